//! `flock-bridge`: a chat bridge process, started and supervised by `flock-supervisor` (one per
//! `bridges:` entry of the swarm file). Not meant to be run by hand — except
//! `flock-bridge check PLATFORM [API_URL]`, which `flockctl init` runs: it reads a token on
//! stdin (never argv or the environment, which other processes can read), asks the platform
//! whose bot it is, and prints one JSON line: `{"bot": NAME}` (exit 0), or `{"error": WHY,
//! "refused": BOOL}` (exit 1 when the platform refused the token, 3 when it could not be asked).

use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    flock_log::init("flock-bridge");
    // The platform token will be in this process's memory: nobody else may read it.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!("flock-bridge: warning: cannot make the process non-dumpable: {e}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("flock-bridge: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("check") {
        return ExitCode::from(runtime.block_on(check(&args[1..])));
    }
    ExitCode::from(runtime.block_on(flock_bridge::run()))
}

/// `check PLATFORM [API_URL]`, the token on stdin.
async fn check(args: &[String]) -> u8 {
    let say = |v: serde_json::Value| println!("{v}");
    let Some(platform) = args.first().and_then(|p| flock_config::Platform::parse(p)) else {
        say(
            serde_json::json!({"error": "usage: flock-bridge check telegram|discord|slack [API_URL]"}),
        );
        return 2;
    };
    let mut token = String::new();
    if std::io::stdin().read_line(&mut token).is_err() || token.trim().is_empty() {
        say(serde_json::json!({"error": "no token on standard input"}));
        return 2;
    }
    let asked = flock_bridge::whoami(platform, args.get(1).map(String::as_str), token.trim());
    match tokio::time::timeout(Duration::from_secs(20), asked).await {
        Ok(Ok(bot)) => {
            say(serde_json::json!({"bot": bot}));
            0
        }
        Ok(Err(e)) => {
            let refused = matches!(e, flock_bridge::PlatformError::Fatal(_));
            say(serde_json::json!({"error": e.to_string(), "refused": refused}));
            if refused { 1 } else { 3 }
        }
        Err(_) => {
            say(serde_json::json!({"error": "no answer within 20 s", "refused": false}));
            3
        }
    }
}
