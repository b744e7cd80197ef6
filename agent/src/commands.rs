//! The worker tools that run something in the sandbox (`flock-sandbox`): `exec` (a shell
//! command in the workspace) and `http_fetch` (one HTTP request to a host the worker was granted).
//! Both read the agent's grants from the router first (for this agent only: the router answers
//! for the connection's identity), and both are journaled in the turn's chain and logged.

use std::time::Duration;

use flock_config::SandboxKind;
use serde_json::Value;

use crate::client::RouterClient;
use crate::output::{ToolOutput, forward};
use crate::workspace::Workspace;

/// Default and longest wall-clock time of one `exec` (a `timeout` grant raises the longest).
const EXEC_TIMEOUT_SECS: (u64, u64) = (60, 600);
/// Default and longest time of one `http_fetch`.
const FETCH_TIMEOUT_SECS: (u64, u64) = (30, 120);
/// Each output stream keeps this much for the model (head and tail).
const OUTPUT_BYTES: usize = 16 * 1024;
/// The fetch itself: fixed code, the request's parts in the environment (never in the shell
/// text). No redirects (a redirect's host would need its own grant), http(s) only, no proxy.
const CURL: &str = "curl -sS -i --noproxy '*' --proto '=http,https' --max-filesize 1048576 \
                    --max-time \"$FLOCK_SECS\" -X \"$FLOCK_METHOD\" --url \"$FLOCK_URL\"";

/// The grants in force for this agent (`permissions__grants`).
#[derive(Debug, Default)]
struct Grants {
    /// Hosts, each with the port it was granted for (`None`: any).
    hosts: Vec<(String, Option<u16>)>,
    read: Vec<std::path::PathBuf>,
    timeout_secs: u64,
}

impl Grants {
    async fn fetch(client: &RouterClient) -> Grants {
        let out = forward(client, "permissions__grants", &Value::Object(Default::default())).await;
        let rows: Vec<Value> = if out.ok {
            serde_json::from_str(&out.content).unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut g = Grants::default();
        for r in rows {
            let target = r["target"].as_str().unwrap_or_default();
            match r["capability"].as_str() {
                Some("network") => {
                    if let Ok(h) = host_port(target) {
                        g.hosts.push(h);
                    }
                }
                Some("read") => g.read.push(target.into()),
                Some("timeout") => {
                    g.timeout_secs = g.timeout_secs.max(target.parse().unwrap_or(0));
                }
                _ => {}
            }
        }
        g
    }

    fn network(&self) -> bool {
        !self.hosts.is_empty()
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|(h, p)| h == host && p.is_none_or(|p| p == port))
    }
}

/// `host`, `host:port` or `[v6]:port` → (lowercase host, port).
fn host_port(authority: &str) -> Result<(String, Option<u16>), String> {
    let bad_port = |p: &str| format!("`{p}` is not a port");
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, rest) = v6.split_once(']').ok_or("an IPv6 host needs its closing `]`")?;
            let port = match rest.strip_prefix(':') {
                Some(p) => Some(p.parse().map_err(|_| bad_port(p))?),
                None => None,
            };
            (h, port)
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p.parse().map_err(|_| bad_port(p))?)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// The host and port a URL reaches (`Err`: why it is refused).
fn target_of(url: &str) -> Result<(String, u16), String> {
    let (rest, default) = if let Some(r) = url.strip_prefix("https://") {
        (r, 443)
    } else if let Some(r) = url.strip_prefix("http://") {
        (r, 80)
    } else {
        return Err("only http:// and https:// URLs".into());
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the URL contains spaces or control characters".into());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("no credentials in URLs".into());
    }
    let (host, port) = host_port(authority)?;
    Ok((host, port.unwrap_or(default)))
}

fn describe(status: &flock_sandbox::Status, secs: u64) -> Result<(String, Option<i32>), String> {
    use flock_sandbox::Status;
    Ok(match status {
        Status::Exited(code) => (format!("exit {code}"), Some(*code)),
        Status::Signaled(sig) => {
            (format!("killed by signal {sig} (a limit: CPU, memory, file size)"), None)
        }
        Status::TimedOut => (format!("timed out after {secs} s and was killed"), None),
        Status::SetupFailed(why) => return Err(why.clone()),
    })
}

async fn run(
    sandbox: SandboxKind,
    policy: &flock_sandbox::Policy,
    secs: u64,
) -> Result<flock_sandbox::Output, ToolOutput> {
    let timeout = Duration::from_secs(secs);
    let ran = match sandbox {
        SandboxKind::Native => {
            flock_sandbox::run(&flock_sandbox::helper_path(), policy, timeout, OUTPUT_BYTES).await
        }
        SandboxKind::Docker => flock_sandbox::docker::run(policy, timeout, OUTPUT_BYTES).await,
    };
    ran.map_err(|e| ToolOutput::err(format!("INTERNAL: the sandbox did not start: {e}")))
}

fn streams(out: &flock_sandbox::Output, mut content: String) -> String {
    for (label, stream) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        if !stream.text.is_empty() {
            content.push_str(&format!("--- {label} ---\n{}", stream.text));
            if !stream.text.ends_with('\n') {
                content.push('\n');
            }
        }
    }
    content
}

async fn journal(client: &RouterClient, event: Value) {
    let _ = forward(client, "journal__event", &event).await;
}

/// `exec`: runs a command in the worker's workspace inside its sandbox (no network, no file
/// outside the workspace, bounded CPU, memory, processes and disk, unless granted more).
pub(crate) async fn exec(
    client: &RouterClient,
    sandbox: SandboxKind,
    ws: &Workspace,
    command: &str,
    timeout: Option<u64>,
) -> ToolOutput {
    if command.trim().is_empty() {
        return ToolOutput::err(
            "BAD_REQUEST: exec needs a `command`, e.g. `cargo test` or `ls -la`",
        );
    }
    let grants = Grants::fetch(client).await;
    let (default, max) = EXEC_TIMEOUT_SECS;
    let secs = timeout.unwrap_or(default).clamp(1, max.max(grants.timeout_secs));
    let mut policy = flock_sandbox::Policy::new(ws.path(), command);
    policy.network = grants.network();
    policy.read_only = grants.read;
    policy.limits.cpu_secs = policy.limits.cpu_secs.max(secs);
    let out = match run(sandbox, &policy, secs).await {
        Ok(out) => out,
        Err(e) => return e,
    };
    let (verdict, exit) = match describe(&out.status, secs) {
        Ok(v) => v,
        Err(why) => {
            tracing::warn!(tool = "exec", "exec `{command}` → the sandbox failed: {why}");
            return ToolOutput::err(format!("SANDBOX: the command did not run: {why}"));
        }
    };
    let taken = out.elapsed.as_secs_f64();
    tracing::info!(
        tool = "exec",
        exit = ?exit,
        ms = out.elapsed.as_millis() as u64,
        "exec `{command}` → {verdict} in {taken:.2} s"
    );
    journal(
        client,
        serde_json::json!({
            "type": "EXEC",
            "message": format!("`{command}` → {verdict} ({taken:.2} s)"),
            "params": {"command": command, "exit": exit, "ms": out.elapsed.as_millis() as u64},
        }),
    )
    .await;
    let content = streams(&out, format!("{verdict} in {taken:.2} s\n"));
    ToolOutput { ok: out.success(), content }
}

/// `http_fetch {url, method, body}`: one request, only to a host this worker holds a network
/// grant for (checked here, in code, before anything runs), made by fixed code in the sandbox.
pub(crate) async fn http_fetch(
    client: &RouterClient,
    sandbox: SandboxKind,
    ws: &Workspace,
    args: &Value,
) -> ToolOutput {
    let text = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or_default();
    let url = text("url").trim();
    let method = match text("method").trim().to_ascii_uppercase().as_str() {
        "" | "GET" => "GET",
        "POST" => "POST",
        other => {
            return ToolOutput::err(format!("BAD_REQUEST: method `{other}`: GET or POST"));
        }
    };
    let (host, port) = match target_of(url) {
        Ok(t) => t,
        Err(why) => return ToolOutput::err(format!("BAD_REQUEST: `{url}`: {why}")),
    };
    let grants = Grants::fetch(client).await;
    if !grants.allows(&host, port) {
        tracing::warn!(tool = "http_fetch", host = %host, "http_fetch {method} {url} → refused: no network grant for {host}");
        journal(
            client,
            serde_json::json!({
                "type": "HTTP_FETCH_BLOCKED",
                "message": format!("{method} {url}: no network grant for {host}"),
                "params": {"host": host, "port": port},
            }),
        )
        .await;
        return ToolOutput::err(format!(
            "FORBIDDEN: no network grant for {host}; ask with permission_request \
             {{capability: network, target: {host}, reason: …}}"
        ));
    }
    let (default, max) = FETCH_TIMEOUT_SECS;
    let secs = args.get("timeout_secs").and_then(Value::as_u64).unwrap_or(default).clamp(1, max);
    let command = if method == "POST" {
        format!("{CURL} --data-binary \"$FLOCK_BODY\"")
    } else {
        CURL.into()
    };
    let mut policy = flock_sandbox::Policy::new(ws.path(), command);
    policy.network = true;
    policy.env = vec![
        ("FLOCK_URL".into(), url.into()),
        ("FLOCK_METHOD".into(), method.into()),
        ("FLOCK_BODY".into(), text("body").into()),
        ("FLOCK_SECS".into(), secs.to_string()),
    ];
    let out = match run(sandbox, &policy, secs + 5).await {
        Ok(out) => out,
        Err(e) => return e,
    };
    if let flock_sandbox::Status::SetupFailed(why) = &out.status {
        return ToolOutput::err(format!("SANDBOX: the request was not made: {why}"));
    }
    let status_line = out.stdout.text.lines().next().unwrap_or_default().trim().to_string();
    let bytes = out.stdout.text.len() as u64 + out.stdout.omitted;
    let verdict = if out.success() { status_line.clone() } else { "failed".to_string() };
    tracing::info!(tool = "http_fetch", host = %host, bytes, "http_fetch {method} {url} → {verdict} ({bytes} bytes)");
    journal(
        client,
        serde_json::json!({
            "type": "HTTP_FETCH",
            "message": format!("{method} {url} → {verdict}"),
            "params": {"host": host, "method": method, "status": status_line, "bytes": bytes},
        }),
    )
    .await;
    if out.success() {
        ToolOutput::ok(out.stdout.text)
    } else {
        ToolOutput::err(streams(&out, "FETCH_FAILED: ".to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_reach_the_host_they_name() {
        assert_eq!(target_of("https://Crates.io/api").unwrap(), ("crates.io".into(), 443));
        assert_eq!(target_of("http://127.0.0.1:8080/x?y").unwrap(), ("127.0.0.1".into(), 8080));
        assert_eq!(target_of("http://[::1]:9/").unwrap(), ("::1".into(), 9));
        assert!(target_of("file:///etc/passwd").is_err());
        assert!(target_of("http://user:pw@evil.com@crates.io/").is_err());
        assert!(target_of("http://crates.io /x").is_err());
        assert!(target_of("http://:80/").is_err());
        let g = Grants {
            hosts: vec![("crates.io".into(), None), ("a.b".into(), Some(8080))],
            ..Default::default()
        };
        assert!(g.allows("crates.io", 443) && g.allows("a.b", 8080));
        assert!(!g.allows("a.b", 80) && !g.allows("static.crates.io", 443));
    }
}
