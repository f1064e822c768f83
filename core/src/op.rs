//! The closed set of ops every backend implements or falls back on, and `OpDesc`, what a
//! backend's `supports_op` sees.
//!
//! Tensor layouts are row-major, last dimension contiguous. Weights are `[out, in]` (ggml's
//! order: a row of the weight is one output feature), so `MatMul` computes `y = x · Wᵀ`.
//! Float inputs and outputs of an op may each be f32, f16 or bf16 unless noted; the CPU
//! reference computes in f32 whatever they are. Index tensors are i32.
//!
//! Fused ops are variants too. The CPU implements each as the composition of its plain ops, so
//! a backend's fused kernel always has an oracle.

pub mod canvas;
mod check;

use std::fmt;

use crate::error::Result;
use crate::tensor::TensorDesc;

/// Elementwise activations.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum UnaryOp {
    #[default]
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    Sigmoid,
    /// `ln(1 + e^x)`, linear above 20 as torch does.
    Softplus,
    Exp,
    Neg,
    Tanh,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 7] = [
        UnaryOp::Silu,
        UnaryOp::GeluTanh,
        UnaryOp::Sigmoid,
        UnaryOp::Softplus,
        UnaryOp::Exp,
        UnaryOp::Neg,
        UnaryOp::Tanh,
    ];
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Silu => "silu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Softplus => "softplus",
            UnaryOp::Exp => "exp",
            UnaryOp::Neg => "neg",
            UnaryOp::Tanh => "tanh",
        }
    }
}

/// Gated linear units: `act(gate) * up`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum GluOp {
    /// SiLU gate (Llama, Qwen).
    #[default]
    SwiGlu,
    /// GELU-tanh gate (Gemma).
    GeGlu,
}

impl GluOp {
    pub fn activation(self) -> UnaryOp {
        match self {
            GluOp::SwiGlu => UnaryOp::Silu,
            GluOp::GeGlu => UnaryOp::GeluTanh,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GluOp::SwiGlu => "swiglu",
            GluOp::GeGlu => "geglu",
        }
    }
}

/// How rotary pairs are formed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml's "normal", GGUF Llama weights).
    #[default]
    Normal,
    /// Halves `(x[i], x[i + n_rot/2])` (GPT-NeoX, Hugging Face `rotate_half`).
    Neox,
}

/// Rotary position embedding of `x [T, H, D]` at positions `pos [T]`.
///
/// Only the first `n_rot` dims of each head rotate (partial rotary); the rest pass through.
/// Pair `i` turns by `pos · freq_scale · base^(-2i/n_rot) / f[i]`, where `f` is the optional
/// third input `freq_factors [n_rot/2]` (Llama-3 style scaling; an infinite factor leaves a
/// pair unrotated), and cos/sin are multiplied by `attn_factor` (YaRN's magnitude scale).
#[derive(Copy, Clone, Debug, PartialEq, Default)]
pub struct RopeParams {
    pub mode: RopeMode,
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    pub attn_factor: f32,
}

impl RopeParams {
    pub fn new(mode: RopeMode, n_rot: usize, base: f32) -> Self {
        RopeParams {
            mode,
            n_rot,
            base,
            freq_scale: 1.0,
            attn_factor: 1.0,
        }
    }
}

/// Which keys a query may see. Positions are absolute: key `j`, query at position `p`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mask {
    /// `j <= p`.
    #[default]
    Causal,
    /// `j <= p && p - j < window` (Gemma's and Mistral's sliding window).
    SlidingWindow(usize),
    /// Every key.
    Bidirectional,
    /// Causal, except the first `n` positions see each other: `j <= p || j < n` (prefix LM).
    PrefixBidirectional(usize),
    /// Every query sees the last `n` keys of its sequence, whatever its own position:
    /// `j >= len - n` (DiffusionGemma's decoder: a canvas over the tail of a sliding window).
    Lookback(usize),
}

impl Mask {
    /// Whether a query at position `p` sees the key at position `j` of `len` keys.
    #[inline]
    pub fn allows(self, p: usize, j: usize, len: usize) -> bool {
        j < len
            && match self {
                Mask::Causal => j <= p,
                Mask::SlidingWindow(w) => j <= p && p - j < w,
                Mask::Bidirectional => true,
                Mask::PrefixBidirectional(n) => j <= p || j < n,
                Mask::Lookback(n) => j + n >= len,
            }
    }
    /// The key positions a query at `p` can see, out of `0..len`, as a half-open range
    /// (every mask above selects one contiguous run of keys).
    #[inline]
    pub fn key_range(self, p: usize, len: usize) -> (usize, usize) {
        match self {
            Mask::Causal => (0, (p + 1).min(len)),
            Mask::SlidingWindow(w) => ((p + 1).saturating_sub(w), (p + 1).min(len)),
            Mask::Bidirectional => (0, len),
            Mask::PrefixBidirectional(n) => (0, (p + 1).max(n).min(len)),
            Mask::Lookback(n) => (len.saturating_sub(n), len),
        }
    }
}

/// Attention parameters shared by the contiguous and the paged form.
#[derive(Copy, Clone, Debug, PartialEq, Default)]
pub struct AttnParams {
    /// Multiplies `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// `cap · tanh(s / cap)` on the scaled logits (Gemma 2).
    pub soft_cap: Option<f32>,
    pub mask: Mask,
}

/// Gating of MoE router logits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum MoeGating {
    #[default]
    Softmax,
    Sigmoid,
}

/// The most weights one [`Op::RmsNormMatMul`] takes (Q, K and V).
pub const MAX_SHARED_NORM: usize = 3;

/// The op set. Each variant's doc gives its inputs → outputs; `[a, b]` are shapes.
#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum Op {
    /// `x [.., K]` (float), `w [N, K]` (any dtype) → `y [.., N]`.
    MatMul,
    /// Matmul by expert id. `x [T, K]` or `[T, k, K]`, `w [E, N, K]` (any dtype),
    /// `ids [T, k]` → `y [T, k, N]`, where `y[t, i] = x[t, i or 0] · w[ids[t, i]]ᵀ`.
    MatMulId,
    /// Embedding lookup: `table [V, D]` (any dtype), `ids [N]` → `[N, D]` (float).
    GetRows,
    /// `a [.., D] + b`, with `b` of `a`'s shape or broadcast from `[D]` or `[R', D]` (rows repeat).
    Add,
    /// `a * b`, broadcast as in `Add`.
    Mul,
    /// `x * scale`.
    Scale(f32),
    Unary(UnaryOp),
    /// `gate [.., F]`, `up [.., F]` → `act(gate) * up`.
    Glu(GluOp),
    /// `x [.., D]`, `w [D]` → `x / rms(x) * w`, or `* (1 + w)` when `one_plus` (Gemma).
    RmsNorm {
        eps: f32,
        one_plus: bool,
    },
    /// `x [.., D]` → `x / sqrt(Σx² + eps)` per row (Qwen3.5's `l2norm`).
    L2Norm {
        eps: f32,
    },
    /// `x [T, H, D]`, `pos [T]`, optional `freq_factors [n_rot/2]` (f32) → `[T, H, D]`.
    Rope(RopeParams),
    /// Row softmax of `x [.., N] * scale`, soft-capped, plus an optional additive `mask [R', N]`
    /// (f32; row `r` of `x` uses mask row `r % R'`).
    Softmax {
        scale: f32,
        soft_cap: Option<f32>,
    },
    /// Attention over contiguous K/V: `q [T, Hq, D]`, `k [S, Hkv, D]`, `v [S, Hkv, Dv]` →
    /// `[T, Hq, Dv]`. Query `i` is at position `S - T + i`; `Hq` is a multiple of `Hkv` (GQA).
    Attention(AttnParams),
    /// Attention through a block table. `q [T, Hq, D]`, `k_cache [B, bs, Hkv, D]`,
    /// `v_cache [B, bs, Hkv, Dv]` (any float or block dtype whose blocks fit a head),
    /// `block_table [S, max_blocks]`, `seq_lens [S]` (context length after this step),
    /// `q_start [S + 1]` (query rows of sequence `s` are `q_start[s]..q_start[s+1]`, the last
    /// ones of its context) → `[T, Hq, Dv]`. Decode is one query per sequence.
    PagedAttention(AttnParams),
    /// Writes `k [T, Hkv, D]`, `v [T, Hkv, Dv]` into the caches at `slots [T]`
    /// (`slot = block · bs + offset`; a negative slot is skipped). Outputs `k_cache`, `v_cache`
    /// are updated in place.
    KvWrite,
    /// `x [.., N]` → `[..]` (i32), the first index of the maximum.
    Argmax,
    /// `x [.., N]` → values `[.., k]` (f32), indices `[.., k]` (i32), largest first, ties to
    /// the lower index.
    TopK(usize),
    /// Causal depthwise conv1d with carried state over a batch of sequences. `x [T, C]`,
    /// `w [C, K]`, `state [S, K-1, C]` (the last K-1 inputs before each sequence),
    /// `seq_start [S + 1]` → `y [T, C]`, `state_out [S, K-1, C]`. SiLU on the output when `silu`.
    Conv1d {
        silu: bool,
    },
    /// The Gated DeltaNet recurrence over a batch of sequences. `q [T, Hk, Dk]`, `k [T, Hk, Dk]`,
    /// `v [T, Hv, Dv]`, `g [T, Hv]` (log decay), `beta [T, Hv]`, `state [S, Hv, Dk, Dv]`,
    /// `seq_start [S + 1]` → `o [T, Hv, Dv]`, `state_out [S, Hv, Dk, Dv]`. `Hv` is a multiple
    /// of `Hk`. Per token: `St = e^g·S; St += k ⊗ β(v − Stᵀk); o = Stᵀ(q·scale)`.
    /// `chunk: Some(c)` asks for the chunked (WY) algorithm with chunks of `c` tokens: the same
    /// function, computed the way prefill kernels do.
    DeltaNet {
        scale: f32,
        chunk: Option<usize>,
    },
    /// Router: `logits [T, E]` → weights `[T, k]` (f32), ids `[T, k]` (i32), best first. Top-k of
    /// the softmax or sigmoid of the logits, renormalised to sum 1 when `normalize`.
    MoeRoute {
        k: usize,
        gating: MoeGating,
        normalize: bool,
    },
    /// Mixing expert outputs: `y [T, k, N]`, `w [T, k]` (f32) → `[T, N]`, `Σᵢ w[t, i]·y[t, i]`.
    MoeSum,
    /// A soft embedding: `logits [T, V]` (f32), `table [V, E]` (any dtype) → `[T, E]`,
    /// `Σⱼ softmax(logits[t])ⱼ · table[j]` over every row (`top_k` 0 or ≥ V), or over the
    /// `top_k` largest logits with the softmax taken over those (DiffusionGemma's
    /// self-conditioning).
    SoftEmbedding {
        top_k: usize,
    },
    /// One denoising draw over a canvas (DiffusionGemma): `logits [T, V]` (f32) → `processed
    /// [T, V]` (f32, `logits · scale`, where `scale` is 1 / the step's temperature), `argmax
    /// [T]` (i32, of the logits, first of equal maxima in IEEE total order), `drawn [T]` (i32,
    /// a draw from `softmax(processed)`: the Gumbel-max argmax of `processed + g`, with `g =
    /// gumbel(seed, row, column)` of [`canvas`]), `entropy [T]` (f32, nats, of
    /// `softmax(processed)`).
    CanvasDraw {
        scale: f32,
        seed: u64,
    },
    /// Entropy-bound acceptance of a canvas's draws, in place. `argmax [T]`, `drawn [T]` (i32),
    /// `entropy [T]` (f32) → output 0 `canvas [T]` (i32): `drawn` where accepted, else
    /// re-noised with [`canvas::noise_token`]`(seed, i, vocab)`; output 1 `history [S, T]`
    /// (i32, read and updated): the last `stability` argmax canvases, oldest first, `-1`
    /// where none yet (`S = max(stability, 1)`); output 2 `status [2]` (i32): positions
    /// accepted, and 1 when denoising stops here. Positions are ranked by (entropy, index)
    /// and accepted while the running f32 sum of the ranked entropies less the position's own
    /// stays within `entropy_bound`; denoising stops when every kept history row equals
    /// `argmax` and the f32 sum of all entropies, in rank order, is under
    /// `confidence · T` (mean entropy under `confidence`). `T` is at most
    /// [`canvas::MAX_CANVAS`].
    CanvasAccept {
        entropy_bound: f32,
        confidence: f32,
        stability: usize,
        vocab: usize,
        seed: u64,
    },
    /// Float → float of another (or the same) dtype, same shape.
    Cast,
    /// Same dtype and shape: a plain copy (views make reshapes free).
    Copy,

    // ---- fused ops ----
    /// `RmsNorm` then `MatMul` by each of one to three weights that share the norm (Q, K and V;
    /// gate and up): `x [.., K]`, `norm_w [K]`, `w_j [N_j, K]` → `y_j [.., N_j]`, an output
    /// per weight.
    RmsNormMatMul {
        eps: f32,
        one_plus: bool,
    },
    /// `Glu` then `MatMul` (the down projection): `gate [.., F]`, `up [.., F]`, `w [N, F]` →
    /// `[.., N]`; with a fourth input, the residual `r [.., N]`, added to the result
    /// (`MatMulAdd`'s epilogue).
    GluMatMul(GluOp),
    /// `MatMul` then `Add` of the residual stream (the attention output projection):
    /// `x [.., K]`, `w [N, K]`, `r [.., N]` → `x · wᵀ + r`.
    MatMulAdd,
    /// One Gated DeltaNet decode step per sequence, state gathered from and written back to a
    /// pool by slot. `q [S, Hk, Dk]`, `k`, `v [S, Hv, Dv]`, `g [S, Hv]`, `beta [S, Hv]`,
    /// `slots [S]` → `o [S, Hv, Dv]`, and output 1 `state_pool [P, Hv, Dk, Dv]` updated in
    /// place. With `qk_l2norm: Some(eps)` q and k are L2-normalised first.
    DeltaNetDecode {
        scale: f32,
        qk_l2norm: Option<f32>,
    },
    /// One conv1d decode step per sequence with the state pool updated in place:
    /// `x [S, C]`, `w [C, K]`, `slots [S]` → `y [S, C]`, output 1 `state_pool [P, K-1, C]`.
    Conv1dDecode {
        silu: bool,
    },
}

impl Op {
    /// Every name [`Op::name`] gives, each once, in the order of the variants: the op
    /// families, with each unary and GLU op under its own name. Derived from the enum (each
    /// variant once, through `EnumIter`), so a new op is listed by being declared. Tests that
    /// go through every op use this list.
    pub fn names() -> Vec<&'static str> {
        use strum::IntoEnumIterator;
        let mut out = Vec::new();
        for op in Op::iter() {
            match op {
                Op::Unary(_) => out.extend(UnaryOp::ALL.iter().map(|u| u.name())),
                Op::Glu(_) => out.extend([GluOp::SwiGlu, GluOp::GeGlu].map(GluOp::name)),
                op => out.push(op.name()),
            }
        }
        out
    }

    /// The op's family name, as counters, logs and `kiln validate` show it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::MatMul => "mat_mul",
            Op::MatMulId => "mat_mul_id",
            Op::MoeSum => "moe_sum",
            Op::GetRows => "get_rows",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale(_) => "scale",
            Op::Unary(u) => u.name(),
            Op::Glu(g) => g.name(),
            Op::RmsNorm { .. } => "rms_norm",
            Op::L2Norm { .. } => "l2_norm",
            Op::Rope(_) => "rope",
            Op::Softmax { .. } => "softmax",
            Op::Attention(_) => "attention",
            Op::PagedAttention(_) => "paged_attention",
            Op::KvWrite => "kv_write",
            Op::Argmax => "argmax",
            Op::TopK(_) => "top_k",
            Op::Conv1d { .. } => "conv1d",
            Op::DeltaNet { .. } => "delta_net",
            Op::MoeRoute { .. } => "moe_route",
            Op::Cast => "cast",
            Op::Copy => "copy",
            Op::RmsNormMatMul { .. } => "rms_norm_mat_mul",
            Op::GluMatMul(_) => "glu_mat_mul",
            Op::MatMulAdd => "mat_mul_add",
            Op::DeltaNetDecode { .. } => "delta_net_decode",
            Op::Conv1dDecode { .. } => "conv1d_decode",
            Op::SoftEmbedding { .. } => "soft_embedding",
            Op::CanvasDraw { .. } => "canvas_draw",
            Op::CanvasAccept { .. } => "canvas_accept",
        }
    }

    /// Whether the op reads its outputs' previous contents (in-place updates: KV caches and
    /// state pools). A fallback must copy such outputs down before running and back after.
    pub fn reads_outputs(&self) -> bool {
        matches!(
            self,
            Op::KvWrite
                | Op::DeltaNetDecode { .. }
                | Op::Conv1dDecode { .. }
                | Op::CanvasAccept { .. }
        )
    }

    /// Checks that `inputs` and `outputs` fit this op: counts, dtypes, shapes and parameters.
    /// The error names the op and every shape.
    pub fn check(&self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        check::check(self, inputs, outputs)
    }

    /// The outputs this op produces for `inputs`, with float outputs in the first float
    /// input's dtype (f32 for `GetRows`). Not defined for in-place ops, whose outputs are the
    /// caller's existing buffers.
    pub fn output_descs(&self, inputs: &[TensorDesc]) -> Result<Vec<TensorDesc>> {
        check::output_descs(self, inputs)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a backend is asked about: the exact op (with its parameters), and the dtypes and
/// shapes of its inputs and outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct OpDesc {
    pub op: Op,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
}

impl OpDesc {
    pub fn new(op: Op, inputs: Vec<TensorDesc>, outputs: Vec<TensorDesc>) -> Self {
        OpDesc {
            op,
            inputs,
            outputs,
        }
    }
    pub fn check(&self) -> Result<()> {
        self.op.check(&self.inputs, &self.outputs)
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.op.name())?;
        for (i, t) in self.inputs.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{t}")?;
        }
        write!(f, ") -> (")?;
        for (i, t) in self.outputs.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{t}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_range_agrees_with_allows() {
        let masks = [
            Mask::Causal,
            Mask::SlidingWindow(3),
            Mask::Bidirectional,
            Mask::PrefixBidirectional(4),
            Mask::Lookback(5),
        ];
        for m in masks {
            for len in 1..10 {
                for p in 0..len {
                    let (lo, hi) = m.key_range(p, len);
                    for j in 0..len {
                        assert_eq!(m.allows(p, j, len), j >= lo && j < hi, "{m:?} p={p} j={j}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod names_tests {
    use super::Op;

    /// Each name once, every unary and GLU op by its own name, and the families by theirs.
    #[test]
    fn names_are_derived_once_each() {
        let names = Op::names();
        let set: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(set.len(), names.len(), "a name twice: {names:?}");
        for n in [
            "mat_mul",
            "silu",
            "tanh",
            "swiglu",
            "geglu",
            "mat_mul_add",
            "canvas_accept",
        ] {
            assert!(names.contains(&n), "{n} missing");
        }
        assert!(!names.contains(&"unary") && !names.contains(&"glu"));
    }
}
