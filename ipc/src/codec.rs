//! The frame codec: `u32` little-endian body length, then a bincode 2 (`config::standard()`)
//! body. Decoding never panics and never allocates more than a bounded multiple of the body it was
//! given: untrusted bytes cannot make a process abort.

use bincode::config::{self, Config};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::frame::Frame;

/// Why a byte stream could not be turned into frames. Any of these closes that one connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    #[error("malformed frame body: {0}")]
    Decode(String),
    #[error("connection closed in the middle of a frame ({have} of {want} bytes)")]
    Truncated { have: usize, want: usize },
    #[error("frame could not be encoded: {0}")]
    Encode(String),
    #[error(
        "a frame of {len} bytes would pass this peer's read budget ({cap} bytes in unfinished \
         frames across its connections): send one large frame at a time"
    )]
    OverBudget { len: u32, cap: usize },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// The bytes a group of connections (one agent's processes; or every other peer of a socket) may
/// hold in read buffers beyond a read chunk each, shared by their [`FrameReader`]s: a peer that
/// opens many connections and leaves a large frame unfinished on each costs the server this
/// much, not the frame limit times its connections. A reader that would pass it fails with
/// [`FrameError::OverBudget`], which closes that one connection.
#[derive(Debug)]
pub struct ReadBudget {
    cap: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl ReadBudget {
    pub fn new(cap: usize) -> std::sync::Arc<ReadBudget> {
        std::sync::Arc::new(ReadBudget { cap, used: Default::default() })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn take(&self, n: usize) -> bool {
        use std::sync::atomic::Ordering;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.cap)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
    }
}

/// What one reader holds of its budget, given back when its buffer shrinks or it is dropped.
#[derive(Debug, Default)]
struct Held {
    budget: Option<std::sync::Arc<ReadBudget>>,
    bytes: usize,
}

impl Held {
    fn release(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.bytes);
        }
        self.bytes = 0;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

fn cfg() -> impl Config {
    config::standard()
}

/// Appends the length-prefixed encoding of `frame` to `buf`.
pub fn encode_frame(frame: &Frame, buf: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    if let Err(e) = bincode::serde::encode_into_std_write(frame, buf, cfg()) {
        buf.truncate(start);
        return Err(FrameError::Encode(e.to_string()));
    }
    let len = buf.len() - start - 4;
    let Ok(len) = u32::try_from(len) else {
        buf.truncate(start);
        return Err(FrameError::Encode(format!("body of {len} bytes does not fit a u32 length")));
    };
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Decodes one frame body (without its length prefix). The whole body must be consumed.
pub fn decode_frame(body: &[u8]) -> Result<Frame, FrameError> {
    // bincode pre-allocates what a length field claims; a limit bounds that. A legitimate body
    // claims at most ~24 bytes per byte of input (a Vec<String> of empty strings), so the limit
    // tier is chosen from the body size: garbage cannot claim more than 32× what it sent.
    macro_rules! decode_with_limit {
        ($limit:expr) => {
            bincode::serde::decode_from_slice::<Frame, _>(
                body,
                config::standard().with_limit::<{ $limit }>(),
            )
        };
    }
    let need = body.len().saturating_mul(32);
    let result = if need <= 1 << 16 {
        decode_with_limit!(1 << 16)
    } else if need <= 1 << 20 {
        decode_with_limit!(1 << 20)
    } else if need <= 1 << 24 {
        decode_with_limit!(1 << 24)
    } else if need <= 1 << 28 {
        decode_with_limit!(1 << 28)
    } else {
        decode_with_limit!(1 << 31)
    };
    match result {
        Ok((frame, used)) if used == body.len() => Ok(frame),
        Ok((_, used)) => {
            Err(FrameError::Decode(format!("{} trailing bytes after the frame", body.len() - used)))
        }
        Err(e) => Err(FrameError::Decode(e.to_string())),
    }
}

/// Reads frames from a byte stream, decoding every complete frame a single `read` brought in.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame: u32,
    held: Held,
}

const READ_CHUNK: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame: u32) -> Self {
        FrameReader {
            inner,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            max_frame,
            held: Held::default(),
        }
    }

    /// Charges this reader's buffer beyond its first chunk to `budget` from now on.
    pub fn set_budget(&mut self, budget: std::sync::Arc<ReadBudget>) {
        self.held.release();
        self.held.budget = Some(budget);
    }

    /// Changes the largest frame accepted from now on (e.g. a small limit until the handshake,
    /// the swarm's limit after it).
    pub fn set_max_frame(&mut self, max_frame: u32) {
        self.max_frame = max_frame;
    }

    /// Waits for at least one frame, then appends every complete frame already buffered to `out`.
    /// Returns the number appended; `0` means the peer closed the stream cleanly between frames.
    pub async fn read_batch(&mut self, out: &mut Vec<Frame>) -> Result<usize, FrameError> {
        loop {
            let n = self.decode_buffered(out)?;
            if n > 0 {
                return Ok(n);
            }
            if !self.fill().await? {
                let have = self.end - self.start;
                if have == 0 {
                    return Ok(0);
                }
                let want = if have >= 4 { self.pending_len() as usize + 4 } else { 4 };
                return Err(FrameError::Truncated { have, want });
            }
        }
    }

    /// Reads exactly one frame; `None` on clean end of stream.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        loop {
            if let Some(f) = self.decode_one()? {
                return Ok(Some(f));
            }
            if !self.fill().await? {
                let have = self.end - self.start;
                if have == 0 {
                    return Ok(None);
                }
                let want = if have >= 4 { self.pending_len() as usize + 4 } else { 4 };
                return Err(FrameError::Truncated { have, want });
            }
        }
    }

    fn pending_len(&self) -> u32 {
        let mut len = [0u8; 4];
        len.copy_from_slice(&self.buf[self.start..self.start + 4]);
        u32::from_le_bytes(len)
    }

    fn decode_buffered(&mut self, out: &mut Vec<Frame>) -> Result<usize, FrameError> {
        let mut n = 0;
        while let Some(f) = self.decode_one()? {
            out.push(f);
            n += 1;
        }
        Ok(n)
    }

    fn decode_one(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.end - self.start < 4 {
            return Ok(None);
        }
        let len = self.pending_len();
        if len > self.max_frame {
            return Err(FrameError::TooLarge { len, max: self.max_frame });
        }
        let total = 4 + len as usize;
        if self.end - self.start < total {
            return Ok(None);
        }
        let body = &self.buf[self.start + 4..self.start + total];
        let frame = decode_frame(body)?;
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            // A large frame's buffer is given back once it is read: what a connection holds
            // between frames is a read chunk, however large the frames it once sent.
            if self.buf.len() > READ_CHUNK {
                self.buf = vec![0; READ_CHUNK];
                self.held.release();
            }
        }
        Ok(Some(frame))
    }

    /// Reads more bytes; false on end of stream.
    async fn fill(&mut self) -> Result<bool, FrameError> {
        // Make room: compact, and grow as bytes arrive — doubling, never to the length a peer
        // merely claims (300 peers claiming 16 MiB each must not cost 4.8 GiB).
        if self.start > 0 && (self.end == self.buf.len() || self.start > self.buf.len() / 2) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let need = if self.end - self.start >= 4 {
                self.pending_len() as usize + 4
            } else {
                READ_CHUNK
            };
            let new_len = need.min(self.buf.len() * 2).min(self.max_frame as usize + 4);
            if new_len <= self.buf.len() {
                // Cannot happen: the length was checked against max_frame before we got here.
                return Err(FrameError::TooLarge { len: need as u32, max: self.max_frame });
            }
            if let Some(budget) = &self.held.budget {
                let more = new_len - self.buf.len();
                if !budget.take(more) {
                    let len = need.saturating_sub(4) as u32;
                    return Err(FrameError::OverBudget { len, cap: budget.cap });
                }
                self.held.bytes += more;
            }
            self.buf.resize(new_len, 0);
        }
        let n = self.inner.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n > 0)
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

#[cfg(test)]
mod growth {
    use super::*;

    #[tokio::test]
    async fn the_buffer_grows_with_the_bytes_not_with_the_claim() {
        // A peer claims a 16 MiB frame and sends 200 KiB of it, then stops.
        let mut bytes = (16u32 << 20).to_le_bytes().to_vec();
        bytes.extend(std::iter::repeat_n(0u8, 200 * 1024));
        let mut reader = FrameReader::new(&bytes[..], 16 << 20);
        let err = reader.read_frame().await.unwrap_err();
        assert!(matches!(err, FrameError::Truncated { .. }), "{err:?}");
        assert!(reader.buf.len() <= 512 * 1024, "buffer of {} bytes", reader.buf.len());
    }

    #[tokio::test]
    async fn readers_sharing_a_budget_hold_at_most_the_budget_and_give_it_back() {
        let text = "x".repeat(3 << 20);
        let frame =
            Frame::new("a", "b", crate::Body::Send { text, mode: crate::SendMode::Durable });
        let mut whole = Vec::new();
        encode_frame(&frame, &mut whole).unwrap();
        let budget = ReadBudget::new(4 << 20);
        // One peer leaves 3 MiB of a frame unfinished on one connection…
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let first = tokio::spawn({
            let budget = budget.clone();
            async move {
                let mut reader = FrameReader::new(rx, 16 << 20);
                reader.set_budget(budget);
                reader.read_frame().await
            }
        });
        use tokio::io::AsyncWriteExt;
        tx.write_all(&whole[..whole.len() - 10]).await.unwrap();
        // (Its buffer doubles up to 2 MiB, then takes the frame's 3 MiB: about 2.94 MiB held.)
        while budget.used() < 5 << 19 {
            tokio::task::yield_now().await;
        }
        // …so a second frame as large, on another connection, would pass the budget: refused.
        let mut second = FrameReader::new(&whole[..], 16 << 20);
        second.set_budget(budget.clone());
        let err = second.read_frame().await.unwrap_err();
        assert!(matches!(err, FrameError::OverBudget { .. }), "{err:?}");
        drop(second);
        assert!(budget.used() < 3 << 20, "the refused reader gave back what it held");
        // The first frame completes, and its bytes are given back.
        tx.write_all(&whole[whole.len() - 10..]).await.unwrap();
        assert_eq!(first.await.unwrap().unwrap(), Some(frame.clone()));
        assert_eq!(budget.used(), 0);
        // Now there is room for it.
        let mut third = FrameReader::new(&whole[..], 16 << 20);
        third.set_budget(budget.clone());
        assert_eq!(third.read_frame().await.unwrap(), Some(frame));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_large_frames_buffer_is_given_back_once_it_is_read() {
        let text = "x".repeat(3 << 20);
        let frame =
            Frame::new("a", "b", crate::Body::Send { text, mode: crate::SendMode::Durable });
        let mut bytes = Vec::new();
        encode_frame(&frame, &mut bytes).unwrap();
        let mut reader = FrameReader::new(&bytes[..], 16 << 20);
        assert_eq!(reader.read_frame().await.unwrap(), Some(frame));
        assert_eq!(reader.buf.len(), READ_CHUNK, "the connection keeps the 3 MiB buffer");
        assert_eq!(reader.buf.capacity(), READ_CHUNK);
    }

    #[tokio::test]
    async fn a_lowered_limit_refuses_what_the_higher_one_took() {
        let frame = Frame::new("a", "b", crate::Body::Heartbeat);
        let mut bytes = Vec::new();
        encode_frame(&frame, &mut bytes).unwrap();
        let mut reader = FrameReader::new(&bytes[..], 4);
        assert!(matches!(reader.read_frame().await, Err(FrameError::TooLarge { .. })));
        let mut reader = FrameReader::new(&bytes[..], 4);
        reader.set_max_frame(1 << 20);
        assert_eq!(reader.read_frame().await.unwrap(), Some(frame));
    }
}
