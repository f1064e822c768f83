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
#[inline]
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
    let row_bytes = dtype.bytes_for(k).unwrap_or(0);
    let tasks: Vec<usize> = (0..n).step_by(ROWS_PER_TASK).collect();
    let parts = tasks
        .par_iter()
        .map(|&n0| -> KResult<Vec<f32>> {
            let rows = ROWS_PER_TASK.min(n - n0);
            let mut wf = vec![0f32; rows * k];
            for r in 0..rows {
                let src = &w[(n0 + r) * row_bytes..(n0 + r + 1) * row_bytes];
                quant::dequantize(dtype, src, &mut wf[r * k..(r + 1) * k])?;
            }
            let mut out = vec![0f32; m * rows];
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for r in 0..rows {
                    out[i * rows + r] = dot(xr, &wf[r * k..(r + 1) * k]);
                }
            }
            Ok(out)
        })
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
