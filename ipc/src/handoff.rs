//! Secrets handed to a spawned process over an inherited socket, never through its environment.
//!
//! Anything in a process's environment can be read from `/proc/<pid>/environ` by any process of
//! the same user for as long as the process is dumpable — for an agent, the instant between
//! `exec` and its first instructions is enough for a sibling that polls for the respawn. So the
//! supervisor writes a spawn's secrets (its single-use router token, a bridge's platform token)
//! into one end of a socket pair, closes it, and lets the child inherit the other end; the child
//! names the descriptor in [`SECRETS_FD`]. A Unix socket cannot be opened through
//! `/proc/<pid>/fd` (the kernel answers `ENXIO`), so no other process can read it; the child
//! reads it to the end once, at start, and closes it.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};

/// The variable that names the inherited descriptor (its number only; not a secret).
pub const SECRETS_FD: &str = "FLOCK_SECRETS_FD";

/// Most bytes of secrets a spawn may be handed (a few tokens; far below a socket's buffer, so
/// the supervisor's write never blocks).
pub const MAX_SECRETS_BYTES: usize = 64 * 1024;

/// The bytes the supervisor writes: the secrets as one JSON object.
pub fn encode(secrets: &BTreeMap<String, String>) -> Vec<u8> {
    serde_json::to_vec(secrets).unwrap_or_default()
}

/// Reads and closes the descriptor [`SECRETS_FD`] names (once per process: later calls get an
/// empty map). No variable: no secrets, so a process started by hand gets a clear "not set"
/// from whoever needs one.
pub fn receive() -> io::Result<BTreeMap<String, String>> {
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let Ok(fd) = std::env::var(SECRETS_FD) else { return Ok(BTreeMap::new()) };
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(BTreeMap::new());
    }
    let fd: i32 = fd.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{SECRETS_FD}={fd} is not a descriptor"),
        )
    })?;
    let stream = take_socket(fd)?;
    let mut bytes = Vec::new();
    stream.take(MAX_SECRETS_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > MAX_SECRETS_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "more secrets than a spawn gets"));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("secrets: {e}")))
}

/// Takes ownership of `fd` if it is an open socket (anything else is refused and left alone:
/// it is not ours).
fn take_socket(fd: i32) -> io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::fs::FileTypeExt;
    let is_socket = fd > 2
        && std::fs::metadata(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{SECRETS_FD}={fd} is not an open socket: flock processes are started by flock-supervisor"
            ),
        ));
    }
    // SAFETY: the descriptor is open (checked above), a socket, and handed to this process for
    // this one use (`receive` takes it once).
    #[allow(unsafe_code)]
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(std::os::unix::net::UnixStream::from(owned))
}
