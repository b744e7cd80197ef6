//! `cluster:` — the hosts of one swarm meet on a NATS JetStream server; `agents[].host` places an
//! agent on one of them (docs/cluster.md).

use super::*;
use crate::spec::{ClusterSpec, DEFAULT_CLUSTER_SECRET_ENV, DEFAULT_HOST, MIN_FAILOVER_SECS};

const CLUSTER_KEYS: &[&str] =
    &["nats", "credentials_file", "leader", "secret_env", "failover", "operators"];

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
        let failover = match lookup(entries, "failover") {
            Some((_, v)) if !v.is_null() => self.failover(v, &leader),
            _ => Default::default(),
        };
        let operators = match lookup(entries, "operators") {
            Some((_, v)) if !v.is_null() => self.operators(v)?,
            _ => vec![leader.clone()],
        };
        Some(ClusterSpec { nats, credentials_file, leader, secret_env, failover, operators })
    }

    /// `cluster.operators: [HOST, …]`: the hosts whose `flockctl` may drive agents placed on
    /// other hosts; each must be one the file places agents on ([`Loader::check_named_hosts`]).
    fn operators(&mut self, node: &Node) -> Option<Vec<String>> {
        let items = self.report.list(node, "cluster.operators")?;
        let mut out = Vec::new();
        for item in items {
            let Some(host) = self.host_name(item, "cluster.operators") else { continue };
            self.named_hosts.push((host.clone(), item.pos, "cluster.operators"));
            if !out.contains(&host) {
                out.push(host);
            }
        }
        Some(out)
    }

    /// `cluster.failover: { HOST: SECONDS, … }`: hosts a standby may take over once lost that
    /// long. Never the leader (its store holds the channels); each host must be one the file
    /// places agents on ([`Loader::check_failover`], once the agents are read).
    fn failover(&mut self, node: &Node, leader: &str) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        let Some(entries) = self.report.mapping(node, "cluster.failover") else { return out };
        for (key, value) in entries {
            let Some(host) = self.host_name(key, "cluster.failover") else { continue };
            if host == leader {
                self.report.error(
                    key.pos,
                    format!(
                        "`cluster.failover` names `{host}`, the leader: the leader's store holds \
                         the channels and permission records, which a standby would not have; \
                         fail over only other hosts"
                    ),
                );
                continue;
            }
            let what = format!("cluster.failover.{host}");
            if let Some(secs) = self.report.uint(value, &what, MIN_FAILOVER_SECS as i128, 86_400) {
                self.named_hosts.push((host.clone(), key.pos, "cluster.failover"));
                out.insert(host, secs);
            }
        }
        out
    }

    /// Each host `cluster.failover` and `cluster.operators` name is one the file places agents
    /// on.
    pub(super) fn check_named_hosts(&mut self, hosts: &[String]) {
        for (host, pos, key) in std::mem::take(&mut self.named_hosts) {
            if !hosts.contains(&host) {
                self.report.error(
                    pos,
                    format!(
                        "`{key}` names `{host}`, which the file places no agent on; \
                         its hosts: {} (`host:` of an agent)",
                        hosts.join(", ")
                    ),
                );
            }
        }
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
