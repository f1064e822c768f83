//! Mixture of experts: routing (top-k over softmax or sigmoid gates) and matmul by expert id.

use rayon::prelude::*;

use super::elementwise::sigmoid;
use super::mat_mul::gemm;
use super::softmax::softmax_row;
use super::{index, In, KResult, Out};
use crate::op::{MoeGating, MoeOp};

pub(crate) fn route(
    k: usize,
    gating: MoeGating,
    normalize: bool,
    i: &[In],
    o: &mut [Out],
) -> KResult {
    let logits = i[0].f32()?;
    let e = i[0].dims()[1].max(1);
    let rows: Vec<(Vec<f32>, Vec<i32>)> = logits
        .par_chunks(e)
        .map(|row| {
            let mut p = row.to_vec();
            match gating {
                MoeGating::Softmax => softmax_row(&mut p),
                MoeGating::Sigmoid => p.iter_mut().for_each(|v| *v = sigmoid(*v)),
            }
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            idx.truncate(k);
            let mut w: Vec<f32> = idx.iter().map(|&j| p[j]).collect();
            if normalize {
                let s: f32 = w.iter().sum();
                if s > 0.0 {
                    w.iter_mut().for_each(|v| *v /= s);
                }
            }
            (w, idx.into_iter().map(|j| j as i32).collect())
        })
        .collect();
    let w: Vec<f32> = rows.iter().flat_map(|r| r.0.iter().copied()).collect();
    let ids: Vec<i32> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
    o[0].store_f32(&w)?;
    o[1].store_i32(&ids);
    Ok(())
}

/// `out[t] = Σᵢ w[t, i]·y[t, i]`, summed in slot order.
pub(crate) fn sum(i: &[In], o: &mut [Out]) -> KResult {
    let y = i[0].f32()?;
    let w = i[1].f32()?;
    let (k, n) = (i[0].dims()[1], i[0].dims()[2]);
    let out: Vec<f32> = y
        .par_chunks(k * n)
        .zip(w.par_chunks(k))
        .flat_map_iter(|(ys, ws)| {
            (0..n).map(move |j| (0..k).fold(0f32, |acc, s| acc + ws[s] * ys[s * n + j]))
        })
        .collect();
    o[0].store_f32(&out)
}

/// `y[t, i] = x[t, i or 0] · w[ids[t, i]]ᵀ`, grouped by expert so each expert's rows are
/// dequantized once per call.
pub(crate) fn mat_mul_id(i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let w = &i[1];
    let ids = i[2].i32()?;
    let (ne, n, kdim) = (w.dims()[0], w.dims()[1], w.dims()[2]);
    let (t, k) = (i[2].dims()[0], i[2].dims()[1]);
    // x is [T, K] (shared by the k slots), [T, 1, K] likewise, or [T, k, K].
    let per_slot = i[0].desc.numel() == t * k * kdim && k > 1;
    let expert_bytes = n * w.row_bytes();
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); ne];
    for (r, &id) in ids.iter().enumerate() {
        by_expert[index(id, ne, "expert id")?].push(r);
    }
    o[0].with_f32(false, |y| {
        for (e, rows) in by_expert.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let mut xs = Vec::with_capacity(rows.len() * kdim);
            for &r in rows {
                let src = if per_slot { r } else { r / k };
                xs.extend_from_slice(&x[src * kdim..(src + 1) * kdim]);
            }
            let mut ys = vec![0f32; rows.len() * n];
            let wb = &w.bytes[e * expert_bytes..(e + 1) * expert_bytes];
            gemm(&xs, rows.len(), kdim, wb, w.desc.dtype, n, &mut ys)?;
            for (j, &r) in rows.iter().enumerate() {
                y[r * n..(r + 1) * n].copy_from_slice(&ys[j * n..(j + 1) * n]);
            }
        }
        Ok(())
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &MoeOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        MoeOp::MatMulId => mat_mul_id(i, o),
        MoeOp::MoeRoute {
            k,
            gating,
            normalize,
        } => route(*k, *gating, *normalize, i, o),
        MoeOp::MoeSum => sum(i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &MoeOp) -> bool {
    false
}
