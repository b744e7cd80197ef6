//! Chains at the router: where a turn's answer goes (a waiting caller, a person's channel), and
//! the accounting of each chain's budget (hops, tokens, wall time) as its turns are admitted and
//! leave; `crate::chains` holds the data, this applies it.

use super::*;

impl RouterState {
    /// Routes a finished turn's answer to whoever waits for it, once per input: a person gets it
    /// in their DM with `agent`, an agent that delegated gets it as a `Result` input. Returns
    /// whether the input's completion waits for the answer's post.
    pub(super) fn route_answer(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        agent: &str,
        done: &Queued,
        reply: &str,
    ) -> bool {
        if done.delegated {
            return false;
        }
        let Some(to) = done.route.answer_to().map(str::to_owned) else { return false };
        let text =
            if reply.trim().is_empty() { "(no answer)".to_owned() } else { reply.to_owned() };
        if to.starts_with("human:") {
            let place = done.route.chain.reply.clone();
            self.post_answer(agent, &to, text, done.chain(), Some(done.id), place);
            return true;
        }
        let mut path = done.route.answer_path.clone();
        path.pop();
        let mut route = Route {
            answer_path: path,
            result: true,
            chain: done.route.chain.clone(),
            hop: done.route.hop + 1,
            parent: Some(done.id),
            tokens: 0,
            by_host: BTreeMap::new(),
        };
        // A stopped chain's person has been told already; the result goes nowhere.
        if self.admit(&mut route, "RESULT", agent, &to, &text).is_ok() {
            let id = derive_id(done.id, RESULT_INDEX);
            self.enqueue(myself, id, agent.to_owned(), to, text, &route, None);
        }
        false
    }

    /// Asks the channels actor to post a chain's answer (or stop notice) where `human` asked
    /// (`place`, as a reply), or in the DM of `agent` and `human`; it answers with
    /// [`RouterMsg::Answered`]. `msg` is completed after the post.
    pub(super) fn post_answer(
        &mut self,
        agent: &str,
        human: &str,
        text: String,
        chain: MsgId,
        msg: Option<MsgId>,
        place: Option<chains::ReplyPlace>,
    ) {
        // A person who asked in a channel is answered there, by the leader that holds it; a
        // send of another host's operator in its DM there; a DM of `flockctl send` on this
        // host stays here.
        let to = match &place {
            Some(_) => self.leader_elsewhere().map(str::to_owned),
            None => self.operator.asker(&chain).map(str::to_owned),
        };
        if let Some(to) = to {
            if let Some(c) = self.chains.map.get_mut(&chain) {
                c.live += 1;
            }
            let agent = agent.to_owned();
            let human = human.to_owned();
            let answer = leader::AnswerOut { agent, human, text, chain, msg, place, to, tries: 0 };
            return self.answer_to_host(answer);
        }
        let posted = match &self.channels {
            Some(ch) => {
                let ask = ChannelsMsg::Answer {
                    agent: agent.to_owned(),
                    human: human.to_owned(),
                    text,
                    chain,
                    msg,
                    place,
                    to_host: None,
                };
                ch.cast(ask).is_ok()
            }
            None => false,
        };
        if posted {
            if let Some(c) = self.chains.map.get_mut(&chain) {
                c.live += 1;
            }
        } else {
            tracing::error!(
                agent,
                human,
                chain = %fmt_id(chain),
                "flock router: no channels actor: the answer of {agent} to {human} cannot be posted"
            );
            if let Some(id) = msg {
                let op = WriteOp::Complete { id, agent: agent.into() };
                let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            }
        }
    }

    /// The channels actor stored a chain's answer (and completed the input it answers in the
    /// same transaction): tell the watchers. When it could not post it, the input is completed
    /// here: the answer is lost (journaled), not retried.
    pub(super) fn answered(&mut self, p: AnswerPosted) {
        if let (Some(id), Err(_)) = (p.msg, &p.outcome) {
            let op = WriteOp::Complete { id, agent: p.agent.clone() };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        }
        match &p.outcome {
            Ok((channel, seq, duplicate)) => {
                let action = if *duplicate { "ANSWER_DUPLICATE" } else { "ANSWER" };
                let message = if *duplicate {
                    format!(
                        "#{channel} already holds this chain's answer (seq {seq}); not posted again"
                    )
                } else {
                    format!("#{channel} seq {seq}: {}", quote(&p.text))
                };
                self.journal_chain(
                    p.chain,
                    None,
                    &p.agent,
                    action,
                    Status::Success,
                    message,
                    |e| {
                        e.param("to", p.human.clone())
                            .param("channel", channel.clone())
                            .param("seq", *seq)
                    },
                );
                let stopped = match self.chains.map.get_mut(&p.chain) {
                    Some(c) => {
                        c.answered = true;
                        c.stopped.is_some()
                    }
                    None => false,
                };
                self.sync_working(p.chain);
                if !*duplicate {
                    let outcome =
                        if stopped { ChainOutcome::Stopped } else { ChainOutcome::Answered };
                    self.end_watchers(p.chain, outcome, &p.text, &p.agent, channel, *seq);
                }
            }
            Err(e) => {
                tracing::warn!(
                    agent = %p.agent,
                    human = %p.human,
                    chain = %fmt_id(p.chain),
                    error = %e,
                    "flock router: the answer of {} to {} was not posted",
                    p.agent,
                    p.human
                );
                self.journal_chain(
                    p.chain,
                    None,
                    &p.agent,
                    "ANSWER",
                    Status::Failed,
                    e.clone(),
                    |e| e.param("to", p.human.clone()),
                );
            }
        }
        self.leave(p.chain);
    }

    /// Tells every `flockctl send --wait` of a chain how it ended.
    pub(super) fn end_watchers(
        &mut self,
        chain: MsgId,
        outcome: ChainOutcome,
        text: &str,
        by: &str,
        channel: &str,
        seq: u64,
    ) {
        let now = self.now();
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        let watchers = std::mem::take(&mut c.watchers);
        let end = ChainEnd {
            chain,
            outcome,
            text: text.to_owned(),
            by: by.to_owned(),
            channel: channel.to_owned(),
            seq,
            hops: c.hops,
            tokens: c.tokens,
            elapsed_ms: now.saturating_sub(c.tag.started_ms),
        };
        self.operator_chain_ended(&end);
        for (conn, frame_id) in watchers {
            let frame = Frame {
                correlation_id: Some(frame_id),
                ..Frame::new(ROUTER, OPERATOR, Body::ChainEnded(end.clone()))
            };
            self.answer(conn, frame);
        }
    }

    /// The route of a message `sender` sends now: in the chain of the input it is working on,
    /// or the root of a new chain when it works on none (a timer, a program's own send).
    pub(super) fn child_route(
        &self,
        sender: &str,
        id: MsgId,
        to: &str,
        text: &str,
        answer_path: Vec<String>,
    ) -> Route {
        match self.slots.get(sender).and_then(|s| s.in_flight.as_ref()) {
            Some(q) => Route {
                answer_path,
                result: false,
                chain: q.route.chain.clone(),
                hop: q.route.hop + 1,
                parent: Some(q.id),
                tokens: 0,
                by_host: BTreeMap::new(),
            },
            None => {
                let mut r = Route::root(id, sender, to, text, self.now(), None);
                r.answer_path = answer_path;
                r
            }
        }
    }

    /// The chain `agent` is working in, and its hops so far.
    pub(super) fn current_chain(&self, agent: &str) -> Option<(ChainTag, u32)> {
        let q = self.slots.get(agent)?.in_flight.as_ref()?;
        let hops = self.chains.map.get(&q.chain()).map_or(q.route.hop, |c| c.hops);
        Some((q.route.chain.clone(), hops))
    }

    /// Charges one more hop to `route`'s chain (creating the chain for a root), or refuses it:
    /// a stopped chain takes nothing, and a hop past the budget stops the chain. Sets the hop.
    pub(super) fn admit(
        &mut self,
        route: &mut Route,
        action: &str,
        from: &str,
        to: &str,
        text: &str,
    ) -> Result<(), String> {
        let budget = self.spec.budget.clone();
        let now = self.now();
        let from = if from == OPERATOR { OPERATOR_HUMAN } else { from };
        if !self.chains.map.contains_key(&route.chain.id) {
            let root = route.parent.is_none() && route.hop <= 1;
            if root && route.answer_path.is_empty() {
                // A root nobody waits on costs nothing until it sets something off (a program's
                // message to a sink never does): its chain is made by its first follow-up.
                route.hop = 1;
                return Ok(());
            }
            // A follow-up of such a root counts its parent's turn, which is in flight.
            self.materialize(&route.chain, route.hop, u32::from(route.parent.is_some()));
        }
        let Some(chain) = self.chains.map.get_mut(&route.chain.id) else {
            return Err("internal: the chain vanished".into());
        };
        if let Some(reason) = &chain.stopped {
            return Err(format!("this chain of turns was stopped: {reason}"));
        }
        let over = chain.refuses_next_hop(&budget, now);
        if let Some(kind) = over {
            let id = route.chain.id;
            self.stop_chain(id, kind);
            return Err(format!(
                "this chain of turns was stopped: {}",
                chains::describe_stop(kind, &budget)
            ));
        }
        chain.hops += 1;
        chain.live += 1;
        route.hop = chain.hops;
        let verb = match action {
            "SEND" => "sent to",
            "REQUEST" => "asked",
            "DELEGATE" => "delegated to",
            "RESULT" => "answered",
            "DELTA" => "notified",
            _ => "→",
        };
        chain.note(format!("{from} {verb} {to}"));
        let (id, parent, hop) = (route.chain.id, route.parent, route.hop);
        self.journal_chain(
            id,
            parent,
            from,
            action,
            Status::Success,
            format!("{from} {verb} {to} (hop {hop}): {}", quote(text)),
            |e| e.param("to", to.to_owned()).param("hop", hop),
        );
        Ok(())
    }

    /// Starts keeping chain `tag` (whose next hop is `hop`) with `live` deliveries already in
    /// progress; a chain made after its first hop journals that hop now.
    pub(super) fn materialize(&mut self, tag: &ChainTag, hop: u32, live: u32) {
        if self.chains.map.contains_key(&tag.id) {
            return;
        }
        // A chain that ended a moment ago and is set off again (a delta handed out after its
        // coalescing delay): it goes on, its root already told.
        if self.chains.revive(tag) {
            let chain = self.chains.entry(tag, hop);
            chain.live = live;
            return;
        }
        let chain = self.chains.entry(tag, hop);
        chain.live = live;
        let late_root = chain.hops >= 1;
        if late_root {
            chain.note(format!("{} sent to {}", tag.origin, tag.entry));
            let message =
                format!("{} sent to {} (hop 1): {}", tag.origin, tag.entry, quote(&tag.text));
            self.journal_chain(tag.id, None, &tag.origin, "SEND", Status::Success, message, |e| {
                e.param("to", tag.entry.clone()).param("hop", 1)
            });
        }
    }

    /// One of the chain's deliveries (or a pending answer) is over; the chain ends at none.
    pub(super) fn leave(&mut self, chain: MsgId) {
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        c.live = c.live.saturating_sub(1);
        if c.live > 0 {
            return;
        }
        if !c.watchers.is_empty() || self.operator.started(&chain) {
            let by = c.tag.entry.clone();
            let text = match &c.stopped {
                Some(r) => format!("[stopped] {r}"),
                None => "(the chain ended without an answer for you)".to_owned(),
            };
            let outcome =
                if c.stopped.is_some() { ChainOutcome::Stopped } else { ChainOutcome::Ended };
            self.end_watchers(chain, outcome, &text, &by, "", 0);
        }
        self.chains.end(chain);
        self.sync_working(chain);
    }

    /// Tells the channels actor whether `chain` is working on a person's post now (running,
    /// not answered, not stopped), when that changed: the bridges show it as typing.
    pub(super) fn sync_working(&mut self, chain: MsgId) {
        let now = self
            .chains
            .map
            .get(&chain)
            .filter(|c| c.stopped.is_none() && !c.answered && c.live > 0)
            .and_then(|c| c.tag.reply.clone());
        let before = match &now {
            Some(p) => self.working.insert(chain, p.clone()),
            None => self.working.remove(&chain),
        };
        let change = match (before, now) {
            (None, Some(p)) => Some((p, true)),
            (Some(p), None) => Some((p, false)),
            _ => None,
        };
        let Some((p, on)) = change else { return };
        // The leader's bridges show it, when the channels are the leader's.
        if let Some(leader) = self.leader_elsewhere().map(str::to_owned) {
            return self.working_to_leader(leader, p.channel, p.seq, on);
        }
        if let Some(ch) = &self.channels {
            let _ = ch.cast(ChannelsMsg::Working { channel: p.channel, seq: p.seq, on });
        }
    }

    /// A person's post that an agent must answer: the message is stored already (with the
    /// post); it starts its chain here and waits in the agent's queue.
    pub(super) fn asked(&mut self, myself: &ActorRef<RouterMsg>, ask: crate::store::channels::Ask) {
        let crate::store::channels::Ask { agent, text, id, mut route } = ask;
        let sender = route.chain.origin.clone();
        // An agent on another host: the cluster link sends the stored message there.
        let remote = !self.slots.contains_key(&agent) && self.remote_host(&agent).is_some();
        if !self.slots.contains_key(&agent) && !remote {
            return; // decommissioned meanwhile: the mail stays in the store
        }
        if let Err(reason) = self.admit(&mut route, "SEND", &sender, &agent, &text) {
            tracing::warn!(agent, reason = %reason, "flock router: a person's post to {agent} was not admitted: {reason}");
            let op = WriteOp::Discard { id, reason };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            return;
        }
        crate::metrics::get().durable_messages.inc();
        if remote {
            return self.forwarded(id, &route);
        }
        let chain = route.chain.id;
        if let Some(slot) = self.slots.get_mut(&agent) {
            slot.queue.push_back(Queued::new(id, DeliveryKind::Message, sender, text, route));
        }
        self.sync_working(chain);
        self.deliver_next(myself, &agent);
    }

    /// Stops a chain at a budget: nothing more of it runs, its running turns are cancelled, and
    /// the person who started it is told in their DM (once).
    pub(super) fn stop_chain(&mut self, id: MsgId, kind: StopKind) {
        let reason = chains::describe_stop(kind, &self.spec.budget);
        let Some(chain) = self.chains.map.get_mut(&id) else { return };
        if chain.stopped.is_some() {
            return;
        }
        chain.stopped = Some(reason.clone());
        self.chains.stopped_total += 1;
        let notice = chain.stop_notice(&reason);
        let (origin, entry, answered, place) = (
            chain.tag.origin.clone(),
            chain.tag.entry.clone(),
            chain.answered,
            chain.tag.reply.clone(),
        );
        tracing::warn!(
            chain = %fmt_id(id),
            agent = %entry,
            reason = %reason,
            "flock router: chain {} stopped: {reason}",
            fmt_id(id)
        );
        self.journal_chain(
            id,
            None,
            &entry,
            "CHAIN_STOPPED",
            Status::Failed,
            notice.clone(),
            |e| e.param("reason", reason.clone()).param("origin", origin.clone()),
        );
        // The turns of the chain: running, or handed over in a delivery window (the agent
        // remembers a cancel for a turn it has not started).
        let running: Vec<(String, MsgId, Option<ConnId>, bool)> = self
            .slots
            .iter()
            .flat_map(|(name, s)| {
                let head = s.in_flight.iter().map(|q| (q, true));
                head.chain(s.window.iter().map(|q| (q, false)))
                    .filter(|(q, _)| q.chain() == id)
                    .map(|(q, started)| (name.clone(), q.id, s.conn, started))
            })
            .collect();
        for (agent, delivery, conn, started) in running {
            if started && let Some(gw) = &self.gateway {
                let _ = gw.cast(GatewayMsg::Cancel { agent: agent.clone() });
            }
            if let Some(conn) = conn {
                let cancel = Frame {
                    correlation_id: Some(delivery),
                    ..Frame::new(
                        ROUTER,
                        agent,
                        Body::Cancel {
                            reason: format!("its chain of turns was stopped: {reason}"),
                        },
                    )
                };
                self.answer(conn, cancel);
            }
        }
        self.sync_working(id);
        if !answered && origin.starts_with("human:") {
            self.post_answer(&entry, &origin, notice, id, None, place);
        } else {
            self.end_watchers(id, ChainOutcome::Stopped, &notice, &entry, "", 0);
        }
    }

    /// Model tokens a chain used; past its token budget it is stopped.
    pub(super) fn charge_tokens(&mut self, chain: MsgId, tokens: u64) {
        let budget = &self.spec.budget;
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        c.tokens += tokens;
        if c.stopped.is_none() && c.tokens > budget.max_tokens {
            self.stop_chain(chain, StopKind::Tokens);
        }
    }

    /// Stops the chains that ran past their time budget (checked every second).
    pub(super) fn check_wall_budgets(&mut self) {
        let now = self.now();
        let limit = self.spec.budget.max_wall_secs * 1000;
        let late: Vec<MsgId> = self
            .chains
            .map
            .values()
            .filter(|c| c.stopped.is_none() && c.live > 0)
            .filter(|c| now.saturating_sub(c.tag.started_ms) > limit)
            .map(|c| c.tag.id)
            .collect();
        for id in late {
            self.stop_chain(id, StopKind::Wall);
        }
        self.release_awaiting();
    }

    /// A hop sent to another host whose result may never come (that host stopped the chain too,
    /// its agent failed, or the host is down): once the chain is stopped here, or gone, nothing
    /// here waits for it any more and the chain can end. A result that comes later is
    /// delivered like any message.
    fn release_awaiting(&mut self) {
        let chains = &self.chains.map;
        let done: Vec<(MsgId, MsgId)> = self
            .awaiting
            .iter()
            .filter(|(_, chain)| chains.get(*chain).is_none_or(|c| c.stopped.is_some()))
            .map(|(hop, chain)| (*hop, *chain))
            .collect();
        for (hop, chain) in done {
            self.awaiting.remove(&hop);
            self.leave(chain);
        }
    }

    /// A finished turn, journaled in its chain (if the router keeps it: a lone root is not).
    pub(super) fn journal_turn(&self, agent: &str, done: &Queued, reply: &str) {
        if self.journal.is_none() || !self.chains.map.contains_key(&done.chain()) {
            return;
        }
        let kind = match done.kind {
            DeliveryKind::Message => "message",
            DeliveryKind::Request => "request",
            DeliveryKind::Delta => "delta",
            DeliveryKind::Result => "result",
        };
        let what = if done.delegated { "delegated its input".to_owned() } else { quote(reply) };
        self.journal_chain(
            done.chain(),
            Some(done.id),
            agent,
            "TURN",
            Status::Success,
            format!("{agent} finished a turn on a {kind} from {}: {what}", done.sender),
            |e| {
                e.param("input", kind)
                    .param("from", done.sender.clone())
                    .param("hop", done.route.hop)
            },
        );
    }

    /// Appends a chain event to the journal (if the router journals): `trace.correlation_id`
    /// is the chain, `trace.parent_id` the message whose turn caused it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn journal_chain(
        &self,
        chain: MsgId,
        parent: Option<MsgId>,
        agent: &str,
        action: &str,
        status: Status,
        message: String,
        more: impl FnOnce(JournalEvent) -> JournalEvent,
    ) {
        let Some(j) = &self.journal else { return };
        let who = if agent == OPERATOR { OPERATOR_HUMAN } else { agent };
        let mut e =
            JournalEvent::new(who, action, status, message).correlation(chains::corr(chain));
        if let Some(p) = parent {
            e = e.parent(fmt_id(p));
        }
        j.log(more(e));
    }
}
