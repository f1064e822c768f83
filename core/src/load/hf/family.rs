//! What one model family tells the Hugging Face loader: the `model_type`s it reads, its
//! metadata beyond the dense fields every family shares, its tensor names, and the byte
//! conversions its checkpoints need. Each family declares one in its own file
//! (`model/<family>.rs`); the registry gathers them; `load/hf.rs` is the machinery that
//! applies them.

use super::config::{Config, Meta};
use crate::error::Result;
pub(crate) use crate::load::hf_defaults::{f, fd, none, Field};

/// One family's Hugging Face side.
pub struct HfFamily {
    /// The `model_type`s it reads (the text model's and a multimodal wrapper's), each with
    /// the GGUF architecture it becomes.
    pub(crate) model_types: &'static [(&'static str, &'static str)],
    /// A config this family takes whatever its `model_type` says (a DFlash drafter is a Qwen3
    /// config with a `dflash_config`), with the architecture it becomes; asked before the
    /// `model_type`s are.
    pub(crate) claims: Option<fn(&Config) -> Option<&'static str>>,
    /// Its metadata beyond the dense fields (written under the architecture's name).
    pub(crate) meta: fn(&Config, &mut Meta) -> Result<()>,
    /// llama.cpp's name for a tensor of its own (checkpoint prefix stripped), asked before the
    /// names every family shares.
    pub(crate) names: fn(&str) -> Option<String>,
    /// RMSNorm weights stored as `w` for `x·(1+w)`: 1 is added on loading, except to norms
    /// whose llama.cpp names end in one of these.
    pub(crate) one_centred_norms: Option<&'static [&'static str]>,
    /// Q and K projections stored in the rotate-half RoPE layout: their rows are permuted to
    /// the interleaved layout.
    pub(crate) rotate_half_qk: bool,
    /// DiffusionGemma: the checkpoint may hold the encoder's copies of the decoder's
    /// tensors (one set is kept) and the encoder's own per-layer output scalars.
    pub(crate) encoder_copies: bool,
    /// What an absent or null field means for each text model type it reads (transformers'
    /// class defaults: [`crate::load::hf_defaults`]).
    pub(crate) defaults: &'static [(&'static str, &'static [Field])],
    /// Its `model_type` decides over the text config's (it wraps another family's text
    /// model: Gemma 4's MTP assistant).
    pub(crate) wraps_text: bool,
    /// The family's vision tower: a `config.json` (the whole file) read as an mmproj GGUF's
    /// `clip.*` metadata (`load/hf/vision.rs` maps the tensors), or an error naming what kiln
    /// cannot run.
    pub(crate) vision: Option<VisionMeta>,
}

/// See [`HfFamily::vision`].
pub(crate) type VisionMeta =
    fn(&serde_json::Value) -> std::result::Result<Vec<(String, crate::load::gguf::Value)>, String>;

impl HfFamily {
    /// A family with only `model_types`, `meta` and `names` of its own.
    pub(crate) const fn new(
        model_types: &'static [(&'static str, &'static str)],
        meta: fn(&Config, &mut Meta) -> Result<()>,
        names: fn(&str) -> Option<String>,
    ) -> HfFamily {
        HfFamily {
            model_types,
            claims: None,
            meta,
            names,
            one_centred_norms: None,
            rotate_half_qk: false,
            encoder_copies: false,
            defaults: &[],
            wraps_text: false,
            vision: None,
        }
    }
}

/// A layer tensor's index and the rest of its name (`layers.3.mlp.gate.weight` → `(3,
/// "mlp.gate.weight")`).
pub fn layer(hf: &str) -> Option<(usize, &str)> {
    let (l, suffix) = hf.strip_prefix("layers.")?.split_once('.')?;
    Some((l.parse().ok()?, suffix))
}

/// `blk.{l}.{name}.weight` for layer tensor `hf` when `map` knows its suffix.
pub fn layer_weight(hf: &str, map: impl Fn(&str) -> Option<&'static str>) -> Option<String> {
    let (l, suffix) = layer(hf)?;
    Some(format!("blk.{l}.{}.weight", map(suffix)?))
}

/// No names of its own.
pub fn no_names(_: &str) -> Option<String> {
    None
}
