//! Rotary position embedding, normal (adjacent pairs) and NeoX (halves), partial and scaled.

use super::{pool, In, KResult, Out};
use crate::op::{RopeMode, RopeOp, RopeParams};

pub(crate) fn rope(p: &RopeParams, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let pos = i[1].i32()?;
    let factors = match i.get(2) {
        Some(f) => Some(f.f32()?),
        None => None,
    };
    let (h, d) = (i[0].dims()[1], i[0].dims()[2]);
    let half = p.n_rot / 2;
    // Inverse frequencies, once per call.
    let inv_freq: Vec<f32> = (0..half)
        .map(|j| {
            let f = p.base.powf(-2.0 * j as f32 / p.n_rot as f32);
            let ff = factors.as_ref().map_or(1.0, |f| f[j]);
            f / ff
        })
        .collect();
    o[0].with_f32(false, |y| {
        y.copy_from_slice(&x);
        let hd = (h * d).max(1);
        pool::par_rows(y, hd, super::norm::PAR_MIN, |r0, toks| {
            for (tok, &pos) in toks.chunks_mut(hd).zip(&pos[r0..]) {
                let t = pos as f32 * p.freq_scale;
                let cs: Vec<(f32, f32)> = inv_freq
                    .iter()
                    .map(|f| {
                        let a = t * f;
                        (a.cos() * p.attn_factor, a.sin() * p.attn_factor)
                    })
                    .collect();
                for head in tok.chunks_mut(d) {
                    for (j, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = match p.mode {
                            RopeMode::Normal => (2 * j, 2 * j + 1),
                            RopeMode::Neox => (j, j + half),
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * c - x1 * s;
                        head[b] = x0 * s + x1 * c;
                    }
                }
            }
        });
        Ok(())
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &RopeOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        RopeOp::Rope(p) => rope(p, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &RopeOp) -> bool {
    true
}
