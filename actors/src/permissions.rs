//! Permission requests (issue #11): a worker that needs more than its sandbox gives asks with
//! `permission_request`; the request is a durable record before it is acknowledged; the sysadmin
//! agent classifies it (`permission_verdict`: GREEN, YELLOW or RED); code then applies rules no
//! model can override:
//!
//! - some things are **never** granted, whoever asks or approves: writes outside the workspace,
//!   the state dir (database, logs, other agents' workspaces), secrets (`/etc/shadow`, `~/.ssh`,
//!   …), `/proc`, `/sys`, `/dev`, or a folder that contains any of them;
//! - GREEN grants at once only what is safe to grant without a person (reading a system path, a
//!   longer timeout); anything else (network: the sandbox cannot yet confine it to one host)
//!   waits for a person as if RED;
//! - YELLOW sends the sysadmin's question back to the requester;
//! - RED waits for a person: `flockctl approvals`, `flockctl approve|deny ID`.
//!
//! The memory runtime asks here too, never an agent: warm memory due for cold storage
//! ([`propose_archive`], requester [`MEMORY_REQUESTER`]) waits for a person, and an approval
//! comes back as [`Effects::archive`] (the router has the memory thread move the files).
//!
//! A grant is scoped to one agent and one capability, with an optional expiry, and is enforced by
//! the sandbox (the agent reads its grants from here before each command, through its own
//! connection). Everything runs inside the store actor (the only writer) as a job; what others
//! must hear (messages to wake the sysadmin or the requester, journal events) comes back as
//! [`Effects`] for the router to carry out.

use std::path::{Component, Path, PathBuf};

use flock_ipc::ToolError;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::caller::Caller;

/// Longest `exec` timeout a grant can give, in seconds.
pub const MAX_TIMEOUT_SECS: u64 = 3600;

/// What a worker may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capability {
    /// Network access for `exec` (host as asked, for the record and the person deciding).
    Network(String),
    /// Read (and execute) a folder or file outside the workspace.
    Read(PathBuf),
    /// A longer `exec` timeout, in seconds.
    Timeout(u64),
    /// Warm memory day files dated up to this day (`YYYY-MM-DD`) moved to cold storage: asked
    /// by the memory runtime only, decided by a person only.
    Archive(String),
}

impl Capability {
    pub fn parse(kind: &str, target: &str) -> Result<Capability, String> {
        let target = target.trim();
        match kind.trim() {
            "network" => {
                let host = target.trim_start_matches("https://").trim_start_matches("http://");
                let host = host.split('/').next().unwrap_or_default();
                let ok = !host.is_empty()
                    && host.len() <= 253
                    && host.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c));
                if !ok {
                    return Err(format!(
                        "`{target}` is not a host; give one like `crates.io` or `api.github.com:443`"
                    ));
                }
                Ok(Capability::Network(host.to_ascii_lowercase()))
            }
            "read" => {
                let p = Path::new(target);
                if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
                    return Err(format!(
                        "`{target}` must be an absolute path without `..`, e.g. /usr/share/dict"
                    ));
                }
                Ok(Capability::Read(p.components().collect()))
            }
            "timeout" => match target.trim_end_matches('s').parse::<u64>() {
                Ok(secs) if (1..=MAX_TIMEOUT_SECS).contains(&secs) => Ok(Capability::Timeout(secs)),
                _ => {
                    Err(format!("`{target}` is not a timeout in seconds (1 to {MAX_TIMEOUT_SECS})"))
                }
            },
            "write" => Err("writes outside the workspace are never granted: write in your \
                            workspace and say where the result is"
                .into()),
            "archive" => Err("moving memory to cold storage is asked for by the memory \
                              runtime, not by agents"
                .into()),
            other => Err(format!(
                "`{other}` is not a capability; ask for one of: network (a host), read (an \
                 absolute path), timeout (seconds)"
            )),
        }
    }

    /// A stored request's capability (the memory runtime's `archive` included).
    pub fn stored(kind: &str, target: &str) -> Result<Capability, String> {
        match kind {
            "archive" => Ok(Capability::Archive(target.to_owned())),
            _ => Capability::parse(kind, target),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Capability::Network(_) => "network",
            Capability::Read(_) => "read",
            Capability::Timeout(_) => "timeout",
            Capability::Archive(_) => "archive",
        }
    }

    pub fn target(&self) -> String {
        match self {
            Capability::Network(h) => h.clone(),
            Capability::Read(p) => p.display().to_string(),
            Capability::Timeout(s) => s.to_string(),
            Capability::Archive(until) => until.clone(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Capability::Network(h) => format!("network access to {h}"),
            Capability::Read(p) => format!("read access to {}", p.display()),
            Capability::Timeout(s) => format!("commands of up to {s} s"),
            Capability::Archive(until) => {
                format!("moving warm memory dated up to {until} to cold storage")
            }
        }
    }
}

/// Paths code never opens to a sandbox, and the rules GREEN may apply alone.
#[derive(Debug, Clone)]
pub struct Invariants {
    /// The state dir, every agent's workspace (some may live outside the state dir): never.
    pub protected: Vec<PathBuf>,
    /// Where a sandbox has a private folder of its own (`/tmp`): a grant there would show
    /// nothing, so it is refused.
    pub private_tmp: PathBuf,
}

/// Secrets and kernel interfaces, never granted (nor any folder that contains one).
const SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/root",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/boot",
];
/// Parts of a path that mark a secret wherever they appear.
const SECRET_PARTS: &[&str] =
    &[".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".netrc", ".git-credentials"];

/// Names of files that hold keys or credentials (a folder holding one is not GREEN).
const SECRET_FILES: &[&str] = &[
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    ".env",
    ".pgpass",
    ".my.cnf",
    "credentials",
    ".htpasswd",
];
/// Extensions of key files.
const SECRET_EXTENSIONS: &[&str] = &["pem", "key", "p12", "pfx", "keystore", "jks"];
/// Entries a GREEN check looks at in a folder to be granted; more, and a person decides.
const GREEN_SCAN_MAX: usize = 10_000;

impl Invariants {
    pub fn new(protected: Vec<PathBuf>) -> Self {
        Invariants { protected, private_tmp: PathBuf::from("/tmp") }
    }

    /// Why code never grants `cap`, whatever a model or a person says; `None` if it may. A path
    /// is judged as written and as it really is (symlinks resolved): a link to the state dir is
    /// the state dir.
    pub fn never(&self, cap: &Capability) -> Option<String> {
        let Capability::Read(path) = cap else { return None };
        if let Some(why) = self.never_path(path) {
            return Some(why);
        }
        if let Ok(real) = std::fs::canonicalize(path)
            && real != *path
            && let Some(why) = self.never_path(&real)
        {
            return Some(format!("{} is a link to {}: {why}", path.display(), real.display()));
        }
        if path.starts_with(&self.private_tmp) {
            return Some(format!(
                "{} is under {}, and a sandbox has a private {} of its own: the grant would \
                 show nothing; put the files elsewhere (e.g. /srv/data) and ask for that",
                path.display(),
                self.private_tmp.display(),
                self.private_tmp.display()
            ));
        }
        None
    }

    fn never_path(&self, path: &Path) -> Option<String> {
        let overlaps = |p: &Path| {
            let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            path.starts_with(p)
                || p.starts_with(path)
                || path.starts_with(&real)
                || real.starts_with(path)
        };
        if path == Path::new("/") {
            return Some("the whole filesystem holds the state dir and secrets".into());
        }
        if let Some(p) = self.protected.iter().find(|p| overlaps(p)) {
            return Some(format!(
                "{} is Flock's state (the database, logs, agents' workspaces) or holds it: {}",
                path.display(),
                p.display()
            ));
        }
        if let Some(p) = SECRETS.iter().map(Path::new).find(|p| overlaps(p)) {
            return Some(format!(
                "{} is or holds secrets or kernel interfaces ({})",
                path.display(),
                p.display()
            ));
        }
        if path.components().any(|c| SECRET_PARTS.iter().any(|s| c.as_os_str() == *s)) {
            return Some(format!("{} holds credentials", path.display()));
        }
        None
    }

    /// Whether a GREEN verdict may grant `cap` without a person (`Err`: why a person decides).
    /// A read grant is judged by what it opens: the whole folder is looked through (links not
    /// followed), and one that holds keys or credentials anywhere — or is too big to look
    /// through — waits for a person.
    pub fn green_may_grant(&self, cap: &Capability) -> Result<(), String> {
        match cap {
            Capability::Network(_) => Err("network access reaches beyond the requested host \
                                           (the sandbox gives the whole network), so a person \
                                           approves it"
                .into()),
            Capability::Read(path) => match secret_inside(path) {
                Ok(None) => Ok(()),
                Ok(Some(found)) => Err(format!(
                    "{} holds what looks like a key or credentials ({}), so a person decides",
                    path.display(),
                    found.display()
                )),
                Err(why) => Err(why),
            },
            Capability::Timeout(_) => Ok(()),
            Capability::Archive(_) => {
                Err("moving memory to cold storage needs a person's explicit approval".into())
            }
        }
    }
}

/// The first file or folder under `path` (itself included, links not followed) whose name says
/// it holds keys or credentials; `Err` when there is too much to look through.
fn secret_inside(path: &Path) -> Result<Option<PathBuf>, String> {
    let secret = |p: &Path| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        SECRET_PARTS.contains(&name)
            || SECRET_FILES.contains(&name)
            || p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| SECRET_EXTENSIONS.contains(&e))
    };
    let mut todo = vec![path.to_path_buf()];
    let mut seen = 0usize;
    while let Some(p) = todo.pop() {
        if secret(&p) {
            return Ok(Some(p));
        }
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        if !meta.is_dir() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&p) else { continue };
        for e in entries.flatten() {
            seen += 1;
            if seen > GREEN_SCAN_MAX {
                return Err(format!(
                    "{} holds more than {GREEN_SCAN_MAX} files and folders, too many to check for \
                     keys, so a person decides",
                    path.display()
                ));
            }
            todo.push(e.path());
        }
    }
    Ok(None)
}

/// A stored request, as `flockctl approvals` and the tools show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    pub id: i64,
    pub agent: String,
    pub capability: String,
    pub target: String,
    pub reason: String,
    /// `pending` (with the sysadmin), `asked` (YELLOW: a question went back), `waiting` (for a
    /// person), `granted`, `denied`.
    pub state: String,
    pub verdict: Option<String>,
    pub verdict_reason: Option<String>,
    pub decided_by: Option<String>,
    pub created_ms: i64,
    pub decided_ms: Option<i64>,
    pub expires_ms: Option<i64>,
}

/// What the router must do after a permission operation: wake agents, write the journal.
#[derive(Debug, Default)]
pub struct Effects {
    /// (from, to, text): a durable message, a new chain nobody waits on.
    pub notify: Vec<(String, String, String)>,
    pub journal: Vec<Logged>,
    /// A person approved moving warm memory dated up to this day to cold: (the day, who).
    pub archive: Option<(String, String)>,
}

/// A journal event of a permission operation.
#[derive(Debug)]
pub struct Logged {
    /// An agent, `human:NAME`, or `flock` for the rules themselves.
    pub who: String,
    pub kind: &'static str,
    pub message: String,
    pub request: i64,
    pub params: Vec<(&'static str, String)>,
}

impl Effects {
    fn log(&mut self, who: &str, kind: &'static str, message: String, r: &Request) {
        self.journal.push(Logged {
            who: who.to_owned(),
            kind,
            message,
            request: r.id,
            params: vec![
                ("agent", r.agent.clone()),
                ("capability", r.capability.clone()),
                ("target", r.target.clone()),
                ("reason", r.reason.clone()),
            ],
        });
    }
}

/// The answer to a permission operation: for the caller (its text, or why it was refused — a
/// refusal still has effects: it is journaled), and for the router.
#[derive(Debug)]
pub struct Reply {
    pub answer: Result<String, ToolError>,
    pub effects: Effects,
}

impl Reply {
    fn ok(text: String, effects: Effects) -> Self {
        Reply { answer: Ok(text), effects }
    }
}

/// Runs permission tool `tool` for `caller`. `key`: the call's id (a replayed turn sends the
/// same), `sysadmin`: the swarm's sysadmin agent, if any. `Err`: refused before anything was
/// written.
#[allow(clippy::too_many_arguments)]
pub fn call(
    conn: &Connection,
    inv: &Invariants,
    caller: &Caller,
    sysadmin: Option<&str>,
    tool: &str,
    args: &serde_json::Value,
    key: &[u8],
    now_ms: i64,
) -> Result<Reply, ToolError> {
    let text = |k: &str| args.get(k).and_then(serde_json::Value::as_str).unwrap_or_default();
    let id = || {
        args.get("id")
            .and_then(|v| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.trim_start_matches('#').parse().ok()))
            })
            .ok_or_else(|| {
                ToolError::bad_request(format!("{tool} needs the request's `id` (a number)"))
            })
    };
    let human = caller.role.is_none();
    let allowed = match caller.role {
        Some(role) => role.may_use(tool) && tool != "permission_decide",
        None => matches!(tool, "permission_list" | "permission_decide"),
    };
    if !allowed {
        let who = caller.role.map_or("person", |r| r.as_str());
        return Err(ToolError::forbidden(format!("a {who} may not use {tool}")));
    }
    let json = |rows: Vec<Request>| {
        let text = serde_json::to_string(&rows).map_err(|e| ToolError::internal(e.to_string()))?;
        Ok(Reply::ok(text, Effects::default()))
    };
    match tool {
        "permission_request" => request(
            conn,
            inv,
            &caller.id,
            text("capability"),
            text("target"),
            text("reason"),
            key,
            sysadmin,
            now_ms,
        ),
        "permission_verdict" => verdict(
            conn,
            inv,
            &caller.id,
            id()?,
            text("verdict"),
            text("reason"),
            text("question"),
            now_ms,
        ),
        "permission_decide" if human => {
            let approve = args.get("approve").and_then(serde_json::Value::as_bool).unwrap_or(false);
            let expires = args
                .get("expires_secs")
                .and_then(serde_json::Value::as_i64)
                .filter(|s| *s > 0)
                .map(|s| now_ms + s * 1000);
            decide(conn, inv, &caller.id, id()?, approve, text("reason"), expires, now_ms)
        }
        "permission_list" => {
            let all = args.get("all").and_then(serde_json::Value::as_bool).unwrap_or(false);
            json(list(conn, all)?)
        }
        "permissions__grants" => json(grants(conn, &caller.id, now_ms)?),
        other => Err(ToolError::bad_request(format!("no permission tool `{other}`"))),
    }
}

const COLUMNS: &str = "id, agent, capability, target, reason, state, verdict, verdict_reason, \
                       decided_by, created_ms, decided_ms, expires_ms";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Request> {
    Ok(Request {
        id: r.get(0)?,
        agent: r.get(1)?,
        capability: r.get(2)?,
        target: r.get(3)?,
        reason: r.get(4)?,
        state: r.get(5)?,
        verdict: r.get(6)?,
        verdict_reason: r.get(7)?,
        decided_by: r.get(8)?,
        created_ms: r.get(9)?,
        decided_ms: r.get(10)?,
        expires_ms: r.get(11)?,
    })
}

fn db(e: rusqlite::Error) -> ToolError {
    ToolError::internal(format!("the permission store failed: {e}"))
}

pub fn get(conn: &Connection, id: i64) -> Result<Option<Request>, ToolError> {
    conn.query_row(&format!("SELECT {COLUMNS} FROM permissions WHERE id = ?1"), [id], row)
        .optional()
        .map_err(db)
}

/// Requests, newest first: the open ones (pending, asked, waiting), or all of them.
pub fn list(conn: &Connection, all: bool) -> Result<Vec<Request>, ToolError> {
    let filter = if all { "" } else { "WHERE state IN ('pending', 'asked', 'waiting')" };
    let mut st = conn
        .prepare(&format!("SELECT {COLUMNS} FROM permissions {filter} ORDER BY id DESC LIMIT 500"))
        .map_err(db)?;
    let rows = st.query_map([], row).map_err(db)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(db)
}

impl crate::store::Store {
    /// What `permission_list` answers a person with (the open requests; `all`: every one),
    /// read here without the router: a person's read, which the dashboard samples.
    pub fn permissions_list(&self, all: bool) -> Result<Vec<Request>, ToolError> {
        list(&self.conn, all)
    }

    /// The requests waiting for a person, oldest first (announced again in chats at start).
    pub fn permissions_waiting(&self) -> Result<Vec<Request>, crate::store::StoreError> {
        let mut st = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM permissions WHERE state = 'waiting' ORDER BY id LIMIT 500"
        ))?;
        let rows = st.query_map([], row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

/// The grants of `agent` in force at `now_ms`.
pub fn grants(conn: &Connection, agent: &str, now_ms: i64) -> Result<Vec<Request>, ToolError> {
    let mut st = conn
        .prepare(&format!(
            "SELECT {COLUMNS} FROM permissions WHERE agent = ?1 AND state = 'granted' \
             AND (expires_ms IS NULL OR expires_ms > ?2) ORDER BY id"
        ))
        .map_err(db)?;
    let rows = st.query_map(params![agent, now_ms], row).map_err(db)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(db)
}

/// Stores a worker's request (once per `key`: a replayed turn gets the same record) and wakes
/// the sysadmin — or, with none in the swarm, leaves it for a person.
#[allow(clippy::too_many_arguments)]
pub fn request(
    conn: &Connection,
    inv: &Invariants,
    agent: &str,
    kind: &str,
    target: &str,
    reason: &str,
    key: &[u8],
    sysadmin: Option<&str>,
    now_ms: i64,
) -> Result<Reply, ToolError> {
    let cap = Capability::parse(kind, target).map_err(ToolError::bad_request)?;
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ToolError::bad_request(
            "say why you need it (`reason`): the sysadmin decides on it",
        ));
    }
    let existing: Option<i64> = conn
        .query_row("SELECT id FROM permissions WHERE request_key = ?1", [key], |r| r.get(0))
        .optional()
        .map_err(db)?;
    if let Some(id) = existing {
        let r = get(conn, id)?.ok_or(ToolError::internal("a stored request vanished"))?;
        return Ok(Reply::ok(
            format!("request #{id} is {} (already asked)", r.state),
            Effects::default(),
        ));
    }
    let mut effects = Effects::default();
    let never = inv.never(&cap);
    let state = match (&never, sysadmin) {
        (Some(_), _) => "denied",
        (None, Some(_)) => "pending",
        (None, None) => "waiting",
    };
    conn.execute(
        "INSERT INTO permissions (agent, capability, target, reason, state, created_ms, \
         request_key, verdict_reason, decided_by, decided_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            agent,
            cap.kind(),
            cap.target(),
            clip(reason, 1000),
            state,
            now_ms,
            key,
            never.as_deref().map(|n| format!("never granted: {n}")),
            never.as_ref().map(|_| "flock"),
            never.as_ref().map(|_| now_ms),
        ],
    )
    .map_err(db)?;
    let r = get(conn, conn.last_insert_rowid())?
        .ok_or(ToolError::internal("the request was not stored"))?;
    effects.log(
        agent,
        "PERMISSION_REQUEST",
        format!("asks for {}: {}", cap.describe(), r.reason),
        &r,
    );
    let answer = match (never, sysadmin) {
        (Some(why), _) => {
            effects.log("flock", "PERMISSION_BLOCKED", format!("never granted: {why}"), &r);
            let text = ToolError::forbidden(format!("request #{} is refused: {why}", r.id));
            return Ok(Reply { answer: Err(text), effects });
        }
        (None, Some(sysadmin)) => {
            effects.notify.push((
                agent.to_owned(),
                sysadmin.to_owned(),
                format!(
                    "[permission_request #{id}] {agent} asks for {what}.\nWhy (the worker's \
                     words): {reason}\nDecide with permission_verdict: id {id}, verdict GREEN \
                     (safe: grant it), YELLOW (unclear: ask a question back) or RED (risky: a \
                     person decides), and a one-line reason.",
                    id = r.id,
                    what = cap.describe(),
                    reason = r.reason,
                ),
            ));
            format!(
                "request #{} stored and sent to {sysadmin}; you will get a message when it is \
                 decided. Go on with what you can do without it.",
                r.id
            )
        }
        (None, None) => {
            effects.log("flock", "PERMISSION_WAITING", "no sysadmin: a person decides".into(), &r);
            format!("request #{} stored; a person decides (`flockctl approvals`)", r.id)
        }
    };
    Ok(Reply::ok(answer, effects))
}

/// The sysadmin's verdict on request `id`, applied by the fixed rules.
#[allow(clippy::too_many_arguments)]
pub fn verdict(
    conn: &Connection,
    inv: &Invariants,
    sysadmin: &str,
    id: i64,
    verdict: &str,
    reason: &str,
    question: &str,
    now_ms: i64,
) -> Result<Reply, ToolError> {
    let r = get(conn, id)?
        .ok_or_else(|| ToolError::bad_request(format!("no permission request #{id}")))?;
    if r.state != "pending" {
        let msg = format!("request #{id} is {} already, not pending", r.state);
        return Err(ToolError::bad_request(msg));
    }
    if r.agent == sysadmin {
        return Err(ToolError::forbidden("the sysadmin cannot decide its own requests"));
    }
    let verdict = verdict.trim().to_ascii_uppercase();
    let reason = clip(reason.trim(), 500);
    let cap = Capability::stored(&r.capability, &r.target).map_err(ToolError::internal)?;
    let mut effects = Effects::default();
    effects.log(sysadmin, "PERMISSION_VERDICT", format!("{verdict}: {reason}"), &r);
    let set = |state: &str, by: Option<&str>| {
        conn.execute(
            "UPDATE permissions SET state = ?2, verdict = ?3, verdict_reason = ?4, \
             decided_by = ?5, decided_ms = CASE WHEN ?5 IS NULL THEN NULL ELSE ?6 END \
             WHERE id = ?1",
            params![id, state, verdict, reason, by, now_ms],
        )
        .map_err(db)
    };
    let answer = match verdict.as_str() {
        "GREEN" => {
            if let Some(why) = inv.never(&cap) {
                // Never reached in practice (refused at request time), kept as the rule.
                set("denied", Some("flock"))?;
                effects.log("flock", "PERMISSION_BLOCKED", format!("GREEN overruled: {why}"), &r);
                effects.notify.push((sysadmin.to_owned(), r.agent.clone(), denied_text(&r, &why)));
                format!("request #{id} cannot be granted by anyone: {why}")
            } else if let Err(why) = inv.green_may_grant(&cap) {
                set("waiting", None)?;
                effects.log(
                    "flock",
                    "PERMISSION_WAITING",
                    format!("GREEN needs a person: {why}"),
                    &r,
                );
                format!("noted; request #{id} waits for a person: {why}")
            } else {
                set("granted", Some(sysadmin))?;
                effects.log(sysadmin, "PERMISSION_GRANTED", cap.describe(), &r);
                effects.notify.push((
                    sysadmin.to_owned(),
                    r.agent.clone(),
                    granted_text(&r, &cap, sysadmin, &reason),
                ));
                format!("request #{id} granted to {}", r.agent)
            }
        }
        "YELLOW" => {
            let question = question.trim();
            if question.is_empty() {
                return Err(ToolError::bad_request("YELLOW needs a `question` for the requester"));
            }
            set("asked", Some(sysadmin))?;
            effects.notify.push((
                sysadmin.to_owned(),
                r.agent.clone(),
                format!(
                    "[permission #{id} question] About your request for {}: {question}\nAnswer by \
                     asking again with permission_request and a fuller reason.",
                    cap.describe()
                ),
            ));
            format!("question sent to {}", r.agent)
        }
        "RED" => {
            set("waiting", None)?;
            effects.log("flock", "PERMISSION_WAITING", "RED: a person decides".into(), &r);
            format!("request #{id} waits for a person (`flockctl approve {id}` or `deny {id}`)")
        }
        other => {
            let msg = format!("verdict `{other}` is not one of GREEN, YELLOW, RED");
            return Err(ToolError::bad_request(msg));
        }
    };
    Ok(Reply::ok(answer, effects))
}

/// A person's decision (`flockctl approve|deny`): on any open request; the never-rules hold.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    conn: &Connection,
    inv: &Invariants,
    person: &str,
    id: i64,
    approve: bool,
    reason: &str,
    expires_ms: Option<i64>,
    now_ms: i64,
) -> Result<Reply, ToolError> {
    let r = get(conn, id)?
        .ok_or_else(|| ToolError::bad_request(format!("no permission request #{id}")))?;
    if !matches!(r.state.as_str(), "pending" | "asked" | "waiting") {
        return Err(ToolError::bad_request(format!("request #{id} is {} already", r.state)));
    }
    let cap = Capability::stored(&r.capability, &r.target).map_err(ToolError::internal)?;
    let reason = clip(reason.trim(), 500);
    let mut effects = Effects::default();
    if approve && let Some(why) = inv.never(&cap) {
        effects.log(person, "PERMISSION_BLOCKED", format!("approval refused: {why}"), &r);
        let text =
            ToolError::forbidden(format!("request #{id} cannot be granted by anyone: {why}"));
        return Ok(Reply { answer: Err(text), effects });
    }
    let state = if approve { "granted" } else { "denied" };
    conn.execute(
        "UPDATE permissions SET state = ?2, decided_by = ?3, decided_ms = ?4, expires_ms = ?5, \
         verdict_reason = CASE WHEN ?6 = '' THEN verdict_reason ELSE ?6 END WHERE id = ?1",
        params![id, state, person, now_ms, expires_ms, reason],
    )
    .map_err(db)?;
    let text = if approve {
        effects.log(person, "PERMISSION_GRANTED", cap.describe(), &r);
        granted_text(&r, &cap, person, &reason)
    } else {
        let why = if reason.is_empty() { "no reason given".to_string() } else { reason.clone() };
        effects.log(person, "PERMISSION_DENIED", why.clone(), &r);
        denied_text(&r, &why)
    };
    match &cap {
        // The runtime asked: no agent to tell; an approval is the move itself.
        Capability::Archive(until) => {
            effects.archive = approve.then(|| (until.clone(), person.to_owned()));
        }
        _ => effects.notify.push((person.to_owned(), r.agent.clone(), text)),
    }
    Ok(Reply::ok(format!("request #{id} {state} ({} for {})", cap.describe(), r.agent), effects))
}

/// Who asks when the memory runtime asks (not an agent name: those have no `:`).
pub const MEMORY_REQUESTER: &str = "flock:memory";

/// After a person decided, the memory runtime asks again only this long later (so what comes due
/// day by day is asked about once a month, not every day).
const ASK_AGAIN_AFTER_MS: i64 = 30 * 86_400_000;

/// What the memory runtime found due for cold storage (`flock_memory::tiers::ColdDue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveDue {
    pub until: String,
    pub first: String,
    pub files: usize,
    pub records: usize,
    pub cold_after_days: u32,
}

/// The memory runtime's request to move warm memory to cold storage: stored waiting for a
/// person — unless one is open already, or a person decided one in the last 30 days (`None`:
/// nothing asked).
pub fn propose_archive(
    conn: &Connection,
    due: &ArchiveDue,
    now_ms: i64,
) -> Result<Option<Reply>, ToolError> {
    let held: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM permissions WHERE capability = 'archive' AND (state IN \
             ('pending', 'asked', 'waiting') OR (state IN ('denied', 'granted') AND \
             decided_ms > ?1))",
            [now_ms - ASK_AGAIN_AFTER_MS],
            |r| r.get(0),
        )
        .map_err(db)?;
    if held > 0 {
        return Ok(None);
    }
    let cap = Capability::Archive(due.until.clone());
    let reason = format!(
        "{} day files ({} records, {} … {}) are older than {} days: cold memory is searched \
         only when asked (`flockctl memory search --all`) and is left out of active memory",
        due.files, due.records, due.first, due.until, due.cold_after_days
    );
    let key = format!("archive:{}:{now_ms}", due.until);
    conn.execute(
        "INSERT INTO permissions (agent, capability, target, reason, state, created_ms, \
         request_key) VALUES (?1, ?2, ?3, ?4, 'waiting', ?5, ?6)",
        params![MEMORY_REQUESTER, cap.kind(), cap.target(), reason, now_ms, key.as_bytes()],
    )
    .map_err(db)?;
    let r = get(conn, conn.last_insert_rowid())?
        .ok_or(ToolError::internal("the request was not stored"))?;
    let mut effects = Effects::default();
    effects.log(MEMORY_REQUESTER, "PERMISSION_REQUEST", format!("asks for {}", cap.describe()), &r);
    effects.log("flock", "PERMISSION_WAITING", "memory archiving: a person decides".into(), &r);
    let text = format!("request #{} waits for a person (`flockctl approve {}`)", r.id, r.id);
    Ok(Some(Reply::ok(text, effects)))
}

fn granted_text(r: &Request, cap: &Capability, by: &str, reason: &str) -> String {
    let how = match cap {
        Capability::Network(_) => "your exec commands now have network access",
        Capability::Read(_) => "your exec commands can now read it",
        Capability::Timeout(_) => "exec accepts timeout_secs up to it now",
        Capability::Archive(_) => "the files move now",
    };
    let why = if reason.is_empty() { String::new() } else { format!(" ({reason})") };
    format!("[permission #{} granted] {} by {by}{why}: {how}.", r.id, cap.describe())
}

fn denied_text(r: &Request, why: &str) -> String {
    format!(
        "[permission #{} denied] {} {}: {why}. Do without it or ask a person.",
        r.id, r.capability, r.target
    )
}

fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(crate::store::schema::PERMISSIONS).unwrap();
        c
    }

    fn inv() -> Invariants {
        Invariants::new(vec![PathBuf::from("/home/u/.flock/state"), PathBuf::from("/srv/ws/a")])
    }

    #[test]
    fn a_read_grant_is_judged_by_what_it_opens() {
        // Wherever the temporary folder is (often /tmp, which a sandbox has of its own: see the
        // end), the checks of what a folder holds are the same.
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        let state = base.join("state");
        let clean = base.join("data/clean");
        let keys = base.join("data/keys");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(clean.join("reports")).unwrap();
        std::fs::write(clean.join("reports/q3.csv"), "a,b").unwrap();
        std::fs::create_dir_all(keys.join("home/.ssh")).unwrap();
        std::fs::write(keys.join("home/.ssh/id_rsa"), "-----BEGIN").unwrap();
        let link = base.join("data/link");
        std::os::unix::fs::symlink(&state, &link).unwrap();
        let inv = Invariants {
            private_tmp: PathBuf::from("/nonexistent-private-tmp"),
            ..Invariants::new(vec![state.clone()])
        };
        let read = |p: &Path| Capability::Read(p.to_path_buf());
        // A clean folder may be granted GREEN; one holding a key anywhere waits for a person.
        assert_eq!(inv.never(&read(&clean)), None);
        assert_eq!(inv.green_may_grant(&read(&clean)), Ok(()));
        assert_eq!(inv.never(&read(&keys)), None);
        let why = inv.green_may_grant(&read(&keys)).unwrap_err();
        assert!(why.contains(".ssh") && why.contains("a person decides"), "{why}");
        // A link to the state dir is the state dir: never.
        let why = inv.never(&read(&link)).expect("refused");
        assert!(why.contains("is a link to") && why.contains("Flock's state"), "{why}");
        // Under /tmp: the sandbox could not show it; refused with why.
        let inv = Invariants::new(vec![state.clone()]);
        let why = inv.never(&read(Path::new("/tmp/data"))).expect("refused");
        assert!(why.contains("private /tmp"), "{why}");
    }

    #[test]
    fn never_covers_the_state_dir_secrets_and_their_parents() {
        let inv = inv();
        for p in [
            "/",
            "/home",
            "/home/u/.flock",
            "/home/u/.flock/state/flock.db",
            "/srv/ws/a/src",
            "/etc/shadow",
            "/etc",
            "/root",
            "/proc/1/environ",
            "/home/u/.ssh",
            "/opt/x/.aws/credentials",
        ] {
            let cap = Capability::parse("read", p).unwrap();
            assert!(inv.never(&cap).is_some(), "{p} must never be granted");
        }
        for p in ["/usr/share/dict", "/opt/toolchain", "/srv/data"] {
            let cap = Capability::parse("read", p).unwrap();
            assert_eq!(inv.never(&cap), None, "{p}");
        }
        assert!(Capability::parse("write", "/tmp/x").is_err());
        assert!(Capability::parse("read", "relative/x").is_err());
        assert!(Capability::parse("read", "/usr/../etc/shadow").is_err());
        assert!(Capability::parse("timeout", "99999").is_err());
        assert_eq!(
            Capability::parse("network", "https://Crates.io/x").unwrap().target(),
            "crates.io"
        );
    }

    #[test]
    fn a_request_is_stored_once_and_goes_to_the_sysadmin() {
        let c = db();
        let ask = |at| {
            request(
                &c,
                &inv(),
                "w",
                "read",
                "/usr/share/dict",
                "spellcheck",
                b"k1",
                Some("sys"),
                at,
            )
            .unwrap()
        };
        let Reply { answer, effects: fx } = ask(1);
        let msg = answer.unwrap();
        assert!(msg.contains("#1 stored and sent to sys"), "{msg}");
        assert_eq!(fx.notify.len(), 1);
        assert_eq!((fx.notify[0].0.as_str(), fx.notify[0].1.as_str()), ("w", "sys"));
        assert!(fx.notify[0].2.contains("spellcheck"));
        // Replayed: the same record, nobody woken twice.
        let Reply { answer, effects: fx } = ask(2);
        let msg = answer.unwrap();
        assert!(msg.contains("#1 is pending"), "{msg}");
        assert!(fx.notify.is_empty());
        assert_eq!(list(&c, true).unwrap().len(), 1);
    }

    #[test]
    fn green_grants_only_what_invariants_allow() {
        let c = db();
        let inv = inv();
        request(&c, &inv, "w", "read", "/usr/share/dict", "why", b"a", Some("sys"), 1).unwrap();
        let Reply { answer, effects: fx } =
            verdict(&c, &inv, "sys", 1, "green", "harmless", "", 5).unwrap();
        let msg = answer.unwrap();
        assert!(msg.contains("granted"), "{msg}");
        assert!(fx.notify[0].2.contains("[permission #1 granted]"));
        assert_eq!(grants(&c, "w", 10).unwrap().len(), 1);
        assert!(grants(&c, "other", 10).unwrap().is_empty());

        // Network: GREEN is not enough, a person decides.
        request(&c, &inv, "w", "network", "crates.io", "deps", b"b", Some("sys"), 1).unwrap();
        let msg = verdict(&c, &inv, "sys", 2, "GREEN", "fine", "", 5).unwrap().answer.unwrap();
        assert!(msg.contains("waits for a person"), "{msg}");
        assert_eq!(get(&c, 2).unwrap().unwrap().state, "waiting");
        assert_eq!(grants(&c, "w", 10).unwrap().len(), 1);

        // The database: refused at the door, whatever anyone says after.
        let r = request(
            &c,
            &inv,
            "w",
            "read",
            "/home/u/.flock/state/flock.db",
            "pls",
            b"c",
            Some("sys"),
            1,
        )
        .unwrap();
        assert_eq!(r.answer.as_ref().map_err(|e| e.code), Err(flock_ipc::ErrorCode::Forbidden));
        assert!(r.effects.notify.is_empty(), "the sysadmin is not even asked");
        assert!(verdict(&c, &inv, "sys", 3, "GREEN", "injected", "", 5).is_err());
        assert!(decide(&c, &inv, "human:operator", 3, true, "", None, 5).is_err());
        assert_eq!(grants(&c, "w", 10).unwrap().len(), 1);
    }

    #[test]
    fn red_waits_for_a_person_and_grants_expire() {
        let c = db();
        let inv = inv();
        request(&c, &inv, "w", "network", "crates.io", "deps", b"a", Some("sys"), 1).unwrap();
        let fx = verdict(&c, &inv, "sys", 1, "RED", "network", "", 2).unwrap().effects;
        assert!(fx.notify.is_empty());
        assert_eq!(list(&c, false).unwrap()[0].state, "waiting");
        let Reply { answer, effects: fx } =
            decide(&c, &inv, "human:operator", 1, true, "ok for today", Some(100), 3).unwrap();
        let msg = answer.unwrap();
        assert!(msg.contains("granted"), "{msg}");
        assert_eq!(fx.notify[0].1, "w");
        assert_eq!(grants(&c, "w", 50).unwrap().len(), 1);
        assert!(grants(&c, "w", 100).unwrap().is_empty(), "expired");
        assert!(
            decide(&c, &inv, "human:operator", 1, false, "", None, 4).is_err(),
            "decided already"
        );
        // YELLOW asks back; the sysadmin cannot decide its own requests.
        request(&c, &inv, "w", "timeout", "900", "long build", b"b", Some("sys"), 1).unwrap();
        let fx =
            verdict(&c, &inv, "sys", 2, "YELLOW", "unclear", "which build?", 2).unwrap().effects;
        assert!(fx.notify[0].2.contains("which build?"));
        request(&c, &inv, "sys", "timeout", "900", "me", b"c", Some("sys"), 1).unwrap();
        assert!(
            verdict(&c, &inv, "sys", 3, "GREEN", "", "", 2).unwrap_err().message.contains("own")
        );
    }

    #[test]
    fn memory_archiving_is_asked_by_the_runtime_alone_and_decided_by_a_person_alone() {
        let c = db();
        let inv = inv();
        let day = 86_400_000;
        let due = ArchiveDue {
            until: "2025-11-29".into(),
            first: "2025-06-01".into(),
            files: 3,
            records: 40,
            cold_after_days: 365,
        };
        // An agent cannot ask for it, whatever it calls it.
        let e = request(&c, &inv, "w", "archive", "2025-11-29", "tidy", b"a", None, 1).unwrap_err();
        assert!(e.message.contains("asked for by the memory runtime"), "{}", e.message);
        // The runtime's request waits for a person, not the sysadmin, and is asked once.
        let r = propose_archive(&c, &due, day).unwrap().expect("asked");
        assert!(r.answer.unwrap().contains("`flockctl approve 1`"));
        let kinds: Vec<_> = r.effects.journal.iter().map(|l| l.kind).collect();
        assert_eq!(kinds, ["PERMISSION_REQUEST", "PERMISSION_WAITING"]);
        let open = list(&c, false).unwrap();
        assert_eq!(
            (open[0].agent.as_str(), open[0].capability.as_str(), open[0].state.as_str()),
            (MEMORY_REQUESTER, "archive", "waiting")
        );
        assert!(open[0].reason.contains("3 day files (40 records, 2025-06-01 … 2025-11-29)"));
        assert!(propose_archive(&c, &due, 2 * day).unwrap().is_none(), "one at a time");
        let e = verdict(&c, &inv, "sys", 1, "GREEN", "fine", "", 2).unwrap_err();
        assert!(e.message.contains("not pending"), "the sysadmin has no say: {}", e.message);
        // Denied: not asked again for 30 days.
        let fx = decide(&c, &inv, "human:ana", 1, false, "not yet", None, 2 * day).unwrap().effects;
        assert!(fx.archive.is_none() && fx.notify.is_empty(), "no agent to tell");
        assert!(propose_archive(&c, &due, 31 * day).unwrap().is_none());
        let r = propose_archive(&c, &due, 33 * day).unwrap().expect("asked again");
        let id = r.effects.journal[0].request;
        // Approved: the move is the effect, and nobody is sent a message.
        let fx = decide(&c, &inv, "human:ana", id, true, "", None, 34 * day).unwrap().effects;
        assert_eq!(fx.archive, Some(("2025-11-29".to_string(), "human:ana".to_string())));
        assert!(fx.notify.is_empty());
        assert!(inv.green_may_grant(&Capability::Archive("2025-11-29".into())).is_err());
        // What comes due day by day after an approval is asked about a month later, not daily.
        assert!(propose_archive(&c, &due, 35 * day).unwrap().is_none());
        assert!(propose_archive(&c, &due, 65 * day).unwrap().is_some());
    }
}
