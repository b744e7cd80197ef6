//! The channels' side of chat bridges (issue #9): what a `flock-bridge` process may do, with its
//! identity from its connection and its powers from the swarm file's `bridges:` mappings.
//!
//! - `bridge__post {external, message_id, user_id, user_name, text}`: a person's message from a
//!   mapped platform chat becomes a post by `human:<platform>:<name>` in the mapped channel,
//!   exactly once: its origin (`<bridge>/<external>/<message_id>`) is a unique key of the post,
//!   so a message the bridge hands over again (after a crash, a reconnect, a replayed update)
//!   answers the first post's seq with `duplicate: true`.
//! - `bridge__pull {external, wait_ms}`: the channel's posts after the mapping's durable cursor
//!   (at most [`PULL_MAX`]), leaving out those that came from this very chat (no echo). With
//!   nothing new, the call waits up to `wait_ms` for a post (long poll, no polling storm).
//! - `bridge__last {external}`: the platform id of the newest message brought in from that chat
//!   (a restarted Discord bridge fetches what was written after it).
//! - `bridge__sent {external, seq, external_id}`: everything up to `seq` reached the chat; the
//!   cursor moves (never back) and the platform's message id is remembered.
//! - Archive: once the channel is archived and the mapping's cursor has reached its last post
//!   (every earlier post went out first, in order), `bridge__pull` answers at once with
//!   `archived: true` and `mirrored` (whether the bridge already mirrored the archive to the
//!   chat). `bridge__archived {external}` records that it did (durably, so a restarted bridge
//!   does not do it again).
//!
//! The channel log is the outbox: a post leaves it only when the bridge says it was delivered,
//! so a bridge killed at any moment resumes at its cursor and loses nothing.

use std::sync::Arc;

use flock_config::{BridgeMapping, BridgeSpec};
use flock_ipc::ErrorCode;
use ractor::ActorRef;
use serde_json::{Value, json};

use super::state::{ChannelsState, ParkedPull, PostKey, bad, str_arg};
use crate::messages::{ChannelsMsg, RouterMsg, ToolReply, ToolResult};
use crate::store::StoreError;
use crate::store::bridges::{BridgeEdit, BridgePost, MappingChange};
use crate::store::channels::{ChannelRow, ChannelState};
use flock_journal::{JournalEvent, Status};

/// The `external` of a mapping whose platform channel is still to be made (a bridge with
/// `mirror_new_channels` and a channel just created in Flock): `new:<channel>`.
pub const PENDING_PREFIX: &str = "new:";

/// The swarm file's mappings with the run-time changes applied, in order of change.
pub fn apply_mapping_changes(bridges: &mut [BridgeSpec], changes: &[MappingChange]) {
    for c in changes {
        let Some(b) = bridges.iter_mut().find(|b| b.name == c.bridge) else { continue };
        let removed = b.channels.iter().position(|m| m.external == c.external);
        let removed = removed.map(|i| b.channels.remove(i));
        if let Some(flock) = &c.flock {
            // A run-time mapping keeps the responder the file gave that chat, if any.
            let (responder, replies) =
                removed.map(|m| (m.responder, m.replies)).unwrap_or_default();
            b.channels.push(BridgeMapping {
                flock: flock.clone(),
                external: c.external.clone(),
                allow: c.allow.clone(),
                responder,
                replies,
            });
        }
    }
}

/// A person's `/approve ID [reason]` or `/deny ID [reason]` in a chat (Telegram's
/// `/approve@botname ID` too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalCommand {
    pub approve: bool,
    pub id: i64,
    pub reason: String,
}

impl ApprovalCommand {
    pub fn parse(text: &str) -> Option<ApprovalCommand> {
        let mut words = text.trim().splitn(3, char::is_whitespace);
        let verb = words.next()?.to_ascii_lowercase();
        let approve = match verb.split('@').next()? {
            "/approve" => true,
            "/deny" => false,
            _ => return None,
        };
        let id = words.next()?.trim_start_matches('#').parse().ok()?;
        let reason = words.next().unwrap_or_default().trim().to_owned();
        Some(ApprovalCommand { approve, id, reason })
    }
}

/// Posts per pull answer.
pub const PULL_MAX: usize = 50;
/// Direct chats one bridge maps at most (a public bot is reachable by anyone).
pub const MAX_DM_CHATS: usize = 500;
/// The longest a pull may wait for a post.
const PULL_WAIT_MAX_MS: u64 = 60_000;

/// Names of the tools a bridge connection may call.
pub fn is_bridge_tool(name: &str) -> bool {
    flock_ipc::identity::BRIDGE_TOOLS.contains(&name)
}

impl ChannelsState {
    fn bridge_spec(&self, bridge: &str) -> Result<&BridgeSpec, (ErrorCode, String)> {
        self.spec.bridges.iter().find(|b| b.name == bridge).ok_or_else(|| {
            (ErrorCode::Forbidden, format!("`{bridge}` is not a bridge of this swarm"))
        })
    }

    /// The Flock channel `external` is mapped to for `bridge`.
    fn mapped(&self, bridge: &str, args: &Value) -> Result<(String, String), (ErrorCode, String)> {
        let external = str_arg(args, "external").ok_or_else(|| bad("`external` is required"))?;
        let spec = self.bridge_spec(bridge)?;
        let m = spec.channels.iter().find(|m| m.external == external).ok_or_else(|| {
            (ErrorCode::Forbidden, format!("chat `{external}` is not mapped by bridge `{bridge}`"))
        })?;
        Ok((m.flock.clone(), external.to_owned()))
    }

    /// Creates the channels the bridges map that do not exist yet (by `bridge:<name>`, with no
    /// members: people or the orchestrator add them), and makes each mapping's `responder` a
    /// member of its channel.
    pub(super) async fn ensure_bridge_channels(&mut self) -> Result<(), (ErrorCode, String)> {
        let wanted: Vec<(String, String, &'static str, Option<String>)> = self
            .spec
            .bridges
            .iter()
            .flat_map(|b| {
                b.channels.iter().map(|m| {
                    (m.flock.clone(), b.name.clone(), b.platform.as_str(), m.responder.clone())
                })
            })
            .collect();
        for (id, bridge, platform, responder) in wanted {
            if !self.channels.contains_key(&id) {
                let topic = format!("bridged to {platform}");
                let by = format!("bridge:{bridge}");
                self.add_channel(ChannelRow::new(&id, &id, &topic, &by, false, Vec::new())).await?;
            }
            let Some(responder) = responder.filter(|r| self.is_agent(r)) else { continue };
            if self.channels.get(&id).is_some_and(|c| !c.members.contains(&responder)) {
                let (c, add) = (id.clone(), vec![responder.clone()]);
                self.db(move |s| s.change_members(&c, &add, &[])).await?;
                if let Some(c) = self.channels.get_mut(&id) {
                    c.members.push(responder);
                }
            }
        }
        Ok(())
    }

    /// One `bridge__*` call of `bridge`; a pull with nothing new is parked (answered later).
    pub(super) async fn bridge_tool(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        bridge: &str,
        name: &str,
        arguments: &str,
        reply: ToolReply,
    ) {
        let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
        let result = match name {
            "bridge__post" => self.bridge_post(myself, bridge, &args).await,
            "bridge__edit" => self.bridge_edit(bridge, &args).await,
            "bridge__made" => self.bridge_made(bridge, &args).await,
            "bridge__mappings" => self.bridge_spec(bridge).map(|b| {
                let channels: Vec<Value> = b
                    .channels
                    .iter()
                    .map(|m| {
                        json!({"flock": m.flock, "external": m.external, "allow": m.allow,
                               "replies": m.replies})
                    })
                    .collect();
                json!({"channels": channels}).to_string()
            }),
            "bridge__sent" => self.bridge_sent(bridge, &args).await,
            "bridge__last" => match self.mapped(bridge, &args) {
                Ok((channel, external)) => {
                    let prefix = format!("{bridge}/{external}/");
                    self.db(move |s| s.last_origin(&channel, &prefix))
                        .await
                        .map(|id| json!({"message_id": id}).to_string())
                }
                Err(e) => Err(e),
            },
            "bridge__pull" => {
                let wait_ms = args.get("wait_ms").and_then(Value::as_u64).unwrap_or(0);
                // What the bridge shows as being worked on: a change answers at once.
                let shown: Vec<u64> = args
                    .get("working")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                match self.bridge_pull(bridge, &args).await {
                    Ok(p)
                        if p.is_empty()
                            && wait_ms > 0
                            && p.archived.is_none()
                            && p.working.iter().map(|(s, _)| *s).eq(shown.iter().copied()) =>
                    {
                        let channel = p.channel;
                        // Park it: the next post or edit in the channel (or the wait running
                        // out) answers. A newer pull of the same mapping replaces an older one.
                        let Ok((_, external)) = self.mapped(bridge, &args) else { return };
                        let key = (bridge.to_owned(), external.clone());
                        let frame_id = reply.frame_id;
                        self.pulls.insert(key, ParkedPull { channel, reply });
                        let (b, wait) = (bridge.to_owned(), wait_ms.min(PULL_WAIT_MAX_MS));
                        myself.send_after(std::time::Duration::from_millis(wait), move || {
                            ChannelsMsg::PullExpired { bridge: b, external, frame_id }
                        });
                        return;
                    }
                    Ok(p) => Ok(self.pull_answer(&p)),
                    Err(e) => Err(e),
                }
            }
            "bridge__archived" => self.bridge_archived(bridge, &args).await,
            other => Err(bad(format!("unknown bridge tool `{other}`"))),
        };
        reply.send(result);
    }

    async fn bridge_post(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        bridge: &str,
        args: &Value,
    ) -> ToolResult {
        let spec = self.bridge_spec(bridge)?.clone();
        let field =
            |k: &str| flock_ipc::identity::platform_id(args, k).map_err(|e| (e.code, e.message));
        let (message_id, user_id) = (field("message_id")?, field("user_id")?);
        let user_name = str_arg(args, "user_name").unwrap_or_default();
        let author = flock_ipc::identity::human_author(spec.platform.as_str(), user_name, &user_id);
        // A person writing to the bot directly: their chat becomes a DM with the agent that
        // answers DMs, mapped (durably) on their first message.
        let direct = args.get("dm").and_then(Value::as_bool) == Some(true);
        let (channel, external) = match self.mapped(bridge, args) {
            Ok(m) => m,
            Err(_) if direct => {
                let external = field("external")?;
                match self.map_direct(&spec, &external, &user_id, &author).await {
                    Ok(m) => m,
                    Err((code, why)) => {
                        let origin = format!("{bridge}/{external}/{message_id}");
                        let reason = "a direct message the bridge does not take";
                        self.refuse_once(&spec, &origin, &why, reason, "", args);
                        return Err((code, why));
                    }
                }
            }
            Err(e) => return Err(e),
        };
        let origin = format!("{bridge}/{external}/{message_id}");
        // Who may speak is decided here (the bridge hands over a refused person's message
        // without its text): the refusal is journaled, once per platform message.
        let mapping = spec.channels.iter().find(|m| m.external == external);
        let allow = match mapping {
            Some(m) => m.allow.clone(),
            // A DM mapped a moment ago (not in this copy of the spec yet) is its person's.
            None => Some(vec![user_id.clone()]),
        };
        if let Some(allow) = allow
            && !allow.contains(&user_id)
        {
            let why = format!("user {user_id} may not post in #{channel} through `{bridge}`");
            self.refuse_once(&spec, &origin, &why, "not on the allow list", &channel, args);
            return Err((ErrorCode::Forbidden, why));
        }
        let text = str_arg(args, "text").ok_or_else(|| bad("`text` is required"))?;
        if let Some(command) = ApprovalCommand::parse(text) {
            return self
                .chat_approval(myself, &spec, &channel, &author, &user_id, text, origin, command)
                .await;
        }
        let (seq, duplicate) = self
            .post_keyed(myself, &channel, &author, text, PostKey::Origin(origin), None, true)
            .await?;
        Ok(json!({"channel": channel, "seq": seq, "author": author, "duplicate": duplicate})
            .to_string())
    }

    /// Journals a refused platform message, once per message (`reason` says why in a word).
    fn refuse_once(
        &mut self,
        spec: &BridgeSpec,
        origin: &str,
        why: &str,
        reason: &str,
        channel: &str,
        args: &Value,
    ) {
        if !self.refused.first_time(origin) {
            return;
        }
        let text = |k: &str| args.get(k).map(|v| v.to_string().trim_matches('"').to_owned());
        let name: String = text("user_name").unwrap_or_default().chars().take(80).collect();
        self.journal(
            JournalEvent::new(
                format!("bridge:{}", spec.name),
                "BRIDGE_POST_REFUSED",
                Status::Failed,
                format!("{why}: {reason}"),
            )
            .param("bridge", json!(spec.name))
            .param("platform", json!(spec.platform.as_str()))
            .param("chat", json!(text("external")))
            .param("channel", json!(channel))
            .param("message_id", json!(text("message_id")))
            .param("user_id", json!(text("user_id")))
            .param("user_name", json!(name))
            .param("reason", json!(reason)),
        );
    }

    /// The DM channel of a person's direct chat with the bot (`external`), made and mapped on
    /// their first message: a two-member channel of the bridge's `dm.agent` and the person,
    /// keyed by their platform id (two people with one display name never share it). Refused
    /// when the bridge takes no DMs or the person is not on `dm.allow`.
    async fn map_direct(
        &mut self,
        spec: &BridgeSpec,
        external: &str,
        user_id: &str,
        author: &str,
    ) -> Result<(String, String), (ErrorCode, String)> {
        let bridge = &spec.name;
        let Some(dm) = &spec.dm else {
            return Err((
                ErrorCode::Forbidden,
                format!("bridge `{bridge}` takes no direct messages (`dm: false`)"),
            ));
        };
        if dm.allow.as_ref().is_some_and(|a| !a.iter().any(|u| u == user_id)) {
            return Err((
                ErrorCode::Forbidden,
                format!(
                    "user {user_id} may not write to bridge `{bridge}`'s bot (not on `dm.allow`)"
                ),
            ));
        }
        if !self.is_agent(&dm.agent) {
            return Err((
                ErrorCode::TargetUnavailable,
                format!("`{}`, who answers bridge `{bridge}`'s DMs, is not in service", dm.agent),
            ));
        }
        // A bot anyone can find must not grow without bound: each DM is a channel, a mapping
        // and a relay loop.
        let open = spec
            .channels
            .iter()
            .filter(|m| self.channels.get(&m.flock).is_some_and(|c| c.is_dm))
            .count();
        if open >= MAX_DM_CHATS {
            return Err((
                ErrorCode::RateLimited,
                format!(
                    "bridge `{bridge}` already has {MAX_DM_CHATS} direct chats; a new one is not \
                     taken (set `dm.allow` to the people who may write to the bot)"
                ),
            ));
        }
        let key = format!("human:{bridge}:{user_id}");
        let channel = super::delta::dm_channel_id(&dm.agent, &key);
        if !self.channels.contains_key(&channel) {
            let name = format!("DM {} / {author}", dm.agent);
            let topic = format!("direct messages with {author} through {}", spec.platform.as_str());
            let members = vec![dm.agent.clone(), author.to_owned()];
            let by = format!("bridge:{bridge}");
            self.add_channel(ChannelRow::new(&channel, &name, &topic, &by, true, members)).await?;
        }
        let change = MappingChange {
            bridge: bridge.clone(),
            external: external.to_owned(),
            flock: Some(channel.clone()),
            allow: Some(vec![user_id.to_owned()]),
        };
        let (c, by) = (change.clone(), format!("bridge:{bridge}"));
        // From the first post of the DM on: the answer to this very message goes out.
        let (b, e, ch) = (bridge.clone(), external.to_owned(), channel.clone());
        self.db(move |s| {
            s.set_bridge_mapping(&c, &by)?;
            s.bridge_cursor(&b, &e, &ch, 0).map(|_| ())
        })
        .await?;
        apply_mapping_changes(
            &mut Arc::make_mut(&mut self.spec).bridges,
            std::slice::from_ref(&change),
        );
        let what = format!("direct chat {external} with {author} ↔ #{channel}");
        self.journal_mapped(bridge, external, &channel, &what);
        Ok((channel, external.to_owned()))
    }

    /// `/approve ID [reason]` or `/deny ID [reason]` from a person in a chat: decided (durably,
    /// as `human:<platform>:<name>`) when they are on the bridge's `approvers`, refused and
    /// journaled otherwise. The command and the outcome are posts of the channel (the outcome
    /// a reply to the command), once per platform message.
    #[allow(clippy::too_many_arguments)]
    async fn chat_approval(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        spec: &BridgeSpec,
        channel: &str,
        author: &str,
        user_id: &str,
        text: &str,
        origin: String,
        command: ApprovalCommand,
    ) -> ToolResult {
        let (c, o) = (channel.to_owned(), origin.clone());
        let posted = self.db(move |s| s.post_with_origin_seq(&c, &o)).await?;
        if let Some(seq) = posted {
            // Handed over again after a crash: the decision was made with the first one.
            return Ok(
                json!({"channel": channel, "seq": seq, "author": author, "duplicate": true})
                    .to_string(),
            );
        }
        let verb = if command.approve { "approve" } else { "deny" };
        let outcome = if !spec.approvers.iter().any(|a| a == user_id) {
            self.refuse_once(
                spec,
                &origin,
                &format!(
                    "user {user_id} may not {verb} permission requests through `{}`",
                    spec.name
                ),
                "not on the bridge's approvers",
                channel,
                &json!({"user_id": user_id, "user_name": author}),
            );
            format!(
                "Only the people on bridge `{}`'s `approvers` list can {verb} permission \
                 requests; request #{} is unchanged. Ask one of them, or the operator \
                 (`flockctl {verb} {}`).",
                spec.name, command.id, command.id
            )
        } else {
            match self.decide_permission(author, &command).await {
                Ok(done) => format!("Done: {done}."),
                Err(why) => format!("Not done: {why}"),
            }
        };
        let (seq, duplicate) = self
            .post_keyed(myself, channel, author, text, PostKey::Origin(origin), None, false)
            .await?;
        if !duplicate {
            let key = PostKey::Origin(format!("flock/decision/{channel}/{seq}"));
            self.post_keyed(myself, channel, "flock", &outcome, key, Some(seq), false).await?;
        }
        Ok(json!({"channel": channel, "seq": seq, "author": author, "duplicate": duplicate})
            .to_string())
    }

    /// Announces permission request `id` (waiting for a person) in the `approvals` channel of
    /// every bridge that has one, once per channel (a unique origin: a repeat posts nothing).
    pub(super) async fn announce_permission(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        id: i64,
        agent: &str,
        what: &str,
        reason: &str,
        why: &str,
    ) {
        let mut places: Vec<String> =
            self.spec.bridges.iter().filter_map(|b| b.approvals.clone()).collect();
        places.sort();
        places.dedup();
        let reason = if reason.trim().is_empty() {
            "no reason given".into()
        } else {
            reason.trim().to_owned()
        };
        let text = format!(
            "[approval needed] #{id}: {agent} asks for {what} — \"{reason}\" ({why}). \
             Approvers: reply `/approve {id}` or `/deny {id} <why>`."
        );
        for channel in places {
            let key = PostKey::Origin(format!("flock/permission/{id}/{channel}"));
            if let Err((_, e)) =
                self.post_keyed(myself, &channel, "flock", &text, key, None, false).await
            {
                tracing::warn!("flock channels: permission #{id} not announced in #{channel}: {e}");
            }
        }
    }

    /// A person's decision on a permission request, through the router (the record and the
    /// messages to the requester commit together there): what was done, or why not.
    async fn decide_permission(
        &self,
        person: &str,
        command: &ApprovalCommand,
    ) -> Result<String, String> {
        let Some(router) = &self.router else { return Err("the router is not running".into()) };
        let arguments = json!({"id": command.id, "approve": command.approve,
                               "reason": command.reason})
        .to_string();
        let asked = ractor::call!(router, |reply| RouterMsg::PermissionHuman {
            person: person.to_owned(),
            tool: "permission_decide".into(),
            arguments,
            reply,
        });
        match asked {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(refused)) => Err(refused.message),
            Err(e) => Err(format!("the router did not answer ({e})")),
        }
    }

    /// `flockctl bridge map|unmap` (a person through the control socket): `{bridge, external,
    /// channel, allow}` maps chat `external` to `channel` (replacing its mapping, if any);
    /// without `channel` the chat is unmapped. Kept in the store over the swarm file's
    /// mappings; the bridge is restarted to take it up (nothing is lost: cursors are durable).
    pub(super) async fn bridge_map(&mut self, caller: &str, arguments: &str) -> ToolResult {
        let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
        let bridge = str_arg(&args, "bridge").ok_or_else(|| bad("`bridge` is required"))?;
        let names: Vec<&str> = self.spec.bridges.iter().map(|b| b.name.as_str()).collect();
        let spec = self.bridge_spec(bridge).map_err(|(code, m)| {
            (
                code,
                format!(
                    "{m}; bridges: {}",
                    if names.is_empty() { "none".into() } else { names.join(", ") }
                ),
            )
        })?;
        let external = str_arg(&args, "external")
            .map(str::trim)
            .filter(|e| !e.is_empty() && e.len() <= 200 && !e.chars().any(char::is_control))
            .ok_or_else(|| bad("`external` is required: the platform's chat or channel id"))?
            .to_owned();
        let channel = match str_arg(&args, "channel").map(|c| c.trim().trim_start_matches('#')) {
            Some(c) if super::delta::valid_channel_id(c) => Some(c.to_owned()),
            Some(c) => {
                return Err(bad(format!(
                    "`{c}` is not a channel id: 1–63 of a-z, 0-9 and -, starting with a letter or digit"
                )));
            }
            None => None,
        };
        let allow: Option<Vec<String>> = match args.get("allow") {
            None | Some(Value::Null) => None,
            Some(Value::Array(ids)) => Some(
                ids.iter()
                    .map(|v| match v {
                        Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                        Value::Number(n) => Ok(n.to_string()),
                        _ => Err(bad("`allow` holds platform user ids (text or numbers)")),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => return Err(bad("`allow` is a list of platform user ids")),
        };
        let current = spec.channels.iter().find(|m| m.external == external);
        match (&channel, current) {
            (None, None) => {
                return Err(bad(format!("chat `{external}` is not mapped by bridge `{bridge}`")));
            }
            (Some(c), Some(m)) if m.flock == *c && m.allow == allow => {
                return Ok(json!({"bridge": bridge, "external": external, "channel": c,
                                 "changed": false})
                .to_string());
            }
            _ => {}
        }
        if channel.is_none() && spec.channels.len() == 1 {
            return Err(bad(format!(
                "chat `{external}` is the only mapping of bridge `{bridge}`: a bridge needs one; map another chat first, or remove the bridge from the swarm file"
            )));
        }
        let change = MappingChange {
            bridge: bridge.to_owned(),
            external: external.clone(),
            flock: channel.clone(),
            allow,
        };
        let (c, by) = (change.clone(), caller.to_owned());
        self.db(move |s| s.set_bridge_mapping(&c, &by)).await?;
        apply_mapping_changes(
            &mut Arc::make_mut(&mut self.spec).bridges,
            std::slice::from_ref(&change),
        );
        self.ensure_bridge_channels().await?;
        self.journal(
            JournalEvent::new(
                caller.to_owned(),
                if channel.is_some() { "BRIDGE_MAPPED" } else { "BRIDGE_UNMAPPED" },
                Status::Success,
                match &channel {
                    Some(c) => format!("bridge `{bridge}`: chat {external} ↔ #{c}"),
                    None => format!("bridge `{bridge}`: chat {external} unmapped"),
                },
            )
            .param("bridge", json!(bridge))
            .param("chat", json!(external))
            .param("channel", json!(channel)),
        );
        // The bridge takes its mappings up when it connects: restart it (a clean stop; its
        // keeper starts it again).
        if let Some(router) = &self.router {
            let _ = router.cast(RouterMsg::StopBridge { bridge: bridge.to_owned() });
        }
        Ok(json!({"bridge": bridge, "external": external, "channel": channel, "changed": true})
            .to_string())
    }

    /// A channel was created in Flock: every bridge with `mirror_new_channels` that does not map
    /// it yet gets a pending mapping (`new:<channel>`) and is restarted; at start it makes the
    /// platform channel and answers `bridge__made`.
    pub(super) async fn mirror_new_channel(&mut self, channel: &str) {
        let bridges: Vec<String> = self
            .spec
            .bridges
            .iter()
            .filter(|b| b.mirror_new_channels && !b.channels.iter().any(|m| m.flock == channel))
            .map(|b| b.name.clone())
            .collect();
        for bridge in bridges {
            let change = MappingChange {
                bridge: bridge.clone(),
                external: format!("{PENDING_PREFIX}{channel}"),
                flock: Some(channel.to_owned()),
                allow: None,
            };
            let c = change.clone();
            if let Err((_, e)) = self.db(move |s| s.set_bridge_mapping(&c, "flock")).await {
                tracing::warn!("bridge `{bridge}`: cannot record #{channel} to mirror: {e}");
                continue;
            }
            apply_mapping_changes(
                &mut Arc::make_mut(&mut self.spec).bridges,
                std::slice::from_ref(&change),
            );
            if let Some(router) = &self.router {
                let _ = router.cast(RouterMsg::StopBridge { bridge });
            }
        }
    }

    /// Journals a mapping the bridge itself made (`BRIDGE_MAPPED`, by `bridge:<name>`).
    fn journal_mapped(&self, bridge: &str, external: &str, channel: &str, what: &str) {
        self.journal(
            JournalEvent::new(
                format!("bridge:{bridge}"),
                "BRIDGE_MAPPED",
                Status::Success,
                format!("bridge `{bridge}`: {what}"),
            )
            .param("bridge", json!(bridge))
            .param("chat", json!(external))
            .param("channel", json!(channel)),
        );
    }

    /// `bridge__made {channel, external}`: the bridge made platform chat `external` for the
    /// pending mapping of `channel`; the mapping is now to it, from the channel's first post.
    async fn bridge_made(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let channel = str_arg(args, "channel").ok_or_else(|| bad("`channel` is required"))?;
        let external = str_arg(args, "external")
            .filter(|e| !e.is_empty() && !e.starts_with(PENDING_PREFIX))
            .ok_or_else(|| bad("`external` is required"))?
            .to_owned();
        let pending = format!("{PENDING_PREFIX}{channel}");
        let spec = self.bridge_spec(bridge)?;
        if !spec.channels.iter().any(|m| m.external == pending) {
            return Err(bad(format!("bridge `{bridge}` has no channel to make for #{channel}")));
        }
        let change = MappingChange {
            bridge: bridge.to_owned(),
            external: external.clone(),
            flock: Some(channel.to_owned()),
            allow: None,
        };
        let (b, c, ch) = (bridge.to_owned(), change.clone(), channel.to_owned());
        self.db(move |s| {
            s.drop_bridge_mapping(&b, &pending)?;
            s.set_bridge_mapping(&c, &format!("bridge:{b}"))?;
            // Every post of the new channel goes out, also those made before the chat was.
            s.bridge_cursor(&b, &c.external, &ch, 0).map(|_| ())
        })
        .await?;
        let bridges = &mut Arc::make_mut(&mut self.spec).bridges;
        let unpend = MappingChange {
            bridge: bridge.to_owned(),
            external: format!("{PENDING_PREFIX}{channel}"),
            flock: None,
            allow: None,
        };
        apply_mapping_changes(bridges, &[unpend, change]);
        self.journal_mapped(
            bridge,
            &external,
            channel,
            &format!("made chat {external} for #{channel}"),
        );
        Ok(json!({"channel": channel, "external": external}).to_string())
    }

    /// `bridge__edit {external, message_id, text}` (a person edited their message) or
    /// `{external, message_id, deleted: true}` (it was deleted): the post it became changes,
    /// and the bridges that relayed it follow. A message that never became a post (refused, or
    /// from before the mapping) is answered `found: false`.
    async fn bridge_edit(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let (channel, external) = self.mapped(bridge, args)?;
        let message_id = flock_ipc::identity::platform_id(args, "message_id")
            .map_err(|e| (e.code, e.message))?;
        let deleted = args.get("deleted").and_then(Value::as_bool) == Some(true);
        let text = match (deleted, str_arg(args, "text")) {
            (true, _) => None,
            (false, Some(t)) => Some(t.to_owned()),
            (false, None) => return Err(bad("`text` is required (or `deleted: true`)")),
        };
        let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
        if let Some(t) = &text
            && t.len() > limit
        {
            return Err(bad(crate::text::too_long("the edited post", t.len(), limit)));
        }
        if self.channels.get(&channel).is_some_and(|c| c.state == ChannelState::Archived) {
            return Err(bad(format!("#{channel} is archived and read-only")));
        }
        let origin = format!("{bridge}/{external}/{message_id}");
        let found = self.db(move |s| s.bridge_edit(&origin, text.as_deref())).await?;
        let Some((posted_in, seq, changed)) = found else {
            return Ok(json!({"channel": channel, "found": false}).to_string());
        };
        if changed {
            self.wake_pulls(&posted_in).await;
        }
        Ok(json!({"channel": posted_in, "seq": seq, "found": true, "changed": changed,
                  "deleted": deleted})
        .to_string())
    }

    async fn bridge_pull(
        &mut self,
        bridge: &str,
        args: &Value,
    ) -> Result<Pulled, (ErrorCode, String)> {
        let (channel, external) = self.mapped(bridge, args)?;
        let (start, is_archived) = self
            .channels
            .get(&channel)
            .map_or((0, false), |c| (c.last_seq, c.state == ChannelState::Archived));
        let echo = format!("{bridge}/{external}/");
        let (b, c) = (bridge.to_owned(), channel.clone());
        let working_seqs: Vec<u64> =
            self.working.get(&channel).map(|w| w.iter().copied().collect()).unwrap_or_default();
        let (posts, cursor, upto, edits, edits_upto, mirrored, working) = self
            .db(move |s| {
                let cursor = s.bridge_cursor(&b, &external, &c, start)?;
                let (posts, upto) = s.bridge_pull(&c, cursor.seq, PULL_MAX, &echo)?;
                let (edits, edits_upto) =
                    s.bridge_edits(&b, &external, &c, cursor.edit_id, cursor.seq, PULL_MAX)?;
                let mirrored = is_archived && s.bridge_archive_mirrored(&b, &external)?;
                let working = working_seqs
                    .into_iter()
                    .map(|seq| Ok((seq, s.reply_target(&echo, &c, seq)?)))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Ok((posts, cursor, upto, edits, edits_upto, mirrored, working))
            })
            .await?;
        // Archived (nothing can be posted any more) and every post is behind the cursor.
        let archived = (is_archived && cursor.seq >= start).then_some(mirrored);
        Ok(Pulled {
            channel,
            posts,
            after: cursor.seq,
            upto,
            edits,
            edit_after: cursor.edit_id,
            edits_upto,
            archived,
            working,
        })
    }

    /// `bridge__archived {external}`: the bridge mirrored the channel's archive to the chat.
    async fn bridge_archived(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let (channel, external) = self.mapped(bridge, args)?;
        if self.channels.get(&channel).is_none_or(|c| c.state != ChannelState::Archived) {
            return Err(bad(format!("#{channel} is not archived")));
        }
        let b = bridge.to_owned();
        self.db(move |s| s.bridge_mark_archived(&b, &external)).await?;
        Ok(json!({"channel": channel, "archived": true}).to_string())
    }

    fn pull_answer(&self, p: &Pulled) -> String {
        let posts: Vec<Value> = p
            .posts
            .iter()
            .map(|p| {
                let mut post = json!({"seq": p.seq, "author": p.author, "text": p.text});
                if let Some(id) = &p.reply_to {
                    post["reply_to"] = json!(id);
                }
                post
            })
            .collect();
        let working: Vec<Value> =
            p.working.iter().map(|(seq, id)| json!({"seq": seq, "reply_to": id})).collect();
        let edits: Vec<Value> = p
            .edits
            .iter()
            .map(|e| {
                json!({"seq": e.seq, "author": e.author, "text": e.text, "deleted": e.deleted,
                       "ids": e.ids})
            })
            .collect();
        let mut v = json!({"channel": p.channel, "posts": posts, "upto": p.upto,
                           "newest": self.newest(&p.channel), "edits": edits,
                           "edit_after": p.edit_after, "edits_upto": p.edits_upto,
                           "working": working});
        if let Some(mirrored) = p.archived {
            v["archived"] = json!(true);
            v["mirrored"] = json!(mirrored);
        }
        v.to_string()
    }

    /// `bridge__sent {external, seq, external_id}`: post `seq` (and all before it) reached the
    /// chat as message(s) `external_id`; `{external, edit}`: the changes up to edit id `edit`
    /// were made in the chat (with `seq` and `external_id` when the post's copy changed ids).
    async fn bridge_sent(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let (channel, external) = self.mapped(bridge, args)?;
        let edit = args.get("edit").and_then(Value::as_u64).unwrap_or(0);
        let seq = match args.get("seq").and_then(Value::as_u64) {
            Some(seq) => seq,
            None if edit > 0 => 0,
            None => return Err(bad("`seq` is required")),
        };
        let last = self.channels.get(&channel).map_or(0, |c| c.last_seq);
        if seq > last {
            return Err(bad(format!("#{channel} has no post {seq} yet (its newest is {last})")));
        }
        let id = str_arg(args, "external_id").map(str::to_owned);
        let b = bridge.to_owned();
        let cursor =
            self.db(move |s| s.bridge_sent_upto(&b, &external, seq, edit, id.as_deref())).await?;
        Ok(json!({"channel": channel, "cursor": cursor}).to_string())
    }

    fn newest(&self, channel: &str) -> u64 {
        self.channels.get(channel).map_or(0, |c| c.last_seq)
    }

    /// A post landed in `channel`: answer the pulls parked on it.
    pub(super) async fn wake_pulls(&mut self, channel: &str) {
        let keys: Vec<(String, String)> = self
            .pulls
            .iter()
            .filter(|(_, p)| p.channel == channel)
            .map(|(k, _)| k.clone())
            .collect();
        for (bridge, external) in keys {
            let Some(parked) = self.pulls.remove(&(bridge.clone(), external.clone())) else {
                continue;
            };
            let args = json!({"external": external});
            let result = self.bridge_pull(&bridge, &args).await.map(|p| self.pull_answer(&p));
            parked.reply.send(result);
        }
    }

    /// The wait of a parked pull ran out: it answers with what there is (nothing new, most
    /// likely; the posts being worked on).
    pub(super) async fn pull_expired(
        &mut self,
        bridge: String,
        external: String,
        frame_id: flock_ipc::MsgId,
    ) {
        let key = (bridge, external);
        if self.pulls.get(&key).is_some_and(|p| p.reply.frame_id == frame_id)
            && let Some(parked) = self.pulls.remove(&key)
        {
            let args = json!({"external": key.1});
            let result = self.bridge_pull(&key.0, &args).await.map(|p| self.pull_answer(&p));
            parked.reply.send(result);
        }
    }
}

/// What a pull found. Its answer: the posts, the highest seq they cover (`upto`: the cursor
/// may move there once they are delivered), the channel's newest seq (what is still waiting),
/// the edits to make to posts already delivered and the highest edit id they cover
/// (`edits_upto`), and, once the channel is archived and the cursor at its end, `archived` and
/// `mirrored`.
struct Pulled {
    channel: String,
    posts: Vec<BridgePost>,
    after: u64,
    upto: u64,
    edits: Vec<BridgeEdit>,
    edit_after: u64,
    edits_upto: u64,
    /// `Some(mirrored)`: archived, and nothing is left to send.
    archived: Option<bool>,
    /// People's posts a chain is working on: (seq, the platform message it is in this chat).
    working: Vec<(u64, Option<String>)>,
}

impl Pulled {
    /// Nothing new: no post and no edit was looked at.
    fn is_empty(&self) -> bool {
        self.upto == self.after && self.edits_upto == self.edit_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_commands_are_read_with_or_without_the_bots_name() {
        let cmd = |approve: bool, id: i64, reason: &str| {
            Some(ApprovalCommand { approve, id, reason: reason.into() })
        };
        assert_eq!(ApprovalCommand::parse("/approve 12"), cmd(true, 12, ""));
        assert_eq!(
            ApprovalCommand::parse("  /deny #3 not now, thanks "),
            cmd(false, 3, "not now, thanks")
        );
        assert_eq!(ApprovalCommand::parse("/Approve@flock_bot 7 ok"), cmd(true, 7, "ok"));
        for not in ["/approve", "/approve x", "approve 1", "please /approve 1", "/approved 1"] {
            assert_eq!(ApprovalCommand::parse(not), None, "{not}");
        }
    }
}
