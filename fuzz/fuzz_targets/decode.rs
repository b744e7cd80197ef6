//! Fuzz target: arbitrary bytes through the frame decoder and the streaming reader.
//! Run: `cargo +nightly fuzz run decode` from `fuzz/` (or `cargo fuzz run decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = flock_ipc::decode_frame(data);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let mut reader = flock_ipc::FrameReader::new(data, 1 << 20);
        let mut out = Vec::new();
        while let Ok(n) = reader.read_batch(&mut out).await {
            if n == 0 {
                break;
            }
        }
    });
});
