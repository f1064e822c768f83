//! The f32 kernel for weights kept 16 rows interleaved (`qdot_x16`'s layout): IQ4_NL, IQ4_XS,
//! Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K where `qdot_x16i` does not take them (no VNNI, for
//! Q5_0 and Q5_1 no VBMI, or rows not a multiple of 64; Q8_0 is packed for this kernel only
//! without VNNI, `qdot_x16::q8_lanes`).
//!
//! A group of 16 rows is, per 16 weights (one column of the 16 rows), a shift, a permute of
//! the format's 16 levels and one multiply-add with the column's activation broadcast (the
//! 5-bit formats, whose fifth bits are a 32-bit head field a row, add a shift of those and a
//! bit select, and permute 32 levels in two registers; Q8_0 widens 16 code bytes and converts
//! them): the sum `s_r = Σ_c level(q_rc) · x_c` over the group's 32 columns, then `y_r += a_r
//! · s_r` with the row's scale for the group (`d`, or IQ4_XS's `d · (scale - 32)`, Q4_K's `d
//! · scale`), and where the format has minimums `y_r += m_r · Σ_c x_c` (Q4_1's `m`, Q4_K's
//! `-dmin · min`). 1.04 against 1.72 ns a group of 32 on one core (IQ4_NL, rows in L2).
//! Prefill runs the same kernel with up to six activation rows (each level decoded once for
//! all of them), so a row's bits never depend on the batch it came in.
//!
//! Exactness: the levels are small integers (exact in f32), the group scales products of an
//! f16 and a 6-bit integer (exact), each product and sum one f32 rounding, a group's sum
//! scaled once: a row's error is within `2⁻²⁴ · (48 + k/32) · Σ |w·x|` (and the minimums'
//! `|m|·Σ|x|`), which the tests hold every row to against an f64 dot.

use super::qdot_x16::MAX_ROWS;
use crate::tensor::DType;

/// `y[i·ldy + r] = Σₖ x[i·ldx + k] · W_r[k]` for `i < mr` (1..=6) and the weight rows of the
/// groups `groups` (rows `16g..16g + 16`), W interleaved (`qdot_x16::pack`). `xs` holds each activation
/// row's `qdot_x16::block_sums` at stride `k / 32` (read where `qdot_x16::needs_sums`).
///
/// # Safety
/// `qdot_x16::packs` held for the weights (AVX-512, the format, k a multiple of its block); `w` holds
/// the groups, `x` `mr` rows of `k` f32 at `ldx`, `xs` `mr` rows of `k / 32` where the format
/// needs them, and `y` `mr` rows at `ldy` writable at the groups' columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dots(
    dtype: DType,
    (x, ldx, xs): (*const f32, usize, *const f32),
    mr: usize,
    k: usize,
    w: *const u8,
    groups: std::ops::Range<usize>,
    (y, ldy): (*mut f32, usize),
) {
    debug_assert!((1..=MAX_ROWS).contains(&mr));
    #[cfg(target_arch = "x86_64")]
    {
        use x86::*;
        let a = Args {
            x,
            ldx,
            xs,
            k,
            w,
            y,
            ldy,
        };
        macro_rules! go {
            ($f:ty) => {
                match mr {
                    1 => run::<$f, 1>(&a, groups),
                    2 => run::<$f, 2>(&a, groups),
                    3 => run::<$f, 3>(&a, groups),
                    4 => run::<$f, 4>(&a, groups),
                    5 => run::<$f, 5>(&a, groups),
                    _ => run::<$f, 6>(&a, groups),
                }
            };
        }
        match dtype {
            DType::IQ4_NL => go!(Iq4Nl),
            DType::Q4_0 => go!(Q40),
            DType::Q4_1 => go!(Q41),
            DType::Q5_0 => go!(Q50),
            DType::Q5_1 => go!(Q51),
            DType::IQ4_XS => go!(Iq4Xs),
            DType::Q4_K => go!(Q4K),
            DType::Q8_0 => match mr {
                1 => run_q8::<1>(&a, groups),
                2 => run_q8::<2>(&a, groups),
                3 => run_q8::<3>(&a, groups),
                4 => run_q8::<4>(&a, groups),
                5 => run_q8::<5>(&a, groups),
                _ => run_q8::<6>(&a, groups),
            },
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, x, ldx, xs, mr, k, w, groups, y, ldy);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    // The levels tables the file-layout kernels use too.
    use super::super::qdot::{iota, iq4_levels};
    use std::arch::x86_64::*;

    /// A call's pointers and strides.
    pub(super) struct Args {
        pub x: *const f32,
        pub ldx: usize,
        pub xs: *const f32,
        pub k: usize,
        pub w: *const u8,
        pub y: *mut f32,
        pub ldy: usize,
    }

    /// A format as the kernel sees it: its 16 levels, its blocks' heads, and how a group's
    /// sums are scaled into the rows' totals.
    pub(super) trait Format {
        /// Bytes of the 16 rows' heads at the start of a packed block.
        const HEAD: usize;
        /// 32-element groups per block: 1 or 8.
        const GROUPS: usize;
        /// What a block's head gives its groups (in registers).
        type Head: Copy;
        /// Codes of 5 bits (the fifth from [`Format::fifth`]), 32 levels in two registers.
        const FIVE: bool = false;
        /// The levels of codes 0..16 (and 16..32 for 5-bit codes).
        unsafe fn levels() -> (__m512, __m512);
        unsafe fn head(h: *const u8) -> Self::Head;
        /// The 16 rows' fifth bits (bit c: element c of the block), for 5-bit codes.
        unsafe fn fifth(_: &Self::Head) -> __m512i {
            _mm512_setzero_si512()
        }
        /// `tot[i] += a · s[i]` with group `g`'s scales (and `+= m · Σx` with its minimums;
        /// `xs` points to the group's activation sum in row 0, rows at stride `ldxs`).
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            h: &Self::Head,
            g: usize,
            xs: *const f32,
            ldxs: usize,
        );
    }

    #[inline(always)]
    unsafe fn f16x16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    #[inline(always)]
    unsafe fn scale_by<const MR: usize>(tot: &mut [__m512; MR], s: &[__m512; MR], a: __m512) {
        for (t, s) in tot.iter_mut().zip(s) {
            *t = _mm512_fmadd_ps(*s, a, *t);
        }
    }

    /// `tot[i] += m · Σx` (row i's sum at `xs + i·ldxs`).
    #[inline(always)]
    unsafe fn add_mins<const MR: usize>(
        tot: &mut [__m512; MR],
        m: __m512,
        xs: *const f32,
        ldxs: usize,
    ) {
        for (i, t) in tot.iter_mut().enumerate() {
            *t = _mm512_fmadd_ps(m, _mm512_set1_ps(*xs.add(i * ldxs)), *t);
        }
    }

    /// 0, 1, …, 15 less `off`.
    #[inline(always)]
    unsafe fn iota_less(off: f32) -> __m512 {
        _mm512_sub_ps(iota(), _mm512_set1_ps(off))
    }

    /// A 32-element format with one scale `d` a block (IQ4_NL and Q4_0: their levels).
    macro_rules! scaled32 {
        ($name:ident, $levels:expr) => {
            pub struct $name;
            impl Format for $name {
                const HEAD: usize = 32;
                const GROUPS: usize = 1;
                type Head = __m512;
                #[inline(always)]
                unsafe fn levels() -> (__m512, __m512) {
                    ($levels, $levels)
                }
                #[inline(always)]
                unsafe fn head(h: *const u8) -> __m512 {
                    f16x16(h)
                }
                #[inline(always)]
                unsafe fn scale<const MR: usize>(
                    tot: &mut [__m512; MR],
                    s: &[__m512; MR],
                    d: &__m512,
                    _: usize,
                    _: *const f32,
                    _: usize,
                ) {
                    scale_by(tot, s, *d)
                }
            }
        };
    }
    scaled32!(Iq4Nl, iq4_levels());
    scaled32!(Q40, iota_less(8.0));

    /// Q4_1: `d · q + m`.
    pub struct Q41;
    impl Format for Q41 {
        const HEAD: usize = 64;
        const GROUPS: usize = 1;
        type Head = (__m512, __m512);
        #[inline(always)]
        unsafe fn levels() -> (__m512, __m512) {
            (iota_less(0.0), iota_less(0.0))
        }
        #[inline(always)]
        unsafe fn head(h: *const u8) -> (__m512, __m512) {
            (f16x16(h), f16x16(h.add(32)))
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            (d, m): &(__m512, __m512),
            _: usize,
            xs: *const f32,
            ldxs: usize,
        ) {
            scale_by(tot, s, *d);
            add_mins(tot, *m, xs, ldxs);
        }
    }

    /// Q5_0: `d · (q - 16)`, q of 5 bits.
    pub struct Q50;
    impl Format for Q50 {
        const HEAD: usize = 96;
        const GROUPS: usize = 1;
        const FIVE: bool = true;
        /// d, the fifth bits.
        type Head = (__m512, __m512i);
        #[inline(always)]
        unsafe fn levels() -> (__m512, __m512) {
            (iota_less(16.0), iota_less(0.0))
        }
        #[inline(always)]
        unsafe fn head(h: *const u8) -> Self::Head {
            (f16x16(h), _mm512_loadu_si512(h.add(32) as *const _))
        }
        #[inline(always)]
        unsafe fn fifth(h: &Self::Head) -> __m512i {
            h.1
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            (d, _): &Self::Head,
            _: usize,
            _: *const f32,
            _: usize,
        ) {
            scale_by(tot, s, *d)
        }
    }

    /// Q5_1: `d · q + m`, q of 5 bits.
    pub struct Q51;
    impl Format for Q51 {
        const HEAD: usize = 128;
        const GROUPS: usize = 1;
        const FIVE: bool = true;
        /// d, m, the fifth bits.
        type Head = (__m512, __m512, __m512i);
        #[inline(always)]
        unsafe fn levels() -> (__m512, __m512) {
            (iota_less(0.0), iota_less(-16.0))
        }
        #[inline(always)]
        unsafe fn head(h: *const u8) -> Self::Head {
            (
                f16x16(h),
                f16x16(h.add(32)),
                _mm512_loadu_si512(h.add(64) as *const _),
            )
        }
        #[inline(always)]
        unsafe fn fifth(h: &Self::Head) -> __m512i {
            h.2
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            (d, m, _): &Self::Head,
            _: usize,
            xs: *const f32,
            ldxs: usize,
        ) {
            scale_by(tot, s, *d);
            add_mins(tot, *m, xs, ldxs);
        }
    }

    /// `(v >> n) & mask` in each lane.
    #[inline(always)]
    unsafe fn bits(v: __m512i, n: u32, mask: i32) -> __m512i {
        _mm512_and_si512(
            _mm512_srl_epi32(v, _mm_cvtsi32_si128(n as i32)),
            _mm512_set1_epi32(mask),
        )
    }

    /// IQ4_XS's packed head: the 16 rows' d, the scales' high bits (widened to 32-bit lanes),
    /// their low nibbles.
    pub(crate) type Iq4xsHead = (__m512, __m512i, __m512i);

    /// The head of a packed IQ4_XS block at `h`.
    #[inline(always)]
    pub(crate) unsafe fn iq4xs_head(h: *const u8) -> Iq4xsHead {
        let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(h.add(32) as *const __m256i));
        (f16x16(h), hi, _mm512_loadu_si512(h.add(64) as *const _))
    }

    /// Group g's factor `d · (s_g − 32)` for the 16 rows (exact: an f16 times a 6-bit integer
    /// less 32), `s_g` the low 4 bits in nibble g of the 4-byte field, the high 2 in bits 2g of
    /// the u16 field.
    #[inline(always)]
    pub(crate) unsafe fn iq4xs_factor((d, hi, lo): &Iq4xsHead, g: usize) -> __m512 {
        let g = g as u32;
        let q = _mm512_or_si512(
            bits(*lo, 4 * g, 15),
            _mm512_slli_epi32::<4>(bits(*hi, 2 * g, 3)),
        );
        _mm512_mul_ps(
            *d,
            _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32))),
        )
    }

    /// IQ4_XS: 256-element blocks, group g's scale `d · (s_g - 32)` ([`iq4xs_factor`]).
    pub struct Iq4Xs;
    impl Format for Iq4Xs {
        const HEAD: usize = 128;
        const GROUPS: usize = 8;
        type Head = Iq4xsHead;
        #[inline(always)]
        unsafe fn levels() -> (__m512, __m512) {
            (iq4_levels(), iq4_levels())
        }
        #[inline(always)]
        unsafe fn head(h: *const u8) -> Self::Head {
            iq4xs_head(h)
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            head: &Self::Head,
            g: usize,
            _: *const f32,
            _: usize,
        ) {
            scale_by(tot, s, iq4xs_factor(head, g));
        }
    }

    /// Q4_K: 256-element blocks, `d · s_g · q - dmin · m_g` with 6-bit scales and mins in its
    /// 12 bytes (three 4-byte fields V0, V1, V2): groups j < 4 take the low 6 bits of byte j
    /// of V0 (scale) and V1 (min); groups 4 + i the low / high nibble of byte i of V2 below the
    /// top 2 bits of byte i of V0 / V1.
    pub struct Q4K;
    impl Format for Q4K {
        const HEAD: usize = 256;
        const GROUPS: usize = 8;
        /// d, -dmin, V0, V1, V2.
        type Head = Q4kHead;
        #[inline(always)]
        unsafe fn levels() -> (__m512, __m512) {
            (iota_less(0.0), iota_less(0.0))
        }
        #[inline(always)]
        unsafe fn head(h: *const u8) -> Self::Head {
            q4k_head(h)
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            head: &Self::Head,
            g: usize,
            xs: *const f32,
            ldxs: usize,
        ) {
            let (a, m) = q4k_factors(head, g);
            scale_by(tot, s, a);
            add_mins(tot, m, xs, ldxs);
        }
    }

    /// A packed Q4_K block's head: d, -dmin and the three 4-byte fields of scales and mins.
    pub(crate) type Q4kHead = (__m512, __m512, __m512i, __m512i, __m512i);

    /// The head of the packed Q4_K block at `h`.
    #[inline(always)]
    pub(crate) unsafe fn q4k_head(h: *const u8) -> Q4kHead {
        let v = |at: usize| _mm512_loadu_si512(h.add(at) as *const _);
        let dmin = f16x16(h.add(32));
        (
            f16x16(h),
            _mm512_sub_ps(_mm512_setzero_ps(), dmin),
            v(64),
            v(128),
            v(192),
        )
    }

    /// Group `g`'s factors in each row: `d · scale` and `-dmin · min` (both exact in f32: an
    /// f16 times a 6-bit integer).
    #[inline(always)]
    pub(crate) unsafe fn q4k_factors(
        (d, ndmin, v0, v1, v2): &Q4kHead,
        g: usize,
    ) -> (__m512, __m512) {
        let (sc, m) = if g < 4 {
            let n = 8 * g as u32;
            (bits(*v0, n, 63), bits(*v1, n, 63))
        } else {
            let n = 8 * (g - 4) as u32;
            (
                _mm512_or_si512(
                    bits(*v2, n, 15),
                    _mm512_slli_epi32::<4>(bits(*v0, n + 6, 3)),
                ),
                _mm512_or_si512(
                    bits(*v2, n + 4, 15),
                    _mm512_slli_epi32::<4>(bits(*v1, n + 6, 3)),
                ),
            )
        };
        (
            _mm512_mul_ps(*d, _mm512_cvtepi32_ps(sc)),
            _mm512_mul_ps(*ndmin, _mm512_cvtepi32_ps(m)),
        )
    }

    /// Bytes ahead of each vector of codes that are prefetched (here and in `qdot_x16i`). One
    /// thread streaming a 1 B Llama's matrices from memory (AMD EPYC Zen 5, k = 2048), 4 KB →
    /// 16 KB ahead: Q4_K 24–27 → 34–38 GB/s, Q6_K 18–20 → 28–31, Q8_0 31 → 35; 8 and 24 KB
    /// within that spread, 1 and 64 KB slower. The cores' stream prefetchers do not cross 4 KB
    /// pages; a Q6_K decode token's read ran at 60 % of one thread's memory rate with 4 KB.
    /// The integer kernel (`qdot_x16i`) asks for the second-level cache where the first is
    /// small (`simd::prefetch_to_l2`); this one's Q8_0 stays with the first (on Zen 4 the second
    /// level slowed a 1 B Q8_0 decode 16.5 → 10.5 t/s).
    pub(crate) const PREFETCH: usize = 16384;

    /// One column of the group for every activation row: the codes at bits `SH..SH + 4` of
    /// each lane (with 5-bit codes, the fifth bit from `hi`, shifted left `HL` or right `HR`
    /// to bit 4) looked up in the levels, times the column's activation.
    #[inline(always)]
    unsafe fn column<F: Format, const MR: usize, const SH: u32, const HL: u32, const HR: u32>(
        s: &mut [__m512; MR],
        (nib, hi): (__m512i, __m512i),
        x: *const f32,
        ldx: usize,
        (lo_levels, hi_levels): (__m512, __m512),
    ) {
        let idx = if SH == 0 {
            nib
        } else {
            _mm512_srli_epi32::<SH>(nib)
        };
        let w = if F::FIVE {
            let h = if HL > 0 {
                _mm512_slli_epi32::<HL>(hi)
            } else if HR > 0 {
                _mm512_srli_epi32::<HR>(hi)
            } else {
                hi
            };
            // Bit 4 from h, the rest from idx (the permute reads bits 0..5).
            let idx = _mm512_ternarylogic_epi32::<0xD8>(idx, h, _mm512_set1_epi32(16));
            _mm512_permutex2var_ps(lo_levels, idx, hi_levels)
        } else {
            _mm512_permutexvar_ps(idx, lo_levels)
        };
        for (i, si) in s.iter_mut().enumerate() {
            *si = _mm512_fmadd_ps(w, _mm512_set1_ps(*x.add(i * ldx)), *si);
        }
    }

    /// Group `g` of block `b` (its bytes from `hp`) into the totals.
    #[inline(always)]
    unsafe fn block_group<F: Format, const MR: usize>(
        a: &Args,
        (hp, head, b): (*const u8, &F::Head, usize),
        g: usize,
        levels: (__m512, __m512),
        tot: &mut [__m512; MR],
    ) {
        let mut s = [_mm512_setzero_ps(); MR];
        let col = 32 * (b * F::GROUPS + g);
        let fifth = F::fifth(head);
        for v in 0..4 {
            let p = hp.add(F::HEAD + 256 * g + 64 * v);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            let nib = _mm512_loadu_si512(p as *const _);
            // The fifth bits of elements 8v..8v + 8 at bits 0..8.
            let hi = if F::FIVE {
                _mm512_srl_epi32(fifth, _mm_cvtsi32_si128(8 * v as i32))
            } else {
                fifth
            };
            let c = (nib, hi);
            let x = a.x.add(col + 8 * v);
            column::<F, MR, 0, 4, 0>(&mut s, c, x, a.ldx, levels);
            column::<F, MR, 4, 3, 0>(&mut s, c, x.add(1), a.ldx, levels);
            column::<F, MR, 8, 2, 0>(&mut s, c, x.add(2), a.ldx, levels);
            column::<F, MR, 12, 1, 0>(&mut s, c, x.add(3), a.ldx, levels);
            column::<F, MR, 16, 0, 0>(&mut s, c, x.add(4), a.ldx, levels);
            column::<F, MR, 20, 0, 1>(&mut s, c, x.add(5), a.ldx, levels);
            column::<F, MR, 24, 0, 2>(&mut s, c, x.add(6), a.ldx, levels);
            column::<F, MR, 28, 0, 3>(&mut s, c, x.add(7), a.ldx, levels);
        }
        F::scale(tot, &s, head, g, a.xs.wrapping_add(col / 32), a.k / 32);
    }

    /// The 16 rows of group `g0` against `MR` activation rows. One group of rows at a time:
    /// its bytes are one stream through memory (four groups at once, four streams, ran
    /// slower from memory), and the blocks' independent sums keep the multiply-adds busy.
    /// A block's groups are written out one by one, so that each group's scale extraction
    /// has constant shifts (a loop over them measured ~10 % slower on Q4_K).
    #[inline(always)]
    unsafe fn group<F: Format, const MR: usize>(a: &Args, g0: usize) {
        let nb = a.k / (32 * F::GROUPS);
        let bb = F::HEAD + 256 * F::GROUPS;
        let levels = F::levels();
        let mut tot = [_mm512_setzero_ps(); MR];
        let base = a.w.add(g0 * nb * bb);
        for b in 0..nb {
            let hp = base.add(b * bb);
            let head = F::head(hp);
            let at = (hp, &head, b);
            let t = &mut tot;
            block_group::<F, MR>(a, at, 0, levels, t);
            if F::GROUPS == 8 {
                block_group::<F, MR>(a, at, 1, levels, t);
                block_group::<F, MR>(a, at, 2, levels, t);
                block_group::<F, MR>(a, at, 3, levels, t);
                block_group::<F, MR>(a, at, 4, levels, t);
                block_group::<F, MR>(a, at, 5, levels, t);
                block_group::<F, MR>(a, at, 6, levels, t);
                block_group::<F, MR>(a, at, 7, levels, t);
            }
        }
        for (i, t) in tot.iter().enumerate() {
            _mm512_storeu_ps(a.y.add(i * a.ldy + 16 * g0), *t);
        }
    }

    /// The groups of rows in `range`, one at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn run<F: Format, const MR: usize>(a: &Args, range: std::ops::Range<usize>) {
        for g in range {
            group::<F, MR>(a, g);
        }
    }

    /// Q8_0's 16 rows of group `g0`: per block the rows' `d`, then 32 columns of 16 code
    /// bytes, each widened and converted (exact) and multiplied by the column's activation;
    /// the block's sums scaled by `d`, as the 4-bit formats'.
    #[inline(always)]
    unsafe fn q8_group<const MR: usize>(a: &Args, g0: usize) {
        const BLOCK: usize = 32 + 512;
        let nb = a.k / 32;
        let base = a.w.add(g0 * nb * BLOCK);
        let mut tot = [_mm512_setzero_ps(); MR];
        for b in 0..nb {
            let hp = base.add(b * BLOCK);
            let d = f16x16(hp);
            let mut s = [_mm512_setzero_ps(); MR];
            for c in 0..32 {
                let p = hp.add(32 + 16 * c);
                if c % 4 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
                }
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i));
                let w = _mm512_cvtepi32_ps(q);
                for (i, si) in s.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*a.x.add(i * a.ldx + 32 * b + c));
                    *si = _mm512_fmadd_ps(w, x, *si);
                }
            }
            scale_by(&mut tot, &s, d);
        }
        for (i, t) in tot.iter().enumerate() {
            _mm512_storeu_ps(a.y.add(i * a.ldy + 16 * g0), *t);
        }
    }

    /// [`run`] for Q8_0.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn run_q8<const MR: usize>(a: &Args, range: std::ops::Range<usize>) {
        for g in range {
            q8_group::<MR>(a, g);
        }
    }
}
