//! Fused dequantize-and-dot: a weight row is read once in its block format, each 32-element
//! group decoded into two f32 vectors in registers and multiplied into up to six f32
//! activation rows at once (a batch of decoding sequences reads each weight once). No scratch
//! buffer, no activation quantization: the products are the exact dequantized weights times
//! the f32 activations, accumulated in f32. Prefill decodes weight tiles once with the same
//! decoders and runs a tile kernel that sums in the same order, so a row's bits never depend
//! on the batch it came in.
//!
//! AVX-512 only (16 lanes, byte shuffles and masks make the decoders short); other CPUs and
//! formats take the dequantize-a-tile path in `mat_mul.rs`.

use crate::tensor::DType;

/// Activation rows one call covers at most: six rows × four accumulators fit in the 32 vector
/// registers with the weights and activations (eight rows spilled).
pub(crate) const MAX_ROWS: usize = 6;

/// Whether [`rows_dots`] handles `dtype` on this CPU.
pub(crate) fn supported(isa: super::simd::Isa, dtype: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == super::simd::Isa::Avx512
            && matches!(
                dtype,
                DType::Q4_0
                    | DType::Q4_1
                    | DType::Q5_0
                    | DType::Q8_0
                    | DType::Q2_K
                    | DType::Q4_K
                    | DType::Q5_K
                    | DType::Q6_K
                    | DType::IQ4_NL
                    | DType::IQ4_XS
                    | DType::IQ2_XXS
                    | DType::IQ3_S
            )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, dtype);
        false
    }
}

/// `y[i·ldy + r] = Σₖ x[i·ldx + k] · W_r[k]` for `i < mr` (1..=6) and each weight row `r` in
/// `rows`, where row r is the `k` elements of `dtype` at `w + r·rb`.
///
/// # Safety
/// [`supported`] is true for `dtype` on this CPU; `k` is a multiple of the block size; each
/// row in `rows` lies in readable memory at `w + r·rb` (`dtype.bytes_for(k)` bytes), `x`
/// points to `mr` rows of `k` f32 at `ldx`, and `y` to `mr` rows at `ldy` writable at the
/// columns in `rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dots(
    dtype: DType,
    x: *const f32,
    ldx: usize,
    mr: usize,
    k: usize,
    (w, rb): (*const u8, usize),
    rows: std::ops::Range<usize>,
    (y, ldy): (*mut f32, usize),
) {
    debug_assert!((1..=MAX_ROWS).contains(&mr));
    #[cfg(target_arch = "x86_64")]
    {
        use x86::*;
        macro_rules! go {
            ($f:ty) => {
                match mr {
                    1 => run::<$f, 1>(x, ldx, k, w, rb, rows, y, ldy),
                    2 => run::<$f, 2>(x, ldx, k, w, rb, rows, y, ldy),
                    3 => run::<$f, 3>(x, ldx, k, w, rb, rows, y, ldy),
                    4 => run::<$f, 4>(x, ldx, k, w, rb, rows, y, ldy),
                    5 => run::<$f, 5>(x, ldx, k, w, rb, rows, y, ldy),
                    _ => run::<$f, 6>(x, ldx, k, w, rb, rows, y, ldy),
                }
            };
        }
        dispatch!(dtype, go);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, x, ldx, mr, k, w, rb, rows, y, ldy);
    }
}

/// [`rows_dots`] for one weight row `w`: `out[i] = x[i] · W`.
///
/// # Safety
/// As for [`rows_dots`].
#[cfg(test)]
pub(crate) unsafe fn row_dots(
    dtype: DType,
    x: *const f32,
    ldx: usize,
    mr: usize,
    k: usize,
    w: *const u8,
    out: &mut [f32; MAX_ROWS],
) {
    rows_dots(dtype, x, ldx, mr, k, (w, 0), 0..1, (out.as_mut_ptr(), 1));
}

/// Runs `$go!(Format)` for the fused kernel's format of `$dtype`.
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch {
    ($dtype:expr, $go:ident) => {
        match $dtype {
            DType::Q4_0 => $go!(Q40),
            DType::Q4_1 => $go!(Q41),
            DType::Q5_0 => $go!(Q50),
            DType::Q8_0 => $go!(Q80),
            DType::Q2_K => $go!(Q2K),
            DType::Q4_K => $go!(Q4K),
            DType::Q5_K => $go!(Q5K),
            DType::Q6_K => $go!(Q6K),
            DType::IQ4_NL => $go!(IQ4NL),
            DType::IQ4_XS => $go!(IQ4XS),
            DType::IQ2_XXS => $go!(IQ2XXS),
            DType::IQ3_S => $go!(IQ3S),
            _ => {}
        }
    };
}
#[cfg(target_arch = "x86_64")]
use dispatch;

/// The order the prefill tile kernel reads a row of `k` elements in ("pass order"): the
/// fused kernel keeps four accumulators per row (the two 16-element halves of each 32-element
/// group, even and odd groups apart), and the tile kernel sums each of them in a pass of its
/// own. Pass `q` (half `q % 2` of the groups of parity `q / 2`) is stored contiguously, so
/// every pass streams through memory. Returns each pass's (start, length) in elements.
pub(crate) fn passes(k: usize) -> [(usize, usize); 4] {
    let groups = k / 32;
    let even = groups.div_ceil(2) * 16;
    let odd = (groups / 2) * 16;
    [
        (0, even),
        (even, even),
        (2 * even, odd),
        (2 * even + odd, odd),
    ]
}

/// Where element `kk` (a multiple of 16) of a row lies in pass order.
#[inline(always)]
fn pass_index(k: usize, kk: usize) -> usize {
    let (g, h) = (kk / 32, (kk / 16) % 2);
    passes(k)[2 * (g % 2) + h].0 + (g / 2) * 16
}

/// Copies a row of `k` f32 (`k` a multiple of 32) into pass order.
pub(crate) fn to_pass_order(src: &[f32], dst: &mut [f32]) {
    let k = src.len();
    for kk in (0..k).step_by(16) {
        let at = pass_index(k, kk);
        dst[at..at + 16].copy_from_slice(&src[kk..kk + 16]);
    }
}

/// Decodes one weight row (`k` elements of `dtype`) into `out` in pass order, with the
/// fused kernels' decoders (so the stored values are the ones they multiply).
///
/// # Safety
/// As for [`rows_dots`]; `out` has room for `k` f32.
pub(crate) unsafe fn decode_row(dtype: DType, w: *const u8, k: usize, out: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use x86::*;
        macro_rules! go {
            ($f:ty) => {
                decode::<$f>(w, k, out)
            };
        }
        dispatch!(dtype, go);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, w, k, out);
    }
}

/// Activation rows [`tile_dots`] covers at once.
pub(crate) const TILE_ROWS: usize = 6;
/// Weight rows [`tile_dots`] covers at once.
pub(crate) const TILE_COLS: usize = 4;

/// `out[i·ldo + j] = x[i] · w[j]` for `mr` (1..=6) activation rows at stride `ldx` and four
/// weight rows, all in pass order (the weights decoded by [`decode_row`]), with the bits
/// [`rows_dots`] gives for the same rows.
///
/// # Safety
/// [`supported`] holds for the weights' format; `k` is a multiple of 32; the pointers cover
/// `mr` rows of `k` f32 at `ldx`, four rows of `k` f32, and `mr` rows of 4 f32 at `ldo`.
pub(crate) unsafe fn tile_dots(
    x: *const f32,
    ldx: usize,
    mr: usize,
    w: [*const f32; TILE_COLS],
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match mr {
        1 => x86::tile::<1>(x, ldx, w, k, out, ldo),
        2 => x86::tile::<2>(x, ldx, w, k, out, ldo),
        3 => x86::tile::<3>(x, ldx, w, k, out, ldo),
        4 => x86::tile::<4>(x, ldx, w, k, out, ldo),
        5 => x86::tile::<5>(x, ldx, w, k, out, ldo),
        _ => x86::tile::<6>(x, ldx, w, k, out, ldo),
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, ldx, mr, w, k, out, ldo);
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "qdot_grids.rs"]
mod grids;

/// The levels tables, for the interleaved kernels (`qdot_x16`).
#[cfg(target_arch = "x86_64")]
pub(super) use x86::{iota, iq4_levels};

#[cfg(target_arch = "x86_64")]
mod x86 {
    pub(super) use super::grids::{IQ2XXS, IQ3S};
    use std::arch::x86_64::*;

    /// A block format as the fused kernel sees it: `GROUPS` groups of 32 elements per block of
    /// `BYTES` bytes.
    pub(super) trait Format {
        const BYTES: usize;
        const GROUPS: usize;
        /// Per-block constants (scales) shared by its groups.
        type Head: Copy;
        unsafe fn head(b: *const u8) -> Self::Head;
        /// Elements `32g..32g + 32` of the block as two vectors of 16.
        unsafe fn group(b: *const u8, h: &Self::Head, g: usize) -> (__m512, __m512);
    }

    /// A 32-element format with one scale set per block: the block is its only group.
    macro_rules! block32 {
        ($name:ident, $bytes:expr, |$b:ident| $body:block) => {
            pub struct $name;
            impl Format for $name {
                const BYTES: usize = $bytes;
                const GROUPS: usize = 1;
                type Head = ();
                #[inline(always)]
                unsafe fn head(_: *const u8) {}
                #[inline(always)]
                unsafe fn group($b: *const u8, _: &(), _: usize) -> (__m512, __m512) $body
            }
        };
    }

    /// The f32 at `p` in all 16 lanes, by a broadcast load: the load unit does it, where a
    /// broadcast from a register (what the compiler makes of `_mm512_set1_ps` on a value it
    /// has in one, even one just stored) takes the shuffle unit that the decoders are bound
    /// by. Q6_K's scales: 17 → 19 GB/s from cache (Q4_K's got slower this way, so it
    /// permutes its scales in registers).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn splat(p: *const f32) -> __m512 {
        let v: __m512;
        std::arch::asm!(
            "vbroadcastss {v}, dword ptr [{p}]",
            v = out(zmm_reg) v,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags)
        );
        v
    }

    /// The f16 at `b` in all 16 lanes: a broadcast load and one conversion (F16C's; the
    /// callers are compiled with it). Inserting it into a register instead made each load
    /// wait on that register's last use; the Q8_0 kernel ran at half speed on that chain.
    #[inline(always)]
    pub(super) unsafe fn f16x16(b: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_set1_epi16(std::ptr::read_unaligned(b as *const i16)))
    }

    /// Bytes ahead of the block being decoded that are prefetched: the weight stream is
    /// sequential, but one core alone does not keep enough misses in flight to fill the
    /// memory bus without help. 4 KiB ahead streams Q8_0 from memory at ~25 GB/s on one core
    /// here, against ~22 at 1.5 KiB (Gemma 3 tg64 on 1 thread: 82 → 92 t/s); beyond 4 KiB it
    /// stops gaining.
    const PREFETCH: usize = 4096;

    block32!(Q40, 18, |b| {
        let d = f16x16(b);
        // The 16 values a nibble can stand for, looked up by the nibble.
        let table = _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(8.0)), d);
        nibble_lookup(b.add(2), table)
    });

    /// 0, 1, …, 15.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn iota() -> __m512 {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }

    /// The bytes at `p` widened to 32-bit lanes, and the same shifted right by 4: in the low
    /// 4 bits of each lane, the low and the high nibbles of bytes 0..16 (the upper bits are
    /// left for the permutes, which read only the low 4). One widening (a shuffle) and one
    /// shift (not a shuffle): the decoders are bound by the shuffle unit.
    #[inline(always)]
    unsafe fn nibble_codes(p: *const u8) -> (__m512i, __m512i) {
        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        (v, _mm512_srli_epi32(v, 4))
    }

    /// The 32 elements of 16 bytes of nibbles (element j in the low nibble of byte j, element
    /// j + 16 in its high nibble), each the entry of `table` its nibble selects: a lookup in
    /// one instruction (vpermps reads only the low 4 bits of each index) instead of a
    /// conversion and a multiply-add.
    #[inline(always)]
    unsafe fn nibble_lookup(p: *const u8, table: __m512) -> (__m512, __m512) {
        let (lo, hi) = nibble_codes(p);
        (
            _mm512_permutexvar_ps(lo, table),
            _mm512_permutexvar_ps(hi, table),
        )
    }

    block32!(Q41, 20, |b| {
        // d and m converted together from their two f16s.
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(b as *const i32)));
        let d = _mm512_broadcastss_ps(dm);
        let m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
        nibble_lookup(b.add(4), _mm512_fmadd_ps(iota(), d, m))
    });

    block32!(Q50, 22, |b| {
        let d = f16x16(b);
        // The low 4 bits of each code (vpermps reads only those of an index).
        let (lo, hi) = nibble_codes(b.add(6));
        // Bit j of qh is bit 4 of element j: it picks the table of codes 16..31.
        let qh = std::ptr::read_unaligned(b.add(2) as *const u32);
        // (q - 16)·d for the codes 0..15 and 16..31.
        let t0 = _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(16.0)), d);
        let t1 = _mm512_mul_ps(iota(), d);
        let pick = |q, bits| _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(q, t0), bits, q, t1);
        (pick(lo, qh as u16), pick(hi, (qh >> 16) as u16))
    });

    block32!(Q80, 34, |b| {
        let d = f16x16(b);
        let lo = _mm_loadu_si128(b.add(2) as *const __m128i);
        let hi = _mm_loadu_si128(b.add(18) as *const __m128i);
        (
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d),
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d),
        )
    });

    /// IQ4_NL's 16 levels.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn iq4_levels() -> __m512 {
        _mm512_setr_ps(
            -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0,
            69.0, 89.0, 113.0,
        )
    }

    // IQ4_NL: f16 d, 16 bytes of nibbles, each a level: the table is the levels times d (the
    // scalar decoder's one rounding, d · level).
    block32!(IQ4NL, 18, |b| {
        nibble_lookup(b.add(2), _mm512_mul_ps(iq4_levels(), f16x16(b)))
    });

    /// IQ4_XS: f16 d, u16 of the 8 groups' scale high bits, 4 bytes of low nibbles, then each
    /// group's 16 bytes of IQ4_NL nibbles.
    pub struct IQ4XS;
    impl Format for IQ4XS {
        const BYTES: usize = 136;
        const GROUPS: usize = 8;
        /// Lane g < 8: d · (scale of group g - 32).
        type Head = __m512;
        #[inline(always)]
        unsafe fn head(b: *const u8) -> __m512 {
            let hi = std::ptr::read_unaligned(b.add(2) as *const u16) as u32;
            let mut s = [0f32; 16];
            for (g, v) in s.iter_mut().take(8).enumerate() {
                let lo = (*b.add(4 + g / 2) >> (4 * (g % 2))) as u32 & 0x0F;
                *v = ((lo | ((hi >> (2 * g)) & 3) << 4) as i32 - 32) as f32;
            }
            _mm512_mul_ps(_mm512_loadu_ps(s.as_ptr()), f16x16(b))
        }
        #[inline(always)]
        unsafe fn group(b: *const u8, h: &__m512, g: usize) -> (__m512, __m512) {
            let dl = _mm512_permutexvar_ps(_mm512_set1_epi32(g as i32), *h);
            nibble_lookup(b.add(8 + 16 * g), _mm512_mul_ps(iq4_levels(), dl))
        }
    }

    /// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
    pub struct Q4K;
    impl Format for Q4K {
        const BYTES: usize = 144;
        const GROUPS: usize = 8;
        /// Lane g < 8: d · scale of group g; lane 8 + g: -dmin · min of group g.
        type Head = __m512;
        #[inline(always)]
        unsafe fn head(b: *const u8) -> __m512 {
            // The 12 bytes of scales and mins (and 4 of nibbles, unused).
            let s = _mm_loadu_si128(b.add(4) as *const __m128i);
            // Lanes 0..8 become the scales, 8..16 the mins. Groups 0..4 have them in the low
            // 6 bits of bytes 0..4 and 4..8; groups 4..8 in the low and high nibbles of bytes
            // 8..12, with bits 4 and 5 in the top two bits of bytes 0..4 and 4..8.
            let a = _mm_shuffle_epi8(
                s,
                _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
            );
            let t = _mm_shuffle_epi8(
                s,
                _mm_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7),
            );
            let nib = _mm_set1_epi8(0x0F);
            let low6 = _mm_and_si128(a, _mm_set1_epi8(63));
            let lo4 = _mm_and_si128(a, nib);
            let hi4 = _mm_and_si128(_mm_srli_epi16(a, 4), nib);
            let top = _mm_and_si128(_mm_srli_epi16(t, 2), _mm_set1_epi8(0x30));
            let packed = _mm_or_si128(_mm_mask_blend_epi8(0xF000, lo4, hi4), top);
            let q = _mm_mask_blend_epi8(0xF0F0, low6, packed);
            // [d × 8, -dmin × 8] from the two f16s.
            let dm = _mm512_cvtph_ps(_mm256_set1_epi32(std::ptr::read_unaligned(b as *const i32)));
            let dm = _mm512_permutexvar_ps(
                _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                dm,
            );
            let dm = _mm512_mask_sub_ps(dm, 0xFF00, _mm512_setzero_ps(), dm);
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), dm)
        }
        #[inline(always)]
        unsafe fn group(b: *const u8, h: &__m512, g: usize) -> (__m512, __m512) {
            let (d1, m1, c0, c1) = Self::scaled_nibbles(b.add(16), h, g);
            let table = _mm512_fmadd_ps(iota(), d1, m1);
            (
                _mm512_permutexvar_ps(c0, table),
                _mm512_permutexvar_ps(c1, table),
            )
        }
    }

    impl Q4K {
        /// Group g's `d · scale` and `-dmin · min` (from the head) in every lane, and its
        /// nibble codes (low 4 bits of each lane) from the nibbles at `qs`: groups 2i and 2i + 1
        /// are the low and high nibbles of the same 32 bytes (the widening is shared between
        /// the two after inlining).
        #[inline(always)]
        unsafe fn scaled_nibbles(
            qs: *const u8,
            h: &__m512,
            g: usize,
        ) -> (__m512, __m512, __m512i, __m512i) {
            let d1 = _mm512_permutexvar_ps(_mm512_set1_epi32(g as i32), *h);
            let m1 = _mm512_permutexvar_ps(_mm512_set1_epi32(8 + g as i32), *h);
            let p = qs.add(32 * (g / 2));
            let (lo0, hi0) = nibble_codes(p);
            let (lo1, hi1) = nibble_codes(p.add(16));
            let (c0, c1) = if g.is_multiple_of(2) {
                (lo0, lo1)
            } else {
                (hi0, hi1)
            };
            (d1, m1, c0, c1)
        }
    }

    /// Q5_K: Q4_K's first 16 bytes (d, dmin, the 6-bit scales and mins), 32 bytes of fifth
    /// bits (bit g of byte l: element l of group g), then Q4_K's nibbles. A code (0..32) looks
    /// up its value in two 16-entry tables; `d1 · code` has at most 22 significant bits, so
    /// the fused `d1 · code - m1` rounds as the scalar decoder's two steps.
    pub struct Q5K;
    impl Format for Q5K {
        const BYTES: usize = 176;
        const GROUPS: usize = 8;
        type Head = __m512;
        #[inline(always)]
        unsafe fn head(b: *const u8) -> __m512 {
            Q4K::head(b)
        }
        #[inline(always)]
        unsafe fn group(b: *const u8, h: &__m512, g: usize) -> (__m512, __m512) {
            let (d1, m1, c0, c1) = Q4K::scaled_nibbles(b.add(48), h, g);
            // Bit g of each qh byte, moved to bit 4 of the code.
            let shift = _mm_cvtsi32_si128(g as i32);
            let bit = |q: *const u8| {
                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(q as *const __m128i));
                _mm512_and_si512(
                    _mm512_srl_epi32(_mm512_slli_epi32(v, 4), shift),
                    _mm512_set1_epi32(16),
                )
            };
            let nib = _mm512_set1_epi32(15);
            let i0 = _mm512_or_si512(_mm512_and_si512(c0, nib), bit(b.add(16)));
            let i1 = _mm512_or_si512(_mm512_and_si512(c1, nib), bit(b.add(32)));
            let t0 = _mm512_fmadd_ps(iota(), d1, m1);
            let t1 = _mm512_fmadd_ps(_mm512_add_ps(iota(), _mm512_set1_ps(16.0)), d1, m1);
            (
                _mm512_permutex2var_ps(t0, i0, t1),
                _mm512_permutex2var_ps(t0, i1, t1),
            )
        }
    }

    /// Q2_K: 16 bytes of 4-bit scale and min pairs (one per 16 elements), 64 bytes of 2-bit
    /// codes (element 128h + 32s + l: bits 2s of byte 32h + l), f16 d and dmin. Each half of a
    /// group looks its codes up in a table of its four values, repeated so that the bits above
    /// a code (the next codes of the byte) do not matter; `dl · code` is exact (15 + 2 bits).
    pub struct Q2K;
    impl Format for Q2K {
        const BYTES: usize = 84;
        const GROUPS: usize = 8;
        /// d and dmin.
        type Head = (f32, f32);
        #[inline(always)]
        unsafe fn head(b: *const u8) -> (f32, f32) {
            let f = |at: usize| {
                half::f16::from_bits(std::ptr::read_unaligned(b.add(at) as *const u16)).to_f32()
            };
            (f(80), f(82))
        }
        #[inline(always)]
        unsafe fn group(b: *const u8, h: &(f32, f32), g: usize) -> (__m512, __m512) {
            let iota4 = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0,
            );
            let table = |sc: u8| {
                let dl = h.0 * (sc & 0x0F) as f32;
                let ml = h.1 * (sc >> 4) as f32;
                _mm512_fmadd_ps(iota4, _mm512_set1_ps(dl), _mm512_set1_ps(-ml))
            };
            let q = b.add(16 + 32 * (g / 4));
            let shift = _mm_cvtsi32_si128(2 * (g % 4) as i32);
            let codes = |p: *const u8| {
                _mm512_srl_epi32(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)),
                    shift,
                )
            };
            (
                _mm512_permutexvar_ps(codes(q), table(*b.add(2 * g))),
                _mm512_permutexvar_ps(codes(q.add(16)), table(*b.add(2 * g + 1))),
            )
        }
    }

    /// Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed scales, f16 d.
    pub struct Q6K;
    impl Format for Q6K {
        const BYTES: usize = 210;
        const GROUPS: usize = 8;
        /// The 16 scales times d (in memory, for broadcasts that are loads).
        type Head = [f32; 16];
        #[inline(always)]
        unsafe fn head(b: *const u8) -> [f32; 16] {
            let sc = _mm_loadu_si128(b.add(192) as *const __m128i);
            let mut h = [0f32; 16];
            _mm512_storeu_ps(
                h.as_mut_ptr(),
                _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)),
                    f16x16(b.add(208)),
                ),
            );
            h
        }
        #[inline(always)]
        unsafe fn group(b: *const u8, s: &[f32; 16], g: usize) -> (__m512, __m512) {
            // Group g: half h = g / 4, part p = g % 4 (elements 32p..32p+32 of the half).
            let (h, p) = (g / 4, g % 4);
            let ql = _mm256_loadu_si256(b.add(64 * h + 32 * (p & 1)) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
            let lo = _mm256_and_si256(
                _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (p as i32 >> 1))),
                _mm256_set1_epi8(0x0F),
            );
            let hi = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p as i32)),
                _mm256_set1_epi8(3),
            );
            // The 6-bit codes less 32, as signed bytes.
            let q = _mm256_sub_epi8(
                _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)),
                _mm256_set1_epi8(32),
            );
            let s0 = splat(&s[8 * h + 2 * p]);
            let s1 = splat(&s[8 * h + 2 * p + 1]);
            let q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            let q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
            (_mm512_mul_ps(q0, s0), _mm512_mul_ps(q1, s1))
        }
    }

    /// One 32-element group at `kk` (two vectors of weights) into accumulators `P` and
    /// `P + 1` of each of `MR` activation rows: `P` is 0 for even groups, 2 for odd ones.
    #[inline(always)]
    unsafe fn fma_group<const MR: usize, const P: usize>(
        acc: &mut [[__m512; 4]; MR],
        x: *const f32,
        ldx: usize,
        kk: usize,
        (w0, w1): (__m512, __m512),
    ) {
        for (i, a) in acc.iter_mut().enumerate() {
            let xp = x.add(i * ldx + kk);
            a[P] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), a[P]);
            a[P + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), a[P + 1]);
        }
    }

    /// Prefetches the block `PREFETCH` bytes past `b`.
    #[inline(always)]
    unsafe fn prefetch<F: Format>(b: *const u8) {
        // A prefetch past the end of the weights is harmless (it never faults).
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH) as *const i8);
        if F::BYTES > 64 {
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH + 128) as *const i8);
        }
    }

    /// `y[i·ldy + r] = x[i] · W_r` for `MR` activation rows and the weight rows `rows`, row r
    /// at `w + r·rb`. The loop over rows is in here so that one row's final sums overlap the
    /// next row's loads (a call per row left them waiting on each other).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run<F: Format, const MR: usize>(
        x: *const f32,
        ldx: usize,
        k: usize,
        w: *const u8,
        rb: usize,
        rows: std::ops::Range<usize>,
        y: *mut f32,
        ldy: usize,
    ) {
        for r in rows {
            let sums = row::<F, MR>(x, ldx, k, w.add(r * rb));
            for (i, s) in sums.iter().enumerate() {
                *y.add(i * ldy + r) = *s;
            }
        }
    }

    /// One weight row `w` against `MR` activation rows.
    ///
    /// Four accumulators per pair: the two halves of each group, even and odd groups apart,
    /// so four chains of multiply-adds are in flight (with two, a row waited on FMA latency).
    /// Groups go in (even, odd) pairs with the accumulators at constant indices (a computed
    /// index would put them on the stack); a block of 32 elements is one group, so those
    /// formats take two blocks a round.
    #[inline(always)]
    unsafe fn row<F: Format, const MR: usize>(
        x: *const f32,
        ldx: usize,
        k: usize,
        w: *const u8,
    ) -> [f32; MR] {
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        let a = &mut acc;
        if F::GROUPS == 1 {
            let blocks = k / 32;
            let mut bi = 0;
            while bi + 2 <= blocks {
                let b0 = w.add(bi * F::BYTES);
                let b1 = b0.add(F::BYTES);
                prefetch::<F>(b0);
                prefetch::<F>(b1);
                fma_group::<MR, 0>(a, x, ldx, bi * 32, F::group(b0, &F::head(b0), 0));
                fma_group::<MR, 2>(a, x, ldx, bi * 32 + 32, F::group(b1, &F::head(b1), 0));
                bi += 2;
            }
            if bi < blocks {
                let b = w.add(bi * F::BYTES);
                fma_group::<MR, 0>(a, x, ldx, bi * 32, F::group(b, &F::head(b), 0));
            }
        } else {
            // An even number of groups per block: a block's group g has the parity of g.
            for bi in 0..k / (32 * F::GROUPS) {
                let b = w.add(bi * F::BYTES);
                prefetch::<F>(b);
                let head = F::head(b);
                for g in (0..F::GROUPS).step_by(2) {
                    let kk = (bi * F::GROUPS + g) * 32;
                    fma_group::<MR, 0>(a, x, ldx, kk, F::group(b, &head, g));
                    fma_group::<MR, 2>(a, x, ldx, kk + 32, F::group(b, &head, g + 1));
                }
            }
        }
        acc.map(|a| finish(&a))
    }

    /// A row's four accumulators summed: the one reduction both paths use.
    #[inline(always)]
    unsafe fn finish(a: &[__m512; 4]) -> f32 {
        let lo = _mm512_add_ps(a[0], a[2]);
        let hi = _mm512_add_ps(a[1], a[3]);
        _mm512_reduce_add_ps(_mm512_add_ps(lo, hi))
    }

    /// Decodes one weight row of `k` elements into `out` in pass order with the same group
    /// decoders as [`run`], so the stored values are the ones it multiplies.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn decode<F: Format>(w: *const u8, k: usize, out: *mut f32) {
        for bi in 0..k / (32 * F::GROUPS) {
            let b = w.add(bi * F::BYTES);
            let head = F::head(b);
            for g in 0..F::GROUPS {
                let (w0, w1) = F::group(b, &head, g);
                let kk = (bi * F::GROUPS + g) * 32;
                _mm512_storeu_ps(out.add(super::pass_index(k, kk)), w0);
                _mm512_storeu_ps(out.add(super::pass_index(k, kk + 16)), w1);
            }
        }
    }

    /// One pass of [`tile`] over `start..start + len` (pass order): one accumulator of every
    /// (activation row, weight row) pair.
    #[inline(always)]
    unsafe fn tile_pass<const MR: usize>(
        x: *const f32,
        ldx: usize,
        w: [*const f32; super::TILE_COLS],
        (start, len): (usize, usize),
    ) -> [[__m512; super::TILE_COLS]; MR] {
        let mut a = [[_mm512_setzero_ps(); super::TILE_COLS]; MR];
        let mut kk = start;
        while kk < start + len {
            let wv = w.map(|r| _mm512_loadu_ps(r.add(kk)));
            for (i, ai) in a.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(i * ldx + kk));
                for (aij, wj) in ai.iter_mut().zip(&wv) {
                    *aij = _mm512_fmadd_ps(*wj, xv, *aij);
                }
            }
            kk += 16;
        }
        a
    }

    /// Prefill over decoded weights: `out[i·ldo + j] = x[i] · w[j]` for `MR` activation rows
    /// and four weight rows, all in pass order, with the bits [`run`] gives. Each of a pair's
    /// four accumulators (the halves of each 32-element group, even and odd groups apart)
    /// takes the same fused multiply-adds in the same order as there, and the same final sum;
    /// being independent of each other, they are summed in four passes, each over a
    /// contiguous stretch of every row, with one accumulator per pair live: 24 in registers,
    /// 24 multiply-adds per 10 loads.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn tile<const MR: usize>(
        x: *const f32,
        ldx: usize,
        w: [*const f32; super::TILE_COLS],
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let p = super::passes(k);
        let a0 = tile_pass::<MR>(x, ldx, w, p[0]);
        let a1 = tile_pass::<MR>(x, ldx, w, p[1]);
        let a2 = tile_pass::<MR>(x, ldx, w, p[2]);
        let a3 = tile_pass::<MR>(x, ldx, w, p[3]);
        for i in 0..MR {
            for j in 0..super::TILE_COLS {
                *out.add(i * ldo + j) = finish(&[a0[i][j], a1[i][j], a2[i][j], a3[i][j]]);
            }
        }
    }
}

#[cfg(test)]
#[path = "qdot_tests.rs"]
mod tests;
