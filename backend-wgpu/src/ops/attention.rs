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

pub(super) fn supports(dev: &Device, d: &OpDesc) -> bool {
    let i = &d.inputs;
    let fits = |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    i[0].dtype == DType::F32
        && d.outputs[0].dtype == DType::F32
        && cache_ok(i[1].dtype)
        && i[1].dtype == i[2].dtype
        && i[0].shape.last() <= MAX_HEAD_DIM
        && i[2].shape.last() <= MAX_HEAD_DIM
        && i.iter().chain(&d.outputs).all(fits)
}

pub(super) fn supports_kv_write(dev: &Device, d: &OpDesc) -> bool {
    let fits = |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    let widths_even = d.inputs[..2].iter().all(|t| (t.numel() / t.shape.0[0].max(1)) % 2 == 0);
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
    }
}

pub(super) fn paged_attention(dev: &Device, p: &AttnParams, i: &[&Tensor], y: &Tensor) -> Result<()> {
    let (q, kc, vc, table, lens, q_start) = (i[0], i[1], i[2], i[3], i[4], i[5]);
    let qd = q.shape().dims();
    let (t, hq, d) = (qd[0], qd[1], qd[2]);
    let kd = kc.shape().dims();
    let (n_blocks, bs, hkv) = (kd[0], kd[1], kd[2]);
    let dv = vc.shape().last();
    let max_blocks = table.shape().dims()[1];
    let n_seqs = lens.numel();
    let kernel = match kc.dtype() {
        DType::F32 => &kernels::PAGED_ATTENTION_F32,
        DType::F16 => &kernels::PAGED_ATTENTION_F16,
        other => return Err(err(format!("paged attention over a {other} cache has no WebGPU kernel"))),
    };
    // Decode: one query per sequence; split the longest possible context.
    let decode = t == n_seqs;
    let ctx = (max_blocks * bs).min(n_blocks * bs).max(1);
    let splits = if decode { ctx.div_ceil(SPLIT_KEYS).max(1) } else { 1 };
    let split_len = if decode { SPLIT_KEYS } else { ctx };
    let scratch = dev.scratch(t * hq * splits * (dv + 2))?;
    let unit = if kc.dtype() == DType::F16 { 2 } else { 4 };
    let (bound, offs) = bind(
        dev,
        &[(q, 4), (kc, unit), (vc, unit), (table, 4), (lens, 4), (q_start, 4), (&scratch, 4)],
    )?;
    let (mask, mask_n) = mask_code(p.mask);
    let rows = u(t * hq)?;
    let (gx, gz) = fold(rows, dev.limits.max_compute_workgroups_per_dimension);
    let params = vec![
        u(t)?,
        u(hq)?,
        u(hkv)?,
        u(d)?,
        u(dv)?,
        u(bs)?,
        u(max_blocks)?,
        u(n_seqs)?,
        offs[0],
        offs[1],
        offs[2],
        offs[3],
        offs[4],
        offs[5],
        u(splits)?,
        u(split_len)?,
        p.scale.to_bits(),
        p.soft_cap.unwrap_or(0.0).to_bits(),
        mask,
        u(mask_n)?,
        1,
        0,
        gx,
    ];
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
            other => return Err(err(format!("kv_write into a {other} cache has no WebGPU kernel"))),
        };
        let (bound, offs) = bind(dev, &[(x, 4), (slots, 4), (cache, 4)])?;
        let params = vec![u(t)?, u(width)?, offs[0], offs[1], offs[2], u(n_slots)?];
        launch_1d(dev, kernel, &bound, params, words.div_ceil(256))?;
    }
    Ok(())
}

pub(super) fn supports_contiguous(dev: &Device, d: &OpDesc) -> bool {
    let i = &d.inputs;
    let fits = |t: &kiln_core::tensor::TensorDesc| dev.fits_binding(t.nbytes().unwrap_or(usize::MAX));
    i[0].dtype == DType::F32
        && d.outputs[0].dtype == DType::F32
        && cache_ok(i[1].dtype)
        && i[1].dtype == i[2].dtype
        && i[0].shape.last() <= MAX_HEAD_DIM
        && i[2].shape.last() <= MAX_HEAD_DIM
        && i.iter().chain(&d.outputs).all(fits)
}

/// The contiguous Attention op: the paged kernel with `paged = 0` (K/V rows indexed
/// directly), split over the keys when there is one query row.
pub(super) fn attention(dev: &Device, p: &AttnParams, i: &[&Tensor], y: &Tensor) -> Result<()> {
    let (q, k, v) = (i[0], i[1], i[2]);
    let qd = q.shape().dims();
    let (t, hq, d) = (qd[0], qd[1], qd[2]);
    let (s_len, hkv) = (k.shape().dims()[0], k.shape().dims()[1]);
    let dv = v.shape().last();
    let kernel = match k.dtype() {
        DType::F32 => &kernels::PAGED_ATTENTION_F32,
        DType::F16 => &kernels::PAGED_ATTENTION_F16,
        other => return Err(err(format!("attention over {other} K/V has no WebGPU kernel"))),
    };
    let decode = t == 1;
    let splits = if decode { s_len.div_ceil(SPLIT_KEYS).max(1) } else { 1 };
    let split_len = if decode { SPLIT_KEYS } else { s_len.max(1) };
    let scratch = dev.scratch(t * hq * splits * (dv + 2))?;
    let unit = if k.dtype() == DType::F16 { 2 } else { 4 };
    let dummy = &dev.dummy;
    let (bound, offs) = bind(
        dev,
        &[(q, 4), (k, unit), (v, unit), (dummy, 4), (dummy, 4), (dummy, 4), (&scratch, 4)],
    )?;
    let (mask, mask_n) = mask_code(p.mask);
    let rows = u(t * hq)?;
    let (gx, gz) = fold(rows, dev.limits.max_compute_workgroups_per_dimension);
    let params = vec![
        u(t)?,
        u(hq)?,
        u(hkv)?,
        u(d)?,
        u(dv)?,
        1,
        1,
        1,
        offs[0],
        offs[1],
        offs[2],
        0,
        0,
        0,
        u(splits)?,
        u(split_len)?,
        p.scale.to_bits(),
        p.soft_cap.unwrap_or(0.0).to_bits(),
        mask,
        u(mask_n)?,
        0,
        u(s_len)?,
        gx,
    ];
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
