//! The error type of kiln-core. Every failure is a value that names what and where.

use crate::tensor::dtype::DType;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A wrong call to an op: shapes, dtypes or parameters that do not fit together.
    #[error("{op}: {msg} (inputs: {inputs}; outputs: {outputs})")]
    Op {
        op: String,
        msg: String,
        inputs: String,
        outputs: String,
    },
    #[error("tensor: {0}")]
    Tensor(String),
    #[error("{dtype}: {msg}")]
    Quant { dtype: DType, msg: String },
    #[error("backend {backend}: {msg}")]
    Backend { backend: String, msg: String },
    #[error(
        "{op} is not supported by backend {backend}, and strict mode forbids the CPU fallback"
    )]
    StrictFallback { backend: String, op: String },
    #[error("backend not available: {0}")]
    NotAvailable(String),
    /// A model file or directory that cannot be used: names the file and the problem.
    #[error("{path}: {msg}")]
    Load { path: String, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model: {0}")]
    Model(String),
    /// The KV cache pool had fewer free blocks than a forward pass asked for. Nothing was
    /// computed; the pass can run once blocks are freed.
    #[error("kv cache: {0}")]
    KvFull(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn quant(dtype: DType, msg: impl Into<String>) -> Self {
        Error::Quant {
            dtype,
            msg: msg.into(),
        }
    }
    pub fn load(path: impl std::fmt::Display, msg: impl Into<String>) -> Self {
        Error::Load {
            path: path.to_string(),
            msg: msg.into(),
        }
    }
    pub fn backend(backend: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Backend {
            backend: backend.into(),
            msg: msg.into(),
        }
    }
}
