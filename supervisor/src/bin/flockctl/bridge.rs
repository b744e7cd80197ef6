//! `flockctl bridge …` helpers: a bridge's status as text, and the Slack app manifest.

/// `flockctl bridge status NAME` as text, from its `bridge ls --json` object.
pub(crate) fn bridge_status_text(b: &serde_json::Value) -> String {
    use std::fmt::Write;
    let str_or = |v: &serde_json::Value, d: &str| v.as_str().unwrap_or(d).to_owned();
    let mut out = String::new();
    let _ = writeln!(out, "bridge {} ({})", str_or(&b["name"], "?"), str_or(&b["platform"], "?"));
    let _ = writeln!(out, "  state       {}", str_or(&b["state"], "?"));
    let pid = b["pid"].as_u64().map_or("-".to_owned(), |p| p.to_string());
    let _ = writeln!(
        out,
        "  pid         {pid} (up {} s, {} restarts)",
        b["uptime_secs"].as_u64().unwrap_or(0),
        b["restarts"].as_u64().unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "  messages    {} in, {} out; {} posts waiting",
        b["inbound"], b["outbound"], b["outbox"]
    );
    let _ = writeln!(out, "  last error  {}", str_or(&b["last_error"], "-"));
    let _ = writeln!(
        out,
        "  token       from ${} (api {})",
        str_or(&b["token_env"], "?"),
        str_or(&b["api_url"], "?")
    );
    let maps = b["channels"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "  mappings    {}", maps.len());
    for m in &maps {
        let allow = match m["allow"].as_array() {
            None => "everyone may post".to_owned(),
            Some(a) if a.len() == 1 => "1 person may post".to_owned(),
            Some(a) => format!("{} people may post", a.len()),
        };
        let cursor = match m["cursor"].as_u64() {
            Some(c) => format!("sent up to seq {c} of {}", m["newest"].as_u64().unwrap_or(0)),
            None => "nothing pulled yet".to_owned(),
        };
        let health = match m["broken"].as_str() {
            Some(why) => format!("BROKEN: {why}"),
            None if m["archived"].as_bool() == Some(true) => "archived (mirrored)".to_owned(),
            None => "ok".to_owned(),
        };
        let _ = writeln!(
            out,
            "    #{} ↔ {}: {allow}; {cursor}, {} waiting; {health}",
            str_or(&m["flock"], "?"),
            str_or(&m["external"], "?"),
            m["waiting"].as_u64().unwrap_or(0)
        );
    }
    out
}

/// The Slack app manifest: Socket Mode, the bot scopes the bridge uses (`chat:write.customize`
/// to post under each agent's name, `channels:manage`/`groups:write` to archive a conversation
/// whose Flock channel was archived, `reactions:write` to mark a message being worked on,
/// `im:history` for direct messages), the message events of channels and of DMs with the bot
/// (the app's Messages tab on).
pub(crate) fn slack_manifest(name: &str) -> String {
    format!(
        r#"# Slack app manifest for a Flock bridge. Create the app from it, install it to the
# workspace (the Bot User OAuth Token, xoxb-…, goes in the variable `token_env` names), then
# Basic Information → App-Level Tokens → Generate with scope connections:write (the xapp-…
# token goes in the variable `app_token_env` names). Invite the bot to each mapped channel.
display_information:
  name: {name}
  description: Your Flock agents in Slack
features:
  app_home:
    home_tab_enabled: false
    messages_tab_enabled: true
    messages_tab_read_only_enabled: false
  bot_user:
    display_name: {name}
    always_online: true
oauth_config:
  scopes:
    bot:
      - channels:history
      - channels:manage
      - channels:read
      - groups:history
      - groups:read
      - groups:write
      - chat:write
      - chat:write.customize
      - im:history
      - reactions:write
      - users:read
settings:
  event_subscriptions:
    bot_events:
      - message.channels
      - message.groups
      - message.im
  interactivity:
    is_enabled: false
  org_deploy_enabled: false
  socket_mode_enabled: true
  token_rotation_enabled: false
"#
    )
}
