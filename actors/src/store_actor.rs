//! The store actor: the single SQLite writer. Writes are group-committed: every write that arrives
//! while a flush is pending joins the same transaction, so the cost of a commit is shared by
//! everything queued behind it (the `Flush` message goes to the back of the mailbox, after the
//! writes already waiting there).

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::messages::{Origin, RouterMsg, StoreJob, StoreMsg, StoredBatch};
use crate::store::{Store, WriteOp};

pub struct StoreActor;

pub struct StoreState {
    store: Store,
    queued: Vec<(WriteOp, Option<Origin>, Option<ActorRef<RouterMsg>>)>,
    flush_scheduled: bool,
}

impl Actor for StoreActor {
    type Msg = StoreMsg;
    type State = StoreState;
    type Arguments = Store;

    async fn pre_start(
        &self,
        _myself: ActorRef<StoreMsg>,
        store: Store,
    ) -> Result<StoreState, ActorProcessingErr> {
        Ok(StoreState { store, queued: Vec::new(), flush_scheduled: false })
    }

    async fn handle(
        &self,
        myself: ActorRef<StoreMsg>,
        msg: StoreMsg,
        state: &mut StoreState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            StoreMsg::Write { op, origin, notify } => {
                state.queued.push((op, origin, notify));
                if !state.flush_scheduled {
                    state.flush_scheduled = true;
                    myself.cast(StoreMsg::Flush)?;
                }
            }
            StoreMsg::Flush => {
                state.flush_scheduled = false;
                flush(state);
            }
            StoreMsg::With(job) => {
                if !state.queued.is_empty() {
                    flush(state);
                }
                let store = &mut state.store;
                blocking(|| job(store));
            }
            StoreMsg::Pending(reply) => {
                let _ = reply.send(state.store.pending().map_err(|e| e.to_string()));
            }
            StoreMsg::TurnsTotals(reply) => {
                let _ = reply.send(state.store.turns_totals().map_err(|e| e.to_string()));
            }
            StoreMsg::DeadLetters { offset, limit, reply } => {
                let page = state.store.dead_letters(offset, limit);
                let _ = reply.send(page.map_err(|e| e.to_string()));
            }
        }
        Ok(())
    }
}

/// Commits every queued write in one transaction and tells the router the outcomes.
fn flush(state: &mut StoreState) {
    let batch = std::mem::take(&mut state.queued);
    let writes = batch.len();
    let store = &mut state.store;
    let result = blocking(|| store.apply(batch.iter().map(|(op, _, _)| op)));
    let mut stored: Option<(ActorRef<RouterMsg>, StoredBatch)> = None;
    for (i, (op, origin, notify)) in batch.into_iter().enumerate() {
        let Some(router) = notify else { continue };
        let outcome = match &result {
            Ok(outcomes) => Ok(outcomes[i]),
            Err(e) => Err(e.to_string()),
        };
        let entry = stored.get_or_insert_with(|| (router, StoredBatch::default()));
        entry.1.items.push((op, origin, outcome));
    }
    if let Err(e) = &result {
        tracing::error!(writes, error = %e, "flock store: commit of {writes} writes failed");
    }
    if let Some((router, batch)) = stored {
        let _ = router.cast(RouterMsg::Stored(batch));
    }
}

/// Runs blocking SQLite work without stalling the other tasks of a multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Runs `f` on the store inside the store actor and waits for its result (for actors and tasks
/// that need an answer; the router never does).
pub async fn with_store<T: Send + 'static>(
    store: &ActorRef<StoreMsg>,
    f: impl FnOnce(&mut Store) -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: StoreJob = Box::new(move |s: &mut Store| {
        let _ = tx.send(f(s).map_err(|e| e.to_string()));
    });
    store.cast(StoreMsg::With(job)).map_err(|e| format!("the store is not running: {e}"))?;
    rx.await.map_err(|_| "the store dropped the request".to_string())?
}
