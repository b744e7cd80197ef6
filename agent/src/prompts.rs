//! Role prompts from `prompts/roles/`, embedded at build time.

use flock_config::Role;

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
