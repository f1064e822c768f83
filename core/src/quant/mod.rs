//! Block formats: [`dequantize`] turns the bytes of any [`DType`] into f32, and [`quantize`]
//! turns f32 into any format that has a reference quantizer ([`quantize_supported`]).
//!
//! Byte layouts are ggml's (little-endian, f16 = IEEE half), so GGUF tensor data can be passed
//! straight in. Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 and BF16 quantize bit-identically to the
//! `gguf` Python package (0.19.0); the K-quants and NVFP4 use simple round-to-nearest
//! quantizers of kiln's own with a small search for each group's scale.
//!
//! One file per family: [`float`](self) conversions, the legacy 32-element formats, the
//! 256-element K-quants and the two FP4 formats.

mod float;
mod fp4;
pub(crate) mod iq_grids;
pub(crate) mod iquants;
pub use iquants::{iq_grid_words, IQ_GRID_OFFSETS, IQ_GRID_WORDS};
mod k_quants;
mod kv_rows;
mod legacy;
pub mod turbo;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tensor::DType;

/// Outputs of at least this many elements are (de)quantized on the rayon pool.
const PAR_MIN_ELEMS: usize = 1 << 16;
/// Elements per rayon task (rounded to whole blocks).
const PAR_CHUNK_ELEMS: usize = 1 << 14;

/// Decodes `dst.len()` elements of `dtype` from `src` (little-endian, as stored in GGUF).
///
/// `src.len()` must be exactly `dtype.bytes_for(dst.len())`. Any bytes are accepted: garbage
/// gives garbage floats (NaN and infinities included), never a panic. `src` need not be aligned.
/// I32 and U32 are converted numerically (rounding to the nearest f32 above 2^24).
#[inline]
pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let want = dtype.bytes_for(dst.len()).ok_or_else(|| {
        Error::quant(
            dtype,
            format!(
                "dequantize: {} output elements is not a multiple of the block size {}",
                dst.len(),
                dtype.block_size()
            ),
        )
    })?;
    if src.len() != want {
        return Err(Error::quant(
            dtype,
            format!(
                "dequantize: {} elements need {want} bytes, got {} bytes",
                dst.len(),
                src.len()
            ),
        ));
    }
    match dtype {
        DType::F32 => for_each_block(src, dst, float::dequant_f32),
        DType::F16 => for_each_block(src, dst, float::dequant_f16),
        DType::BF16 => for_each_block(src, dst, float::dequant_bf16),
        DType::I32 => for_each_block(src, dst, float::dequant_i32),
        DType::U32 => for_each_block(src, dst, float::dequant_u32),
        DType::Q4_0 => for_each_block(src, dst, legacy::dequant_q4_0),
        DType::Q4_1 => for_each_block(src, dst, legacy::dequant_q4_1),
        DType::Q5_0 => for_each_block(src, dst, legacy::dequant_q5_0),
        DType::Q5_1 => for_each_block(src, dst, legacy::dequant_q5_1),
        DType::Q8_0 => for_each_block(src, dst, legacy::dequant_q8_0),
        DType::Q2_K => for_each_block(src, dst, k_quants::dequant_q2_k),
        DType::Q3_K => for_each_block(src, dst, k_quants::dequant_q3_k),
        DType::Q4_K => for_each_block(src, dst, k_quants::dequant_q4_k),
        DType::Q5_K => for_each_block(src, dst, k_quants::dequant_q5_k),
        DType::Q6_K => for_each_block(src, dst, k_quants::dequant_q6_k),
        DType::Q8_K => for_each_block(src, dst, k_quants::dequant_q8_k),
        DType::MXFP4 => for_each_block(src, dst, fp4::dequant_mxfp4),
        DType::NVFP4 => for_each_block(src, dst, fp4::dequant_nvfp4),
        DType::IQ2_XXS => for_each_block(src, dst, iquants::dequant_iq2_xxs),
        DType::IQ2_XS => for_each_block(src, dst, iquants::dequant_iq2_xs),
        DType::IQ3_XXS => for_each_block(src, dst, iquants::dequant_iq3_xxs),
        DType::IQ1_S => for_each_block(src, dst, iquants::dequant_iq1_s),
        DType::IQ4_NL => for_each_block(src, dst, iquants::dequant_iq4_nl),
        DType::IQ3_S => for_each_block(src, dst, iquants::dequant_iq3_s),
        DType::IQ2_S => for_each_block(src, dst, iquants::dequant_iq2_s),
        DType::IQ4_XS => for_each_block(src, dst, iquants::dequant_iq4_xs),
        DType::IQ1_M => for_each_block(src, dst, iquants::dequant_iq1_m),
        DType::TQ1_0 => for_each_block(src, dst, iquants::dequant_tq1_0),
        DType::TQ2_0 => for_each_block(src, dst, iquants::dequant_tq2_0),
        DType::TQ4 => for_each_block(src, dst, turbo::dequant_tq4),
        DType::TQ3 => for_each_block(src, dst, turbo::dequant_tq3),
        DType::TQ2 => for_each_block(src, dst, turbo::dequant_tq2),
        DType::TQ4P => for_each_block(src, dst, turbo::dequant_tq4p),
        DType::TQ3P => for_each_block(src, dst, turbo::dequant_tq3p),
        DType::TQ3T => for_each_block(src, dst, turbo::dequant_tq3t),
        DType::TQ2T => for_each_block(src, dst, turbo::dequant_tq2t),
    }
    Ok(())
}

/// [`dequantize`] for one row on the calling thread, inlined into its caller so hot loops
/// (matmul, attention) get the block decoders compiled with their target features.
/// `src.len()` must be exactly `dtype.bytes_for(dst.len())`; otherwise nothing is written.
#[inline(always)]
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    // A macro rather than a generic helper: direct calls of the `#[inline(always)]` block
    // decoders, so they are inlined into the caller's target features.
    macro_rules! each {
        ($f:path) => {
            for (s, d) in src
                .chunks_exact(dtype.type_size())
                .zip(dst.chunks_exact_mut(dtype.block_size()))
            {
                if let (Ok(s), Ok(d)) = (s.try_into(), d.try_into()) {
                    $f(s, d);
                }
            }
        };
    }
    if dtype.bytes_for(dst.len()) != Some(src.len()) {
        return;
    }
    match dtype {
        DType::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        // Sixteen at a time with AVX-512, else eight where the CPU converts halves (F16C):
        // attention reads f16 caches a row at a time through here (exact either way).
        DType::F16 if kv_rows::dequant_row(dtype, src, dst) => {}
        DType::F16 => match bytemuck::try_cast_slice::<u8, half::f16>(src) {
            Ok(h) => half::slice::HalfFloatSliceExt::convert_to_f32_slice(h, dst),
            Err(_) => each!(float::dequant_f16),
        },
        DType::BF16 => each!(float::dequant_bf16),
        DType::I32 => each!(float::dequant_i32),
        DType::U32 => each!(float::dequant_u32),
        DType::Q4_0 => each!(legacy::dequant_q4_0),
        DType::Q4_1 => each!(legacy::dequant_q4_1),
        DType::Q5_0 => each!(legacy::dequant_q5_0),
        DType::Q5_1 => each!(legacy::dequant_q5_1),
        DType::Q8_0 if kv_rows::dequant_row(dtype, src, dst) => {}
        DType::Q8_0 => each!(legacy::dequant_q8_0),
        DType::Q2_K => each!(k_quants::dequant_q2_k),
        DType::Q3_K => each!(k_quants::dequant_q3_k),
        DType::Q4_K => each!(k_quants::dequant_q4_k),
        DType::Q5_K => each!(k_quants::dequant_q5_k),
        DType::Q6_K => each!(k_quants::dequant_q6_k),
        DType::Q8_K => each!(k_quants::dequant_q8_k),
        DType::MXFP4 => each!(fp4::dequant_mxfp4),
        DType::NVFP4 => each!(fp4::dequant_nvfp4),
        DType::IQ2_XXS => each!(iquants::dequant_iq2_xxs),
        DType::IQ2_XS => each!(iquants::dequant_iq2_xs),
        DType::IQ3_XXS => each!(iquants::dequant_iq3_xxs),
        DType::IQ1_S => each!(iquants::dequant_iq1_s),
        DType::IQ4_NL => each!(iquants::dequant_iq4_nl),
        DType::IQ3_S => each!(iquants::dequant_iq3_s),
        DType::IQ2_S => each!(iquants::dequant_iq2_s),
        DType::IQ4_XS => each!(iquants::dequant_iq4_xs),
        DType::IQ1_M => each!(iquants::dequant_iq1_m),
        DType::TQ1_0 => each!(iquants::dequant_tq1_0),
        DType::TQ2_0 => each!(iquants::dequant_tq2_0),
        DType::TQ4 | DType::TQ3 | DType::TQ2 | DType::TQ3T | DType::TQ2T
            if kv_rows::dequant_row(dtype, src, dst) => {}
        DType::TQ4 => each!(turbo::dequant_tq4),
        DType::TQ3 => each!(turbo::dequant_tq3),
        DType::TQ2 => each!(turbo::dequant_tq2),
        DType::TQ4P => each!(turbo::dequant_tq4p),
        DType::TQ3P => each!(turbo::dequant_tq3p),
        DType::TQ3T => each!(turbo::dequant_tq3t),
        DType::TQ2T => each!(turbo::dequant_tq2t),
    }
}

/// `blocks` blocks of `dtype` drawn from `rng`: a byte a draw, then one draw for the block's
/// f16 scale, set to a finite value of either sign in [1/8, 1/4) (IQ1_M keeps it in the top
/// nibbles of its four scale words, TQ1_0 and TQ2_0 in their last two bytes). Valid blocks of
/// the i-quants, which kiln has no quantizer for, to test their decoders and kernels with;
/// `tests/fixtures/quant/make_iquant_fixtures.py` draws the same. Other types get the random
/// bytes as they are.
pub fn random_blocks(dtype: DType, blocks: usize, rng: &mut crate::rng::Rng) -> Vec<u8> {
    let ts = dtype.type_size();
    let mut out = Vec::with_capacity(blocks.saturating_mul(ts));
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..ts).map(|_| rng.next_u64() as u8).collect();
        if DType::IQUANTS.contains(&dtype) {
            let h = (rng.next_u64() as u16 & 0x83FF) | 0x3000;
            match dtype {
                DType::TQ1_0 | DType::TQ2_0 => b[ts - 2..].copy_from_slice(&h.to_le_bytes()),
                DType::IQ1_M => {
                    for i in 0..4 {
                        let at = 48 + 2 * i;
                        let w = u16::from_le_bytes([b[at], b[at + 1]]) & 0x0FFF
                            | ((h >> (4 * i)) & 0xF) << 12;
                        b[at..at + 2].copy_from_slice(&w.to_le_bytes());
                    }
                }
                _ => b[..2].copy_from_slice(&h.to_le_bytes()),
            }
        }
        out.extend(b);
    }
    out
}

/// Whether [`quantize`] can produce `dtype`: the float types and every block type but the
/// grid-coded i-quants (IQ4_NL, IQ4_XS, TQ1_0 and TQ2_0 have quantizers). The integer types have no quantizer
/// (an f32 → integer conversion is not a quantization kiln needs).
pub fn quantize_supported(dtype: DType) -> bool {
    !dtype.is_int()
        && !(DType::IQUANTS.contains(&dtype)
            && !matches!(
                dtype,
                DType::IQ4_NL | DType::IQ4_XS | DType::TQ1_0 | DType::TQ2_0
            ))
}

/// Encodes `src` as `dtype`. `src.len()` must be a multiple of the block size.
///
/// F16 and BF16 round to nearest even (BF16 turns NaNs quiet, as ggml does). Non-finite inputs
/// to the block formats give some bytes without panicking, but nothing meaningful.
pub fn quantize(dtype: DType, src: &[f32]) -> Result<Vec<u8>> {
    let bytes = dtype.bytes_for(src.len()).unwrap_or(0);
    let mut out = vec![0u8; bytes];
    quantize_into(dtype, src, &mut out)?;
    Ok(out)
}

/// [`quantize`] into `out`, which must be exactly `dtype.bytes_for(src.len())` bytes.
pub fn quantize_into(dtype: DType, src: &[f32], out: &mut [u8]) -> Result<()> {
    if !quantize_supported(dtype) {
        return Err(Error::quant(dtype, "quantize: no quantizer for this type"));
    }
    let bytes = dtype.bytes_for(src.len()).ok_or_else(|| {
        Error::quant(
            dtype,
            format!(
                "quantize: {} elements is not a multiple of the block size {}",
                src.len(),
                dtype.block_size()
            ),
        )
    })?;
    if out.len() != bytes {
        return Err(Error::quant(
            dtype,
            format!(
                "quantize: {} elements need {bytes} bytes, the output has {}",
                src.len(),
                out.len()
            ),
        ));
    }
    match dtype {
        DType::F32 => quant_each_block(src, out, float::quant_f32),
        DType::F16 => quant_each_block(src, out, float::quant_f16),
        DType::BF16 => quant_each_block(src, out, float::quant_bf16),
        DType::Q4_0 => quant_each_block(src, out, legacy::quant_q4_0),
        DType::Q4_1 => quant_each_block(src, out, legacy::quant_q4_1),
        DType::Q5_0 => quant_each_block(src, out, legacy::quant_q5_0),
        DType::Q5_1 => quant_each_block(src, out, legacy::quant_q5_1),
        DType::Q8_0 => quant_each_block(src, out, legacy::quant_q8_0),
        DType::Q2_K => quant_each_block(src, out, k_quants::quant_q2_k),
        DType::Q3_K => quant_each_block(src, out, k_quants::quant_q3_k),
        DType::Q4_K => quant_each_block(src, out, k_quants::quant_q4_k),
        DType::Q5_K => quant_each_block(src, out, k_quants::quant_q5_k),
        DType::Q6_K => quant_each_block(src, out, k_quants::quant_q6_k),
        DType::Q8_K => quant_each_block(src, out, k_quants::quant_q8_k),
        DType::MXFP4 => quant_each_block(src, out, fp4::quant_mxfp4),
        DType::NVFP4 => quant_each_block(src, out, fp4::quant_nvfp4),
        DType::IQ4_NL => quant_each_block(src, out, iquants::quant_iq4_nl),
        DType::IQ4_XS => quant_each_block(src, out, iquants::quant_iq4_xs),
        DType::TQ1_0 => quant_each_block(src, out, iquants::quant_tq1_0),
        DType::TQ2_0 => quant_each_block(src, out, iquants::quant_tq2_0),
        DType::TQ4 => quant_each_block(src, out, turbo::quant_tq4),
        DType::TQ3 => quant_each_block(src, out, turbo::quant_tq3),
        DType::TQ2 => quant_each_block(src, out, turbo::quant_tq2),
        DType::TQ4P => quant_each_block(src, out, turbo::quant_tq4p),
        DType::TQ3P => quant_each_block(src, out, turbo::quant_tq3p),
        DType::TQ3T => quant_each_block(src, out, turbo::quant_tq3t),
        DType::TQ2T => quant_each_block(src, out, turbo::quant_tq2t),
        DType::I32
        | DType::U32
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ3_XXS
        | DType::IQ1_S
        | DType::IQ3_S
        | DType::IQ2_S
        | DType::IQ1_M => return Err(Error::quant(dtype, "quantize: no quantizer for this type")),
    }
    Ok(())
}

/// Runs `f` on every (block bytes, block output) pair; `TS` bytes make `BS` elements. The
/// caller has checked that the lengths are whole, matching numbers of blocks.
fn for_each_block<const TS: usize, const BS: usize>(
    src: &[u8],
    dst: &mut [f32],
    f: fn(&[u8; TS], &mut [f32; BS]),
) {
    let run = |src: &[u8], dst: &mut [f32]| {
        for (s, d) in src.chunks_exact(TS).zip(dst.chunks_exact_mut(BS)) {
            // Both conversions always succeed: the chunks are exactly TS and BS long.
            if let (Ok(s), Ok(d)) = (s.try_into(), d.try_into()) {
                f(s, d);
            }
        }
    };
    if dst.len() >= PAR_MIN_ELEMS {
        let blocks = (PAR_CHUNK_ELEMS / BS).max(1);
        src.par_chunks(blocks * TS)
            .zip(dst.par_chunks_mut(blocks * BS))
            .for_each(|(s, d)| run(s, d));
    } else {
        run(src, dst);
    }
}

/// Like [`for_each_block`], the other way round.
fn quant_each_block<const BS: usize, const TS: usize>(
    src: &[f32],
    dst: &mut [u8],
    f: fn(&[f32; BS], &mut [u8; TS]),
) {
    let run = |src: &[f32], dst: &mut [u8]| {
        for (s, d) in src.chunks_exact(BS).zip(dst.chunks_exact_mut(TS)) {
            if let (Ok(s), Ok(d)) = (s.try_into(), d.try_into()) {
                f(s, d);
            }
        }
    };
    if src.len() >= PAR_MIN_ELEMS {
        let blocks = (PAR_CHUNK_ELEMS / BS).max(1);
        src.par_chunks(blocks * BS)
            .zip(dst.par_chunks_mut(blocks * TS))
            .for_each(|(s, d)| run(s, d));
    } else {
        run(src, dst);
    }
}

/// The f16 stored little-endian at `b[at..at + 2]`, as f32.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// `x` rounded to f16 (nearest even): its little-endian bytes and the value they decode to.
#[inline(always)]
fn to_f16(x: f32) -> ([u8; 2], f32) {
    let h = half::f16::from_f32(x);
    (h.to_bits().to_le_bytes(), h.to_f32())
}

/// The first element of largest magnitude, with its sign (ggml's and gguf's choice of "max"
/// for the symmetric formats: ties go to the earliest element).
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut max = x.first().copied().unwrap_or(0.0);
    let mut amax = max.abs();
    for &v in x.iter().skip(1) {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixtures written by `tests/fixtures/quant/make_quant_fixtures.py` (gguf 0.19.0): the
    /// dtype, the file stem, and the two files `<stem><a>` and `<stem><b>`.
    macro_rules! fixture {
        ($dtype:ident, $stem:literal, $a:literal, $b:literal) => {
            (
                DType::$dtype,
                $stem,
                include_bytes!(concat!("../../../tests/fixtures/quant/", $stem, $a)) as &[u8],
                include_bytes!(concat!("../../../tests/fixtures/quant/", $stem, $b)) as &[u8],
            )
        };
    }

    /// Random blocks and gguf's dequantization of them.
    macro_rules! dequant_fixture {
        ($dtype:ident, $stem:literal) => {
            fixture!($dtype, $stem, ".blocks", ".f32")
        };
    }

    /// Random f32 and gguf's quantization of them.
    macro_rules! quant_fixture {
        ($dtype:ident, $stem:literal) => {
            fixture!($dtype, $stem, ".quant_in.f32", ".quant_out.blocks")
        };
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Bitwise equality, except that any NaN equals any NaN (f16 → f32 conversions may or may
    /// not quieten a signalling NaN's payload).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// xorshift64* with Box–Muller normals: deterministic, no dependencies.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform in (0, 1].
        fn uniform(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 + 1.0) / (1u64 << 24) as f32
        }
        /// Standard normal, never exactly zero.
        fn normal(&mut self) -> f32 {
            let (u1, u2) = (self.uniform(), self.uniform());
            let v = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
            if v == 0.0 {
                1e-3
            } else {
                v
            }
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next_u64() as u8).collect()
        }
    }

    fn check_dequant(dtype: DType, name: &str, blocks: &[u8], expect: &[u8]) {
        let expect = f32s(expect);
        let mut got = vec![0.0f32; expect.len()];
        dequantize(dtype, blocks, &mut got).unwrap();
        for (i, (&g, &e)) in got.iter().zip(&expect).enumerate() {
            assert!(
                same(g, e),
                "{name}: element {i} (block {}): kiln {g:e} ({:#010x}), gguf {e:e} ({:#010x})",
                i / dtype.block_size(),
                g.to_bits(),
                e.to_bits()
            );
        }
    }

    #[test]
    fn dequantize_matches_gguf_fixtures() {
        let cases = [
            dequant_fixture!(Q4_0, "q4_0"),
            dequant_fixture!(Q4_1, "q4_1"),
            dequant_fixture!(Q5_0, "q5_0"),
            dequant_fixture!(Q5_1, "q5_1"),
            dequant_fixture!(Q8_0, "q8_0"),
            dequant_fixture!(Q2_K, "q2_K"),
            dequant_fixture!(Q3_K, "q3_K"),
            dequant_fixture!(Q4_K, "q4_K"),
            dequant_fixture!(Q5_K, "q5_K"),
            dequant_fixture!(Q6_K, "q6_K"),
            dequant_fixture!(Q8_K, "q8_K"),
            dequant_fixture!(MXFP4, "mxfp4"),
            dequant_fixture!(NVFP4, "nvfp4"),
            dequant_fixture!(MXFP4, "mxfp4_all_e"),
            dequant_fixture!(NVFP4, "nvfp4_all_scales"),
            dequant_fixture!(BF16, "bf16"),
        ];
        for (dtype, name, blocks, expect) in cases {
            check_dequant(dtype, name, blocks, expect);
            // The same bytes at an odd address decode the same.
            let mut shifted = vec![0u8; blocks.len() + 1];
            shifted[1..].copy_from_slice(blocks);
            check_dequant(dtype, name, &shifted[1..], expect);
        }
    }

    #[test]
    fn quantize_matches_gguf_reference_quantizers() {
        let cases = [
            quant_fixture!(Q8_0, "q8_0"),
            quant_fixture!(Q4_0, "q4_0"),
            quant_fixture!(Q4_1, "q4_1"),
            quant_fixture!(Q5_0, "q5_0"),
            quant_fixture!(Q5_1, "q5_1"),
            quant_fixture!(MXFP4, "mxfp4"),
            quant_fixture!(BF16, "bf16"),
        ];
        for (dtype, name, input, expect) in cases {
            let got = quantize(dtype, &f32s(input)).unwrap();
            assert_eq!(got.len(), expect.len(), "{name}");
            let ts = dtype.type_size();
            for (i, (g, e)) in got.chunks(ts).zip(expect.chunks(ts)).enumerate() {
                assert_eq!(g, e, "{name}: block {i} differs from gguf's");
            }
        }
    }

    /// Normalised squared error `sum (x - y)^2 / sum x^2` of a quantize → dequantize round trip.
    fn round_trip_nmse(dtype: DType, x: &[f32]) -> f64 {
        let q = quantize(dtype, x).unwrap();
        assert_eq!(q.len(), dtype.bytes_for(x.len()).unwrap(), "{dtype}");
        let mut y = vec![0.0f32; x.len()];
        dequantize(dtype, &q, &mut y).unwrap();
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for (&a, &b) in x.iter().zip(&y) {
            assert!(
                b.is_finite(),
                "{dtype}: non-finite output {b} for input {a}"
            );
            num += (a as f64 - b as f64).powi(2);
            den += (a as f64).powi(2);
        }
        num / den
    }

    /// `n` standard normals; with `spread`, every group of 32 gets its own scale in [0.05, 20]
    /// (log-uniform), as real weight rows have, which exercises the K-quants' super-block scales.
    fn normal_data(rng: &mut Rng, n: usize, spread: bool) -> Vec<f32> {
        let mut x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        if spread {
            for g in x.chunks_mut(32) {
                let s = (0.05f32.ln() + rng.uniform() * (20.0f32 / 0.05).ln()).exp();
                g.iter_mut().for_each(|v| *v *= s);
            }
        }
        x
    }

    /// Upper bounds on the round-trip error of [`round_trip_nmse`] for unit normals (per-group
    /// spreads included). A uniform grid of step Δ costs about Δ²/12 per element, and for 32
    /// normals max|x| ≈ 2.5 (≈ 2.2 for 16, ≈ 3 for 256); so Q8_0: Δ ≈ 2.5/127, ≈ 3e-5;
    /// Q4_0: Δ ≈ 2.5/8, ≈ 8e-3; Q4_1: Δ ≈ 4.5/15, ≈ 6e-3; Q5_0/Q5_1 a quarter of those; Q6_K:
    /// Δ ≈ 2.2/32, ≈ 4e-4; Q4_K/Q5_K as Q4_1/Q5_1 plus a little for the 6-bit group scales;
    /// Q3_K: Δ ≈ 2.2/4 with only 3 steps on one side, ≈ 2.5e-2; Q2_K: Δ ≈ 3.8/3, ≈ 0.1; Q8_K
    /// one grid over 256 values, ≈ 5e-5, more when the groups' ranges differ. FP4 (E2M1) has a
    /// 1-bit mantissa: relative step 1/4..1/2, ≈ 1e-2 with MXFP4's power-of-two scale and a bit
    /// less with NVFP4's finer one. f16/bf16: relative rounding ≤ 2^-11 / 2^-8, mean square
    /// ≈ 2^-22/3.6 ≈ 7e-8 and 2^-16/3.6 ≈ 4e-6. The bounds leave about 1.5-2× margin over the
    /// measured values (which the fixed seed makes deterministic), so a quantizer that gets
    /// noticeably worse fails.
    fn nmse_bound(dtype: DType) -> f64 {
        match dtype {
            DType::F32 => 0.0,
            DType::F16 => 1e-7,
            DType::BF16 => 6e-6,
            DType::Q8_0 => 6e-5,
            DType::Q4_0 => 1.2e-2,
            DType::Q4_1 => 1e-2,
            DType::Q5_0 => 3.5e-3,
            DType::Q5_1 => 3e-3,
            DType::Q2_K => 0.15,
            DType::Q3_K => 4e-2,
            DType::Q4_K => 1e-2,
            DType::Q5_K => 3e-3,
            DType::Q6_K => 7e-4,
            DType::Q8_K => 3e-4,
            DType::MXFP4 => 2.5e-2,
            DType::NVFP4 => 1.5e-2,
            // The Lloyd-Max distortions of a unit normal (0.0095, 0.035, 0.118) with room for
            // the estimated scales; see quant/turbo.rs for the rotated-row bounds.
            DType::TQ4 => 1.3e-2,
            DType::TQ3 => 4.5e-2,
            DType::TQ2 => 0.15,
            // The (b-1)-bit codes' distortion plus the sketch's, which is as large again
            // (an unbiased estimate of the residual, not its nearest point).
            DType::TQ4P => 9e-2,
            DType::TQ3P => 0.3,
            // Trellis-coded: ~1 dB under the same bits' Lloyd-Max distortion.
            DType::TQ3T => 3.8e-2,
            DType::TQ2T => 0.13,
            // Ternary over max |x| of 256 values (meant for weights trained ternary): normal
            // data loses everything under max/2, most of it.
            DType::TQ1_0 | DType::TQ2_0 => 1.0,
            // 16 levels dense near zero, scales searched by weighted least squares.
            DType::IQ4_NL | DType::IQ4_XS => 1e-2,
            d => unreachable!("{d} has no quantizer (the test skips it)"),
        }
    }

    #[test]
    fn round_trips_stay_within_error_bounds() {
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        for dtype in DType::ALL.into_iter().chain(DType::KV_ONLY) {
            if !quantize_supported(dtype) {
                continue;
            }
            for spread in [false, true] {
                let x = normal_data(&mut rng, 8192, spread);
                let e = round_trip_nmse(dtype, &x);
                assert!(
                    e <= nmse_bound(dtype),
                    "{dtype} (spread {spread}): normalised MSE {e:.3e} > bound {:.1e}",
                    nmse_bound(dtype)
                );
            }
        }
    }

    #[test]
    fn zeros_round_trip_to_zeros() {
        for dtype in DType::ALL
            .into_iter()
            .chain(DType::KV_ONLY)
            .filter(|&d| quantize_supported(d))
        {
            let x = vec![0.0f32; 512];
            let q = quantize(dtype, &x).unwrap();
            let mut y = vec![1.0f32; 512];
            dequantize(dtype, &q, &mut y).unwrap();
            assert!(y.iter().all(|&v| v == 0.0), "{dtype}");
        }
    }

    #[test]
    fn mxfp4_representable_values_round_trip_exactly() {
        let mut rng = Rng(77);
        for _ in 0..200 {
            let e = 100 + (rng.next_u64() % 60) as u8;
            let d = f32::from_bits((e as u32 - 1) << 23); // half scale, 2^(e - 128)
            let mut x: Vec<f32> = (0..32)
                .map(|_| fp4::KV[(rng.next_u64() % 16) as usize] as f32 * d)
                .collect();
            // Pin the block maximum to ±8 or ±12 (× d) so that the scale is determined.
            let top = [8.0, 12.0, -8.0, -12.0][(rng.next_u64() % 4) as usize];
            x[(rng.next_u64() % 32) as usize] = top * d;
            let q = quantize(DType::MXFP4, &x).unwrap();
            assert_eq!(q[0], e);
            let mut y = vec![0.0f32; 32];
            dequantize(DType::MXFP4, &q, &mut y).unwrap();
            assert_eq!(x, y, "e = {e}");
        }
    }

    #[test]
    fn nvfp4_representable_values_round_trip_exactly() {
        let mut rng = Rng(78);
        for _ in 0..200 {
            let mut x = vec![0.0f32; 64];
            let mut codes = [0u8; 4];
            for (s, sub) in x.chunks_mut(16).enumerate() {
                codes[s] = 1 + (rng.next_u64() % 0x7E) as u8; // every finite non-zero code
                let d = fp4::ue4m3_half(codes[s]);
                for v in sub.iter_mut() {
                    *v = fp4::KV[(rng.next_u64() % 16) as usize] as f32 * d;
                }
                let top = if rng.next_u64() & 1 == 0 { 12.0 } else { -12.0 };
                sub[(rng.next_u64() % 16) as usize] = top * d;
            }
            let q = quantize(DType::NVFP4, &x).unwrap();
            assert_eq!(q[..4], codes);
            let mut y = vec![0.0f32; 64];
            dequantize(DType::NVFP4, &q, &mut y).unwrap();
            assert_eq!(x, y, "scale codes {codes:02x?}");
        }
    }

    #[test]
    fn f16_and_bf16_round_trip_every_bit_pattern() {
        // 65536 elements: this also runs the rayon path.
        let bits: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        for dtype in [DType::F16, DType::BF16] {
            let mut y = vec![0.0f32; 1 << 16];
            dequantize(dtype, &bits, &mut y).unwrap();
            let back = quantize(dtype, &y).unwrap();
            for (i, (a, b)) in bits.chunks(2).zip(back.chunks(2)).enumerate() {
                assert!(
                    a == b || y[i].is_nan(),
                    "{dtype}: {i:#06x} came back as {b:02x?}"
                );
            }
        }
    }

    #[test]
    fn integers_convert_numerically() {
        let src: Vec<u8> = [-5i32, 0, i32::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut y = [0.0f32; 3];
        dequantize(DType::I32, &src, &mut y).unwrap();
        assert_eq!(y, [-5.0, 0.0, 2147483648.0]);
        dequantize(DType::U32, &src, &mut y).unwrap();
        assert_eq!(y, [4294967291.0, 0.0, 2147483648.0]);
    }

    #[test]
    fn q8_k_block_sums_are_the_group_sums() {
        let mut rng = Rng(5);
        let x = normal_data(&mut rng, 512, true);
        let q = quantize(DType::Q8_K, &x).unwrap();
        for b in q.chunks(DType::Q8_K.type_size()) {
            for g in 0..16 {
                let sum: i32 = b[4 + 16 * g..4 + 16 * g + 16]
                    .iter()
                    .map(|&v| v as i8 as i32)
                    .sum();
                let at = 4 + 256 + 2 * g;
                assert_eq!(sum, i16::from_le_bytes([b[at], b[at + 1]]) as i32);
            }
        }
    }

    #[test]
    fn block_byte_sizes_agree_with_dtype() {
        let sizes = [
            (DType::Q4_0, legacy::Q4_0_BYTES),
            (DType::Q4_1, legacy::Q4_1_BYTES),
            (DType::Q5_0, legacy::Q5_0_BYTES),
            (DType::Q5_1, legacy::Q5_1_BYTES),
            (DType::Q8_0, legacy::Q8_0_BYTES),
            (DType::Q2_K, k_quants::Q2_K_BYTES),
            (DType::Q3_K, k_quants::Q3_K_BYTES),
            (DType::Q4_K, k_quants::Q4_K_BYTES),
            (DType::Q5_K, k_quants::Q5_K_BYTES),
            (DType::Q6_K, k_quants::Q6_K_BYTES),
            (DType::Q8_K, k_quants::Q8_K_BYTES),
            (DType::MXFP4, fp4::MXFP4_BYTES),
            (DType::NVFP4, fp4::NVFP4_BYTES),
            (DType::IQ2_XXS, iquants::IQ2_XXS_BYTES),
            (DType::IQ2_XS, iquants::IQ2_XS_BYTES),
            (DType::IQ3_XXS, iquants::IQ3_XXS_BYTES),
            (DType::IQ1_S, iquants::IQ1_S_BYTES),
            (DType::IQ4_NL, iquants::IQ4_NL_BYTES),
            (DType::IQ3_S, iquants::IQ3_S_BYTES),
            (DType::IQ2_S, iquants::IQ2_S_BYTES),
            (DType::IQ4_XS, iquants::IQ4_XS_BYTES),
            (DType::IQ1_M, iquants::IQ1_M_BYTES),
            (DType::TQ1_0, iquants::TQ1_0_BYTES),
            (DType::TQ2_0, iquants::TQ2_0_BYTES),
        ];
        for (dtype, bytes) in sizes {
            assert_eq!(dtype.type_size(), bytes, "{dtype}");
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let is_quant_err = |r: Result<()>, want: DType| match r {
            Err(Error::Quant { dtype, msg }) => {
                assert_eq!(dtype, want);
                msg
            }
            other => panic!("expected a quant error for {want}, got {other:?}"),
        };
        let msg = is_quant_err(
            dequantize(DType::Q4_0, &[0u8; 17], &mut [0.0; 32]),
            DType::Q4_0,
        );
        assert!(msg.contains("18") && msg.contains("17"), "{msg}");
        is_quant_err(
            dequantize(DType::Q4_0, &[0u8; 19], &mut [0.0; 32]),
            DType::Q4_0,
        );
        is_quant_err(
            dequantize(DType::Q4_K, &[0u8; 144], &mut [0.0; 255]),
            DType::Q4_K,
        );
        is_quant_err(dequantize(DType::F32, &[0u8; 3], &mut [0.0; 1]), DType::F32);
        is_quant_err(dequantize(DType::F16, &[0u8; 4], &mut [0.0; 1]), DType::F16);
        is_quant_err(quantize(DType::Q4_K, &[1.0; 100]).map(drop), DType::Q4_K);
        is_quant_err(quantize(DType::NVFP4, &[1.0; 32]).map(drop), DType::NVFP4);
        is_quant_err(quantize(DType::I32, &[1.0; 4]).map(drop), DType::I32);
        assert!(!quantize_supported(DType::U32) && !quantize_supported(DType::I32));
        // Nothing is a whole number of blocks.
        dequantize(DType::Q6_K, &[], &mut []).unwrap();
        assert!(quantize(DType::Q6_K, &[]).unwrap().is_empty());
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = Rng(0xBAD5EED);
        for dtype in DType::ALL {
            let bs = dtype.block_size();
            // A few blocks, and enough for the parallel path.
            for n in [bs, 3 * bs, PAR_MIN_ELEMS.div_ceil(bs) * bs + 7 * bs] {
                let src = rng.bytes(dtype.bytes_for(n).unwrap());
                let mut y = vec![0.0f32; n];
                dequantize(dtype, &src, &mut y).unwrap();
            }
            if quantize_supported(dtype) {
                // Random bit patterns (NaN, infinities, subnormals) and blocks of specials.
                let mut x: Vec<f32> = (0..64 * bs)
                    .map(|_| f32::from_bits(rng.next_u64() as u32))
                    .collect();
                let specials = [f32::NAN, f32::INFINITY, -f32::INFINITY, 3e38, -1e-40, -0.0];
                for (b, &v) in x.chunks_mut(bs).zip(&specials) {
                    b.fill(v);
                }
                let q = quantize(dtype, &x).unwrap();
                dequantize(dtype, &q, &mut x).unwrap();
            }
        }
    }

    #[test]
    fn parallel_path_matches_block_by_block() {
        let mut rng = Rng(99);
        let x = normal_data(&mut rng, 1 << 17, true);
        for dtype in [DType::F16, DType::Q8_0, DType::Q4_K, DType::NVFP4] {
            let whole = quantize(dtype, &x).unwrap();
            let pieces: Vec<u8> = x
                .chunks(1024)
                .flat_map(|c| quantize(dtype, c).unwrap())
                .collect();
            assert!(whole == pieces, "{dtype}: quantize");
            let mut y_whole = vec![0.0f32; x.len()];
            dequantize(dtype, &whole, &mut y_whole).unwrap();
            let per = dtype.bytes_for(1024).unwrap();
            for (i, c) in whole.chunks(per).enumerate() {
                let mut y = vec![0.0f32; 1024];
                dequantize(dtype, c, &mut y).unwrap();
                assert!(
                    y == y_whole[1024 * i..1024 * (i + 1)],
                    "{dtype}: dequantize"
                );
            }
        }
    }
}
