//! Integer dot products for the K-quants on AVX2 CPUs (no AVX-512), within the f32 bound.
//!
//! A weight row of Q4_K or Q6_K holds small integer codes `q` and, per group of 16 or 32, a
//! small integer scale `sc` (and for Q4_K a min `mn`), under per-block f16 factors. The f32
//! decoders turn every code into an f32 before multiplying: a conversion, a table lookup or a
//! multiply per weight, and the decode kernels spend their time there, not waiting for memory.
//! Here the codes stay integers. Each activation row is split once, per block of 256, into
//!
//! ```text
//!   x_j = s · (b2_j · 2¹⁶ + b1_j · 2⁸ + b0_j) + ε_j,    s = 2^e,  b0, b1 ∈ [0, 255],  b2 ∈ [-64, 64]
//! ```
//!
//! and each weight group's (or sub-block's) `Σ q_j · x_q,j` is computed exactly in 32-bit
//! integers: `vpmaddubsw` multiplies code and digit bytes, `vpmaddwd` sums the pairs, and a
//! tree of horizontal adds gives the group totals, which are converted to f32 once each and
//! multiplied by `d · sc · s` (the scales never enter the integer part, so no scale is
//! broadcast per group).
//!
//! # The bound
//! `e` is chosen from the block's largest `|x|`, `M ∈ [2^E, 2^(E+1))`, as `E − 21`: then
//! `|x_j / s| < 2^22`, the rounding `x_q = round(x_j / s)` fits in 23 bits (the three digits
//! above), and `|ε_j| ≤ s / 2 = 2^(E−22) ≤ 2^-22 · M`. Scaling by a power of two is exact, so
//! ε is the only approximation before the integer sums, which are exact (the lane bounds are
//! at each kernel). After them come the conversions to f32 (one rounding of a group's total)
//! and f32 accumulation of one term per group, as in any f32 dot. So
//!
//! ```text
//!   |result − Σ w_j x_j| ≤ Σ_blocks 2^-22 · M_block · Σ_block |w_j|  +  f32 summation error
//! ```
//!
//! where `w_j` are the dequantized weights: an absolute error of at most 2⁻²² (about 2.4e-7)
//! of the block's largest activation per unit of weight (2⁻¹²⁷ for a block whose largest
//! activation is below 2⁻¹⁰⁴, where the step stops at the smallest normal f32), which
//! `tests/exact.rs` checks end to end against an f64 forward pass. The tests here check every
//! row against an f64 dot over the dequantized weights with that bound.
//!
//! # Same bits in every batch
//! A row's integers do not depend on anything but the row, and its f32 operations run in the
//! same order whichever number of rows a call covers, so a row gives the same bits alone, in a
//! batch of decodes or in a prefill (which runs this kernel over tiles of rows).

use crate::tensor::DType;

/// Elements per activation block (one scale `s`): the K-quants' block.
pub(crate) const BLOCK: usize = 256;
/// Activation rows one call covers at most (at four the 16 registers spill: prefill calls take
/// three).
pub(crate) const MAX_ROWS: usize = 4;

/// Whether [`rows_dots`] handles `dtype` on this CPU.
pub(crate) fn supported(isa: super::simd::Isa, dtype: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == super::simd::Isa::Avx2 && matches!(dtype, DType::Q4_K | DType::Q6_K)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, dtype);
        false
    }
}

/// Bytes of one split activation row of `k` elements: for each group of 32, the 32 `b0`, the
/// 32 `b1` and the 32 `b2` (96 bytes); then the group sums of `x_q` as f32 (`k / 32`), then
/// the block scales `s` as f32 (`k / 256`).
pub(crate) fn row_bytes(k: usize) -> usize {
    3 * k + 4 * (k / 32) + 4 * (k / BLOCK)
}

/// `2^e` as f32, for `e` in -126..=127.
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Splits one activation row `x` (`k` a multiple of 256) into `out` ([`row_bytes`] long).
///
/// A block holding a NaN or an infinity gets the scale NaN, so its dots are NaN (as an f32
/// product with such an activation would be NaN or infinite).
pub(crate) fn split_row(x: &[f32], out: &mut [u8]) {
    let k = x.len();
    let (digits, rest) = out.split_at_mut(3 * k);
    let (sums, scales) = rest.split_at_mut(4 * (k / 32));
    for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
        let m = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        // A NaN is lost by `max`: look for one.
        let finite = m.is_finite() && xb.iter().all(|v| !v.is_nan());
        // E: the exponent of m (a subnormal or zero m counts as tiny); e = E - 21, kept where
        // 2^e and 2^-e are both normal f32 (so below M = 2^-104 the step stays 2^-126).
        let big_e = ((m.to_bits() >> 23) & 0xFF) as i32 - 127;
        let e = (big_e - 21).clamp(-126, 126);
        let (s, inv) = if finite {
            (pow2(e), pow2(-e))
        } else {
            (f32::NAN, 0.0)
        };
        scales[4 * b..4 * b + 4].copy_from_slice(&s.to_le_bytes());
        for (g, xg) in xb.chunks_exact(32).enumerate() {
            let gi = b * (BLOCK / 32) + g;
            let d = &mut digits[96 * gi..96 * gi + 96];
            let mut sum = 0i32;
            for (j, v) in xg.iter().enumerate() {
                // |v · 2^-e| < 2^22, so the rounded value fits in 23 bits; a non-finite block
                // is all zeros (inv = 0; NaN · 0 is NaN, which `as` turns into 0).
                let q = (v * inv).round_ties_even() as i32;
                sum += q;
                d[j] = q as u8;
                d[32 + j] = (q >> 8) as u8;
                d[64 + j] = (q >> 16) as i8 as u8;
            }
            // |sum| ≤ 32 · 2^22 = 2^27: one rounding to f32.
            sums[4 * gi..4 * gi + 4].copy_from_slice(&(sum as f32).to_le_bytes());
        }
    }
}

/// `y[i·ldy + r] = x_i · W_r` for the `mr` (1..=4) split activation rows at `x` (stride
/// [`row_bytes`]) and each weight row `r` in `rows`, row r being `k` elements of `dtype` at
/// `w + r·rb`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (as where [`supported`] holds) and the kernels handle
/// `dtype`; `k` is a multiple of 256; `x` holds `mr` rows
/// made by [`split_row`] for this `k`; each weight row in `rows` is readable; `y` is writable
/// at rows `0..mr` (stride `ldy`) and the columns in `rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dots(
    dtype: DType,
    x: *const u8,
    mr: usize,
    k: usize,
    (w, rb): (*const u8, usize),
    rows: std::ops::Range<usize>,
    (y, ldy): (*mut f32, usize),
) {
    debug_assert!((1..=MAX_ROWS).contains(&mr));
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! go {
            ($f:ident) => {
                match mr {
                    1 => x86::run::<1>(x86::$f::<1>, x, k, w, rb, rows, y, ldy),
                    2 => x86::run::<2>(x86::$f::<2>, x, k, w, rb, rows, y, ldy),
                    3 => x86::run::<3>(x86::$f::<3>, x, k, w, rb, rows, y, ldy),
                    _ => x86::run::<4>(x86::$f::<4>, x, k, w, rb, rows, y, ldy),
                }
            };
        }
        match dtype {
            DType::Q4_K => go!(row_q4k),
            DType::Q6_K => go!(row_q6k),
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, x, mr, k, w, rb, rows, y, ldy);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{row_bytes, BLOCK};
    use std::arch::x86_64::*;

    /// Bytes ahead of the weight block being read that are prefetched (the stream is
    /// sequential, but one core alone keeps too few misses in flight without help).
    const PREFETCH: usize = 4096;

    /// A row kernel: `MR` split activation rows (at stride [`row_bytes`]) against one weight row.
    pub type RowFn<const MR: usize> = unsafe fn(*const u8, usize, *const u8) -> [f32; MR];

    /// The loop over weight rows, calling `row` for each.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run<const MR: usize>(
        row: RowFn<MR>,
        x: *const u8,
        k: usize,
        w: *const u8,
        rb: usize,
        rows: std::ops::Range<usize>,
        y: *mut f32,
        ldy: usize,
    ) {
        for r in rows {
            let s = row(x, k, w.add(r * rb));
            for (i, v) in s.iter().enumerate() {
                *y.add(i * ldy + r) = *v;
            }
        }
    }

    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            std::ptr::read_unaligned(p as *const u16) as i32,
        )))
    }

    #[inline(always)]
    unsafe fn u32_at(p: *const u8) -> u32 {
        std::ptr::read_unaligned(p as *const u32)
    }

    #[inline(always)]
    unsafe fn f32_at(p: *const u8) -> f32 {
        std::ptr::read_unaligned(p as *const f32)
    }

    /// The eight lanes summed in a fixed order.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const u8, bytes: usize) {
        let mut o = 0;
        while o < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + o) as *const i8);
            o += 64;
        }
    }

    /// Pointers to activation row i's parts: digits, group sums, block scales.
    #[inline(always)]
    unsafe fn parts(x: *const u8, k: usize, i: usize) -> (*const u8, *const u8, *const u8) {
        let r = x.add(i * row_bytes(k));
        (r, r.add(3 * k), r.add(3 * k + 4 * (k / 32)))
    }

    /// The digit sums of one 32-element group of codes `wq` against the digits at `a` (b0, b1,
    /// b2 at +0, +32, +64), unscaled: lane l (elements 4l..4l+3) of `hi` holds
    /// `256·Σ q·b2 + Σ q·b1` and of `lo` `Σ q·b0`.
    ///
    /// `q_top` multiplies b2 (signed) as the unsigned operand: the codes themselves when they
    /// are unsigned; their absolute values when not (`SIGNED`), b2 then taking their signs.
    #[inline(always)]
    unsafe fn group_digits<const SIGNED: bool>(
        a: *const u8,
        wq: __m256i,
        q_top: __m256i,
    ) -> (__m256i, __m256i) {
        let b0 = _mm256_loadu_si256(a as *const __m256i);
        let b1 = _mm256_loadu_si256(a.add(32) as *const __m256i);
        let mut b2 = _mm256_loadu_si256(a.add(64) as *const __m256i);
        if SIGNED {
            b2 = _mm256_sign_epi8(b2, wq);
        }
        // vpmaddubsw: unsigned bytes (first) times signed bytes, adjacent pairs summed to i16;
        // vpmaddwd by 256 or 1 sums adjacent i16 pairs into i32.
        let p0 = _mm256_maddubs_epi16(b0, wq);
        let p1 = _mm256_maddubs_epi16(b1, wq);
        let p2 = _mm256_maddubs_epi16(q_top, b2);
        let hi = _mm256_add_epi32(
            _mm256_madd_epi16(p2, _mm256_set1_epi16(256)),
            _mm256_madd_epi16(p1, _mm256_set1_epi16(1)),
        );
        (hi, _mm256_madd_epi16(p0, _mm256_set1_epi16(1)))
    }

    /// Eight vectors' lane sums (each lane sum below 2³¹), in order, from the two halves of
    /// the horizontal-add tree: `a` = hadd(hadd(v0, v1), hadd(v2, v3)), `b` the same of v4..v7.
    #[inline(always)]
    unsafe fn totals8(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(
            _mm256_permute2x128_si256(a, b, 0x20),
            _mm256_permute2x128_si256(a, b, 0x31),
        )
    }

    /// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; weight
    /// `d·sc_g·q − dmin·mn_g` in group g of 32, q in 0..=15.
    ///
    /// Each group's `Σ q·x_q` is an exact integer: per lane of 4 elements, `vpmaddubsw(q, b2)`
    /// ≤ 2·15·64 = 1,920 and `vpmaddubsw(b1, q)`, `vpmaddubsw(b0, q)` ≤ 2·255·15 = 7,650 (no
    /// saturation at 32,767), so `256·(256·Σb2 + Σb1) + Σb0` ≤ 256·(2·1,920·256 + 2·7,650) +
    /// 2·7,650 ≈ 2.56e8, and the group's 8 lanes ≤ 2.045e9, below 2³¹. The eight group totals
    /// are converted to f32 (one rounding each) and multiplied by `d·s·sc_g`; the mins term
    /// `dmin·s·Σ mn_g·Σ_g x_q` comes from the group sums. Both accumulate in f32 lanes (one per
    /// group) in block order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_q4k<const MR: usize>(x: *const u8, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [_mm256_setzero_ps(); MR];
        let nib = _mm256_set1_epi8(0x0F);
        for bi in 0..k / BLOCK {
            let b = w.add(bi * 144);
            prefetch(b, 144);
            let d = f16_at(b);
            let dmin = f16_at(b.add(2));
            // The 6-bit scales and mins: groups 0..4 in the low 6 bits of bytes 0..4 and
            // 4..8; groups 4..8 in the nibbles of bytes 8..12, with bits 4 and 5 in the top
            // two bits of bytes 0..4 and 4..8.
            let (w0, w1, w2) = (u32_at(b.add(4)), u32_at(b.add(8)), u32_at(b.add(12)));
            let sc = (w0 & 0x3f3f_3f3f) as u64
                | (((w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4)) as u64) << 32;
            let mn = (w1 & 0x3f3f_3f3f) as u64
                | ((((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4)) as u64) << 32;
            let scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64)));
            let mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64)));
            // Per row: hadd(hadd(C0, C1), hadd(C2, C3)) and the same of C4..C7.
            let mut half = [[_mm256_setzero_si256(); 2]; MR];
            for c2 in 0..2 {
                let mut pair = [[_mm256_setzero_si256(); 2]; MR];
                for c1 in 0..2 {
                    let c = 2 * c2 + c1;
                    let v = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
                    let q0 = _mm256_and_si256(v, nib);
                    let q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    for i in 0..MR {
                        let (dg, _, _) = parts(x, k, i);
                        let a = dg.add(96 * (bi * 8 + 2 * c));
                        let (h0, l0) = group_digits::<false>(a, q0, q0);
                        let (h1, l1) = group_digits::<false>(a.add(96), q1, q1);
                        let c0 = _mm256_add_epi32(_mm256_slli_epi32(h0, 8), l0);
                        let c1v = _mm256_add_epi32(_mm256_slli_epi32(h1, 8), l1);
                        pair[i][c1] = _mm256_hadd_epi32(c0, c1v);
                    }
                }
                for i in 0..MR {
                    half[i][c2] = _mm256_hadd_epi32(pair[i][0], pair[i][1]);
                }
            }
            for i in 0..MR {
                let (_, sums, scales) = parts(x, k, i);
                let sx = f32_at(scales.add(4 * bi));
                let tot = _mm256_cvtepi32_ps(totals8(half[i][0], half[i][1]));
                let dsc = _mm256_mul_ps(scf, _mm256_set1_ps(d * sx));
                acc[i] = _mm256_fmadd_ps(tot, dsc, acc[i]);
                let gs = _mm256_loadu_ps(sums.add(4 * 8 * bi) as *const f32);
                acc[i] =
                    _mm256_fnmadd_ps(_mm256_mul_ps(mnf, gs), _mm256_set1_ps(dmin * sx), acc[i]);
            }
        }
        let mut out = [0f32; MR];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum(a);
        }
        out
    }

    /// Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed scales (one per 16
    /// weights), f16 d; weight `d·sc·(q − 32)`, q in 0..=63.
    ///
    /// The codes less 32 are signed bytes in -32..=31; b2 takes their signs (`vpsignb`) so that
    /// it can be the signed operand against their absolute values. Each 16-weight sub-block's
    /// `256·Σ(q−32)·b2 + Σ(q−32)·b1` and `Σ(q−32)·b0` are exact integers: per lane,
    /// `vpmaddubsw(|q−32|, ±b2)` ≤ 2·32·64 = 4,096 and the others ≤ 2·255·32 = 16,320, so the
    /// first ≤ 2·4,096·256 + 2·16,320 ≈ 2.1e6 and the second ≤ 32,640; a sub-block's 4 lanes
    /// stay below 2²⁴, exact in f32. The sub-block's total `256·first + second` is rounded to
    /// f32 once and multiplied by `d·s·sc`; f32 lanes accumulate in block order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_q6k<const MR: usize>(x: *const u8, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [_mm256_setzero_ps(); MR];
        for bi in 0..k / BLOCK {
            let b = w.add(bi * 210);
            prefetch(b, 210);
            let d = f16_at(b.add(208));
            let scp = b.add(192);
            for h in 0..2 {
                // Sub-block totals come out as [p0a, p1a, p2a, p3a | p0b, p1b, p2b, p3b] (group
                // p's halves a and b): scales 8h + 2p and 8h + 2p + 1.
                let sv = _mm256_cvtepi8_epi32(_mm_loadl_epi64(scp.add(8 * h) as *const __m128i));
                let scf = _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(
                    sv,
                    _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7),
                ));
                let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
                let mut pair_hi = [[_mm256_setzero_si256(); 2]; MR];
                let mut pair_lo = [[_mm256_setzero_si256(); 2]; MR];
                for p2 in 0..2 {
                    let mut cur = [[_mm256_setzero_si256(); 4]; MR];
                    for p1 in 0..2 {
                        let p = 2 * p2 + p1;
                        let ql = _mm256_loadu_si256(b.add(64 * h + 32 * (p & 1)) as *const __m256i);
                        let low = _mm256_and_si256(
                            _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (p as i32 >> 1))),
                            _mm256_set1_epi8(0x0F),
                        );
                        let top = _mm256_and_si256(
                            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p as i32)),
                            _mm256_set1_epi8(3),
                        );
                        let q = _mm256_sub_epi8(
                            _mm256_or_si256(low, _mm256_slli_epi16(top, 4)),
                            _mm256_set1_epi8(32),
                        );
                        let aq = _mm256_abs_epi8(q);
                        let g = 4 * h + p;
                        for i in 0..MR {
                            let (dg, _, _) = parts(x, k, i);
                            let a = dg.add(96 * (bi * 8 + g));
                            let (hv, lv) = group_digits::<true>(a, q, aq);
                            cur[i][p1] = hv;
                            cur[i][2 + p1] = lv;
                        }
                    }
                    for i in 0..MR {
                        pair_hi[i][p2] = _mm256_hadd_epi32(cur[i][0], cur[i][1]);
                        pair_lo[i][p2] = _mm256_hadd_epi32(cur[i][2], cur[i][3]);
                    }
                }
                for i in 0..MR {
                    let (_, _, scales) = parts(x, k, i);
                    let sx = f32_at(scales.add(4 * bi));
                    let th = _mm256_hadd_epi32(pair_hi[i][0], pair_hi[i][1]);
                    let tl = _mm256_hadd_epi32(pair_lo[i][0], pair_lo[i][1]);
                    let t = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(th),
                        _mm256_set1_ps(256.0),
                        _mm256_cvtepi32_ps(tl),
                    );
                    acc[i] = _mm256_fmadd_ps(t, _mm256_mul_ps(scf, _mm256_set1_ps(d * sx)), acc[i]);
                }
            }
        }
        let mut out = [0f32; MR];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum(a);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd;
    use crate::quant;
    use crate::rng::Rng;

    /// Every row against an f64 dot over the dequantized weights, within the bound proven in
    /// the module's comment (with the f32 summation's share bounded generously), and the same
    /// bits whatever the number of rows in the call.
    #[test]
    fn integer_rows_match_an_f64_dot_within_the_bound_and_do_not_depend_on_the_batch() {
        let types = [DType::Q4_K, DType::Q6_K];
        if !simd::has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = Rng::new(23);
        for &dt in &types {
            for &k in &[256usize, 768, 2048] {
                let n = 5;
                let wf: Vec<f32> = (0..n * k).map(|_| rng.normal() * 0.05).collect();
                let wq = quant::quantize(dt, &wf).unwrap();
                let rb = wq.len() / n;
                let mut wd = vec![0f32; n * k];
                quant::dequantize(dt, &wq, &mut wd).unwrap();
                // Activations with outliers (as real ones have), a block of zeros and one of
                // tiny values.
                let m = MAX_ROWS;
                let mut x: Vec<f32> = (0..m * k)
                    .map(|j| {
                        let v = rng.normal();
                        if j % 97 == 0 {
                            v * 40.0
                        } else {
                            v
                        }
                    })
                    .collect();
                if k >= 768 {
                    x[256..512].fill(0.0);
                    for v in &mut x[k + 512..k + 768] {
                        *v *= 1e-30;
                    }
                }
                let rl = row_bytes(k);
                let mut split = vec![0u8; m * rl];
                for i in 0..m {
                    split_row(&x[i * k..(i + 1) * k], &mut split[i * rl..(i + 1) * rl]);
                }
                let mut full = vec![f32::NAN; m * n];
                unsafe {
                    rows_dots(
                        dt,
                        split.as_ptr(),
                        m,
                        k,
                        (wq.as_ptr(), rb),
                        0..n,
                        (full.as_mut_ptr(), n),
                    )
                };
                for i in 0..m {
                    for r in 0..n {
                        let xr = &x[i * k..(i + 1) * k];
                        let wr = &wd[r * k..(r + 1) * k];
                        let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let mut bound = 0f64;
                        for (xb, wb) in xr.chunks(BLOCK).zip(wr.chunks(BLOCK)) {
                            let mx = xb.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                            let sw: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                            bound += mx * sw * 2f64.powi(-22);
                        }
                        let mag: f64 = xr
                            .iter()
                            .zip(wr)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        // f32 summation of k/256·8 terms and the conversions: far inside 1e-5.
                        bound += mag * 1e-5;
                        let got = full[i * n + r] as f64;
                        assert!(
                            (got - want).abs() <= bound,
                            "{dt:?} k={k} row {i} col {r}: {got} vs {want} (bound {bound:e})"
                        );
                        // An activation quantized to one int8 part would miss by ~1e-2 of
                        // `mag`: the bound is far tighter than that.
                        assert!(
                            bound < 1e-3 * mag + 1e-12,
                            "{dt:?}: bound {bound} mag {mag}"
                        );
                    }
                }
                // Fewer rows per call, and a subset of weight rows: the same bits.
                for mr in 1..=m {
                    for i0 in (0..m).step_by(mr) {
                        let rows = mr.min(m - i0);
                        let mut part = vec![f32::NAN; rows * n];
                        unsafe {
                            rows_dots(
                                dt,
                                split.as_ptr().add(i0 * rl),
                                rows,
                                k,
                                (wq.as_ptr(), rb),
                                1..n,
                                (part.as_mut_ptr(), n),
                            )
                        };
                        for i in 0..rows {
                            for r in 1..n {
                                assert_eq!(
                                    part[i * n + r].to_bits(),
                                    full[(i0 + i) * n + r].to_bits(),
                                    "{dt:?} k={k} mr={mr} row {} col {r}",
                                    i0 + i
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn split_digits_rebuild_the_row_within_half_a_step() {
        let mut rng = Rng::new(5);
        let k = 512;
        let mut x: Vec<f32> = (0..k).map(|_| rng.normal() * 3.0).collect();
        x[7] = -1000.0;
        x[300] = f32::MIN_POSITIVE / 8.0;
        let mut out = vec![0u8; row_bytes(k)];
        split_row(&x, &mut out);
        for b in 0..k / BLOCK {
            let s =
                f32::from_le_bytes(out[3 * k + 4 * (k / 32) + 4 * b..][..4].try_into().unwrap());
            let mx = x[b * BLOCK..(b + 1) * BLOCK]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            assert!(
                s as f64 <= mx as f64 * 2f64.powi(-20) && s > 0.0,
                "block {b}: s {s}"
            );
            for j in b * BLOCK..(b + 1) * BLOCK {
                let (g, l) = (j / 32, j % 32);
                let d = &out[96 * g..96 * g + 96];
                let q = d[64 + l] as i8 as i64 * 65536 + d[32 + l] as i64 * 256 + d[l] as i64;
                assert!(q.abs() <= 1 << 22);
                let err = (q as f64 * s as f64 - x[j] as f64).abs();
                assert!(err <= s as f64 / 2.0, "element {j}: {err} vs step {s}");
            }
        }
        // A block with a NaN gives NaN dots.
        x[3] = f32::NAN;
        split_row(&x, &mut out);
        let s = f32::from_le_bytes(out[3 * k + 4 * (k / 32)..][..4].try_into().unwrap());
        assert!(s.is_nan());
    }
}
