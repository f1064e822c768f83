//! The integer kernel for Q4_K weights kept 16 rows interleaved (`qdot_x16`'s layout), on
//! AVX-512 CPUs with VNNI: the same bytes as the f32 kernel there, a third of its
//! instructions.
//!
//! The f32 kernel spends a shift, a permute and a multiply-add on every column of 16 weights.
//! Here the activations are split into three signed bytes as for the file-layout integer
//! kernels (`qdot_int::split_row`, 22-bit integers with a scale per group of 32: `x_j = s ·
//! (t2_j · 2¹⁶ + t1_j · 2⁸ + t0_j) + ε_j`, `s` a power of two, `|ε_j| ≤ 2⁻²² · M` for the
//! group's largest `|x|`, `|x_q| ≤ 2²²`), and `vpdpbusd` multiplies a lane's four 4-bit codes
//! (unsigned bytes, masked out of the lane's eight nibbles) by four digits of one activation
//! row (broadcast) and adds the four products into the lane: 64 weights of 16 rows an
//! instruction. A packed lane holds elements `8v + j` at bits `4j`, so its low nibbles are
//! elements `8v + 0, 2, 4, 6` and its high ones `8v + 1, 3, 5, 7`; the split row is rearranged
//! once per call into that order ([`split_rows`]).
//!
//! # The bound
//! A group of 32 columns is summed by Horner's rule over the digits: every lane first adds
//! `Σ q · t2`, is shifted left 8 bits, adds `Σ q · t1`, is shifted again and adds `Σ q · t0`,
//! which is `Σ q · x_q` exactly. No value wraps: after the second stage a lane holds
//! `Σ q · (x_q − t0)`, and `|x_q − t0| ≤ 2²² + 128`, so every stage is within `32 · 15 ·
//! (2²² + 128) < 2³¹` (at most 32 codes of at most 15); partial lanes (several accumulators
//! a row where few rows leave the multiplier idle) are sums over fewer columns, within the
//! same bound, and their integer sum is the same whatever the split. The group's integer
//! converts to f32 once (a relative 2⁻²⁴), is multiplied by `d · scale · s` (exact: an f16
//! times a 6-bit integer times the group's power of two) and added to the row's total; the minimums
//! come from the activations' f32 group sums as in the f32 kernel. So a row's error is the
//! split's `Σ_groups 2⁻²² · M_g · Σ_g |d · scale · q|` plus f32 roundings of the same kind as
//! the f32 kernel's (a conversion and a multiply-add a group), which the tests hold every
//! row to against an f64 dot.
//!
//! # Same bits in every batch
//! Decode and prefill (up to six activation rows a call, each code unpacked once for all of
//! them) run the same integer sums and the same f32 operations in the same order for a row.

use super::qdot_int::{self, Split};
use crate::tensor::DType;

/// Activation rows one kernel call covers at most.
pub(crate) const MAX_ROWS: usize = 6;

/// Whether interleaved `dtype` weights go through this kernel on this CPU (the storage has
/// interleaved them, so AVX-512 is present).
pub(crate) fn supported(dtype: DType) -> bool {
    dtype == DType::Q4_K && super::qdot_vnni::has_vnni()
}

/// Bytes of one activation row as [`split_rows`] leaves it: for each 32-element group its
/// digits t2, t1 and t0, 32 bytes each in the lanes' order (for `v` in 0..4: elements `8v + 0,
/// 2, 4, 6`, then `8v + 1, 3, 5, 7`), then the groups' scales `s` as f32 (`k / 32`), the
/// whole padded to 64 bytes.
pub(crate) fn row_bytes(k: usize) -> usize {
    (100 * (k / 32)).next_multiple_of(64)
}

/// The split: 22-bit integers with a scale per group of 32 (an outlier coarsens only its own
/// group's steps).
pub(crate) const SPLIT: Split = Split {
    q_bits: 22,
    group_scales: true,
};

/// Where group `g`'s digits begin in a split row, and where its scale lies.
const fn digits_at(g: usize) -> usize {
    96 * g
}
const fn scale_at(k: usize, g: usize) -> usize {
    96 * (k / 32) + 4 * g
}

/// Splits the rows of `x` (each `k` long, `k` a multiple of 256) into `out` ([`row_bytes`]
/// each), through `scratch`.
pub(crate) fn split_rows(x: &[f32], k: usize, scratch: &mut Vec<u8>, out: &mut Vec<u8>) {
    let rb = row_bytes(k);
    out.clear();
    if k == 0 || !k.is_multiple_of(256) {
        return;
    }
    out.resize(x.len() / k * rb, 0);
    scratch.clear();
    scratch.resize(qdot_int::row_bytes(k), 0);
    // The block scales in `qdot_int`'s row: after the digits and the sums of 32 and 16.
    let scales = 3 * k + 4 * (k / 32) + 4 * (k / 16);
    for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        qdot_int::split_row(row, scratch, SPLIT);
        for g in 0..k / 32 {
            for t in 0..3 {
                let src = &scratch[qdot_int::digit_at(g, 2 - t)..][..32];
                let d = &mut dst[digits_at(g) + 32 * t..][..32];
                for (d, s) in d.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                    let w = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
                    d.copy_from_slice(&lanes_order(w).to_le_bytes());
                }
            }
        }
        let n = 4 * (k / 32);
        dst[scale_at(k, 0)..][..n].copy_from_slice(&scratch[scales..][..n]);
    }
}

/// Eight bytes `b0..b7` as `b0 b2 b4 b6 b1 b3 b5 b7`.
fn lanes_order(w: u64) -> u64 {
    let even = |mut x: u64| {
        x &= 0x00FF_00FF_00FF_00FF;
        x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
        (x | (x >> 16)) & 0xFFFF_FFFF
    };
    even(w) | (even(w >> 8) << 32)
}

/// `y[i·ldy + r] = x_i · W_r` for the `mr` (1..=6) rows split by [`split_rows`] at `x`
/// (stride `ldx` bytes) and the weight rows of the interleaved groups `groups` (rows `16g..16g
/// + 16`); `xs` holds each row's f32 group sums (`qdot_x16::block_sums`) at stride `ldxs`.
///
/// # Safety
/// [`supported`] holds for `dtype`, the weights are interleaved Q4_K (`qdot_x16::pack`) with
/// `k` a multiple of 256 and hold the groups; `x` and `xs` hold `mr` rows as described; `y`
/// is writable at `mr` rows of stride `ldy` at the groups' columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dots(
    (x, ldx, xs, ldxs): (*const u8, usize, *const f32, usize),
    mr: usize,
    k: usize,
    w: *const u8,
    groups: std::ops::Range<usize>,
    (y, ldy): (*mut f32, usize),
) {
    debug_assert!((1..=MAX_ROWS).contains(&mr) && k.is_multiple_of(256));
    #[cfg(target_arch = "x86_64")]
    {
        let a = x86::Args {
            x,
            ldx,
            xs,
            ldxs,
            k,
            w,
            y,
            ldy,
        };
        // Few rows leave the multiplier idle on one chain of sums: more chains a row.
        match mr {
            1 => x86::run::<1, 4>(&a, groups),
            2 => x86::run::<2, 2>(&a, groups),
            3 => x86::run::<3, 2>(&a, groups),
            4 => x86::run::<4, 1>(&a, groups),
            5 => x86::run::<5, 1>(&a, groups),
            _ => x86::run::<6, 1>(&a, groups),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, ldx, xs, ldxs, mr, k, w, groups, y, ldy);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::qdot_x16::x86::{q4k_factors, q4k_head, Q4kHead, PREFETCH};
    use super::{digits_at, scale_at};
    use std::arch::x86_64::*;

    /// A call's pointers and strides.
    pub(super) struct Args {
        pub x: *const u8,
        pub ldx: usize,
        pub xs: *const f32,
        pub ldxs: usize,
        pub k: usize,
        pub w: *const u8,
        pub y: *mut f32,
        pub ldy: usize,
    }

    /// Q4_K's packed block: the 16 rows' heads, then 8 groups of four 64-byte vectors.
    const HEAD: usize = 256;
    const BLOCK: usize = HEAD + 8 * 256;

    /// Group `g` of the block at `hp` (global group `gi`) for every activation row, into
    /// `tot`, with `P` chains of sums a row.
    #[inline(always)]
    unsafe fn block_group<const MR: usize, const P: usize>(
        a: &Args,
        (hp, head, gi): (*const u8, &Q4kHead, usize),
        g: usize,
        tot: &mut [__m512; MR],
    ) {
        let low = _mm512_set1_epi8(0x0F);
        let mut c = [_mm512_setzero_si512(); 8];
        for v in 0..4 {
            let p = hp.add(HEAD + 256 * g + 64 * v);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            let nib = _mm512_loadu_si512(p as *const _);
            c[2 * v] = _mm512_and_si512(nib, low);
            c[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(nib), low);
        }
        let mut acc = [[_mm512_setzero_si512(); P]; MR];
        for t in 0..3 {
            if t > 0 {
                for chains in acc.iter_mut() {
                    for ch in chains.iter_mut() {
                        *ch = _mm512_slli_epi32::<8>(*ch);
                    }
                }
            }
            for (i, chains) in acc.iter_mut().enumerate() {
                let xq = a.x.add(i * a.ldx + digits_at(gi) + 32 * t) as *const i32;
                for (q, c) in c.iter().enumerate() {
                    let xb = _mm512_set1_epi32(xq.add(q).read_unaligned());
                    chains[q % P] = _mm512_dpbusd_epi32(chains[q % P], *c, xb);
                }
            }
        }
        let (f, m) = q4k_factors(head, g);
        for (i, (t, chains)) in tot.iter_mut().zip(&acc).enumerate() {
            let mut sum = chains[0];
            for ch in &chains[1..] {
                sum = _mm512_add_epi32(sum, *ch);
            }
            let s = (a.x.add(i * a.ldx + scale_at(a.k, gi)) as *const f32).read_unaligned();
            let fs = _mm512_mul_ps(f, _mm512_set1_ps(s));
            *t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), fs, *t);
            let xs = _mm512_set1_ps(*a.xs.add(i * a.ldxs + gi));
            *t = _mm512_fmadd_ps(m, xs, *t);
        }
    }

    /// The 16 rows of group `g0` against `MR` activation rows.
    #[inline(always)]
    unsafe fn group<const MR: usize, const P: usize>(a: &Args, g0: usize) {
        let nb = a.k / 256;
        let mut tot = [_mm512_setzero_ps(); MR];
        let base = a.w.add(g0 * nb * BLOCK);
        for b in 0..nb {
            let hp = base.add(b * BLOCK);
            let head = q4k_head(hp);
            let t = &mut tot;
            block_group::<MR, P>(a, (hp, &head, 8 * b), 0, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 1), 1, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 2), 2, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 3), 3, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 4), 4, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 5), 5, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 6), 6, t);
            block_group::<MR, P>(a, (hp, &head, 8 * b + 7), 7, t);
        }
        for (i, t) in tot.iter().enumerate() {
            _mm512_storeu_ps(a.y.add(i * a.ldy + 16 * g0), *t);
        }
    }

    /// The groups of rows in `range`, one at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run<const MR: usize, const P: usize>(
        a: &Args,
        range: std::ops::Range<usize>,
    ) {
        for g in range {
            group::<MR, P>(a, g);
        }
    }
}
