//! Paged attention (decode and prefill) and the KV write, both through the block table.
//!
//! Attention is two launches: the split kernel (one workgroup per tile of query rows, pack of
//! heads sharing a KV head, and split of the key range, reading K/V by block-table index) and
//! the combine. Decode batches (one query per sequence) take a row a workgroup and split long
//! contexts into chunks of `SPLIT_KEYS` keys so the work spreads over the device; prefill
//! takes several rows a workgroup (`row_tile`) and one split.

use kiln_core::op::{AttentionOp, AttnParams, Mask, OpDesc};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{bind, err, launch_1d, u};
use crate::device::{fold, Device};
use crate::kernels::{self, plain, Kernel};

const ATTENTION_COMBINE: &str = include_str!("../../../shaders/attention_combine.wgsl");

plain!(
    PAGED_ATTENTION_COMBINE,
    "paged_attention_combine",
    "attention_combine",
    ATTENTION_COMBINE
);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[&PAGED_ATTENTION_COMBINE];

/// Keys per split in decode.
const SPLIT_KEYS: usize = 256;
/// Head dims each thread group can hold (4 per thread, 64 threads).
const MAX_HEAD_DIM: usize = 256;

/// Bytes of the longest row of blocks `kv_write` assembles in workgroup memory.
const MAX_BLOCK_ROW_BYTES: usize = 9216;

/// Paged (`q, k_cache, v_cache, ...`) and contiguous (`q, k, v`) attention alike: any pair of
/// cache formats of the KV tables, block formats over heads of whole blocks.
pub(super) fn supports(dev: &Device, d: &OpDesc) -> bool {
    let i = &d.inputs;
    let fits =
        |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    let whole = |t: &kiln_core::tensor::TensorDesc| t.shape.last() % t.dtype.block_size() == 0;
    i[0].dtype == DType::F32
        && d.outputs[0].dtype == DType::F32
        && kernels::paged_attention(i[1].dtype, i[2].dtype).is_some()
        && whole(&i[1])
        && whole(&i[2])
        && i[0].shape.last() <= MAX_HEAD_DIM
        && i[2].shape.last() <= MAX_HEAD_DIM
        && i.iter().chain(&d.outputs).all(fits)
}

/// Whether a `width`-element token row can be written into a cache of `t` (see
/// shaders/attention_kv_write.wgsl): halves in pairs, blocks in rows of whole words that fit the
/// workgroup's row buffer.
fn kv_row_ok(t: DType, width: usize) -> bool {
    if kernels::kv_write(t).is_none() {
        return false;
    }
    match t {
        DType::F32 => true,
        DType::F16 | DType::BF16 => width % 2 == 0,
        _ => match t.bytes_for(width) {
            Some(b) => b % 4 == 0 && b <= MAX_BLOCK_ROW_BYTES,
            None => false,
        },
    }
}

pub(super) fn supports_kv_write(dev: &Device, d: &OpDesc) -> bool {
    let fits =
        |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    let width = |t: &kiln_core::tensor::TensorDesc| t.numel() / t.shape.0[0].max(1);
    d.inputs[0].dtype == DType::F32
        && d.inputs[1].dtype == DType::F32
        && d.outputs
            .iter()
            .zip(&d.inputs[..2])
            .all(|(c, x)| kv_row_ok(c.dtype, width(x)))
        && d.inputs.iter().chain(&d.outputs).all(fits)
}

fn mask_code(m: Mask) -> (u32, usize) {
    match m {
        Mask::Causal => (0, 0),
        Mask::SlidingWindow(w) => (1, w),
        Mask::Bidirectional => (2, 0),
        Mask::PrefixBidirectional(n) => (3, n),
        Mask::Lookback(n) => (4, n),
    }
}

/// Query heads one workgroup scores together (shaders/attention.wgsl's PACK is the most): the
/// largest of 4, 3, 2 that divides the query heads per KV head, else 1.
fn head_pack(hq: usize, hkv: usize) -> usize {
    let per_kv = hq / hkv.max(1);
    [4, 3, 2]
        .into_iter()
        .find(|&p| per_kv >= p && per_kv.is_multiple_of(p))
        .unwrap_or(1)
}

/// Query rows one workgroup takes (`rtile`) and its banks of 4 (row, head) slots, within
/// shaders/attention.wgsl's workgroup arrays: at most 16 slots, the slots' query rows in 1024
/// floats, and each V lane (4 dims of one bank) once among the 64 threads. Decode takes one
/// row (its parallelism comes from splitting the keys); prefill as many as fit, so every
/// K and V value a workgroup decodes serves them all.
fn row_tile(decode: bool, pack: usize, d: usize, dv: usize) -> (usize, usize) {
    let quads = dv.div_ceil(4);
    let fits = |r: usize| {
        let banks = (r * pack).div_ceil(4);
        banks <= 4 && 4 * banks * d <= 1024 && banks * quads <= 64
    };
    let r = if decode {
        1
    } else {
        (1..=16).rev().find(|&r| fits(r)).unwrap_or(1)
    };
    (r, (r * pack).div_ceil(4))
}

/// One attention launch: the split kernel, then the combine.
struct Launch<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    /// Block table, sequence lengths and query starts (the dummy for contiguous K/V).
    table: &'a Tensor,
    lens: &'a Tensor,
    q_start: &'a Tensor,
    /// Where the per-row key ends follow the sequence lengths in their buffer, in words.
    key_end: Option<u32>,
    /// Token slots per block (1 for contiguous K/V) and block-table width.
    bs: usize,
    max_blocks: usize,
    n_seqs: usize,
    /// The longest context any query row can see (sizes the decode splits).
    ctx: usize,
    /// One query row per sequence: split the keys across workgroups.
    decode: bool,
    /// Contiguous K/V of one sequence of `s_len` keys (the Attention op).
    contiguous: Option<usize>,
}

fn run(dev: &Device, p: &AttnParams, l: &Launch<'_>, y: &Tensor) -> Result<()> {
    let qd = l.q.shape().dims();
    let (t, hq, d) = (qd[0], qd[1], qd[2]);
    let hkv = l.k.shape().dims()[l.k.shape().rank() - 2];
    let dv = l.v.shape().last();
    let kernel = kernels::paged_attention(l.k.dtype(), l.v.dtype()).ok_or_else(|| {
        err(format!(
            "attention over a {} K and {} V cache has no WebGPU kernel",
            l.k.dtype(),
            l.v.dtype()
        ))
    })?;
    let ctx = l.ctx.max(1);
    let (splits, split_len) = if l.decode {
        (ctx.div_ceil(SPLIT_KEYS), SPLIT_KEYS)
    } else {
        (1, ctx)
    };
    let scratch = dev.scratch(t * hq * splits * (dv + 2))?;
    // Cache offsets go in bytes; rows must sit on the boundary their format reads at.
    let align = |t: &Tensor| if t.dtype() == DType::F32 { 4 } else { 2 };
    let (bound, offs) = bind(
        dev,
        &[
            (l.q, 4),
            (l.k, 1),
            (l.v, 1),
            (l.table, 4),
            (l.lens, 4),
            (l.q_start, 4),
            (&scratch, 4),
        ],
    )?;
    for (t, off) in [(l.k, offs[1]), (l.v, offs[2])] {
        if off % align(t) != 0 {
            return Err(err(format!(
                "a {} cache view starts at byte {off}",
                t.dtype()
            )));
        }
    }
    let (mask, mask_n) = mask_code(p.mask);
    let rows = u(t * hq)?;
    let pack = head_pack(hq, hkv);
    let (rtile, banks) = row_tile(l.decode, pack, d, dv);
    // Row tiles never span two sequences: one partial tile a sequence at most.
    let tiles = if rtile == 1 {
        t
    } else {
        t.div_ceil(rtile) + l.n_seqs
    };
    let (gx, gz) = fold(
        u(tiles * hq / pack)?,
        dev.limits.max_compute_workgroups_per_dimension,
    );
    let mut params = vec![
        u(t)?,
        u(hq)?,
        u(hkv)?,
        u(d)?,
        u(dv)?,
        u(l.bs)?,
        u(l.max_blocks)?,
        u(l.n_seqs)?,
    ];
    params.extend_from_slice(&offs[..6]);
    params.extend([
        u(splits)?,
        u(split_len)?,
        p.scale.to_bits(),
        p.soft_cap.unwrap_or(0.0).to_bits(),
        mask,
        u(mask_n)?,
        l.contiguous.is_none() as u32,
        u(l.contiguous.unwrap_or(0))?,
        gx,
        u(pack)?,
        u(rtile)?,
        u(banks)?,
        l.key_end.map_or(u32::MAX, |w| offs[4] + w),
    ]);
    dev.dispatch_bound(kernel, &bound, &params, [gx, u(splits)?, gz])?;
    let (bound, offs) = bind(dev, &[(&scratch, 4), (y, 4)])?;
    let params = vec![rows, u(dv)?, u(splits)?, offs[1]];
    launch_1d(
        dev,
        &PAGED_ATTENTION_COMBINE,
        &bound,
        params,
        (t * hq * dv).div_ceil(64),
    )
}

pub(super) fn paged_attention(
    dev: &Device,
    p: &AttnParams,
    i: &[&Tensor],
    y: &Tensor,
) -> Result<()> {
    let (q, kc, table) = (i[0], i[1], i[3]);
    let kd = kc.shape().dims();
    let (n_blocks, bs) = (kd[0], kd[1]);
    let max_blocks = table.shape().dims()[1];
    let n_seqs = i[4].numel();
    // With a key_end: sequence lengths, query starts and key ends copied into one buffer,
    // read through the lengths' binding (the shader's bindings stay within the WebGPU
    // default of 8 storage buffers a stage).
    let packed;
    let (lens, q_start, key_end) = match i.get(6) {
        None => (i[4].clone(), i[5].clone(), None),
        Some(ke) => {
            let t = q.shape().dims()[0];
            packed = dev.scratch(2 * n_seqs + 1 + t)?;
            dev.copy_into(i[4], &packed, 0)?;
            dev.copy_into(i[5], &packed, 4 * n_seqs)?;
            dev.copy_into(ke, &packed, 4 * (2 * n_seqs + 1))?;
            // The lengths' binding spans the whole buffer: the key ends are read through it.
            (
                packed.view(0, [2 * n_seqs + 1 + t])?,
                packed.view(n_seqs, [n_seqs + 1])?,
                Some(u(2 * n_seqs + 1)?),
            )
        }
    };
    let l = Launch {
        q,
        k: kc,
        v: i[2],
        table,
        lens: &lens,
        q_start: &q_start,
        key_end,
        bs,
        max_blocks,
        n_seqs,
        ctx: max_blocks.min(n_blocks) * bs,
        decode: q.shape().dims()[0] == n_seqs,
        contiguous: None,
    };
    run(dev, p, &l, y)
}

/// The contiguous Attention op: the same kernel with K/V rows indexed directly.
pub(super) fn attention(dev: &Device, p: &AttnParams, i: &[&Tensor], y: &Tensor) -> Result<()> {
    let s_len = i[1].shape().dims()[0];
    let l = Launch {
        q: i[0],
        k: i[1],
        v: i[2],
        table: &dev.dummy,
        lens: &dev.dummy,
        q_start: &dev.dummy,
        key_end: None,
        bs: 1,
        max_blocks: 1,
        n_seqs: 1,
        ctx: s_len,
        decode: i[0].shape().dims()[0] == 1,
        contiguous: Some(s_len),
    };
    run(dev, p, &l, y)
}

pub(super) fn kv_write(dev: &Device, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    let slots = i[2];
    let t = slots.numel();
    for (x, cache) in [(i[0], o[0]), (i[1], o[1])] {
        let width = x.numel() / t.max(1);
        let cd = cache.shape().dims();
        let n_slots = cd[0] * cd[1];
        if !kv_row_ok(cache.dtype(), width) {
            return Err(err(format!(
                "kv_write of {width}-element rows into a {} cache has no WebGPU kernel",
                cache.dtype()
            )));
        }
        let kernel = kernels::kv_write(cache.dtype())
            .ok_or_else(|| err(format!("no kv_write kernel for {}", cache.dtype())))?;
        // Elementwise formats: a thread per cache word; block formats: a workgroup per row.
        let groups = match cache.dtype() {
            DType::F32 => (t * width).div_ceil(64),
            DType::F16 | DType::BF16 => (t * width / 2).div_ceil(64),
            _ => t,
        };
        let (bound, offs) = bind(dev, &[(x, 4), (slots, 4), (cache, 4)])?;
        let params = vec![u(t)?, u(width)?, offs[0], offs[1], offs[2], u(n_slots)?];
        launch_1d(dev, kernel, &bound, params, groups)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::row_tile;

    /// Every head shape the launcher accepts gets a tile within the shader's arrays, decode
    /// one row, and prefill as many rows as those arrays allow.
    #[test]
    fn row_tiles_fit_the_shader_arrays() {
        for pack in 1..=4 {
            for d in (1..=256).step_by(7).chain([64, 128, 256]) {
                for dv in (1..=256).step_by(11).chain([64, 128, 256]) {
                    assert_eq!(row_tile(true, pack, d, dv), (1, 1));
                    let (r, banks) = row_tile(false, pack, d, dv);
                    assert!(r >= 1 && r * pack <= 4 * banks && banks <= 4);
                    assert!(4 * banks * d <= 1024 && banks * dv.div_ceil(4) <= 64);
                    // One more row would not fit.
                    let more = (r + 1) * pack;
                    let b = more.div_ceil(4);
                    assert!(r == 16 || b > 4 || 4 * b * d > 1024 || b * dv.div_ceil(4) > 64);
                }
            }
        }
        assert_eq!(row_tile(false, 3, 64, 64), (5, 4));
        assert_eq!(row_tile(false, 4, 256, 256), (1, 1));
    }
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, op: &AttentionOp, d: &OpDesc) -> bool {
    match op {
        AttentionOp::Attention(_) | AttentionOp::PagedAttention(_) => supports(dev, d),
        AttentionOp::KvWrite => supports_kv_write(dev, d),
        // No fused kernel: the model takes RoPE and the K/V write apart.
        AttentionOp::RopeKvWrite(_) => false,
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &AttentionOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        AttentionOp::Attention(p) => attention(dev, p, i, o[0]),
        AttentionOp::PagedAttention(p) => paged_attention(dev, p, i, o[0]),
        AttentionOp::KvWrite => kv_write(dev, i, o),
        AttentionOp::RopeKvWrite(_) => {
            Err(super::no_kernel(&kiln_core::op::Op::Attention(op.clone())))
        }
    }
}
