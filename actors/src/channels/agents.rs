//! Agents made and unmade at run time: `flock_create_agent`, `agents__spawn` (an instance of a
//! template), `flock_decommission_agent`, and agents' attention states (`flock_sleep`).

use flock_config::{AgentSpec, Role};
use flock_ipc::ErrorCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::state::{AgentState, ChannelsState, bad, described, internal, str_arg};
use crate::caller::Caller;
use crate::messages::AgentOp;
use crate::messages::ToolResult;
use crate::store::channels::ChannelState;
use flock_journal::{JournalEvent, Status};

impl ChannelsState {
    /// `flock_create_agent {name, role, archetype?, description?, model?}`: a new supervised
    /// agent process, persisted so it comes back after a supervisor restart.
    pub(super) async fn create_agent(&mut self, caller: &Caller, args: &Value) -> ToolResult {
        let name = str_arg(args, "name").ok_or_else(|| bad("`name` is required"))?.to_owned();
        if !flock_config::valid_agent_name(&name) {
            return Err(bad(format!(
                "`{name}` is not a valid agent name: 1–63 of a-z, 0-9 and -, starting with a letter or digit"
            )));
        }
        if flock_config::reserved_agent_name(&name) {
            return Err(bad(format!(
                "`{name}` is reserved: Flock uses it for itself; pick another name"
            )));
        }
        let decommissioned = {
            let n = name.clone();
            self.db(move |s| s.is_decommissioned(&n)).await?
        };
        if self.is_agent(&name) || decommissioned {
            return Err(bad(format!(
                "an agent named `{name}` exists or existed; pick another name"
            )));
        }
        if self.taken.contains(&name) {
            return Err(bad(format!(
                "the swarm file places an agent named `{name}` on another host; pick another name"
            )));
        }
        let role_text = str_arg(args, "role").unwrap_or("worker");
        let Some(role) = Role::ALL.into_iter().find(|r| r.as_str() == role_text) else {
            let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            return Err(bad(format!(
                "unknown role `{role_text}`; use one of {}",
                roles.join(", ")
            )));
        };
        if matches!(role, Role::Orchestrator | Role::Sysadmin) {
            return Err((
                ErrorCode::Forbidden,
                format!("a swarm has one {}; it is declared in the swarm file", role.as_str()),
            ));
        }
        let model_name =
            str_arg(args, "model").map(str::to_owned).or_else(|| self.spec.default_model.clone());
        let Some(model) = model_name.as_ref().and_then(|m| self.spec.models.get(m)).cloned() else {
            let known: Vec<&str> = self.spec.models.keys().map(String::as_str).collect();
            return Err(bad(match model_name {
                // The swarm file has no `defaults.model`: the new agent must name one.
                None => format!(
                    "say which model the agent runs (`model`; `--model` with flockctl): this swarm has no \
                     default model; its models: {}",
                    known.join(", ")
                ),
                Some(m) => format!("no model `{m}`; models of this swarm: {}", known.join(", ")),
            }));
        };
        let spec = AgentSpec {
            archetype: str_arg(args, "archetype").map(str::to_owned),
            description: described(str_arg(args, "description").unwrap_or_default())?,
            restart: self.spec.default_restart,
            stop_timeout_secs: self.spec.default_stop_timeout_secs,
            ready_timeout_secs: self.spec.default_ready_timeout_secs,
            extensions: flock_config::ExtensionSpec::defaults(role, &self.peers()),
            ..AgentSpec::new(name.clone(), role, model)
        };
        let started = self.start_agent(caller, spec, "AGENT_CREATED").await?;
        match started {
            Ok(m) => {
                Ok(json!({"name": name, "role": role.as_str(), "state": "ready", "detail": m})
                    .to_string())
            }
            Err(e) => Err((
                ErrorCode::TargetUnavailable,
                format!("`{name}` was created but did not start: {e}"),
            )),
        }
    }

    /// Persists a new agent (or instance), asks the supervisor to start it and journals the
    /// outcome. The outer error is Flock's; the inner one says why the process did not start.
    pub(super) async fn start_agent(
        &mut self,
        caller: &Caller,
        spec: AgentSpec,
        event: &str,
    ) -> Result<Result<String, String>, (ErrorCode, String)> {
        let Some(ops) = self.agent_ops.clone() else {
            return Err(internal("this supervisor cannot start agents"));
        };
        let key = spec.key();
        let json_spec = serde_json::to_string(&spec).map_err(internal)?;
        let (k, who) = (key.clone(), caller.id.clone());
        self.db(move |s| s.register_agent(&k, &json_spec, &who)).await?;
        let role = spec.role;
        self.agents.push(spec.clone());
        let (tx, rx) = oneshot::channel();
        ops(AgentOp::Create { spec: Box::new(spec), reply: tx });
        let started = rx.await.map_err(|_| internal("the supervisor dropped the request"))?;
        let (status, message) = match &started {
            Ok(m) => (Status::Success, m.clone()),
            Err(e) => (Status::Failed, e.clone()),
        };
        self.journal(
            JournalEvent::new(&caller.id, event, status, message)
                .param("agent", json!(key))
                .param("role", json!(role.as_str())),
        );
        Ok(started)
    }

    /// `agents__spawn {agent, instance?}`: a new process of a declared agent with its own
    /// instance key, addressed as `agent@instance` (e.g. a worker per conversation). Spawning an
    /// instance that exists answers its address again.
    pub(super) async fn spawn_instance(&mut self, caller: &Caller, args: &Value) -> ToolResult {
        let agent = str_arg(args, "agent").ok_or_else(|| bad("`agent` is required"))?;
        let Some(base) =
            self.agents.iter().find(|a| a.name == agent && a.instance.is_none()).cloned()
        else {
            return Err((ErrorCode::AgentNotFound, format!("no declared agent named `{agent}`")));
        };
        if self.elsewhere.contains_key(agent) {
            return Err((
                ErrorCode::Forbidden,
                format!(
                    "`{agent}` runs on another host, and so do its instances: an agent on that \
                     host spawns them (or place `{agent}` on this host with `host:`)"
                ),
            ));
        }
        let instance = match str_arg(args, "instance") {
            Some(i) => i.to_owned(),
            None => format!("{:08x}", fastrand::u32(..)),
        };
        if instance == "default" || !flock_config::valid_agent_name(&instance) {
            return Err(bad(format!(
                "`{instance}` is not a valid instance key: 1–63 of a-z, 0-9 and -, not `default`"
            )));
        }
        let key = format!("{agent}@{instance}");
        if self.is_agent(&key) {
            return Ok(json!({"address": key, "state": "ready", "existing": true}).to_string());
        }
        let spec = AgentSpec { instance: Some(instance), ..base };
        match self.start_agent(caller, spec, "AGENT_SPAWNED").await? {
            Ok(_) => Ok(json!({"address": key, "state": "ready"}).to_string()),
            Err(e) => Err((ErrorCode::TargetUnavailable, format!("`{key}` did not start: {e}"))),
        }
    }

    /// `flock_decommission_agent {name}`: stopped for good and removed from every channel; its
    /// messages and journal entries stay.
    pub(super) async fn decommission_agent(&mut self, caller: &Caller, args: &Value) -> ToolResult {
        let name = str_arg(args, "name").ok_or_else(|| bad("`name` is required"))?.to_owned();
        let Some(role) = self.role_of(&name) else {
            return Err((ErrorCode::AgentNotFound, format!("no agent named `{name}`")));
        };
        if matches!(role, Role::Orchestrator | Role::Sysadmin) || name == caller.id {
            return Err((
                ErrorCode::Forbidden,
                format!("`{name}` ({}) cannot be decommissioned", role.as_str()),
            ));
        }
        let Some(ops) = self.agent_ops.clone() else {
            return Err(internal("this supervisor cannot decommission agents"));
        };
        let n = name.clone();
        self.db(move |s| s.decommission_agent(&n)).await?;
        self.agents.retain(|a| !a.has_key(&name));
        let mut archiving = Vec::new();
        for c in self.channels.values_mut() {
            if c.members.contains(&name) {
                c.members.retain(|m| m != &name);
                c.ready.retain(|m| m != &name);
                if c.state == ChannelState::Archiving {
                    archiving.push(c.id.clone());
                }
            }
        }
        // Nothing of it stays in memory either (a swarm that spawns a worker per conversation
        // must not grow with every conversation).
        self.cursors.retain(|(a, _), _| a != &name);
        self.armed.retain(|(a, _)| a != &name);
        self.retry.retain(|(a, _), _| a != &name);
        self.delta_chain.retain(|(a, _), _| a != &name);
        self.states.remove(&name);
        self.cards.remove(&name);
        ops(AgentOp::Decommission { name: name.clone() });
        self.journal(
            JournalEvent::new(
                &caller.id,
                "AGENT_DECOMMISSIONED",
                Status::Success,
                format!("{name} decommissioned"),
            )
            .param("agent", json!(name)),
        );
        // Readiness is re-evaluated: the member that left may have been the last one missing.
        for c in archiving {
            self.evaluate_archive(&c).await;
        }
        Ok(json!({"name": name, "state": "decommissioned"}).to_string())
    }

    pub(super) async fn set_state(
        &mut self,
        agent: &str,
        state: AgentState,
    ) -> Result<(), (ErrorCode, String)> {
        if self.state_of(agent) == state {
            return Ok(());
        }
        let (a, s) = (agent.to_owned(), state.as_str());
        self.db(move |st| st.set_agent_state(&a, s)).await?;
        self.states.insert(agent.to_owned(), state);
        self.journal(JournalEvent::new(
            agent,
            "AGENT_STATE",
            Status::Success,
            format!("{agent} is {}", state.as_str()),
        ));
        Ok(())
    }
}
