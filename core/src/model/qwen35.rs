//! Qwen3.5 / Qwen3.6 dense hybrids (`qwen35`): most layers are Gated DeltaNet (linear
//! attention with a short causal conv and a recurrent state per sequence), every few a gated
//! full-attention layer (output gate, QK-norm, partial rotate-half RoPE) over the paged KV
//! cache; each layer then has a SwiGLU MLP.
//!
//! A linear-attention layer, per token: `q, k, v = conv1d(x·W_qkv)` (SiLU), q and k
//! L2-normalised, `β = σ(x·W_b)`, `g = a·softplus(x·W_a + dt_bias)` with `a = -exp(A_log)`,
//! the gated delta rule over the state, then RMSNorm(o)·SiLU(x·W_z) and the output projection.
//! The conv and delta-rule states live in per-sequence slots the runner assigns; they are
//! gathered by slot before the layer and written back after it (slot 0 is the zero state of a
//! sequence's first step). The fused projections are split at load time (q/k/v and the query
//! and its gate), so every op sees whole tensors.
//!
//! Norm weights arrive with Qwen's `1 + w` already folded in (as llama.cpp's converter does),
//! except the gated norm, which is a plain one. GGUF files from llama.cpp and Hugging Face
//! checkpoints differ only in the order of the value heads, which is undone at load.

use super::blocks::{
    attention, check_batch, experts, gives, step_input, upload_batch, GatedFfn, Head, NormSpec,
    Taps,
};
use super::llama::{base_info, f32_or};
use super::weights::Weights;
use super::{DraftSource, Features, ForwardBatch, KvCaches, KvGroup, Model, ModelInfo, StepInput};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
use crate::load::hf::config::{Config, Meta};
use crate::load::hf::family::{f, layer, layer_weight, Field, HfFamily};
use crate::op::{AttnParams, GluOp, Mask, RopeMode, RopeParams, UnaryOp};
use crate::tensor::Tensor;

/// Tokens per chunk of the chunked delta rule in prefill.
const CHUNK: usize = 64;
/// The epsilon of the L2 norm on the DeltaNet queries and keys.
const L2_EPS: f32 = 1e-6;

struct Linear {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    conv_q: Tensor,
    conv_k: Tensor,
    conv_v: Tensor,
    w_z: Tensor,
    w_b: Tensor,
    w_a: Tensor,
    /// `-exp(A_log)` `[Hv]`.
    a: Tensor,
    dt_bias: Tensor,
    norm: Tensor,
    w_out: Tensor,
    /// Index of this layer's first state pool.
    pool: usize,
}

struct Full {
    wq: Tensor,
    w_gate: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    /// Index within the KV group.
    kv: usize,
}

enum Mixer {
    Linear(Box<Linear>),
    Full(Box<Full>),
}

/// The sparse MoE block (Qwen3.5-MoE): softmax top-k routing renormalised over the chosen
/// experts, SwiGLU experts, and a shared expert scaled by its own sigmoid gate.
struct Moe {
    router: Tensor,
    gate_exps: Tensor,
    up_exps: Tensor,
    down_exps: Tensor,
    k: usize,
    /// The shared expert and its gate `[1, E]`.
    shared: Option<(GatedFfn, Tensor)>,
}

enum Ffn {
    Dense(GatedFfn),
    Moe(Box<Moe>),
}

struct Layer {
    attn_norm: Tensor,
    mixer: Mixer,
    ffn_norm: Tensor,
    ffn: Ffn,
}

/// Sizes of the linear-attention layers.
#[derive(Copy, Clone, Debug)]
struct Ssm {
    /// Conv kernel width.
    kernel: usize,
    hk: usize,
    dk: usize,
    hv: usize,
    dv: usize,
}

pub struct Qwen35 {
    info: ModelInfo,
    eps: f32,
    rope: RopeParams,
    /// Which rotary pairs turn by an image token's row (`.0`) and column (`.1`) under M-RoPE
    /// (the rest by its time; text tokens turn by one position on all three).
    mrope: Option<(Vec<bool>, Vec<bool>)>,
    ssm: Ssm,
    head: Head,
    layers: Vec<Layer>,
    groups: Vec<KvGroup>,
    states: Vec<Vec<usize>>,
}

/// The M-RoPE pair sets of a file that has sections (`rope.dimension_sections`: the pairs
/// of time, height and width), interleaved as Qwen3.5 has them (pair j by height when
/// `j mod 3 = 1` and `j < 3·h`, by width when `j mod 3 = 2` and `j < 3·w`, else by time)
/// unless `rope.mrope_interleaved` is false (then consecutive: time, height, width). Sections
/// past the rotary pairs are cut off where they end, as transformers' slices are (a small
/// model converted with the released models' sections, `[11, 11, 10]`, keeps what fits).
fn mrope_pairs(f: &GgufFile, half: usize) -> Result<Option<(Vec<bool>, Vec<bool>)>> {
    let key = f.arch_key("rope.dimension_sections");
    if f.get(&key).is_none() {
        return Ok(None);
    }
    let s = f.get_i64_array(&key)?;
    let sec = |i: usize| s.get(i).copied().unwrap_or(0).clamp(0, 1 << 16) as usize;
    let (t, h, w) = (sec(0), sec(1), sec(2));
    if h + w == 0 {
        return Ok(None);
    }
    let interleaved = f
        .get(&f.arch_key("rope.mrope_interleaved"))
        .and_then(|v| v.as_bool())
        .unwrap_or(true);
    let (rows, cols) = (0..half)
        .map(|j| match interleaved {
            true => (j % 3 == 1 && j < 3 * h, j % 3 == 2 && j < 3 * w),
            false => ((t..t + h).contains(&j), (t + h..t + h + w).contains(&j)),
        })
        .unzip();
    Ok(Some((rows, cols)))
}

/// A batch's M-RoPE positions on the device: each row's time position (a text token's one
/// position: its index less what the images before it saved) and how far its row and column
/// positions are from it (0 for text).
struct Turns {
    time: Tensor,
    rows: (Tensor, Tensor),
    cols: (Tensor, Tensor),
}

impl Turns {
    /// `x` turned by time, then its row pairs by the row offset and its column pairs by the
    /// column offset (the other pairs' factors are infinite: no turn).
    fn apply(&self, ex: &Executor, x: &Tensor, rope: RopeParams) -> Result<Tensor> {
        let x = ex.rope(x, &self.time, rope, None)?;
        let x = ex.rope(&x, &self.rows.0, rope, Some(&self.rows.1))?;
        ex.rope(&x, &self.cols.0, rope, Some(&self.cols.1))
    }
}

/// Row `i` of a sequence under M-RoPE (transformers' `get_rope_index` for one sequence of
/// text and images): `(time, height, width)`. A text token's three are its index less, for
/// each image before it, the image's tokens minus its longer side; an image's tokens share
/// the time of its first, their height and width that plus their row and column.
pub fn mrope_position(i: usize, images: &[crate::model::ImageGrid]) -> [i64; 3] {
    let mut saved = 0i64;
    for g in images {
        let n = g.rows * g.cols;
        if i < g.start {
            break;
        }
        if i < g.start + n {
            let t = g.start as i64 - saved;
            let k = i - g.start;
            return [t, t + (k / g.cols) as i64, t + (k % g.cols) as i64];
        }
        saved += n as i64 - g.rows.max(g.cols) as i64;
    }
    let t = i as i64 - saved;
    [t, t, t]
}

impl Qwen35 {
    /// The batch's M-RoPE positions, when a sequence in it has images (else every row turns
    /// by its index, as text does).
    fn image_turns(&self, ex: &Executor, b: &ForwardBatch) -> Result<Option<Turns>> {
        let Some((rows, cols)) = &self.mrope else {
            return Ok(None);
        };
        if b.seqs.iter().all(|s| s.images.is_empty()) {
            return Ok(None);
        }
        let t = b.tokens.len();
        let mut p = vec![[0i64; 3]; t];
        for (r, &pos) in b.positions.iter().enumerate() {
            p[r] = [i64::from(pos); 3];
        }
        for s in &b.seqs {
            let rows = s.q_start.min(t)..(s.q_start + s.q_len).min(t);
            for (pr, &pos) in p[rows.clone()].iter_mut().zip(&b.positions[rows]) {
                *pr = mrope_position(pos.max(0) as usize, &s.images);
            }
        }
        let int = |v: i64| {
            i32::try_from(v).map_err(|_| Error::Model(format!("position {v} exceeds i32")))
        };
        let col = |k: usize| -> Result<Tensor> {
            let v = p
                .iter()
                .map(|x| int(x[k] - if k == 0 { 0 } else { x[0] }))
                .collect::<Result<Vec<_>>>()?;
            ex.upload_i32(&[t], &v)
        };
        let mask = |on: &[bool]| -> Result<Tensor> {
            let f: Vec<f32> = on
                .iter()
                .map(|&o| if o { 1.0 } else { f32::INFINITY })
                .collect();
            ex.upload_f32(&[f.len()], &f)
        };
        Ok(Some(Turns {
            time: col(0)?,
            rows: (col(1)?, mask(rows)?),
            cols: (col(2)?, mask(cols)?),
        }))
    }
}

pub fn build(f: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    Ok(Box::new(Qwen35::load(f, ex)?))
}

impl Qwen35 {
    fn load(f: &GgufFile, ex: &Executor) -> Result<Qwen35> {
        let mut info = base_info(f)?;
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&f.arch_key(k))? as usize) };
        let eps = f.get_f32(&f.arch_key("attention.layer_norm_rms_epsilon"))?;
        let ssm = Ssm {
            kernel: u("ssm.conv_kernel")?,
            hk: u("ssm.group_count")?,
            dk: u("ssm.state_size")?,
            hv: u("ssm.time_step_rank")?,
            dv: 0,
        };
        let ssm = Ssm {
            dv: u("ssm.inner_size")?.checked_div(ssm.hv).unwrap_or(0),
            ..ssm
        };
        let (e, hd, nh, nkv, ff, v) = (
            info.n_embd,
            info.head_dim,
            info.n_head,
            info.n_head_kv,
            info.n_ff,
            info.vocab,
        );
        let bad = |m: String| Error::load(f.path(), m);
        if nh == 0
            || nkv == 0
            || !nh.is_multiple_of(nkv)
            || ssm.hk == 0
            || !ssm.hv.is_multiple_of(ssm.hk)
        {
            return Err(bad(format!(
                "bad head counts: {nh} query / {nkv} KV heads, {} key / {} value heads in the linear layers",
                ssm.hk, ssm.hv
            )));
        }
        if ssm.kernel < 2 {
            return Err(bad(format!("conv kernel of {} taps", ssm.kernel)));
        }
        let full: Vec<bool> = match f.get(&f.arch_key("attention.recurrent_layers")) {
            Some(Value::Array(a)) if a.len() == info.n_layer => {
                a.iter().map(|x| !matches!(x, Value::Bool(true))).collect()
            }
            Some(_) => {
                return Err(bad(format!(
                    "{} must list one flag per layer",
                    f.arch_key("attention.recurrent_layers")
                )))
            }
            None => {
                let every = match f.get(&f.arch_key("full_attention_interval")) {
                    Some(_) => u("full_attention_interval")?.max(1),
                    None => 4,
                };
                (0..info.n_layer).map(|l| (l + 1) % every == 0).collect()
            }
        };
        // llama.cpp's GGUF files order the value heads tiled over the key heads (value head g
        // uses key head g mod Hk); Hugging Face's, and kiln's ops, group them (value head j
        // uses key head j / (Hv/Hk)). `v_order[j]` is where grouped head j sits in the file.
        let tiled = f.get("kiln.source").and_then(|v| v.as_str()) != Some("huggingface");
        let r = ssm.hv / ssm.hk;
        let v_order: Vec<usize> = (0..ssm.hv)
            .map(|j| if tiled { (j % r) * ssm.hk + j / r } else { j })
            .collect();
        let heads = |width: usize, base: usize| -> Vec<std::ops::Range<usize>> {
            v_order
                .iter()
                .map(|&g| base + g * width..base + (g + 1) * width)
                .collect()
        };
        let rot = match f.get(&f.arch_key("rope.dimension_count")) {
            Some(_) => u("rope.dimension_count")?,
            None => hd,
        };
        let rope = RopeParams::new(
            RopeMode::Neox,
            rot,
            f32_or(f, &f.arch_key("rope.freq_base"), 10_000.0)?,
        );
        let mrope = mrope_pairs(f, rope.n_rot / 2)?;
        let full_layers: Vec<usize> = (0..info.n_layer).filter(|&l| full[l]).collect();
        let groups = if full_layers.is_empty() {
            Vec::new()
        } else {
            vec![KvGroup {
                layers: full_layers,
                window: None,
                n_kv_heads: nkv,
                head_dim: hd,
                v_head_dim: hd,
            }]
        };
        let (kd, vd) = (ssm.hk * ssm.dk, ssm.hv * ssm.dv);
        let c = 2 * kd + vd;
        let km1 = ssm.kernel - 1;
        let mut w = Weights::new(f, ex);
        let head = Head::load(&mut w, v, e)?;
        // (experts, used per token, expert FFN width, shared expert width) for MoE models.
        let experts = match f.get(&f.arch_key("expert_count")) {
            Some(_) => {
                let ne = u("expert_count")?;
                let k = u("expert_used_count")?;
                if k == 0 || k > ne {
                    return Err(bad(format!("{k} experts per token of {ne}")));
                }
                let shared = match f.get(&f.arch_key("expert_shared_feed_forward_length")) {
                    Some(_) => u("expert_shared_feed_forward_length")?,
                    None => 0,
                };
                Some((ne, k, u("expert_feed_forward_length")?, shared))
            }
            None => None,
        };
        let mut layers = Vec::with_capacity(info.n_layer);
        let mut states = Vec::new();
        let mut n_full = 0;
        for (l, &is_full) in full.iter().enumerate() {
            let n = |s: &str| format!("blk.{l}.{s}");
            let mixer = if is_full {
                // q_proj holds each head's query then its output gate.
                let (q, g): (Vec<_>, Vec<_>) = (0..nh)
                    .map(|h| {
                        (
                            2 * h * hd..2 * h * hd + hd,
                            2 * h * hd + hd..2 * (h + 1) * hd,
                        )
                    })
                    .unzip();
                let qn = n("attn_q.weight");
                let m = Full {
                    wq: w.get_rows(&qn, &[2 * nh * hd, e], &q)?,
                    w_gate: w.get_rows(&qn, &[2 * nh * hd, e], &g)?,
                    wk: w.get(&n("attn_k.weight"), &[nkv * hd, e])?,
                    wv: w.get(&n("attn_v.weight"), &[nkv * hd, e])?,
                    wo: w.get(&n("attn_output.weight"), &[e, nh * hd])?,
                    q_norm: w.get(&n("attn_q_norm.weight"), &[hd])?,
                    k_norm: w.get(&n("attn_k_norm.weight"), &[hd])?,
                    kv: n_full,
                };
                n_full += 1;
                Mixer::Full(Box::new(m))
            } else {
                let qkv = n("attn_qkv.weight");
                let conv = n("ssm_conv1d.weight");
                let parts = [0..kd, kd..2 * kd];
                let v_rows = heads(ssm.dv, 2 * kd);
                let per_head = |w: &mut Weights, name: &str| -> Result<Tensor> {
                    let v = w.host_f32(name, ssm.hv)?;
                    let v: Vec<f32> = v_order.iter().map(|&g| v[g]).collect();
                    ex.upload_f32(&[ssm.hv], &v)
                };
                let pool = states.len();
                states.extend([
                    vec![km1, kd],
                    vec![km1, kd],
                    vec![km1, vd],
                    vec![ssm.hv, ssm.dk, ssm.dv],
                ]);
                let m = Linear {
                    wq: w.get_rows(&qkv, &[c, e], &parts[..1])?,
                    wk: w.get_rows(&qkv, &[c, e], &parts[1..2])?,
                    wv: w.get_rows(&qkv, &[c, e], &v_rows)?,
                    conv_q: w.get_rows(&conv, &[c, ssm.kernel], &parts[..1])?,
                    conv_k: w.get_rows(&conv, &[c, ssm.kernel], &parts[1..2])?,
                    conv_v: w.get_rows(&conv, &[c, ssm.kernel], &v_rows)?,
                    w_z: w.get_rows(&n("attn_gate.weight"), &[vd, e], &heads(ssm.dv, 0))?,
                    w_b: w.get_rows(&n("ssm_beta.weight"), &[ssm.hv, e], &heads(1, 0))?,
                    w_a: w.get_rows(&n("ssm_alpha.weight"), &[ssm.hv, e], &heads(1, 0))?,
                    a: per_head(&mut w, &n("ssm_a"))?,
                    dt_bias: per_head(&mut w, &n("ssm_dt.bias"))?,
                    norm: w.get(&n("ssm_norm.weight"), &[ssm.dv])?,
                    w_out: w.get_col_ranges(&n("ssm_out.weight"), &[e, vd], &heads(ssm.dv, 0))?,
                    pool,
                };
                Mixer::Linear(Box::new(m))
            };
            let ffn = match experts {
                Some((ne, k, fe, fs)) => {
                    let shared = if fs > 0 {
                        Some((
                            GatedFfn {
                                gate: w.get(&n("ffn_gate_shexp.weight"), &[fs, e])?,
                                up: w.get(&n("ffn_up_shexp.weight"), &[fs, e])?,
                                down: w.get(&n("ffn_down_shexp.weight"), &[e, fs])?,
                                act: GluOp::SwiGlu,
                            },
                            w.get(&n("ffn_gate_inp_shexp.weight"), &[1, e])?,
                        ))
                    } else {
                        None
                    };
                    Ffn::Moe(Box::new(Moe {
                        router: w.get(&n("ffn_gate_inp.weight"), &[ne, e])?,
                        gate_exps: w.get(&n("ffn_gate_exps.weight"), &[ne, fe, e])?,
                        up_exps: w.get(&n("ffn_up_exps.weight"), &[ne, fe, e])?,
                        down_exps: w.get(&n("ffn_down_exps.weight"), &[ne, e, fe])?,
                        k,
                        shared,
                    }))
                }
                None => Ffn::Dense(GatedFfn::load(&mut w, l, e, ff, GluOp::SwiGlu)?),
            };
            layers.push(Layer {
                attn_norm: w.get(&n("attn_norm.weight"), &[e])?,
                mixer,
                ffn_norm: w.get(&n("post_attention_norm.weight"), &[e])?,
                ffn,
            });
        }
        w.describe(&mut info);
        Ok(Qwen35 {
            info,
            eps,
            rope,
            mrope,
            ssm,
            head,
            layers,
            groups,
            states,
        })
    }
}

/// Per forward: the batch's slots in the state pools.
struct StateIo {
    /// `[S]`: the slot each sequence's state is read from (0, the zero state, on its first
    /// step).
    read: Tensor,
    /// `[S]`: the slot it is written back to.
    write: Tensor,
}

impl Qwen35 {
    /// Pool `p`'s rows for this batch, shaped `[S, shape…]`.
    fn gather(&self, ex: &Executor, kv: &KvCaches, p: usize, io: &StateIo) -> Result<Tensor> {
        let pool = kv
            .states
            .get(p)
            .ok_or_else(|| Error::Model(format!("no state pool {p}")))?;
        let n: usize = self.states[p].iter().product();
        let slots = pool.shape().dims()[0];
        let rows = ex.get_rows(&pool.reshape([slots, n])?, &io.read)?;
        let s = rows.shape().dims()[0];
        let mut shape = vec![s];
        shape.extend_from_slice(&self.states[p]);
        rows.reshape(shape)
    }

    /// Writes two states of the batch back into pools `p` and `p + 1`.
    fn scatter(
        &self,
        ex: &Executor,
        kv: &KvCaches,
        p: usize,
        a: &Tensor,
        b: &Tensor,
        io: &StateIo,
    ) -> Result<()> {
        let s = a.shape().dims()[0];
        let flat = |t: &Tensor| t.reshape([s, 1, t.numel() / s.max(1)]);
        ex.kv_write(
            &flat(a)?,
            &flat(b)?,
            &io.write,
            &kv.states[p],
            &kv.states[p + 1],
        )
    }

    fn linear(
        &self,
        ex: &Executor,
        m: &Linear,
        h: &Tensor,
        kv: &KvCaches,
        io: &StateIo,
        seq_start: &Tensor,
    ) -> Result<Tensor> {
        let t = h.shape().dims()[0];
        let s = self.ssm;
        let conv = |x: &Tensor, w: &Tensor, pool: usize| -> Result<(Tensor, Tensor)> {
            let state = self.gather(ex, kv, pool, io)?;
            ex.conv1d(true, x, w, &state, seq_start)
        };
        let (q, cq) = conv(&ex.matmul(h, &m.wq)?, &m.conv_q, m.pool)?;
        let (k, ck) = conv(&ex.matmul(h, &m.wk)?, &m.conv_k, m.pool + 1)?;
        let (v, cv) = conv(&ex.matmul(h, &m.wv)?, &m.conv_v, m.pool + 2)?;
        let q = ex.l2_norm(&q.reshape([t, s.hk, s.dk])?, L2_EPS)?;
        let k = ex.l2_norm(&k.reshape([t, s.hk, s.dk])?, L2_EPS)?;
        let v = v.reshape([t, s.hv, s.dv])?;
        let beta = ex.unary(UnaryOp::Sigmoid, &ex.matmul(h, &m.w_b)?)?;
        let a = ex.add(&ex.matmul(h, &m.w_a)?, &m.dt_bias)?;
        let g = ex.mul(&ex.unary(UnaryOp::Softplus, &a)?, &m.a)?;
        let state = self.gather(ex, kv, m.pool + 3, io)?;
        let scale = 1.0 / (s.dk as f32).sqrt();
        let chunk = (t > 1).then_some(CHUNK);
        let (o, st) = ex.delta_net(scale, chunk, [&q, &k, &v], &g, &beta, &state, seq_start)?;
        self.scatter(ex, kv, m.pool, &cq, &ck, io)?;
        self.scatter(ex, kv, m.pool + 2, &cv, &st, io)?;
        let o = ex.rms_norm(&o, &m.norm, self.eps, false)?;
        let z = ex.unary(UnaryOp::Silu, &ex.matmul(h, &m.w_z)?)?;
        let o = ex.mul(&o.reshape([t, s.hv * s.dv])?, &z)?;
        ex.matmul(&o, &m.w_out)
    }
}

/// The MoE block on `h [T, E]`.
fn moe(ex: &Executor, m: &Moe, h: &Tensor) -> Result<Tensor> {
    let t = h.shape().dims()[0];
    let logits = ex.matmul(h, &m.router)?;
    let (weights, ids) = ex.moe_route(&logits, m.k, crate::op::MoeGating::Softmax, true)?;
    let exps = (&m.gate_exps, &m.up_exps, &m.down_exps);
    let mut out = experts(ex, h, exps, GluOp::SwiGlu, &ids, &weights)?;
    if let Some((ffn, sg)) = &m.shared {
        let s = ffn.forward_on(ex, h)?;
        let e = s.shape().dims()[1];
        let gate = ex.unary(UnaryOp::Sigmoid, &ex.matmul(h, sg)?)?;
        let s = ex.moe_sum(&s.reshape([t, 1, e])?, &gate)?;
        out = ex.add(&out, &s)?;
    }
    Ok(out)
}

impl Model for Qwen35 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }

    fn state_shapes(&self) -> Vec<Vec<usize>> {
        self.states.clone()
    }

    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        let x = self.layers_pass(ex, b, kv, &mut Taps::none())?;
        self.head.logits(ex, &x, b, self.ns(), None)
    }

    fn forward_features(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        f: &Features,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut taps = Taps::new(f, self.info.n_layer)?;
        let x = self.layers_pass(ex, b, kv, &mut taps)?;
        let ns = self.ns();
        let logits = self.head.logits(ex, &x, b, ns, None)?;
        Ok((logits, taps.finish(ex, &x, &self.head, ns)?))
    }

    fn gives(&self, f: &Features) -> bool {
        gives(f, self.info.n_layer)
    }

    fn draft_source(&self) -> Option<DraftSource> {
        let i = &self.info;
        Some(DraftSource {
            tok_embd: self.head.tok_embd.clone(),
            embed_scale: 1.0,
            output: self.head.output.clone(),
            hidden: i.n_embd,
            n_layer: i.n_layer,
            groups: self.groups.clone(),
            sliding: None,
            full: None,
        })
    }
}

impl Qwen35 {
    fn ns(&self) -> NormSpec {
        NormSpec {
            eps: self.eps,
            one_plus: false,
        }
    }

    /// The layers over the batch's embeddings: the last hidden state (`taps` collects the
    /// layer outputs a drafter reads).
    fn layers_pass(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        taps: &mut Taps,
    ) -> Result<Tensor> {
        let i = &self.info;
        let t = check_batch(b, i.vocab)?;
        let bt = upload_batch(ex, b, self.groups.len())?;
        if b.seqs.iter().any(|s| s.state_slot == 0) {
            return Err(Error::Model(
                "a sequence has no recurrent-state slot".into(),
            ));
        }
        let io = StateIo {
            read: step_input(ex, b, StepInput::StateRead)?,
            write: step_input(ex, b, StepInput::StateWrite)?,
        };
        let (x, _) = self.head.embed(ex, b)?;
        // An image's rows take its soft tokens (as they are: no embedding scale here).
        let mut x = super::blocks::splice_embeds(ex, &x, b)?;
        let (hd, nh, nkv) = (i.head_dim, i.n_head, i.n_head_kv);
        let turns = self.image_turns(ex, b)?;
        let ns = NormSpec {
            eps: self.eps,
            one_plus: false,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let h = ex.rms_norm(&x, &layer.attn_norm, self.eps, false)?;
            let o = match &layer.mixer {
                Mixer::Linear(m) => self.linear(ex, m, &h, kv, &io, &bt.q_start)?,
                Mixer::Full(m) => {
                    let q = ex.matmul(&h, &m.wq)?.reshape([t, nh, hd])?;
                    let k = ex.matmul(&h, &m.wk)?.reshape([t, nkv, hd])?;
                    let v = ex.matmul(&h, &m.wv)?.reshape([t, nkv, hd])?;
                    let q = ex.rms_norm(&q, &m.q_norm, self.eps, false)?;
                    let k = ex.rms_norm(&k, &m.k_norm, self.eps, false)?;
                    if turns.is_none() {
                        kv.calibrate_rope(ex, (0, m.kv), (&q, Some(&k)), self.rope, None)?;
                    }
                    let (q, k) = match &turns {
                        None => (
                            ex.rope(&q, &bt.positions, self.rope, None)?,
                            ex.rope(&k, &bt.positions, self.rope, None)?,
                        ),
                        Some(tu) => (tu.apply(ex, &q, self.rope)?, tu.apply(ex, &k, self.rope)?),
                    };
                    let p = AttnParams {
                        scale: 1.0 / (hd as f32).sqrt(),
                        soft_cap: None,
                        mask: Mask::Causal,
                    };
                    let a = attention(ex, &bt, kv, (0, m.kv), &q, Some((&k, &v)), p)?;
                    let gate = ex.unary(UnaryOp::Sigmoid, &ex.matmul(&h, &m.w_gate)?)?;
                    let a = ex.mul(&a, &gate)?;
                    ex.matmul(&a, &m.wo)?
                }
            };
            x = ex.add(&x, &o)?;
            let d = match &layer.ffn {
                Ffn::Dense(f) => f.forward(ex, &x, &layer.ffn_norm, ns)?,
                Ffn::Moe(m) => moe(ex, m, &ex.rms_norm(&x, &layer.ffn_norm, self.eps, false)?)?,
            };
            x = ex.add(&x, &d)?;
            taps.after(l, &x);
        }
        Ok(x)
    }
}

// ---- Hugging Face checkpoints ----

/// What absent and null fields mean (transformers' class defaults).
const QWEN35: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "32768", true),
    f("head_dim", "256", true),
    f("num_key_value_heads", "4", true),
    f("linear_conv_kernel_dim", "4", true),
    f("linear_key_head_dim", "128", true),
    f("linear_num_key_heads", "16", true),
    f("linear_num_value_heads", "32", true),
    f("linear_value_head_dim", "128", true),
];

const QWEN35_MOE: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "32768", true),
    f("head_dim", "256", true),
    f("num_key_value_heads", "2", true),
    f("linear_conv_kernel_dim", "4", true),
    f("linear_key_head_dim", "128", true),
    f("linear_num_key_heads", "16", true),
    f("linear_num_value_heads", "32", true),
    f("linear_value_head_dim", "128", true),
    f("num_experts", "256", true),
    f("num_experts_per_tok", "8", true),
    f("moe_intermediate_size", "512", true),
    f("shared_expert_intermediate_size", "512", true),
];

/// Qwen3.5 / 3.6 checkpoints, dense and MoE: norms stored for `x·(1+w)` but the gated one,
/// the linear-attention layers' tensors, the layer pattern.
pub const HF: HfFamily = HfFamily {
    one_centred_norms: Some(&["ssm_norm.weight"]),
    vision: Some(super::qwen35v::hf_vision),
    defaults: &[
        ("qwen3_5", QWEN35),
        ("qwen3_5_text", QWEN35),
        ("qwen3_5_moe", QWEN35_MOE),
        ("qwen3_5_moe_text", QWEN35_MOE),
    ],
    ..HfFamily::new(
        &[
            ("qwen3_5", "qwen35"),
            ("qwen3_5_text", "qwen35"),
            ("qwen3_5_moe", "qwen35moe"),
            ("qwen3_5_moe_text", "qwen35moe"),
        ],
        hf_meta,
        hf_names,
    )
};

/// The GGUF architectures of this file and its checkpoints.
pub const FAMILY: super::Family = super::Family {
    archs: &[("qwen35", build), ("qwen35moe", build)],
    hf: &[&HF],
};

fn hf_meta(c: &Config, m: &mut Meta) -> Result<()> {
    m.f("rope.freq_base", c.rope_theta(None).unwrap_or(10_000.0));
    let (kind, _) = c.rope_scaling(None)?;
    if kind != "none" {
        return Err(c.err("Qwen3.5 RoPE scaling is not supported yet"));
    }
    let nh = c.usize("num_attention_heads")?;
    let hd = c.usize_or("head_dim", c.usize("hidden_size")? / nh)?;
    let partial = c
        .get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"))
        .or_else(|| c.get("partial_rotary_factor"))
        .and_then(serde_json::Value::as_f64)
        // The class default: a quarter of each head rotates.
        .unwrap_or(0.25);
    m.u("rope.dimension_count", (hd as f64 * partial) as usize);
    let rope = c.get("rope_parameters");
    if let Some(s) = rope
        .and_then(|p| p.get("mrope_section"))
        .and_then(serde_json::Value::as_array)
    {
        let s: Vec<Value> = s
            .iter()
            .map(|x| x.as_i64().map(|v| Value::I32(v.clamp(0, 1 << 16) as i32)))
            .collect::<Option<_>>()
            .ok_or_else(|| c.err("config.json: mrope_section must hold integers"))?;
        m.set("rope.dimension_sections", Value::Array(s));
        let interleaved = rope
            .and_then(|p| p.get("mrope_interleaved"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true);
        m.set("rope.mrope_interleaved", Value::Bool(interleaved));
    }
    m.u("ssm.conv_kernel", c.usize("linear_conv_kernel_dim")?);
    m.u("ssm.state_size", c.usize("linear_key_head_dim")?);
    m.u("ssm.group_count", c.usize("linear_num_key_heads")?);
    m.u("ssm.time_step_rank", c.usize("linear_num_value_heads")?);
    m.u(
        "ssm.inner_size",
        c.usize("linear_value_head_dim")? * c.usize("linear_num_value_heads")?,
    );
    let layers = c.usize("num_hidden_layers")?;
    let types = match c.layer_types() {
        Some(t) => t,
        None => {
            let every = c.usize_or("full_attention_interval", 4)?.max(1);
            (0..layers)
                .map(|l| match (l + 1) % every {
                    0 => "full_attention".to_string(),
                    _ => "linear_attention".to_string(),
                })
                .collect()
        }
    };
    if types.len() != layers {
        return Err(c.err("config.json: layer_types must list every layer"));
    }
    let linear = types.iter().map(|t| Value::Bool(t != "full_attention"));
    m.set("attention.recurrent_layers", Value::Array(linear.collect()));
    Ok(())
}

fn hf_names(hf: &str) -> Option<String> {
    match layer(hf)? {
        (l, "linear_attn.A_log") => return Some(format!("blk.{l}.ssm_a")),
        (l, "linear_attn.dt_bias") => return Some(format!("blk.{l}.ssm_dt.bias")),
        _ => {}
    }
    layer_weight(hf, |suffix| {
        Some(match suffix {
            "linear_attn.in_proj_qkv.weight" => "attn_qkv",
            "mlp.gate.weight" => "ffn_gate_inp",
            "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp",
            "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp",
            "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp",
            "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp",
            "linear_attn.in_proj_z.weight" => "attn_gate",
            "linear_attn.in_proj_b.weight" => "ssm_beta",
            "linear_attn.in_proj_a.weight" => "ssm_alpha",
            "linear_attn.conv1d.weight" => "ssm_conv1d",
            "linear_attn.norm.weight" => "ssm_norm",
            "linear_attn.out_proj.weight" => "ssm_out",
            "post_attention_layernorm.weight" => "post_attention_norm",
            _ => return None,
        })
    })
}
