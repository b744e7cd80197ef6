//! Starting the actors from the application that runs them (the supervisor), through functions
//! that are not generic. An actor's message loop (ractor's, for each actor type) and the
//! connection tasks (for each transport) are generic code: they are compiled in the crate that
//! names the concrete type. Named here, they are compiled with this crate — built optimised in
//! every profile (Cargo.toml's `dist` profile) — and not in the caller, which `dist` builds at
//! opt-level 0 to keep a person's first build short. (Measured: the router's loop compiled in the
//! supervisor at opt-level 0 cost 18 % of routed throughput and 30 % of a request's latency.)

use flock_ipc::{Transport, UnixTransport};
use ractor::{Actor, ActorRef, SpawnErr};
use tokio::task::JoinHandle;

use crate::channels::{Channels, ChannelsArgs};
use crate::gateway::{Gateway, GatewayArgs};
use crate::messages::{ChannelsMsg, ConnKind, GatewayMsg, RouterMsg, StoreMsg};
use crate::router::{Router, RouterArgs};
use crate::server::{ConnLimits, serve};
use crate::store::Store;
use crate::store_actor::StoreActor;

/// Starts the store actor (the only writer of `store`), named `name`.
pub async fn store(name: &str, store: Store) -> Result<ActorRef<StoreMsg>, SpawnErr> {
    Ok(Actor::spawn(Some(name.into()), StoreActor, store).await?.0)
}

/// Starts the channels actor, named `name`.
pub async fn channels(name: &str, args: ChannelsArgs) -> Result<ActorRef<ChannelsMsg>, SpawnErr> {
    Ok(Actor::spawn(Some(name.into()), Channels, args).await?.0)
}

/// Starts the model gateway actor, named `name`.
pub async fn gateway(name: &str, args: GatewayArgs) -> Result<ActorRef<GatewayMsg>, SpawnErr> {
    Ok(Actor::spawn(Some(name.into()), Gateway, args).await?.0)
}

/// Starts the router actor, named `name`.
pub async fn router(name: &str, args: RouterArgs) -> Result<ActorRef<RouterMsg>, SpawnErr> {
    Ok(Actor::spawn(Some(name.into()), Router, args).await?.0)
}

/// [`serve`] over a Unix socket.
pub fn serve_unix(
    listener: <UnixTransport as Transport>::Listener,
    kind: ConnKind,
    router: ActorRef<RouterMsg>,
    limits: ConnLimits,
) -> JoinHandle<()> {
    serve::<UnixTransport>(listener, kind, router, limits)
}
