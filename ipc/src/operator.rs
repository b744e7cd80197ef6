//! The operator key: a secret the supervisor writes at every start to `operator.key` beside its
//! control socket (mode 0600, in the 0700 `run/` folder), and which every control client presents
//! in its `ClientHello`. The control socket serves only connections that present it: the operator
//! is whoever can read that file — the person who started the swarm — and never an agent, whose
//! cage does not show `run/` (see docs/security.md). A new key each run: a process that read an
//! earlier run's key cannot use it against the next.

use std::io;
use std::path::{Path, PathBuf};

/// The key file's name, in the control socket's folder.
pub const KEY_FILE: &str = "operator.key";

/// Where the key of the supervisor listening on `control_socket` is.
pub fn key_path(control_socket: &Path) -> PathBuf {
    control_socket.with_file_name(KEY_FILE)
}

/// The key to present to the supervisor listening on `control_socket`. A missing file gives an
/// empty key (the supervisor then says which file it wanted); a file that cannot be read is an
/// error that names it.
pub fn read_key(control_socket: &Path) -> io::Result<String> {
    let path = key_path(control_socket);
    match std::fs::read_to_string(&path) {
        Ok(key) => Ok(key.trim().to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "cannot read the operator key {}: {e} (only the user who started the swarm can)",
                path.display()
            ),
        )),
    }
}

/// Writes a new `key` for the control socket at `control_socket`: readable by the owner only,
/// replacing any earlier run's key (never written through a link someone left in its place).
pub fn write_key(control_socket: &Path, key: &str) -> io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = key_path(control_socket);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(key.as_bytes())?;
    f.sync_all()?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_the_owners_alone_and_replaced_each_run() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        assert_eq!(read_key(&socket).unwrap(), "", "no file: an empty key");
        let path = write_key(&socket, "first").unwrap();
        assert_eq!(path, dir.path().join(KEY_FILE));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read_key(&socket).unwrap(), "first");
        // A link left where the key goes is replaced, not written through.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "untouched").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        write_key(&socket, "second").unwrap();
        assert_eq!(read_key(&socket).unwrap(), "second");
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
    }
}
