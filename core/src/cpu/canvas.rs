//! The canvas ops of block diffusion: the draw (processed logits, argmax, a Gumbel-max draw,
//! entropy) and the entropy-bound acceptance (see `Op::CanvasDraw`, `Op::CanvasAccept`).

use rayon::prelude::*;

use super::{In, KResult, Out};
use crate::op::canvas::{gumbel, noise_token, row_key, GUMBEL_MAX};

/// One row: (argmax, draw, entropy), `p` the processed row.
fn draw_row(x: &[f32], p: &[f32], seed: u64, row: usize) -> (usize, usize, f32) {
    let mut a = 0usize;
    for (j, &v) in x.iter().enumerate().skip(1) {
        if v.total_cmp(&x[a]).is_gt() {
            a = j;
        }
    }
    let m = p[a];
    if !m.is_finite() {
        return (a, a, 0.0);
    }
    let (mut z, mut ez) = (0f64, 0f64);
    for &v in p {
        let d = v as f64 - m as f64;
        if d > f64::NEG_INFINITY {
            let e = d.exp();
            z += e;
            ez += e * d;
        }
    }
    let h = (z.ln() - ez / z).max(0.0) as f32;
    // Gumbel-max: only logits within the noise's range of the argmax's noisy score can win.
    let key = row_key(seed, row as u32);
    let best = m + gumbel(key, a as u32);
    let floor = best as f64 - GUMBEL_MAX as f64 - best.abs() as f64 * 1e-6;
    let (mut d, mut ds) = (a, best);
    for (j, &v) in p.iter().enumerate() {
        if (v as f64) < floor || j == a {
            continue;
        }
        let s = v + gumbel(key, j as u32);
        if s.total_cmp(&ds).is_gt() || (s.total_cmp(&ds).is_eq() && j < d) {
            (d, ds) = (j, s);
        }
    }
    (a, d, h)
}

pub(crate) fn draw(scale: f32, seed: u64, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    let v = i[0].dims()[1];
    let p: Vec<f32> = x.iter().map(|&l| l * scale).collect();
    let rows: Vec<(usize, usize, f32)> = x
        .par_chunks(v)
        .zip(p.par_chunks(v))
        .enumerate()
        .map(|(r, (xr, pr))| draw_row(xr, pr, seed, r))
        .collect();
    o[0].store_f32(&p)?;
    o[1].store_i32(&rows.iter().map(|r| r.0 as i32).collect::<Vec<_>>());
    o[2].store_i32(&rows.iter().map(|r| r.1 as i32).collect::<Vec<_>>());
    o[3].store_f32(&rows.iter().map(|r| r.2).collect::<Vec<_>>())
}

fn read_i32(o: &Out) -> Vec<i32> {
    o.bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub(crate) fn accept(
    bound: f32,
    confidence: f32,
    stability: usize,
    vocab: usize,
    seed: u64,
    i: &[In],
    o: &mut [Out],
) -> KResult {
    let (argmax, drawn, ent) = (i[0].i32()?, i[1].i32()?, i[2].f32()?);
    let t = argmax.len();
    let mut order: Vec<usize> = (0..t).collect();
    order.sort_by(|&a, &b| ent[a].total_cmp(&ent[b]).then(a.cmp(&b)));
    // Running f32 sums in rank order: position `order[r]` is accepted when the sum through
    // rank r less its own entropy is within the bound.
    let mut accept = vec![false; t];
    let mut sum = 0f32;
    for &pos in &order {
        sum += ent[pos];
        accept[pos] = sum - ent[pos] <= bound;
    }
    let canvas: Vec<i32> = (0..t)
        .map(|pos| match accept[pos] {
            true => drawn[pos],
            false => noise_token(seed, pos as u32, vocab as u32) as i32,
        })
        .collect();
    let mut hist = read_i32(&o[1]);
    let stable = (0..stability).all(|s| hist[s * t..(s + 1) * t] == argmax[..]);
    if stability > 0 {
        hist.copy_within(t..stability * t, 0);
        hist[(stability - 1) * t..stability * t].copy_from_slice(&argmax);
    }
    let stop = stable && sum < confidence * t as f32;
    o[0].store_i32(&canvas);
    o[1].store_i32(&hist);
    let accepted = accept.iter().filter(|&&a| a).count() as i32;
    o[2].store_i32(&[accepted, stop as i32]);
    Ok(())
}
