//! Integer dot products for the K-quants (Q4_K, Q5_K, Q6_K) on AVX-512 CPUs with VNNI, within
//! the f32 bound.
//!
//! The activations are split as for the AVX2 kernels (`qdot_int`: per block of 256, `x_j =
//! s · (t2_j · 2¹⁶ + t1_j · 2⁸ + t0_j) + ε_j` with signed-byte digits and `|ε_j| ≤ 2⁻²² · M`),
//! and the same bound holds; only the integer arithmetic differs. A 512-bit register holds 64
//! codes (two groups of 32), and `vpdpbusd` multiplies codes by digit bytes and adds each four
//! into a 32-bit lane in one instruction. The three digits enter one accumulator by Horner's
//! rule, `((Σ q·t2) · 2⁸ + Σ q·t1) · 2⁸ + Σ q·t0 = Σ q · x_q`, exactly: each lane holds four
//! weights' `q · x_q`, then it is converted to f32 once and multiplied by its group's scale.
//! Against the AVX2 kernel (`vpmaddubsw` and `vpmaddwd` per digit, the scale as a 16-bit
//! multiplier), a group costs half the multiplies and no 16-bit stage.
//!
//! # The bound
//! As in `qdot_int`: the splitting error `ε` is the only approximation before the integer
//! sums. Per lane, Q4_K's `|Σ₄ q · x_q| ≤ 4 · 15 · (64 · 2¹⁶ + 128 · 2⁸ + 128) < 2²⁸` and
//! Q6_K's `≤ 4 · 63 · 4,227,200 < 1.07 · 2³⁰`, so the Horner sums never wrap; each converts
//! to f32 with a relative error of at most 2⁻²⁴. The group factor `d · sc` is exact in f32
//! (an 11-bit f16 significand times a 6- or 8-bit integer), so each lane's term is rounded
//! twice (conversion, multiply-add) and the block's sum once more by `s`, a power of two
//! (exact). The offsets (Q4_K's mins, Q6_K's 32) come from the activations' group sums, as
//! in `qdot_int`. So `|result − Σ w_j x_j| ≤ Σ_blocks 2⁻²² · M_block · Σ_block |w_j|` plus the
//! f32 rounding of a dot of that length, checked here row by row against an f64 dot and end to
//! end by `tests/exact.rs`.
//!
//! # Same bits in every batch
//! A row's sums run in the same order whatever the number of activation rows in a call (the
//! rows share the decoded weights, never an accumulator), and every batch size on a CPU that
//! takes this path runs it: decode, batched decode and prefill give a row the same bits.

use crate::tensor::DType;

/// Activation rows one call covers at most.
pub(crate) const MAX_ROWS: usize = 4;

/// Whether [`rows_dots`] handles `dtype` on this CPU (AVX-512 picked, and VNNI present).
pub(crate) fn supported(isa: super::simd::Isa, dtype: DType) -> bool {
    isa == super::simd::Isa::Avx512
        && matches!(dtype, DType::Q4_K | DType::Q5_K | DType::Q6_K)
        && has_vnni()
}

/// Whether the CPU has what these kernels use: AVX-512 F, BW, VL and VNNI, FMA and F16C.
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f")
            && has!("avx512bw")
            && has!("avx512vl")
            && has!("avx512vnni")
            && has!("fma")
            && has!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `y[i·ldy + r] = x_i · W_r` for the `mr` (1..=4) split activation rows at `x` (stride
/// `qdot_int::row_bytes`, made by `qdot_int::split_row`) and each weight row `r` in `rows`, row r being
/// `k` elements of `dtype` at `w + r·rb`.
///
/// # Safety
/// [`has_vnni`] holds and `dtype` is Q4_K, Q5_K or Q6_K; `k` is a multiple of 256; `x` holds `mr`
/// split rows for this `k`; each weight row in `rows` is readable; `y` is writable at rows
/// `0..mr` (stride `ldy`) and the columns in `rows`.
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
            ($f:ty) => {
                match mr {
                    1 => x86::run::<$f, 1>(x, k, w, rb, rows, y, ldy),
                    2 => x86::run::<$f, 2>(x, k, w, rb, rows, y, ldy),
                    3 => x86::run::<$f, 3>(x, k, w, rb, rows, y, ldy),
                    _ => x86::run::<$f, 4>(x, k, w, rb, rows, y, ldy),
                }
            };
        }
        match dtype {
            DType::Q4_K => go!(x86::Q4K),
            DType::Q5_K => go!(x86::Q5K),
            DType::Q6_K => go!(x86::Q6K),
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
    use super::super::qdot_int::x86::{f16_at, f32_at, parts, prefetch, scales_mins_k4};
    use super::super::qdot_int::{digit_at, BLOCK};
    use std::arch::x86_64::*;

    /// A format's weight side: what one block of one weight row gives the kernel.
    pub trait Format {
        /// Bytes of a block of 256.
        const BYTES: usize;
        /// A block's group factors `d·sc` as f32 (the lanes [`Format::pair`] permutes from), and
        /// its offset factors, each lane multiplying the activations' sum over the same lane's
        /// group in [`Format::sums`] (lanes it does not use are zero).
        unsafe fn head(b: *const u8) -> (__m512, __m512);
        /// The 64 codes of group pair `c` (0..4, elements `64c..64c + 64`) as bytes, and the
        /// factors of their 16 lanes of four.
        unsafe fn pair(b: *const u8, c: usize, scales: __m512) -> (__m512i, __m512);
        /// Activation row `i`'s group sums that [`Format::head`]'s offsets multiply, for block
        /// `bi`.
        unsafe fn sums(x: *const u8, k: usize, i: usize, bi: usize) -> __m512;
    }

    /// `MR` split activation rows against `NR` weight rows at once (the activation digits are
    /// loaded once for every weight row, the weight codes once for every activation row); a
    /// pair's operations and their order are the same for any `MR` and `NR`.
    #[inline(always)]
    unsafe fn tile<F: Format, const MR: usize, const NR: usize>(
        x: *const u8,
        k: usize,
        w: [*const u8; NR],
    ) -> [[f32; NR]; MR] {
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        for bi in 0..k / BLOCK {
            // (Loops, not `array::from_fn`: its closures were not inlined into the kernel.)
            let mut heads = [(_mm512_setzero_ps(), _mm512_setzero_ps()); NR];
            for (h, wj) in heads.iter_mut().zip(&w) {
                let b = wj.add(bi * F::BYTES);
                prefetch(b, F::BYTES);
                *h = F::head(b);
            }
            let mut blk = [[_mm512_setzero_ps(); NR]; MR];
            for c in 0..4 {
                let mut codes = [(_mm512_setzero_si512(), _mm512_setzero_ps()); NR];
                for ((q, wj), h) in codes.iter_mut().zip(&w).zip(&heads) {
                    *q = F::pair(wj.add(bi * F::BYTES), c, h.0);
                }
                for (i, bl) in blk.iter_mut().enumerate() {
                    let a = parts(x, k, i).0.add(digit_at(bi * 8 + 2 * c, 0));
                    let t = [
                        _mm512_loadu_si512(a as *const __m512i),
                        _mm512_loadu_si512(a.add(64) as *const __m512i),
                        _mm512_loadu_si512(a.add(128) as *const __m512i),
                    ];
                    for (b, (q, m)) in bl.iter_mut().zip(&codes) {
                        *b = _mm512_fmadd_ps(_mm512_cvtepi32_ps(horner(*q, &t)), *m, *b);
                    }
                }
            }
            for (i, (a, bl)) in acc.iter_mut().zip(&blk).enumerate() {
                let sums = F::sums(x, k, i, bi);
                let sx = _mm512_set1_ps(f32_at(parts(x, k, i).3.add(4 * bi)));
                for ((a, b), h) in a.iter_mut().zip(bl).zip(&heads) {
                    *a = _mm512_fmadd_ps(_mm512_fnmadd_ps(h.1, sums, *b), sx, *a);
                }
            }
        }
        let mut out = [[0f32; NR]; MR];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, a) in o.iter_mut().zip(a) {
                *o = hsum(*a);
            }
        }
        out
    }

    /// `y[i·ldy + r] = x_i · W_r` for `MR` split rows and the weight rows `rows`, two at a
    /// time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn run<F: Format, const MR: usize>(
        x: *const u8,
        k: usize,
        w: *const u8,
        rb: usize,
        rows: std::ops::Range<usize>,
        y: *mut f32,
        ldy: usize,
    ) {
        let mut r = rows.start;
        // One activation row (decode) goes one weight row at a time: pairs measured slower
        // there (1B Llama Q4_K tg 33 against 36 t/s), faster in prefill (pp128 73 against 61).
        while MR > 1 && r + 2 <= rows.end {
            let s = tile::<F, MR, 2>(x, k, [w.add(r * rb), w.add((r + 1) * rb)]);
            for (i, v) in s.iter().enumerate() {
                *y.add(i * ldy + r) = v[0];
                *y.add(i * ldy + r + 1) = v[1];
            }
            r += 2;
        }
        while r < rows.end {
            let s = tile::<F, MR, 1>(x, k, [w.add(r * rb)]);
            for (i, v) in s.iter().enumerate() {
                *y.add(i * ldy + r) = v[0];
            }
            r += 1;
        }
    }

    /// `Σ q · x_q` per lane for 64 codes `q` and the three digits `t` of the same 64 elements:
    /// Horner's rule over the digits, exact (the lane bounds are at the formats).
    #[inline(always)]
    unsafe fn horner(q: __m512i, t: &[__m512i; 3]) -> __m512i {
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, t[2]);
        let s = _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(s), q, t[1]);
        _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(s), q, t[0])
    }

    /// The sum of the 16 lanes in a fixed order.
    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        let top = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let h = _mm256_add_ps(_mm512_castps512_ps256(v), top);
        let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; weight
    /// `d·sc_g·q − dmin·mn_g` in group g of 32, q in 0..=15. Bytes `32c..32c + 32` hold group
    /// `2c` in their low nibbles and `2c + 1` in their high ones: one 32-byte load, broadcast
    /// to both halves of a register and shifted by 0 and 4, is the 64 codes of a group pair.
    /// Per lane `|Σ₄ q·x_q| ≤ 4 · 15 · 4,227,200 < 2²⁸`: the Horner sums do not wrap.
    pub struct Q4K;

    /// Q4_K's and Q5_K's head: f16 d, f16 dmin and 12 bytes of 6-bit scales and mins, as
    /// `d·sc_g` and `dmin·mn_g` in elements 0..8 (exact: 11 × 6 significant bits).
    #[inline(always)]
    unsafe fn scales_mins(b: *const u8) -> (__m512, __m512) {
        let d = f16_at(b);
        let dmin = f16_at(b.add(2));
        let (sc, mn) = scales_mins_k4(b);
        let f = |v: u64, s: f32| {
            _mm512_zextps256_ps512(_mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64))),
                _mm256_set1_ps(s),
            ))
        };
        (f(sc, d), f(mn, dmin))
    }

    /// The nibbles of bytes `at..at + 32` of `b` as the 64 codes of a group pair: low nibbles
    /// in the first 32 bytes, high ones in the last (one load, broadcast to both halves and
    /// shifted by 0 and 4).
    #[inline(always)]
    unsafe fn nibble_pair(b: *const u8, at: usize) -> __m512i {
        let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(at) as *const __m256i));
        _mm512_and_si512(
            _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)),
            _mm512_set1_epi8(0x0F),
        )
    }

    /// Group `2c`'s factor in lanes 0..8, group `2c + 1`'s in lanes 8..16.
    #[inline(always)]
    unsafe fn pair_factors(c: usize, scales: __m512) -> __m512 {
        let (g0, g1) = (2 * c as i32, 2 * c as i32 + 1);
        let lanes = _mm512_setr_epi32(
            g0, g0, g0, g0, g0, g0, g0, g0, g1, g1, g1, g1, g1, g1, g1, g1,
        );
        _mm512_permutexvar_ps(lanes, scales)
    }

    /// The sums over each group of 32, in lanes 0..8.
    #[inline(always)]
    unsafe fn sums32(x: *const u8, k: usize, i: usize, bi: usize) -> __m512 {
        _mm512_maskz_loadu_ps(0x00FF, parts(x, k, i).1.add(4 * 8 * bi) as *const f32)
    }

    impl Format for Q4K {
        const BYTES: usize = 144;

        #[inline(always)]
        unsafe fn head(b: *const u8) -> (__m512, __m512) {
            scales_mins(b)
        }

        #[inline(always)]
        unsafe fn pair(b: *const u8, c: usize, scales: __m512) -> (__m512i, __m512) {
            (nibble_pair(b, 16 + 32 * c), pair_factors(c, scales))
        }

        #[inline(always)]
        unsafe fn sums(x: *const u8, k: usize, i: usize, bi: usize) -> __m512 {
            sums32(x, k, i, bi)
        }
    }

    /// Q5_K: Q4_K's head, 32 bytes of fifth bits, 128 bytes of nibbles (at 48); weight
    /// `d·sc_g·q − dmin·mn_g`, q in 0..=31, bit 4 of group g's element l being bit g of
    /// high byte l. Per lane `|Σ₄ q·x_q| ≤ 4 · 31 · 4,227,200 < 2²⁹`: the Horner sums do not
    /// wrap.
    pub struct Q5K;

    impl Format for Q5K {
        const BYTES: usize = 176;

        #[inline(always)]
        unsafe fn head(b: *const u8) -> (__m512, __m512) {
            scales_mins(b)
        }

        #[inline(always)]
        unsafe fn pair(b: *const u8, c: usize, scales: __m512) -> (__m512i, __m512) {
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i));
            let (s0, s1) = (2 * c as i64, 2 * c as i64 + 1);
            let top = _mm512_and_si512(
                _mm512_srlv_epi64(qh, _mm512_setr_epi64(s0, s0, s0, s0, s1, s1, s1, s1)),
                _mm512_set1_epi8(1),
            );
            let q = _mm512_or_si512(nibble_pair(b, 48 + 32 * c), _mm512_slli_epi16::<4>(top));
            (q, pair_factors(c, scales))
        }

        #[inline(always)]
        unsafe fn sums(x: *const u8, k: usize, i: usize, bi: usize) -> __m512 {
            sums32(x, k, i, bi)
        }
    }

    /// Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed scales (one per 16
    /// weights), f16 d; weight `d·sc·(q − 32)`, q in 0..=63. In each half of 128 weights, the
    /// group pair `(4h, 4h + 1)` is the low nibbles of bytes `64h..64h + 64` with bit pairs 0 and
    /// 2 of the high bytes `128 + 32h..`, and `(4h + 2, 4h + 3)` the high nibbles with bit
    /// pairs 4 and 6. The codes enter unsigned; the offset comes from the activations' sums
    /// over each 16: `Σ sc·(q − 32)·x = Σ sc·q·x − 32·Σ sc·Σ₁₆ x`. Per lane
    /// `|Σ₄ q·x_q| ≤ 4 · 63 · 4,227,200 < 2³¹`: the Horner sums do not wrap.
    pub struct Q6K;

    impl Format for Q6K {
        const BYTES: usize = 210;

        #[inline(always)]
        unsafe fn head(b: *const u8) -> (__m512, __m512) {
            let d = f16_at(b.add(208));
            // The 16 scales times d (exact: 11 × 8 significant bits), and times 32 d.
            let scb = _mm_loadu_si128(b.add(192) as *const __m128i);
            let scf = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scb)),
                _mm512_set1_ps(d),
            );
            (scf, _mm512_mul_ps(scf, _mm512_set1_ps(32.0)))
        }

        #[inline(always)]
        unsafe fn pair(b: *const u8, c: usize, scales: __m512) -> (__m512i, __m512) {
            let (h, hi) = (c / 2, c % 2);
            let ql = _mm512_loadu_si512(b.add(64 * h) as *const __m512i);
            let nib = _mm512_set1_epi8(0x0F);
            let low = if hi == 0 {
                _mm512_and_si512(ql, nib)
            } else {
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nib)
            };
            let qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i));
            let (s0, s1) = (4 * hi as i64, 4 * hi as i64 + 2);
            let top = _mm512_and_si512(
                _mm512_srlv_epi64(qh, _mm512_setr_epi64(s0, s0, s0, s0, s1, s1, s1, s1)),
                _mm512_set1_epi8(3),
            );
            let q = _mm512_or_si512(low, _mm512_slli_epi16::<4>(top));
            // Scales 4c..4c + 4, four lanes (16 weights) each.
            let s = 4 * c as i32;
            let (s1, s2, s3) = (s + 1, s + 2, s + 3);
            let lanes =
                _mm512_setr_epi32(s, s, s, s, s1, s1, s1, s1, s2, s2, s2, s2, s3, s3, s3, s3);
            (q, _mm512_permutexvar_ps(lanes, scales))
        }

        /// The sums over each 16.
        #[inline(always)]
        unsafe fn sums(x: *const u8, k: usize, i: usize, bi: usize) -> __m512 {
            _mm512_loadu_ps(parts(x, k, i).2.add(4 * 16 * bi) as *const f32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qdot_int::{check_row_kernel, row_bytes, split_row};
    use crate::quant;
    use crate::rng::Rng;

    /// Every row against an f64 dot over the dequantized weights, within the bound proven in
    /// the module's comment, and the same bits whatever the number of rows in the call or the
    /// weight rows it covers.
    #[test]
    fn vnni_rows_match_an_f64_dot_within_the_bound_and_do_not_depend_on_the_batch() {
        if !has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let types = [DType::Q4_K, DType::Q5_K, DType::Q6_K];
        check_row_kernel(&types, MAX_ROWS, rows_dots, 29);
    }

    /// Codes at their extremes (all 15 or all 63 with the largest scales) against digits at
    /// theirs: the Horner sums must not wrap.
    #[test]
    fn extreme_codes_and_digits_do_not_wrap() {
        if !has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let k = 512;
        for &dt in &[DType::Q4_K, DType::Q5_K, DType::Q6_K] {
            // Large equal weights quantize to the top code with the top scale.
            let wf: Vec<f32> = (0..k)
                .map(|j| if j % 3 == 0 { 1.0 } else { 0.999 })
                .collect();
            let wq = quant::quantize(dt, &wf).unwrap();
            let mut wd = vec![0f32; k];
            quant::dequantize(dt, &wq, &mut wd).unwrap();
            // Activations near the block maximum, both signs: digits at their ends.
            let mut rng = Rng::new(3);
            for sign in [1f32, -1.0] {
                let x: Vec<f32> = (0..k)
                    .map(|j| sign * (1.0 - (j % 7) as f32 * rng.uniform(0.0, 1e-7)))
                    .collect();
                let mut split = vec![0u8; row_bytes(k)];
                split_row(&x, &mut split);
                let mut y = [f32::NAN];
                unsafe {
                    rows_dots(
                        dt,
                        split.as_ptr(),
                        1,
                        k,
                        (wq.as_ptr(), wq.len()),
                        0..1,
                        (y.as_mut_ptr(), 1),
                    )
                };
                let want: f64 = x.iter().zip(&wd).map(|(a, b)| *a as f64 * *b as f64).sum();
                assert!(
                    ((y[0] as f64) - want).abs() <= 1e-5 * want.abs(),
                    "{dt:?} sign {sign}: {} vs {want}",
                    y[0]
                );
            }
        }
    }
}
