//! Key and query statistics after RoPE, averaged over a context's positions analytically
//! from statistics taken before it (`--kv-fit-keys`, `--kv-center-keys`).
//!
//! A fitted key map ([`super::key_fit`]) needs `E[k kᵀ]` and `E[q qᵀ]` of the keys and
//! queries as the cache sees them, after RoPE, over every position a context holds. Measured
//! after RoPE, they need a calibration pass over the whole context: a channel pair whose
//! rotation is slow against the pass keeps one direction there, and a map fitted to those
//! directions is wrong further on (SmolLM2 at 4,096 tokens: worse than no map). Before RoPE,
//! the statistics of a short pass hold at any position, and RoPE's effect on them is known:
//! pair `i` (channels `a_i`, `b_i`) turns by `p·ω_i` at position `p`, `x' = R(p·ω_i) x` with
//! `R(φ) = [[cos φ, −sin φ], [sin φ, cos φ]]`, so over positions `0..P` uniformly
//!
//! ```text
//! E_p[R(pω_i) B R(pω_j)ᵀ] = (αI + βJ)·R̄(ω_i − ω_j) + (γK + δL)·R̄(−ω_i − ω_j)
//! ```
//!
//! for the 2 × 2 block `B` of the moments between pairs `i` and `j`, written as its part that
//! commutes with rotations, `αI + βJ` (`J` the quarter turn), and its reflection part
//! `γK + δL` (`K = diag(1, −1)`, `L` the swap; `R(φ)K = K R(−φ)`), where `R̄(ω)` is the mean of
//! `R(pω)` over the positions: `[[C, −S], [S, C]]` with `C + iS = (1/P)·Σ_p e^{ipω}`, a
//! geometric sum. A pair against an unrotated channel averages to `R̄(ω_i)·B`, and a mean
//! key `μ` to `R̄(ω_i)·μ_i` per pair. YaRN's `attn_factor` scales the rotated channels.

use crate::op::rope::{RopeMode, RopeParams};

/// A layer's rotary embedding as its statistics see it: the rotated channel pairs with
/// their angle a position, and the gain of the rotated channels.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotary {
    /// `(a, b, ω)`: channels `a` and `b` turn by `p·ω` at position `p`.
    pairs: Vec<(usize, usize, f64)>,
    /// Width of the rows (rotated channels and the rest).
    d: usize,
    /// What cos and sin are multiplied by (`attn_factor`).
    gain: f64,
}

/// One row or column unit of the moments: a rotated pair (its index) or a channel that
/// passes through.
#[derive(Clone, Copy)]
enum Unit {
    Pair(usize),
    Plain(usize),
}

impl Rotary {
    /// The embedding `rope` applies to rows of `d` channels (`factors`, where given, divide
    /// each pair's frequency, as the op's third input does). `None` where `rope` does not fit
    /// rows of `d` or a factor is missing.
    pub fn new(rope: &RopeParams, factors: Option<&[f32]>, d: usize) -> Option<Rotary> {
        let n = rope.n_rot;
        if n == 0 || n % 2 != 0 || n > d || factors.is_some_and(|f| f.len() != n / 2) {
            return None;
        }
        let half = n / 2;
        let pairs = (0..half)
            .map(|i| {
                let theta = (rope.base as f64).powf(-2.0 * i as f64 / n as f64);
                let f = factors.map_or(1.0, |f| f[i] as f64);
                // An infinite factor leaves the pair unrotated (the op's convention).
                let w = match f.is_finite() {
                    true => rope.freq_scale as f64 * theta / f,
                    false => 0.0,
                };
                match rope.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1, w),
                    RopeMode::Neox => (i, i + half, w),
                }
            })
            .collect();
        Some(Rotary {
            pairs,
            d,
            gain: rope.attn_factor as f64,
        })
    }

    /// Whether every angle and the gain are finite numbers (a model file's RoPE parameters
    /// may give an infinite or NaN frequency, which its rope op would turn into NaN rows).
    pub fn is_finite(&self) -> bool {
        self.gain.is_finite() && self.pairs.iter().all(|p| p.2.is_finite())
    }

    fn units(&self) -> Vec<Unit> {
        let mut rotated = vec![false; self.d];
        for &(a, b, _) in &self.pairs {
            rotated[a] = true;
            rotated[b] = true;
        }
        (0..self.pairs.len())
            .map(Unit::Pair)
            .chain((0..self.d).filter(|&c| !rotated[c]).map(Unit::Plain))
            .collect()
    }

    /// `E_p[R(p) m R(p)ᵀ]` over positions `0..positions` for the `d × d` second moments `m`
    /// (row-major) of rows before RoPE.
    pub fn average_moments(&self, m: &[f64], positions: usize) -> Vec<f64> {
        let d = self.d;
        let mut out = vec![0.0; d * d];
        if m.len() != d * d {
            return out;
        }
        let units = self.units();
        let g = self.gain;
        for &u in &units {
            for &v in &units {
                match (u, v) {
                    (Unit::Plain(a), Unit::Plain(b)) => out[a * d + b] = m[a * d + b],
                    (Unit::Pair(i), Unit::Plain(c)) => {
                        let (a, b, _) = self.pairs[i];
                        let t = self.mean_turned(i, positions, (m[a * d + c], m[b * d + c]));
                        (out[a * d + c], out[b * d + c]) = t;
                    }
                    (Unit::Plain(c), Unit::Pair(j)) => {
                        // B · R̄ᵀ for a row B = (x, y) is R̄ · (x, y) written as a row.
                        let (a, b, _) = self.pairs[j];
                        let t = self.mean_turned(j, positions, (m[c * d + a], m[c * d + b]));
                        (out[c * d + a], out[c * d + b]) = t;
                    }
                    (Unit::Pair(i), Unit::Pair(j)) => {
                        let (a, b, wi) = self.pairs[i];
                        let (c, e, wj) = self.pairs[j];
                        let (b00, b01) = (m[a * d + c], m[a * d + e]);
                        let (b10, b11) = (m[b * d + c], m[b * d + e]);
                        let (al, be) = ((b00 + b11) / 2.0, (b10 - b01) / 2.0);
                        let (ga, de) = ((b00 - b11) / 2.0, (b01 + b10) / 2.0);
                        let (c1, s1) = mean_turn(wi - wj, positions);
                        let (c2, s2) = mean_turn(-wi - wj, positions);
                        // (αI + βJ)·[[c1, −s1], [s1, c1]] + (γK + δL)·[[c2, −s2], [s2, c2]].
                        let r = [
                            al * c1 - be * s1 + ga * c2 + de * s2,
                            -al * s1 - be * c1 - ga * s2 + de * c2,
                            be * c1 + al * s1 + de * c2 - ga * s2,
                            -be * s1 + al * c1 - de * s2 - ga * c2,
                        ];
                        let gg = g * g;
                        out[a * d + c] = gg * r[0];
                        out[a * d + e] = gg * r[1];
                        out[b * d + c] = gg * r[2];
                        out[b * d + e] = gg * r[3];
                    }
                }
            }
        }
        out
    }

    /// `E_p[R(p) μ]` over positions `0..positions` for a mean `μ` of `d` before RoPE.
    pub fn average_vector(&self, mu: &[f64], positions: usize) -> Vec<f64> {
        let mut out = mu.to_vec();
        if mu.len() != self.d {
            return out;
        }
        for (i, &(a, b, _)) in self.pairs.iter().enumerate() {
            (out[a], out[b]) = self.mean_turned(i, positions, (mu[a], mu[b]));
        }
        out
    }

    /// `gain · R̄(ω_i) · (x, y)`: pair `i`'s two channels turned by its mean turn over
    /// positions `0..positions`.
    fn mean_turned(&self, i: usize, positions: usize, (x, y): (f64, f64)) -> (f64, f64) {
        let (cs, sn) = mean_turn(self.pairs[i].2, positions);
        (self.gain * (cs * x - sn * y), self.gain * (sn * x + cs * y))
    }
}

/// The mean of `(cos pω, sin pω)` over `p = 0..positions`: `(1/P)·e^{i(P−1)r/2}·sin(Pr/2) /
/// sin(r/2)` with `r` the angle `ω` less its whole turns (which `cos pω` and `sin pω` do not
/// see; reduced first, the quotient keeps its precision near a whole turn, where `sin(ω/2)`
/// of the unreduced angle would be a rounding error).
fn mean_turn(w: f64, positions: usize) -> (f64, f64) {
    use std::f64::consts::TAU;
    let p = positions.max(1) as f64;
    let r = w - TAU * (w / TAU).round();
    let half = (r / 2.0).sin();
    if !half.is_normal() {
        return (1.0, 0.0);
    }
    let amp = (p * r / 2.0).sin() / (p * half);
    let phase = (p - 1.0) * r / 2.0;
    (amp * phase.cos(), amp * phase.sin())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn rand_rows(n: usize, d: usize, seed: u64) -> Vec<f64> {
        let mut r = Rng::new(seed);
        // Correlated channels with a mean, as keys have.
        let mix: Vec<f64> = (0..d * d).map(|_| r.normal() as f64).collect();
        let mean: Vec<f64> = (0..d).map(|_| 2.0 * r.normal() as f64).collect();
        let mut out = vec![0.0; n * d];
        for row in out.chunks_exact_mut(d) {
            let z: Vec<f64> = (0..d).map(|_| r.normal() as f64).collect();
            for (i, o) in row.iter_mut().enumerate() {
                *o = mean[i] + (0..d).map(|j| mix[i * d + j] * z[j]).sum::<f64>() / d as f64;
            }
        }
        out
    }

    /// The rows turned at every position `0..positions` by a direct rotation, their second
    /// moments and mean: the oracle the closed forms are held to.
    fn brute(rot: &Rotary, rows: &[f64], positions: usize) -> (Vec<f64>, Vec<f64>) {
        let d = rot.d;
        let mut m = vec![0.0; d * d];
        let mut mu = vec![0.0; d];
        let mut n = 0.0;
        for p in 0..positions {
            for row in rows.chunks_exact(d) {
                let mut x = row.to_vec();
                for &(a, b, w) in &rot.pairs {
                    let (s, c) = (p as f64 * w).sin_cos();
                    x[a] = rot.gain * (c * row[a] - s * row[b]);
                    x[b] = rot.gain * (s * row[a] + c * row[b]);
                }
                for i in 0..d {
                    mu[i] += x[i];
                    for j in 0..d {
                        m[i * d + j] += x[i] * x[j];
                    }
                }
                n += 1.0;
            }
        }
        (
            m.iter().map(|v| v / n).collect(),
            mu.iter().map(|v| v / n).collect(),
        )
    }

    fn moments(rows: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
        let n = (rows.len() / d) as f64;
        let mut m = vec![0.0; d * d];
        let mut mu = vec![0.0; d];
        for row in rows.chunks_exact(d) {
            for i in 0..d {
                mu[i] += row[i] / n;
                for j in 0..d {
                    m[i * d + j] += row[i] * row[j] / n;
                }
            }
        }
        (m, mu)
    }

    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn the_closed_forms_equal_the_moments_of_rotated_rows() {
        // Both layouts, partial rotary, a pair left unrotated by an infinite factor, a
        // YaRN-style gain, a frequency of a whole turn a position.
        let cases: [(RopeMode, usize, usize, Option<Vec<f32>>, f32, f32); 4] = [
            (RopeMode::Normal, 8, 8, None, 1.0, 1.0),
            (RopeMode::Neox, 10, 6, None, 0.5, 1.0),
            (
                RopeMode::Neox,
                8,
                8,
                Some(vec![1.0, 4.0, f32::INFINITY, 2.0]),
                1.0,
                1.2,
            ),
            (
                RopeMode::Normal,
                6,
                4,
                Some(vec![1.0 / std::f32::consts::TAU, 3.0]),
                1.0,
                1.0,
            ),
        ];
        for (ci, (mode, d, n_rot, factors, scale, gain)) in cases.into_iter().enumerate() {
            let mut rope = RopeParams::new(mode, n_rot, 10.0);
            rope.freq_scale = scale;
            rope.attn_factor = gain;
            let rot = Rotary::new(&rope, factors.as_deref(), d).expect("fits");
            let rows = rand_rows(7, d, 11 + ci as u64);
            let (m, mu) = moments(&rows, d);
            for positions in [1, 5, 37] {
                let (bm, bmu) = brute(&rot, &rows, positions);
                let am = rot.average_moments(&m, positions);
                let amu = rot.average_vector(&mu, positions);
                let scale = bm.iter().fold(0.0f64, |a, v| a.max(v.abs()));
                assert!(
                    max_diff(&am, &bm) < 1e-12 * scale.max(1.0),
                    "case {ci}, {positions} positions: moments off by {}",
                    max_diff(&am, &bm)
                );
                assert!(
                    max_diff(&amu, &bmu) < 1e-12 * scale.max(1.0),
                    "case {ci}: mean"
                );
            }
        }
    }

    #[test]
    fn the_pairs_turn_as_the_rope_op_does() {
        // Rows through the CPU's rope op at positions 0..P against the closed form: the
        // pairs, their order and their angles are the op's.
        use crate::exec::Executor;
        let ex = Executor::cpu();
        for (mode, factors) in [
            (RopeMode::Normal, None),
            (RopeMode::Neox, Some(vec![1.0f32, 8.0, 2.0, f32::INFINITY])),
        ] {
            let (d, n_rot, positions) = (12usize, 8usize, 40usize);
            let mut rope = RopeParams::new(mode, n_rot, 100.0);
            rope.freq_scale = 0.5;
            let rows = rand_rows(3, d, 5);
            let (m, mu) = moments(&rows, d);
            let rot = Rotary::new(&rope, factors.as_deref(), d).expect("fits");
            // [P·3, 1, d]: every row at every position.
            let x: Vec<f32> = (0..positions)
                .flat_map(|_| rows.iter().map(|&v| v as f32))
                .collect();
            let pos: Vec<i32> = (0..positions)
                .flat_map(|p| std::iter::repeat_n(p as i32, 3))
                .collect();
            let xt = ex.upload_f32(&[positions * 3, 1, d], &x).expect("upload");
            let pt = ex.upload_i32(&[positions * 3], &pos).expect("upload");
            let ft = factors
                .as_ref()
                .map(|f| ex.upload_f32(&[f.len()], f).expect("upload"));
            let y = ex.rope(&xt, &pt, rope, ft.as_ref()).expect("rope");
            let y: Vec<f64> = ex
                .download_f32(&y)
                .expect("download")
                .iter()
                .map(|&v| v as f64)
                .collect();
            let (bm, bmu) = moments(&y, d);
            let scale = bm.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let dm = max_diff(&rot.average_moments(&m, positions), &bm);
            let dmu = max_diff(&rot.average_vector(&mu, positions), &bmu);
            assert!(
                dm < 1e-5 * scale,
                "{mode:?}: moments off by {dm} of {scale}"
            );
            assert!(dmu < 1e-5 * scale, "{mode:?}: mean off by {dmu}");
        }
    }

    #[test]
    fn a_rope_that_does_not_fit_the_rows_gives_none() {
        let rope = RopeParams::new(RopeMode::Normal, 8, 10.0);
        assert!(Rotary::new(&rope, None, 6).is_none());
        assert!(Rotary::new(&rope, Some(&[1.0; 3]), 8).is_none());
        assert!(Rotary::new(&rope, Some(&[1.0; 4]), 8).is_some());
    }
}
