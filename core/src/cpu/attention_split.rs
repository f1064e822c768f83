//! Paged decode attention split among the threads over a long context: a decode step of one
//! sequence or a few, or of a batch of sequences.
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
//!
//! Both the scoring and the weighing tasks read a key position's rows of every KV head they
//! need together, a few keys at a time: those rows lie side by side in the cache, where one
//! head's rows alone lie a stride apart (a prefetcher that follows them fetches the other
//! heads' rows anyway, and reading them for one head at a time left SmolLM2's decode at 4k
//! tokens reading its f32 cache at ~10 GB/s). That holds for a batch of sequences decoding
//! together too, whose row-path tasks are plenty but each reads one KV head's rows: four
//! SmolLM2 sequences at 2k tokens on two threads decode 1.28× as fast split.

use super::{cache_row, score_keys, softmax_row, weigh_values, BUFS, PAGED_AHEAD};
use crate::cpu::{pool, simd, In};
use crate::op::AttnParams;
use crate::quant;

/// Keys one scoring task takes (a multiple of 4, the micro-kernel's keys a call).
const SPLIT_KEYS: usize = 256;

/// Keys a scoring task takes of one KV head before the next head's rows of the same keys
/// (a multiple of 4): 16 keys of SmolLM2's three heads of 64 f32 are 12 KB, in the
/// first-level cache while every head reads them.
const STREAM_KEYS: usize = 16;

thread_local! {
    /// The scores of a split step, kept by the thread that starts it (a fresh buffer of this
    /// size a layer would be mapped and faulted in each time).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether `t` query tokens of `hq` query heads each over key ranges up to `longest` long
/// are worth the split: the keys are many enough to pay for two more joins, and the scores
/// it keeps (`t · hq · longest`) are either a few tokens' (no more than the threads) or
/// within [`SPLIT_SCORES`]. The row path reads each KV head's rows apart, a stride apart in
/// the cache: Llama 3.2 1 B's eight KV heads at 4k tokens, one sequence, 28 → 34 t/s split;
/// one thread, one task a step, SmolLM2 at 4k tokens 39.5 → 67.9 t/s; four sequences
/// decoding together at 2k tokens, SmolLM2 135 → 173 t/s in all.
pub(super) fn pays(t: usize, hq: usize, longest: usize) -> bool {
    longest >= 2 * SPLIT_KEYS
        && (t <= pool::threads() || t.saturating_mul(hq).saturating_mul(longest) <= SPLIT_SCORES)
}

/// Scores (f32) a split step of more tokens than threads keeps at most (16 MB): past it the
/// row path, which keeps none.
const SPLIT_SCORES: usize = 1 << 22;

/// A paged cache as the split reads it: the tensor, its rows as f32 where it is f32, its bytes
/// a row.
pub(super) type Cache<'a, 'c> = (&'a In<'c>, Option<&'c [f32]>, usize);

/// Paged decode attention for `t` query tokens (`q`: `[t, hq, d]`), each KV head's group of
/// query heads a unit (`y`: `[t, hq, dv]`): `range(ti, s)` is token `ti`'s key range in its
/// sequence `seq_of[ti]`, `locate(s, j, g)` the cache row of key `j` of head `g`, which
/// is `locate(s, j, 0) + g` (a key position's rows of every KV head side by side).
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

    // The scores, SPLIT_KEYS keys of one token a task, every KV head of it: a key position's
    // rows of all the KV heads lie side by side in the cache, so a task streams through
    // whole blocks (one KV head's rows alone lie a stride apart, which the hardware's
    // prefetchers follow by fetching the other heads' rows anyway). A token's units share
    // its key range.
    let tasks: Vec<(usize, usize, usize)> = (0..t)
        .flat_map(|ti| {
            let (lo, hi) = spans[ti * hkv];
            (lo..hi)
                .step_by(SPLIT_KEYS)
                .map(move |j| (ti, j, (j + SPLIT_KEYS).min(hi)))
        })
        .collect();
    // A key position's rows of every KV head, decoded at once where the cache is not f32 (one
    // call of the row decoder for them all; the same values as a head's row alone).
    let whole =
        (kf.is_none() && kc.desc.dtype.bytes_for(hkv * d) == Some(hkv * krb)).then_some(hkv * d);
    pool::par(tasks.len(), |i| {
        let (ti, j0, j1) = tasks[i];
        let s = seq_of[ti];
        let (lo, hi) = spans[ti * hkv];
        let mut decoded = vec![0f32; whole.map_or(0, |w| STREAM_KEYS * w)];
        BUFS.with(|b| {
            let mut b = b.borrow_mut();
            let sp = &sp;
            let mut base = KeyRows::new(j0);
            for k0 in (j0..j1).step_by(STREAM_KEYS) {
                let k1 = (k0 + STREAM_KEYS).min(j1);
                base.reach((k1 + PAGED_AHEAD).min(hi), |j| locate(s, j, 0));
                if let Some(w) = whole {
                    base.decode(
                        kc,
                        krb,
                        k0..k1,
                        (0, hkv * krb),
                        &mut decoded[..(k1 - k0) * w],
                    );
                }
                for g in 0..hkv {
                    let u = ti * hkv + g;
                    let h = u * heads;
                    let (base, decoded) = (&base, &decoded);
                    let mut key = |j: usize, buf: &mut [f32]| {
                        if let Some(w) = whole {
                            let at = (j - k0) * w + g * d;
                            return Some(&decoded[at..at + d]);
                        }
                        // Head 0's row starts the key position's rows of every head.
                        if g == 0 && j + PAGED_AHEAD < base.end {
                            let at = base.row(j + PAGED_AHEAD) * krb;
                            simd::prefetch(kc.bytes.as_ptr().wrapping_add(at), hkv * krb);
                        }
                        cache_row(kc, kf, base.row(j) + g, d, krb, buf)
                    };
                    // SAFETY: unit u's scores are `heads` rows of hi - lo at offs[u]; this
                    // task alone writes the columns of keys j0..j1.
                    unsafe {
                        score_keys(
                            p,
                            (&q[h * d..(h + heads) * d], heads),
                            (lo, hi - lo),
                            k0..k1,
                            sp.0.add(offs[u]),
                            &mut b.0,
                            &mut key,
                        )
                    };
                }
            }
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

    // The weighted sums: a token's value rows of every KV head (side by side in the cache)
    // are split into as many ranges of whole vectors as there are threads (whole blocks of a
    // block-type cache), and each task walks the keys STREAM_KEYS at a time, its range's rows
    // of those keys read once (an f32 cache's in place, others decoded into a buffer), each
    // KV head's part through the register kernel with the sums carried over from the keys
    // before (the same chain of fused multiply-adds over the keys in ascending order, the same
    // values a row decoded whole gives). Else (no AVX-512, or heads of a width the ranges do
    // not divide) a unit a task.
    let yp = pool::SendPtr(y.as_mut_ptr());
    let unit = heads * dv;
    let scores = &owned;
    let vdt = vc.desc.dtype;
    // The ranges' granule: a vector, or a block where blocks are longer.
    let gran = 16 * vdt.block_size().div_ceil(16).max(1);
    let columns = simd::isa() == simd::Isa::Avx512
        && dv.is_multiple_of(gran)
        && gran.is_multiple_of(vdt.block_size().max(1))
        && vdt.bytes_for(gran).is_some();
    if columns {
        let grains = hkv * dv / gran;
        let parts = pool::threads().clamp(1, grains.max(1));
        pool::par(t * parts, |i| {
            let (ti, part) = (i / parts, i % parts);
            let (c_lo, c_hi) = (
                gran * (part * grains / parts),
                gran * ((part + 1) * grains / parts),
            );
            let s = seq_of[ti];
            let (lo, hi) = spans[ti * hkv];
            // This range's pieces: (KV head, its first column, columns).
            let pieces: Vec<(usize, usize, usize)> = (c_lo / dv..c_hi.div_ceil(dv))
                .map(|g| {
                    let c0 = c_lo.max(g * dv);
                    let c1 = c_hi.min((g + 1) * dv);
                    (g, c0 - g * dv, c1 - c0)
                })
                .collect();
            let width = c_hi - c_lo;
            // The range's bytes within a key position's rows (whole blocks: `gran` divides
            // every bound), and its rows decoded where the cache is not f32.
            let (b_lo, b_len) = (
                vdt.bytes_for(c_lo).unwrap_or(0),
                vdt.bytes_for(width).unwrap_or(0),
            );
            let mut decoded = match vf {
                Some(_) => Vec::new(),
                None => vec![0f32; STREAM_KEYS * width],
            };
            let mut sums = vec![0f32; heads * width];
            let mut rows = Vec::with_capacity(STREAM_KEYS);
            let mut fetch = Vec::with_capacity(STREAM_KEYS);
            let mut base = KeyRows::new(lo);
            for k0 in (lo..hi).step_by(STREAM_KEYS) {
                let k1 = (k0 + STREAM_KEYS).min(hi);
                base.reach((k1 + PAGED_AHEAD).min(hi), |j| locate(s, j, 0));
                if vf.is_none() {
                    base.decode(
                        vc,
                        vrb,
                        k0..k1,
                        (b_lo, b_len),
                        &mut decoded[..(k1 - k0) * width],
                    );
                }
                let mut at = 0;
                for &(g, c0, cw) in &pieces {
                    let u = ti * hkv + g;
                    rows.clear();
                    fetch.clear();
                    match vf {
                        Some(v) => {
                            let addr =
                                |j: usize| v[(base.row(j) + g) * dv + c0..].as_ptr() as usize;
                            rows.extend((k0..k1).map(addr));
                            fetch.extend((k0 + PAGED_AHEAD..base.end).map(addr));
                        }
                        None => {
                            let col = g * dv + c0 - c_lo;
                            rows.extend(
                                (k0..k1)
                                    .map(|j| decoded[(j - k0) * width + col..].as_ptr() as usize),
                            );
                        }
                    }
                    // SAFETY: every address is `cw` f32 of a value row, in the cache or
                    // decoded, which outlives the call.
                    let done = unsafe {
                        simd::weighted_rows(
                            &scores[offs[u] + (k0 - lo)..offs[u + 1]],
                            hi - lo,
                            heads,
                            &rows,
                            &fetch,
                            cw,
                            &mut sums[at..at + heads * cw],
                            k0 > lo,
                        )
                    };
                    debug_assert!(done, "AVX-512 was checked above");
                    at += heads * cw;
                }
            }
            let yp = &yp;
            let mut at = 0;
            for &(g, c0, cw) in &pieces {
                for (r, row) in sums[at..at + heads * cw].chunks_exact(cw).enumerate() {
                    let o = (ti * hkv + g) * unit + r * dv + c0;
                    // SAFETY: columns c0..c0 + cw of head r of unit (ti, g): this task's alone.
                    let dst = unsafe { std::slice::from_raw_parts_mut(yp.0.add(o), cw) };
                    dst.copy_from_slice(row);
                }
                at += heads * cw;
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

/// The head-0 cache rows of a task's run of keys in ascending order, each located once
/// (a block-table lookup and a division), kept for the [`STREAM_KEYS`] keys being read and
/// the [`PAGED_AHEAD`] after them.
struct KeyRows {
    ring: [usize; RING],
    /// One past the last key located.
    end: usize,
}

/// Keys [`KeyRows`] holds (a power of two).
const RING: usize = 64;
const _: () = assert!(STREAM_KEYS + PAGED_AHEAD <= RING && RING.is_power_of_two());

impl KeyRows {
    fn new(start: usize) -> Self {
        KeyRows {
            ring: [0; RING],
            end: start,
        }
    }

    /// Locates the keys up to `to` (exclusive) not yet located; keys below `to - RING` are
    /// forgotten.
    #[inline(always)]
    fn reach(&mut self, to: usize, locate: impl Fn(usize) -> usize) {
        while self.end < to {
            self.ring[self.end % RING] = locate(self.end);
            self.end += 1;
        }
    }

    /// Key `j`'s row (located, and not forgotten).
    #[inline(always)]
    fn row(&self, j: usize) -> usize {
        self.ring[j % RING]
    }

    /// Decodes bytes `b_lo..b_lo + b_len` of each of `keys`' rows of every KV head (rows of
    /// `rb` bytes a head, side by side from head 0's) into `out`, a key after another in
    /// equal parts, prefetching the same bytes [`PAGED_AHEAD`] keys on as each is decoded.
    /// The keys must be located.
    #[inline(always)]
    fn decode(
        &self,
        cache: &In,
        rb: usize,
        keys: std::ops::Range<usize>,
        (b_lo, b_len): (usize, usize),
        out: &mut [f32],
    ) {
        let width = out.len() / keys.len().max(1);
        for (j, y) in keys.zip(out.chunks_exact_mut(width.max(1))) {
            if j + PAGED_AHEAD < self.end {
                let at = self.row(j + PAGED_AHEAD) * rb + b_lo;
                simd::prefetch(cache.bytes.as_ptr().wrapping_add(at), b_len);
            }
            let at = self.row(j) * rb + b_lo;
            quant::dequantize_row(cache.desc.dtype, &cache.bytes[at..at + b_len], y);
        }
    }
}

/// Scores (f32) a thread keeps between steps at most (16 MB).
const KEEP_SCORES: usize = 1 << 22;

#[cfg(test)]
thread_local! {
    /// Split steps this thread started (the tests check that theirs took this path).
    pub(super) static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
