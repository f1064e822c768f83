//! Integer dot products for the K-quants (Q4_K, Q5_K, Q6_K), Q8_0, Q5_1 and IQ4_XS on AVX-512
//! CPUs with VNNI, within the f32 bound.
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
//! # Q8_0, Q5_1, IQ4_XS
//! These rows are whole groups of 32 (k a multiple of 64: a row of 576 ends in a short chunk
//! of two groups), each group with its own f16 factor, and their activations are split with a
//! scale per group (`s_g`, see [`split`]): `|ε_j| ≤ 2^-b · M_g` for the group's largest
//! `|x|`, `b` = 21 or 22. Signed 8-bit weights (Q8_0's codes, IQ4's levels) enter
//! `vpdpbusd` as unsigned bytes `q + 128` and the offset `128 · d · s_g · Σ_g x_q` is
//! subtracted per group, as Q4_K's mins are; the lane bound `4 · 255 · 2²¹ < 2³¹` is why
//! their split keeps 21 bits. The factor `d · s_g` (and `d · (ls − 32) · s_g`) is exact (a
//! power-of-two scaling of an exact product) short of the subnormal range. So
//! `|result − Σ w_j x_j| ≤ Σ_groups 2^-b · M_g · Σ_g |w_j|` plus the f32 roundings (the
//! conversion of a lane is a relative 2⁻²⁴ of `Σ₄ |q + 128| · |x_q|`, at most twice the
//! largest weight magnitude's share).
//!
//! # Same bits in every batch
//! A row's sums run in the same order whatever the number of activation rows in a call (the
//! rows share the decoded weights, never an accumulator), and every batch size on a CPU that
//! takes this path runs it: decode, batched decode and prefill give a row the same bits.

use super::qdot_int::Split;
use crate::tensor::DType;

/// Activation rows one call covers at most.
pub(crate) const MAX_ROWS: usize = 4;

/// Whether [`rows_dots`] handles `dtype` on this CPU (AVX-512 picked, and VNNI present).
pub(crate) fn supported(isa: super::simd::Isa, dtype: DType) -> bool {
    isa == super::simd::Isa::Avx512 && split(dtype).is_some() && has_vnni()
}

/// The activation split (`qdot_int::split_row`) that `dtype`'s kernel takes, if it has one.
/// The K-quants: 22-bit integers, a scale per block of 256. Q8_0, Q5_1 and IQ4_XS: a scale per
/// group of 32 (an outlier then coarsens only its own group's steps; the kernel folds the
/// scale into the group's factor: SmolLM2's logits 3–4× closer to the f64 forward than with a
/// scale per 256), and 21-bit integers where the codes enter as bytes up to 255 (8-bit
/// weights offset by 128), whose four-product lane sums would wrap at 22.
///
/// Q4_0, Q4_1, Q5_0 and IQ4_NL keep the f32 kernels (`qdot`): on 576-wide rows their integer
/// kernels measured no faster (IQ4_NL 33.7 against 31.6 ns a row from memory, one core; 30.6
/// against 31.8 even with four blocks' nibbles gathered by one VBMI byte permute into two
/// registers of codes), and prefill pays for them (SmolLM2 Q4_1 pp64 −30 %; the IQ4_XS file,
/// whose 576-wide matrices are IQ4_NL, decode +1–4 % against pp −25 %). Q8_0's decode gains a
/// third at 1 B (its weights then stream at the memory's rate), Q5_1 had no fused kernel.
pub(crate) fn split(dtype: DType) -> Option<Split> {
    let group = |q_bits| {
        Some(Split {
            q_bits,
            group_scales: true,
        })
    };
    match dtype {
        DType::Q8_0 | DType::IQ4_XS => group(21),
        DType::Q5_1 => group(22),
        DType::Q4_K | DType::Q5_K | DType::Q6_K => Some(super::qdot_int::K_SPLIT),
        _ => None,
    }
}

/// Whether rows of `k` elements go through the kernel: whole blocks of the format, and pairs of
/// groups of 32 (a register's worth of codes).
pub(crate) fn fits(dtype: DType, k: usize) -> bool {
    k.is_multiple_of(dtype.block_size().max(64))
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
/// [`has_vnni`] holds and [`split`] has `dtype`; [`fits`] holds for `k`; `x` holds `mr` split
/// rows for this `k`, made as `split(dtype)` says; each weight row in `rows` is readable; `y` is
/// writable at rows `0..mr` (stride `ldy`) and the columns in `rows`.
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
            DType::Q8_0 => go!(x86::B32<x86::Q8_0>),
            DType::Q5_1 => go!(x86::B32<x86::Q5_1>),
            DType::IQ4_XS => go!(x86::IQ4XS),
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
    use super::super::qdot_int::x86::{f16_at, f32_at, parts, prefetch, scales_mins_k4, u32_at};
    use super::super::qdot_int::{digit_at, BLOCK};
    use std::arch::x86_64::*;

    /// A format's weight side: what the weights of one chunk of 256 elements of one weight
    /// row (a K-quant block, or eight blocks of 32) give the kernel.
    pub trait Format {
        /// Bytes of a chunk of 256 elements.
        const BYTES: usize;
        /// A chunk's group factors (`d·sc`, or `d`) as f32 (the lanes [`Format::pair`] permutes
        /// from), and its offset factors, each lane multiplying the activations' sum over the
        /// same lane's group in [`Format::sums`] (lanes it does not use are zero). `ng` is the
        /// chunk's number of groups of 32: 8, or fewer in a row's short last chunk (formats
        /// with blocks of 32 only).
        unsafe fn head(b: *const u8, ng: usize) -> (__m512, __m512);
        /// Whether the activations have a scale per group of 32 (folded into the factors and
        /// offsets per row) rather than per chunk.
        const GROUP_SCALES: bool = false;
        /// The 64 codes of group pair `c` (0..4, elements `64c..64c + 64`) as bytes.
        unsafe fn codes(b: *const u8, c: usize) -> __m512i;
        /// The factors of group pair `c`'s 16 lanes of four, from [`Format::head`]'s.
        /// (By default a group pair's: group `2c`'s factor in lanes 0..8, `2c + 1`'s in 8..16.)
        #[inline(always)]
        unsafe fn factors(c: usize, scales: __m512) -> __m512 {
            pair_factors(c, scales)
        }
        /// Activation row `i`'s group sums that [`Format::head`]'s offsets multiply, for chunk
        /// `bi` of `ng` groups.
        /// (By default the sums over each group of 32.)
        #[inline(always)]
        unsafe fn sums(x: *const u8, k: usize, i: usize, bi: usize, ng: usize) -> __m512 {
            sums32(x, k, i, bi, ng)
        }
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
        // A short last chunk (blocks of 32 only: k a multiple of 64) reads its factors first,
        // so their latency (a gather) hides behind the whole chunks (a row of 576 measured
        // 33.5 against 30.6 ns from memory the other way round, IQ4_NL on one core); its sums
        // still come last.
        let (tail, ng) = (k / BLOCK, (k % BLOCK) / 32);
        let tail_heads = (ng > 0).then(|| heads::<F, NR>(&w, tail, ng));
        for bi in 0..k / BLOCK {
            chunk::<F, MR, NR>(x, k, &w, bi, 8, heads::<F, NR>(&w, bi, 8), &mut acc);
        }
        if let Some(h) = tail_heads {
            chunk::<F, MR, NR>(x, k, &w, tail, ng, h, &mut acc);
        }
        let mut out = [[0f32; NR]; MR];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, a) in o.iter_mut().zip(a) {
                *o = hsum(*a);
            }
        }
        out
    }

    /// The weight rows' [`Format::head`]s for chunk `bi` of `ng` groups (its weights
    /// prefetched ahead).
    #[inline(always)]
    unsafe fn heads<F: Format, const NR: usize>(
        w: &[*const u8; NR],
        bi: usize,
        ng: usize,
    ) -> [(__m512, __m512); NR] {
        // (Loops, not `array::from_fn`: its closures were not inlined into the kernel.)
        let mut heads = [(_mm512_setzero_ps(), _mm512_setzero_ps()); NR];
        for (h, wj) in heads.iter_mut().zip(w) {
            let b = wj.add(bi * F::BYTES);
            prefetch(b, F::BYTES);
            *h = F::head(b, ng);
        }
        heads
    }

    /// Chunk `bi` (`ng` groups of 32, even) of every row into `acc`, with the weight rows'
    /// `heads`.
    #[inline(always)]
    unsafe fn chunk<F: Format, const MR: usize, const NR: usize>(
        x: *const u8,
        k: usize,
        w: &[*const u8; NR],
        bi: usize,
        ng: usize,
        heads: [(__m512, __m512); NR],
        acc: &mut [[__m512; NR]; MR],
    ) {
        // With a scale per group, each row's factors and offsets: the weights' times the
        // row's scales (exact: an f16 or 17-bit factor times a power of two).
        let mut rowf = [[(_mm512_setzero_ps(), _mm512_setzero_ps()); NR]; MR];
        if F::GROUP_SCALES {
            let lanes = ((1u32 << ng) - 1) as u16;
            for (i, rf) in rowf.iter_mut().enumerate() {
                let sv =
                    _mm512_maskz_loadu_ps(lanes, parts(x, k, i).3.add(4 * 8 * bi) as *const f32);
                for (f, h) in rf.iter_mut().zip(&heads) {
                    *f = (_mm512_mul_ps(h.0, sv), _mm512_mul_ps(h.1, sv));
                }
            }
        }
        let mut blk = [[_mm512_setzero_ps(); NR]; MR];
        for c in 0..ng / 2 {
            let mut codes = [(_mm512_setzero_si512(), _mm512_setzero_ps()); NR];
            for ((q, wj), h) in codes.iter_mut().zip(w).zip(&heads) {
                q.0 = F::codes(wj.add(bi * F::BYTES), c);
                if !F::GROUP_SCALES {
                    q.1 = F::factors(c, h.0);
                }
            }
            for (i, bl) in blk.iter_mut().enumerate() {
                let a = parts(x, k, i).0.add(digit_at(bi * 8 + 2 * c, 0));
                let t = [
                    _mm512_loadu_si512(a as *const __m512i),
                    _mm512_loadu_si512(a.add(64) as *const __m512i),
                    _mm512_loadu_si512(a.add(128) as *const __m512i),
                ];
                for ((b, (q, m)), f) in bl.iter_mut().zip(&codes).zip(&rowf[i]) {
                    let m = if F::GROUP_SCALES {
                        F::factors(c, f.0)
                    } else {
                        *m
                    };
                    *b = _mm512_fmadd_ps(_mm512_cvtepi32_ps(horner(*q, &t)), m, *b);
                }
            }
        }
        for (i, (a, bl)) in acc.iter_mut().zip(&blk).enumerate() {
            let sums = F::sums(x, k, i, bi, ng);
            if F::GROUP_SCALES {
                for ((a, b), f) in a.iter_mut().zip(bl).zip(&rowf[i]) {
                    *a = _mm512_add_ps(*a, _mm512_fnmadd_ps(f.1, sums, *b));
                }
            } else {
                let sx = _mm512_set1_ps(f32_at(parts(x, k, i).3.add(4 * bi)));
                for ((a, b), h) in a.iter_mut().zip(bl).zip(&heads) {
                    *a = _mm512_fmadd_ps(_mm512_fnmadd_ps(h.1, sums, *b), sx, *a);
                }
            }
        }
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

    /// The sums over each of the chunk's `ng` groups of 32, in lanes 0..ng.
    #[inline(always)]
    unsafe fn sums32(x: *const u8, k: usize, i: usize, bi: usize, ng: usize) -> __m512 {
        let lanes = ((1u32 << ng) - 1) as u16;
        _mm512_maskz_loadu_ps(lanes, parts(x, k, i).1.add(4 * 8 * bi) as *const f32)
    }

    impl Format for Q4K {
        const BYTES: usize = 144;

        #[inline(always)]
        unsafe fn head(b: *const u8, _ng: usize) -> (__m512, __m512) {
            scales_mins(b)
        }

        #[inline(always)]
        unsafe fn codes(b: *const u8, c: usize) -> __m512i {
            nibble_pair(b, 16 + 32 * c)
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
        unsafe fn head(b: *const u8, _ng: usize) -> (__m512, __m512) {
            scales_mins(b)
        }

        #[inline(always)]
        unsafe fn codes(b: *const u8, c: usize) -> __m512i {
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i));
            let (s0, s1) = (2 * c as i64, 2 * c as i64 + 1);
            let top = _mm512_and_si512(
                _mm512_srlv_epi64(qh, _mm512_setr_epi64(s0, s0, s0, s0, s1, s1, s1, s1)),
                _mm512_set1_epi8(1),
            );
            _mm512_or_si512(nibble_pair(b, 48 + 32 * c), _mm512_slli_epi16::<4>(top))
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
        unsafe fn head(b: *const u8, _ng: usize) -> (__m512, __m512) {
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
        unsafe fn codes(b: *const u8, c: usize) -> __m512i {
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
            _mm512_or_si512(low, _mm512_slli_epi16::<4>(top))
        }

        /// Scales 4c..4c + 4, four lanes (16 weights) each.
        #[inline(always)]
        unsafe fn factors(c: usize, scales: __m512) -> __m512 {
            let s = 4 * c as i32;
            let (s1, s2, s3) = (s + 1, s + 2, s + 3);
            let lanes =
                _mm512_setr_epi32(s, s, s, s, s1, s1, s1, s1, s2, s2, s2, s2, s3, s3, s3, s3);
            _mm512_permutexvar_ps(lanes, scales)
        }

        /// The sums over each 16.
        #[inline(always)]
        unsafe fn sums(x: *const u8, k: usize, i: usize, bi: usize, _ng: usize) -> __m512 {
            _mm512_loadu_ps(parts(x, k, i).2.add(4 * 16 * bi) as *const f32)
        }
    }

    /// The formats with blocks of 32 weights (an f16 `d` first): a chunk of 256 elements is
    /// eight blocks, whose factors come from one gather, and a group pair is two blocks.
    pub trait Block32 {
        /// Bytes of a block.
        const BB: usize;
        /// The 64 codes of the blocks at `b0` and `b1` as bytes, in element order.
        unsafe fn codes(b0: *const u8, b1: *const u8) -> __m512i;
        /// The offset factors from the blocks' `d` and the f16 after it (`m`, where there is
        /// one): the weight is `d · q − offset`.
        unsafe fn offsets(d: __m256, m: __m256) -> __m256;
    }

    /// A [`Block32`] format as a [`Format`].
    pub struct B32<T>(T);

    impl<T: Block32> Format for B32<T> {
        const BYTES: usize = 8 * T::BB;
        const GROUP_SCALES: bool = true;

        /// `d` and the f16 after it of each of the chunk's `ng` blocks: a whole chunk's eight
        /// words through a small array (scalar loads measured faster than a gather), a short
        /// chunk's in one masked gather (the words of blocks past `ng` are not read).
        #[inline(always)]
        unsafe fn head(b: *const u8, ng: usize) -> (__m512, __m512) {
            let v = if ng == 8 {
                let mut words = [0u32; 8];
                for (g, w) in words.iter_mut().enumerate() {
                    *w = u32_at(b.add(g * T::BB));
                }
                _mm256_loadu_si256(words.as_ptr() as *const __m256i)
            } else {
                let at = _mm256_mullo_epi32(
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                    _mm256_set1_epi32(T::BB as i32),
                );
                let lanes = ((1u32 << ng) - 1) as u8;
                _mm256_mmask_i32gather_epi32::<1>(
                    _mm256_setzero_si256(),
                    lanes,
                    at,
                    b as *const i32,
                )
            };
            let d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v));
            let m = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(v)));
            (
                _mm512_zextps256_ps512(d),
                _mm512_zextps256_ps512(T::offsets(d, m)),
            )
        }

        #[inline(always)]
        unsafe fn codes(b: *const u8, c: usize) -> __m512i {
            let b0 = b.add(2 * c * T::BB);
            T::codes(b0, b0.add(T::BB))
        }
    }

    /// Two groups' 16 bytes of nibbles (at `a` and `b`; element `j < 16` of a group in the low
    /// nibble of byte j, element `j + 16` in its high nibble) as their 64 codes: the two loads
    /// side by side, each 128-bit half doubled, and the copies shifted by 0 and 4.
    #[inline(always)]
    unsafe fn nibbles2(a: *const u8, b: *const u8) -> __m512i {
        let ab = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i)),
            _mm_loadu_si128(b as *const __m128i),
        );
        halves_to_codes(_mm512_castsi256_si512(ab))
    }

    /// 32 bytes of nibbles (two groups' 16, in the low 256 bits) as their 64 codes.
    #[inline(always)]
    unsafe fn halves_to_codes(v: __m512i) -> __m512i {
        let v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), v);
        _mm512_and_si512(
            _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
            _mm512_set1_epi8(0x0F),
        )
    }

    /// The fifth bits of two Q5 blocks (bit j of each one's 32-bit `qh` is element j's) put on
    /// their 64 codes.
    #[inline(always)]
    unsafe fn fifth_bits(q: __m512i, qh0: *const u8, qh1: *const u8) -> __m512i {
        let bits = u32_at(qh0) as u64 | (u32_at(qh1) as u64) << 32;
        _mm512_or_si512(q, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(16)))
    }

    /// IQ4_NL's 16 levels plus 128 (1..=241), in each 128-bit lane.
    #[inline(always)]
    unsafe fn iq4_levels() -> __m512i {
        let l = crate::quant::iquants::KVALUES_IQ4NL_U8;
        _mm512_broadcast_i32x4(_mm_loadu_si128(l.as_ptr() as *const __m128i))
    }

    /// Q8_0: f16 d, 32 signed bytes q; weight `d·q`. The codes enter as `q + 128` (0..=255, an
    /// exclusive or of the sign bit), the offset `128·d` from the activations' group sums.
    /// Per lane `|Σ₄ (q + 128)·x_q| ≤ 4 · 255 · 2²¹ < 2³¹` with the 21-bit split (and every
    /// partial Horner sum `Σ₄ (q + 128)·(x_q − t0)` ≤ 4 · 255 · (2²¹ + 128), too): no wrap.
    pub struct Q8_0;

    impl Block32 for Q8_0 {
        const BB: usize = 34;

        #[inline(always)]
        unsafe fn codes(b0: *const u8, b1: *const u8) -> __m512i {
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(b0.add(2) as *const __m256i));
            let v = _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(b1.add(2) as *const __m256i));
            _mm512_xor_si512(v, _mm512_set1_epi8(-128))
        }

        #[inline(always)]
        unsafe fn offsets(d: __m256, _m: __m256) -> __m256 {
            _mm256_mul_ps(d, _mm256_set1_ps(128.0))
        }
    }

    /// Q5_1: f16 d, f16 m, 32 fifth bits, 16 bytes of nibbles; weight `d·q + m` (offset `−m`),
    /// q up to 31: lanes below 2²⁸ with the 22-bit split.
    pub struct Q5_1;

    impl Block32 for Q5_1 {
        const BB: usize = 24;

        #[inline(always)]
        unsafe fn codes(b0: *const u8, b1: *const u8) -> __m512i {
            fifth_bits(nibbles2(b0.add(8), b1.add(8)), b0.add(4), b1.add(4))
        }

        #[inline(always)]
        unsafe fn offsets(_d: __m256, m: __m256) -> __m256 {
            _mm256_sub_ps(_mm256_setzero_ps(), m)
        }
    }

    /// IQ4_XS: f16 d, the 8 groups' 6-bit scales `ls` (high 2 bits in a u16, low 4 in four
    /// bytes), IQ4_NL's nibbles (16 bytes a group, groups in order); weight
    /// `d·(ls − 32)·level`, the 16 levels in -127..=113. The codes enter as `level + 128`
    /// (1..=241, one `vpshufb`), the factor is `d·(ls − 32)` (exact: 11 × 6 bits), the offset
    /// 128 times it; lanes as Q8_0's (21-bit split).
    pub struct IQ4XS;

    impl Format for IQ4XS {
        const BYTES: usize = 136;
        const GROUP_SCALES: bool = true;

        #[inline(always)]
        unsafe fn head(b: *const u8, _ng: usize) -> (__m512, __m512) {
            let hi = _mm256_and_si256(
                _mm256_srlv_epi32(
                    _mm256_set1_epi32(u16::from_le_bytes([*b.add(2), *b.add(3)]) as i32),
                    _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                ),
                _mm256_set1_epi32(3),
            );
            let lo = _mm256_and_si256(
                _mm256_srlv_epi32(
                    _mm256_set1_epi32(u32_at(b.add(4)) as i32),
                    _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                ),
                _mm256_set1_epi32(0x0F),
            );
            let ls = _mm256_sub_epi32(
                _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)),
                _mm256_set1_epi32(32),
            );
            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(ls), _mm256_set1_ps(f16_at(b)));
            (
                _mm512_zextps256_ps512(f),
                _mm512_zextps256_ps512(_mm256_mul_ps(f, _mm256_set1_ps(128.0))),
            )
        }

        #[inline(always)]
        unsafe fn codes(b: *const u8, c: usize) -> __m512i {
            let v = _mm256_loadu_si256(b.add(8 + 32 * c) as *const __m256i);
            _mm512_shuffle_epi8(iq4_levels(), halves_to_codes(_mm512_castsi256_si512(v)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qdot_int::{check_row_kernel, row_bytes, split_row};
    use crate::quant;

    /// The formats these kernels take.
    const TYPES: [DType; 6] = [
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::Q5_1,
        DType::IQ4_XS,
    ];

    /// Every row against an f64 dot over the dequantized weights, within the bound proven in
    /// the module's comment, and the same bits whatever the number of rows in the call or the
    /// weight rows it covers.
    #[test]
    fn vnni_rows_match_an_f64_dot_within_the_bound_and_do_not_depend_on_the_batch() {
        if !has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let how = |dt| split(dt).unwrap_or(crate::cpu::qdot_int::K_SPLIT);
        check_row_kernel(&TYPES, MAX_ROWS, rows_dots, how, 29);
    }

    /// Codes at their extremes (all 15, 31 or 63 with the largest scales; Q8_0's ±127) against
    /// digits at theirs (activations just below a power of two: integers at the top of the
    /// split's range): the Horner sums must not wrap.
    #[test]
    fn extreme_codes_and_digits_do_not_wrap() {
        if !has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let k = 512;
        for &dt in &TYPES {
            let how = split(dt).unwrap_or(crate::cpu::qdot_int::K_SPLIT);
            for wsign in [1f32, -1.0] {
                // Large equal weights quantize to the top code with the top scale.
                let wf: Vec<f32> = (0..k)
                    .map(|j| wsign * if j % 3 == 0 { 1.0 } else { 0.999 })
                    .collect();
                let wq = quant::quantize(dt, &wf).unwrap();
                let mut wd = vec![0f32; k];
                quant::dequantize(dt, &wq, &mut wd).unwrap();
                for sign in [1f32, -1.0] {
                    let x: Vec<f32> = (0..k)
                        .map(|j| sign * f32::from_bits(0x3FFF_FFFF - (j % 7) as u32))
                        .collect();
                    let mut split = vec![0u8; row_bytes(k)];
                    split_row(&x, &mut split, how);
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
                        "{dt:?} signs {wsign} {sign}: {} vs {want}",
                        y[0]
                    );
                }
            }
        }
    }
}
