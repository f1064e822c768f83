//! Model files: GGUF (memory-mapped) and Hugging Face directories (config.json and
//! safetensors), both seen through [`gguf::GgufFile`].

pub mod gguf;
pub mod hf;
pub(crate) mod hf_defaults;
pub mod safetensors;

use std::path::Path;

use crate::error::Result;

/// Opens a model: a GGUF file, or a Hugging Face model directory.
pub fn open_model(path: &Path) -> Result<gguf::GgufFile> {
    if hf::is_model_dir(path) {
        hf::open_dir(path)
    } else {
        gguf::GgufFile::open(path)
    }
}
