//! Sentence embeddings for the memory index (feature `vectors`): all-MiniLM-L6-v2 (a 6-layer BERT,
//! 384 dimensions) run in-process with `candle` on the CPU, from the files `scripts/setup` puts in
//! `$FLOCK_HOME/models/all-minilm-l6-v2/` (`model.safetensors`, `vocab.txt`, `config.json`). No
//! network at run time.
//!
//! The tokenizer is BERT's (lower-casing, accents kept, punctuation split, WordPiece with `##`
//! continuations) written out here from `vocab.txt`: it is short, and the `tokenizers` crate would
//! cost more to build than the model. Inputs are cut to [`MAX_TOKENS`]; the sentence vector is the
//! mean of the token vectors under the attention mask, L2-normalised (the model's pooling), so a
//! dot product is the cosine similarity.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};

/// Dimensions of a vector.
pub const DIM: usize = 384;
/// Tokens per input, `[CLS]` and `[SEP]` included (the model was tuned on up to 256).
pub const MAX_TOKENS: usize = 256;

/// Where `scripts/setup` puts the model: `$FLOCK_HOME/models/all-minilm-l6-v2`.
pub fn default_dir() -> Option<PathBuf> {
    let home = std::env::var_os("FLOCK_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".flock")))?;
    Some(home.join("models").join("all-minilm-l6-v2"))
}

/// [`default_dir`] if `scripts/setup` has put the model there.
pub fn installed_dir() -> Option<PathBuf> {
    default_dir().filter(|d| d.join("model.safetensors").exists())
}

type Result<T> = std::result::Result<T, String>;

fn err(what: &str) -> impl Fn(candle_core::Error) -> String + '_ {
    move |e| format!("embedding model: {what}: {e}")
}

/// The tokenizer: BERT's basic split, then WordPiece over `vocab.txt`.
#[derive(Debug)]
struct WordPiece {
    vocab: HashMap<String, u32>,
    unk: u32,
    cls: u32,
    sep: u32,
}

impl WordPiece {
    fn load(path: &Path) -> Result<WordPiece> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let vocab: HashMap<String, u32> =
            text.lines().enumerate().map(|(i, t)| (t.to_owned(), i as u32)).collect();
        let id =
            |t: &str| vocab.get(t).copied().ok_or_else(|| format!("{t} is not in the vocabulary"));
        Ok(WordPiece { unk: id("[UNK]")?, cls: id("[CLS]")?, sep: id("[SEP]")?, vocab })
    }

    /// `[CLS] … [SEP]`, at most [`MAX_TOKENS`] ids.
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![self.cls];
        'words: for word in basic_split(text) {
            if ids.len() >= MAX_TOKENS - 1 {
                break;
            }
            if word.chars().count() > 100 {
                ids.push(self.unk);
                continue;
            }
            let mut pieces = Vec::new();
            let mut start = 0;
            let chars: Vec<char> = word.chars().collect();
            while start < chars.len() {
                let mut end = chars.len();
                let mut found = None;
                while start < end {
                    let piece: String = chars[start..end].iter().collect();
                    let key = if start > 0 { format!("##{piece}") } else { piece };
                    if let Some(&id) = self.vocab.get(&key) {
                        found = Some(id);
                        break;
                    }
                    end -= 1;
                }
                match found {
                    Some(id) => pieces.push(id),
                    None => {
                        ids.push(self.unk);
                        continue 'words;
                    }
                }
                start = end;
            }
            ids.extend(pieces);
        }
        ids.truncate(MAX_TOKENS - 1);
        ids.push(self.sep);
        ids
    }
}

/// BERT's basic tokenizer (uncased): lower-case, control characters dropped, every punctuation
/// mark and CJK character its own token, split on whitespace.
fn basic_split(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if c == '\0' || c == '\u{fffd}' || (c.is_control() && !c.is_whitespace()) {
            continue;
        }
        if c.is_whitespace() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
        } else if c.is_ascii_punctuation() || is_cjk(c) || (!c.is_alphanumeric() && !c.is_ascii()) {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            words.push(c.to_lowercase().collect());
        } else {
            current.extend(c.to_lowercase());
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0xF900..=0xFAFF)
}

/// One encoder layer.
#[derive(Debug)]
struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

/// The model: embeddings, 6 layers, mean pooling.
pub struct Embedder {
    tokenizer: WordPiece,
    words: Embedding,
    positions: Embedding,
    types: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    device: Device,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Embedder(all-MiniLM-L6-v2)")
    }
}

const EPS: f64 = 1e-12;

impl Embedder {
    /// Loads the model from `dir` (see [`default_dir`]).
    pub fn load(dir: &Path) -> Result<Embedder> {
        let config: serde_json::Value = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| {
                format!("read {}: {e} (run scripts/setup)", dir.join("config.json").display())
            })
            .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("config.json: {e}")))?;
        let n = |k: &str| {
            config[k].as_u64().map(|v| v as usize).ok_or(format!("config.json has no {k}"))
        };
        let (hidden, layers, heads) =
            (n("hidden_size")?, n("num_hidden_layers")?, n("num_attention_heads")?);
        let (inter, vocab, max_pos, types) = (
            n("intermediate_size")?,
            n("vocab_size")?,
            n("max_position_embeddings")?,
            n("type_vocab_size")?,
        );
        if hidden != DIM {
            return Err(format!("config.json: hidden_size {hidden}, expected {DIM}"));
        }
        let weights = std::fs::read(dir.join("model.safetensors"))
            .map_err(|e| format!("read {}: {e}", dir.join("model.safetensors").display()))?;
        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(err("weights"))?;
        let vb = if vb.contains_tensor("embeddings.word_embeddings.weight") {
            vb
        } else {
            vb.pp("bert")
        };
        let e = vb.pp("embeddings");
        let ln = |vb: VarBuilder| candle_nn::layer_norm(hidden, EPS, vb);
        let words = candle_nn::embedding(vocab, hidden, e.pp("word_embeddings"))
            .map_err(err("embeddings"))?;
        let positions = candle_nn::embedding(max_pos, hidden, e.pp("position_embeddings"))
            .map_err(err("embeddings"))?;
        let type_emb = candle_nn::embedding(types, hidden, e.pp("token_type_embeddings"))
            .map_err(err("embeddings"))?;
        let norm = ln(e.pp("LayerNorm")).map_err(err("embeddings"))?;
        let layers = (0..layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layer.{i}"));
                let a = l.pp("attention");
                Ok(Layer {
                    query: candle_nn::linear(hidden, hidden, a.pp("self").pp("query"))?,
                    key: candle_nn::linear(hidden, hidden, a.pp("self").pp("key"))?,
                    value: candle_nn::linear(hidden, hidden, a.pp("self").pp("value"))?,
                    attn_out: candle_nn::linear(hidden, hidden, a.pp("output").pp("dense"))?,
                    attn_norm: ln(a.pp("output").pp("LayerNorm"))?,
                    up: candle_nn::linear(hidden, inter, l.pp("intermediate").pp("dense"))?,
                    down: candle_nn::linear(inter, hidden, l.pp("output").pp("dense"))?,
                    out_norm: ln(l.pp("output").pp("LayerNorm"))?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(err("layers"))?;
        Ok(Embedder {
            tokenizer: WordPiece::load(&dir.join("vocab.txt"))?,
            words,
            positions,
            types: type_emb,
            norm,
            layers,
            heads,
            device,
        })
    }

    /// The unit vector of each text.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encoded: Vec<Vec<u32>> = texts.iter().map(|t| self.tokenizer.encode(t)).collect();
        let len = encoded.iter().map(Vec::len).max().unwrap_or(2);
        let batch = encoded.len();
        let mut ids = Vec::with_capacity(batch * len);
        let mut mask = Vec::with_capacity(batch * len);
        for e in &encoded {
            ids.extend(e.iter().copied().chain(std::iter::repeat_n(0, len - e.len())));
            mask.extend(
                std::iter::repeat_n(1f32, e.len()).chain(std::iter::repeat_n(0f32, len - e.len())),
            );
        }
        self.forward(&ids, &mask, batch, len).map_err(err("forward"))
    }

    fn forward(
        &self,
        ids: &[u32],
        mask: &[f32],
        batch: usize,
        len: usize,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let d = &self.device;
        let ids = Tensor::from_slice(ids, (batch, len), d)?;
        let positions =
            Tensor::arange(0u32, len as u32, d)?.unsqueeze(0)?.broadcast_as((batch, len))?;
        let types = ids.zeros_like()?;
        let mut x = self
            .words
            .forward(&ids)?
            .add(&self.positions.forward(&positions)?)?
            .add(&self.types.forward(&types)?)?;
        x = self.norm.forward(&x)?;
        let mask = Tensor::from_slice(mask, (batch, len), d)?;
        // Padding gets -10 000 before the softmax: (batch, 1, 1, len).
        let bias = mask.affine(10_000.0, -10_000.0)?.reshape((batch, 1, 1, len))?;
        let head = DIM / self.heads;
        let scale = 1.0 / (head as f64).sqrt();
        let split = |t: Tensor| -> candle_core::Result<Tensor> {
            t.reshape((batch, len, self.heads, head))?.transpose(1, 2)?.contiguous()
        };
        for l in &self.layers {
            let q = split(l.query.forward(&x)?)?;
            let k = split(l.key.forward(&x)?)?;
            let v = split(l.value.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&bias)?;
            let weights = candle_nn::ops::softmax_last_dim(&scores)?;
            let context = weights.matmul(&v)?.transpose(1, 2)?.reshape((batch, len, DIM))?;
            x = l.attn_norm.forward(&l.attn_out.forward(&context)?.add(&x)?)?;
            let ff = l.down.forward(&l.up.forward(&x)?.gelu_erf()?)?;
            x = l.out_norm.forward(&ff.add(&x)?)?;
        }
        // Mean over the real tokens, then unit length.
        let m = mask.unsqueeze(2)?;
        let summed = x.broadcast_mul(&m)?.sum(1)?;
        let counts = m.sum(1)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?;
        mean.broadcast_div(&norm)?.to_vec2::<f32>()
    }
}

/// The dot product of two unit vectors: their cosine similarity (the index scans its int8
/// copies instead, `scan.rs`).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_basic_split_lowercases_and_splits_punctuation() {
        assert_eq!(
            basic_split("Hello, World! It's 5pm."),
            ["hello", ",", "world", "!", "it", "'", "s", "5pm", "."]
        );
    }

    /// Runs only where `scripts/setup` fetched the model.
    #[test]
    fn similar_sentences_are_closer_than_unrelated_ones() {
        let Some(dir) = installed_dir() else {
            eprintln!("skipped: no embedding model (scripts/setup fetches it)");
            return;
        };
        let e = Embedder::load(&dir).unwrap();
        let v = e
            .embed(&[
                "When is my dental check-up?",
                "The dentist moved my appointment to Thursday.",
                "The printer on the second floor jams again.",
            ])
            .unwrap();
        assert_eq!(v[0].len(), DIM);
        let norm: f32 = v[0].iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        let (near, far) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
        assert!(near > far + 0.2, "dentist {near} vs printer {far}");
        // Batched and single give the same vector (padding is masked out).
        let single = e.embed(&["When is my dental check-up?"]).unwrap();
        assert!(cosine(&single[0], &v[0]) > 0.9999);
    }
}
