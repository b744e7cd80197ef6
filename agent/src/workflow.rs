//! The team protocol the runtime walks an agent through, step by step, whatever its model:
//!
//! - **A person's request to the orchestrator** becomes a project channel: the runtime looks up
//!   the workers (`flock_discover`), the model creates `#project-…` with the members it picks from
//!   them, then writes the kick-off post; the person is answered with where the work happens.
//! - **In a `project-…` channel**, a worker speaks when a post @mentions it: the runtime reads the
//!   channel for it, the model does its part with its tools and posts it, and the post hands over
//!   to the next member who has not posted yet. The other deltas cost no model call.
//! - **The orchestrator follows its project channels**: once every member has posted — or the
//!   channel went quiet (a `[quiet]` notice: a member never posted) — the runtime starts the
//!   archive and relays the outcome to where the person asked.
//! - **An archive notice** is answered by reading the channel, writing what was learned to
//!   memory, updating the card, and saying ready.
//!
//! At each step the model is offered only that step's tool, with its arguments narrowed (the
//! channel it must post in, the members it may pick), and must call it: a small model cannot
//! wander off the protocol, and under a grammar it cannot write a malformed call. What needs no
//! judgement (reading, discovering, saying ready, archiving) the runtime calls itself.
//!
//! Pure: every step is decided from the turn's input and the calls the turn has made so far, so
//! a replayed turn walks the same way and every rule has a unit test.

use flock_config::Role;
use flock_ipc::channel::{ARCHIVE_NOTICE, DM_PREFIX, QUIET_NOTICE, SYSTEM_AUTHOR, mentions, posts};
use flock_ipc::llm::ToolDef;
use serde_json::{Value, json};

use crate::tools::TurnState;

/// Channels the orchestrator opens for a person's request are named `project-…`; in them the
/// runtime walks the hand-over protocol.
pub const PROJECT_PREFIX: &str = "project-";

/// A protocol step the model failed this many times (a refused call) is given up, in words.
const TRIES: usize = 2;

/// A worker's tool calls (files, data) before its post in a project channel; then only the post.
const WORK_STEPS: usize = 3;

/// A call this turn made, with its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    pub name: String,
    pub arguments: Value,
    pub ok: bool,
    pub content: String,
}

/// What the turn is about.
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a> {
    /// The agent's own name (as others @mention it).
    pub me: &'a str,
    pub role: Role,
    /// Its archetype (`project-manager`, `qa`, …), which says what its part of a project is.
    pub archetype: Option<&'a str>,
    pub state: TurnState,
    /// The channel the input belongs to.
    pub channel: Option<&'a str>,
    /// Who sent it, and who waits for the answer.
    pub sender: &'a str,
    pub answer_to: Option<&'a str>,
    /// The input's text (a delta's notification text).
    pub text: &'a str,
    /// The calls this turn made so far, in order.
    pub done: &'a [Done],
}

/// What happens next in a turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Not a protocol turn: the usual offer, the model free to answer.
    Free,
    /// Ask the model, offering exactly `tools`; it must call one of them. `note` says what this
    /// step wants, in words, right before the model writes (it does not stay in the session).
    Model { tools: Vec<ToolDef>, note: String },
    /// The runtime makes this call itself, without asking the model.
    Call { name: &'static str, arguments: Value },
    /// The turn ends with this answer, without a model call.
    Reply(String),
}

/// The next step of turn `t`. `offered`: the tools the turn would offer without a protocol;
/// `all`: every tool the agent's role may call (a protocol step may need an opt-in one).
pub fn plan(t: &Turn, offered: &[ToolDef], all: &[ToolDef]) -> Step {
    if t.role.answers_in_text() {
        return Step::Free;
    }
    match t.state {
        // A person's post in a shared channel (#lobby, a bridged group) starts a project; a
        // direct message or `flockctl send` is answered one to one.
        TurnState::Owed
            if t.role == Role::Orchestrator
                && t.answer_to.is_some_and(|a| a.starts_with("human:"))
                && t.channel.is_some_and(|c| !c.starts_with(DM_PREFIX)) =>
        {
            open_project(t, all)
        }
        TurnState::Channel => match t.channel {
            Some(c) if c.starts_with(PROJECT_PREFIX) => in_project(t, c, offered, all),
            _ => Step::Free,
        },
        _ => Step::Free,
    }
}

/// A person asked the orchestrator: discover → create → kick-off → answer.
fn open_project(t: &Turn, all: &[ToolDef]) -> Step {
    let Some(found) = last_ok(t.done, "flock_discover") else {
        if tries(t.done, "flock_discover") > 0 {
            return Step::Free;
        }
        return Step::Call { name: "flock_discover", arguments: json!({"role": "worker"}) };
    };
    let workers: Vec<String> = serde_json::from_str::<Value>(&found.content)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|card| card["name"].as_str().map(str::to_owned))
        .collect();
    if workers.is_empty() {
        return Step::Free;
    }
    // The channels that exist, so the project's id is new (a small model reuses the last one).
    if tries(t.done, "flock_channel_list") == 0 {
        return Step::Call { name: "flock_channel_list", arguments: json!({}) };
    }
    let Some(created) = last_ok(t.done, "flock_channel_create") else {
        if tries(t.done, "flock_channel_create") >= TRIES {
            return gave_up(t.done, "open a project channel", "flock_channel_create");
        }
        let note = format!(
            "Open a project channel for {asker}'s request: \"{request}\". Call \
             flock_channel_create: channel = project- and a short name for the project, topic = \
             what must be delivered, in at most 12 words of your own, members = the workers it \
             needs from the cards above, the one who starts first.",
            asker = asker(t),
            request = clip(t.text, 300),
        );
        return model(
            narrow(all, "flock_channel_create", |p| {
                p["properties"]["channel"] = json!({
                    "type": "string",
                    "description": "project-NAME: a short name for the project, a-z, 0-9 and -",
                    "pattern": "^project-[a-z0-9]+(-[a-z0-9]+)*$",
                    "maxLength": 40,
                });
                p["properties"]["members"] = json!({
                    "type": "array",
                    "description": "the workers the project needs, the first starts",
                    "items": {"type": "string", "enum": workers},
                    "minItems": 1,
                    "maxItems": workers.len(),
                });
                p["required"] = json!(["channel", "topic", "members"]);
            }),
            note,
        );
    };
    let channel = channel_arg(&created.arguments).unwrap_or_default().to_owned();
    let members = strings(&created.arguments["members"]);
    if !posted_in(t.done, &channel) {
        if tries_in(t.done, &channel) >= TRIES {
            return gave_up(t.done, "post the kick-off", "flock_channel_post");
        }
        let note = format!(
            "Now post the kick-off in #{channel}: in two or three sentences, what {asker} asked \
             (\"{request}\") and what done means for the team; address @{first} to start.",
            asker = asker(t),
            request = clip(t.text, 300),
            first = members.first().map(String::as_str).unwrap_or("the first member"),
        );
        return model(post_in(all, &channel), note);
    }
    Step::Reply(format!(
        "On it: #{channel} is open with {}. I will post the outcome here when the team is done.",
        members.join(", ")
    ))
}

/// A delta of a project channel: the archive protocol, the orchestrator following, or a
/// worker's part.
fn in_project(t: &Turn, channel: &str, offered: &[ToolDef], all: &[ToolDef]) -> Step {
    let new = posts(t.text);
    let me = t.me.to_lowercase();
    let by_others = || new.iter().filter(|p| p.author != t.me);
    if by_others().any(|p| p.text.starts_with(ARCHIVE_NOTICE) && mentions(&p.text).contains(&me)) {
        return archive(t, channel, all);
    }
    // Flock's notice that the channel went quiet, to the one who opened it: wrap up now.
    let quiet = new.iter().any(|p| {
        p.author == SYSTEM_AUTHOR
            && p.text.starts_with(QUIET_NOTICE)
            && mentions(&p.text).contains(&me)
    });
    match t.role {
        Role::Orchestrator => follow(t, channel, by_others().count() > 0, quiet),
        Role::Worker => {
            let called = by_others()
                .any(|p| !p.text.starts_with(ARCHIVE_NOTICE) && mentions(&p.text).contains(&me));
            if called { take_part(t, channel, offered, all) } else { Step::Reply("noted".into()) }
        }
        _ => Step::Free,
    }
}

/// The archive notice: read the history, remember, update the card, say ready.
fn archive(t: &Turn, channel: &str, all: &[ToolDef]) -> Step {
    if tries(t.done, "flock_channel_read") == 0 {
        return read(channel);
    }
    // A member whose model could not write its memory in two tries (a small model restates the
    // notice or repeats itself) still leaves a record: the runtime remembers its own last post.
    if all.iter().any(|d| d.name == "memory_remember")
        && last_ok(t.done, "memory_remember").is_none()
        && tries(t.done, "memory_remember") == TRIES
        && let Some(text) = read_result(t.done).and_then(|state| own_part(t.me, channel, &state))
    {
        let arguments = json!({"text": text, "priority": "medium", "category": "event"});
        return Step::Call { name: "memory_remember", arguments };
    }
    for step in ["memory_remember", "flock_update_card"] {
        if all.iter().any(|d| d.name == step)
            && last_ok(t.done, step).is_none()
            && tries(t.done, step) < TRIES
        {
            let note = match step {
                "memory_remember" => format!(
                    "#{channel} is finished. Call memory_remember with one sentence about this \
                     project that the team should recall later, in your own words: a fact, a \
                     decision or a lesson, with names."
                ),
                _ => format!(
                    "Call flock_update_card: description = what you do, in one sentence that \
                     names your part in #{channel}; skills = two to four single words."
                ),
            };
            return model(
                narrow(all, step, |p| {
                    bound(p, "/properties/text", MEMORY_CHARS);
                    bound(p, "/properties/description", 200);
                    bound_list(p, "/properties/skills", 4, 30);
                    bound_list(p, "/properties/tags", 4, 30);
                }),
                note,
            );
        }
    }
    match last(t.done, "flock_archive_ready") {
        None => Step::Call { name: "flock_archive_ready", arguments: json!({"channel": channel}) },
        Some(d) if d.ok => Step::Reply(format!("ready for the archive of #{channel}")),
        Some(d) => Step::Reply(format!("could not say ready for #{channel}: {}", d.content)),
    }
}

/// The orchestrator in one of its project channels: once every member has posted (or the
/// channel went `quiet`: a member never will), archive and tell the person.
fn follow(t: &Turn, channel: &str, news: bool, quiet: bool) -> Step {
    if !news {
        return Step::Reply("noted".into());
    }
    let Some(state) = read_result(t.done) else {
        if tries(t.done, "flock_channel_read") > 0 {
            return gave_up(t.done, "read the channel", "flock_channel_read");
        }
        return read(channel);
    };
    if state["state"] != "active" {
        return Step::Reply("noted".into());
    }
    let team = team(&state);
    let posted = authors(&state);
    let waiting: Vec<&String> = team.iter().filter(|m| !posted.contains(m)).collect();
    if team.is_empty() || (!waiting.is_empty() && !quiet) {
        let names: Vec<&str> = waiting.iter().map(|s| s.as_str()).collect();
        return Step::Reply(format!("noted; waiting for {}", names.join(", ")));
    }
    match last(t.done, "flock_channel_archive") {
        None => {
            return Step::Call {
                name: "flock_channel_archive",
                arguments: json!({"channel": channel}),
            };
        }
        Some(d) if !d.ok => {
            return Step::Reply(format!("could not archive #{channel}: {}", d.content));
        }
        Some(_) => {}
    }
    if let Some(origin) = origin(state["topic"].as_str().unwrap_or_default())
        && tries_in(t.done, &origin) == 0
    {
        return Step::Call {
            name: "flock_channel_post",
            arguments: json!({"channel": origin, "text": outcome(channel, &state)}),
        };
    }
    Step::Reply(format!("archiving #{channel}"))
}

/// A worker @mentioned in a project channel: read, do its part with its tools, post it.
fn take_part(t: &Turn, channel: &str, offered: &[ToolDef], all: &[ToolDef]) -> Step {
    let Some(state) = read_result(t.done) else {
        if tries(t.done, "flock_channel_read") > 0 {
            return gave_up(t.done, "read the channel", "flock_channel_read");
        }
        return read(channel);
    };
    if posted_in(t.done, channel) {
        return Step::Reply(format!("posted my part in #{channel}"));
    }
    let mine = state["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["author"] == t.me).count());
    if mine >= 3 || state["state"] != "active" {
        return Step::Reply("noted".into());
    }
    // Refused twice: the channel hears so (and the hand-over goes on), then the turn ends.
    match tries_in(t.done, channel) {
        TRIES => {
            // The reason in plain words: no error code, no instructions meant for the model.
            let why = last(t.done, "flock_channel_post").map_or("", |d| d.content.as_str());
            let why = why.trim_start_matches("BAD_REQUEST: ").split(';').next().unwrap_or("");
            let text = format!("({} could not post its part this time: {})", t.me, why.trim());
            return Step::Call {
                name: "flock_channel_post",
                arguments: json!({"channel": channel, "text": text}),
            };
        }
        n if n > TRIES => return gave_up(t.done, "post my part", "flock_channel_post"),
        _ => {}
    }
    // Its work tools (files, data, the sandbox) and the post; not the channel admin or
    // addressing tools: the hand-over is the post's @mention. After WORK_STEPS calls of its
    // tools, only the post: the part is due.
    let worked = t.done.iter().filter(|d| d.name != "flock_channel_read").count();
    let mut tools: Vec<ToolDef> = offered
        .iter()
        .filter(|d| {
            worked < WORK_STEPS
                && !(d.name.starts_with("flock_")
                    || d.name.starts_with("agents__")
                    || d.name.starts_with("memory_"))
        })
        .cloned()
        .collect();
    for tool in &mut tools {
        bound(&mut tool.parameters, "/properties/content", FILE_CHARS);
    }
    tools.extend(post_in(all, channel));
    let topic = state["topic"].as_str().unwrap_or_default();
    let topic = topic.rfind(" (asked by ").map_or(topic, |at| &topic[..at]);
    let note = format!(
        "You are {me}. Do your part of the project \"{topic}\" now: {part}{tools}. Then call \
         flock_channel_post in #{channel} with your part itself, in your own words — never a \
         copy of earlier posts, and never a claim of work no tool of yours did.",
        me = t.me,
        part = part_of(t.archetype),
        tools = if worked < WORK_STEPS && tools.len() > 1 {
            " (use your tools if it needs them)"
        } else {
            ""
        },
    );
    model(tools, note)
}

/// The arguments the runtime makes of a model's call at a protocol step, when they differ: a
/// project's topic says who asked where (the outcome goes there); the kick-off mentions a
/// member; a worker's post hands over to the next member who has not posted.
pub fn amend(t: &Turn, name: &str, arguments: &Value) -> Option<Value> {
    let Value::Object(args) = arguments else { return None };
    let mut args = args.clone();
    match (t.role, t.state, name) {
        (Role::Orchestrator, TurnState::Owed, "flock_channel_create") => {
            let topic = args.get("topic").and_then(Value::as_str).unwrap_or_default();
            // A model that copies an earlier topic copies its origin too: said once.
            let mut plain =
                topic.find(" (asked by ").map_or(topic, |at| &topic[..at]).trim().to_owned();
            // A topic with no word of this request is the last project's, copied from the
            // model's own history: the project is named after the request instead.
            let request = request_of(t.text);
            let stale = !related(&plain, &request);
            if stale {
                plain = clip(&request, 80);
            }
            let asker = t.sender.trim_start_matches("human:");
            let place = t.channel.map(|c| format!(" in #{c}")).unwrap_or_default();
            let topic = format!("{plain} (asked by {asker}{place})").trim().to_owned();
            args.insert("topic".into(), json!(topic));
            let taken: Vec<String> = last_ok(t.done, "flock_channel_list")
                .and_then(|d| serde_json::from_str::<Value>(&d.content).ok())
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|c| c["channel"].as_str().map(str::to_owned))
                .collect();
            // A taken id (the model reused the last project's) is named after this topic
            // instead, with the first free `-2`, `-3`… suffix if need be.
            let renamed =
                |id: &&str| taken.iter().any(|t| t == id) || (stale && !related(id, &request));
            if let Some(id) = channel_arg(arguments).filter(renamed) {
                let named = slug(&plain).map(|s| format!("{PROJECT_PREFIX}{s}"));
                let id = named.unwrap_or_else(|| id.to_owned());
                let free = std::iter::once(id.clone())
                    .chain((2..).map(|n| format!("{id}-{n}")))
                    .find(|c| !taken.contains(c));
                args.insert("channel".into(), json!(free));
            }
            let mut members = strings(args.get("members").unwrap_or(&Value::Null));
            let mut seen = std::collections::HashSet::new();
            members.retain(|m| seen.insert(m.clone()));
            args.insert("members".into(), json!(members));
        }
        (Role::Orchestrator, TurnState::Owed, "flock_channel_post") => {
            let created = last_ok(t.done, "flock_channel_create")?;
            if channel_arg(arguments) != channel_arg(&created.arguments) {
                return None;
            }
            let members = strings(&created.arguments["members"]);
            let text = args.get("text").and_then(Value::as_str).unwrap_or_default();
            let named = mentions(text);
            let first = members.first()?;
            if members.iter().any(|m| named.contains(&m.to_lowercase())) {
                return None;
            }
            args.insert("text".into(), json!(format!("{} @{first} please start.", text.trim())));
        }
        (Role::Worker, TurnState::Channel, "flock_channel_post") => {
            let state = read_result(t.done)?;
            if channel_arg(arguments) != t.channel {
                return None;
            }
            let posted = authors(&state);
            let next = team(&state).into_iter().find(|m| m != t.me && !posted.contains(m))?;
            let text = args.get("text").and_then(Value::as_str).unwrap_or_default();
            if mentions(text).contains(&next.to_lowercase()) {
                return None;
            }
            args.insert("text".into(), json!(format!("{} @{next} over to you.", text.trim())));
        }
        _ => return None,
    }
    let amended = Value::Object(args);
    (amended != *arguments).then_some(amended)
}

/// What a worker's part of a project is, by its archetype.
fn part_of(archetype: Option<&str>) -> &'static str {
    match archetype {
        Some("project-manager") => {
            "the plan — numbered tasks, each with its owner among the members and what done means"
        }
        Some("code-first-developer") => {
            "the code — write it into a file with fs_write, then say what it does and the file's name"
        }
        Some("production-first-developer") => {
            "the production check — what can fail, how we would see it, and the smallest fix"
        }
        Some("code-reviewer") => {
            "the review — the problems in order of importance, each with its fix, and a verdict"
        }
        Some("qa") => {
            "the test note — what you checked against the plan, what passed and what failed; \
             end with \"QA sign-off:\" only if everything passed"
        }
        _ => "what your role does for this project",
    }
}

/// Why a model's call at a protocol step is refused before it runs, if it is: a worker's post
/// or memory that mostly copies what the channel already says (small models parrot the last
/// post), or a post that claims a file no tool of this turn wrote. The refusal is a tool error
/// the model reads; the protocol counts the try.
pub fn check(t: &Turn, name: &str, arguments: &Value) -> Option<String> {
    if t.state != TurnState::Channel || !t.channel.is_some_and(|c| c.starts_with(PROJECT_PREFIX)) {
        return None;
    }
    let text = match name {
        "flock_channel_post" => arguments.get("text"),
        "memory_remember" => arguments.get("text"),
        _ => None,
    }?
    .as_str()?;
    let state = read_result(t.done);
    let mut earlier: Vec<String> = posts(t.text).into_iter().map(|p| p.text).collect();
    if let Some(messages) = state.as_ref().and_then(|s| s["messages"].as_array()) {
        earlier.extend(messages.iter().filter_map(|m| m["text"].as_str().map(str::to_owned)));
    }
    // A memory may say in its own words what the member did (its post said it first); it may
    // not copy a notice (what the archive asks for is no memory) or a post whole.
    let copied = if name == "memory_remember" {
        let notice = |p: &String| p.starts_with(ARCHIVE_NOTICE) || p.starts_with(QUIET_NOTICE);
        let (notices, posts): (Vec<String>, Vec<String>) = earlier.into_iter().partition(notice);
        copied_share(text, &notices) > 0.5 || copied_share(text, &posts) > 0.9
    } else {
        copied_share(text, &earlier) > 0.5
    };
    if copied {
        let what = if name == "memory_remember" {
            "one sentence the team should recall about this project".to_owned()
        } else {
            format!("your own part: {}", part_of(t.archetype))
        };
        return Some(format!(
            "BAD_REQUEST: this mostly repeats what the channel already says; write {what}, in \
             your own words"
        ));
    }
    let wrote = t.done.iter().any(|d| d.ok && matches!(d.name.as_str(), "fs_write" | "fs_patch"));
    if name == "flock_channel_post" && !wrote && claims_own_file(text) {
        return Some(
            "BAD_REQUEST: this says you wrote a file, but no tool of yours wrote one in this \
             turn; post what you actually did (or write the file with fs_write first)"
                .into(),
        );
    }
    None
}

/// The share of `text`'s word 4-grams that appear in `earlier` (0 for a text under 8 words).
pub(crate) fn copied_share(text: &str, earlier: &[String]) -> f64 {
    fn words(s: &str) -> Vec<String> {
        s.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    }
    let w = words(text);
    if w.len() < 8 {
        return 0.0;
    }
    let seen: std::collections::HashSet<String> = earlier
        .iter()
        .flat_map(|e| words(e).windows(4).map(|g| g.join(" ")).collect::<Vec<_>>())
        .collect();
    let grams: Vec<String> = w.windows(4).map(|g| g.join(" ")).collect();
    grams.iter().filter(|g| seen.contains(*g)).count() as f64 / grams.len() as f64
}

/// "I wrote notes.md", "I have created the file …": a first-person claim of a written file.
fn claims_own_file(text: &str) -> bool {
    let lower = text.to_lowercase().replace('’', "'");
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '\'' | '/')))
        .filter(|w| !w.is_empty())
        .collect();
    words.iter().enumerate().any(|(i, w)| {
        matches!(*w, "i" | "i've" | "we" | "we've")
            && words[i + 1..].iter().take(3).any(|v| {
                matches!(*v, "wrote" | "written" | "created" | "saved" | "generated" | "added")
            })
            && words[i + 1..].iter().take(12).any(|f| crate::turn::is_file(f))
    })
}

/// A channel-id name from a topic's first four meaningful words (`a command-line tool that
/// converts CSV` → `command-line-tool-converts`), if it has any.
fn slug(topic: &str) -> Option<String> {
    const SKIP: [&str; 14] = [
        "a", "an", "the", "to", "of", "for", "and", "with", "that", "create", "build", "make",
        "new", "project",
    ];
    let words: Vec<String> = topic
        .to_lowercase()
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .map(|w| w.trim_matches('-').to_owned())
        .filter(|w| !w.is_empty() && !SKIP.contains(&w.as_str()))
        .take(4)
        .collect();
    let s = words.join("-");
    (!s.is_empty()).then(|| s.chars().take(40).collect::<String>().trim_end_matches('-').to_owned())
}

/// A person's request without its "New project:" lead-in.
fn request_of(text: &str) -> String {
    let t = text.trim();
    let lower = t.to_lowercase();
    let rest = ["new project:", "project:"]
        .iter()
        .find_map(|p| lower.starts_with(p).then(|| &t[p.len()..]))
        .unwrap_or(t);
    rest.trim().to_owned()
}

/// Whether two texts share a word of four letters or more (by its first five: "converts" and
/// "converter" are one word here).
fn related(a: &str, b: &str) -> bool {
    fn stems(s: &str) -> std::collections::HashSet<String> {
        s.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.chars().count() >= 4)
            .map(|w| w.chars().take(5).collect())
            .collect()
    }
    !stems(a).is_disjoint(&stems(b))
}

/// Who asked for a project and where: the channel named in its topic's "(asked by … in #c)".
pub fn origin(topic: &str) -> Option<String> {
    let at = topic.rfind("(asked by ")?;
    let rest = &topic[at..];
    let c = rest.split_once(" in #")?.1.trim_end_matches(')');
    (!c.is_empty() && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        .then(|| c.to_owned())
}

fn model(tools: Vec<ToolDef>, note: String) -> Step {
    if tools.is_empty() { Step::Free } else { Step::Model { tools, note } }
}

/// The person (or agent) who asked, as a name.
fn asker<'a>(t: &Turn<'a>) -> &'a str {
    t.sender.trim_start_matches("human:")
}

fn clip(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

/// What a member did in a project, for its memory: its last post in the channel (without
/// @mentions and the runtime's hand-over), with the channel and its topic.
fn own_part(me: &str, channel: &str, state: &Value) -> Option<String> {
    let messages = state["messages"].as_array()?;
    let last = messages.iter().rev().find(|m| m["author"] == me)?;
    let text = last["text"].as_str()?;
    let words: Vec<&str> = text.split_whitespace().filter(|w| mentions(w).is_empty()).collect();
    let text = words.join(" ");
    let text = text.trim_end_matches(" over to you.").trim_end_matches(" please start.");
    let topic = state["topic"].as_str().unwrap_or_default();
    let topic = topic.find(" (asked by ").map_or(topic, |at| &topic[..at]).trim();
    Some(format!("{me}'s part in #{channel} ({topic}): {}", clip(text, 300)))
}

/// What the person is told when a project ends: each member's last post, as they wrote it (cut
/// and without @mentions), or that it posted nothing: the runtime relays, it does not summarise.
fn outcome(channel: &str, state: &Value) -> String {
    let messages = state["messages"].as_array().cloned().unwrap_or_default();
    let parts: Vec<String> = team(state)
        .iter()
        .map(|m| {
            let Some(last) = messages.iter().rev().find(|x| x["author"] == m.as_str()) else {
                return format!("{m}: (posted nothing before the channel went quiet)");
            };
            let text = last["text"].as_str().unwrap_or_default();
            let words: Vec<&str> =
                text.split_whitespace().filter(|w| mentions(w).is_empty()).collect();
            format!("{m}: {}", clip(&words.join(" "), 200))
        })
        .collect();
    format!("Update: #{channel} is done and being archived.\n{}", parts.join("\n"))
}

fn read(channel: &str) -> Step {
    Step::Call { name: "flock_channel_read", arguments: json!({"channel": channel, "limit": 50}) }
}

/// The tool `name` of `all` with its parameters edited by `edit`; none if the role lacks it.
fn narrow(all: &[ToolDef], name: &str, edit: impl FnOnce(&mut Value)) -> Vec<ToolDef> {
    let Some(mut def) = all.iter().find(|d| d.name == name).cloned() else { return Vec::new() };
    edit(&mut def.parameters);
    vec![def]
}

/// `flock_channel_post`, for `channel` only.
fn post_in(all: &[ToolDef], channel: &str) -> Vec<ToolDef> {
    narrow(all, "flock_channel_post", |p| {
        p["properties"]["channel"] = json!({"type": "string", "enum": [channel]});
        bound(p, "/properties/text", POST_CHARS);
    })
}

/// The longest post, file and memory the protocol's steps let a model write (characters). Under
/// the grammar the model must close the string by then, so a call ends well inside the answer's
/// token limit instead of being cut off there (malformed) — the team-eval's only malformed calls
/// with the grammar on were a card's skills and a post that ran on to the limit.
const POST_CHARS: usize = 1_200;
const FILE_CHARS: usize = 2_400;
const MEMORY_CHARS: usize = 300;

/// Bounds the string property at `pointer` of a tool's parameters (if it has one) to `max`
/// characters.
fn bound(params: &mut Value, pointer: &str, max: usize) {
    if let Some(property @ Value::Object(_)) = params.pointer_mut(pointer) {
        property["maxLength"] = json!(max);
    }
}

/// Bounds the list property at `pointer` (if there is one) to `items` items of `chars` each.
fn bound_list(params: &mut Value, pointer: &str, items: usize, chars: usize) {
    if let Some(property @ Value::Object(_)) = params.pointer_mut(pointer) {
        property["maxItems"] = json!(items);
        bound(property, "/items", chars);
    }
}

fn last<'a>(done: &'a [Done], name: &str) -> Option<&'a Done> {
    done.iter().rev().find(|d| d.name == name)
}

fn last_ok<'a>(done: &'a [Done], name: &str) -> Option<&'a Done> {
    done.iter().rev().find(|d| d.name == name && d.ok)
}

fn tries(done: &[Done], name: &str) -> usize {
    done.iter().filter(|d| d.name == name).count()
}

/// The channel a call names (`#` or not, as the channels actor accepts both).
fn channel_arg(arguments: &Value) -> Option<&str> {
    arguments.get("channel")?.as_str().map(|c| c.trim_start_matches('#'))
}

fn is_post_in(d: &Done, channel: &str) -> bool {
    d.name == "flock_channel_post" && channel_arg(&d.arguments) == Some(channel)
}

fn posted_in(done: &[Done], channel: &str) -> bool {
    done.iter().any(|d| d.ok && is_post_in(d, channel))
}

fn tries_in(done: &[Done], channel: &str) -> usize {
    done.iter().filter(|d| is_post_in(d, channel)).count()
}

/// The turn's last successful channel read, parsed.
fn read_result(done: &[Done]) -> Option<Value> {
    serde_json::from_str(&last_ok(done, "flock_channel_read")?.content).ok()
}

/// A channel's team: its agent members but the one who opened it.
fn team(state: &Value) -> Vec<String> {
    let creator = state["created_by"].as_str().unwrap_or_default();
    strings(&state["members"])
        .into_iter()
        .filter(|m| m != creator && !m.starts_with("human:"))
        .collect()
}

/// Who has posted in a read channel.
fn authors(state: &Value) -> Vec<String> {
    state["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["author"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// A step given up after [`TRIES`] refused calls: the answer says what failed, in words.
fn gave_up(done: &[Done], what: &str, tool: &str) -> Step {
    let why = last(done, tool).map(|d| d.content.as_str()).unwrap_or("no reason given");
    Step::Reply(format!("I could not {what}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{definitions_for, offered};

    fn turn<'a>(
        me: &'a str,
        role: Role,
        state: TurnState,
        channel: &'a str,
        text: &'a str,
    ) -> Turn<'a> {
        Turn {
            me,
            role,
            archetype: None,
            state,
            channel: Some(channel),
            sender: "human:alice",
            answer_to: (state == TurnState::Owed).then_some("human:alice"),
            text,
            done: &[],
        }
    }

    fn ok(name: &str, arguments: Value, content: Value) -> Done {
        Done { name: name.into(), arguments, ok: true, content: content.to_string() }
    }

    fn refused(name: &str, arguments: Value, why: &str) -> Done {
        Done { name: name.into(), arguments, ok: false, content: why.into() }
    }

    fn names(step: &Step) -> Vec<&str> {
        match step {
            Step::Model { tools, .. } => tools.iter().map(|t| t.name.as_str()).collect(),
            other => panic!("not a model step: {other:?}"),
        }
    }

    fn delta(channel: &str, lines: &[(&str, &str)]) -> String {
        let body: String = lines
            .iter()
            .enumerate()
            .map(|(i, (a, t))| format!("[seq {}] {a}: {t}\n", i + 1))
            .collect();
        format!(
            "[Channel: #{channel}]\nNew messages: seq 1..{n} ({n})\n--- New Messages ---\n{body}--- End New Messages ---\nFull history: flock_channel_read(channel=\"{channel}\")",
            n = lines.len()
        )
    }

    fn read_result(members: &[&str], posts: &[(&str, &str)], topic: &str) -> Value {
        json!({
            "channel": "project-login", "topic": topic, "state": "active",
            "members": members, "created_by": "orchestrator",
            "messages": posts.iter().map(|(a, t)| json!({"author": a, "text": t})).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn a_persons_request_to_the_orchestrator_walks_discover_create_kickoff_answer() {
        let all = definitions_for(Role::Orchestrator);
        let base =
            turn("orchestrator", Role::Orchestrator, TurnState::Owed, "lobby", "a login page");
        assert_eq!(
            plan(&base, &all, &all),
            Step::Call { name: "flock_discover", arguments: json!({"role": "worker"}) }
        );

        let cards = json!([{"name": "pm"}, {"name": "dev"}, {"name": "qa"}]);
        let mut done = vec![ok("flock_discover", json!({"role": "worker"}), cards)];
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &all, &all),
            Step::Call { name: "flock_channel_list", arguments: json!({}) }
        );
        let channels = json!([{"channel": "lobby"}, {"channel": "project-login"}]);
        done.push(ok("flock_channel_list", json!({}), channels));
        let step = plan(&Turn { done: &done, ..base }, &all, &all);
        assert_eq!(names(&step), ["flock_channel_create"]);
        let Step::Model { tools, .. } = &step else { unreachable!() };
        let p = &tools[0].parameters;
        assert_eq!(p["properties"]["members"]["items"]["enum"], json!(["pm", "dev", "qa"]));
        assert_eq!(p["properties"]["channel"]["pattern"], "^project-[a-z0-9]+(-[a-z0-9]+)*$");
        assert_eq!(p["required"], json!(["channel", "topic", "members"]));

        // The runtime says in the topic who asked where, and drops a member picked twice.
        let asked = json!({"channel": "project-login", "topic": "Login page", "members": ["pm", "dev", "pm"]});
        let amended = amend(&Turn { done: &done, ..base }, "flock_channel_create", &asked).unwrap();
        assert_eq!(amended["topic"], "Login page (asked by alice in #lobby)");
        assert_eq!(amended["members"], json!(["pm", "dev"]));
        // The id is taken already (the model reused the last project's): named after the topic.
        assert_eq!(amended["channel"], "project-login-page");
        // A topic copied with its origin says it once.
        let copied = json!({"channel": "x", "topic": "Login page (asked by alice in #lobby)", "members": ["pm"]});
        assert_eq!(amend(&Turn { done: &done, ..base }, "flock_channel_create", &copied), None);
        // The last project's topic and name, copied for a new request: named after the request.
        let csv = "New project: a command-line tool that converts CSV files to JSON";
        let next = Turn { text: csv, done: &done, ..base };
        let stale = json!({"channel": "project-login-page", "topic": "Create a login page with email and password (asked by alice in #lobby)", "members": ["pm"]});
        let fixed = amend(&next, "flock_channel_create", &stale).unwrap();
        assert_eq!(
            fixed["topic"],
            "a command-line tool that converts CSV files to JSON (asked by alice in #lobby)"
        );
        assert_eq!(fixed["channel"], "project-command-line-tool-converts-csv");
        let apt = json!({"channel": "project-csv-json", "topic": "CSV to JSON converter", "members": ["pm"]});
        let kept = amend(&next, "flock_channel_create", &apt).unwrap();
        assert_eq!(
            (kept["channel"].as_str(), kept["topic"].as_str()),
            (Some("project-csv-json"), Some("CSV to JSON converter (asked by alice in #lobby)"))
        );
        assert_eq!(
            slug("Create a command-line tool that converts CSV files").as_deref(),
            Some("command-line-tool-converts-csv")
        );
        let amended = json!({"channel": "project-login", "topic": amended["topic"], "members": amended["members"]});

        done.push(ok("flock_channel_create", amended, json!({"channel": "project-login"})));
        let step = plan(&Turn { done: &done, ..base }, &all, &all);
        assert_eq!(names(&step), ["flock_channel_post"]);
        let Step::Model { tools, .. } = &step else { unreachable!() };
        assert_eq!(tools[0].parameters["properties"]["channel"]["enum"], json!(["project-login"]));

        // A kick-off that mentions nobody is handed to the first member.
        let t = Turn { done: &done, ..base };
        let kick = json!({"channel": "project-login", "text": "Build a login page."});
        let amended = amend(&t, "flock_channel_post", &kick).unwrap();
        assert_eq!(amended["text"], "Build a login page. @pm please start.");
        let named = json!({"channel": "project-login", "text": "@dev build it"});
        assert_eq!(amend(&t, "flock_channel_post", &named), None);

        done.push(ok("flock_channel_post", amended, json!({"seq": 1})));
        let Step::Reply(answer) = plan(&Turn { done: &done, ..base }, &all, &all) else {
            panic!("no answer")
        };
        assert!(answer.contains("#project-login") && answer.contains("pm, dev"), "{answer}");
    }

    #[test]
    fn a_step_refused_twice_ends_the_turn_with_the_reason_in_words() {
        let all = definitions_for(Role::Orchestrator);
        let base = turn("orchestrator", Role::Orchestrator, TurnState::Owed, "lobby", "a page");
        let create = json!({"channel": "project-x", "topic": "t", "members": ["pm"]});
        let done = vec![
            ok("flock_discover", json!({}), json!([{"name": "pm"}])),
            ok("flock_channel_list", json!({}), json!([])),
            refused(
                "flock_channel_create",
                create.clone(),
                "BAD_REQUEST: channel `#project-x` already exists",
            ),
            refused(
                "flock_channel_create",
                create,
                "BAD_REQUEST: channel `#project-x` already exists",
            ),
        ];
        let Step::Reply(why) = plan(&Turn { done: &done, ..base }, &all, &all) else { panic!() };
        assert_eq!(
            why,
            "I could not open a project channel: BAD_REQUEST: channel `#project-x` already exists"
        );
        // With no worker to staff a project, or an agent asking, the model is free.
        let lonely = vec![ok("flock_discover", json!({}), json!([]))];
        assert_eq!(plan(&Turn { done: &lonely, ..base }, &all, &all), Step::Free);
        let asked_by_an_agent = Turn { answer_to: Some("coordinator"), ..base };
        assert_eq!(plan(&asked_by_an_agent, &all, &all), Step::Free);
        // A direct message (or `flockctl send`) is answered one to one.
        let direct = Turn { channel: Some("dm-human-alice--orchestrator"), ..base };
        assert_eq!(plan(&direct, &all, &all), Step::Free);
        assert_eq!(plan(&Turn { channel: None, ..base }, &all, &all), Step::Free);
    }

    #[test]
    fn a_worker_speaks_in_a_project_channel_only_when_handed_the_work_and_hands_over() {
        let all = definitions_for(Role::Worker);
        let offered = offered(Role::Worker, None, TurnState::Channel, &[], None);
        let quiet = delta("project-login", &[("orchestrator", "Kick-off: @pm please start.")]);
        let t = turn("dev", Role::Worker, TurnState::Channel, "project-login", &quiet);
        assert_eq!(plan(&t, &offered, &all), Step::Reply("noted".into()));

        let called = delta("project-login", &[("pm", "Plan: a form. @dev over to you")]);
        let base = Turn { text: &called, ..t };
        assert_eq!(
            plan(&base, &offered, &all),
            Step::Call {
                name: "flock_channel_read",
                arguments: json!({"channel": "project-login", "limit": 50})
            }
        );
        let history = read_result(
            &["orchestrator", "pm", "dev", "qa"],
            &[("orchestrator", "Kick-off"), ("pm", "Plan: a form. @dev over to you")],
            "Login (asked by alice in #lobby)",
        );
        let mut done = vec![ok("flock_channel_read", json!({}), history)];
        let step = plan(&Turn { done: &done, ..base }, &offered, &all);
        let tools = names(&step);
        assert!(tools.contains(&"flock_channel_post") && tools.contains(&"fs_write"), "{tools:?}");
        assert!(
            !tools.iter().any(|t| *t != "flock_channel_post" && t.starts_with("flock_")),
            "{tools:?}"
        );
        // The file and the post are bounded: the model closes them inside its token limit.
        let Step::Model { tools: defs, .. } = &step else { unreachable!() };
        let max = |tool: &str, prop: &str| {
            let d = defs.iter().find(|d| d.name == tool).unwrap();
            d.parameters["properties"][prop]["maxLength"].as_u64()
        };
        assert_eq!(max("fs_write", "content"), Some(FILE_CHARS as u64));
        assert_eq!(max("flock_channel_post", "text"), Some(POST_CHARS as u64));

        // After three calls of its tools the part is due: only the post is offered.
        let busy: Vec<Done> = done
            .iter()
            .cloned()
            .chain((0..3).map(|i| ok("fs_write", json!({"path": format!("f{i}")}), json!("ok"))))
            .collect();
        assert_eq!(
            names(&plan(&Turn { done: &busy, ..base }, &offered, &all)),
            ["flock_channel_post"]
        );

        // Its post hands over to the next member who has not posted.
        let post = json!({"channel": "project-login", "text": "Built LoginForm."});
        let amended = amend(&Turn { done: &done, ..base }, "flock_channel_post", &post).unwrap();
        assert_eq!(amended["text"], "Built LoginForm. @qa over to you.");
        // A post that names the channel with its '#' is the same post.
        let amended = json!({"channel": "#project-login", "text": amended["text"]});
        done.push(ok("flock_channel_post", amended, json!({"seq": 3})));
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &offered, &all),
            Step::Reply("posted my part in #project-login".into())
        );
        // A part refused twice: the channel hears so, and the hand-over goes on.
        let cut = "BAD_REQUEST: the call was cut off or incomplete; write it again, shorter";
        let failing: Vec<Done> =
            done[..1]
                .iter()
                .cloned()
                .chain((0..2).map(|_| {
                    refused("flock_channel_post", json!({"channel": "project-login"}), cut)
                }))
                .collect();
        let Step::Call { name: "flock_channel_post", arguments } =
            plan(&Turn { done: &failing, ..base }, &offered, &all)
        else {
            panic!("no failure post")
        };
        assert_eq!(
            arguments["text"],
            "(dev could not post its part this time: the call was cut off or incomplete)"
        );

        // Outside project channels the model is free.
        let general = Turn { channel: Some("general"), ..base };
        assert_eq!(plan(&general, &offered, &all), Step::Free);
    }

    #[test]
    fn the_orchestrator_archives_once_every_member_posted_and_tells_the_person_where_they_asked() {
        let all = definitions_for(Role::Orchestrator);
        let own = delta("project-login", &[("orchestrator", "Kick-off @pm")]);
        let t = turn("orchestrator", Role::Orchestrator, TurnState::Channel, "project-login", &own);
        assert_eq!(plan(&t, &all, &all), Step::Reply("noted".into()));

        let news = delta("project-login", &[("pm", "Plan. @dev over to you")]);
        let base = Turn { text: &news, ..t };
        assert!(matches!(plan(&base, &all, &all), Step::Call { name: "flock_channel_read", .. }));
        let members = ["orchestrator", "pm", "dev", "qa"];
        let topic = "Login (asked by alice in #lobby)";
        let part = read_result(&members, &[("orchestrator", "k"), ("pm", "p")], topic);
        let done = vec![ok("flock_channel_read", json!({}), part)];
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &all, &all),
            Step::Reply("noted; waiting for dev, qa".into())
        );

        let all_in = read_result(
            &members,
            &[("orchestrator", "k"), ("pm", "p"), ("dev", "d"), ("qa", "q")],
            topic,
        );
        let mut done = vec![ok("flock_channel_read", json!({}), all_in)];
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &all, &all),
            Step::Call {
                name: "flock_channel_archive",
                arguments: json!({"channel": "project-login"})
            }
        );
        done.push(ok("flock_channel_archive", json!({"channel": "project-login"}), json!({})));
        // The person hears each member's last word where they asked, relayed by the runtime.
        let step = plan(&Turn { done: &done, ..base }, &all, &all);
        let Step::Call { name: "flock_channel_post", arguments } = &step else {
            panic!("{step:?}")
        };
        assert_eq!(arguments["channel"], "lobby");
        assert_eq!(
            arguments["text"],
            "Update: #project-login is done and being archived.\npm: p\ndev: d\nqa: q"
        );
        // A member's words wake nobody where the person asked: every @mention is left out.
        let sly = read_result(
            &members,
            &[("pm", "done (@sysadmin) @qa x"), ("dev", "d"), ("qa", "q")],
            topic,
        );
        let told = outcome("project-login", &sly);
        assert!(mentions(&told).is_empty() && told.contains("pm: done x"), "{told}");
        done.push(ok("flock_channel_post", arguments.clone(), json!({})));
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &all, &all),
            Step::Reply("archiving #project-login".into())
        );
    }

    #[test]
    fn a_quiet_project_is_wrapped_up_with_what_is_there() {
        let all = definitions_for(Role::Orchestrator);
        let members = ["orchestrator", "pm", "dev", "qa"];
        let topic = "Login (asked by alice in #lobby)";
        let part = read_result(&members, &[("orchestrator", "k"), ("pm", "p")], topic);
        let done = vec![ok("flock_channel_read", json!({}), part.clone())];
        // Flock's notice to whoever opened the channel: archive now, not when dev and qa post.
        let text = format!(
            "{QUIET_NOTICE}#project-login has had no post for 15 min. @orchestrator: wrap it up"
        );
        let quiet = delta("project-login", &[("flock", &text)]);
        let t =
            turn("orchestrator", Role::Orchestrator, TurnState::Channel, "project-login", &quiet);
        assert!(matches!(
            plan(&Turn { done: &done, ..t }, &all, &all),
            Step::Call { name: "flock_channel_archive", .. }
        ));
        let told = outcome("project-login", &part);
        assert!(told.contains("pm: p\ndev: (posted nothing"), "{told}");
        // A quiet notice for someone else, or a member quoting one, changes nothing.
        let other = text.replace("@orchestrator", "@pm");
        let quoted = delta("project-login", &[("flock", &other), ("dev", "[quiet] @orchestrator")]);
        let t =
            turn("orchestrator", Role::Orchestrator, TurnState::Channel, "project-login", &quoted);
        let step = plan(&Turn { done: &done, ..t }, &all, &all);
        assert!(matches!(&step, Step::Reply(r) if r.starts_with("noted; waiting")), "{step:?}");
    }

    #[test]
    fn an_archive_notice_is_answered_with_a_read_memory_a_card_and_ready() {
        let all = definitions_for(Role::Worker);
        let notice = delta(
            "project-login",
            &[(
                "orchestrator",
                "[archive] #project-login is being archived. @pm @dev @qa please review",
            )],
        );
        let base = turn("qa", Role::Worker, TurnState::Channel, "project-login", &notice);
        assert!(matches!(plan(&base, &all, &all), Step::Call { name: "flock_channel_read", .. }));
        let mut done = vec![ok("flock_channel_read", json!({}), json!({}))];
        let step = plan(&Turn { done: &done, ..base }, &all, &all);
        assert_eq!(names(&step), ["memory_remember"]);
        // Every string the step asks for is bounded, so under the grammar the call ends inside the
        // answer's token limit, and no property is added that the tool does not have.
        let Step::Model { tools, .. } = &step else { unreachable!() };
        assert_eq!(tools[0].parameters["properties"]["text"]["maxLength"], MEMORY_CHARS);
        assert!(tools[0].parameters["properties"].get("description").is_none());
        // A model that fails its memory twice: the runtime remembers the member's own part.
        let members = ["orchestrator", "pm", "dev", "qa"];
        let posts = [
            ("dev", "Wrote login.html. @qa over to you."),
            ("qa", "QA sign-off: the form checks both fields. @orchestrator"),
        ];
        let read = read_result(&members, &posts, "Login page (asked by alice in #lobby)");
        let mut failed = vec![ok("flock_channel_read", json!({}), read)];
        failed.push(refused("memory_remember", json!({"text": "a"}), "BAD_REQUEST: repeats"));
        failed.push(refused("memory_remember", json!({"text": "a"}), "BAD_REQUEST: repeats"));
        let step = plan(&Turn { done: &failed, ..base }, &all, &all);
        let Step::Call { name: "memory_remember", arguments } = &step else { panic!("{step:?}") };
        assert_eq!(
            arguments["text"],
            "qa's part in #project-login (Login page): QA sign-off: the form checks both fields."
        );
        failed.push(ok("memory_remember", arguments.clone(), json!("remembered")));
        assert_eq!(
            names(&plan(&Turn { done: &failed, ..base }, &all, &all)),
            ["flock_update_card"]
        );
        done.push(ok("memory_remember", json!({"text": "x"}), json!("remembered")));
        let step = plan(&Turn { done: &done, ..base }, &all, &all);
        assert_eq!(names(&step), ["flock_update_card"]);
        let Step::Model { tools, .. } = &step else { unreachable!() };
        let card = &tools[0].parameters["properties"];
        assert_eq!(
            (card["skills"]["maxItems"].as_u64(), card["skills"]["items"]["maxLength"].as_u64()),
            (Some(4), Some(30))
        );
        assert_eq!(card["description"]["maxLength"], 200);
        done.push(refused("flock_update_card", json!({}), "BAD_REQUEST"));
        done.push(refused("flock_update_card", json!({}), "BAD_REQUEST"));
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &all, &all),
            Step::Call {
                name: "flock_archive_ready",
                arguments: json!({"channel": "project-login"})
            }
        );
        done.push(ok("flock_archive_ready", json!({}), json!({})));
        assert_eq!(
            plan(&Turn { done: &done, ..base }, &all, &all),
            Step::Reply("ready for the archive of #project-login".into())
        );
    }

    #[test]
    fn a_post_that_parrots_the_channel_or_claims_an_unwritten_file_is_refused() {
        let kick =
            "Alice asked to create a login page. We need to deliver it to the team. @pm start.";
        let d = delta("project-login", &[("orchestrator", kick)]);
        let base = turn("pm", Role::Worker, TurnState::Channel, "project-login", &d);
        let post = |text: &str| json!({"channel": "project-login", "text": text});
        let copy = "Alice asked to create a login page. We need to deliver it to the team.";
        assert!(check(&base, "flock_channel_post", &post(copy)).unwrap().contains("repeats"));
        let own =
            "Plan: 1) form with email and password, owner dev; 2) tests for lockout, owner qa.";
        assert_eq!(check(&base, "flock_channel_post", &post(own)), None);
        let claim = "I have written the login form in login.html and the checks in login.js.";
        assert!(check(&base, "flock_channel_post", &post(claim)).unwrap().contains("no tool"));
        // Naming someone else's file is no claim; a file written in this turn backs it.
        assert_eq!(
            check(
                &base,
                "flock_channel_post",
                &post("dev wrote login.html; it looks right to me.")
            ),
            None
        );
        let wrote = vec![ok("fs_write", json!({"path": "login.html"}), json!("ok"))];
        assert_eq!(check(&Turn { done: &wrote, ..base }, "flock_channel_post", &post(claim)), None);
        // Memory that copies the archive notice is refused too; outside project channels nothing is.
        let notice = delta(
            "project-login",
            &[(
                "orchestrator",
                "[archive] #project-login is being archived. @pm please review the history, write what you learned to memory",
            )],
        );
        let at_archive = Turn { text: &notice, ..base };
        let copied = json!({"text": "project-login is being archived. please review the history, write what you learned"});
        assert!(check(&at_archive, "memory_remember", &copied).is_some());
        // Remembering one's own part in other words than the post is a memory; a post copied
        // whole is not.
        let mine =
            "Plan: 1) form with email and password, owner dev; 2) tests for lockout, owner qa.";
        let read = read_result(
            &["orchestrator", "pm"],
            &[("pm", mine)],
            "Login (asked by alice in #lobby)",
        );
        let done = vec![ok("flock_channel_read", json!({}), read)];
        let archived = Turn { done: &done, ..at_archive };
        let recalled = "In the login project my plan was: 1) form with email and password, owner dev; 2) tests for lockout, owner qa.";
        assert!(copied_share(recalled, &[mine.to_owned()]) > 0.5, "a post would be refused");
        assert_eq!(check(&archived, "memory_remember", &json!({"text": recalled})), None);
        let whole = json!({"text": mine});
        assert!(check(&archived, "memory_remember", &whole).is_some());
        assert_eq!(
            check(&Turn { channel: Some("general"), ..base }, "flock_channel_post", &post(copy)),
            None
        );
    }

    #[test]
    fn the_origin_of_a_project_is_read_from_its_topic() {
        assert_eq!(origin("Login (asked by alice in #lobby)").as_deref(), Some("lobby"));
        assert_eq!(origin("x (asked by bob)"), None);
        assert_eq!(origin("x (asked by bob in #Bad Name)"), None);
        assert_eq!(origin("no origin"), None);
    }
}
