//! Paged decode attention split among the threads where its units are too few for them.
//!
//! The row path gives each task one token's query heads that share a KV head, so a decode step
//! of one sequence has as many tasks as the model has KV heads: three for SmolLM2 on two
//! threads leave one thread idle a third of the time, one (Gemma 3) leaves all but one idle —
//! or, split a query head a task, reads every key and value row once per head. Over a long
//! context that is most of a token's time. Here the three steps of [`super::attend`] run one
//! after the other, each split among the threads on its own terms, with the same arithmetic:
//! the scores by ranges of keys (a score depends on its query and key rows alone), the
//! softmax by rows, and the weighted sums by ranges of value columns (each output element is
//! one chain of fused multiply-adds over the keys in ascending order, whichever columns run
//! beside it). So the output is the row path's, bit for bit, whatever the thread count.

use super::{cache_row, score_keys, softmax_row, weigh_values, BUFS, PAGED_AHEAD};
use crate::cpu::{pool, simd, In};
use crate::op::AttnParams;

/// Keys one scoring task takes (a multiple of 4, the micro-kernel's keys a call).
const SPLIT_KEYS: usize = 256;

/// Value columns one weighing task takes (a multiple of 16, a vector).
const SPLIT_COLUMNS: usize = 32;

thread_local! {
    /// The scores of a split step, kept by the thread that starts it (a fresh buffer of this
    /// size a layer would be mapped and faulted in each time).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether `units` (query tokens × KV heads) over keys ranges up to `longest` long are worth
/// the split: some thread would idle for a unit's time, and the keys are many enough to pay
/// for two more joins.
pub(super) fn pays(units: usize, longest: usize) -> bool {
    let threads = pool::threads();
    threads > 1
        && longest >= 2 * SPLIT_KEYS
        && (units < threads || (!units.is_multiple_of(threads) && units < 4 * threads))
}

/// A paged cache as the split reads it: the tensor, its rows as f32 where it is f32, its bytes
/// a row.
pub(super) type Cache<'a, 'c> = (&'a In<'c>, Option<&'c [f32]>, usize);

/// Paged decode attention for `t` query tokens (`q`: `[t, hq, d]`), each KV head's group of
/// query heads a unit (`y`: `[t, hq, dv]`): `range(ti, s)` is token `ti`'s key range in its
/// sequence `seq_of[ti]`, `locate(s, j, g)` the cache row of key `j` of head `g`.
#[allow(clippy::too_many_arguments)]
pub(super) fn paged_split<'c>(
    p: &AttnParams,
    q: &[f32],
    (t, hq, d): (usize, usize, usize),
    (hkv, dv): (usize, usize),
    (kc, kf, krb): Cache<'_, 'c>,
    (vc, vf, vrb): Cache<'_, 'c>,
    seq_of: &[usize],
    range: impl Fn(usize, usize) -> (usize, usize) + Sync,
    locate: impl Fn(usize, usize, usize) -> usize + Sync,
    y: &mut [f32],
) {
    let heads = hq / hkv.max(1);
    let units = t * hkv;
    // Unit u: token u / hkv, KV head u % hkv, query heads u·heads.., its keys and scores.
    let spans: Vec<(usize, usize)> = (0..units)
        .map(|u| {
            let ti = u / hkv;
            let (lo, hi) = range(ti, seq_of[ti]);
            (lo, hi.max(lo))
        })
        .collect();
    let mut offs = Vec::with_capacity(units + 1);
    offs.push(0usize);
    for &(lo, hi) in &spans {
        offs.push(offs[offs.len() - 1] + heads * (hi - lo));
    }
    let mut owned = SCORES.with(|c| c.take());
    owned.clear();
    owned.resize(offs[units], 0.0);
    let sp = pool::SendPtr(owned.as_mut_ptr());
    let key_rows = |u: usize| {
        let (ti, g) = (u / hkv, u % hkv);
        (seq_of[ti], g, spans[u])
    };

    // The scores, SPLIT_KEYS keys a task.
    let tasks: Vec<(usize, usize, usize)> = (0..units)
        .flat_map(|u| {
            let (lo, hi) = spans[u];
            (lo..hi)
                .step_by(SPLIT_KEYS)
                .map(move |j| (u, j, (j + SPLIT_KEYS).min(hi)))
        })
        .collect();
    pool::par(tasks.len(), |i| {
        let (u, j0, j1) = tasks[i];
        let (s, g, (lo, hi)) = key_rows(u);
        let h = u * heads;
        BUFS.with(|b| {
            let mut b = b.borrow_mut();
            let mut key = |j: usize, buf: &mut [f32]| {
                if j + PAGED_AHEAD < hi {
                    let r = locate(s, j + PAGED_AHEAD, g);
                    simd::prefetch(kc.bytes.as_ptr().wrapping_add(r * krb), krb);
                }
                cache_row(kc, kf, locate(s, j, g), d, krb, buf)
            };
            let sp = &sp;
            // SAFETY: unit u's scores are `heads` rows of hi - lo at offs[u]; this task alone
            // writes the columns of keys j0..j1.
            unsafe {
                score_keys(
                    p,
                    (&q[h * d..(h + heads) * d], heads),
                    (lo, hi - lo),
                    j0..j1,
                    sp.0.add(offs[u]),
                    &mut b.0,
                    &mut key,
                )
            };
        });
    });

    // The softmax, a row a task.
    pool::par(units * heads, |i| {
        let (u, r) = (i / heads, i % heads);
        let n = spans[u].1 - spans[u].0;
        let sp = &sp;
        // SAFETY: row r of unit u's scores, this task's alone.
        softmax_row(unsafe { std::slice::from_raw_parts_mut(sp.0.add(offs[u] + r * n), n) });
    });

    // The weighted sums: by ranges of value columns where the value rows are f32 in the cache
    // and fit the register kernel, else a unit a task.
    let yp = pool::SendPtr(y.as_mut_ptr());
    let unit = heads * dv;
    let scores = &owned;
    // Not past 4 heads and 64 columns (one pass of weighted_rows): with Gemma 3's values of
    // 256, eight column tasks each walking every key measured slower (d4000: 130 → 117 t/s)
    // than a unit a task.
    let columns = vf.is_some()
        && simd::isa() == simd::Isa::Avx512
        && heads <= 4
        && dv <= 64
        && dv.is_multiple_of(16);
    if columns {
        let parts = dv.div_ceil(SPLIT_COLUMNS);
        pool::par(units * parts, |i| {
            let (u, c0) = (i / parts, (i % parts) * SPLIT_COLUMNS);
            let cw = SPLIT_COLUMNS.min(dv - c0);
            let (s, g, (lo, hi)) = key_rows(u);
            let n = hi - lo;
            let mut part = vec![0f32; heads * cw];
            if let Some(v) = vf {
                let rows: Vec<usize> = (lo..hi)
                    .map(|j| v[locate(s, j, g) * dv + c0..].as_ptr() as usize)
                    .collect();
                // SAFETY: every address is `cw` f32 of a value row in the cache.
                let done = n > 0
                    && unsafe {
                        simd::weighted_rows(
                            &scores[offs[u]..offs[u + 1]],
                            n,
                            heads,
                            &rows,
                            cw,
                            &mut part,
                            false,
                        )
                    };
                debug_assert!(done || n == 0, "AVX-512 was checked above");
            }
            let yp = &yp;
            for (r, row) in part.chunks_exact(cw).enumerate() {
                // SAFETY: columns c0..c0 + cw of head r of unit u: this task's alone.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(yp.0.add(u * unit + r * dv + c0), cw) };
                dst.copy_from_slice(row);
            }
        });
    } else {
        pool::par(units, |u| {
            let (s, g, (lo, hi)) = key_rows(u);
            let yp = &yp;
            // SAFETY: unit u's output rows, this task's alone.
            let out = unsafe { std::slice::from_raw_parts_mut(yp.0.add(u * unit), unit) };
            BUFS.with(|b| {
                let mut b = b.borrow_mut();
                let (_, vb, _, at) = &mut *b;
                let mut val = |j: usize, buf: &mut [f32]| {
                    if j + PAGED_AHEAD < hi {
                        let r = locate(s, j + PAGED_AHEAD, g);
                        simd::prefetch(vc.bytes.as_ptr().wrapping_add(r * vrb), vrb);
                    }
                    cache_row(vc, vf, locate(s, j, g), dv, vrb, buf)
                };
                weigh_values(
                    &scores[offs[u]..offs[u + 1]],
                    (lo, hi),
                    out,
                    (vb, at),
                    &mut val,
                );
            });
        });
    }
    #[cfg(test)]
    CALLS.with(|c| c.set(c.get() + 1));
    // Kept for the next step unless a long context's batch made it large.
    if owned.capacity() <= KEEP_SCORES {
        SCORES.with(|c| c.replace(owned));
    }
}

/// Scores (f32) a thread keeps between steps at most (16 MB).
const KEEP_SCORES: usize = 1 << 22;

#[cfg(test)]
thread_local! {
    /// Split steps this thread started (the tests check that theirs took this path).
    pub(super) static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
