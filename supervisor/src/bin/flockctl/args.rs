//! flockctl's command line: every subcommand and option, with the help text users read.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use clap_complete::engine::ArgValueCandidates;

#[derive(Parser)]
#[command(name = "flockctl", version, about = "Drive a running Flock swarm")]
pub(crate) struct Cli {
    /// State dir of the swarm [default: $FLOCK_HOME or ~/.flock].
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub(crate) enum BridgeCommand {
    /// Every bridge of the swarm: state, pid, posts waiting to go out, messages in/out, last
    /// error, and which channel maps to which chat.
    #[command(alias = "list")]
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// One bridge in detail: state, pid, restarts, last error, and each mapping (channel ↔
    /// chat, who may post, its outbound cursor and the posts waiting, whether the chat refuses
    /// posts and why).
    Status {
        /// The bridge's name in the swarm file (`flockctl bridge ls` lists them).
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Map a platform chat to a channel while the swarm runs.
    ///
    /// Replaces the chat's mapping, if it has one; kept across restarts, over the swarm file's
    /// mappings. The bridge restarts to take it up; nothing is lost (its cursors are durable). A
    /// new mapping starts at the channel's newest post: no history is sent to the chat.
    Map {
        /// The bridge's name in the swarm file (`flockctl bridge ls` lists them).
        name: String,
        /// The platform's chat or channel id (Telegram `-100…`, Discord channel id, Slack `C…`).
        #[arg(allow_hyphen_values = true)]
        external: String,
        /// The Flock channel (`#team` or `team`); created if it does not exist.
        #[arg(add = ArgValueCandidates::new(crate::complete::channels))]
        channel: String,
        /// Only these platform user ids may post from the chat (comma-separated); everyone if
        /// left out.
        #[arg(long, value_delimiter = ',')]
        allow: Option<Vec<String>>,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a chat's mapping while the swarm runs.
    ///
    /// Kept across restarts, over the swarm file's mappings; the bridge restarts without it.
    Unmap {
        /// The bridge's name in the swarm file.
        name: String,
        /// The platform's chat or channel id whose mapping goes.
        #[arg(allow_hyphen_values = true)]
        external: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the app manifest to create the bot with (Slack: api.slack.com/apps → Create New
    /// App → From a manifest), with every scope and event the bridge needs.
    Manifest {
        #[arg(value_parser = ["slack"])]
        platform: String,
        /// The app's display name.
        #[arg(long, default_value = "Flock")]
        name: String,
    },
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// List every process and actor: state, pid, uptime, restarts, last exit, mailbox, turns,
    /// memory, tokens.
    ///
    /// On a terminal, states are in colour (green: ready or running, cyan: busy, yellow: starting,
    /// restarting, stopping; red: failed, stopped, exited) unless NO_COLOR is set.
    Ps {
        /// Print a JSON array instead of a table (with --watch: one compact array per line).
        #[arg(long)]
        json: bool,
        /// Keep showing it, refreshed every --interval: on a terminal a live view redrawn in
        /// place (Ctrl-C quits); piped, a new table each time, after a blank line.
        #[arg(short, long)]
        watch: bool,
        /// With --watch: seconds between refreshes.
        #[arg(long, value_name = "SECS", default_value_t = 1, requires = "watch",
              value_parser = clap::value_parser!(u64).range(1..))]
        interval: u64,
    },
    /// Send a message to an agent as human:operator; exits 0 once it is in the agent's durable
    /// mailbox. The agent's answer is posted in your DM with it, whose name this command prints
    /// (`flockctl read dm-coordinator--human-operator` for the coordinator); with --wait, it is
    /// printed here.
    ///
    /// Exit codes with --wait: 0 answered, 3 stopped by a budget (the reason is printed), 4 the
    /// work ended without an answer, 5 --timeout passed first, 1 any other error.
    #[command(verbatim_doc_comment)]
    Send {
        /// The agent, e.g. coordinator (`flockctl ps` lists them).
        #[arg(add = ArgValueCandidates::new(crate::complete::processes))]
        agent: String,
        /// The message (quote it; `-` reads it from standard input).
        text: String,
        /// Route in memory only (lost if the agent is down); no acceptance is awaited.
        #[arg(long, conflicts_with = "wait")]
        at_most_once: bool,
        /// Wait for the answer and print it (progress goes to stderr every 10 s).
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, default_value_t = 600, value_name = "SECS")]
        timeout: u64,
        /// Print as JSON: without --wait, that it was accepted (agent, chain, dm); with --wait,
        /// the outcome (chain, outcome, text, by, channel, seq, hops, tokens, elapsed_ms).
        #[arg(long)]
        json: bool,
    },
    /// Chains of turns in flight (one per outside input): hops, tokens and time against their
    /// budgets.
    Chains {
        #[arg(long)]
        json: bool,
    },
    /// Show an agent's log (spawns, exits, turns, tool calls); without an agent, every log (the
    /// agents', the model's, the bridges'), each line after the name of its log, in order of
    /// time.
    Logs {
        /// The agent, the model or a bridge (`flockctl ps` lists them) [default: all of them].
        #[arg(add = ArgValueCandidates::new(crate::complete::processes))]
        agent: Option<String>,
        /// Keep printing new lines (without an agent: of every log, agents created later too).
        #[arg(short, long)]
        follow: bool,
        /// How many past lines to show (without an agent: of each log).
        #[arg(short = 'n', long, default_value_t = 100)]
        lines: u32,
    },
    /// Stop an agent (it stays stopped until `start`).
    Stop {
        #[arg(add = ArgValueCandidates::new(crate::complete::processes))]
        agent: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a stopped or failed agent; waits until it is ready.
    Start {
        #[arg(add = ArgValueCandidates::new(crate::complete::processes))]
        agent: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Restart an agent; waits until it is ready again.
    Restart {
        #[arg(add = ArgValueCandidates::new(crate::complete::processes))]
        agent: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List messages that exhausted their delivery attempts, oldest first, a page at a time
    /// (texts are shown up to 2 000 characters).
    DeadLetters {
        /// How many to list (at most 500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Skip this many first (the next page: --offset 50).
        #[arg(long, default_value_t = 0)]
        offset: u32,
        #[arg(long)]
        json: bool,
    },
    /// Stop every agent in reverse start order, then the supervisor. With no swarm running in an
    /// existing state dir there is nothing to stop: exit 0.
    Down {
        /// Print the outcome as JSON: `{"stopped": true|false, "message": …}`.
        #[arg(long)]
        json: bool,
    },
    /// Permission requests waiting for a person (RED, or network access the sysadmin found
    /// safe); with --all, every request and how it was decided.
    Approvals {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Grant permission request ID; the agent's sandbox enforces it from its next command.
    Approve {
        id: i64,
        /// Why (recorded in the journal and told to the agent).
        #[arg(long)]
        reason: Option<String>,
        /// Grant for this many seconds only.
        #[arg(long, value_name = "SECS")]
        expires: Option<u64>,
        /// Decide as human:NAME [default: $USER, else operator].
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Refuse permission request ID; the agent is told why.
    Deny {
        id: i64,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Post to a channel as `human:NAME`.
    Post {
        /// The channel, e.g. '#project-login' (quote it: `#` starts a shell comment).
        #[arg(add = ArgValueCandidates::new(crate::complete::channels))]
        channel: String,
        /// The post (`-` reads it from standard input).
        text: String,
        /// Post as human:NAME [default: $USER, else operator].
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the post's channel and seq as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read a channel: the newest messages, or those after a seq; --follow keeps printing.
    Read {
        #[arg(add = ArgValueCandidates::new(crate::complete::channels))]
        channel: String,
        /// Only messages with seq greater than N.
        #[arg(long, value_name = "N")]
        after: Option<u64>,
        /// At most this many messages per page (max 200).
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Keep printing new messages as they arrive.
        #[arg(short, long)]
        follow: bool,
        #[arg(long)]
        json: bool,
    },
    /// List channels: state, topic, members, last seq.
    Channels {
        #[arg(long)]
        json: bool,
    },
    /// Create or archive a channel, or change its members (as a human, with orchestrator powers).
    Channel {
        #[command(subcommand)]
        command: ChannelCommand,
    },
    /// An agent's conversation sessions (one per channel; "(direct)" for messages and requests).
    Session {
        #[command(subcommand)]
        command: SessionCommand,
    },
    /// Create an agent at run time, or decommission one (orchestrator powers, as human:NAME).
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// The shared journal: what happened, who did it, how it ended (works without a running swarm).
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
    /// The swarm's long-term memory: search, show, stats, rebuild the index (works without a
    /// running swarm; the markdown files under memory/ are the truth, the index is rebuildable).
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
    },
    /// Chat bridges (Telegram, Discord, Slack): state, outbox, mappings (and changing them), the
    /// Slack app manifest.
    Bridge {
        #[command(subcommand)]
        command: BridgeCommand,
    },
    /// Print a shell completion script: `flockctl completions bash > ~/.local/share/bash-completion/completions/flockctl`
    /// (also zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the web dashboard's URL (with this run's token), served when the swarm was started
    /// with `flock-supervisor up --ui 127.0.0.1:PORT`; `--open` also opens it in a browser.
    Ui {
        /// Open the URL with xdg-open (or $BROWSER).
        #[arg(long)]
        open: bool,
        /// Print `{"url": …}`.
        #[arg(long)]
        json: bool,
    },
    /// Write the manual pages of flockctl and flock-supervisor, a page per subcommand too
    /// (flockctl.1, flockctl-ps.1, …, flock-supervisor.1, …); `man flockctl` finds them once they
    /// are in a man1 directory of the MANPATH (e.g. `flockctl man --dir ~/.local/share/man/man1`).
    Man {
        /// Where to write them (created if missing).
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
    /// Write a swarm file from a few choices — the team and its model — and check it as
    /// `flock-supervisor validate` does. On a terminal it asks for what the flags leave out;
    /// `--yes` takes the defaults instead. An existing file is never overwritten without
    /// `--force` (which keeps it as FILE.bak).
    ///
    /// Examples: `flockctl init` (asks); `flockctl init --yes` (an assistant on the embedded
    /// model in ./flock.yaml); `flockctl init team.yaml --team project --model
    /// openai:gpt-4o-mini --yes`; `flockctl init --model http://127.0.0.1:11434/v1 --model-id
    /// qwen2.5:7b --yes` (an Ollama, llama.cpp or vLLM server, probed).
    Init(InitArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct InitArgs {
    /// The swarm file to write.
    #[arg(default_value = "flock.yaml")]
    pub file: PathBuf,
    /// `assistant`: a coordinator and a worker with long-term memory (unconscious, observer,
    /// reflection, dream) and a sysadmin — answers a person's requests. `project`: an
    /// orchestrator that opens a project channel for a request and a team (pm, dev, qa) that
    /// plans, builds and checks it there. `office`: an orchestrator, two workers and a sysadmin on
    /// scripted models (no LLM, no key; ready in seconds) — Flock's plumbing on its own.
    #[arg(long, value_parser = ["assistant", "project", "office"])]
    pub team: Option<String>,
    /// The model every agent runs: `local` (the embedded Qwen2.5-Coder-1.5B; no API key),
    /// `local-small` (the 0.5B), `openai:MODEL`, `anthropic:MODEL`, or the URL of an
    /// OpenAI-compatible server (Ollama, llama.cpp, vLLM) with `--model-id`. The office team
    /// runs `scripted` models and takes no other.
    #[arg(long)]
    pub model: Option<String>,
    /// The model's name on an OpenAI-compatible server given by URL (e.g. `qwen2.5:7b`).
    #[arg(long, value_name = "NAME")]
    pub model_id: Option<String>,
    /// The NAME of the environment variable that holds the API key (default OPENAI_API_KEY or
    /// ANTHROPIC_API_KEY); the key itself is never written to the file.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// The swarm's name ([a-z0-9-]; default: the team's).
    #[arg(long)]
    pub name: Option<String>,
    /// Connect a chat: `telegram`, `discord` or `slack`. The bot's token comes from the
    /// environment (TELEGRAM_BOT_TOKEN, DISCORD_BOT_TOKEN, SLACK_BOT_TOKEN and SLACK_APP_TOKEN) or
    /// is asked for, is checked with the platform (Telegram getMe, Discord /users/@me, Slack
    /// auth.test: a refused token writes nothing), and is kept in the .env beside the swarm file
    /// (mode 0600), which `up` and `validate` read.
    #[arg(long, value_parser = ["telegram", "discord", "slack"])]
    pub bridge: Option<String>,
    /// The chat to connect to the team's channel `#team`: a Telegram chat id (`-100…`), a Discord
    /// or Slack channel id (docs/bridges.md says where to find it). People may also write to the
    /// bot directly.
    #[arg(long, value_name = "ID", requires = "bridge", allow_hyphen_values = true)]
    pub chat: Option<String>,
    /// The platform's API address, for a self-hosted Telegram Bot API server or a proxy
    /// [default: the platform's own].
    #[arg(long, value_name = "URL", requires = "bridge")]
    pub bridge_url: Option<String>,
    /// Take the defaults for every choice the flags leave out, without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Take the chat out of a file init wrote before.
    #[arg(long, conflicts_with = "bridge")]
    pub no_bridge: bool,
    /// Replace an existing file that init did not write, or that was changed since (the old one
    /// is kept as FILE.bak). Without it, a re-run on a file init wrote changes only what the
    /// flags say and keeps the other choices.
    #[arg(long)]
    pub force: bool,
    /// Print what was written as JSON (file, team, model, swarm, warnings).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub(crate) enum MemoryCommand {
    /// Records matching words and meaning, best first (BM25 and all-MiniLM-L6-v2 vectors fused by
    /// reciprocal rank, with priority and recency boosts); cold records (older than 365 days)
    /// only with --all.
    Search {
        query: String,
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Cold records too.
        #[arg(long)]
        all: bool,
        /// hybrid (words and meaning, fused), bm25 (words) or vector (meaning).
        #[arg(long, default_value = "hybrid")]
        mode: String,
        /// Only what this agent did (its journal lines) or was observed doing (observations
        /// about its turns, what it remembered itself).
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        filter: MemoryFilter,
        #[arg(long)]
        json: bool,
    },
    /// One record in full, by the id search shows.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Records per kind and tier, files, index size.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the index from the memory files (safe at any time: the files are the truth).
    Rebuild,
    /// Move memory day files between tiers: hot (journals/, observations/, reflections/),
    /// warm (warm/) and cold (cold/, searched only with --all). Without dates or --older-than,
    /// a move to warm or cold takes what is older than that tier's age (memory.tiers in the
    /// swarm file: 90 and 365 days by default); --to hot brings files back. A file whose
    /// destination exists is left where it is and named. The running swarm's memory thread moves
    /// them when one runs (journaled as yours).
    Archive {
        /// Where the files go: hot, warm or cold.
        #[arg(long)]
        to: String,
        /// Only from these tiers (comma-separated) [default: the other two].
        #[arg(long, value_delimiter = ',')]
        from: Vec<String>,
        /// Only day files older than this many days.
        #[arg(long, value_name = "DAYS")]
        older_than: Option<u32>,
        /// Only day files dated on or after this day (YYYY-MM-DD).
        #[arg(long)]
        since: Option<String>,
        /// Only day files dated on or before this day (YYYY-MM-DD).
        #[arg(long)]
        until: Option<String>,
        /// Say what would move; move nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Where the memory lives and when its day files move (the running swarm's settings; set
    /// them in the swarm file under memory.tiers).
    Config {
        #[arg(long)]
        json: bool,
    },
    /// Every record (journals too), newest first, as JSON Lines on stdout: one object a record
    /// (id, kind, date, time, priority, category, agent, path, text, tier), for a backup or
    /// another tool. The filters are `memory search`'s.
    Export {
        #[command(flatten)]
        filter: MemoryFilter,
    },
}

/// Which records `memory search` and `memory export` keep.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct MemoryFilter {
    /// Only these kinds: journal, observation, reflection, knowledge (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// At least this priority: low, medium or high (observations carry one).
    #[arg(long)]
    pub priority: Option<String>,
    /// Only this category, as the observer tags it (decision, preference, …).
    #[arg(long)]
    pub category: Option<String>,
    /// Only records dated on or after this day (YYYY-MM-DD).
    #[arg(long)]
    pub since: Option<String>,
    /// Only records dated on or before this day (YYYY-MM-DD).
    #[arg(long)]
    pub until: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum ChannelCommand {
    /// Create a channel; you (human:NAME) become a member.
    Create {
        /// Id: 1–63 of a-z, 0-9 and -, e.g. project-login.
        channel: String,
        #[arg(long, default_value = "")]
        topic: String,
        /// Display name [default: the id].
        #[arg(long)]
        name: Option<String>,
        /// Members, comma-separated: agent names or human:NAME.
        #[arg(long, value_delimiter = ',')]
        members: Vec<String>,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start the archive protocol (members get a notice and a deadline); --force archives now.
    Archive {
        #[arg(add = ArgValueCandidates::new(crate::complete::channels))]
        channel: String,
        #[arg(long)]
        force: bool,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show members, or change them with --add/--remove (comma-separated).
    Members {
        #[arg(add = ArgValueCandidates::new(crate::complete::channels))]
        channel: String,
        #[arg(long, value_delimiter = ',')]
        add: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        remove: Vec<String>,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum SessionCommand {
    /// Without --channel: the agent's sessions; with it: that session's messages.
    Show {
        #[arg(add = ArgValueCandidates::new(crate::complete::processes))]
        agent: String,
        /// A channel ('#name'), or "" for direct messages and requests.
        #[arg(long, add = ArgValueCandidates::new(crate::complete::channels))]
        channel: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum AgentCommand {
    /// A new supervised agent process; it survives supervisor restarts.
    Create {
        name: String,
        /// worker, coordinator, unconscious, observer, reflection or dream.
        #[arg(long, default_value = "worker")]
        role: String,
        /// e.g. code-reviewer, qa.
        #[arg(long)]
        archetype: Option<String>,
        #[arg(long, default_value = "")]
        description: String,
        /// A model of the swarm file's `models:` [default: `defaults.model`].
        #[arg(long)]
        model: Option<String>,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A new process of a declared agent with its own instance key, addressed as AGENT@KEY (a
    /// worker per conversation); it answers the address again if the instance exists.
    /// Decommission it when its work is done.
    Spawn {
        /// The declared agent to run another instance of.
        agent: String,
        /// The instance key (1–63 of a-z, 0-9 and -) [default: a random one].
        #[arg(long)]
        instance: Option<String>,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop an agent for good and remove it from every channel (its history stays).
    Decommission {
        name: String,
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum JournalCommand {
    /// The newest events, oldest first.
    Read {
        /// How many events.
        #[arg(long, default_value_t = 20)]
        last: usize,
        /// Print a JSON array of schema events.
        #[arg(long)]
        json: bool,
    },
    /// Events matching space-separated terms: agent= type= status= since= until= corr= limit=
    /// (e.g. `flockctl journal query "agent=worker-1 status=FAILED since=2026-11-21"`).
    Query {
        expr: String,
        #[arg(long)]
        json: bool,
    },
    /// Append one event given as JSON (validated against the schema; id and timestamp are filled
    /// in when absent).
    Log { json: String },
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::Parser as _;
    use std::path::Path;

    /// The words of a shell line up to its first comment, pipe, redirection or `;`/`&&`, with
    /// quotes taken off (enough for the lines the docs show; `$(…)` is not expanded).
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut word, mut quote, mut started) = (Vec::new(), String::new(), None, false);
        let mut last = ' ';
        for ch in line.chars() {
            match (quote, ch) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(ch);
                    started = true;
                }
                (None, '#') if last.is_whitespace() => break,
                (None, '|' | ';' | '&' | '>' | '<') => break,
                (None, c) if c.is_whitespace() => {
                    if started {
                        out.push(std::mem::take(&mut word));
                        started = false;
                    }
                }
                (None, c) => {
                    word.push(c);
                    started = true;
                }
            }
            last = ch;
        }
        if started {
            out.push(word);
        }
        out
    }

    /// Every `flockctl` and `flock-supervisor` command line in the README's and docs' shell
    /// blocks is one the binaries accept as written (a renamed option or subcommand fails here,
    /// not in a reader's terminal). Synopses (`[--all]`) are left out.
    #[test]
    fn every_command_line_in_the_readme_and_docs_parses() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = vec![root.join("README.md")];
        for doc in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
            if doc.path().extension().is_some_and(|e| e == "md") {
                files.push(doc.path());
            }
        }
        let mut checked = 0;
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let mut in_sh = false;
            for (n, line) in text.lines().enumerate() {
                let fence = line.trim_start();
                if fence.starts_with("```") {
                    in_sh = !in_sh && (fence == "```sh" || fence == "```bash");
                    continue;
                }
                if !in_sh || line.contains("[--") {
                    continue;
                }
                let mut w = words(line.trim());
                if w.first().is_some_and(|c| c == "sudo") {
                    w.remove(0);
                }
                let Some(program) = w.first().map(|c| c.trim_start_matches("bin/").to_owned())
                else {
                    continue;
                };
                let at = format!("{}:{}: {line}", file.display(), n + 1);
                let parsed = match program.as_str() {
                    "flockctl" => Cli::try_parse_from(&w).map(|_| ()),
                    "flock-supervisor" => {
                        flock_supervisor::cli::Cli::try_parse_from(&w).map(|_| ())
                    }
                    _ => continue,
                };
                use clap::error::ErrorKind;
                match parsed {
                    Err(e)
                        if !matches!(
                            e.kind(),
                            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
                        ) =>
                    {
                        panic!("{at}\n{e}")
                    }
                    _ => {}
                }
                checked += 1;
            }
        }
        assert!(checked >= 40, "only {checked} command lines found");
    }

    #[test]
    fn the_docs_line_splitter_keeps_quotes_and_stops_at_comments() {
        assert_eq!(
            words(r#"bin/flockctl post '#lobby' "a b" --as alice   # a comment"#),
            ["bin/flockctl", "post", "#lobby", "a b", "--as", "alice"]
        );
        assert_eq!(words("flockctl ps --json | jq ."), ["flockctl", "ps", "--json"]);
        assert_eq!(words("flockctl read ''"), ["flockctl", "read", ""]);
    }
}
