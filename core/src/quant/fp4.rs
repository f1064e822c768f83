//! The FP4 (E2M1) formats: MXFP4 (32 values, one E8M0 scale) and NVFP4 (64 values, four
//! sub-blocks of 16 with an unsigned E4M3 scale each).
//!
//! Both store 4-bit E2M1 codes: bit 3 is the sign, bits 0..3 index the magnitudes
//! 0, 0.5, 1, 1.5, 2, 3, 4, 6. Like ggml, kiln keeps those magnitudes doubled as integers
//! ([`KV`]) and halves the block scale instead, so every product is exact in f32.

/// E2M1 values times two, indexed by the 4-bit code (codes 0 and 8 are +0 and -0; both decode
/// to +0.0).
pub(super) const KV: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

pub(super) const MXFP4_BYTES: usize = 1 + 16;
pub(super) const NVFP4_BYTES: usize = 4 + 32;

/// The code whose value `KV[code] * d` is closest to `v`; ties go to the lower code (so 0, not
/// -0). This is ggml's and gguf's choice: errors `|KV * d - v|` in f32, first minimum.
#[inline(always)]
fn best_code(v: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KV[0] as f32 * d - v).abs();
    for (i, &k) in KV.iter().enumerate().skip(1) {
        let err = (k as f32 * d - v).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

// ---- MXFP4: u8 e (E8M0), qs[16] ---------------------------------------------------------------

/// Half of the E8M0 scale `2^(e - 127)`, i.e. `2^(e - 128)`, built from its bits. For e = 0 and
/// e = 1 that is an f32 subnormal (bit 21 or 22 of the mantissa); e = 255 gives 2^127 (E8M0's
/// NaN code is not special-cased, as in ggml).
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Element `j` is the low nibble of `qs[j]`, element `j + 16` the high nibble.
#[inline(always)]
pub(super) fn dequant_mxfp4(b: &[u8; MXFP4_BYTES], y: &mut [f32; 32]) {
    let d = e8m0_half(b[0]);
    for j in 0..16 {
        let q = b[1 + j];
        y[j] = d * KV[(q & 0x0F) as usize] as f32;
        y[j + 16] = d * KV[(q >> 4) as usize] as f32;
    }
}

/// ggml's reference MXFP4 quantizer (bit-identical to gguf's): `e = floor(log2(max|x|)) - 2 +
/// 127`, so that the largest magnitude lands in [4, 8) times the scale (E2M1's top binade is
/// [4, 6] in units of the scale), then the nearest code for each element.
///
/// `log2` is f32's, like ggml's `log2f` and numpy's float32 `log2`: for a maximum just below a
/// power of two it may round up to the exponent of that power, and so does the reference.
/// Maxima below 2^-125 (where the reference's byte conversion would wrap) give e = 0.
pub(super) fn quant_mxfp4(x: &[f32; 32], b: &mut [u8; MXFP4_BYTES]) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let e = if amax > 0.0 {
        // `as u8` saturates: huge or infinite maxima give 255.
        (amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_half(e);
    b[0] = e;
    for j in 0..16 {
        b[1 + j] = best_code(x[j], d) | (best_code(x[j + 16], d) << 4);
    }
}

// ---- NVFP4: u8 scales[4] (UE4M3), qs[32] ------------------------------------------------------

/// Half of the unsigned E4M3 scale (bias 7; bit 7 is ignored): exponent 0 is subnormal,
/// `man * 2^-9`; codes 0x00 and 0x7F (E4M3's NaN) decode to 0, as in ggml and gguf.
#[inline(always)]
pub(super) fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0x0F) as u32;
    let man = (x & 0x07) as f32;
    let raw = if exp == 0 {
        man * f32::from_bits((127 - 9) << 23)
    } else {
        (1.0 + man / 8.0) * f32::from_bits((exp + 127 - 7) << 23)
    };
    raw * 0.5
}

/// Sub-block `s` has its scale in byte `s` and its 16 codes in `qs[8s..8s + 8]`: element `i < 8`
/// in the low nibble of byte `i`, element `i + 8` in its high nibble.
#[inline(always)]
pub(super) fn dequant_nvfp4(b: &[u8; NVFP4_BYTES], y: &mut [f32; 64]) {
    for s in 0..4 {
        let d = ue4m3_half(b[s]);
        let qs = &b[4 + 8 * s..4 + 8 * s + 8];
        let out = &mut y[16 * s..16 * s + 16];
        for i in 0..8 {
            out[i] = d * KV[(qs[i] & 0x0F) as usize] as f32;
            out[i + 8] = d * KV[(qs[i] >> 4) as usize] as f32;
        }
    }
}

/// The finite, non-zero UE4M3 code (1..=0x7E) nearest to `t` (ties to the smaller code). The
/// codes' values increase with the code, so a binary search finds it.
fn nearest_ue4m3(t: f32) -> u8 {
    let (mut lo, mut hi) = (1u8, 0x7Eu8);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ue4m3_half(mid) * 2.0 < t {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo > 1 && t - ue4m3_half(lo - 1) * 2.0 <= ue4m3_half(lo) * 2.0 - t {
        lo - 1
    } else {
        lo
    }
}

/// kiln's NVFP4 quantizer (gguf has none): each sub-block's scale is `max|x| / 6` (6 is E2M1's
/// largest magnitude) rounded to the nearest UE4M3 code; that code and its two neighbours are
/// tried and the one with the smallest squared error kept; then each element takes its nearest
/// code. Values of the form `e2m1 * scale` with the block maximum at ±6·scale come back exactly.
/// An all-zero (or non-finite) sub-block gets scale code 0.
pub(super) fn quant_nvfp4(x: &[f32; 64], b: &mut [u8; NVFP4_BYTES]) {
    for s in 0..4 {
        let xs = &x[16 * s..16 * s + 16];
        let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let code = if amax > 0.0 && amax.is_finite() {
            let c = nearest_ue4m3(amax / 6.0);
            let mut best = (f32::INFINITY, c);
            for cand in [c, c.saturating_add(1), c.saturating_sub(1)] {
                if !(1..=0x7E).contains(&cand) {
                    continue;
                }
                let d = ue4m3_half(cand);
                let err: f32 = xs
                    .iter()
                    .map(|&v| {
                        let y = KV[best_code(v, d) as usize] as f32 * d;
                        (v - y) * (v - y)
                    })
                    .sum();
                if err < best.0 {
                    best = (err, cand);
                }
            }
            best.1
        } else {
            0
        };
        b[s] = code;
        let d = ue4m3_half(code);
        for i in 0..8 {
            b[4 + 8 * s + i] = best_code(xs[i], d) | (best_code(xs[i + 8], d) << 4);
        }
    }
}
