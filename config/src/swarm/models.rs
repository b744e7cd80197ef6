//! `models:`: scripted transcripts, remote providers (OpenAI-compatible, Anthropic) and the
//! embedded local model, each by name, and the references agents make to them.

use super::*;

impl Loader<'_> {
    pub(super) fn models(&mut self, node: &Node) {
        if node.is_null() {
            return;
        }
        let Some(entries) = self.report.mapping(node, "models") else {
            return;
        };
        for (key, def) in entries {
            let Some(name) = key.text() else {
                self.report.error(
                    key.pos,
                    format!("model names must be plain names, found {}", key.describe()),
                );
                continue;
            };
            let model = match self.model(name, def) {
                Some(spec) => Model::Ready(spec),
                None => Model::Broken,
            };
            // Duplicate names were reported by the YAML reader; the first one wins.
            self.models.entry(name.to_owned()).or_insert(model);
        }
    }

    /// One model definition; `None` if it has a problem (reported).
    pub(super) fn model(&mut self, name: &str, node: &Node) -> Option<ModelSpec> {
        let what = format!("models.{name}");
        if node.is_null() {
            self.report.error(
                node.pos,
                format!("model `{name}` is empty; add `provider: scripted` and a `transcript:`"),
            );
            return None;
        }
        let entries = self.report.mapping(node, &what)?;
        let before = self.report.count();
        let keys = [MODEL_KEYS, REMOTE_KEYS, LOCAL_KEYS].concat();
        self.report.unknown_keys(entries, &keys, &format!("`{what}`"));
        let provider = match lookup(entries, "provider") {
            Some((_, v)) => match v.text().and_then(openai_compatible) {
                Some((server, base_url)) => {
                    self.report.error(
                        v.pos,
                        format!(
                            "`{what}.provider: {}`: {server} serves the OpenAI chat API; write \
                             `provider: openai` and `base_url: {base_url}` (and `model:` its model name)",
                            v.text().unwrap_or_default()
                        ),
                    );
                    None
                }
                None => {
                    self.report.choice(v, &format!("{what}.provider"), "model provider", PROVIDERS)
                }
            },
            None => {
                self.report.error(
                    node.pos,
                    format!(
                        "model `{name}` has no `provider`; add `provider: local`, `scripted`, `openai` or `anthropic`"
                    ),
                );
                None
            }
        };
        match provider {
            Some(Provider::OpenAi) => return self.remote(name, node, entries, before, false),
            Some(Provider::Anthropic) => return self.remote(name, node, entries, before, true),
            Some(Provider::Local) => return self.local(name, entries, before),
            // Reported above; its other keys are not held against a provider nobody named.
            None => return None,
            Some(Provider::Scripted) => {
                for (k, _) in entries {
                    let Some(key) = k.text() else { continue };
                    let owner = if REMOTE_KEYS.contains(&key) {
                        "`provider: openai` or `anthropic` models"
                    } else if LOCAL_KEYS.contains(&key) {
                        "`provider: local` models"
                    } else {
                        continue;
                    };
                    self.report
                        .error(k.pos, format!("`{key}` is for {owner}, not `scripted`; remove it"));
                }
            }
        }
        let transcript = match (lookup(entries, "transcript"), lookup(entries, "rules")) {
            (Some(_), Some((rules_key, _))) => {
                self.report.error(
                    rules_key.pos,
                    format!(
                        "model `{name}` has both `transcript` and `rules`; keep exactly one \
                         (a transcript file, or inline rules)"
                    ),
                );
                None
            }
            (None, None) => {
                self.report.error(
                    node.pos,
                    format!(
                        "model `{name}` has no rules; add `transcript: path/to/file.yaml` or an \
                         inline `rules:` list"
                    ),
                );
                None
            }
            (Some((_, path)), None) => self.transcript_file(path, &what),
            (None, Some((_, rules))) => Some(transcript::rules(
                rules,
                &format!("{what}.rules"),
                &mut self.report,
                &mut self.targets,
            )),
        };
        // Only a model without any problem is usable; a broken one stays out of the spec.
        (self.report.count() == before).then_some(transcript).flatten().map(ModelSpec::Scripted)
    }

    /// The embedded model (`provider: local`): every key is optional.
    pub(super) fn local(
        &mut self,
        name: &str,
        entries: &[(Node, Node)],
        before: usize,
    ) -> Option<ModelSpec> {
        let what = format!("models.{name}");
        for (k, _) in entries {
            let Some(key) = k.text() else { continue };
            if ["transcript", "rules", "base_url", "api_key_env", "retry_base_ms", "strict_tools"]
                .contains(&key)
            {
                self.report.error(
                    k.pos,
                    format!(
                        "`{key}` is not for `provider: local` models (the embedded model takes \
                         `model`, `path`, `threads`, `ctx`, `slots`, `timeout_secs`, `max_tokens`); \
                         remove it from `{what}`"
                    ),
                );
            }
        }
        let field = |key: &str| lookup(entries, key).map(|(_, v)| v);
        let defaults = crate::spec::LocalModel::default();
        let r = &mut self.report;
        let path = field("path").and_then(|v| r.string(v, &format!("{what}.path"))).map(|p| {
            let p = PathBuf::from(p);
            // Relative to the swarm file, like transcripts.
            if p.is_absolute() { p } else { std::path::absolute(self.dir.join(&p)).unwrap_or(p) }
        });
        let r = &mut self.report;
        let model = match field("model") {
            Some(v) => match r.string(v, &format!("{what}.model")) {
                Some(m) if crate::spec::KnownModel::find(&m).is_some() => m,
                Some(m) => {
                    r.error(
                        v.pos,
                        format!(
                            "`{what}.model`: no local model named `{m}`; known: {} (fetch one with \
                             `scripts/setup --model NAME`), or give `path:` to another GGUF file",
                            crate::spec::KnownModel::names().join(", ")
                        ),
                    );
                    defaults.model.clone()
                }
                None => defaults.model.clone(),
            },
            None => defaults.model.clone(),
        };
        if let (Some(v), Some(_)) = (field("model"), field("path")) {
            r.error(v.pos, format!("`{what}` has both `model` and `path`; keep one"));
        }
        let threads =
            field("threads").and_then(|v| r.uint::<u32>(v, &format!("{what}.threads"), 1, 256));
        let slots = field("slots")
            .and_then(|v| r.uint::<u32>(v, &format!("{what}.slots"), 1, 64))
            .unwrap_or(defaults.slots);
        let ctx = field("ctx")
            .and_then(|v| r.uint::<u32>(v, &format!("{what}.ctx"), 256, 131_072))
            .unwrap_or(defaults.ctx);
        let timeout_secs = field("timeout_secs")
            .and_then(|v| r.uint(v, &format!("{what}.timeout_secs"), 1, 3600))
            .unwrap_or(defaults.timeout_secs);
        let max_tokens = field("max_tokens")
            .and_then(|v| r.uint::<u32>(v, &format!("{what}.max_tokens"), 1, 32_768))
            .unwrap_or(defaults.max_tokens);
        (self.report.count() == before).then_some(ModelSpec::Local(crate::spec::LocalModel {
            model,
            path,
            threads,
            ctx,
            slots,
            timeout_secs,
            max_tokens,
        }))
    }

    /// An HTTP model: OpenAI-compatible chat completions or Anthropic Messages. The key is named,
    /// never written: `api_key_env` says which environment variable of the supervisor holds it.
    pub(super) fn remote(
        &mut self,
        name: &str,
        node: &Node,
        entries: &[(Node, Node)],
        before: usize,
        anthropic: bool,
    ) -> Option<ModelSpec> {
        let what = format!("models.{name}");
        for key in ["transcript", "rules"] {
            if let Some((k, _)) = lookup(entries, key) {
                self.report.error(
                    k.pos,
                    format!("`{key}` is for `provider: scripted` models; remove it from `{what}`"),
                );
            }
        }
        let field = |key: &str| lookup(entries, key).map(|(_, v)| v);
        let model = match field("model") {
            Some(v) => self.report.string(v, &format!("{what}.model")),
            None => {
                self.report.error(
                    node.pos,
                    format!("model `{name}` has no `model:`; name the provider's model, e.g. `model: gpt-4o-mini`"),
                );
                None
            }
        };
        let base_url = match field("base_url") {
            Some(v) => self.report.string(v, &format!("{what}.base_url")),
            None => Some(
                if anthropic { "https://api.anthropic.com" } else { "https://api.openai.com/v1" }
                    .to_owned(),
            ),
        };
        if let (Some(url), Some(v)) = (&base_url, field("base_url"))
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            self.report.error(
                v.pos,
                format!("`{what}.base_url` must start with http:// or https://, got `{url}`"),
            );
        }
        let api_key_env = match field("api_key_env") {
            Some(v) => {
                let env = self.report.string(v, &format!("{what}.api_key_env"));
                if let Some(e) = &env
                    && !valid_env_name(e)
                {
                    self.report.error(
                        v.pos,
                        format!("`{what}.api_key_env` must name an environment variable like `OPENAI_API_KEY`, got `{e}`"),
                    );
                }
                env
            }
            None if anthropic => {
                self.report.error(
                    node.pos,
                    format!("model `{name}` needs `api_key_env: ANTHROPIC_API_KEY` (the variable that holds the key)"),
                );
                None
            }
            None => None,
        };
        let r = &mut self.report;
        let timeout_secs = field("timeout_secs")
            .and_then(|v| r.uint(v, &format!("{what}.timeout_secs"), 1, 3600))
            .unwrap_or(60);
        let max_tokens = field("max_tokens")
            .and_then(|v| r.uint(v, &format!("{what}.max_tokens"), 1, 1_000_000))
            .unwrap_or(1024);
        let retry_base_ms = field("retry_base_ms")
            .and_then(|v| r.uint(v, &format!("{what}.retry_base_ms"), 1, 600_000))
            .unwrap_or(2000);
        let strict_tools = field("strict_tools")
            .and_then(|v| r.boolean(v, &format!("{what}.strict_tools")))
            .unwrap_or(true);
        if self.report.count() != before {
            return None;
        }
        let remote = crate::spec::RemoteModel {
            base_url: base_url?,
            model: model?,
            api_key_env,
            timeout_secs,
            max_tokens,
            retry_base_ms,
            strict_tools,
        };
        Some(if anthropic { ModelSpec::Anthropic(remote) } else { ModelSpec::OpenAi(remote) })
    }

    /// Reads and validates a transcript file named by `models.x.transcript` (`node`).
    pub(super) fn transcript_file(
        &mut self,
        node: &Node,
        what: &str,
    ) -> Option<crate::spec::Transcript> {
        let written = self.report.string(node, &format!("{what}.transcript"))?;
        let path = self.dir.join(&written);
        if let Some(cached) = self.transcripts.get(&path) {
            return cached.clone();
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) => {
                self.report.error(
                    node.pos,
                    format!(
                        "cannot read transcript `{}`: {error}; paths are relative to the swarm \
                         file's folder",
                        path.display()
                    ),
                );
                self.transcripts.insert(path, None);
                return None;
            }
        };
        let file = path.display().to_string();
        let mut report = self.report.for_file(&file);
        let before = report.count();
        let transcript = yaml::parse(&text, &mut report)
            .map(|root| transcript::file(&root, &mut report, &mut self.targets));
        let transcript = transcript.filter(|_| report.count() == before);
        self.transcripts.insert(path, transcript.clone());
        transcript
    }

    /// Resolves a model name used at `node`; reports it if it is not defined.
    pub(super) fn model_ref(&mut self, name: &str, node: &Node, what: &str) -> Option<ModelSpec> {
        match self.models.get(name) {
            Some(Model::Ready(spec)) => Some(spec.clone()),
            Some(Model::Broken) => None,
            None => {
                let hint = match closest(name, self.models.keys().map(String::as_str)) {
                    Some(best) => format!("did you mean `{best}`? "),
                    None => String::new(),
                };
                let mut defined: Vec<&str> = self.models.keys().map(String::as_str).collect();
                defined.sort_unstable();
                let fix = if defined.is_empty() {
                    "define it under `models:`".to_owned()
                } else {
                    format!("{hint}define it under `models:` or use one of {}", list(defined))
                };
                self.report
                    .error(node.pos, format!("`{what}`: model `{name}` is not defined; {fix}"));
                None
            }
        }
    }
}

/// Servers people run that speak the OpenAI chat API under a name of their own: the name as
/// written in `provider:`, what it is called, and its usual local base URL.
fn openai_compatible(provider: &str) -> Option<(&'static str, &'static str)> {
    Some(match provider.to_ascii_lowercase().as_str() {
        "ollama" => ("Ollama", "http://localhost:11434/v1"),
        "vllm" => ("vLLM", "http://localhost:8000/v1"),
        "llama.cpp" | "llamacpp" | "llama-cpp" | "llama-server" | "llama_cpp" => {
            ("llama.cpp's llama-server", "http://localhost:8080/v1")
        }
        "lmstudio" | "lm-studio" | "lm_studio" => ("LM Studio", "http://localhost:1234/v1"),
        "openrouter" => ("OpenRouter", "https://openrouter.ai/api/v1"),
        "groq" => ("Groq", "https://api.groq.com/openai/v1"),
        _ => return None,
    })
}
