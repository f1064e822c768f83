//! RMSNorm (plain and `1 + w`), L2 norm and LayerNorm, one row of the last dimension at a time.

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

/// `(x − mean) / sqrt(var + eps) * w + b` per row, the mean and the (population) variance
/// summed in f64 in two passes, so the reference holds for rows far from zero mean.
pub(crate) fn layer_norm(eps: f32, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let w = i[1].f32()?;
    let b = i[2].f32()?;
    let d = w.len().max(1);
    o[0].with_f32(false, |y| {
        y.copy_from_slice(&x);
        pool::par_rows(y, d, PAR_MIN, |_, rows| {
            for row in rows.chunks_mut(d) {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
                let inv = 1.0 / (var + eps as f64).sqrt();
                for ((v, w), b) in row.iter_mut().zip(w.iter()).zip(b.iter()) {
                    *v = ((*v as f64 - mean) * inv * *w as f64 + *b as f64) as f32;
                }
            }
        });
        Ok(())
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &NormOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        NormOp::RmsNorm { eps, one_plus } => rms_norm(*eps, *one_plus, i, o),
        NormOp::L2Norm { eps } => l2_norm(*eps, i, o),
        NormOp::LayerNorm { eps } => layer_norm(*eps, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &NormOp) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use crate::exec::Executor;
    use crate::op::{NormOp, Op};
    use crate::rng::Rng;

    /// LayerNorm against a naive f64 loop, on rows far from zero mean (where a variance taken
    /// about the origin, E[x²] − E[x]², would cancel) and a row of one repeated value.
    #[test]
    fn layer_norm_matches_a_naive_f64_loop() {
        let ex = Executor::cpu();
        let mut rng = Rng::new(17);
        let (rows, d, eps) = (6usize, 300usize, 1e-5f32);
        let mut x: Vec<f32> = (0..rows * d)
            .map(|i| 100.0 * (i / d) as f32 + rng.normal() * (0.01 + (i / d) as f32))
            .collect();
        x[..d].fill(3.25);
        let w: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
        let b: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
        let up = |v: &[f32], s: &[usize]| ex.upload_f32(s, v).expect("upload");
        let out = ex
            .run(
                &Op::Norm(NormOp::LayerNorm { eps }),
                &[&up(&x, &[rows, d]), &up(&w, &[d]), &up(&b, &[d])],
            )
            .expect("layer_norm");
        let got = ex.download_f32(&out[0]).expect("download");
        for r in 0..rows {
            let row: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|&v| v as f64).collect();
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
            for j in 0..d {
                let want = (row[j] - mean) / (var + eps as f64).sqrt() * w[j] as f64 + b[j] as f64;
                let g = got[r * d + j] as f64;
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "row {r} col {j}: {g} vs {want}"
                );
            }
        }
    }
}
