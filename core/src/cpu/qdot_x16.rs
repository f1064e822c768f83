//! Weights of the 4-bit 32-element formats (IQ4_NL, Q4_0, Q4_1) stored 16 rows interleaved,
//! and the kernel that reads them: each vector lane is a weight row.
//!
//! In the file's layout a row's block is decoded into two vectors of 16 of its elements
//! (`qdot.rs`): per 16 weights a widening, a shift, a table permute and a multiply-add, plus
//! a scaled table per block: ~6.3 cycles a block of 32 on one Zen 4 core, twice what memory
//! needs. Here the CPU backend keeps such a matrix (`[n, k]`, n a multiple of 16) as groups
//! of 16 rows, each group's blocks side by side: for block `b` of group `g`, the 16 rows'
//! scales (each f16 field as 16 consecutive f16: `d`, then Q4_1's `m`), then four 64-byte
//! vectors; vector `v`'s 32-bit lane `r` holds row r's elements `8v..8v + 8` of the block, one
//! nibble each (element `8v + j` in bits `4j..4j + 4`). Same size as the file's blocks.
//!
//! A block of 16 rows is then, per 16 weights (one column of the 16 rows), a shift, a permute
//! of the format's 16 levels and one multiply-add with the column's activation broadcast: the
//! sum `s_r = Σ_c level(q_rc) · x_c` over the block's 32 columns, then `y_r += d_r · s_r` (and
//! for Q4_1 `+= m_r · Σ_c x_c`). 1.04 against 1.72 ns a block of 32 on one core (rows in L2).
//! Prefill runs the same kernel with up to six activation rows (each level decoded once for
//! all of them), so a row's bits never depend on the batch it came in.
//!
//! Exactness: the levels are small integers (exact in f32), each product and sum one f32
//! rounding, the block's sum scaled once: the error of a row is within
//! `2⁻²³ · (32 + k/32) · Σ |w·x|`-ish, like the file-layout kernel's (the tests hold every row
//! to an f64 dot of the dequantized weights).

use crate::tensor::DType;

/// Weight rows a group interleaves.
pub(crate) const ROWS: usize = 16;

/// Activation rows one kernel call covers at most.
pub(crate) const MAX_ROWS: usize = 6;

/// Whether the CPU backend keeps a `dtype` tensor of `dims` interleaved on this CPU.
pub(crate) fn packs(isa: super::simd::Isa, dtype: DType, dims: &[usize]) -> bool {
    cfg!(target_arch = "x86_64")
        && isa == super::simd::Isa::Avx512
        && head_bytes(dtype).is_some()
        && matches!(dims, &[n, k] if n > 0 && n % ROWS == 0 && k > 0 && k % 32 == 0)
}

/// The bytes of a file block's scales (before its 16 bytes of nibbles), for the formats kept
/// interleaved.
fn head_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::IQ4_NL | DType::Q4_0 => Some(2),
        DType::Q4_1 => Some(4),
        _ => None,
    }
}

/// The interleaved form of `src`, `n` rows of `k` elements of `dtype` in the file's layout, into
/// `dst` (the same size).
pub(crate) fn pack(dtype: DType, k: usize, src: &[u8], dst: &mut [u8]) {
    shuffle(dtype, k, src, dst, true);
}

/// The file's layout from the interleaved form.
pub(crate) fn unpack(dtype: DType, k: usize, src: &[u8], dst: &mut [u8]) {
    shuffle(dtype, k, src, dst, false);
}

/// Row `r` of an interleaved matrix in the file's layout (`dst`: one row's bytes).
pub(crate) fn unpack_row(dtype: DType, k: usize, packed: &[u8], r: usize, dst: &mut [u8]) {
    let Some(h) = head_bytes(dtype) else { return };
    let (bb, nb) = (h + 16, k / 32);
    let gb = nb * ROWS * bb;
    let Some(g) = packed.get(r / ROWS * gb..(r / ROWS + 1) * gb) else {
        return;
    };
    for (b, out) in dst.chunks_exact_mut(bb).take(nb).enumerate() {
        block(&g[b * ROWS * bb..(b + 1) * ROWS * bb], h, r % ROWS, out);
    }
}

/// Moves every row's blocks between the two layouts (`to_packed`: file → interleaved).
fn shuffle(dtype: DType, k: usize, src: &[u8], dst: &mut [u8], to_packed: bool) {
    let Some(h) = head_bytes(dtype) else { return };
    let bb = h + 16;
    let (nb, gbb) = (k / 32, ROWS * bb);
    let (rb, gb) = (nb * bb, nb * gbb);
    if rb == 0 {
        return;
    }
    for (s, d) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
        for b in 0..nb {
            for r in 0..ROWS {
                if to_packed {
                    let file = &s[r * rb + b * bb..r * rb + (b + 1) * bb];
                    block_in(file, h, r, &mut d[b * gbb..(b + 1) * gbb]);
                } else {
                    let out = &mut d[r * rb + b * bb..r * rb + (b + 1) * bb];
                    block(&s[b * gbb..(b + 1) * gbb], h, r, out);
                }
            }
        }
    }
}

/// Row `r`'s file block out of a packed group block `g` (`h` head bytes).
fn block(g: &[u8], h: usize, r: usize, out: &mut [u8]) {
    for f in 0..h / 2 {
        out[2 * f..2 * f + 2].copy_from_slice(&g[32 * f + 2 * r..32 * f + 2 * r + 2]);
    }
    let nib = &g[16 * h..];
    let code = |e: usize| {
        let lane = &nib[64 * (e / 8) + 4 * r..64 * (e / 8) + 4 * r + 4];
        let word = u32::from_le_bytes([lane[0], lane[1], lane[2], lane[3]]);
        ((word >> (4 * (e % 8))) & 15) as u8
    };
    for j in 0..16 {
        out[h + j] = code(j) | (code(j + 16) << 4);
    }
}

/// Row `r`'s file block `file` into a packed group block `g`.
fn block_in(file: &[u8], h: usize, r: usize, g: &mut [u8]) {
    for f in 0..h / 2 {
        g[32 * f + 2 * r..32 * f + 2 * r + 2].copy_from_slice(&file[2 * f..2 * f + 2]);
    }
    let code = |e: usize| {
        let byte = file[h + e % 16];
        if e < 16 {
            byte & 15
        } else {
            byte >> 4
        }
    };
    let nib = &mut g[16 * h..];
    for v in 0..4 {
        let word = (0..8).fold(0u32, |w, j| w | (code(8 * v + j) as u32) << (4 * j));
        nib[64 * v + 4 * r..64 * v + 4 * r + 4].copy_from_slice(&word.to_le_bytes());
    }
}

/// Each activation row's block sums `Σ_{c ∈ block b} x_c` (what Q4_1's minimums multiply),
/// `k / 32` a row, in the order the kernels need them: the same for every batch.
pub(crate) fn block_sums(x: &[f32], k: usize, out: &mut Vec<f32>) {
    out.clear();
    for row in x.chunks_exact(k) {
        out.extend(row.chunks_exact(32).map(|b| {
            // A fixed pairwise order.
            let mut v = [0f32; 16];
            for (i, v) in v.iter_mut().enumerate() {
                *v = b[i] + b[i + 16];
            }
            for w in [8, 4, 2, 1] {
                for i in 0..w {
                    v[i] += v[i + w];
                }
            }
            v[0]
        }));
    }
}

/// `y[i·ldy + r] = Σₖ x[i·ldx + k] · W_r[k]` for `i < mr` (1..=6) and the weight rows of the
/// groups `groups` (rows `16g..16g + 16`), W interleaved (`pack`). `xs` holds each activation
/// row's [`block_sums`] at stride `k / 32` (read for Q4_1 only).
///
/// # Safety
/// [`packs`] held for the weights (AVX-512, the format, k a multiple of 32); `w` holds the
/// groups, `x` `mr` rows of `k` f32 at `ldx`, `xs` `mr` rows of `k / 32`, and `y` `mr` rows at
/// `ldy` writable at the groups' columns.
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
                    1 => run::<$f, 1, 1>(&a, groups),
                    2 => run::<$f, 1, 2>(&a, groups),
                    3 => run::<$f, 1, 3>(&a, groups),
                    4 => run::<$f, 1, 4>(&a, groups),
                    5 => run::<$f, 1, 5>(&a, groups),
                    _ => run::<$f, 1, 6>(&a, groups),
                }
            };
        }
        match dtype {
            DType::IQ4_NL => go!(Iq4Nl),
            DType::Q4_0 => go!(Q40),
            DType::Q4_1 => go!(Q41),
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, x, ldx, xs, mr, k, w, groups, y, ldy);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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

    /// A format as the kernel sees it: its 16 levels, and a block's scaling of the rows' sums.
    pub(super) trait Format {
        /// Bytes of the 16 rows' scales at the start of a group block.
        const HEAD: usize;
        unsafe fn levels() -> __m512;
        /// `tot[i] += d · s[i]` (and Q4_1's `m · Σx`) for the group block's scales at `h`;
        /// `xs` points to the block's sum in activation row 0, rows at stride `ldxs`.
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            h: *const u8,
            xs: *const f32,
            ldxs: usize,
        );
    }

    #[inline(always)]
    unsafe fn f16x16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    #[inline(always)]
    unsafe fn scale_d<const MR: usize>(tot: &mut [__m512; MR], s: &[__m512; MR], h: *const u8) {
        let d = f16x16(h);
        for (t, s) in tot.iter_mut().zip(s) {
            *t = _mm512_fmadd_ps(*s, d, *t);
        }
    }

    pub struct Iq4Nl;
    impl Format for Iq4Nl {
        const HEAD: usize = 32;
        #[inline(always)]
        unsafe fn levels() -> __m512 {
            _mm512_setr_ps(
                -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0,
                53.0, 69.0, 89.0, 113.0,
            )
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            h: *const u8,
            _: *const f32,
            _: usize,
        ) {
            scale_d(tot, s, h)
        }
    }

    pub struct Q40;
    impl Format for Q40 {
        const HEAD: usize = 32;
        #[inline(always)]
        unsafe fn levels() -> __m512 {
            _mm512_setr_ps(
                -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                7.0,
            )
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            h: *const u8,
            _: *const f32,
            _: usize,
        ) {
            scale_d(tot, s, h)
        }
    }

    pub struct Q41;
    impl Format for Q41 {
        const HEAD: usize = 64;
        #[inline(always)]
        unsafe fn levels() -> __m512 {
            _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            )
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            h: *const u8,
            xs: *const f32,
            ldxs: usize,
        ) {
            scale_d(tot, s, h);
            let m = f16x16(h.add(32));
            for (i, t) in tot.iter_mut().enumerate() {
                *t = _mm512_fmadd_ps(m, _mm512_set1_ps(*xs.add(i * ldxs)), *t);
            }
        }
    }

    /// Bytes ahead of each vector of codes that are prefetched (each group is its own stream).
    const PREFETCH: usize = 4096;

    /// One column of the block for every group and activation row: the codes at bits
    /// `SH..SH + 4` of each lane looked up in the levels, times the column's activation.
    #[inline(always)]
    unsafe fn column<const G: usize, const MR: usize, const SH: u32>(
        s: &mut [[__m512; MR]; G],
        nib: &[__m512i; G],
        x: *const f32,
        ldx: usize,
        levels: __m512,
    ) {
        for (sg, n) in s.iter_mut().zip(nib) {
            let idx = if SH == 0 {
                *n
            } else {
                _mm512_srli_epi32::<SH>(*n)
            };
            let w = _mm512_permutexvar_ps(idx, levels);
            for (i, si) in sg.iter_mut().enumerate() {
                *si = _mm512_fmadd_ps(w, _mm512_set1_ps(*x.add(i * ldx)), *si);
            }
        }
    }

    /// `G` groups at a time from `g0`, `MR` activation rows.
    #[inline(always)]
    unsafe fn groups<F: Format, const G: usize, const MR: usize>(a: &Args, g0: usize) {
        let nb = a.k / 32;
        let bb = F::HEAD + 256;
        let gb = nb * bb;
        let levels = F::levels();
        let mut tot = [[_mm512_setzero_ps(); MR]; G];
        for b in 0..nb {
            let mut s = [[_mm512_setzero_ps(); MR]; G];
            for v in 0..4 {
                let mut nib = [_mm512_setzero_si512(); G];
                for (gi, n) in nib.iter_mut().enumerate() {
                    let p = a.w.add((g0 + gi) * gb + b * bb + F::HEAD + 64 * v);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
                    *n = _mm512_loadu_si512(p as *const _);
                }
                let x = a.x.add(32 * b + 8 * v);
                column::<G, MR, 0>(&mut s, &nib, x, a.ldx, levels);
                column::<G, MR, 4>(&mut s, &nib, x.add(1), a.ldx, levels);
                column::<G, MR, 8>(&mut s, &nib, x.add(2), a.ldx, levels);
                column::<G, MR, 12>(&mut s, &nib, x.add(3), a.ldx, levels);
                column::<G, MR, 16>(&mut s, &nib, x.add(4), a.ldx, levels);
                column::<G, MR, 20>(&mut s, &nib, x.add(5), a.ldx, levels);
                column::<G, MR, 24>(&mut s, &nib, x.add(6), a.ldx, levels);
                column::<G, MR, 28>(&mut s, &nib, x.add(7), a.ldx, levels);
            }
            for (gi, (t, s)) in tot.iter_mut().zip(&s).enumerate() {
                F::scale(t, s, a.w.add((g0 + gi) * gb + b * bb), a.xs.add(b), nb);
            }
        }
        for (gi, t) in tot.iter().enumerate() {
            for (i, t) in t.iter().enumerate() {
                _mm512_storeu_ps(a.y.add(i * a.ldy + 16 * (g0 + gi)), *t);
            }
        }
    }

    /// The groups `range`, `G` at a time, then one at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn run<F: Format, const G: usize, const MR: usize>(
        a: &Args,
        range: std::ops::Range<usize>,
    ) {
        let mut g = range.start;
        while g + G <= range.end {
            groups::<F, G, MR>(a, g);
            g += G;
        }
        while g < range.end {
            groups::<F, 1, MR>(a, g);
            g += 1;
        }
    }
}

#[cfg(test)]
#[path = "qdot_x16_tests.rs"]
mod tests;
