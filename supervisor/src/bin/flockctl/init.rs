//! `flockctl init`: a swarm file from a few choices (the team, its model), checked as
//! `flock-supervisor validate` checks one before it is written, never written over silently.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use flock_config::Platform;
use serde_json::json;

use crate::args::InitArgs;

/// The teams `init` writes.
const TEAMS: [(&str, &str); 3] = [
    ("assistant", "a coordinator and a worker with long-term memory — answers your requests"),
    ("project", "an orchestrator and pm, dev, qa — plans, builds and checks projects in channels"),
    (
        "office",
        "an orchestrator, two workers and a sysadmin on scripted models — no LLM, ready in seconds",
    ),
];

/// The chats `init` connects a team to (asked on a terminal; `--bridge` otherwise).
const CHATS: [(&str, &str); 4] = [
    ("none", "only the terminal (flockctl) and the dashboard"),
    ("telegram", "a Telegram group or chat, through your bot"),
    ("discord", "a Discord channel, through your bot"),
    ("slack", "a Slack channel, through your app (Socket Mode)"),
];

/// The team whose agents run scripted models (no LLM): its `--model` is `scripted`.
const OFFICE: &str = "office";

/// The model every agent of the written swarm runs.
#[derive(Debug, Clone, PartialEq)]
enum Model {
    /// The embedded model (`provider: local`) by its known name.
    Local(&'static str),
    /// `provider: openai` or `anthropic` with the model's name and the key's variable.
    Hosted { provider: &'static str, model: String, key_env: String },
    /// An OpenAI-compatible server by URL (Ollama, llama.cpp, vLLM), key optional.
    Server { url: String, model: String, key_env: Option<String> },
    /// The office team's scripted models: deterministic rules, no LLM.
    Scripted,
}

impl Model {
    /// `local`, `local-small`, `openai:MODEL`, `anthropic:MODEL`, or `http(s)://…` with
    /// `model_id`; `Err` says what is accepted.
    fn parse(choice: &str, model_id: Option<&str>, key_env: Option<&str>) -> Result<Model> {
        let choice = choice.trim();
        let hosted = |provider: &'static str, model: &str, default_env: &str| {
            if model.is_empty() {
                bail!(
                    "`{provider}:` needs the model's name, e.g. `{provider}:{}`",
                    example(provider)
                );
            }
            Ok(Model::Hosted {
                provider,
                model: model.to_owned(),
                key_env: key_env.unwrap_or(default_env).to_owned(),
            })
        };
        match choice {
            "scripted" => Ok(Model::Scripted),
            "local" => Ok(Model::Local("qwen2.5-coder-1.5b")),
            "local-small" => Ok(Model::Local("qwen2.5-coder-0.5b")),
            _ if choice.starts_with("openai:") => hosted("openai", &choice[7..], "OPENAI_API_KEY"),
            _ if choice.starts_with("anthropic:") => {
                hosted("anthropic", &choice[10..], "ANTHROPIC_API_KEY")
            }
            _ if choice.starts_with("http://") || choice.starts_with("https://") => {
                let Some(model) = model_id.filter(|m| !m.trim().is_empty()) else {
                    bail!(
                        "a model server by URL needs the model's name on it: add `--model-id \
                         NAME` (e.g. `qwen2.5:7b` for Ollama; `GET {}/models` lists them)",
                        choice.trim_end_matches('/')
                    );
                };
                Ok(Model::Server {
                    url: choice.trim_end_matches('/').to_owned(),
                    model: model.trim().to_owned(),
                    key_env: key_env.map(str::to_owned),
                })
            }
            _ => bail!(
                "unknown model `{choice}`: use `local` (the embedded 1.5B model, no key), \
                 `local-small` (0.5B), `openai:MODEL`, `anthropic:MODEL`, or the URL of an \
                 OpenAI-compatible server with `--model-id NAME`{}",
                if choice == "ollama" || choice.starts_with("ollama:") {
                    " (Ollama: `--model http://127.0.0.1:11434/v1 --model-id qwen2.5:7b`)"
                } else {
                    ""
                }
            ),
        }
    }

    /// The `models:` entry, indented under `main:` (the scripted models: the whole section).
    fn yaml(&self, team: &str) -> String {
        // The project team's posts and plans are longer than an answer.
        let max_tokens = if team == "project" { "    max_tokens: 1024\n" } else { "" };
        match self {
            Model::Local(name) => format!("    provider: local\n    model: {name}\n{max_tokens}"),
            Model::Hosted { provider, model, key_env } => format!(
                "    provider: {provider}\n    model: {}\n    api_key_env: {key_env}   # the \
                 variable's NAME; set it where you run `up`\n{max_tokens}",
                quoted(model)
            ),
            Model::Server { url, model, key_env } => format!(
                "    provider: openai             # any OpenAI-compatible server\n    base_url: \
                 {}\n    model: {}\n{}{max_tokens}",
                quoted(url),
                quoted(model),
                key_env.as_ref().map(|k| format!("    api_key_env: {k}\n")).unwrap_or_default()
            ),
            Model::Scripted => OFFICE_MODELS.to_owned(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Model::Local(name) => format!("the embedded model {name}"),
            Model::Hosted { provider, model, .. } => format!("{provider} {model}"),
            Model::Server { url, model, .. } => format!("{model} at {url}"),
            Model::Scripted => "scripted models (no LLM)".to_owned(),
        }
    }
}

/// The office's models: one rule list per kind of agent (what `examples/office.yaml` keeps in
/// `examples/transcripts/`, inline so the file stands alone).
const OFFICE_MODELS: &str =
    "  orchestrator:                 # the first rule whose `match` is in the input runs
    provider: scripted
    rules:
      - match: \"status\"
        steps:
          - tool: agents__list
        reply: \"all hands present\"
      - match: \"build\"             # ask worker-1 (waits for its answer), tell worker-2
        steps:
          - tool: agents__request
            args: { to: worker-1, text: \"build: {input}\" }
          - tool: agents__send
            args: { to: worker-2, text: \"please test: {input}\" }
        reply: \"orchestrator: job dispatched\"
      - reply: \"ack: {input}\"
  worker:
    provider: scripted
    rules:
      - match: \"status\"
        reply: \"worker ready\"
      - steps:
          - delay_ms: 200         # works for a moment, like a model thinking
        reply: \"worker done: {input}\"
  sysadmin:
    provider: scripted
    rules:
      - match: \"status\"
        steps:
          - tool: agents__list
        reply: \"sysadmin: all systems nominal\"
      - reply: \"sysadmin: noted: {input}\"
";

fn example(provider: &str) -> &'static str {
    if provider == "openai" { "gpt-4o-mini" } else { "claude-sonnet-4-5" }
}

/// A YAML double-quoted string.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The team's agents (and what the team needs besides its model).
fn team_yaml(team: &str) -> &'static str {
    match team {
        OFFICE => {
            "agents:
  - name: orchestrator
    role: orchestrator
    description: \"Takes jobs and hands them to the workers\"
    model: orchestrator
    can_call: [worker-1, worker-2, sysadmin]
  - name: sysadmin
    role: sysadmin
    description: \"Keeps the office running\"
    model: sysadmin
  - name: worker-1
    role: worker
    description: \"Builds what the orchestrator asks for\"
  - name: worker-2
    role: worker
    description: \"Tests what worker-1 built\"
"
        }
        "project" => {
            "budget:                  # a project takes many turns
  max_hops: 40
  max_tokens: 200000
  max_wall_secs: 1800
channels:
  archive_deadline_secs: 300

agents:
  - name: orchestrator
    role: orchestrator
    archetype: project-manager
    description: \"Turns project requests into channels and teams, and closes them when done\"
  - name: pm
    role: worker
    archetype: project-manager
    description: \"Breaks a project down into a plan with tasks and owners\"
    tools: []          # the plan is its post
  - name: dev
    role: worker
    archetype: code-first-developer
    description: \"Writes the code of the plan into files\"
    tools: [fs_write, fs_read, fs_list]
  - name: qa
    role: worker
    archetype: qa
    description: \"Checks what dev built against the plan and signs it off\"
    tools: []          # its test note is its post
"
        }
        _ => {
            "agents:
  - name: coordinator
    role: coordinator
    description: \"Receives every input, routes it to the worker, answers the human\"
    can_call: [worker]
  - name: worker
    role: worker
    description: \"Does the job\"
    can_call: [coordinator]
    tools: [fs_write, fs_read, fs_list]
  - name: unconscious
    role: unconscious
    description: \"Answers with relevant memories\"
  - name: observer
    role: observer
    description: \"Writes third-person observations of the worker's turns\"
    can_call: [reflection]
  - name: reflection
    role: reflection
    description: \"Finds patterns in unreflected observations\"
  - name: dream
    role: dream
    description: \"Consolidates memory into knowledge while the swarm is idle\"
  - name: sysadmin
    role: sysadmin
    description: \"Triages permission requests: GREEN grants, YELLOW asks back, RED waits for a person\"
"
        }
    }
}

/// How to talk to the written swarm once it runs.
fn first_steps(team: &str) -> &'static str {
    match team {
        OFFICE => "flockctl send orchestrator \"build the login page\" --wait",
        "project" => {
            "flockctl channel create lobby --topic \"Project requests\" --members orchestrator --as alice\n  \
             flockctl post '#lobby' \"New project: a login page with email and password\" --as alice"
        }
        _ => "flockctl send coordinator \"Plan my week\" --wait",
    }
}

/// A chat the swarm answers in, through a bridge.
#[derive(Debug, Clone, PartialEq)]
struct Bridge {
    platform: Platform,
    chat: String,
    api_url: Option<String>,
}

impl Bridge {
    /// The variables its tokens are read from: the bot's, and Slack's app-level token.
    fn token_vars(&self) -> &'static [&'static str] {
        match self.platform {
            Platform::Telegram => &["TELEGRAM_BOT_TOKEN"],
            Platform::Discord => &["DISCORD_BOT_TOKEN"],
            Platform::Slack => &["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"],
        }
    }

    /// The `bridges:` section: the chat mapped to `#team`, answered by the team's front agent.
    fn yaml(&self, team: &str) -> String {
        let p = self.platform.as_str();
        let vars = self.token_vars();
        let app = vars.get(1).map(|v| format!("    app_token_env: {v}\n")).unwrap_or_default();
        let api = self.api_url.as_ref().map(|u| format!("    api_url: {u}\n")).unwrap_or_default();
        let responder = if team == "assistant" { "coordinator" } else { "orchestrator" };
        format!(
            "\nbridges:\n  - name: {p}\n    platform: {p}\n    token_env: {}\n{app}{api}    \
             channels:\n      - {{ flock: team, external: {}, responder: {responder} }}\n",
            vars[0],
            quoted(&self.chat)
        )
    }
}

/// What a swarm file is written from. They are recorded in the file's header, so a re-run of
/// `init` starts from them and changes only what it is told to.
#[derive(Debug, Clone, PartialEq)]
struct Choices {
    team: String,
    /// As `--model` takes it: `local`, `openai:MODEL`, a URL…
    model: String,
    model_id: Option<String>,
    api_key_env: Option<String>,
    name: String,
    bridge: Option<Bridge>,
}

/// The header line that records the choices, as `init`'s own flags.
const CHOICES_LINE: &str = "# flockctl init";

impl Choices {
    /// The choices as `init`'s flags.
    fn flags(&self) -> Vec<String> {
        let mut f: Vec<String> = vec!["--team".into(), self.team.clone()];
        f.extend(["--model".into(), self.model.clone()]);
        let optional = [("--model-id", &self.model_id), ("--api-key-env", &self.api_key_env)];
        for (flag, value) in optional {
            if let Some(v) = value {
                f.extend([flag.into(), v.clone()]);
            }
        }
        f.extend(["--name".into(), self.name.clone()]);
        if let Some(b) = &self.bridge {
            f.extend([
                "--bridge".into(),
                b.platform.as_str().into(),
                "--chat".into(),
                b.chat.clone(),
            ]);
            if let Some(u) = &b.api_url {
                f.extend(["--bridge-url".into(), u.clone()]);
            }
        }
        f
    }

    /// The choices recorded in the header of a file `init` wrote; `None` for any other file.
    fn recorded(text: &str) -> Option<Choices> {
        #[derive(clap::Parser)]
        #[command(no_binary_name = true)]
        struct Recorded {
            #[command(flatten)]
            args: InitArgs,
        }
        use clap::Parser as _;
        let line = text
            .lines()
            .take_while(|l| l.starts_with('#'))
            .find_map(|l| l.strip_prefix(CHOICES_LINE)?.strip_prefix(' '))?;
        let args = Recorded::try_parse_from(line.split_whitespace()).ok()?.args;
        let bridge = match (&args.bridge, &args.chat) {
            (Some(p), Some(chat)) => Some(Bridge {
                platform: Platform::parse(p)?,
                chat: chat.clone(),
                api_url: args.bridge_url.clone(),
            }),
            _ => None,
        };
        Some(Choices {
            team: args.team?,
            model: args.model?,
            model_id: args.model_id,
            api_key_env: args.api_key_env,
            name: args.name?,
            bridge,
        })
    }

    /// The file's text and its model; `Err` says which choice is not one.
    fn render(&self, file: &Path) -> Result<(String, Model)> {
        let model =
            Model::parse(&self.model, self.model_id.as_deref(), self.api_key_env.as_deref())?;
        match (self.team == OFFICE, model == Model::Scripted) {
            (true, true) | (false, false) => {}
            (true, false) => bail!(
                "the office team runs scripted models (no LLM): leave out --model, or pick \
                 `--team assistant` to run `{}`",
                self.model
            ),
            (false, true) => bail!(
                "`scripted` is the office team's model: pick `--team office`, or a model the \
                 {} team can think with (`local`, `openai:MODEL`, …)",
                self.team
            ),
        }
        // A value with spaces could not be read back from the header line: then the file has
        // none, and a re-run needs --force like for a file written by hand.
        let flags = self.flags();
        let line = if flags.iter().any(|f| f.chars().any(char::is_whitespace)) {
            String::new()
        } else {
            format!("{CHOICES_LINE} {}\n", flags.join(" "))
        };
        Ok((swarm_yaml(self, &model, &line, file), model))
    }

    /// What changed from `old` to `self`, one entry per choice.
    fn changes(&self, old: &Choices) -> Vec<String> {
        let chat = |c: &Choices| {
            c.bridge.as_ref().map_or("none".to_owned(), |b| {
                format!("{} {}", b.platform.as_str(), b.chat)
                    + &b.api_url.as_ref().map(|u| format!(" at {u}")).unwrap_or_default()
            })
        };
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "none".to_owned());
        [
            ("team", old.team.clone(), self.team.clone()),
            ("model", old.model.clone(), self.model.clone()),
            ("model id", opt(&old.model_id), opt(&self.model_id)),
            ("key variable", opt(&old.api_key_env), opt(&self.api_key_env)),
            ("name", old.name.clone(), self.name.clone()),
            ("chat", chat(old), chat(self)),
        ]
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(what, a, b)| format!("{what} {a} → {b}"))
        .collect()
    }
}

/// A file's text below its leading comment lines (what the choices decide; the header names the
/// path it was written as).
fn body(text: &str) -> &str {
    let mut rest = text;
    while rest.starts_with('#') {
        rest = rest.split_once('\n').map_or("", |(_, r)| r);
    }
    rest
}

/// The whole file.
fn swarm_yaml(c: &Choices, model: &Model, choices_line: &str, file: &Path) -> String {
    let models = match model {
        Model::Scripted => format!(
            "models:\n{}\ndefaults:\n  model: worker          # every agent runs `worker` unless it \
             says otherwise\n\n",
            model.yaml(&c.team)
        ),
        _ => format!(
            "models:\n  main:\n{}defaults:\n  model: main            # every agent runs `main` \
             unless it says otherwise\n\n",
            model.yaml(&c.team)
        ),
    };
    format!(
        "# Written by `flockctl init`. Check it: flock-supervisor validate {file}\n\
         # Run it: flock-supervisor up {file} --detach   (every key: docs/swarm-file.md)\n\
         {choices_line}\
         swarm:\n  name: {name}\n\n\
         {models}\
         {team}{bridge}",
        file = file.display(),
        name = c.name,
        team = team_yaml(&c.team),
        bridge = c.bridge.as_ref().map(|b| b.yaml(&c.team)).unwrap_or_default(),
    )
}

/// Whose bot `token` is, asked of the platform by `flock-bridge check` (the bridge's own
/// clients; the token goes over its stdin). `Ok(Err(why))`: the platform could not be asked.
async fn check_token(bridge: &Bridge, var: &str, token: &str) -> Result<Result<String, String>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let program = flock_supervisor::spawn::sibling_binary(
        "flock-bridge",
        "FLOCK_BRIDGE_BIN",
        "install Flock with scripts/install, or build it with `cargo build -p flock-bridge`",
    )?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg("check").arg(bridge.platform.as_str()).args(bridge.api_url.iter());
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start flock-bridge to check the token")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(format!("{}\n", token.trim()).as_bytes()).await?;
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out).await?;
    }
    let status = child.wait().await?;
    let said: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
    let why = said["error"].as_str().unwrap_or("no answer").to_owned();
    match (status.code(), said["bot"].as_str()) {
        (Some(0), Some(bot)) => Ok(Ok(bot.to_owned())),
        (Some(1), _) => bail!(
            "{} refused the token in {var} ({why}): copy it again from {}; nothing was written",
            bridge.platform.as_str(),
            match bridge.platform {
                Platform::Telegram => "@BotFather (/token)",
                Platform::Discord => "the Developer Portal (Bot → Reset Token)",
                Platform::Slack => "api.slack.com/apps (OAuth & Permissions)",
            }
        ),
        _ => Ok(Err(format!(
            "the token in {var} could not be checked with {} ({why}); `up` will tell",
            bridge.platform.as_str()
        ))),
    }
}

/// Questions on the terminal (dialoguer: arrow keys for a pick, a hidden entry for a secret),
/// written to stderr so stdout keeps only the result.
mod prompt {
    use anyhow::{Context, Result};
    use dialoguer::theme::ColorfulTheme;
    use dialoguer::{Input, Password, Select};

    /// A line of text; Enter takes `default` (none when it is empty).
    pub(super) fn text(question: &str, default: &str) -> Result<String> {
        let theme = ColorfulTheme::default();
        let mut input = Input::<String>::with_theme(&theme).with_prompt(question);
        input = if default.is_empty() {
            input.allow_empty(true)
        } else {
            input.default(default.to_owned())
        };
        Ok(input.interact_text().context("read the answer from the terminal")?.trim().to_owned())
    }

    /// One of `items` (name, what it is), starting on `default`.
    pub(super) fn pick(question: &str, items: &[(&str, &str)], default: &str) -> Result<String> {
        let shown: Vec<String> = items.iter().map(|(n, what)| format!("{n:<10} {what}")).collect();
        let at = items.iter().position(|(n, _)| *n == default).unwrap_or(0);
        let chosen = Select::with_theme(&ColorfulTheme::default())
            .with_prompt(question)
            .items(&shown)
            .default(at)
            .interact()
            .context("read the choice from the terminal")?;
        Ok(items[chosen].0.to_owned())
    }

    /// A secret, not shown while it is typed (empty: none).
    pub(super) fn secret(question: &str) -> Result<String> {
        let entry = Password::with_theme(&ColorfulTheme::default())
            .with_prompt(question)
            .allow_empty_password(true)
            .interact()
            .context("read the secret from the terminal")?;
        Ok(entry.trim().to_owned())
    }
}

/// What `GET /models` of the server at `url` lists, or why it could not be asked (for a note).
async fn probe(url: &str) -> Result<Vec<String>, String> {
    let client = flock_llm::LlmClient::new().map_err(|e| e.to_string())?;
    client.list_models(url, std::time::Duration::from_secs(5)).await.map_err(|e| {
        format!("{url} could not be asked for its models ({e}); start the server first")
    })
}

/// The choices for this run: the flags, else what the file recorded (a re-run), else asked on a
/// terminal, else the defaults. A new `--model` or `--bridge` drops what belonged to the old one.
fn choose(args: &InitArgs, before: Option<&Choices>, asking: bool) -> Result<Choices> {
    let team = match (&args.team, before) {
        (Some(t), _) => t.clone(),
        (None, Some(b)) => b.team.clone(),
        (None, None) if asking => prompt::pick("team", &TEAMS, "assistant")?,
        (None, None) => "assistant".to_owned(),
    };
    // The office runs its scripted models; a team that thinks needs a model (a team changed from
    // or to the office does not keep the other's).
    let kept = before.filter(|b| (b.model == "scripted") == (team == OFFICE));
    let (model, model_id, api_key_env) = match (&args.model, kept) {
        (Some(m), _) => (m.clone(), args.model_id.clone(), args.api_key_env.clone()),
        (None, _) if team == OFFICE => ("scripted".to_owned(), None, None),
        (None, Some(b)) => (
            b.model.clone(),
            args.model_id.clone().or_else(|| b.model_id.clone()),
            args.api_key_env.clone().or_else(|| b.api_key_env.clone()),
        ),
        (None, None) => {
            let model = if asking {
                eprintln!(
                    "  local (embedded 1.5B, no key) · local-small (0.5B) · openai:MODEL · \
                     anthropic:MODEL · http://HOST:PORT/v1 (Ollama, llama.cpp, vLLM)"
                );
                prompt::text("model", "local")?
            } else {
                "local".to_owned()
            };
            (model, args.model_id.clone(), args.api_key_env.clone())
        }
    };
    let model_id = match model_id {
        None if asking && model.starts_with("http") => {
            Some(prompt::text("the model's name on that server", "qwen2.5:7b")?)
        }
        id => id,
    };
    let name = match (&args.name, before) {
        (Some(n), _) => n.clone(),
        (None, Some(b)) => b.name.clone(),
        (None, None) if asking => prompt::text("swarm name", &team)?,
        (None, None) => team.clone(),
    };
    let platform = match (&args.bridge, before) {
        _ if args.no_bridge => None,
        (Some(platform), _) => Some(
            Platform::parse(platform)
                .ok_or_else(|| anyhow::anyhow!("unknown chat platform `{platform}`"))?,
        ),
        (None, Some(_)) => None,
        (None, None) if asking => Platform::parse(&prompt::pick("chat", &CHATS, "none")?),
        (None, None) => None,
    };
    let bridge = match (platform, before) {
        _ if args.no_bridge => None,
        (Some(platform), _) => {
            let chat = match &args.chat {
                Some(c) => c.clone(),
                None if asking => {
                    prompt::text(&format!("the {} chat to connect", platform.as_str()), "")?
                }
                None => String::new(),
            };
            if chat.trim().is_empty() {
                bail!(
                    "--bridge {} needs --chat ID: the chat the team answers in (docs/bridges.md \
                     says where to find its id)",
                    platform.as_str()
                );
            }
            Some(Bridge {
                platform,
                chat: chat.trim().to_owned(),
                api_url: args.bridge_url.clone(),
            })
        }
        (None, Some(b)) => b.bridge.clone(),
        (None, None) => None,
    };
    Ok(Choices { team, model, model_id, api_key_env, name, bridge })
}

pub(crate) async fn run(args: InitArgs) -> Result<ExitCode> {
    let asking = !args.yes && std::io::stdin().is_terminal();
    let file = &args.file;
    if file.is_dir() {
        bail!(
            "{} is a folder: give the file to write, e.g. {}",
            file.display(),
            file.join("flock.yaml").display()
        );
    }
    // A file already there: one `init` wrote and nobody changed since is edited (its recorded
    // choices, changed by the flags); any other is written over only with --force.
    let current = match std::fs::read_to_string(file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("read {}", file.display())),
    };
    let before = current.as_deref().and_then(Choices::recorded);
    if let (Some(text), false) = (&current, args.force) {
        let untouched = before
            .as_ref()
            .and_then(|b| b.render(file).ok())
            .is_some_and(|(was, _)| body(&was) == body(text));
        if !untouched {
            bail!(
                "{} exists{}: init does not write over it. Edit it by hand, or pass --force to \
                 replace it (the old one is kept as {}.bak), or give another file",
                file.display(),
                if before.is_some() {
                    " and was changed since init wrote it"
                } else {
                    " and init did not write it"
                },
                file.display()
            );
        }
    }
    if asking {
        let what = if before.is_some() { "changes" } else { "writes" };
        eprintln!("flockctl init {what} the swarm file {}", file.display());
    }
    let choices = choose(&args, before.as_ref(), asking)?;
    let (text, model) = choices.render(file)?;
    // Checked as `validate` checks it, before anything is written (a name or URL given on the
    // command line that the swarm file does not accept is refused with the loader's words).
    let spec = flock_config::parse(&text, file)
        .map_err(|e| anyhow::anyhow!("not written: the swarm file would not be valid:\n{e}"))?;
    // The bridge's tokens: from the environment, else the .env already there, else asked for;
    // the bot's checked with the platform before anything is written.
    let mut dotenv = flock_supervisor::dotenv::read(file)?;
    let mut keep: Vec<(String, String)> = Vec::new();
    let mut bot = None;
    let mut warnings = Vec::new();
    if let Some(b) = &choices.bridge {
        for (i, var) in b.token_vars().iter().enumerate() {
            let given = std::env::var(var).ok().filter(|v| !v.trim().is_empty());
            let value = match given.or_else(|| dotenv.get(*var).cloned()) {
                Some(v) => Some(v),
                None if asking => {
                    Some(prompt::secret(&format!("{var} (kept in .env, mode 0600; not shown)"))?)
                        .filter(|v| !v.is_empty())
                }
                None => None,
            };
            let Some(value) = value else { continue };
            if i == 0 {
                match check_token(b, var, &value).await? {
                    Ok(name) => bot = Some(name),
                    Err(why) => warnings.push(why),
                }
            }
            // Already in .env as it is: nothing to write.
            if dotenv.get(*var).map(|v| v.trim()) != Some(value.trim()) {
                keep.push(((*var).to_owned(), value.trim().to_owned()));
            }
        }
        dotenv.extend(keep.iter().cloned());
    }
    warnings.extend(flock_supervisor::secrets::missing_secrets(&spec, &dotenv));
    if let Model::Local(known) = &model {
        let present = flock_supervisor::model::flock_home()
            .zip(flock_config::KnownModel::find(known))
            .is_some_and(|(home, m)| home.join("models").join(m.file).is_file());
        if !present {
            warnings.push(format!(
                "the model {known} is not on this machine yet: `scripts/setup --model {known}` \
                 fetches it (`scripts/up` does it for you)"
            ));
        }
    }
    if let Model::Server { url, model: wanted, .. } = &model {
        match probe(url).await {
            Ok(models) if !models.is_empty() && !models.iter().any(|m| m == wanted) => warnings
                .push(format!("{url} does not list `{wanted}`; it lists: {}", models.join(", "))),
            Ok(_) => {}
            Err(why) => warnings.push(why),
        }
    }

    // What this run does to the file: writes it, changes it (the old one kept), or nothing.
    let changes = before.as_ref().map(|b| choices.changes(b)).unwrap_or_default();
    let action = match &current {
        None => "written",
        Some(old) if body(old) == body(&text) && !args.force => "unchanged",
        Some(_) => {
            let backup = PathBuf::from(format!("{}.bak", file.display()));
            std::fs::copy(file, &backup)
                .with_context(|| format!("keep {} as {}", file.display(), backup.display()))?;
            if before.is_some() && !args.force { "changed" } else { "replaced" }
        }
    };
    if action != "unchanged" {
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(file, &text).with_context(|| format!("write {}", file.display()))?;
    }
    let env_file = flock_supervisor::dotenv::path_for(file);
    if !keep.is_empty() {
        flock_supervisor::dotenv::update(&env_file, &keep)?;
    }
    let Choices { team, name, bridge, .. } = &choices;
    let chat = bridge
        .as_ref()
        .map(|b| json!({"platform": b.platform.as_str(), "chat": b.chat, "bot": bot}));

    if args.json {
        let out = json!({
            "file": file.display().to_string(),
            "action": action,
            "changes": changes,
            "swarm": name,
            "team": team,
            "model": model.describe(),
            "agents": spec.agents.len(),
            "bridge": chat,
            "env_file": (!keep.is_empty()).then(|| env_file.display().to_string()),
            "warnings": warnings,
        });
        println!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    let what = format!(
        "swarm `{name}`, the {team} team ({} agents) on {}",
        spec.agents.len(),
        model.describe()
    );
    match action {
        "unchanged" => println!("{} already says that: {what}; nothing written", file.display()),
        "changed" => println!(
            "changed {}: {} (the old one is kept as {}.bak)",
            file.display(),
            changes.join(", "),
            file.display()
        ),
        "replaced" => println!(
            "wrote {}: {what} (the old one is kept as {}.bak)",
            file.display(),
            file.display()
        ),
        _ => println!("wrote {}: {what}", file.display()),
    }
    if let Some(b) = bridge {
        let whose = bot.as_ref().map(|n| format!(" as {n}")).unwrap_or_default();
        println!(
            "  chat: {} {} ↔ #team{whose}; people may also write to the bot directly",
            b.platform.as_str(),
            b.chat
        );
    }
    if !keep.is_empty() {
        let vars: Vec<&str> = keep.iter().map(|(v, _)| v.as_str()).collect();
        println!("  kept {} in {} (mode 0600; up reads it)", vars.join(", "), env_file.display());
    }
    for w in &warnings {
        println!("  note: {w}");
    }
    println!("next:\n  flock-supervisor up {} --detach\n  {}", file.display(), first_steps(team));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choices(team: &str, model: &str, id: Option<&str>, bridge: Option<Bridge>) -> Choices {
        Choices {
            team: team.into(),
            model: model.into(),
            model_id: id.map(str::to_owned),
            api_key_env: None,
            name: team.into(),
            bridge,
        }
    }

    #[test]
    fn every_team_and_model_choice_writes_a_file_that_validates() {
        let file = Path::new("/tmp/flock.yaml");
        for team in ["assistant", "project"] {
            for (model, id) in [
                ("local", None),
                ("local-small", None),
                ("openai:gpt-4o-mini", None),
                ("anthropic:claude-sonnet-4-5", None),
                ("http://127.0.0.1:11434/v1", Some("qwen2.5:7b")),
            ] {
                let (text, _) = choices(team, model, id, None).render(file).unwrap();
                let spec = flock_config::parse(&text, file)
                    .unwrap_or_else(|e| panic!("{team} on {model}:\n{e}\n{text}"));
                assert!(spec.agents.len() >= 4, "{team}");
                let err = choices(OFFICE, model, id, None).render(file).unwrap_err();
                assert!(err.to_string().contains("leave out --model"), "{err}");
            }
            let err = choices(team, "scripted", None, None).render(file).unwrap_err();
            assert!(err.to_string().contains("pick `--team office`"), "{err}");
        }
        let (text, model) = choices(OFFICE, "scripted", None, None).render(file).unwrap();
        let spec = flock_config::parse(&text, file).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let names: Vec<&str> = spec.agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["orchestrator", "sysadmin", "worker-1", "worker-2"]);
        assert!(spec.models.values().all(|m| matches!(m, flock_config::ModelSpec::Scripted(_))));
        assert_eq!(model, Model::Scripted);
    }

    #[test]
    fn every_team_with_every_chat_platform_writes_a_file_that_validates() {
        let file = Path::new("/tmp/flock.yaml");
        for team in ["assistant", "project", OFFICE] {
            let responder = if team == "assistant" { "coordinator" } else { "orchestrator" };
            let model = if team == OFFICE { "scripted" } else { "local" };
            for platform in Platform::ALL {
                let url = Some("http://127.0.0.1:9/api".to_owned());
                let bridge = Bridge { platform, chat: "-100123".into(), api_url: url };
                let (text, _) =
                    choices(team, model, None, Some(bridge.clone())).render(file).unwrap();
                let spec = flock_config::parse(&text, file)
                    .unwrap_or_else(|e| panic!("{team} with {platform:?}:\n{e}\n{text}"));
                let b = &spec.bridges[0];
                assert_eq!((b.platform, b.token_env.as_str()), (platform, bridge.token_vars()[0]));
                assert_eq!(b.app_token_env.is_some(), platform == Platform::Slack);
                let m = &b.channels[0];
                assert_eq!((m.flock.as_str(), m.external.as_str()), ("team", "-100123"));
                assert_eq!(m.responder.as_deref(), Some(responder), "{team}");
            }
        }
    }

    #[test]
    fn the_choices_are_read_back_from_the_header_and_a_hand_edit_is_seen() {
        let file = Path::new("/tmp/flock.yaml");
        let bridge = Bridge {
            platform: Platform::Telegram,
            chat: "-100123".into(),
            api_url: Some("http://127.0.0.1:9/api".into()),
        };
        let mut c = choices("project", "http://127.0.0.1:11434/v1", Some("qwen2.5:7b"), None);
        c.api_key_env = Some("OLLAMA_KEY".into());
        c.bridge = Some(bridge);
        let (text, _) = c.render(file).unwrap();
        assert!(text.contains("\n# flockctl init --team project --model http://"), "{text}");
        assert_eq!(Choices::recorded(&text), Some(c.clone()));
        // Under another path the header differs, the body does not.
        let (elsewhere, _) = c.render(Path::new("other/flock.yaml")).unwrap();
        assert_ne!(elsewhere, text);
        assert_eq!(body(&elsewhere), body(&text));
        assert_ne!(body(&text.replace("role: worker", "role: worker\n    tools: []")), body(&text));
        // A file init did not write has no choices; a value with spaces is not recorded.
        assert_eq!(Choices::recorded("swarm:\n  name: x\n"), None);
        let spaced = choices("assistant", "openai:my model", None, None);
        assert_eq!(Choices::recorded(&spaced.render(file).unwrap().0), None);

        let mut changed = c.clone();
        changed.model = "local".into();
        changed.bridge = None;
        let said = changed.changes(&c).join(", ");
        assert_eq!(
            said,
            "model http://127.0.0.1:11434/v1 → local, chat telegram -100123 at \
             http://127.0.0.1:9/api → none"
        );
    }

    #[test]
    fn a_rerun_keeps_what_the_flags_leave_out_and_a_new_model_drops_the_old_ones_id() {
        let mut before =
            choices("assistant", "http://127.0.0.1:11434/v1", Some("qwen2.5:7b"), None);
        before.name = "home".into();
        let args = |extra: &[&str]| {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                args: InitArgs,
            }
            use clap::Parser as _;
            Cli::parse_from(["init"].iter().chain(extra)).args
        };
        let same = choose(&args(&[]), Some(&before), false).unwrap();
        assert_eq!(same, before);
        let team = choose(&args(&["--team", "project"]), Some(&before), false).unwrap();
        assert_eq!((team.team.as_str(), team.name.as_str()), ("project", "home"));
        assert_eq!(team.model_id, before.model_id);
        let model = choose(&args(&["--model", "openai:gpt-4o"]), Some(&before), false).unwrap();
        assert_eq!((model.model.as_str(), model.model_id), ("openai:gpt-4o", None));
        let chat = ["--bridge", "telegram", "--chat", "-100"];
        let with = choose(&args(&chat), Some(&before), false).unwrap();
        assert_eq!(with.bridge.as_ref().map(|b| b.chat.as_str()), Some("-100"));
        let without = choose(&args(&["--no-bridge"]), Some(&with), false).unwrap();
        assert_eq!(without.bridge, None);
        // To the office and back: its scripted models are not kept for a team that thinks.
        let office = choose(&args(&["--team", "office"]), Some(&before), false).unwrap();
        assert_eq!((office.model.as_str(), office.model_id.as_deref()), ("scripted", None));
        let back = choose(&args(&["--team", "assistant"]), Some(&office), false).unwrap();
        assert_eq!(back.model, "local");
    }

    #[test]
    fn a_model_choice_that_is_not_one_says_what_is() {
        let err = Model::parse("ollama", None, None).unwrap_err().to_string();
        assert!(err.contains("--model http://127.0.0.1:11434/v1"), "{err}");
        let err = Model::parse("http://127.0.0.1:11434/v1", None, None).unwrap_err().to_string();
        assert!(err.contains("--model-id"), "{err}");
        let err = Model::parse("openai:", None, None).unwrap_err().to_string();
        assert!(err.contains("openai:gpt-4o-mini"), "{err}");
        assert_eq!(
            Model::parse("openai:gpt-4o", None, Some("MY_KEY")).unwrap(),
            Model::Hosted { provider: "openai", model: "gpt-4o".into(), key_env: "MY_KEY".into() }
        );
    }
}
