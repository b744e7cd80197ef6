//! Slack through slack-morphism 2.31: Socket Mode (an app-level `xapp-` token, no public URL)
//! brings people's messages in; `chat.postMessage` with a `username` per author (scope
//! `chat:write.customize`) sends posts out, or `*[author]*` in front where Slack does not apply
//! the name. Markdown is turned into Slack's mrkdwn (`**b**` → `*b*`, links → `<url|text>`,
//! lists), and `<`, `>`, `&` are escaped, so an agent cannot write `<!channel>` or `<!here>`.
//! People's edits and deletions (`message_changed`, `message_deleted`) are followed; the bot's
//! own copies are changed with `chat.update` / `chat.delete`.
//!
//! An envelope is acknowledged by slack-morphism when the push callback returns: the callback
//! waits until the message is posted in Flock (durable), so a bridge killed before that gets the
//! envelope again from Slack, and the post's unique origin keeps it from being posted twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slack_morphism::errors::SlackClientError;
use slack_morphism::prelude::*;
use tokio::sync::{mpsc, oneshot};

use crate::{Change, Inbound, PlatformError};

/// Longest text per message (Slack accepts 40 000 but shows long messages truncated).
pub const LIMIT: usize = 3_900;
/// Room kept for the `*[author]*` prefix.
const PREFIX_ROOM: usize = 100;

pub type Client = SlackClient<SlackClientHyperHttpsConnector>;

/// A person's message, and where to say it is durable (the envelope is acked after).
pub type Incoming = (Inbound, oneshot::Sender<()>);

/// How many threaded messages a Slack bridge remembers the thread of.
const THREADS_KEPT: usize = 4096;

pub struct Slack {
    pub client: Arc<Client>,
    bot: SlackApiToken,
    bot_user: String,
    /// The bot user's name and its team's (`name` of `team`), from `auth.test`.
    bot_name: String,
    /// User id → display name.
    names: Mutex<HashMap<String, String>>,
    /// A person's message in a thread → the thread's parent (Slack wants the parent's `ts` as
    /// `thread_ts`): an answer to a follow-up in a thread goes to that thread. The newest
    /// [`THREADS_KEPT`]; after a restart a follow-up's answer names the follow-up itself.
    threads: Mutex<(HashMap<String, String>, std::collections::VecDeque<String>)>,
    /// Set once Slack posted under the bot's name although a username was asked for (the app
    /// lacks `chat:write.customize`): from then on the name goes in front of the text.
    prefix: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Slack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slack").field("bot_user", &self.bot_user).finish_non_exhaustive()
    }
}

/// The HTTP client: rustls with the webpki roots (no dependency on the machine's CA files);
/// plain `http://` only for an `api_url` that says so (a local proxy or a test double).
pub fn client(api_url: Option<&str>) -> Result<Arc<Client>, PlatformError> {
    crate::install_crypto_provider();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build();
    let mut connector = SlackClientHyperConnector::with_connector(https);
    if let Some(url) = api_url {
        connector = connector.with_slack_api_url(url.trim_end_matches('/'));
    }
    Ok(Arc::new(SlackClient::new(connector)))
}

impl Slack {
    /// Checks the bot token (`auth.test`).
    pub async fn connect(client: Arc<Client>, bot_token: &str) -> Result<Slack, PlatformError> {
        let bot = SlackApiToken::new(SlackApiTokenValue::new(bot_token.to_owned()));
        let me = client
            .open_session(&bot)
            .auth_test()
            .await
            .map_err(|e| classify(&e, "checking the bot token (auth.test)"))?;
        Ok(Slack {
            client,
            bot,
            bot_user: me.user_id.to_string(),
            bot_name: match (&me.user, &me.team) {
                (Some(user), team) => format!("{user} of {team}"),
                (None, team) => format!("{} of {team}", me.user_id),
            },
            names: Mutex::default(),
            threads: Mutex::default(),
            prefix: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn bot_user(&self) -> &str {
        &self.bot_user
    }

    pub fn bot_name(&self) -> &str {
        &self.bot_name
    }

    /// Pieces of a post in mrkdwn, each leaving room for the prefix.
    pub fn messages(text: &str) -> Vec<String> {
        crate::render::split(&mrkdwn(text), LIMIT - PREFIX_ROOM, |_| 1)
    }

    /// Sends one piece by `author`; returns the message's `ts` and the text as people see it.
    pub async fn send(
        &self,
        channel: &str,
        author: &str,
        piece: &str,
        thread: Option<&str>,
    ) -> Result<(String, String), PlatformError> {
        use std::sync::atomic::Ordering;
        let label = crate::render::author_label(author);
        let prefixed = self.prefix.load(Ordering::Relaxed);
        let text =
            if prefixed { format!("*[{}]* {piece}", escape(&label)) } else { piece.to_owned() };
        let mut req = SlackApiChatPostMessageRequest::new(
            SlackChannelId::new(channel.to_owned()),
            SlackMessageContent::new().with_text(text.clone()),
        )
        .with_unfurl_links(false)
        .with_unfurl_media(false);
        if !prefixed {
            req = req.with_username(label.clone());
        }
        if let Some(ts) = thread {
            let parent = self.thread_of(ts);
            req = req.with_thread_ts(SlackTs::new(parent));
        }
        let sent = self
            .client
            .open_session(&self.bot)
            .chat_post_message(&req)
            .await
            .map_err(|e| classify(&e, "chat.postMessage"))?;
        // Without `chat:write.customize` Slack ignores the name and posts as the bot: say who
        // wrote it in the text from now on.
        if !prefixed && sent.message.sender.username.as_deref() != Some(label.as_str()) {
            tracing::warn!(
                "flock-bridge: Slack did not apply the author's name (add the scope chat:write.customize to the app to post under each agent's name); writing *[name]* in front instead"
            );
            self.prefix.store(true, Ordering::Relaxed);
        }
        // As people see it, with the name (what the echo record compares with).
        let shown = if prefixed { text } else { format!("[{label}] {text}") };
        Ok((sent.ts.to_string(), shown))
    }

    /// Replaces the text of the bot's message `ts` with a piece by `author`; returns the text as
    /// people see it. (Slack keeps the name the message was posted under.)
    pub async fn edit(
        &self,
        channel: &str,
        ts: &str,
        author: &str,
        piece: &str,
    ) -> Result<String, PlatformError> {
        use std::sync::atomic::Ordering;
        let label = crate::render::author_label(author);
        let prefixed = self.prefix.load(Ordering::Relaxed);
        let text =
            if prefixed { format!("*[{}]* {piece}", escape(&label)) } else { piece.to_owned() };
        let req = SlackApiChatUpdateRequest::new(
            SlackChannelId::new(channel.to_owned()),
            SlackMessageContent::new().with_text(text.clone()),
            SlackTs::new(ts.to_owned()),
        );
        self.client
            .open_session(&self.bot)
            .chat_update(&req)
            .await
            .map_err(|e| classify(&e, "chat.update"))?;
        Ok(if prefixed { text } else { format!("[{label}] {text}") })
    }

    /// Makes a public channel named `name` (scope `channels:manage`); returns its id. The bot
    /// made it, so it is in it.
    pub async fn create_channel(&self, name: &str) -> Result<String, PlatformError> {
        let req = SlackApiConversationsCreateRequest::new(name.to_owned());
        match self.client.open_session(&self.bot).conversations_create(&req).await {
            Ok(made) => Ok(made.channel.id.to_string()),
            Err(e) => {
                let taken = format!(
                    "a Slack channel named {name} exists already; map it with `flockctl bridge map`"
                );
                Err(with_hint(
                    classify(&e, "conversations.create"),
                    &[
                        ("name_taken", &taken),
                        (
                            "missing_scope",
                            "add the scope channels:manage to the app (flockctl bridge manifest slack) and reinstall it",
                        ),
                    ],
                ))
            }
        }
    }

    /// Deletes the bot's message `ts`; one already gone counts as done.
    pub async fn delete(&self, channel: &str, ts: &str) -> Result<(), PlatformError> {
        let req = SlackApiChatDeleteRequest::new(
            SlackChannelId::new(channel.to_owned()),
            SlackTs::new(ts.to_owned()),
        );
        match self.client.open_session(&self.bot).chat_delete(&req).await {
            Ok(_) => Ok(()),
            Err(SlackClientError::ApiError(api)) if api.code == "message_not_found" => Ok(()),
            Err(e) => Err(classify(&e, "chat.delete")),
        }
    }

    /// Archives conversation `channel` (`conversations.archive`, scope `channels:manage` for a
    /// public channel, `groups:write` for a private one); one already archived counts as done.
    pub async fn archive(&self, channel: &str) -> Result<(), PlatformError> {
        let req = SlackApiConversationsArchiveRequest::new(SlackChannelId::new(channel.to_owned()));
        match self.client.open_session(&self.bot).conversations_archive(&req).await {
            Ok(_) => Ok(()),
            Err(SlackClientError::ApiError(api)) if api.code == "already_archived" => Ok(()),
            Err(e) => Err(with_hint(
                classify(&e, "conversations.archive"),
                &[
                    (
                        "missing_scope",
                        "add the scopes channels:manage (public channels) and groups:write (private ones) to the app (flockctl bridge manifest slack) and reinstall it",
                    ),
                    (
                        "not_in_channel",
                        "invite the bot to the channel (/invite) so it can archive it",
                    ),
                ],
            )),
        }
    }

    /// A person's display name (cached): profile display name, real name, then handle.
    async fn name_of(&self, user: &str) -> String {
        if let Some(n) = self.names.lock().unwrap_or_else(|p| p.into_inner()).get(user) {
            return n.clone();
        }
        let req = SlackApiUsersInfoRequest::new(SlackUserId::new(user.to_owned()));
        let name = match self.client.open_session(&self.bot).users_info(&req).await {
            Ok(info) => {
                let u = info.user;
                let profile = u.profile.as_ref();
                [
                    profile.and_then(|p| p.display_name.clone()),
                    profile.and_then(|p| p.real_name.clone()),
                    u.real_name.clone(),
                    u.name.clone(),
                ]
                .into_iter()
                .flatten()
                .find(|n| !n.trim().is_empty())
                .unwrap_or_else(|| user.to_owned())
            }
            Err(_) => user.to_owned(),
        };
        self.names.lock().unwrap_or_else(|p| p.into_inner()).insert(user.to_owned(), name.clone());
        name
    }

    /// The thread message `ts` belongs to (its parent's `ts`), or `ts` itself.
    fn thread_of(&self, ts: &str) -> String {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        threads.0.get(ts).cloned().unwrap_or_else(|| ts.to_owned())
    }

    /// Remembers that message `ts` is a reply in thread `parent`.
    fn note_thread(&self, ts: &str, parent: &str) {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        if threads.0.insert(ts.to_owned(), parent.to_owned()).is_none() {
            threads.1.push_back(ts.to_owned());
        }
        while threads.1.len() > THREADS_KEPT {
            if let Some(old) = threads.1.pop_front() {
                threads.0.remove(&old);
            }
        }
    }

    /// Marks message `ts` with the reaction `name` (`on`), or takes it off; a reaction already
    /// there (or already gone) counts as done.
    pub async fn react(
        &self,
        channel: &str,
        ts: &str,
        name: &str,
        on: bool,
    ) -> Result<(), PlatformError> {
        let session = self.client.open_session(&self.bot);
        let (channel, ts) = (SlackChannelId::new(channel.to_owned()), SlackTs::new(ts.to_owned()));
        let done = if on {
            let req = SlackApiReactionsAddRequest::new(channel, name.into(), ts);
            session.reactions_add(&req).await.map(|_| ())
        } else {
            let req = SlackApiReactionsRemoveRequest::new(name.into())
                .with_channel(channel)
                .with_timestamp(ts);
            session.reactions_remove(&req).await.map(|_| ())
        };
        match done {
            Ok(()) => Ok(()),
            Err(e) => match classify(&e, if on { "reactions.add" } else { "reactions.remove" }) {
                PlatformError::Permanent(m)
                    if m.contains("already_reacted") || m.contains("no_reaction") =>
                {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }

    /// A person's new message, edit or deletion, or `None` for bots (this one among them), joins
    /// and the like.
    pub async fn inbound(&self, event: &SlackMessageEvent) -> Option<Inbound> {
        // An edit or deletion names the message it changes (and its author) inside the event.
        let (sender, content, ts, change) = match &event.subtype {
            None => (&event.sender, event.content.as_ref(), event.origin.ts.clone(), Change::New),
            Some(SlackMessageEventType::MessageChanged) => {
                let m = event.message.as_ref()?;
                (&m.sender, m.content.as_ref(), m.ts.clone(), Change::Edited)
            }
            Some(SlackMessageEventType::MessageDeleted) => {
                let m = event.previous_message.as_ref()?;
                (&m.sender, None, event.deleted_ts.clone()?, Change::Deleted)
            }
            Some(_) => return None,
        };
        if sender.bot_id.is_some() {
            return None;
        }
        let user = sender.user.as_ref()?.to_string();
        if user == self.bot_user {
            return None;
        }
        let text = match change {
            Change::Deleted => String::new(),
            _ => markdown_of(&content?.text.clone()?),
        };
        if let Some(parent) = event.origin.thread_ts.as_ref().filter(|t| **t != ts) {
            self.note_thread(ts.as_ref(), parent.as_ref());
        }
        Some(Inbound {
            external: event.origin.channel.as_ref()?.to_string(),
            message_id: ts.to_string(),
            user_name: self.name_of(&user).await,
            user_id: user,
            text,
            change,
            direct: event.origin.channel_type.as_ref().is_some_and(|t| t.0 == "im"),
        })
    }
}

/// What the push callback needs: the relay's queue and the Slack side.
pub struct CallbackState {
    pub tx: mpsc::UnboundedSender<Incoming>,
    pub slack: Arc<Slack>,
}

/// slack-morphism's push-event callback: hands a person's message to the relay and returns
/// (so the envelope is acked) only once it is posted in Flock.
pub async fn on_push(
    event: SlackPushEventCallback,
    _client: Arc<Client>,
    states: SlackClientEventsUserState,
) -> UserCallbackResult<()> {
    let SlackEventCallbackBody::Message(message) = event.event else { return Ok(()) };
    let state = states.read().await;
    let Some(cb) = state.get_user_state::<CallbackState>() else { return Ok(()) };
    let Some(inbound) = cb.slack.inbound(&message).await else { return Ok(()) };
    let (done, posted) = oneshot::channel();
    if cb.tx.send((inbound, done)).is_err() {
        return Err("the bridge is stopping".into());
    }
    drop(state);
    match posted.await {
        Ok(()) => Ok(()),
        // Not posted (the router is gone): no ack, Slack sends the envelope again.
        Err(_) => Err("the message could not be posted in Flock".into()),
    }
}

/// Starts Socket Mode with the app-level token; runs until the process ends.
pub async fn listen(
    slack: Arc<Slack>,
    app_token: &str,
    tx: mpsc::UnboundedSender<Incoming>,
) -> Result<SlackClientSocketModeListener<SlackClientHyperHttpsConnector>, PlatformError> {
    let callbacks = SlackSocketModeListenerCallbacks::new().with_push_events(on_push);
    let env = Arc::new(
        SlackClientEventsListenerEnvironment::new(slack.client.clone())
            .with_user_state(CallbackState { tx, slack: slack.clone() }),
    );
    let listener =
        SlackClientSocketModeListener::new(&SlackClientSocketModeConfig::new(), env, callbacks);
    let app = SlackApiToken::new(SlackApiTokenValue::new(app_token.to_owned()));
    listener
        .listen_for(&app)
        .await
        .map_err(|e| classify(&e, "opening Socket Mode (apps.connections.open)"))?;
    listener.start().await;
    Ok(listener)
}

/// What a slack-morphism error means for the relay.
pub fn classify(e: &SlackClientError, doing: &str) -> PlatformError {
    match e {
        SlackClientError::RateLimitError(r) => PlatformError::RateLimited(
            r.retry_after.unwrap_or(Duration::from_secs(1)).max(Duration::from_millis(100)),
        ),
        SlackClientError::ApiError(api) => {
            let what = format!("{doing}: {}", api.code);
            match api.code.as_str() {
                "invalid_auth"
                | "not_authed"
                | "account_inactive"
                | "token_revoked"
                | "not_allowed_token_type" => PlatformError::Fatal(format!(
                    "{what}: Slack refused the token (check the variables `token_env` (xoxb-…) and `app_token_env` (xapp-…) name)"
                )),
                "ratelimited" => PlatformError::RateLimited(Duration::from_secs(1)),
                "internal_error" | "fatal_error" | "service_unavailable" | "request_timeout" => {
                    PlatformError::Transient(what)
                }
                _ => PlatformError::Permanent(what),
            }
        }
        other => PlatformError::Transient(format!("{doing}: {}", scrub(&other.to_string()))),
    }
}

fn scrub(text: &str) -> String {
    text.split_whitespace()
        .map(|w| if w.contains("xoxb-") || w.contains("xapp-") { "[token]" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Slack's three escapes: nothing an agent writes can become a mention or a link.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A person's text as written (Slack sends `&`, `<`, `>` escaped).
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

/// A person's mrkdwn as the Markdown the rest of Flock speaks: `*b*` → `**b**`, `~s~` →
/// `~~s~~`, `<url|text>` → `[text](url)`, `<url>` → `url` (`_i_` and code are the same in both);
/// Slack's escapes undone. Mentions (`<@U1>`, `<!here>`) stay as Slack wrote them.
pub fn markdown_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    by_line(text, &mut out, |line, code, out| {
        if code {
            out.push_str(line);
            return;
        }
        let mut rest = line;
        'next: while let Some(c) = rest.chars().next() {
            if c == '`'
                && let Some(end) = rest[1..].find('`')
            {
                out.push_str(&rest[..end + 2]);
                rest = &rest[end + 2..];
                continue;
            }
            if c == '<'
                && let Some(end) = rest.find('>')
            {
                let inner = &rest[1..end];
                if inner.starts_with("http://")
                    || inner.starts_with("https://")
                    || inner.starts_with("mailto:")
                {
                    match inner.split_once('|') {
                        Some((url, label)) => out.push_str(&format!("[{label}]({url})")),
                        None => out.push_str(inner),
                    }
                    rest = &rest[end + 1..];
                    continue;
                }
            }
            for (mark, to) in [('*', "**"), ('~', "~~")] {
                if c == mark
                    && let Some(end) = rest[1..].find(mark)
                    && end > 0
                    && !rest[1..].starts_with(' ')
                    && !rest[1..1 + end].ends_with(' ')
                {
                    out.push_str(to);
                    out.push_str(&rest[1..1 + end]);
                    out.push_str(to);
                    rest = &rest[end + 2..];
                    continue 'next;
                }
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    });
    // Slack escapes `&`, `<` and `>` everywhere (so a `<` above is always its markup): undone
    // once, at the end.
    unescape(&out)
}

/// Markdown → Slack mrkdwn: `**b**`/`__b__` → `*b*`, `*i*`/`_i_` → `_i_`, `~~s~~` → `~s~`,
/// `[text](url)` → `<url|text>`, `# heading` → `*heading*`, `- item`/`* item` → `• item`;
/// code spans and blocks are left as they are (escaped only).
pub fn mrkdwn(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    by_line(text, &mut out, |line, code, out| {
        if code {
            out.push_str(&escape(line));
            return;
        }
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let (lead, rest) = if let Some(h) = trimmed.strip_prefix('#') {
            let h = h.trim_start_matches('#').trim();
            out.push_str(indent);
            out.push('*');
            out.push_str(&inline(h));
            out.push('*');
            return;
        } else if let Some(r) = trimmed
            .strip_prefix("- ")
            .or_else(|| trimmed.strip_prefix("* "))
            .or_else(|| trimmed.strip_prefix("+ "))
        {
            ("• ", r)
        } else {
            ("", trimmed)
        };
        out.push_str(indent);
        out.push_str(lead);
        out.push_str(&inline(rest));
    });
    out
}

/// Calls `each` on every line of `text` with whether it is code (a ```` ``` ```` fence or a line
/// between two), the lines joined in `out` by `\n` as they were.
fn by_line(text: &str, out: &mut String, mut each: impl FnMut(&str, bool, &mut String)) {
    let mut in_block = false;
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let fence = line.trim_start().starts_with("```");
        if fence {
            in_block = !in_block;
        }
        each(line, fence || in_block, out);
    }
}

/// Inline Markdown of one line in mrkdwn, escaped (code spans copied as they are).
fn inline(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    'next: while let Some(c) = rest.chars().next() {
        if c == '`'
            && let Some(end) = rest[1..].find('`')
        {
            out.push_str(&escape(&rest[..end + 2]));
            rest = &rest[end + 2..];
            continue;
        }
        if c == '['
            && let Some(close) = rest.find("](")
            && let Some(end) = rest[close + 2..].find(')')
        {
            let (label, url) = (&rest[1..close], &rest[close + 2..close + 2 + end]);
            if ["http://", "https://", "mailto:"].iter().any(|p| url.starts_with(p)) {
                out.push_str(&format!("<{}|{}>", escape(url), escape(label)));
                rest = &rest[close + 2 + end + 1..];
                continue;
            }
        }
        for (mark, to) in [("**", "*"), ("__", "*"), ("~~", "~")] {
            if let Some(body) = rest.strip_prefix(mark)
                && let Some(end) = body.find(mark)
                && end > 0
            {
                out.push_str(to);
                out.push_str(&inline(&body[..end]));
                out.push_str(to);
                rest = &body[end + mark.len()..];
                continue 'next;
            }
        }
        // *italic* → _italic_ (a single star that closes on the same line).
        if c == '*'
            && let Some(end) = rest[1..].find('*')
            && end > 0
            && !rest[1..].starts_with(' ')
        {
            out.push('_');
            out.push_str(&inline(&rest[1..1 + end]));
            out.push('_');
            rest = &rest[end + 2..];
            continue;
        }
        out.push_str(&escape(&rest[..c.len_utf8()]));
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// A permanent error whose Slack error code is one of `hints`' gets that hint after it: what to do
/// about it.
fn with_hint(e: PlatformError, hints: &[(&str, &str)]) -> PlatformError {
    match e {
        PlatformError::Permanent(m) => match hints.iter().find(|(code, _)| m.ends_with(code)) {
            Some((_, hint)) => PlatformError::Permanent(format!("{m}: {hint}")),
            None => PlatformError::Permanent(m),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_mrkdwn() {
        assert_eq!(mrkdwn("**bold** and *it* and ~~gone~~"), "*bold* and _it_ and ~gone~");
        assert_eq!(
            mrkdwn("see [the docs](https://x.io/a?b=1&c=2)"),
            "see <https://x.io/a?b=1&amp;c=2|the docs>"
        );
        assert_eq!(mrkdwn("# Plan\n- one\n- two"), "*Plan*\n• one\n• two");
        assert_eq!(mrkdwn("`a**b**c` stays"), "`a**b**c` stays");
        assert_eq!(mrkdwn("```\nlet x = a < b;\n```"), "```\nlet x = a &lt; b;\n```");
    }

    #[test]
    fn nobody_is_pinged_by_an_agents_text() {
        assert_eq!(
            mrkdwn("<!channel> <!here> <@U123> a&b"),
            "&lt;!channel&gt; &lt;!here&gt; &lt;@U123&gt; a&amp;b"
        );
        assert_eq!(unescape("a &lt;b&gt; &amp; c"), "a <b> & c");
    }

    #[test]
    fn a_persons_mrkdwn_becomes_markdown_and_back() {
        let md =
            markdown_of("deploy at *6* ~not 5~, _soon_, see <https://x.io/a?b=1&amp;c=2|the plan>");
        assert_eq!(md, "deploy at **6** ~~not 5~~, _soon_, see [the plan](https://x.io/a?b=1&c=2)");
        assert_eq!(
            mrkdwn(&md),
            "deploy at *6* ~not 5~, _soon_, see <https://x.io/a?b=1&amp;c=2|the plan>"
        );
        assert_eq!(markdown_of("`*code*` and 2 * 3 * 4 &lt;b&gt;"), "`*code*` and 2 * 3 * 4 <b>");
        assert_eq!(markdown_of("&amp;lt; stays"), "&lt; stays", "undone once");
        assert_eq!(markdown_of("<@U123> <!here> <https://x.io>"), "<@U123> <!here> https://x.io");
    }

    #[test]
    fn tokens_never_reach_an_error_text() {
        assert!(!scrub("bad token xoxb-123-abc given").contains("xoxb-123"));
    }
}
