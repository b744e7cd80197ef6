//! The LLM gateway actor: the only place API keys live. Agents send `LlmCall` frames; the router
//! hands them here with the caller's identity and model; each call runs in its own task (the
//! actor never waits on a provider), answers the agent's outbox with `LlmResult`, and counts
//! tokens per agent. A key never appears in a frame, a log line or an error message.

use std::collections::HashMap;
use std::time::Duration;

use flock_config::{LocalModel, ModelSpec, RemoteModel};
use flock_ipc::llm::ChatRequest;
use flock_ipc::{Body, Frame, MsgId, Outbox, ROUTER};
use flock_llm::{Endpoint, LlmClient, ProviderKind, RetryPolicy, Secret};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::messages::{GatewayMsg, RouterMsg, StoreMsg};
use crate::store::WriteOp;

pub struct GatewayArgs {
    /// API keys by the name of the environment variable they were read from.
    pub keys: HashMap<String, Secret>,
    /// Token totals persisted before this run.
    pub usage: HashMap<String, (u64, u64)>,
    pub store: ActorRef<StoreMsg>,
    /// The embedded model's process, if the swarm runs one.
    pub local: Option<LocalLink>,
}

/// How the gateway reaches the embedded model (`flock-model`, run by the supervisor): its base
/// URL while it is up (`None` while it starts or restarts), the token it was started with, and
/// the client that reaches it (over its Unix socket).
#[derive(Clone)]
pub struct LocalLink {
    pub base_url: watch::Receiver<Option<String>>,
    pub token: Secret,
    pub client: LlmClient,
}

impl LocalLink {
    /// The endpoint of the embedded model, waiting (up to the call's timeout) while it is
    /// starting or restarting after a crash.
    async fn endpoint(mut self, model: &LocalModel) -> Result<Endpoint, String> {
        let timeout = Duration::from_secs(model.timeout_secs);
        let url = tokio::time::timeout(timeout, self.base_url.wait_for(Option::is_some))
            .await
            .map_err(|_| {
                format!(
                    "the embedded model (flock-model) has not been up for {} s; see `flockctl logs flock-model`",
                    model.timeout_secs
                )
            })?
            .map_err(|_| "the embedded model (flock-model) is not running".to_owned())?
            .clone()
            .unwrap_or_default();
        Ok(Endpoint {
            kind: ProviderKind::OpenAi,
            base_url: url,
            model: "local".into(),
            api_key: Some(self.token),
            timeout,
            max_tokens: model.max_tokens,
            retry: RetryPolicy::default(),
            // Its grammar already holds every call to the tool's schema.
            strict_tools: false,
        })
    }
}

pub struct Gateway;

pub struct GatewayState {
    client: LlmClient,
    keys: HashMap<String, Secret>,
    usage: HashMap<String, (u64, u64)>,
    in_flight: HashMap<String, (u64, AbortHandle)>,
    next_call: u64,
    store: ActorRef<StoreMsg>,
    local: Option<LocalLink>,
}

/// Where a call goes.
enum Target {
    Ready(Endpoint),
    Local(LocalLink, LocalModel),
}

/// The endpoint of a remote model, with its key looked up by variable name.
fn endpoint(
    model: &RemoteModel,
    kind: ProviderKind,
    keys: &HashMap<String, Secret>,
) -> Result<Target, String> {
    let api_key = match &model.api_key_env {
        Some(var) => Some(keys.get(var).cloned().ok_or_else(|| {
            format!("the API key variable {var} is not set in flock-supervisor's environment")
        })?),
        None => None,
    };
    Ok(Target::Ready(Endpoint {
        kind,
        base_url: model.base_url.clone(),
        model: model.model.clone(),
        api_key,
        timeout: Duration::from_secs(model.timeout_secs),
        max_tokens: model.max_tokens,
        retry: RetryPolicy {
            base: Duration::from_millis(model.retry_base_ms),
            ..RetryPolicy::default()
        },
        strict_tools: model.strict_tools,
    }))
}

fn answer(outbox: &Outbox, frame_id: MsgId, agent: &str, ok: bool, response: String) {
    let frame = Frame {
        correlation_id: Some(frame_id),
        ..Frame::new(ROUTER, agent, Body::LlmResult { ok, response })
    };
    let _ = outbox.try_send(frame);
}

impl Actor for Gateway {
    type Msg = GatewayMsg;
    type State = GatewayState;
    type Arguments = GatewayArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<GatewayMsg>,
        args: GatewayArgs,
    ) -> Result<GatewayState, ActorProcessingErr> {
        let client = LlmClient::new().map_err(|e| format!("start the HTTP client: {e}"))?;
        Ok(GatewayState {
            client,
            keys: args.keys,
            usage: args.usage,
            in_flight: HashMap::new(),
            next_call: 0,
            store: args.store,
            local: args.local,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<GatewayMsg>,
        msg: GatewayMsg,
        st: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            GatewayMsg::Call { agent, model, request, frame_id, outbox, chain, background } => {
                let target = match &model {
                    ModelSpec::OpenAi(m) => endpoint(m, ProviderKind::OpenAi, &st.keys),
                    ModelSpec::Anthropic(m) => endpoint(m, ProviderKind::Anthropic, &st.keys),
                    ModelSpec::Local(m) => match &st.local {
                        Some(link) => Ok(Target::Local(link.clone(), m.clone())),
                        None => Err("this swarm runs no embedded model (flock-model)".into()),
                    },
                    ModelSpec::Scripted(_) => {
                        Err("this agent's model is scripted; it runs inside the agent".into())
                    }
                };
                let target = match target {
                    Ok(t) => t,
                    Err(e) => {
                        answer(&outbox, frame_id, &agent, false, e);
                        return Ok(());
                    }
                };
                let mut req: ChatRequest = match serde_json::from_str(&request) {
                    Ok(r) => r,
                    Err(e) => {
                        answer(&outbox, frame_id, &agent, false, format!("malformed LlmCall: {e}"));
                        return Ok(());
                    }
                };
                // Secrets never reach a model, whatever carried them in (a tool result, a file,
                // a person's message).
                mask_request(&mut req);
                // The embedded model keeps one KV-cache slot per agent, keyed by this name.
                // and serves background work after the turns people wait for.
                if matches!(target, Target::Local(..)) {
                    req.user = Some(agent.clone());
                    req.service_tier = background.then(|| "flex".to_owned());
                }
                st.next_call += 1;
                let call = st.next_call;
                let model_label = model_label(&model);
                let t0 = std::time::Instant::now();
                let client = match &target {
                    Target::Local(link, _) => link.client.clone(),
                    Target::Ready(_) => st.client.clone(),
                };
                let me = myself.clone();
                let who = agent.clone();
                let task = tokio::spawn(async move {
                    let ep = match target {
                        Target::Ready(ep) => Ok(ep),
                        // Resolved here, not in the actor: the model may be (re)starting.
                        Target::Local(link, m) => link.endpoint(&m).await,
                    };
                    let result = match ep {
                        Ok(ep) => client.complete(&ep, &req).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e),
                    };
                    let (ok, response, tin, tout) = match result {
                        Ok(r) => {
                            let (tin, tout) = (r.tokens_in, r.tokens_out);
                            (true, serde_json::to_string(&r).unwrap_or_default(), tin, tout)
                        }
                        Err(e) => (false, e, 0, 0),
                    };
                    let outcome = if ok { "ok" } else { "error" };
                    crate::metrics::get().llm_call(
                        &model_label,
                        outcome,
                        t0.elapsed(),
                        (tin, tout),
                    );
                    answer(&outbox, frame_id, &who, ok, response);
                    if let Some((chain, router)) = chain
                        && tin + tout > 0
                    {
                        let _ = router.cast(RouterMsg::Tokens { chain, tokens: tin + tout });
                    }
                    let _ = me.cast(GatewayMsg::Done {
                        agent: who,
                        call,
                        tokens_in: tin,
                        tokens_out: tout,
                    });
                });
                // One turn at a time per agent: a new call supersedes a forgotten one.
                if let Some((_, old)) = st.in_flight.insert(agent, (call, task.abort_handle())) {
                    old.abort();
                }
            }
            GatewayMsg::Cancel { agent } => {
                if let Some((_, task)) = st.in_flight.remove(&agent) {
                    task.abort();
                }
            }
            GatewayMsg::Done { agent, call, tokens_in, tokens_out } => {
                if st.in_flight.get(&agent).is_some_and(|(c, _)| *c == call) {
                    st.in_flight.remove(&agent);
                }
                if tokens_in + tokens_out > 0 {
                    let u = st.usage.entry(agent.clone()).or_default();
                    u.0 += tokens_in;
                    u.1 += tokens_out;
                    let op = WriteOp::AddTokens { agent, tokens_in, tokens_out };
                    let _ = st.store.cast(StoreMsg::Write { op, origin: None, notify: None });
                }
            }
            GatewayMsg::Usage(reply) => {
                let _ = reply.send(st.usage.clone());
            }
        }
        Ok(())
    }
}

/// The `model` label of a call's metrics: `openai/gpt-4o`, `anthropic/…`, `local/qwen2.5-…`.
fn model_label(model: &ModelSpec) -> String {
    match model {
        ModelSpec::OpenAi(m) => format!("openai/{}", m.model),
        ModelSpec::Anthropic(m) => format!("anthropic/{}", m.model),
        ModelSpec::Local(m) => match &m.path {
            Some(p) => format!("local/{}", p.file_name().unwrap_or_default().to_string_lossy()),
            None => format!("local/{}", m.model),
        },
        ModelSpec::Scripted(_) => "scripted".into(),
    }
}

/// Masks every text of a model request (`flock_memory::mask`): messages, tool results and the
/// arguments of earlier tool calls.
pub fn mask_request(req: &mut ChatRequest) {
    use flock_ipc::llm::ChatMsg;
    use flock_memory::mask::mask_in_place;
    for m in &mut req.messages {
        match m {
            ChatMsg::System { text } | ChatMsg::User { text } => {
                mask_in_place(text);
            }
            ChatMsg::Assistant { text, tool_calls } => {
                if let Some(t) = text {
                    mask_in_place(t);
                }
                for c in tool_calls {
                    mask_in_place(&mut c.arguments);
                }
            }
            ChatMsg::Tool { content, .. } => {
                mask_in_place(content);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_ipc::llm::{ChatMsg, ToolCall};

    #[test]
    fn no_text_of_a_model_request_keeps_a_secret() {
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz012345";
        let mut req = ChatRequest {
            messages: vec![
                ChatMsg::System { text: format!("deploy with {key}") },
                ChatMsg::User { text: "password: hunter2hunter".into() },
                ChatMsg::Assistant {
                    text: Some(format!("using {key}")),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "fs_read".into(),
                        arguments: format!("{{\"path\":\"{key}\"}}"),
                    }],
                },
                ChatMsg::Tool {
                    call_id: "c1".into(),
                    name: "fs_read".into(),
                    content: format!("OPENAI_API_KEY={key}\nmail ana@example.com"),
                },
            ],
            tools: Vec::new(),
            ..Default::default()
        };
        mask_request(&mut req);
        let text = serde_json::to_string(&req).unwrap();
        assert!(!text.contains(key) && !text.contains("hunter2"), "{text}");
        assert!(!text.contains("ana@example.com"), "{text}");
        assert_eq!(text.matches("[masked:").count(), 6, "{text}");
    }
}
