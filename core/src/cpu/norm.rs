//! RMSNorm (plain and `1 + w`) and L2 norm, one row of the last dimension at a time.

use super::{pool, In, KResult, Out};
use crate::op::NormOp;

/// Elements below which a row-wise op runs on the calling thread alone.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Normalises each row of `x` (rows of `w.len()`) in place.
pub(crate) fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32, one_plus: bool) {
    let d = w.len().max(1);
    pool::par_rows(x, d, PAR_MIN, |_, rows| {
        for row in rows.chunks_mut(d) {
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / d as f32 + eps).sqrt();
            for (v, w) in row.iter_mut().zip(w) {
                let w = if one_plus { 1.0 + w } else { *w };
                *v = *v * inv * w;
            }
        }
    });
}

/// `x / sqrt(Σx² + eps)` per row of `d`, in place.
pub(crate) fn l2_norm_rows(x: &mut [f32], d: usize, eps: f32) {
    let d = d.max(1);
    pool::par_rows(x, d, PAR_MIN, |_, rows| {
        for row in rows.chunks_mut(d) {
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss + eps).sqrt();
            for v in row.iter_mut() {
                *v *= inv;
            }
        }
    });
}

pub(crate) fn rms_norm(eps: f32, one_plus: bool, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let w = i[1].f32()?;
    o[0].with_f32(false, |y| {
        y.copy_from_slice(&x);
        rms_norm_rows(y, &w, eps, one_plus);
        Ok(())
    })
}

pub(crate) fn l2_norm(eps: f32, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let d = i[0].desc.shape.last();
    o[0].with_f32(false, |y| {
        y.copy_from_slice(&x);
        l2_norm_rows(y, d, eps);
        Ok(())
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &NormOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        NormOp::RmsNorm { eps, one_plus } => rms_norm(*eps, *one_plus, i, o),
        NormOp::L2Norm { eps } => l2_norm(*eps, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &NormOp) -> bool {
    true
}
