//! Row softmax with scale, soft-capping and an additive mask.

use rayon::prelude::*;

use super::{In, KResult, Out};
use crate::op::SoftmaxOp;

/// Softmax of one row in place (max-subtracted; an all `-inf` row becomes zeros).
pub(crate) fn softmax_row(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

pub(crate) fn softmax(scale: f32, soft_cap: Option<f32>, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let mask = match i.get(1) {
        Some(m) => Some(m.f32()?),
        None => None,
    };
    let n = i[0].desc.shape.last().max(1);
    let mrows = i.get(1).map_or(1, |m| m.desc.shape.rows().max(1));
    o[0].with_f32(false, |y| {
        y.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .enumerate()
            .for_each(|(r, (y, x))| {
                for (j, (y, x)) in y.iter_mut().zip(x).enumerate() {
                    let mut v = x * scale;
                    if let Some(c) = soft_cap {
                        v = c * (v / c).tanh();
                    }
                    if let Some(m) = &mask {
                        v += m[(r % mrows) * n + j];
                    }
                    *y = v;
                }
                softmax_row(y);
            });
        Ok(())
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &SoftmaxOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        SoftmaxOp::Softmax { scale, soft_cap } => softmax(*scale, *soft_cap, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &SoftmaxOp) -> bool {
    false
}
