//! Raw wire access: a blocking Unix-socket connection that writes whatever bytes a test wants
//! (valid frames, garbage, lying length prefixes) and decodes what comes back with `flock-ipc`.
//! For attacking the router, not for talking to it politely (agents use `flock_ipc::Connection`).

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use flock_ipc::{Body, Frame, Hello, PROTOCOL_VERSION, ROUTER, decode_frame, encode_frame};

/// How long a read waits for the router before the test fails (generous: under the full suite on
/// two cores, beside the embedded model's tests, a close took longer than 10 s once).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct RawConn {
    stream: UnixStream,
}

/// What the peer sent before it closed the connection.
#[derive(Debug)]
pub struct Closed {
    pub frames: Vec<Frame>,
    /// Bytes after the last complete frame (none from a well-behaved router).
    pub trailing: usize,
}

impl RawConn {
    /// Connects to a socket (`<state>/run/router.sock` or `control.sock`).
    pub fn connect(path: &Path) -> Self {
        let stream = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", path.display()));
        stream.set_read_timeout(Some(READ_TIMEOUT)).expect("set a read timeout");
        RawConn { stream }
    }

    /// Writes raw bytes. Errors are returned, not raised: the router may already have hung up.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Ends our side of the stream (the router then sees end of file after what we sent).
    pub fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }

    /// Encodes and writes one frame.
    pub fn send_frame(&mut self, frame: &Frame) -> std::io::Result<()> {
        let mut buf = Vec::new();
        encode_frame(frame, &mut buf).expect("encode a test frame");
        self.send_bytes(&buf)
    }

    /// Reads one frame; `None` once the peer has closed the connection. Panics on a timeout or on
    /// bytes that do not decode (the router must only ever send valid frames).
    pub fn read_frame(&mut self) -> Option<Frame> {
        let mut len = [0u8; 4];
        if !self.read_exact_or_eof(&mut len) {
            return None;
        }
        let len = u32::from_le_bytes(len) as usize;
        let mut body = vec![0u8; len];
        assert!(self.read_exact_or_eof(&mut body), "the peer closed the connection mid-frame");
        Some(decode_frame(&body).unwrap_or_else(|e| panic!("the router sent a bad frame: {e}")))
    }

    /// Reads frames until the peer closes the connection.
    pub fn read_until_closed(&mut self) -> Closed {
        self.try_read_until_closed()
            .unwrap_or_else(|e| panic!("waiting for the router to close the connection: {e}"))
    }

    /// [`Self::read_until_closed`], with the read's error (a timeout after [`READ_TIMEOUT`])
    /// returned, so a test can say more about the router before it fails.
    pub fn try_read_until_closed(&mut self) -> std::io::Result<Closed> {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                // A peer that closes with our bytes unread resets the connection instead of
                // ending it; what it sent before that has been read already.
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        let mut frames = Vec::new();
        let mut at = 0;
        while bytes.len() - at >= 4 {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            if bytes.len() - at - 4 < len {
                break;
            }
            let body = &bytes[at + 4..at + 4 + len];
            frames.push(
                decode_frame(body).unwrap_or_else(|e| panic!("the router sent a bad frame: {e}")),
            );
            at += 4 + len;
        }
        Ok(Closed { frames, trailing: bytes.len() - at })
    }

    fn read_exact_or_eof(&mut self, buf: &mut [u8]) -> bool {
        let mut have = 0;
        while have < buf.len() {
            match self.stream.read(&mut buf[have..]) {
                Ok(0) => {
                    assert!(have == 0, "the peer closed the connection mid-frame");
                    return false;
                }
                Ok(n) => have += n,
                Err(e) if e.kind() == ErrorKind::ConnectionReset && have == 0 => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => panic!("reading from the router: {e}"),
            }
        }
        true
    }
}

/// An agent's `Hello` frame, as `flock-agent` would send it.
pub fn hello(agent: &str, token: &str) -> Frame {
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: agent.into(),
        instance: "default".into(),
        pid: std::process::id(),
        token: token.into(),
    };
    Frame::new(agent, ROUTER, Body::Hello(hello))
}

/// A control client's `ClientHello` frame, as `flockctl` would send it to the supervisor
/// listening on `control_socket` (with the operator key beside it).
pub fn client_hello(control_socket: &std::path::Path) -> Frame {
    let key = flock_ipc::operator::read_key(control_socket).expect("read the operator key");
    let body =
        Body::ClientHello { protocol_version: PROTOCOL_VERSION, client: "testkit".into(), key };
    Frame::new(flock_ipc::OPERATOR, ROUTER, body)
}
