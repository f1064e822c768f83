//! The dense decoder-only transformer shared by the Llama family and Gemma 3 (and, with
//! QK-norm, Qwen3): pre-norm attention and gated MLP blocks, each with optional post-norms,
//! over the paged KV cache. Family files fill in a `DecoderSpec` from their metadata.

use super::weights::Weights;
use super::{ForwardBatch, KvCaches, KvGroup, Model, ModelInfo};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::op::{AttnParams, GluOp, Mask, RopeParams};
use crate::tensor::Tensor;

/// What distinguishes one dense family from another.
#[derive(Clone, Debug)]
pub struct DecoderSpec {
    pub info: ModelInfo,
    pub eps: f32,
    /// Multiply the embeddings by this (Gemma: sqrt(n_embd)).
    pub embed_scale: Option<f32>,
    /// RMSNorm as `x·(1+w)` (Gemma's HF checkpoints; GGUF conversions fold the 1 in).
    pub norm_one_plus: bool,
    /// Per-head RMSNorm of q and k before RoPE (Gemma 3, Qwen3).
    pub qk_norm: bool,
    /// Norms on the attention and MLP outputs before the residual add (Gemma 2/3).
    pub post_norms: bool,
    pub act: GluOp,
    pub attn_scale: f32,
    pub attn_soft_cap: Option<f32>,
    pub final_soft_cap: Option<f32>,
    /// RoPE and attention window per layer.
    pub rope: Vec<RopeParams>,
    pub window: Vec<Option<usize>>,
    /// Llama-3 style per-pair frequency factors (`rope_freqs.weight`), applied to every layer.
    pub rope_freqs: Option<Vec<f32>>,
}

struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    post_ffn_norm: Option<Tensor>,
    /// (KV group, index of this layer within the group)
    kv: (usize, usize),
}

pub struct Decoder {
    spec: DecoderSpec,
    tok_embd: Tensor,
    out_norm: Tensor,
    output: Tensor,
    layers: Vec<Layer>,
    groups: Vec<KvGroup>,
    rope_freqs: Option<Tensor>,
}

/// Splits layers into KV groups by window: full-attention layers first, then each window size.
fn kv_groups(
    window: &[Option<usize>],
    n_kv: usize,
    hd: usize,
) -> (Vec<KvGroup>, Vec<(usize, usize)>) {
    let mut groups: Vec<KvGroup> = Vec::new();
    let mut place = Vec::with_capacity(window.len());
    for (l, w) in window.iter().enumerate() {
        let g = match groups.iter().position(|g| g.window == *w) {
            Some(g) => g,
            None => {
                groups.push(KvGroup {
                    layers: Vec::new(),
                    window: *w,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    v_head_dim: hd,
                });
                groups.len() - 1
            }
        };
        place.push((g, groups[g].layers.len()));
        groups[g].layers.push(l);
    }
    (groups, place)
}

impl Decoder {
    pub fn load(file: &GgufFile, ex: &Executor, mut spec: DecoderSpec) -> Result<Decoder> {
        let i = spec.info.clone();
        let (e, hd, nh, nkv, ff, v) =
            (i.n_embd, i.head_dim, i.n_head, i.n_head_kv, i.n_ff, i.vocab);
        if nh == 0 || nkv == 0 || nh % nkv != 0 || i.n_layer == 0 {
            return Err(Error::load(
                file.path(),
                format!(
                    "bad head counts: {nh} query heads, {nkv} KV heads, {} layers",
                    i.n_layer
                ),
            ));
        }
        if spec.rope.len() != i.n_layer || spec.window.len() != i.n_layer {
            return Err(Error::Model(
                "decoder spec: per-layer RoPE and window lists must have one entry per layer"
                    .into(),
            ));
        }
        let (groups, place) = kv_groups(&spec.window, nkv, hd);
        let mut w = Weights::new(file, ex);
        let tok_embd = w.get("token_embd.weight", &[v, e])?;
        let out_norm = w.get("output_norm.weight", &[e])?;
        let output = match w.get_opt("output.weight", &[v, e])? {
            Some(t) => t,
            None => tok_embd.clone(),
        };
        let rope_freqs = match &spec.rope_freqs {
            Some(f) => Some(ex.upload_f32(&[f.len()], f)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(i.n_layer);
        for (l, &kv) in place.iter().enumerate() {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let opt_norm =
                |w: &mut Weights, s: &str, d: usize, on: bool| -> Result<Option<Tensor>> {
                    if on {
                        w.get(&n(s), &[d]).map(Some)
                    } else {
                        Ok(None)
                    }
                };
            layers.push(Layer {
                attn_norm: w.get(&n("attn_norm"), &[e])?,
                wq: w.get(&n("attn_q"), &[nh * hd, e])?,
                wk: w.get(&n("attn_k"), &[nkv * hd, e])?,
                wv: w.get(&n("attn_v"), &[nkv * hd, e])?,
                wo: w.get(&n("attn_output"), &[e, nh * hd])?,
                q_norm: opt_norm(&mut w, "attn_q_norm", hd, spec.qk_norm)?,
                k_norm: opt_norm(&mut w, "attn_k_norm", hd, spec.qk_norm)?,
                post_attn_norm: opt_norm(&mut w, "post_attention_norm", e, spec.post_norms)?,
                ffn_norm: w.get(&n("ffn_norm"), &[e])?,
                w_gate: w.get(&n("ffn_gate"), &[ff, e])?,
                w_up: w.get(&n("ffn_up"), &[ff, e])?,
                w_down: w.get(&n("ffn_down"), &[e, ff])?,
                post_ffn_norm: opt_norm(&mut w, "post_ffw_norm", e, spec.post_norms)?,
                kv,
            });
        }
        spec.info.n_params = w.n_params;
        spec.info.dtypes = w.counts.iter().map(|(d, n)| (*d, *n)).collect();
        Ok(Decoder {
            spec,
            tok_embd,
            out_norm,
            output,
            layers,
            groups,
            rope_freqs,
        })
    }

    fn norm(&self, ex: &Executor, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        ex.rms_norm(x, w, self.spec.eps, self.spec.norm_one_plus)
    }

    /// `norm(x)` projected by each of `ws`, through the fused norm-matmul where the backend
    /// has it.
    fn normed_matmuls<const N: usize>(
        &self,
        ex: &Executor,
        x: &Tensor,
        norm_w: &Tensor,
        ws: [&Tensor; N],
    ) -> Result<[Tensor; N]> {
        let out = ex.rms_norm_matmuls(x, norm_w, self.spec.eps, self.spec.norm_one_plus, &ws)?;
        out.try_into()
            .map_err(|_| Error::Model("a matmul per weight".into()))
    }
}

/// The batch's index tensors, uploaded once per forward.
pub(crate) struct BatchTensors {
    pub positions: Tensor,
    pub seq_lens: Tensor,
    pub q_start: Tensor,
    /// Per KV group: block table and slot mapping.
    pub tables: Vec<(Tensor, Tensor)>,
}

pub(crate) fn upload_batch(
    ex: &Executor,
    b: &ForwardBatch,
    n_groups: usize,
) -> Result<BatchTensors> {
    let t = b.tokens.len();
    let s = b.seqs.len();
    let positions = ex.upload_i32(&[t], &b.positions)?;
    let seq_lens: Vec<i32> = b.seqs.iter().map(|q| q.seq_len as i32).collect();
    let mut q_start: Vec<i32> = b.seqs.iter().map(|q| q.q_start as i32).collect();
    q_start.push(t as i32);
    let mut tables = Vec::with_capacity(n_groups);
    for g in 0..n_groups {
        let width = b
            .seqs
            .iter()
            .map(|q| q.block_tables.get(g).map_or(0, |t| t.len()))
            .max()
            .unwrap_or(0)
            .max(1);
        let mut table = vec![0i32; s * width];
        for (si, q) in b.seqs.iter().enumerate() {
            let bt = q.block_tables.get(g).ok_or_else(|| {
                Error::Model(format!("sequence {si} has no block table for KV group {g}"))
            })?;
            for (j, &blk) in bt.iter().enumerate() {
                table[si * width + j] = blk as i32;
            }
        }
        let slots = b
            .slots
            .get(g)
            .ok_or_else(|| Error::Model(format!("no slot mapping for KV group {g}")))?;
        tables.push((
            ex.upload_i32(&[s, width], &table)?,
            ex.upload_i32(&[t], slots)?,
        ));
    }
    Ok(BatchTensors {
        positions,
        seq_lens: ex.upload_i32(&[s], &seq_lens)?,
        q_start: ex.upload_i32(&[s + 1], &q_start)?,
        tables,
    })
}

/// Checks a batch against the model: tokens and positions agree, every id is in the
/// vocabulary. Returns the token count.
pub(crate) fn check_batch(b: &ForwardBatch, vocab: usize) -> Result<usize> {
    let t = b.tokens.len();
    if t == 0 || b.positions.len() != t {
        return Err(Error::Model(format!(
            "batch of {t} tokens with {} positions",
            b.positions.len()
        )));
    }
    if let Some(&bad) = b.tokens.iter().find(|&&tok| tok as usize >= vocab) {
        return Err(Error::Model(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(t)
}

/// The model's head on the rows that want logits (only those go through the final RMSNorm,
/// `(eps, one_plus)`, and the output matrix, fused where the backend has the fused op):
/// `[rows, vocab]`, soft-capped when `soft_cap` is set.
#[allow(clippy::too_many_arguments)]
pub(crate) fn logits_head(
    ex: &Executor,
    x: &Tensor,
    b: &ForwardBatch,
    out_norm: &Tensor,
    output: &Tensor,
    (eps, one_plus): (f32, bool),
    vocab: usize,
    soft_cap: Option<f32>,
) -> Result<Tensor> {
    let t = b.tokens.len();
    let rows: Vec<i32> = b.logits_rows.iter().map(|&r| r as i32).collect();
    if rows.is_empty() {
        return ex
            .backend()
            .alloc(&crate::TensorDesc::new(crate::DType::F32, [0, vocab]));
    }
    if rows.iter().any(|&r| r as usize >= t) {
        return Err(Error::Model(format!(
            "logits rows {:?} out of the batch of {t}",
            b.logits_rows
        )));
    }
    let sel = ex.get_rows(x, &ex.upload_i32(&[rows.len()], &rows)?)?;
    let mut logits = ex
        .rms_norm_matmuls(&sel, out_norm, eps, one_plus, &[output])?
        .remove(0);
    if let Some(c) = soft_cap {
        logits = ex.scale(&logits, 1.0 / c)?;
        logits = ex.unary(crate::op::UnaryOp::Tanh, &logits)?;
        logits = ex.scale(&logits, c)?;
    }
    Ok(logits)
}

impl Model for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.spec.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }

    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        let sp = &self.spec;
        let i = &sp.info;
        let t = check_batch(b, i.vocab)?;
        let bt = upload_batch(ex, b, self.groups.len())?;
        let ids: Vec<i32> = b.tokens.iter().map(|&x| x as i32).collect();
        let ids = ex.upload_i32(&[t], &ids)?;
        let mut x = ex.get_rows(&self.tok_embd, &ids)?;
        if let Some(s) = sp.embed_scale {
            x = ex.scale(&x, s)?;
        }
        let (hd, nh, nkv) = (i.head_dim, i.n_head, i.n_head_kv);
        for (l, layer) in self.layers.iter().enumerate() {
            // Attention.
            let [q, k, v] =
                self.normed_matmuls(ex, &x, &layer.attn_norm, [&layer.wq, &layer.wk, &layer.wv])?;
            let mut q = q.reshape([t, nh, hd])?;
            let mut k = k.reshape([t, nkv, hd])?;
            let v = v.reshape([t, nkv, hd])?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = self.norm(ex, &q, qn)?;
                k = self.norm(ex, &k, kn)?;
            }
            q = ex.rope(&q, &bt.positions, sp.rope[l], self.rope_freqs.as_ref())?;
            k = ex.rope(&k, &bt.positions, sp.rope[l], self.rope_freqs.as_ref())?;
            let (g, gi) = layer.kv;
            let (kc, vc) = (&kv.groups[g].0[gi], &kv.groups[g].1[gi]);
            let (table, slots) = &bt.tables[g];
            ex.kv_write(&k, &v, slots, kc, vc)?;
            let mask = match sp.window[l] {
                Some(w) => Mask::SlidingWindow(w),
                None => Mask::Causal,
            };
            let p = AttnParams {
                scale: sp.attn_scale,
                soft_cap: sp.attn_soft_cap,
                mask,
            };
            let a = ex.paged_attention(p, &q, kc, vc, table, &bt.seq_lens, &bt.q_start)?;
            let mut o = ex.matmul(&a.reshape([t, nh * hd])?, &layer.wo)?;
            if let Some(pn) = &layer.post_attn_norm {
                o = self.norm(ex, &o, pn)?;
            }
            x = ex.add(&x, &o)?;
            // MLP.
            let [gate, up] =
                self.normed_matmuls(ex, &x, &layer.ffn_norm, [&layer.w_gate, &layer.w_up])?;
            let mut d = ex.glu_matmul(sp.act, &gate, &up, &layer.w_down)?;
            if let Some(pn) = &layer.post_ffn_norm {
                d = self.norm(ex, &d, pn)?;
            }
            x = ex.add(&x, &d)?;
        }
        logits_head(
            ex,
            &x,
            b,
            &self.out_norm,
            &self.output,
            (self.spec.eps, self.spec.norm_one_plus),
            i.vocab,
            sp.final_soft_cap,
        )
    }
}
