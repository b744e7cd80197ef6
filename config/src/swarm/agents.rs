//! `defaults:` and `agents:`: each agent's keys, its name, role, tools, `can_call`, environment,
//! command and workspace, checked against each other (no two workspaces nested, every target
//! declared).

use super::*;

impl Loader<'_> {
    pub(super) fn defaults(&mut self, node: Option<&Node>) -> Defaults {
        let mut defaults = Defaults {
            model: None,
            restart: RestartPolicy::Permanent,
            stop_timeout_secs: 10,
            ready_timeout_secs: 10,
        };
        let Some(node) = node.filter(|n| !n.is_null()) else {
            return defaults;
        };
        let Some(entries) = self.report.mapping(node, "defaults") else {
            return defaults;
        };
        self.report.unknown_keys(entries, DEFAULTS_KEYS, "`defaults`");
        if let Some((_, v)) = lookup(entries, "model")
            && let Some(name) = self.report.string(v, "defaults.model")
        {
            let spec = self.model_ref(&name, v, "defaults.model");
            defaults.model = Some((name, spec));
        }
        if let Some((_, v)) = lookup(entries, "restart")
            && let Some(policy) =
                self.report.choice(v, "defaults.restart", "restart policy", RESTART_POLICIES)
        {
            defaults.restart = policy;
        }
        if let Some((_, v)) = lookup(entries, "stop_timeout_secs")
            && let Some(n) = self.report.uint(v, "defaults.stop_timeout_secs", 0, U64_MAX)
        {
            defaults.stop_timeout_secs = n;
        }
        if let Some((_, v)) = lookup(entries, "ready_timeout_secs")
            && let Some(n) = self.report.uint(v, "defaults.ready_timeout_secs", 1, U64_MAX)
        {
            defaults.ready_timeout_secs = n;
        }
        defaults
    }

    pub(super) fn agents(
        &mut self,
        entry: Option<(&Node, &Node)>,
        defaults: &Defaults,
    ) -> Vec<AgentSpec> {
        let Some((key, node)) = entry else {
            self.report.error(
                Pos::START,
                "missing `agents:` list; add one with at least one agent \
                 (`- name: worker-1` and `role: worker`)",
            );
            return Vec::new();
        };
        if node.is_null() {
            self.report.error(key.pos, AGENTS_EMPTY);
            return Vec::new();
        }
        let Some(items) = self.report.list(node, "agents") else {
            return Vec::new();
        };
        if items.is_empty() {
            self.report.error(node.pos, AGENTS_EMPTY);
            return Vec::new();
        }

        // First pass: names, so `can_call` may name agents defined further down.
        let names: Vec<Option<String>> =
            items.iter().enumerate().map(|(i, item)| self.agent_name(item, i)).collect();
        let mut first_seen: HashMap<&str, Pos> = HashMap::new();
        for (item, name) in items.iter().zip(&names) {
            let Some(name) = name else { continue };
            let pos = name_pos(item);
            if let Some(first) = first_seen.get(name.as_str()) {
                self.report.error(
                    pos,
                    format!(
                        "duplicate agent name `{name}` (first at line {}); agent names must be \
                         unique: rename one of them",
                        first.line
                    ),
                );
            } else {
                first_seen.insert(name, pos);
            }
        }
        let known: Vec<&str> = names.iter().flatten().map(String::as_str).collect();
        self.agent_names = known.iter().map(|n| (*n).to_owned()).collect();
        // Names with their roles, for extensions' default peers (roles are reported by `agent`).
        let peers: Vec<(String, Role)> = items
            .iter()
            .zip(&names)
            .filter_map(|(item, name)| {
                let role = lookup(item.entries()?, "role")?.1.text()?;
                let role = roles().into_iter().find(|(n, _)| *n == role)?.1;
                Some((name.clone()?, role))
            })
            .collect();

        let mut agents = Vec::new();
        for (i, (item, name)) in items.iter().zip(&names).enumerate() {
            if let Some(agent) = self.agent(item, i, name.as_deref(), &known, &peers, defaults) {
                agents.push(agent);
            }
        }
        self.check_workspaces(items, &agents);
        agents
    }

    /// No agent's workspace may hold another agent's (it could read and change its files): a
    /// relative workspace (under the state dir's workspaces/, the default being the agent's
    /// name) may equal another's — a shared one — but not contain it.
    pub(super) fn check_workspaces(&mut self, items: &[Node], agents: &[AgentSpec]) {
        let relative = |a: &AgentSpec| match &a.workspace {
            Some(p) if p.is_absolute() => None,
            Some(p) => Some(p.components().collect::<PathBuf>()),
            None => Some(PathBuf::from(a.key())),
        };
        for a in agents {
            let Some(outer) = relative(a) else { continue };
            for b in agents.iter().filter(|b| b.name != a.name) {
                let Some(inner) = relative(b) else { continue };
                if inner != outer && inner.starts_with(&outer) {
                    let pos = items
                        .iter()
                        .find(|item| {
                            item.entries()
                                .and_then(|e| lookup(e, "name"))
                                .and_then(|(_, v)| v.text())
                                == Some(a.name.as_str())
                        })
                        .and_then(|item| item.entries().and_then(|e| lookup(e, "workspace")))
                        .map_or(Pos::START, |(_, v)| v.pos);
                    self.report.error(
                        pos,
                        format!(
                            "agent `{}`'s workspace `{}` holds agent `{}`'s (`{}`): it could read \
                             and change that agent's files; give each agent a folder of its own",
                            a.name,
                            outer.display(),
                            b.name,
                            inner.display()
                        ),
                    );
                }
            }
        }
    }

    /// The agent's `name`, if it is present and valid (otherwise reported).
    pub(super) fn agent_name(&mut self, item: &Node, index: usize) -> Option<String> {
        // A non-mapping item is reported by `agent`; here it just has no name.
        let entries = item.entries()?;
        let Some((_, value)) = lookup(entries, "name") else {
            self.report.error(
                item.pos,
                "this agent has no `name`; add `name: worker-1` (lowercase letters, digits, `-`)",
            );
            return None;
        };
        let name = self.report.string(value, &format!("agents[{index}].name"))?;
        if !valid_agent_name(&name) {
            self.report.error(
                value.pos,
                format!(
                    "invalid agent name `{name}`; use 1 to 63 lowercase letters, digits and `-`, \
                     starting with a letter or digit (e.g. `{}`)",
                    suggest_name(&name)
                ),
            );
            return None;
        }
        if crate::reserved_agent_name(&name) {
            self.report.error(
                value.pos,
                format!(
                    "`{name}` is reserved: Flock uses it for itself (the operator, the supervisor \
                     and its actors, people); choose another name, e.g. `{name}-agent`"
                ),
            );
            return None;
        }
        Some(name)
    }

    pub(super) fn agent(
        &mut self,
        item: &Node,
        index: usize,
        name: Option<&str>,
        known: &[&str],
        peers: &[(String, Role)],
        defaults: &Defaults,
    ) -> Option<AgentSpec> {
        let path = match name {
            Some(name) => format!("agents.{name}"),
            None => format!("agents[{index}]"),
        };
        let entries = self.report.mapping(item, &path)?;
        let r = &mut self.report;
        r.unknown_keys(entries, AGENT_KEYS, &format!("`{path}`"));
        let field = |key: &str| lookup(entries, key).map(|(_, v)| (v, format!("{path}.{key}")));

        let role = match field("role") {
            Some((v, what)) => r.choice(v, &what, "role", &roles()),
            None => {
                r.error(
                    item.pos,
                    format!(
                        "`{path}` has no `role`; add `role: worker` (one of {})",
                        list(roles().iter().map(|(n, _)| *n))
                    ),
                );
                None
            }
        };
        let archetype = field("archetype")
            .filter(|(v, _)| !v.is_null())
            .and_then(|(v, what)| r.string(v, &what));
        let description = field("description")
            .filter(|(v, _)| !v.is_null())
            .and_then(|(v, what)| {
                r.string_of_at_most(v, &what, crate::fields::MAX_DESCRIPTION_BYTES)
            })
            .unwrap_or_default();
        let restart = field("restart")
            .and_then(|(v, what)| r.choice(v, &what, "restart policy", RESTART_POLICIES))
            .unwrap_or(defaults.restart);
        let stop_timeout_secs = field("stop_timeout_secs")
            .and_then(|(v, what)| r.uint(v, &what, 0, U64_MAX))
            .unwrap_or(defaults.stop_timeout_secs);
        let ready_timeout_secs = field("ready_timeout_secs")
            .and_then(|(v, what)| r.uint(v, &what, 1, U64_MAX))
            .unwrap_or(defaults.ready_timeout_secs);
        let delivery_window =
            field("delivery_window").and_then(|(v, what)| r.uint(v, &what, 1, MAX_WINDOW));
        let workspace = field("workspace").filter(|(v, _)| !v.is_null()).and_then(|(v, what)| {
            let path = PathBuf::from(r.string(v, &what)?);
            // A relative workspace lives under the state dir's `workspaces/`; `..` would take
            // it out (into the state dir itself, or anywhere). An absolute path is the user's
            // own choice.
            // `.` (or nothing) is the workspaces/ folder itself: every agent's workspace.
            if path.is_relative()
                && !path.components().any(|c| matches!(c, std::path::Component::Normal(_)))
            {
                r.error(
                    v.pos,
                    format!(
                        "`{what}`: `{}` is the state dir's workspaces/ folder itself, which holds \
                         every other agent's workspace; give a name (e.g. `shared`) or an \
                         absolute path",
                        path.display()
                    ),
                );
                return None;
            }
            if path.is_relative() && path.components().any(|c| c == std::path::Component::ParentDir)
            {
                r.error(
                    v.pos,
                    format!(
                        "`{what}`: `{}` leaves the state dir's workspaces/ folder (`..`); give a \
                         plain relative name (e.g. `shared`) or an absolute path",
                        path.display()
                    ),
                );
                return None;
            }
            Some(path)
        });
        let env = field("env").map(|(v, what)| env(r, v, &what)).unwrap_or_default();
        let can_call =
            field("can_call").map(|(v, what)| can_call(r, v, &what, known)).unwrap_or_default();
        let tools = field("tools").map(|(v, what)| tools(r, v, &what, role));
        let sandbox = field("sandbox")
            .and_then(|(v, what)| r.choice(v, &what, "sandbox backend", SANDBOXES))
            .unwrap_or_default();
        let unconfined =
            field("unconfined").and_then(|(v, what)| r.boolean(v, &what)).unwrap_or(false);
        let delegate = field("delegate").and_then(|(v, what)| {
            let rule = r.choice(v, &what, "delegation rule", DELEGATES)?;
            if rule == Delegate::Always && role.is_some_and(|role| role != Role::Coordinator) {
                r.error(
                    v.pos,
                    format!(
                        "`{what}: always` is for a coordinator (it hands every request to the \
                         agent it delegates to); remove it, or give the agent `role: coordinator`"
                    ),
                );
            }
            Some(rule)
        });
        let command = field("command").and_then(|(v, what)| self.command(v, &what));
        let host = field("host").filter(|(v, _)| !v.is_null()).and_then(|(v, what)| {
            let host = self.host_name(v, &what)?;
            if !self.clustered {
                self.report.error(
                    v.pos,
                    format!(
                        "`{what}: {host}` places the agent on another host, but the swarm \
                             has no `cluster:`; add `cluster: {{ nats: nats://HOST:4222 }}` (the \
                             JetStream server the hosts meet on), or remove `host:`"
                    ),
                );
            }
            Some(host)
        });
        let extensions = match field("extensions") {
            Some((v, what)) => crate::extensions::parse(&mut self.report, v, &what, peers),
            None => role.map(|role| ExtensionSpec::defaults(role, peers)).unwrap_or_default(),
        };
        // The pipeline's peers are callable by the agent (a restricted `can_call` lists whom its
        // model may address; the pipeline is part of the agent).
        let mut can_call = can_call;
        if !can_call.is_empty() {
            for peer in extensions.iter().flat_map(ExtensionSpec::peers) {
                if !can_call.contains(&peer) {
                    can_call.push(peer);
                }
            }
        }

        let model = match field("model") {
            Some((v, what)) => match self.report.string(v, &what) {
                Some(model) => self.model_ref(&model, v, &what),
                None => None,
            },
            None => match &defaults.model {
                Some((_, spec)) => spec.clone(),
                // No model named anywhere: the embedded local model (DESIGN.md §7).
                None => Some(ModelSpec::Local(crate::spec::LocalModel::default())),
            },
        };

        Some(AgentSpec {
            name: name?.to_owned(),
            role: role?,
            archetype,
            description,
            restart,
            stop_timeout_secs,
            ready_timeout_secs,
            workspace,
            command,
            env,
            can_call,
            tools,
            sandbox,
            unconfined,
            model: model?,
            instance: None,
            extensions,
            delegate: delegate.unwrap_or_default(),
            host,
            delivery_window,
        })
    }

    /// `command: [program, args…]`. A relative program path with a `/` is resolved against the
    /// swarm file's folder (the process runs in its workspace, where it would mean something
    /// else); a bare name like `python3` is left for `PATH`.
    pub(super) fn command(&mut self, node: &Node, what: &str) -> Option<Vec<String>> {
        let items = self.report.list(node, what)?;
        if items.is_empty() {
            self.report.error(
                node.pos,
                format!(
                    "`{what}` is empty; give the program and its arguments, e.g. \
                     [\"./bin/agent\", \"--flag\"], or remove it to run the bundled flock-agent"
                ),
            );
            return None;
        }
        let mut command = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            command.push(self.report.string(item, &format!("{what}[{i}]"))?);
        }
        let program = &command[0];
        if program.is_empty() {
            self.report
                .error(items[0].pos, format!("`{what}[0]` is empty; name the program to run"));
            return None;
        }
        if program.contains('/') && Path::new(program).is_relative() {
            let joined = self.dir.join(program);
            let resolved = std::path::absolute(&joined).unwrap_or(joined);
            match resolved.to_str() {
                Some(resolved) => command[0] = resolved.to_owned(),
                None => {
                    self.report.error(
                        items[0].pos,
                        format!(
                            "`{what}[0]` resolves to a path that is not valid UTF-8; use an \
                             absolute path"
                        ),
                    );
                    return None;
                }
            }
        }
        Some(command)
    }

    /// Checks the `args.to` names collected from transcripts. Every validly named agent counts,
    /// even one with other problems: its own errors already say what is wrong with it.
    pub(super) fn check_targets(&mut self) {
        let names: HashSet<&str> = self.agent_names.iter().map(String::as_str).collect();
        for target in &self.targets {
            // `name@instance` addresses an instance spawned at run time (`agents__spawn`).
            let agent = target.name.split_once('@').map_or(target.name.as_str(), |(a, _)| a);
            if names.contains(agent) {
                continue;
            }
            let message = unknown_agent(&target.what, &target.name, names.iter().copied());
            self.report.for_file(&target.file).error(target.pos, message);
        }
    }
}

/// Role names for `choice`, from the one list in `spec.rs`.
pub(super) fn roles() -> [(&'static str, Role); 8] {
    Role::ALL.map(|role| (role.as_str(), role))
}

/// Where an agent's name is written (the agent itself if `name` is missing).
pub(super) fn name_pos(item: &Node) -> Pos {
    item.entries().and_then(|e| lookup(e, "name")).map_or(item.pos, |(_, v)| v.pos)
}

/// `env:` — a mapping of variable names to values.
pub(super) fn env(r: &mut Report<'_>, node: &Node, what: &str) -> Vec<(String, String)> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(entries) = r.mapping(node, what) else {
        return Vec::new();
    };
    let mut env = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let Some(name) = key.text() else {
            r.error(
                key.pos,
                format!("keys in `{what}` must be variable names, found {}", key.describe()),
            );
            continue;
        };
        if !valid_env_name(name) {
            r.error(
                key.pos,
                format!(
                    "`{what}`: `{name}` is not a valid variable name; use capital letters, digits \
                     and `_`, not starting with a digit (e.g. `{}`)",
                    suggest_env_name(name)
                ),
            );
            continue;
        }
        if name.starts_with("FLOCK_") {
            r.error(
                key.pos,
                format!(
                    "`{what}`: `{name}` is reserved (Flock sets `FLOCK_*` variables itself); \
                     rename it"
                ),
            );
            continue;
        }
        // Values are free text: `PORT: 8080` means the text "8080".
        if let Some(value) = r.string(value, &format!("{what}.{name}")) {
            env.push((name.to_owned(), value));
        }
    }
    env
}

/// A list of names (`null`: none), each read as a string and kept if `check` finds nothing
/// wrong with it; what is wrong is reported at the item, named `what[i]`.
fn names(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    check: impl Fn(&str, &str) -> Option<String>,
) -> Vec<String> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(items) = r.list(node, what) else {
        return Vec::new();
    };
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{what}[{i}]");
        let Some(name) = r.string(item, &at) else { continue };
        match check(&at, &name) {
            Some(problem) => r.error(item.pos, problem),
            None => names.push(name),
        }
    }
    names
}

/// `tools: [name, …]`: the tools offered to this agent's model (a subset of its role's).
pub(super) fn tools(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    role: Option<Role>,
) -> Vec<String> {
    names(r, node, what, |at, name| {
        let spec = crate::tools::tool(name).filter(|t| t.is_model_tool());
        let Some(spec) = spec else {
            return Some(format!("`{at}`: {}", crate::tools::unknown_tool_hint(name)));
        };
        let role = role.filter(|r| !r.may_use(name))?;
        Some(format!(
            "`{at}`: a {} may not use `{name}` ({}); remove it",
            role.as_str(),
            spec.access.who()
        ))
    })
}

pub(super) fn can_call(r: &mut Report<'_>, node: &Node, what: &str, known: &[&str]) -> Vec<String> {
    names(r, node, what, |_, name| {
        (!known.contains(&name)).then(|| unknown_agent(what, name, known.iter().copied()))
    })
}

pub(super) fn unknown_agent<'a>(
    what: &str,
    name: &str,
    known: impl Iterator<Item = &'a str> + Clone,
) -> String {
    let hint = match closest(name, known.clone()) {
        Some(best) => format!("did you mean `{best}`? "),
        None => String::new(),
    };
    let mut names: Vec<&str> = known.collect();
    names.sort_unstable();
    if names.is_empty() {
        return format!(
            "`{what}` names unknown agent `{name}`; this swarm has no valid agent names yet"
        );
    }
    format!("`{what}` names unknown agent `{name}`; {hint}agents in this swarm: {}", list(names))
}

/// `[A-Z_][A-Z0-9_]*`.
pub(super) fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

pub(super) fn suggest_env_name(name: &str) -> String {
    let mut fixed: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect();
    if fixed.is_empty() || fixed.starts_with(|c: char| c.is_ascii_digit()) {
        fixed.insert(0, '_');
    }
    fixed
}

/// A valid agent name close to `name`, for the "e.g." part of the message.
pub(super) fn suggest_name(name: &str) -> String {
    let mut fixed: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_start_matches('-')
        .chars()
        .take(63)
        .collect();
    if !valid_agent_name(&fixed) {
        fixed = "worker-1".to_owned();
    }
    fixed
}

/// Every agent's `name` as written (valid or not), with where it is written.
pub(super) fn written_agent_names(top: &[(Node, Node)]) -> Vec<(String, Pos)> {
    let Some((_, Node { value: Value::Seq(items), .. })) = lookup(top, "agents") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let (_, name) = lookup(item.entries()?, "name")?;
            Some((name.text()?.to_owned(), name.pos))
        })
        .collect()
}
