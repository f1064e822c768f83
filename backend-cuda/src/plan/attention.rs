//! Attention: contiguous, and paged (decode split over the key range, prefill per row).

use kiln_core::op::{AttnParams, Mask, RopeMode, RopeParams};
use kiln_core::tensor::{DType, TensorDesc};

use super::*;
use crate::names;

/// A mask as the attention kernels take it: `(window, see_to)`, where `window` (0: none)
/// bounds a row's keys from below and every row sees at least the first `see_to` keys; a
/// window with the top bit set is a lookback instead: every row sees the last `window & !top`
/// keys of its sequence.
const LOOKBACK: u32 = 1 << 31;

fn mask_args(mask: Mask) -> Option<(u32, u32)> {
    Some(match mask {
        Mask::Causal => (0, 0),
        Mask::SlidingWindow(0) => return None,
        // The kernels take positions as 32-bit ints: a wider window is no window.
        Mask::SlidingWindow(w) => (w.min(i32::MAX as usize) as u32, 0),
        Mask::Bidirectional => (0, u32::MAX),
        Mask::PrefixBidirectional(n) => (0, u(n).unwrap_or(u32::MAX)),
        Mask::Lookback(n) => (LOOKBACK | u(n).filter(|&n| n < LOOKBACK)?, 0),
    })
}

pub(super) fn plan_attention(
    p: &AttnParams,
    i: &[TensorDesc],
    o: &[TensorDesc],
) -> Option<Vec<Step>> {
    use Arg::{F32, U32};
    (all_f32(i) && o[0].dtype == DType::F32).then_some(())?;
    let (t, hq, d) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
    let (s, hkv, dv) = (dim(&i[1], 0), dim(&i[1], 1), dim(&i[2], 2));
    (d <= MAX_HEAD_DIM && dv <= MAX_HEAD_DIM && hkv > 0 && hq % hkv == 0).then_some(())?;
    // Positions are 32-bit ints in the kernel.
    i32::try_from(s).ok()?;
    let cap = p.soft_cap.unwrap_or(0.0);
    (cap >= 0.0).then_some(())?;
    let (window, see_to) = mask_args(p.mask)?;
    let mut args = with_tensors(
        3,
        1,
        [
            U32(u(t)?),
            U32(u(s)?),
            U32(u(hq)?),
            U32(u(hkv)?),
            U32(u(d)?),
            U32(u(dv)?),
            F32(p.scale),
            F32(cap),
            U32(window),
            U32(see_to),
        ],
    );
    match tiled_rows(hq / hkv) {
        Some(qr) => {
            args.push(U32(qr));
            one(
                "attention_tiled_f32",
                (u(t.div_ceil(qr as usize))?, u(hkv)?, 1),
                (PREFILL_THREADS, 1, 1),
                args,
            )
        }
        None => launch1("attention_f32", t * hq * 32, args),
    }
}

pub(super) fn plan_paged_attention(
    p: &AttnParams,
    i: &[TensorDesc],
    o: &[TensorDesc],
) -> Option<Vec<Step>> {
    use Arg::{In, Null, Out, F32, U32};
    // A seventh input, the rows' key reach (an image's soft tokens both ways), goes to the
    // one-warp-a-row prefill kernels (the last argument; null without it).
    (matches!(i.len(), 6 | 7) && i[0].dtype == DType::F32 && o[0].dtype == DType::F32)
        .then_some(())?;
    let reach = i.len() == 7;
    let key_end = if reach { In(6) } else { Null };
    let (window, see_to) = mask_args(p.mask)?;
    let (t, hq, d) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
    let (bs, hkv, dv) = (dim(&i[1], 1), dim(&i[1], 2), dim(&i[2], 3));
    let (s, max_blocks) = (dim(&i[3], 0), dim(&i[3], 1));
    // The kernels find each row's sequence: there must be one.
    (s > 0 && d == dv && d <= MAX_HEAD_DIM && hkv > 0 && hq % hkv == 0).then_some(())?;
    let cap = p.soft_cap.unwrap_or(0.0);
    (cap >= 0.0).then_some(())?;
    // f32 and f16 caches (K and V alike) have kernels of their own; every other pair of
    // cache formats goes to the `_kv` kernels, which take the two format codes last.
    let (f16, coded) = match (i[1].dtype, i[2].dtype) {
        (DType::F32, DType::F32) => (false, None),
        (DType::F16, DType::F16) => (true, None),
        (kt, vt) => {
            let codes = (names::kv_format(kt)?, names::kv_format(vt)?);
            (d % 32 == 0).then_some(())?;
            (false, Some(codes))
        }
    };
    let pick = |plain: &'static str, half: &'static str, kv: &'static str| match (coded, f16) {
        (Some(_), _) => kv,
        (None, true) => half,
        (None, false) => plain,
    };
    let codes = |args: &mut Vec<Arg>| {
        if let Some((kf, vf)) = coded {
            args.extend([U32(kf), U32(vf)]);
        }
    };
    let n_blocks = dim(&i[1], 0);
    let common = [
        U32(u(d)?),
        U32(u(bs)?),
        U32(u(max_blocks)?),
        U32(u(n_blocks)?),
        F32(p.scale),
        F32(cap),
        U32(window),
    ];
    // The decode kernel is causal (with an optional window): a row sees keys up to its own
    // position, which for the last row of a sequence is every key whatever the mask, but not
    // for earlier rows of a sequence that has several.
    if !reach
        && t == s
        && hq / hkv <= MAX_GROUP
        && matches!(p.mask, Mask::Causal | Mask::SlidingWindow(_))
    {
        // Decode: a block per (sequence, KV head, split of the keys), serving the group's
        // query heads. The plan cannot see the sequences' lengths (they are on the device),
        // so the splits cover the block table's whole capacity; splits past a sequence's
        // length find no keys and cost a block that exits at once.
        let capacity = max_blocks * bs;
        let pairs = (s * hkv).max(1);
        let splits = DECODE_TARGET_BLOCKS
            .div_ceil(pairs)
            .min(capacity.div_ceil(MIN_SPLIT_KEYS))
            .clamp(1, MAX_GRID_YZ as usize);
        let chunk = capacity.div_ceil(splits).max(1);
        // Key positions up to splits · chunk are computed in 32-bit ints.
        i32::try_from(splits * chunk + chunk).ok()?;
        let kernel = pick("paged_decode_f32", "paged_decode_f16", "paged_decode_kv");
        let part = if splits > 1 {
            Arg::Scratch(0)
        } else {
            Arg::Null
        };
        let mut args = with_tensors(6, 1, [part, U32(u(t)?), U32(u(hq)?), U32(u(hkv)?)]);
        args.extend(common);
        args.push(U32(u(chunk)?));
        codes(&mut args);
        let mut steps = one(kernel, (u(s)?, u(hkv)?, u(splits)?), (128, 1, 1), args)?;
        if splits > 1 {
            let records = t * hq * splits * (d + 2);
            steps.insert(0, Step::Scratch(TensorDesc::new(DType::F32, [records])));
            steps.extend(one(
                "paged_decode_combine",
                (u(t * hq)?, 1, 1),
                (u(d.next_multiple_of(32).min(256))?, 1, 1),
                vec![
                    Arg::Scratch(0),
                    Out(0),
                    U32(u(t)?),
                    U32(u(hq)?),
                    U32(u(splits)?),
                    U32(u(d)?),
                ],
            )?);
        }
        return Some(steps);
    }
    let mut args = with_tensors(6, 1, [U32(u(s)?), U32(u(t)?), U32(u(hq)?), U32(u(hkv)?)]);
    args.extend(common);
    args.push(U32(see_to));
    // With FA_TC=1, f16 caches and head dims of 16·n up to 128: flash attention on the
    // tensor cores, FA_PAIRS (row, head) pairs a block.
    if let Some((kernel, qr)) = tc_prefill(f16 && coded.is_none() && !reach, d, hq / hkv) {
        args.push(U32(qr));
        return one(
            kernel,
            (u(t.div_ceil(qr as usize))?, u(hkv)?, 1),
            (FA_THREADS, 1, 1),
            args,
        );
    }
    if let Some(qr) = tiled_rows(hq / hkv).filter(|_| !reach) {
        args.push(U32(qr));
        codes(&mut args);
        let kernel = pick(
            "paged_prefill_tiled_f32",
            "paged_prefill_tiled_f16",
            "paged_prefill_tiled_kv",
        );
        return one(
            kernel,
            (u(t.div_ceil(qr as usize))?, u(hkv)?, 1),
            (PREFILL_THREADS, 1, 1),
            args,
        );
    }
    codes(&mut args);
    args.push(key_end);
    let kernel = pick("paged_prefill_f32", "paged_prefill_f16", "paged_prefill_kv");
    launch1(kernel, t * hq * 32, args)
}

/// (row, head) pairs of one tiled prefill block (`PREFILL_PAIRS` in attention.cu) and
/// its threads (`PREFILL_WARPS` warps).
const PREFILL_PAIRS: usize = 16;
const PREFILL_THREADS: u32 = 128;

/// (row, head) pairs of one tensor-core prefill block (`FA_PAIRS` in attention.cu) and its
/// threads (`FA_WARPS` warps).
const FA_PAIRS: usize = 64;
const FA_THREADS: u32 = 128;

/// The tensor-core prefill kernel for head dim `d` and a GQA group of `group` query heads, and
/// its query rows a block, where the `FA_TC=1` knob asks for it and `eligible` (f16 caches, no
/// key reach) holds.
fn tc_prefill(eligible: bool, d: usize, group: usize) -> Option<(&'static str, u32)> {
    (eligible && kernels::knob("FA_TC") == Some(1)).then_some(())?;
    (d % 16 == 0 && (1..=FA_PAIRS).contains(&group)).then_some(())?;
    let kernel = match d {
        16..=64 => "paged_prefill_tc_f16_64",
        65..=128 => "paged_prefill_tc_f16_128",
        _ => return None,
    };
    Some((kernel, (FA_PAIRS / group) as u32))
}

/// Query rows per block of the tiled prefill kernels for a GQA group of `group` query heads
/// (every head of the group rides along), or `None` for a group too large to tile.
fn tiled_rows(group: usize) -> Option<u32> {
    (1..=PREFILL_PAIRS)
        .contains(&group)
        .then(|| (PREFILL_PAIRS / group) as u32)
}

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &AttentionOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::U32;
    match op {
        AttentionOp::KvWrite => {
            all_f32(&i[..2]).then_some(())?;
            let t = dim(&i[0], 0);
            let hd = i[0].numel() / t.max(1);
            let hdv = i[1].numel() / t.max(1);
            // Cache rows: B · bs.
            let n_slots = dim(&o[0], 0) * dim(&o[0], 1);
            let kernel = match (o[0].dtype, o[1].dtype) {
                (DType::F32, DType::F32) => "kv_write_f32",
                (DType::F16, DType::F16) => "kv_write_f16",
                (kt, vt) => {
                    // Any other pair: a thread per 32-value block of a row.
                    let (kf, vf) = (names::kv_format(kt)?, names::kv_format(vt)?);
                    (hd % 32 == 0 && hdv % 32 == 0).then_some(())?;
                    return launch1(
                        "kv_write_kv",
                        t * (hd + hdv) / 32,
                        with_tensors(
                            3,
                            2,
                            [
                                U32(u(t)?),
                                U32(u(hd)?),
                                U32(u(hdv)?),
                                U32(u(n_slots)?),
                                U32(kf),
                                U32(vf),
                            ],
                        ),
                    );
                }
            };
            launch1(
                kernel,
                t * (hd + hdv),
                with_tensors(
                    3,
                    2,
                    [U32(u(t)?), U32(u(hd)?), U32(u(hdv)?), U32(u(n_slots)?)],
                ),
            )
        }
        AttentionOp::Attention(p) => plan_attention(p, i, o),
        AttentionOp::PagedAttention(p) => plan_paged_attention(p, i, o),
        AttentionOp::RopeKvWrite(r) => plan_rope_kv_write(r, i, o),
    }
}

/// RoPE of q and k with the K/V write: one thread per rotary pair or pass-through dim of every
/// query and key head and per value dim, f32 activations into f32 or f16 caches (the other
/// cache formats take the three ops).
fn plan_rope_kv_write(r: &RopeParams, i: &[TensorDesc], o: &[TensorDesc]) -> Option<Vec<Step>> {
    use Arg::{In, Null, Out, F32, U32};
    (fuse_launches() && all_f32(&i[..3]) && o[0].dtype == DType::F32).then_some(())?;
    (i.get(5).is_none_or(|f| f.dtype == DType::F32)).then_some(())?;
    let kernel = match (o[1].dtype, o[2].dtype) {
        (DType::F32, DType::F32) => "rope_kv_write_f32",
        (DType::F16, DType::F16) => "rope_kv_write_f16",
        _ => return None,
    };
    let (t, hq, d) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
    let (hkv, dv) = (dim(&i[1], 1), dim(&i[2], 2));
    (r.n_rot % 2 == 0 && r.n_rot > 0 && r.n_rot <= d).then_some(())?;
    let per_tok = (hq + hkv) * (d - r.n_rot / 2) + hkv * dv;
    // Cache rows: B · bs.
    let n_slots = dim(&o[1], 0) * dim(&o[1], 1);
    launch1(
        kernel,
        t.checked_mul(per_tok)?,
        vec![
            In(0),
            In(1),
            In(2),
            In(3),
            In(4),
            if i.len() > 5 { In(5) } else { Null },
            Out(0),
            Out(1),
            Out(2),
            U32(u(t)?),
            U32(u(hq)?),
            U32(u(hkv)?),
            U32(u(d)?),
            U32(u(dv)?),
            U32(u(r.n_rot)?),
            U32((r.mode == RopeMode::Neox) as u32),
            F32(r.base),
            F32(r.freq_scale),
            F32(r.attn_factor),
            U32((i.len() > 5) as u32),
            U32(u(n_slots)?),
        ],
    )
}
