//! A model's vision tower, as the engine uses it: where it comes from (a Hugging Face
//! checkpoint's own tower, or llama.cpp's split mmproj GGUF beside a text GGUF), how an image
//! becomes pixel values ([`crate::vision::Processor`]), the soft tokens it encodes an image
//! into, and how a prompt makes room for them.
//!
//! The prompt: a chat template writes one image marker per image (Gemma 3:
//! `<start_of_image>`); [`VisionTower::expand`] replaces each by the model's full image
//! sequence (Gemma 3's processor: `"\n\n<start_of_image>" + "<image_soft_token>" × 256 +
//! "<end_of_image>\n\n"`), which the tokenizer then reads; the soft tokens' rows take the
//! encoder's embeddings.

use std::path::Path;

use super::siglip::Siglip;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::tensor::Tensor;
use crate::vision::resize::Filter;
use crate::vision::{Processor, Rgb};

/// An image encoder and everything needed to feed it.
pub struct VisionTower {
    encoder: Siglip,
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
        let encoder = Siglip::load(&file, ex)?;
        if processor.size != Some((encoder.image, encoder.image)) {
            return Err(Error::load(
                file.path(),
                format!(
                    "the image processor makes {:?} images, the encoder takes {}x{}",
                    processor.size, encoder.image, encoder.image
                ),
            ));
        }
        Ok(Some(VisionTower {
            encoder,
            processor,
            marker: "<start_of_image>".into(),
            soft_token: "<image_soft_token>".into(),
            wrap: ("\n\n<start_of_image>".into(), "<end_of_image>\n\n".into()),
        }))
    }

    /// Soft tokens per image.
    pub fn tokens_per_image(&self) -> usize {
        self.encoder.tokens_per_image()
    }

    /// The text model's width, which the soft tokens have.
    pub fn width(&self) -> usize {
        self.encoder.text_width
    }

    /// `text` with each image marker replaced by an image's whole sequence (its soft tokens
    /// wrapped as the model's processor wraps them), and the number of markers replaced.
    pub fn expand(&self, text: &str) -> (String, usize) {
        let n = text.matches(self.marker.as_str()).count();
        if n == 0 {
            return (text.to_string(), 0);
        }
        let seq = format!(
            "{}{}{}",
            self.wrap.0,
            self.soft_token.repeat(self.tokens_per_image()),
            self.wrap.1
        );
        (text.replace(self.marker.as_str(), &seq), n)
    }

    /// The soft tokens of one image: `[tokens_per_image, width]` f32 on `ex`'s backend.
    pub fn encode(&self, ex: &Executor, img: &Rgb) -> Result<Tensor> {
        let (_, _, px) = self.processor.pixels(img)?;
        self.encoder.encode(ex, &px)
    }

    /// [`VisionTower::encode`] from pixel values already made (`[3, S, S]`).
    pub fn encode_pixels(&self, ex: &Executor, pixels: &[f32]) -> Result<Tensor> {
        self.encoder.encode(ex, pixels)
    }
}

/// An mmproj GGUF's image processing: its square size, bilinear resampling (what the HF
/// processors of the projectors kiln reads use), 1/255 and its mean and standard deviation.
fn processor_from_gguf(f: &GgufFile) -> Result<Processor> {
    let size = f.get_u64("clip.vision.image_size")? as usize;
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
    Ok(Processor {
        size: Some((size, size)),
        filter: Filter::Bilinear,
        rescale: Some(1.0 / 255.0),
        normalize: Some((mean, std)),
    })
}
