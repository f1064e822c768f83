//! The one table of model families: each family's file declares its GGUF architectures (with
//! their builders) and its Hugging Face checkpoints' side ([`HfFamily`]: `model_type`s,
//! metadata, tensor names, conversions); this list gathers them.

use super::{Builder, Family, Model};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::load::hf::family::HfFamily;

/// Every family kiln runs.
pub const FAMILIES: &[Family] = &[
    super::llama::FAMILY,
    super::qwen35::FAMILY,
    super::gemma3::FAMILY,
    super::gemma4::FAMILY,
    super::diffusion_gemma::FAMILY,
    super::gemma4_assistant::FAMILY,
    super::dflash::FAMILY,
];

/// Every GGUF architecture kiln builds, with its builder.
pub fn architectures() -> impl Iterator<Item = (&'static str, Builder)> {
    FAMILIES.iter().flat_map(|f| f.archs.iter().copied())
}

/// Every Hugging Face family.
pub fn hf_families() -> impl Iterator<Item = &'static HfFamily> {
    FAMILIES.iter().flat_map(|f| f.hf.iter().copied())
}

/// Builds the model a GGUF file describes, with its weights uploaded to the executor's backend.
pub fn build_from_gguf(file: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    let arch = file.architecture()?;
    let _span = tracing::info_span!("load", arch, path = file.path()).entered();
    match architectures().find(|(name, _)| *name == arch) {
        Some((_, build)) => build(file, ex),
        None => Err(Error::load(
            file.path(),
            format!(
                "unknown architecture {arch:?}; kiln runs: {}",
                architectures().map(|a| a.0).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}
