//! The mailbox engine: durable and at-most-once sends, requests with deadlines, delegation, the
//! deliveries in flight per agent (the one its turn works on, and up to its delivery window of
//! durable messages behind it), `Ack`/`Nack` (a `Nack` rewinds the window), failed deliveries and
//! dead letters, and the store's answers (a batch accepted, a message completed).

use super::*;

impl RouterState {
    pub(super) fn send(&mut self, myself: &ActorRef<RouterMsg>, conn: ConnId, frame: Frame) {
        let Body::Send { mode, text } = &frame.body else { return };
        // The operator's message for an agent on another host: that host takes it.
        if *mode == SendMode::Durable
            && frame.from == OPERATOR
            && let Some(host) = self.remote_host(&frame.to).map(str::to_owned)
        {
            return self.operator_send_to_host(conn, host, &frame);
        }
        if let Err((code, msg)) = self.check_target(&frame.from, &frame.to) {
            return self.answer(conn, Frame::error(&frame, code, msg));
        }
        if *mode == SendMode::AtMostOnce {
            if let Some((code, msg)) = self.not_across_hosts(&frame.from, &frame.to) {
                return self.answer(conn, Frame::error(&frame, code, msg));
            }
            return self.route_at_most_once(conn, frame);
        }
        // A person's message waits for an answer; an agent's send during a turn joins that
        // turn's chain (nobody waits for its answer: delegation is `Delegate`), unless it is the
        // runtime's upkeep, which starts its own.
        let mut route = if *mode == SendMode::Upkeep {
            Route::root(frame.id, &frame.from, &frame.to, text, self.now(), None)
        } else if frame.from == OPERATOR {
            Route::root(
                frame.id,
                OPERATOR_HUMAN,
                &frame.to,
                text,
                self.now(),
                Some(OPERATOR_HUMAN.to_owned()),
            )
        } else {
            self.child_route(&frame.from, frame.id, &frame.to, text, Vec::new())
        };
        if let Err(msg) = self.admit(&mut route, "SEND", &frame.from, &frame.to, text) {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
        }
        self.enqueue(myself, frame.id, frame.from, frame.to, text.clone(), &route, Some(conn));
    }

    /// Hands the caller's current input over to `frame.to`: the callee's answer comes back as a
    /// `Result` input of the caller, whose own turn gives no answer.
    pub(super) fn delegate(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        conn: ConnId,
        agent: &str,
        frame: Frame,
    ) {
        let Body::Delegate { text } = &frame.body else { return };
        if let Err((code, msg)) = self.check_target(agent, &frame.to) {
            return self.answer(conn, Frame::error(&frame, code, msg));
        }
        let current = self.slots.get(agent).and_then(|s| s.in_flight.as_ref());
        let refusal = match current {
            None => Some("delegation belongs to a turn: this agent is not working on an input"),
            Some(q) if q.route.answer_to().is_none() => Some(
                "nobody waits for an answer to this input, so there is nothing to delegate; use agents__send",
            ),
            Some(q) if q.kind == DeliveryKind::Result => Some(
                "this input is a delegated agent's result: answer it yourself, it cannot be delegated again",
            ),
            Some(q) if q.kind != DeliveryKind::Message => {
                Some("only a message can be delegated (a request's caller waits for this agent)")
            }
            Some(q) if q.delegated => Some("this turn has already delegated its input"),
            Some(_) => None,
        };
        if let Some(msg) = refusal {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
        }
        let Some(q) = current else { return };
        let mut path = q.route.answer_path.clone();
        path.push(agent.to_owned());
        let mut route = self.child_route(agent, frame.id, &frame.to, text, path);
        if let Err(msg) = self.admit(&mut route, "DELEGATE", agent, &frame.to, text) {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
        }
        if let Some(q) = self.slots.get_mut(agent).and_then(|s| s.in_flight.as_mut()) {
            q.delegated = true;
        }
        self.enqueue(
            myself,
            frame.id,
            agent.to_owned(),
            frame.to,
            text.clone(),
            &route,
            Some(conn),
        );
    }

    /// Puts a durable message in its target's SQLite mailbox; it is queued for the target (and
    /// `Accepted` answered on `conn`, if any) once the store has committed it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn enqueue(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        id: MsgId,
        sender: String,
        target: String,
        text: String,
        route: &Route,
        conn: Option<ConnId>,
    ) {
        // Hot path: no event unless `RUST_LOG` asks for trace (the fields are not even formatted).
        tracing::trace!(msg_id = %fmt_id(id), from = %sender, to = %target, chain = %fmt_id(route.chain.id), "enqueue");
        let msg =
            NewMessage { id, route: self.route_for(route, id, &target), sender, target, text };
        let write = StoreMsg::Write {
            op: WriteOp::Enqueue(msg),
            origin: Some(Origin { conn: conn.unwrap_or(NO_CONN), frame: id }),
            notify: Some(myself.clone()),
        };
        if let Err(e) = self.store.cast(write) {
            tracing::error!(msg_id = %fmt_id(id), error = %e, "flock router: the store is not running");
            self.leave(route.chain.id);
            if let Some(conn) = conn {
                let err = Frame {
                    correlation_id: Some(id),
                    ..Frame::new(
                        ROUTER,
                        "",
                        Body::Error {
                            code: ErrorCode::Internal,
                            message: "the store is not running".into(),
                        },
                    )
                };
                self.answer(conn, err);
            }
        }
    }

    /// The raw path: straight into the target's outbox, no store, no queue. Moves the text.
    pub(super) fn route_at_most_once(&mut self, conn: ConnId, frame: Frame) {
        let Frame { id, from, to, deadline_ms, body: Body::Send { text, .. }, .. } = frame else {
            return;
        };
        // The raw path is outside chain budgets (models cannot send at_most_once).
        let out =
            Delivery::raw(DeliveryKind::Message, from, text, false).frame(id, to, deadline_ms);
        let target = self.slots.get(&out.to).and_then(|s| s.conn).and_then(|c| self.conns.get(&c));
        let result = match target {
            Some(info) => info.outbox.try_send(out).map_err(|e| e.into_inner()),
            None => Err(out),
        };
        match result {
            Ok(()) => self.counters.routed += 1,
            Err(out) => {
                self.counters.dropped += 1;
                let message = format!(
                    "`{}` is not connected or not keeping up; at_most_once messages are not queued",
                    out.to
                );
                let err = Frame {
                    correlation_id: Some(out.id),
                    ..Frame::new(
                        ROUTER,
                        out.from,
                        Body::Error { code: ErrorCode::TargetUnavailable, message },
                    )
                };
                self.answer(conn, err);
            }
        }
    }

    pub(super) fn request(&mut self, myself: &ActorRef<RouterMsg>, conn: ConnId, frame: Frame) {
        let Body::Request { text, timeout_ms } = &frame.body else { return };
        if let Err((code, msg)) = self.check_target(&frame.from, &frame.to) {
            return self.answer(conn, Frame::error(&frame, code, msg));
        }
        // The call chain is the router's own record of who is serving whom, never the caller's.
        let mut calls = self
            .slots
            .get(&frame.from)
            .and_then(|s| s.in_flight.as_ref())
            .map(|q| q.call_chain.clone())
            .unwrap_or_default();
        if frame.from != OPERATOR {
            calls.push(chain_entry(&frame.from));
        }
        let callee = chain_entry(&frame.to);
        if calls.contains(&callee) {
            let msg =
                format!("calling {callee} would close a cycle: {} → {callee}", calls.join(" → "));
            return self.answer(conn, Frame::error(&frame, ErrorCode::CircularCall, msg));
        }
        // The caller waits for the reply itself: nobody else waits on the callee's turn.
        let mut route = if frame.from == OPERATOR {
            Route::root(frame.id, OPERATOR_HUMAN, &frame.to, text, self.now(), None)
        } else {
            self.child_route(&frame.from, frame.id, &frame.to, text, Vec::new())
        };
        if let Err(msg) = self.admit(&mut route, "REQUEST", &frame.from, &frame.to, text) {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
        }
        let timeout_ms =
            if *timeout_ms == 0 { self.spec.delivery.request_timeout_ms } else { *timeout_ms };
        let deadline = self.now().saturating_add(timeout_ms);
        self.requests.insert(
            frame.id,
            PendingRequest {
                caller: frame.from.clone(),
                caller_conn: conn,
                target: frame.to.clone(),
                timeout_ms,
                deadline,
            },
        );
        let id = frame.id;
        self.deadlines.insert((deadline, id));
        self.arm_deadline(myself);
        if let Some(host) = self.remote_host(&frame.to).map(str::to_owned) {
            let call = crate::messages::HostCall {
                id,
                from: frame.from.clone(),
                to: frame.to.clone(),
                text: text.clone(),
                timeout_ms,
                calls,
                route: self.route_for(&route, id, &frame.to),
            };
            return self.call_remote(host, call, route.chain.id);
        }
        let Some(slot) = self.slots.get_mut(&frame.to) else { return };
        let mut q = Queued::new(id, DeliveryKind::Request, frame.from.clone(), text.clone(), route);
        q.call_chain = calls;
        slot.queue.push_back(q);
        let to = frame.to.clone();
        self.deliver_next(myself, &to);
    }

    /// Hands queued inputs to `agent` while it is connected and has room: the next input when
    /// it works on none, and durable messages behind a durable message up to its delivery window
    /// (a request or a delta always travels alone).
    pub(super) fn deliver_next(&mut self, myself: &ActorRef<RouterMsg>, agent: &str) {
        let mut dropped = Vec::new();
        let mut told = Vec::new();
        let default_window = self.spec.delivery.window;
        if let Some(slot) = self.slots.get_mut(agent)
            && !slot.stopping
            && let Some(info) = slot.conn.and_then(|c| self.conns.get(&c))
        {
            let window = slot.spec.delivery_window.unwrap_or(default_window).max(1) as usize;
            if let Some(id) = slot.rewind_owed {
                let rewind =
                    Frame { correlation_id: Some(id), ..Frame::new(ROUTER, agent, Body::Rewind) };
                if info.outbox.try_send(rewind).is_err() {
                    // Nothing more until the agent has it: it would drop what came before.
                    return retry_later(myself, slot, agent);
                }
                slot.rewind_owed = None;
            }
            while let Some(q) = slot.queue.pop_front() {
                let room = match &slot.in_flight {
                    None => true,
                    Some(head) => head.durable() && q.durable() && slot.window.len() + 1 < window,
                };
                if !room {
                    slot.queue.push_front(q);
                    break;
                }
                // Skipped lazily, to keep this O(1): a request whose caller already timed out,
                // and anything of a chain that was stopped.
                let stale = q.kind == DeliveryKind::Request && !self.requests.contains_key(&q.id);
                let stopped = self.chains.map.get(&q.chain()).is_some_and(|c| c.stopped.is_some());
                if stale || stopped {
                    dropped.push(q);
                    continue;
                }
                // Checked here, not when queued: the turn that told it may still be running then.
                if let Some(upto) = Self::told_already(&self.told, &self.host_deltas, agent, &q) {
                    told.push((q, upto));
                    continue;
                }
                let frame = Delivery {
                    kind: q.kind,
                    sender: q.sender.clone(),
                    text: q.text.clone(),
                    attempt: q.attempts + 1,
                    durable: q.durable(),
                    call_chain: q.call_chain.clone(),
                    channel: match &q.channel {
                        Some(span) => Some(span.channel.clone()),
                        None => q.route.conversation().map(str::to_owned),
                    },
                    answer_to: if q.delegated {
                        None
                    } else {
                        q.route.answer_to().map(str::to_owned)
                    },
                    chain: Some(q.chain()),
                }
                .frame(q.id, agent.to_owned(), None);
                match info.outbox.try_send(frame) {
                    Ok(()) => {
                        self.counters.routed += 1;
                        if slot.in_flight.is_none() {
                            slot.in_flight = Some(q);
                            slot.delivered_at = Some(Instant::now());
                        } else {
                            slot.window.push_back(q);
                        }
                    }
                    Err(_) => {
                        slot.queue.push_front(q);
                        retry_later(myself, slot, agent);
                        break;
                    }
                }
            }
        }
        for q in dropped {
            self.discard(agent, q, "its chain of turns was stopped");
        }
        for (q, upto) in told {
            self.told_before(agent, q, upto);
        }
    }

    /// Drops an input that will never run (stale request, stopped chain): a durable message is
    /// marked done in the store (not a dead letter, not a turn), a waiting caller is told.
    pub(super) fn discard(&mut self, agent: &str, q: Queued, reason: &str) {
        match q.kind {
            DeliveryKind::Message | DeliveryKind::Result => {
                let op = WriteOp::Discard { id: q.id, reason: reason.to_owned() };
                let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            }
            DeliveryKind::Request if self.requests.contains_key(&q.id) => {
                let message = format!("`{agent}` will not answer: {reason}");
                self.reply(q.id, agent, Body::Error { code: ErrorCode::BudgetExceeded, message });
            }
            DeliveryKind::Request => {}
            // Handled, as a delta refused at admission is: its messages stay readable.
            DeliveryKind::Delta => self.delta_done(agent, &q, true),
        }
        self.leave(q.chain());
    }

    pub(super) fn turn_finished(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        agent: &str,
        frame: Frame,
    ) {
        let Some(id) = frame.correlation_id else { return };
        let Some(slot) = self.slots.get_mut(agent) else { return };
        let current = slot.in_flight.as_ref().is_some_and(|q| q.id == id);
        match frame.body {
            Body::Ack { reply } => {
                slot.turns_total += 1;
                if !current {
                    // An at_most_once delivery (not leased): only the turn is counted.
                    *self.unflushed_turns.entry(agent.to_owned()).or_default() += 1;
                    return;
                }
                let Some(done) = slot.in_flight.take() else { return };
                turn_ended(agent, slot, true);
                // The agent starts the next input it holds as soon as it has acknowledged this.
                slot.in_flight = slot.window.pop_front();
                if slot.in_flight.is_some() {
                    slot.delivered_at = Some(Instant::now());
                }
                let reply = reply.unwrap_or_default();
                self.journal_turn(agent, &done, &reply);
                match done.kind {
                    DeliveryKind::Message | DeliveryKind::Result => {
                        // The completion and its turn count commit together: counted exactly
                        // once. An answer to a person completes the message only once it is
                        // posted, so a crash in between replays the turn, never loses the answer.
                        if !self.route_answer(myself, agent, &done, &reply) {
                            let op = WriteOp::Complete { id, agent: agent.into() };
                            let _ =
                                self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
                        }
                    }
                    // Not worth a commit per turn: counted in memory, flushed every second.
                    DeliveryKind::Request => {
                        *self.unflushed_turns.entry(agent.to_owned()).or_default() += 1;
                        self.reply(id, agent, Body::Reply { text: reply });
                    }
                    DeliveryKind::Delta => {
                        *self.unflushed_turns.entry(agent.to_owned()).or_default() += 1;
                        self.delta_done(agent, &done, true);
                    }
                }
                self.leave(done.chain());
            }
            Body::Nack { reason } => {
                // Every Nack is answered by a `Rewind` (before any other delivery): the agent
                // drops the deliveries it holds until then.
                slot.rewind_owed = Some(id);
                if !current {
                    return self.deliver_next(myself, agent);
                }
                let Some(failed) = slot.in_flight.take() else { return };
                turn_ended(agent, slot, false);
                // Sent, never started: back to the head of the mailbox, behind the failed one.
                while let Some(q) = slot.window.pop_back() {
                    slot.queue.push_front(q);
                }
                let stopped =
                    self.chains.map.get(&failed.chain()).is_some_and(|c| c.stopped.is_some());
                match failed.kind {
                    // Whatever its kind, an input of a stopped chain is over (a waiting caller
                    // hears BUDGET_EXCEEDED, a delta counts as handled).
                    _ if stopped => self.discard(agent, failed, "its chain of turns was stopped"),
                    DeliveryKind::Request => {
                        let msg = format!("`{agent}` could not finish the request: {reason}");
                        self.reply(
                            id,
                            agent,
                            Body::Error { code: ErrorCode::Internal, message: msg },
                        );
                        self.leave(failed.chain());
                    }
                    DeliveryKind::Message | DeliveryKind::Result => {
                        self.failed_delivery(agent, failed, reason)
                    }
                    DeliveryKind::Delta => {
                        self.delta_done(agent, &failed, false);
                        self.leave(failed.chain());
                    }
                }
            }
            _ => return,
        }
        self.deliver_next(myself, agent);
    }

    /// A durable message's delivery failed: count it; requeue it at the head, or dead-letter it.
    pub(super) fn failed_delivery(&mut self, agent: &str, mut q: Queued, reason: String) {
        let max = self.spec.delivery.max_delivery_attempts;
        let Some(slot) = self.slots.get_mut(agent) else { return };
        q.attempts += 1;
        if q.attempts < max {
            let op = WriteOp::FailedAttempt { id: q.id, attempts: q.attempts };
            slot.queue.push_front(q);
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            return;
        }
        tracing::warn!(
            msg_id = %fmt_id(q.id),
            agent,
            attempts = q.attempts,
            reason = %reason,
            "flock router: message {} to `{agent}` dead-lettered after {} failed deliveries ({reason})",
            fmt_id(q.id),
            q.attempts
        );
        crate::metrics::get().dead_letters.inc();
        let op = WriteOp::DeadLetter {
            id: q.id,
            attempts: q.attempts,
            reason: format!("{} failed deliveries; last: {reason}", q.attempts),
        };
        let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        // A person waiting for this input's answer hears that there will be none.
        if let Some(human) = q.route.answer_to().filter(|to| to.starts_with("human:"))
            && !q.delegated
        {
            let text = format!(
                "[failed] I could not process \"{}\": it failed {} times (last: {reason}). \
                 It is in `flockctl dead-letters`.",
                clip(&q.text, 80),
                q.attempts
            );
            let place = q.route.chain.reply.clone();
            self.post_answer(agent, human, text, q.chain(), None, place);
        }
        self.leave(q.chain());
    }

    pub(super) fn stored(&mut self, myself: &ActorRef<RouterMsg>, batch: StoredBatch) {
        for (op, origin, outcome) in batch.items {
            let WriteOp::Enqueue(msg) = op else { continue };
            let Some(origin) = origin else { continue };
            if origin.conn == hosts::FROM_HOST {
                self.stored_from_host(myself, msg, outcome);
                continue;
            }
            let route =
                Route::load(&msg.route, msg.id, &msg.sender, &msg.target, &msg.text, self.now());
            let chain = route.chain.id;
            let answer = match outcome {
                Ok(WriteOutcome::Inserted) => {
                    crate::metrics::get().durable_messages.inc();
                    let target = msg.target.clone();
                    let remote = self.remote_host(&target).is_some();
                    match self.slots.get_mut(&target) {
                        Some(slot) => {
                            let kind = if route.result {
                                DeliveryKind::Result
                            } else {
                                DeliveryKind::Message
                            };
                            slot.queue.push_back(Queued::new(
                                msg.id,
                                kind,
                                msg.sender.clone(),
                                msg.text,
                                route,
                            ));
                            self.deliver_next(myself, &target);
                        }
                        None if remote => self.forwarded(msg.id, &route),
                        // Decommissioned meanwhile: the mail stays in the store.
                        None => self.leave(chain),
                    }
                    Body::Accepted
                }
                // Accepted before (a replayed turn re-sent it): accepted, not queued or charged
                // twice.
                Ok(_) => {
                    if let Some(c) = self.chains.map.get_mut(&chain) {
                        c.hops = c.hops.saturating_sub(1);
                    }
                    self.leave(chain);
                    Body::Accepted
                }
                Err(e) => {
                    self.leave(chain);
                    Body::Error {
                        code: ErrorCode::Internal,
                        message: format!("the message could not be stored: {e}"),
                    }
                }
            };
            if origin.conn == NO_CONN {
                continue;
            }
            let frame = Frame {
                id: new_id(),
                from: ROUTER.into(),
                to: msg.sender,
                correlation_id: Some(origin.frame),
                deadline_ms: None,
                body: answer,
            };
            self.answer(origin.conn, frame);
        }
    }

    pub(super) fn request_timeout(&mut self, id: MsgId) {
        let Some(req) = self.requests.remove(&id) else { return };
        let target = req.target.clone();
        let message = format!(
            "`{target}` did not answer within {} ms; its turn was cancelled",
            req.timeout_ms
        );
        let body = Body::Error { code: ErrorCode::Timeout, message };
        if req.caller_conn == hosts::FROM_HOST {
            // Its caller's host times it out too (same deadline on its own clock).
            self.answer_host_call(id, body);
        } else {
            let frame = Frame {
                id: new_id(),
                from: ROUTER.into(),
                to: req.caller,
                correlation_id: Some(id),
                deadline_ms: None,
                body,
            };
            self.answer(req.caller_conn, frame);
        }
        // A callee on another host: that host cancels its turn.
        self.remote_call_over(id);
        // Cancel the callee's turn if it is working on it; if it is still queued, it is skipped.
        let Some(slot) = self.slots.get(&target) else { return };
        if slot.in_flight.as_ref().is_some_and(|q| q.id == id)
            && let Some(gw) = &self.gateway
        {
            // The callee's model call is wasted work now: stop it.
            let _ = gw.cast(GatewayMsg::Cancel { agent: target.clone() });
        }
        if slot.in_flight.as_ref().is_some_and(|q| q.id == id)
            && let Some(conn) = slot.conn
        {
            let cancel = Frame {
                correlation_id: Some(id),
                ..Frame::new(
                    ROUTER,
                    target.clone(),
                    Body::Cancel { reason: "the caller's deadline passed".into() },
                )
            };
            self.answer(conn, cancel);
        }
    }

    /// Routes the answer to request `id` back to its caller, if it is still waiting.
    pub(super) fn reply(&mut self, id: MsgId, callee: &str, body: Body) {
        let Some(req) = self.requests.remove(&id) else {
            self.counters.late_replies += 1;
            return;
        };
        self.deadlines.remove(&(req.deadline, id));
        if req.caller_conn == hosts::FROM_HOST {
            self.answer_host_call(id, body);
            return;
        }
        let frame = Frame {
            id: new_id(),
            from: callee.to_owned(),
            to: req.caller,
            correlation_id: Some(id),
            deadline_ms: None,
            body,
        };
        self.answer(req.caller_conn, frame);
    }

    /// Arms the one deadline timer for the earliest pending deadline, unless it already fires
    /// by then.
    pub(super) fn arm_deadline(&mut self, myself: &ActorRef<RouterMsg>) {
        let Some(&(due, _)) = self.deadlines.first() else { return };
        if self.deadline_armed.is_some_and(|armed| armed <= due) {
            return;
        }
        self.deadline_armed = Some(due);
        let wait = Duration::from_millis(due.saturating_sub(self.now()));
        myself.send_after(wait, || RouterMsg::CheckDeadlines);
    }

    /// Persists the turn counts gathered since the last flush, in one write per agent.
    pub(super) fn flush_turns(&mut self) {
        for (agent, n) in self.unflushed_turns.drain() {
            let op = WriteOp::AddTurns { agent, n };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        }
    }
}

/// Tries `agent`'s deliveries again in 10 ms (its outbox was full), unless that is already due.
fn retry_later(myself: &ActorRef<RouterMsg>, slot: &mut Slot, agent: &str) {
    if !slot.retry_scheduled {
        slot.retry_scheduled = true;
        let name = agent.to_owned();
        myself.send_after(Duration::from_millis(10), move || RouterMsg::RetryDeliver(name));
    }
}
