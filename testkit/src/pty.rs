//! A command on a pseudo-terminal, as a person at a terminal runs it: its standard input,
//! output and error are the terminal (80 × 24, its controlling terminal), so prompts that
//! read keys and draw with escape codes behave as they do for a person. The test types with
//! [`Pty::send`] and waits for what the program drew with [`Pty::expect`].
//!
//! `openpty(3)` and the child's `setsid`/`TIOCSCTTY` are C calls: the only unsafe code here.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A running command on its own pseudo-terminal.
pub struct Pty {
    child: Child,
    master: File,
    screen: Arc<(Mutex<Screen>, Condvar)>,
}

#[derive(Default)]
struct Screen {
    /// Everything the program wrote.
    raw: Vec<u8>,
    /// How much of its text (escape codes taken out) [`Pty::expect`] has consumed.
    seen: usize,
    /// The terminal closed (the program and all it started have let go of it).
    closed: bool,
}

impl Screen {
    /// What the program drew since what was consumed, escape codes taken out.
    fn unseen(&self) -> String {
        plain(&String::from_utf8_lossy(&self.raw)).get(self.seen..).unwrap_or("").to_owned()
    }
}

/// The arrow keys and Enter, as a terminal sends them.
pub const DOWN: &str = "\x1b[B";
pub const ENTER: &str = "\r";

impl Pty {
    /// Starts `cmd` on a new pseudo-terminal, in a session of its own.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Pty> {
        let (master, slave) = open()?;
        cmd.stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        // `cmd` holds the parent's copies of the terminal's end until told otherwise: closed
        // here, so the reader sees the end when the program exits.
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let master = File::from(master);
        let screen: Arc<(Mutex<Screen>, Condvar)> = Arc::default();
        let mut reader = master.try_clone()?;
        let shared = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = reader.read(&mut buf).unwrap_or(0); // EIO once the terminal is closed
                let (lock, cv) = &*shared;
                let mut s = lock.lock().unwrap();
                if n == 0 {
                    s.closed = true;
                    cv.notify_all();
                    return;
                }
                s.raw.extend_from_slice(&buf[..n]);
                cv.notify_all();
            }
        });
        Ok(Pty { child, master, screen })
    }

    /// Types `keys`.
    pub fn send(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).expect("write to the terminal");
    }

    /// Waits until the program has drawn `text` (escape codes ignored) after what earlier calls
    /// waited for, and consumes the screen up to it; panics with the screen after `timeout`.
    pub fn expect(&mut self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.screen;
        let mut s = lock.lock().unwrap();
        loop {
            let unseen = s.unseen();
            if let Some(at) = unseen.find(text) {
                s.seen += at + text.len();
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && !s.closed,
                "the terminal never showed {text:?}; since the last answer it shows:\n{unseen}"
            );
            s = cv.wait_timeout(s, left).unwrap().0;
        }
    }

    /// Waits for the program to exit; returns its status and what it drew since the last
    /// [`Pty::expect`].
    pub fn wait(mut self, timeout: Duration) -> (ExitStatus, String) {
        let status = crate::proc::wait_timeout(&mut self.child, timeout);
        let rest = self.screen.0.lock().unwrap().unseen();
        match status {
            Some(status) => (status, rest),
            None => {
                let _ = self.child.kill();
                panic!("the program did not exit within {timeout:?}; the terminal shows:\n{rest}")
            }
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new pseudo-terminal of 80 × 24: (master, slave).
fn open() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut master = -1;
    let mut slave = -1;
    let size = libc::winsize { ws_row: 24, ws_col: 80, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: the out-pointers are valid; no name buffer; termios left to the defaults.
    let rc = unsafe {
        libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openpty returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) })
}

/// `s` without ANSI escape sequences (CSI `ESC [ … letter`, and two-byte `ESC x`).
fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.next_if_eq(&'[').is_some() {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() || c == '~' {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escape_codes_are_taken_out() {
        assert_eq!(
            super::plain("\x1b[1m\x1b[32m✔\x1b[0m team · \x1b[2Koffice\x1b7"),
            "✔ team · office"
        );
    }
}
