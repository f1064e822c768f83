//! Causal depthwise conv1d with carried state (Gated DeltaNet's and LFM's short conv), and its
//! decode step over a state pool.

use rayon::prelude::*;

use super::elementwise::silu as silu_fn;
use super::{index, In, KResult, KernelError, Out};
use crate::op::ConvOp;

/// Runs one sequence: `x [L, C]` after `state [K-1, C]`; writes `y [L, C]` and the new state.
fn conv_seq(
    x: &[f32],
    w: &[f32],
    kw: usize,
    ch: usize,
    silu: bool,
    state: &mut [f32],
    y: &mut [f32],
) {
    let l = x.len() / ch.max(1);
    // The window: the carried state, then the sequence.
    let mut win = Vec::with_capacity((kw - 1 + l) * ch);
    win.extend_from_slice(state);
    win.extend_from_slice(x);
    y.par_chunks_mut(ch.max(1)).enumerate().for_each(|(t, yr)| {
        for (c, out) in yr.iter_mut().enumerate() {
            let mut s = 0f32;
            for k in 0..kw {
                s += w[c * kw + k] * win[(t + k) * ch + c];
            }
            *out = if silu { silu_fn(s) } else { s };
        }
    });
    let keep = (kw - 1) * ch;
    state.copy_from_slice(&win[win.len() - keep..]);
}

/// Sequence boundaries from `seq_start`, validated.
pub(crate) fn seq_ranges(seq_start: &[i32], t: usize) -> KResult<Vec<(usize, usize)>> {
    if seq_start.first() != Some(&0) || seq_start.last().copied() != Some(t as i32) {
        return Err(KernelError::Data(format!(
            "seq_start must run from 0 to the {t} tokens, got {seq_start:?}"
        )));
    }
    seq_start
        .windows(2)
        .enumerate()
        .map(|(s, w)| {
            if w[1] < w[0] {
                Err(KernelError::Data(format!(
                    "seq_start decreases at sequence {s}"
                )))
            } else {
                Ok((w[0] as usize, w[1] as usize))
            }
        })
        .collect()
}

pub(crate) fn conv1d(silu: bool, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let w = i[1].f32()?;
    let mut state = i[2].f32()?.into_owned();
    let (t, ch) = (i[0].dims()[0], i[0].dims()[1]);
    let kw = i[1].dims()[1];
    let ranges = seq_ranges(&i[3].i32()?, t)?;
    let sl = (kw - 1) * ch;
    o[0].with_f32(false, |y| {
        for (s, &(a, b)) in ranges.iter().enumerate() {
            conv_seq(
                &x[a * ch..b * ch],
                &w,
                kw,
                ch,
                silu,
                &mut state[s * sl..(s + 1) * sl],
                &mut y[a * ch..b * ch],
            );
        }
        Ok(())
    })?;
    o[1].store_f32(&state)
}

/// Checks that `slots` are in range of a pool of `pool` and pairwise distinct.
pub(crate) fn pool_slots(slots: &[i32], pool: usize) -> KResult<Vec<usize>> {
    let idx = slots
        .iter()
        .map(|&s| index(s, pool, "state slot"))
        .collect::<KResult<Vec<_>>>()?;
    let mut seen = idx.clone();
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err(KernelError::Data("two sequences share a state slot".into()));
    }
    Ok(idx)
}

pub(crate) fn conv1d_decode(silu: bool, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let w = i[1].f32()?;
    let ch = i[0].dims()[1];
    let kw = i[1].dims()[1];
    let sl = (kw - 1) * ch;
    let (y, pool) = o.split_at_mut(1);
    let slots = pool_slots(&i[2].i32()?, pool[0].dims()[0])?;
    pool[0].with_f32(true, |pool| {
        y[0].with_f32(false, |y| {
            for (si, &slot) in slots.iter().enumerate() {
                let st = &mut pool[slot * sl..(slot + 1) * sl];
                conv_seq(
                    &x[si * ch..(si + 1) * ch],
                    &w,
                    kw,
                    ch,
                    silu,
                    st,
                    &mut y[si * ch..(si + 1) * ch],
                );
            }
            Ok(())
        })
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &ConvOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        ConvOp::Conv1d { silu } => conv1d(*silu, i, o),
        ConvOp::Conv1dDecode { silu } => conv1d_decode(*silu, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &ConvOp) -> bool {
    false
}
