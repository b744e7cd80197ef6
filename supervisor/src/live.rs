//! What `flockctl` shows on a terminal: the `ps` table with its states in colour, the live view
//! of `ps --watch` (redrawn in place, like `top`), and the lines of every log with the name of
//! their log in front (`logs -f` without an agent, like `docker compose logs -f`).
//!
//! Cursor movements are written only to a terminal, colours as [`colour_wanted`] says
//! (`NO_COLOR`, <https://no-color.org>, `CLICOLOR`, `CLICOLOR_FORCE`): piped, the output is
//! plain text.

use std::io::{IsTerminal, Write};

use flock_ipc::PsRow;

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";

/// Whether standard output is a terminal.
pub fn stdout_is_tty() -> bool {
    std::io::stdout().is_terminal()
}

/// Whether to write colours to standard output, by the usual conventions (anstream's reading
/// of them): never with `NO_COLOR` set or `CLICOLOR=0`, always with `CLICOLOR_FORCE`, else on a
/// terminal that is not `TERM=dumb`.
pub fn colour_wanted() -> bool {
    anstream::AutoStream::choice(&std::io::stdout()) != anstream::ColorChoice::Never
}

/// The colour of a state in `flockctl ps`: green when it works, cyan when busy, yellow on its
/// way up or down, red when it does not run.
pub fn state_colour(state: &str) -> Option<&'static str> {
    let word = state.split(['(', ' ', ':']).next().unwrap_or(state);
    match word {
        "ready" | "running" | "connected" | "up" => Some(GREEN),
        "busy" => Some(CYAN),
        "starting" | "restarting" | "backoff" | "stopping" | "connecting" | "reconnecting"
        | "unknown" => Some(YELLOW),
        "failed" | "stopped" | "broken" | "exited" | "down" | "disconnected" | "lost" => Some(RED),
        _ => None,
    }
}

pub fn human_bytes(b: Option<u64>) -> String {
    match b {
        None => "-".into(),
        Some(b) if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        Some(b) => format!("{}K", b >> 10),
    }
}

pub fn human_secs(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s / 60) % 60),
    }
}

/// Columns of the `ps` table a narrow terminal drops, least needed first (SANDBOX, KIND, TOKENS,
/// LAST EXIT, TURNS, ROLE, HOST, CAGE — kept to the end when an agent is UNCAGED —, UPTIME, RSS,
/// PID). NAME, STATE, RESTARTS and MAILBOX always stay.
const DROP_ORDER: [usize; 11] = [4, 2, 14, 10, 12, 3, 1, 5, 8, 13, 6];
const HOST: usize = 1;
const STATE: usize = 7;
const CAGE: usize = 5;

/// The width `ps` fits its table to: `COLUMNS` if set, else the terminal's when standard output
/// is one; `None` (no limit) for a pipe or a file, so scripts get every column.
pub fn terminal_width() -> Option<usize> {
    if let Some(c) = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok())
        && c > 0
    {
        return Some(c);
    }
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct passed, which lives on this stack
    // frame for the call; fd 1 is this process's standard output.
    #[allow(unsafe_code)]
    let r = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// The `flockctl ps` table; with `colour`, the states in colour, the actors' rows dim and the
/// column names bold (cells are padded before, so the columns line up either way). Within
/// `width` characters: columns are dropped ([`DROP_ORDER`]), then names cut with `…`. HOST only
/// in a swarm across hosts.
pub fn table(rows: &[PsRow], colour: bool, width: Option<usize>) -> String {
    let header = [
        "NAME",
        "HOST",
        "KIND",
        "ROLE",
        "SANDBOX",
        "CAGE",
        "PID",
        "STATE",
        "UPTIME",
        "RESTARTS",
        "LAST EXIT",
        "MAILBOX",
        "TURNS",
        "RSS",
        "TOKENS IN/OUT",
    ];
    let cells: Vec<[String; 15]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.host.clone().unwrap_or_else(|| "-".into()),
                r.kind.clone(),
                r.role.clone(),
                r.sandbox.clone().unwrap_or_else(|| "-".into()),
                match r.confined {
                    Some(true) => "caged".into(),
                    Some(false) => "UNCAGED".into(),
                    None => "-".into(),
                },
                r.pid.map_or("-".into(), |p| p.to_string()),
                r.state.clone(),
                if r.pid.is_some() { human_secs(r.uptime_secs) } else { "-".into() },
                r.restarts.to_string(),
                r.last_exit.clone().unwrap_or_else(|| "-".into()),
                r.mailbox_depth.to_string(),
                r.turns_total.to_string(),
                human_bytes(r.rss_bytes),
                if r.tokens_in + r.tokens_out == 0 {
                    "-".into()
                } else {
                    format!("{}/{}", r.tokens_in, r.tokens_out)
                },
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    // Which columns fit: cut long names, drop the least needed columns until the line fits,
    // then cut the names further.
    let mut keep: Vec<usize> = (0..header.len()).collect();
    if rows.iter().all(|r| r.host.is_none()) {
        keep.retain(|&c| c != HOST);
    }
    let total = |keep: &[usize], widths: &[usize]| -> usize {
        keep.iter().map(|&i| widths[i]).sum::<usize>() + 2 * keep.len().saturating_sub(1)
    };
    if let Some(max) = width {
        let uncaged = rows.iter().any(|r| r.confined == Some(false));
        let mut order: Vec<usize> = DROP_ORDER.to_vec();
        if uncaged {
            order.retain(|&c| c != CAGE);
            order.push(CAGE);
        }
        // Long names are cut to 20 first: a column of facts is worth more than a name's tail.
        if total(&keep, &widths) > max {
            widths[0] = widths[0].min(20);
        }
        for col in order {
            if total(&keep, &widths) <= max {
                break;
            }
            keep.retain(|&c| c != col);
        }
        let over = total(&keep, &widths).saturating_sub(max);
        widths[0] = widths[0].saturating_sub(over).max(8);
    }
    let fit = |cell: &str, w: usize| -> String {
        if cell.chars().count() <= w {
            return cell.to_owned();
        }
        let cut: String = cell.chars().take(w.saturating_sub(1)).collect();
        format!("{cut}…")
    };
    let line = |cols: Vec<&str>| -> String {
        let parts: Vec<String> = keep
            .iter()
            .map(|&i| {
                let w = widths[i];
                format!("{:<w$}", fit(cols[i], w))
            })
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    let mut out = String::new();
    let head = line(header.to_vec());
    if colour {
        out.push_str(&format!("{BOLD}{head}{RESET}\n"));
    } else {
        out.push_str(&head);
        out.push('\n');
    }
    for (row, r) in cells.iter().zip(rows) {
        let text = line(row.iter().map(String::as_str).collect());
        if !colour {
            out.push_str(&text);
        } else if r.kind == "actor" {
            out.push_str(&format!("{DIM}{text}{RESET}"));
        } else if let Some(c) = state_colour(&r.state) {
            // The state cell starts after the padded cells before it.
            let at: usize = keep.iter().take_while(|&&i| i < STATE).map(|&i| widths[i] + 2).sum();
            let (before, rest) = split_at_char(&text, at);
            let (state, after) = split_at_char(rest, r.state.chars().count());
            out.push_str(&format!("{before}{c}{state}{RESET}{after}"));
        } else {
            out.push_str(&text);
        }
        out.push('\n');
    }
    out
}

fn split_at_char(s: &str, n: usize) -> (&str, &str) {
    let i = s.char_indices().nth(n).map_or(s.len(), |(i, _)| i);
    s.split_at(i)
}

/// The line above the live table: how long the swarm has been up, how many agents are ready of
/// how many, how many are busy, how many hosts are up (in a swarm across hosts), and the time
/// (UTC).
pub fn header(rows: &[PsRow], now: &str, colour: bool) -> String {
    let uptime = rows.iter().find(|r| r.kind == "supervisor").map_or(0, |r| r.uptime_secs);
    let agents: Vec<&PsRow> = rows.iter().filter(|r| r.kind == "agent").collect();
    let up = agents.iter().filter(|r| r.state == "ready" || r.state == "busy").count();
    let busy = agents.iter().filter(|r| r.state == "busy").count();
    let down = agents.len() - up;
    let time = now.get(11..19).unwrap_or(now);
    let ready = format!("{up}/{} ready", agents.len());
    let ready = match (colour, down) {
        (false, _) => ready,
        (true, 0) => format!("{GREEN}{ready}{RESET}"),
        (true, _) => format!("{YELLOW}{ready}{RESET}"),
    };
    let hosts: Vec<&PsRow> = rows.iter().filter(|r| r.kind == "host").collect();
    let hosts = match hosts.iter().filter(|r| r.state == "up").count() {
        _ if hosts.is_empty() => String::new(),
        n if !colour => format!(", hosts {n}/{} up", hosts.len()),
        n if n == hosts.len() => format!(", hosts {GREEN}{n}/{n} up{RESET}"),
        n => format!(", hosts {RED}{n}/{} up{RESET}", hosts.len()),
    };
    format!(
        "flock: swarm up {}, agents {ready}, {busy} busy{hosts}  {time} UTC",
        human_secs(uptime)
    )
}

/// The live view of `ps --watch` on a terminal: the alternate screen, without a cursor, redrawn
/// in place; the terminal is given back as it was when this is dropped (at exit, on Ctrl-C, on
/// an error).
#[derive(Debug)]
pub struct Screen {
    _private: (),
}

impl Screen {
    pub fn enter() -> std::io::Result<Screen> {
        let mut out = std::io::stdout().lock();
        out.write_all(b"\x1b[?1049h\x1b[?25l")?;
        out.flush()?;
        Ok(Screen { _private: () })
    }

    /// Replaces what the screen shows with `text`: from the top left, each line cleared to its
    /// end, and everything below the last line cleared.
    pub fn draw(&mut self, text: &str) -> std::io::Result<()> {
        let mut frame = String::from("\x1b[H");
        for line in text.lines() {
            frame.push_str(line);
            frame.push_str("\x1b[K\n");
        }
        frame.push_str("\x1b[J");
        let mut out = std::io::stdout().lock();
        out.write_all(frame.as_bytes())?;
        out.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
    }
}

/// Colours the names of logs are shown in: twelve that tell apart on a dark or a light terminal.
const PALETTE: [&str; 12] = [
    "\x1b[36m", "\x1b[33m", "\x1b[32m", "\x1b[35m", "\x1b[34m", "\x1b[31m", "\x1b[96m", "\x1b[93m",
    "\x1b[92m", "\x1b[95m", "\x1b[94m", "\x1b[91m",
];

/// Puts the name of its log in front of each line, padded to the longest name seen so far, each
/// name in a colour of its own (in the order of the names given, then as new ones appear: no two
/// share one until there are more logs than colours).
#[derive(Debug)]
pub struct Prefixer {
    width: usize,
    colour: bool,
    colours: std::collections::HashMap<String, &'static str>,
    /// Whether ids (32 hex digits) are cut to their last 8 (for a person at a terminal).
    short_ids: bool,
}

impl Prefixer {
    /// `names`: the logs expected (to line up from the first line on).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>, colour: bool) -> Self {
        let mut p = Prefixer { width: 0, colour, colours: Default::default(), short_ids: false };
        for name in names {
            p.width = p.width.max(name.chars().count());
            p.colour_of(name);
        }
        p
    }

    /// Cuts ids to their last 8 hex digits (`…1a2b3c4d`).
    pub fn short_ids(mut self) -> Self {
        self.short_ids = true;
        self
    }

    fn colour_of(&mut self, name: &str) -> &'static str {
        let next = PALETTE[self.colours.len() % PALETTE.len()];
        self.colours.entry(name.to_owned()).or_insert(next)
    }

    /// `name | line`; a line without a log (a note of the supervisor's) as it is.
    pub fn line(&mut self, source: &str, line: &str) -> String {
        let line = if self.short_ids { shorten_ids(line) } else { line.into() };
        if source.is_empty() {
            return line.into_owned();
        }
        self.width = self.width.max(source.chars().count());
        let w = self.width;
        if self.colour {
            format!("{}{source:<w$} |{RESET} {line}", self.colour_of(source))
        } else {
            format!("{source:<w$} | {line}")
        }
    }
}

/// `line` with every id (a run of exactly 32 hex digits, as `fmt_id` writes message and chain
/// ids) cut to `…` and its last 8 digits — enough to tell ids apart in one screen of logs.
pub fn shorten_ids(line: &str) -> std::borrow::Cow<'_, str> {
    let b = line.as_bytes();
    let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    let mut out = String::new();
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if !hex(b[i]) || (i > 0 && b[i - 1].is_ascii_alphanumeric()) {
            i += 1;
            continue;
        }
        let end = (i..b.len()).find(|&j| !hex(b[j])).unwrap_or(b.len());
        let whole = end == b.len() || !b[end].is_ascii_alphanumeric();
        if end - i == 32 && whole {
            out.push_str(&line[copied..i]);
            out.push('…');
            out.push_str(&line[end - 8..end]);
            copied = end;
        }
        i = end.max(i + 1);
    }
    if copied == 0 {
        return line.into();
    }
    out.push_str(&line[copied..]);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, kind: &str, state: &str) -> PsRow {
        PsRow {
            name: name.into(),
            kind: kind.into(),
            role: "worker".into(),
            pid: Some(42),
            state: state.into(),
            uptime_secs: 65,
            ..Default::default()
        }
    }

    #[test]
    fn colours_only_decorate_the_plain_table() {
        let rows = [
            row("supervisor", "supervisor", "running"),
            row("router", "actor", "running"),
            row("a", "agent", "ready"),
            row("b", "agent", "exited(signal SIGKILL)"),
            row("c", "agent", "busy"),
        ];
        let plain = table(&rows, false, None);
        assert!(!plain.contains('\x1b'), "{plain}");
        let coloured = table(&rows, true, None);
        assert!(coloured.contains(&format!("{RED}exited(signal SIGKILL){RESET}")), "{coloured}");
        assert!(coloured.contains(&format!("{GREEN}ready{RESET}")), "{coloured}");
        assert!(coloured.contains(&format!("{CYAN}busy{RESET}")), "{coloured}");
        assert!(coloured.contains(&format!("{DIM}router")), "{coloured}");
        let stripped = coloured
            .replace(RESET, "")
            .replace(BOLD, "")
            .replace(DIM, "")
            .replace(RED, "")
            .replace(GREEN, "")
            .replace(CYAN, "");
        assert_eq!(stripped, plain);
        let head = header(&rows, "2026-11-25T13:04:24.000Z", false);
        assert_eq!(head, "flock: swarm up 1m5s, agents 2/3 ready, 1 busy  13:04:24 UTC");
    }

    #[test]
    fn a_narrow_terminal_gets_the_columns_that_matter_and_no_wrapped_row() {
        let mut rows = vec![
            row("supervisor", "supervisor", "running"),
            row("router", "actor", "running"),
            row("a-very-long-agent-name-for-a-worker", "agent", "ready"),
            row("b", "agent", "exited(signal SIGKILL)"),
        ];
        for r in &mut rows {
            r.sandbox = Some("namespaces".into());
            r.confined = Some(true);
            r.last_exit = Some("exit 0 at 2026-11-27T12:00:00Z".into());
            r.tokens_in = 123_456;
            r.tokens_out = 7_890;
            r.rss_bytes = Some(6 << 20);
        }
        let wide = table(&rows, false, None);
        assert!(wide.lines().next().unwrap().contains("TOKENS IN/OUT"), "{wide}");
        assert!(wide.lines().any(|l| l.chars().count() > 80), "{wide}");
        for width in [80, 60] {
            let narrow = table(&rows, false, Some(width));
            for line in narrow.lines() {
                assert!(line.chars().count() <= width, "{width}: {line:?}\n{narrow}");
            }
            let head = narrow.lines().next().unwrap();
            for kept in ["NAME", "STATE", "RESTARTS", "MAILBOX"] {
                assert!(head.contains(kept), "{width}: {head}");
            }
            assert!(narrow.contains("exited(signal SIGKILL)"), "{narrow}");
            let coloured = table(&rows, true, Some(width));
            assert!(
                coloured.contains(&format!("{RED}exited(signal SIGKILL){RESET}")),
                "{coloured}"
            );
        }
        let at_80 = table(&rows, false, Some(80));
        assert!(!at_80.contains("SANDBOX") && at_80.contains("PID"), "{at_80}");
        // An agent out of its cage keeps the column that says so longest.
        rows[3].confined = Some(false);
        let tight = table(&rows, false, Some(72));
        assert!(tight.contains("UNCAGED"), "{tight}");
    }

    #[test]
    fn a_swarm_across_hosts_shows_each_row_s_host_and_how_many_hosts_are_up() {
        let one = [row("supervisor", "supervisor", "running"), row("a", "agent", "ready")];
        assert!(!table(&one, false, None).contains("HOST"));
        let mut rows = vec![
            row("main", "host", "up"),
            row("supervisor", "supervisor", "running"),
            row("a", "agent", "ready"),
            row("gpu", "host", "lost"),
            row("b", "agent", "unknown"),
        ];
        for (r, h) in rows.iter_mut().zip(["main", "main", "main", "gpu", "gpu"]) {
            r.host = Some(h.into());
        }
        let t = table(&rows, false, None);
        let head = t.lines().next().unwrap();
        assert_eq!(head.split_whitespace().take(2).collect::<Vec<_>>(), ["NAME", "HOST"], "{t}");
        let b = t.lines().find(|l| l.starts_with("b ")).unwrap();
        assert!(b.contains("gpu") && b.contains("unknown"), "{t}");
        assert!(table(&rows, true, None).contains(&format!("{RED}lost{RESET}")));
        let head = header(&rows, "2026-11-25T13:04:24.000Z", false);
        assert_eq!(
            head,
            "flock: swarm up 1m5s, agents 1/2 ready, 0 busy, hosts 1/2 up  13:04:24 UTC"
        );
    }

    #[test]
    fn names_keep_their_colour_and_line_up() {
        let mut p = Prefixer::new(["a", "worker"], false);
        assert_eq!(p.line("a", "hi"), "a      | hi");
        assert_eq!(p.line("", "… skipped …"), "… skipped …");
        let mut p = Prefixer::new(["a"], true);
        assert_eq!(p.line("a", "hi"), format!("{}a |{RESET} hi", PALETTE[0]));
    }

    #[test]
    fn every_log_gets_a_colour_of_its_own_until_there_are_more_logs_than_colours() {
        let names: Vec<String> = (0..PALETTE.len()).map(|i| format!("agent-{i}")).collect();
        let mut p = Prefixer::new(names.iter().map(String::as_str), true);
        let colours: std::collections::HashSet<&str> =
            names.iter().map(|n| p.colour_of(n)).collect();
        assert_eq!(colours.len(), PALETTE.len());
        // A log that appears later takes the next colour; the same name keeps its own.
        assert_eq!(p.colour_of("late"), PALETTE[0]);
        assert_eq!(p.colour_of("agent-3"), PALETTE[3]);
    }

    #[test]
    fn ids_are_cut_to_their_last_eight_digits_and_nothing_else_is() {
        let id = "0193a1b2c3d4e5f60718293a4b5c6d7e";
        let line = format!("INFO turn done msg_id={id} chain={id}, sha=deadbeef x{id}");
        assert_eq!(
            shorten_ids(&line),
            format!("INFO turn done msg_id=…4b5c6d7e chain=…4b5c6d7e, sha=deadbeef x{id}")
        );
        let longer = format!("{id}ff");
        assert_eq!(shorten_ids(&longer), longer, "33+ digits are not an id");
        assert_eq!(shorten_ids("plain"), "plain");
        let mut p = Prefixer::new(["a"], false).short_ids();
        assert_eq!(p.line("a", &format!("id {id}")), "a | id …4b5c6d7e");
    }
}
