//! `crate::cluster` in a build without the `cluster` feature (no NATS client: ~45 crates and
//! ~30 s less of a first build on 2 cores). A swarm on one host runs exactly as with it; a swarm
//! file with `cluster:` is refused by [`connect`], before anything starts, with the way to build
//! it. The types have no values ([`Link`], [`Hosts`] and [`Error`] hold an `Infallible`), so
//! every method below is unreachable by construction, not by a runtime check: the code that uses
//! them compiles the same in both builds. (The field is private, so the code outside does not
//! see them as empty and warn about unreachable code.)

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use flock_actors::router::{CreatedElsewhere, HostLink};
use flock_actors::store::PendingMessage;
use flock_actors::{RouterMsg, StoreMsg};
use flock_config::{AgentSpec, SwarmSpec};
use flock_ipc::PsRow;
use flock_ipc::id::MsgId;
use ractor::ActorRef;
use tokio::sync::mpsc::UnboundedReceiver;

/// How often a host writes its status (as in the cluster build).
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A host whose last status is older than this is shown as lost (as in the cluster build).
pub const LOST_AFTER: Duration = Duration::from_secs(5);

/// A link to the broker: none exists in this build.
#[derive(Debug, Clone)]
pub struct Link(Infallible);

/// The swarm's other hosts: none in this build.
#[derive(Debug, Clone)]
pub struct Hosts(Infallible);

/// An error of the broker: none in this build.
#[derive(Debug)]
pub struct Error(Infallible);

impl std::fmt::Display for Error {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {}
    }
}

/// Whether `e` says another supervisor took this host over.
pub fn fenced(e: &Error) -> bool {
    match e.0 {}
}

/// The refusal of a swarm across hosts; `Ok(None)` for a swarm on one host.
pub async fn connect(
    spec: &SwarmSpec,
    _host: &str,
    _secret: Option<flock_llm::Secret>,
    _state: &crate::paths::StateDir,
    _standby: bool,
) -> Result<Option<Link>> {
    if spec.cluster.is_some() {
        bail!(
            "this flock-supervisor was built without swarms across hosts (the `cluster` \
             feature), and the file has `cluster:`: `scripts/up FILE` builds it for such a file, \
             or build it yourself with `cargo build --profile dist -p flock-supervisor --features \
             cluster` (`scripts/install` builds it by default)"
        );
    }
    Ok(None)
}

impl Hosts {
    pub fn new(link: Link, _whole: &SwarmSpec, _created: CreatedElsewhere) -> Hosts {
        match link.0 {}
    }

    pub fn me(&self) -> &str {
        match self.0 {}
    }

    pub fn drives_other_hosts(&self) -> bool {
        match self.0 {}
    }

    pub fn leader_elsewhere(&self) -> Option<&str> {
        match self.0 {}
    }

    pub fn elsewhere(&self) -> HashMap<String, String> {
        match self.0 {}
    }

    pub fn others(&self) -> Vec<String> {
        match self.0 {}
    }

    pub fn remote_agents(&self) -> Vec<String> {
        match self.0 {}
    }

    pub async fn hand_over(
        &self,
        _pending: &[PendingMessage],
    ) -> (Vec<(MsgId, String)>, Option<Error>) {
        match self.0 {}
    }

    pub async fn publish(&self, _rows: &[PsRow], _created: Vec<AgentSpec>) -> Result<(), Error> {
        match self.0 {}
    }

    pub async fn created_on(&self, _host: &str) -> Option<Vec<AgentSpec>> {
        match self.0 {}
    }

    pub async fn rows(&self, _local: Vec<PsRow>, _waiting: &HashMap<String, u64>) -> Vec<PsRow> {
        match self.0 {}
    }
}

pub fn hold(link: &Link, _lease: Option<Arc<crate::failover::Lease>>) -> tokio::task::AbortHandle {
    match link.0 {}
}

pub fn spawn(
    link: Link,
    _store: ActorRef<StoreMsg>,
    _router: ActorRef<RouterMsg>,
    _host: &HostLink,
    _held: Option<tokio::sync::watch::Receiver<bool>>,
) {
    match link.0 {}
}

pub fn copy_journal(link: Link, _leader: String, _lines: UnboundedReceiver<Vec<String>>) {
    match link.0 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> SwarmSpec {
        flock_config::parse(yaml, std::path::Path::new("swarm.yaml")).expect("a valid swarm file")
    }

    /// A build without the feature refuses a swarm across hosts before anything starts, and says
    /// how to build one that runs it; a swarm on one host gets no link and runs as ever.
    #[tokio::test]
    async fn a_file_with_cluster_is_refused_with_how_to_build_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = crate::paths::StateDir { root: dir.path().to_path_buf() };
        let one = "swarm: { name: one }\nmodels:\n  s: { provider: scripted, rules: [ { reply: hi } ] }\n\
                   agents:\n  - { name: a, role: worker, model: s }\n";
        let link = connect(&spec(one), "main", None, &state, false).await.unwrap();
        assert!(link.is_none());
        let across = format!("{one}cluster: {{ nats: \"nats://127.0.0.1:4222\" }}\n");
        let err = connect(&spec(&across), "main", None, &state, false).await.unwrap_err();
        let err = err.to_string();
        assert!(err.contains("built without swarms across hosts"), "{err}");
        assert!(err.contains("--features cluster") && err.contains("scripts/up"), "{err}");
    }
}
