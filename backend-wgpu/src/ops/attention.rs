//! Paged attention (decode and prefill) and the KV write, both through the block table.
//!
//! Attention is two launches: the split kernel (one workgroup per query row, head and split
//! of the key range, reading K/V by block-table index) and the combine. Decode batches (one
//! query per sequence) split long contexts into chunks of `SPLIT_KEYS` keys so the work
//! spreads over the device; prefill uses one split per row.

use kiln_core::op::{AttnParams, Mask, OpDesc};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{bind, err, launch_1d, u};
use crate::device::{fold, Device};
use crate::kernels;

/// Keys per split in decode.
const SPLIT_KEYS: usize = 256;
/// Head dims each thread group can hold (4 per thread, 64 threads).
const MAX_HEAD_DIM: usize = 256;

fn cache_ok(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F16)
}

/// Paged (`q, k_cache, v_cache, ...`) and contiguous (`q, k, v`) attention alike.
pub(super) fn supports(dev: &Device, d: &OpDesc) -> bool {
    let i = &d.inputs;
    let fits =
        |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    i[0].dtype == DType::F32
        && d.outputs[0].dtype == DType::F32
        && cache_ok(i[1].dtype)
        && i[1].dtype == i[2].dtype
        && i[0].shape.last() <= MAX_HEAD_DIM
        && i[2].shape.last() <= MAX_HEAD_DIM
        && i.iter().chain(&d.outputs).all(fits)
}

pub(super) fn supports_kv_write(dev: &Device, d: &OpDesc) -> bool {
    let fits =
        |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    let widths_even = d.inputs[..2]
        .iter()
        .all(|t| (t.numel() / t.shape.0[0].max(1)) % 2 == 0);
    d.inputs[0].dtype == DType::F32
        && d.inputs[1].dtype == DType::F32
        && d.outputs.iter().all(|c| match c.dtype {
            DType::F32 => true,
            DType::F16 => widths_even,
            _ => false,
        })
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

/// One attention launch: the split kernel, then the combine.
struct Launch<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    /// Block table, sequence lengths and query starts (the dummy for contiguous K/V).
    table: &'a Tensor,
    lens: &'a Tensor,
    q_start: &'a Tensor,
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
    let kernel = match l.k.dtype() {
        DType::F32 => &kernels::PAGED_ATTENTION_F32,
        DType::F16 => &kernels::PAGED_ATTENTION_F16,
        other => {
            return Err(err(format!(
                "attention over {other} K/V has no WebGPU kernel"
            )))
        }
    };
    let ctx = l.ctx.max(1);
    let (splits, split_len) = if l.decode {
        (ctx.div_ceil(SPLIT_KEYS), SPLIT_KEYS)
    } else {
        (1, ctx)
    };
    let scratch = dev.scratch(t * hq * splits * (dv + 2))?;
    let unit = if l.k.dtype() == DType::F16 { 2 } else { 4 };
    let (bound, offs) = bind(
        dev,
        &[
            (l.q, 4),
            (l.k, unit),
            (l.v, unit),
            (l.table, 4),
            (l.lens, 4),
            (l.q_start, 4),
            (&scratch, 4),
        ],
    )?;
    let (mask, mask_n) = mask_code(p.mask);
    let rows = u(t * hq)?;
    let (gx, gz) = fold(rows, dev.limits.max_compute_workgroups_per_dimension);
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
    ]);
    dev.dispatch_bound(kernel, &bound, &params, [gx, u(splits)?, gz])?;
    let (bound, offs) = bind(dev, &[(&scratch, 4), (y, 4)])?;
    let params = vec![rows, u(dv)?, u(splits)?, offs[1]];
    launch_1d(
        dev,
        &kernels::PAGED_ATTENTION_COMBINE,
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
    let (q, kc, table, lens) = (i[0], i[1], i[3], i[4]);
    let kd = kc.shape().dims();
    let (n_blocks, bs) = (kd[0], kd[1]);
    let max_blocks = table.shape().dims()[1];
    let n_seqs = lens.numel();
    let l = Launch {
        q,
        k: kc,
        v: i[2],
        table,
        lens,
        q_start: i[5],
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
        let (kernel, words) = match cache.dtype() {
            DType::F32 => (&kernels::KV_WRITE_F32, t * width),
            DType::F16 => (&kernels::KV_WRITE_F16, t * width / 2),
            other => {
                return Err(err(format!(
                    "kv_write into a {other} cache has no WebGPU kernel"
                )))
            }
        };
        let (bound, offs) = bind(dev, &[(x, 4), (slots, 4), (cache, 4)])?;
        let params = vec![u(t)?, u(width)?, offs[0], offs[1], offs[2], u(n_slots)?];
        launch_1d(dev, kernel, &bound, params, words.div_ceil(256))?;
    }
    Ok(())
}
