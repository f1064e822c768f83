//! Attention where every query row sees the same keys (a bidirectional mask over many rows:
//! a vision tower's thousands of patches) as register-tiled matrix products on AVX-512.
//!
//! The row-at-a-time kernel ([`super::attention`]'s `attend`) scores four keys against a few
//! rows with a dot micro-kernel that ends in horizontal sums, and adds each weighted value
//! row into an output row in memory (a load and a store per 16 products); over 3,072
//! patches that ran at a sixth of the matmuls' rate. Here, per head:
//! - the keys are transposed once (`Kᵀ`, `d × s`), and the scores of 4 query rows × 64 keys
//!   are 16 vector accumulators summed over the head's dimensions in order (an FMA chain per
//!   score, no horizontal sums);
//! - after the softmax (the same as the row kernel's), the outputs of 4 rows × up to 80
//!   values stay in 20 accumulators while the keys go by in order: each output element is
//!   `fma(p_j, v_j, ·)` over `j` ascending from zero, exactly the row kernel's sequence, so
//!   given the same weights it is the same bits.
//!
//! The scores' dimension order differs from the dot kernel's lane tree, so the outputs differ
//! from the row-at-a-time path's in the last bits; an image is encoded by one call, so no
//! result depends on which path a row took.

use super::{pool, simd};
use crate::op::AttnParams;

/// Query rows of one head a task scores together (every key's column read once for all).
const TILE: usize = 16;
/// Keys one score micro-kernel covers (four vectors).
const KEYS: usize = 64;
/// Values one output micro-kernel covers (five vectors).
const VALS: usize = 80;
/// Pieces per thread of the head-major rows.
const PIECES: usize = 4;

/// Whether [`attention`] runs on this CPU.
pub(super) fn supported() -> bool {
    simd::isa() == simd::Isa::Avx512
}

/// `y [t, hq, dv]` = softmax(q·kᵀ·scale) · v for every row over keys `p.mask.key_range(0, s)`
/// (the same for all rows), `q [t, hq, d]`, `k [s, hkv, d]`, `v [s, hkv, dv]`. The caller
/// checks [`supported`].
pub(super) fn attention(
    p: &AttnParams,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (t, hq, d): (usize, usize, usize),
    (s, hkv, dv): (usize, usize, usize),
    y: &mut [f32],
) {
    let group = hq / hkv.max(1);
    let (lo, hi) = p.mask.key_range(0, s);
    let n = hi.saturating_sub(lo);
    // The keys lo..hi of each KV head, transposed: row e of head g holds dimension e of every
    // key, padded with zeros to whole micro-kernels.
    let sp = n.div_ceil(KEYS) * KEYS;
    let mut kt = vec![0f32; hkv * d * sp];
    pool::par_rows(&mut kt, d * sp, 0, |g0, heads| {
        for (gi, kh) in heads.chunks_exact_mut(d * sp).enumerate() {
            let g = g0 + gi;
            for j in 0..n {
                let row = &k[((lo + j) * hkv + g) * d..][..d];
                for (e, &x) in row.iter().enumerate() {
                    kh[e * sp + j] = x;
                }
            }
        }
    });
    let scratch = || vec![0f32; TILE * sp];
    head_tiles(
        q,
        (t, hq, d),
        dv,
        (TILE, PIECES),
        y,
        scratch,
        |scores, h, qbuf, m, out| {
            let g = h / group.max(1);
            let kh = &kt[g * d * sp..(g + 1) * d * sp];
            for r4 in (0..m).step_by(4) {
                let mr = 4.min(m - r4);
                for j0 in (0..sp).step_by(KEYS) {
                    // SAFETY: AVX-512 is present (`supported`); qbuf holds mr rows of d from
                    // r4, kh holds d rows of sp from j0 on (64 keys), scores mr rows of sp.
                    unsafe {
                        x86::scores(
                            mr,
                            qbuf[r4 * d..].as_ptr(),
                            d,
                            kh[j0..].as_ptr(),
                            sp,
                            scores[r4 * sp + j0..].as_mut_ptr(),
                            sp,
                            p.scale,
                        )
                    };
                }
            }
            for row in scores.chunks_exact_mut(sp).take(m) {
                let row = &mut row[..n];
                if let Some(c) = p.soft_cap {
                    for x in row.iter_mut() {
                        *x = c * (*x / c).tanh();
                    }
                }
                // SAFETY: AVX-512 is present.
                unsafe { x86::softmax(row) };
            }
            let vh = v[g * dv..].as_ptr();
            for r4 in (0..m).step_by(4) {
                let mr = 4.min(m - r4);
                for c0 in (0..dv).step_by(VALS) {
                    let w = VALS.min(dv - c0);
                    // SAFETY: AVX-512 is present; the weights hold mr rows of n from r4; the
                    // value rows lo..hi of head g lie in v (row j at (j·hkv + g)·dv, w values
                    // from c0); out holds mr rows of dv from r4.
                    unsafe {
                        x86::weighted(
                            mr,
                            w,
                            scores[r4 * sp..].as_ptr(),
                            sp,
                            n,
                            vh.add(lo * hkv * dv + c0),
                            hkv * dv,
                            out[r4 * dv + c0..].as_mut_ptr(),
                            dv,
                        )
                    };
                }
            }
        },
    );
}

/// The rows of `q [t, hq, d]` in tiles of up to `tile` consecutive rows of one head, spread
/// over the pool in about `pieces` pieces a thread: `f(h, qrows, m, out)` gets the tile's `m`
/// query rows (contiguous, `m × d`) and their `m × dv` outputs, which land in `y [t, hq, dv]`.
/// `scratch()` makes each task's own buffers, passed to every call of that task.
#[allow(clippy::too_many_arguments)]
pub(super) fn head_tiles<S>(
    q: &[f32],
    (t, hq, d): (usize, usize, usize),
    dv: usize,
    (tile, pieces): (usize, usize),
    y: &mut [f32],
    scratch: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, &[f32], usize, &mut [f32]) + Sync,
) {
    // Head-major: the rows of one head are contiguous, so a tile's outputs are too.
    let mut tmp = vec![0f32; hq * t * dv];
    pool::par_rows_in(&mut tmp, dv, 0, pieces, |r0, ys| {
        let mut qbuf = vec![0f32; tile * d];
        let mut s = scratch();
        let rows = ys.len() / dv.max(1);
        let mut at = 0;
        while at < rows {
            let r = r0 + at;
            let (h, ti) = (r / t, r % t);
            // A tile stays within its head and within this piece.
            let m = tile.min(t - ti).min(rows - at);
            for (x, dst) in qbuf.chunks_exact_mut(d).take(m).enumerate() {
                let src = ((ti + x) * hq + h) * d;
                dst.copy_from_slice(&q[src..src + d]);
            }
            f(
                &mut s,
                h,
                &qbuf[..m * d],
                m,
                &mut ys[at * dv..(at + m) * dv],
            );
            at += m;
        }
    });
    for h in 0..hq {
        for ti in 0..t {
            let src = (h * t + ti) * dv;
            let dst = (ti * hq + h) * dv;
            y[dst..dst + dv].copy_from_slice(&tmp[src..src + dv]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Softmax of a row in place: max-subtracted, `exp` by the crate's polynomial
    /// ([`super::super::elementwise::exp_f32`], a few ulps) sixteen lanes at a time, the sum in
    /// sixteen partial sums added in a fixed order.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax(row: &mut [f32]) {
        use super::super::elementwise::exp_f32;
        let mut lanes = [f32::NEG_INFINITY; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            for (m, &x) in lanes.iter_mut().zip(c) {
                *m = m.max(x);
            }
        }
        let max = chunks
            .remainder()
            .iter()
            .chain(&lanes)
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        let mut sums = [0f32; 16];
        let mut chunks = row.chunks_exact_mut(16);
        for c in &mut chunks {
            for (s, x) in sums.iter_mut().zip(c.iter_mut()) {
                *x = exp_f32(*x - max);
                *s += *x;
            }
        }
        let mut sum = 0f32;
        for x in chunks.into_remainder() {
            *x = exp_f32(*x - max);
            sum += *x;
        }
        let sum = sums.iter().fold(sum, |a, &b| a + b);
        let inv = 1.0 / sum;
        for x in row.iter_mut() {
            *x *= inv;
        }
    }

    /// Scores of `mr` (1..=4) query rows (at `q`, stride `d`) against 64 keys of `kt`
    /// (dimension e's 64 at `kt + e·ldk`), each an FMA chain over e in order, times `scale`,
    /// to `out` (row i at `out + i·ldo`).
    ///
    /// # Safety
    /// AVX-512F; the pointers cover what is described.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores(
        mr: usize,
        q: *const f32,
        d: usize,
        kt: *const f32,
        ldk: usize,
        out: *mut f32,
        ldo: usize,
        scale: f32,
    ) {
        match mr {
            1 => scores_n::<1>(q, d, kt, ldk, out, ldo, scale),
            2 => scores_n::<2>(q, d, kt, ldk, out, ldo, scale),
            3 => scores_n::<3>(q, d, kt, ldk, out, ldo, scale),
            _ => scores_n::<4>(q, d, kt, ldk, out, ldo, scale),
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn scores_n<const R: usize>(
        q: *const f32,
        d: usize,
        kt: *const f32,
        ldk: usize,
        out: *mut f32,
        ldo: usize,
        scale: f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for e in 0..d {
            let row = kt.add(e * ldk);
            let kv = [
                _mm512_loadu_ps(row),
                _mm512_loadu_ps(row.add(16)),
                _mm512_loadu_ps(row.add(32)),
                _mm512_loadu_ps(row.add(48)),
            ];
            for (i, a) in acc.iter_mut().enumerate() {
                let qb = _mm512_set1_ps(*q.add(i * d + e));
                for c in 0..4 {
                    a[c] = _mm512_fmadd_ps(qb, kv[c], a[c]);
                }
            }
        }
        let sv = _mm512_set1_ps(scale);
        for (i, a) in acc.iter().enumerate() {
            for (c, v) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add(i * ldo + 16 * c), _mm512_mul_ps(*v, sv));
            }
        }
    }

    /// Rows `i < mr` (1..=4) of `out` (stride `ldo`), `w` (1..=80) values:
    /// `Σ_{j<n} p[i·ldp + j] · v[j·ldv ..]`, each element an FMA chain over j ascending from
    /// zero (the row kernel's axpy sequence).
    ///
    /// # Safety
    /// AVX-512F; the pointers cover what is described.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn weighted(
        mr: usize,
        w: usize,
        p: *const f32,
        ldp: usize,
        n: usize,
        v: *const f32,
        ldv: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        macro_rules! go {
            ($r:literal) => {
                match w.div_ceil(16) {
                    1 => weighted_n::<$r, 1>(w, p, ldp, n, v, ldv, out, ldo),
                    2 => weighted_n::<$r, 2>(w, p, ldp, n, v, ldv, out, ldo),
                    3 => weighted_n::<$r, 3>(w, p, ldp, n, v, ldv, out, ldo),
                    4 => weighted_n::<$r, 4>(w, p, ldp, n, v, ldv, out, ldo),
                    _ => weighted_n::<$r, 5>(w, p, ldp, n, v, ldv, out, ldo),
                }
            };
        }
        match mr {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn weighted_n<const R: usize, const C: usize>(
        w: usize,
        p: *const f32,
        ldp: usize,
        n: usize,
        v: *const f32,
        ldv: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        // The last vector's lanes past w read and write nothing.
        let tail = w - 16 * (C - 1);
        let last: __mmask16 = if tail >= 16 {
            0xFFFF
        } else {
            ((1u32 << tail) - 1) as __mmask16
        };
        let mask = |c: usize| if c + 1 == C { last } else { 0xFFFF };
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for j in 0..n {
            let row = v.add(j * ldv);
            let mut vv = [_mm512_setzero_ps(); C];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_ps(mask(c), row.add(16 * c));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let pb = _mm512_set1_ps(*p.add(i * ldp + j));
                for c in 0..C {
                    a[c] = _mm512_fmadd_ps(pb, vv[c], a[c]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (c, x) in a.iter().enumerate() {
                _mm512_mask_storeu_ps(out.add(i * ldo + 16 * c), mask(c), *x);
            }
        }
    }
}

/// Never called off x86-64 ([`supported`] is false there).
#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub unsafe fn softmax(_: &mut [f32]) {}
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores(
        _: usize,
        _: *const f32,
        _: usize,
        _: *const f32,
        _: usize,
        _: *mut f32,
        _: usize,
        _: f32,
    ) {
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn weighted(
        _: usize,
        _: usize,
        _: *const f32,
        _: usize,
        _: usize,
        _: *const f32,
        _: usize,
        _: *mut f32,
        _: usize,
    ) {
    }
}
