//! The block-diffusion canvas sampler's settings (DiffusionGemma's entropy-bound sampler).
//!
//! A canvas starts as uniformly random tokens (or a given canvas). Each denoising step, with
//! `k` steps remaining of `N`, scales the decoder's logits by 1 / the temperature
//! `t_min + (t_max − t_min)·k/N`, draws a token per position from the softmax, and accepts
//! the lowest-entropy positions while the running entropy sum, less the largest entropy taken,
//! stays within `entropy_bound`; the rest are re-noised with random tokens. The processed
//! logits feed the next step's self-conditioning. Denoising stops after `N` steps, or when
//! the argmax canvas has been the same for `stability_threshold` steps before and the mean
//! entropy is under `confidence_threshold`. The canvas committed is the last argmax canvas.
//!
//! The step runs on the device as two ops, [`CanvasOp::CanvasDraw`] and [`CanvasOp::CanvasAccept`]; this
//! module makes them from the settings.

use crate::error::{Error, Result};
use crate::op::{CanvasOp, Op};

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

    /// The draw of a step with `remaining` steps left, seeded by `seed` (see [`step_seeds`]).
    pub fn draw_op(&self, remaining: usize, seed: u64) -> Op {
        Op::Canvas(CanvasOp::CanvasDraw {
            scale: 1.0 / self.temperature(remaining),
            seed,
        })
    }

    /// The acceptance of a step over a vocabulary of `vocab`, seeded by `seed`.
    pub fn accept_op(&self, vocab: usize, seed: u64) -> Op {
        Op::Canvas(CanvasOp::CanvasAccept {
            entropy_bound: self.entropy_bound,
            confidence: self.confidence_threshold,
            stability: self.stability_threshold,
            vocab,
            seed,
        })
    }
}

/// SplitMix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seeds of step `step` of canvas `canvas` of a generation seeded by `seed`: (the draw's,
/// the acceptance's).
pub fn step_seeds(seed: u64, canvas: usize, step: usize) -> (u64, u64) {
    let base = mix64(seed ^ mix64(((canvas as u64) << 32) ^ step as u64));
    (mix64(base), mix64(base ^ 0x5EED))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(p.validate().is_err());
        }
        assert!(DiffusionParams::default().validate().is_ok());
    }

    #[test]
    fn the_schedule_runs_from_t_max_to_t_min_and_seeds_differ_per_step() {
        let p = DiffusionParams {
            max_denoising_steps: 4,
            t_min: 0.5,
            t_max: 1.5,
            ..DiffusionParams::default()
        };
        assert!((p.temperature(4) - 1.5).abs() < 1e-6);
        assert!((p.temperature(1) - 0.75).abs() < 1e-6);
        let mut seen = std::collections::HashSet::new();
        for c in 0..4 {
            for s in 0..8 {
                let (a, b) = step_seeds(7, c, s);
                assert!(seen.insert(a) && seen.insert(b));
            }
        }
    }
}
