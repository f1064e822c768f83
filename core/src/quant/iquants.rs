//! The i-quants (IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) and
//! the ternary TQ1_0 and TQ2_0: ggml's byte layouts, decoded with the f32 operations of the
//! `gguf` Python package's dequantizers in the same order, so the floats are the same bits
//! (`tests::dequantization_equals_the_gguf_package`).
//!
//! - IQ4_NL (32 values, 18 bytes): f16 `d`, 16 bytes of nibbles (byte j: value j low, j + 16
//!   high), each an index into the 16 non-uniform levels [`KVALUES_IQ4NL`]: `d · level`.
//! - IQ4_XS (256, 136): f16 `d`, the 6-bit scales of the 8 groups of 32 (low 4 bits in
//!   `scales_l`, two nibbles a byte; high 2 bits in the u16 `scales_h`), then 16 bytes of
//!   IQ4_NL nibbles a group: `d · (scale - 32) · level`.
//! - IQ2_XXS (256, 66), IQ2_XS (74), IQ2_S (82), IQ3_XXS (98), IQ3_S (110): f16 `d`, then per
//!   group of 32 an index into a lattice grid for each 8 (IQ2) or 4 (IQ3) values, their signs,
//!   and a 4-bit group (or half-group) scale. Where signs come as 7-bit indices, the eighth
//!   sign makes the count of minus signs even (`ksigns(i) = i | parity(i) << 7`).
//! - IQ1_S (256, 50), IQ1_M (256, 56): 11-bit indices into a grid of {-1, 0, 1} points,
//!   shifted by ±1/8 (`delta`) and scaled by odd 3-bit multiples of `d`; IQ1_M keeps its f16
//!   `d` in the top nibbles of its four scale words.
//! - TQ1_0 (256, 54): 5 or 4 trits a byte, each byte `⌈(Σ t_n 3^(4-n)) · 256 / 243⌉` so the
//!   n-th trit is `((byte · 3^n mod 256) · 3) >> 8`; TQ2_0 (256, 66): 2 bits a value. Values
//!   `(t - 1) · d`, `d` (f16) last.
//!
//! The grids are generated (`iq_grids.rs`, by `scripts/iquant-grids.py`). Quantizers: TQ1_0
//! and TQ2_0 (ggml's reference ones, bit for bit), IQ4_NL and IQ4_XS (llama.cpp's with no
//! importance matrix, bit for bit on blocks llama-quantize wrote); the grid types have none here
//! (llama.cpp's search the grids and, for IQ1 and IQ2, need an importance matrix).

use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::{f16_at, to_f16};

const QK: usize = 256;

pub(super) const IQ4_NL_BYTES: usize = 2 + 16;
pub(super) const IQ4_XS_BYTES: usize = 2 + 2 + 4 + 128;
pub(super) const IQ2_XXS_BYTES: usize = 2 + 64;
pub(super) const IQ2_XS_BYTES: usize = 2 + 64 + 8;
pub(super) const IQ2_S_BYTES: usize = 2 + 32 + 32 + 8 + 8;
pub(super) const IQ3_XXS_BYTES: usize = 2 + 64 + 32;
pub(super) const IQ3_S_BYTES: usize = 2 + 64 + 8 + 32 + 4;
pub(super) const IQ1_S_BYTES: usize = 2 + 32 + 16;
pub(super) const IQ1_M_BYTES: usize = 32 + 16 + 8;
pub(super) const TQ1_0_BYTES: usize = 48 + 4 + 2;
pub(super) const TQ2_0_BYTES: usize = 64 + 2;

/// The grids as one table of little-endian words, for GPU kernels that read them from memory:
/// each grid's points in order, a point of 8 coordinates as two words (low, then high), of 4
/// as one; [`IQ_GRID_OFFSETS`] names each grid's first word.
pub fn iq_grid_words() -> Vec<u32> {
    let mut w = Vec::with_capacity(IQ_GRID_WORDS);
    for g in [&IQ2XXS_GRID[..], &IQ2XS_GRID[..], &IQ2S_GRID[..]] {
        w.extend(g.iter().flat_map(|&p| [p as u32, (p >> 32) as u32]));
    }
    w.extend_from_slice(&IQ3XXS_GRID);
    w.extend_from_slice(&IQ3S_GRID);
    w.extend(IQ1S_GRID.iter().flat_map(|&p| [p as u32, (p >> 32) as u32]));
    w
}

/// Each grid's first word in [`iq_grid_words`].
pub const IQ_GRID_OFFSETS: [(&str, usize); 6] = [
    ("IQ2XXS", 0),
    ("IQ2XS", 512),
    ("IQ2S", 512 + 1024),
    ("IQ3XXS", 512 + 1024 + 2048),
    ("IQ3S", 512 + 1024 + 2048 + 256),
    ("IQ1S", 512 + 1024 + 2048 + 256 + 512),
];

/// The words of [`iq_grid_words`].
pub const IQ_GRID_WORDS: usize = 512 + 1024 + 2048 + 256 + 512 + 4096;

/// IQ4_NL's 16 levels (IQ4_XS's too).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL's levels plus 128 (1..=241: their top bit flipped), as the integer kernels take
/// them unsigned.
pub(crate) const KVALUES_IQ4NL_U8: [u8; 16] = {
    let mut l = [0u8; 16];
    let mut j = 0;
    while j < 16 {
        l[j] = (KVALUES_IQ4NL[j] as i16 + 128) as u8;
        j += 1;
    }
    l
};

/// IQ1's shift of every grid coordinate.
const IQ1_DELTA: f32 = 0.125;

/// The 8 signs of a 7-bit sign index: bit j set = value j negative; bit 7 makes the count of
/// set bits even.
#[inline(always)]
pub(crate) fn ksigns(i: u32) -> u32 {
    let i = i & 0x7F;
    i | ((i.count_ones() & 1) << 7)
}

#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u32 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u32
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// ±1 for sign bit `j` of `signs` (set = negative).
#[inline(always)]
fn sign(signs: u32, j: usize) -> f32 {
    if (signs >> j) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// Writes the 8 values `db · grid coordinate · sign` of one IQ2 grid point.
#[inline(always)]
fn put8(y: &mut [f32], db: f32, point: u64, signs: u32) {
    for (j, v) in y.iter_mut().take(8).enumerate() {
        *v = db * ((point >> (8 * j)) & 0xFF) as f32 * sign(signs, j);
    }
}

/// The same for one IQ3 point (4 coordinates), signs `signs >> shift`.
#[inline(always)]
fn put4(y: &mut [f32], db: f32, point: u32, signs: u32, shift: usize) {
    for (j, v) in y.iter_mut().take(4).enumerate() {
        *v = db * ((point >> (8 * j)) & 0xFF) as f32 * sign(signs, shift + j);
    }
}

#[inline(always)]
pub(super) fn dequant_iq4_nl(b: &[u8; IQ4_NL_BYTES], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0x0F) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
    }
}

#[inline(always)]
pub(super) fn dequant_iq4_xs(b: &[u8; IQ4_XS_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    for ib in 0..8 {
        let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let hi = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * ((lo | (hi << 4)) as i32 - 32) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let out = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            out[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
            out[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

#[inline(always)]
pub(super) fn dequant_iq2_xxs(b: &[u8; IQ2_XXS_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let at = 2 + 8 * ib;
        let aux = u32_at(b, at + 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let point = IQ2XXS_GRID[b[at + l] as usize];
            let signs = ksigns(aux >> (7 * l));
            put8(&mut y[32 * ib + 8 * l..], db, point, signs);
        }
    }
}

#[inline(always)]
pub(super) fn dequant_iq2_xs(b: &[u8; IQ2_XS_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let sc = b[66 + ib];
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let s = if l < 2 { sc & 0x0F } else { sc >> 4 };
            let db = d * (0.5 + s as f32) * 0.25;
            put8(
                &mut y[32 * ib + 8 * l..],
                db,
                IQ2XS_GRID[(q & 511) as usize],
                ksigns(q >> 9),
            );
        }
    }
}

#[inline(always)]
pub(super) fn dequant_iq2_s(b: &[u8; IQ2_S_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let sc = b[74 + ib];
        let qh = b[66 + ib] as usize;
        for l in 0..4 {
            let idx = b[2 + 4 * ib + l] as usize | (((qh >> (2 * l)) & 3) << 8);
            let s = if l < 2 { sc & 0x0F } else { sc >> 4 };
            let db = d * (0.5 + s as f32) * 0.25;
            let signs = b[34 + 4 * ib + l] as u32;
            put8(&mut y[32 * ib + 8 * l..], db, IQ2S_GRID[idx], signs);
        }
    }
}

#[inline(always)]
pub(super) fn dequant_iq3_xxs(b: &[u8; IQ3_XXS_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = ksigns(aux >> (7 * l));
            let q = 2 + 8 * ib + 2 * l;
            let out = &mut y[32 * ib + 8 * l..];
            put4(out, db, IQ3XXS_GRID[b[q] as usize], signs, 0);
            put4(&mut out[4..], db, IQ3XXS_GRID[b[q + 1] as usize], signs, 4);
        }
    }
}

#[inline(always)]
pub(super) fn dequant_iq3_s(b: &[u8; IQ3_S_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let db = d * (1 + 2 * s as u32) as f32;
        for l in 0..4 {
            let signs = b[74 + 4 * ib + l] as u32;
            let out = &mut y[32 * ib + 8 * l..];
            for h in 0..2 {
                let i = 8 * ib + 2 * l + h; // the point's index among the block's 64
                let idx = b[2 + i] as usize | ((((b[66 + i / 8] >> (i % 8)) & 1) as usize) << 8);
                put4(&mut out[4 * h..], db, IQ3S_GRID[idx], signs, 4 * h);
            }
        }
    }
}

/// The 8 values of one IQ1 grid point: `dl · (coordinate + delta)`.
#[inline(always)]
fn put_iq1(y: &mut [f32], dl: f32, point: u64, delta: f32) {
    for (j, v) in y.iter_mut().take(8).enumerate() {
        *v = dl * (((point >> (8 * j)) & 0xFF) as u8 as i8 as f32 + delta);
    }
}

#[inline(always)]
pub(super) fn dequant_iq1_s(b: &[u8; IQ1_S_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 == 0 {
            IQ1_DELTA
        } else {
            -IQ1_DELTA
        };
        for l in 0..4 {
            let idx = b[2 + 4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            put_iq1(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[idx], delta);
        }
    }
}

#[inline(always)]
pub(super) fn dequant_iq1_m(b: &[u8; IQ1_M_BYTES], y: &mut [f32; QK]) {
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000);
    let d = half::f16::from_bits(bits as u16).to_f32();
    for (i, out) in y.chunks_exact_mut(8).enumerate() {
        // Point i (of 32): index bits from nibble i % 2 of qh byte i / 2 (bit 3: delta's sign);
        // scale i / 2 (3 bits) from word i / 8.
        let nib = (b[32 + i / 2] >> (4 * (i % 2))) & 0x0F;
        let idx = b[i] as usize | (((nib & 7) as usize) << 8);
        let k = i / 2;
        let s = (sc[k / 4] >> (3 * (k % 4))) & 7;
        let dl = d * (2 * s + 1) as f32;
        let delta = if nib & 0x08 == 0 {
            IQ1_DELTA
        } else {
            -IQ1_DELTA
        };
        put_iq1(out, dl, IQ1S_GRID[idx], delta);
    }
}

/// Powers of three for the trits of a TQ1_0 byte.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

#[inline(always)]
fn trit(byte: u8, n: usize) -> f32 {
    (((byte.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as i32 - 1) as f32
}

#[inline(always)]
pub(super) fn dequant_tq1_0(b: &[u8; TQ1_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 52);
    // 32 bytes of 5 trits (values n·32 + m), 16 of 5 (160 + n·16 + m), 4 of 4 (240 + n·4 + m).
    for n in 0..5 {
        for m in 0..32 {
            y[32 * n + m] = d * trit(b[m], n);
        }
        for m in 0..16 {
            y[160 + 16 * n + m] = d * trit(b[32 + m], n);
        }
    }
    for n in 0..4 {
        for m in 0..4 {
            y[240 + 4 * n + m] = d * trit(b[48 + m], n);
        }
    }
}

#[inline(always)]
pub(super) fn dequant_tq2_0(b: &[u8; TQ2_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 64);
    for h in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = (b[32 * h + m] >> (2 * l)) & 3;
                y[128 * h + 32 * l + m] = d * (q as i32 - 1) as f32;
            }
        }
    }
}

/// The index of the IQ4_NL level nearest `x` (ggml's choice: by bisection, a tie between two
/// levels to the upper one).
#[inline(always)]
fn nearest_level(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The scale of a group of 32 for the IQ4 levels, by ggml's reference search with no
/// importance matrix (each value weighs x²): the scale that puts the largest-magnitude value
/// on the -127 level, refit by weighted least squares, then 15 scales around it, each refit,
/// the best fit kept. 0 for a group whose largest magnitude is below 1e-15.
fn iq4_group_scale(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    // Σ w·q·x and Σ w·q² of the levels nearest id·x, w = x², in the reference's order.
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &v in x {
            let q = KVALUES_IQ4NL[nearest_level(id * v) as usize] as f32;
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let (sumqx, sumq2) = fit(1.0 / (-max / v0));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -7..=7 {
        let (sumqx, sumq2) = fit((itry as f32 + v0) / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 level indices as IQ4 nibbles: byte j holds value j low, j + 16 high.
#[inline(always)]
fn pack_iq4(l: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[j + 16] << 4);
    }
}

/// IQ4_NL as llama.cpp's quantizer writes it with no importance matrix (bit for bit: a test
/// checks blocks it made).
pub(super) fn quant_iq4_nl(x: &[f32; 32], b: &mut [u8; IQ4_NL_BYTES]) {
    let d = iq4_group_scale(x);
    b[..2].copy_from_slice(&to_f16(d).0);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let l: Vec<u8> = x.iter().map(|&v| nearest_level(id * v)).collect();
    pack_iq4(&l, &mut b[2..]);
}

/// IQ4_XS as llama.cpp's quantizer writes it with no importance matrix: each group's scale
/// searched as IQ4_NL's, the block's `d` = -(the largest-magnitude group scale) / 32, each group
/// scale rounded to a multiple of `d` in -32..=31 and its values re-matched to the levels at it.
pub(super) fn quant_iq4_xs(x: &[f32; QK], b: &mut [u8; IQ4_XS_BYTES]) {
    let mut scales = [0f32; 8];
    let (mut amax, mut max) = (0f32, 0f32);
    for (g, s) in scales.iter_mut().enumerate() {
        *s = iq4_group_scale(&x[32 * g..32 * g + 32]);
        if s.abs() > amax {
            amax = s.abs();
            max = *s;
        }
    }
    let d = -max / 32.0;
    b[..2].copy_from_slice(&to_f16(d).0);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    b[4..8].fill(0);
    for (g, &s) in scales.iter().enumerate() {
        let l = ((id * s).round_ties_even() as i32).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let levels: Vec<u8> = x[32 * g..32 * g + 32]
            .iter()
            .map(|&v| nearest_level(idl * v))
            .collect();
        pack_iq4(&levels, &mut b[8 + 16 * g..8 + 16 * g + 16]);
        let u = (l + 32) as u8;
        b[4 + g / 2] |= (u & 0x0F) << (4 * (g % 2));
        scales_h |= ((u >> 4) as u16) << (2 * g);
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

/// Each value as a trit 0, 1, 2 (for -1, 0, 1 times `d` = max |x|), and `d` as f16: ggml's
/// reference choice (round half away from zero of x / d).
#[inline(always)]
fn ternary(x: &[f32; QK]) -> ([u8; QK], [u8; 2]) {
    let d = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut t = [0u8; QK];
    for (q, &v) in t.iter_mut().zip(x) {
        // Clamped: a NaN or an infinity gives some trit, never an out-of-range one.
        *q = ((v * id).round().clamp(-1.0, 1.0) as i8 + 1) as u8;
    }
    (t, to_f16(d).0)
}

pub(super) fn quant_tq1_0(x: &[f32; QK], b: &mut [u8; TQ1_0_BYTES]) {
    let (t, d) = ternary(x);
    let pack = |trits: &mut dyn Iterator<Item = u8>| -> u8 {
        let v = trits.fold(0u16, |a, q| a * 3 + q as u16);
        ((v * 256 + 242) / 243) as u8
    };
    for m in 0..32 {
        b[m] = pack(&mut (0..5).map(|n| t[32 * n + m]));
    }
    for m in 0..16 {
        b[32 + m] = pack(&mut (0..5).map(|n| t[160 + 16 * n + m]));
    }
    for m in 0..4 {
        // Four trits, weighted 81, 27, 9, 3 (the fifth is an implied 0).
        let v: u16 = (0..4).fold(0u16, |a, n| a * 3 + t[240 + 4 * n + m] as u16) * 3;
        b[48 + m] = ((v * 256 + 242) / 243) as u8;
    }
    b[52..54].copy_from_slice(&d);
}

pub(super) fn quant_tq2_0(x: &[f32; QK], b: &mut [u8; TQ2_0_BYTES]) {
    let (t, d) = ternary(x);
    for h in 0..2 {
        for m in 0..32 {
            b[32 * h + m] = (0..4).fold(0u8, |a, l| a | (t[128 * h + 32 * l + m] << (2 * l)));
        }
    }
    b[64..66].copy_from_slice(&d);
}

#[cfg(test)]
mod tests {
    use super::super::{dequantize, quantize, random_blocks};
    use super::*;
    use crate::rng::Rng;
    use crate::tensor::DType;
    use sha2::{Digest, Sha256};

    fn fixture() -> serde_json::Value {
        serde_json::from_str(include_str!("../../../tests/fixtures/quant/iquants.json"))
            .expect("fixture JSON")
    }

    /// kiln's dequantization of every i-quant equals the `gguf` package's (0.19.0) bit for bit
    /// on 4096 random blocks (every grid point drawn many times): the SHA-256 of the f32
    /// output, and its first values for a readable failure.
    #[test]
    fn dequantization_equals_the_gguf_package() {
        let fx = fixture();
        for dtype in DType::IQUANTS {
            let f = &fx[dtype.name()];
            let blocks = f["blocks"].as_u64().expect("blocks") as usize;
            let seed = f["seed"].as_u64().expect("seed");
            let src = random_blocks(dtype, blocks, &mut Rng::with_state(seed));
            assert_dequantizes_as(dtype, &src, f, "random blocks");
        }
    }

    /// `src` dequantizes to the fixture entry `f`'s values: its first ones, and the SHA-256 of
    /// all of them as little-endian f32.
    fn assert_dequantizes_as(dtype: DType, src: &[u8], f: &serde_json::Value, what: &str) {
        let block = dtype
            .bytes_for(dtype.block_size())
            .expect("a block's bytes");
        assert_eq!(src.len() % block, 0, "{dtype}");
        let mut y = vec![0.0f32; src.len() / block * dtype.block_size()];
        dequantize(dtype, src, &mut y).unwrap();
        let first: Vec<f32> = f["first"]
            .as_array()
            .expect("first")
            .iter()
            .map(|v| v.as_f64().expect("a number") as f32)
            .collect();
        assert_eq!(
            &y[..first.len()],
            &first[..],
            "{dtype} ({what}): first values"
        );
        let bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let digest = format!("{:x}", Sha256::digest(&bytes));
        assert_eq!(
            digest,
            f["sha256"].as_str().expect("sha256"),
            "{dtype} ({what})"
        );
    }

    /// The same on blocks llama.cpp's llama-quantize wrote (real encoder output: the first 16
    /// blocks of a tensor of each type in requantized SmolLM2 and Gemma 3 files, stored in the
    /// fixture).
    #[test]
    fn dequantization_of_llama_quantize_blocks_equals_the_gguf_package() {
        let fx = fixture();
        for dtype in DType::IQUANTS {
            let f = &fx[dtype.name()]["made"];
            let hex = f["hex"]
                .as_str()
                .unwrap_or_else(|| panic!("{dtype}: no made blocks"));
            let src: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            let source = f["source"].as_str().unwrap_or("?");
            assert_dequantizes_as(dtype, &src, f, source);
        }
    }

    /// IQ4_NL and IQ4_XS quantize as llama.cpp's llama-quantize does with no importance
    /// matrix, bit for bit: rows of SmolLM2's weights in f32, and the blocks it wrote of them.
    #[test]
    fn iq4_quantization_equals_llama_quantize() {
        let fx = fixture();
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
                .collect()
        };
        for dtype in [DType::IQ4_NL, DType::IQ4_XS] {
            let cases = fx[dtype.name()]["quantized_made"]
                .as_array()
                .unwrap_or_else(|| panic!("{dtype}: no quantized rows"));
            assert!(!cases.is_empty());
            for c in cases {
                let x: Vec<f32> = hex(c["values"].as_str().expect("values"))
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                let want = hex(c["blocks"].as_str().expect("blocks"));
                let got = quantize(dtype, &x).unwrap();
                assert_eq!(got.len(), want.len(), "{dtype} {}", c["source"]);
                let block = dtype
                    .bytes_for(dtype.block_size())
                    .expect("a block's bytes");
                if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                    panic!(
                        "{dtype} {}: byte {i} (block {}) differs: {:02x?} vs {:02x?}",
                        c["source"],
                        i / block,
                        &got[i / block * block..(i / block + 1) * block],
                        &want[i / block * block..(i / block + 1) * block]
                    );
                }
            }
        }
    }

    /// TQ1_0 and TQ2_0 quantize as the `gguf` package does (ggml's reference), bit for bit.
    #[test]
    fn ternary_quantization_equals_the_gguf_package() {
        let fx = fixture();
        for dtype in [DType::TQ1_0, DType::TQ2_0] {
            let f = &fx[dtype.name()]["quantized"];
            let mut rng = Rng::with_state(f["seed"].as_u64().expect("seed"));
            let n = f["values"].as_u64().expect("values") as usize;
            // Uniform in [-1, 1) with every 97th value an exact zero (no draw for it), as the
            // script draws them.
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 97 == 0 {
                        0.0
                    } else {
                        ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
                    }
                })
                .collect();
            let q = quantize(dtype, &x).unwrap();
            let digest = format!("{:x}", Sha256::digest(&q));
            assert_eq!(digest, f["sha256"].as_str().expect("sha256"), "{dtype}");
            // And the round trip: every value within d/2 of its input.
            let mut y = vec![0.0f32; n];
            dequantize(dtype, &q, &mut y).unwrap();
            for (b, (xs, ys)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
                let d = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                for (a, c) in xs.iter().zip(ys) {
                    assert!(
                        (a - c).abs() <= 0.5 * d * 1.001 + 1e-6,
                        "{dtype} block {b}: {a} -> {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_word_table_holds_every_grid_at_its_offset() {
        let w = iq_grid_words();
        assert_eq!(w.len(), IQ_GRID_WORDS);
        let at = |name: &str| {
            IQ_GRID_OFFSETS
                .iter()
                .find(|g| g.0 == name)
                .map(|g| g.1)
                .unwrap_or(usize::MAX)
        };
        let two = |o: usize, i: usize| w[o + 2 * i] as u64 | (w[o + 2 * i + 1] as u64) << 32;
        for i in 0..IQ2XXS_GRID.len() {
            assert_eq!(two(at("IQ2XXS"), i), IQ2XXS_GRID[i]);
        }
        for i in 0..IQ2XS_GRID.len() {
            assert_eq!(two(at("IQ2XS"), i), IQ2XS_GRID[i]);
        }
        for i in 0..IQ2S_GRID.len() {
            assert_eq!(two(at("IQ2S"), i), IQ2S_GRID[i]);
        }
        assert_eq!(w[at("IQ3XXS")..at("IQ3XXS") + 256], IQ3XXS_GRID[..]);
        assert_eq!(w[at("IQ3S")..at("IQ3S") + 512], IQ3S_GRID[..]);
        for i in 0..IQ1S_GRID.len() {
            assert_eq!(two(at("IQ1S"), i), IQ1S_GRID[i]);
        }
    }

    #[test]
    fn sign_indices_complete_to_an_even_count() {
        for i in 0..128u32 {
            let s = super::ksigns(i);
            assert_eq!(s & 0x7F, i);
            assert_eq!(s.count_ones() % 2, 0, "{i}");
        }
    }
}
