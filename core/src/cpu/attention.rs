//! Attention over contiguous K/V, paged attention through a block table, and the KV write by
//! slot mapping that fills the paged caches.

use super::softmax::softmax_row;
use super::{index, pool, simd, In, KResult, KernelError, Out};
use crate::op::{AttentionOp, AttnParams, RopeParams};
use crate::quant;
use crate::tensor::DType;

thread_local! {
    /// Per-thread buffers of the attention kernels: four key rows, four value rows, the
    /// scores, the addresses of the value rows.
    static BUFS: std::cell::RefCell<(Vec<f32>, Vec<f32>, Vec<f32>, Vec<usize>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
    /// Per-thread key and value rows of one KV head, gathered (dequantized) once for a piece of
    /// query rows ([`paged`]'s shared path).
    static DECODED: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The scores of one query row against up to four keys (`dst.len()` of the dot products
/// `row`): scaled, then soft-capped where the layer caps them.
#[inline(always)]
fn store_scores(p: &AttnParams, row: &[f32; 4], dst: &mut [f32]) {
    match p.soft_cap {
        None => {
            for (o, &v) in dst.iter_mut().zip(row) {
                *o = v * p.scale;
            }
        }
        Some(c) => {
            for (o, &v) in dst.iter_mut().zip(row) {
                *o = c * ((v * p.scale) / c).tanh();
            }
        }
    }
}

/// Softmax-weighted sums over keys `lo..hi` for the `heads` query rows of one token that
/// share a KV head (`q`: `heads` rows of `d`; `out`: `heads` rows of `dv`). `key(j, buf)` and
/// `val(j, buf)` give the row of key position `j`: `Some` slice of the cache itself where it
/// is f32, else `None` after filling `buf` with the dequantized row.
///
/// The scores go through the dot micro-kernel four keys by up to four heads at a time, so a
/// key row is read once for its whole group of heads; each score is summed in the same order
/// whatever the batch, the heads or the key count around it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend<'c>(
    p: &AttnParams,
    q: &[f32],
    heads: usize,
    lo: usize,
    hi: usize,
    out: &mut [f32],
    mut key: impl FnMut(usize, &mut [f32]) -> Option<&'c [f32]>,
    mut val: impl FnMut(usize, &mut [f32]) -> Option<&'c [f32]>,
) {
    let n = hi.saturating_sub(lo);
    if heads == 0 {
        return;
    }
    BUFS.with(|b| {
        let mut b = b.borrow_mut();
        let (kb, vb, scores, at) = &mut *b;
        scores.clear();
        // Zero-width keys score 0 (the softmax then weighs the values evenly).
        scores.resize(heads * n, 0.0);
        // SAFETY: `scores` holds `heads` rows of `n`.
        unsafe {
            score_keys(
                p,
                (q, heads),
                (lo, n),
                lo..hi,
                scores.as_mut_ptr(),
                kb,
                &mut key,
            )
        };
        for h in 0..heads {
            softmax_row(&mut scores[h * n..(h + 1) * n]);
        }
        weigh_values(scores, (lo, hi), out, (vb, at), &mut val);
    })
}

/// [`attend`]'s scores of keys `keys` (within `lo..lo + n`): `heads` query rows `q` against
/// them four keys at a time, into `scores` (`heads` rows of `n`, column `j - lo` for key `j`).
/// Each score's bits depend on its query and key row alone, so any split of the keys gives
/// the same scores.
///
/// # Safety
/// `scores` holds `heads` rows of `n` f32, and no one else writes the columns of `keys`.
#[inline(always)]
unsafe fn score_keys<'c>(
    p: &AttnParams,
    (q, heads): (&[f32], usize),
    (lo, n): (usize, usize),
    keys: std::ops::Range<usize>,
    scores: *mut f32,
    kb: &mut Vec<f32>,
    key: &mut impl FnMut(usize, &mut [f32]) -> Option<&'c [f32]>,
) {
    let d = q.len() / heads.max(1);
    let isa = simd::isa();
    let mr_max = simd::max_rows(isa);
    kb.resize(4 * d, 0.0);
    let mut sums: simd::Sums = [[0.0; 4]; 4];
    let hi = keys.end;
    for j0 in keys.step_by(4).filter(|_| d > 0) {
        let nk = 4.min(hi - j0);
        // Fewer than four keys repeat the last one; its scores are not kept.
        let mut rows = [std::ptr::null::<f32>(); 4];
        for ((t, r), buf) in rows.iter_mut().enumerate().zip(kb.chunks_exact_mut(d)) {
            *r = match key(j0 + t.min(nk - 1), buf) {
                Some(row) if row.len() >= d => row.as_ptr(),
                _ => buf.as_ptr(),
            };
        }
        for h0 in (0..heads).step_by(mr_max) {
            let mr = mr_max.min(heads - h0);
            // SAFETY: q holds `heads` rows of d from h0 on, each key row d f32 (a cache
            // row checked above or a row of kb, each borrowed once and not resized while
            // the pointers live).
            unsafe { simd::dots(isa, q[h0 * d..].as_ptr(), d, mr, rows, d, &mut sums) };
            for (i, row) in sums.iter().enumerate().take(mr) {
                let at = (h0 + i) * n + (j0 - lo);
                // SAFETY: the caller's `scores` holds this row's columns j0 - lo .. + nk.
                let dst = unsafe { std::slice::from_raw_parts_mut(scores.add(at), nk) };
                store_scores(p, row, dst);
            }
        }
    }
}

/// [`attend`]'s weighted sums: `out` (`heads` rows of `dv`) = the softmax weights `scores`
/// (`heads` rows of `hi - lo`) times the value rows `val(j)` of keys `lo..hi`, each output
/// element one chain of fused multiply-adds over the keys in ascending order.
fn weigh_values<'c>(
    scores: &[f32],
    (lo, hi): (usize, usize),
    out: &mut [f32],
    (vb, at): (&mut Vec<f32>, &mut Vec<usize>),
    val: &mut impl FnMut(usize, &mut [f32]) -> Option<&'c [f32]>,
) {
    let n = hi.saturating_sub(lo);
    let heads = if n == 0 { 0 } else { scores.len() / n };
    let dv = match heads {
        0 => 0,
        h => out.len() / h,
    };
    vb.resize(4 * dv, 0.0);
    out.fill(0.0);
    // Where every value row is in memory as it is (an f32 cache, or rows gathered for a
    // piece of prefill rows) and one pass of weighted_rows holds every sum (at most 4
    // heads × 64 values: more would read the rows once per pass, where the loop below
    // reads each once), all of them at once with the sums in registers (the same bits).
    at.clear();
    for j in (lo..hi).filter(|_| dv > 0 && dv <= 64 && heads <= 4) {
        match val(j, &mut vb[..dv]) {
            Some(row) if row.len() >= dv => at.push(row.as_ptr() as usize),
            _ => break,
        }
    }
    // SAFETY: every address is a value row of at least dv f32 that lives for 'c.
    if at.len() == n
        && n > 0
        && unsafe {
            let fetch = at.get(PAGED_AHEAD..).unwrap_or(&[]);
            simd::weighted_rows(scores, n, heads, at, fetch, dv, out, false)
        }
    {
        return;
    }
    // Four value rows at a time into every head's output (the sums in key order, as one
    // row at a time would make them).
    for j0 in (lo..hi).step_by(4).filter(|_| dv > 0) {
        let nk = 4.min(hi - j0);
        let mut rows: [&[f32]; 4] = [&[]; 4];
        for ((t, r), buf) in rows
            .iter_mut()
            .enumerate()
            .take(nk)
            .zip(vb.chunks_exact_mut(dv))
        {
            *r = match val(j0 + t, buf) {
                Some(row) => row,
                None => buf,
            };
        }
        for (h, o) in out.chunks_exact_mut(dv).enumerate() {
            let s = &scores[h * n + (j0 - lo)..h * n + (j0 - lo) + nk];
            simd::axpy_rows(s, &rows[..nk], o);
        }
    }
}

/// Keys a tile of query rows takes at a time in [`attend_rows`]: their key and value rows
/// (with heads of 64, 64 KB) stay in the core's second-level cache while every row of the
/// tile uses them.
const KEY_BLOCK: usize = 128;

/// Query tokens [`attend_rows`] takes together at most: their scores (tokens × heads × keys,
/// 1 MB for 16 tokens of 4 heads at 4k keys) stay in the second-level cache.
const ROW_BLOCK: usize = 16;

/// Scores a tile may hold (f32): fewer tokens a tile past it, so a thread's score buffer
/// stays at 4 MB whatever the context (one token a tile at 128k keys and 8 heads).
const TILE_SCORES: usize = 1 << 20;

/// [`attend`] for several query tokens of one sequence that share a KV head, with their keys
/// and values gathered into contiguous rows (`kd`, `vd`: rows of `d` and `dv` for key
/// positions `klo ..`): token `r` has its `heads` query rows at `q[r·qs ..]` and its key range
/// `ranges[r]`, and writes `out[r·os ..][.. heads·dv]`. The keys go by in blocks of
/// [`KEY_BLOCK`], each block used by every token before the next is read, so a long context's
/// keys and values come from memory once per [`ROW_BLOCK`] tokens instead of once per token.
/// Every score is the same micro-kernel sum of the same row pair, every softmax the same
/// function of the same scores, and every output element the same chain of fused
/// multiply-adds over the keys in ascending order (resumed from the stored sum at each block),
/// so the output is [`attend`]'s, bit for bit. AVX-512 only; false (nothing done) elsewhere.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    p: &AttnParams,
    (q, qs): (&[f32], usize),
    heads: usize,
    ranges: &[(usize, usize)],
    (kd, vd, klo): (&[f32], &[f32], usize),
    (d, dv): (usize, usize),
    (out, os): (&mut [f32], usize),
) -> bool {
    let isa = simd::isa();
    let tokens = ranges.len();
    if isa != simd::Isa::Avx512 || tokens > ROW_BLOCK || heads == 0 || d == 0 || dv == 0 {
        return false;
    }
    let mr_max = simd::max_rows(isa);
    // Where token r's scores start (heads rows of its key count).
    let n_of = |r: usize| ranges[r].1.saturating_sub(ranges[r].0);
    BUFS.with(|b| {
        let mut b = b.borrow_mut();
        let (_, _, scores, at) = &mut *b;
        let mut off = [0usize; ROW_BLOCK + 1];
        for r in 0..tokens.min(ROW_BLOCK) {
            off[r + 1] = off[r] + heads * n_of(r);
        }
        // Every score a token's range holds is written below before it is read.
        if scores.len() < off[tokens] {
            scores.resize(off[tokens], 0.0);
        }
        let (kmin, kmax) = ranges
            .iter()
            .filter(|(lo, hi)| hi > lo)
            .fold((usize::MAX, 0), |(a, b), &(lo, hi)| (a.min(lo), b.max(hi)));
        let mut sums: simd::Sums = [[0.0; 4]; 4];
        for kb in (kmin..kmax).step_by(KEY_BLOCK) {
            let kend = (kb + KEY_BLOCK).min(kmax);
            for (r, &(lo, hi)) in ranges.iter().enumerate() {
                let (a, e, n) = (lo.max(kb), hi.min(kend), n_of(r));
                for j0 in (a..e).step_by(4) {
                    let nk = 4.min(e - j0);
                    // Fewer than four keys repeat the last one; its scores are not kept.
                    let mut rows = [std::ptr::null::<f32>(); 4];
                    for (t, row) in rows.iter_mut().enumerate() {
                        *row = kd[(j0 + t.min(nk - 1) - klo) * d..][..d].as_ptr();
                    }
                    for h0 in (0..heads).step_by(mr_max) {
                        let mr = mr_max.min(heads - h0);
                        // SAFETY: q holds token r's heads rows of d from h0 on, each key row
                        // d f32 of kd (bounds-checked slices above).
                        unsafe {
                            simd::dots(
                                isa,
                                q[r * qs + h0 * d..].as_ptr(),
                                d,
                                mr,
                                rows,
                                d,
                                &mut sums,
                            )
                        };
                        for (i, row) in sums.iter().enumerate().take(mr) {
                            let at = off[r] + (h0 + i) * n + (j0 - lo);
                            store_scores(p, row, &mut scores[at..at + nk]);
                        }
                    }
                }
            }
        }
        for (r, &o) in off.iter().enumerate().take(tokens) {
            for h in 0..heads {
                softmax_row(&mut scores[o + h * n_of(r)..][..n_of(r)]);
            }
            out[r * os..][..heads * dv].fill(0.0);
        }
        for kb in (kmin..kmax).step_by(KEY_BLOCK) {
            let kend = (kb + KEY_BLOCK).min(kmax);
            at.clear();
            at.extend((kb..kend).map(|j| vd[(j - klo) * dv..][..dv].as_ptr() as usize));
            for (r, &(lo, hi)) in ranges.iter().enumerate() {
                let (a, e, n) = (lo.max(kb), hi.min(kend), n_of(r));
                if a >= e {
                    continue;
                }
                let w = &scores[off[r] + (a - lo)..off[r] + (heads - 1) * n + (e - lo)];
                // SAFETY: every address is a row of dv f32 in vd.
                let done = unsafe {
                    simd::weighted_rows(
                        w,
                        n,
                        heads,
                        &at[a - kb..e - kb],
                        &[],
                        dv,
                        &mut out[r * os..][..heads * dv],
                        true,
                    )
                };
                debug_assert!(done, "AVX-512 was checked above");
            }
        }
    });
    true
}

/// Keys ahead of the one being read whose cache rows paged attention prefetches.
const PAGED_AHEAD: usize = 32;

/// Pieces per thread: a causal prompt's later rows cost more, so many small pieces.
const ATTN_PIECES: usize = 8;

/// Query heads per task: the whole group that shares a KV head (each key row read once for
/// all of them), unless that leaves fewer tasks than threads (decode on a model with one KV
/// head), then one head per task. A score's bits do not depend on this.
fn unit_heads(t: usize, hkv: usize, group: usize) -> usize {
    if t * hkv < pool::threads() {
        1
    } else {
        group.max(1)
    }
}

/// Query rows of one head scored together by the tiled path: each key row read once for all.
const ROW_TILE: usize = 16;

/// Contiguous attention where every query row sees the same keys (a bidirectional mask: a
/// vision tower's) over many rows: the rows of one head are scored in tiles of
/// [`ROW_TILE`] through [`attend`] (as if they were heads sharing a KV head), so a key row is
/// read once per tile instead of once per row. Every score, weight and sum is computed as
/// the row-at-a-time path computes it (same micro-kernel order), so the output is the same
/// bits.
#[allow(clippy::too_many_arguments)]
fn attention_tiled(
    p: &AttnParams,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (t, hq, d): (usize, usize, usize),
    (s, hkv, dv): (usize, usize, usize),
    y: &mut [f32],
) {
    let group = hq / hkv.max(1);
    let (lo, hi) = p.mask.key_range(0, s);
    super::attention_tile::head_tiles(
        q,
        (t, hq, d),
        dv,
        (ROW_TILE, ATTN_PIECES),
        y,
        || (),
        |_, h, qrows, m, out| {
            let g = h / group.max(1);
            attend(
                p,
                qrows,
                m,
                lo,
                hi,
                out,
                |j, _| Some(&k[(j * hkv + g) * d..(j * hkv + g + 1) * d]),
                |j, _| Some(&v[(j * hkv + g) * dv..(j * hkv + g + 1) * dv]),
            );
        },
    );
}

pub(crate) fn attention(p: &AttnParams, i: &[In], o: &mut [Out]) -> KResult {
    let q = i[0].f32()?;
    let k = i[1].f32()?;
    let v = i[2].f32()?;
    let (t, hq, d) = (i[0].dims()[0], i[0].dims()[1], i[0].dims()[2]);
    let (s, hkv) = (i[1].dims()[0], i[1].dims()[1]);
    let dv = i[2].dims()[2];
    let group = hq / hkv;
    if p.mask == crate::op::Mask::Bidirectional && t >= ROW_TILE && d > 0 && dv > 0 {
        return o[0].with_f32(false, |y| {
            if super::attention_tile::supported() {
                super::attention_tile::attention(p, (&q, &k, &v), (t, hq, d), (s, hkv, dv), y);
            } else {
                attention_tiled(p, (&q, &k, &v), (t, hq, d), (s, hkv, dv), y);
            }
            Ok(())
        });
    }
    let heads = unit_heads(t, hkv, group);
    let unit = (heads * dv).max(1);
    o[0].with_f32(false, |y| {
        pool::par_rows_in(y, unit, 0, ATTN_PIECES, |r0, ys| {
            for (ri, out) in ys.chunks_mut(unit).enumerate() {
                let h = (r0 + ri) * heads;
                let (ti, g) = (h / hq, h % hq / group);
                let pos = s - t + ti;
                let (lo, hi) = p.mask.key_range(pos, s);
                attend(
                    p,
                    &q[h * d..(h + heads) * d],
                    heads,
                    lo,
                    hi,
                    out,
                    |j, _| Some(&k[(j * hkv + g) * d..(j * hkv + g + 1) * d]),
                    |j, _| Some(&v[(j * hkv + g) * dv..(j * hkv + g + 1) * dv]),
                );
            }
        });
        Ok(())
    })
}

/// Per-sequence layout of a paged batch, validated against the tensors' sizes.
struct Batch {
    /// For each query row (token), its sequence.
    seq_of: Vec<usize>,
    /// For each query row, its absolute position.
    pos_of: Vec<usize>,
    seq_lens: Vec<usize>,
}

fn batch(t: usize, seq_lens: &[i32], q_start: &[i32], max_ctx: usize) -> KResult<Batch> {
    let s = seq_lens.len();
    let mut seq_of = Vec::with_capacity(t);
    let mut pos_of = Vec::with_capacity(t);
    let mut lens = Vec::with_capacity(s);
    if q_start.first() != Some(&0) || q_start.last().copied() != Some(t as i32) {
        return Err(KernelError::Data(format!(
            "q_start must run from 0 to the {t} query rows, got {q_start:?}"
        )));
    }
    for si in 0..s {
        let (a, b) = (q_start[si], q_start[si + 1]);
        if b < a {
            return Err(KernelError::Data(format!(
                "q_start decreases at sequence {si}"
            )));
        }
        let qlen = (b - a) as usize;
        let len = seq_lens[si];
        if len < 0 || (len as usize) < qlen || len as usize > max_ctx {
            return Err(KernelError::Data(format!(
                "sequence {si}: length {len} must cover its {qlen} queries and fit its block table ({max_ctx} slots)"
            )));
        }
        let len = len as usize;
        lens.push(len);
        for j in 0..qlen {
            seq_of.push(si);
            pos_of.push(len - qlen + j);
        }
    }
    Ok(Batch {
        seq_of,
        pos_of,
        seq_lens: lens,
    })
}

/// Row `r` (`width` elements, `row_bytes` bytes) of a paged cache: borrowed from `f32s` when
/// the cache is f32, else `None` after dequantizing it into `buf`.
#[inline(always)]
fn cache_row<'c>(
    cache: &In<'c>,
    f32s: Option<&'c [f32]>,
    r: usize,
    width: usize,
    row_bytes: usize,
    buf: &mut [f32],
) -> Option<&'c [f32]> {
    match f32s {
        Some(c) => Some(&c[r * width..(r + 1) * width]),
        None => {
            quant::dequantize_row(
                cache.desc.dtype,
                &cache.bytes[r * row_bytes..(r + 1) * row_bytes],
                buf,
            );
            None
        }
    }
}

/// Query rows a piece of the shared path, and a sequence of the batch, hold on average at
/// least, for it to be taken: below that rows hardly share their gathered keys (a batch of
/// decodes has one row a sequence), and the row path splits finer and reads f32 in place.
const SHARED_ROWS: usize = 4;

pub(crate) fn paged_attention(p: &AttnParams, i: &[In], o: &mut [Out]) -> KResult {
    let (t, seqs) = (i[0].dims()[0], i[4].dims()[0]);
    let shared = t >= SHARED_ROWS * ATTN_PIECES * pool::threads() && t >= SHARED_ROWS * seqs;
    paged(p, i, o, if shared { Path::Shared } else { Path::Decode })
}

/// How [`paged`] computes (each gives the same bits).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// The shared path.
    Shared,
    /// The split path where [`split::pays`] says so, else the row path.
    Decode,
    /// The row path (the tests' reference).
    #[cfg(test)]
    Rows,
}

/// Paged attention. Row path: each task takes one query token's heads that
/// share a KV head and reads every key and value row it needs from the cache (dequantizing
/// rows of a cache that is not f32 into a buffer, one row at a time). Over a long context
/// the split path takes its place ([`split::pays`]): the threads share each token's keys,
/// softmax rows and value columns, reading the cache's rows of every KV head together
/// (`attention_split.rs`). Shared path (prefill):
/// each task takes a piece of consecutive query tokens, and for each run of them from one
/// sequence and each KV head gathers the keys and values the run reads once, dequantized,
/// into contiguous rows, then scores every row against them: at an 8k context a prefill
/// chunk's rows otherwise dequantize the whole cache once each, and even f32 rows read in
/// place lie a KV-head stride apart in scattered blocks. Both call [`attend`] with the same
/// rows and heads, whose sums do not depend on how many heads it is given, so the output is
/// the same bits either way.
fn paged(p: &AttnParams, i: &[In], o: &mut [Out], path: Path) -> KResult {
    let q = i[0].f32()?;
    let (kc, vc) = (&i[1], &i[2]);
    let table = i[3].i32()?;
    let (seq_lens, q_start) = (i[4].i32()?, i[5].i32()?);
    let (t, hq, d) = (i[0].dims()[0], i[0].dims()[1], i[0].dims()[2]);
    let (nblocks, bs, hkv) = (kc.dims()[0], kc.dims()[1], kc.dims()[2]);
    let dv = vc.dims()[3];
    let maxb = i[3].dims()[1];
    let b = batch(t, &seq_lens, &q_start, maxb * bs)?;
    let key_end = match i.get(6) {
        Some(e) => Some(e.i32()?),
        None => None,
    };
    // Every block that some query row of a sequence reads is checked once here, so the
    // kernel trusts them. The first row's key range starts lowest (masks only move the
    // start forward); blocks before it may be released (-1) by sliding-window layers.
    for (s, &len) in b.seq_lens.iter().enumerate() {
        let (a, e) = (q_start[s] as usize, q_start[s + 1] as usize);
        if e == a {
            continue;
        }
        let (lo, _) = p.mask.key_range(b.pos_of[a], len);
        for j in lo / bs.max(1)..len.div_ceil(bs.max(1)) {
            index(table[s * maxb + j], nblocks, "block id")?;
        }
    }
    let group = hq / hkv;
    let (krb, vrb) = (kc.row_bytes(), vc.row_bytes());
    // Row index of head `g` of key position `j` of sequence `s`, through the block table.
    let locate =
        |s: usize, j: usize, g: usize| (table[s * maxb + j / bs] as usize * bs + j % bs) * hkv + g;
    // f32 caches are read in place; others are dequantized a row at a time.
    let kf: Option<&[f32]> = (kc.desc.dtype == DType::F32)
        .then(|| bytemuck::try_cast_slice(kc.bytes).ok())
        .flatten();
    let vf: Option<&[f32]> = (vc.desc.dtype == DType::F32)
        .then(|| bytemuck::try_cast_slice(vc.bytes).ok())
        .flatten();
    // The key range of query row `ti` of sequence `s`.
    let range = |ti: usize, s: usize| {
        let (lo, hi) = p.mask.key_range(b.pos_of[ti], b.seq_lens[s]);
        match key_end.as_ref().map(|e| e[ti]) {
            Some(e) => (lo, hi.max((e.max(0) as usize).min(b.seq_lens[s]))),
            None => (lo, hi),
        }
    };
    if path == Path::Shared {
        return o[0].with_f32(false, |y| {
            let unit = (hq * dv).max(1);
            pool::par_rows_in(y, unit, 0, ATTN_PIECES, |r0, ys| {
                DECODED.with(|c| {
                    let mut c = c.borrow_mut();
                    let (kd, vd) = &mut *c;
                    let rows = ys.len() / unit;
                    let mut a = 0;
                    while a < rows {
                        let s = b.seq_of[r0 + a];
                        let e = (a..rows).find(|&r| b.seq_of[r0 + r] != s).unwrap_or(rows);
                        let (klo, khi) = (r0 + a..r0 + e)
                            .map(|ti| range(ti, s))
                            .filter(|(lo, hi)| hi > lo)
                            .fold((usize::MAX, 0), |(a, b), (lo, hi)| (a.min(lo), b.max(hi)));
                        let n = khi.saturating_sub(klo);
                        for g in 0..hkv {
                            for (c, f, rb, w, buf) in
                                [(kc, kf, krb, d, &mut *kd), (vc, vf, vrb, dv, &mut *vd)]
                            {
                                buf.resize(n * w, 0.0);
                                for (j, row) in buf.chunks_exact_mut(w.max(1)).enumerate().take(n) {
                                    let r = locate(s, klo + j, g);
                                    match f {
                                        Some(c) => row.copy_from_slice(&c[r * w..(r + 1) * w]),
                                        None => quant::dequantize_row(
                                            c.desc.dtype,
                                            &c.bytes[r * rb..(r + 1) * rb],
                                            row,
                                        ),
                                    }
                                }
                            }
                            let (kd, vd) = (&*kd, &*vd);
                            // Tiles of up to ROW_BLOCK tokens (attend_rows), else token by
                            // token.
                            let per = (TILE_SCORES / (group * n).max(1)).clamp(1, ROW_BLOCK);
                            let mut tiled = r0 + a;
                            while tiled < r0 + e {
                                let end = (tiled + per).min(r0 + e);
                                let ranges: Vec<(usize, usize)> =
                                    (tiled..end).map(|ti| range(ti, s)).collect();
                                let q0 = (tiled * hq + g * group) * d;
                                let o0 = (tiled - r0) * unit + g * group * dv;
                                if !attend_rows(
                                    p,
                                    (&q[q0..], hq * d),
                                    group,
                                    &ranges,
                                    (kd, vd, klo),
                                    (d, dv),
                                    (&mut ys[o0..], unit),
                                ) {
                                    break;
                                }
                                tiled = end;
                            }
                            for ti in tiled..r0 + e {
                                let (lo, hi) = range(ti, s);
                                attend(
                                    p,
                                    &q[(ti * hq + g * group) * d..(ti * hq + (g + 1) * group) * d],
                                    group,
                                    lo,
                                    hi,
                                    &mut ys[(ti - r0) * unit + g * group * dv..][..group * dv],
                                    |j, _| Some(&kd[(j - klo) * d..][..d]),
                                    |j, _| Some(&vd[(j - klo) * dv..][..dv]),
                                );
                            }
                        }
                        a = e;
                    }
                })
            });
            Ok(())
        });
    }
    let longest = (0..t)
        .map(|ti| {
            let (lo, hi) = range(ti, b.seq_of[ti]);
            hi.saturating_sub(lo)
        })
        .max()
        .unwrap_or(0);
    if path == Path::Decode && split::pays(t, hq, longest) {
        return o[0].with_f32(false, |y| {
            split::paged_split(
                p,
                &q,
                (t, hq, d),
                (hkv, dv),
                (kc, kf, krb),
                (vc, vf, vrb),
                &b.seq_of,
                &range,
                &locate,
                y,
            );
            Ok(())
        });
    }
    let heads = unit_heads(t, hkv, group);
    let unit = (heads * dv).max(1);
    o[0].with_f32(false, |y| {
        pool::par_rows_in(y, unit, 0, ATTN_PIECES, |r0, ys| {
            for (ri, out) in ys.chunks_mut(unit).enumerate() {
                let h = (r0 + ri) * heads;
                let (ti, g) = (h / hq, h % hq / group);
                let s = b.seq_of[ti];
                let (lo, hi) = range(ti, s);
                // The rows PAGED_AHEAD keys on are prefetched as each row is taken: a
                // sequence's rows lie in scattered blocks, a stride apart within each.
                let ahead = |j: usize, cache: &In, rb: usize| {
                    if j + PAGED_AHEAD < hi {
                        let r = locate(s, j + PAGED_AHEAD, g);
                        simd::prefetch(cache.bytes.as_ptr().wrapping_add(r * rb), rb);
                    }
                };
                attend(
                    p,
                    &q[h * d..(h + heads) * d],
                    heads,
                    lo,
                    hi,
                    out,
                    |j, buf| {
                        ahead(j, kc, krb);
                        cache_row(kc, kf, locate(s, j, g), d, krb, buf)
                    },
                    |j, buf| {
                        ahead(j, vc, vrb);
                        cache_row(vc, vf, locate(s, j, g), dv, vrb, buf)
                    },
                );
            }
        });
        Ok(())
    })
}

pub(crate) fn kv_write(i: &[In], o: &mut [Out]) -> KResult {
    let slots = i[2].i32()?;
    for (src, dst) in i[..2].iter().zip(o.iter_mut()) {
        let x = src.f32()?;
        let (nblocks, bs) = (dst.dims()[0], dst.dims()[1]);
        let width = src.dims()[1] * src.dims()[2];
        let row_bytes = dst.desc.dtype.bytes_for(width).unwrap_or(0);
        let dtype = dst.desc.dtype;
        for (t, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let slot = index(slot, nblocks * bs, "slot")?;
            let row = &x[t * width..(t + 1) * width];
            let out = &mut dst.bytes[slot * row_bytes..(slot + 1) * row_bytes];
            quant::quantize_into(dtype, row, out)?;
        }
    }
    Ok(())
}

/// RoPE of q into `q_out` and of k, then the K/V write of the rotated k and v: the three ops
/// it fuses, one after another.
pub(crate) fn rope_kv_write(p: &RopeParams, i: &[In], o: &mut [Out]) -> KResult {
    fn with<'a>(x: &In<'a>, i: &[In<'a>]) -> Vec<In<'a>> {
        let mut v = vec![In::new(x.desc, x.bytes), In::new(i[3].desc, i[3].bytes)];
        if let Some(f) = i.get(5) {
            v.push(In::new(f.desc, f.bytes));
        }
        v
    }
    let (q_out, caches) = o.split_at_mut(1);
    super::rope::rope(p, &with(&i[0], i), q_out)?;
    let k_desc = i[1].desc.clone();
    let mut k_rot = vec![0u8; i[1].bytes.len()];
    super::rope::rope(
        p,
        &with(&i[1], i),
        &mut [Out {
            desc: &k_desc,
            bytes: &mut k_rot,
        }],
    )?;
    let kv_in = [
        In::new(&k_desc, &k_rot),
        In::new(i[2].desc, i[2].bytes),
        In::new(i[4].desc, i[4].bytes),
    ];
    kv_write(&kv_in, caches)
}

/// The family's CPU reference.
pub(super) fn run_op(op: &AttentionOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        AttentionOp::Attention(p) => attention(p, i, o),
        AttentionOp::PagedAttention(p) => paged_attention(p, i, o),
        AttentionOp::KvWrite => kv_write(i, o),
        AttentionOp::RopeKvWrite(p) => rope_kv_write(p, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &AttentionOp) -> bool {
    true
}

#[path = "attention_split.rs"]
mod split;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
