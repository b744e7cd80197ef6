//! Who the control socket serves as the operator: a live process this supervisor did not start.
//! The decision is on the process that called `connect()`; one that has exited — a child that
//! connected, handed the socket to a grandchild and died — cannot be placed and is refused.

use std::process::{Command, Stdio};
use std::time::Duration;

use flock_actors::server::operator_peer;
use flock_ipc::{PeerCred, Transport, UnixTransport};

/// A process that connects to `socket` and stays until its stdin closes.
fn connector(socket: &std::path::Path) -> std::process::Child {
    Command::new("python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nsys.stdin.read()",
        ])
        .arg(socket)
        .stdin(Stdio::piped())
        .spawn()
        .expect("python3")
}

#[tokio::test]
async fn a_connection_is_judged_by_the_live_process_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let transport = UnixTransport::new(dir.path().join("control.sock"));
    let listener = transport.bind().unwrap();
    let me = std::process::id() as i32;

    let mut child = connector(&transport.path);
    let accepted = tokio::time::timeout(Duration::from_secs(10), UnixTransport::accept(&listener));
    let (_r, _w, peer) = accepted.await.expect("the child connects").unwrap();
    assert_eq!(peer.pid, Some(child.id() as i32));
    assert!(peer.pidfd.is_some(), "SO_PEERPIDFD is there on this kernel");

    // A process this "supervisor" started is not the operator.
    let err = operator_peer(&peer, me).unwrap_err();
    assert!(err.contains("not processes this supervisor started"), "{err}");

    // Once it has exited (and been reaped: its pid leads nowhere in /proc), it cannot be placed.
    drop(child.stdin.take());
    child.wait().unwrap();
    let err = operator_peer(&peer, me).unwrap_err();
    assert!(err.contains("has exited"), "{err}");
    // Without a pidfd the same holds, by /proc alone.
    let no_pidfd = PeerCred { pidfd: None, ..peer.clone() };
    assert!(operator_peer(&no_pidfd, me).unwrap_err().contains("has exited"));

    // A live process outside this process's tree (the one that started the test) is served.
    let parent = std::os::unix::process::parent_id() as i32;
    let outsider = PeerCred { uid: peer.uid, pid: Some(parent), pidfd: None };
    assert_eq!(operator_peer(&outsider, me), Ok(()));
    // And one whose pid nobody can tell is not.
    let unknown = PeerCred { uid: peer.uid, pid: None, pidfd: None };
    assert!(operator_peer(&unknown, me).is_err());
}
