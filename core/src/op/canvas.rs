//! The counter-based randomness of the canvas ops ([`super::Op::CanvasDraw`],
//! [`super::Op::CanvasAccept`]): every backend computes the same 32-bit hashes from the seed
//! and a position, so a draw needs no random state on the device and is the same on every
//! backend (up to the last bits of the logarithms in the Gumbel noise).

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
