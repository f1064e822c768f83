//! The canvas family: DiffusionGemma's denoising draw and entropy-bound acceptance, and the
//! counter-based randomness they share: every backend computes the same 32-bit hashes from
//! the seed and a position, so a draw needs no random state on the device and is the same on
//! every backend (up to the last bits of the logarithms in the Gumbel noise).

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::{DType, Shape, TensorDesc};

#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum CanvasOp {
    /// One denoising draw over a canvas (DiffusionGemma): `logits [T, V]` (f32) → `processed
    /// [T, V]` (f32, `logits · scale`, where `scale` is 1 / the step's temperature), `argmax
    /// [T]` (i32, of the logits, first of equal maxima in IEEE total order), `drawn [T]` (i32,
    /// a draw from `softmax(processed)`: the Gumbel-max argmax of `processed + g`, with `g =
    /// gumbel(seed, row, column)`), `entropy [T]` (f32, nats, of `softmax(processed)`).
    CanvasDraw { scale: f32, seed: u64 },
    /// Entropy-bound acceptance of a canvas's draws, in place. `argmax [T]`, `drawn [T]` (i32),
    /// `entropy [T]` (f32) → output 0 `canvas [T]` (i32): `drawn` where accepted, else
    /// re-noised with [`noise_token`]`(seed, i, vocab)`; output 1 `history [S, T]`
    /// (i32, read and updated): the last `stability` argmax canvases, oldest first, `-1`
    /// where none yet (`S = max(stability, 1)`); output 2 `status [2]` (i32): positions
    /// accepted, and 1 when denoising stops here. Positions are ranked by (entropy, index)
    /// and accepted while the running f32 sum of the ranked entropies less the position's own
    /// stays within `entropy_bound`; denoising stops when every kept history row equals
    /// `argmax` and the f32 sum of all entropies, in rank order, is under
    /// `confidence · T` (mean entropy under `confidence`). `T` is at most [`MAX_CANVAS`].
    CanvasAccept {
        entropy_bound: f32,
        confidence: f32,
        stability: usize,
        vocab: usize,
        seed: u64,
    },
}

/// The family's first op with zero or unit parameters: what `EnumIter` lists the family by
/// (names, `Op::names()`), not an op to run.
impl Default for CanvasOp {
    fn default() -> Self {
        CanvasOp::CanvasDraw {
            scale: 1.0,
            seed: 0,
        }
    }
}

impl Family for CanvasOp {
    fn name(&self) -> &'static str {
        match self {
            CanvasOp::CanvasDraw { .. } => "canvas_draw",
            CanvasOp::CanvasAccept { .. } => "canvas_accept",
        }
    }

    fn reads_outputs(&self) -> bool {
        matches!(self, CanvasOp::CanvasAccept { .. })
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        match self {
            CanvasOp::CanvasDraw { scale, .. } => {
                c.n_inputs(&[1])?;
                c.dtype(&i[0], DType::F32, "logits")?;
                c.rank(&i[0], 2, "logits")?;
                c.ensure(i[0].shape.0[1] >= 1, || "the vocabulary is empty".into())?;
                c.ensure(i[0].shape.0[1] <= i32::MAX as usize, || {
                    "the vocabulary must fit an i32 id".into()
                })?;
                c.ensure(scale.is_finite() && *scale > 0.0, || {
                    format!("scale {scale} must be finite and above 0")
                })
            }
            CanvasOp::CanvasAccept {
                entropy_bound,
                confidence,
                vocab,
                ..
            } => {
                c.n_inputs(&[3])?;
                c.dtype(&i[0], DType::I32, "argmax")?;
                c.dtype(&i[1], DType::I32, "drawn")?;
                c.dtype(&i[2], DType::F32, "entropy")?;
                let t = i[0].shape.0.clone();
                c.ensure(
                    t.len() == 1 && i[1].shape.0 == t && i[2].shape.0 == t,
                    || "argmax, drawn and entropy must be [T]".into(),
                )?;
                c.ensure(t[0] >= 1 && t[0] <= MAX_CANVAS, || {
                    format!("a canvas of 1 to {MAX_CANVAS} positions")
                })?;
                c.ensure(*vocab >= 1 && *vocab <= i32::MAX as usize, || {
                    format!("vocabulary {vocab} must be 1 to {}", i32::MAX)
                })?;
                c.ensure(!entropy_bound.is_nan() && !confidence.is_nan(), || {
                    "bounds must not be NaN".into()
                })
            }
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        let i = c.inputs;
        match self {
            CanvasOp::CanvasDraw { .. } => {
                let (t, v) = (i[0].shape.0[0], i[0].shape.0[1]);
                Ok(vec![
                    TensorDesc::new(DType::F32, Shape(vec![t, v])),
                    TensorDesc::new(DType::I32, Shape(vec![t])),
                    TensorDesc::new(DType::I32, Shape(vec![t])),
                    TensorDesc::new(DType::F32, Shape(vec![t])),
                ])
            }
            CanvasOp::CanvasAccept { .. } => Err(c.err(
                "updates its outputs in place: the caller supplies them, so they cannot be inferred",
            )),
        }
    }

    fn check_in_place(&self, c: &Ctx) -> Result<()> {
        let CanvasOp::CanvasAccept { stability, .. } = self else {
            return Err(c.err("is not an in-place op"));
        };
        let (i, o) = (c.inputs, c.outputs);
        let t = i[0].shape.0[0];
        c.ensure(o.len() == 3, || {
            format!(
                "updates canvas, history and status: 3 outputs, got {}",
                o.len()
            )
        })?;
        let s = (*stability).max(1);
        c.ensure(
            o.iter().all(|d| d.dtype == DType::I32)
                && o[0].shape.0 == [t]
                && o[1].shape.0 == [s, t]
                && o[2].shape.0 == [2],
            || format!("outputs must be i32 canvas [{t}], history [{s}, {t}], status [2]"),
        )
    }
}

/// The longest canvas the acceptance op takes (one workgroup ranks it in shared memory).
pub const MAX_CANVAS: usize = 1024;

/// The largest Gumbel noise [`gumbel`] gives: `−ln(−ln(1 − 2⁻²⁵))` ≈ 17.33, rounded up. A
/// logit more than this below the best one's noisy score cannot be drawn.
pub const GUMBEL_MAX: f32 = 17.5;

/// The column tag of the re-noising hashes (draws use columns below the vocabulary).
pub const NOISE_COLUMN: u32 = 0xFFFF_FFFF;

/// A 32-bit integer finaliser (xor-shift-multiply, full avalanche).
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The hash of (`seed`, `row`) that [`hash`] finishes per column: computed once per row.
pub fn row_key(seed: u64, row: u32) -> u32 {
    let s = mix32((seed >> 32) as u32 ^ 0x9e37_79b9);
    mix32(row ^ mix32(seed as u32 ^ s))
}

/// The hash of (`seed`, `row`, `column`).
pub fn hash(seed: u64, row: u32, column: u32) -> u32 {
    mix32(column ^ row_key(seed, row))
}

/// A uniform in (0, 1) from a hash's top 24 bits.
pub fn unit(h: u32) -> f32 {
    ((h >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// `−ln(u)` for `u` = [`unit`]`(h)`: an exponential variate. Near `u = 1` (the variates that
/// make the largest Gumbel noise) it is the series of `−ln(1 − w)` in `w = 1 − u` (exact in
/// f32), where a plain logarithm would lose every digit; elsewhere the logarithm.
pub fn exponential(h: u32) -> f32 {
    let k = h >> 8;
    let w = ((16_777_216 - k) as f32 - 0.5) * (1.0 / 16_777_216.0);
    if w <= 0.0625 {
        w * (1.0 + w * (0.5 + w * (1.0 / 3.0 + w * (0.25 + w * (0.2 + w * (1.0 / 6.0))))))
    } else {
        -unit(h).ln()
    }
}

/// Gumbel noise `−ln(−ln(u))` of the hash with row key `key` at `column`, in f32.
pub fn gumbel(key: u32, column: u32) -> f32 {
    -exponential(mix32(column ^ key)).ln()
}

/// The token re-noising puts at `pos` of a canvas.
pub fn noise_token(seed: u64, pos: u32, vocab: u32) -> u32 {
    hash(seed, pos, NOISE_COLUMN) % vocab.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gumbel_noise_stays_under_its_bound_and_has_the_gumbel_mean() {
        let key = row_key(0x1234_5678_9abc_def0, 3);
        let n = 200_000u32;
        let mut sum = 0f64;
        let mut max = f32::MIN;
        for j in 0..n {
            let g = gumbel(key, j);
            sum += g as f64;
            max = max.max(g);
        }
        // Extremes of the 24-bit grid.
        let hi = -exponential(0xFFFF_FFFF).ln();
        let lo = -exponential(0).ln();
        assert!(hi < GUMBEL_MAX && max <= hi && lo > -3.0, "{lo} {hi} {max}");
        // The Gumbel distribution's mean is the Euler–Mascheroni constant.
        let mean = sum / n as f64;
        assert!((mean - 0.577_215_66).abs() < 0.01, "{mean}");
    }

    #[test]
    fn the_exponential_variate_is_minus_the_log_of_the_uniform() {
        for k in (0..1u32 << 24)
            .step_by(9_973)
            .chain([0, 1 << 23, (1 << 24) - 1])
        {
            let h = k << 8;
            let u = ((k as f64) + 0.5) / 16_777_216.0;
            let want = -u.ln();
            let got = exponential(h) as f64;
            // u itself rounds to f32 (k + 0.5 needs 25 bits): 2⁻²⁵ absolute, at most.
            assert!(
                (got - want).abs() <= 4e-8 + 2e-7 * want,
                "k={k} {got} {want}"
            );
        }
    }

    #[test]
    fn noise_tokens_cover_the_vocabulary_evenly() {
        let vocab = 10u32;
        let mut counts = [0usize; 10];
        for pos in 0..50_000 {
            counts[noise_token(77, pos, vocab) as usize] += 1;
        }
        for c in counts {
            assert!((4_500..5_500).contains(&c), "{counts:?}");
        }
        assert_ne!(noise_token(1, 0, 1000), noise_token(2, 0, 1000));
    }
}
