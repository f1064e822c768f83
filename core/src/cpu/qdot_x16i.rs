//! The integer kernel for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL and IQ4_XS
//! weights kept 16 rows interleaved (`qdot_x16`'s layout), on AVX-512 CPUs with VNNI (and
//! VBMI for Q5_0 and Q5_1): for Q4_K the same bytes as the f32 kernel there, a third of its
//! instructions; Q5_K, Q6_K and (packed in lanes for this kernel) Q8_0 have no other
//! interleaved kernel there.
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
//! times a 6-bit integer times the group's power of two) and added to the row's total; the
//! minimums come from the activations' f32 group sums as in the f32 kernel. So a row's error is the
//! split's `Σ_groups 2⁻²² · M_g · Σ_g |d · scale · q|` plus f32 roundings of the same kind as
//! the f32 kernel's (a conversion and a multiply-add a group), which the tests hold every
//! row to against an f64 dot.
//!
//! # Q5_K
//! Q4_K's blocks with 5-bit codes, `q = nibble + 16 · fifth bit` (the bits packed beside the
//! nibbles, `qdot_x16::hi_at`, moved to bit 4 of each code byte by a shift and a masked
//! merge): the same sums with 21-bit integers (`|x_q| ≤ 2²¹`, `|ε_j| ≤ 2⁻²¹ · M`), every stage
//! within `32 · 31 · (2²¹ + 128) < 2³¹`.
//!
//! # Q6_K
//! Its codes are 6 bits, `q = nibble + 16 · high` (2-bit high parts, packed and merged as
//! Q5_K's fifth bits), `w = d · scale · (q − 32)` with a scale per 16 elements. A group's two halves are summed
//! apart, with 21-bit integers (`|x_q| ≤ 2²¹`, `|ε_j| ≤ 2⁻²¹ · M`): every stage within `16 · 63
//! · (2²¹ + 128) < 2³¹`. The offset is integer too: the split row holds `32 · Σ x_q` over each
//! 16 (`|·| ≤ 2³⁰`), subtracted from the half's sum, which leaves `Σ (q − 32) · x_q` exactly
//! (`|·| ≤ 2³⁰`). The halves convert to f32, are multiplied by `d · scale` (exact: an f16
//! times an 8-bit integer) and added (two roundings), and their sum is multiplied by the
//! group's `s` and added to the row's total.
//!
//! # Q8_0, IQ4_NL and IQ4_XS
//! Codes of 8 bits (or levels of 8 bits looked up by 4-bit codes): their own formats, sums and
//! bound, in `qdot_x16i_bytes.rs`.
//!
//! # Blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1)
//! A block is one group: the sums as Q4_K's (22-bit integers for the 4-bit codes, 21 for the
//! 5-bit ones, every stage within `32 · 31 · (2²¹ + 128) < 2³¹`), Q5's fifth bits moved beside
//! the nibbles by a byte multishift. The codes are centred, `q − c` for c = 8 or 16: the split
//! row's `c · Σ x_q` (two i32 halves, see [`offset`]) is subtracted from the group's integer,
//! which leaves `Σ (q − c) · x_q` exactly (within 2³⁰), then one conversion and one multiply-add
//! by `d · s` (exact: an f16 times a power of two). Q4_1's and Q5_1's minimums become `m + c ·
//! d` (one rounding a block) times the f32 group sum, as Q4_K's.
//!
//! # Same bits in every batch
//! Decode and prefill (up to eight activation rows a call, each code unpacked once for all of
//! them) run the same integer sums and the same f32 operations in the same order for a row.

use super::qdot_int::{self, Split};
use crate::tensor::DType;

/// Activation rows one kernel call covers at most: eight accumulators beside a group's eight
/// code vectors (1 B Llama Q4_K pp512, one thread, medians of 3 alternating runs: 109.4 t/s at
/// six rows against 117.6 at eight; 105.9 at ten, which spills, against 120.0 at eight). The
/// f32 kernel for the other interleaved formats keeps `qdot_x16::MAX_ROWS`.
pub(crate) const MAX_ROWS: usize = 8;

/// Whether interleaved `dtype` weights can go through this kernel on this CPU (the storage
/// interleaves the 4- and 5-bit formats on AVX-512, Q5_K and Q6_K only where this holds; the
/// others take `qdot_x16f` where it does not, or where [`runs`] does not hold).
pub(crate) fn supported(dtype: DType) -> bool {
    split(dtype).is_some()
        && super::qdot_vnni::has_vnni()
        && (!matches!(dtype, DType::Q5_0 | DType::Q5_1) || has_vbmi())
}

/// Whether a `dtype` matrix with rows of `k` goes through this kernel here (its layout's
/// blocks whole, and `k` a multiple of 64 for the split).
pub(crate) fn runs(dtype: DType, k: usize) -> bool {
    supported(dtype) && k > 0 && k.is_multiple_of(64) && k.is_multiple_of(block_len(dtype))
}

/// Elements of a block of `dtype` (256 for the K-quants, else 32).
fn block_len(dtype: DType) -> usize {
    if matches!(
        dtype,
        DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS
    ) {
        256
    } else {
        32
    }
}

/// Q5_0's and Q5_1's fifth bits reach their codes by a byte-wise multishift (AVX-512 VBMI).
fn has_vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The offset `c` the kernel takes from the codes (Q6_K's `q − 32` with 21-bit integers,
/// Q4_0's and Q4_1's `q − 8` with 22, Q5_0's and Q5_1's `q − 16` with 21, the byte codes'
/// flipped top bit `u − 128` with 22): the split rows carry `c · Σ x_q` over each 16
/// elements, within `c · 16 · 2^q_bits ≤ 2³⁰`, and a group of 32's two within 2³¹; for the
/// byte codes (Q8_0, IQ4_NL, IQ4_XS: [`offsets`]) `c · Σ (t2 · 2⁸ + t1)` and `c · Σ t0` over
/// the group instead. Q4_1 and Q5_1 have no offset but a minimum `m`: `d · q + m = d · (q −
/// c) + (m + c · d)`, codes centred on zero with a minimum near it, which halves the weight
/// magnitude the split's error scales with (`Σ |d · (q − c)|` against `Σ |d · q|`) and the
/// cancellation between the sums and the minimums' term (SmolLM2 with Q5_1 matrices:
/// 4.8e-4 → 1.5e-4 of the f64 logits; Q4_1 2.4e-4 → 1.1e-4).
fn offset(dtype: DType) -> Option<i32> {
    match dtype {
        DType::Q6_K => Some(32),
        DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS => Some(128),
        DType::Q4_0 | DType::Q4_1 => Some(8),
        DType::Q5_0 | DType::Q5_1 => Some(16),
        _ => None,
    }
}

/// The activations' split for `dtype`: integers with a scale per group of 32 (an outlier
/// coarsens only its own group's steps), 22 bits for the 4-bit codes and the byte codes
/// (whose last digit is summed apart), 21 for the 5- and 6-bit ones (the module's bounds).
pub(crate) fn split(dtype: DType) -> Option<Split> {
    let q_bits = match dtype {
        DType::Q4_0 | DType::Q4_1 | DType::Q4_K | DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS => 22,
        DType::Q5_0 | DType::Q5_1 | DType::Q5_K | DType::Q6_K => 21,
        _ => return None,
    };
    Some(Split {
        q_bits,
        group_scales: true,
    })
}

/// Bytes of one activation row as [`split_rows`] leaves it: for each 32-element group its
/// digits t2, t1 and t0, 32 bytes each in the lanes' order (for `v` in 0..4: elements `8v + 0,
/// 2, 4, 6`, then `8v + 1, 3, 5, 7`); then the groups' scales `s` as f32 (`k / 32`); then the
/// offset formats' `c · Σ x_q` over each 16 elements as i32 (`k / 16`, see [`offset`]); the
/// whole padded to 64 bytes.
pub(crate) fn row_bytes(k: usize) -> usize {
    (108 * (k / 32)).next_multiple_of(64)
}

/// Where group `g`'s digits begin in a split row, where its scale lies, and its offsets.
const fn digits_at(g: usize) -> usize {
    96 * g
}
const fn scale_at(k: usize, g: usize) -> usize {
    96 * (k / 32) + 4 * g
}
const fn offsets_at(k: usize, g: usize) -> usize {
    100 * (k / 32) + 8 * g
}

/// Splits the rows of `x` (each `k` long, `k` a multiple of 64) for `dtype`'s kernel into
/// `out` ([`row_bytes`] each; bytes no kernel reads, such as the padding, are left as they
/// were), on the current pool's threads for many rows.
pub(crate) fn split_rows(x: &[f32], k: usize, dtype: DType, out: &mut Vec<u8>) {
    let rb = row_bytes(k);
    let Some(how) = split(dtype) else {
        out.clear();
        return;
    };
    if k == 0 || !k.is_multiple_of(64) {
        out.clear();
        return;
    }
    let n = x.len() / k * rb;
    if out.len() < n {
        out.resize(n, 0);
    }
    out.truncate(n);
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Eight rows or more in parallel (a prompt's: split serially, they cost 5 % of a 135 M
    // model's prefill on two threads).
    super::pool::par_rows(out, rb, 8 * rb, |first, part| {
        SCRATCH.with(|c| {
            let mut scratch = c.borrow_mut();
            if scratch.len() < qdot_int::row_bytes(k) {
                scratch.resize(qdot_int::row_bytes(k), 0);
            }
            for (i, dst) in part.chunks_exact_mut(rb).enumerate() {
                let row = &x[(first + i) * k..][..k];
                split_one(row, dtype, how, &mut scratch, dst);
            }
        })
    });
}

/// One row of [`split_rows`], through `scratch` (`qdot_int`'s row).
fn split_one(row: &[f32], dtype: DType, how: Split, scratch: &mut [u8], dst: &mut [u8]) {
    let k = row.len();
    // The group scales in `qdot_int`'s row: after the digits and the sums of 32 and 16.
    let scales = 3 * k + 4 * (k / 32) + 4 * (k / 16);
    qdot_int::split_row(row, scratch, how);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2")
        && scratch.len() >= 3 * k
        && dst.len() >= offsets_at(k, k / 32)
    {
        // SAFETY: AVX2 is present; the lengths are as `arrange_avx2` needs.
        unsafe { x86::arrange_avx2(scratch, dst, k, offsets(dtype)) };
    } else {
        arrange(scratch, dst, k, offsets(dtype));
    }
    #[cfg(not(target_arch = "x86_64"))]
    arrange(scratch, dst, k, offsets(dtype));
    let n = 4 * (k / 32);
    dst[scale_at(k, 0)..][..n].copy_from_slice(&scratch[scales..][..n]);
}

/// The offsets a format's split rows carry: `c` ([`offset`]), and whether by digit (the byte
/// codes, whose last digit the kernel sums apart: `c · Σ (t2 · 2⁸ + t1)` and `c · Σ t0` over
/// each group, `qdot_x16i_bytes.rs`) rather than by half.
fn offsets(dtype: DType) -> Option<(i32, bool)> {
    let by_digit = matches!(dtype, DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS);
    offset(dtype).map(|c| (c, by_digit))
}

/// The digits of `qdot_int`'s split row `scratch` (`k` elements) into `dst` in the lanes'
/// order, and where the format's codes are offset by `c`, the groups' `c · Σ x_q` over each
/// 16 elements (or by digit, [`offsets`]): a byte at a time, the definition
/// `x86::arrange_avx2` must match.
fn arrange(scratch: &[u8], dst: &mut [u8], k: usize, c: Option<(i32, bool)>) {
    for g in 0..k / 32 {
        for t in 0..3 {
            let src = &scratch[qdot_int::digit_at(g, 2 - t)..][..32];
            let d = &mut dst[digits_at(g) + 32 * t..][..32];
            for (d, s) in d.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                let w = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
                d.copy_from_slice(&lanes_order(w).to_le_bytes());
            }
        }
        if let Some((c, by_digit)) = c {
            let t = |t: usize| &scratch[qdot_int::digit_at(g, t)..][..32];
            let (t0, t1, t2) = (t(0), t(1), t(2));
            if by_digit {
                // |Σ (t2 · 2⁸ + t1)| ≤ 32 · (2¹⁴ + 128), |Σ t0| ≤ 32 · 128: times c = 128
                // within 2²⁷ and 2¹⁹.
                let d = |b: &[u8], j: usize| b[j] as i8 as i32;
                let hi: i32 = (0..32).map(|j| d(t2, j) * 256 + d(t1, j)).sum();
                let lo: i32 = (0..32).map(|j| d(t0, j)).sum();
                for (h, v) in [hi, lo].into_iter().enumerate() {
                    dst[offsets_at(k, g) + 4 * h..][..4].copy_from_slice(&(c * v).to_le_bytes());
                }
                continue;
            }
            for h in 0..2 {
                // |Σ x_q| ≤ 16 · 2^q_bits: c times it within 2³⁰ (`offset`).
                let mut sum = 0i32;
                for j in 16 * h..16 * h + 16 {
                    let d = |b: &[u8]| b[j] as i8 as i32;
                    sum += d(t2) * 65536 + d(t1) * 256 + d(t0);
                }
                dst[offsets_at(k, g) + 4 * h..][..4].copy_from_slice(&(c * sum).to_le_bytes());
            }
        }
    }
}

/// Eight bytes `b0..b7` as `b0 b2 b4 b6 b1 b3 b5 b7`.
fn lanes_order(w: u64) -> u64 {
    use super::qdot_x16::even_bytes;
    even_bytes(w) as u64 | (even_bytes(w >> 8) as u64) << 32
}

/// `y[i·ldy + r] = x_i · W_r` for the `mr` (1..=6) rows split by [`split_rows`] for `dtype`
/// at `x` (stride `ldx` bytes) and the weight rows of the interleaved groups `groups` (rows
/// `16g..16g + 16`); `xs` holds each row's f32 group sums (`qdot_x16::block_sums`, read for
/// the minimums of Q4_1, Q5_1, Q4_K and Q5_K) at stride `ldxs`.
///
/// # Safety
/// [`runs`] holds for `dtype` and `k`, the weights are interleaved `dtype` (`qdot_x16::pack`)
/// and hold the groups; `x` and `xs` hold `mr` rows as described;
/// `y` is writable at `mr` rows of stride `ldy` at the groups' columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dots(
    dtype: DType,
    (x, ldx, xs, ldxs): (*const u8, usize, *const f32, usize),
    mr: usize,
    k: usize,
    w: *const u8,
    groups: std::ops::Range<usize>,
    (y, ldy): (*mut f32, usize),
) {
    debug_assert!((1..=MAX_ROWS).contains(&mr) && runs(dtype, k));
    #[cfg(target_arch = "x86_64")]
    {
        use x86::*;
        let a = Args {
            x,
            ldx,
            xs,
            ldxs,
            k,
            w,
            y,
            ldy,
            l2: super::simd::prefetch_to_l2(),
        };
        // Few rows leave the multiplier idle on one chain of sums: more chains a row (Q6_K's
        // two halves are two chains already).
        macro_rules! go {
            // Chains a row for 1, 2..3 and 4..6 rows.
            ($f:ty, $p1:literal, $p2:literal) => {
                match mr {
                    1 => <$f>::run::<1, $p1>(&a, groups),
                    2 => <$f>::run::<2, $p2>(&a, groups),
                    3 => <$f>::run::<3, $p2>(&a, groups),
                    4 => <$f>::run::<4, 1>(&a, groups),
                    5 => <$f>::run::<5, 1>(&a, groups),
                    6 => <$f>::run::<6, 1>(&a, groups),
                    7 => <$f>::run::<7, 1>(&a, groups),
                    _ => <$f>::run::<8, 1>(&a, groups),
                }
            };
        }
        match dtype {
            DType::Q4_K => go!(Q4K, 2, 2),
            DType::Q5_K => go!(Q5K, 2, 2),
            DType::Q6_K => go!(Q6K, 2, 1),
            DType::Q8_0 => go!(Q80, 2, 1),
            DType::IQ4_NL => go!(Iq4Nl, 2, 1),
            DType::IQ4_XS => go!(Iq4Xs, 2, 1),
            DType::Q4_0 => go!(Q40, 2, 2),
            DType::Q4_1 => go!(Q41, 2, 2),
            DType::Q5_0 => go!(Q50, 2, 2),
            DType::Q5_1 => go!(Q51, 2, 2),
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, x, ldx, xs, ldxs, mr, k, w, groups, y, ldy);
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "qdot_x16i_blocks.rs"]
mod blocks;
#[cfg(target_arch = "x86_64")]
#[path = "qdot_x16i_bytes.rs"]
mod bytes;

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// [`super::arrange`] with AVX2: a byte shuffle a digit a group (the lanes' order is within
    /// each 8 bytes), and the sums of 16 digits by `vpsadbw` on the digits offset to unsigned
    /// (`t + 128`: less 16 · 128).
    ///
    /// # Safety
    /// AVX2 is present; `scratch` holds `qdot_int`'s digits of `k` elements (`3k` bytes),
    /// `dst` reaches the end of the offsets (`offsets_at(k, k / 32)`).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn arrange_avx2(
        scratch: &[u8],
        dst: &mut [u8],
        k: usize,
        c: Option<(i32, bool)>,
    ) {
        use super::{digits_at, offsets_at, qdot_int};
        debug_assert!(scratch.len() >= 3 * k && dst.len() >= offsets_at(k, k / 32));
        let order = _mm256_setr_epi8(
            0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10,
            12, 14, 9, 11, 13, 15,
        );
        let flip = _mm256_set1_epi8(-128);
        let (sp, dp) = (scratch.as_ptr(), dst.as_mut_ptr());
        for g in 0..k / 32 {
            // Per digit, the sums of its quarters of 8 bytes (as t + 128).
            let mut quarters = [[0i64; 4]; 3];
            for (t, q) in quarters.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(sp.add(qdot_int::digit_at(g, t)) as *const __m256i);
                let at = dp.add(digits_at(g) + 32 * (2 - t));
                _mm256_storeu_si256(at as *mut __m256i, _mm256_shuffle_epi8(v, order));
                if c.is_some() {
                    let sad = _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256());
                    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, sad);
                }
            }
            if let Some((c, true)) = c {
                let s = |t: usize| quarters[t].iter().sum::<i64>() as i32 - 4096;
                let o = dp.add(offsets_at(k, g)) as *mut i32;
                o.write_unaligned(c * (s(2) * 256 + s(1)));
                o.add(1).write_unaligned(c * s(0));
            } else if let Some((c, _)) = c {
                for h in 0..2 {
                    let s = |t: usize| (quarters[t][2 * h] + quarters[t][2 * h + 1]) as i32 - 2048;
                    let sum = s(2) * 65536 + s(1) * 256 + s(0);
                    let o = dp.add(offsets_at(k, g) + 4 * h) as *mut i32;
                    o.write_unaligned(c * sum);
                }
            }
        }
    }

    use super::super::qdot_x16f::x86::{q4k_factors, q4k_head, Q4kHead, PREFETCH};
    use super::{digits_at, offsets_at, scale_at};
    use crate::cpu::simd::prefetch_line;
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
        /// The far prefetches go to the second-level cache (`simd::prefetch_to_l2`).
        pub l2: bool,
    }

    /// A format as the kernel sees it: its packed block, its codes, and how a group's integer
    /// sums become the rows' totals.
    pub(super) trait Format {
        /// Bytes of the 16 rows' heads at the start of a packed block.
        const HEAD: usize;
        /// 32-element groups a block holds (8 for the K-quants, else 1).
        const GROUPS: usize;
        /// Packed bytes of a group of 32 elements (16 rows).
        const GROUP: usize;
        /// Sums a group keeps apart: 1, or 2 (halves of 16 elements, code vectors 0..4 and
        /// 4..8, or with `LAST_APART` the top two digits' and the last digit's).
        const HALVES: usize;
        /// Whether the last digit is summed apart (`sums[i][1]`) rather than by Horner's rule
        /// (the byte codes, whose 22-bit sums would not fit 32 bits).
        const LAST_APART: bool = false;
        type Head;
        unsafe fn head(hp: *const u8) -> Self::Head;
        /// The group's codes at `p` (of the block with `head`) as 8 vectors of bytes: vector
        /// `2v` holds elements `8v + 0, 2, 4, 6` of each row (lane), `2v + 1` elements `8v +
        /// 1, 3, 5, 7`.
        unsafe fn codes(p: *const u8, head: &Self::Head) -> [__m512i; 8];
        /// `tot[i] +=` the group's sums `sums[i][h]` (each half's `Σ q · x_q`), scaled; `at`
        /// is the group in its block and in the row.
        unsafe fn finish<const MR: usize>(
            a: &Args,
            sums: &[[__m512i; 2]; MR],
            head: &Self::Head,
            at: (usize, usize),
            tot: &mut [__m512; MR],
        );
        /// The groups of rows in `range`, through the entry with the CPU features the format
        /// needs.
        ///
        /// # Safety
        /// As `rows_dots`, and the features of the entry present.
        #[inline(always)]
        unsafe fn run<const MR: usize, const P: usize>(a: &Args, range: std::ops::Range<usize>)
        where
            Self: Sized,
        {
            run_plain::<Self, MR, P>(a, range)
        }
    }

    /// Row `i`'s scale of group `gi`, broadcast.
    #[inline(always)]
    pub(super) unsafe fn scale(a: &Args, i: usize, gi: usize) -> __m512 {
        let p = a.x.add(i * a.ldx + scale_at(a.k, gi)) as *const f32;
        _mm512_set1_ps(p.read_unaligned())
    }

    /// The codes of a group of nibbles (four vectors at `p`).
    #[inline(always)]
    pub(super) unsafe fn codes_nibbles(p: *const u8) -> [__m512i; 8] {
        let low = _mm512_set1_epi8(0x0F);
        let mut c = [_mm512_setzero_si512(); 8];
        for v in 0..4 {
            let nib = _mm512_loadu_si512(p.add(64 * v) as *const _);
            c[2 * v] = _mm512_and_si512(nib, low);
            c[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(nib), low);
        }
        c
    }

    pub struct Q4K;
    impl Format for Q4K {
        const HEAD: usize = 256;
        const GROUPS: usize = 8;
        const GROUP: usize = 256;
        const HALVES: usize = 1;
        type Head = Q4kHead;
        #[inline(always)]
        unsafe fn head(hp: *const u8) -> Q4kHead {
            q4k_head(hp)
        }
        #[inline(always)]
        unsafe fn codes(p: *const u8, _: &Q4kHead) -> [__m512i; 8] {
            codes_nibbles(p)
        }
        #[inline(always)]
        unsafe fn finish<const MR: usize>(
            a: &Args,
            sums: &[[__m512i; 2]; MR],
            head: &Q4kHead,
            (g, gi): (usize, usize),
            tot: &mut [__m512; MR],
        ) {
            let (f, m) = q4k_factors(head, g);
            for (i, (t, sum)) in tot.iter_mut().zip(sums).enumerate() {
                let fs = _mm512_mul_ps(f, scale(a, i, gi));
                *t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[0]), fs, *t);
                let xs = _mm512_set1_ps(*a.xs.add(i * a.ldxs + gi));
                *t = _mm512_fmadd_ps(m, xs, *t);
            }
        }
    }

    /// The codes of a group with `W`-bit high parts (`qdot_x16::hi_at`): code vector `2v +
    /// o` takes its parts from bits `W · (2 (v % (4 / W)) + o)` of high vector `v / (4 / W)`,
    /// moved to bit 4 by a shift, masked, and merged above the nibble (`(a & 0x0F) | b`:
    /// 0xEC).
    #[inline(always)]
    unsafe fn codes_high<const W: u32>(p: *const u8) -> [__m512i; 8] {
        let low = _mm512_set1_epi8(0x0F);
        let top = _mm512_set1_epi8((((1u32 << W) - 1) << 4) as i8);
        let per = 4 / W as usize;
        let mut c = [_mm512_setzero_si512(); 8];
        for v in 0..4 {
            let nib = _mm512_loadu_si512(p.add(64 * v) as *const _);
            let h = _mm512_loadu_si512(p.add(256 + 64 * (v / per)) as *const _);
            for o in 0..2 {
                let at = W * (2 * (v % per) as u32 + o as u32);
                let part = match at {
                    0 => _mm512_slli_epi16::<4>(h),
                    1 => _mm512_slli_epi16::<3>(h),
                    2 => _mm512_slli_epi16::<2>(h),
                    3 => _mm512_slli_epi16::<1>(h),
                    4 => h,
                    5 => _mm512_srli_epi16::<1>(h),
                    6 => _mm512_srli_epi16::<2>(h),
                    _ => _mm512_srli_epi16::<3>(h),
                };
                let part = _mm512_and_si512(part, top);
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

    /// Q5_K packed: Q4_K's head and nibbles, and per group one vector of fifth bits.
    pub struct Q5K;
    impl Format for Q5K {
        const HEAD: usize = 256;
        const GROUPS: usize = 8;
        const GROUP: usize = 320;
        const HALVES: usize = 1;
        type Head = Q4kHead;
        #[inline(always)]
        unsafe fn head(hp: *const u8) -> Q4kHead {
            q4k_head(hp)
        }
        #[inline(always)]
        unsafe fn codes(p: *const u8, _: &Q4kHead) -> [__m512i; 8] {
            codes_high::<1>(p)
        }
        #[inline(always)]
        unsafe fn finish<const MR: usize>(
            a: &Args,
            sums: &[[__m512i; 2]; MR],
            head: &Q4kHead,
            at: (usize, usize),
            tot: &mut [__m512; MR],
        ) {
            Q4K::finish(a, sums, head, at, tot)
        }
    }

    /// Q6_K packed: the 16 scales of the 16 rows (16 bytes each, one a row), their d (f16),
    /// then per group four vectors of nibbles and two of high parts.
    pub struct Q6K;
    impl Format for Q6K {
        const HEAD: usize = 288;
        const GROUPS: usize = 8;
        const GROUP: usize = 384;
        const HALVES: usize = 2;
        /// d, and the head's address (the scales are read per group).
        type Head = (__m512, *const u8);
        #[inline(always)]
        unsafe fn head(hp: *const u8) -> Self::Head {
            let d = _mm256_loadu_si256(hp.add(256) as *const __m256i);
            (_mm512_cvtph_ps(d), hp)
        }
        #[inline(always)]
        unsafe fn codes(p: *const u8, _: &Self::Head) -> [__m512i; 8] {
            codes_high::<2>(p)
        }
        #[inline(always)]
        unsafe fn finish<const MR: usize>(
            a: &Args,
            sums: &[[__m512i; 2]; MR],
            (d, hp): &Self::Head,
            (g, gi): (usize, usize),
            tot: &mut [__m512; MR],
        ) {
            let sc = |h: usize| {
                let b = _mm_loadu_si128(hp.add(16 * (2 * g + h)) as *const __m128i);
                _mm512_mul_ps(*d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)))
            };
            let (f0, f1) = (sc(0), sc(1));
            for (i, (t, sum)) in tot.iter_mut().zip(sums).enumerate() {
                let off = a.x.add(i * a.ldx + offsets_at(a.k, gi)) as *const i32;
                let half = |h: usize| {
                    let o = _mm512_set1_epi32(off.add(h).read_unaligned());
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[h], o))
                };
                let both = _mm512_fmadd_ps(half(1), f1, _mm512_mul_ps(half(0), f0));
                *t = _mm512_fmadd_ps(both, scale(a, i, gi), *t);
            }
        }
    }

    pub use super::bytes::{Iq4Nl, Iq4Xs, Q80};

    pub use super::blocks::{Q40, Q41, Q50, Q51};

    /// Group `g` of the block at `hp` (global group `gi`) for every activation row, into
    /// `tot`, with `P` chains of sums a row and half.
    #[inline(always)]
    unsafe fn block_group<F: Format, const MR: usize, const P: usize>(
        a: &Args,
        (hp, head, gi): (*const u8, &F::Head, usize),
        g: usize,
        tot: &mut [__m512; MR],
    ) {
        let p = hp.add(F::HEAD + F::GROUP * g);
        // The block `PREFETCH` bytes ahead, a `GROUPS`-th of it a group (an eighth of a
        // K-quant block, a whole block of 32): the heads too, which a
        // group's own span left out (a ninth of Q4_K's bytes; Q6_K from memory on one thread
        // 28–31 → 32–34 GB/s). Spans rounded up to lines overlap a little.
        let span = (F::HEAD + F::GROUPS * F::GROUP)
            .div_ceil(F::GROUPS)
            .next_multiple_of(64);
        let (from, len) = (hp.wrapping_add(span * g), span);
        let mut at = 0;
        while at < len {
            prefetch_line(from.wrapping_add(PREFETCH + at), a.l2);
            at += 64;
        }
        let c = F::codes(p, head);
        // Chain `q % P` of half `q / (8 / HALVES)` takes code vector q.
        // Plain counted loops over constants, which unroll with the accumulators in
        // registers (iterator adaptors here left them in memory).
        let mut acc = [[[_mm512_setzero_si512(); P]; 2]; MR];
        // With the last digit apart, Horner's rule takes the first two (in halves, two chains
        // a row), whose sum goes into sums 0, and the last goes into sums 1 on its own (its
        // own loop: an index that depends on the digit kept the sums in memory, Q8_0 pp512
        // 121 → 105 t/s; one chain a row for the first two digits, 113).
        let horner = if F::LAST_APART { 2 } else { 3 };
        for t in 0..horner {
            if t > 0 {
                for i in 0..MR {
                    for h in 0..F::HALVES {
                        for ch in 0..P {
                            acc[i][h][ch] = _mm512_slli_epi32::<8>(acc[i][h][ch]);
                        }
                    }
                }
            }
            for i in 0..MR {
                let xq = a.x.add(i * a.ldx + digits_at(gi) + 32 * t) as *const i32;
                for q in 0..8 {
                    let xb = _mm512_set1_epi32(xq.add(q).read_unaligned());
                    let (h, ch) = (q / (8 / F::HALVES), q % P);
                    acc[i][h][ch] = _mm512_dpbusd_epi32(acc[i][h][ch], c[q], xb);
                }
            }
        }
        if F::LAST_APART {
            for i in 0..MR {
                for ch in 0..P {
                    acc[i][0][ch] = _mm512_add_epi32(acc[i][0][ch], acc[i][1][ch]);
                    acc[i][1][ch] = _mm512_setzero_si512();
                }
            }
            for i in 0..MR {
                let xq = a.x.add(i * a.ldx + digits_at(gi) + 64) as *const i32;
                for q in 0..8 {
                    let xb = _mm512_set1_epi32(xq.add(q).read_unaligned());
                    let ch = q % P;
                    acc[i][1][ch] = _mm512_dpbusd_epi32(acc[i][1][ch], c[q], xb);
                }
            }
        }
        let mut sums = [[_mm512_setzero_si512(); 2]; MR];
        for i in 0..MR {
            for h in 0..F::HALVES {
                let mut sum = acc[i][h][0];
                for ch in 1..P {
                    sum = _mm512_add_epi32(sum, acc[i][h][ch]);
                }
                sums[i][h] = sum;
            }
        }
        F::finish(a, &sums, head, (g, gi), tot);
    }

    /// The 16 rows of group `g0` against `MR` activation rows.
    #[inline(always)]
    unsafe fn group<F: Format, const MR: usize, const P: usize>(a: &Args, g0: usize) {
        let nb = a.k / (32 * F::GROUPS);
        let bb = F::HEAD + F::GROUPS * F::GROUP;
        let mut tot = [_mm512_setzero_ps(); MR];
        let base = a.w.add(g0 * nb * bb);
        for b in 0..nb {
            let hp = base.add(b * bb);
            let head = F::head(hp);
            let t = &mut tot;
            if F::GROUPS == 1 {
                block_group::<F, MR, P>(a, (hp, &head, b), 0, t);
                continue;
            }
            block_group::<F, MR, P>(a, (hp, &head, 8 * b), 0, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 1), 1, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 2), 2, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 3), 3, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 4), 4, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 5), 5, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 6), 6, t);
            block_group::<F, MR, P>(a, (hp, &head, 8 * b + 7), 7, t);
        }
        for (i, t) in tot.iter().enumerate() {
            _mm512_storeu_ps(a.y.add(i * a.ldy + 16 * g0), *t);
        }
    }

    /// The groups of rows in `range`, one at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run_plain<F: Format, const MR: usize, const P: usize>(
        a: &Args,
        range: std::ops::Range<usize>,
    ) {
        for g in range {
            group::<F, MR, P>(a, g);
        }
    }

    /// [`run_plain`] with AVX-512 VBMI (Q5_0's and Q5_1's fifth bits).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    pub(super) unsafe fn run_vbmi<F: Format, const MR: usize, const P: usize>(
        a: &Args,
        range: std::ops::Range<usize>,
    ) {
        for g in range {
            group::<F, MR, P>(a, g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The AVX2 rearrangement writes the bytes the scalar definition writes (digits in the
    /// lanes' order, the offsets), for rows of 64 and 640 with and without offsets, over a
    /// buffer of stale bytes.
    #[test]
    fn the_vector_arrangement_is_the_scalar_one() {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::is_x86_feature_detected!("avx2") {
                eprintln!("skipped: no AVX2 here");
                return;
            }
            let mut rng = Rng::new(51);
            for k in [64, 640, 1536] {
                for dtype in [
                    DType::Q4_K,
                    DType::Q4_0,
                    DType::Q5_1,
                    DType::Q6_K,
                    DType::Q8_0,
                ] {
                    let how = split(dtype).unwrap();
                    let x: Vec<f32> = (0..k)
                        .map(|j| rng.normal() * if j % 37 == 0 { 50.0 } else { 1.0 })
                        .collect();
                    let mut scratch = vec![0u8; qdot_int::row_bytes(k)];
                    qdot_int::split_row(&x, &mut scratch, how);
                    let mut want = vec![0xA5u8; row_bytes(k)];
                    arrange(&scratch, &mut want, k, offsets(dtype));
                    let mut got = vec![0xA5u8; row_bytes(k)];
                    // SAFETY: AVX2 is present; the buffers are a split row and a whole one.
                    unsafe { x86::arrange_avx2(&scratch, &mut got, k, offsets(dtype)) };
                    assert_eq!(got, want, "{dtype} k {k}");
                }
            }
        }
    }
}
