//! Row softmax with scale, soft-capping and an additive mask.

use rayon::prelude::*;

use super::elementwise::exp_f32;
use super::{In, KResult, Out};
use crate::op::SoftmaxOp;

/// Softmax of one row in place (max-subtracted; an all `-inf` row becomes zeros). The
/// exponentials go through [`exp_f32`] and the sum runs in 16 lanes added in a fixed order,
/// so the loop vectorises and gives the same bits on every CPU.
pub(crate) fn softmax_row(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::isa() == super::simd::Isa::Avx512 {
        // SAFETY: the CPU has AVX-512.
        return unsafe { softmax_row_avx512(row) };
    }
    softmax_row_lanes(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn softmax_row_avx512(row: &mut [f32]) {
    softmax_row_lanes(row)
}

#[inline(always)]
fn softmax_row_lanes(row: &mut [f32]) {
    const L: usize = 16;
    let mut m = [f32::NEG_INFINITY; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for (m, v) in m.iter_mut().zip(c) {
            *m = m.max(*v);
        }
    }
    for (m, v) in m.iter_mut().zip(chunks.remainder()) {
        *m = m.max(*v);
    }
    let max = m.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    // A masked score (-inf) weighs exactly 0.
    let e = |v: f32| {
        if v == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(v - max)
        }
    };
    let mut s = [0f32; L];
    let mut chunks = row.chunks_exact_mut(L);
    for c in &mut chunks {
        for (s, v) in s.iter_mut().zip(c.iter_mut()) {
            *v = e(*v);
            *s += *v;
        }
    }
    for (s, v) in s.iter_mut().zip(chunks.into_remainder()) {
        *v = e(*v);
        *s += *v;
    }
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            s[i] += s[i + w];
        }
    }
    let inv = 1.0 / s[0];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Rows of many lengths, with masked (-inf) scores, against an f64 softmax; the
    /// vectorised and the portable build give the same bits.
    #[test]
    fn softmax_row_matches_an_f64_softmax() {
        let mut rng = Rng::new(41);
        for n in [1usize, 5, 16, 37, 300, 1029] {
            let mut row: Vec<f32> = (0..n).map(|_| rng.normal() * 6.0).collect();
            for j in (0..n).filter(|j| j % 7 == 3) {
                row[j] = f32::NEG_INFINITY;
            }
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let z: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            let mut got = row.clone();
            softmax_row(&mut got);
            let mut portable = row.clone();
            softmax_row_lanes(&mut portable);
            for (j, ((g, p), x)) in got.iter().zip(&portable).zip(&row).enumerate() {
                assert_eq!(g.to_bits(), p.to_bits(), "n {n}: {j}");
                let want = (*x as f64 - max).exp() / z;
                if *x == f32::NEG_INFINITY {
                    assert_eq!(*g, 0.0, "n {n}: masked {j}");
                } else {
                    // exp within a few ulp, of an argument x - max rounded to f32.
                    let rel = 1e-6 + (*x as f64 - max).abs() * f64::powi(2.0, -23);
                    assert!(
                        (*g as f64 - want).abs() <= rel * want + 1e-30,
                        "n {n}: {j}: {g} vs {want}"
                    );
                }
            }
        }
        let mut masked = vec![f32::NEG_INFINITY; 20];
        softmax_row(&mut masked);
        assert!(masked.iter().all(|&v| v == 0.0));
    }
}
