//! The channels actor: channels, membership, seq numbers, delta notifications, agent states,
//! A2A cards and the archive protocol (DESIGN.md §8). Every `flock_*` tool call lands here with
//! the caller's identity taken from its connection (agents) or from `flockctl` (humans), and the
//! caller's powers are checked here, in code.

mod agents;
mod archive;
pub mod bridge;
pub mod delta;
mod posts;
mod schedule;
mod state;

pub use self::state::{AgentState, ChannelsState};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use flock_config::{AgentSpec, Role, SwarmSpec};
use flock_ipc::ErrorCode;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{Value, json};

use self::delta::{strip_hash, valid_channel_id};
use self::state::{PostKey, Refused, bad, described, internal, iso, list_arg, str_arg};
use crate::caller::Caller;
use crate::messages::{AgentOps, AnswerPosted, ChannelsMsg, RouterMsg, StoreMsg, ToolResult};
use crate::store::channels::{Card, ChannelRow, ChannelState};
use crate::store::now_ms;
use crate::store_actor::with_store;
use flock_journal::{Journal, JournalEvent, Status};

/// Tools this actor answers: those the tool table gives it (`flock_*` and `agents__spawn`).
pub fn is_channel_tool(name: &str) -> bool {
    flock_config::tools::owner(name) == Some(flock_config::Owner::Channels)
}

/// Page size of `flock_channel_read` when none is asked for, and its maximum.
const READ_DEFAULT: usize = 50;
const READ_MAX: usize = 200;

pub struct ChannelsArgs {
    pub spec: Arc<SwarmSpec>,
    pub store: ActorRef<StoreMsg>,
    pub journal: Option<Arc<Journal>>,
    /// How to create and decommission agents (`None`: those tools answer INTERNAL).
    pub agent_ops: Option<AgentOps>,
    /// The agents of other hosts, on the leader of a swarm across hosts (which holds every
    /// host's channels); empty otherwise.
    pub elsewhere: Vec<AgentSpec>,
    /// The names the swarm file places on other hosts (any host of a swarm across hosts): no
    /// agent of that name is created here.
    pub taken: Vec<String>,
}

pub struct Channels;

impl Actor for Channels {
    type Msg = ChannelsMsg;
    type State = ChannelsState;
    type Arguments = ChannelsArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ChannelsMsg>,
        args: ChannelsArgs,
    ) -> Result<ChannelsState, ActorProcessingErr> {
        let (channels, cursors, states, cards) = with_store(&args.store, |s| {
            Ok((s.channels()?, s.cursors()?, s.agent_states()?, s.cards()?))
        })
        .await
        .map_err(|e| format!("load channels: {e}"))?;
        let mut st = ChannelsState {
            agents: args.spec.agents.iter().chain(&args.elsewhere).cloned().collect(),
            elsewhere: args.elsewhere.iter().map(|a| (a.key(), a.clone())).collect(),
            taken: args.taken.into_iter().collect(),
            agent_ops: args.agent_ops,
            spec: args.spec,
            store: args.store,
            router: None,
            journal: args.journal,
            channels: channels.into_iter().map(|c| (c.id.clone(), c)).collect(),
            cursors: cursors.into_iter().map(|(a, c, cur)| ((a, c), cur)).collect(),
            states: states
                .into_iter()
                .filter_map(|(a, s)| AgentState::parse(&s).map(|s| (a, s)))
                .collect(),
            cards: cards.into_iter().map(|c| (c.agent.clone(), c)).collect(),
            armed: HashSet::new(),
            retry: HashMap::new(),
            myself: Some(myself.clone()),
            current_chain: None,
            current_answers: false,
            working: HashMap::new(),
            delta_chain: HashMap::new(),
            pulls: HashMap::new(),
            refused: Refused::default(),
            last_post_at: HashMap::new(),
            quiet_armed: HashSet::new(),
        };
        // Mappings changed at run time (`flockctl bridge map|unmap`) stand over the file's.
        let changes = st
            .db(|s| s.bridge_mapping_changes())
            .await
            .map_err(|(_, e)| format!("bridge mappings: {e}"))?;
        if !changes.is_empty() {
            bridge::apply_mapping_changes(&mut Arc::make_mut(&mut st.spec).bridges, &changes);
        }
        st.ensure_bridge_channels().await.map_err(|(_, e)| format!("bridge channels: {e}"))?;
        // Requests that wait for a person are announced where people approve from chat (again:
        // an announcement lost in a crash is made now; one made already is not repeated).
        if st.spec.bridges.iter().any(|b| b.approvals.is_some()) {
            let waiting = st.db(|s| s.permissions_waiting()).await.unwrap_or_default();
            for r in waiting {
                let what = format!("{} {}", r.capability, r.target);
                let why = "waits for a person";
                st.announce_permission(&myself, r.id, &r.agent, &what, &r.reason, why).await;
            }
        }
        // Archive deadlines survive restarts.
        let now = now_ms();
        for c in st.channels.values() {
            if let (ChannelState::Archiving, Some(deadline)) = (c.state, c.archive_deadline_at) {
                let wait = Duration::from_millis(deadline.saturating_sub(now).max(0) as u64);
                let channel = c.id.clone();
                myself.send_after(wait, move || ChannelsMsg::ArchiveDeadline { channel });
            }
        }
        // Quiet spells count again from the start (the last post's time is not kept).
        let opened: Vec<String> = st.channels.keys().cloned().collect();
        for channel in opened {
            st.quiet_arm(&myself, &channel, None);
        }
        // A delta that was in flight when the supervisor stopped was never acknowledged: its
        // messages are still new to the agent (not a replay), so it is scheduled again.
        let unfinished: Vec<(String, String)> = st
            .cursors
            .iter()
            .filter(|(_, c)| c.scheduled_seq > c.sent_seq)
            .map(|(k, _)| k.clone())
            .collect();
        for (agent, channel) in unfinished {
            if let Some(c) = st.cursors.get_mut(&(agent.clone(), channel.clone())) {
                c.scheduled_seq = c.sent_seq;
            }
            let upto = st.channels.get(&channel).map_or(0, |c| c.last_seq);
            st.schedule(&myself, &agent, &channel, upto).await;
        }
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<ChannelsMsg>,
        msg: ChannelsMsg,
        st: &mut ChannelsState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ChannelsMsg::SetRouter(r) => st.router = Some(r),
            ChannelsMsg::Elsewhere { added, gone } => {
                for name in gone {
                    if st.elsewhere.remove(&name).is_some() {
                        st.agents.retain(|a| a.key() != name);
                    }
                }
                for spec in added {
                    if !st.agents.iter().any(|a| a.key() == spec.key()) {
                        st.elsewhere.insert(spec.key(), spec.clone());
                        st.agents.push(spec);
                    }
                }
            }
            ChannelsMsg::Tool { caller, name, arguments, chain, answers, reply } => {
                st.current_chain = chain;
                st.current_answers = answers;
                let result = st.tool(&myself, &caller, &name, &arguments).await;
                st.current_chain = None;
                st.current_answers = false;
                reply.send(result);
            }
            ChannelsMsg::Human { caller, name, arguments, reply } => {
                // Only people (the control socket) change a bridge's mappings.
                let result = if name == "bridge_map" {
                    st.bridge_map(&caller.id, &arguments).await
                } else {
                    st.tool(&myself, &caller, &name, &arguments).await
                };
                let _ = reply.send(result.map_err(|(code, msg)| (code, for_people(&msg))));
            }
            ChannelsMsg::Working { channel, seq, on } => {
                let seqs = st.working.entry(channel.clone()).or_default();
                let changed = if on { seqs.insert(seq) } else { seqs.remove(&seq) };
                if seqs.is_empty() {
                    st.working.remove(&channel);
                }
                if changed {
                    st.wake_pulls(&channel).await;
                }
            }
            ChannelsMsg::PermissionWaiting { id, agent, what, reason, why } => {
                st.announce_permission(&myself, id, &agent, &what, &reason, &why).await;
            }
            ChannelsMsg::Answer { agent, human, text, chain, msg, place, to_host } => {
                let outcome = st.answer(&myself, &agent, &human, &text, chain, msg, place).await;
                let posted = AnswerPosted {
                    chain,
                    agent,
                    human,
                    text,
                    msg,
                    outcome: outcome.map_err(|(code, m)| format!("{code}: {m}")),
                };
                if let Some(host) = to_host {
                    let _ = host.send(posted);
                } else if let Some(r) = &st.router {
                    let _ = r.cast(RouterMsg::Answered(posted));
                }
            }
            ChannelsMsg::DeltaDue { agent, channel } => st.send_delta(&agent, &channel).await,
            ChannelsMsg::DeltaDone { agent, channel, upto, ok } => {
                st.delta_done(&myself, &agent, &channel, upto, ok).await;
            }
            ChannelsMsg::AgentReady { agent } => {
                // Retry deltas that failed while the agent was away; an AWAKE agent also gets
                // whatever its channels received since its cursor.
                let awake = st.state_of(&agent) == AgentState::Awake;
                let mut due: Vec<(String, u64)> = Vec::new();
                for c in st.channels.values().filter(|c| c.members.contains(&agent)) {
                    let key = (agent.clone(), c.id.clone());
                    let sent = st.cursors.get(&key).map_or(0, |cur| cur.sent_seq);
                    if let Some(upto) = st.retry.remove(&key) {
                        due.push((c.id.clone(), upto.max(if awake { c.last_seq } else { 0 })));
                    } else if awake && c.last_seq > sent && c.state != ChannelState::Archived {
                        due.push((c.id.clone(), c.last_seq));
                    }
                }
                for (channel, upto) in due {
                    st.schedule(&myself, &agent, &channel, upto).await;
                }
            }
            ChannelsMsg::ArchiveDeadline { channel } => st.archive_deadline(&channel).await,
            ChannelsMsg::Quiet { channel } => st.quiet(&myself, &channel).await,
            ChannelsMsg::Bridge { bridge, name, arguments, reply } => {
                st.bridge_tool(&myself, &bridge, &name, &arguments, reply).await;
            }
            ChannelsMsg::PullExpired { bridge, external, frame_id } => {
                st.pull_expired(bridge, external, frame_id).await;
            }
        }
        Ok(())
    }
}

/// A refusal worded for an agent, reworded for a person: the tools it names become the
/// `flockctl` commands that do the same.
fn for_people(message: &str) -> String {
    const COMMANDS: [(&str, &str); 5] = [
        ("flock_channel_list", "`flockctl channels`"),
        ("flock_channel_read", "`flockctl read`"),
        ("flock_channel_post", "`flockctl post`"),
        ("flock_channel_create", "`flockctl channel create`"),
        ("flock_discover", "`flockctl ps`"),
    ];
    COMMANDS.iter().fold(message.to_owned(), |m, (tool, command)| {
        m.replace(&format!("`{tool}`"), command).replace(tool, command)
    })
}

/// One line for the journal saying what a successful tool call did.
fn summary(tool: &str, args: &Value, result: &str) -> String {
    let r: Value = serde_json::from_str(result).unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let quote = |text: &str| {
        let mut t: String = text.chars().take(120).collect();
        if text.chars().count() > 120 {
            t.push('…');
        }
        format!("{t:?}")
    };
    match tool {
        "flock_channel_post" | "flock_message" => format!(
            "#{} seq {}: {}",
            s(&r["channel"]),
            r["seq"],
            quote(args["text"].as_str().unwrap_or_default())
        ),
        "flock_channel_create" => {
            format!("created #{} {:?} members {}", s(&r["channel"]), s(&r["topic"]), r["members"])
        }
        "flock_assign_members" => format!("#{} members now {}", s(&r["channel"]), r["members"]),
        "flock_channel_archive" => format!("#{} {}", s(&r["channel"]), s(&r["state"])),
        "flock_archive_ready" => {
            format!("ready to archive #{} (now {})", s(&r["channel"]), s(&r["state"]))
        }
        "flock_update_card" => {
            format!("card: {} skills {}", quote(&s(&r["description"])), r["skills"])
        }
        "flock_sleep" => "asleep until mentioned".into(),
        "flock_channel_read" => format!(
            "read #{} ({} messages)",
            s(&r["channel"]),
            r["messages"].as_array().map_or(0, Vec::len)
        ),
        "flock_channel_list" => format!("listed {} channels", r.as_array().map_or(0, Vec::len)),
        "flock_discover" => format!("found {} agents", r.as_array().map_or(0, Vec::len)),
        "flock_create_agent" => format!("created agent {} ({})", s(&r["name"]), s(&r["role"])),
        "flock_decommission_agent" => format!("decommissioned {}", s(&r["name"])),
        "agents__spawn" => format!("spawned {}", s(&r["address"])),
        _ => result.chars().take(200).collect(),
    }
}

impl ChannelsState {
    /// Runs one tool for `caller`; every call is journaled with its outcome.
    async fn tool(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        caller: &Caller,
        name: &str,
        arguments: &str,
    ) -> ToolResult {
        let args: Value = match serde_json::from_str(if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        }) {
            Ok(v @ Value::Object(_)) => v,
            _ => return Err(bad("tool arguments must be a JSON object")),
        };
        let result = if !is_channel_tool(name) {
            let tools: Vec<&str> =
                flock_config::tools::model_tools().filter(|t| is_channel_tool(t)).collect();
            Err(bad(format!("no channel tool `{name}`; available: {}", tools.join(", "))))
        } else if !caller.may(name) {
            Err((
                ErrorCode::Forbidden,
                format!(
                    "`{}` is a {} and may not call {name}: only the orchestrator (or a human through flockctl) may",
                    caller.id,
                    caller.role.map_or("human", Role::as_str)
                ),
            ))
        } else {
            self.run(myself, caller, name, &args).await
        };
        // Reads by people (`flockctl read`, `channels`) are not events; everything else is.
        let read_only =
            matches!(name, "flock_channel_read" | "flock_channel_list" | "flock_discover");
        if read_only && caller.is_human() && result.is_ok() {
            return result;
        }
        let (status, message) = match &result {
            Ok(r) => (Status::Success, summary(name, &args, r)),
            Err((code, msg)) => (Status::Failed, format!("{code}: {msg}")),
        };
        let mut event = JournalEvent::new(&caller.id, name.to_ascii_uppercase(), status, &message)
            .param("tool", json!(name))
            .param("arguments", args);
        if matches!(&result, Err((ErrorCode::Forbidden, _))) {
            event = event.param("forbidden", Value::Bool(true));
        }
        self.journal(event);
        result
    }

    async fn run(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        caller: &Caller,
        name: &str,
        args: &Value,
    ) -> ToolResult {
        match name {
            "flock_channel_create" => {
                let id = strip_hash(
                    str_arg(args, "channel")
                        .or_else(|| str_arg(args, "id"))
                        .ok_or_else(|| bad("`channel` (the new channel's id) is required"))?,
                )
                .to_owned();
                if !valid_channel_id(&id) {
                    return Err(bad(format!(
                        "`{id}` is not a valid channel id: use 1–63 of a-z, 0-9 and -, starting with a letter or digit"
                    )));
                }
                if self.channels.contains_key(&id) {
                    return Err(bad(format!("channel `#{id}` already exists")));
                }
                let mut members = list_arg(args, "members")?;
                self.check_participants(&members)?;
                if !members.contains(&caller.id) {
                    members.insert(0, caller.id.clone());
                }
                let name = str_arg(args, "name").unwrap_or(&id).to_owned();
                let topic = str_arg(args, "topic").unwrap_or_default();
                let row = ChannelRow::new(&id, &name, topic, &caller.id, false, members);
                self.add_channel(row.clone()).await?;
                self.mirror_new_channel(&id).await;
                Ok(json!({"channel": id, "topic": row.topic, "members": row.members}).to_string())
            }
            "flock_channel_post" => {
                let channel = self.channel(str_arg(args, "channel"))?.id.clone();
                let text = str_arg(args, "text").ok_or_else(|| bad("`text` is required"))?;
                // The agent that owes a person their answer, posting where they asked: this
                // post is the answer (a reply to theirs), so the runtime posts no second one.
                let answer = self
                    .current_chain
                    .as_ref()
                    .filter(|_| self.current_answers)
                    .and_then(|(tag, _)| Some((tag.id, tag.reply.clone()?)))
                    .filter(|(_, place)| place.channel == channel);
                if let Some((chain, place)) = answer {
                    let key = PostKey::Answer(chain);
                    let (seq, duplicate) = self
                        .post_keyed(myself, &channel, &caller.id, text, key, Some(place.seq), false)
                        .await?;
                    if !duplicate {
                        return Ok(json!({"channel": channel, "seq": seq}).to_string());
                    }
                }
                let (seq, _) = self.post(myself, &channel, &caller.id, text).await?;
                Ok(json!({"channel": channel, "seq": seq}).to_string())
            }
            "flock_channel_read" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                let limit = args
                    .get("limit")
                    .and_then(Value::as_u64)
                    .map_or(READ_DEFAULT, |l| (l as usize).clamp(1, READ_MAX));
                let id = ch.id.clone();
                let messages = match args.get("after").and_then(Value::as_u64) {
                    Some(after) => self.db(move |s| s.messages_after(&id, after, limit)).await?,
                    // No cursor: the newest page, so the end of a long channel is one call away.
                    None => {
                        let last = ch.last_seq;
                        self.db(move |s| s.messages_between(&id, 0, last, limit)).await?
                    }
                };
                // A page stays well inside one frame: messages are cut off by bytes as well as
                // by count (always at least one; each is at most a message's limit).
                let budget = self.spec.delivery.max_frame_bytes as usize / 4;
                let mut used = 0;
                let keep = messages
                    .iter()
                    .take_while(|m| {
                        used += m.text.len() + m.author.len();
                        used <= budget
                    })
                    .count()
                    .max(1);
                let mut messages = messages;
                messages.truncate(keep);
                let next_after = messages.last().map(|m| m.seq);
                Ok(json!({
                    "channel": ch.id, "name": ch.name, "topic": ch.topic, "state": ch.state.as_str(),
                    "members": ch.members, "created_by": ch.created_by, "last_seq": ch.last_seq,
                    "messages": messages.iter().map(|m| json!({"seq": m.seq, "author": m.author, "text": m.text})).collect::<Vec<_>>(),
                    "more_after": next_after.filter(|s| *s < ch.last_seq),
                })
                .to_string())
            }
            "flock_channel_list" => {
                let mut list: Vec<&ChannelRow> = self.channels.values().collect();
                list.sort_by_key(|c| (c.created_at, c.id.clone()));
                let v: Vec<Value> = list
                    .iter()
                    .map(|c| {
                        json!({"channel": c.id, "name": c.name, "topic": c.topic, "state": c.state.as_str(),
                               "members": c.members, "last_seq": c.last_seq, "dm": c.is_dm,
                               "member": c.members.contains(&caller.id)})
                    })
                    .collect();
                Ok(Value::Array(v).to_string())
            }
            "flock_assign_members" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                if ch.state == ChannelState::Archived {
                    return Err(bad(format!("#{} is archived; its members cannot change", ch.id)));
                }
                let add = list_arg(args, "add")?;
                let remove = list_arg(args, "remove")?;
                self.check_participants(&add)?;
                let (id, a, r) = (ch.id.clone(), add.clone(), remove.clone());
                self.db(move |s| s.change_members(&id, &a, &r)).await?;
                let c =
                    self.channels.get_mut(&ch.id).ok_or_else(|| internal("channel vanished"))?;
                for m in &add {
                    if !c.members.contains(m) {
                        c.members.push(m.clone());
                    }
                }
                c.members.retain(|m| !remove.contains(m));
                c.ready.retain(|m| !remove.contains(m));
                let members = c.members.clone();
                // Readiness is re-evaluated whenever membership changes.
                if ch.state == ChannelState::Archiving {
                    self.evaluate_archive(&ch.id).await;
                }
                Ok(json!({"channel": ch.id, "members": members}).to_string())
            }
            "flock_channel_archive" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                if ch.state == ChannelState::Archived {
                    return Err(bad(format!("#{} is already archived", ch.id)));
                }
                let force = args.get("force").and_then(Value::as_bool).unwrap_or(false);
                if force {
                    self.archive_now(&ch.id, &format!("forced by {}", caller.id)).await?;
                    return Ok(json!({"channel": ch.id, "state": "archived"}).to_string());
                }
                if ch.state == ChannelState::Archiving {
                    return Err(bad(format!("#{} is already being archived", ch.id)));
                }
                self.start_archive(myself, caller, &ch.id).await?;
                let c = &self.channels[&ch.id];
                Ok(json!({"channel": ch.id, "state": c.state.as_str(),
                          "deadline": c.archive_deadline_at.map(iso)})
                .to_string())
            }
            "flock_archive_ready" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                if !ch.members.contains(&caller.id) {
                    return Err(bad(format!("`{}` is not a member of #{}", caller.id, ch.id)));
                }
                if ch.state != ChannelState::Archiving {
                    return Err(bad(format!(
                        "#{} is {}, not being archived",
                        ch.id,
                        ch.state.as_str()
                    )));
                }
                let (id, who) = (ch.id.clone(), caller.id.clone());
                self.db(move |s| s.mark_archive_ready(&id, &who)).await?;
                if let Some(c) = self.channels.get_mut(&ch.id)
                    && !c.ready.contains(&caller.id)
                {
                    c.ready.push(caller.id.clone());
                }
                // A repeated "ready" re-checks completion too.
                self.evaluate_archive(&ch.id).await;
                Ok(json!({"channel": ch.id, "state": self.channels[&ch.id].state.as_str()})
                    .to_string())
            }
            "flock_message" => {
                let to = str_arg(args, "to").ok_or_else(|| bad("`to` is required"))?.to_owned();
                let text = str_arg(args, "text").ok_or_else(|| bad("`text` is required"))?;
                self.check_participants(std::slice::from_ref(&to))?;
                if to == caller.id {
                    return Err(bad("a DM needs someone else"));
                }
                let id = self.ensure_dm(&caller.id, &to).await?;
                let (seq, _) = self.post(myself, &id, &caller.id, text).await?;
                Ok(json!({"channel": id, "seq": seq}).to_string())
            }
            "flock_discover" => {
                let query = str_arg(args, "query").unwrap_or_default().to_lowercase();
                let role = str_arg(args, "role").map(str::to_lowercase);
                let skill = str_arg(args, "skill").map(str::to_lowercase);
                let found: Vec<Value> = self
                    .agents
                    .iter()
                    .filter_map(|a| {
                        let card = self.cards.get(&a.name).cloned().unwrap_or_default();
                        let description = if card.description.is_empty() { a.description.clone() } else { card.description.clone() };
                        let haystack = format!(
                            "{} {} {} {} {} {}",
                            a.name, a.role.as_str(), a.archetype.clone().unwrap_or_default(), description,
                            card.skills.join(" "), card.tags.join(" ")
                        )
                        .to_lowercase();
                        let ok = haystack.contains(&query)
                            && role.as_deref().is_none_or(|r| r == a.role.as_str())
                            && skill.as_deref().is_none_or(|s| card.skills.iter().any(|k| k.to_lowercase() == s));
                        ok.then(|| {
                            json!({"name": a.name, "role": a.role.as_str(), "archetype": a.archetype,
                                   "description": description, "skills": card.skills, "tags": card.tags,
                                   "state": self.state_of(&a.name).as_str()})
                        })
                    })
                    .collect();
                Ok(Value::Array(found).to_string())
            }
            "flock_update_card" => {
                if caller.is_human() {
                    return Err(bad("cards belong to agents"));
                }
                let mut card = self
                    .cards
                    .get(&caller.id)
                    .cloned()
                    .unwrap_or_else(|| Card { agent: caller.id.clone(), ..Card::default() });
                if let Some(d) = str_arg(args, "description") {
                    card.description = described(d)?;
                }
                if args.get("skills").is_some() {
                    card.skills = list_arg(args, "skills")?;
                }
                if args.get("tags").is_some() {
                    card.tags = list_arg(args, "tags")?;
                }
                let c = card.clone();
                self.db(move |s| s.put_card(&c)).await?;
                self.cards.insert(caller.id.clone(), card.clone());
                Ok(json!({"agent": card.agent, "description": card.description, "skills": card.skills, "tags": card.tags}).to_string())
            }
            "flock_sleep" => {
                if caller.is_human() {
                    return Err(bad("humans do not sleep here"));
                }
                self.set_state(&caller.id, AgentState::Sleep).await?;
                Ok(json!({"agent": caller.id, "state": "SLEEP", "wakes_on": "a @mention or a DM"})
                    .to_string())
            }
            "flock_create_agent" => self.create_agent(caller, args).await,
            "agents__spawn" => self.spawn_instance(caller, args).await,
            "flock_decommission_agent" => self.decommission_agent(caller, args).await,
            _ => Err(bad(format!("no channel tool `{name}`"))),
        }
    }
}
