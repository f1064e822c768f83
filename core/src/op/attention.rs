//! The attention family: attention over contiguous or paged K/V, and the writes that fill the
//! paged caches.

use super::{Ctx, Family, RopeParams};
use crate::error::Result;
use crate::tensor::{DType, Shape, TensorDesc};

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

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum AttentionOp {
    /// Attention over contiguous K/V: `q [T, Hq, D]`, `k [S, Hkv, D]`, `v [S, Hkv, Dv]` →
    /// `[T, Hq, Dv]`. Query `i` is at position `S - T + i`; `Hq` is a multiple of `Hkv` (GQA).
    Attention(AttnParams),
    /// Attention through a block table. `q [T, Hq, D]`, `k_cache [B, bs, Hkv, D]`,
    /// `v_cache [B, bs, Hkv, Dv]` (any float or block dtype whose blocks fit a head),
    /// `block_table [S, max_blocks]`, `seq_lens [S]` (context length after this step),
    /// `q_start [S + 1]` (query rows of sequence `s` are `q_start[s]..q_start[s+1]`, the last
    /// ones of its context) → `[T, Hq, Dv]`. Decode is one query per sequence. An optional
    /// seventh input `key_end [T]` (i32) widens row `i`'s keys to at least the positions
    /// before `key_end[i]` (within its sequence's length; 0 or less: the mask alone), so an
    /// image's soft tokens see each other both ways (Gemma 3).
    PagedAttention(AttnParams),
    /// Writes `k [T, Hkv, D]`, `v [T, Hkv, Dv]` into the caches at `slots [T]`
    /// (`slot = block · bs + offset`; a negative slot is skipped). Outputs `k_cache`, `v_cache`
    /// are updated in place.
    KvWrite,
    /// RoPE of the queries and keys and the K/V write in one launch: `q [T, Hq, D]`,
    /// `k [T, Hkv, D]`, `v [T, Hkv, Dv]`, `positions [T]`, `slots [T]`, optional
    /// `freq_factors [n_rot/2]` (f32). Outputs: `q_out [T, Hq, D]`, q rotated (written), and
    /// `k_cache`, `v_cache` updated in place (k rotated, and v, at the slots): what `rope` of
    /// q, `rope` of k and `kv_write` of the rotated k and v do one after another.
    RopeKvWrite(RopeParams),
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for AttentionOp {
    fn default() -> Self {
        AttentionOp::Attention(AttnParams::default())
    }
}

impl Family for AttentionOp {
    fn name(&self) -> &'static str {
        match self {
            AttentionOp::Attention(_) => "attention",
            AttentionOp::PagedAttention(_) => "paged_attention",
            AttentionOp::KvWrite => "kv_write",
            AttentionOp::RopeKvWrite(_) => "rope_kv_write",
        }
    }

    fn reads_outputs(&self) -> bool {
        matches!(self, AttentionOp::KvWrite | AttentionOp::RopeKvWrite(_))
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        let (p, paged) = match self {
            AttentionOp::Attention(p) => (p, false),
            AttentionOp::PagedAttention(p) => (p, true),
            AttentionOp::KvWrite => {
                c.n_inputs(&[3])?;
                c.float(&i[0], "k")?;
                c.float(&i[1], "v")?;
                c.rank(&i[0], 3, "k")?;
                c.rank(&i[1], 3, "v")?;
                c.ensure(i[0].shape.0[..2] == i[1].shape.0[..2], || {
                    "k and v must be [T, Hkv, _] alike".into()
                })?;
                c.dtype(&i[2], DType::I32, "slots")?;
                return c.ensure(i[2].shape.0 == [i[0].shape.0[0]], || {
                    "slots must be [T]".into()
                });
            }
            AttentionOp::RopeKvWrite(r) => {
                c.n_inputs(&[5, 6])?;
                for (t, what) in [(&i[0], "q"), (&i[1], "k"), (&i[2], "v")] {
                    c.float(t, what)?;
                    c.rank(t, 3, what)?;
                }
                let (q, k, v) = (c.dims(&i[0]), c.dims(&i[1]), c.dims(&i[2]));
                c.ensure(q[0] == k[0] && k[..2] == v[..2], || {
                    "q, k and v must be [T, _, _] alike, k and v [T, Hkv, _]".into()
                })?;
                c.ensure(q[2] == k[2] && k[1] > 0 && q[1] % k[1] == 0, || {
                    format!(
                        "q [T, Hq, D] and k [T, Hkv, D] with Hq a multiple of Hkv: {q:?}, {k:?}"
                    )
                })?;
                for (t, what) in [(&i[3], "positions"), (&i[4], "slots")] {
                    c.dtype(t, DType::I32, what)?;
                    c.ensure(t.shape.0 == [q[0]], || format!("{what} must be [{}]", q[0]))?;
                }
                return r.check(c, q[2], i.get(5));
            }
        };
        if let Some(cap) = p.soft_cap {
            c.ensure(cap > 0.0, || "soft cap must be positive".into())?;
        }
        if let Mask::SlidingWindow(w) = p.mask {
            c.ensure(w > 0, || "sliding window must be at least 1".into())?;
        }
        c.n_inputs(if paged { &[6, 7] } else { &[3] })?;
        c.float(&i[0], "q")?;
        c.rank(&i[0], 3, "q")?;
        let q = c.dims(&i[0]);
        let kr = if paged { 4 } else { 3 };
        c.rank(&i[1], kr, "k")?;
        c.rank(&i[2], kr, "v")?;
        let k = c.dims(&i[1]);
        let v = c.dims(&i[2]);
        let (hkv, d) = (k[kr - 2], k[kr - 1]);
        c.ensure(v[kr - 2] == hkv, || {
            "k and v must have the same number of heads".into()
        })?;
        c.ensure(v[..kr - 2] == k[..kr - 2], || {
            "k and v must have the same leading dims".into()
        })?;
        c.ensure(d == q[2], || {
            format!("q head dim {} != k head dim {d}", q[2])
        })?;
        c.ensure(hkv > 0 && q[1] % hkv == 0, || {
            format!("query heads {} must be a multiple of kv heads {hkv}", q[1])
        })?;
        if paged {
            c.blocks(&i[1], "k_cache")?;
            c.blocks(&i[2], "v_cache")?;
            c.ensure(!i[1].dtype.is_int() && !i[2].dtype.is_int(), || {
                "caches must be float or block types".into()
            })?;
            for (t, what) in [
                (&i[3], "block_table"),
                (&i[4], "seq_lens"),
                (&i[5], "q_start"),
            ] {
                c.dtype(t, DType::I32, what)?;
            }
            c.rank(&i[3], 2, "block_table")?;
            let s = i[3].shape.0[0];
            c.ensure(i[4].shape.0 == [s], || format!("seq_lens must be [{s}]"))?;
            c.ensure(i[5].shape.0 == [s + 1], || {
                format!("q_start must be [{}]", s + 1)
            })?;
            if let Some(e) = i.get(6) {
                c.dtype(e, DType::I32, "key_end")?;
                c.ensure(e.shape.0 == [q[0]], || {
                    format!("key_end must be [{}]", q[0])
                })?;
            }
        } else {
            c.float(&i[1], "k")?;
            c.float(&i[2], "v")?;
            c.ensure(k[0] >= q[0], || {
                format!("{} queries but only {} keys", q[0], k[0])
            })?;
        }
        Ok(())
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        match self {
            AttentionOp::Attention(_) | AttentionOp::PagedAttention(_) => {
                let q = &i[0].shape.0;
                let dv = *i[2].shape.0.last().unwrap_or(&0);
                Ok(vec![TensorDesc::new(i[0].dtype, Shape(vec![q[0], q[1], dv]))])
            }
            AttentionOp::KvWrite | AttentionOp::RopeKvWrite(_) => Err(c.err(
                "updates its outputs in place: the caller supplies them, so they cannot be inferred",
            )),
        }
    }

    fn check_in_place(&self, c: &Ctx) -> Result<()> {
        let (i, o) = match self {
            AttentionOp::KvWrite => (c.inputs, c.outputs),
            AttentionOp::RopeKvWrite(_) => {
                let (i, o) = (c.inputs, c.outputs);
                c.ensure(o.len() == 3, || {
                    format!("has 3 outputs (q_out, k_cache, v_cache), got {}", o.len())
                })?;
                c.ensure(o[0].dtype == i[0].dtype && o[0].shape == i[0].shape, || {
                    "q_out must be q's dtype and shape".into()
                })?;
                (&i[1..], &o[1..])
            }
            _ => return Err(c.err("is not an in-place op")),
        };
        c.ensure(o.len() == 2, || {
            format!("updates 2 outputs (k_cache, v_cache), got {}", o.len())
        })?;
        c.rank(&o[0], 4, "k_cache")?;
        c.rank(&o[1], 4, "v_cache")?;
        c.blocks(&o[0], "k_cache")?;
        c.blocks(&o[1], "v_cache")?;
        c.ensure(!o[0].dtype.is_int() && !o[1].dtype.is_int(), || {
            "caches must be float or block types".into()
        })?;
        let (k, v) = (&i[0].shape.0, &i[1].shape.0);
        c.ensure(
            o[0].shape.0[2..] == k[1..] && o[1].shape.0[2..] == v[1..],
            || "caches must be [B, bs, Hkv, D] with k's and v's head shapes".into(),
        )?;
        c.ensure(o[0].shape.0[..2] == o[1].shape.0[..2], || {
            "k_cache and v_cache must have the same blocks".into()
        })
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
