//! The dense decoder-only transformer shared by the Llama family and Gemma 3 (and, with
//! QK-norm, Qwen3): pre-norm attention and gated MLP blocks, each with optional post-norms,
//! over the paged KV cache. Family files fill in a `DecoderSpec` from their metadata.

use super::blocks::{
    check_batch, gives, image_key_end, normed_matmuls, rope_attention, splice_embeds, upload_batch,
    GatedFfn, Head, NormSpec, Taps,
};
use super::weights::Weights;
use super::{DraftSource, Features, ForwardBatch, KvCaches, KvGroup, Model, ModelInfo};
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
    /// An image's soft tokens see each other both ways (and what precedes them causally),
    /// on every layer, within its window (Gemma 3).
    pub images_bidirectional: bool,
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
    ffn: GatedFfn,
    post_ffn_norm: Option<Tensor>,
    /// (KV group, index of this layer within the group)
    kv: (usize, usize),
}

pub struct Decoder {
    spec: DecoderSpec,
    head: Head,
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
        let head = Head::load(&mut w, v, e)?;
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
                ffn: GatedFfn::load(&mut w, l, e, ff, spec.act)?,
                post_ffn_norm: opt_norm(&mut w, "post_ffw_norm", e, spec.post_norms)?,
                kv,
            });
        }
        w.describe(&mut spec.info);
        Ok(Decoder {
            spec,
            head,
            layers,
            groups,
            rope_freqs,
        })
    }

    fn norm(&self, ex: &Executor, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        ex.rms_norm(x, w, self.spec.eps, self.spec.norm_one_plus)
    }

    fn norm_spec(&self) -> NormSpec {
        NormSpec {
            eps: self.spec.eps,
            one_plus: self.spec.norm_one_plus,
        }
    }
}

impl Model for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.spec.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }

    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        let x = self.layers_pass(ex, b, kv, &mut Taps::none())?;
        self.head
            .logits(ex, &x, b, self.norm_spec(), self.spec.final_soft_cap)
    }

    fn forward_features(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        f: &Features,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut taps = Taps::new(f, self.spec.info.n_layer)?;
        let x = self.layers_pass(ex, b, kv, &mut taps)?;
        let ns = self.norm_spec();
        let logits = self.head.logits(ex, &x, b, ns, self.spec.final_soft_cap)?;
        Ok((logits, taps.finish(ex, &x, &self.head, ns)?))
    }

    fn gives(&self, f: &Features) -> bool {
        gives(f, self.spec.info.n_layer)
    }

    fn draft_source(&self) -> Option<DraftSource> {
        let i = &self.spec.info;
        Some(DraftSource {
            tok_embd: self.head.tok_embd.clone(),
            embed_scale: self.spec.embed_scale.unwrap_or(1.0),
            output: self.head.output.clone(),
            hidden: i.n_embd,
            n_layer: i.n_layer,
            groups: self.groups.clone(),
            sliding: None,
            full: None,
        })
    }
}

impl Decoder {
    /// The layers over the batch's embeddings: the last hidden state (`taps` collects the
    /// layer outputs a drafter reads).
    fn layers_pass(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        taps: &mut Taps,
    ) -> Result<Tensor> {
        let sp = &self.spec;
        let i = &sp.info;
        let t = check_batch(b, i.vocab)?;
        let mut bt = upload_batch(ex, b, self.groups.len())?;
        if sp.images_bidirectional {
            bt.key_end = image_key_end(ex, b)?;
        }
        let ns = self.norm_spec();
        let (mut x, _) = self.head.embed(ex, b)?;
        if let Some(s) = sp.embed_scale {
            x = ex.scale(&x, s)?;
        }
        let mut x = splice_embeds(ex, &x, b)?;
        let (hd, nh, nkv) = (i.head_dim, i.n_head, i.n_head_kv);
        for (l, layer) in self.layers.iter().enumerate() {
            // Attention.
            let [q, k, v] = normed_matmuls(
                ex,
                &x,
                &layer.attn_norm,
                ns,
                [&layer.wq, &layer.wk, &layer.wv],
            )?;
            let mut q = q.reshape([t, nh, hd])?;
            let mut k = k.reshape([t, nkv, hd])?;
            let v = v.reshape([t, nkv, hd])?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = self.norm(ex, &q, qn)?;
                k = self.norm(ex, &k, kn)?;
            }
            let mask = match sp.window[l] {
                Some(w) => Mask::SlidingWindow(w),
                None => Mask::Causal,
            };
            let p = AttnParams {
                scale: sp.attn_scale,
                soft_cap: sp.attn_soft_cap,
                mask,
            };
            let rope = (sp.rope[l], self.rope_freqs.as_ref());
            let a = rope_attention(ex, &bt, kv, layer.kv, (&q, &k, &v), rope, p)?;
            // Each residual add is its projection's epilogue where no norm comes between.
            x = match &layer.post_attn_norm {
                Some(pn) => {
                    let o = ex.matmul(&a, &layer.wo)?;
                    ex.add(&x, &self.norm(ex, &o, pn)?)?
                }
                None => ex.matmul_add(&a, &layer.wo, &x)?,
            };
            // MLP.
            x = match &layer.post_ffn_norm {
                Some(pn) => {
                    let d = layer.ffn.forward(ex, &x, &layer.ffn_norm, ns)?;
                    ex.add(&x, &self.norm(ex, &d, pn)?)?
                }
                None => layer.ffn.forward_residual(ex, &x, &layer.ffn_norm, ns)?,
            };
            taps.after(l, &x);
        }
        Ok(x)
    }
}
