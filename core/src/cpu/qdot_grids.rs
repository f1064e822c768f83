//! The grid i-quants' decoders for the fused kernels (`qdot.rs`): IQ2_XXS and IQ3_S, whose
//! values are points of a fixed lattice grid picked by index, with per-value signs. A child of
//! `qdot` (its `Format` trait and helpers), for the length of that file.

use super::x86::{f16x16, Format};
use std::arch::x86_64::*;

/// `v` with the sign bit of lane i flipped where bit i of `m` is set (exact, zeros too).
#[inline(always)]
unsafe fn flip_signs(v: __m512, m: u16) -> __m512 {
    _mm512_castsi512_ps(_mm512_mask_xor_epi32(
        _mm512_castps_si512(v),
        m,
        _mm512_castps_si512(v),
        _mm512_set1_epi32(i32::MIN),
    ))
}

/// A byte grid (`$n` entries of `$m` coordinate bytes packed little-endian in an integer)
/// as f32 coordinates, at compile time (each byte converts exactly).
macro_rules! grid_f32 {
    ($grid:expr, $n:expr, $m:expr) => {{
        let mut t = [[0f32; $m]; $n];
        let mut i = 0;
        while i < $n {
            let mut j = 0;
            while j < $m {
                t[i][j] = (($grid[i] as u64 >> (8 * j)) & 0xFF) as u8 as f32;
                j += 1;
            }
            i += 1;
        }
        t
    }};
}

/// Sixteen group factors `$f(s)` for the 4-bit scales `s`, each in all 16 lanes.
macro_rules! scale_rows {
    (|$s:ident| $f:expr) => {{
        let mut t = [[0f32; 16]; 16];
        let mut $s = 0;
        while $s < 16 {
            t[$s] = [$f; 16];
            $s += 1;
        }
        t
    }};
}

/// IQ2_XXS's grid as f32: entry i is grid point i's eight coordinates, one aligned 32-byte
/// load (the byte grid needed four scalar loads, a register assembled from them and two
/// widenings a group: the decoder was bound by the shuffle unit). 8 KiB.
#[repr(C, align(64))]
struct Iq2xxsF32([[f32; 8]; 256]);
static IQ2XXS_F32: Iq2xxsF32 = Iq2xxsF32(grid_f32!(crate::quant::iq_grids::IQ2XXS_GRID, 256, 8));

/// IQ2_XXS's group factors `(0.5 + s) · 0.25` (exact: s ≤ 15).
#[repr(C, align(64))]
struct Iq2xxsScales([[f32; 16]; 16]);
static IQ2XXS_SCALES: Iq2xxsScales = Iq2xxsScales(scale_rows!(|s| (0.5 + s as f32) * 0.25));

/// IQ2_XXS: f16 d, then a group's 8 bytes: 4 grid indices (8 values each) and a u32 of
/// four 7-bit sign indices and the 4-bit scale. A value is `db · coordinate`, negated where
/// its sign bit is set (by flipping the sign bit: the scalar decoder's `· -1`, zeros too).
/// The scalar decoder's `db` is `(d · (0.5 + s)) · 0.25`; here `d · ((0.5 + s) · 0.25)`,
/// the same value (scaling by a power of two commutes with rounding; `d · 0.125` is far
/// from f32's subnormals for any f16 `d`).
pub struct IQ2XXS;
impl Format for IQ2XXS {
    const BYTES: usize = 66;
    const GROUPS: usize = 8;
    /// `d` in all 16 lanes, and each group's 32 sign bits.
    type Head = (__m512, [u64; 8]);
    #[inline(always)]
    unsafe fn head(b: *const u8) -> (__m512, [u64; 8]) {
        let mut signs = [0u64; 8];
        _mm512_storeu_si512(signs.as_mut_ptr() as *mut __m512i, iq2xxs_signs(b.add(2)));
        (f16x16(b), signs)
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, h: &(__m512, [u64; 8]), g: usize) -> (__m512, __m512) {
        let p = b.add(2 + 8 * g);
        let s = *p.add(7) >> 4;
        let db = _mm512_mul_ps(h.0, _mm512_load_ps(IQ2XXS_SCALES.0[s as usize].as_ptr()));
        let signs = h.1[g];
        (
            flip_signs(_mm512_mul_ps(iq2xxs_points(p), db), signs as u16),
            flip_signs(
                _mm512_mul_ps(iq2xxs_points(p.add(2)), db),
                (signs >> 16) as u16,
            ),
        )
    }
}

/// The two IQ2_XXS grid points whose indices are the bytes at `p`, one register.
#[inline(always)]
unsafe fn iq2xxs_points(p: *const u8) -> __m512 {
    let pt = |j: usize| IQ2XXS_F32.0[*p.add(j) as usize].as_ptr();
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_load_ps(pt(0)))),
        _mm256_castps_pd(_mm256_load_ps(pt(1))),
    ))
}

/// The 32 sign bits of each of a block's 8 IQ2_XXS groups (the groups' 8 bytes at `q`), in
/// the low half of its 64-bit lane: the four 7-bit sign indices of the group's u32 (its
/// bytes 4..8) spread to a byte each, and bit 7 of each byte set where the byte's other
/// bits are odd in number (`iquants::ksigns`, for all 32 at once; the scalar form cost a
/// group more than its vector work).
#[inline(always)]
unsafe fn iq2xxs_signs(q: *const u8) -> __m512i {
    let a = _mm512_srli_epi64::<32>(_mm512_loadu_si512(q as *const __m512i));
    // (x & m) | y in one instruction each (written out, not as a closure: a closure's
    // intrinsics can be left as calls).
    const AND_OR: i32 = 0xEA;
    let s = _mm512_and_si512(a, _mm512_set1_epi64(0x7F));
    let s = _mm512_ternarylogic_epi64::<AND_OR>(
        _mm512_slli_epi64::<1>(a),
        _mm512_set1_epi64(0x7F00),
        s,
    );
    let s = _mm512_ternarylogic_epi64::<AND_OR>(
        _mm512_slli_epi64::<2>(a),
        _mm512_set1_epi64(0x7F_0000),
        s,
    );
    let s = _mm512_ternarylogic_epi64::<AND_OR>(
        _mm512_slli_epi64::<3>(a),
        _mm512_set1_epi64(0x7F00_0000),
        s,
    );
    // Bit 0 of each byte: the parity of the byte.
    let p = _mm512_xor_si512(s, _mm512_srli_epi64::<4>(s));
    let p = _mm512_xor_si512(p, _mm512_srli_epi64::<2>(p));
    let p = _mm512_xor_si512(p, _mm512_srli_epi64::<1>(p));
    _mm512_ternarylogic_epi64::<AND_OR>(
        _mm512_slli_epi64::<7>(p),
        _mm512_set1_epi64(0x8080_8080),
        s,
    )
}

/// IQ3_S's grid as f32: entry i is grid point i's four coordinates, one aligned 16-byte
/// load (as [`IQ2XXS_F32`]).
#[repr(C, align(64))]
struct Iq3sF32([[f32; 4]; 512]);
static IQ3S_F32: Iq3sF32 = Iq3sF32(grid_f32!(crate::quant::iq_grids::IQ3S_GRID, 512, 4));

/// IQ3_S's group factors `1 + 2 s` (exact).
#[repr(C, align(64))]
struct Iq3sScales([[f32; 16]; 16]);
static IQ3S_SCALES: Iq3sScales = Iq3sScales(scale_rows!(|s| (1 + 2 * s) as f32));

/// IQ3_S: f16 d, 64 index bytes, 8 bytes of their ninth bits, 32 bytes of signs, 4 bytes
/// of 4-bit group scales. Group g: 8 grid points of 4 values, `d · (1 + 2 s)` each (one
/// rounding, as the scalar decoder's).
pub struct IQ3S;
impl Format for IQ3S {
    const BYTES: usize = 110;
    const GROUPS: usize = 8;
    /// `d` in all 16 lanes.
    type Head = __m512;
    #[inline(always)]
    unsafe fn head(b: *const u8) -> __m512 {
        f16x16(b)
    }
    #[inline(always)]
    unsafe fn group(b: *const u8, d: &__m512, g: usize) -> (__m512, __m512) {
        let s = (*b.add(106 + g / 2) >> (4 * (g % 2))) & 0x0F;
        let db = _mm512_mul_ps(*d, _mm512_load_ps(IQ3S_SCALES.0[s as usize].as_ptr()));
        // Point j's index: byte j of the group's 8, and bit j of its ninth-bits byte.
        let (q, qh) = (b.add(2 + 8 * g), *b.add(66 + g) as usize);
        let signs = std::ptr::read_unaligned(b.add(74 + 4 * g) as *const u32);
        (
            flip_signs(_mm512_mul_ps(iq3s_points(q, qh), db), signs as u16),
            flip_signs(
                _mm512_mul_ps(iq3s_points(q.add(4), qh >> 4), db),
                (signs >> 16) as u16,
            ),
        )
    }
}

/// The four IQ3_S grid points whose indices are the bytes at `q` with bits 0..4 of `qh`
/// as their ninth bits, one register. (A function, not a closure: a closure's intrinsics
/// were left as calls.)
#[inline(always)]
unsafe fn iq3s_points(q: *const u8, qh: usize) -> __m512 {
    let pt = |j: usize| IQ3S_F32.0[*q.add(j) as usize | ((qh >> j) & 1) << 8].as_ptr();
    let v = _mm512_castps128_ps512(_mm_load_ps(pt(0)));
    let v = _mm512_insertf32x4::<1>(v, _mm_load_ps(pt(1)));
    let v = _mm512_insertf32x4::<2>(v, _mm_load_ps(pt(2)));
    _mm512_insertf32x4::<3>(v, _mm_load_ps(pt(3)))
}
