//! `cluster:` — the hosts of one swarm meet on a NATS JetStream server; `agents[].host` places an
//! agent on one of them (docs/cluster.md).

use super::*;
use crate::spec::{ClusterSpec, DEFAULT_CLUSTER_SECRET_ENV, DEFAULT_HOST};

const CLUSTER_KEYS: &[&str] = &["nats", "credentials_file", "leader", "secret_env"];

impl Loader<'_> {
    pub(super) fn cluster(&mut self, node: &Node) -> Option<ClusterSpec> {
        if node.is_null() {
            return None;
        }
        let entries = self.report.mapping(node, "cluster")?;
        let r = &mut self.report;
        r.unknown_keys(entries, CLUSTER_KEYS, "`cluster`");
        let nats = match lookup(entries, "nats") {
            Some((_, v)) => {
                let url = r.string(v, "cluster.nats")?;
                let schemes = ["nats://", "tls://", "ws://", "wss://"];
                let bad = url.split(',').map(str::trim).find(|u| {
                    !schemes.iter().any(|s| u.starts_with(s)) || u.len() <= "nats://".len()
                });
                if let Some(bad) = bad {
                    // Only its scheme: an address may hold a password (`nats://user:pass@…`).
                    let scheme = bad.split_once("://").map_or("no scheme", |(s, _)| s);
                    r.error(
                        v.pos,
                        format!(
                            "`cluster.nats` holds an address that is not a NATS server's \
                             ({scheme}); write `nats://HOST:4222` (`tls://` for TLS; several \
                             comma-separated)"
                        ),
                    );
                    return None;
                }
                url
            }
            None => {
                r.error(
                    node.pos,
                    "`cluster` has no `nats`; add the JetStream server every host connects to, \
                     e.g. `nats: nats://127.0.0.1:4222`",
                );
                return None;
            }
        };
        let credentials_file = match lookup(entries, "credentials_file") {
            Some((_, v)) if !v.is_null() => {
                let path = PathBuf::from(r.string(v, "cluster.credentials_file")?);
                // Relative to the swarm file, like transcripts: every host finds its own copy
                // beside its copy of the file.
                let joined = if path.is_relative() { self.dir.join(path) } else { path };
                Some(std::path::absolute(&joined).unwrap_or(joined))
            }
            _ => None,
        };
        let leader = match lookup(entries, "leader") {
            Some((_, v)) => self.host_name(v, "cluster.leader")?,
            None => DEFAULT_HOST.to_owned(),
        };
        let secret_env = match lookup(entries, "secret_env") {
            Some((_, v)) => {
                let var = self.report.string(v, "cluster.secret_env")?;
                let ok = !var.is_empty()
                    && var
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                    && !var.as_bytes()[0].is_ascii_digit();
                if !ok {
                    // Never repeat it: it may be the secret itself, pasted in by mistake.
                    self.report.error(
                        v.pos,
                        "`cluster.secret_env` must NAME an environment variable (A-Z, 0-9, _), e.g. \
                         `FLOCK_CLUSTER_SECRET`; put the secret itself in that variable, never in \
                         the file",
                    );
                    return None;
                }
                var
            }
            None => DEFAULT_CLUSTER_SECRET_ENV.to_owned(),
        };
        Some(ClusterSpec { nats, credentials_file, leader, secret_env })
    }

    /// A host's name: the agents' rule (it is part of NATS subjects and of `ps`).
    pub(super) fn host_name(&mut self, node: &Node, what: &str) -> Option<String> {
        let name = self.report.string(node, what)?;
        if !valid_agent_name(&name) {
            self.report.error(
                node.pos,
                format!(
                    "`{what}` `{name}` is not a valid host name: use lowercase letters, digits \
                     and `-` (at most 63), e.g. `{}`",
                    suggest_name(&name)
                ),
            );
            return None;
        }
        Some(name)
    }
}
