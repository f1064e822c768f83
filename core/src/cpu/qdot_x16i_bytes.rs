//! The integer kernel's formats with codes of 8 bits: Q8_0, and IQ4_NL and IQ4_XS, whose 4-bit
//! codes index levels of 8 bits (`qdot_x16i`'s module comment has the kernel and its layout).
//!
//! # Q8_0
//! Signed byte codes `w ∈ [-128, 127]`, four columns of a row a lane in the nibble formats'
//! order (`qdot_x16::q8_lanes`), `x = d · w` a block of 32. `vpdpbusd` takes one operand
//! unsigned, so the kernel flips each code's top bit, `u = w + 128 ∈ [0, 255]` (a `vpxord`
//! per code vector, shared by every activation row), and takes 128 times the digits' sums
//! back ([`offset`]). With 22-bit integers as Q4_K's, `Σ w · x_q` over a group reaches
//! `32 · 128 · 2²²`, past 32 bits, so the Horner sum stops before the last digit: two lanes
//! a row sum `Σ u · (t2 · 2⁸ + t1)` over each half of 16 (every stage within `16 · 255 ·
//! (2¹⁴ + 128) < 2²⁷`), added into `hi` (within 2²⁸), then one lane sums `lo = Σ u · t0`
//! (within `32 · 255 · 128 < 2²⁰`), and the split row carries `128 · Σ
//! (t2 · 2⁸ + t1)` and `128 · Σ t0` for the group (within 2²⁷ and 2¹⁹), which leave `Σ w ·
//! (t2 · 2⁸ + t1)` and `Σ w · t0` exactly. The two convert to f32 (one rounding for the
//! first, the second is exact), meet as `2⁸ · hi + lo` (one rounding) and are multiplied by
//! `d · s` (exact: an f16 times a power of two) into the row's total (one fused
//! multiply-add). So Q8_0's error is the split's `2⁻²² · M_g · Σ_g |d · w|` and f32 roundings
//! of the size of an f32 dot's.
//!
//! # IQ4_NL and IQ4_XS
//! Their nibbles index 16 signed levels in `[-127, 113]`: a byte shuffle per code vector
//! looks each up in the levels plus 128 (the top bit flipped), and the sums are Q8_0's, with
//! the same bounds; the factor is IQ4_NL's `d`, or IQ4_XS's `d · (s_g − 32)` for group g
//! (exact: an f16 times a 6-bit integer less 32). The f32 kernel they took before spent a
//! permute and a multiply-add on every 16 weights: the 1 B Llama shape in IQ4_XS decoded 20.1
//! → 33.4 t/s on one Zen 4 thread (medians of 3 alternating; pp512 on two 99 → 110).
//!

use super::offsets_at;
use super::x86::{codes_nibbles, scale, Args, Format};
use crate::cpu::qdot_x16f::x86::{iq4xs_factor, iq4xs_head, Iq4xsHead};
use std::arch::x86_64::*;

/// Q8_0 packed in lanes (`qdot_x16::q8_lanes`): the 16 rows' d (f16), then eight vectors
/// of code bytes in the nibble formats' order.
pub struct Q80;
impl Format for Q80 {
    const HEAD: usize = 32;
    const GROUPS: usize = 1;
    const GROUP: usize = 512;
    const HALVES: usize = 2;
    const LAST_APART: bool = true;
    type Head = __m512;
    #[inline(always)]
    unsafe fn head(hp: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(hp as *const __m256i))
    }
    /// The codes with their top bit flipped: `w + 128` as unsigned bytes.
    #[inline(always)]
    unsafe fn codes(p: *const u8, _: &__m512) -> [__m512i; 8] {
        let flip = _mm512_set1_epi8(-128);
        let mut c = [_mm512_setzero_si512(); 8];
        for (q, c) in c.iter_mut().enumerate() {
            *c = _mm512_xor_si512(_mm512_loadu_si512(p.add(64 * q) as *const _), flip);
        }
        c
    }
    #[inline(always)]
    unsafe fn finish<const MR: usize>(
        a: &Args,
        sums: &[[__m512i; 2]; MR],
        d: &__m512,
        (_, gi): (usize, usize),
        tot: &mut [__m512; MR],
    ) {
        finish_apart(a, sums, *d, gi, tot)
    }
}

/// Adds to `tot` a group's sums with the last digit apart (`Format::LAST_APART`) and the
/// codes' top bit flipped: `Σ w · (t2 · 2⁸ + t1)` and `Σ w · t0` (the split row's by-digit
/// offsets taken from the lanes), as `2⁸ · hi + lo`, times the rows' factor `f` (d, or
/// IQ4_XS's `d · (scale − 32)`) and the group's `s`.
#[inline(always)]
unsafe fn finish_apart<const MR: usize>(
    a: &Args,
    sums: &[[__m512i; 2]; MR],
    f: __m512,
    gi: usize,
    tot: &mut [__m512; MR],
) {
    let shift = _mm512_set1_ps(256.0);
    for (i, (t, sum)) in tot.iter_mut().zip(sums).enumerate() {
        let off = a.x.add(i * a.ldx + offsets_at(a.k, gi)) as *const i32;
        let part = |h: usize| {
            let o = _mm512_set1_epi32(off.add(h).read_unaligned());
            _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[h], o))
        };
        let both = _mm512_fmadd_ps(part(0), shift, part(1));
        *t = _mm512_fmadd_ps(both, _mm512_mul_ps(f, scale(a, i, gi)), *t);
    }
}

/// IQ4_NL's and IQ4_XS's codes: a group's nibbles (four vectors at `p`) looked up in the
/// 16 levels plus 128 (1..=241: the levels' top bit flipped, as Q8_0's codes).
#[inline(always)]
unsafe fn codes_iq4(p: *const u8) -> [__m512i; 8] {
    let l = crate::quant::iquants::KVALUES_IQ4NL_U8;
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(l.as_ptr() as *const __m128i));
    let mut c = codes_nibbles(p);
    for c in c.iter_mut() {
        *c = _mm512_shuffle_epi8(table, *c);
    }
    c
}

/// IQ4_NL packed: the 16 rows' d (f16), then a block's nibbles as Q4_0's.
pub struct Iq4Nl;
impl Format for Iq4Nl {
    const HEAD: usize = 32;
    const GROUPS: usize = 1;
    const GROUP: usize = 256;
    const HALVES: usize = 2;
    const LAST_APART: bool = true;
    type Head = __m512;
    #[inline(always)]
    unsafe fn head(hp: *const u8) -> __m512 {
        Q80::head(hp)
    }
    #[inline(always)]
    unsafe fn codes(p: *const u8, _: &__m512) -> [__m512i; 8] {
        codes_iq4(p)
    }
    #[inline(always)]
    unsafe fn finish<const MR: usize>(
        a: &Args,
        sums: &[[__m512i; 2]; MR],
        d: &__m512,
        at: (usize, usize),
        tot: &mut [__m512; MR],
    ) {
        Q80::finish(a, sums, d, at, tot)
    }
}

/// IQ4_XS packed: the 16 rows' d (f16), the scales' high bits (u16), their low nibbles (4
/// bytes), then per group of 32 its nibbles; group g's factor `d · (s_g − 32)`
/// (`qdot_x16f::x86::iq4xs_factor`).
pub struct Iq4Xs;
impl Format for Iq4Xs {
    const HEAD: usize = 128;
    const GROUPS: usize = 8;
    const GROUP: usize = 256;
    const HALVES: usize = 2;
    const LAST_APART: bool = true;
    type Head = Iq4xsHead;
    #[inline(always)]
    unsafe fn head(hp: *const u8) -> Iq4xsHead {
        iq4xs_head(hp)
    }
    #[inline(always)]
    unsafe fn codes(p: *const u8, _: &Iq4xsHead) -> [__m512i; 8] {
        codes_iq4(p)
    }
    #[inline(always)]
    unsafe fn finish<const MR: usize>(
        a: &Args,
        sums: &[[__m512i; 2]; MR],
        head: &Iq4xsHead,
        (g, gi): (usize, usize),
        tot: &mut [__m512; MR],
    ) {
        finish_apart(a, sums, iq4xs_factor(head, g), gi, tot)
    }
}
