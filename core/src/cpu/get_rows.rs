//! Embedding lookup from a table in any dtype.

use super::{index, pool, In, KResult, Out};
use crate::op::GetRowsOp;

pub(crate) fn get_rows(i: &[In], o: &mut [Out]) -> KResult {
    let (table, ids) = (&i[0], i[1].i32()?);
    let (v, d) = (table.dims()[0], table.dims()[1]);
    let rows = ids
        .iter()
        .map(|&id| index(id, v, "row id"))
        .collect::<KResult<Vec<_>>>()?;
    let d = d.max(1);
    o[0].with_f32(false, |y| {
        pool::par_rows(y, d, 1 << 15, |r0, dst| {
            for (dst, &r) in dst.chunks_mut(d).zip(&rows[r0..]) {
                table.dequantize_row(r, dst);
            }
        });
        Ok(())
    })
}

/// `Σⱼ softmax(logits[t])ⱼ · table[j]`, over every row or the `top_k` largest logits (see
/// [`crate::op::GetRowsOp::SoftEmbedding`]). Dense: the probabilities first, then the table once, in
/// vocabulary slices whose partial sums are added. Top-k: k rows gathered per position.
pub(crate) fn soft_embedding(top_k: usize, i: &[In], o: &mut [Out]) -> KResult {
    use rayon::prelude::*;
    let (logits, table) = (i[0].f32()?, &i[1]);
    let (t, v) = (i[0].dims()[0], i[0].dims()[1]);
    let e = table.dims()[1];
    let row = |j: usize, dst: &mut [f32]| table.dequantize_row(j, dst);
    // Each position's chosen rows and their softmax weights.
    let pick = |ls: &[f32]| -> Vec<(usize, f64)> {
        let mut ids: Vec<usize> = (0..v).collect();
        if top_k > 0 && top_k < v {
            ids.select_nth_unstable_by(top_k - 1, |&a, &b| ls[b].total_cmp(&ls[a]));
            ids.truncate(top_k);
        }
        let m = ids
            .iter()
            .map(|&j| ls[j] as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut w: Vec<(usize, f64)> = ids.iter().map(|&j| (j, (ls[j] as f64 - m).exp())).collect();
        let z: f64 = w.iter().map(|x| x.1).sum();
        for x in &mut w {
            x.1 /= z;
        }
        w
    };
    let chosen: Vec<Vec<(usize, f64)>> = logits.par_chunks(v.max(1)).map(pick).collect();
    let mut out = vec![0f64; t * e];
    if top_k > 0 && top_k < v {
        out.par_chunks_mut(e.max(1))
            .zip(&chosen)
            .for_each(|(acc, w)| {
                let mut r = vec![0f32; e];
                for &(j, p) in w {
                    row(j, &mut r);
                    for (a, &x) in acc.iter_mut().zip(&r) {
                        *a += p * x as f64;
                    }
                }
            });
    } else {
        // The table once: slices of the vocabulary in parallel, their sums added.
        let slice = 1024usize;
        out = (0..v.div_ceil(slice))
            .into_par_iter()
            .map(|s| {
                let mut acc = vec![0f64; t * e];
                let mut r = vec![0f32; e];
                for j in s * slice..((s + 1) * slice).min(v) {
                    row(j, &mut r);
                    for (ti, w) in chosen.iter().enumerate() {
                        let p = w[j].1;
                        for (a, &x) in acc[ti * e..(ti + 1) * e].iter_mut().zip(&r) {
                            *a += p * x as f64;
                        }
                    }
                }
                acc
            })
            .reduce(
                || vec![0f64; t * e],
                |mut a, b| {
                    for (x, y) in a.iter_mut().zip(&b) {
                        *x += y;
                    }
                    a
                },
            );
    }
    let out: Vec<f32> = out.iter().map(|&x| x as f32).collect();
    o[0].store_f32(&out)
}

/// The family's CPU reference.
pub(super) fn run_op(op: &GetRowsOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        GetRowsOp::GetRows => get_rows(i, o),
        GetRowsOp::SoftEmbedding { top_k } => soft_embedding(*top_k, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(op: &GetRowsOp) -> bool {
    *op == GetRowsOp::GetRows
}
