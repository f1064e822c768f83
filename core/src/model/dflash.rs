//! A DFlash block-diffusion drafter (z-lab/dflash, arXiv 2602.06036): a few Qwen3-style
//! layers with no embeddings or head of their own. The target's hidden states after the
//! layers the drafter names, side by side, are its context: projected (`fc`, then
//! `hidden_norm`) to the drafter's width, they give every layer's K/V at those tokens'
//! positions (the same projected rows for every layer, so the context is written once per
//! token and kept in the drafter's own paged cache). A block of `block` tokens — the pending
//! token, then mask tokens — is embedded with the target's table and run through the layers,
//! every block query attending to the whole context and the whole block (no causal mask);
//! the target's output matrix turns the final-normed rows after the first into the drafts.
//! The block's own K/V go to the slots after the context as scratch, overwritten by the next
//! round's context.

use super::blocks::{attention, upload_batch, GatedFfn, Head, NormSpec};
use super::weights::Weights;
use super::{DraftSource, ForwardBatch, KvCaches, KvGroup};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
use crate::load::hf::config::{Config, Meta};
use crate::load::hf::family::HfFamily;
use crate::op::{AttnParams, GluOp, Mask, RopeMode, RopeParams};
use crate::tensor::Tensor;
use serde_json::Value as Json;

struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    ffn_norm: Tensor,
    ffn: GatedFfn,
}

pub struct DFlash {
    layers: Vec<Layer>,
    fc: Tensor,
    hidden_norm: Tensor,
    norm: Tensor,
    e: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
    eps: f32,
    rope: RopeParams,
    block: usize,
    mask_token: u32,
    target_layers: Vec<usize>,
    groups: Vec<KvGroup>,
    /// The target's embeddings and output matrix, once bound.
    head: Option<(Head, f32)>,
}

impl DFlash {
    pub fn load(f: &GgufFile, ex: &Executor) -> Result<DFlash> {
        let arch = f.architecture()?;
        if arch != "dflash" {
            return Err(Error::load(
                f.path(),
                format!("a DFlash drafter was expected, not {arch}"),
            ));
        }
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&f.arch_key(k))? as usize) };
        let (n, e, nh) = (
            u("block_count")?,
            u("embedding_length")?,
            u("attention.head_count")?,
        );
        let nkv = u("attention.head_count_kv")?;
        let hd = u("attention.key_length")?;
        let ff = u("feed_forward_length")?;
        let block = u("block_size")?;
        let mask_token = u("mask_token_id")?;
        let target_layers: Vec<usize> = match f.get(&f.arch_key("target_layers")) {
            Some(Value::Array(v)) => v
                .iter()
                .map(|x| x.as_u64().map(|l| l as usize))
                .collect::<Option<_>>()
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let sane = |v: usize, most: usize| v > 0 && v <= most;
        if !(sane(n, 1 << 10)
            && sane(e, 1 << 16)
            && sane(nh, 1 << 10)
            && sane(nkv, nh)
            && nh % nkv == 0
            && sane(hd, 1 << 12)
            && sane(ff, 1 << 18)
            && (2..=256).contains(&block)
            && mask_token < 1 << 24
            && sane(target_layers.len(), 64))
        {
            return Err(Error::load(
                f.path(),
                format!(
                    "bad DFlash sizes: {n} layers of {e}, {nh} heads ({nkv} KV) of {hd}, FFN \
                     {ff}, block {block}, target layers {target_layers:?}"
                ),
            ));
        }
        let eps = f.get_f32(&f.arch_key("attention.layer_norm_rms_epsilon"))?;
        let base = crate::model::llama::f32_or(f, &f.arch_key("rope.freq_base"), 10_000.0)?;
        let mut w = Weights::new(f, ex);
        let mut layers = Vec::with_capacity(n);
        for l in 0..n {
            let name = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: w.get(&name("attn_norm"), &[e])?,
                wq: w.get(&name("attn_q"), &[nh * hd, e])?,
                wk: w.get(&name("attn_k"), &[nkv * hd, e])?,
                wv: w.get(&name("attn_v"), &[nkv * hd, e])?,
                wo: w.get(&name("attn_output"), &[e, nh * hd])?,
                q_norm: w.get(&name("attn_q_norm"), &[hd])?,
                k_norm: w.get(&name("attn_k_norm"), &[hd])?,
                ffn_norm: w.get(&name("ffn_norm"), &[e])?,
                ffn: GatedFfn::load(&mut w, l, e, ff, GluOp::SwiGlu)?,
            });
        }
        let taps = target_layers.len();
        Ok(DFlash {
            layers,
            fc: w.get("dflash.fc.weight", &[e, taps * e])?,
            hidden_norm: w.get("dflash.hidden_norm.weight", &[e])?,
            norm: w.get("output_norm.weight", &[e])?,
            e,
            n_head: nh,
            n_kv: nkv,
            hd,
            eps,
            rope: RopeParams::new(RopeMode::Neox, hd, base),
            block,
            mask_token: mask_token as u32,
            groups: vec![KvGroup {
                layers: (0..n).collect(),
                window: None,
                n_kv_heads: nkv,
                head_dim: hd,
                v_head_dim: hd,
            }],
            target_layers,
            head: None,
        })
    }

    /// Tokens per drafting block (the pending token and `block - 1` masks).
    pub fn block(&self) -> usize {
        self.block
    }
    pub fn mask_token(&self) -> u32 {
        self.mask_token
    }
    /// The target's layers whose outputs are the context.
    pub fn target_layers(&self) -> &[usize] {
        &self.target_layers
    }
    /// The drafter's own KV cache: one group of every layer.
    pub fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }
    /// Width of one context row: the target's hidden states, side by side.
    pub fn feature_width(&self) -> usize {
        self.target_layers.len() * self.e
    }

    /// Drafts with `src`'s embeddings and output matrix from now on.
    pub fn bind(&mut self, src: &DraftSource) -> Result<()> {
        let vocab = src.output.shape().dims().first().copied().unwrap_or(0);
        if src.hidden != self.e {
            return Err(Error::Model(format!(
                "the DFlash drafter is {} wide, the target {}",
                self.e, src.hidden
            )));
        }
        if let Some(&l) = self.target_layers.iter().find(|&&l| l >= src.n_layer) {
            return Err(Error::Model(format!(
                "the DFlash drafter reads layer {l}; the target has {}",
                src.n_layer
            )));
        }
        if self.mask_token as usize >= vocab {
            return Err(Error::Model(format!(
                "the DFlash mask token {} is outside the target's vocabulary of {vocab}",
                self.mask_token
            )));
        }
        let head = Head {
            tok_embd: src.tok_embd.clone(),
            out_norm: self.norm.clone(),
            output: src.output.clone(),
        };
        self.head = Some((head, src.embed_scale));
        Ok(())
    }

    fn ns(&self) -> NormSpec {
        NormSpec {
            eps: self.eps,
            one_plus: false,
        }
    }

    /// Per-head RMSNorm, then RoPE at `positions`.
    fn norm_rope(&self, ex: &Executor, x: &Tensor, w: &Tensor, pos: &Tensor) -> Result<Tensor> {
        ex.rope(&ex.rms_norm(x, w, self.eps, false)?, pos, self.rope, None)
    }

    /// Writes the K/V of context rows: `feats` `[T, feature_width]` are the target's hidden
    /// states of `b`'s tokens, whose positions and slots `b` gives.
    pub fn write_context(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        feats: &Tensor,
    ) -> Result<()> {
        let t = b.tokens.len();
        let bt = upload_batch(ex, b, 1)?;
        let ctx = ex.rms_norm(
            &ex.matmul(feats, &self.fc)?,
            &self.hidden_norm,
            self.eps,
            false,
        )?;
        let (_, slots) = &bt.tables[0];
        for (l, layer) in self.layers.iter().enumerate() {
            let k = ex
                .matmul(&ctx, &layer.wk)?
                .reshape([t, self.n_kv, self.hd])?;
            let k = self.norm_rope(ex, &k, &layer.k_norm, &bt.positions)?;
            let v = ex
                .matmul(&ctx, &layer.wv)?
                .reshape([t, self.n_kv, self.hd])?;
            let (kc, vc) = kv
                .groups
                .first()
                .and_then(|(ks, vs)| Some((ks.get(l)?, vs.get(l)?)))
                .ok_or_else(|| Error::Model(format!("no DFlash cache for layer {l}")))?;
            ex.kv_write(&k, &v, slots, kc, vc)?;
        }
        Ok(())
    }

    /// One drafting pass over blocks (`b`: each sequence's block tokens after its context,
    /// their slots scratch): the logits of `b.logits_rows` `[rows, vocab]`.
    pub fn draft(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        let (head, scale) = self
            .head
            .as_ref()
            .ok_or_else(|| Error::Model("the DFlash drafter is not bound to a target".into()))?;
        let t = b.tokens.len();
        let bt = upload_batch(ex, b, 1)?;
        let ns = self.ns();
        let (mut x, _) = head.embed(ex, b)?;
        if *scale != 1.0 {
            x = ex.scale(&x, *scale)?;
        }
        let p = AttnParams {
            scale: 1.0 / (self.hd as f32).sqrt(),
            soft_cap: None,
            mask: Mask::Bidirectional,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let h = ex.rms_norm(&x, &layer.attn_norm, self.eps, false)?;
            let q = ex
                .matmul(&h, &layer.wq)?
                .reshape([t, self.n_head, self.hd])?;
            let k = ex.matmul(&h, &layer.wk)?.reshape([t, self.n_kv, self.hd])?;
            let v = ex.matmul(&h, &layer.wv)?.reshape([t, self.n_kv, self.hd])?;
            let q = self.norm_rope(ex, &q, &layer.q_norm, &bt.positions)?;
            let k = self.norm_rope(ex, &k, &layer.k_norm, &bt.positions)?;
            let a = attention(ex, &bt, kv, (0, l), &q, Some((&k, &v)), p)?;
            x = ex.add(&x, &ex.matmul(&a, &layer.wo)?)?;
            x = ex.add(&x, &layer.ffn.forward(ex, &x, &layer.ffn_norm, ns)?)?;
        }
        head.logits(ex, &x, b, ns, None)
    }
}

// ---- Hugging Face checkpoints ----

/// A DFlash drafter's checkpoint: a Qwen3 config with a `dflash_config` section (whatever
/// its `model_type`), its projections, and Qwen3's layer names.
pub const HF: HfFamily = HfFamily {
    claims: Some(claims),
    ..HfFamily::new(&[], hf_meta, hf_names)
};

/// No GGUF architecture (the drafter is built by speculative decoding's setup).
pub const FAMILY: super::Family = super::Family {
    archs: &[],
    hf: &[&HF],
};

fn claims(c: &Config) -> Option<&'static str> {
    c.root.get("dflash_config").map(|_| "dflash")
}

fn hf_names(hf: &str) -> Option<String> {
    match hf {
        "fc.weight" => Some("dflash.fc.weight".into()),
        "hidden_norm.weight" => Some("dflash.hidden_norm.weight".into()),
        _ => None,
    }
}

/// A DFlash drafter's settings: Qwen3's RoPE, the block, the mask token, the target's
/// layers it reads (its own list, or the reference code's default spread).
fn hf_meta(c: &Config, m: &mut Meta) -> Result<()> {
    m.f("rope.freq_base", c.rope_theta(None).unwrap_or(10_000.0));
    let (kind, _) = c.rope_scaling(None)?;
    if kind != "none" {
        return Err(c.err("DFlash RoPE scaling is not supported yet"));
    }
    if let Some(types) = c.layer_types() {
        if types.iter().any(|t| t != "full_attention") {
            return Err(c.err("DFlash drafters with sliding-window layers are not supported yet"));
        }
    }
    let root = |k: &str| c.root.get(k).filter(|v| !v.is_null());
    let dc = root("dflash_config").cloned().unwrap_or(Json::Null);
    let block = root("block_size")
        .or_else(|| dc.get("block_size"))
        .and_then(Json::as_u64)
        .ok_or_else(|| c.err("config.json: a DFlash drafter needs block_size"))?;
    let mask = dc
        .get("mask_token_id")
        .and_then(Json::as_u64)
        .ok_or_else(|| c.err("config.json: dflash_config needs mask_token_id"))?;
    let drafts = c.usize("num_hidden_layers")?;
    let layers: Vec<u64> = match dc.get("target_layer_ids").and_then(Json::as_array) {
        Some(ids) => ids
            .iter()
            .map(Json::as_u64)
            .collect::<Option<_>>()
            .ok_or_else(|| c.err("config.json: target_layer_ids must be layer numbers"))?,
        None => {
            let n = root("num_target_layers")
                .and_then(Json::as_u64)
                .ok_or_else(|| c.err("config.json: no target_layer_ids nor num_target_layers"))?;
            spread_layers(n as usize, drafts)
        }
    };
    if !(2..=256).contains(&block) || layers.is_empty() || layers.len() > 64 {
        return Err(c.err(format!(
            "a DFlash block of {block} over {} target layers",
            layers.len()
        )));
    }
    m.u("block_size", block as usize);
    m.u("mask_token_id", mask as usize);
    m.set(
        "target_layers",
        Value::Array(layers.into_iter().map(Value::U64).collect()),
    );
    Ok(())
}

/// The reference code's default choice of target layers for `drafts` draft layers: one
/// in the middle, or an even spread from layer 1 to the fourth from last.
fn spread_layers(target: usize, drafts: usize) -> Vec<u64> {
    if drafts <= 1 {
        return vec![(target / 2) as u64];
    }
    let (start, end) = (1f64, target as f64 - 3.0);
    (0..drafts)
        .map(|i| {
            (start + i as f64 * (end - start) / (drafts - 1) as f64)
                .round()
                .max(0.0) as u64
        })
        .collect()
}
