//! One turn: `turn.pre`, then model steps (each after `step.pre`) and tool calls (between
//! `tool_call.pre` and `.post`) until a final answer, then `turn.post`.
//!
//! What the runtime guarantees here, whatever the model does: the model is offered only the
//! choices that make sense for this input (`tools::offered`); a delegation ends the turn (the
//! answer comes back later as a result); a repeated call is not run again — the model is asked
//! for its answer instead; a tool error is never the reply; the conversation is laid out so its
//! stable part (prompt, history) is a prefix the model server can keep in its KV cache.

use flock_config::{AgentSpec, ModelSpec};
use flock_ipc::{Delivery, DeliveryKind, ErrorCode, MsgId};

use crate::client::RouterClient;
use crate::extensions::{Pipeline, TurnInput};
use crate::provider::{ChatMessage, LlmProvider, LlmStep};
use crate::tools::{self, TurnState};
use crate::workflow::{self, Step};
use crate::{MAX_STEPS, prompts};
use tracing::Instrument;

/// The memory context (`[active_memory]`, `[unconscious_context]`, `[journal]`) a local model
/// gets per turn, in characters (~120 tokens): about the three best memories.
const CONTEXT_BUDGET_CHARS: usize = 480;

/// Context blocks without the lines the conversation already shows in an earlier context (a
/// memory recalled before is still in the history the model reads); a block left with no line
/// is dropped.
pub fn fresh_context(blocks: Vec<String>, session: &[ChatMessage]) -> Vec<String> {
    let shown: std::collections::HashSet<&str> = session
        .iter()
        .filter_map(|m| match m {
            ChatMessage::System { text } => Some(text.lines().skip(1)),
            _ => None,
        })
        .flatten()
        .collect();
    blocks
        .into_iter()
        .filter_map(|block| {
            let mut lines = block.lines();
            let head = lines.next()?;
            let new: Vec<&str> = lines.filter(|l| !shown.contains(l)).collect();
            (!new.is_empty()).then(|| format!("{head}\n{}", new.join("\n")))
        })
        .collect()
}

/// Context blocks cut to `budget` characters in all: each keeps its heading and as many of its
/// lines (best first) as fit; a block with no line left is left out.
pub fn fit_context(blocks: Vec<String>, budget: usize) -> Vec<String> {
    let mut left = budget;
    let mut out = Vec::new();
    for block in blocks {
        let mut lines = block.lines();
        let Some(head) = lines.next() else { continue };
        let mut kept = vec![head.to_owned()];
        for line in lines {
            let line: String = line.chars().take(left.min(200)).collect();
            if line.trim().is_empty() || line.len() > left {
                break;
            }
            left -= line.len();
            kept.push(line);
        }
        if kept.len() > 1 {
            out.push(kept.join("\n"));
        }
    }
    out
}

/// History kept for a local model, as a share of its context window, in characters per token
/// of the estimate: a sixteenth (256 tokens of a 4 096-token slot, the last two or three
/// exchanges; an eighth made the same question 1.9× slower at the end of a 22-task conversation
/// than at its start, a sixteenth 1.16×, with the same answers right). A
/// request's prompt then stays within a fixed budget however long the conversation — what is
/// older comes back through memory (the unconscious's recall), not by replaying it — and every
/// token of context a CPU attends over costs time on each generated token.
const HISTORY_SHARE_OF_CTX: usize = 16;
const CHARS_PER_TOKEN: usize = 3;

impl TurnState {
    /// What a delivery asks of its agent.
    pub fn of(delivery: &Delivery) -> TurnState {
        match delivery.kind {
            DeliveryKind::Result => TurnState::Result,
            DeliveryKind::Request => TurnState::Request,
            DeliveryKind::Delta => TurnState::Channel,
            DeliveryKind::Message if delivery.answer_to.is_some() => TurnState::Owed,
            DeliveryKind::Message => TurnState::Free,
        }
    }
}

/// A finished turn: its answer and the messages to append to the session.
#[derive(Debug)]
pub struct Finished {
    pub reply: String,
    pub messages: Vec<ChatMessage>,
}

/// Runs one turn of `spec` on `delivery`; `session` is this channel's conversation so far (the
/// turn's messages are appended to it).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    spec: &AgentSpec,
    client: &RouterClient,
    provider: &mut impl LlmProvider,
    pipeline: &mut Pipeline,
    workspace: Option<&crate::workspace::Workspace>,
    id: MsgId,
    delivery: &Delivery,
    session: &mut Vec<ChatMessage>,
) -> Result<Finished, String> {
    let input = TurnInput {
        id,
        from: &delivery.sender,
        text: &delivery.text,
        result: delivery.kind == DeliveryKind::Result,
    };
    let pre = pipeline.turn_pre(&input, session).await;
    if let Some(budget) = history_budget(spec) {
        trim_history(session, budget);
    }
    // Who exists right now (agents created or spawned at run time included), less the agents
    // the pipeline itself talks to; the prompt shows it only with `context_injector`.
    let catalog =
        prompts::without(tools::catalog(client).await.as_deref(), &pipeline.hidden_peers());
    let state = TurnState::of(delivery);
    let waiting = delivery.answer_to.as_deref();
    let offered = tools::offered(
        spec.role,
        spec.tools.as_deref(),
        state,
        &prompts::callable(&catalog),
        waiting,
    );
    let shown = pipeline.injects_catalog().then_some(catalog.as_str());

    // Stable first (prompt, then history): that prefix stays in the model's KV cache from turn
    // to turn (the prompt's date changes once a day). What changes every turn (memory context)
    // goes after it, with the input — which carries its own time of day.
    let now = flock_ipc::time::unix_ms_now();
    let today = pipeline.wants_time().then(|| prompts::today(now));
    let system = prompts::system_message(spec, shown, today.as_deref());
    let mut conversation = vec![ChatMessage::System { text: system }];
    conversation.extend(session.iter().cloned());
    // The turn's memory context is new text, processed in full on each request. For a local model
    // it joins the conversation with the turn (so it is part of the cached history afterwards),
    // only the memories the history does not already show are added, and those within a fixed
    // budget (best first): memory that grows does not make every answer slower.
    let local = history_budget(spec).is_some();
    let (context, kept_context) = if local {
        let new = fresh_context(pre.context, session);
        (Vec::new(), fit_context(new, CONTEXT_BUDGET_CHARS))
    } else {
        (pre.context, Vec::new())
    };
    conversation.extend(context.into_iter().map(|text| ChatMessage::System { text }));
    // A delegate's result is not a message to answer *to its sender*: say whom the answer is for
    // (models, small and not so small, otherwise thank the worker).
    let relay = state == TurnState::Result && spec.role.is_reflexive();
    if state == TurnState::Result && !relay {
        let waiting = waiting.unwrap_or("the person who asked");
        conversation.push(ChatMessage::System {
            text: format!(
                "The message below is {}'s result for the request above. Answer {waiting} now, \
                 using it; your answer is delivered to them.",
                delivery.sender
            ),
        });
    }
    let start = conversation.len();
    conversation.extend(kept_context.into_iter().map(|text| ChatMessage::System { text }));
    let input_at = conversation.len();
    let text = match delivery.kind {
        DeliveryKind::Result => format!("[result] {}", delivery.text),
        _ => delivery.text.clone(),
    };
    let others = answers_to_others(session, &text);
    let at = pipeline.wants_time().then_some(now);
    conversation.push(ChatMessage::User { from: delivery.sender.clone(), text, at });

    // The pipeline may have found the answer itself (the unconscious's recall), or the role
    // relays a delegate's result as it is: no model call.
    let mut reply = if relay { Some(delivery.text.clone()) } else { pre.reply };
    if let Some(text) = &reply {
        conversation.push(ChatMessage::Assistant { text: text.clone() });
    }
    let mut calls = 0u32;
    let mut made = std::collections::HashSet::new();
    let mut errors: Vec<String> = Vec::new();
    let mut text_only = false;
    let mut retried = false;
    let mut sent_back: Option<String> = None;
    let mut delegated = false;
    // An answer that is not one (the request said again, or an earlier answer to another request
    // copied) is asked for once more without the session's history — the text it copied from —
    // nor the tools; if the model still does it, the exchange stays out of the session.
    let mut echo_noted = false;
    let mut no_answer = false;
    let history_end = 1 + session.len();
    let answers_a_person = matches!(state, TurnState::Owed | TurnState::Request);
    let wants_file = needs_a_file(&delivery.text);
    let (mut wrote_file, mut nudged) = (false, false);
    // The files this turn wrote: an answer that does not name them gets them named (the person
    // must learn where the work is, whatever words a small model chose).
    let mut written: Vec<String> = Vec::new();
    // …and what `fs_write` put in them: a person who asked for a list, not a file, gets the list.
    let mut contents: Vec<(String, String)> = Vec::new();
    // A request for work the agent has no tool for (a file, for a coordinator) is handed to the
    // agent that has one by the runtime, not left to the model: a small model answers "here is
    // your file" without any tool writing it.
    let hands_files_over = state == TurnState::Owed
        && spec.role.is_reflexive()
        && !offered.iter().any(|t| t.name == "fs_write");
    let mut handed_over = false;
    // A coordinator whose swarm says `delegate: always` is a router: every request it owes an
    // answer for goes to its delegate, its model is not asked.
    let routes_all = state == TurnState::Owed
        && spec.role.is_reflexive()
        && spec.delegate == flock_config::Delegate::Always;
    let mut forced = (reply.is_none() && (routes_all || (hands_files_over && wants_file)))
        .then(|| delegate_target(&offered))
        .flatten()
        .map(|to| {
            let why =
                if routes_all { "the swarm routes every request" } else { "it asks for a file" };
            tracing::info!("  the request is handed to {to} without asking the model ({why})");
            handed_over = true;
            runtime_handover(&to)
        });
    // The team protocol (project channels, the archive) for this turn's role and input.
    let all_tools = tools::definitions_for(spec.role);
    let this_turn = workflow::Turn {
        me: &client.name,
        role: spec.role,
        archetype: spec.archetype.as_deref(),
        state,
        channel: delivery.channel.as_deref(),
        sender: &delivery.sender,
        answer_to: waiting,
        text: &delivery.text,
        done: &[],
    };
    for step in 0..MAX_STEPS {
        if reply.is_some() {
            break;
        }
        pipeline.step_pre(step, &mut conversation);
        let done = calls_since(&conversation, input_at);
        let planned = match (&forced, text_only) {
            (None, false) => {
                workflow::plan(&workflow::Turn { done: &done, ..this_turn }, &offered, &all_tools)
            }
            _ => Step::Free,
        };
        // A protocol step: the tool it must call, and the channel when it is a post (words
        // instead of the post are posted by the runtime).
        let mut protocol: Option<(String, Option<String>)> = None;
        let next = match (forced.take(), planned) {
            (Some(step), _) => step,
            (None, Step::Reply(text)) => {
                tracing::info!("  {}", crate::quote(&text));
                conversation.push(ChatMessage::Assistant { text: text.clone() });
                reply = Some(text);
                break;
            }
            (None, Step::Call { name, arguments }) => runtime_call(step, name, &arguments),
            (None, Step::Model { tools, note }) => {
                let post = tools.iter().find(|t| t.name == "flock_channel_post");
                let posts_to = post.and_then(|t| {
                    t.parameters.pointer("/properties/channel/enum/0")?.as_str().map(str::to_owned)
                });
                let tool = post.or(tools.first()).map(|t| t.name.clone()).unwrap_or_default();
                protocol = Some((tool, posts_to));
                // The step's note is read right before the model writes, and leaves with it.
                conversation.push(ChatMessage::System { text: note });
                let next = provider.next(&conversation, &tools, true).await;
                conversation.pop();
                next?
            }
            (None, Step::Free) => {
                let tools: &[_] = if text_only { &[] } else { &offered };
                if echo_noted {
                    let view = without_history(&conversation, history_end);
                    provider.next(&view, tools, false).await?
                } else {
                    provider.next(&conversation, tools, false).await?
                }
            }
        };
        match next {
            // A protocol step answered in words: a post's words are posted for the model; a
            // cut-off or missing call is a refused call of the step's tool (the protocol counts
            // it, and gives the step up after its tries).
            LlmStep::Final(text) if protocol.is_some() => {
                let (tool, posts_to) = protocol.take().unwrap_or_default();
                let cut = text.trim().is_empty() || text.trim_start().starts_with("{\"tool\"");
                match posts_to {
                    Some(channel) if !cut => {
                        tracing::info!(
                            "  the model answered in words where a post was due: posted for it"
                        );
                        let arguments =
                            serde_json::json!({"channel": channel, "text": text.trim()});
                        forced = Some(runtime_call(step, "flock_channel_post", &arguments));
                    }
                    _ => {
                        let why = if cut {
                            "BAD_REQUEST: the call was cut off or incomplete; write it again, shorter"
                        } else {
                            "BAD_REQUEST: this step needs a call, not words"
                        };
                        // Its arguments say which step it missed (a post: its channel).
                        let arguments = match posts_to {
                            Some(channel) => serde_json::json!({"channel": channel}).to_string(),
                            None => "{}".to_owned(),
                        };
                        let id = format!("{RUNTIME_CALL}missed-{step}");
                        refused(client, &mut conversation, id, &tool, arguments, why).await;
                    }
                }
            }
            LlmStep::Final(text) => {
                if echoes_an_error(&text, &errors) {
                    if !retried {
                        // Ask once more, in words; the echo is not kept.
                        tracing::info!(
                            "  the answer repeated a tool error; asking again for words"
                        );
                        retried = true;
                        text_only = true;
                        conversation.push(ChatMessage::System { text: RETRY_NOTE.into() });
                        continue;
                    }
                    let fallback = could_not_finish(&errors);
                    conversation.retain(|m| !is_retry_note(m));
                    conversation.push(ChatMessage::Assistant { text: fallback.clone() });
                    reply = Some(fallback);
                    break;
                }
                // An answer that only says the request again, or copies an earlier answer to
                // another request, is not an answer. Measured on the 1.5B model: offered tools,
                // it says "Plan my week: …" back; the same request without the tools and the
                // history (the text it copies from) gets the plan. So it is asked once more that
                // way — no note and no draft either: a small model copies those too.
                // (Judged for each draft: the one that ends the turn decides the session.)
                no_answer = answers_a_person && not_an_answer(&text, &delivery.text, &others);
                if no_answer && !echo_noted {
                    tracing::info!(
                        "  the answer only restated the request or an earlier answer; asking \
                         once more without the history and the tools"
                    );
                    echo_noted = true;
                    text_only |= !wants_file;
                    continue;
                }
                // An answer that claims a file nobody wrote in this turn: an agent without
                // `fs_write` hands the request to the agent that has it (the draft is dropped)…
                let claims = !wrote_file && claims_a_file(&text);
                if claims
                    && hands_files_over
                    && !handed_over
                    && let Some(to) = delegate_target(&offered)
                {
                    tracing::info!(
                        "  the answer claims a file no tool wrote: handed to {to} instead"
                    );
                    handed_over = true;
                    forced = Some(runtime_handover(&to));
                    continue;
                }
                // …and one with `fs_write` is asked once to write it (a request for a file
                // answered without writing one, or an answer that claims one).
                if !nudged
                    && (wants_file || claims)
                    && !wrote_file
                    && offered.iter().any(|t| t.name == "fs_write")
                    && !text_only
                {
                    tracing::info!("  a file was asked for and none was written: asking once more");
                    nudged = true;
                    conversation.push(ChatMessage::Assistant { text });
                    conversation.push(ChatMessage::System { text: WRITE_IT_NOTE.into() });
                    continue;
                }
                // A draft that claimed a file, and its note, leave the conversation.
                if let Some(at) =
                    conversation.iter().rposition(is_write_it_note).filter(|&at| at > 0)
                {
                    conversation.drain(at - 1..=at);
                }
                // An extension may send the answer back once (a reflection over its budget):
                // the model sees its draft and the note; neither stays in the session.
                if sent_back.is_none()
                    && let Some(note) = pipeline.review_answer(&text)
                {
                    tracing::info!("  the answer was sent back once: {}", crate::quote(&note));
                    conversation.push(ChatMessage::Assistant { text });
                    conversation.push(ChatMessage::System { text: note.clone() });
                    sent_back = Some(note);
                    continue;
                }
                conversation.retain(|m| !is_retry_note(m));
                conversation.push(ChatMessage::Assistant { text: text.clone() });
                reply = Some(text);
                break;
            }
            LlmStep::ToolCalls(requested) => {
                let mut delegated_to = None;
                for call in requested {
                    // A model that repeats the exact same call in one turn is looping (small
                    // models do): the repeat is not run, and the next step may only answer.
                    if !made.insert((call.name.clone(), call.arguments.clone())) {
                        tracing::info!(
                            tool = %call.name,
                            "  repeated call {} not run again; asking for the answer",
                            call.name
                        );
                        // At a protocol step it is a refused call: the next step is due.
                        match protocol {
                            Some(_) => {
                                let why = "BAD_REQUEST: this exact call was made already; do the \
                                           next step";
                                let id = format!("{RUNTIME_CALL}missed-{step}");
                                let (name, args) = (&call.name, call.arguments.clone());
                                refused(client, &mut conversation, id, name, args, why).await;
                            }
                            None => text_only = true,
                        }
                        continue;
                    }
                    // A hand-over says whose request it is: "my week" is the person's week.
                    let mut call = hand_over(call, delivery, spec.role.is_reflexive());
                    // A protocol step's call as the protocol needs it (a topic that says who
                    // asked, a post that hands over).
                    if let Ok(args) = serde_json::from_str(&call.arguments)
                        && let Some(amended) = workflow::amend(
                            &workflow::Turn { done: &done, ..this_turn },
                            &call.name,
                            &args,
                        )
                    {
                        call.arguments = amended.to_string();
                    }
                    // …and refused before it runs when it breaks the protocol's rules (a copy
                    // of the channel, a file nobody wrote): the model reads why.
                    let refusal = (!call.id.starts_with(RUNTIME_CALL))
                        .then(|| serde_json::from_str(&call.arguments).ok())
                        .flatten()
                        .and_then(|args| {
                            let t = workflow::Turn { done: &done, ..this_turn };
                            workflow::check(&t, &call.name, &args)
                        });
                    if let Some(why) = refusal {
                        errors.push(why.clone());
                        let (id, name, args) = (call.id, call.name, call.arguments);
                        refused(client, &mut conversation, id, &name, args, &why).await;
                        continue;
                    }
                    let tool_span = tracing::info_span!("tool", tool = %call.name, call = calls);
                    let out = async {
                        let local = match pipeline.tool_call_pre(&call) {
                            Some(out) => Some(out),
                            None => {
                                let (name, args) = (&call.name, &call.arguments);
                                tools::workspace_tool(
                                    client,
                                    spec.role,
                                    spec.sandbox,
                                    workspace,
                                    name,
                                    args,
                                )
                                .await
                            }
                        };
                        match local {
                            Some(out) => out,
                            None => {
                                let (name, args) = (&call.name, &call.arguments);
                                // Memory writes are the supervisor's, under an id derived from the
                                // turn: a replayed turn remembers nothing twice.
                                let out = tools::execute(client, id, calls, name, args).await;
                                if out.ok && crate::memory::is_memory_write(name) {
                                    crate::memory::journal_write(client, name, args).await;
                                }
                                out
                            }
                        }
                    }
                    .instrument(tool_span.clone())
                    .await;
                    pipeline.tool_call_post(&call, &out);
                    calls += 1;
                    tool_span.in_scope(|| {
                        tracing::info!(
                            ok = out.ok,
                            "  tool {} {} → {}: {}",
                            call.name,
                            call.arguments,
                            if out.ok { "ok" } else { "error" },
                            crate::quote(&out.content)
                        )
                    });
                    if out.ok && matches!(call.name.as_str(), "fs_write" | "fs_patch") {
                        wrote_file = true;
                        let args = serde_json::from_str::<serde_json::Value>(&call.arguments)
                            .unwrap_or_default();
                        if let Some(path) = args["path"].as_str().map(str::to_owned) {
                            if let Some(content) = args["content"].as_str() {
                                contents.retain(|(p, _)| *p != path);
                                contents.push((path.clone(), content.to_owned()));
                            }
                            if !written.contains(&path) {
                                written.push(path);
                            }
                        }
                    }
                    if out.ok && call.name == "agents__delegate" {
                        delegated_to = serde_json::from_str::<serde_json::Value>(&call.arguments)
                            .ok()
                            .and_then(|a| a["to"].as_str().map(str::to_owned));
                    }
                    if !out.ok {
                        errors.push(out.content.clone());
                    }
                    conversation.push(ChatMessage::ToolCall {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments,
                    });
                    conversation.push(ChatMessage::ToolResult {
                        call_id: call.id,
                        name: call.name,
                        ok: out.ok,
                        content: out.content,
                    });
                    if delegated_to.is_some() {
                        break;
                    }
                }
                // A delegation ends the turn: the answer is the delegate's, later. The session
                // keeps only the input: the result turn then reads the request and the result
                // side by side (a small model copies a stored "(delegated …)" line instead).
                if let Some(to) = delegated_to {
                    conversation.truncate(input_at + 1);
                    reply = Some(format!("(delegated to {to})"));
                    delegated = true;
                    break;
                }
            }
        }
    }
    let text = reply.unwrap_or_else(|| {
        let text = format!("(stopped after {MAX_STEPS} steps without a final answer)");
        conversation.push(ChatMessage::Assistant { text: text.clone() });
        text
    });
    // A person who asked for a list gets the list; one who asked for something to be kept (a
    // note, a file) gets the confirmation.
    let wants_the_text = answers_a_person && !wants_file && !asks_to_keep(&delivery.text);
    let text = match (delegated, wants_the_text) {
        (true, _) => text,
        (false, false) => name_the_files(text, &written),
        (false, true) => show_the_work(name_the_files(text, &written), &contents),
    };
    // A draft that was sent back, and the note that did, leave the session however it ended.
    if let Some(note) = sent_back {
        let at = conversation
            .iter()
            .rposition(|m| matches!(m, ChatMessage::System { text } if *text == note));
        if let Some(at) = at.filter(|&at| at > 0) {
            conversation.drain(at - 1..=at);
        }
    }
    pipeline.turn_post(&input, &text, delegated).await;
    // Only a finished turn joins the session (a failed one is retried from scratch). After a
    // compaction the store gets the compacted session again ahead of the turn, so a restart
    // resumes from the summary.
    let mut turn_messages: Vec<ChatMessage> = conversation.drain(start..).collect();
    if no_answer {
        tracing::info!("  the answer still only restated: the exchange is left out of the session");
        turn_messages.clear();
    }
    session.extend(turn_messages.iter().cloned());
    let mut messages = pre.persist_first;
    messages.extend(turn_messages);
    Ok(Finished { reply: text, messages })
}

/// `answer`, with the files the turn wrote named at its end when it names none of them
/// (`File written successfully.` → `File written successfully. (notes.txt)`).
fn name_the_files(answer: String, written: &[String]) -> String {
    let named = |p: &String| {
        let file = p.rsplit('/').next().unwrap_or(p);
        answer.contains(p.as_str()) || (!file.is_empty() && answer.contains(file))
    };
    if written.is_empty() || written.iter().any(named) {
        return answer;
    }
    format!("{} ({})", answer.trim_end(), written.join(", "))
}

/// The conversation without the session's history (`conversation[1..history_end]`) and
/// without the input's time of day: a model with nothing else to go by copies its
/// `[from, 17:59 UTC]` form into the answer.
fn without_history(conversation: &[ChatMessage], history_end: usize) -> Vec<ChatMessage> {
    conversation[..1]
        .iter()
        .chain(&conversation[history_end..])
        .map(|m| match m {
            ChatMessage::User { from, text, .. } => {
                ChatMessage::User { from: from.clone(), text: text.clone(), at: None }
            }
            other => other.clone(),
        })
        .collect()
}

/// `answer`, with the text of each file the turn wrote that it does not already show: the turn's
/// request asked for an answer, not a file (a small model with `fs_write` puts a to-do list in
/// `notes/moving.txt` and answers "I wrote 191 bytes to notes/moving.txt"). Each file at most
/// 2,000 characters.
fn show_the_work(answer: String, contents: &[(String, String)]) -> String {
    let mut out = answer.trim_end().to_owned();
    for (path, content) in contents {
        let content = content.trim();
        if !content.is_empty() && !answer.contains(content) {
            out.push_str(&format!("\n\n{path}:\n{}", crate::clip(content, 2000)));
        }
    }
    out
}

/// Whether a request asks for something to be kept rather than answered: "keep my trip notes",
/// "save this", "remember that …", "log it".
fn asks_to_keep(text: &str) -> bool {
    const KEEP: [&str; 8] =
        ["keep", "save", "store", "record", "remember", "log", "archive", "jot"];
    text.to_lowercase().split(|c: char| !c.is_alphanumeric()).any(|w| KEEP.contains(&w))
}

/// Whether a request asks for a file to be written (made, saved…): "write a file named
/// notes.txt", "save the list to list.md".
pub fn needs_a_file(text: &str) -> bool {
    const VERBS: [&str; 9] =
        ["write", "create", "save", "make", "put", "store", "append", "generate", "produce"];
    let lower = text.to_lowercase();
    let words: Vec<&str> =
        lower.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '_' || c == '-')).collect();
    let verb = words.iter().position(|w| VERBS.contains(&w.trim_end_matches('.')));
    verb.is_some_and(|v| words[v..].iter().take(12).any(|w| is_file(w)))
}

/// Whether an answer says a file was written (made, saved…) or presents one as made: "I wrote
/// notes.txt", "Here's a file named notes.txt in your workspace", "saved it to list.md".
pub fn claims_a_file(text: &str) -> bool {
    const CLAIMS: [&str; 8] =
        ["wrote", "written", "created", "saved", "stored", "generated", "put", "added"];
    let lower = text.to_lowercase().replace('’', "'");
    if ["here's a file", "here is a file", "here's the file", "here is the file"]
        .iter()
        .any(|p| lower.contains(p))
    {
        return true;
    }
    let words: Vec<&str> =
        lower.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '_' || c == '-')).collect();
    words.iter().enumerate().any(|(i, w)| {
        CLAIMS.contains(&w.trim_end_matches('.')) && words[i..].iter().take(10).any(|w| is_file(w))
    })
}

/// A word that names a file: `file(s)` or a name with a known extension (`notes.txt`).
pub(crate) fn is_file(word: &str) -> bool {
    const EXTENSIONS: [&str; 14] = [
        "txt", "md", "csv", "json", "yaml", "yml", "toml", "py", "rs", "js", "ts", "sh", "html",
        "log",
    ];
    let w = word.trim_end_matches('.');
    w == "file"
        || w == "files"
        || w.rsplit_once('.')
            .is_some_and(|(stem, ext)| !stem.is_empty() && EXTENSIONS.contains(&ext))
}

/// The runtime's own `agents__delegate` of the input to `to` (a reflexive role hands the input
/// over as it is).
/// A call the runtime makes itself at protocol step `step` (its id says so: a scripted model
/// does not count it among its own steps).
fn runtime_call(step: usize, name: &str, arguments: &serde_json::Value) -> LlmStep {
    LlmStep::ToolCalls(vec![crate::provider::ToolCall {
        id: format!("{RUNTIME_CALL}{step}"),
        name: name.into(),
        arguments: arguments.to_string(),
    }])
}

/// A call refused at a protocol step (words or a cut-off call where a call was due, a repeat,
/// a copy of the channel, a claim of a file nobody wrote), recorded as a failed call of `tool`
/// with its arguments: the model reads why, the protocol counts the try, and the journal shows
/// it (`TOOL_REFUSED`).
async fn refused(
    client: &RouterClient,
    conversation: &mut Vec<ChatMessage>,
    id: String,
    tool: &str,
    arguments: String,
    why: &str,
) {
    tracing::info!(tool = %tool, "  {tool} refused: {why}");
    let event = serde_json::json!({
        "type": "TOOL_REFUSED",
        "message": format!("{tool} refused: {why}"),
        "params": {"tool": tool},
    });
    let _ = crate::output::forward(client, "journal__event", &event).await;
    conversation.push(ChatMessage::ToolCall { id: id.clone(), name: tool.to_owned(), arguments });
    conversation.push(ChatMessage::ToolResult {
        call_id: id,
        name: tool.to_owned(),
        ok: false,
        content: why.to_owned(),
    });
}

/// The id prefix of the calls the runtime makes itself.
pub const RUNTIME_CALL: &str = "runtime-";

/// The calls made since the input at `input_at`, with their results.
fn calls_since(conversation: &[ChatMessage], input_at: usize) -> Vec<workflow::Done> {
    let mut done: Vec<workflow::Done> = Vec::new();
    for m in conversation.iter().skip(input_at + 1) {
        match m {
            ChatMessage::ToolCall { name, arguments, .. } => done.push(workflow::Done {
                name: name.clone(),
                arguments: serde_json::from_str(arguments).unwrap_or_default(),
                ok: false,
                content: String::new(),
            }),
            ChatMessage::ToolResult { ok, content, .. } => {
                if let Some(last) = done.last_mut() {
                    last.ok = *ok;
                    last.content = content.clone();
                }
            }
            _ => {}
        }
    }
    done
}

fn runtime_handover(to: &str) -> LlmStep {
    LlmStep::ToolCalls(vec![crate::provider::ToolCall {
        id: format!("{RUNTIME_CALL}handover"),
        name: "agents__delegate".into(),
        arguments: serde_json::json!({"to": to}).to_string(),
    }])
}

/// Whom a runtime hand-over goes to: the first agent `agents__delegate` may address.
fn delegate_target(offered: &[flock_ipc::llm::ToolDef]) -> Option<String> {
    let delegate = offered.iter().find(|t| t.name == "agents__delegate")?;
    let to = delegate.parameters.pointer("/properties/to/enum")?.as_array()?;
    to.first()?.as_str().map(str::to_owned)
}

/// An `agents__delegate` as it goes out: a reflexive role hands over the input itself (its model
/// only picks the delegate), and a person's request says who asks ("my week" is theirs).
fn hand_over(
    mut call: crate::provider::ToolCall,
    delivery: &Delivery,
    reflexive: bool,
) -> crate::provider::ToolCall {
    if call.name != "agents__delegate" {
        return call;
    }
    let Ok(mut args) = serde_json::from_str::<serde_json::Value>(&call.arguments) else {
        return call;
    };
    let mut task = match (reflexive, args["task"].as_str()) {
        (false, Some(t)) => t.to_owned(),
        _ => delivery.text.clone(),
    };
    let person = match delivery.sender.as_str() {
        flock_ipc::OPERATOR => Some("human:operator"),
        s if s.starts_with("human:") => Some(s),
        _ => None,
    };
    if let Some(person) = person.filter(|p| !task.starts_with(p)) {
        task = format!("{person} asks: {task}");
    }
    args["task"] = task.into();
    call.arguments = args.to_string();
    call
}

const WRITE_IT_NOTE: &str = "[note] The request asks for a file, and no file was written: call \
                             fs_write with the file's path and content now, then answer.";

fn is_write_it_note(m: &ChatMessage) -> bool {
    matches!(m, ChatMessage::System { text } if text == WRITE_IT_NOTE)
}

/// Whether an answer of eight words or more is mostly the request said again: four in five of
/// its word 4-grams are the request's.
pub fn restates(answer: &str, request: &str) -> bool {
    crate::workflow::copied_share(answer, &[request.to_owned()]) >= 0.8
}

/// Whether `answer` answers something else: it restates `request`, or it is one of the `earlier`
/// answers (to other requests) copied — nine in ten of its word 4-grams are theirs — without one
/// word of the request that those answers lack. A follow-up ("move PyCon to Friday") changes
/// the earlier answer or uses the request's new words; a copy does neither. A request that asks
/// for an earlier answer ("again", "repeat", "same" …) may get one.
pub fn not_an_answer(answer: &str, request: &str, earlier: &[String]) -> bool {
    if restates(answer, request) {
        return true;
    }
    if earlier.is_empty() || crate::workflow::copied_share(answer, earlier) < 0.9 {
        return false;
    }
    let words = |s: &str| -> std::collections::HashSet<String> {
        s.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.len() >= 4)
            .map(str::to_owned)
            .collect()
    };
    let asked = words(request);
    // "Say it again", "the same as before": a request for an earlier answer.
    const BACK: [&str; 7] = ["again", "repeat", "same", "previous", "earlier", "above", "remind"];
    if BACK.iter().any(|w| asked.contains(*w)) {
        return false;
    }
    let known: std::collections::HashSet<String> = earlier.iter().flat_map(|e| words(e)).collect();
    let new: Vec<&String> = asked.iter().filter(|w| !known.contains(*w)).collect();
    let said = words(answer);
    !new.is_empty() && !new.iter().any(|w| said.contains(*w))
}

/// The answers in `session` to requests other than `request` (a request said again may get its
/// answer again).
fn answers_to_others(session: &[ChatMessage], request: &str) -> Vec<String> {
    let mut asked: Option<&str> = None;
    let mut out = Vec::new();
    for m in session {
        match m {
            ChatMessage::User { text, .. } => asked = Some(text),
            ChatMessage::Assistant { text } => {
                if let Some(q) = asked.take()
                    && q.trim() != request.trim()
                    && !restates(q, request)
                    && !restates(request, q)
                {
                    out.push(text.clone());
                }
            }
            _ => {}
        }
    }
    out
}

const RETRY_NOTE: &str = "[note] Your last answer only repeated a tool error. Answer the request \
                          itself now, in plain words, with what you know or did.";

fn is_retry_note(m: &ChatMessage) -> bool {
    matches!(m, ChatMessage::System { text } if text == RETRY_NOTE)
}

/// Whether a final answer is only an error string (one the tools returned, or in their form),
/// or a tool call written out as text (`{"tool": …}`) instead of made.
pub fn echoes_an_error(text: &str, errors: &[String]) -> bool {
    let t = text.trim();
    if t.is_empty() {
        return false;
    }
    if serde_json::from_str::<serde_json::Value>(t).is_ok_and(|v| v.get("tool").is_some()) {
        return true;
    }
    let upper = t.trim_start_matches(['[', '(', '"', '\'']);
    let code_like = ErrorCode::ALL.iter().any(|c| upper.starts_with(c.as_str()))
        || upper.starts_with("ERROR")
        || upper.starts_with("DUPLICATE");
    code_like || errors.iter().any(|e| e.len() >= 20 && t.contains(e.trim()))
}

/// The answer when the model could only repeat an error: what failed, said for a person.
fn could_not_finish(errors: &[String]) -> String {
    match errors.last() {
        Some(e) => {
            format!("I could not finish this: a step failed ({}).", crate::clip(e, 160))
        }
        None => "I could not finish this: I found no answer to give.".to_owned(),
    }
}

/// The history budget, in characters, of an agent on the embedded model (its context is
/// small); `None` for remote models, whose windows are large.
fn history_budget(spec: &AgentSpec) -> Option<usize> {
    match &spec.model {
        ModelSpec::Local(m) => Some(m.ctx as usize / HISTORY_SHARE_OF_CTX * CHARS_PER_TOKEN),
        _ => None,
    }
}

/// Past `budget` characters, drops the oldest messages down to half the budget, cutting at a
/// user message or summary. Dropping in big steps (not one message per turn) keeps the history
/// a stable prefix for many turns, which is what the model server's KV cache reuses.
pub fn trim_history(session: &mut Vec<ChatMessage>, budget: usize) {
    let total: usize = session.iter().map(crate::extensions::chars_of).sum();
    if total <= budget {
        return;
    }
    let mut over = total - budget / 2;
    let mut cut = 0;
    while cut < session.len() && over > 0 {
        over = over.saturating_sub(crate::extensions::chars_of(&session[cut]));
        cut += 1;
    }
    session.drain(..cut);
    crate::extensions::window(session, usize::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_names_the_files_its_turn_wrote() {
        let w = vec!["notes.txt".to_owned(), "src/main.rs".to_owned()];
        assert_eq!(
            name_the_files("File written successfully.".into(), &w),
            "File written successfully. (notes.txt, src/main.rs)"
        );
        assert_eq!(name_the_files("Wrote notes.txt.".into(), &w), "Wrote notes.txt.");
        assert_eq!(name_the_files("See main.rs".into(), &w), "See main.rs");
        assert_eq!(name_the_files("Done.".into(), &[]), "Done.");
    }

    #[test]
    fn a_memory_the_history_already_shows_is_not_added_again() {
        let session = vec![
            ChatMessage::System {
                text: "[unconscious_context]\n- likes tea\n- lives in Lisbon".into(),
            },
            ChatMessage::User { from: "human:dana".into(), text: "hi".into(), at: None },
        ];
        let blocks = vec![
            "[unconscious_context]\n- lives in Lisbon\n- has a cat, Miso".to_owned(),
            "[active_memory]\n- likes tea".to_owned(),
        ];
        assert_eq!(fresh_context(blocks, &session), ["[unconscious_context]\n- has a cat, Miso"]);
    }

    #[test]
    fn the_memory_context_of_a_turn_is_held_to_its_budget_best_lines_first() {
        let recall =
            (1..=10).map(|i| format!("- memory {i}: {}", "x".repeat(90))).collect::<Vec<_>>();
        let blocks = vec![
            format!("[active_memory]\n{}", "- the person likes tea"),
            format!("[unconscious_context]\n{}", recall.join("\n")),
            "[journal]\n".to_owned(),
        ];
        let fitted = fit_context(blocks, 300);
        let size: usize =
            fitted.iter().map(|b| b.lines().skip(1).map(str::len).sum::<usize>()).sum();
        assert!(size <= 300, "{fitted:#?}");
        assert_eq!(fitted.len(), 2, "an empty block is left out: {fitted:#?}");
        assert!(fitted[0].ends_with("likes tea"));
        assert!(fitted[1].contains("memory 1:") && !fitted[1].contains("memory 5:"), "{fitted:#?}");
    }

    #[test]
    fn the_history_a_request_carries_stays_bounded_after_a_hundred_requests() {
        let budget = 4096 / HISTORY_SHARE_OF_CTX * CHARS_PER_TOKEN;
        let mut session: Vec<ChatMessage> = Vec::new();
        let mut largest = 0;
        for i in 0..100 {
            trim_history(&mut session, budget);
            let size: usize = session.iter().map(crate::extensions::chars_of).sum();
            largest = largest.max(size);
            session.push(ChatMessage::User {
                from: "human:operator".into(),
                text: format!("request {i}: {}", "what about this and that? ".repeat(3)),
                at: None,
            });
            session
                .push(ChatMessage::Assistant { text: format!("answer {i}: {}", "ok ".repeat(40)) });
        }
        trim_history(&mut session, budget);
        assert!(largest <= budget, "a request carried {largest} characters of history");
        // The newest exchange is always there; the oldest are gone.
        assert!(
            matches!(session.last(), Some(ChatMessage::Assistant { text }) if text.starts_with("answer 99"))
        );
        assert!(
            matches!(&session[0], ChatMessage::User { text, .. } if !text.starts_with("request 0:"))
        );
    }

    #[test]
    fn an_answer_that_only_restates_the_request_is_recognised() {
        let request = "human:operator asks: Plan my week: two talks (the Rust meetup and PyCon) \
                       and the v3 release. Give each item a day.";
        assert!(restates(
            "Plan my week: two talks (the Rust meetup and PyCon) and the v3 release. Give each item a day.",
            request
        ));
        let plan = "Monday: the Rust meetup talk. Wednesday: the PyCon talk. Friday: ship the v3 \
                    release.";
        assert!(!restates(plan, request));
        // Short answers are never taken for a restatement ("Paris.", "42").
        assert!(!restates("Plan my week", request));
        let summary = "Summarise in one sentence: the server crashed at 2am because the disk was \
                       full, and we freed 20 GB.";
        assert!(!restates(
            "The disk filled up at 2am and crashed the server; 20 GB were freed.",
            summary
        ));
    }

    #[test]
    fn an_answer_shows_the_files_the_turn_wrote_when_none_was_asked_for() {
        let list = "- pack the boxes\n- book the van\n- collect the new keys";
        let wrote = vec![("notes/moving.txt".to_owned(), format!("{list}\n"))];
        let answer = show_the_work("I wrote 52 bytes to notes/moving.txt.".into(), &wrote);
        assert_eq!(
            answer,
            format!("I wrote 52 bytes to notes/moving.txt.\n\nnotes/moving.txt:\n{list}")
        );
        // An answer that already shows it is left alone.
        let shown = format!("Your list:\n{list}");
        assert_eq!(show_the_work(shown.clone(), &wrote), shown);
        assert_eq!(show_the_work("Done.".into(), &[]), "Done.");
        // Only where the request wanted the text, not something kept.
        assert!(!asks_to_keep("I am moving flats on Saturday. Make a to-do list."));
        assert!(asks_to_keep("keep my trip notes: Lisbon, 3 days"));
        assert!(asks_to_keep("Please save this for later"));
        assert!(!asks_to_keep("Write a short note to the team about Friday"));
    }

    #[test]
    fn an_earlier_answer_copied_to_another_request_is_not_an_answer() {
        let week = "Monday: give the Rust meetup talk. Wednesday: give the PyCon talk. Friday: \
                    ship the v3 release.";
        let earlier = vec![week.to_owned()];
        let picnic = "Make a short checklist for a picnic with sandwiches, lemonade and a blanket.";
        assert!(not_an_answer(week, picnic, &earlier));
        assert!(!not_an_answer("Sandwiches, lemonade, a blanket, napkins.", picnic, &earlier));
        // A follow-up that changes the earlier answer is one…
        let moved = "Monday: give the Rust meetup talk. Friday: give the PyCon talk. Friday: ship \
                     the v3 release.";
        assert!(!not_an_answer(moved, "Move the PyCon talk to Friday.", &earlier));
        // …and so is one that keeps nine tenths of it but uses the request's new word.
        let long = "Monday: give the Rust meetup talk in the morning, then review the slides after \
                    lunch with the team. Wednesday: give the PyCon talk and meet the organisers \
                    for dinner. Friday: ship the v3 release and write the announcement.";
        let earlier_long = vec![long.to_owned()];
        let umbrella = "Add an umbrella to Friday.";
        let with_it = format!("{long} Umbrella.");
        assert!(crate::workflow::copied_share(&with_it, &earlier_long) >= 0.9);
        assert!(!not_an_answer(&with_it, umbrella, &earlier_long));
        assert!(not_an_answer(long, umbrella, &earlier_long), "the same text without it");
        // A request with no word the earlier answers lack may get one of them again.
        assert!(!not_an_answer(week, "Say the week plan again.", &earlier));
        assert!(!not_an_answer(week, "Repeat that for my calendar, please.", &earlier));
        // With nothing earlier only a restatement counts.
        assert!(!not_an_answer(week, picnic, &[]));
    }

    #[test]
    fn earlier_answers_to_the_same_request_are_not_counted_as_others() {
        let user = |text: &str| ChatMessage::User { from: "p".into(), text: text.into(), at: None };
        let answer = |text: &str| ChatMessage::Assistant { text: text.into() };
        let session = vec![
            user("What is the capital of France, and what river runs through it?"),
            answer("Paris; the Seine runs through it."),
            user("Plan my week: two talks and the release."),
            answer("Monday: talk one. Tuesday: talk two. Friday: the release."),
        ];
        let others = answers_to_others(
            &session,
            "What is the capital of France, and what river runs through it?",
        );
        assert_eq!(others, vec!["Monday: talk one. Tuesday: talk two. Friday: the release."]);
    }

    #[test]
    fn an_answer_that_claims_a_file_is_recognised() {
        for yes in [
            "Here's a file named notes.txt in your workspace that contains the word banana.",
            "I wrote notes.txt for you.",
            "Done: saved the list to list.md",
            "I have created the file.",
        ] {
            assert!(claims_a_file(yes), "{yes}");
        }
        for no in ["The capital of France is Paris.", "You could write a file for that.", "7"] {
            assert!(!claims_a_file(no), "{no}");
        }
    }

    #[test]
    fn a_request_for_a_file_is_recognised_and_talk_about_files_is_not() {
        for yes in [
            "Write a file named notes.txt in your workspace that contains the word banana.",
            "please save the shopping list to list.md",
            "Create a file with my three goals",
            "make todo.txt with: milk, eggs",
        ] {
            assert!(needs_a_file(yes), "{yes}");
        }
        for no in [
            "What is in notes.txt?",
            "How do I write a good README?",
            "What is the capital of France?",
            "Plan my week: two talks and a release",
            "Write a haiku about rain.",
        ] {
            assert!(!needs_a_file(no), "{no}");
        }
    }

    #[test]
    fn error_strings_are_recognised_in_any_usual_form() {
        let errors = vec!["BAD_REQUEST: no channel named `general-talk` here".to_string()];
        assert!(echoes_an_error("ERROR DUPLICATE: you already made this call", &[]));
        assert!(echoes_an_error("BAD_REQUEST: x", &[]));
        assert!(echoes_an_error("[FORBIDDEN] nope", &[]));
        assert!(echoes_an_error(r#"{"tool": "agents__list", "arguments": {}}"#, &[]));
        assert!(echoes_an_error(
            "It says: BAD_REQUEST: no channel named `general-talk` here",
            &errors
        ));
        assert!(!echoes_an_error(
            "Your week: Monday talk A, Wednesday talk B, Friday release.",
            &errors
        ));
        assert!(!echoes_an_error("", &errors));
    }

    #[test]
    fn history_is_trimmed_in_big_steps_and_starts_at_a_user_message() {
        let msg = |i: usize| {
            if i.is_multiple_of(2) {
                ChatMessage::User { from: "op".into(), text: "u".repeat(100), at: None }
            } else {
                ChatMessage::Assistant { text: "a".repeat(100) }
            }
        };
        let mut s: Vec<ChatMessage> = (0..10).map(msg).collect();
        trim_history(&mut s, 2_000);
        assert_eq!(s.len(), 10, "under budget: untouched");
        s.extend((10..20).map(msg));
        trim_history(&mut s, 1_000);
        // 2 000 chars > 1 000: down to at most 500, starting at a user message.
        let total: usize = s.iter().map(crate::extensions::chars_of).sum();
        assert!(total <= 500, "{total}");
        assert!(matches!(s[0], ChatMessage::User { .. }));
        // The next turns add to the same prefix until the budget is passed again.
        let before = s.clone();
        s.push(msg(20));
        trim_history(&mut s, 1_000);
        assert_eq!(&s[..before.len()], &before[..]);
    }
}
