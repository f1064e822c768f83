//! Images in: decoding (PNG, JPEG, WebP, with bounded dimensions and memory), the image
//! processors of the vision models (resize exactly as Pillow does, rescale, normalize, as
//! transformers' PIL backend does them), and the content hash that keys an image's soft
//! tokens in the prefix cache.
//!
//! Nothing here trusts the bytes it is given: an unknown format, a truncated or corrupt file,
//! dimensions over [`MAX_SIDE`] or more than [`MAX_PIXELS`] pixels are errors that name the
//! problem, and the decoder's allocations are capped before it starts.

pub mod resize;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use resize::Filter;

/// The longest side kiln decodes.
pub const MAX_SIDE: u32 = 16_384;
/// The most pixels kiln decodes (a 48-megapixel photo fits).
pub const MAX_PIXELS: u64 = 50_000_000;

/// An 8-bit RGB image, rows top down, 3 bytes a pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// A decoded image and the SHA-256 of its encoded bytes (what keys its soft tokens' KV: two
/// different files never share cache blocks, the same file always can).
#[derive(Clone, Debug)]
pub struct Image {
    pub rgb: Rgb,
    pub digest: [u8; 32],
}

impl Image {
    /// Decodes `bytes` (PNG, JPEG or WebP, told by their first bytes). An image with an alpha
    /// channel is laid over white, as transformers' `convert_to_rgb` does.
    pub fn decode(bytes: &[u8]) -> Result<Image> {
        let rgb = decode_rgb(bytes)?;
        Ok(Image {
            rgb,
            digest: Sha256::digest(bytes).into(),
        })
    }
}

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::Model(format!("image: {msg}"))
}

fn decode_rgb(bytes: &[u8]) -> Result<Rgb> {
    use image::ImageFormat;
    let format = image::guess_format(bytes).map_err(|_| bad("not a PNG, JPEG or WebP file"))?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP
    ) {
        return Err(bad(format!(
            "{format:?} is not supported (PNG, JPEG and WebP are)"
        )));
    }
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    // The decoded image at 8 bytes a pixel (RGBA, 16 bits a channel), and some slack.
    limits.max_alloc = Some(MAX_PIXELS * 8 + (64 << 20));
    reader.limits(limits.clone());
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| bad(format!("cannot read its header: {e}")))?;
    if w == 0 || h == 0 || u64::from(w) * u64::from(h) > MAX_PIXELS {
        return Err(bad(format!(
            "{w}x{h} pixels is outside what kiln decodes (at most {MAX_SIDE} a side and {MAX_PIXELS} pixels)"
        )));
    }
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| bad(format!("cannot decode it: {e}")))?;
    let (width, height) = (img.width() as usize, img.height() as usize);
    let data = if img.color().has_alpha() {
        over_white(img.to_rgba8().as_raw())
    } else {
        img.to_rgb8().into_raw()
    };
    Ok(Rgb {
        width,
        height,
        data,
    })
}

/// RGBA pixels composited over opaque white, in Pillow's integer arithmetic
/// (`alpha_composite`: 7 fractional bits, division by 255 as `((x >> 8) + x) >> 8`).
pub fn over_white(rgba: &[u8]) -> Vec<u8> {
    const P: u32 = 7;
    let mut out = Vec::with_capacity(rgba.len() / 4 * 3);
    for px in rgba.chunks_exact(4) {
        let a = u32::from(px[3]);
        if a == 0 {
            out.extend_from_slice(&[255, 255, 255]);
            continue;
        }
        let out_a255 = a * 255 + 255 * (255 - a);
        let coef1 = a * 255 * 255 * (1 << P) / out_a255;
        let coef2 = 255 * (1 << P) - coef1;
        for &c in &px[..3] {
            let t = u32::from(c) * coef1 + 255 * coef2 + (0x80 << P);
            out.push(((((t >> 8) + t) >> 8) >> P) as u8);
        }
    }
    out
}

/// An image processor: what a vision model's `preprocessor_config.json` (or an mmproj GGUF's
/// metadata) says turns an image into its pixel values.
#[derive(Clone, Debug, PartialEq)]
pub struct Processor {
    /// Output height and width; `None`: no resize (or `fit`'s).
    pub size: Option<(usize, usize)>,
    /// Instead of a fixed size, the largest size of the image's aspect ratio that fits a
    /// patch budget (Gemma 4's processor).
    pub fit: Option<Fit>,
    /// Or each side rounded to whole tiles within a pixel range (Qwen's processors).
    pub area: Option<Area>,
    pub filter: Filter,
    /// Multiplies the 0..=255 values (in f64, then rounded to f32), when set.
    pub rescale: Option<f64>,
    /// Per channel `(x − mean) / std` in f32, when set.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

/// Gemma 4's aspect-preserving resize: the image scaled to about `max_patches` patches of
/// `patch` pixels, each side then rounded down to a multiple of `patch · pool` (the patches
/// pooled `pool × pool` into soft tokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    pub patch: usize,
    pub pool: usize,
    pub max_patches: usize,
}

impl Fit {
    /// The height and width an `h × w` image is resized to (transformers'
    /// `get_aspect_ratio_preserving_size`, in the same f64 arithmetic).
    pub fn size(&self, h: usize, w: usize) -> Result<(usize, usize)> {
        let unit = self.patch * self.pool;
        if h == 0 || w == 0 || unit == 0 {
            return Err(bad(format!("cannot fit a {w}x{h} image")));
        }
        // In f64: a model's processor config sets these (bounded where it is read).
        let target = self.max_patches as f64 * (self.patch * self.patch) as f64;
        let factor = (target / (h as f64 * w as f64)).sqrt();
        let mut th = ((factor * h as f64) / unit as f64).floor() as usize * unit;
        let mut tw = ((factor * w as f64) / unit as f64).floor() as usize * unit;
        let longest = (self.max_patches / (self.pool * self.pool)) * unit;
        if th == 0 && tw == 0 {
            return Err(bad(format!(
                "a {w}x{h} image cannot be resized to whole {unit}-pixel tiles"
            )));
        } else if th == 0 {
            th = unit;
            tw = (w / h * unit).min(longest);
        } else if tw == 0 {
            tw = unit;
            th = (h / w * unit).min(longest);
        }
        let pixels = th as f64 * tw as f64;
        if pixels > target {
            return Err(bad(format!(
                "a {w}x{h} image resized to {tw}x{th} would exceed {} patches",
                self.max_patches
            )));
        }
        if pixels > MAX_PIXELS as f64 {
            return Err(bad(format!(
                "a {w}x{h} image would be resized to {tw}x{th}, over {MAX_PIXELS} pixels"
            )));
        }
        Ok((th, tw))
    }
}

/// Qwen's dynamic resolution (transformers' `smart_resize`): each side rounded to the nearest
/// multiple of `unit` (a patch times the merge), then the whole scaled, keeping the aspect
/// ratio, into `min_pixels..=max_pixels`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Area {
    pub unit: usize,
    pub min_pixels: usize,
    pub max_pixels: usize,
}

impl Area {
    /// The height and width an `h × w` image is resized to, in transformers' f64 arithmetic
    /// (Python's `round` rounds halves to even).
    pub fn size(&self, h: usize, w: usize) -> Result<(usize, usize)> {
        let unit = self.unit;
        if h == 0 || w == 0 || unit == 0 {
            return Err(bad(format!("cannot resize a {w}x{h} image")));
        }
        let (hf, wf, u) = (h as f64, w as f64, unit as f64);
        if hf.max(wf) / hf.min(wf) > 200.0 {
            return Err(bad(format!(
                "a {w}x{h} image: its aspect ratio is over 200 (the model's processor refuses it)"
            )));
        }
        let mut th = (hf / u).round_ties_even() * u;
        let mut tw = (wf / u).round_ties_even() * u;
        if th * tw > self.max_pixels as f64 {
            let beta = (hf * wf / self.max_pixels as f64).sqrt();
            th = u.max((hf / beta / u).floor() * u);
            tw = u.max((wf / beta / u).floor() * u);
        } else if th * tw < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (hf * wf)).sqrt();
            th = (hf * beta / u).ceil() * u;
            tw = (wf * beta / u).ceil() * u;
        }
        if th * tw > MAX_PIXELS as f64 || th > f64::from(MAX_SIDE) || tw > f64::from(MAX_SIDE) {
            return Err(bad(format!(
                "a {w}x{h} image would be resized to {tw}x{th}, over the pixel bound"
            )));
        }
        Ok((th as usize, tw as usize))
    }
}

impl Processor {
    /// The processor a Hugging Face `preprocessor_config.json` describes (the fields of the
    /// image processors of SigLIP and Gemma 3: a fixed `size`, `resample`, `do_rescale` with
    /// `rescale_factor`, `do_normalize` with `image_mean`/`image_std`; Gemma 4's
    /// `max_soft_tokens`, `patch_size` and `pooling_kernel_size` instead of a size).
    pub fn from_hf(cfg: &serde_json::Value) -> Result<Processor> {
        use serde_json::Value as J;
        let flag = |k: &str, default: bool| cfg.get(k).and_then(J::as_bool).unwrap_or(default);
        if flag("do_pan_and_scan", false) {
            return Err(bad(
                "preprocessor_config.json asks for pan-and-scan crops, which kiln does not make yet",
            ));
        }
        let fit = match cfg.get("max_soft_tokens").and_then(J::as_u64) {
            Some(soft) if flag("do_resize", true) => {
                let n = |k: &str, default: u64, most: u64| {
                    cfg.get(k)
                        .and_then(J::as_u64)
                        .unwrap_or(default)
                        .clamp(1, most) as usize
                };
                let (patch, pool) = (n("patch_size", 16, 256), n("pooling_kernel_size", 3, 16));
                if soft == 0 || soft > 1 << 14 {
                    return Err(bad(format!(
                        "preprocessor_config.json: max_soft_tokens {soft} is out of range"
                    )));
                }
                Some(Fit {
                    patch,
                    pool,
                    max_patches: soft as usize * pool * pool,
                })
            }
            _ => None,
        };
        // Qwen's processors: a merge size and a pixel range instead of a size.
        let area = match cfg.get("merge_size").and_then(J::as_u64) {
            Some(merge) if fit.is_none() && flag("do_resize", true) => {
                let s = cfg.get("size").unwrap_or(&J::Null);
                let px = |keys: [&str; 2], default: u64| {
                    keys.iter()
                        .find_map(|k| s.get(k).or_else(|| cfg.get(k)).and_then(J::as_u64))
                        .unwrap_or(default)
                        .clamp(1, MAX_PIXELS) as usize
                };
                let patch = cfg.get("patch_size").and_then(J::as_u64).unwrap_or(16);
                let (min_pixels, max_pixels) = (
                    px(["shortest_edge", "min_pixels"], 56 * 56),
                    px(["longest_edge", "max_pixels"], 28 * 28 * 1280),
                );
                if !(1..=256).contains(&patch)
                    || !(1..=16).contains(&merge)
                    || min_pixels > max_pixels
                {
                    return Err(bad(format!(
                        "preprocessor_config.json: patch {patch}, merge {merge}, pixels {min_pixels}..{max_pixels} are out of range"
                    )));
                }
                Some(Area {
                    unit: (patch * merge) as usize,
                    min_pixels,
                    max_pixels,
                })
            }
            _ => None,
        };
        let size = if fit.is_some() || area.is_some() {
            None
        } else if flag("do_resize", true) {
            let s = cfg
                .get("size")
                .ok_or_else(|| bad("preprocessor_config.json has no size"))?;
            let dim = |k: &str| {
                s.get(k)
                    .and_then(J::as_u64)
                    .filter(|&v| v > 0 && v <= u64::from(MAX_SIDE))
                    .map(|v| v as usize)
            };
            match (dim("height"), dim("width")) {
                (Some(h), Some(w)) => Some((h, w)),
                _ => {
                    return Err(bad(format!(
                        "preprocessor_config.json: size {s} is not a height and width kiln supports"
                    )))
                }
            }
        } else {
            None
        };
        let filter = Filter::from_pil(cfg.get("resample").and_then(J::as_u64).unwrap_or(2))?;
        let rescale = flag("do_rescale", true).then(|| {
            cfg.get("rescale_factor")
                .and_then(J::as_f64)
                .unwrap_or(1.0 / 255.0)
        });
        let three = |k: &str| -> Result<[f32; 3]> {
            let v = cfg
                .get(k)
                .ok_or_else(|| bad(format!("preprocessor_config.json has no {k}")))?;
            let one = |x: &J| x.as_f64().map(|f| f as f32);
            match v {
                J::Array(a) if a.len() == 3 => {
                    let mut out = [0f32; 3];
                    for (o, x) in out.iter_mut().zip(a) {
                        *o = one(x).ok_or_else(|| bad(format!("{k} must hold numbers")))?;
                    }
                    Ok(out)
                }
                x => one(x)
                    .map(|f| [f; 3])
                    .ok_or_else(|| bad(format!("{k} must be 3 numbers"))),
            }
        };
        let normalize = match flag("do_normalize", true) {
            true => {
                let (mean, std) = (three("image_mean")?, three("image_std")?);
                if std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
                    return Err(bad("image_std must be finite and nonzero"));
                }
                Some((mean, std))
            }
            false => None,
        };
        Ok(Processor {
            size,
            fit,
            area,
            filter,
            rescale,
            normalize,
        })
    }

    /// The pixel values of `img`: `[3, H, W]` (channel planes), f32.
    pub fn pixels(&self, img: &Rgb) -> Result<(usize, usize, Vec<f32>)> {
        let size = match (self.fit, self.area) {
            (Some(f), _) => Some(f.size(img.height, img.width)?),
            (None, Some(a)) => Some(a.size(img.height, img.width)?),
            (None, None) => self.size,
        };
        let (h, w, data) = match size {
            Some((h, w)) if (h, w) != (img.height, img.width) => (
                h,
                w,
                resize::resize_rgb(&img.data, (img.width, img.height), (w, h), self.filter)?,
            ),
            _ => (img.height, img.width, img.data.clone()),
        };
        let n = h * w;
        let mut out = vec![0f32; 3 * n];
        for (i, px) in data.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let mut v = match self.rescale {
                    Some(s) => (f64::from(px[c]) * s) as f32,
                    None => f32::from(px[c]),
                };
                if let Some((mean, std)) = self.normalize {
                    v = (v - mean[c]) / std[c];
                }
                out[c * n + i] = v;
            }
        }
        Ok((h, w, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 4's resize stays in bounds whatever a config asks: a budget past the pixel cap is
    /// an error, extreme aspect ratios give whole tiles, a 1x1 image is scaled up (as
    /// transformers does).
    #[test]
    fn fitted_sizes_are_bounded() {
        let big = Fit {
            patch: 256,
            pool: 16,
            max_patches: (1 << 14) * 256,
        };
        assert!(big.size(16_384, 16_384).is_err());
        let g4 = Fit {
            patch: 16,
            pool: 3,
            max_patches: 280 * 9,
        };
        let (h, w) = g4.size(1, 16_384).unwrap();
        assert!(
            h % 48 == 0 && w % 48 == 0 && h * w <= 280 * 9 * 256,
            "{h}x{w}"
        );
        assert_eq!(g4.size(1, 1).unwrap(), (768, 768));
        assert_eq!(g4.size(768, 1024).unwrap(), (672, 912));
    }

    #[test]
    fn hostile_bytes_are_errors() {
        assert!(Image::decode(b"").is_err());
        assert!(Image::decode(b"GIF89a\x01\x00\x01\x00").is_err());
        // A PNG signature and nothing after it.
        assert!(Image::decode(b"\x89PNG\r\n\x1a\n").is_err());
        // A PNG header claiming 100000 x 100000 pixels.
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&100_000u32.to_be_bytes());
        png.extend_from_slice(&100_000u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        let e = Image::decode(&png).unwrap_err().to_string();
        assert!(e.contains("image"), "{e}");
    }

    #[test]
    fn a_png_round_trips_and_alpha_is_laid_over_white() {
        let mut rng = crate::rng::Rng::new(5);
        let (w, h) = (13u32, 7u32);
        let px: Vec<u8> = (0..w * h * 4).map(|_| rng.below(256) as u8).collect();
        let mut bytes = Vec::new();
        image::RgbaImage::from_raw(w, h, px.clone())
            .unwrap()
            .write_to(
                &mut std::io::Cursor::new(&mut bytes),
                image::ImageFormat::Png,
            )
            .unwrap();
        let img = Image::decode(&bytes).unwrap();
        assert_eq!((img.rgb.width, img.rgb.height), (13, 7));
        assert_eq!(img.rgb.data, over_white(&px));
        // Opaque pixels keep their colour, clear ones turn white.
        assert_eq!(
            over_white(&[10, 20, 30, 255, 1, 2, 3, 0]),
            vec![10, 20, 30, 255, 255, 255]
        );
        assert_eq!(img.digest, <[u8; 32]>::from(Sha256::digest(&bytes)));
    }
}
