//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
//!
//! In the 4- and 5-bit formats byte `j` of `qs` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble; the 5-bit formats keep bit 4 of element `j` in bit `j` of the
//! little-endian u32 `qh`.
//!
//! The quantizers reproduce ggml's reference ones (and so the `gguf` Python package's) bit for
//! bit: the same f32 operations in the same order, f16 scales rounded to nearest even.

use super::{f16_at, signed_absmax, to_f16};

const QK: usize = 32;

pub(super) const Q4_0_BYTES: usize = 2 + QK / 2;
pub(super) const Q4_1_BYTES: usize = 4 + QK / 2;
pub(super) const Q5_0_BYTES: usize = 2 + 4 + QK / 2;
pub(super) const Q5_1_BYTES: usize = 4 + 4 + QK / 2;
pub(super) const Q8_0_BYTES: usize = 2 + QK;

// ---- dequantize -------------------------------------------------------------------------------

#[inline(always)]
pub(super) fn dequant_q4_0(b: &[u8; Q4_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qs = &b[2..];
    for j in 0..QK / 2 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

#[inline(always)]
pub(super) fn dequant_q4_1(b: &[u8; Q4_1_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..];
    for j in 0..QK / 2 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
    }
}

#[inline(always)]
pub(super) fn dequant_q5_0(b: &[u8; Q5_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..];
    for j in 0..QK / 2 {
        let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        y[j] = (lo as i32 - 16) as f32 * d;
        y[j + QK / 2] = (hi as i32 - 16) as f32 * d;
    }
}

#[inline(always)]
pub(super) fn dequant_q5_1(b: &[u8; Q5_1_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..];
    for j in 0..QK / 2 {
        let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        y[j] = lo as f32 * d + m;
        y[j + QK / 2] = hi as f32 * d + m;
    }
}

#[inline(always)]
pub(super) fn dequant_q8_0(b: &[u8; Q8_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..]) {
        *y = q as i8 as f32 * d;
    }
}

// ---- quantize ---------------------------------------------------------------------------------

/// `1 / d`, or 0 for a zero scale (an all-zero block).
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    for &v in &x[1..] {
        min = min.min(v);
        max = max.max(v);
    }
    (min, max)
}

/// Packs 32 4-bit codes: element `j` low nibble, element `j + 16` high nibble.
#[inline(always)]
fn pack_nibbles(q: &[u8; QK], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | (q[j + QK / 2] << 4);
    }
}

/// Bit 4 of every 5-bit code, element `j` in bit `j`.
#[inline(always)]
fn high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= u32::from((v >> 4) & 1) << j;
    }
    qh.to_le_bytes()
}

/// Symmetric 4 bits: the element of largest magnitude maps to -8, `d = max / -8`, and each code
/// is `trunc(x / d + 8.5)` capped at 15 (so +8d, which cannot be stored, becomes 7).
pub(super) fn quant_q4_0(x: &[f32; QK], b: &mut [u8; Q4_0_BYTES]) {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        // `as u8` truncates toward zero (and saturates), like C's conversion in range.
        *q = ((v * id + 8.5) as u8).min(15);
    }
    b[..2].copy_from_slice(&to_f16(d).0);
    pack_nibbles(&q, &mut b[2..]);
}

/// Asymmetric 4 bits: `d = (max - min) / 15`, codes `trunc((x - min) / d + 0.5)`, `m = min`.
pub(super) fn quant_q4_1(x: &[f32; QK], b: &mut [u8; Q4_1_BYTES]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v - min) * id + 0.5) as u8).min(15);
    }
    b[..2].copy_from_slice(&to_f16(d).0);
    b[2..4].copy_from_slice(&to_f16(min).0);
    pack_nibbles(&q, &mut b[4..]);
}

/// Symmetric 5 bits: like Q4_0 with `d = max / -16` and offset 16.
pub(super) fn quant_q5_0(x: &[f32; QK], b: &mut [u8; Q5_0_BYTES]) {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id + 16.5) as u8).min(31);
    }
    b[..2].copy_from_slice(&to_f16(d).0);
    b[2..6].copy_from_slice(&high_bits(&q));
    pack_nibbles(&q, &mut b[6..]);
}

/// Asymmetric 5 bits: like Q4_1 with 31 steps.
pub(super) fn quant_q5_1(x: &[f32; QK], b: &mut [u8; Q5_1_BYTES]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v - min) * id + 0.5) as u8).min(31);
    }
    b[..2].copy_from_slice(&to_f16(d).0);
    b[2..4].copy_from_slice(&to_f16(min).0);
    b[4..8].copy_from_slice(&high_bits(&q));
    pack_nibbles(&q, &mut b[8..]);
}

/// 8 bits: `d = max|x| / 127`, codes `round(x / d)` with halves away from zero.
pub(super) fn quant_q8_0(x: &[f32; QK], b: &mut [u8; Q8_0_BYTES]) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    b[..2].copy_from_slice(&to_f16(d).0);
    for (q, &v) in b[2..].iter_mut().zip(x) {
        // f32::round rounds halves away from zero, as ggml's roundf and gguf's np_roundf do.
        *q = (v * id).round() as i8 as u8;
    }
}
