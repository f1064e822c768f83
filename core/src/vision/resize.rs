//! Resampling of 8-bit RGB images exactly as Pillow's `Image.resize` does it, because the
//! image processors of transformers (the PIL backend) resize with Pillow and a vision model's
//! logits follow its pixels.
//!
//! The algorithm (Pillow's convolution resampler, as its documentation and behaviour define
//! it): the image is resized along x, then along y, each pass a 1-D convolution. For output
//! index `o` of an axis scaled from `n_in` to `n_out` (`scale = n_in / n_out`), the filter is
//! stretched by `fs = max(scale, 1)` (so downscaling averages: antialiasing), centred on
//! `c = (o + ½)·scale`, over the inputs `trunc(c − support·fs + ½) ..< trunc(c + support·fs +
//! ½)` clamped to the image; the weights `f((i − c + ½)/fs)` are normalised to sum 1 in f64,
//! then turned to fixed point with 22 fractional bits, rounded half away from zero. Each pass
//! sums `pixel · weight` in integers starting from ½ (`1 << 21`), shifts right by 22 (floor)
//! and clamps to 0..=255, so the intermediate image is 8-bit as well. An axis whose size does
//! not change is not resampled; an unchanged image is returned as it is.

use crate::error::{Error, Result};

/// Fractional bits of the fixed-point weights.
const BITS: u32 = 22;

/// Pillow's resampling filters (the `resample` numbers of an image processor's config).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Filter {
    /// `1 − |x|` on `|x| < 1` (Pillow 2, `BILINEAR`).
    Bilinear,
    /// Keys' cubic with `a = −0.5` on `|x| < 2` (Pillow 3, `BICUBIC`).
    Bicubic,
    /// `sinc(x)·sinc(x/3)` on `|x| < 3` (Pillow 1, `LANCZOS`).
    Lanczos,
    /// 1 on `−½ < x ≤ ½` (Pillow 4, `BOX`).
    Box,
    /// `0.54 + 0.46·cos(πx)` on `|x| < 1` (Pillow 5, `HAMMING`).
    Hamming,
}

impl Filter {
    /// The filter of a Pillow `resample` number (0, nearest, is not a convolution and is not
    /// supported).
    pub fn from_pil(n: u64) -> Result<Filter> {
        Ok(match n {
            1 => Filter::Lanczos,
            2 => Filter::Bilinear,
            3 => Filter::Bicubic,
            4 => Filter::Box,
            5 => Filter::Hamming,
            _ => {
                return Err(Error::Model(format!(
                    "image resampling filter {n} is not supported (bilinear 2, bicubic 3, lanczos 1, box 4, hamming 5 are)"
                )))
            }
        })
    }

    fn support(self) -> f64 {
        match self {
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        fn sinc(x: f64) -> f64 {
            if x == 0.0 {
                1.0
            } else {
                let px = std::f64::consts::PI * x;
                px.sin() / px
            }
        }
        match self {
            Filter::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let px = std::f64::consts::PI * x;
                    px.sin() / px * (0.54 + 0.46 * px.cos())
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if x.abs() < 3.0 {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

/// One output index's taps: the first input index and the fixed-point weights.
struct Taps {
    first: usize,
    weights: Vec<i32>,
}

fn taps(n_in: usize, n_out: usize, filter: Filter) -> Vec<Taps> {
    let scale = n_in as f64 / n_out as f64;
    let fs = scale.max(1.0);
    let support = filter.support() * fs;
    (0..n_out)
        .map(|o| {
            let c = (o as f64 + 0.5) * scale;
            // `as i64` truncates toward zero, as the C cast it mirrors does.
            let lo = ((c - support + 0.5) as i64).max(0) as usize;
            let hi = ((c + support + 0.5) as i64).clamp(0, n_in as i64) as usize;
            let w: Vec<f64> = (lo..hi.max(lo))
                .map(|i| filter.weight((i as f64 - c + 0.5) / fs))
                .collect();
            let sum: f64 = w.iter().sum();
            let one = f64::from(1u32 << BITS);
            let weights = w
                .iter()
                .map(|&k| {
                    let k = if sum != 0.0 { k / sum } else { k };
                    if k < 0.0 {
                        (-0.5 + k * one) as i32
                    } else {
                        (0.5 + k * one) as i32
                    }
                })
                .collect();
            Taps { first: lo, weights }
        })
        .collect()
}

#[inline]
fn clip8(acc: i64) -> u8 {
    (acc >> BITS).clamp(0, 255) as u8
}

/// `rgb` (`w × h`, 3 bytes a pixel, rows top down) resized to `ow × oh` with `filter`.
pub fn resize_rgb(
    rgb: &[u8],
    (w, h): (usize, usize),
    (ow, oh): (usize, usize),
    filter: Filter,
) -> Result<Vec<u8>> {
    if rgb.len() != w * h * 3 || w == 0 || h == 0 || ow == 0 || oh == 0 {
        return Err(Error::Model(format!(
            "cannot resize a {w}x{h} image ({} bytes) to {ow}x{oh}",
            rgb.len()
        )));
    }
    let half = 1i64 << (BITS - 1);
    // Along x: every row.
    let row_pass = if ow != w {
        let t = taps(w, ow, filter);
        let mut out = vec![0u8; ow * h * 3];
        for y in 0..h {
            let src = &rgb[y * w * 3..(y + 1) * w * 3];
            for (x, tp) in t.iter().enumerate() {
                for ch in 0..3 {
                    let mut acc = half;
                    for (j, &k) in tp.weights.iter().enumerate() {
                        acc += i64::from(src[(tp.first + j) * 3 + ch]) * i64::from(k);
                    }
                    out[(y * ow + x) * 3 + ch] = clip8(acc);
                }
            }
        }
        out
    } else {
        rgb.to_vec()
    };
    if oh == h {
        return Ok(row_pass);
    }
    // Along y.
    let t = taps(h, oh, filter);
    let mut out = vec![0u8; ow * oh * 3];
    for (y, tp) in t.iter().enumerate() {
        for x in 0..ow * 3 {
            let mut acc = half;
            for (j, &k) in tp.weights.iter().enumerate() {
                acc += i64::from(row_pass[(tp.first + j) * ow * 3 + x]) * i64::from(k);
            }
            out[y * ow * 3 + x] = clip8(acc);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights of every tap row sum to one (in fixed point, within rounding), and a constant
    /// image stays constant under every filter.
    #[test]
    fn constant_images_stay_constant() {
        for f in [
            Filter::Bilinear,
            Filter::Bicubic,
            Filter::Lanczos,
            Filter::Box,
            Filter::Hamming,
        ] {
            for (w, h, ow, oh) in [(7, 5, 32, 32), (64, 48, 17, 13), (3, 300, 9, 31)] {
                let img = vec![173u8; w * h * 3];
                let out = resize_rgb(&img, (w, h), (ow, oh), f).unwrap();
                assert!(out.iter().all(|&v| v == 173), "{f:?} {w}x{h} -> {ow}x{oh}");
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(resize_rgb(&[0; 5], (2, 1), (4, 4), Filter::Bilinear).is_err());
        assert!(resize_rgb(&[0; 6], (2, 1), (0, 4), Filter::Bilinear).is_err());
        assert!(Filter::from_pil(0).is_err());
    }
}
