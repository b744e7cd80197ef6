//! `flock-actors`: the orchestrator inside the supervisor process — the router actor, the store
//! actor (the only SQLite writer) and the connection server that feeds the router.
//!
//! It does not spawn or supervise OS processes (that is `flock-supervisor`); it learns about them
//! through [`RouterMsg::Expect`]/[`RouterMsg::Stop`] and reports back through
//! [`router::RouterEvent`]s.

pub mod caller;
pub mod chains;
pub mod channels;
pub mod gateway;
pub mod memory;
pub mod messages;
pub mod metrics;
pub mod permissions;
pub mod router;
pub mod server;
pub mod start;
pub mod store;
pub mod store_actor;
pub mod text;

pub use messages::{ConnKind, RouteInfo, RouterCounters, RouterMsg, StoreMsg};
pub use router::{ControlCall, ControlSink, EventSink, Router, RouterArgs, RouterEvent};
pub use server::{ConnLimits, serve};
pub use store::{Durability, Store, StoreError};
pub use store_actor::StoreActor;
