//! The swarm across hosts in the spec: `cluster:` and where each agent runs (docs/cluster.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{AgentSpec, SwarmSpec};

/// The host a swarm runs on when nothing names one, and the leader of a cluster unless
/// `cluster.leader` names another.
pub const DEFAULT_HOST: &str = "main";

/// `cluster:` in YAML: where the hosts of one swarm meet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSpec {
    /// The NATS server(s) with JetStream: `nats://host:port` (comma-separated for a cluster).
    pub nats: String,
    /// A NATS credentials file (`.creds`), absolute; `None`: the server asks for none.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// The host agents without `host:` run on (default [`DEFAULT_HOST`]).
    pub leader: String,
    /// The NAME of the environment variable holding the swarm's secret, the same on every host
    /// (default [`DEFAULT_CLUSTER_SECRET_ENV`]): every message between hosts carries a MAC made
    /// with it, so nothing without the secret (an agent process, a stranger on the broker) can
    /// inject one.
    pub secret_env: String,
    /// Hosts another machine may take over (`flock-supervisor up --host NAME --standby`), each
    /// with how long it must have been lost first, in seconds (`cluster.failover`; empty: none).
    /// A run of such a host stops its agents once it cannot renew its lease for
    /// [`FENCE_AFTER_SECS`], so they never run on two machines at once.
    #[serde(default)]
    pub failover: std::collections::BTreeMap<String, u64>,
    /// The hosts whose `flockctl` may drive agents placed on other hosts (send to them, stop,
    /// start, restart them, read their logs): `cluster.operators`, the leader alone unless the
    /// file lists others. A host not listed drives only its own agents.
    #[serde(default)]
    pub operators: Vec<String>,
}

/// A run of a host with `cluster.failover` that could not renew its lease (its status) for this
/// long stops its agents: another machine may take the host over after the (longer) time the
/// file gives, never before [`MIN_FAILOVER_SECS`].
pub const FENCE_AFTER_SECS: u64 = 5;
/// The shortest `cluster.failover` wait: the fence's time, the agents' kill and the hosts'
/// clocks fit well inside it.
pub const MIN_FAILOVER_SECS: u64 = 15;

/// The variable `cluster.secret_env` names unless the file says otherwise.
pub const DEFAULT_CLUSTER_SECRET_ENV: &str = "FLOCK_CLUSTER_SECRET";

impl SwarmSpec {
    /// The host agents without `host:` run on: the cluster's leader, or [`DEFAULT_HOST`].
    pub fn leader(&self) -> &str {
        self.cluster.as_ref().map_or(DEFAULT_HOST, |c| c.leader.as_str())
    }

    /// Whether `flockctl` on host `host` may drive agents placed on other hosts
    /// (`cluster.operators`; the leader alone unless the file lists others).
    pub fn may_operate(&self, host: &str) -> bool {
        self.operator_hosts().contains(&host)
    }

    /// The hosts whose `flockctl` drives agents on every host (`cluster.operators`, else the
    /// leader; none on one host).
    pub fn operator_hosts(&self) -> Vec<&str> {
        match &self.cluster {
            Some(c) if c.operators.is_empty() => vec![c.leader.as_str()],
            Some(c) => c.operators.iter().map(String::as_str).collect(),
            None => Vec::new(),
        }
    }

    /// The host `agent` is placed on.
    pub fn host_of<'a>(&'a self, agent: &'a AgentSpec) -> &'a str {
        agent.host.as_deref().unwrap_or_else(|| self.leader())
    }

    /// Every host the file places an agent on, the leader first.
    pub fn hosts(&self) -> Vec<String> {
        let mut hosts = vec![self.leader().to_owned()];
        for a in &self.agents {
            let h = self.host_of(a);
            if !hosts.iter().any(|x| x == h) {
                hosts.push(h.to_owned());
            }
        }
        hosts
    }

    /// How long host `host` must have been lost before a standby may take it over
    /// (`cluster.failover`); `None`: it never fails over.
    pub fn failover_after(&self, host: &str) -> Option<std::time::Duration> {
        let secs = self.cluster.as_ref()?.failover.get(host)?;
        Some(std::time::Duration::from_secs(*secs))
    }

    /// The agents the file places on hosts other than `host`.
    pub fn agents_elsewhere(&self, host: &str) -> Vec<AgentSpec> {
        self.agents.iter().filter(|a| self.host_of(a) != host).cloned().collect()
    }

    /// The part of the swarm `host` runs: its own agents only (the others are reached through
    /// the cluster). `Err` when the file places nothing there and names the hosts it knows.
    pub fn for_host(&self, host: &str) -> Result<SwarmSpec, String> {
        let hosts = self.hosts();
        if !hosts.iter().any(|h| h == host) {
            return Err(format!(
                "the swarm file places no agent on host `{host}`; its hosts: {} (`host:` of an \
                 agent; agents without one run on `{}`)",
                hosts.join(", "),
                self.leader()
            ));
        }
        let mut part = self.clone();
        part.agents.retain(|a| self.host_of(a) == host);
        // Chat bridges post into the channels, which the leader holds.
        if host != self.leader() {
            part.bridges.clear();
        }
        Ok(part)
    }
}
