//! The plain element types, one element per "block": f32, f16, bf16 and the two integer types.
//! Everything is little-endian and read byte-wise, so the source need not be aligned.

use half::{bf16, f16};

#[inline(always)]
pub(super) fn dequant_f32(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = f32::from_le_bytes(*b);
}

#[inline(always)]
pub(super) fn dequant_f16(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f16::from_bits(u16::from_le_bytes(*b)).to_f32();
}

/// bf16 is the top half of an f32, so decoding is a shift (NaN payloads survive).
#[inline(always)]
pub(super) fn dequant_bf16(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
}

#[inline(always)]
pub(super) fn dequant_i32(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = i32::from_le_bytes(*b) as f32;
}

#[inline(always)]
pub(super) fn dequant_u32(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = u32::from_le_bytes(*b) as f32;
}

pub(super) fn quant_f32(x: &[f32; 1], b: &mut [u8; 4]) {
    *b = x[0].to_le_bytes();
}

/// Round to nearest even; overflow goes to infinity, as IEEE conversion does.
pub(super) fn quant_f16(x: &[f32; 1], b: &mut [u8; 2]) {
    *b = f16::from_f32(x[0]).to_bits().to_le_bytes();
}

/// Round to nearest even on the dropped 16 bits; a NaN keeps its top bits and is made quiet.
/// This is what ggml's `ggml_compute_fp32_to_bf16` (and gguf's BF16 quantizer) do.
pub(super) fn quant_bf16(x: &[f32; 1], b: &mut [u8; 2]) {
    *b = bf16::from_f32(x[0]).to_bits().to_le_bytes();
}
