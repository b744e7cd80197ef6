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

/// A refused or failed tool call: a wire code and a message for whoever called (a model sees
/// `CODE: message`). Carried typed from where it happens to the edge — an `Error` frame to an
/// agent, a coded error to `flockctl` or a chat bridge — never formatted and parsed back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ToolError { code, message: message.into() }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}
