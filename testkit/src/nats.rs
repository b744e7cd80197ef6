//! A real NATS server with JetStream for tests (Debian's `nats-server`, which `scripts/setup`
//! installs): on a loopback port it picks itself, its store in a folder of the test's, killed on
//! drop. `scripts/test` sets `FLOCK_REQUIRE_NATS=1`: there a missing server fails the test instead
//! of skipping it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `nats-server` binary: `FLOCK_NATS_SERVER`, else on PATH, else Debian's `/usr/sbin`.
pub fn server_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLOCK_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// The server binary, or `None` (and a line saying the test skipped) where there is none and
/// `FLOCK_REQUIRE_NATS` is not set.
pub fn available(test: &str) -> Option<PathBuf> {
    let bin = server_bin();
    if bin.is_none() {
        assert!(
            std::env::var_os("FLOCK_REQUIRE_NATS").is_none(),
            "FLOCK_REQUIRE_NATS is set but there is no nats-server: run scripts/setup"
        );
        eprintln!("{test}: skipped (no nats-server: run scripts/setup)");
    }
    bin
}

/// A running `nats-server -js`.
#[derive(Debug)]
pub struct Broker {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Child,
    config: Option<PathBuf>,
}

impl Broker {
    /// A new broker on a port it picks itself (`-p -1`, read back from its ports file: a port
    /// picked here and handed over could be taken by a test running beside it), or again on
    /// `port` after a kill. Its JetStream store is `dir/jetstream`.
    pub fn start(bin: &Path, dir: &Path, port: Option<u16>) -> Broker {
        Broker::start_with(bin, dir, port, None)
    }

    /// A new broker with `config` (a `nats-server.conf` text: users and their permissions) as
    /// well.
    pub fn with_config(bin: &Path, dir: &Path, config: &str) -> Broker {
        let file = dir.join("nats-server.conf");
        std::fs::write(&file, config).expect("write the broker's config");
        Broker::start_with(bin, dir, None, Some(file))
    }

    fn start_with(bin: &Path, dir: &Path, port: Option<u16>, config: Option<PathBuf>) -> Broker {
        let ports_dir = dir.join("ports");
        std::fs::create_dir_all(&ports_dir).expect("create the broker's ports folder");
        let mut cmd = Command::new(bin);
        if let Some(c) = &config {
            cmd.arg("-c").arg(c);
        }
        let mut child = cmd
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(port.map_or("-1".to_owned(), |p| p.to_string()))
            .arg("--ports_file_dir")
            .arg(&ports_dir)
            .arg("-sd")
            .arg(dir.join("jetstream"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let ports_file = ports_dir.join(format!(
            "{}_{}.ports",
            bin.file_name().unwrap_or_default().to_string_lossy(),
            child.id()
        ));
        let mut listening = None;
        crate::wait_for(
            || {
                if let Some(status) = child.try_wait().expect("poll nats-server") {
                    panic!("nats-server exited at start ({status}): port {port:?} taken?");
                }
                // `{"nats":["nats://127.0.0.1:46449"]}`
                let listed = std::fs::read_to_string(&ports_file).unwrap_or_default();
                listening = listed
                    .split("nats://127.0.0.1:")
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                    .filter(|p: &u16| TcpStream::connect(("127.0.0.1", *p)).is_ok());
                listening.is_some()
            },
            Duration::from_secs(10),
            "nats-server listens",
        );
        let port = listening.expect("a port once listening");
        Broker { bin: bin.to_owned(), dir: dir.to_owned(), port, child, config }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`, for a [`crate::net::Relay`] in front of it.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `kill -9`, then the same server again on the same store and port.
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
        *self = Broker::start_with(
            &self.bin.clone(),
            &self.dir.clone(),
            Some(self.port),
            self.config.clone(),
        );
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
