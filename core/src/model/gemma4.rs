//! Gemma 4 (`gemma4`): sliding-window and full attention layers with their own head sizes and
//! KV-head counts, plain RMSNorms (q, k, and an unscaled one on v), attention scale 1, K used
//! as V on full layers (`attention_k_eq_v`), the last layers reusing the K/V of the last
//! earlier layer of their type (KV sharing: they neither project nor store K/V), per-layer
//! embeddings (PLE) mixed in after each block, a learned scalar per layer, an optional MoE
//! block beside the dense MLP, and final logit soft-capping.
//!
//! RoPE: the sliding layers rotate the whole head with their own base; the full layers use
//! "proportional" RoPE: rotate-half over the whole head, where only the first
//! `partial × head_dim / 2` frequencies turn (`base^(-2i/head_dim)`) and the rest stand still.
//! That is the RoPE op over the whole head with frequency factors: 1 for the turning pairs, a
//! huge number (frequency 0) for the others.

use super::blocks::{
    attention, check_batch, experts, upload_batch, GatedFfn, Head, NormSpec, Split,
};
pub(crate) use super::gemma4_hf::hf_meta;
use super::gemma4_ple::PleInputs;
use super::llama::{base_info, f32_or};
use super::weights::Weights;
use super::{ForwardBatch, KvCaches, KvGroup, Model, ModelInfo};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
use crate::load::hf::family::{f, fd, layer, layer_weight, none, Field, HfFamily};
use crate::op::{AttnParams, GluOp, Mask, MoeGating, RopeMode, RopeParams, UnaryOp};
use crate::tensor::Tensor;

/// The frequency factor of a pair that does not turn (frequency / factor ≈ 0).
const STILL: f32 = 1e30;

struct Attn {
    wq: Tensor,
    q_norm: Tensor,
    /// K and V projections and the K norm; `None` for a layer that reuses another's K/V.
    kv: Option<(Tensor, Option<Tensor>, Tensor)>,
    wo: Tensor,
    post_norm: Tensor,
    hd: usize,
    n_kv: usize,
    window: Option<usize>,
    rope: RopeParams,
    /// (KV group, index in the group) of the caches it writes or reads.
    cache: (usize, usize),
    /// Ones `[hd]`: V's RMSNorm has no scale.
    ones: Tensor,
}

struct Moe {
    router: Tensor,
    /// `router.scale / sqrt(hidden)` `[E]`.
    router_scale: Tensor,
    /// `[experts, 1]`.
    per_expert_scale: Tensor,
    ones: Tensor,
    gate_exps: Tensor,
    up_exps: Tensor,
    down_exps: Tensor,
    k: usize,
    pre_norm_2: Tensor,
    post_norm_1: Tensor,
    post_norm_2: Tensor,
}

struct Ple {
    gate: Tensor,
    proj: Tensor,
    post_norm: Tensor,
}

struct Layer {
    attn_norm: Tensor,
    attn: Attn,
    ffn_norm: Tensor,
    ffn: GatedFfn,
    post_ffn_norm: Tensor,
    moe: Option<Moe>,
    ple: Option<Ple>,
    scalar: f32,
    /// DiffusionGemma's encoder scales the layer's output by a scalar of its own.
    enc_scalar: f32,
}

pub struct Gemma4 {
    pub(super) info: ModelInfo,
    pub(super) eps: f32,
    pub(super) soft_cap: Option<f32>,
    /// Whether an image's soft tokens see each other both ways on the sliding layers.
    images_bidirectional: bool,
    pub(super) head: Head,
    layers: Vec<Layer>,
    groups: Vec<KvGroup>,
    ple: Option<PleInputs>,
    /// Frequency factors of the full layers' proportional RoPE.
    full_factors: Option<Tensor>,
    /// An MTP assistant's layers read another model's caches: that model's KV group count
    /// (`None`: this model's own groups).
    source_groups: Option<usize>,
}

/// How a pass runs the layers: causally (a language model, or DiffusionGemma's encoder), or
/// as DiffusionGemma's decoder over canvases of `canvas` tokens (full layers see the whole
/// context, sliding layers the last `window - 1` keys before the canvas and the canvas), or
/// as an MTP assistant's step: one query past what the cache holds, full layers seeing all
/// of it and sliding layers its last `window + 1` keys (transformers' flipped bidirectional
/// window: distance ≤ window from the newest key).
#[derive(Copy, Clone, Debug)]
pub(super) enum Pass {
    Causal,
    /// Causal, each layer's output scaled by its encoder scalar (DiffusionGemma's encoder).
    Encoder,
    Canvas(usize),
    /// The first `seqs` sequences as the encoder's rows, the rest as canvases of `canvas`
    /// tokens: one pass for both, each part attending under its own masks and scaled by its
    /// own scalars (the projections and FFNs run once over every row).
    Mixed {
        canvas: usize,
        seqs: usize,
    },
    Lookahead,
}

impl Pass {
    /// A layer's mask in this pass (`window`: a sliding layer's); a mixed pass's parts are
    /// an encoder and a canvas pass.
    fn mask(self, window: Option<usize>) -> Mask {
        match (window, self) {
            (Some(w), Pass::Causal | Pass::Encoder) => Mask::SlidingWindow(w),
            (None, Pass::Causal | Pass::Encoder) => Mask::Causal,
            (Some(w), Pass::Canvas(c) | Pass::Mixed { canvas: c, .. }) => {
                Mask::Lookback(c + w.saturating_sub(1))
            }
            (None, Pass::Canvas(_) | Pass::Mixed { .. } | Pass::Lookahead) => Mask::Bidirectional,
            (Some(w), Pass::Lookahead) => Mask::Lookback(w + 1),
        }
    }

    /// A layer's output scalar in this pass (a mixed pass scales each part by its own).
    fn scalar(self, enc: f32, dec: f32) -> f32 {
        match self {
            Pass::Encoder => enc,
            _ => dec,
        }
    }
}

pub fn build(f: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    Ok(Box::new(Gemma4::load(f, ex, false)?))
}

fn list<T>(f: &GgufFile, key: &str, n: usize, get: impl Fn(&Value) -> Option<T>) -> Result<Vec<T>> {
    let k = f.arch_key(key);
    match f.get(&k) {
        Some(Value::Array(v)) if v.len() == n => v
            .iter()
            .map(&get)
            .collect::<Option<Vec<T>>>()
            .ok_or_else(|| Error::load(f.path(), format!("{k}: bad entry"))),
        _ => Err(Error::load(
            f.path(),
            format!("{k} must list one entry per layer"),
        )),
    }
}

impl Gemma4 {
    /// `assistant`: Gemma 4's MTP assistant, whose layers all read a target's K/V (bound
    /// later by [`Gemma4::bind_shared`]).
    pub(super) fn load(f: &GgufFile, ex: &Executor, assistant: bool) -> Result<Gemma4> {
        let mut info = base_info(f)?;
        let n = info.n_layer;
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&f.arch_key(k))? as usize) };
        let eps = f.get_f32(&f.arch_key("attention.layer_norm_rms_epsilon"))?;
        // Two spellings of the per-layer settings: kiln's from Hugging Face configs, and
        // llama.cpp's GGUF keys (sliding_window_pattern, key_length[_swa], a head_count_kv list).
        let has = |k: &str| f.get(&f.arch_key(k)).is_some();
        let flag = |v: &Value| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        };
        let sliding = if has("attention.sliding_layers") {
            list(f, "attention.sliding_layers", n, flag)?
        } else {
            list(f, "attention.sliding_window_pattern", n, flag)?
        };
        let count = |v: &Value| v.as_u64().map(|x| x as usize);
        let dims = if has("attention.layer_key_length") {
            list(f, "attention.layer_key_length", n, count)?
        } else {
            let (full, swa) = (u("attention.key_length")?, u("attention.key_length_swa")?);
            sliding
                .iter()
                .map(|&s| if s { swa } else { full })
                .collect()
        };
        let kvs = if has("attention.layer_head_count_kv") {
            list(f, "attention.layer_head_count_kv", n, count)?
        } else {
            list(f, "attention.head_count_kv", n, count)?
        };
        let window = u("attention.sliding_window")?;
        let n_shared = u("attention.shared_kv_layers")?;
        // K = V on full layers: said by kiln's key, or seen in a GGUF as full layers without V.
        let k_eq_v = matches!(
            f.get(&f.arch_key("attention.k_eq_v")),
            Some(Value::Bool(true))
        ) || (0..n).any(|l| {
            !sliding[l]
                && l < n.saturating_sub(n_shared)
                && f.tensor(&format!("blk.{l}.attn_v.weight")).is_err()
        });
        let ple_width = u("embedding_length_per_layer_input")?;
        // kiln's key from a Hugging Face config; in llama.cpp's files none, where its rule
        // holds: bidirectional except E2B and E4B (text widths 1536 and 2560).
        let images_bidirectional = match f.get(&f.arch_key("attention.images_bidirectional")) {
            Some(Value::Bool(b)) => *b,
            _ => !matches!(info.n_embd, 1536 | 2560),
        };
        let soft_cap = match f.get(&f.arch_key("final_logit_softcapping")) {
            Some(_) => Some(f.get_f32(&f.arch_key("final_logit_softcapping"))?),
            None => None,
        };
        let local_base = match has("rope.freq_base_swa") {
            true => f.get_f32(&f.arch_key("rope.freq_base_swa"))?,
            false => f32_or(f, &f.arch_key("rope.local_freq_base"), 10_000.0)?,
        };
        let full_base = f32_or(f, &f.arch_key("rope.freq_base"), 1_000_000.0)?;
        let partial = f32_or(f, &f.arch_key("rope.full_partial"), 1.0)?;
        let full_factor = f32_or(f, &f.arch_key("rope.full_factor"), 1.0)?;
        let (e, nh, v) = (info.n_embd, info.n_head, info.vocab);
        let bad = |m: String| Error::load(f.path(), m);
        let bad_sharing = if assistant {
            n_shared != n
        } else {
            n_shared >= n
        };
        if nh == 0 || n == 0 || bad_sharing || kvs.iter().any(|&k| k == 0 || nh % k != 0) {
            return Err(bad(format!(
                "bad sizes: {nh} heads, KV heads {kvs:?}, {n_shared} of {n} layers sharing KV"
            )));
        }
        // KV sharing: a shared layer reads the caches of the last earlier unshared layer of
        // its type.
        let first_shared = n - n_shared;
        let mut producer = vec![0usize; n];
        for l in 0..n {
            if assistant {
                continue;
            }
            producer[l] = if l < first_shared {
                l
            } else {
                (0..first_shared)
                    .rev()
                    .find(|&p| sliding[p] == sliding[l])
                    .ok_or_else(|| {
                        bad(format!("layer {l} has no earlier layer to share K/V with"))
                    })?
            };
        }
        // KV groups: sliding layers and full layers (each with its own head shape).
        let mut groups: Vec<KvGroup> = Vec::new();
        let mut place = vec![(0usize, 0usize); n];
        for l in 0..first_shared {
            let w = sliding[l].then_some(window);
            let g = match groups
                .iter()
                .position(|g| g.window == w && g.head_dim == dims[l] && g.n_kv_heads == kvs[l])
            {
                Some(g) => g,
                None => {
                    groups.push(KvGroup {
                        layers: Vec::new(),
                        window: w,
                        n_kv_heads: kvs[l],
                        head_dim: dims[l],
                        v_head_dim: dims[l],
                    });
                    groups.len() - 1
                }
            };
            place[l] = (g, groups[g].layers.len());
            groups[g].layers.push(l);
        }
        let full_hd = (0..n).find(|&l| !sliding[l]).map(|l| dims[l]);
        let full_factors = match full_hd {
            // A GGUF carries the factors itself.
            Some(hd) if f.tensor("rope_freqs.weight").is_ok() => {
                let (t, bytes) = f.data("rope_freqs.weight")?;
                if t.n_elements() != hd / 2 {
                    return Err(bad(format!(
                        "rope_freqs has {} values, not {}",
                        t.n_elements(),
                        hd / 2
                    )));
                }
                let mut v = vec![0f32; hd / 2];
                crate::quant::dequantize(t.dtype, &bytes, &mut v)?;
                Some(ex.upload_f32(&[hd / 2], &v)?)
            }
            Some(hd) => {
                let turning = (partial * hd as f32 / 2.0) as usize;
                let factors: Vec<f32> = (0..hd / 2)
                    .map(|i| if i < turning { full_factor } else { STILL })
                    .collect();
                Some(ex.upload_f32(&[hd / 2], &factors)?)
            }
            None => None,
        };

        let mut w = Weights::new(f, ex);
        let head = Head::load(&mut w, v, e)?;
        let ple = match ple_width {
            0 => None,
            p => Some(PleInputs::load(f, &mut w, n, p, e)?),
        };
        let experts = match f.get(&f.arch_key("expert_count")) {
            Some(_) => {
                let (ne, k) = (u("expert_count")?, u("expert_used_count")?);
                if k == 0 || k > ne {
                    return Err(Error::load(
                        f.path(),
                        format!("{k} experts per token of {ne}"),
                    ));
                }
                Some((ne, k, u("expert_feed_forward_length")?))
            }
            None => None,
        };
        let mut layers = Vec::with_capacity(n);
        for l in 0..n {
            let name = |s: &str| format!("blk.{l}.{s}");
            let (hd, nkv) = (dims[l], kvs[l]);
            let shared = l >= first_shared;
            let kv = if shared {
                None
            } else {
                let wk = w.get(&name("attn_k.weight"), &[nkv * hd, e])?;
                let wv = if k_eq_v && !sliding[l] {
                    None
                } else {
                    Some(w.get(&name("attn_v.weight"), &[nkv * hd, e])?)
                };
                Some((wk, wv, w.get(&name("attn_k_norm.weight"), &[hd])?))
            };
            let rope = if sliding[l] {
                RopeParams::new(RopeMode::Neox, hd, local_base)
            } else {
                RopeParams::new(RopeMode::Neox, hd, full_base)
            };
            let attn = Attn {
                wq: w.get(&name("attn_q.weight"), &[nh * hd, e])?,
                q_norm: w.get(&name("attn_q_norm.weight"), &[hd])?,
                kv,
                wo: w.get(&name("attn_output.weight"), &[e, nh * hd])?,
                post_norm: w.get(&name("post_attention_norm.weight"), &[e])?,
                hd,
                n_kv: nkv,
                window: sliding[l].then_some(window),
                rope,
                cache: place[producer[l]],
                ones: ex.upload_f32(&[hd], &vec![1.0; hd])?,
            };
            // The MLP may be twice as wide on shared layers: its width comes from the file.
            let ff = f
                .tensor(&name("ffn_gate.weight"))?
                .shape
                .first()
                .copied()
                .unwrap_or(0);
            let moe = match experts {
                Some((ne, k, fe)) => {
                    let scale = w.host_f32(&name("ffn_gate_inp.scale"), e)?;
                    let root = 1.0 / (e as f32).sqrt();
                    let scale: Vec<f32> = scale.iter().map(|s| s * root).collect();
                    let pes = w.host_f32(&name("ffn_down_exps.scale"), ne)?;
                    // llama.cpp keeps gate and up fused per expert: [E, 2F, H].
                    let fused = name("ffn_gate_up_exps.weight");
                    let (gate_exps, up_exps) = if f.tensor(&fused).is_ok() {
                        let (g, u): (Vec<_>, Vec<_>) = (0..ne)
                            .map(|x| {
                                (
                                    2 * x * fe..(2 * x + 1) * fe,
                                    (2 * x + 1) * fe..(2 * x + 2) * fe,
                                )
                            })
                            .unzip();
                        let shape = [ne, 2 * fe, e];
                        (
                            w.get_rows(&fused, &shape, &g)?.reshape([ne, fe, e])?,
                            w.get_rows(&fused, &shape, &u)?.reshape([ne, fe, e])?,
                        )
                    } else {
                        (
                            w.get(&name("ffn_gate_exps.weight"), &[ne, fe, e])?,
                            w.get(&name("ffn_up_exps.weight"), &[ne, fe, e])?,
                        )
                    };
                    Some(Moe {
                        router: w.get(&name("ffn_gate_inp.weight"), &[ne, e])?,
                        router_scale: ex.upload_f32(&[e], &scale)?,
                        per_expert_scale: ex.upload_f32(&[ne, 1], &pes)?,
                        ones: ex.upload_f32(&[e], &vec![1.0; e])?,
                        gate_exps,
                        up_exps,
                        down_exps: w.get(&name("ffn_down_exps.weight"), &[ne, e, fe])?,
                        k,
                        pre_norm_2: w.get(&name("pre_ffw_norm_2.weight"), &[e])?,
                        post_norm_1: w.get(&name("post_ffw_norm_1.weight"), &[e])?,
                        post_norm_2: w.get(&name("post_ffw_norm_2.weight"), &[e])?,
                    })
                }
                None => None,
            };
            let ple = match ple_width {
                0 => None,
                p => Some(Ple {
                    gate: w.get(&name("inp_gate.weight"), &[p, e])?,
                    proj: w.get(&name("proj.weight"), &[e, p])?,
                    post_norm: w.get(&name("post_norm.weight"), &[e])?,
                }),
            };
            let scalar = ["layer_output_scale", "layer_output_scale.weight"]
                .iter()
                .find(|s| f.tensor(&name(s)).is_ok())
                .map(|s| w.host_f32(&name(s), 1).map(|v| v[0]))
                .transpose()?
                .unwrap_or(1.0);
            let enc_scalar = match f.tensor(&name("enc_output_scale")) {
                Ok(_) => w.host_f32(&name("enc_output_scale"), 1)?[0],
                Err(_) => scalar,
            };
            layers.push(Layer {
                enc_scalar,
                attn_norm: w.get(&name("attn_norm.weight"), &[e])?,
                attn,
                ffn_norm: w.get(&name("ffn_norm.weight"), &[e])?,
                ffn: GatedFfn::load(&mut w, l, e, ff, GluOp::GeGlu)?,
                post_ffn_norm: w.get(&name("post_ffw_norm.weight"), &[e])?,
                moe,
                ple,
                scalar,
            });
        }
        w.describe(&mut info);
        Ok(Gemma4 {
            info,
            eps,
            soft_cap,
            images_bidirectional,
            head,
            layers,
            groups,
            ple,
            full_factors,
            source_groups: None,
        })
    }

    /// The (KV group, index) of the cache the last layer of each kind computes K/V into, as
    /// an MTP assistant reads them: (sliding, full).
    pub(super) fn last_producers(&self) -> (Option<(usize, usize)>, Option<(usize, usize)>) {
        let last = |sliding: bool| {
            self.layers
                .iter()
                .rev()
                .find(|l| l.attn.window.is_some() == sliding)
                .map(|l| l.attn.cache)
        };
        (last(true), last(false))
    }

    /// An MTP assistant's layers read `groups`' caches: sliding layers the one at
    /// `sliding`, full layers the one at `full` (head shapes must agree).
    pub(super) fn bind_shared(
        &mut self,
        groups: &[KvGroup],
        sliding: Option<(usize, usize)>,
        full: Option<(usize, usize)>,
    ) -> Result<()> {
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let a = &mut layer.attn;
            let kind = if a.window.is_some() {
                "sliding"
            } else {
                "full"
            };
            let place = if a.window.is_some() { sliding } else { full };
            let g = place.and_then(|(g, _)| groups.get(g)).ok_or_else(|| {
                Error::Model(format!(
                    "assistant layer {l} ({kind}) has no {kind} layer of the target to read"
                ))
            })?;
            if g.head_dim != a.hd || g.n_kv_heads != a.n_kv || g.window != a.window {
                return Err(Error::Model(format!(
                    "assistant layer {l} ({kind}) expects {} KV heads of {} (window {:?}); \
                     the target's have {} of {} (window {:?})",
                    a.n_kv, a.hd, a.window, g.n_kv_heads, g.head_dim, g.window
                )));
            }
            a.cache = place.unwrap_or_default();
        }
        self.source_groups = Some(groups.len());
        Ok(())
    }

    fn norm(&self, ex: &Executor, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        ex.rms_norm(x, w, self.eps, false)
    }

    /// The per-layer embedding input of every layer, `[T, width]` each.
    fn ple_inputs(&self, ex: &Executor, x0: &Tensor, ids: &Tensor) -> Result<Vec<Tensor>> {
        match &self.ple {
            Some(p) => p.inputs(ex, x0, ids, self.info.n_embd, self.eps),
            None => Ok(Vec::new()),
        }
    }

    fn moe(&self, ex: &Executor, m: &Moe, res: &Tensor) -> Result<Tensor> {
        let t = res.shape().dims()[0];
        let r = ex.mul(&self.norm(ex, res, &m.ones)?, &m.router_scale)?;
        let logits = ex.matmul(&r, &m.router)?;
        let (weights, ids) = ex.moe_route(&logits, m.k, MoeGating::Softmax, true)?;
        let pes = ex
            .get_rows(&m.per_expert_scale, &ids.reshape([t * m.k])?)?
            .reshape([t, m.k])?;
        let weights = ex.mul(&weights, &pes)?;
        let h = self.norm(ex, res, &m.pre_norm_2)?;
        let exps = (&m.gate_exps, &m.up_exps, &m.down_exps);
        let y = experts(ex, &h, exps, GluOp::GeGlu, &ids, &weights)?;
        self.norm(ex, &y, &m.post_norm_2)
    }
}

impl Model for Gemma4 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }

    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        let x = self.causal(ex, b, kv, Pass::Causal)?;
        self.head.logits(ex, &x, b, self.norm_spec(), self.soft_cap)
    }

    fn forward_features(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        f: &super::Features,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        if *f != super::Features::Final {
            return Err(Error::Model(format!(
                "Gemma 4 hands a drafter its final hidden state, not {f:?}"
            )));
        }
        let x = self.causal(ex, b, kv, Pass::Causal)?;
        let logits = self
            .head
            .logits(ex, &x, b, self.norm_spec(), self.soft_cap)?;
        let n = self.norm_spec();
        Ok((
            logits,
            vec![ex.rms_norm(&x, &self.head.out_norm, n.eps, n.one_plus)?],
        ))
    }

    fn gives(&self, f: &super::Features) -> bool {
        *f == super::Features::Final
    }

    fn draft_source(&self) -> Option<super::DraftSource> {
        if self.source_groups.is_some() {
            return None;
        }
        let (sliding, full) = self.last_producers();
        Some(super::DraftSource {
            tok_embd: self.head.tok_embd.clone(),
            embed_scale: (self.info.n_embd as f32).sqrt(),
            output: self.head.output.clone(),
            hidden: self.info.n_embd,
            n_layer: self.info.n_layer,
            groups: self.groups.clone(),
            sliding,
            full,
        })
    }
}

impl Gemma4 {
    pub(super) fn norm_spec(&self) -> NormSpec {
        NormSpec {
            eps: self.eps,
            one_plus: false,
        }
    }

    /// The embedded batch through every layer, causally (`pass`: `Causal` or `Encoder`): the
    /// last hidden state `[T, e]`.
    pub(super) fn causal(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        pass: Pass,
    ) -> Result<Tensor> {
        let i = &self.info;
        check_batch(b, i.vocab)?;
        let (x0, ids) = self.head.embed(ex, b)?;
        let x = ex.scale(&x0, (i.n_embd as f32).sqrt())?;
        // An image row takes the image's embedding; its per-layer input is that embedding's
        // projection and its (zeroed: the pad token's) id's table row, as transformers makes it.
        let x = super::blocks::splice_embeds(ex, &x, b)?;
        let ple = self.ple_inputs(ex, &x, &ids)?;
        self.layers_pass(ex, b, kv, x, &ple, pass)
    }

    /// A pass over `b` whose first `seqs` sequences are the encoder's tokens (embedded here)
    /// and whose other rows, embedded already as `canvas_x` (`[rows, e]`), are canvases of
    /// `canvas` tokens: the last hidden state `[T, e]`.
    pub(super) fn mixed(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        seqs: usize,
        canvas_x: Tensor,
        canvas: usize,
    ) -> Result<Tensor> {
        if seqs == 0 {
            return self.layers_pass(ex, b, kv, canvas_x, &[], Pass::Canvas(canvas));
        }
        let (enc, _) = super::blocks::split_batch(b, seqs);
        let (x0, ids) = self.head.embed(ex, &enc)?;
        let x = ex.scale(&x0, (self.info.n_embd as f32).sqrt())?;
        let ple = self.ple_inputs(ex, &x, &ids)?;
        let x = ex.concat_rows(&[&x, &canvas_x])?;
        self.layers_pass(ex, b, kv, x, &ple, Pass::Mixed { canvas, seqs })
    }

    /// The layers over the embedded batch `x`.
    pub(super) fn layers_pass(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        mut x: Tensor,
        ple: &[Tensor],
        pass: Pass,
    ) -> Result<Tensor> {
        let i = &self.info;
        let t = b.tokens.len();
        let n_groups = self.source_groups.unwrap_or(self.groups.len());
        let bt = upload_batch(ex, b, n_groups)?;
        // Image soft tokens see each other both ways on the sliding layers (where the
        // checkpoint says so); the full layers stay causal.
        let bt_images = match self.images_bidirectional && !b.embeds.is_empty() {
            true => Some(super::blocks::BatchTensors {
                key_end: super::blocks::image_key_end(ex, b)?,
                ..bt.clone()
            }),
            false => None,
        };
        let split = match pass {
            Pass::Mixed { seqs, .. } => Some(Split::new(ex, b, seqs, n_groups)?),
            _ => None,
        };
        let ns = self.norm_spec();
        let nh = i.n_head;
        for (l, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            let h = self.norm(ex, &x, &layer.attn_norm)?;
            let factors = if a.window.is_none() {
                self.full_factors.as_ref()
            } else {
                None
            };
            let q = ex.matmul(&h, &a.wq)?.reshape([t, nh, a.hd])?;
            let q_normed = self.norm(ex, &q, &a.q_norm)?;
            let mut new_kv = None;
            if let Some((wk, wv, k_norm)) = &a.kv {
                let k_raw = ex.matmul(&h, wk)?.reshape([t, a.n_kv, a.hd])?;
                let v_raw = match wv {
                    Some(wv) => ex.matmul(&h, wv)?.reshape([t, a.n_kv, a.hd])?,
                    None => k_raw.clone(),
                };
                let k_normed = self.norm(ex, &k_raw, k_norm)?;
                kv.calibrate_rope(ex, a.cache, (&q_normed, Some(&k_normed)), a.rope, factors)?;
                let k = ex.rope(&k_normed, &bt.positions, a.rope, factors)?;
                let v = self.norm(ex, &v_raw, &a.ones)?;
                new_kv = Some((k, v));
            } else {
                kv.calibrate_rope(ex, a.cache, (&q_normed, None), a.rope, factors)?;
            }
            let q = ex.rope(&q_normed, &bt.positions, a.rope, factors)?;
            let params = |pass: Pass| AttnParams {
                scale: 1.0,
                soft_cap: None,
                mask: pass.mask(a.window),
            };
            let new_kv = new_kv.as_ref().map(|(k, v)| (k, v));
            let o = match &split {
                Some(sp) => {
                    let canvas = Pass::Canvas(match pass {
                        Pass::Mixed { canvas, .. } => canvas,
                        _ => 0,
                    });
                    let p = (params(Pass::Encoder), params(canvas));
                    sp.attention(ex, &bt, kv, a.cache, &q, new_kv, p)?
                }
                None => {
                    let bt = match (&bt_images, a.window) {
                        (Some(bi), Some(_)) => bi,
                        _ => &bt,
                    };
                    attention(ex, bt, kv, a.cache, &q, new_kv, params(pass))?
                }
            };
            let o = ex.matmul(&o, &a.wo)?;
            x = ex.add(&x, &self.norm(ex, &o, &a.post_norm)?)?;
            // MLP (and the MoE block beside it).
            let res = x.clone();
            let mut y = layer.ffn.forward(ex, &res, &layer.ffn_norm, ns)?;
            if let Some(m) = &layer.moe {
                let y1 = self.norm(ex, &y, &m.post_norm_1)?;
                y = ex.add(&y1, &self.moe(ex, m, &res)?)?;
            }
            x = ex.add(&res, &self.norm(ex, &y, &layer.post_ffn_norm)?)?;
            // Per-layer inputs (a mixed pass has them for its encoder rows only).
            if let (Some(p), Some(inp)) = (&layer.ple, ple.get(l)) {
                let ple_add = |x: Tensor| -> Result<Tensor> {
                    let g = ex.unary(UnaryOp::GeluTanh, &ex.matmul(&x, &p.gate)?)?;
                    let g = ex.mul(&g, inp)?;
                    let y = self.norm(ex, &ex.matmul(&g, &p.proj)?, &p.post_norm)?;
                    ex.add(&x, &y)
                };
                x = match &split {
                    Some(sp) => sp.each(ex, &x, ple_add, Ok)?,
                    None => ple_add(x)?,
                };
            }
            let scale = |x: Tensor, s: f32| match s != 1.0 {
                true => ex.scale(&x, s),
                false => Ok(x),
            };
            let (enc, dec) = (layer.enc_scalar, layer.scalar);
            x = match &split {
                Some(sp) if enc != 1.0 || dec != 1.0 => {
                    sp.each(ex, &x, |x| scale(x, enc), |x| scale(x, dec))?
                }
                Some(_) => x,
                None => scale(x, pass.scalar(enc, dec))?,
            };
        }
        Ok(x)
    }
}

// ---- Hugging Face checkpoints ----

/// What absent and null fields mean (transformers' class defaults).
/// Gemma 4's RoPE when `rope_parameters` is absent: the class default.
pub(crate) const GEMMA4_ROPE: &str = r#"{"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
    "rope_theta": 1000000.0}}"#;

pub(crate) const GEMMA4: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    f("sliding_window", "512", true),
    none("final_logit_softcapping"),
    f("attention_k_eq_v", "false", true),
    f("num_kv_shared_layers", "0", true),
    f("hidden_size_per_layer_input", "256", true),
    f("enable_moe_block", "false", true),
    fd("rope_parameters", GEMMA4_ROPE),
];

/// Gemma 4 checkpoints (text, or the multimodal one with its vision tower): per-layer head
/// sizes, both RoPEs, K = V, KV sharing, per-layer embeddings, the MoE block.
pub const HF: HfFamily = HfFamily {
    defaults: &[("gemma4", GEMMA4), ("gemma4_text", GEMMA4)],
    vision: Some(super::gemma4v::hf_vision),
    ..HfFamily::new(
        &[("gemma4", "gemma4"), ("gemma4_text", "gemma4")],
        hf_meta,
        hf_names,
    )
};

/// The GGUF architecture of this file and its checkpoints.
pub const FAMILY: super::Family = super::Family {
    archs: &[("gemma4", build)],
    hf: &[&HF],
};

/// Gemma 4's tensor names (its per-layer embeddings too).
pub(crate) fn hf_names(hf: &str) -> Option<String> {
    layer_names(hf, true)
}

/// Gemma 4's tensor names; `ple`: with the per-layer embeddings' (DiffusionGemma has none).
pub(crate) fn layer_names(hf: &str, ple: bool) -> Option<String> {
    if ple {
        let top = match hf {
            "embed_tokens_per_layer.weight" => Some("per_layer_token_embd.weight"),
            "per_layer_model_projection.weight" => Some("per_layer_model_proj.weight"),
            "per_layer_projection_norm.weight" => Some("per_layer_proj_norm.weight"),
            _ => None,
        };
        if let Some(t) = top {
            return Some(t.into());
        }
    }
    match layer(hf)? {
        (l, "layer_scalar") => return Some(format!("blk.{l}.layer_output_scale")),
        (l, "router.scale") => return Some(format!("blk.{l}.ffn_gate_inp.scale")),
        (l, "router.per_expert_scale") => return Some(format!("blk.{l}.ffn_down_exps.scale")),
        _ => {}
    }
    layer_weight(hf, |suffix| {
        Some(match suffix {
            "post_attention_layernorm.weight" => "post_attention_norm",
            "pre_feedforward_layernorm.weight" => "ffn_norm",
            "post_feedforward_layernorm.weight" => "post_ffw_norm",
            "post_feedforward_layernorm_1.weight" => "post_ffw_norm_1",
            "post_feedforward_layernorm_2.weight" => "post_ffw_norm_2",
            "pre_feedforward_layernorm_2.weight" => "pre_ffw_norm_2",
            "router.proj.weight" => "ffn_gate_inp",
            "per_layer_input_gate.weight" if ple => "inp_gate",
            "per_layer_projection.weight" if ple => "proj",
            "post_per_layer_input_norm.weight" if ple => "post_norm",
            _ => return None,
        })
    })
}
