//! `flockctl` as a live view: `ps --watch` (plain tables when piped, a redrawn screen in colour
//! on a terminal, no colour with NO_COLOR), `logs -f` without an agent (every log on one stream,
//! each line after its log's name, agents created later included) and `flockctl man`.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use flock_testkit::proc::wait_timeout;
use flock_testkit::{POLL, Swarm, bin, run};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{SHORT, answer_model};

fn yaml() -> String {
    format!(
        "swarm: {{ name: live }}\nmodels:\n{}defaults: {{ model: m }}\nagents:\n  \
         - {{ name: alpha, role: worker }}\n  - {{ name: bravo-longer, role: worker }}\n",
        answer_model("m", "got: {input}")
    )
}

/// A running `flockctl` whose standard output is collected as it comes.
pub(crate) struct Live {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Live {
    pub(crate) fn spawn(mut cmd: Command) -> Live {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn");
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Live { child, out }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Waits for the command to exit by itself, and returns its exit code.
    #[track_caller]
    fn exit_code(&mut self) -> Option<i32> {
        let mut exited = None;
        let child = &mut self.child;
        flock_testkit::wait_for(
            || {
                exited = child.try_wait().expect("try_wait");
                exited.is_some()
            },
            SHORT,
            "flockctl exits by itself",
        );
        exited.and_then(|status| status.code())
    }

    /// Waits until the output so far satisfies `cond`, and returns it.
    #[track_caller]
    pub(crate) fn wait_for(&self, what: &str, mut cond: impl FnMut(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + SHORT;
        loop {
            let text = self.text();
            if cond(&text) {
                return text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {SHORT:?} waiting for {what}; output so far:\n{text}"
            );
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `flockctl ARGS` for `swarm`, to run as a [`Live`] view.
pub(crate) fn ctl(swarm: &Swarm, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("flockctl"));
    cmd.arg("--state-dir").arg(swarm.state_dir()).args(args).env_remove("FLOCK_HOME");
    cmd
}

/// Whether `text` holds an SGR sequence (a colour or another text attribute).
fn has_sgr(text: &str) -> bool {
    text.match_indices("\x1b[").any(|(i, _)| {
        let rest = &text[i + 2..];
        let params = rest.find(|c: char| !(c.is_ascii_digit() || c == ';')).unwrap_or(rest.len());
        rest[params..].starts_with('m')
    })
}

#[test]
fn ps_watch_is_plain_when_piped_and_a_coloured_live_view_on_a_terminal() {
    let swarm = Swarm::start(&yaml());

    // Piped: a header and a table per interval, separated by a blank line, no escape codes.
    let live = Live::spawn(ctl(&swarm, &["ps", "--watch"]));
    let out = live.wait_for("two tables", |t| t.matches("NAME  ").count() >= 2);
    assert!(!out.contains('\x1b'), "escape codes in piped output: {out:?}");
    let first = out.split("\n\n").next().unwrap();
    assert!(first.starts_with("flock: swarm up "), "{out}");
    assert!(first.contains("agents 2/2 ready, 0 busy"), "{out}");
    assert!(first.lines().any(|l| l.starts_with("alpha ") && l.contains(" ready ")), "{out}");
    assert!(out.contains("\n\nflock: swarm up "), "no blank line between tables: {out}");
    // Ctrl-C ends it cleanly.
    let mut child = live;
    kill(Pid::from_raw(child.child.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_timeout(&mut child.child, SHORT).expect("ps --watch ends on SIGINT");
    assert!(status.success(), "{status}");

    // --json: one compact array per line.
    let live = Live::spawn(ctl(&swarm, &["ps", "--watch", "--json", "--interval", "1"]));
    let out = live.wait_for("two JSON lines", |t| t.matches('\n').count() >= 2);
    for line in out.lines().take(2) {
        let rows: serde_json::Value = serde_json::from_str(line).expect(line);
        assert!(rows.as_array().is_some_and(|r| r.iter().any(|r| r["name"] == "alpha")), "{line}");
    }

    // On a terminal (script(1) gives it one): the alternate screen, redrawn in place, states
    // in colour; the terminal is given back on Ctrl-C. With NO_COLOR: the same without colour.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("no script(1): the terminal half of this test is skipped");
        return;
    }
    for no_color in [None, Some("1")] {
        let line = format!(
            "timeout --preserve-status -s INT 4 {} --state-dir {} ps --watch",
            bin("flockctl").display(),
            swarm.state_dir().display()
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"]).env_remove("FLOCK_HOME").env("TERM", "xterm");
        match no_color {
            Some(v) => cmd.env("NO_COLOR", v),
            None => cmd.env_remove("NO_COLOR"),
        };
        let done = run(&mut cmd, SHORT);
        let out = String::from_utf8_lossy(&done.stdout).into_owned();
        assert!(done.status.success(), "{no_color:?}: {}; {out:?}", done.status);
        assert!(out.contains("\x1b[?1049h\x1b[?25l"), "no alternate screen: {out:?}");
        assert!(out.matches("\x1b[Hflock: swarm up").count() >= 2, "not redrawn: {out:?}");
        let restored = out.rfind("\x1b[?25h\x1b[?1049l").expect("the terminal is given back");
        assert!(restored > out.rfind("flock: swarm up").unwrap(), "{out:?}");
        if no_color.is_none() {
            assert!(out.contains("\x1b[32mready\x1b[0m"), "ready is not green: {out:?}");
        } else {
            assert!(!has_sgr(&out), "colours despite NO_COLOR: {out:?}");
            assert!(out.contains("ready"), "{out:?}");
        }
    }
}

#[test]
fn logs_follow_without_an_agent_streams_every_log_with_its_name() {
    let swarm = Swarm::start(&yaml());
    swarm.ctl_ok(&["send", "alpha", "first"]);
    swarm.wait_for_log("alpha", "reply \"got: first\"", SHORT);

    let live = Live::spawn(ctl(&swarm, &["logs", "-f", "-n", "5"]));
    // The past lines first, names padded to the longest one (bravo-longer).
    live.wait_for("alpha's past lines", |t| {
        t.lines().any(|l| l.starts_with("alpha        | ") && l.contains("reply \"got: first\""))
    });
    swarm.ctl_ok(&["send", "bravo-longer", "second"]);
    swarm.ctl_ok(&["send", "alpha", "third"]);
    let out = live.wait_for("both agents' new lines", |t| {
        t.lines().any(|l| l.starts_with("bravo-longer | ") && l.contains("reply \"got: second\""))
            && t.lines().any(|l| l.starts_with("alpha        | ") && l.contains("got: third"))
    });
    assert!(!out.contains('\x1b'), "{out:?}");
    // An agent created after the stream began is in it too.
    swarm.ctl_ok(&["agent", "create", "late", "--as", "alice"]);
    swarm.ctl_ok(&["send", "late", "fourth"]);
    live.wait_for("the new agent's lines", |t| {
        t.lines().any(|l| l.starts_with("late ") && l.contains("reply \"got: fourth\""))
    });

    // Without -f: the last lines of every log, in order of time.
    let out = swarm.ctl_ok(&["logs", "-n", "50"]);
    let stamps: Vec<&str> =
        out.lines().map(|l| l.split_once(" | ").expect(l).1.split(' ').next().unwrap()).collect();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "not in order of time:\n{out}");
    for name in ["alpha ", "bravo-longer ", "late "] {
        assert!(out.lines().any(|l| l.starts_with(name)), "no {name}lines:\n{out}");
    }

    // `down` ends the stream, and that is not a failure (as `docker logs -f`).
    let mut live = live;
    swarm.ctl_ok(&["down"]);
    assert_eq!(live.exit_code(), Some(0), "logs -f after a clean down");
}

#[test]
fn flockctl_man_writes_a_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("man1");
    let out = run(
        Command::new(bin("flockctl"))
            .args(["man", "--dir"])
            .arg(&target)
            .env("FLOCK_HOME", dir.path().join("nowhere")),
        SHORT,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for page in [
        "flockctl.1",
        "flockctl-ps.1",
        "flockctl-logs.1",
        "flockctl-memory-search.1",
        "flock-supervisor.1",
        "flock-supervisor-up.1",
    ] {
        let text =
            std::fs::read_to_string(target.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        let title = text
            .lines()
            .find(|l| l.starts_with('.') && !l.starts_with(".ie") && !l.starts_with(".el"));
        assert!(
            title.is_some_and(|l| l.starts_with(".TH ")),
            "{page}: {}",
            &text[..text.len().min(300)]
        );
        assert!(text.contains(".SH NAME") && text.contains(".SH SYNOPSIS"), "{page}");
    }
    let ps = std::fs::read_to_string(target.join("flockctl-ps.1")).unwrap();
    assert!(ps.contains("interval"), "{ps}");
    render_if_possible(&target.join("flockctl-logs.1"));
}

/// With man(1) at hand, the page renders to text with its sections.
fn render_if_possible(page: &Path) {
    let Ok(out) = Command::new("man").arg("-l").arg(page).env("MANPAGER", "cat").output() else {
        return;
    };
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("SYNOPSIS") && text.contains("flockctl-logs"), "{text}");
    }
}
