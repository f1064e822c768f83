//! The one table from architecture name (GGUF `general.architecture`) to builder.

use super::Model;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;

type Builder = fn(&GgufFile, &Executor) -> Result<Box<dyn Model>>;

/// Every architecture kiln runs, with its builder.
pub const ARCHITECTURES: &[(&str, Builder)] = &[
    ("llama", super::llama::build),
    ("qwen3", super::llama::build_qwen3),
    ("qwen35", super::qwen35::build),
    ("qwen35moe", super::qwen35::build),
    ("gemma3", super::gemma3::build),
    ("gemma4", super::gemma4::build),
    ("diffusion-gemma", super::diffusion_gemma::build),
];

/// Builds the model a GGUF file describes, with its weights uploaded to the executor's backend.
pub fn build_from_gguf(file: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    let arch = file.architecture()?;
    let _span = tracing::info_span!("load", arch, path = file.path()).entered();
    match ARCHITECTURES.iter().find(|(name, _)| *name == arch) {
        Some((_, build)) => build(file, ex),
        None => Err(Error::load(
            file.path(),
            format!(
                "unknown architecture {arch:?}; kiln runs: {}",
                ARCHITECTURES
                    .iter()
                    .map(|a| a.0)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}
