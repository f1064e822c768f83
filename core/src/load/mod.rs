//! Model files: GGUF (memory-mapped) and, later, Hugging Face safetensors directories.

pub mod gguf;
