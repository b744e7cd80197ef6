//! Who is who on the wire, and the checks of a handshake that need nothing but the frame: the
//! protocol version, the address a `Hello` claims, a secret compared in constant time, and the id
//! a chat platform's user gets. The router runs them on every `Hello` and `BridgeHello`, the
//! channels actor names people with [`human_author`], and the fuzz targets run this same code.

use crate::{ErrorCode, Hello, PROTOCOL_VERSION, ToolError};

/// The instance key of every agent declared in the swarm file (one instance each); a spawned
/// instance has its own (`agent@instance`).
pub const DEFAULT_INSTANCE: &str = "default";

/// Refuses a handshake whose protocol version is not this build's.
pub fn check_version(hello: &Hello) -> Result<(), ToolError> {
    if hello.protocol_version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::BadRequest,
        format!(
            "protocol version {} is not supported (expected {PROTOCOL_VERSION})",
            hello.protocol_version
        ),
    ))
}

/// Refuses a control connection's `ClientHello` whose protocol version is not this build's, or
/// whose operator key is not `want` (`None`: the control socket has no key to check).
pub fn check_client_hello(
    protocol_version: u32,
    key: &str,
    want: Option<&str>,
) -> Result<(), ToolError> {
    if protocol_version != PROTOCOL_VERSION {
        return Err(ToolError::new(
            ErrorCode::BadRequest,
            format!(
                "protocol version {protocol_version} is not supported (this supervisor speaks \
                 {PROTOCOL_VERSION}); use the flockctl that came with it"
            ),
        ));
    }
    if let Some(want) = want
        && !same_secret(want, key)
    {
        let what = if key.is_empty() { "no" } else { "a wrong" };
        return Err(ToolError::new(
            ErrorCode::Forbidden,
            format!(
                "this connection presented {what} operator key: the control socket serves the \
                 operator, who can read `{}` beside it (run as the user who started the swarm, \
                 with the same --state-dir)",
                crate::operator::KEY_FILE
            ),
        ));
    }
    Ok(())
}

/// The tools a chat bridge's connection may call (answered by the channels actor); a bridge's
/// `bridge__status` report is the router's own.
pub const BRIDGE_TOOLS: [&str; 8] = [
    "bridge__post",
    "bridge__mappings",
    "bridge__made",
    "bridge__edit",
    "bridge__pull",
    "bridge__sent",
    "bridge__last",
    "bridge__archived",
];

/// A platform's id (a message's, a user's, a chat's) in a bridge call's arguments: a non-empty
/// string, or a number as platforms send them.
pub fn platform_id(args: &serde_json::Value, key: &str) -> Result<String, ToolError> {
    match args.get(key) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        _ => Err(ToolError::new(ErrorCode::BadRequest, format!("`{key}` is required"))),
    }
}

/// The address a `Hello` claims: `agent`, or `agent@instance` for a spawned instance.
pub fn hello_address(hello: &Hello) -> String {
    if hello.instance.is_empty() || hello.instance == DEFAULT_INSTANCE {
        hello.agent_id.clone()
    } else {
        format!("{}@{}", hello.agent_id, hello.instance)
    }
}

/// Whether a presented secret is the expected one, in time that does not depend on where they
/// differ.
pub fn same_secret(expected: &str, given: &str) -> bool {
    subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given.as_bytes()).into()
}

/// `human:<platform>:<name>` for a chat platform's user: the name cut to 40 of a-z, 0-9, `.`,
/// `_` and `-` (lowercase), falling back to the user id — a person can never take an agent's
/// name.
pub fn human_author(platform: &str, user_name: &str, user_id: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .flat_map(char::to_lowercase)
            .map(
                |c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' },
            )
            .collect::<String>()
            .trim_matches('-')
            .chars()
            .take(40)
            .collect()
    };
    let name = clean(user_name);
    let name = if name.is_empty() { clean(user_id) } else { name };
    format!("human:{platform}:{}", if name.is_empty() { "unknown" } else { &name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_person_never_gets_an_agents_name() {
        assert_eq!(human_author("telegram", "Alice Smith", "42"), "human:telegram:alice-smith");
        assert_eq!(human_author("telegram", "", "42"), "human:telegram:42");
        assert_eq!(human_author("discord", "!!!", ""), "human:discord:unknown");
        assert_eq!(human_author("slack", "worker-1", "U1"), "human:slack:worker-1");
        assert!(human_author("slack", &"x".repeat(500), "U1").len() < 60);
    }

    #[test]
    fn secrets_are_equal_only_when_every_byte_is() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
    }
}
