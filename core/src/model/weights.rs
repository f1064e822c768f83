//! Uploading a file's tensors to the backend, checking their shapes.

use crate::backend::Executor;
use crate::error::{Error, Result};
use crate::load::gguf::GgufFile;
use crate::tensor::{DType, Tensor, TensorDesc};

pub(crate) struct Weights<'a> {
    pub file: &'a GgufFile,
    pub ex: &'a Executor,
    pub counts: std::collections::BTreeMap<DType, usize>,
    pub n_params: u64,
}

impl<'a> Weights<'a> {
    pub fn new(file: &'a GgufFile, ex: &'a Executor) -> Self {
        Weights {
            file,
            ex,
            counts: Default::default(),
            n_params: 0,
        }
    }

    /// The tensor `name`, which must have `shape` (outermost first).
    pub fn get(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let (info, bytes) = self.file.data(name)?;
        if info.shape != shape {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name} has shape {:?}, the model's configuration needs {shape:?}",
                    info.shape
                ),
            ));
        }
        *self.counts.entry(info.dtype).or_insert(0) += 1;
        self.n_params += info.shape.iter().product::<usize>() as u64;
        self.ex
            .upload(&TensorDesc::new(info.dtype, info.shape.clone()), bytes)
    }

    /// Like `get`, or `None` when the file has no such tensor.
    pub fn get_opt(&mut self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        if self.file.tensors().iter().any(|t| t.name == name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }
}
