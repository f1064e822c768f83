//! The integer kernel's formats with blocks of 32: Q4_0, Q4_1, Q5_0 and Q5_1 (`qdot_x16i`'s
//! module comment has their sums and bound, "Blocks of 32").

use super::offsets_at;
use super::x86::{codes_nibbles, run_plain, run_vbmi, scale, Args, Format};
use std::arch::x86_64::*;

/// A packed block of 32's head (Q4_0, Q4_1, Q5_0, Q5_1): the 16 rows' d, their minimum
/// less the codes' offset (Q4_1, Q5_1: `m + c · d`, see `offset`) and their fifth bits
/// (Q5_0, Q5_1: bit `l` of a lane is element l's), zero where the format has none.
pub(super) type BlockHead = (__m512, __m512, __m512i);

/// The head at `hp` of a block with (`M`) minimums and (`H`) fifth bits and codes offset by
/// `C`: d's 16 f16, then m's, then the fifth bits' 16 words.
#[inline(always)]
unsafe fn block_head<const M: bool, const H: bool, const C: i32>(hp: *const u8) -> BlockHead {
    let f16s = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(hp.add(at) as *const __m256i));
    let d = f16s(0);
    let m = if M {
        _mm512_fmadd_ps(d, _mm512_set1_ps(C as f32), f16s(32))
    } else {
        _mm512_setzero_ps()
    };
    let h = if H {
        _mm512_loadu_si512(hp.add(if M { 64 } else { 32 }) as *const _)
    } else {
        _mm512_setzero_si512()
    };
    (d, m, h)
}

/// The codes of a block of 32 with fifth bits `qh` (a word a row): code vector `2v + o`'s
/// byte `b` in a lane is element `8v + 2b + o`, whose fifth bit is bit `8v + 2b + o` of the
/// lane's word. A byte-wise multishift takes for byte `j` of each 64-bit pair of lanes the
/// eight bits from `32 · (j / 4) + 8v + 2 (j % 4) + o − 4` (modulo 64), which puts that
/// bit at bit 4; masked, it is merged above the nibble (`(a & 0x0F) | b`: 0xEC).
#[inline(always)]
unsafe fn codes_fifth(p: *const u8, qh: __m512i) -> [__m512i; 8] {
    let low = _mm512_set1_epi8(0x0F);
    let five = _mm512_set1_epi8(0x10);
    let mut c = [_mm512_setzero_si512(); 8];
    for v in 0..4 {
        let nib = _mm512_loadu_si512(p.add(64 * v) as *const _);
        for o in 0..2 {
            let mut ctl = 0u64;
            for j in 0..8 {
                let at = (32 * (j / 4) + 8 * v + 2 * (j % 4) + o + 60) % 64;
                ctl |= (at as u64) << (8 * j);
            }
            let ms = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(ctl as i64), qh);
            let part = _mm512_and_si512(ms, five);
            let n = if o == 0 {
                nib
            } else {
                _mm512_srli_epi16::<4>(nib)
            };
            c[2 * v + o] = _mm512_ternarylogic_epi32::<0xEC>(n, part, low);
        }
    }
    c
}

/// Adds to `tot` the group sums of a block of 32 (global group `gi`) less `c · Σ x_q` (the
/// split row's two halves of 16, their sum within 2³¹ and the difference, `Σ (q − c) ·
/// x_q`, within 2³⁰: see `offset`) times `d · s`, plus `(m + c · d) · Σ x` where the
/// format has minimums (`M`).
#[inline(always)]
unsafe fn finish_block<const MR: usize, const M: bool>(
    a: &Args,
    sums: &[[__m512i; 2]; MR],
    (d, m, _): &BlockHead,
    gi: usize,
    tot: &mut [__m512; MR],
) {
    for (i, (t, sum)) in tot.iter_mut().zip(sums).enumerate() {
        let off = a.x.add(i * a.ldx + offsets_at(a.k, gi)) as *const i32;
        let c = off
            .read_unaligned()
            .wrapping_add(off.add(1).read_unaligned());
        let q = _mm512_sub_epi32(sum[0], _mm512_set1_epi32(c));
        let ds = _mm512_mul_ps(*d, scale(a, i, gi));
        *t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), ds, *t);
        if M {
            let xs = _mm512_set1_ps(*a.xs.add(i * a.ldxs + gi));
            *t = _mm512_fmadd_ps(*m, xs, *t);
        }
    }
}

/// The formats with blocks of 32: `$name`, with or without minimums and fifth bits, its
/// codes offset by `C` (`offset`).
macro_rules! block_format {
    ($name:ident, $doc:literal, M = $m:literal, H = $h:literal, C = $c:literal) => {
        #[doc = $doc]
        pub struct $name;
        impl Format for $name {
            const HEAD: usize = 32 + 32 * $m as usize + 64 * $h as usize;
            const GROUPS: usize = 1;
            const GROUP: usize = 256;
            const HALVES: usize = 1;
            type Head = BlockHead;
            #[inline(always)]
            unsafe fn head(hp: *const u8) -> BlockHead {
                block_head::<$m, $h, $c>(hp)
            }
            #[inline(always)]
            unsafe fn codes(p: *const u8, head: &BlockHead) -> [__m512i; 8] {
                if $h {
                    codes_fifth(p, head.2)
                } else {
                    codes_nibbles(p)
                }
            }
            #[inline(always)]
            unsafe fn finish<const MR: usize>(
                a: &Args,
                sums: &[[__m512i; 2]; MR],
                head: &BlockHead,
                (_, gi): (usize, usize),
                tot: &mut [__m512; MR],
            ) {
                finish_block::<MR, $m>(a, sums, head, gi, tot)
            }
            #[inline(always)]
            unsafe fn run<const MR: usize, const P: usize>(
                a: &Args,
                range: std::ops::Range<usize>,
            ) {
                if $h {
                    run_vbmi::<Self, MR, P>(a, range)
                } else {
                    run_plain::<Self, MR, P>(a, range)
                }
            }
        }
    };
}
block_format!(
    Q40,
    "Q4_0 packed: d and the nibbles.",
    M = false,
    H = false,
    C = 8
);
block_format!(
    Q41,
    "Q4_1 packed: d, m and the nibbles.",
    M = true,
    H = false,
    C = 8
);
block_format!(
    Q50,
    "Q5_0 packed: d, the fifth bits and the nibbles.",
    M = false,
    H = true,
    C = 16
);
block_format!(
    Q51,
    "Q5_1 packed: d, m, the fifth bits and the nibbles.",
    M = true,
    H = true,
    C = 16
);
