//! Weights of the 4- and 5-bit formats (IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_XS, Q4_K) stored 16
//! rows interleaved, and the kernel that reads them: each vector lane is a weight row.
//!
//! In the file's layout a row's 32 elements are decoded into two vectors of 16 (`qdot.rs`):
//! per 16 weights a widening, a shift, a table permute and a multiply-add, plus a scaled
//! table per group: ~6.3 cycles a group of 32 on one Zen 4 core, twice what memory needs.
//! Here the CPU backend keeps such a matrix (`[n, k]`, n a multiple of 16) as groups of 16
//! rows, each group's blocks side by side. For block `b` of a group: the 16 rows' block
//! heads, field by field (each field of the file's block head, e.g. the f16 `d`, as 16
//! consecutive values, one a row), then for each 32-element group of the block four 64-byte
//! vectors: vector `v`'s 32-bit lane `r` holds row r's elements `8v..8v + 8` of the group, one
//! 4-bit code each (element `8v + j` in bits `4j..4j + 4`). Same size as the file's blocks.
//!
//! A group of 16 rows is then, per 16 weights (one column of the 16 rows), a shift, a permute
//! of the format's 16 levels and one multiply-add with the column's activation broadcast (the
//! 5-bit formats, whose fifth bits are a 32-bit head field a row, add a shift of those and a
//! bit select, and permute 32 levels in two registers): the
//! sum `s_r = Σ_c level(q_rc) · x_c` over the group's 32 columns, then `y_r += a_r · s_r`
//! with the row's scale for the group (`d`, or IQ4_XS's `d · (scale - 32)`, Q4_K's
//! `d · scale`), and where the format has minimums `y_r += m_r · Σ_c x_c` (Q4_1's `m`, Q4_K's
//! `-dmin · min`). 1.04 against 1.72 ns a group of 32 on one core (IQ4_NL, rows in L2).
//! Prefill runs the same kernel with up to six activation rows (each level decoded once for
//! all of them), so a row's bits never depend on the batch it came in.
//!
//! Exactness: the levels are small integers (exact in f32), the group scales products of an
//! f16 and a 6-bit integer (exact), each product and sum one f32 rounding, a group's sum
//! scaled once: a row's error is within `2⁻²⁴ · (48 + k/32) · Σ |w·x|` (and the minimums'
//! `|m|·Σ|x|`), which the tests hold every row to against an f64 dot.

use crate::tensor::DType;

/// Weight rows a group interleaves.
pub(crate) const ROWS: usize = 16;

/// Activation rows one kernel call covers at most.
pub(crate) const MAX_ROWS: usize = 6;

/// How a format's file block is laid out, as the interleaving sees it.
struct Layout {
    /// The sizes of the block head's fields (before the codes), in bytes.
    head: &'static [usize],
    /// 32-element groups per block.
    groups: usize,
    /// Where elements `8v..8v + 8` of group `g` lie among the block's codes: eight
    /// consecutive bytes from the returned one, a nibble each at the returned shift.
    run8: Run8,
    /// Where the head and the codes begin in the file's block (Q6_K's head is at its end).
    head_at: usize,
    codes_at: usize,
    /// Where the codes' high parts (Q5_K's fifth bit, Q6_K's 2 bits) begin in the file's
    /// block, and their width `w`: element `l` of group `g` has them at bits `w · (g % (8 /
    /// w))` of byte `32 · (g / (8 / w)) + l` there. Packed, each group has `w` more 64-byte
    /// vectors after its four of nibbles (see [`hi_at`]).
    high_at: Option<(usize, u32)>,
}

/// Where a run of eight codes lies: see [`Layout::run8`].
type Run8 = fn(usize, usize) -> (usize, u32);

impl Layout {
    fn head_bytes(&self) -> usize {
        self.head.iter().sum()
    }
    /// Bytes of a row's codes in a group: 16 of nibbles, and 8 of high parts.
    fn group_bytes(&self) -> usize {
        16 + 4 * self.high_at.map_or(0, |(_, w)| w as usize)
    }
    fn block_bytes(&self) -> usize {
        self.head_bytes() + self.group_bytes() * self.groups
    }
}

/// Codes of 32-element groups: element `l` of group `g` in the low (l < 16) or high nibble
/// of byte `16g + l % 16`.
fn run8_32(g: usize, v: usize) -> (usize, u32) {
    (16 * g + 8 * (v % 2), 4 * (v / 2) as u32)
}

/// Q4_K's codes: groups 2i and 2i + 1 are the low and high nibbles of the same 32 bytes.
fn run8_q4k(g: usize, v: usize) -> (usize, u32) {
    (32 * (g / 2) + 8 * v, 4 * (g % 2) as u32)
}

/// Q6_K's low nibbles: groups 4i..4i + 4 are the low, low, high and high nibbles of bytes
/// 64i..64i + 32, 64i + 32..64i + 64, 64i..64i + 32 and 64i + 32..64i + 64.
fn run8_q6k(g: usize, v: usize) -> (usize, u32) {
    (
        64 * (g / 4) + 32 * (g % 2) + 8 * v,
        4 * ((g % 4) / 2) as u32,
    )
}

/// Where the `w`-bit high part of element `l = 8v + 2b + o` (o = 0, 1) of a group goes when
/// packed: high vector `u = v / (4 / w)`, byte `b` of the row's lane, bits from `w · (2 · (v %
/// (4 / w)) + o)`. So a shift of the vector to bit 4 and a mask leave in byte b the part of
/// the element whose nibble the kernel's code vector `2v + o` has in byte b.
fn hi_at(w: u32, l: usize) -> (usize, usize, u32) {
    let per = 4 / w as usize;
    let (v, j) = (l / 8, l % 8);
    (v / per, j / 2, w * (2 * (v % per) + j % 2) as u32)
}

/// Where group `g`'s high parts lie in the file's block, as [`Layout::high_at`] says: the
/// first of 32 bytes, and the shift.
fn hi_file((at, w): (usize, u32), g: usize) -> (usize, u32) {
    let per = 8 / w as usize;
    (at + 32 * (g / per), w * (g % per) as u32)
}

/// Bytes 0, 2, 4 and 6 of `w`, as a word.
pub(crate) fn even_bytes(w: u64) -> u32 {
    let mut x = w & 0x00FF_00FF_00FF_00FF;
    x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    ((x | (x >> 16)) & 0xFFFF_FFFF) as u32
}

/// The nibbles at `shift` of eight bytes, packed into a word (byte j's in bits `4j..4j + 4`).
fn gather8(bytes: [u8; 8], shift: u32) -> u32 {
    let mut x = (u64::from_le_bytes(bytes) >> shift) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    ((x | (x >> 16)) & 0xFFFF_FFFF) as u32
}

/// [`gather8`] undone: the word's eight nibbles, one a byte, at `shift`.
fn scatter8(word: u32, shift: u32) -> u64 {
    let mut x = word as u64;
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    ((x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F) << shift
}

/// The interleaved formats' layouts.
fn layout(dtype: DType) -> Option<Layout> {
    if dtype == DType::Q6_K {
        // ql (128 bytes), qh (64), then the head: 16 scales (a field each, so that the
        // packed block holds each scale of the 16 rows side by side) and d.
        return Some(Layout {
            head: &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2],
            groups: 8,
            run8: run8_q6k,
            head_at: 192,
            codes_at: 0,
            high_at: Some((128, 2)),
        });
    }
    if dtype == DType::Q5_K {
        // Q4_K's head, the fifth bits (32 bytes: bit g of byte l, element l of group g), then
        // Q4_K's nibbles.
        return Some(Layout {
            head: &[2, 2, 4, 4, 4],
            groups: 8,
            run8: run8_q4k,
            head_at: 0,
            codes_at: 48,
            high_at: Some((16, 1)),
        });
    }
    let (head, groups, run8): (&'static [usize], usize, Run8) = match dtype {
        DType::IQ4_NL | DType::Q4_0 => (&[2], 1, run8_32),
        DType::Q4_1 => (&[2, 2], 1, run8_32),
        // d (and Q5_1's m), the 32 fifth bits (bit c: element c's).
        DType::Q5_0 => (&[2, 4], 1, run8_32),
        DType::Q5_1 => (&[2, 2, 4], 1, run8_32),
        // d, the 8 groups' scale high bits (u16), their low nibbles (4 bytes).
        DType::IQ4_XS => (&[2, 2, 4], 8, run8_32),
        // d, dmin, the 12 bytes of 6-bit scales and mins as three 4-byte fields.
        DType::Q4_K => (&[2, 2, 4, 4, 4], 8, run8_q4k),
        _ => return None,
    };
    let codes_at = head.iter().sum();
    Some(Layout {
        head,
        groups,
        run8,
        head_at: 0,
        codes_at,
        high_at: None,
    })
}

/// Whether the CPU backend keeps a `dtype` tensor of `dims` interleaved on this CPU.
pub(crate) fn packs(isa: super::simd::Isa, dtype: DType, dims: &[usize]) -> bool {
    let Some(l) = layout(dtype) else {
        return false;
    };
    cfg!(target_arch = "x86_64")
        && isa == super::simd::Isa::Avx512
        && matches!(dims, &[n, k] if n > 0 && n % ROWS == 0 && k > 0 && k % (32 * l.groups) == 0)
        // Q5_K and Q6_K have only the integer kernel.
        && (l.high_at.is_none() || super::qdot_x16i::supported(dtype))
}

/// Whether the kernel reads the activations' 32-element group sums ([`block_sums`]): the
/// formats with minimums.
pub(crate) fn needs_sums(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K)
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
    let Some(l) = layout(dtype) else { return };
    let bb = l.block_bytes();
    let nb = k / (32 * l.groups);
    let gb = nb * ROWS * bb;
    let Some(g) = packed.get(r / ROWS * gb..(r / ROWS + 1) * gb) else {
        return;
    };
    for (b, out) in dst.chunks_exact_mut(bb).take(nb).enumerate() {
        block_out(&l, &g[b * ROWS * bb..(b + 1) * ROWS * bb], r % ROWS, out);
    }
}

/// Moves every row's blocks between the two layouts (`to_packed`: file → interleaved).
fn shuffle(dtype: DType, k: usize, src: &[u8], dst: &mut [u8], to_packed: bool) {
    let Some(l) = layout(dtype) else { return };
    let bb = l.block_bytes();
    let nb = k / (32 * l.groups);
    let (rb, gbb) = (nb * bb, ROWS * bb);
    let gb = nb * gbb;
    if rb == 0 {
        return;
    }
    // Groups of rows in parallel (a model's weights are interleaved as they load).
    use rayon::prelude::*;
    src.par_chunks_exact(gb)
        .zip(dst.par_chunks_exact_mut(gb))
        .for_each(|(s, d)| {
            for b in 0..nb {
                for r in 0..ROWS {
                    if to_packed {
                        let file = &s[r * rb + b * bb..r * rb + (b + 1) * bb];
                        block_in(&l, file, r, &mut d[b * gbb..(b + 1) * gbb]);
                    } else {
                        let out = &mut d[r * rb + b * bb..r * rb + (b + 1) * bb];
                        block_out(&l, &s[b * gbb..(b + 1) * gbb], r, out);
                    }
                }
            }
        });
}

/// Where row `r`'s head field `f` lies in a packed block of 16 rows.
fn field_at(l: &Layout, f: usize, r: usize) -> usize {
    16 * l.head[..f].iter().sum::<usize>() + l.head[f] * r
}
/// Where row `r`'s codes `8v..8v + 8` of group `g` lie in a packed block of 16 rows: a 4-byte
/// lane, code `8v + j` in bits `4j..4j + 4`.
fn lane_at(l: &Layout, g: usize, v: usize, r: usize) -> usize {
    16 * l.head_bytes() + 16 * l.group_bytes() * g + 64 * v + 4 * r
}

/// Row `r`'s file block out of a packed block of 16 rows `g`.
fn block_out(l: &Layout, g: &[u8], r: usize, out: &mut [u8]) {
    let mut at = l.head_at;
    for (f, &size) in l.head.iter().enumerate() {
        let src = field_at(l, f, r);
        out[at..at + size].copy_from_slice(&g[src..src + size]);
        at += size;
    }
    let region = if l.head_at == 0 {
        l.head_bytes()..out.len()
    } else {
        0..l.head_at
    };
    out[region].fill(0);
    for grp in 0..l.groups {
        for v in 0..4 {
            let lane = lane_at(l, grp, v, r);
            let word = u32::from_le_bytes([g[lane], g[lane + 1], g[lane + 2], g[lane + 3]]);
            let (byte, shift) = (l.run8)(grp, v);
            let dst = &mut out[l.codes_at + byte..l.codes_at + byte + 8];
            let mut b = [0u8; 8];
            b.copy_from_slice(dst);
            dst.copy_from_slice(&(u64::from_le_bytes(b) | scatter8(word, shift)).to_le_bytes());
        }
        if let Some(hi) = l.high_at {
            let (at, shift) = hi_file(hi, grp);
            let mask = (1u8 << hi.1) - 1;
            for e in 0..32 {
                let (u, b, sh) = hi_at(hi.1, e);
                let part = (g[lane_at(l, grp, 4 + u, r) + b] >> sh) & mask;
                out[at + e] |= part << shift;
            }
        }
    }
}

/// Row `r`'s file block `file` into a packed block of 16 rows `g`.
fn block_in(l: &Layout, file: &[u8], r: usize, g: &mut [u8]) {
    let mut at = l.head_at;
    for (f, &size) in l.head.iter().enumerate() {
        let dst = field_at(l, f, r);
        g[dst..dst + size].copy_from_slice(&file[at..at + size]);
        at += size;
    }
    for grp in 0..l.groups {
        for v in 0..4 {
            let (byte, shift) = (l.run8)(grp, v);
            let mut b = [0u8; 8];
            b.copy_from_slice(&file[l.codes_at + byte..l.codes_at + byte + 8]);
            let lane = lane_at(l, grp, v, r);
            g[lane..lane + 4].copy_from_slice(&gather8(b, shift).to_le_bytes());
        }
        if let Some(hi) = l.high_at {
            // Elements 8v..8v + 8's parts, a byte each; then `hi_at`'s places, a word at a
            // time: even elements at bits w · 2s of byte j / 2 (s = v % (4 / w)), odd ones w
            // above.
            let (at, shift) = hi_file(hi, grp);
            let w = hi.1;
            let per = 4 / w as usize;
            let mask = 0x0101_0101_0101_0101 * ((1u64 << w) - 1);
            let word = |v: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&file[at + 8 * v..at + 8 * v + 8]);
                (u64::from_le_bytes(b) >> shift) & mask
            };
            let part = |x: u64| even_bytes(x) | (even_bytes(x >> 8) << w);
            for u in 0..w as usize {
                let lane = (0..per).fold(0u32, |lane, s| {
                    lane | part(word(per * u + s)) << (2 * w * s as u32)
                });
                let dst = lane_at(l, grp, 4 + u, r);
                g[dst..dst + 4].copy_from_slice(&lane.to_le_bytes());
            }
        }
    }
}

/// Each activation row's sums of its 32-element groups `Σ_{c ∈ group} x_c` (what the
/// minimums multiply), `k / 32` a row, in a fixed order: the same for every batch.
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
/// row's [`block_sums`] at stride `k / 32` (read where [`needs_sums`]).
///
/// # Safety
/// [`packs`] held for the weights (AVX-512, the format, k a multiple of its block); `w` holds
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

    /// IQ4_XS: 256-element blocks, group g's scale `d · (s_g - 32)` with `s_g` 6 bits: the low
    /// 4 in nibble g of the 4-byte field, the high 2 in bits 2g of the u16 field.
    pub struct Iq4Xs;
    impl Format for Iq4Xs {
        const HEAD: usize = 128;
        const GROUPS: usize = 8;
        /// d, the high bits (widened to 32-bit lanes), the low nibbles.
        type Head = (__m512, __m512i, __m512i);
        #[inline(always)]
        unsafe fn levels() -> (__m512, __m512) {
            (iq4_levels(), iq4_levels())
        }
        #[inline(always)]
        unsafe fn head(h: *const u8) -> Self::Head {
            let hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(h.add(32) as *const __m256i));
            (f16x16(h), hi, _mm512_loadu_si512(h.add(64) as *const _))
        }
        #[inline(always)]
        unsafe fn scale<const MR: usize>(
            tot: &mut [__m512; MR],
            s: &[__m512; MR],
            (d, hi, lo): &Self::Head,
            g: usize,
            _: *const f32,
            _: usize,
        ) {
            let g = g as u32;
            let q = _mm512_or_si512(
                bits(*lo, 4 * g, 15),
                _mm512_slli_epi32::<4>(bits(*hi, 2 * g, 3)),
            );
            let sc = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32)));
            scale_by(tot, s, _mm512_mul_ps(*d, sc));
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

    /// Bytes ahead of each vector of codes that are prefetched.
    pub(crate) const PREFETCH: usize = 4096;

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
}

#[cfg(test)]
#[path = "qdot_x16_tests.rs"]
mod tests;
