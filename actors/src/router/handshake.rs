//! Connections at the router: a new connection's handshake (the token, the operator key, the
//! process tree the supervisor spawned for the agent), and what a closed connection leaves behind.

use super::*;

impl RouterState {
    pub(super) fn open(&mut self, myself: &ActorRef<RouterMsg>, opened: Opened) {
        let Opened { conn, kind, first, outbox, closer, peer, root } = opened;
        let reject = |code: ErrorCode, reason: String| {
            // Dropping `closer` and `outbox` here makes the connection task write this frame
            // and close; the router keeps serving everyone else.
            let _ = outbox.try_send(Frame::answer(&first, ROUTER, Body::Reject { code, reason }));
        };
        match (kind, &first.body) {
            (ConnKind::Agent, Body::Hello(hello)) => {
                if self.token_reused(hello, &peer) {
                    return reject(
                        ErrorCode::Forbidden,
                        "this spawn's token was already used: both connections are closed and the agent is restarted with a new one".into(),
                    );
                }
                if let Err((code, reason)) = self.check_hello(hello, root) {
                    tracing::warn!(
                        agent = %hello.agent_id,
                        pid = ?peer.pid,
                        reason = %reason,
                        "flock router: rejected Hello from pid {:?} as `{}`",
                        peer.pid,
                        hello.agent_id
                    );
                    return reject(code, reason);
                }
                let name = hello_address(hello);
                // A connection of an earlier incarnation that has not closed yet is superseded:
                // close it first, so its in-flight delivery goes back to the mailbox.
                if let Some(old) = self.slots.get(&name).and_then(|s| s.conn) {
                    self.closed(old);
                }
                let Some(slot) = self.slots.get_mut(&name) else { return };
                slot.used_token = slot.expected_token.take();
                slot.conn = Some(conn);
                slot.conn_root = root;
                slot.last_seen.store(unix_ms(), Ordering::Relaxed);
                let welcome = Welcome {
                    protocol_version: PROTOCOL_VERSION,
                    swarm: self.spec.name.clone(),
                    agent_spec_json: slot.spec_json.clone(),
                    heartbeat_interval_ms: self.spec.supervision.heartbeat_interval_ms,
                    max_frame_bytes: self.spec.delivery.max_frame_bytes,
                };
                let _ = outbox.try_send(Frame::answer(&first, ROUTER, Body::Welcome(welcome)));
                self.conns.insert(
                    conn,
                    ConnInfo { identity: name.clone(), kind, outbox, _closer: closer },
                );
                self.counters.connections += 1;
                // The pid the connection comes from, not the one the Hello claims (a caged agent
                // is PID 1 of its own namespace).
                let pid = peer.pid.map_or(hello.pid, |p| p as u32);
                (self.events)(RouterEvent::Ready { agent: name.clone(), pid });
                if let Some(ch) = &self.channels {
                    let _ = ch.cast(ChannelsMsg::AgentReady { agent: name.clone() });
                }
                self.ready_to_leader(&name);
                self.deliver_next(myself, &name);
            }
            (ConnKind::Agent, Body::BridgeHello(hello)) => {
                self.open_bridge(conn, &first, hello, outbox, closer);
            }
            (ConnKind::Control, Body::ClientHello { protocol_version, key, .. }) => {
                if let Err(e) = flock_ipc::identity::check_client_hello(
                    *protocol_version,
                    key,
                    self.operator_key.as_deref(),
                ) {
                    return reject(e.code, e.message);
                }
                let welcome = Welcome {
                    protocol_version: PROTOCOL_VERSION,
                    swarm: self.spec.name.clone(),
                    agent_spec_json: String::new(),
                    heartbeat_interval_ms: self.spec.supervision.heartbeat_interval_ms,
                    max_frame_bytes: self.spec.delivery.max_frame_bytes,
                };
                let _ = outbox.try_send(Frame::answer(&first, ROUTER, Body::Welcome(welcome)));
                self.conns.insert(
                    conn,
                    ConnInfo { identity: OPERATOR.into(), kind, outbox, _closer: closer },
                );
                self.counters.connections += 1;
            }
            (_, body) => reject(
                ErrorCode::BadRequest,
                format!("the first frame must be a handshake, got {}", body.kind()),
            ),
        }
    }

    /// Whether `hello` presents the token an earlier Hello already used. A spawn's token is
    /// single-use and the agent never says Hello twice (it exits when its connection closes), so
    /// two processes had it: one read it where it should not have. The connection that used it
    /// first is closed too — it may be the impostor — and the event is journaled; the agent,
    /// refused, exits and is restarted with a fresh token.
    pub(super) fn token_reused(&mut self, hello: &Hello, peer: &PeerCred) -> bool {
        let key = hello_address(hello);
        let Some(slot) = self.slots.get_mut(&key) else { return false };
        let reused = slot.used_token.as_ref().is_some_and(|t| same_secret(t, &hello.token));
        if !reused {
            return false;
        }
        slot.used_token = None;
        let first = slot.conn;
        let message = format!(
            "a second Hello as `{key}` (pid {:?}) presented the token its spawn had already used; both connections are closed",
            peer.pid
        );
        tracing::warn!(agent = %key, pid = ?peer.pid, "flock router: {message}");
        if let Some(j) = &self.journal {
            j.log(
                JournalEvent::new(&key, "TOKEN_REUSED", Status::Failed, message)
                    .param("pid", peer.pid.unwrap_or(0)),
            );
        }
        if let Some(old) = first {
            self.closed(old);
        }
        true
    }

    /// `agent`'s spawn is process `pid`: a connection that said Hello as `agent` from outside
    /// that process's tree (it came in between the token's issue and the spawn's return) is
    /// closed; its in-flight delivery goes back to the mailbox.
    pub(super) fn spawned(&mut self, agent: &str, pid: u32) {
        let Some(slot) = self.slots.get_mut(agent) else { return };
        slot.spawned_pid = Some(pid);
        // A Hello took this spawn's token (an earlier spawn's connection that has not closed
        // yet is left to be superseded as usual).
        let hello_since_expect = slot.expected_token.is_none();
        if let Some(conn) = slot.conn
            && hello_since_expect
            && slot.conn_root != Some(pid)
        {
            tracing::warn!(
                agent,
                pid,
                from = ?slot.conn_root,
                "flock router: `{agent}` said Hello from outside the process the supervisor started for it (pid {pid}); closing that connection"
            );
            self.closed(conn);
        }
    }

    pub(super) fn check_hello(
        &self,
        hello: &Hello,
        root: Option<u32>,
    ) -> Result<(), (ErrorCode, String)> {
        flock_ipc::identity::check_version(hello).map_err(|e| (e.code, e.message))?;
        let key = hello_address(hello);
        let Some(slot) = self.slots.get(&key) else {
            return Err((ErrorCode::AgentNotFound, format!("no agent `{key}` in this swarm")));
        };
        if let Some(pid) = slot.spawned_pid
            && root != Some(pid)
        {
            return Err((
                ErrorCode::Forbidden,
                format!(
                    "this Hello does not come from the process the supervisor started for `{key}` (pid {pid}) or one of its children"
                ),
            ));
        }
        match &slot.expected_token {
            Some(t) if same_secret(t, &hello.token) => Ok(()),
            _ => Err((
                ErrorCode::Forbidden,
                "wrong or expired token: agents are started by the supervisor, which hands each spawn its own token".into(),
            )),
        }
    }

    pub(super) fn closed(&mut self, conn: ConnId) {
        let Some(info) = self.conns.remove(&conn) else { return };
        if info.kind == ConnKind::Bridge {
            return self.bridge_closed(conn, &info.identity);
        }
        if info.kind != ConnKind::Agent {
            return;
        }
        let agent = info.identity;
        let Some(slot) = self.slots.get_mut(&agent) else { return };
        if slot.conn != Some(conn) {
            return;
        }
        slot.conn = None;
        slot.rewind_owed = None;
        // Handed over but never started: back to the head of the mailbox, in order, and not a
        // failed delivery.
        while let Some(q) = slot.window.pop_back() {
            slot.queue.push_front(q);
        }
        if let Some(q) = slot.in_flight.take() {
            turn_ended(&agent, slot, false);
            let stopped = self.chains.map.get(&q.chain()).is_some_and(|c| c.stopped.is_some());
            match q.kind {
                _ if stopped => self.discard(&agent, q, "its chain of turns was stopped"),
                // A request is retried within its deadline; a deliberate stop is nobody's fault.
                DeliveryKind::Request => slot.queue.push_front(q),
                DeliveryKind::Message | DeliveryKind::Result if slot.stopping => {
                    slot.queue.push_front(q)
                }
                DeliveryKind::Message | DeliveryKind::Result => {
                    self.failed_delivery(&agent, q, "the agent's connection closed mid-turn".into())
                }
                // The channels actor rolls its cursor back and retries when the agent returns.
                DeliveryKind::Delta => {
                    self.delta_done(&agent, &q, false);
                    self.leave(q.chain());
                }
            }
        }
        (self.events)(RouterEvent::Disconnected { agent: agent.clone() });
    }
}
