//! The block-diffusion canvas sampler (DiffusionGemma's entropy-bound sampler).
//!
//! A canvas starts as uniformly random tokens (or a given canvas). Each denoising step, with
//! `k` steps remaining of `N`, divides the decoder's logits by the temperature
//! `t_min + (t_max − t_min)·k/N`, draws a token per position from the softmax, and accepts
//! the lowest-entropy positions while the running entropy sum, less the largest entropy taken,
//! stays within `entropy_bound`; the rest are re-noised with random tokens. The processed
//! logits feed the next step's self-conditioning. Denoising stops after `N` steps, or when
//! the argmax canvas has been the same for `stability_threshold` steps before and the mean
//! entropy is under `confidence_threshold`. The canvas committed is the last argmax canvas.

use crate::error::{Error, Result};
use crate::rng::Rng;

/// Settings of the denoising loop (`generation_config.json` holds a checkpoint's defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct DiffusionParams {
    pub max_denoising_steps: usize,
    pub t_min: f32,
    pub t_max: f32,
    pub entropy_bound: f32,
    pub stability_threshold: usize,
    pub confidence_threshold: f32,
    pub seed: u64,
}

impl Default for DiffusionParams {
    /// transformers' defaults for a checkpoint that sets none.
    fn default() -> Self {
        DiffusionParams {
            max_denoising_steps: 48,
            t_min: 0.4,
            t_max: 0.8,
            entropy_bound: 0.1,
            stability_threshold: 1,
            confidence_threshold: 0.005,
            seed: 0,
        }
    }
}

impl DiffusionParams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Model(m));
        if self.max_denoising_steps == 0 || self.max_denoising_steps > 100_000 {
            return bad(format!(
                "max_denoising_steps must be 1 to 100000, not {}",
                self.max_denoising_steps
            ));
        }
        if !(self.t_min.is_finite() && self.t_max.is_finite()) || self.t_min <= 0.0 {
            return bad(format!(
                "temperatures must be finite and t_min above 0 (t_min {}, t_max {})",
                self.t_min, self.t_max
            ));
        }
        if self.t_max <= self.t_min {
            return bad(format!(
                "t_max ({}) must be above t_min ({})",
                self.t_max, self.t_min
            ));
        }
        if self.entropy_bound.is_nan() || self.entropy_bound <= 0.0 {
            return bad(format!(
                "entropy_bound must be above 0, not {}",
                self.entropy_bound
            ));
        }
        if self.confidence_threshold.is_nan() || self.confidence_threshold <= 0.0 {
            return bad(format!(
                "confidence_threshold must be above 0, not {}",
                self.confidence_threshold
            ));
        }
        Ok(())
    }

    /// The temperature with `remaining` of the steps left (the first step has them all).
    pub fn temperature(&self, remaining: usize) -> f32 {
        let n = self.max_denoising_steps.max(1) as f32;
        self.t_min + (self.t_max - self.t_min) * (remaining as f32 / n)
    }
}

/// What one denoising step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutcome {
    /// The canvas the next step denoises (accepted positions kept, the rest re-noised).
    pub next: Vec<u32>,
    /// The argmax of the processed logits: the canvas committed if denoising ends here.
    pub argmax: Vec<u32>,
    /// Positions accepted this step.
    pub accepted: usize,
    /// Mean entropy of the processed distributions.
    pub mean_entropy: f64,
    /// Whether denoising stops here (stable and confident).
    pub stop: bool,
}

/// One canvas's denoising state.
pub struct CanvasSampler {
    params: DiffusionParams,
    vocab: usize,
    rng: Rng,
    /// The last `stability_threshold` argmax canvases, oldest first (`None`: not yet seen).
    history: std::collections::VecDeque<Option<Vec<u32>>>,
}

impl CanvasSampler {
    pub fn new(params: DiffusionParams, vocab: usize) -> Result<CanvasSampler> {
        params.validate()?;
        if vocab == 0 {
            return Err(Error::Model("an empty vocabulary".into()));
        }
        let rng = Rng::new(params.seed);
        let mut s = CanvasSampler {
            params,
            vocab,
            rng,
            history: Default::default(),
        };
        s.reset();
        Ok(s)
    }

    pub fn params(&self) -> &DiffusionParams {
        &self.params
    }

    /// Before a new canvas: forgets the argmax history.
    pub fn reset(&mut self) {
        self.history = std::iter::repeat_n(None, self.params.stability_threshold).collect();
    }

    /// A canvas of `n` uniformly random tokens.
    pub fn noise(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.rng.below(self.vocab) as u32).collect()
    }

    /// One step over the decoder's `logits` (one row per position of `canvas`), `remaining`
    /// steps left counting this one. `logits` become the processed logits (divided by the
    /// temperature): the next step's self-conditioning input.
    pub fn step(
        &mut self,
        canvas: &[u32],
        logits: &mut [Vec<f32>],
        remaining: usize,
    ) -> Result<StepOutcome> {
        if logits.len() != canvas.len() || logits.iter().any(|r| r.len() != self.vocab) {
            return Err(Error::Model(format!(
                "{} logits rows for a canvas of {}",
                logits.len(),
                canvas.len()
            )));
        }
        let t = self.params.temperature(remaining) as f64;
        let n = canvas.len();
        let mut drawn = Vec::with_capacity(n);
        let mut argmax = Vec::with_capacity(n);
        let mut entropy = Vec::with_capacity(n);
        for row in logits.iter_mut() {
            for x in row.iter_mut() {
                *x = (*x as f64 / t) as f32;
            }
            let (a, h, d) = self.draw(row);
            argmax.push(a);
            entropy.push(h);
            drawn.push(d);
        }
        // Lowest entropy first; accept while the sum less the largest taken stays in bound.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| entropy[a].total_cmp(&entropy[b]).then(a.cmp(&b)));
        let mut accept = vec![false; n];
        let mut sum = 0f64;
        for &i in &order {
            sum += entropy[i];
            if sum - entropy[i] <= self.params.entropy_bound as f64 {
                accept[i] = true;
            }
        }
        let mut next = Vec::with_capacity(n);
        for i in 0..n {
            next.push(match accept[i] {
                true => drawn[i],
                false => self.rng.below(self.vocab) as u32,
            });
        }
        let mean_entropy = entropy.iter().sum::<f64>() / n.max(1) as f64;
        let stable = self
            .history
            .iter()
            .all(|h| h.as_deref() == Some(&argmax[..]));
        if !self.history.is_empty() {
            self.history.pop_front();
            self.history.push_back(Some(argmax.clone()));
        }
        Ok(StepOutcome {
            next,
            accepted: accept.iter().filter(|&&a| a).count(),
            stop: stable && mean_entropy < self.params.confidence_threshold as f64,
            argmax,
            mean_entropy,
        })
    }

    /// A processed row's argmax, its softmax's entropy (nats), and a draw from it.
    fn draw(&mut self, row: &[f32]) -> (u32, f64, u32) {
        let mut best = 0usize;
        for (i, &x) in row.iter().enumerate() {
            // NaN never wins; the first of equal maxima does.
            if x > row[best] || row[best].is_nan() {
                best = i;
            }
        }
        let m = row[best] as f64;
        if !m.is_finite() {
            return (best as u32, 0.0, best as u32);
        }
        let mut z = 0f64;
        let mut ez = 0f64;
        for &x in row {
            let d = x as f64 - m;
            if d.is_finite() {
                let e = d.exp();
                z += e;
                ez += e * d;
            }
        }
        // H = log Z − E[d] for p = e^d / Z.
        let h = (z.ln() - ez / z).max(0.0);
        let mut u = self.rng.f64() * z;
        let mut pick = best;
        for (i, &x) in row.iter().enumerate() {
            let d = x as f64 - m;
            if !d.is_finite() {
                continue;
            }
            u -= d.exp();
            if u <= 0.0 {
                pick = i;
                break;
            }
        }
        (best as u32, h, pick as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_entropy(row: &[f32]) -> f64 {
        let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
        -row.iter()
            .map(|&x| {
                let p = (x as f64 - m).exp() / z;
                if p > 0.0 {
                    p * p.ln()
                } else {
                    0.0
                }
            })
            .sum::<f64>()
    }

    #[test]
    fn entropies_and_acceptance_follow_the_bound() {
        let mut rng = Rng::new(3);
        let vocab = 50;
        let p = DiffusionParams {
            max_denoising_steps: 4,
            t_min: 0.5,
            t_max: 1.5,
            entropy_bound: 2.0,
            stability_threshold: 0,
            confidence_threshold: 0.01,
            seed: 9,
        };
        let mut s = CanvasSampler::new(p.clone(), vocab).expect("sampler");
        let canvas: Vec<u32> = (0..12).map(|i| i as u32).collect();
        // Rows of different sharpness, so entropies differ.
        let raw: Vec<Vec<f32>> = (0..12)
            .map(|i| {
                (0..vocab)
                    .map(|_| rng.normal() * (1.0 + i as f32))
                    .collect()
            })
            .collect();
        let mut logits = raw.clone();
        let out = s.step(&canvas, &mut logits, 4).expect("step");
        let t = p.temperature(4) as f64;
        assert!((t - 1.5).abs() < 1e-6);
        let ents: Vec<f64> = raw
            .iter()
            .map(|r| naive_entropy(&r.iter().map(|&x| (x as f64 / t) as f32).collect::<Vec<_>>()))
            .collect();
        // The accepted set: the lowest entropies while sum − max stays within 2.
        let mut sorted = ents.clone();
        sorted.sort_by(f64::total_cmp);
        let mut sum = 0.0;
        let want = sorted
            .iter()
            .filter(|&&h| {
                sum += h;
                sum - h <= 2.0
            })
            .count();
        assert_eq!(out.accepted, want);
        assert!(want > 0 && want < 12, "{ents:?}");
        let mean = ents.iter().sum::<f64>() / 12.0;
        assert!((out.mean_entropy - mean).abs() < 1e-6);
        for (r, row) in logits.iter().enumerate() {
            let best = (0..vocab)
                .max_by(|&a, &b| raw[r][a].total_cmp(&raw[r][b]))
                .expect("row");
            assert_eq!(out.argmax[r], best as u32);
            assert!((row[best] as f64 - raw[r][best] as f64 / t).abs() < 1e-3);
        }
    }

    #[test]
    fn near_zero_temperature_draws_the_argmax_and_stops_when_stable() {
        let mut rng = Rng::new(4);
        let vocab = 30;
        let p = DiffusionParams {
            max_denoising_steps: 6,
            t_min: 1e-4,
            t_max: 2e-4,
            entropy_bound: 1e9,
            stability_threshold: 2,
            confidence_threshold: 0.005,
            seed: 1,
        };
        let mut s = CanvasSampler::new(p, vocab).expect("sampler");
        let raw: Vec<Vec<f32>> = (0..8)
            .map(|_| (0..vocab).map(|_| rng.normal()).collect())
            .collect();
        let canvas = s.noise(8);
        let mut stops = Vec::new();
        for remaining in (1..=6).rev() {
            let mut l = raw.clone();
            let out = s.step(&canvas, &mut l, remaining).expect("step");
            assert_eq!(
                out.next, out.argmax,
                "everything accepted, drawn at the argmax"
            );
            assert_eq!(out.accepted, 8);
            stops.push(out.stop);
        }
        // The same argmax twice before: the third step may stop.
        assert_eq!(stops, vec![false, false, true, true, true, true]);
    }

    #[test]
    fn bad_settings_are_refused() {
        for p in [
            DiffusionParams {
                t_max: 0.1,
                ..DiffusionParams::default()
            },
            DiffusionParams {
                max_denoising_steps: 0,
                ..DiffusionParams::default()
            },
            DiffusionParams {
                entropy_bound: f32::NAN,
                ..DiffusionParams::default()
            },
        ] {
            assert!(CanvasSampler::new(p, 10).is_err());
        }
    }
}
