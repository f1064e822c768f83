//! The canvas ops of block diffusion: the draw (processed logits, argmax, a Gumbel-max draw,
//! entropy) and the entropy-bound acceptance (see `CanvasOp::CanvasDraw`, `CanvasOp::CanvasAccept`).

use rayon::prelude::*;

use super::{In, KResult, Out};
use crate::op::canvas::{gumbel, noise_token, row_key, GUMBEL_MAX};
use crate::op::CanvasOp;

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

/// The family's CPU reference.
pub(super) fn run_op(op: &CanvasOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        CanvasOp::CanvasDraw { scale, seed } => draw(*scale, *seed, i, o),
        CanvasOp::CanvasAccept {
            entropy_bound,
            confidence,
            stability,
            vocab,
            seed,
        } => accept(*entropy_bound, *confidence, *stability, *vocab, *seed, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &CanvasOp) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use crate::exec::Executor;
    use crate::op::canvas::{gumbel, noise_token, row_key};
    use crate::op::{CanvasOp, Op};
    use crate::rng::Rng;

    fn draw(
        ex: &Executor,
        x: &[f32],
        t: usize,
        scale: f32,
        seed: u64,
    ) -> (Vec<i32>, Vec<i32>, Vec<f32>) {
        let v = x.len() / t;
        let logits = ex.upload_f32(&[t, v], x).expect("upload");
        let (p, a, d, h) = ex
            .canvas_draw(&Op::Canvas(CanvasOp::CanvasDraw { scale, seed }), &logits)
            .expect("draw");
        let p = ex.download_f32(&p).expect("processed");
        for (got, &l) in p.iter().zip(x) {
            assert_eq!(*got, l * scale);
        }
        (
            ex.download_i32(&a).expect("argmax"),
            ex.download_i32(&d).expect("drawn"),
            ex.download_f32(&h).expect("entropy"),
        )
    }

    #[test]
    fn the_draw_matches_a_naive_f64_loop() {
        let ex = Executor::cpu();
        let mut rng = Rng::new(11);
        let (t, v, scale, seed) = (6usize, 500usize, 1.0 / 0.7f32, 0xfeed_beef_u64);
        let x: Vec<f32> = (0..t * v)
            .map(|i| rng.normal() * (1.0 + (i / v) as f32))
            .collect();
        let (a, d, h) = draw(&ex, &x, t, scale, seed);
        for r in 0..t {
            let row = &x[r * v..(r + 1) * v];
            let p: Vec<f64> = row.iter().map(|&l| (l * scale) as f64).collect();
            let best = (0..v).fold(0, |b, j| if row[j] > row[b] { j } else { b });
            assert_eq!(a[r], best as i32);
            let m = p[best];
            let z: f64 = p.iter().map(|q| (q - m).exp()).sum();
            let ent: f64 = -p
                .iter()
                .map(|q| (q - m).exp() / z)
                .map(|q| q * q.ln())
                .sum::<f64>();
            assert!(
                (h[r] as f64 - ent).abs() < 1e-5 * ent.max(1.0),
                "{} {ent}",
                h[r]
            );
            // Every column scored: the pruned search finds the same winner.
            let key = row_key(seed, r as u32);
            let scores: Vec<f32> = (0..v)
                .map(|j| (row[j] * scale) + gumbel(key, j as u32))
                .collect();
            let win = (0..v).fold(0, |b, j| if scores[j] > scores[b] { j } else { b });
            assert_eq!(d[r], win as i32, "row {r}");
        }
        // A different seed draws differently somewhere; the argmax stays.
        let (a2, d2, _) = draw(&ex, &x, t, scale, seed + 1);
        assert_eq!(a, a2);
        assert_ne!(d, d2);
    }

    #[test]
    fn draws_follow_the_softmax() {
        let ex = Executor::cpu();
        let logits = [0.3f32, -1.0, 2.0, 0.0, 1.2];
        let rows = 40_000;
        let x: Vec<f32> = logits.iter().cycle().take(rows * 5).copied().collect();
        let (_, d, _) = draw(&ex, &x, rows, 1.0, 5);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for (j, &l) in logits.iter().enumerate() {
            let p = (l as f64).exp() / z;
            let got = d.iter().filter(|&&k| k == j as i32).count() as f64 / rows as f64;
            let sigma = (p * (1.0 - p) / rows as f64).sqrt();
            assert!((got - p).abs() < 4.0 * sigma, "token {j}: {got} vs {p}");
        }
    }

    /// transformers' rule in f64: sort by entropy, accept where the cumulative sum less the
    /// position's own entropy is within the bound.
    #[test]
    fn acceptance_follows_the_entropy_bound_and_stops_when_stable_and_confident() {
        let ex = Executor::cpu();
        let mut rng = Rng::new(3);
        let (t, vocab) = (50usize, 1000usize);
        for (bound, stability, same, conf, scale) in [
            (0.8f32, 2usize, false, 0.005f32, 0.1f32),
            (0.8, 2, true, 0.05, 0.001),
            (0.8, 2, true, 0.005, 0.1),
            (3.0, 0, false, 0.5, 0.1),
        ] {
            let argmax: Vec<i32> = (0..t).map(|_| rng.below(vocab) as i32).collect();
            let drawn: Vec<i32> = (0..t).map(|_| rng.below(vocab) as i32).collect();
            let ent: Vec<f32> = (0..t).map(|_| rng.f64() as f32 * scale).collect();
            let rows = stability.max(1);
            let hist0: Vec<i32> = match same {
                true => argmax.iter().cycle().take(rows * t).copied().collect(),
                false => (0..rows * t).map(|_| rng.below(vocab) as i32).collect(),
            };
            let up = |v: &[i32], s: &[usize]| ex.upload_i32(s, v).expect("upload");
            let (canvas, history, status) = (
                up(&[0; 50], &[t]),
                up(&hist0, &[rows, t]),
                up(&[0, 0], &[2]),
            );
            let op = Op::Canvas(CanvasOp::CanvasAccept {
                entropy_bound: bound,
                confidence: conf,
                stability,
                vocab,
                seed: 77,
            });
            let ins = [
                &up(&argmax, &[t]),
                &up(&drawn, &[t]),
                &ex.upload_f32(&[t], &ent).expect("e"),
            ];
            ex.canvas_accept(&op, ins, &canvas, &history, &status)
                .expect("accept");
            let canvas = ex.download_i32(&canvas).expect("canvas");
            let history = ex.download_i32(&history).expect("history");
            let status = ex.download_i32(&status).expect("status");
            let mut sorted: Vec<f64> = ent.iter().map(|&e| e as f64).collect();
            sorted.sort_by(f64::total_cmp);
            let mut accepted = 0;
            for i in 0..t {
                let e = ent[i] as f64;
                let below: f64 = sorted.iter().filter(|&&s| s < e).sum();
                let take = below <= bound as f64;
                if (below - bound as f64).abs() < 1e-5 {
                    continue; // at the bound f32 and f64 sums may decide differently
                }
                let want = match take {
                    true => drawn[i],
                    false => noise_token(77, i as u32, vocab as u32) as i32,
                };
                assert_eq!(canvas[i], want, "position {i}");
                accepted += take as i32;
            }
            assert_eq!(status[0], accepted);
            // Spread entropies under a tight bound: some accepted, some not.
            if scale > 0.01 && bound < 1.0 {
                assert!(accepted > 0 && (accepted as usize) < t, "{accepted}");
            }
            let mean = sorted.iter().sum::<f64>() / t as f64;
            let stop = (same || stability == 0) && mean < conf as f64;
            assert_eq!(
                status[1], stop as i32,
                "bound {bound} same {same} mean {mean}"
            );
            if stability > 0 {
                let mut want = hist0[t..].to_vec();
                want.extend(&argmax);
                assert_eq!(history, want);
            }
        }
    }
}
