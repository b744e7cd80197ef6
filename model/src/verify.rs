//! The model file check: it must exist and have the pinned sha256 (the wheels it is assembled
//! from come from an anonymous publisher). Hashing a 1.1 GB file takes a few seconds, so a verified
//! file is remembered in `<file>.sha256-ok` (size, mtime and hash); a file that changes since is
//! hashed again.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// The default model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, as `scripts/setup` installs it (the
/// supervisor passes `--sha256` for any other known model).
pub const MODEL_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
/// Its sha256 (shared/REFERENCES.md §5).
pub const MODEL_SHA256: &str = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046";

/// Why the model file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the model file {path} does not exist; run `scripts/setup` to fetch it")]
    Missing { path: PathBuf },
    #[error(
        "the model file {path} has sha256 {actual}, not the pinned {expected}: it is damaged or \
         another file; delete it and run `scripts/setup` (with `--model NAME` for another \
         model), or pass --no-verify to use another model on purpose"
    )]
    Mismatch { path: PathBuf, actual: String, expected: String },
    #[error("cannot read the model file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
}

/// `$FLOCK_HOME/models/<MODEL_FILE>` (`FLOCK_HOME` defaults to `~/.flock`).
pub fn default_model_path() -> Option<PathBuf> {
    let home = match std::env::var_os("FLOCK_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").filter(|h| !h.is_empty())?).join(".flock"),
    };
    Some(home.join("models").join(MODEL_FILE))
}

/// Whether the file is there and has the pinned hash; `Ok(true)` when the hash came from the
/// `.sha256-ok` record rather than a fresh read.
pub fn verify(path: &Path) -> Result<bool, VerifyError> {
    verify_against(path, MODEL_SHA256)
}

/// Whether the file is there and has the sha256 `expected` (lowercase hex).
pub fn verify_sha256(path: &Path, expected: &str) -> Result<bool, VerifyError> {
    verify_against(path, &expected.to_ascii_lowercase())
}

/// Only that the file exists (for `--no-verify`).
pub fn check_exists(path: &Path) -> Result<(), VerifyError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(VerifyError::Missing { path: path.to_path_buf() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(VerifyError::Missing { path: path.to_path_buf() })
        }
        Err(source) => Err(VerifyError::Read { path: path.to_path_buf(), source }),
    }
}

fn verify_against(path: &Path, expected: &str) -> Result<bool, VerifyError> {
    check_exists(path)?;
    let read_err = |source| VerifyError::Read { path: path.to_path_buf(), source };
    let stamp = stamp(path).map_err(read_err)?;
    let record = record_path(path);
    if std::fs::read_to_string(&record).is_ok_and(|r| r.trim() == format!("{stamp} {expected}")) {
        return Ok(true);
    }
    let actual = sha256_file(path).map_err(read_err)?;
    if actual != expected {
        let _stale = std::fs::remove_file(&record);
        let expected = expected.to_owned();
        return Err(VerifyError::Mismatch { path: path.to_path_buf(), actual, expected });
    }
    // Best effort: a read-only models directory only costs a re-hash next time.
    let _ = std::fs::write(&record, format!("{stamp} {expected}\n"));
    Ok(false)
}

fn record_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".sha256-ok");
    PathBuf::from(name)
}

/// `size mtime_ns`: what must not change for the record to stay valid.
fn stamp(path: &Path) -> std::io::Result<String> {
    let m = std::fs::metadata(path)?;
    let mtime = m.modified()?.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    Ok(format!("{} {mtime}", m.len()))
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(ctx.finish().as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // sha256("abc")
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn missing_file_names_the_setup_script() {
        let e = verify(Path::new("/nonexistent/model.gguf")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("/nonexistent/model.gguf") && text.contains("scripts/setup"),
            "{text}"
        );
    }

    #[test]
    fn a_verified_file_is_remembered_until_it_changes() {
        let dir = std::env::temp_dir().join(format!("flock-model-verify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m.gguf");
        std::fs::write(&f, "abc").unwrap();
        assert!(!verify_against(&f, ABC).unwrap(), "first check hashes");
        assert!(verify_against(&f, ABC).unwrap(), "second check uses the record");
        std::fs::write(&f, "abd").unwrap();
        let e = verify_against(&f, ABC).unwrap_err();
        assert!(matches!(e, VerifyError::Mismatch { .. }));
        let text = e.to_string();
        assert!(text.contains("m.gguf") && text.contains("scripts/setup"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
