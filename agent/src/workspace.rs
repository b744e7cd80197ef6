//! The workspace tools of a worker — `fs_read`, `fs_write`, `fs_list`, `fs_search`, `fs_patch` —
//! confined to the agent's workspace by the kernel, not by checks on strings: every path is
//! opened with `openat2(2)` from a descriptor of the workspace with `RESOLVE_BENEATH` and
//! `RESOLVE_NO_MAGICLINKS`, so an absolute path, a `..` above the workspace or a symlink that
//! leads out of it fails to open. Writes are atomic (a temporary file in the same folder, then
//! `renameat`); sizes are bounded. Every answer is data for the model (`ToolOutput`), never a
//! panic. Not here: running commands (that needs the sandbox of issue #11).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::{Mode, mkdirat};

use crate::output::ToolOutput;

/// Largest file `fs_read` returns, and largest content `fs_write` takes.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// `fs_list` and `fs_search` stop after this many entries / matches.
const MAX_ENTRIES: usize = 200;
const MAX_MATCHES: usize = 50;
/// `fs_search` reads at most this many files.
const MAX_SEARCHED_FILES: usize = 2_000;

/// The workspace, held open: the process may change directory, the tools stay inside it.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    path: PathBuf,
}

fn how(flags: OFlag) -> OpenHow {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    // The kernel refuses a mode without O_CREAT.
    if flags.contains(OFlag::O_CREAT) { how.mode(Mode::from_bits_truncate(0o644)) } else { how }
}

/// A path a model gave, checked for what the kernel would refuse anyway, to say why clearly.
fn relative(path: &str) -> Result<PathBuf, ToolOutput> {
    let p = Path::new(path.trim());
    if path.trim().is_empty() || path.contains('\0') {
        return Err(bad("give a file path inside your workspace, e.g. notes/plan.md"));
    }
    if p.is_absolute() {
        return Err(forbidden(&format!(
            "`{path}` is absolute; paths are relative to your workspace, e.g. notes/plan.md"
        )));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(forbidden(&format!("`{path}` uses `..`; stay inside your workspace")));
    }
    Ok(p.components().filter(|c| *c != Component::CurDir).collect())
}

/// A folder a model gave; empty means the whole workspace.
fn folder(path: &str) -> Result<PathBuf, ToolOutput> {
    if path.trim().is_empty() { Ok(PathBuf::new()) } else { relative(path) }
}

fn bad(msg: &str) -> ToolOutput {
    ToolOutput { ok: false, content: format!("BAD_REQUEST: {msg}") }
}

fn forbidden(msg: &str) -> ToolOutput {
    ToolOutput { ok: false, content: format!("FORBIDDEN: {msg}") }
}

/// The model's view of an errno from opening `path`.
fn failed(path: &Path, e: Errno) -> ToolOutput {
    let p = path.display();
    match e {
        Errno::EXDEV | Errno::ELOOP => {
            forbidden(&format!("`{p}` leads outside your workspace (a link or `..`)"))
        }
        Errno::ENOENT => bad(&format!("`{p}` does not exist; fs_list shows what does")),
        Errno::ENOTDIR => bad(&format!("a part of `{p}` is a file, not a folder")),
        Errno::EISDIR => bad(&format!("`{p}` is a folder; fs_list lists it")),
        Errno::EACCES | Errno::EPERM => forbidden(&format!("`{p}`: permission denied")),
        other => ToolOutput { ok: false, content: format!("INTERNAL: `{p}`: {}", other.desc()) },
    }
}

impl Workspace {
    /// The workspace at `path` (an agent's is its working directory).
    pub fn open(path: &Path) -> std::io::Result<Workspace> {
        let root = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        let path = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.to_path_buf());
        Ok(Workspace { root, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_at(&self, rel: &Path, flags: OFlag) -> Result<OwnedFd, ToolOutput> {
        let target = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        openat2(self.root.as_fd(), target, how(flags)).map_err(|e| failed(rel, e))
    }

    /// A regular file of the workspace, open for reading. Anything else is refused without
    /// waiting on it: a FIFO (opened non-blocking, so no writer is awaited), a socket or a
    /// device would hold the agent's turn (and its heartbeat's patience) as long as it likes.
    fn open_regular(&self, rel: &Path, path: &str) -> Result<std::fs::File, ToolOutput> {
        let fd = self.open_at(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)?;
        let stat = nix::sys::stat::fstat(&fd)
            .map_err(|e| ToolOutput::err(format!("INTERNAL: reading `{path}`: {e}")))?;
        match nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode & nix::libc::S_IFMT) {
            nix::sys::stat::SFlag::S_IFREG => Ok(std::fs::File::from(fd)),
            nix::sys::stat::SFlag::S_IFDIR => {
                Err(bad(&format!("`{path}` is a folder; fs_list lists it")))
            }
            _ => Err(bad(&format!(
                "`{path}` is not a regular file (a pipe, socket or device); only files can be read"
            ))),
        }
    }

    /// The first `max + 1` bytes of a regular file of the workspace (more than `max`: the file
    /// is longer).
    pub fn read_bytes(&self, path: &str, max: usize) -> Result<Vec<u8>, ToolOutput> {
        let rel = relative(path)?;
        let file = self.open_regular(&rel, path)?;
        let mut bytes = Vec::new();
        let read = file.take(max as u64 + 1).read_to_end(&mut bytes);
        if let Err(e) = read {
            let msg = if e.raw_os_error() == Some(libc_eisdir()) {
                format!("BAD_REQUEST: `{path}` is a folder; fs_list lists it")
            } else {
                format!("INTERNAL: reading `{path}`: {e}")
            };
            return Err(ToolOutput { ok: false, content: msg });
        }
        Ok(bytes)
    }

    /// `fs_read`: a text file, at most [`MAX_FILE_BYTES`].
    pub fn read(&self, path: &str) -> ToolOutput {
        let mut bytes = match self.read_bytes(path, MAX_FILE_BYTES) {
            Ok(b) => b,
            Err(e) => return e,
        };
        if bytes.contains(&0) {
            return bad(&format!("`{path}` is a binary file; only text files can be read"));
        }
        let cut = bytes.len() > MAX_FILE_BYTES;
        bytes.truncate(MAX_FILE_BYTES);
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if cut {
            text.push_str(&format!("\n… (cut at {MAX_FILE_BYTES} bytes)"));
        }
        ToolOutput { ok: true, content: text }
    }

    /// `fs_write`: creates or replaces a file atomically (and the folders above it).
    pub fn write(&self, path: &str, content: &str) -> ToolOutput {
        let rel = match relative(path) {
            Ok(r) if r.as_os_str().is_empty() => return bad("give a file name, not the workspace"),
            Ok(r) => r,
            Err(e) => return e,
        };
        if content.len() > MAX_FILE_BYTES {
            return bad(&format!(
                "the content is {} bytes; at most {MAX_FILE_BYTES} per file",
                content.len()
            ));
        }
        let (parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), n.to_owned()),
            _ => return bad(&format!("`{path}` is not a file path")),
        };
        let dir = match self.make_dirs(&parent) {
            Ok(d) => d,
            Err(e) => return e,
        };
        // Atomic: the new content appears whole or not at all, whatever crashes.
        let tmp = format!(".{}.flock-tmp-{}", name.to_string_lossy(), std::process::id());
        let created = openat2(
            dir.as_fd(),
            tmp.as_str(),
            how(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW),
        );
        let fd = match created {
            Ok(fd) => fd,
            Err(e) => return failed(&rel, e),
        };
        let mut file = std::fs::File::from(fd);
        if let Err(e) = file.write_all(content.as_bytes()).and_then(|_| file.sync_data()) {
            let _ = nix::unistd::unlinkat(
                dir.as_fd(),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return ToolOutput { ok: false, content: format!("INTERNAL: writing `{path}`: {e}") };
        }
        if let Err(e) = renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name.as_os_str()) {
            let _ = nix::unistd::unlinkat(
                dir.as_fd(),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return failed(&rel, e);
        }
        ToolOutput {
            ok: true,
            content: format!("wrote {} bytes to {}", content.len(), rel.display()),
        }
    }

    /// The folder `rel` (created with its parents if missing), opened beneath the workspace.
    fn make_dirs(&self, rel: &Path) -> Result<OwnedFd, ToolOutput> {
        let mut so_far = PathBuf::new();
        for part in rel.components() {
            so_far.push(part);
            let parent = so_far.parent().unwrap_or(Path::new(""));
            let dir = self.open_at(parent, OFlag::O_DIRECTORY | OFlag::O_RDONLY)?;
            match mkdirat(dir.as_fd(), part.as_os_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(failed(&so_far, e)),
            }
        }
        self.open_at(rel, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
    }

    /// `fs_list`: a folder's entries (folders end with `/`), two levels deep.
    pub fn list(&self, path: &str) -> ToolOutput {
        let rel = match folder(path) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let mut out = Vec::new();
        if let Err(e) = self.walk(&rel, 2, &mut |p, is_dir| {
            out.push(format!("{}{}", p.display(), if is_dir { "/" } else { "" }));
            out.len() < MAX_ENTRIES
        }) {
            return e;
        }
        out.sort();
        if out.is_empty() {
            return ToolOutput { ok: true, content: "(empty)".into() };
        }
        if out.len() >= MAX_ENTRIES {
            out.push(format!("… (first {MAX_ENTRIES} entries)"));
        }
        ToolOutput { ok: true, content: out.join("\n") }
    }

    /// Calls `visit(path, is_dir)` for the entries under `rel`, `depth` levels deep, until it
    /// returns false. Links are listed, never followed.
    fn walk(
        &self,
        rel: &Path,
        depth: usize,
        visit: &mut dyn FnMut(&Path, bool) -> bool,
    ) -> Result<bool, ToolOutput> {
        let fd = self.open_at(rel, OFlag::O_DIRECTORY | OFlag::O_RDONLY)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| failed(rel, e))?;
        let mut subdirs = Vec::new();
        for entry in dir.iter().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." || name.contains(".flock-tmp-") {
                continue;
            }
            let is_dir = entry.file_type() == Some(nix::dir::Type::Directory);
            let path = rel.join(&name);
            if !visit(&path, is_dir) {
                return Ok(false);
            }
            if is_dir && !name.starts_with('.') {
                subdirs.push(path);
            }
        }
        if depth > 1 {
            for sub in subdirs {
                if !self.walk(&sub, depth - 1, visit)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// `fs_search`: lines containing `query` (case-insensitive) in the text files under `path`.
    pub fn search(&self, query: &str, path: &str) -> ToolOutput {
        if query.trim().is_empty() {
            return bad("give the text to search for");
        }
        let rel = match folder(path) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let mut files = Vec::new();
        if let Err(e) = self.walk(&rel, 16, &mut |p, is_dir| {
            if !is_dir {
                files.push(p.to_path_buf());
            }
            files.len() < MAX_SEARCHED_FILES
        }) {
            return e;
        }
        let needle = query.to_lowercase();
        let mut hits = Vec::new();
        for file in files {
            // Pipes and sockets are passed over, never waited on.
            let Ok(f) = self.open_regular(&file, &file.to_string_lossy()) else { continue };
            let mut bytes = Vec::new();
            let _ = f.take(MAX_FILE_BYTES as u64).read_to_end(&mut bytes);
            if bytes.contains(&0) {
                continue;
            }
            for (n, line) in String::from_utf8_lossy(&bytes).lines().enumerate() {
                if line.to_lowercase().contains(&needle) {
                    hits.push(format!(
                        "{}:{}: {}",
                        file.display(),
                        n + 1,
                        crate::clip(line.trim(), 200)
                    ));
                    if hits.len() >= MAX_MATCHES {
                        hits.push(format!("… (first {MAX_MATCHES} matches)"));
                        return ToolOutput { ok: true, content: hits.join("\n") };
                    }
                }
            }
        }
        let content =
            if hits.is_empty() { format!("no line contains {query:?}") } else { hits.join("\n") };
        ToolOutput { ok: true, content }
    }

    /// `fs_patch`: applies a unified diff to one file (the whole hunk must match).
    pub fn patch(&self, path: &str, diff: &str) -> ToolOutput {
        let current = self.read(path);
        if !current.ok {
            return current;
        }
        let patch = match diffy::Patch::from_str(diff) {
            Ok(p) => p,
            Err(e) => {
                return bad(&format!(
                    "the diff is not a unified diff ({e}); give hunks like `@@ -1,2 +1,2 @@` with \
                     ` `, `-` and `+` lines"
                ));
            }
        };
        match diffy::apply(&current.content, &patch) {
            Ok(new) => {
                let out = self.write(path, &new);
                if out.ok {
                    ToolOutput {
                        ok: true,
                        content: format!("patched {path} ({} bytes now)", new.len()),
                    }
                } else {
                    out
                }
            }
            Err(e) => bad(&format!(
                "the diff does not apply to {path} as it is now ({e}); fs_read it and try again"
            )),
        }
    }
}

fn libc_eisdir() -> i32 {
    Errno::EISDIR as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        let ws = Workspace::open(&dir.path().join("ws")).unwrap();
        (dir, ws)
    }

    #[test]
    fn a_pipe_in_the_workspace_is_refused_at_once_not_waited_on() {
        let (_d, ws) = ws();
        assert!(ws.write("notes.txt", "hello").ok);
        nix::unistd::mkfifo(&ws.path().join("pipe"), Mode::from_bits_truncate(0o600)).unwrap();
        // Opening a FIFO for reading would wait for a writer forever: it is refused instead.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = ws.path().to_path_buf();
        std::thread::spawn(move || {
            let ws = Workspace::open(&path).unwrap();
            let _ = tx.send((ws.read("pipe"), ws.search("hello", "")));
        });
        let (read, search) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("fs_read and fs_search of a workspace with a FIFO returned");
        assert!(!read.ok && read.content.contains("not a regular file"), "{}", read.content);
        assert_eq!(search.content, "notes.txt:1: hello", "the pipe is passed over");
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        let folder = ws.read("sub");
        assert!(!folder.ok && folder.content.contains("is a folder"), "{}", folder.content);
    }

    #[test]
    fn files_are_written_atomically_read_listed_searched_and_patched() {
        let (_d, ws) = ws();
        assert!(ws.write("notes/plan.md", "1. install\n2. hello world\n").ok);
        assert_eq!(ws.read("notes/plan.md").content, "1. install\n2. hello world\n");
        assert_eq!(ws.read("./notes/plan.md").content, "1. install\n2. hello world\n");
        assert_eq!(ws.list("").content, "notes/\nnotes/plan.md");
        assert_eq!(ws.search("HELLO", "").content, "notes/plan.md:2: 2. hello world");
        let diff = "--- a/notes/plan.md\n+++ b/notes/plan.md\n@@ -1,2 +1,3 @@\n 1. install\n 2. hello world\n+3. a CLI\n";
        assert!(ws.patch("notes/plan.md", diff).ok);
        assert_eq!(ws.read("notes/plan.md").content, "1. install\n2. hello world\n3. a CLI\n");
        let stale = ws.patch("notes/plan.md", "@@ -1,1 +1,1 @@\n-nothing like this\n+x\n");
        assert!(!stale.ok && stale.content.contains("does not apply"), "{}", stale.content);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(ws.path().join("notes")).unwrap().count(), 1);
    }

    #[test]
    fn nothing_outside_the_workspace_can_be_reached() {
        let (d, ws) = ws();
        std::fs::write(d.path().join("secret.txt"), "the database password").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret.txt"), ws.path().join("link")).unwrap();
        std::os::unix::fs::symlink(d.path(), ws.path().join("up")).unwrap();
        std::os::unix::fs::symlink("../secret.txt", ws.path().join("rel")).unwrap();
        for path in
            ["/etc/passwd", "../secret.txt", "link", "up/secret.txt", "rel", "a/../../secret.txt"]
        {
            let out = ws.read(path);
            assert!(!out.ok, "{path} was read: {}", out.content);
            assert!(out.content.starts_with("FORBIDDEN"), "{path}: {}", out.content);
        }
        for path in ["/etc/passwd", "../secret.txt", "up/secret.txt", "a/../../secret.txt"] {
            let out = ws.write(path, "x");
            assert!(
                !out.ok && !out.content.contains("wrote"),
                "{path} was written: {}",
                out.content
            );
        }
        // Writing a link's name replaces the link itself (inside), never what it points to.
        assert!(ws.write("link", "mine").ok);
        assert!(!ws.path().join("link").is_symlink());
        assert_eq!(
            std::fs::read_to_string(d.path().join("secret.txt")).unwrap(),
            "the database password"
        );
        assert!(ws.write("up/x.txt", "x").content.starts_with("FORBIDDEN"));
        assert!(!d.path().join("x.txt").exists());
        // Listing shows the links, never what they point to.
        let list = ws.list("").content;
        assert!(list.contains("link") && !list.contains("secret"), "{list}");
        assert!(
            ws.search("password", "").content.starts_with("no line contains"),
            "search stays inside"
        );
    }

    #[test]
    fn sizes_and_bad_paths_are_refused_with_a_reason() {
        let (_d, ws) = ws();
        let big = "x".repeat(MAX_FILE_BYTES + 1);
        assert!(ws.write("big.txt", &big).content.contains("at most"));
        assert!(ws.read("missing.txt").content.contains("does not exist"));
        assert!(ws.write("", "x").content.starts_with("BAD_REQUEST"));
        std::fs::write(ws.path().join("bin"), [0u8, 1, 2]).unwrap();
        assert!(ws.read("bin").content.contains("binary"));
        assert!(ws.read("notes").content.starts_with("BAD_REQUEST"));
    }
}
