//! `bridges:`: chat bridges (Telegram, Discord, Slack), their tokens' variables, API URLs, channel
//! mappings, DMs and who may write.

use super::*;

impl Loader<'_> {
    /// `bridges: [{name, platform, token_env, api_url, max_posts_per_minute, channels}, …]`: chat
    /// bridges. `agents` are the agents' names as written, which no bridge may take.
    pub(super) fn bridges(&mut self, node: &Node, agents: &[(String, Pos)]) -> Vec<BridgeSpec> {
        let mut bridges = Vec::new();
        if node.is_null() {
            return bridges;
        }
        let r = &mut self.report;
        let Some(items) = r.list(node, "bridges") else { return bridges };
        let mut names: HashMap<String, Pos> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(bridge) = bridge(r, item, i, agents, &mut names) {
                bridges.push(bridge);
            }
        }
        bridges
    }
}

/// One entry of `bridges:`; `None` if it has a problem (reported). `names` are the bridge names
/// seen so far, with their positions.
pub(super) fn bridge(
    r: &mut Report<'_>,
    item: &Node,
    index: usize,
    agents: &[(String, Pos)],
    names: &mut HashMap<String, Pos>,
) -> Option<BridgeSpec> {
    let what = format!("bridges[{index}]");
    let fields = r.mapping(item, &what)?;
    let before = r.count();
    r.unknown_keys(fields, BRIDGE_KEYS, &format!("`{what}`"));
    let field = |key: &str| lookup(fields, key).map(|(_, v)| (v, format!("{what}.{key}")));
    let missing = |r: &mut Report<'_>, key: &str, fix: &str| {
        r.error(item.pos, format!("`{what}` has no `{key}`; add {fix}"));
    };

    let name = match field("name") {
        Some((v, path)) => bridge_name(r, v, &path, agents, names),
        None => {
            missing(r, "name", "`name: team-telegram` (lowercase letters, digits, `-`)");
            None
        }
    };
    let platform = match field("platform") {
        Some((v, path)) => platform(r, v, &path),
        None => {
            missing(r, "platform", "`platform: telegram`");
            None
        }
    };
    let token_env = match field("token_env") {
        Some((v, path)) => token_env(r, v, &path),
        None => {
            missing(
                r,
                "token_env",
                "`token_env: TELEGRAM_BOT_TOKEN`: the environment variable that holds the bot token",
            );
            None
        }
    };
    // Slack's Socket Mode needs an app-level token (`xapp-…`) beside the bot token.
    let app_token_env = match (field("app_token_env"), platform) {
        (Some((v, path)), Some(Platform::Slack)) => self::token_env(r, v, &path),
        (Some((v, path)), Some(_)) => {
            r.error(
                v.pos,
                format!(
                    "`{path}` is for Slack bridges only (Socket Mode's app-level token); remove it"
                ),
            );
            None
        }
        (None, Some(Platform::Slack)) => {
            missing(
                r,
                "app_token_env",
                "`app_token_env: SLACK_APP_TOKEN`: the variable holding the app-level token (`xapp-…`, scope connections:write) Socket Mode needs",
            );
            None
        }
        // No (valid) platform: that error is reported already.
        (Some(_), None) | (None, _) => None,
    };
    let api_url =
        field("api_url").filter(|(v, _)| !v.is_null()).and_then(|(v, path)| api_url(r, v, &path));
    let max_posts_per_minute = field("max_posts_per_minute")
        .and_then(|(v, path)| r.uint(v, &path, 1, 600))
        .unwrap_or(DEFAULT_POSTS_PER_MINUTE);
    // Slack and Discord bots can make channels; a Telegram bot cannot make a group.
    let mirror_new_channels = match (field("mirror_new_channels"), platform) {
        (Some((v, path)), Some(Platform::Telegram)) => {
            r.error(
                v.pos,
                format!(
                    "`{path}`: a Telegram bot cannot create groups; remove it (map chats with `channels:` or `flockctl bridge map`)"
                ),
            );
            false
        }
        (Some((v, path)), _) => r.boolean(v, &path).unwrap_or(false),
        (None, _) => false,
    };
    let channels = match lookup(fields, "channels") {
        Some((key, v)) => bridge_channels(r, key, v, &format!("{what}.channels"), agents),
        None => {
            missing(
                r,
                "channels",
                &format!("the Flock channels it connects to chats, {BRIDGE_CHANNELS_EXAMPLE}"),
            );
            Vec::new()
        }
    };
    // Direct messages with the bot: on by default (answered by the coordinator or orchestrator,
    // filled in once the agents are known), `dm: false` turns them off.
    let dm = match field("dm") {
        None => Some(DmSpec { agent: String::new(), allow: None }),
        Some((v, path)) => bridge_dm(r, v, &path, agents),
    };
    let approvals = field("approvals").and_then(|(v, path)| {
        let id = flock_channel(r, v, &path)?;
        if !channels.is_empty() && !channels.iter().any(|m| m.flock == id) {
            let mapped: Vec<&str> = channels.iter().map(|m| m.flock.as_str()).collect();
            r.error(
                v.pos,
                format!(
                    "`{path}`: `{id}` is not one of this bridge's channels ({}); announce \
                     approvals in a channel the bridge maps",
                    mapped.join(", ")
                ),
            );
            return None;
        }
        Some(id)
    });
    let approvers = match field("approvers") {
        Some((v, path)) => user_ids(
            r,
            v,
            &path,
            "nobody could approve",
            "leave `approvers` out if nobody approves through this bridge",
        )
        .unwrap_or_default(),
        None => Vec::new(),
    };
    if let (Some((v, path)), true) = (field("approvals"), approvers.is_empty()) {
        r.error(
            v.pos,
            format!(
                "`{path}` announces permission requests, but no `approvers` may decide them; add \
                 `approvers: [\"<platform user id>\"]` to the bridge"
            ),
        );
    }
    if r.count() != before {
        return None;
    }
    Some(BridgeSpec {
        name: name?,
        platform: platform?,
        token_env: token_env?,
        app_token_env,
        api_url,
        channels,
        max_posts_per_minute,
        mirror_new_channels,
        dm,
        approvals,
        approvers,
    })
}

/// `bridges[i].dm`: `false`, an agent's name, or `{agent, allow}`.
pub(super) fn bridge_dm(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    agents: &[(String, Pos)],
) -> Option<DmSpec> {
    match node.scalar() {
        Some(Scalar::Bool(false)) => return None,
        Some(Scalar::Str(name)) => {
            return agent_ref(r, node, name, what, agents)
                .map(|agent| DmSpec { agent, allow: None });
        }
        _ => {}
    }
    let Some(fields) = node.entries() else {
        r.error(
            node.pos,
            format!(
                "`{what}` must be `false`, the agent that answers (e.g. `dm: coordinator`), or \
                 `{{agent: coordinator, allow: [\"<user id>\"]}}`; found {}",
                node.describe()
            ),
        );
        return None;
    };
    r.unknown_keys(fields, BRIDGE_DM_KEYS, &format!("`{what}`"));
    let agent = match lookup(fields, "agent") {
        Some((_, v)) => match v.text() {
            Some(name) => agent_ref(r, v, name, &format!("{what}.agent"), agents)?,
            None => {
                r.error(v.pos, format!("`{what}.agent` must be an agent's name"));
                return None;
            }
        },
        None => String::new(),
    };
    let allow = match lookup(fields, "allow") {
        Some((_, v)) => Some(user_ids(
            r,
            v,
            &format!("{what}.allow"),
            "nobody could write to the bot",
            "leave `allow` out to let everyone who reaches the bot write to it, or write `dm: false`",
        )?),
        None => None,
    };
    Some(DmSpec { agent, allow })
}

/// An agent named in a bridge (`responder`, `dm`): one of the file's agents.
pub(super) fn agent_ref(
    r: &mut Report<'_>,
    node: &Node,
    name: &str,
    what: &str,
    agents: &[(String, Pos)],
) -> Option<String> {
    if agents.iter().any(|(a, _)| a == name) {
        return Some(name.to_owned());
    }
    let names: Vec<&str> = agents.iter().map(|(a, _)| a.as_str()).collect();
    let hint = crate::error::did_you_mean(name, names.iter().copied());
    r.error(
        node.pos,
        format!("`{what}`: no agent named `{name}` (agents: {}){hint}", names.join(", ")),
    );
    None
}

/// `bridges[i].name`: valid, not a bridge's already, not an agent's.
pub(super) fn bridge_name(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    agents: &[(String, Pos)],
    names: &mut HashMap<String, Pos>,
) -> Option<String> {
    let name = r.string(node, what)?;
    if !valid_bridge_name(&name) {
        r.error(
            node.pos,
            format!(
                "`{what}`: invalid bridge name `{name}`; use 1 to {MAX_BRIDGE_NAME} lowercase \
                 letters, digits and `-`, starting with a letter or digit (e.g. `team-telegram`)"
            ),
        );
        return None;
    }
    if let Some(first) = names.get(&name) {
        r.error(
            node.pos,
            format!(
                "duplicate bridge name `{name}` (first at line {}); bridge names must be unique: \
                 rename one of them",
                first.line
            ),
        );
        return None;
    }
    names.insert(name.clone(), node.pos);
    if let Some((_, at)) = agents.iter().find(|(agent, _)| *agent == name) {
        r.error(
            node.pos,
            format!(
                "`{what}`: bridge `{name}` has the same name as agent `{name}` (line {}); a \
                 bridge and an agent may not share a name (both appear as senders in channels): \
                 rename the bridge",
                at.line
            ),
        );
        return None;
    }
    Some(name)
}

/// `[a-z0-9][a-z0-9-]{0,30}`.
pub(super) fn valid_bridge_name(name: &str) -> bool {
    name.len() <= MAX_BRIDGE_NAME && valid_agent_name(name)
}

/// A Flock channel id: `[a-z0-9][a-z0-9-]{0,62}`, the syntax of agent names (and of the
/// channels actor's own check).
pub(super) fn valid_channel_id(id: &str) -> bool {
    valid_agent_name(id)
}

/// A valid channel id close to `id`, for the "e.g." part of the message.
pub(super) fn suggest_channel_id(id: &str) -> String {
    let fixed: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(63)
        .collect();
    if valid_channel_id(&fixed) { fixed } else { "general".to_owned() }
}

/// `bridges[i].platform`: a known platform this version has a bridge for.
pub(super) fn platform(r: &mut Report<'_>, node: &Node, what: &str) -> Option<Platform> {
    let text = r.string(node, what)?;
    let names = || PLATFORMS.iter().map(|p| p.as_str());
    let Some(platform) = PLATFORMS.iter().copied().find(|p| p.as_str() == text) else {
        let hint = match closest(&text, names()) {
            Some(best) => format!(" (did you mean `{best}`?)"),
            None => String::new(),
        };
        r.error(
            node.pos,
            format!(
                "`{what}`: unknown platform `{text}`; known: {}{hint}",
                names().collect::<Vec<_>>().join(", ")
            ),
        );
        return None;
    };
    if !BUILT_PLATFORMS.contains(&platform) {
        let built: Vec<&str> = BUILT_PLATFORMS.iter().map(|p| p.as_str()).collect();
        r.error(
            node.pos,
            format!(
                "`{what}`: `{text}` bridges are not built yet; this version has: {}",
                built.join(", ")
            ),
        );
        return None;
    }
    Some(platform)
}

/// `bridges[i].token_env`: the NAME of the variable that holds the bot token. The value is never
/// repeated in a message: it may be the token itself, pasted in the wrong place.
pub(super) fn token_env(r: &mut Report<'_>, node: &Node, what: &str) -> Option<String> {
    let name = r.string(node, what)?;
    if name.len() > MAX_TOKEN_ENV || name.contains(':') || name.chars().any(char::is_lowercase) {
        r.error(
            node.pos,
            format!(
                "`{what}` must name an environment variable (A-Z, 0-9, _), not hold the token \
                 itself; put the token in an environment variable where you run `up` (e.g. \
                 `export TELEGRAM_BOT_TOKEN=…`) and write that variable's name here"
            ),
        );
        return None;
    }
    if !valid_env_name(&name) {
        r.error(
            node.pos,
            format!(
                "`{what}` must name an environment variable: 1 to {MAX_TOKEN_ENV} of A-Z, 0-9 \
                 and `_`, not starting with a digit (e.g. `TELEGRAM_BOT_TOKEN`)"
            ),
        );
        return None;
    }
    Some(name)
}

/// `bridges[i].api_url`: an http(s) base URL, its trailing `/` trimmed.
pub(super) fn api_url(r: &mut Report<'_>, node: &Node, what: &str) -> Option<String> {
    let url = r.string_of_at_most(node, what, MAX_API_URL_BYTES)?;
    if url.chars().any(char::is_whitespace) {
        r.error(node.pos, format!("`{what}` contains whitespace; write the URL without any"));
        return None;
    }
    // A Telegram API URL carries the token in its path (`/bot<id>:<secret>/`); the base URL must
    // not, and the value is not repeated here.
    let holds_token = url.match_indices("/bot").any(|(i, _)| {
        let after = &url[i + 4..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && after[digits..].starts_with(':')
    });
    if holds_token {
        r.error(
            node.pos,
            format!(
                "`{what}` holds a bot token (`/bot<id>:…`); give only the API's base URL (e.g. \
                 `https://api.telegram.org`) and put the token in the variable `token_env` names"
            ),
        );
        return None;
    }
    let Some(rest) = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) else {
        r.error(
            node.pos,
            format!(
                "`{what}` must start with http:// or https://, got `{url}`; e.g. \
                 `http://127.0.0.1:8081`"
            ),
        );
        return None;
    };
    if rest.split('/').next().is_none_or(str::is_empty) {
        r.error(
            node.pos,
            format!("`{what}` has no host after the scheme; e.g. `http://127.0.0.1:8081`"),
        );
        return None;
    }
    Some(url.trim_end_matches('/').to_owned())
}

/// `bridges[i].channels`: at least one mapping; each platform chat at most once.
pub(super) fn bridge_channels(
    r: &mut Report<'_>,
    key: &Node,
    node: &Node,
    what: &str,
    agents: &[(String, Pos)],
) -> Vec<BridgeMapping> {
    let mut mappings = Vec::new();
    let empty = format!(
        "`{what}` is empty; map at least one Flock channel to a chat, {BRIDGE_CHANNELS_EXAMPLE}"
    );
    if node.is_null() {
        r.error(key.pos, empty);
        return mappings;
    }
    let Some(items) = r.list(node, what) else { return mappings };
    if items.is_empty() {
        r.error(node.pos, empty);
        return mappings;
    }
    // Each platform chat mapped so far: its Flock channel and where the mapping is.
    let mut chats: HashMap<String, (String, Pos)> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let what = format!("{what}[{i}]");
        let Some(fields) = r.mapping(item, &what) else { continue };
        r.unknown_keys(fields, BRIDGE_CHANNEL_KEYS, &format!("`{what}`"));
        let flock = match lookup(fields, "flock") {
            Some((_, v)) => flock_channel(r, v, &format!("{what}.flock")),
            None => {
                r.error(
                    item.pos,
                    format!("`{what}` has no `flock`; add `flock: general`, the Flock channel"),
                );
                None
            }
        };
        let external = match lookup(fields, "external") {
            Some((_, v)) => platform_id(r, v, &format!("{what}.external"), "the chat's id")
                .map(|id| (id, v.pos)),
            None => {
                r.error(
                    item.pos,
                    format!(
                        "`{what}` has no `external`; add the platform chat's id, e.g. \
                         `external: \"-1001234567890\"`"
                    ),
                );
                None
            }
        };
        let allow =
            lookup(fields, "allow").and_then(|(_, v)| allow(r, v, &format!("{what}.allow")));
        let responder = lookup(fields, "responder").and_then(|(_, v)| {
            let path = format!("{what}.responder");
            match v.text() {
                Some(name) => agent_ref(r, v, name, &path, agents),
                None => {
                    r.error(v.pos, format!("`{path}` must be the name of the agent that answers"));
                    None
                }
            }
        });
        let replies = match lookup(fields, "replies") {
            None => Replies::Thread,
            Some((_, v)) => match v.text() {
                Some("thread") => Replies::Thread,
                Some("channel") => Replies::Channel,
                _ => {
                    r.error(
                        v.pos,
                        format!(
                            "`{what}.replies` must be `thread` (answers attached to the person's \
                             message: a reply, or a Slack thread) or `channel` (a plain message \
                             in the chat); found {}",
                            v.describe()
                        ),
                    );
                    Replies::Thread
                }
            },
        };
        let (Some(flock), Some((external, at))) = (flock, external) else { continue };
        match chats.get(&external) {
            Some((first_flock, first)) if *first_flock == flock => r.error(
                item.pos,
                format!(
                    "`{what}` maps `{flock}` to chat `{external}` again (first at line {}); \
                     remove one of them",
                    first.line
                ),
            ),
            Some((first_flock, first)) => r.error(
                at,
                format!(
                    "`{what}.external`: chat `{external}` is already mapped to `{first_flock}` \
                     (line {}); an inbound message from it would not know its channel: map each \
                     chat to one Flock channel",
                    first.line
                ),
            ),
            None => {
                chats.insert(external.clone(), (flock.clone(), item.pos));
                mappings.push(BridgeMapping { flock, external, allow, responder, replies });
            }
        }
    }
    mappings
}

/// `…channels[j].flock`: a Flock channel id.
pub(super) fn flock_channel(r: &mut Report<'_>, node: &Node, what: &str) -> Option<String> {
    if node.is_null() {
        r.error(
            node.pos,
            format!(
                "`{what}` has no value; write the Flock channel id after the colon (`#` starts a \
                 YAML comment: write `general`, not `#general`)"
            ),
        );
        return None;
    }
    let id = r.string(node, what)?;
    if !valid_channel_id(&id) {
        r.error(
            node.pos,
            format!(
                "`{what}`: `{id}` is not a Flock channel id; use 1 to 63 lowercase letters, \
                 digits and `-`, starting with a letter or digit (e.g. `{}`)",
                suggest_channel_id(&id)
            ),
        );
        return None;
    }
    Some(id)
}

/// `…channels[j].allow`: the platform user ids who may post; `None` if it has a problem
/// (reported).
pub(super) fn allow(r: &mut Report<'_>, node: &Node, what: &str) -> Option<Vec<String>> {
    user_ids(r, node, what, "nobody could post", "leave `allow` out to let everyone post")
}

/// A non-empty list of platform user ids; `empty` says what an empty one would mean, `fix` how
/// to do without the key.
pub(super) fn user_ids(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    empty: &str,
    fix: &str,
) -> Option<Vec<String>> {
    if node.is_null() {
        r.error(node.pos, format!("`{what}` has no value; list the platform user ids, or {fix}"));
        return None;
    }
    let items = r.list(node, what)?;
    if items.is_empty() {
        r.error(node.pos, format!("`{what}` is empty: {empty}; {fix}"));
        return None;
    }
    let mut ids = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match platform_id(r, item, &format!("{what}[{i}]"), "a user id") {
            Some(id) => ids.push(id),
            None => ok = false,
        }
    }
    ok.then_some(ids)
}

/// A platform's chat or user id: text, or a YAML integer kept as its decimal text; 1 to
/// [`MAX_PLATFORM_ID`] characters.
pub(super) fn platform_id(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    kind: &str,
) -> Option<String> {
    let id = match node.scalar() {
        Some(Scalar::Str(text)) => text.to_owned(),
        Some(Scalar::Int(n)) => n.to_string(),
        Some(Scalar::Null) => {
            r.error(node.pos, format!("`{what}` has no value; write {kind} after the colon"));
            return None;
        }
        _ => {
            r.error(
                node.pos,
                format!(
                    "`{what}` must be {kind} as text or a whole number, found {}; put it in quotes",
                    node.describe()
                ),
            );
            return None;
        }
    };
    if id.trim().is_empty() {
        r.error(node.pos, format!("`{what}` is empty; write {kind}"));
        return None;
    }
    let chars = id.chars().count();
    if chars > MAX_PLATFORM_ID {
        r.error(
            node.pos,
            format!("`{what}` is {chars} characters long; {kind} has at most {MAX_PLATFORM_ID}"),
        );
        return None;
    }
    Some(id)
}
