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

    /// The rows `ranges` (in order) of the 2-D tensor `name`, which must have `shape`: e.g.
    /// one part of a fused projection. Rows must hold whole blocks of the dtype.
    pub fn get_rows(
        &mut self,
        name: &str,
        shape: &[usize],
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Tensor> {
        let (info, bytes) = self.file.data(name)?;
        if info.shape != shape || shape.len() != 2 || shape[0] == 0 {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name} has shape {:?}, the model's configuration needs {shape:?}",
                    info.shape
                ),
            ));
        }
        let row = bytes.len() / shape[0];
        let mut out = Vec::new();
        let mut rows = 0;
        for r in ranges {
            if r.start > r.end || r.end > shape[0] {
                return Err(Error::Model(format!("rows {r:?} of {name} out of range")));
            }
            out.extend_from_slice(&bytes[r.start * row..r.end * row]);
            rows += r.len();
        }
        *self.counts.entry(info.dtype).or_insert(0) += 1;
        self.n_params += (rows * shape[1]) as u64;
        self.ex
            .upload(&TensorDesc::new(info.dtype, [rows, shape[1]]), &out)
    }

    /// Columns `cols` of the 2-D float tensor `name` (of `shape`): e.g. one layer's slice of a
    /// table packed `[rows, layers × width]`.
    pub fn get_cols(
        &mut self,
        name: &str,
        shape: &[usize],
        cols: std::ops::Range<usize>,
    ) -> Result<Tensor> {
        let (info, bytes) = self.file.data(name)?;
        let width = shape.get(1).copied().unwrap_or(0);
        if info.shape != shape || shape.len() != 2 || cols.end > width || cols.start > cols.end {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name} has shape {:?}; columns {cols:?} of {shape:?} were asked for",
                    info.shape
                ),
            ));
        }
        if info.dtype.block_size() != 1 {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name}: column slices of {} are not supported",
                    info.dtype
                ),
            ));
        }
        let el = info.dtype.type_size();
        let mut out = Vec::with_capacity(shape[0] * cols.len() * el);
        for r in 0..shape[0] {
            let row = &bytes[r * width * el..(r + 1) * width * el];
            out.extend_from_slice(&row[cols.start * el..cols.end * el]);
        }
        *self.counts.entry(info.dtype).or_insert(0) += 1;
        self.n_params += (shape[0] * cols.len()) as u64;
        self.ex
            .upload(&TensorDesc::new(info.dtype, [shape[0], cols.len()]), &out)
    }

    /// A scalar or small f32 vector read to the host (dequantized).
    pub fn host_f32(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        let (info, bytes) = self.file.data(name)?;
        if info.n_elements() != n {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name} has {} values, {n} were expected",
                    info.n_elements()
                ),
            ));
        }
        let mut v = vec![0f32; n];
        crate::quant::dequantize(info.dtype, bytes, &mut v)?;
        Ok(v)
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
