//! `.env` beside a swarm file: the secrets a person keeps out of their shell (API keys, chat
//! bridges' tokens), read by `flock-supervisor up` and `validate` and written by `flockctl init`.
//!
//! `NAME=value` lines; blank lines and `#` comments are skipped, `export NAME=value` is accepted,
//! a value in single or double quotes is taken without them. A variable set in the environment
//! wins over the file. The file must be private (mode 0600 or stricter): one that other users may
//! read is refused, saying how to fix it — a token in a world-readable file is a leaked token.

use std::collections::HashMap;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The file's name, in the swarm file's folder.
pub const FILE_NAME: &str = ".env";

/// Where the `.env` of `swarm_file` is.
pub fn path_for(swarm_file: &Path) -> PathBuf {
    match swarm_file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(FILE_NAME),
        _ => PathBuf::from(FILE_NAME),
    }
}

/// The variables of the `.env` beside `swarm_file` (none when there is no such file).
pub fn read(swarm_file: &Path) -> Result<HashMap<String, String>> {
    let path = path_for(swarm_file);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    if meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} may be read by other users (mode {:o}); it holds secrets: `chmod 600 {}`",
            path.display(),
            meta.permissions().mode() & 0o777,
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut vars = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let Some((name, value)) = parse_line(line)
            .with_context(|| format!("{}:{}: {}", path.display(), i + 1, line.trim()))?
        else {
            continue;
        };
        vars.insert(name.to_owned(), value.to_owned());
    }
    Ok(vars)
}

/// The agent whose workspace holds the `.env` of `swarm_file` (a worker with `workspace:` the
/// project folder would see the swarm's secrets in its cage), if any.
pub fn exposed_to<'a>(spec: &'a flock_config::SwarmSpec, swarm_file: &Path) -> Option<&'a str> {
    let env = std::fs::canonicalize(path_for(swarm_file)).ok()?;
    spec.agents.iter().find_map(|a| {
        let ws = std::fs::canonicalize(a.workspace.as_ref().filter(|w| w.is_absolute())?).ok()?;
        env.starts_with(ws).then_some(a.name.as_str())
    })
}

/// One line: `None` for a blank line or a comment.
fn parse_line(line: &str) -> Result<Option<(&str, &str)>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let line = line.strip_prefix("export ").map_or(line, str::trim_start);
    let Some((name, value)) = line.split_once('=') else {
        bail!("not `NAME=value`");
    };
    let name = name.trim();
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        bail!("`{name}` is not a variable name (letters, digits and `_`)");
    }
    let value = value.trim();
    let unquoted = ['"', '\''].iter().find_map(|q| {
        value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)).filter(|_| value.len() >= 2)
    });
    Ok(Some((name, unquoted.unwrap_or(value))))
}

/// Sets `updates` in the `.env` at `path`: a variable already there gets its new value on its
/// first line (any later line naming it again is dropped: [`read`] takes the last one), a new
/// one is added at the end, every other line stays as it was. Written to a temporary file (mode
/// 0600) and renamed over the old one.
pub fn update(path: &Path, updates: &[(String, String)]) -> Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let mut written = vec![false; updates.len()];
    let mut out = String::new();
    for line in old.lines() {
        let named = parse_line(line).ok().flatten().map(|(n, _)| n);
        match updates.iter().position(|(n, _)| Some(n.as_str()) == named) {
            Some(i) if written[i] => {}
            Some(i) => {
                let (n, v) = &updates[i];
                out.push_str(&format!("{n}={v}\n"));
                written[i] = true;
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for ((n, v), _) in updates.iter().zip(&written).filter(|(_, done)| !**done) {
        out.push_str(&format!("{n}={v}\n"));
    }
    let tmp = path.with_extension("env.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    std::io::Write::write_all(&mut file, out.as_bytes())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_comments_quotes_and_export_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let swarm = dir.path().join("flock.yaml");
        let env = path_for(&swarm);
        std::fs::write(&env, "# keys\nA=1\n\nexport B = 'two words'\nC=\"x=y\"\n").unwrap();
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
        let vars = read(&swarm).unwrap();
        assert_eq!(vars.len(), 3);
        assert_eq!(
            (vars["A"].as_str(), vars["B"].as_str(), vars["C"].as_str()),
            ("1", "two words", "x=y")
        );
    }

    #[test]
    fn a_file_others_may_read_or_a_bad_line_is_refused_saying_how_to_fix_it() {
        let dir = tempfile::tempdir().unwrap();
        let swarm = dir.path().join("flock.yaml");
        assert!(read(&swarm).unwrap().is_empty(), "no file: nothing");
        let env = path_for(&swarm);
        std::fs::write(&env, "A=1\n").unwrap();
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = format!("{:#}", read(&swarm).unwrap_err());
        assert!(err.contains("other users (mode 644)") && err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&env, "A=1\nnot a line\n").unwrap();
        let err = format!("{:#}", read(&swarm).unwrap_err());
        assert!(err.contains(".env:2: not a line: not `NAME=value`"), "{err}");
    }

    #[test]
    fn an_agent_whose_workspace_holds_the_env_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let swarm = dir.path().join("flock.yaml");
        let yaml = |ws: &Path| {
            format!(
                "swarm: {{ name: s }}\nmodels: {{ m: {{ provider: scripted, rules: [ {{ reply: ok }} ] }} }}\n\
                 agents:\n  - {{ name: w, role: worker, model: m, workspace: \"{}\" }}\n",
                ws.display()
            )
        };
        update(&path_for(&swarm), &[("K".into(), "v".into())]).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let spec = flock_config::parse(&yaml(elsewhere.path()), &swarm).unwrap();
        assert_eq!(exposed_to(&spec, &swarm), None);
        let spec = flock_config::parse(&yaml(dir.path()), &swarm).unwrap();
        assert_eq!(exposed_to(&spec, &swarm), Some("w"));
    }

    #[test]
    fn an_update_replaces_its_variables_and_keeps_every_other_line() {
        let dir = tempfile::tempdir().unwrap();
        let env = dir.path().join(".env");
        std::fs::write(
            &env,
            "# mine\nOPENAI_API_KEY=sk-1\nTELEGRAM_BOT_TOKEN=old\nexport TELEGRAM_BOT_TOKEN=older\n",
        )
        .unwrap();
        let updates = [("TELEGRAM_BOT_TOKEN".into(), "new".into()), ("X".into(), "y".into())];
        update(&env, &updates).unwrap();
        let text = std::fs::read_to_string(&env).unwrap();
        assert_eq!(text, "# mine\nOPENAI_API_KEY=sk-1\nTELEGRAM_BOT_TOKEN=new\nX=y\n");
        let swarm = dir.path().join("flock.yaml");
        assert_eq!(read(&swarm).unwrap()["TELEGRAM_BOT_TOKEN"], "new", "no stale line wins");
        let mode = std::fs::metadata(&env).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
