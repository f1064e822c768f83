//! A model's vision tower, as the engine uses it: where it comes from (a Hugging Face
//! checkpoint's own tower, or llama.cpp's split mmproj GGUF beside a text GGUF), how an image
//! becomes pixel values ([`crate::vision::Processor`]), the soft tokens it encodes an image
//! into, and how a prompt makes room for them.
//!
//! The prompt: a chat template writes one image marker per image (Gemma 3:
//! `<start_of_image>`, Gemma 4: `<|image|>`); [`VisionTower::expand`] replaces each by the
//! model's full image sequence (Gemma 3's processor: `"\n\n<start_of_image>" +
//! "<image_soft_token>" × 256 + "<end_of_image>\n\n"`; Gemma 4's: `"<|image>" + "<|image|>"
//! × n + "<image|>"`, n by the image's size), which the tokenizer then reads; the soft
//! tokens' rows take the encoder's embeddings.

use std::path::Path;

use super::gemma4v::Gemma4Vision;
use super::qwen35v::Qwen35Vision;
use super::siglip::Siglip;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::tensor::Tensor;
use crate::vision::resize::Filter;
use crate::vision::{Area, Fit, Image, Processor, Rgb};

pub use super::tower::ImageText;

enum Encoder {
    /// Gemma 3's SigLIP tower: square images, a fixed number of soft tokens.
    Siglip(Siglip),
    /// Gemma 4's: images at their aspect ratio, soft tokens by their size.
    Gemma4(Gemma4Vision),
    /// Qwen3.5's: images at their aspect ratio in a pixel range, soft tokens by their size,
    /// placed in the text by their grid (M-RoPE).
    Qwen35(Qwen35Vision),
}

/// An image encoder and everything needed to feed it.
pub struct VisionTower {
    encoder: Encoder,
    pub processor: Processor,
    /// What a chat template writes for an image.
    pub marker: String,
    /// The text of one image's soft token.
    pub soft_token: String,
    /// The text an image's soft tokens are wrapped in: `(before, after)`.
    pub wrap: (String, String),
}

impl VisionTower {
    /// The vision tower that goes with the model at `model`: from `mmproj` when given, else
    /// the checkpoint's own (a Hugging Face directory with a `vision_config`), else `None`.
    pub fn open(model: &Path, mmproj: Option<&Path>, ex: &Executor) -> Result<Option<VisionTower>> {
        let (file, processor) = match mmproj {
            Some(p) => {
                let f = GgufFile::open(p)?;
                let proc = processor_from_gguf(&f)?;
                (f, proc)
            }
            None if crate::load::hf::is_model_dir(model) => {
                let Some(f) = crate::load::hf::vision::open_vision_dir(model)? else {
                    return Ok(None);
                };
                let cfg_path = model.join("preprocessor_config.json");
                let raw = std::fs::read(&cfg_path).map_err(|e| {
                    Error::load(
                        cfg_path.display().to_string(),
                        format!("cannot read it: {e}"),
                    )
                })?;
                let cfg: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| {
                    Error::load(cfg_path.display().to_string(), format!("not JSON: {e}"))
                })?;
                (f, Processor::from_hf(&cfg)?)
            }
            None => return Ok(None),
        };
        let arch = file.get_str("general.architecture")?;
        if arch != "clip" {
            return Err(Error::load(
                file.path(),
                format!("architecture {arch:?} is not a vision projector (clip)"),
            ));
        }
        let kind = projector_type(&file)?;
        let (encoder, text) = if kind == super::gemma4v::PROJECTOR {
            let e = Gemma4Vision::load(&file, ex)?;
            match processor.fit {
                Some(f) if f.patch == e.patch && f.pool == e.pool => {}
                _ => {
                    return Err(Error::load(
                        file.path(),
                        format!(
                        "the image processor ({:?}) does not make {}-pixel patches pooled {}x{}",
                        processor.fit, e.patch, e.pool, e.pool
                    ),
                    ))
                }
            }
            (Encoder::Gemma4(e), &super::gemma4v::IMAGE_TEXT)
        } else if kind == super::qwen35v::PROJECTOR {
            let e = Qwen35Vision::load(&file, ex)?;
            match processor.area {
                Some(a) if a.unit == e.patch * e.merge => {}
                _ => {
                    return Err(Error::load(
                        file.path(),
                        format!(
                            "the image processor ({:?}) does not make tiles of {}-pixel patches merged {}x{}",
                            processor.area, e.patch, e.merge, e.merge
                        ),
                    ))
                }
            }
            (Encoder::Qwen35(e), &super::qwen35v::IMAGE_TEXT)
        } else {
            let e = Siglip::load(&file, ex)?;
            if processor.size != Some((e.image, e.image)) {
                return Err(Error::load(
                    file.path(),
                    format!(
                        "the image processor makes {:?} images, the encoder takes {}x{}",
                        processor.size, e.image, e.image
                    ),
                ));
            }
            (Encoder::Siglip(e), &super::gemma3::IMAGE_TEXT)
        };
        Ok(Some(VisionTower {
            encoder,
            processor,
            marker: text.marker.into(),
            soft_token: text.soft_token.into(),
            wrap: (text.before.into(), text.after.into()),
        }))
    }

    /// Soft tokens of `img` (its pixel size after the processor's resize).
    pub fn tokens_for(&self, img: &Rgb) -> Result<usize> {
        match &self.encoder {
            Encoder::Siglip(e) => Ok(e.tokens_per_image()),
            Encoder::Gemma4(e) => {
                let (h, w) = match self.processor.fit {
                    Some(f) => f.size(img.height, img.width)?,
                    None => (img.height, img.width),
                };
                Ok(e.tokens(h, w))
            }
            Encoder::Qwen35(_) => self.grid_for(img).map(|(r, c)| r * c),
        }
    }

    /// The soft-token grid (rows, columns) of `img`, for a tower whose model places image
    /// tokens by their row and column (Qwen3.5's M-RoPE); `None` for the others.
    pub fn grid(&self, img: &Rgb) -> Result<Option<(usize, usize)>> {
        match &self.encoder {
            Encoder::Qwen35(_) => self.grid_for(img).map(Some),
            _ => Ok(None),
        }
    }

    fn grid_for(&self, img: &Rgb) -> Result<(usize, usize)> {
        let Encoder::Qwen35(e) = &self.encoder else {
            return Err(Error::Model("this tower has no soft-token grid".into()));
        };
        let (h, w) = match self.processor.area {
            Some(a) => a.size(img.height, img.width)?,
            None => (img.height, img.width),
        };
        Ok(e.grid(h, w))
    }

    /// Sizes images to at most `n` soft tokens (a tower that sizes images by their aspect
    /// ratio: Gemma 4's processor takes 70, 140, 280, 560 or 1120).
    pub fn set_max_soft_tokens(&mut self, n: usize) -> Result<()> {
        match (&self.encoder, self.processor.fit.as_mut()) {
            (Encoder::Gemma4(_), Some(f)) if [70, 140, 280, 560, 1120].contains(&n) => {
                f.max_patches = n * f.pool * f.pool;
                Ok(())
            }
            (Encoder::Gemma4(_), Some(_)) => Err(Error::Model(format!(
                "{n} soft tokens an image: Gemma 4 takes 70, 140, 280, 560 or 1120"
            ))),
            (Encoder::Qwen35(_), _) => match self.processor.area.as_mut() {
                Some(a)
                    if n >= 1
                        && n.saturating_mul(a.unit * a.unit)
                            <= crate::vision::MAX_PIXELS as usize =>
                {
                    a.max_pixels = n * a.unit * a.unit;
                    a.min_pixels = a.min_pixels.min(a.max_pixels);
                    Ok(())
                }
                _ => Err(Error::Model(format!(
                    "{n} soft tokens an image is out of this tower's range"
                ))),
            },
            _ => Err(Error::Model(
                "this vision tower takes a fixed number of soft tokens an image".into(),
            )),
        }
    }

    /// A description of the soft tokens an image takes, for logs.
    pub fn describe(&self) -> String {
        match (&self.encoder, self.processor.fit) {
            (Encoder::Siglip(e), _) => format!(
                "{} soft tokens an image of {}x{} pixels",
                e.tokens_per_image(),
                e.image,
                e.image
            ),
            (
                Encoder::Gemma4(_),
                Some(Fit {
                    max_patches, pool, ..
                }),
            ) => format!(
                "at most {} soft tokens an image, at its aspect ratio",
                max_patches / (pool * pool).max(1)
            ),
            (Encoder::Gemma4(_), None) => "soft tokens by the image's size".into(),
            (Encoder::Qwen35(_), _) => match self.processor.area {
                Some(Area {
                    unit,
                    min_pixels,
                    max_pixels,
                }) => format!(
                    "{} to {} soft tokens an image, at its aspect ratio",
                    min_pixels.div_ceil(unit * unit),
                    max_pixels / (unit * unit)
                ),
                None => "soft tokens by the image's size".into(),
            },
        }
    }

    /// The text model's width, which the soft tokens have.
    pub fn width(&self) -> usize {
        match &self.encoder {
            Encoder::Siglip(e) => e.text_width,
            Encoder::Gemma4(e) => e.text_width,
            Encoder::Qwen35(e) => e.text_width,
        }
    }

    /// `text` with its image markers replaced, the i-th by `images[i]`'s whole sequence (its
    /// soft tokens wrapped as the model's processor wraps them), and the number of markers;
    /// `text` as it is when they are not as many as the images.
    pub fn expand(&self, text: &str, images: &[std::sync::Arc<Image>]) -> Result<(String, usize)> {
        let n = text.matches(self.marker.as_str()).count();
        if n == 0 || n != images.len() {
            return Ok((text.to_string(), n));
        }
        let mut out = String::with_capacity(text.len());
        for (i, piece) in text.split(self.marker.as_str()).enumerate() {
            if i > 0 {
                let k = self.tokens_for(&images[i - 1].rgb)?;
                out.push_str(&self.wrap.0);
                out.push_str(&self.soft_token.repeat(k));
                out.push_str(&self.wrap.1);
            }
            out.push_str(piece);
        }
        Ok((out, n))
    }

    /// The soft tokens of one image: `[tokens_for(img), width]` f32 on `ex`'s backend.
    pub fn encode(&self, ex: &Executor, img: &Rgb) -> Result<Tensor> {
        let (h, w, px) = self.processor.pixels(img)?;
        self.encode_pixels(ex, &px, h, w)
    }

    /// [`VisionTower::encode`] from pixel values already made (`[3, h, w]`).
    pub fn encode_pixels(
        &self,
        ex: &Executor,
        pixels: &[f32],
        h: usize,
        w: usize,
    ) -> Result<Tensor> {
        match &self.encoder {
            Encoder::Siglip(e) => {
                if (h, w) != (e.image, e.image) {
                    return Err(Error::Model(format!(
                        "a {w}x{h} image for a tower of {}x{}",
                        e.image, e.image
                    )));
                }
                e.encode(ex, pixels)
            }
            Encoder::Gemma4(e) => e.encode(ex, pixels, h, w),
            Encoder::Qwen35(e) => e.encode(ex, pixels, h, w),
        }
    }
}

/// An mmproj file's projector type: `clip.projector_type`, or where a file holds more than
/// one modality's (Gemma 4's), `clip.vision.projector_type`.
fn projector_type(f: &GgufFile) -> Result<&str> {
    match f.get_str("clip.projector_type") {
        Ok(t) => Ok(t),
        Err(_) => f.get_str("clip.vision.projector_type"),
    }
}

/// An mmproj GGUF's image processing: its square size, bilinear resampling (what the HF
/// processors of the projectors kiln reads use), 1/255 and its mean and standard deviation.
fn processor_from_gguf(f: &GgufFile) -> Result<Processor> {
    if projector_type(f).ok() == Some(super::gemma4v::PROJECTOR) {
        // Gemma 4's processor: bicubic, 1/255 and no normalization (the tower maps the values
        // itself), at most 280 soft tokens an image (its default).
        // Bounded as a processor config's are (vision/mod.rs).
        let u = |k: &str, d: u64, most: u64| f.get_u64(k).unwrap_or(d).clamp(1, most) as usize;
        let (patch, pool) = (
            u("clip.vision.patch_size", 16, 256),
            u("clip.vision.projector.scale_factor", 3, 16),
        );
        return Ok(Processor {
            size: None,
            fit: Some(Fit {
                patch,
                pool,
                max_patches: 280 * pool * pool,
            }),
            area: None,
            filter: Filter::Bicubic,
            rescale: Some(1.0 / 255.0),
            normalize: None,
        });
    }
    let three = |k: &str| -> Result<[f32; 3]> {
        let v = f.get_f32_array(k)?;
        <[f32; 3]>::try_from(v.as_slice())
            .map_err(|_| Error::load(f.path(), format!("{k} must hold 3 values")))
    };
    let (mean, std) = (
        three("clip.vision.image_mean")?,
        three("clip.vision.image_std")?,
    );
    if std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
        return Err(Error::load(
            f.path(),
            "clip.vision.image_std must be finite and nonzero",
        ));
    }
    if projector_type(f).ok() == Some(super::qwen35v::PROJECTOR) {
        // Qwen's processor: bicubic, at the image's aspect ratio, between 8 and 4096 soft
        // tokens an image (llama.cpp's bounds: the mmproj file names none).
        let u = |k: &str, d: u64, most: u64| f.get_u64(k).unwrap_or(d).clamp(1, most) as usize;
        let unit =
            u("clip.vision.patch_size", 16, 256) * u("clip.vision.spatial_merge_size", 2, 16);
        return Ok(Processor {
            size: None,
            fit: None,
            area: Some(Area {
                unit,
                min_pixels: 8 * unit * unit,
                max_pixels: 4096 * unit * unit,
            }),
            filter: Filter::Bicubic,
            rescale: Some(1.0 / 255.0),
            normalize: Some((mean, std)),
        });
    }
    let size = f.get_u64("clip.vision.image_size")? as usize;
    Ok(Processor {
        size: Some((size, size)),
        fit: None,
        area: None,
        filter: Filter::Bilinear,
        rescale: Some(1.0 / 255.0),
        normalize: Some((mean, std)),
    })
}
