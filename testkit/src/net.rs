//! A network cut between one process and a server, on loopback: [`Relay`] forwards TCP
//! connections to a target address until it is [`Relay::cut`] — every open connection is shut
//! down and new ones are closed as soon as they are accepted, as a host cut off from the network
//! sees it — and forwards again once [`Relay::heal`]ed. Real sockets, so the client's own
//! reconnect logic runs.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A TCP relay to one address that can be cut and healed.
pub struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on an ephemeral loopback port and forwards to `target`.
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let relay = Relay { addr, cut: Arc::default(), open: Arc::default(), stop: Arc::default() };
        let (cut, open, stop) = (relay.cut.clone(), relay.open.clone(), relay.stop.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if cut.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let mut live = open.lock().unwrap_or_else(|p| p.into_inner());
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        live.push(c);
                    }
                }
                drop(live);
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        relay
    }

    /// `nats://127.0.0.1:PORT` of the relay.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Cuts every connection through the relay and refuses new ones until [`Relay::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        let mut live = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for s in live.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the acceptor so it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
