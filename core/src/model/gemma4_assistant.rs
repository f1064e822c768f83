//! Gemma 4's multi-token-prediction assistant (`gemma4_assistant`): a small Gemma 4 whose
//! layers compute no K/V of their own; every sliding layer attends to the K/V of the
//! target's last sliding layer and every full layer to the target's last full layer, over
//! what the target has computed. A drafting step's input is the target's (scaled) embedding
//! of the last token beside a hidden state of the target's width: the target's final-normed
//! hidden state for the first draft, then the assistant's own output projected back to that
//! width. Its position stays that of the pending token for the whole round.
//!
//! The head is the tied embedding table; with ordered embeddings, the vocabulary is split in
//! clusters (`token_ordering` lists each cluster's tokens in turn), a centroid projection
//! picks the `top_k` likeliest clusters, and every token outside them gets the smallest
//! kept logit minus one.

use super::gemma4::{Gemma4, Pass};
use super::{DraftSource, ForwardBatch, KvCaches, ModelInfo};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
use crate::load::hf::config::{Config, Meta};
use crate::load::hf::family::HfFamily;
use crate::tensor::Tensor;

struct Centroids {
    weight: Tensor,
    /// Cluster `c`'s tokens: `ordering[c * per .. (c + 1) * per]`.
    ordering: Vec<u32>,
    per: usize,
    top_k: usize,
}

pub struct Gemma4Assistant {
    body: Gemma4,
    /// The input projection's halves: on the token embedding and on the hidden state.
    pre_tok: Tensor,
    pre_hid: Tensor,
    /// Back to the target's width: the next step's hidden state.
    post: Tensor,
    centroids: Option<Centroids>,
    backbone: usize,
    source: Option<DraftSource>,
}

/// One drafting step's outputs.
pub struct AssistantStep {
    /// `[rows, vocab]`, masked to the chosen clusters with ordered embeddings.
    pub logits: Vec<Vec<f32>>,
    /// The next step's hidden state `[rows, backbone]`.
    pub hidden: Tensor,
}

impl Gemma4Assistant {
    pub fn load(f: &GgufFile, ex: &Executor) -> Result<Gemma4Assistant> {
        let arch = f.architecture()?;
        if arch != "gemma4-assistant" {
            return Err(Error::load(
                f.path(),
                format!("a Gemma 4 MTP assistant (gemma4_assistant) was expected, not {arch}"),
            ));
        }
        let body = Gemma4::load(f, ex, true)?;
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&f.arch_key(k))? as usize) };
        let b = u("assistant.backbone_length")?;
        let h = body.info.n_embd;
        let mut w = super::weights::Weights::new(f, ex);
        let pre_tok = w.get_cols("mtp.pre_proj.weight", &[h, 2 * b], 0..b)?;
        let pre_hid = w.get_cols("mtp.pre_proj.weight", &[h, 2 * b], b..2 * b)?;
        let post = w.get("mtp.post_proj.weight", &[b, h])?;
        let ordered = matches!(
            f.get(&f.arch_key("assistant.ordered_embeddings")),
            Some(Value::Bool(true))
        );
        let centroids = if ordered {
            let (c, k) = (
                u("assistant.centroid_count")?,
                u("assistant.centroid_top_k")?,
            );
            let v = body.info.vocab;
            if c == 0 || k == 0 || k > c || v % c != 0 {
                return Err(Error::load(
                    f.path(),
                    format!("{c} centroids (top {k}) do not split a vocabulary of {v}"),
                ));
            }
            let (info, bytes) = f.data("mtp.token_ordering")?;
            if info.n_elements() != v || info.dtype != crate::DType::I32 {
                return Err(Error::load(
                    f.path(),
                    format!("mtp.token_ordering must hold {v} i32 token ids"),
                ));
            }
            let ordering: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .map(|t| u32::try_from(t).ok().filter(|&t| (t as usize) < v))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    Error::load(f.path(), "mtp.token_ordering: a token id is out of range")
                })?;
            Some(Centroids {
                weight: w.get("mtp.centroids.weight", &[c, h])?,
                ordering,
                per: v / c,
                top_k: k,
            })
        } else {
            None
        };
        Ok(Gemma4Assistant {
            body,
            pre_tok,
            pre_hid,
            post,
            centroids,
            backbone: b,
            source: None,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.body.info
    }

    /// The width of the target's hidden state it is fed.
    pub fn backbone(&self) -> usize {
        self.backbone
    }

    /// Reads `src`'s caches from now on: widths and head shapes must match the target's.
    pub fn bind(&mut self, src: &DraftSource, target_vocab: usize) -> Result<()> {
        if src.hidden != self.backbone {
            return Err(Error::Model(format!(
                "the assistant was trained beside a model of width {}, the target's is {}",
                self.backbone, src.hidden
            )));
        }
        if target_vocab != self.body.info.vocab {
            return Err(Error::Model(format!(
                "the assistant's vocabulary has {} tokens, the target's {target_vocab}",
                self.body.info.vocab
            )));
        }
        self.body.bind_shared(&src.groups, src.sliding, src.full)?;
        self.source = Some(src.clone());
        Ok(())
    }

    /// One drafting step over `b` (one row per sequence: the last token, at the pending
    /// token's position; block tables and lengths of the target's cache, no slots) with the
    /// hidden states `hidden` `[rows, backbone]`, reading the target's caches `kv`.
    pub fn step(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        hidden: &Tensor,
    ) -> Result<AssistantStep> {
        let src = self
            .source
            .as_ref()
            .ok_or_else(|| Error::Model("the assistant is not bound to a target".into()))?;
        let rows = b.tokens.len();
        if b.logits_rows.len() != rows || b.seqs.iter().any(|s| s.q_len != 1) {
            return Err(Error::Model(
                "an assistant step takes one row per sequence, every row wanting logits".into(),
            ));
        }
        let ids: Vec<i32> = b.tokens.iter().map(|&t| t as i32).collect();
        let ids = ex.upload_i32(&[rows], &ids)?;
        let e = ex.scale(&ex.get_rows(&src.tok_embd, &ids)?, src.embed_scale)?;
        let x = ex.add(
            &ex.matmul(&e, &self.pre_tok)?,
            &ex.matmul(hidden, &self.pre_hid)?,
        )?;
        let x = self.body.layers_pass(ex, b, kv, x, &[], Pass::Lookahead)?;
        let n = self.body.norm_spec();
        let x = ex.rms_norm(&x, &self.body.head.out_norm, n.eps, n.one_plus)?;
        let hidden = ex.matmul(&x, &self.post)?;
        let v = self.body.info.vocab;
        let flat = ex.download_f32(&ex.matmul(&x, &self.body.head.output)?)?;
        let mut logits: Vec<Vec<f32>> = flat.chunks_exact(v).map(<[f32]>::to_vec).collect();
        if let Some(c) = &self.centroids {
            let cl = ex.download_f32(&ex.matmul(&x, &c.weight)?)?;
            let nc = c.ordering.len() / c.per;
            for (row, scores) in logits.iter_mut().zip(cl.chunks_exact(nc)) {
                mask_to_clusters(row, scores, c);
            }
        }
        Ok(AssistantStep { logits, hidden })
    }
}

/// Keeps the logits of the `top_k` best-scoring clusters' tokens; every other token gets
/// the smallest kept logit minus one.
fn mask_to_clusters(row: &mut [f32], scores: &[f32], c: &Centroids) {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut keep = vec![false; row.len()];
    let mut low = f32::INFINITY;
    for &cl in &order[..c.top_k.min(order.len())] {
        for &t in &c.ordering[cl * c.per..(cl + 1) * c.per] {
            keep[t as usize] = true;
            low = low.min(row[t as usize]);
        }
    }
    for (x, k) in row.iter_mut().zip(keep) {
        if !k {
            *x = low - 1.0;
        }
    }
}

// ---- Hugging Face checkpoints ----

/// Gemma 4 MTP assistant checkpoints: Gemma 4's metadata and layer names (its head not
/// soft-capped), the backbone width, the ordered-embedding head.
pub const HF: HfFamily = HfFamily {
    // An assistant whose text config names no type of its own is a Gemma 4 text model.
    defaults: &[("gemma4_assistant", super::gemma4::GEMMA4)],
    wraps_text: true,
    ..HfFamily::new(
        &[("gemma4_assistant", "gemma4-assistant")],
        hf_meta,
        hf_names,
    )
};

/// No GGUF architecture of its own here (speculative decoding's setup builds it).
pub const FAMILY: super::Family = super::Family {
    archs: &[],
    hf: &[&HF],
};

fn hf_meta(c: &Config, m: &mut Meta) -> Result<()> {
    use serde_json::Value as Json;
    super::gemma4::hf_meta(c, m)?;
    // The assistant's head is not soft-capped.
    m.kv.retain(|(k, _)| !k.ends_with(".final_logit_softcapping"));
    let root = |k: &str| c.root.get(k);
    let backbone = root("backbone_hidden_size")
        .and_then(Json::as_u64)
        .ok_or_else(|| c.err("config.json: no backbone_hidden_size"))?;
    m.u("assistant.backbone_length", backbone as usize);
    let ordered = root("use_ordered_embeddings")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    m.set("assistant.ordered_embeddings", Value::Bool(ordered));
    if ordered {
        let n = |k: &str, d: u64| root(k).and_then(Json::as_u64).unwrap_or(d) as usize;
        m.u("assistant.centroid_count", n("num_centroids", 2048));
        m.u(
            "assistant.centroid_top_k",
            n("centroid_intermediate_top_k", 32),
        );
    }
    Ok(())
}

fn hf_names(hf: &str) -> Option<String> {
    let own = match hf {
        "pre_projection.weight" => Some("mtp.pre_proj.weight"),
        "post_projection.weight" => Some("mtp.post_proj.weight"),
        "masked_embedding.centroids.weight" => Some("mtp.centroids.weight"),
        "masked_embedding.token_ordering" => Some("mtp.token_ordering"),
        _ => None,
    };
    match own {
        Some(n) => Some(n.into()),
        None => super::gemma4::hf_names(hf),
    }
}
