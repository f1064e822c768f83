//! Weights stored 16 rows interleaved, a vector lane per weight row: the layout, and how the
//! CPU backend moves between it and the file's. Two kernels read it: `qdot_x16i` (integer, on
//! VNNI: Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS, and with VBMI Q5_0 and Q5_1) and
//! `qdot_x16f` (f32: the formats but Q5_K and Q6_K where the integer kernel does not run).
//!
//! In the file's layout a row's 32 elements are decoded into two vectors of 16 (`qdot.rs`):
//! per 16 weights a widening, a shift, a table permute and a multiply-add, plus a scaled
//! table per group: ~6.3 cycles a group of 32 on one Zen 4 core, twice what memory needs.
//! Here the CPU backend keeps such a matrix (`[n, k]`, n a multiple of 16) as groups of 16
//! rows, each group's blocks side by side. For block `b` of a group: the 16 rows' block
//! heads, field by field (each field of the file's block head, e.g. the f16 `d`, as 16
//! consecutive values, one a row), then for each 32-element group of the block four 64-byte
//! vectors: vector `v`'s 32-bit lane `r` holds row r's elements `8v..8v + 8` of the group, one
//! 4-bit code each (element `8v + j` in bits `4j..4j + 4`); Q5_K's and Q6_K's high parts of
//! the codes follow as one or two more vectors ([`hi_at`]); Q8_0's codes are bytes, a column
//! of the 16 rows at a time, or with VNNI four columns of a row a lane, as the integer kernel
//! reads them ([`Layout::bytes`], [`q8_lanes`]). Same size as the file's blocks.

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
    /// Codes of a byte each (Q8_0): packed, a group is 32 columns of 16 bytes (column `c`'s
    /// code of row `r` at byte `16c + r`), or with [`q8_lanes`] eight vectors of 16 lanes
    /// ([`byte_at`]); `run8` is unused.
    bytes: bool,
}

/// Whether Q8_0 is packed for the integer kernel (`qdot_x16i`, on AVX-512 VNNI): lane `r` of
/// code vector `2v + o` holds row r's elements `8v + o, 8v + 2 + o, 8v + 4 + o, 8v + 6 + o`,
/// the order the nibble formats' codes take (so the split activations' arrangement is
/// theirs). Else column by column for the f32 kernel (`qdot_x16f`).
pub(crate) fn q8_lanes() -> bool {
    super::qdot_vnni::has_vnni()
}

/// Where row `r`'s code of column `c` lies among a packed Q8_0 block's codes, in lanes
/// ([`q8_lanes`]) or column by column.
fn byte_at(lanes: bool, c: usize, r: usize) -> usize {
    if lanes {
        let (v, j) = (c / 8, c % 8);
        64 * (2 * v + j % 2) + 4 * r + j / 2
    } else {
        16 * c + r
    }
}

/// Where a run of eight codes lies: see [`Layout::run8`].
type Run8 = fn(usize, usize) -> (usize, u32);

impl Layout {
    fn head_bytes(&self) -> usize {
        self.head.iter().sum()
    }
    /// Bytes of a row's codes in a group: 16 of nibbles and 4 or 8 of high parts, or 32
    /// bytes.
    fn group_bytes(&self) -> usize {
        if self.bytes {
            return 32;
        }
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
            bytes: false,
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
            bytes: false,
        });
    }
    if dtype == DType::Q8_0 {
        return Some(Layout {
            head: &[2],
            groups: 1,
            run8: run8_32,
            head_at: 0,
            codes_at: 2,
            high_at: None,
            bytes: true,
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
        bytes: false,
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
        // The integer kernel's split takes rows of 64 (Q8_0's lanes are its alone).
        && (!(dtype == DType::Q8_0 && q8_lanes()) || dims[1] % 64 == 0)
        // Q5_K and Q6_K have only the integer kernel (`qdot_x16i`), which needs VNNI.
        && (l.high_at.is_none() || super::qdot_vnni::has_vnni())
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
    if l.bytes {
        let (codes, lanes) = (16 * l.head_bytes(), q8_lanes());
        for (c, o) in out[l.codes_at..l.codes_at + 32].iter_mut().enumerate() {
            *o = g[codes + byte_at(lanes, c, r)];
        }
        return;
    }
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
    if l.bytes {
        let (codes, lanes) = (16 * l.head_bytes(), q8_lanes());
        for (c, v) in file[l.codes_at..l.codes_at + 32].iter().enumerate() {
            g[codes + byte_at(lanes, c, r)] = *v;
        }
        return;
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

#[cfg(test)]
#[path = "qdot_x16_tests.rs"]
mod tests;
