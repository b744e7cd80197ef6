//! Connections: the [`Transport`] trait (Unix sockets today; NATS later, DESIGN.md §13), the
//! batching writer task with its bounded outbox, and the client side of the handshake.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::codec::{FrameError, FrameReader, encode_frame};
use crate::error::ErrorCode;
use crate::frame::{Body, Frame, Hello, ROUTER, Welcome};
use crate::{DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION};

/// The sending side of a connection: frames queued here are written by the writer task. Bounded,
/// so a peer that stops reading cannot make its sender's memory grow (`try_send` fails instead).
pub type Outbox = mpsc::Sender<Frame>;

/// Frames per batched write, and bytes after which a batch is flushed early.
const BATCH_FRAMES: usize = 1024;
const BATCH_BYTES: usize = 256 * 1024;
/// A batch of fewer frames waits one scheduler turn for more.
const COALESCE_BELOW: usize = 16;

/// Spawns the task that drains `rx` into `w`, many frames per `write` syscall. It ends when
/// every [`Outbox`] is dropped (after writing what was queued) or when a write fails.
pub fn spawn_writer<W>(
    mut w: W,
    mut rx: mpsc::Receiver<Frame>,
) -> JoinHandle<Result<(), FrameError>>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut frames = Vec::with_capacity(BATCH_FRAMES);
        let mut buf = Vec::with_capacity(BATCH_BYTES);
        while rx.recv_many(&mut frames, BATCH_FRAMES).await > 0 {
            // A short batch: let the other tasks run once (the router is often mid-burst),
            // then take what came meanwhile — one write, and one wake-up of the peer, for
            // several frames instead of one each (1 000 agents: docs/benchmarks.md).
            if frames.len() < COALESCE_BELOW {
                tokio::task::yield_now().await;
                while frames.len() < BATCH_FRAMES {
                    match rx.try_recv() {
                        Ok(f) => frames.push(f),
                        Err(_) => break,
                    }
                }
            }
            for f in frames.drain(..) {
                if let Err(e) = encode_frame(&f, &mut buf) {
                    // A frame we built ourselves failed to encode: a bug, but not the peer's
                    // fault. Drop that frame only.
                    tracing::error!(kind = f.kind(), error = %e, "flock-ipc: dropping an unencodable frame");
                }
                if buf.len() >= BATCH_BYTES {
                    w.write_all(&buf).await?;
                    buf.clear();
                }
            }
            if !buf.is_empty() {
                w.write_all(&buf).await?;
                buf.clear();
            }
        }
        let _ = w.shutdown().await;
        Ok(())
    })
}

/// Credentials of the process at the other end of a socket.
#[derive(Debug, Clone)]
pub struct PeerCred {
    pub uid: u32,
    /// The pid of the process that connected, as it was at `connect()`.
    pub pid: Option<i32>,
    /// A pidfd for that same process (`SO_PEERPIDFD`, Linux ≥ 6.5): it tells whether the
    /// process still lives — so a pid read from `/proc` is known not to belong to another
    /// process that got the number after it exited.
    pub pidfd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// A way to reach and to serve the router. Everything above it deals in frames, not sockets.
pub trait Transport: Send + Sync + 'static {
    type Read: tokio::io::AsyncRead + Unpin + Send + 'static;
    type Write: AsyncWrite + Unpin + Send + 'static;
    type Listener: Send + 'static;

    /// Opens the listening endpoint.
    fn bind(&self) -> io::Result<Self::Listener>;
    /// Waits for the next peer.
    fn accept(
        listener: &Self::Listener,
    ) -> impl Future<Output = io::Result<(Self::Read, Self::Write, PeerCred)>> + Send;
    /// Connects to the endpoint.
    fn connect(&self) -> impl Future<Output = io::Result<(Self::Read, Self::Write)>> + Send;
}

/// A Unix-domain socket at a filesystem path (never the abstract namespace: the path lives in a
/// 0700 directory, so the filesystem is the first access check; the peer uid is the second).
#[derive(Debug, Clone)]
pub struct UnixTransport {
    pub path: PathBuf,
}

impl UnixTransport {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        UnixTransport { path: path.into() }
    }
}

impl Transport for UnixTransport {
    type Read = OwnedReadHalf;
    type Write = OwnedWriteHalf;
    type Listener = UnixListener;

    fn bind(&self) -> io::Result<UnixListener> {
        // A socket file left by a killed supervisor is stale if nobody answers on it.
        if self.path.exists() {
            match std::os::unix::net::UnixStream::connect(&self.path) {
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{} is in use by a running process", self.path.display()),
                    ));
                }
                Err(_) => std::fs::remove_file(&self.path)?,
            }
        }
        let listener = UnixListener::bind(&self.path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o600))?;
        Ok(listener)
    }

    async fn accept(
        listener: &UnixListener,
    ) -> io::Result<(OwnedReadHalf, OwnedWriteHalf, PeerCred)> {
        let (stream, _) = listener.accept().await?;
        let cred = stream.peer_cred()?;
        let pidfd = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerPidfd)
            .ok()
            .map(std::sync::Arc::new);
        let (r, w) = stream.into_split();
        Ok((r, w, PeerCred { uid: cred.uid(), pid: cred.pid(), pidfd }))
    }

    async fn connect(&self) -> io::Result<(OwnedReadHalf, OwnedWriteHalf)> {
        let stream = UnixStream::connect(&self.path).await?;
        Ok(stream.into_split())
    }
}

/// Why connecting to the router failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("rejected by the supervisor ({code}): {reason}")]
    Rejected { code: ErrorCode, reason: String },
    #[error("handshake failed: {0}")]
    Protocol(String),
}

/// A connected, handshaken client (agent, `flockctl`, bench tool).
pub struct Connection {
    pub reader: FrameReader<OwnedReadHalf>,
    pub outbox: Outbox,
    pub welcome: Welcome,
    pub writer: JoinHandle<Result<(), FrameError>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("welcome", &self.welcome).finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects as an agent: `Hello` → `Welcome` | `Reject`.
    pub async fn agent(
        path: &Path,
        hello: Hello,
        outbox_frames: usize,
    ) -> Result<Self, ConnectError> {
        let from = hello.agent_id.clone();
        Self::handshake(path, Frame::new(from, ROUTER, Body::Hello(hello)), outbox_frames).await
    }

    /// Connects as a chat bridge: `BridgeHello` → `Welcome` | `Reject`.
    pub async fn bridge(path: &Path, hello: Hello) -> Result<Self, ConnectError> {
        let from = hello.agent_id.clone();
        Self::handshake(path, Frame::new(from, ROUTER, Body::BridgeHello(hello)), 4096).await
    }

    /// Connects as a control client (`flockctl`): `ClientHello` → `Welcome` | `Reject`.
    /// The operator key is read from beside the socket ([`crate::operator::read_key`]).
    pub async fn client(path: &Path, client: &str) -> Result<Self, ConnectError> {
        let key = crate::operator::read_key(path)
            .map_err(|source| ConnectError::Io { path: path.display().to_string(), source })?;
        let hello =
            Body::ClientHello { protocol_version: PROTOCOL_VERSION, client: client.into(), key };
        Self::handshake(path, Frame::new(crate::frame::OPERATOR, ROUTER, hello), 1024).await
    }

    async fn handshake(
        path: &Path,
        hello: Frame,
        outbox_frames: usize,
    ) -> Result<Self, ConnectError> {
        let transport = UnixTransport::new(path);
        let (r, w) = transport
            .connect()
            .await
            .map_err(|source| ConnectError::Io { path: path.display().to_string(), source })?;
        let (outbox, rx) = mpsc::channel(outbox_frames.max(16));
        let writer = spawn_writer(w, rx);
        let mut reader = FrameReader::new(r, DEFAULT_MAX_FRAME_BYTES);
        outbox.send(hello).await.map_err(|_| ConnectError::Protocol("writer closed".into()))?;
        match reader.read_frame().await {
            Ok(Some(Frame { body: Body::Welcome(welcome), .. })) => {
                // The swarm may allow larger frames than the default; never read with less than
                // the default (a small swarm limit bounds what peers send, not what they receive).
                reader.set_max_frame(welcome.max_frame_bytes.max(DEFAULT_MAX_FRAME_BYTES));
                Ok(Connection { reader, outbox, welcome, writer })
            }
            Ok(Some(Frame { body: Body::Reject { code, reason }, .. })) => {
                Err(ConnectError::Rejected { code, reason })
            }
            Ok(Some(other)) => {
                Err(ConnectError::Protocol(format!("expected Welcome, got {}", other.kind())))
            }
            Ok(None) => Err(ConnectError::Protocol("connection closed before Welcome".into())),
            Err(e) => Err(ConnectError::Protocol(e.to_string())),
        }
    }
}
