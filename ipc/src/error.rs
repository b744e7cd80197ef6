//! The closed set of wire error codes (DESIGN.md §4). A wire error is a code plus a message, never
//! a serialized Rust error.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// No agent of that name exists in the swarm.
    AgentNotFound,
    /// The agent exists but cannot take this now (stopped, failed, not connected for a
    /// non-durable send, outbox full).
    TargetUnavailable,
    /// A deadline passed.
    Timeout,
    /// The request would call an agent already in the call chain.
    CircularCall,
    /// The swarm is shutting down.
    Draining,
    /// The caller's role or identity does not allow this.
    Forbidden,
    /// The frame or its arguments are malformed.
    BadRequest,
    /// Too much traffic; try again later.
    RateLimited,
    /// The chain of turns this frame belongs to used up its budget (hops, tokens or wall time)
    /// and was stopped by the router.
    BudgetExceeded,
    /// A bug or an unexpected failure inside Flock.
    Internal,
}

impl ErrorCode {
    /// The SCREAMING_CASE name used in tool results, logs and `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::AgentNotFound => "AGENT_NOT_FOUND",
            ErrorCode::TargetUnavailable => "TARGET_UNAVAILABLE",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::CircularCall => "CIRCULAR_CALL",
            ErrorCode::Draining => "DRAINING",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::BadRequest => "BAD_REQUEST",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::BudgetExceeded => "BUDGET_EXCEEDED",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    pub const ALL: [ErrorCode; 10] = [
        ErrorCode::AgentNotFound,
        ErrorCode::TargetUnavailable,
        ErrorCode::Timeout,
        ErrorCode::CircularCall,
        ErrorCode::Draining,
        ErrorCode::Forbidden,
        ErrorCode::BadRequest,
        ErrorCode::RateLimited,
        ErrorCode::BudgetExceeded,
        ErrorCode::Internal,
    ];
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
