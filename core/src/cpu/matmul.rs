//! MatMul and its fused forms: `y = x · Wᵀ` with W in any dtype, dequantized a row at a time.

use rayon::prelude::*;

use super::{elementwise, norm, In, KResult, Out};
use crate::op::GluOp;
use crate::quant;
use crate::tensor::DType;

/// Weight rows per parallel task: each task dequantizes these once and reuses them for every
/// activation row.
const ROWS_PER_TASK: usize = 16;

/// f32 dot product with several accumulators, so the compiler can vectorise it.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = 0f32;
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s + acc.iter().sum::<f32>()
}

/// Four dot products of `x` with `w[0..4]` sharing each load of `x`; each sum is accumulated in
/// the same order as `dot`, so results do not depend on how rows are grouped.
#[inline(always)]
fn dot4(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
    let n = x.len();
    let chunks = n / 8;
    let mut acc = [[0f32; 8]; 4];
    for c in 0..chunks {
        let xs = &x[c * 8..c * 8 + 8];
        for r in 0..4 {
            let ws = &w[r][c * 8..c * 8 + 8];
            for l in 0..8 {
                acc[r][l] += xs[l] * ws[l];
            }
        }
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        let mut s = 0f32;
        for i in chunks * 8..n {
            s += x[i] * w[r][i];
        }
        out[r] = s + acc[r].iter().sum::<f32>();
    }
    out
}

thread_local! {
    /// Dequantized weight rows of the current task, reused across tasks on a worker thread.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One task: dequantize `rows` weight rows starting at `n0`, then dot them with every
/// activation row. Returns `[m, rows]`.
#[inline(always)]
fn task(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n0: usize,
    rows: usize,
) -> KResult<Vec<f32>> {
    let row_bytes = dtype.bytes_for(k).unwrap_or(0);
    // The scratch is taken out of the thread-local and put back at the end, so this body is
    // inlined into the caller's target features rather than into a closure.
    let mut wf = SCRATCH.with(|cell| cell.take());
    if wf.len() < rows * k {
        wf.resize(rows * k, 0.0);
    }
    for r in 0..rows {
        let src = &w[(n0 + r) * row_bytes..(n0 + r + 1) * row_bytes];
        quant::dequantize_row(dtype, src, &mut wf[r * k..(r + 1) * k]);
    }
    let mut out = vec![0f32; m * rows];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        let mut r = 0;
        while r + 4 <= rows {
            let d = dot4(
                xr,
                [
                    &wf[r * k..(r + 1) * k],
                    &wf[(r + 1) * k..(r + 2) * k],
                    &wf[(r + 2) * k..(r + 3) * k],
                    &wf[(r + 3) * k..(r + 4) * k],
                ],
            );
            out[i * rows + r..i * rows + r + 4].copy_from_slice(&d);
            r += 4;
        }
        while r < rows {
            out[i * rows + r] = dot(xr, &wf[r * k..(r + 1) * k]);
            r += 1;
        }
    }
    SCRATCH.with(|cell| cell.replace(wf));
    Ok(out)
}

/// `task` compiled for AVX2 + FMA (chosen at run time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn task_avx2(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n0: usize,
    rows: usize,
) -> KResult<Vec<f32>> {
    task(x, m, k, w, dtype, n0, rows)
}

fn run_task(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n0: usize,
    rows: usize,
) -> KResult<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { task_avx2(x, m, k, w, dtype, n0, rows) };
        }
    }
    task(x, m, k, w, dtype, n0, rows)
}

/// `y [m, n] = x [m, k] · Wᵀ` where `w` holds `n` rows of `k` elements of `dtype`.
pub(crate) fn gemm(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n: usize,
    y: &mut [f32],
) -> KResult {
    let tasks: Vec<usize> = (0..n).step_by(ROWS_PER_TASK).collect();
    let parts = tasks
        .par_iter()
        .map(|&n0| run_task(x, m, k, w, dtype, n0, ROWS_PER_TASK.min(n - n0)))
        .collect::<KResult<Vec<_>>>()?;
    for (&n0, part) in tasks.iter().zip(&parts) {
        let rows = ROWS_PER_TASK.min(n - n0);
        for i in 0..m {
            y[i * n + n0..i * n + n0 + rows].copy_from_slice(&part[i * rows..(i + 1) * rows]);
        }
    }
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
