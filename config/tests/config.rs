//! Behaviour of `flock-config` through its public API: valid files become specs with defaults
//! applied, invalid ones report every problem at once with file, line and column.

use std::path::{Path, PathBuf};

use flock_config::{
    ConfigError, DeliverySpec, ExtensionSpec, LocalModel, Matcher, ModelSpec, RestartPolicy, Role,
    ScriptStep, Strategy, SupervisionSpec, SwarmSpec, Transcript, load, parse,
};

/// A model block most tests reuse: one inline rule that answers everything.
const MODELS: &str = "
models:
  echo:
    provider: scripted
    rules:
      - reply: \"echo {input}\"
";

fn swarm(body: &str) -> String {
    format!("swarm:\n  name: test\n{MODELS}{body}")
}

fn ok(text: &str) -> SwarmSpec {
    match parse(text, Path::new("swarm.yaml")) {
        Ok(spec) => spec,
        Err(errors) => panic!("expected a valid swarm, got:\n{errors}"),
    }
}

fn errors(text: &str) -> Vec<ConfigError> {
    errors_at(text, Path::new("swarm.yaml"))
}

fn errors_at(text: &str, origin: &Path) -> Vec<ConfigError> {
    match parse(text, origin) {
        Ok(spec) => panic!("expected errors, got a valid swarm: {spec:?}"),
        Err(errors) => errors.0,
    }
}

/// Asserts there is exactly one error, and returns it.
fn one_error(text: &str) -> ConfigError {
    let errors = errors(text);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    errors.into_iter().next().unwrap_or_else(|| unreachable!())
}

fn assert_mentions(error: &ConfigError, parts: &[&str]) {
    for part in parts {
        assert!(error.message.contains(part), "`{part}` not in: {}", error.message);
    }
}

#[test]
fn omitted_sections_and_keys_take_their_defaults() {
    let spec = ok(&swarm("agents:\n  - name: solo\n    role: worker\n    model: echo\n"));
    assert_eq!(spec.name, "test");
    assert_eq!(spec.supervision, SupervisionSpec::default());
    assert_eq!(spec.delivery, DeliverySpec::default());
    let agent = &spec.agents[0];
    assert_eq!(agent.name, "solo");
    assert_eq!(agent.role, Role::Worker);
    assert_eq!(agent.restart, RestartPolicy::Permanent);
    assert_eq!((agent.stop_timeout_secs, agent.ready_timeout_secs), (10, 10));
    assert_eq!(agent.description, "");
    assert_eq!(agent.archetype, None);
    assert_eq!(agent.workspace, None);
    assert_eq!(agent.command, None);
    assert!(agent.env.is_empty() && agent.can_call.is_empty());
    let expected_source = std::path::absolute("swarm.yaml").ok();
    assert_eq!(spec.source, expected_source);
}

#[test]
fn defaults_section_applies_to_agents_that_omit_the_keys() {
    let spec = ok(&swarm(
        "defaults:
  model: echo
  restart: transient
  stop_timeout_secs: 3
  ready_timeout_secs: 4
agents:
  - name: a
    role: worker
  - name: b
    role: worker
    restart: temporary
    stop_timeout_secs: 7
",
    ));
    let [a, b] = &spec.agents[..] else { panic!("two agents expected") };
    assert_eq!(
        (a.restart, a.stop_timeout_secs, a.ready_timeout_secs),
        (RestartPolicy::Transient, 3, 4)
    );
    assert_eq!(
        (b.restart, b.stop_timeout_secs, b.ready_timeout_secs),
        (RestartPolicy::Temporary, 7, 4)
    );
    assert!(matches!(&a.model, ModelSpec::Scripted(t) if t.rules.len() == 1));
}

#[test]
fn every_setting_is_read_when_given() {
    let spec = ok(&swarm(
        "supervision:
  strategy: rest_for_one
  max_restarts: 1
  max_seconds: 2
  backoff_initial_ms: 3
  backoff_max_ms: 4
  backoff_reset_secs: 5
  escalate: true
  heartbeat_interval_ms: 60
  heartbeat_misses: 7
  parallel: 16
delivery:
  max_delivery_attempts: 8
  request_timeout_ms: 9
  max_frame_bytes: 1024
  outbox_frames: 16
  window: 64
agents:
  - name: a
    role: observer
    archetype: qa
    description: Watches
    delivery_window: 3
    workspace: some/dir
    env: { API_URL: 'http://x', PORT: 8080 }
    model: echo
",
    ));
    let expected = SupervisionSpec {
        strategy: Strategy::RestForOne,
        max_restarts: 1,
        max_seconds: 2,
        backoff_initial_ms: 3,
        backoff_max_ms: 4,
        backoff_reset_secs: 5,
        escalate: true,
        heartbeat_interval_ms: 60,
        heartbeat_misses: 7,
        parallel: 16,
    };
    assert_eq!(spec.supervision, expected);
    let delivery = DeliverySpec {
        max_delivery_attempts: 8,
        request_timeout_ms: 9,
        max_frame_bytes: 1024,
        outbox_frames: 16,
        window: 64,
    };
    assert_eq!(spec.delivery, delivery);
    let agent = &spec.agents[0];
    assert_eq!(agent.delivery_window, Some(3));
    assert_eq!(agent.archetype.as_deref(), Some("qa"));
    assert_eq!(agent.description, "Watches");
    assert_eq!(agent.workspace, Some(PathBuf::from("some/dir")));
    let env =
        [("API_URL".to_owned(), "http://x".to_owned()), ("PORT".to_owned(), "8080".to_owned())];
    assert_eq!(agent.env, env);
}

#[test]
fn all_strategies_restart_policies_and_roles_parse() {
    for (text, strategy) in [
        ("one_for_one", Strategy::OneForOne),
        ("one_for_all", Strategy::OneForAll),
        ("rest_for_one", Strategy::RestForOne),
    ] {
        let spec = ok(&swarm(&format!(
            "supervision:\n  strategy: {text}\nagents:\n  - {{ name: a, role: worker, model: echo }}\n"
        )));
        assert_eq!(spec.supervision.strategy, strategy);
    }
    for (text, policy) in [
        ("permanent", RestartPolicy::Permanent),
        ("transient", RestartPolicy::Transient),
        ("temporary", RestartPolicy::Temporary),
    ] {
        let spec = ok(&swarm(&format!(
            "agents:\n  - {{ name: a, role: worker, model: echo, restart: {text} }}\n"
        )));
        assert_eq!(spec.agents[0].restart, policy);
    }
    for role in Role::ALL {
        let spec = ok(&swarm(&format!(
            "agents:\n  - {{ name: a, role: {}, model: echo }}\n",
            role.as_str()
        )));
        assert_eq!(spec.agents[0].role, role);
    }
}

#[test]
fn agents_keep_yaml_order() {
    let spec = ok(&swarm(
        "defaults: { model: echo }
agents:
  - { name: zeta, role: worker }
  - { name: alpha, role: worker }
  - { name: mid, role: worker }
",
    ));
    let names: Vec<&str> = spec.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["zeta", "alpha", "mid"]);
}

#[test]
fn unknown_key_is_reported_at_its_position_with_a_suggestion() {
    let text = "swarm:
  name: test
supervision:
  strategi: one_for_all
agents:
  - { name: a, role: worker, model: echo }
models:
  echo: { provider: scripted, rules: [] }
";
    let error = one_error(text);
    assert_eq!((error.file.as_str(), error.line, error.column), ("swarm.yaml", 4, 3));
    assert_mentions(
        &error,
        &["unknown key `strategi`", "`supervision`", "did you mean `strategy`?"],
    );
    assert_eq!(
        error.to_string(),
        "swarm.yaml:4:3: unknown key `strategi` in `supervision`; did you mean `strategy`?"
    );
}

#[test]
fn unknown_key_without_a_close_match_lists_the_allowed_keys() {
    let error = one_error(&swarm(
        "agents:\n  - name: a\n    role: worker\n    model: echo\n    colour: blue\n",
    ));
    assert_mentions(&error, &["unknown key `colour`", "`agents.a`", "remove it", "`can_call`"]);
    let top = one_error(&swarm("agents: [{ name: a, role: worker, model: echo }]\nextra: 1\n"));
    assert_mentions(&top, &["unknown key `extra`", "the swarm file"]);
}

#[test]
fn several_problems_are_reported_at_once_with_their_lines() {
    let text = "swarm:
  name: test
supervision:
  strategy: one_for_none
  max_restarts: many
models:
  echo: { provider: scripted, rules: [] }
agents:
  - name: a
    role: wizard
    model: echo
";
    let errors = errors(text);
    let lines: Vec<(usize, usize)> = errors.iter().map(|e| (e.line, e.column)).collect();
    assert_eq!(lines, [(4, 13), (5, 17), (10, 11)], "{errors:#?}");
    assert_mentions(
        &errors[0],
        &["unknown strategy `one_for_none`", "`one_for_one`, `one_for_all`, `rest_for_one`"],
    );
    assert_mentions(&errors[1], &["`supervision.max_restarts` must be a whole number"]);
    assert_mentions(&errors[2], &["unknown role `wizard`", "`orchestrator`", "`dream`"]);
}

#[test]
fn the_display_of_all_errors_has_one_line_per_error() {
    let text = "swarm: { name: x }\nagents:\n  - { name: A, role: worker }\n  - { name: b }\n";
    let Err(errors) = parse(text, Path::new("s.yaml")) else { panic!("expected errors") };
    let rendered = errors.to_string();
    assert_eq!(rendered.lines().count(), errors.0.len());
    assert!(rendered.lines().all(|l| l.starts_with("s.yaml:")), "{rendered}");
}

#[test]
fn yaml_syntax_error_reports_line_and_column() {
    let error = one_error("swarm:\n  name: test\nagents: [a, b\nmore: 1\n");
    assert!(error.line >= 3, "{error}");
    assert!(error.column >= 1, "{error}");
    assert_mentions(&error, &["YAML syntax error"]);

    let bad_indent = one_error("swarm:\n  name: test\n   oops: 1\n");
    assert_eq!(bad_indent.line, 3, "{bad_indent}");
    assert_mentions(&bad_indent, &["YAML syntax error"]);
}

#[test]
fn empty_file_and_missing_sections_say_what_to_add() {
    assert_mentions(&one_error(""), &["empty", "`swarm:`", "`agents:`"]);
    let errors = errors("supervision: {}\n");
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_mentions(&errors[0], &["missing `swarm:`"]);
    assert_mentions(&errors[1], &["missing `agents:`"]);
    assert_mentions(&one_error(&swarm("agents: []\n")), &["`agents` is empty"]);
    assert_mentions(
        &one_error(
            "swarm: {}\nagents: [{ name: a, role: worker, model: m }]\nmodels: { m: { provider: scripted, rules: [] } }\n",
        ),
        &["`swarm.name` is missing"],
    );
}

#[test]
fn duplicate_agent_names_are_rejected_at_the_second_one() {
    let error = one_error(&swarm(
        "defaults: { model: echo }\nagents:\n  - name: a\n    role: worker\n  - name: a\n    role: worker\n",
    ));
    assert_mentions(&error, &["duplicate agent name `a`", "unique"]);
    assert_eq!(error.line, 13);
    assert_eq!(error.column, 11);
}

#[test]
fn invalid_agent_names_are_rejected_with_an_example() {
    let error = one_error(&swarm("agents:\n  - { name: Worker_1, role: worker, model: echo }\n"));
    assert_mentions(&error, &["invalid agent name `Worker_1`", "e.g. `worker-1`"]);
}

#[test]
fn a_swarm_name_follows_the_agents_rule_with_an_example() {
    let text = "swarm:\n  name: Bad_Name\nagents:\n  - { name: w, role: worker }\n";
    let error = one_error(text);
    assert_eq!(error.line, 2);
    assert_mentions(&error, &["`swarm.name` `Bad_Name` is not a valid name", "e.g. `bad-name`"]);
}

#[test]
fn an_openai_compatible_server_named_as_provider_gets_one_error_saying_what_to_write() {
    let text = "swarm:\n  name: t\nmodels:\n  mine:\n    provider: ollama\n    \
                base_url: http://localhost:11434/v1\n    model: qwen2.5\nagents:\n  \
                - { name: w, role: worker, model: mine }\n";
    let error = one_error(text);
    assert_eq!(error.line, 5);
    assert_mentions(
        &error,
        &["Ollama serves the OpenAI chat API", "`provider: openai`", "http://localhost:11434/v1"],
    );
    // Any other unknown provider: the list of providers, and still only that error.
    let error = one_error(&text.replace("ollama", "olama"));
    assert_mentions(&error, &["olama", "openai"]);
}

#[test]
fn missing_required_agent_keys_are_reported_at_the_agent() {
    let errors = errors(&swarm(
        "agents:\n  - description: nameless\n    role: worker\n    model: echo\n  - name: b\n",
    ));
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_mentions(&errors[0], &["no `name`"]);
    assert_eq!((errors[0].line, errors[0].column), (10, 5));
    assert_mentions(&errors[1], &["`agents.b` has no `role`", "`worker`"]);
}

#[test]
fn extensions_default_by_role_and_take_settings_in_order() {
    let spec = ok("swarm: { name: s }
agents:
  - { name: c, role: coordinator }
  - { name: w, role: worker }
  - { name: u, role: unconscious }
  - { name: o, role: observer }
  - { name: d, role: dream }
  - name: x
    role: worker
    extensions: [date_helper, {message_window: {max: 10}}, {worker_lifecycle: {timeout_ms: 500}}]
");
    let names = |a: usize| spec.agents[a].extensions.iter().map(|e| e.name()).collect::<Vec<_>>();
    let base = ["message_window", "message_compaction", "context_injector", "date_helper"];
    assert_eq!(names(0), [&base[..], &["worker_lifecycle", "idle_monitor"]].concat());
    assert_eq!(names(1), [&base[..], &["worker_lifecycle"]].concat());
    let memory = ["message_window", "date_helper", "memory_files"];
    assert_eq!(names(2), memory, "the unconscious recalls");
    assert_eq!(names(3), memory);
    assert_eq!(spec.agents[3].extensions[0], ExtensionSpec::MessageWindow { max: 0 }, "no history");
    assert_eq!(
        spec.agents[0].extensions[5],
        ExtensionSpec::IdleMonitor { after_secs: 1800, notify: vec!["d".into()] }
    );
    assert_eq!(
        spec.agents[3].extensions[2],
        ExtensionSpec::MemoryFiles { reflect_after: None, reflect_tokens: 1_500, reflection: None }
    );
    assert_eq!(
        spec.agents[5].extensions,
        [
            ExtensionSpec::DateHelper,
            ExtensionSpec::MessageWindow { max: 10 },
            ExtensionSpec::WorkerLifecycle {
                unconscious: Some("u".into()),
                observer: Some("o".into()),
                timeout_ms: 500
            },
        ]
    );
    // A restricted `can_call` still lets the pipeline reach its peers.
    let spec = ok("swarm: { name: s }
agents:
  - { name: c, role: coordinator, can_call: [w] }
  - { name: w, role: worker }
  - { name: u, role: unconscious }
  - { name: o, role: observer }
  - { name: d, role: dream }
");
    assert_eq!(spec.agents[0].can_call, ["w", "u", "o", "d"]);
    let error = one_error(
        "swarm: { name: s }\nagents:\n  - { name: a, role: worker, extensions: [message_windw] }\n",
    );
    assert_mentions(
        &error,
        &["unknown extension `message_windw`", "did you mean `message_window`"],
    );
    assert_eq!((error.line, error.column), (3, 43));
    // Reflection's trigger: a size, a count, or both.
    let spec = ok("swarm: { name: s }
agents:
  - name: o
    role: observer
    extensions: [{memory_files: {reflect_tokens: 3000, reflect_after: 40}}]
");
    assert_eq!(
        spec.agents[0].extensions[0],
        ExtensionSpec::MemoryFiles {
            reflect_after: Some(40),
            reflect_tokens: 3000,
            reflection: None
        }
    );
    let error = one_error(
        "swarm: { name: s }\nagents:\n  - { name: o, role: observer, extensions: [{memory_files: {reflect_tokens: 10}}] }\n",
    );
    assert_mentions(&error, &["reflect_tokens", "100"]);
    // An agent saved by an older version (its spec in the store, before `reflect_tokens`) reads.
    let old: ExtensionSpec =
        serde_json::from_str(r#"{"kind":"memory_files","reflect_after":20,"reflection":null}"#)
            .unwrap();
    assert_eq!(
        old,
        ExtensionSpec::MemoryFiles {
            reflect_after: Some(20),
            reflect_tokens: 1_500,
            reflection: None
        }
    );
}

#[test]
fn an_agent_without_a_model_gets_the_embedded_local_model() {
    let spec = ok("swarm: { name: s }\nagents:\n  - { name: a, role: worker }\n");
    assert_eq!(spec.agents[0].model, ModelSpec::Local(LocalModel::default()));
    assert_eq!(spec.local_model(), Ok(Some(LocalModel::default())));
}

#[test]
fn local_models_take_their_own_keys_and_must_share_one_process() {
    let spec = ok("swarm: { name: s }
models:
  small: { provider: local, threads: 1, ctx: 2048, max_tokens: 64, timeout_secs: 30 }
  other: { provider: local, threads: 2 }
agents:
  - { name: a, role: worker, model: small }
");
    let ModelSpec::Local(m) = &spec.agents[0].model else { panic!("local") };
    assert_eq!((m.threads, m.ctx, m.max_tokens, m.timeout_secs), (Some(1), 2048, 64, 30));
    let conflict = spec.local_model().expect_err("two processes would be needed");
    assert!(conflict.contains("one flock-model process"), "{conflict}");

    let error = one_error(
        "swarm: { name: s }\nmodels:\n  l: { provider: local, base_url: http://x }\nagents:\n  - { name: a, role: worker, model: l }\n",
    );
    assert_mentions(&error, &["`base_url` is not for `provider: local`", "`threads`"]);
}

#[test]
fn can_call_must_name_agents_of_the_swarm() {
    let error = one_error(&swarm(
        "defaults: { model: echo }
agents:
  - { name: boss, role: orchestrator, can_call: [worker-1, wroker-2] }
  - { name: worker-1, role: worker }
  - { name: worker-2, role: worker }
",
    ));
    assert_mentions(
        &error,
        &["`agents.boss.can_call` names unknown agent `wroker-2`", "did you mean `worker-2`?"],
    );
    assert_eq!((error.line, error.column), (11, 60));
}

#[test]
fn can_call_may_name_an_agent_defined_later() {
    let spec = ok(&swarm(
        "defaults: { model: echo }\nagents:\n  - { name: a, role: worker, can_call: [b] }\n  - { name: b, role: worker }\n",
    ));
    assert_eq!(spec.agents[0].can_call, ["b"]);
}

#[test]
fn an_undefined_model_is_reported_where_it_is_named() {
    let error = one_error(&swarm("agents:\n  - { name: a, role: worker, model: ech }\n"));
    assert_mentions(&error, &["model `ech` is not defined", "did you mean `echo`?"]);
    assert_eq!((error.line, error.column), (10, 37));

    // A bad `defaults.model` is reported once, not again for each agent that relies on it.
    let errors = errors(&swarm(
        "defaults: { model: nope }\nagents:\n  - { name: a, role: worker }\n  - { name: b, role: worker }\n",
    ));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_mentions(&errors[0], &["`defaults.model`: model `nope` is not defined"]);
}

#[test]
fn wrong_types_say_what_was_found() {
    let errors = errors(&swarm(
        "supervision:
  max_seconds: \"60\"
  escalate: yes
  heartbeat_interval_ms: 5
delivery:
  max_frame_bytes: 2.5
agents: [{ name: a, role: worker, model: echo }]
",
    ));
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert_mentions(&errors[0], &["must be a number", "remove the quotes"]);
    assert_mentions(&errors[1], &["must be `true` or `false`", "\"yes\""]);
    assert_mentions(
        &errors[2],
        &["`supervision.heartbeat_interval_ms` must be at least 10, got 5"],
    );
    assert_mentions(&errors[3], &["whole number"]);
    // `agents` given as a mapping instead of a list.
    let agents = one_error(&swarm("agents: { name: a }\n"));
    assert_mentions(&agents, &["`agents` must be a list", "found a mapping"]);
}

#[test]
fn env_keys_must_be_shell_names_and_not_flock_ones() {
    let errors = errors(&swarm(
        "agents:
  - name: a
    role: worker
    model: echo
    env:
      good_name: 1
      FLOCK_HOME: /tmp
      OK: fine
      EMPTY:
",
    ));
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_mentions(&errors[0], &["`good_name` is not a valid variable name", "`GOOD_NAME`"]);
    assert_eq!((errors[0].line, errors[0].column), (14, 7));
    assert_mentions(&errors[1], &["`FLOCK_HOME` is reserved"]);
    assert_mentions(&errors[2], &["`agents.a.env.EMPTY` has no value"]);
}

#[test]
fn relative_command_paths_resolve_against_the_swarm_folder() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let origin = dir.path().join("swarm.yaml");
    let text = swarm(
        "defaults: { model: echo }
agents:
  - { name: a, role: worker, command: [./bin/agent, --flag, ./not-a-program] }
  - { name: b, role: worker, command: [python3, run.py] }
  - { name: c, role: worker, command: [/bin/sh, -c, exit 3] }
",
    );
    let spec = parse(&text, &origin).unwrap_or_else(|e| panic!("{e}"));
    let program = dir.path().join("bin/agent");
    let command = |i: usize| spec.agents[i].command.clone().unwrap_or_default();
    assert_eq!(Path::new(&command(0)[0]), program);
    assert_eq!(command(0)[1..], ["--flag", "./not-a-program"]);
    assert_eq!(command(1), ["python3", "run.py"]);
    assert_eq!(command(2), ["/bin/sh", "-c", "exit 3"]);

    let error =
        one_error(&swarm("agents: [{ name: a, role: worker, model: echo, command: [] }]\n"));
    assert_mentions(&error, &["`agents.a.command` is empty"]);
    let error =
        one_error(&swarm("agents: [{ name: a, role: worker, model: echo, command: run.sh }]\n"));
    assert_mentions(&error, &["`agents.a.command` must be a list"]);
}

#[test]
fn inline_rules_become_a_transcript_with_json_arguments_in_file_order() {
    let spec = ok("swarm: { name: t }
models:
  m:
    provider: scripted
    rules:
      - match: ping
        reply: pong {input}
      - equals: exact
        steps:
          - tool: agents__request
            args: { to: b, text: \"do {input}\", timeout_ms: 500, extra: [1, true, null, 2.5] }
          - delay_ms: 20
          - tool: agents__list
      - match: \"*\"
agents:
  - { name: a, role: worker, model: m }
  - { name: b, role: worker, model: m }
");
    let ModelSpec::Scripted(Transcript { rules }) = &spec.agents[0].model else {
        panic!("scripted")
    };
    assert_eq!(rules.len(), 3);
    assert_eq!(rules[0].matcher, Matcher::Contains("ping".to_owned()));
    assert_eq!(rules[0].reply, "pong {input}");
    assert!(rules[0].steps.is_empty());
    assert_eq!(rules[1].matcher, Matcher::Equals("exact".to_owned()));
    assert_eq!(rules[1].reply, "");
    assert_eq!(
        rules[1].steps,
        [
            ScriptStep::Tool {
                name: "agents__request".to_owned(),
                arguments:
                    r#"{"to":"b","text":"do {input}","timeout_ms":500,"extra":[1,true,null,2.5]}"#
                        .to_owned(),
            },
            ScriptStep::DelayMs(20),
            ScriptStep::Tool { name: "agents__list".to_owned(), arguments: "{}".to_owned() },
        ]
    );
    assert_eq!(rules[2].matcher, Matcher::Any);
}

#[test]
fn transcript_rule_problems_are_all_reported() {
    let errors = errors(
        "swarm: { name: t }
models:
  m:
    provider: scripted
    rules:
      - match: a
        equals: b
      - steps:
          - tool: agents__sned
          - { tool: agents__list, delay_ms: 5 }
          - {}
          - tool: agents__send
            args: { to: ghost, text: 5 }
          - tool: agents__request
            args: { text: hi }
          - tool: agents__send
agents:
  - { name: a, role: worker, model: m }
",
    );
    let found: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.message.as_str())).collect();
    assert_eq!(errors.len(), 8, "{found:#?}");
    assert_mentions(&errors[0], &["both `match` and `equals`"]);
    assert_mentions(&errors[1], &["unknown tool `agents__sned`", "did you mean `agents__send`?"]);
    assert_mentions(&errors[2], &["both `tool` and `delay_ms`"]);
    assert_mentions(&errors[3], &["does nothing"]);
    assert_mentions(&errors[4], &["names unknown agent `ghost`", "agents in this swarm: `a`"]);
    assert_mentions(&errors[5], &["`models.m.rules[1].steps[3].args.text` must be text", "quotes"]);
    assert_mentions(&errors[6], &["is missing `to`"]);
    assert_mentions(&errors[7], &["`agents__send` needs `args` with `to` and `text`"]);
    let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [7, 9, 10, 11, 13, 13, 15, 16]);
}

#[test]
fn model_definitions_are_checked() {
    let errors = errors(
        "swarm: { name: t }
models:
  a: { provider: llamafile, rules: [] }
  b: { provider: scripted }
  c: { provider: scripted, rules: [], transcript: x.yaml }
  d: { rules: [] }
agents:
  - { name: x, role: worker, model: a }
",
    );
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert_mentions(&errors[0], &["unknown model provider `llamafile`", "`scripted`", "`openai`"]);
    assert_mentions(&errors[1], &["model `b` has no rules"]);
    assert_mentions(&errors[2], &["both `transcript` and `rules`"]);
    assert_mentions(&errors[3], &["model `d` has no `provider`"]);
}

#[test]
fn transcript_file_errors_are_reported_in_the_transcript_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let transcripts = dir.path().join("transcripts");
    std::fs::create_dir(&transcripts).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(
        transcripts.join("bad.yaml"),
        "rules:\n  - match: x\n    replay: oops\n    steps:\n      - tool: agents__send\n        args: { to: nobody, text: hi }\n",
    )
    .unwrap_or_else(|e| panic!("write: {e}"));
    let origin = dir.path().join("swarm.yaml");
    let text = "swarm: { name: t }
models:
  m1: { provider: scripted, transcript: transcripts/bad.yaml }
  m2: { provider: scripted, transcript: transcripts/bad.yaml }
  m3: { provider: scripted, transcript: transcripts/missing.yaml }
agents:
  - { name: a, role: worker, model: m1 }
";
    let errors = errors_at(text, &origin);
    let swarm_file = origin.display().to_string();
    let transcript_file = transcripts.join("bad.yaml").display().to_string();
    // The file shared by m1 and m2 is read once, so its problems are listed once.
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_eq!(
        (errors[0].file.as_str(), errors[0].line, errors[0].column),
        (swarm_file.as_str(), 5, 41)
    );
    assert_mentions(
        &errors[0],
        &["cannot read transcript", "missing.yaml", "relative to the swarm file's folder"],
    );
    assert_eq!(
        (errors[1].file.as_str(), errors[1].line, errors[1].column),
        (transcript_file.as_str(), 3, 5)
    );
    assert_mentions(&errors[1], &["unknown key `replay`", "did you mean `reply`?"]);
    assert_eq!((errors[2].file.as_str(), errors[2].line), (transcript_file.as_str(), 6));
    assert_mentions(&errors[2], &["unknown agent `nobody`"]);
}

#[test]
fn transcript_file_syntax_error_names_the_transcript() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    std::fs::write(dir.path().join("t.yaml"), "rules:\n  - reply: [unclosed\n")
        .unwrap_or_else(|e| panic!("write: {e}"));
    let origin = dir.path().join("swarm.yaml");
    let text = "swarm: { name: t }\nmodels: { m: { provider: scripted, transcript: t.yaml } }\nagents: [{ name: a, role: worker, model: m }]\n";
    let errors = errors_at(text, &origin);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].file.ends_with("t.yaml"), "{errors:#?}");
    assert_mentions(&errors[0], &["YAML syntax error"]);
}

#[test]
fn templated_targets_are_not_checked_until_run_time() {
    ok("swarm: { name: t }
models:
  m:
    provider: scripted
    rules:
      - steps: [ { tool: agents__send, args: { to: \"{from}\", text: \"back at you\" } } ]
agents: [{ name: a, role: worker, model: m }]
");
}

#[test]
fn load_reports_an_unreadable_file_at_line_zero() {
    let Err(errors) = load(Path::new("/nonexistent/flock/swarm.yaml")) else { panic!("loaded?") };
    assert_eq!(errors.0.len(), 1);
    let error = &errors.0[0];
    assert_eq!(
        (error.file.as_str(), error.line, error.column),
        ("/nonexistent/flock/swarm.yaml", 0, 0)
    );
    assert_mentions(error, &["cannot read the swarm file"]);
}

#[test]
fn shipped_examples_validate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    let mut checked = Vec::new();
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("read_dir: {e}")).path();
        if path.extension().is_some_and(|ext| ext == "yaml") {
            let spec = load(&path)
                .unwrap_or_else(|errors| panic!("{} is invalid:\n{errors}", path.display()));
            assert!(!spec.agents.is_empty());
            checked.push(spec.name);
        }
    }
    checked.sort();
    assert!(checked.len() >= 2, "{checked:?}");
    assert!(
        checked.contains(&"office".to_owned()) && checked.contains(&"brain-persona".to_owned())
    );
}

#[test]
fn office_example_dispatches_builds_from_the_orchestrator() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/office.yaml");
    let spec = load(&path).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = spec.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["orchestrator", "sysadmin", "worker-1", "worker-2"]);
    let Some(orchestrator) = spec.agent("orchestrator") else { panic!("no orchestrator") };
    let ModelSpec::Scripted(transcript) = &orchestrator.model else { panic!("scripted") };
    let Some(rule) = transcript.rule_for("build the login page") else { panic!("no build rule") };
    assert_eq!(rule.reply, "orchestrator: job dispatched");
    assert!(matches!(&rule.steps[0], ScriptStep::Tool { name, .. } if name == "agents__request"));
    // Workers answer without calling anyone, so a job cannot loop.
    let Some(worker) = spec.agent("worker-1") else { panic!("no worker-1") };
    let ModelSpec::Scripted(transcript) = &worker.model else { panic!("scripted") };
    let calls = transcript.rules.iter().flat_map(|r| &r.steps);
    assert!(calls.clone().all(|s| !matches!(s, ScriptStep::Tool { .. })));
    assert_eq!(
        transcript.rule_for("build: x").map(|r| r.reply.as_str()),
        Some("worker done: {input}")
    );
}

#[test]
fn remote_models_parse_with_defaults_and_name_only_the_key_variable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swarm.yaml");
    std::fs::write(
        &path,
        "swarm: {name: s}\nmodels:\n  gpt: {provider: openai, model: gpt-4o-mini, api_key_env: OPENAI_API_KEY}\n  local: {provider: openai, base_url: 'http://127.0.0.1:11434/v1', model: qwen2.5}\n  claude: {provider: anthropic, model: claude-x, api_key_env: ANTHROPIC_API_KEY, retry_base_ms: 10}\nagents:\n  - {name: a, role: worker, model: gpt}\n  - {name: b, role: worker, model: local}\n  - {name: c, role: worker, model: claude}\n",
    )
    .unwrap();
    let spec = flock_config::load(&path).unwrap();
    let ModelSpec::OpenAi(gpt) = &spec.agents[0].model else { panic!("openai") };
    assert_eq!(gpt.base_url, "https://api.openai.com/v1");
    assert_eq!(gpt.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
    assert_eq!((gpt.timeout_secs, gpt.max_tokens, gpt.retry_base_ms), (60, 1024, 2000));
    let ModelSpec::OpenAi(local) = &spec.agents[1].model else { panic!("openai") };
    assert_eq!(local.api_key_env, None);
    let ModelSpec::Anthropic(claude) = &spec.agents[2].model else { panic!("anthropic") };
    assert_eq!((claude.base_url.as_str(), claude.retry_base_ms), ("https://api.anthropic.com", 10));
}

#[test]
fn remote_model_mistakes_are_reported_with_positions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swarm.yaml");
    std::fs::write(
        &path,
        "swarm: {name: s}\nmodels:\n  a: {provider: anthropic, model: m}\n  b: {provider: openai, base_url: ftp://x}\n  c: {provider: scripted, rules: [{reply: x}], model: m}\nagents:\n  - {name: w, role: worker, model: a}\n",
    )
    .unwrap();
    let err = flock_config::load(&path).unwrap_err().to_string();
    assert!(err.contains("needs `api_key_env: ANTHROPIC_API_KEY`"), "{err}");
    assert!(err.contains("has no `model:`"), "{err}");
    assert!(err.contains("must start with http:// or https://"), "{err}");
    assert!(err.contains("`model` is for `provider: openai` or `anthropic` models"), "{err}");
}

/// scripts/setup fetches exactly the models flock-config knows (name, file, size, hash).
#[test]
fn the_setup_script_pins_every_known_local_model() {
    let setup = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup"),
    )
    .unwrap();
    for m in flock_config::KNOWN_LOCAL_MODELS {
        let line = format!("fetch {} {} \\\n    {} {}", m.name, m.file, m.sha256, m.bytes);
        assert!(setup.contains(&line), "scripts/setup does not fetch {m:?} as {line:?}");
    }
    let default = &flock_config::KNOWN_LOCAL_MODELS[0];
    assert!(
        setup.contains(&format!("want={}", default.name)),
        "setup's default is {}",
        default.name
    );
}

#[test]
fn reserved_agent_names_are_refused() {
    for name in ["operator", "supervisor", "router", "human", "system"] {
        let e = one_error(&swarm(&format!(
            "agents:\n  - {{ name: {name}, role: worker, model: echo }}\n"
        )));
        assert_mentions(&e, &[name, "reserved"]);
        assert_eq!(e.line, 10, "{e:?}");
    }
}

#[test]
fn a_relative_workspace_may_not_climb_out_of_the_state_dir() {
    let e = one_error(&swarm(
        "agents:\n  - { name: w, role: worker, model: echo, workspace: ../../.. }\n",
    ));
    assert_mentions(&e, &["../../..", "workspaces/", "absolute"]);
    let spec =
        ok(&swarm("agents:\n  - { name: w, role: worker, model: echo, workspace: /srv/w }\n"));
    assert_eq!(spec.agents[0].workspace.as_deref(), Some(Path::new("/srv/w")));
    let spec =
        ok(&swarm("agents:\n  - { name: w, role: worker, model: echo, workspace: team/a }\n"));
    assert_eq!(spec.agents[0].workspace.as_deref(), Some(Path::new("team/a")));
}

#[test]
fn oversized_fields_are_refused_where_they_are_written() {
    let long = "d".repeat(flock_config::MAX_DESCRIPTION_BYTES + 1);
    let e = one_error(&swarm(&format!(
        "agents:\n  - {{ name: w, role: worker, model: echo, description: {long} }}\n"
    )));
    assert_mentions(&e, &["`agents.w.description`", "2049 bytes long", "at most 2048"]);
    assert_eq!(e.line, 10, "{e:?}");
    let fits = "d".repeat(flock_config::MAX_DESCRIPTION_BYTES);
    ok(&swarm(&format!(
        "agents:\n  - {{ name: w, role: worker, model: echo, description: {fits} }}\n"
    )));

    // Any other text field has the general bound.
    let huge = "a".repeat(flock_config::MAX_FIELD_BYTES + 1);
    let e = one_error(&swarm(&format!(
        "agents:\n  - {{ name: w, role: worker, model: echo, archetype: {huge} }}\n"
    )));
    assert_mentions(&e, &["archetype", "65537 bytes long", "at most 65536"]);
}

#[test]
fn journal_context_takes_how_many_events_to_show() {
    let spec = ok(&swarm(
        "agents:\n  - { name: w, role: worker, model: echo, extensions: [{journal_context: {last: 5}}] }\n  - { name: v, role: worker, model: echo, extensions: [journal_context] }\n",
    ));
    assert_eq!(spec.agents[0].extensions[0], ExtensionSpec::JournalContext { last: 5 });
    assert_eq!(spec.agents[1].extensions[0], ExtensionSpec::JournalContext { last: 10 });
    let e = one_error(&swarm(
        "agents:\n  - { name: w, role: worker, model: echo, extensions: [{journal_context: {last: 0}}] }\n",
    ));
    assert_mentions(&e, &["journal_context.last"]);
}

#[test]
fn the_swarms_own_masking_rules_are_checked_where_they_are_written() {
    let spec = ok(&swarm(
        "memory:\n  mask:\n    - { name: employee_id, pattern: \"EMP-[0-9]{6}\" }\nagents:\n  - { name: w, role: worker, model: echo }\n",
    ));
    assert_eq!(spec.mask.len(), 1);
    assert_eq!(
        (spec.mask[0].name.as_str(), spec.mask[0].pattern.as_str()),
        ("employee_id", "EMP-[0-9]{6}")
    );
    let errors = errors(&swarm(
        "memory:\n  mask:\n    - { name: a, pattern: \"(\" }\n    - { name: b, pattern: \"x*\" }\n    - { name: Bad-Name, pattern: \"y\" }\n    - { pattern: \"z\" }\nagents:\n  - { name: w, role: worker, model: echo }\n",
    ));
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert_mentions(&errors[0], &["memory.mask[0].pattern", "not a valid regular expression"]);
    assert_mentions(&errors[1], &["memory.mask[1].pattern", "matches the empty string"]);
    assert_mentions(&errors[2], &["memory.mask[2].name", "Bad-Name"]);
    assert_mentions(&errors[3], &["memory.mask[3]", "needs `name` and `pattern`"]);
}

#[test]
fn memory_tiers_take_their_ages_and_refuse_a_cold_age_below_the_warm_one() {
    let agents = "agents:\n  - { name: w, role: worker, model: echo }\n";
    let spec = ok(&swarm(agents));
    assert_eq!((spec.tiers.warm_after_days, spec.tiers.cold_after_days), (90, 365));
    let spec = ok(&swarm(&format!(
        "memory:\n  tiers: {{ warm_after_days: 30, cold_after_days: 180 }}\n{agents}"
    )));
    assert_eq!((spec.tiers.warm_after_days, spec.tiers.cold_after_days), (30, 180));
    let e = one_error(&swarm(&format!("memory:\n  tiers: {{ warm_after_days: 400 }}\n{agents}")));
    assert_mentions(&e, &["cold_after_days", "(365)", "more than", "(400)"]);
    let e = one_error(&swarm(&format!("memory:\n  tiers: {{ hot_days: 3 }}\n{agents}")));
    assert_mentions(&e, &["hot_days", "memory.tiers"]);
    let e = one_error(&swarm(&format!("memory:\n  tiers: {{ warm_after_days: 0 }}\n{agents}")));
    assert_mentions(&e, &["memory.tiers.warm_after_days"]);
}

#[test]
fn a_coordinator_may_route_every_request_and_only_a_coordinator() {
    let spec = ok(&swarm(
        "agents:\n  - { name: c, role: coordinator, model: echo, can_call: [w], delegate: always }\n  - { name: w, role: worker, model: echo }\n",
    ));
    assert_eq!(spec.agents[0].delegate, flock_config::Delegate::Always);
    assert_eq!(spec.agents[1].delegate, flock_config::Delegate::WhenNeeded, "the default");
    let e = one_error(&swarm(
        "agents:\n  - { name: w, role: worker, model: echo, delegate: always }\n",
    ));
    assert_mentions(&e, &["agents.w.delegate: always", "role: coordinator"]);
    let e = one_error(&swarm(
        "agents:\n  - { name: c, role: coordinator, model: echo, delegate: sometimes }\n",
    ));
    assert_mentions(&e, &["sometimes", "when-needed", "always"]);
}

#[test]
fn agents_are_placed_on_hosts_of_a_cluster_and_each_host_runs_its_own() {
    let spec = ok(&swarm(
        "cluster:\n  nats: nats://10.0.0.1:4222\n  credentials_file: host.creds\nagents:\n  \
         - { name: coordinator, role: coordinator, model: echo }\n  \
         - { name: worker, role: worker, model: echo, host: gpu-1 }\n",
    ));
    let cluster = spec.cluster.as_ref().expect("a cluster");
    assert_eq!(cluster.nats, "nats://10.0.0.1:4222");
    assert_eq!(cluster.leader, "main", "the default leader");
    assert_eq!(cluster.secret_env, "FLOCK_CLUSTER_SECRET", "the default secret variable");
    let creds = cluster.credentials_file.as_ref().expect("a credentials file");
    assert!(creds.is_absolute() && creds.ends_with("host.creds"), "{}", creds.display());
    assert_eq!(spec.hosts(), ["main", "gpu-1"]);
    let gpu = spec.for_host("gpu-1").unwrap();
    assert_eq!(gpu.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["worker"]);
    let main = spec.for_host("main").unwrap();
    assert_eq!(main.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["coordinator"]);
    let err = spec.for_host("gpu-2").unwrap_err();
    assert!(err.contains("no agent on host `gpu-2`") && err.contains("main, gpu-1"), "{err}");
    // Without a cluster every agent runs on the one host.
    let single = ok(&swarm("agents:\n  - { name: solo, role: worker, model: echo }\n"));
    assert_eq!((single.cluster.is_none(), single.hosts()), (true, vec!["main".to_owned()]));
}

#[test]
fn a_host_without_a_cluster_or_a_bad_cluster_is_refused_where_it_is_written() {
    let e = one_error(&swarm(
        "agents:\n  - { name: solo, role: worker, model: echo }\n  - { name: far, role: worker, model: echo, host: gpu }\n",
    ));
    assert_eq!((e.line, e.column), (11, 51), "{e}");
    assert_mentions(&e, &["host: gpu", "no `cluster:`", "nats://"]);
    let e = one_error(&swarm(
        "cluster: { nats: \"http://10.0.0.1:4222\" }\nagents:\n  - { name: solo, role: worker, model: echo }\n",
    ));
    assert_mentions(&e, &["cluster.nats", "(http)", "nats://HOST:4222"]);
    let e = one_error(&swarm(
        "cluster: { nats: \"http://u:hunter2@10.0.0.1:4222\" }\nagents:\n  - { name: solo, role: worker, model: echo }\n",
    ));
    assert!(!e.message.contains("hunter2"), "a password in the address is not repeated: {e}");
    let e = one_error(&swarm(
        "cluster: { nats: \"nats://a:4222\", leadr: x }\nagents:\n  - { name: solo, role: worker, model: echo }\n",
    ));
    assert_mentions(&e, &["leadr", "leader"]);
    let e = one_error(&swarm(
        "cluster: { nats: \"nats://a:4222\" }\nagents:\n  - { name: solo, role: worker, model: echo, host: GPU_1 }\n",
    ));
    assert_mentions(&e, &["GPU_1", "valid host name", "gpu-1"]);
    let e = one_error(&swarm(
        "cluster: { leader: main }\nagents:\n  - { name: solo, role: worker, model: echo }\n",
    ));
    assert_mentions(&e, &["no `nats`"]);
    // A secret pasted where its variable's name goes is refused without being repeated.
    let e = one_error(&swarm(
        "cluster: { nats: \"nats://a:4222\", secret_env: \"hunter2-xyz\" }\nagents:\n  - { name: solo, role: worker, model: echo }\n",
    ));
    assert_mentions(&e, &["secret_env", "NAME an environment variable"]);
    assert!(!e.message.contains("hunter2"), "{}", e.message);
}

#[test]
fn a_host_may_fail_over_only_when_the_file_says_so_never_the_leader_nor_too_soon() {
    let agents = "agents:\n  - { name: solo, role: worker, model: echo }\n  \
                  - { name: far, role: worker, model: echo, host: gpu }\n";
    let spec = ok(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", failover: {{ gpu: 30 }} }}\n{agents}"
    )));
    assert_eq!(spec.failover_after("gpu"), Some(std::time::Duration::from_secs(30)));
    assert_eq!(spec.failover_after("main"), None, "only the hosts the file names");
    let e = one_error(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", failover: {{ main: 30 }} }}\n{agents}"
    )));
    assert_mentions(&e, &["cluster.failover", "`main`, the leader", "channels"]);
    let e = one_error(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", failover: {{ gpu: 5 }} }}\n{agents}"
    )));
    assert_mentions(&e, &["cluster.failover.gpu", "at least 15"]);
    let e = one_error(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", failover: {{ gpu-2: 30 }} }}\n{agents}"
    )));
    assert_mentions(&e, &["`gpu-2`", "places no agent on", "main, gpu"]);
}

#[test]
fn only_the_hosts_cluster_operators_lists_drive_other_hosts_agents_the_leader_by_default() {
    let agents = "agents:\n  - { name: solo, role: worker, model: echo }\n  \
                  - { name: far, role: worker, model: echo, host: gpu }\n";
    let spec = ok(&swarm(&format!("cluster: {{ nats: \"nats://a:4222\" }}\n{agents}")));
    assert!(spec.may_operate("main"), "the leader, by default");
    assert!(!spec.may_operate("gpu"), "only the leader, by default");
    let spec = ok(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", operators: [gpu, main, gpu] }}\n{agents}"
    )));
    assert!(spec.may_operate("main") && spec.may_operate("gpu"));
    assert_eq!(spec.cluster.as_ref().map(|c| c.operators.len()), Some(2), "listed once");
    let spec =
        ok(&swarm(&format!("cluster: {{ nats: \"nats://a:4222\", operators: [gpu] }}\n{agents}")));
    assert!(!spec.may_operate("main"), "a list replaces the default");
    assert!(
        !ok(&swarm("agents:\n  - { name: solo, role: worker, model: echo }\n")).may_operate("main")
    );
    let e = one_error(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", operators: [cpu] }}\n{agents}"
    )));
    assert_mentions(&e, &["cluster.operators", "`cpu`", "places no agent on", "main, gpu"]);
    let e = one_error(&swarm(&format!(
        "cluster: {{ nats: \"nats://a:4222\", operators: main }}\n{agents}"
    )));
    assert_mentions(&e, &["cluster.operators", "must be a list"]);
}

#[test]
fn an_agent_is_found_by_its_address_with_or_without_an_instance() {
    let spec = ok(&swarm("agents:\n  - { name: worker, role: worker }\n"));
    let declared = spec.agents[0].clone();
    assert!(declared.has_key("worker"));
    assert!(!declared.has_key("worker@a") && !declared.has_key("work") && !declared.has_key(""));
    let instance = flock_config::AgentSpec { instance: Some("a".into()), ..declared };
    assert_eq!(instance.key(), "worker@a");
    assert!(instance.has_key("worker@a"));
    for other in ["worker", "worker@b", "worker@", "other@a", "worker@a@a"] {
        assert!(!instance.has_key(other), "{other}");
    }
}

#[test]
fn a_swarm_searches_memory_with_a_memory_role_or_a_memory_tool_only() {
    // `validate --needs` prints `vectors` for such a swarm, so scripts/up builds search by meaning.
    let worker = "agents:\n  - { name: w, role: worker }\n";
    assert!(!ok(&swarm(worker)).searches_memory(), "a worker with its default tools");
    let tool = "agents:\n  - { name: w, role: worker, tools: [fs_read, memory_search] }\n";
    assert!(ok(&swarm(tool)).searches_memory(), "a worker offered memory_search");
    let role = "agents:\n  - { name: w, role: worker }\n  - { name: u, role: unconscious }\n";
    assert!(ok(&swarm(role)).searches_memory(), "the unconscious recalls by searching");
}
