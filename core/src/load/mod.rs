//! Model files: GGUF (memory-mapped) and Hugging Face directories (config.json and
//! safetensors), both seen through [`gguf::GgufFile`].

pub mod gguf;
pub mod hf;
pub mod safetensors;

use std::path::Path;

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Opens a model: a GGUF file, or a Hugging Face model directory.
pub fn open_model(path: &Path) -> Result<gguf::GgufFile> {
    if hf::is_model_dir(path) {
        hf::open_dir(path)
    } else {
        gguf::GgufFile::open(path)
    }
}

/// The tokenizer of a model opened with [`open_model`]: the GGUF file's own, or the
/// directory's `tokenizer.json` (with `tokenizer_config.json` and `chat_template.jinja`).
pub fn open_tokenizer(path: &Path, file: &gguf::GgufFile) -> Result<Tokenizer> {
    if hf::is_model_dir(path) {
        Tokenizer::from_hf_file(&path.join("tokenizer.json"))
    } else {
        Tokenizer::from_gguf(file)
    }
}
