//! Who calls a tool, as the connection established it (an agent's handshake, `flockctl`'s
//! operator key, a chat bridge's token) — never as tool arguments say. Channels and permissions
//! both decide by it.

use flock_config::Role;

/// Who is calling, as established by the connection — never by tool arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Agent name, or `human:<name>`.
    pub id: String,
    /// `None` for humans.
    pub role: Option<Role>,
}

impl Caller {
    pub fn is_human(&self) -> bool {
        self.role.is_none()
    }
    pub fn may(&self, tool: &str) -> bool {
        self.role.is_none_or(|role| role.may_use(tool))
    }
}
