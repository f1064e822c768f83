//! The 256-element K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.
//!
//! Dequantization follows ggml's element order and its f32 arithmetic exactly (the group scale
//! `d * sc` is formed first, then multiplied by the code, then the group minimum subtracted),
//! so results match ggml and the `gguf` package bit for bit.
//!
//! The quantizers are kiln's own round-to-nearest ones, not ggml's iterative searches: every
//! group gets the ideal scale (and minimum) for its range, the super-block scales are those
//! divided by the largest integer scale, and each group then picks, among the integer scales
//! (and minimums) next to its ideal, the one with the smallest squared error.

use super::{f16_at, signed_absmax, to_f16};
use crate::tensor::QK_K;

pub(super) const Q2_K_BYTES: usize = QK_K / 16 + QK_K / 4 + 2 + 2;
pub(super) const Q3_K_BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;
pub(super) const Q4_K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;
pub(super) const Q5_K_BYTES: usize = 2 + 2 + 12 + QK_K / 8 + QK_K / 2;
pub(super) const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
pub(super) const Q8_K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);

// ---- shared helpers ---------------------------------------------------------------------------

/// Scale and minimum `j` (0..8) of Q4_K/Q5_K, 6 bits each, from the 12 packed bytes: for
/// `j < 4` the low 6 bits of bytes `j` and `j + 4`; for `j >= 4` a nibble of byte `j + 4` plus
/// the top 2 bits of bytes `j - 4` and `j` as bits 4..6.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The inverse of [`scale_min_k4`] for eight 6-bit scales and mins.
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8], s: &mut [u8]) {
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
}

/// The 16 signed 6-bit scales of Q3_K (stored with offset 32): scale `j` has its low 4 bits in
/// byte `j % 8` (low nibble for `j < 8`, high nibble otherwise) and its top 2 bits in byte
/// `8 + j % 4` at bit `2 * (j / 4)`.
fn unpack_q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        *o = ((lo | (hi << 4)) as i8).wrapping_sub(32);
    }
    out
}

fn pack_q3_k_scales(sc: &[i8; 16], s: &mut [u8]) {
    s[..12].fill(0);
    for (j, &v) in sc.iter().enumerate() {
        let u = (v as i32 + 32).clamp(0, 63) as u8;
        s[j % 8] |= (u & 0x0F) << (4 * (j / 8));
        s[8 + j % 4] |= (u >> 4) << (2 * (j / 4));
    }
}

/// Integer candidates for a scale whose ideal (real) value is `ideal`: floor and ceil, clamped.
#[inline(always)]
fn neighbours(ideal: f32, lo: i32, hi: i32) -> [i32; 2] {
    let f = ideal.floor();
    // NaN or infinite ideals (from non-finite input) saturate in `as` and are clamped.
    [(f as i32).clamp(lo, hi), ((f + 1.0) as i32).clamp(lo, hi)]
}

/// Code for `v` on the grid `offset + step * q`, `q` in `0..=qmax`.
#[inline(always)]
fn code_asym(v: f32, step: f32, offset: f32, qmax: i32) -> i32 {
    if step == 0.0 {
        0
    } else {
        (((v + offset) / step).round() as i32).clamp(0, qmax)
    }
}

/// Code for `v` on the grid `step * q`, `q` in `qlo..=qhi`.
#[inline(always)]
fn code_sym(v: f32, step: f32, qlo: i32, qhi: i32) -> i32 {
    if step == 0.0 {
        0
    } else {
        ((v / step).round() as i32).clamp(qlo, qhi)
    }
}

/// Asymmetric groups (Q2_K, Q4_K, Q5_K): value = `d * sc * q - dmin * m`, `q` in `0..=qmax`,
/// `sc` and `m` in `0..=smax`. Fills `sc`, `m` and the codes `q` of every group of `x`, and
/// returns the f16 bytes of `d` and `dmin`.
fn quant_asym<const G: usize>(
    x: &[f32; QK_K],
    qmax: i32,
    smax: i32,
    sc: &mut [u8; G],
    m: &mut [u8; G],
    q: &mut [u8; QK_K],
) -> ([u8; 2], [u8; 2]) {
    let glen = QK_K / G;
    // Ideal per-group step and (non-negative) minimum to subtract: the grid spans
    // [min(x, 0), max(x)], so that a group of positive values still includes 0 exactly.
    let mut step = [0.0f32; G];
    let mut mins = [0.0f32; G];
    for (g, xs) in x.chunks_exact(glen).enumerate() {
        let lo = xs.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = xs.iter().fold(lo, |a, &v| a.max(v));
        step[g] = (hi - lo) / qmax as f32;
        mins[g] = -lo;
    }
    let max_step = step.iter().fold(0.0f32, |a, &v| a.max(v));
    let max_min = mins.iter().fold(0.0f32, |a, &v| a.max(v));
    let (d_bytes, d) = to_f16(max_step / smax as f32);
    let (dmin_bytes, dmin) = to_f16(max_min / smax as f32);

    for (g, xs) in x.chunks_exact(glen).enumerate() {
        let sc_ideal = if d > 0.0 { step[g] / d } else { 0.0 };
        let m_ideal = if dmin > 0.0 { mins[g] / dmin } else { 0.0 };
        let mut best = (f32::INFINITY, 0, 0);
        for s in neighbours(sc_ideal, 0, smax) {
            for mm in neighbours(m_ideal, 0, smax) {
                let st = d * s as f32;
                let off = dmin * mm as f32;
                let err: f32 = xs
                    .iter()
                    .map(|&v| {
                        let y = st * code_asym(v, st, off, qmax) as f32 - off;
                        (v - y) * (v - y)
                    })
                    .sum();
                if err < best.0 {
                    best = (err, s, mm);
                }
            }
        }
        let (_, s, mm) = best;
        sc[g] = s as u8;
        m[g] = mm as u8;
        let st = d * s as f32;
        let off = dmin * mm as f32;
        for (qv, &v) in q[g * glen..(g + 1) * glen].iter_mut().zip(xs) {
            *qv = code_asym(v, st, off, qmax) as u8;
        }
    }
    (d_bytes, dmin_bytes)
}

/// Symmetric groups of 16 (Q3_K, Q6_K): value = `d * sc * q`, `q` in `qlo..=qhi` (`qlo` < 0),
/// signed `sc` in `slo..=shi`. Each group's element of largest magnitude maps to `qlo`, and the
/// group scale of largest magnitude to `slo`. Fills `sc` and the codes `q`, returns f16 `d`.
fn quant_sym(
    x: &[f32; QK_K],
    qlo: i32,
    qhi: i32,
    slo: i32,
    shi: i32,
    sc: &mut [i8; 16],
    q: &mut [i8; QK_K],
) -> [u8; 2] {
    let mut ideal = [0.0f32; 16];
    for (g, xs) in x.chunks_exact(16).enumerate() {
        ideal[g] = signed_absmax(xs) / qlo as f32;
    }
    let (d_bytes, d) = to_f16(signed_absmax(&ideal) / slo as f32);
    for (g, xs) in x.chunks_exact(16).enumerate() {
        let sc_ideal = if d != 0.0 { ideal[g] / d } else { 0.0 };
        let mut best = (f32::INFINITY, 0);
        for s in neighbours(sc_ideal, slo, shi) {
            let st = d * s as f32;
            let err: f32 = xs
                .iter()
                .map(|&v| {
                    let y = st * code_sym(v, st, qlo, qhi) as f32;
                    (v - y) * (v - y)
                })
                .sum();
            if err < best.0 {
                best = (err, s);
            }
        }
        let s = best.1;
        sc[g] = s as i8;
        let st = d * s as f32;
        for (qv, &v) in q[g * 16..(g + 1) * 16].iter_mut().zip(xs) {
            *qv = code_sym(v, st, qlo, qhi) as i8;
        }
    }
    d_bytes
}

// ---- Q2_K: scales[16] (scale | min << 4), qs[64], f16 d, f16 dmin ----------------------------

#[inline(always)]
pub(super) fn dequant_q2_k(b: &[u8; Q2_K_BYTES], y: &mut [f32; QK_K]) {
    let scales = &b[..16];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    // Two halves of 128; in each, shifts 0, 2, 4, 6 of qs[32h..32h + 32], each shift covering
    // two groups of 16 (qs[0..16] and qs[16..32] of the half).
    for h in 0..2 {
        let qs = &b[16 + 32 * h..16 + 32 * h + 32];
        for s in 0..4 {
            for k in 0..2 {
                let g = 8 * h + 2 * s + k;
                let dl = d * (scales[g] & 0x0F) as f32;
                let ml = dmin * (scales[g] >> 4) as f32;
                let out = &mut y[16 * g..16 * g + 16];
                for (o, &q) in out.iter_mut().zip(&qs[16 * k..16 * k + 16]) {
                    *o = dl * ((q >> (2 * s)) & 3) as f32 - ml;
                }
            }
        }
    }
}

pub(super) fn quant_q2_k(x: &[f32; QK_K], b: &mut [u8; Q2_K_BYTES]) {
    let mut sc = [0u8; 16];
    let mut m = [0u8; 16];
    let mut q = [0u8; QK_K];
    let (d, dmin) = quant_asym(x, 3, 15, &mut sc, &mut m, &mut q);
    for g in 0..16 {
        b[g] = sc[g] | (m[g] << 4);
    }
    let qs = &mut b[16..80];
    qs.fill(0);
    // Element 128h + 32s + l sits in qs[32h + l] at bits 2s.
    for (i, &v) in q.iter().enumerate() {
        let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
        qs[32 * h + l] |= v << (2 * s);
    }
    b[80..82].copy_from_slice(&d);
    b[82..84].copy_from_slice(&dmin);
}

// ---- Q3_K: hmask[32], qs[64], scales[12], f16 d ----------------------------------------------

#[inline(always)]
pub(super) fn dequant_q3_k(b: &[u8; Q3_K_BYTES], y: &mut [f32; QK_K]) {
    let hmask = &b[..32];
    let scales = unpack_q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    // Like Q2_K, with the third bit of element 128h + 32s + l in bit 4h + s of hmask[l]; a
    // clear bit means "subtract 4".
    for h in 0..2 {
        let qs = &b[32 + 32 * h..32 + 32 * h + 32];
        for s in 0..4 {
            let bit = 4 * h + s;
            for k in 0..2 {
                let g = 8 * h + 2 * s + k;
                let dl = d * scales[g] as f32;
                let out = &mut y[16 * g..16 * g + 16];
                let (q, hm) = (&qs[16 * k..16 * k + 16], &hmask[16 * k..16 * k + 16]);
                for ((o, &q), &hm) in out.iter_mut().zip(q).zip(hm) {
                    let low = ((q >> (2 * s)) & 3) as i32;
                    let sub = if (hm >> bit) & 1 != 0 { 0 } else { 4 };
                    *o = dl * (low - sub) as f32;
                }
            }
        }
    }
}

pub(super) fn quant_q3_k(x: &[f32; QK_K], b: &mut [u8; Q3_K_BYTES]) {
    let mut sc = [0i8; 16];
    let mut q = [0i8; QK_K];
    let d = quant_sym(x, -4, 3, -32, 31, &mut sc, &mut q);
    b[..96].fill(0);
    for (i, &v) in q.iter().enumerate() {
        let u = (v as i32 + 4) as u8; // 0..=7
        let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
        b[32 + 32 * h + l] |= (u & 3) << (2 * s);
        b[l] |= (u >> 2) << (4 * h + s);
    }
    pack_q3_k_scales(&sc, &mut b[96..108]);
    b[108..110].copy_from_slice(&d);
}

// ---- Q4_K: f16 d, f16 dmin, scales[12], qs[128] ----------------------------------------------

#[inline(always)]
pub(super) fn dequant_q4_k(b: &[u8; Q4_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    // Four chunks of 64: group 2c from the low nibbles of qs[32c..32c + 32], group 2c + 1 from
    // the high nibbles.
    for c in 0..4 {
        let qs = &b[16 + 32 * c..16 + 32 * c + 32];
        for k in 0..2 {
            let (sc, m) = scale_min_k4(2 * c + k, scales);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            let out = &mut y[64 * c + 32 * k..64 * c + 32 * k + 32];
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = d1 * ((q >> (4 * k)) & 0x0F) as f32 - m1;
            }
        }
    }
}

pub(super) fn quant_q4_k(x: &[f32; QK_K], b: &mut [u8; Q4_K_BYTES]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    let mut q = [0u8; QK_K];
    let (d, dmin) = quant_asym(x, 15, 63, &mut sc, &mut m, &mut q);
    b[0..2].copy_from_slice(&d);
    b[2..4].copy_from_slice(&dmin);
    pack_scale_min_k4(&sc, &m, &mut b[4..16]);
    for c in 0..4 {
        for l in 0..32 {
            b[16 + 32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
        }
    }
}

// ---- Q5_K: f16 d, f16 dmin, scales[12], qh[32], qs[128] --------------------------------------

#[inline(always)]
pub(super) fn dequant_q5_k(b: &[u8; Q5_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    // As Q4_K; bit 4 of group g's element l is bit g of qh[l].
    for c in 0..4 {
        let qs = &b[48 + 32 * c..48 + 32 * c + 32];
        for k in 0..2 {
            let g = 2 * c + k;
            let (sc, m) = scale_min_k4(g, scales);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            let out = &mut y[32 * g..32 * g + 32];
            for ((o, &q), &h) in out.iter_mut().zip(qs).zip(qh) {
                let v = ((q >> (4 * k)) & 0x0F) | (((h >> g) & 1) << 4);
                *o = d1 * v as f32 - m1;
            }
        }
    }
}

pub(super) fn quant_q5_k(x: &[f32; QK_K], b: &mut [u8; Q5_K_BYTES]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    let mut q = [0u8; QK_K];
    let (d, dmin) = quant_asym(x, 31, 63, &mut sc, &mut m, &mut q);
    b[0..2].copy_from_slice(&d);
    b[2..4].copy_from_slice(&dmin);
    pack_scale_min_k4(&sc, &m, &mut b[4..16]);
    b[16..48].fill(0);
    for (i, &v) in q.iter().enumerate() {
        let (g, l) = (i / 32, i % 32);
        b[16 + l] |= (v >> 4) << g;
    }
    for c in 0..4 {
        for l in 0..32 {
            b[48 + 32 * c + l] = (q[64 * c + l] & 0x0F) | (q[64 * c + 32 + l] << 4);
        }
    }
}

// ---- Q6_K: ql[128], qh[64], i8 scales[16], f16 d ---------------------------------------------

#[inline(always)]
pub(super) fn dequant_q6_k(b: &[u8; Q6_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 208);
    // Two halves of 128. In half h, for l in 0..32: ql[64h + l] holds elements l (low nibble)
    // and l + 64 (high), ql[64h + 32 + l] elements l + 32 and l + 96; qh[32h + l] holds their
    // top 2 bits at shifts 0, 2, 4, 6 for elements l, l + 32, l + 64, l + 96.
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        let out = &mut y[128 * h..128 * h + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * sc[is] as i8 as f32 * q1 as f32;
            out[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            out[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            out[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

pub(super) fn quant_q6_k(x: &[f32; QK_K], b: &mut [u8; Q6_K_BYTES]) {
    let mut sc = [0i8; 16];
    let mut q = [0i8; QK_K];
    let d = quant_sym(x, -32, 31, -128, 127, &mut sc, &mut q);
    let u = |i: usize| (q[i] as i32 + 32) as u8; // 0..=63
    for h in 0..2 {
        for l in 0..32 {
            let e = 128 * h + l;
            b[64 * h + l] = (u(e) & 0x0F) | ((u(e + 64) & 0x0F) << 4);
            b[64 * h + 32 + l] = (u(e + 32) & 0x0F) | ((u(e + 96) & 0x0F) << 4);
            b[128 + 32 * h + l] = (u(e) >> 4)
                | ((u(e + 32) >> 4) << 2)
                | ((u(e + 64) >> 4) << 4)
                | ((u(e + 96) >> 4) << 6);
        }
    }
    for (o, &s) in b[192..208].iter_mut().zip(&sc) {
        *o = s as u8;
    }
    b[208..210].copy_from_slice(&d);
}

// ---- Q8_K: f32 d, i8 qs[256], i16 bsums[16] ---------------------------------------------------

#[inline(always)]
pub(super) fn dequant_q8_k(b: &[u8; Q8_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * q as i8 as f32;
    }
}

/// `d = max|x| / 127` (kept as f32), codes `round(x / d)`, and `bsums[g]` the sum of the codes
/// of group `g` of 16 (the dot-product kernels use them to apply the other side's minimums).
pub(super) fn quant_q8_k(x: &[f32; QK_K], b: &mut [u8; Q8_K_BYTES]) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    b[..4].copy_from_slice(&d.to_le_bytes());
    let mut q = [0i8; QK_K];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id).round() as i32).clamp(-127, 127) as i8;
    }
    for (o, &v) in b[4..4 + QK_K].iter_mut().zip(&q) {
        *o = v as u8;
    }
    for (g, qs) in q.chunks_exact(16).enumerate() {
        let sum: i16 = qs.iter().map(|&v| v as i16).sum();
        let at = 4 + QK_K + 2 * g;
        b[at..at + 2].copy_from_slice(&sum.to_le_bytes());
    }
}
