//! The `flock-agent` binary cargo built is linked the lean way (agent/link/rustc-wrapper, issue
//! #28): statically where this machine has the static C library, and with the functions an agent
//! runs at the front of its code. If cargo stopped running the wrapper (or the wrapper stopped
//! doing its job) every agent would silently take twice the memory again.

use std::path::Path;
use std::process::Command;

const AGENT: &str = env!("CARGO_BIN_EXE_flock-agent");

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the ELF file at `path` asks for a program interpreter (`PT_INTERP`: dynamically linked).
fn has_interpreter(path: &str) -> bool {
    let elf = std::fs::read(path).expect("read the agent binary");
    assert_eq!(&elf[..4], b"\x7fELF", "{path} is not an ELF file");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let at = phoff + i * size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3
    })
}

#[test]
fn the_agent_is_linked_statically_where_the_static_c_library_is_there() {
    let libc_a = Command::new("cc").arg("-print-file-name=libc.a").output();
    let found = libc_a
        .map(|o| {
            let p = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            p != "libc.a" && Path::new(&p).exists()
        })
        .unwrap_or(false);
    assert_eq!(
        has_interpreter(AGENT),
        !found,
        "{AGENT}: static libc {}, but the binary {} an interpreter",
        if found { "found" } else { "not found" },
        if has_interpreter(AGENT) { "has" } else { "has no" }
    );
}

/// The static agent must not look up host, user or group names: glibc would load its NSS
/// modules for them at run time, from the glibc it was not built with (ARCHITECTURE, agent/).
#[test]
fn the_static_agent_calls_no_name_lookup_that_needs_shared_libraries() {
    if has_interpreter(AGENT) {
        return; // dynamically linked: the lookups work as anywhere
    }
    let Ok(nm) = Command::new("nm").args(["--defined-only", AGENT]).output() else {
        eprintln!("no nm here");
        return;
    };
    const LOOKUPS: &[&str] = &[
        "getaddrinfo",
        "gethostbyname",
        "gethostbyname_r",
        "gethostbyaddr",
        "getservbyname",
        "getpwnam",
        "getpwnam_r",
        "getpwuid",
        "getpwuid_r",
        "getgrnam",
        "getgrnam_r",
        "getgrgid",
        "getgrgid_r",
        "getgrouplist",
        "initgroups",
    ];
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let linked: Vec<&str> = symbols
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|name| LOOKUPS.contains(name))
        .collect();
    assert!(
        linked.is_empty(),
        "{AGENT} is linked statically but calls {linked:?}: those load NSS modules at run time; \
         resolve the name elsewhere (the supervisor) or drop the static link (agent/link/rustc-wrapper)"
    );
}

#[test]
fn the_functions_an_agent_runs_come_first_in_its_code() {
    let Ok(nm) = Command::new("nm").args(["--defined-only", "-n", AGENT]).output() else {
        eprintln!("no nm here: the wrapper does not order the agent without it either");
        return;
    };
    // The code's symbols by address, as their keys (the wrapper's own rule).
    let text: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let (_, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            matches!(kind, "T" | "t").then(|| name.to_owned())
        })
        .take(300)
        .collect();
    let mut keys = Command::new(manifest_dir().join("link/rustc-wrapper"))
        .arg("--keys")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run rustc-wrapper --keys");
    {
        use std::io::Write;
        let mut stdin = keys.stdin.take().unwrap();
        stdin.write_all(text.join("\n").as_bytes()).unwrap();
    }
    let keys = keys.wait_with_output().unwrap();
    let first: Vec<String> =
        String::from_utf8_lossy(&keys.stdout).lines().map(str::to_owned).collect();
    let listed = std::fs::read_to_string(manifest_dir().join("link/startup-symbols.txt")).unwrap();
    let listed: std::collections::HashSet<&str> =
        listed.lines().filter(|l| !l.starts_with('#')).collect();
    let on_list = first.iter().filter(|k| listed.contains(k.as_str())).count();
    assert!(
        first.len() >= 100 && on_list * 10 >= first.len() * 8,
        "only {on_list} of the first {} functions of {AGENT} are on link/startup-symbols.txt: \
         the agent was not linked with its ordering",
        first.len()
    );
}

/// A linker that does not know `--symbol-ordering-file` (GNU ld, say) still builds the agent: the
/// wrapper links it again without the ordering. Here rustc is a stand-in that fails on that
/// option and otherwise "links" by copying the real agent binary, logging each call.
#[test]
fn a_linker_without_symbol_ordering_still_links_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("deps");
    std::fs::create_dir(&out).unwrap();
    let log = dir.path().join("calls");
    let fake = dir.path().join("rustc");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> {log}\ncase \"$*\" in *symbol-ordering-file*) \
             echo 'ld: unknown option: --symbol-ordering-file' >&2; exit 1 ;; esac\n\
             cp {AGENT} {out}/flock_agent-t\n",
            log = log.display(),
            out = out.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = Command::new(manifest_dir().join("link/rustc-wrapper"))
        .arg(&fake)
        .args(["--crate-name", "flock_agent", "--crate-type", "bin", "--emit=dep-info,link"])
        .args(["-C", "extra-filename=-t", "--out-dir"])
        .arg(&out)
        .env_remove("FLOCK_AGENT_PLAIN_LINK")
        .output()
        .unwrap();
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(run.status.success(), "{}\ncalls:\n{calls}", String::from_utf8_lossy(&run.stderr));
    let calls: Vec<&str> = calls.lines().collect();
    // Linked, ordered (refused), linked again without the ordering.
    assert!(calls.iter().any(|c| c.contains("symbol-ordering-file")), "{calls:?}");
    assert!(!calls.last().unwrap().contains("symbol-ordering-file"), "{calls:?}");
    assert!(!out.join("flock_agent-t.order").exists(), "a refused ordering is not kept");
    assert!(out.join("flock_agent-t").exists());
}
