//! Memory tiers at the router (issue #29): the daily TTL job's schedule is the supervisor's
//! (`RouterMsg::MemoryTick`); the memory thread moves the files (`crate::memory`); what waits for
//! a person — warm memory due for cold storage — becomes a permission request here
//! (`permissions::propose_archive`), and a person's approval comes back through
//! [`RouterState::archive_approved`]. Every move is journaled (`MEMORY_TIERED`).

use flock_ipc::ToolError;
use flock_journal::{JournalEvent, Status};
use ractor::ActorRef;
use serde_json::Value;

use super::{RouterState, unix_ms};
use crate::memory::{Call, approved_cold_move};
use crate::messages::{PermissionEffects, RouterMsg, StoreJob, StoreMsg};
use crate::permissions::{self, ArchiveDue};
use crate::store::Store;

/// Who the journal names for the TTL job's own moves.
const TTL_JOB: &str = "flock:memory";

impl RouterState {
    /// Runs the TTL job now (at start, then daily).
    pub(super) fn memory_tick(&mut self, myself: &ActorRef<RouterMsg>) {
        self.memory_call(myself, "memory__ttl", "{}".into(), TTL_JOB);
    }

    /// A person approved moving warm memory dated up to `until` to cold storage.
    pub(super) fn archive_approved(&mut self, myself: &ActorRef<RouterMsg>, until: &str, by: &str) {
        self.memory_call(myself, "memory__archive", approved_cold_move(until), by);
    }

    fn memory_call(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        tool: &str,
        arguments: String,
        by: &str,
    ) {
        let Some(memory) = &self.memory else { return };
        let router = myself.clone();
        let by = by.to_owned();
        let call = Call {
            tool: tool.to_owned(),
            arguments,
            caller: TTL_JOB.to_owned(),
            key: format!("{tool}-{}", unix_ms()),
        };
        memory.call(
            call,
            Box::new(move |result| {
                let _ = router.cast(RouterMsg::MemoryTiers { by, result });
            }),
        );
    }

    /// What a move did: journaled; warm memory due for cold becomes a request for a person.
    pub(super) fn memory_tiers(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        by: String,
        result: Result<String, ToolError>,
    ) {
        let answer = match result.map(|json| serde_json::from_str::<Value>(&json)) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return tracing::warn!(error = %e, "flock: memory tiers answered garbage"),
            Err(e) => {
                tracing::warn!(error = %e.message, "flock: memory day files not moved");
                if let Some(j) = &self.journal {
                    j.log(JournalEvent::new(by, "MEMORY_TIERED", Status::Failed, e.message));
                }
                return;
            }
        };
        // The TTL job answers {to_warm, cold_due}; a move answers the move itself.
        let moved = if answer.get("to_warm").is_some() { &answer["to_warm"] } else { &answer };
        if moved["dry_run"].as_bool() == Some(true) {
            return;
        }
        let files = moved["files"].as_array().map_or(0, Vec::len);
        let skipped = moved["skipped"].as_array().map_or(0, Vec::len);
        if files + skipped > 0 {
            let to = moved["to"].as_str().unwrap_or_default();
            let records = moved["records"].as_u64().unwrap_or(0);
            let message = format!("moved {files} memory day files ({records} records) to {to}");
            tracing::info!(files, records, to, skipped, "flock: {message}");
            if let Some(j) = &self.journal {
                let status = if skipped > 0 { Status::Failed } else { Status::Success };
                let mut e = JournalEvent::new(by, "MEMORY_TIERED", status, message)
                    .param("to", to)
                    .param("files", files)
                    .param("records", records);
                if skipped > 0 {
                    e = e.param("skipped", moved["skipped"].to_string());
                }
                j.log(e);
            }
        }
        let due = &answer["cold_due"];
        if !due.is_object() {
            return;
        }
        let text = |k: &str| due[k].as_str().unwrap_or_default().to_owned();
        let count = |k: &str| due[k].as_u64().unwrap_or(0) as usize;
        let due = ArchiveDue {
            until: text("until"),
            first: text("first"),
            files: count("files"),
            records: count("records"),
            cold_after_days: due["cold_after_days"].as_u64().unwrap_or(0) as u32,
        };
        let router = myself.clone();
        let job: StoreJob = Box::new(move |store: &mut Store| {
            let now = unix_ms() as i64;
            let asked = store.with_messages(|conn| {
                permissions::propose_archive(conn, &due, now).map(|r| (r, Vec::new()))
            });
            match asked {
                Ok(Ok((Some(r), _))) => {
                    let effects = PermissionEffects {
                        journal: r.effects.journal,
                        stored: Vec::new(),
                        archive: None,
                    };
                    let _ = router.cast(RouterMsg::Permission(effects));
                }
                Ok(Ok((None, _))) => {}
                Ok(Err(e)) => tracing::warn!(error = %e.message, "flock: memory archive not asked"),
                Err(e) => tracing::warn!(error = %e, "flock: memory archive not asked"),
            }
        });
        if let Err(e) = self.store.cast(StoreMsg::With(job)) {
            tracing::error!(error = %e, "flock router: the store is not running");
        }
    }
}
