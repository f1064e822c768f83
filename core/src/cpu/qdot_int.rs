//! Integer dot products for the K-quants on AVX2 CPUs, within the f32 bound; the activation
//! split here is also the input of the AVX-512 VNNI kernels (`qdot_vnni`).
//!
//! A weight row of Q4_K or Q6_K holds small integer codes `q` and, per group of 32 or 16, a
//! small integer scale `sc` (and for Q4_K a min `mn`), under per-block f16 factors. The f32
//! decoders turn every code into an f32 before multiplying: a conversion, a table lookup or a
//! multiply per weight, and the decode kernels spend their time there, not waiting for memory.
//! Here the codes stay integers. Each activation row is split once, per block of 256, into
//!
//! ```text
//!   x_j = s · (t2_j · 2¹⁶ + t1_j · 2⁸ + t0_j) + ε_j,    s = 2^e,  t0, t1 ∈ [-128, 127],  t2 ∈ [-64, 64]
//! ```
//!
//! (balanced digits: all three are signed bytes, so they are the memory operand of
//! `vpmaddubsw` against the unsigned codes, and no load of them costs an instruction of its
//! own). For every digit the kernels sum `sc_g · Σ_g q · t` over a block's groups exactly in
//! 32-bit lanes: `vpmaddubsw` multiplies code and digit bytes and adds pairs, `vpmaddwd` by
//! the group's scale (broadcast to 16-bit lanes with one `vpshufb`, shared by every activation
//! row) adds pairs again, and one add per digit accumulates. No horizontal sum is taken inside
//! a block: the three accumulators are converted to f32 once per block, combined with their
//! powers of 2¹⁶ and 2⁸ and multiplied by `d · s`; Q4_K's mins and Q6_K's offset of 32 come
//! from the activations' sums over each group.
//!
//! # The bound
//! `e` is chosen from the block's largest `|x|`, `M ∈ [2^E, 2^(E+1))`, as `E − 21`: then
//! `|x_j / s| < 2^22`, the rounding `x_q = round(x_j / s)` fits in 23 bits (the three digits
//! above), and `|ε_j| ≤ s / 2 = 2^(E−22) ≤ 2^-22 · M`. Scaling by a power of two is exact, so
//! ε is the only approximation before the integer sums, which are exact (the lane bounds are
//! at each kernel). After them come f32 roundings: of the three digit sums, of their
//! combination, and of the offset terms (`dmin·mn·Σx`, `32·d·sc·Σx`), each a relative 2⁻²⁴ of
//! a sum of magnitudes `Σ |c_j|·|x_j|` where `|c_j|` is at most 63·d·|sc| or `dmin·mn` (a few
//! times the largest weight of the group), and the f32 accumulation of one term per lane and
//! block, as in any f32 dot. So
//!
//! ```text
//!   |result − Σ w_j x_j| ≤ Σ_blocks 2^-22 · M_block · Σ_block |w_j|  +  f32 rounding error
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

/// Bytes of one split activation row of `k` elements: for each pair of groups of 32 (64
/// elements), the 64 `t0`, the 64 `t1` and the 64 `t2` (192 bytes: a 512-bit register's worth
/// of each digit, see [`digit_at`]); then the sums of `x_q` over each group of 32 as f32
/// (`k / 32`), over each group of 16 (`k / 16`), and the block scales `s` as f32 (`k / 256`).
pub(crate) fn row_bytes(k: usize) -> usize {
    3 * k + 4 * (k / 32) + 4 * (k / 16) + 4 * (k / 32)
}

/// How a row is split: the integers' range, `|x_q| ≤ 2^q_bits`, and whether each group of 32
/// has its own scale (else each block of 256 has one; the scales region holds `k / 32`
/// entries either way).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Split {
    pub q_bits: i32,
    pub group_scales: bool,
}

/// The K-quant kernels' split: `|x_q| ≤ 2²²`, a scale per block (see the module's comment).
/// The VNNI kernels for the formats with blocks of 32 take their own (`qdot_vnni`).
pub(crate) const K_SPLIT: Split = Split {
    q_bits: 22,
    group_scales: false,
};

/// Where digit `t` (0, 1, 2) of group `g` (32 elements) starts in a split row: groups are
/// paired, `2g` and `2g + 1` side by side for each digit, so one 64-byte load holds a digit of
/// 64 consecutive elements (the AVX-512 kernels) and a 32-byte load one group's (AVX2).
pub(crate) const fn digit_at(g: usize, t: usize) -> usize {
    192 * (g / 2) + 32 * (g % 2) + 64 * t
}

/// `2^e` as f32, for `e` in -126..=127.
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// The balanced digit of `v` modulo 256, in -128..=127, and what is left (`(v − t) / 256`).
fn balanced(v: i32) -> (i32, i32) {
    let t = ((v + 128) & 0xFF) - 128;
    (t, (v - t) >> 8)
}

/// Splits one activation row `x` (`k` a multiple of 64; the last block of 256 may be short)
/// into `out` ([`row_bytes`] long), with integers `|x_q| ≤ 2^q_bits` (`q_bits` 19 to 22): the
/// scale of a block (or of a group, with `group_scales`) is `2^(E − q_bits + 1)` for its
/// maximum `M` in `[2^E, 2^(E+1))`, so `|ε_j| ≤ 2^-q_bits · M`, and the top digit is at most
/// `2^(q_bits − 16)`.
///
/// A block (group) holding a NaN or an infinity gets the scale NaN, so its dots are NaN (as an
/// f32 product with such an activation would be NaN or infinite).
pub(crate) fn split_row(x: &[f32], out: &mut [u8], how: Split) {
    debug_assert!(x.len().is_multiple_of(64) && (19..=22).contains(&how.q_bits));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2")
        && x.len().is_multiple_of(64)
        && out.len() >= row_bytes(x.len())
    {
        // SAFETY: AVX2 is present; the lengths are as `split_avx2` needs.
        unsafe { x86::split_avx2(x, out, how) };
        return;
    }
    split_scalar(x, out, how);
}

/// The scale `2^e` for a block or group whose largest magnitude is `m` (NaN where `finite` is
/// false), and `2^-e` (0 there): `e = E − q_bits + 1` for `m` in `[2^E, 2^(E+1))`, kept where
/// `2^e` and `2^-e` are both normal f32 (a subnormal or zero m counts as tiny, so below
/// `M = 2^-104` the step stays `2^-126`).
fn scale_of(m: f32, finite: bool, q_bits: i32) -> (f32, f32) {
    let big_e = ((m.to_bits() >> 23) & 0xFF) as i32 - 127;
    let e = (big_e - q_bits + 1).clamp(-126, 126);
    if finite {
        (pow2(e), pow2(-e))
    } else {
        (f32::NAN, 0.0)
    }
}

/// [`split_row`] one element at a time: the definition the vector split must match byte for
/// byte.
fn split_scalar(x: &[f32], out: &mut [u8], how: Split) {
    let k = x.len();
    let (digits, rest) = out.split_at_mut(3 * k);
    let (sums32, rest) = rest.split_at_mut(4 * (k / 32));
    let (sums16, scales) = rest.split_at_mut(4 * (k / 16));
    // With a scale per block, the entries past the blocks' are zeros.
    scales.fill(0);
    // The largest magnitude, and whether all are finite (a NaN is lost by `max`).
    let top = |xs: &[f32]| {
        let m = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        (m, m.is_finite() && xs.iter().all(|v| !v.is_nan()))
    };
    for (b, xb) in x.chunks(BLOCK).enumerate() {
        let (m, finite) = top(xb);
        let mut scale = scale_of(m, finite, how.q_bits);
        if !how.group_scales {
            scales[4 * b..4 * b + 4].copy_from_slice(&scale.0.to_le_bytes());
        }
        for (g, xg) in xb.chunks_exact(32).enumerate() {
            let gi = b * (BLOCK / 32) + g;
            if how.group_scales {
                let (m, finite) = top(xg);
                scale = scale_of(m, finite, how.q_bits);
                scales[4 * gi..4 * gi + 4].copy_from_slice(&scale.0.to_le_bytes());
            }
            let inv = scale.1;
            let (d0, d1, d2) = (digit_at(gi, 0), digit_at(gi, 1), digit_at(gi, 2));
            let mut half = [0i32; 2];
            for (j, v) in xg.iter().enumerate() {
                // |v · 2^-e| < 2^q_bits, so |q| ≤ 2^q_bits: t0 and t1 are balanced bytes and
                // the rest |t2| ≤ (2^(q_bits - 8) + 1/2) / 2^8 rounds to at most
                // 2^(q_bits - 16). A non-finite block is all zeros (inv = 0; NaN · 0 is NaN,
                // which `as` turns into 0).
                let q = (v * inv).round_ties_even() as i32;
                half[j / 16] += q;
                let (t0, r) = balanced(q);
                let (t1, t2) = balanced(r);
                digits[d0 + j] = t0 as i8 as u8;
                digits[d1 + j] = t1 as i8 as u8;
                digits[d2 + j] = t2 as i8 as u8;
            }
            // |sum| ≤ 32 · 2^22 = 2^27: one rounding to f32 each.
            let whole = (half[0] + half[1]) as f32;
            sums32[4 * gi..4 * gi + 4].copy_from_slice(&whole.to_le_bytes());
            for (h, v) in half.iter().enumerate() {
                let o = 4 * (2 * gi + h);
                sums16[o..o + 4].copy_from_slice(&(*v as f32).to_le_bytes());
            }
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
pub(crate) mod x86 {
    use super::{row_bytes, BLOCK};
    use std::arch::x86_64::*;

    /// Bytes ahead of the weight block being read that are prefetched into L1, and further
    /// ahead into L2: one core alone keeps too few misses in flight for the sequential stream.
    /// 1B Llama Q4_K decode on 2 AVX-512 threads, medians of 5 interleaved rounds: 42.6 t/s
    /// against 39.2 with one prefetch 4 KiB ahead into L1 (30 t/s with none).
    const PREFETCH_L1: usize = 1024;
    const PREFETCH_L2: usize = 8192;

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
    pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            std::ptr::read_unaligned(p as *const u16) as i32,
        )))
    }

    #[inline(always)]
    pub(crate) unsafe fn u32_at(p: *const u8) -> u32 {
        std::ptr::read_unaligned(p as *const u32)
    }

    #[inline(always)]
    pub(crate) unsafe fn f32_at(p: *const u8) -> f32 {
        std::ptr::read_unaligned(p as *const f32)
    }

    /// The eight lanes summed in a fixed order.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// Q4_K's and Q5_K's 6-bit scales and mins (bytes 4..16 of a block), one byte a group:
    /// groups 0..4 in the low 6 bits of bytes 0..4 and 4..8; groups 4..8 in the nibbles of
    /// bytes 8..12, with bits 4 and 5 in the top two bits of bytes 0..4 and 4..8.
    #[inline(always)]
    pub(crate) unsafe fn scales_mins_k4(b: *const u8) -> (u64, u64) {
        let (w0, w1, w2) = (u32_at(b.add(4)), u32_at(b.add(8)), u32_at(b.add(12)));
        let sc = (w0 & 0x3f3f_3f3f) as u64
            | (((w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4)) as u64) << 32;
        let mn = (w1 & 0x3f3f_3f3f) as u64
            | ((((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4)) as u64) << 32;
        (sc, mn)
    }

    #[inline(always)]
    pub(crate) unsafe fn prefetch(p: *const u8, bytes: usize) {
        let mut o = 0;
        while o < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_L1 + o) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_L2 + o) as *const i8);
            o += 64;
        }
    }

    /// [`super::split_row`] eight elements at a time, with the same bytes: the block maximum is
    /// the same value whichever order it is taken in, the products with `2^-e` are exact, the
    /// conversion rounds to nearest even (the default MXCSR mode) as `round_ties_even` does,
    /// and the integer digit and sum arithmetic is exact.
    ///
    /// # Safety
    /// The CPU has AVX2; `x.len()` is a multiple of 64 and `out` holds [`row_bytes`] of it.
    #[target_feature(enable = "avx2")]
    pub unsafe fn split_avx2(x: &[f32], out: &mut [u8], how: super::Split) {
        let k = x.len();
        let (digits, rest) = out.split_at_mut(3 * k);
        let (sums32, rest) = rest.split_at_mut(4 * (k / 32));
        let (sums16, scales) = rest.split_at_mut(4 * (k / 16));
        scales.fill(0);
        let abs_mask = _mm256_set1_ps(f32::from_bits(0x7FFF_FFFF));
        for (b, xb) in x.chunks(BLOCK).enumerate() {
            let xp = xb.as_ptr();
            let groups = xb.len() / 32;
            // Each group's largest magnitude and whether it is all finite.
            let mut gmax = [0f32; 8];
            let mut gfinite = [true; 8];
            for g in 0..groups {
                let mut mx = _mm256_setzero_ps();
                let mut bad = _mm256_setzero_ps();
                for c in 0..4 {
                    let a = _mm256_and_ps(_mm256_loadu_ps(xp.add(32 * g + 8 * c)), abs_mask);
                    mx = _mm256_max_ps(mx, a);
                    // NaN or infinite: |v| is not below infinity (an unordered compare is true).
                    bad = _mm256_or_ps(
                        bad,
                        _mm256_cmp_ps::<_CMP_NLT_UQ>(a, _mm256_set1_ps(f32::INFINITY)),
                    );
                }
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
                gmax[g] = lanes.iter().fold(0f32, |m, v| m.max(*v));
                gfinite[g] = _mm256_movemask_ps(bad) == 0;
            }
            let block = super::scale_of(
                gmax.iter().fold(0f32, |m, v| m.max(*v)),
                gfinite.iter().all(|f| *f),
                how.q_bits,
            );
            if !how.group_scales {
                scales[4 * b..4 * b + 4].copy_from_slice(&block.0.to_le_bytes());
            }
            let gd = digits.as_mut_ptr().add(96 * 8 * b);
            let g32 = sums32.as_mut_ptr().add(4 * 8 * b) as *mut i32;
            let g16 = sums16.as_mut_ptr().add(4 * 16 * b) as *mut i32;
            let (c128, c255) = (_mm256_set1_epi32(128), _mm256_set1_epi32(255));
            // packs interleave 128-bit lanes: this puts the 32 bytes back in element order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for g in 0..groups {
                let (s, inv) = if how.group_scales {
                    let sc = super::scale_of(gmax[g], gfinite[g], how.q_bits);
                    let at = 4 * (8 * b + g);
                    scales[at..at + 4].copy_from_slice(&sc.0.to_le_bytes());
                    sc
                } else {
                    block
                };
                if s.is_nan() {
                    for d in 0..3 {
                        std::ptr::write_bytes(gd.add(super::digit_at(g, d)), 0, 32);
                    }
                    std::ptr::write_unaligned(g32.add(g), 0);
                    std::ptr::write_unaligned(g16.add(2 * g), 0);
                    std::ptr::write_unaligned(g16.add(2 * g + 1), 0);
                    continue;
                }
                let inv = _mm256_set1_ps(inv);
                let mut t = [[_mm256_setzero_si256(); 4]; 3];
                let mut sum = [_mm256_setzero_si256(); 2];
                for c in 0..4 {
                    let v = _mm256_loadu_ps(xp.add(32 * g + 8 * c));
                    let q = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
                    sum[c / 2] = _mm256_add_epi32(sum[c / 2], q);
                    let t0 =
                        _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(q, c128), c255), c128);
                    let r = _mm256_srai_epi32(_mm256_sub_epi32(q, t0), 8);
                    let t1 =
                        _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(r, c128), c255), c128);
                    t[0][c] = t0;
                    t[1][c] = t1;
                    t[2][c] = _mm256_srai_epi32(_mm256_sub_epi32(r, t1), 8);
                }
                for (d, tv) in t.iter().enumerate() {
                    let lo = _mm256_packs_epi32(tv[0], tv[1]);
                    let hi = _mm256_packs_epi32(tv[2], tv[3]);
                    let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(lo, hi), order);
                    _mm256_storeu_si256(gd.add(super::digit_at(g, d)) as *mut __m256i, bytes);
                }
                let mut h = [0i32; 2];
                for (hv, sv) in h.iter_mut().zip(sum) {
                    let mut l = [0i32; 8];
                    _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, sv);
                    *hv = l.iter().sum();
                }
                // The sums as f32, one rounding each, as the scalar split stores them.
                std::ptr::write_unaligned(g32.add(g), ((h[0] + h[1]) as f32).to_bits() as i32);
                std::ptr::write_unaligned(g16.add(2 * g), (h[0] as f32).to_bits() as i32);
                std::ptr::write_unaligned(g16.add(2 * g + 1), (h[1] as f32).to_bits() as i32);
            }
        }
    }

    /// Pointers to activation row i's parts: digits, sums over 32, sums over 16, block scales.
    #[inline(always)]
    pub(crate) unsafe fn parts(
        x: *const u8,
        k: usize,
        i: usize,
    ) -> (*const u8, *const u8, *const u8, *const u8) {
        let r = x.add(i * row_bytes(k));
        let s32 = r.add(3 * k);
        let s16 = s32.add(4 * (k / 32));
        (r, s32, s16, s16.add(4 * (k / 16)))
    }

    /// `vpshufb` controls that spread 16-bit element `g` of each 128-bit lane over the lane.
    const SPREAD: [[u8; 32]; 8] = {
        let mut c = [[0u8; 32]; 8];
        let mut g = 0;
        while g < 8 {
            let mut j = 0;
            while j < 32 {
                c[g][j] = (2 * g + (j & 1)) as u8;
                j += 1;
            }
            g += 1;
        }
        c
    };

    #[inline(always)]
    unsafe fn spread(v: __m256i, g: usize) -> __m256i {
        _mm256_shuffle_epi8(v, _mm256_loadu_si256(SPREAD[g].as_ptr() as *const __m256i))
    }

    /// Adds one group's `scale · Σ q·t` to each digit's lanes: `acc[0..3]` for `t0`, `t1`,
    /// `t2` (at `a`, `a + 64`, `a + 128`), `q` the group's unsigned codes, `m` the scale in every
    /// 16-bit lane (or, for Q6_K, one scale per 128-bit half).
    #[inline(always)]
    unsafe fn group(acc: &mut [__m256i; 3], a: *const u8, q: __m256i, m: __m256i) {
        for (t, v) in acc.iter_mut().enumerate() {
            let d = _mm256_loadu_si256(a.add(64 * t) as *const __m256i);
            *v = _mm256_add_epi32(*v, _mm256_madd_epi16(_mm256_maddubs_epi16(q, d), m));
        }
    }

    /// A block's three digit accumulators as one f32 vector: `2¹⁶·t2 + 2⁸·t1 + t0` per lane.
    #[inline(always)]
    unsafe fn combine(acc: &[__m256i; 3]) -> __m256 {
        _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(acc[2]),
            _mm256_set1_ps(65536.0),
            _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(acc[1]),
                _mm256_set1_ps(256.0),
                _mm256_cvtepi32_ps(acc[0]),
            ),
        )
    }

    /// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; weight
    /// `d·sc_g·q − dmin·mn_g` in group g of 32, q in 0..=15.
    ///
    /// The digit sums are exact: per 16-bit lane `vpmaddubsw(q, t)` ≤ 2·15·128 = 3,840; per
    /// 32-bit lane `vpmaddwd` by sc ≤ 63 gives ≤ 2·3,840·63 = 483,840, and the block's 8
    /// groups ≤ 3,870,720 (half that for t2), below 2²⁴: the conversions to f32 are exact too.
    /// Each lane's `2¹⁶·t2 + 2⁸·t1 + t0` is rounded twice (two FMAs), multiplied by `d·s` into
    /// the f32 lanes; the mins term `dmin·s·Σ_g mn_g·Σ_g x_q` comes from the group sums.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_q4k<const MR: usize>(x: *const u8, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [_mm256_setzero_ps(); MR];
        let nib = _mm256_set1_epi8(0x0F);
        for bi in 0..k / BLOCK {
            let b = w.add(bi * 144);
            prefetch(b, 144);
            let d = f16_at(b);
            let dmin = f16_at(b.add(2));
            let (sc, mn) = scales_mins_k4(b);
            // The scales as 16-bit elements 0..8 of both lanes.
            let scv = _mm256_cvtepu8_epi16(_mm_set1_epi64x(sc as i64));
            let mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64)));
            let mut dig = [[_mm256_setzero_si256(); 3]; MR];
            for c in 0..4 {
                let v = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
                let q0 = _mm256_and_si256(v, nib);
                let q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                let (m0, m1) = (spread(scv, 2 * c), spread(scv, 2 * c + 1));
                for (i, di) in dig.iter_mut().enumerate() {
                    let a = parts(x, k, i).0.add(super::digit_at(bi * 8 + 2 * c, 0));
                    group(di, a, q0, m0);
                    group(di, a.add(32), q1, m1);
                }
            }
            for (i, (a, di)) in acc.iter_mut().zip(&dig).enumerate() {
                let (_, sums, _, scales) = parts(x, k, i);
                let sx = f32_at(scales.add(4 * bi));
                *a = _mm256_fmadd_ps(combine(di), _mm256_set1_ps(d * sx), *a);
                let gs = _mm256_loadu_ps(sums.add(4 * 8 * bi) as *const f32);
                *a = _mm256_fnmadd_ps(_mm256_mul_ps(mnf, gs), _mm256_set1_ps(dmin * sx), *a);
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
    /// The codes enter unsigned, and the offset comes from the activations' sums over each 16:
    /// `Σ sc·(q − 32)·x = Σ sc·q·x − 32·Σ sc·Σ_16 x`. The digit sums are exact: per 16-bit lane
    /// `vpmaddubsw(q, t)` ≤ 2·63·128 = 16,128; per 32-bit lane `vpmaddwd` by |sc| ≤ 128 gives
    /// ≤ 4,128,768, and the block's 8 groups ≤ 33,030,144, below 2³¹. The conversions to f32
    /// round (relative 2⁻²⁴), then as for Q4_K.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_q6k<const MR: usize>(x: *const u8, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [_mm256_setzero_ps(); MR];
        let evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for bi in 0..k / BLOCK {
            let b = w.add(bi * 210);
            prefetch(b, 210);
            let d = f16_at(b.add(208));
            let scb = _mm_loadu_si128(b.add(192) as *const __m128i);
            // Even-numbered scales as 16-bit elements of the low lane, odd ones of the high:
            // group g (sub-blocks 2g, 2g + 1) spreads element g.
            let scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scb, evens_odds));
            // All 16 scales as f32, for the offset term.
            let sf0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb));
            let sf1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(scb, scb)));
            let mut dig = [[_mm256_setzero_si256(); 3]; MR];
            for h in 0..2 {
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
                    let q = _mm256_or_si256(low, _mm256_slli_epi16(top, 4));
                    let g = 4 * h + p;
                    let m = spread(scv, g);
                    for (i, di) in dig.iter_mut().enumerate() {
                        let a = parts(x, k, i).0.add(super::digit_at(bi * 8 + g, 0));
                        group(di, a, q, m);
                    }
                }
            }
            for (i, (a, di)) in acc.iter_mut().zip(&dig).enumerate() {
                let (_, _, sums, scales) = parts(x, k, i);
                let sx = f32_at(scales.add(4 * bi));
                *a = _mm256_fmadd_ps(combine(di), _mm256_set1_ps(d * sx), *a);
                let s16 = sums.add(4 * 16 * bi) as *const f32;
                let off = _mm256_fmadd_ps(
                    sf1,
                    _mm256_loadu_ps(s16.add(8)),
                    _mm256_mul_ps(sf0, _mm256_loadu_ps(s16)),
                );
                *a = _mm256_fnmadd_ps(off, _mm256_set1_ps(32.0 * d * sx), *a);
            }
        }
        let mut out = [0f32; MR];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum(a);
        }
        out
    }
}

/// A row kernel's signature (`rows_dots` here and in `qdot_vnni`).
#[cfg(test)]
pub(crate) type RowsDots = unsafe fn(
    DType,
    *const u8,
    usize,
    usize,
    (*const u8, usize),
    std::ops::Range<usize>,
    (*mut f32, usize),
);

/// The integer kernels' shared check: for each of `types` and a few widths, every row of
/// `kernel` against an f64 dot over the dequantized weights within the bound of the module's
/// comment for activations split as `how(dtype)` says (the f32 summation's share bounded
/// generously; activations with outliers, a zero block and a block of 1e-30 values), and the
/// same bits whatever the number of rows (1..=`max_rows`) in a call or the weight rows it
/// covers. Formats with blocks of 32 also run rows ending in a short block (1–3 group pairs).
#[cfg(test)]
pub(crate) fn check_row_kernel(
    types: &[DType],
    max_rows: usize,
    kernel: RowsDots,
    how: fn(DType) -> Split,
    seed: u64,
) {
    use crate::quant;
    use crate::rng::Rng;
    let mut rng = Rng::new(seed);
    for &dt in types {
        let widths: &[usize] = if dt.block_size() == 32 {
            &[64, 576, 640, 704, 2048]
        } else {
            &[256, 768, 2048]
        };
        let split_how = how(dt);
        // Elements per scale, and the splitting error's bound per unit of the largest
        // activation under one scale.
        let (per, step) = (
            if split_how.group_scales { 32 } else { BLOCK },
            2f64.powi(-split_how.q_bits),
        );
        for &k in widths {
            let n = 5;
            let wf: Vec<f32> = (0..n * k).map(|_| rng.normal() * 0.05).collect();
            let wq = quant::quantize(dt, &wf).unwrap();
            let rb = wq.len() / n;
            let mut wd = vec![0f32; n * k];
            quant::dequantize(dt, &wq, &mut wd).unwrap();
            // Activations with outliers (as real ones have), a block of zeros and one of
            // tiny values.
            let m = max_rows;
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
                split_row(
                    &x[i * k..(i + 1) * k],
                    &mut split[i * rl..(i + 1) * rl],
                    split_how,
                );
            }
            let mut full = vec![f32::NAN; m * n];
            unsafe {
                kernel(
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
                    for (xb, wb) in xr.chunks(per).zip(wr.chunks(per)) {
                        let mx = xb.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                        let sw: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                        bound += mx * sw * step;
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
                        kernel(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd;
    use crate::rng::Rng;

    /// Every row against an f64 dot over the dequantized weights, within the bound proven in
    /// the module's comment, and the same bits whatever the number of rows in the call.
    #[test]
    fn integer_rows_match_an_f64_dot_within_the_bound_and_do_not_depend_on_the_batch() {
        if !simd::has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        check_row_kernel(
            &[DType::Q4_K, DType::Q6_K],
            MAX_ROWS,
            rows_dots,
            |_| K_SPLIT,
            23,
        );
    }

    /// The vector split writes the scalar split's bytes, on random rows with outliers, a
    /// zero block, tiny and subnormal values, halfway cases and non-finite blocks.
    #[test]
    fn the_vector_split_writes_the_scalar_bytes() {
        if !simd::has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = Rng::new(41);
        for case in 0..48 {
            // Whole blocks of 256 and rows ending in a short block; both ranges of x_q.
            let k = if case % 2 == 0 {
                256 * (1 + case % 5)
            } else {
                64 * (1 + case % 13)
            };
            let how = Split {
                q_bits: if case % 3 == 0 { 21 } else { 22 },
                group_scales: case % 4 == 1,
            };
            let mut x: Vec<f32> = (0..k)
                .map(|j| {
                    let v = rng.normal() * 2f32.powi((case as i32 % 9) - 4);
                    if j % 61 == 0 {
                        v * 300.0
                    } else {
                        v
                    }
                })
                .collect();
            match case % 8 {
                1 => x[..64].fill(0.0),
                2 => x[3] = f32::NAN,
                3 => x[k - 1] = f32::NEG_INFINITY,
                4 => x.iter_mut().for_each(|v| *v *= 1e-41),
                5 => {
                    // Exact halves of the step: rounding ties.
                    x[0] = 1024.0;
                    for (j, v) in x[1..64].iter_mut().enumerate() {
                        *v = (j as f32 - 100.0) * 2f32.powi(-12) + 2f32.powi(-13);
                    }
                }
                _ => {}
            }
            let mut a = vec![0xAAu8; row_bytes(k)];
            let mut b = vec![0x55u8; row_bytes(k)];
            split_scalar(&x, &mut a, how);
            unsafe { x86::split_avx2(&x, &mut b, how) };
            assert!(a == b, "case {case} ({how:?}): the splits differ");
        }
    }

    /// For both ranges of the integers, scales per block and per group, and a row ending in a
    /// short block: each element within half a step, the digits within their ranges, the sums
    /// exact, a NaN block (group) NaN and its neighbours not.
    #[test]
    fn split_digits_rebuild_the_row_within_half_a_step() {
        let mut rng = Rng::new(5);
        let cases = [
            (512, 22, false),
            (576, 21, false),
            (576, 22, false),
            (576, 21, true),
        ];
        for (k, q_bits, group_scales) in cases {
            let how = Split {
                q_bits,
                group_scales,
            };
            let per = if group_scales { 32 } else { BLOCK };
            let mut x: Vec<f32> = (0..k).map(|_| rng.normal() * 3.0).collect();
            x[7] = -1000.0;
            x[300] = f32::MIN_POSITIVE / 8.0;
            x[k - 3] = 700.0;
            let mut out = vec![0u8; row_bytes(k)];
            split_row(&x, &mut out, how);
            let scales = 3 * k + 4 * (k / 32) + 4 * (k / 16);
            let scale = |out: &[u8], b: usize| {
                f32::from_le_bytes(out[scales + 4 * b..][..4].try_into().unwrap())
            };
            let mut sums = [vec![0i64; k / 32], vec![0i64; k / 16]];
            for b in 0..k.div_ceil(per) {
                let s = scale(&out, b);
                let xb = &x[b * per..((b + 1) * per).min(k)];
                let mx = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                assert!(
                    s as f64 <= mx as f64 * 2f64.powi(2 - q_bits) && s > 0.0,
                    "block {b}: s {s}"
                );
                for j in b * per..b * per + xb.len() {
                    let (g, l) = (j / 32, j % 32);
                    let t = |d: usize| out[digit_at(g, d) + l] as i8 as i64;
                    assert!(t(2).abs() <= 1 << (q_bits - 16));
                    let q = t(2) * 65536 + t(1) * 256 + t(0);
                    assert!(q.abs() <= 1 << q_bits);
                    let err = (q as f64 * s as f64 - x[j] as f64).abs();
                    assert!(err <= s as f64 / 2.0, "element {j}: {err} vs step {s}");
                    sums[0][j / 32] += q;
                    sums[1][j / 16] += q;
                }
            }
            // The sums over each 32 and each 16 (exact integers, rounded once to f32).
            let mut at = 3 * k;
            for part in &sums {
                for (g, want) in part.iter().enumerate() {
                    let got = f32::from_le_bytes(out[at + 4 * g..][..4].try_into().unwrap());
                    assert_eq!(got, *want as f32, "sum {g} of {}", k / part.len());
                }
                at += 4 * part.len();
            }
            // A block (group) with a NaN gives NaN dots; the next one keeps its scale.
            x[3] = f32::NAN;
            split_row(&x, &mut out, how);
            assert!(scale(&out, 0).is_nan());
            assert!(scale(&out, 1).is_finite());
        }
    }
}
