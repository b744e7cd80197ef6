//! `flockctl init`: a swarm file from a few choices (the team, its model), checked as
//! `flock-supervisor validate` checks one before it is written, never written over silently.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use flock_config::Platform;
use serde_json::json;

use crate::args::InitArgs;

/// The teams `init` writes.
const TEAMS: [(&str, &str); 2] = [
    ("assistant", "a coordinator and a worker with long-term memory — answers your requests"),
    ("project", "an orchestrator and pm, dev, qa — plans, builds and checks projects in channels"),
];

/// The model every agent of the written swarm runs.
#[derive(Debug, Clone, PartialEq)]
enum Model {
    /// The embedded model (`provider: local`) by its known name.
    Local(&'static str),
    /// `provider: openai` or `anthropic` with the model's name and the key's variable.
    Hosted { provider: &'static str, model: String, key_env: String },
    /// An OpenAI-compatible server by URL (Ollama, llama.cpp, vLLM), key optional.
    Server { url: String, model: String, key_env: Option<String> },
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

    /// The `models:` entry, indented under `main:`.
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
        }
    }

    fn describe(&self) -> String {
        match self {
            Model::Local(name) => format!("the embedded model {name}"),
            Model::Hosted { provider, model, .. } => format!("{provider} {model}"),
            Model::Server { url, model, .. } => format!("{model} at {url}"),
        }
    }
}

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
        "project" => {
            "flockctl channel create lobby --topic \"Project requests\" --members orchestrator --as alice\n  \
             flockctl post '#lobby' \"New project: a login page with email and password\" --as alice"
        }
        _ => "flockctl send coordinator \"Plan my week\" --wait",
    }
}

/// A chat the swarm answers in, through a bridge.
#[derive(Debug, Clone)]
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
        let responder = if team == "project" { "orchestrator" } else { "coordinator" };
        format!(
            "\nbridges:\n  - name: {p}\n    platform: {p}\n    token_env: {}\n{app}{api}    \
             channels:\n      - {{ flock: team, external: {}, responder: {responder} }}\n",
            vars[0],
            quoted(&self.chat)
        )
    }
}

/// The whole file.
fn swarm_yaml(
    name: &str,
    team: &str,
    model: &Model,
    bridge: Option<&Bridge>,
    file: &Path,
) -> String {
    format!(
        "# Written by `flockctl init`. Check it: flock-supervisor validate {file}\n\
         # Run it: flock-supervisor up {file} --detach   (every key: docs/swarm-file.md)\n\
         swarm:\n  name: {name}\n\n\
         models:\n  main:\n{model}\
         defaults:\n  model: main            # every agent runs `main` unless it says otherwise\n\n\
         {team}{bridge}",
        file = file.display(),
        model = model.yaml(team),
        team = team_yaml(team),
        bridge = bridge.map(|b| b.yaml(team)).unwrap_or_default(),
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

/// Asks `question` on the terminal with `default`; an empty line takes the default.
fn ask(question: &str, default: &str) -> Result<String> {
    eprint!("{question} [{default}]: ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("read the answer from the terminal")?;
    let line = line.trim();
    Ok(if line.is_empty() { default.to_owned() } else { line.to_owned() })
}

/// What `GET /models` of the server at `url` lists, or why it could not be asked (for a note).
async fn probe(url: &str) -> Result<Vec<String>, String> {
    let client = flock_llm::LlmClient::new().map_err(|e| e.to_string())?;
    client.list_models(url, std::time::Duration::from_secs(5)).await.map_err(|e| {
        format!("{url} could not be asked for its models ({e}); start the server first")
    })
}

pub(crate) async fn run(args: InitArgs) -> Result<ExitCode> {
    let asking = !args.yes && std::io::stdin().is_terminal();
    if asking {
        eprintln!(
            "flockctl init: a swarm file in {} (Enter takes the default)",
            args.file.display()
        );
    }
    let team = match &args.team {
        Some(t) => t.clone(),
        None if asking => {
            for (name, what) in TEAMS {
                eprintln!("  {name:<10} {what}");
            }
            let t = ask("team", "assistant")?;
            if !TEAMS.iter().any(|(n, _)| *n == t) {
                bail!("unknown team `{t}`: `assistant` or `project`");
            }
            t
        }
        None => "assistant".to_owned(),
    };
    let choice = match &args.model {
        Some(m) => m.clone(),
        None if asking => {
            eprintln!(
                "  local (embedded 1.5B, no key) · local-small (0.5B) · openai:MODEL · \
                 anthropic:MODEL · http://HOST:PORT/v1 (Ollama, llama.cpp, vLLM)"
            );
            ask("model", "local")?
        }
        None => "local".to_owned(),
    };
    let model_id = match (&args.model_id, choice.starts_with("http")) {
        (None, true) if asking => Some(ask("the model's name on that server", "qwen2.5:7b")?),
        (id, _) => id.clone(),
    };
    let model = Model::parse(&choice, model_id.as_deref(), args.api_key_env.as_deref())?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None if asking => ask("swarm name", &team)?,
        None => team.clone(),
    };

    let bridge = match &args.bridge {
        Some(platform) => {
            let platform = Platform::parse(platform)
                .ok_or_else(|| anyhow::anyhow!("unknown chat platform `{platform}`"))?;
            let chat = match &args.chat {
                Some(c) => c.clone(),
                None if asking => ask(&format!("the {} chat to connect", platform.as_str()), "")?,
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
        None => None,
    };

    let file = &args.file;
    if file.is_dir() {
        bail!(
            "{} is a folder: give the file to write, e.g. {}",
            file.display(),
            file.join("flock.yaml").display()
        );
    }
    let text = swarm_yaml(&name, &team, &model, bridge.as_ref(), file);
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
    if let Some(b) = &bridge {
        for (i, var) in b.token_vars().iter().enumerate() {
            let given = std::env::var(var).ok().filter(|v| !v.trim().is_empty());
            let value = match given.or_else(|| dotenv.get(*var).cloned()) {
                Some(v) => Some(v),
                None if asking => Some(ask(&format!("{var} (kept in .env, mode 0600)"), "")?)
                    .filter(|v| !v.trim().is_empty()),
                None => None,
            };
            let Some(value) = value else { continue };
            if i == 0 {
                match check_token(b, var, &value).await? {
                    Ok(name) => bot = Some(name),
                    Err(why) => warnings.push(why),
                }
            }
            keep.push(((*var).to_owned(), value.trim().to_owned()));
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

    if file.exists() {
        if !args.force {
            bail!(
                "{} exists: init does not write over it. Pass --force to replace it (the old one \
                 is kept as {}.bak), or give another file",
                file.display(),
                file.display()
            );
        }
        let backup = PathBuf::from(format!("{}.bak", file.display()));
        std::fs::copy(file, &backup)
            .with_context(|| format!("keep {} as {}", file.display(), backup.display()))?;
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(file, &text).with_context(|| format!("write {}", file.display()))?;
    let env_file = flock_supervisor::dotenv::path_for(file);
    if !keep.is_empty() {
        flock_supervisor::dotenv::update(&env_file, &keep)?;
    }
    let chat = bridge
        .as_ref()
        .map(|b| json!({"platform": b.platform.as_str(), "chat": b.chat, "bot": bot}));

    if args.json {
        let out = json!({
            "file": file.display().to_string(),
            "swarm": name,
            "team": team,
            "model": model.describe(),
            "agents": spec.agents.len(),
            "bridge": chat,
            "env_file": (!keep.is_empty()).then(|| env_file.display().to_string()),
            "warnings": warnings,
        });
        println!("{out}");
    } else {
        println!(
            "wrote {}: swarm `{name}`, the {team} team ({} agents) on {}",
            file.display(),
            spec.agents.len(),
            model.describe()
        );
        if let Some(b) = &bridge {
            let whose = bot.as_ref().map(|n| format!(" as {n}")).unwrap_or_default();
            println!(
                "  chat: {} {} ↔ #team{whose}; people may also write to the bot directly",
                b.platform.as_str(),
                b.chat
            );
        }
        if !keep.is_empty() {
            let vars: Vec<&str> = keep.iter().map(|(v, _)| v.as_str()).collect();
            println!(
                "  kept {} in {} (mode 0600; up reads it)",
                vars.join(", "),
                env_file.display()
            );
        }
        for w in &warnings {
            println!("  note: {w}");
        }
        println!(
            "next:\n  flock-supervisor up {} --detach\n  {}",
            file.display(),
            first_steps(&team)
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_team_and_model_choice_writes_a_file_that_validates() {
        let file = Path::new("/tmp/flock.yaml");
        for team in ["assistant", "project"] {
            for (choice, id) in [
                ("local", None),
                ("local-small", None),
                ("openai:gpt-4o-mini", None),
                ("anthropic:claude-sonnet-4-5", None),
                ("http://127.0.0.1:11434/v1", Some("qwen2.5:7b")),
            ] {
                let model = Model::parse(choice, id, None).unwrap();
                let text = swarm_yaml(team, team, &model, None, file);
                let spec = flock_config::parse(&text, file)
                    .unwrap_or_else(|e| panic!("{team} on {choice}:\n{e}\n{text}"));
                assert!(spec.agents.len() >= 4, "{team}");
            }
        }
    }

    #[test]
    fn every_team_with_every_chat_platform_writes_a_file_that_validates() {
        let file = Path::new("/tmp/flock.yaml");
        let model = Model::parse("local", None, None).unwrap();
        for team in ["assistant", "project"] {
            for platform in Platform::ALL {
                let url = Some("http://127.0.0.1:9/api".to_owned());
                let bridge = Bridge { platform, chat: "-100123".into(), api_url: url };
                let text = swarm_yaml(team, team, &model, Some(&bridge), file);
                let spec = flock_config::parse(&text, file)
                    .unwrap_or_else(|e| panic!("{team} with {platform:?}:\n{e}\n{text}"));
                let b = &spec.bridges[0];
                assert_eq!((b.platform, b.token_env.as_str()), (platform, bridge.token_vars()[0]));
                assert_eq!(b.app_token_env.is_some(), platform == Platform::Slack);
                let m = &b.channels[0];
                assert_eq!((m.flock.as_str(), m.external.as_str()), ("team", "-100123"));
            }
        }
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
