//! `flockctl send`: a message into an agent's durable mailbox (or at most once), and with
//! `--wait` the chain's answer when it ends.

use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use flock_ipc::{Body, Connection, ControlReply, ControlRequest, Frame, ROUTER, SendMode};
use serde_json::json;

use crate::*;

pub(crate) async fn send(
    conn: &mut Connection,
    agent: String,
    text: String,
    at_most_once: bool,
    wait: bool,
    timeout: u64,
    json: bool,
) -> Result<ExitCode> {
    let text = text_or_stdin(text)?;
    let mode = if at_most_once { SendMode::AtMostOnce } else { SendMode::Durable };
    let frame = Frame::new(flock_ipc::OPERATOR, &agent, Body::Send { text, mode });
    let id = frame.id;
    conn.outbox.send(frame).await.map_err(|_| anyhow!("the supervisor closed the connection"))?;
    if at_most_once {
        // Only a failure is answered; wait briefly for one.
        let answer =
            tokio::time::timeout(std::time::Duration::from_millis(300), conn.reader.read_frame())
                .await;
        if let Ok(Ok(Some(Frame { body: Body::Error { code, message }, .. }))) = answer {
            bail!("{code}: {message}");
        }
        if json {
            println!("{}", json!({"agent": agent, "mode": "at_most_once", "routed": true}));
        } else {
            println!("routed to {agent} (at_most_once)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    // The message id is its chain's id: watch it before anything can end it.
    let watch =
        Frame::new(flock_ipc::OPERATOR, ROUTER, Body::Control(ControlRequest::Watch { chain: id }));
    if wait {
        conn.outbox
            .send(watch)
            .await
            .map_err(|_| anyhow!("the supervisor closed the connection"))?;
    }
    loop {
        match conn.reader.read_frame().await? {
            Some(f) if f.correlation_id == Some(id) => match f.body {
                Body::Accepted => {
                    let chain = flock_ipc::id::fmt_id(id);
                    if !wait {
                        let dm = dm_of(&agent);
                        if json {
                            let v =
                                json!({"agent": agent, "chain": chain, "accepted": true, "dm": dm});
                            println!("{v}");
                        } else {
                            println!(
                                "accepted into {agent}'s mailbox (chain {chain}); the answer will be in your DM: flockctl read {dm}"
                            );
                        }
                        return Ok(ExitCode::SUCCESS);
                    }
                    eprintln!(
                        "accepted into {agent}'s mailbox (chain {chain}); waiting for the answer…"
                    );
                    break;
                }
                Body::Error { code, message } => bail!("{code}: {message}"),
                other => bail!("unexpected {} answer", other.kind()),
            },
            Some(_) => continue,
            None => {
                bail!("the supervisor closed the connection before accepting the message")
            }
        }
    }
    wait_for_end(conn, id, timeout, json).await
}
/// Waits for chain `id` to end (`send --wait`), printing progress to stderr every 10 s.
pub(crate) async fn wait_for_end(
    conn: &mut Connection,
    id: flock_ipc::MsgId,
    timeout: u64,
    json: bool,
) -> Result<ExitCode> {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(10),
        Duration::from_secs(10),
    );
    loop {
        tokio::select! {
            frame = conn.reader.read_frame() => match frame? {
                Some(Frame { body: Body::ChainEnded(end), .. }) if end.chain == id => {
                    let code = match end.outcome {
                        flock_ipc::ChainOutcome::Answered => 0,
                        flock_ipc::ChainOutcome::Stopped => 3,
                        flock_ipc::ChainOutcome::Ended => 4,
                    };
                    if json {
                        println!("{}", serde_json::to_string_pretty(&json!({
                            "chain": flock_ipc::id::fmt_id(end.chain), "outcome": end.outcome.as_str(),
                            "text": end.text, "by": end.by, "channel": end.channel, "seq": end.seq,
                            "hops": end.hops, "tokens": end.tokens, "elapsed_ms": end.elapsed_ms,
                        }))?);
                    } else {
                        println!("{}", end.text);
                        eprintln!(
                            "({} by {} in {:.1} s: {} hops, {} tokens{})",
                            end.outcome.as_str(),
                            end.by,
                            end.elapsed_ms as f64 / 1000.0,
                            end.hops,
                            end.tokens,
                            if end.channel.is_empty() { String::new() } else { format!("; #{} seq {}", end.channel, end.seq) }
                        );
                    }
                    return Ok(ExitCode::from(code));
                }
                Some(Frame { body: Body::ControlReply(ControlReply::Chains(rows)), .. }) => {
                    if let Some(r) = rows.iter().find(|r| r.id == id) {
                        eprintln!(
                            "… {} s: {} hops, {} tokens, {}",
                            started.elapsed().as_secs(), r.hops, r.tokens, r.state
                        );
                    }
                }
                Some(Frame { body: Body::Error { code, message }, .. }) => bail!("{code}: {message}"),
                Some(_) => continue,
                None => bail!("the supervisor closed the connection before the answer came"),
            },
            _ = tokio::time::sleep_until(deadline.into()) => {
                eprintln!(
                    "no answer within {timeout} s; the work goes on (flockctl chains; flockctl journal query corr={})",
                    flock_ipc::id::fmt_id(id)
                );
                return Ok(ExitCode::from(5));
            }
            _ = tick.tick() => {
                let ask = Frame::new(flock_ipc::OPERATOR, ROUTER, Body::Control(ControlRequest::Chains));
                conn.outbox.send(ask).await.map_err(|_| anyhow!("the supervisor closed the connection"))?;
            }
        }
    }
}
