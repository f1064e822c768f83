//! Fused dequantize-and-dot for Q8_0 on AVX2 CPUs (no AVX-512): each 32-element block's codes
//! are widened to f32 in registers and multiplied into up to four f32 activation rows, the
//! block's sum scaled by its `d` once. No scratch buffer and no activation quantization: the
//! products are f32 products of the stored codes and the activations, as in any f32 dot.
//!
//! Prefill runs the same kernel over tiles of rows, so a row's bits never depend on the batch
//! it came in.

use crate::tensor::DType;

/// Activation rows one call covers at most.
pub(crate) const MAX_ROWS: usize = 4;

/// Whether [`rows_dots`] handles `dtype` on this CPU.
pub(crate) fn supported(isa: super::simd::Isa, dtype: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == super::simd::Isa::Avx2 && dtype == DType::Q8_0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, dtype);
        false
    }
}

/// `y[i·ldy + r] = Σₖ x[i·ldx + k] · W_r[k]` for `i < mr` (1..=4) and each weight row `r` in
/// `rows`, row r being the `k` elements of `dtype` at `w + r·rb`.
///
/// # Safety
/// [`supported`] holds for `dtype` on this CPU; `k` is a multiple of 32; each weight row in
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
    if dtype == DType::Q8_0 {
        match mr {
            1 => x86::run::<1>(x, ldx, k, w, rb, rows, y, ldy),
            2 => x86::run::<2>(x, ldx, k, w, rb, rows, y, ldy),
            3 => x86::run::<3>(x, ldx, k, w, rb, rows, y, ldy),
            _ => x86::run::<4>(x, ldx, k, w, rb, rows, y, ldy),
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

    /// Bytes ahead of the block being read that are prefetched.
    const PREFETCH: usize = 4096;

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn run<const MR: usize>(
        x: *const f32,
        ldx: usize,
        k: usize,
        w: *const u8,
        rb: usize,
        rows: std::ops::Range<usize>,
        y: *mut f32,
        ldy: usize,
    ) {
        for r in rows {
            let s = row::<MR>(x, ldx, k, w.add(r * rb));
            for (i, v) in s.iter().enumerate() {
                *y.add(i * ldy + r) = *v;
            }
        }
    }

    /// One Q8_0 block (f16 d, 32 signed bytes) as four vectors of its codes in f32, and d.
    #[inline(always)]
    unsafe fn block(b: *const u8) -> ([__m256; 4], __m256) {
        let d = _mm256_cvtph_ps(_mm_set1_epi16(std::ptr::read_unaligned(b as *const i16)));
        let q = std::array::from_fn(|j| {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                b.add(2 + 8 * j) as *const __m128i
            )))
        });
        (q, d)
    }

    /// `Σ q·x` over one block for activation row `xp` (32 f32).
    #[inline(always)]
    unsafe fn block_dot(q: &[__m256; 4], xp: *const f32) -> __m256 {
        let mut s = _mm256_mul_ps(q[0], _mm256_loadu_ps(xp));
        s = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xp.add(8)), s);
        s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xp.add(16)), s);
        _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xp.add(24)), s)
    }

    /// One weight row against `MR` activation rows: per block, `Σ q·x` in eight lanes, then
    /// times d into one of two accumulators (even and odd blocks, so two chains are in
    /// flight), summed at the end in a fixed order.
    #[inline(always)]
    unsafe fn row<const MR: usize>(x: *const f32, ldx: usize, k: usize, w: *const u8) -> [f32; MR] {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let blocks = k / 32;
        let mut bi = 0;
        while bi + 2 <= blocks {
            for h in 0..2 {
                let b = w.add((bi + h) * 34);
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH) as *const i8);
                let (q, d) = block(b);
                for (i, a) in acc.iter_mut().enumerate() {
                    let s = block_dot(&q, x.add(i * ldx + (bi + h) * 32));
                    a[h] = _mm256_fmadd_ps(s, d, a[h]);
                }
            }
            bi += 2;
        }
        if bi < blocks {
            let (q, d) = block(w.add(bi * 34));
            for (i, a) in acc.iter_mut().enumerate() {
                let s = block_dot(&q, x.add(i * ldx + bi * 32));
                a[0] = _mm256_fmadd_ps(s, d, a[0]);
            }
        }
        acc.map(|[a, b]| {
            let v = _mm256_add_ps(a, b);
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd;
    use crate::quant;
    use crate::rng::Rng;

    /// Every row against an f64 dot over the dequantized weights (within f32 rounding), and
    /// the same bits whatever the number of rows in the call.
    #[test]
    fn q8_0_rows_match_an_f64_dot_and_do_not_depend_on_the_batch() {
        let isa = simd::isa();
        if !supported(isa, DType::Q8_0) {
            eprintln!("skipped: no AVX2 kernel on this CPU ({isa:?})");
            return;
        }
        let mut rng = Rng::new(31);
        // 96: an odd number of blocks (the unpaired last one).
        for &k in &[32usize, 96, 2048] {
            let n = 5;
            let m = MAX_ROWS;
            let wf: Vec<f32> = (0..n * k).map(|_| rng.normal()).collect();
            let wq = quant::quantize(DType::Q8_0, &wf).unwrap();
            let rb = wq.len() / n;
            let mut wd = vec![0f32; n * k];
            quant::dequantize(DType::Q8_0, &wq, &mut wd).unwrap();
            let ldx = k + 3;
            let x: Vec<f32> = (0..m * ldx).map(|_| rng.normal()).collect();
            let mut full = vec![f32::NAN; m * n];
            unsafe {
                rows_dots(
                    DType::Q8_0,
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
                        "k={k} row {i} col {r}: {got} vs {want}"
                    );
                }
            }
            for mr in 1..=m {
                for i0 in (0..m).step_by(mr) {
                    let rows = mr.min(m - i0);
                    let mut part = vec![f32::NAN; rows * n];
                    unsafe {
                        rows_dots(
                            DType::Q8_0,
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
                                "k={k} mr={mr} row {} col {r}",
                                i0 + i
                            );
                        }
                    }
                }
            }
        }
    }
}
