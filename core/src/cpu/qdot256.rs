//! Fused dequantize-and-dot for the 32-element formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) on AVX2
//! CPUs (no AVX-512), for decoding: the codes of four weight rows are widened to f32 and turned
//! into the dequantized weights in registers with the decoder's own operations (`(q − o)·d`,
//! exact in f32, or `q·d + m` with the product exact and one rounding of the sum), then
//! multiplied into up to two activation rows with one fused multiply-add chain per (activation
//! row, weight row) over 8-element steps, and the chain's eight lanes summed by `simd`'s
//! reduction: the very operations, in the same order, of the tile path (`simd::dots` over rows
//! dequantized into a tile), which prefill keeps. So a row's bits do not depend on the batch,
//! and prefill keeps the tile kernel's speed.

use crate::tensor::DType;

/// Activation rows one call covers at most (the tile kernel's AVX2 rows).
pub(crate) const MAX_ROWS: usize = 2;

/// Whether [`rows_dots`] handles `dtype` on this CPU.
pub(crate) fn supported(isa: super::simd::Isa, dtype: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == super::simd::Isa::Avx2
            && matches!(
                dtype,
                DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1
            )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, dtype);
        false
    }
}

/// `y[i·ldy + r] = Σₖ x[i·ldx + k] · W_r[k]` for `i < mr` (1..=2) and each weight row `r` in
/// `rows`, row r being the `k` elements of `dtype` at `w + r·rb`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C (as where [`supported`] holds) and the kernels handle
/// `dtype`; `k` is a multiple of 32; each weight row in
/// `rows` is readable; `x` holds `mr` rows of `k` f32 at stride `ldx`; `y` is writable at rows
/// `0..mr` (stride `ldy`) and the columns in `rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_dots(
    dtype: DType,
    x: *const f32,
    ldx: usize,
    mr: usize,
    k: usize,
    (w, rb): (*const u8, usize),
    rows: std::ops::Range<usize>,
    (y, ldy): (*mut f32, usize),
) {
    debug_assert!((1..=MAX_ROWS).contains(&mr));
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! go {
            ($f:expr) => {
                match mr {
                    1 => x86::run::<1, { $f }>(x, ldx, k, w, rb, rows, y, ldy),
                    _ => x86::run::<2, { $f }>(x, ldx, k, w, rb, rows, y, ldy),
                }
            };
        }
        match dtype {
            DType::Q8_0 => go!(x86::Q8_0),
            DType::Q4_0 => go!(x86::Q4_0),
            DType::Q4_1 => go!(x86::Q4_1),
            DType::Q5_0 => go!(x86::Q5_0),
            DType::Q5_1 => go!(x86::Q5_1),
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dtype, x, ldx, mr, k, w, rb, rows, y, ldy);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The formats, as the kernels' const parameter.
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q4_1: u8 = 2;
    pub const Q5_0: u8 = 3;
    pub const Q5_1: u8 = 4;

    /// Bytes of one block of format `F`.
    const fn block_bytes(f: u8) -> usize {
        match f {
            Q8_0 => 34,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            _ => 24,
        }
    }

    /// Weight rows `rows` four at a time (fewer at the end repeat the last; their sums are not
    /// stored).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn run<const MR: usize, const F: u8>(
        x: *const f32,
        ldx: usize,
        k: usize,
        w: *const u8,
        rb: usize,
        rows: std::ops::Range<usize>,
        y: *mut f32,
        ldy: usize,
    ) {
        let mut r = rows.start;
        while r < rows.end {
            let nr = 4.min(rows.end - r);
            let mut wr = [w; 4];
            for (t, p) in wr.iter_mut().enumerate() {
                *p = w.add((r + t.min(nr - 1)) * rb);
            }
            let s = four::<MR, F>(x, ldx, k, wr, 4 * rb);
            for i in 0..MR {
                for t in 0..nr {
                    *y.add(i * ldy + r + t) = s[i][t];
                }
            }
            r += nr;
        }
    }

    #[inline(always)]
    unsafe fn f16_splat(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(p as *const i16)))
    }

    /// A block's scale factors: `d`, and `m` for the formats with one (else unused).
    #[inline(always)]
    unsafe fn factors<const F: u8>(b: *const u8) -> (__m256, __m256) {
        let d = f16_splat(b);
        let m = if F == Q4_1 || F == Q5_1 {
            f16_splat(b.add(2))
        } else {
            d
        };
        (d, m)
    }

    /// Vector `c` (elements 8c..8c + 8) of the dequantized weights of the block at `b`, whose
    /// factors are `(d, m)`, computed as `quant`'s decoders compute them: `(q − o) as f32 · d`
    /// for the symmetric formats, `q as f32 · d + m` (product, then sum) for the others.
    #[inline(always)]
    unsafe fn part<const F: u8>(b: *const u8, c: usize, (d, m): (__m256, __m256)) -> __m256 {
        if F == Q8_0 {
            let codes = _mm_loadl_epi64(b.add(2 + 8 * c) as *const __m128i);
            return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), d);
        }
        // Byte j holds element j (low nibble) and j + 16 (high nibble); bit j of qh is bit 4
        // of element j.
        let qs = b.add(match F {
            Q4_0 => 2,
            Q4_1 => 4,
            Q5_0 => 6,
            _ => 8,
        });
        let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs.add(8 * (c & 1)) as *const __m128i));
        let mut q = if c < 2 {
            _mm256_and_si256(bytes, _mm256_set1_epi32(0x0F))
        } else {
            _mm256_srli_epi32(bytes, 4)
        };
        if F == Q5_0 || F == Q5_1 {
            let qh = std::ptr::read_unaligned(b.add(if F == Q5_0 { 2 } else { 4 }) as *const i32);
            let shift = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let shift = _mm256_add_epi32(shift, _mm256_set1_epi32(8 * c as i32));
            let bit = _mm256_srlv_epi32(_mm256_set1_epi32(qh), shift);
            let bit = _mm256_and_si256(bit, _mm256_set1_epi32(1));
            q = _mm256_or_si256(q, _mm256_slli_epi32(bit, 4));
        }
        match F {
            Q4_0 | Q5_0 => {
                let o = _mm256_set1_epi32(if F == Q4_0 { 8 } else { 16 });
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, o)), d)
            }
            _ => _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m),
        }
    }

    /// Four weight rows of format `F` against `MR` activation rows (prefetching `ahead` bytes
    /// past each): per 8 elements, each row's dequantized weights and `acc[i][j] = fma(x_i,
    /// w_j, acc[i][j])`, as `simd::dots`' AVX2 kernel does over a dequantized tile; then its
    /// lane reduction.
    #[inline(always)]
    unsafe fn four<const MR: usize, const F: u8>(
        x: *const f32,
        ldx: usize,
        k: usize,
        w: [*const u8; 4],
        ahead: usize,
    ) -> [[f32; 4]; MR] {
        let bb = block_bytes(F);
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        for bi in 0..k / 32 {
            let mut f = [(_mm256_setzero_ps(), _mm256_setzero_ps()); 4];
            for j in 0..4 {
                let b = w[j].add(bi * bb);
                // The same block of the row four ahead (the four rows are read side by side,
                // so the stream ahead of them is the next call's rows).
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(ahead) as *const i8);
                f[j] = factors::<F>(b);
            }
            for c in 0..4 {
                let mut wv = [_mm256_setzero_ps(); 4];
                for j in 0..4 {
                    wv[j] = part::<F>(w[j].add(bi * bb), c, f[j]);
                }
                let kk = bi * 32 + 8 * c;
                for (i, a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.add(i * ldx + kk));
                    for j in 0..4 {
                        a[j] = _mm256_fmadd_ps(xv, wv[j], a[j]);
                    }
                }
            }
        }
        let mut out = [[0f32; 4]; MR];
        for (o, a) in out.iter_mut().zip(&acc) {
            for j in 0..4 {
                o[j] = crate::cpu::simd::hsum256(a[j]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd;
    use crate::quant;
    use crate::rng::Rng;

    /// Every row against an f64 dot over the dequantized weights (within f32 rounding), the
    /// same bits as the tile path, and the same bits whatever the number of rows in the call.
    #[test]
    fn rows_match_an_f64_dot_and_the_tile_path_bit_for_bit() {
        if !simd::has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        // The tile path as an AVX2 CPU runs it (also where this CPU would pick AVX-512).
        let isa = simd::Isa::Avx2;
        let mut rng = Rng::new(31);
        let types = [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
        ];
        // 96: an odd number of blocks (the unpaired last one).
        for (&dt, &k) in types
            .iter()
            .flat_map(|t| [32usize, 96, 2048].iter().map(move |k| (t, k)))
        {
            let n = 5;
            let m = MAX_ROWS;
            let wf: Vec<f32> = (0..n * k).map(|_| rng.normal()).collect();
            let wq = quant::quantize(dt, &wf).unwrap();
            let rb = wq.len() / n;
            let mut wd = vec![0f32; n * k];
            quant::dequantize(dt, &wq, &mut wd).unwrap();
            let ldx = k + 3;
            let x: Vec<f32> = (0..m * ldx).map(|_| rng.normal()).collect();
            let mut full = vec![f32::NAN; m * n];
            unsafe {
                rows_dots(
                    dt,
                    x.as_ptr(),
                    ldx,
                    m,
                    k,
                    (wq.as_ptr(), rb),
                    0..n,
                    (full.as_mut_ptr(), n),
                )
            };
            for i in 0..m {
                for r in 0..n {
                    let xr = &x[i * ldx..i * ldx + k];
                    let wr = &wd[r * k..(r + 1) * k];
                    let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = xr
                        .iter()
                        .zip(wr)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    let got = full[i * n + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * mag + 1e-30,
                        "{dt:?} k={k} row {i} col {r}: {got} vs {want}"
                    );
                }
            }
            // The tile path (rows dequantized, then `simd::dots`) gives the same bits.
            for i in 0..m {
                for r0 in (0..n).step_by(4) {
                    let rowp: [*const f32; 4] =
                        std::array::from_fn(|t| wd[(r0 + t).min(n - 1) * k..].as_ptr());
                    let mut sums = [[0f32; 4]; 4];
                    unsafe { simd::dots(isa, x.as_ptr().add(i * ldx), ldx, 1, rowp, k, &mut sums) };
                    for t in 0..4.min(n - r0) {
                        assert_eq!(
                            sums[0][t].to_bits(),
                            full[i * n + r0 + t].to_bits(),
                            "{dt:?} k={k} row {i} col {}",
                            r0 + t
                        );
                    }
                }
            }
            for mr in 1..=m {
                for i0 in (0..m).step_by(mr) {
                    let rows = mr.min(m - i0);
                    let mut part = vec![f32::NAN; rows * n];
                    unsafe {
                        rows_dots(
                            dt,
                            x.as_ptr().add(i0 * ldx),
                            ldx,
                            rows,
                            k,
                            (wq.as_ptr(), rb),
                            2..n,
                            (part.as_mut_ptr(), n),
                        )
                    };
                    for i in 0..rows {
                        for r in 2..n {
                            assert_eq!(
                                part[i * n + r].to_bits(),
                                full[(i0 + i) * n + r].to_bits(),
                                "{dt:?} k={k} mr={mr} row {} col {r}",
                                i0 + i
                            );
                        }
                    }
                }
            }
        }
    }
}
