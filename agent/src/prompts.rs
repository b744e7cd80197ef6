//! The system message of a turn: role and archetype prompts from `prompts/` (embedded at build
//! time), the rules every agent shares, and the runtime catalog. A prompt asks; only code
//! guarantees (roles and `can_call` are enforced by the router and the channels actor).

use flock_config::{AgentSpec, Role};
use serde_json::Value;

pub fn role_prompt(role: Role) -> &'static str {
    match role {
        Role::Orchestrator => include_str!("../../prompts/roles/orchestrator.md"),
        Role::Sysadmin => include_str!("../../prompts/roles/sysadmin.md"),
        Role::Worker => include_str!("../../prompts/roles/worker.md"),
        Role::Coordinator => include_str!("../../prompts/roles/coordinator.md"),
        Role::Unconscious => include_str!("../../prompts/roles/unconscious.md"),
        Role::Observer => include_str!("../../prompts/roles/observer.md"),
        Role::Reflection => include_str!("../../prompts/roles/reflection.md"),
        Role::Dream => include_str!("../../prompts/roles/dream.md"),
    }
}

/// The prompt of a worker archetype, if Flock has one by that name.
pub fn archetype_prompt(archetype: &str) -> Option<&'static str> {
    Some(match archetype {
        "project-manager" => include_str!("../../prompts/archetypes/project-manager.md"),
        "code-first-developer" => include_str!("../../prompts/archetypes/code-first-developer.md"),
        "production-first-developer" => {
            include_str!("../../prompts/archetypes/production-first-developer.md")
        }
        "code-reviewer" => include_str!("../../prompts/archetypes/code-reviewer.md"),
        "qa" => include_str!("../../prompts/archetypes/qa.md"),
        _ => return None,
    })
}

const COMMON: &str = include_str!("../../prompts/roles/_common.md");

/// The catalog without the agents named in `hidden` (those the runtime talks to on the agent's
/// behalf: a worker's prompt never mentions its unconscious or observer).
pub fn without(catalog: Option<&str>, hidden: &[String]) -> String {
    let entries: Vec<Value> =
        catalog.and_then(|c| serde_json::from_str::<Vec<Value>>(c).ok()).unwrap_or_default();
    let kept: Vec<Value> = entries
        .into_iter()
        .filter(|e| !hidden.iter().any(|h| e["name"].as_str() == Some(h.as_str())))
        .collect();
    Value::Array(kept).to_string()
}

/// The names in a catalog this agent may call.
pub fn callable(catalog: &str) -> Vec<String> {
    let entries: Vec<Value> = serde_json::from_str(catalog).unwrap_or_default();
    entries
        .iter()
        .filter(|e| e["callable"].as_bool() != Some(false))
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect()
}

/// The date line of `date_helper`: `Today is Wednesday, 2026-11-25 (UTC).` (it changes once a
/// day, so the prompt stays a cacheable prefix; each input carries its own time of day).
pub fn today(now_ms: u64) -> String {
    let day = flock_ipc::time::weekday(now_ms);
    let date = &flock_ipc::time::format_timestamp(now_ms)[..10];
    format!("Today is {day}, {date} (UTC).")
}

/// Renders the system message. `catalog` is the JSON array `agents__catalog` answers (who else
/// exists, with role, archetype, description and whether this agent may call them); `None`
/// leaves `[runtime_catalog]` out (no `context_injector`).
pub fn system_message(spec: &AgentSpec, catalog: Option<&str>, today: Option<&str>) -> String {
    let mut out = format!("You are `{}`.\n\n{}", spec.key(), role_prompt(spec.role).trim_end());
    if let Some(a) = spec.archetype.as_deref() {
        match archetype_prompt(a) {
            Some(p) => out.push_str(&format!("\n\n{}", p.trim_end())),
            None => out.push_str(&format!("\n\nYour archetype is **{a}**.")),
        }
    }
    if !spec.description.is_empty() {
        out.push_str(&format!("\n\nYour job here: {}", spec.description));
    }
    out.push_str(&format!("\n\n{}", COMMON.trim_end()));
    if let Some(today) = today {
        out.push_str(&format!("\n\n{today}"));
    }
    let Some(catalog) = catalog else { return out };
    let entries: Vec<Value> = serde_json::from_str::<Vec<Value>>(catalog).unwrap_or_default();
    out.push_str("\n\n[runtime_catalog]");
    if entries.is_empty() {
        out.push_str("\n(no other agents)");
    }
    for e in entries {
        let name = e["name"].as_str().unwrap_or_default();
        let role = e["role"].as_str().unwrap_or_default();
        let archetype = e["archetype"].as_str().map(|a| format!(", {a}")).unwrap_or_default();
        let description = e["description"].as_str().filter(|d| !d.is_empty());
        let callable =
            if e["callable"].as_bool() == Some(false) { " — you may not call it" } else { "" };
        out.push_str(&format!(
            "\n- {name} ({role}{archetype}){}{callable}",
            description.map(|d| format!(": {d}")).unwrap_or_default()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `snake_case` names a prompt puts in backticks that look like tools.
    fn tools_named(prompt: &str) -> Vec<&str> {
        prompt
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.contains('_') && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
            .collect()
    }

    #[test]
    fn every_tool_a_prompt_names_exists_and_its_role_may_call_it() {
        let mut checked = 0;
        let workers = ["project-manager", "code-first-developer", "production-first-developer"];
        let archetypes = workers.into_iter().chain(["code-reviewer", "qa"]);
        let prompts = Role::ALL.into_iter().map(|r| (r, role_prompt(r))).chain(
            archetypes.map(|a| (Role::Worker, archetype_prompt(a).expect("a shipped archetype"))),
        );
        for (role, prompt) in prompts {
            for name in tools_named(prompt) {
                assert!(
                    flock_config::tools::tool(name).is_some(),
                    "the {role:?} prompt names `{name}`, which is not a tool"
                );
                assert!(
                    role.may_use(name),
                    "the {role:?} prompt names `{name}`, which it may not call"
                );
                checked += 1;
            }
        }
        // The orchestrator's and the worker's prompts walk the channel protocol by its tools.
        for (role, tools) in [
            (Role::Orchestrator, &["flock_channel_create", "flock_channel_post"][..]),
            (Role::Worker, &["flock_channel_post", "memory_remember", "flock_update_card"][..]),
        ] {
            let named = tools_named(role_prompt(role));
            assert!(tools.iter().all(|t| named.contains(t)), "{role:?} names {named:?}");
        }
        assert!(checked >= 8, "only {checked} tool names checked");
    }

    fn spec(role: Role, archetype: Option<&str>) -> AgentSpec {
        AgentSpec {
            archetype: archetype.map(Into::into),
            description: "builds things".into(),
            ..crate::test_spec(role, Vec::new())
        }
    }

    #[test]
    fn the_date_line_names_the_weekday() {
        // 2026-11-25 was a Wednesday; 1970-01-01 a Thursday.
        assert_eq!(today(1_795_608_000_000), "Today is Wednesday, 2026-11-25 (UTC).");
        assert_eq!(today(0), "Today is Thursday, 1970-01-01 (UTC).");
    }

    #[test]
    fn every_role_and_archetype_has_a_prompt() {
        for role in Role::ALL {
            assert!(!role_prompt(role).trim().is_empty(), "{role:?}");
        }
        for a in [
            "project-manager",
            "code-first-developer",
            "production-first-developer",
            "code-reviewer",
            "qa",
        ] {
            assert!(archetype_prompt(a).is_some(), "{a}");
        }
    }

    #[test]
    fn the_catalog_hides_the_pipelines_peers_and_names_whom_the_agent_may_call() {
        let catalog = r#"[{"name":"coordinator","callable":true},{"name":"unconscious","callable":true},
                          {"name":"observer","callable":true},{"name":"boss","callable":false}]"#;
        let shown = without(Some(catalog), &["unconscious".into(), "observer".into()]);
        let m = system_message(&spec(Role::Worker, None), Some(&shown), None);
        assert!(!m.contains("unconscious") && !m.contains("observer"), "{m}");
        assert_eq!(callable(&shown), ["coordinator"]);
        // The memory roles get no tools; only the orchestrator gets the orchestrator's.
        assert!(crate::tools::definitions_for(Role::Observer).is_empty());
        let names =
            |r| crate::tools::definitions_for(r).into_iter().map(|d| d.name).collect::<Vec<_>>();
        assert!(names(Role::Orchestrator).contains(&"flock_channel_create".to_string()));
        assert!(!names(Role::Worker).contains(&"flock_channel_create".to_string()));
        assert!(!names(Role::Worker).contains(&"agents__spawn".to_string()));
        assert!(names(Role::Coordinator).contains(&"agents__spawn".to_string()));
        use crate::tools::{TurnState, offered};
        let defs = offered(Role::Worker, None, TurnState::Free, &callable(&shown), None);
        let send = defs.iter().find(|d| d.name == "agents__send").unwrap();
        assert_eq!(send.parameters["properties"]["to"]["enum"], serde_json::json!(["coordinator"]));
        // Working on the coordinator's task, the worker has nobody else to address: its answer
        // goes back by itself, so no addressing tool is offered at all; `tools:` narrows the rest.
        let defs =
            offered(Role::Worker, None, TurnState::Owed, &callable(&shown), Some("coordinator"));
        let addressing = ["agents__send", "agents__request", "agents__delegate"];
        assert!(defs.iter().all(|d| !addressing.contains(&d.name.as_str())), "{defs:?}");
        assert!(defs.iter().any(|d| d.name == "flock_channel_post"), "{defs:?}");
        let only = ["agents__request".to_string()];
        let defs = offered(
            Role::Worker,
            Some(&only),
            TurnState::Owed,
            &callable(&shown),
            Some("coordinator"),
        );
        assert!(defs.is_empty(), "{defs:?}");
        // A coordinator owing a person an answer: delegate or answer, nothing else; answering a
        // result: text only.
        let team = vec!["worker".to_string(), "dream".to_string()];
        let defs = offered(Role::Coordinator, None, TurnState::Owed, &team, Some("human:operator"));
        assert_eq!(defs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["agents__delegate"]);
        // It picks the delegate; the request goes over as it is.
        assert_eq!(defs[0].parameters["required"], serde_json::json!(["to"]), "{defs:?}");
        assert!(
            offered(Role::Coordinator, None, TurnState::Result, &team, Some("human:op")).is_empty()
        );
    }

    #[test]
    fn system_message_has_role_archetype_human_priority_and_catalog() {
        let catalog = r#"[{"name":"qa","role":"worker","archetype":"qa","description":"tests","callable":true},
                          {"name":"boss","role":"orchestrator","archetype":null,"description":"","callable":false}]"#;
        let m = system_message(&spec(Role::Worker, Some("code-reviewer")), Some(catalog), None);
        assert!(m.starts_with("You are `w`."));
        assert!(m.contains("archetype is **code reviewer**"));
        assert!(m.contains("`human:` participants"));
        assert!(m.contains("[runtime_catalog]\n- qa (worker, qa): tests\n- boss (orchestrator) — you may not call it"), "{m}");
    }
}
