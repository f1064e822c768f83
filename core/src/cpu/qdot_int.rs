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
//! and `Σ sc · Σ q_j · b_pj` is computed exactly in 32-bit integers (`vpmaddubsw` multiplies
//! byte pairs, `vpmaddwd` multiplies their sums by the scale), then converted to f32 once per
//! block and multiplied by `d · s` there.
//!
//! # The bound
//! `e` is chosen from the block's largest `|x|`, `M ∈ [2^E, 2^(E+1))`, as `E − 21`: then
//! `|x_j / s| < 2^22`, the rounding `x_q = round(x_j / s)` fits in 23 bits (the three digits
//! above), and `|ε_j| ≤ s / 2 = 2^(E−22) ≤ 2^-22 · M`. Scaling by a power of two is exact, so
//! ε is the only approximation before the integer sums, which are exact (the lane bounds are
//! at each kernel). After them come the conversions to f32 (one rounding of a 4-element
//! partial sum) and f32 accumulation of one term per block and lane, as in any f32 dot. So
//!
//! ```text
//!   |result − Σ w_j x_j| ≤ Σ_blocks 2^-22 · M_block · Σ_block |w_j|  +  f32 summation error
//! ```
//!
//! where `w_j` are the dequantized weights: an absolute error of at most 2⁻²² (about 2.4e-7)
//! of the block's largest activation per unit of weight (2⁻¹²⁷ for a block whose largest
//! activation is below 2⁻¹⁰⁴, where the step stops at the smallest normal f32), which `tests/exact.rs` checks end to
//! end against an f64 forward pass. The tests here check every row against an f64 dot over the
//! dequantized weights with that bound.
//!
//! # Same bits in every batch
//! A row's integers do not depend on anything but the row, and its f32 operations run in the
//! same order whichever number of rows a call covers, so a row gives the same bits alone, in a
//! batch of decodes or in a prefill (which runs this kernel over tiles of rows).

use crate::tensor::DType;

/// Elements per activation block (one scale `s`): the K-quants' block.
pub(crate) const BLOCK: usize = 256;
/// Activation rows one call covers at most (three accumulators each in the 16 registers).
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
/// [`supported`] holds for `dtype` on this CPU; `k` is a multiple of 256; `x` holds `mr` rows
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
    const PREFETCH: usize = 2048;

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

    /// The integer sums of one 32-element group `wq` (bytes; codes as signed or unsigned bytes
    /// per the caller) against the digits at `a` (b0, b1, b2 at +0, +32, +64), under the
    /// group's scale as i16 pairs: `s1` = sc, `s256` = 256·sc. Adds `sc · (256·Σ q·b2 + Σ q·b1)`
    /// into `hi` and `sc · Σ q·b0` into `lo`, lane l holding elements 4l..4l+3.
    ///
    /// `q_top` is what multiplies b2 (signed) as the unsigned operand: the codes themselves
    /// when they are unsigned, their absolute values when not (then `b2` is given the codes'
    /// signs by the caller through `sign_top`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn group_sums<const SIGNED: bool>(
        a: *const u8,
        wq: __m256i,
        q_top: __m256i,
        s1: __m256i,
        s256: __m256i,
        hi: &mut __m256i,
        lo: &mut __m256i,
    ) {
        let b0 = _mm256_loadu_si256(a as *const __m256i);
        let b1 = _mm256_loadu_si256(a.add(32) as *const __m256i);
        let mut b2 = _mm256_loadu_si256(a.add(64) as *const __m256i);
        if SIGNED {
            b2 = _mm256_sign_epi8(b2, wq);
        }
        // vpmaddubsw: unsigned bytes (first) times signed bytes, adjacent pairs summed to i16.
        let p0 = _mm256_maddubs_epi16(b0, wq);
        let p1 = _mm256_maddubs_epi16(b1, wq);
        let p2 = _mm256_maddubs_epi16(q_top, b2);
        let t = _mm256_add_epi32(_mm256_madd_epi16(p2, s256), _mm256_madd_epi16(p1, s1));
        *hi = _mm256_add_epi32(*hi, t);
        *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(p0, s1));
    }

    /// Adds `(256·hi + lo) · ds` into `acc` (hi and lo converted to f32, one rounding each).
    #[inline(always)]
    unsafe fn flush(acc: &mut __m256, hi: __m256i, lo: __m256i, ds: f32) {
        let f = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(hi),
            _mm256_set1_ps(256.0),
            _mm256_cvtepi32_ps(lo),
        );
        *acc = _mm256_fmadd_ps(f, _mm256_set1_ps(ds), *acc);
    }

    /// An i16 pair `(v, v)` as one i32, for a broadcast multiplier of `vpmaddwd`.
    #[inline(always)]
    fn pair(v: i32) -> i32 {
        (v & 0xFFFF) | (v << 16)
    }

    /// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; weight
    /// `d·sc_g·q − dmin·mn_g` in group g of 32, q in 0..=15.
    ///
    /// Lane bounds (i32, per block): |b2| ≤ 64, so `vpmaddubsw(q, b2)` ≤ 2·15·64 = 1,920 and
    /// `vpmaddubsw(b1, q)` ≤ 2·255·15 = 7,650 (no saturation at 32,767); times 256·sc ≤ 16,128
    /// and sc ≤ 63 by `vpmaddwd`: ≤ 2·1,920·16,128 + 2·7,650·63 ≈ 6.3e7 per group, 5.1e8 over
    /// the block's 8 groups, below 2³¹. The mins term `dmin · Σ mn_g · Σ_g x_q` is in f32 from
    /// the group sums.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_q4k<const MR: usize>(x: *const u8, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [_mm256_setzero_ps(); MR];
        let nib = _mm256_set1_epi8(0x0F);
        for bi in 0..k / BLOCK {
            let b = w.add(bi * 144);
            prefetch(b, 144);
            let d = f16_at(b);
            let dmin = f16_at(b.add(2));
            let s = std::slice::from_raw_parts(b.add(4), 12);
            let mut sc = [0i32; 8];
            let mut mn = [0i32; 8];
            for j in 0..4 {
                sc[j] = (s[j] & 63) as i32;
                mn[j] = (s[j + 4] & 63) as i32;
                sc[j + 4] = ((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4)) as i32;
                mn[j + 4] = ((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4)) as i32;
            }
            let mins = _mm256_cvtepi32_ps(_mm256_loadu_si256(mn.as_ptr() as *const __m256i));
            let mut hi = [_mm256_setzero_si256(); MR];
            let mut lo = [_mm256_setzero_si256(); MR];
            for c in 0..4 {
                let v = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
                let codes = [
                    _mm256_and_si256(v, nib),
                    _mm256_and_si256(_mm256_srli_epi16(v, 4), nib),
                ];
                for (h, q) in codes.into_iter().enumerate() {
                    let g = 2 * c + h;
                    let s1 = _mm256_set1_epi32(pair(sc[g]));
                    let s256 = _mm256_set1_epi32(pair(256 * sc[g]));
                    for i in 0..MR {
                        let (dg, _, _) = parts(x, k, i);
                        let a = dg.add(96 * (bi * 8 + g));
                        group_sums::<false>(a, q, q, s1, s256, &mut hi[i], &mut lo[i]);
                    }
                }
            }
            for i in 0..MR {
                let (_, sums, scales) = parts(x, k, i);
                let sx = f32_at(scales.add(4 * bi));
                flush(&mut acc[i], hi[i], lo[i], d * sx);
                let gs = _mm256_loadu_ps(sums.add(4 * 8 * bi) as *const f32);
                acc[i] =
                    _mm256_fnmadd_ps(_mm256_mul_ps(mins, gs), _mm256_set1_ps(dmin * sx), acc[i]);
            }
        }
        acc.map(|a| hsum(a))
    }

    /// Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed scales (one per 16
    /// weights), f16 d; weight `d·sc·(q − 32)`, q in 0..=63.
    ///
    /// The codes less 32 are signed bytes in -32..=31; b2 takes their signs (`vpsignb`) so that
    /// it can be the signed operand against their absolute values. Lane bounds (i32, per half
    /// block of 128): `vpmaddubsw(|q−32|, ±b2)` ≤ 2·32·64 = 4,096 and `vpmaddubsw(b1, q−32)` ≤
    /// 2·255·32 = 16,320; times |256·sc| ≤ 32,768 and |sc| ≤ 128: ≤ 2.73e8 per group, 1.1e9 over
    /// a half's 4 groups, below 2³¹ (so the sums are flushed to f32 every half block).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_q6k<const MR: usize>(x: *const u8, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [_mm256_setzero_ps(); MR];
        for bi in 0..k / BLOCK {
            let b = w.add(bi * 210);
            prefetch(b, 210);
            let d = f16_at(b.add(208));
            let scp = b.add(192) as *const i8;
            for h in 0..2 {
                let mut hi = [_mm256_setzero_si256(); MR];
                let mut lo = [_mm256_setzero_si256(); MR];
                let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
                for p in 0..4 {
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
                    // Elements 0..16 of the group have scale 8h + 2p, 16..32 the next.
                    let (s0, s1) = (
                        *scp.add(8 * h + 2 * p) as i32,
                        *scp.add(8 * h + 2 * p + 1) as i32,
                    );
                    let m1 = _mm256_setr_m128i(_mm_set1_epi32(pair(s0)), _mm_set1_epi32(pair(s1)));
                    let m256 = _mm256_setr_m128i(
                        _mm_set1_epi32(pair(256 * s0)),
                        _mm_set1_epi32(pair(256 * s1)),
                    );
                    let g = 4 * h + p;
                    for i in 0..MR {
                        let (dg, _, _) = parts(x, k, i);
                        let a = dg.add(96 * (bi * 8 + g));
                        group_sums::<true>(a, q, aq, m1, m256, &mut hi[i], &mut lo[i]);
                    }
                }
                for i in 0..MR {
                    let (_, _, scales) = parts(x, k, i);
                    flush(&mut acc[i], hi[i], lo[i], d * f32_at(scales.add(4 * bi)));
                }
            }
        }
        acc.map(|a| hsum(a))
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
        let isa = simd::isa();
        let types = [DType::Q4_K, DType::Q6_K];
        if !types.iter().any(|&t| supported(isa, t)) {
            eprintln!("skipped: no integer kernels on this CPU ({isa:?})");
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
