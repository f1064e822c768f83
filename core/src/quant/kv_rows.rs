//! Whole rows of the KV cache's block types decoded 32 values at a time with AVX-512: the
//! CPU's attention decodes a cache row per key per decode step, and element by element that
//! was most of a decode step at a 4k context. q8_0: the bytes widened to f32 and scaled.
//! TurboQuant (`tq4`, `tq3`, `tq2` and the trellis-coded `tq3t`, `tq2t`; `turbo.rs` documents
//! them): the code bytes are spread so that each 16-bit lane holds the two bytes its code lies
//! in (a byte permute, VBMI), shifted by its bit offset and masked; trellis codes become
//! `2·code + parity`, the parity being the branch bits (bit 0) of the codes one and three
//! before, as a 32-bit mask; one permute each 16 values reads the point table, and one
//! multiply applies the scale. The values are the scalar decoders' bit for bit (the same
//! integers or table entries times the same f32 scale).

use crate::tensor::DType;

/// Decodes whole blocks of `dtype` from `src` into `dst` (`dst.len()` = 32 per block) where
/// this CPU has the instructions and `dtype` is f16 (any length), q8_0 or one of the five;
/// says whether it did.
#[inline]
pub(super) fn dequant_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if dtype == DType::F16 {
            if !x86::available() || src.len() != 2 * dst.len() {
                return false;
            }
            // SAFETY: the instructions were detected; `src` holds `dst.len()` halves.
            unsafe { x86::f16(src, dst) };
            return true;
        }
        if dtype == DType::Q8_0 {
            if !x86::available() || src.len() / 34 * 32 != dst.len() {
                return false;
            }
            // SAFETY: the instructions were detected; whole blocks are read and written.
            unsafe { x86::q8_0(src, dst) };
            return true;
        }
        let (bits, table) = match dtype {
            DType::TQ2 => (2, 0),
            DType::TQ3 => (3, 1),
            DType::TQ4 => (4, 2),
            DType::TQ2T => (2, 3),
            DType::TQ3T => (3, 4),
            _ => return false,
        };
        if !x86::available() || src.len() / (2 + 4 * bits) * 32 != dst.len() {
            return false;
        }
        // SAFETY: the instructions were detected; blocks are read within `src` (the codes by
        // a masked load of their bytes only) and written within `dst`.
        unsafe { x86::row(bits, table >= 3, &super::turbo::TABLES[table], src, dst) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, src, dst);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Whether the CPU has the instructions (detected once: attention asks it for every
    /// cache row it decodes).
    pub(super) fn available() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vbmi")
        })
    }

    /// For `bits`-bit codes: byte `2i` and `2i + 1` of the permute bring the code bytes code
    /// `i` lies in (the second clamped to the last code byte), and lane `i` of the shifts is
    /// its bit offset in the first.
    const fn spread(bits: usize) -> ([u8; 64], [u16; 32]) {
        let (mut idx, mut sh) = ([0u8; 64], [0u16; 32]);
        let last = 4 * bits - 1;
        let mut i = 0;
        while i < 32 {
            let bit = i * bits;
            idx[2 * i] = (bit / 8) as u8;
            idx[2 * i + 1] = if bit / 8 + 1 > last {
                last
            } else {
                bit / 8 + 1
            } as u8;
            sh[i] = (bit % 8) as u16;
            i += 1;
        }
        (idx, sh)
    }
    const SPREAD: [([u8; 64], [u16; 32]); 3] = [spread(2), spread(3), spread(4)];

    /// Halves widened 16 at a time (exact), the tail one at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    pub(super) unsafe fn f16(src: &[u8], dst: &mut [f32]) {
        let whole = dst.len() / 16 * 16;
        for (b, y) in src.chunks_exact(32).zip(dst[..whole].chunks_exact_mut(16)) {
            let h = _mm256_loadu_si256(b.as_ptr().cast());
            _mm512_storeu_ps(y.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
        for (b, y) in src[2 * whole..].chunks_exact(2).zip(&mut dst[whole..]) {
            *y = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    pub(super) unsafe fn q8_0(src: &[u8], dst: &mut [f32]) {
        for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
            let d = _mm512_set1_ps(super::super::f16_at(b, 0));
            let q = _mm256_loadu_si256(b.as_ptr().add(2).cast());
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(q)));
            let out = y.as_mut_ptr();
            _mm512_storeu_ps(out, _mm512_mul_ps(lo, d));
            _mm512_storeu_ps(out.add(16), _mm512_mul_ps(hi, d));
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    pub(super) unsafe fn row(
        bits: usize,
        trellis: bool,
        table: &[f32; 16],
        src: &[u8],
        dst: &mut [f32],
    ) {
        let bytes = 2 + 4 * bits;
        let (idx, sh) = &SPREAD[bits - 2];
        let idx = _mm512_loadu_si512(idx.as_ptr().cast());
        let sh = _mm512_loadu_si512(sh.as_ptr().cast());
        let mask = _mm512_set1_epi16((1i16 << bits) - 1);
        let one = _mm512_set1_epi16(1);
        let tab = _mm512_loadu_ps(table.as_ptr());
        let kload: __mmask16 = ((1u32 << (4 * bits)) - 1) as u16;
        for (b, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(32)) {
            let s = _mm512_set1_ps(super::super::f16_at(b, 0));
            let raw = _mm_maskz_loadu_epi8(kload, b.as_ptr().add(2).cast());
            let pairs = _mm512_permutexvar_epi8(idx, _mm512_castsi128_si512(raw));
            let mut c = _mm512_and_si512(_mm512_srlv_epi16(pairs, sh), mask);
            if trellis {
                // Bit i of `u`: code i's branch bit; the parity of step i is u_(i-1) ^ u_(i-3).
                let u = _mm512_test_epi16_mask(c, one);
                let par = (u << 1) ^ (u << 3);
                c = _mm512_add_epi16(_mm512_add_epi16(c, c), _mm512_maskz_mov_epi16(par, one));
            }
            let lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(c));
            let hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(c));
            let out = y.as_mut_ptr();
            _mm512_storeu_ps(out, _mm512_mul_ps(s, _mm512_permutexvar_ps(lo, tab)));
            _mm512_storeu_ps(
                out.add(16),
                _mm512_mul_ps(s, _mm512_permutexvar_ps(hi, tab)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::quant::{self, legacy, turbo};
    use crate::rng::Rng;
    use crate::tensor::DType;

    /// f16 rows widen to the scalar conversion's bits, whole vectors and tails.
    #[test]
    fn halves_widen_as_the_scalar_conversion() {
        if !super::x86_ready() {
            println!("skipped: this CPU lacks AVX-512 VBMI");
            return;
        }
        let mut rng = Rng::new(44);
        for n in [1usize, 15, 16, 17, 64, 200] {
            // Normal values and their reciprocals (subnormal halves among them), signed zeros
            // and infinities.
            let mut h: Vec<half::f16> = (0..n)
                .map(|i| {
                    let x = rng.normal() * 1e3;
                    half::f16::from_f32(if i % 3 == 0 { 1e-3 / x } else { x })
                })
                .collect();
            for (i, v) in [
                half::f16::NEG_ZERO,
                half::f16::INFINITY,
                half::f16::NEG_INFINITY,
            ]
            .into_iter()
            .enumerate()
            {
                if i < n {
                    h[n - 1 - i] = v;
                }
            }
            let src: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut fast = vec![f32::NAN; n];
            assert!(super::dequant_row(DType::F16, &src, &mut fast));
            for (i, (a, b)) in fast.iter().zip(&h).enumerate() {
                assert_eq!(a.to_bits(), b.to_f32().to_bits(), "{n} halves, value {i}");
            }
        }
    }

    /// Every block type decodes to the scalar decoders' bits: random blocks (any code, any
    /// finite f16 scale) and blocks quantized from Gaussian rows, over rows of 1 to 5 blocks.
    #[test]
    fn rows_decode_as_the_scalar_decoders() {
        if !super::x86_ready() {
            println!("skipped: this CPU lacks AVX-512 VBMI");
            return;
        }
        let mut rng = Rng::new(43);
        for dt in [
            DType::Q8_0,
            DType::TQ2,
            DType::TQ3,
            DType::TQ4,
            DType::TQ2T,
            DType::TQ3T,
        ] {
            for blocks in 1..=5usize {
                let n = 32 * blocks;
                let mut src = quant::random_blocks(dt, blocks, &mut rng);
                for b in src.chunks_exact_mut(dt.type_size()) {
                    // A finite scale of either sign.
                    b[1] &= 0xFB;
                }
                let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                src.extend(quant::quantize(dt, &x).unwrap());
                let mut fast = vec![f32::NAN; 2 * n];
                assert!(super::dequant_row(dt, &src, &mut fast), "{dt}");
                let mut slow = vec![f32::NAN; 2 * n];
                for (b, y) in src
                    .chunks_exact(dt.type_size())
                    .zip(slow.chunks_exact_mut(32))
                {
                    let y: &mut [f32; 32] = y.try_into().unwrap();
                    match dt {
                        DType::Q8_0 => legacy::dequant_q8_0(b.try_into().unwrap(), y),
                        DType::TQ2 => turbo::dequant_tq2(b.try_into().unwrap(), y),
                        DType::TQ3 => turbo::dequant_tq3(b.try_into().unwrap(), y),
                        DType::TQ4 => turbo::dequant_tq4(b.try_into().unwrap(), y),
                        DType::TQ2T => turbo::dequant_tq2t(b.try_into().unwrap(), y),
                        _ => turbo::dequant_tq3t(b.try_into().unwrap(), y),
                    }
                }
                assert!(slow.iter().any(|v| *v != 0.0));
                for (i, (a, b)) in fast.iter().zip(&slow).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{dt}, {blocks} blocks, value {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
fn x86_ready() -> bool {
    x86::available()
}
#[cfg(all(test, not(target_arch = "x86_64")))]
fn x86_ready() -> bool {
    false
}
