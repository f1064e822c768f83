//! MatMul and its fused forms: `y = x · Wᵀ` with W in any dtype, dequantized a row at a time.

use super::simd::{self, Isa};
use super::{elementwise, norm, pool, qdot, In, KResult, Out};
use crate::op::GluOp;
use crate::quant;
use crate::tensor::DType;

/// Weight rows dequantized at a time: one tile, reused by every activation row.
const TILE: usize = 8;

/// `Σ a[i]·b[i]`, vectorised for this CPU.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    simd::dot(a, b)
}

thread_local! {
    /// Dequantized weight rows of the current tile, reused across tiles on a thread.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Dequantizes weight rows `n0..n0 + rows` of `w` into `buf` ([rows, k]), on this thread.
#[inline(always)]
fn dequantize_tile(w: &[u8], dtype: DType, k: usize, n0: usize, rows: usize, buf: &mut [f32]) {
    let rb = dtype.bytes_for(k).unwrap_or(0);
    for r in 0..rows {
        let src = &w[(n0 + r) * rb..(n0 + r + 1) * rb];
        quant::dequantize_row(dtype, src, &mut buf[r * k..(r + 1) * k]);
    }
}

/// Tile dequantization compiled for AVX-512 (the block decoders vectorise under it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dequantize_tile_avx512(
    w: &[u8],
    dtype: DType,
    k: usize,
    n0: usize,
    rows: usize,
    buf: &mut [f32],
) {
    dequantize_tile(w, dtype, k, n0, rows, buf)
}

/// Tile dequantization compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_tile_avx2(
    w: &[u8],
    dtype: DType,
    k: usize,
    n0: usize,
    rows: usize,
    buf: &mut [f32],
) {
    dequantize_tile(w, dtype, k, n0, rows, buf)
}

fn dequantize_tile_isa(
    isa: Isa,
    w: &[u8],
    dtype: DType,
    k: usize,
    n0: usize,
    rows: usize,
    buf: &mut [f32],
) {
    match isa {
        // SAFETY: `isa` is what the CPU has (simd::isa).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { dequantize_tile_avx512(w, dtype, k, n0, rows, buf) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { dequantize_tile_avx2(w, dtype, k, n0, rows, buf) },
        _ => dequantize_tile(w, dtype, k, n0, rows, buf),
    }
}

/// `y[i, n0 + j] = x[i] · wt[j]` for every activation row `i < m` and tile row `j < rows`,
/// where `wt` is `rows` f32 rows of `k`.
///
/// # Safety
/// `y` must point to `m` rows of `ldy` writable f32 that no other thread writes at columns
/// `n0..n0 + rows`; `x` holds `m · k` f32 and `wt` `rows · k`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_dots(
    isa: Isa,
    x: &[f32],
    m: usize,
    k: usize,
    wt: *const f32,
    rows: usize,
    y: *mut f32,
    ldy: usize,
    n0: usize,
) {
    let mr_max = simd::max_rows(isa);
    let mut out: simd::Sums = [[0f32; 4]; 4];
    let mut i = 0;
    while i < m {
        let mr = mr_max.min(m - i);
        let mut j = 0;
        while j < rows {
            let nr = 4.min(rows - j);
            // Fewer than four weight rows repeat the last one; its sums are not stored.
            let w = std::array::from_fn(|t| wt.add((j + t.min(nr - 1)) * k));
            simd::dots(isa, x.as_ptr().add(i * k), k, mr, w, k, &mut out);
            for (ii, o) in out.iter().enumerate().take(mr) {
                let dst = y.add((i + ii) * ldy + n0 + j);
                for (jj, v) in o.iter().enumerate().take(nr) {
                    *dst.add(jj) = *v;
                }
            }
            j += 4;
        }
        i += mr;
    }
}

/// `y [m, n] = x [m, k] · Wᵀ` where `w` holds `n` rows of `k` elements of `dtype`: weight
/// rows are split over the CPU pool; each thread dequantizes a tile of rows once into a small
/// buffer that stays in cache and runs the vectorised dot micro-kernel over every activation
/// row. f32 weights are read in place.
pub(crate) fn gemm(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n: usize,
    y: &mut [f32],
) -> KResult {
    let rb = dtype.bytes_for(k).unwrap_or(0);
    if x.len() < m * k || y.len() < m * n || w.len() < n * rb || m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y[..m * n].fill(0.0);
        return Ok(());
    }
    let isa = simd::isa();
    let yp = pool::SendPtr(y.as_mut_ptr());
    // f32 weights in native byte order are used where they lie (unaligned loads).
    let direct = dtype == DType::F32 && cfg!(target_endian = "little");
    // Formats with a fused kernel. A few activation rows (decode, batched decode): dequantize
    // and dot in one pass over each weight row. More (prefill): decode each tile of weight rows
    // once with the same decoders and run the tile kernel, which sums in the fused kernel's
    // order. Both give the same bits for a row, so no result depends on the batch it came in
    // (a prefix-cache hit, a batch of sequences and a whole prompt agree exactly).
    if qdot::supported(isa, dtype) && k.is_multiple_of(32) {
        if m <= qdot::MAX_ROWS {
            pool::par_ranges(n, 4, 4, |range| {
                let yp = &yp;
                let mut out = [0f32; qdot::MAX_ROWS];
                for r in range {
                    // SAFETY: the fused kernel handles `dtype` here; row r lies inside `w`,
                    // and column r of y is this task's alone.
                    unsafe {
                        qdot::row_dots(
                            dtype,
                            x.as_ptr(),
                            k,
                            m,
                            k,
                            w.as_ptr().add(r * rb),
                            &mut out,
                        );
                        for (i, v) in out.iter().enumerate().take(m) {
                            *yp.0.add(i * n + r) = *v;
                        }
                    }
                }
            });
        } else {
            pool::par_ranges(n, TILE, 12, |range| {
                let yp = &yp;
                let mut buf = SCRATCH.with(|c| c.take());
                if buf.len() < TILE * k {
                    buf.resize(TILE * k, 0.0);
                }
                let mut out = [[0f32; 2]; qdot::TILE_ROWS];
                let mut n0 = range.start;
                while n0 < range.end {
                    let rows = TILE.min(range.end - n0);
                    // SAFETY: rows n0..n0+rows lie inside `w`; `buf` holds TILE rows of k; the
                    // columns n0..n0+rows of y are this task's alone.
                    unsafe {
                        for r in 0..rows {
                            qdot::decode_row(
                                dtype,
                                w.as_ptr().add((n0 + r) * rb),
                                k,
                                buf.as_mut_ptr().add(r * k),
                            );
                        }
                        let mut i = 0;
                        while i < m {
                            let mr = qdot::TILE_ROWS.min(m - i);
                            let mut j = 0;
                            while j < rows {
                                let nr = 2.min(rows - j);
                                let wt =
                                    [buf.as_ptr().add(j * k), buf.as_ptr().add((j + nr - 1) * k)];
                                qdot::tile_dots(x.as_ptr().add(i * k), k, mr, wt, k, &mut out);
                                for (ii, o) in out.iter().enumerate().take(mr) {
                                    for (jj, v) in o.iter().enumerate().take(nr) {
                                        *yp.0.add((i + ii) * n + n0 + j + jj) = *v;
                                    }
                                }
                                j += 2;
                            }
                            i += mr;
                        }
                    }
                    n0 += rows;
                }
                SCRATCH.with(|c| c.replace(buf));
            });
        }
        return Ok(());
    }
    // Enough pieces per thread that a core slowed by other work hands some to the other.
    pool::par_ranges(n, TILE, 4, |range| {
        let yp = &yp;
        if direct {
            // SAFETY: `w` holds n rows of k f32 (checked above); columns `range` are this
            // task's alone.
            unsafe {
                let wt = (w.as_ptr() as *const f32).add(range.start * k);
                tile_dots(isa, x, m, k, wt, range.len(), yp.0, n, range.start);
            }
            return;
        }
        let mut buf = SCRATCH.with(|c| c.take());
        if buf.len() < TILE * k {
            buf.resize(TILE * k, 0.0);
        }
        let mut n0 = range.start;
        while n0 < range.end {
            let rows = TILE.min(range.end - n0);
            dequantize_tile_isa(isa, w, dtype, k, n0, rows, &mut buf);
            // SAFETY: the tile holds `rows` rows of k; columns n0..n0+rows are this task's.
            unsafe { tile_dots(isa, x, m, k, buf.as_ptr(), rows, yp.0, n, n0) };
            n0 += rows;
        }
        SCRATCH.with(|c| c.replace(buf));
    });
    Ok(())
}

fn run(x: &[f32], w: &In, o: &mut Out) -> KResult {
    let (n, k) = (w.dims()[0], w.dims()[1]);
    let m = x.len() / k.max(1);
    o.with_f32(false, |y| gemm(x, m, k, w.bytes, w.desc.dtype, n, y))
}

pub(crate) fn mat_mul(i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    run(&x, &i[1], &mut o[0])
}

pub(crate) fn rms_norm_mat_mul(eps: f32, one_plus: bool, i: &[In], o: &mut [Out]) -> KResult {
    let mut x = i[0].f32()?.into_owned();
    let w = i[1].f32()?;
    norm::rms_norm_rows(&mut x, &w, eps, one_plus);
    run(&x, &i[2], &mut o[0])
}

pub(crate) fn glu_mat_mul(g: GluOp, i: &[In], o: &mut [Out]) -> KResult {
    let mut h = i[0].f32()?.into_owned();
    let up = i[1].f32()?;
    elementwise::glu_in_place(g, &mut h, &up);
    run(&h, &i[2], &mut o[0])
}
