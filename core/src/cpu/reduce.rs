//! Argmax and top-k over the last dimension (largest first, ties to the lower index).

use std::cmp::Ordering;

use rayon::prelude::*;

use super::{In, KResult, Out};
use crate::op::ReduceOp;

/// Descending by value (IEEE total order), then ascending by index.
#[inline]
fn better(a: (usize, f32), b: (usize, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

pub(crate) fn argmax(i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let n = i[0].desc.shape.last().max(1);
    let idx: Vec<i32> = x
        .par_chunks(n)
        .map(|row| {
            let mut best = (0usize, row[0]);
            for (j, &v) in row.iter().enumerate().skip(1) {
                if better((j, v), best) == Ordering::Less {
                    best = (j, v);
                }
            }
            best.0 as i32
        })
        .collect();
    o[0].store_i32(&idx);
    Ok(())
}

pub(crate) fn top_k(k: usize, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let n = i[0].desc.shape.last().max(1);
    let rows: Vec<Vec<(usize, f32)>> = x
        .par_chunks(n)
        .map(|row| {
            let mut v: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
            if k < v.len() {
                v.select_nth_unstable_by(k - 1, |a, b| better(*a, *b));
                v.truncate(k);
            }
            v.sort_unstable_by(|a, b| better(*a, *b));
            v
        })
        .collect();
    let vals: Vec<f32> = rows.iter().flat_map(|r| r.iter().map(|e| e.1)).collect();
    let idx: Vec<i32> = rows
        .iter()
        .flat_map(|r| r.iter().map(|e| e.0 as i32))
        .collect();
    o[0].store_f32(&vals)?;
    o[1].store_i32(&idx);
    Ok(())
}

/// The family's CPU reference.
pub(super) fn run_op(op: &ReduceOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        ReduceOp::Argmax => argmax(i, o),
        ReduceOp::TopK(k) => top_k(*k, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &ReduceOp) -> bool {
    false
}
