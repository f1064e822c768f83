//! Uploading a file's tensors to the backend, checking their shapes.

use crate::error::{Error, Result};
use crate::exec::Executor;
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

    /// Writes what was loaded (parameter count, tensors per dtype) into `info`.
    pub fn describe(&self, info: &mut super::ModelInfo) {
        info.n_params = self.n_params;
        info.dtypes = self.counts.iter().map(|(d, n)| (*d, *n)).collect();
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
            .upload(&TensorDesc::new(info.dtype, info.shape.clone()), &bytes)
    }

    /// The rows `ranges` (in order) of tensor `name`, which must have `shape`: e.g. one part
    /// of a fused projection. For a tensor of more dimensions, rows are its innermost vectors
    /// (all outer indices flattened). Rows must hold whole blocks of the dtype. The result is
    /// `[rows, shape.last()]`.
    pub fn get_rows(
        &mut self,
        name: &str,
        shape: &[usize],
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Tensor> {
        let (info, bytes) = self.file.data(name)?;
        let nrows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        if info.shape != shape || shape.len() < 2 || nrows == 0 {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name} has shape {:?}, the model's configuration needs {shape:?}",
                    info.shape
                ),
            ));
        }
        let cols = shape[shape.len() - 1];
        let row = bytes.len() / nrows;
        let mut out = Vec::new();
        let mut rows = 0;
        for r in ranges {
            if r.start > r.end || r.end > nrows {
                return Err(Error::Model(format!("rows {r:?} of {name} out of range")));
            }
            out.extend_from_slice(&bytes[r.start * row..r.end * row]);
            rows += r.len();
        }
        *self.counts.entry(info.dtype).or_insert(0) += 1;
        self.n_params += (rows * cols) as u64;
        self.ex
            .upload(&TensorDesc::new(info.dtype, [rows, cols]), &out)
    }

    /// Columns `cols` of the 2-D float tensor `name` (of `shape`): e.g. one layer's slice of a
    /// table packed `[rows, layers × width]`.
    pub fn get_cols(
        &mut self,
        name: &str,
        shape: &[usize],
        cols: std::ops::Range<usize>,
    ) -> Result<Tensor> {
        self.get_col_ranges(name, shape, &[cols])
    }

    /// The columns `ranges` (in order) of the 2-D float tensor `name`.
    pub fn get_col_ranges(
        &mut self,
        name: &str,
        shape: &[usize],
        ranges: &[std::ops::Range<usize>],
    ) -> Result<Tensor> {
        let (info, bytes) = self.file.data(name)?;
        let width = shape.get(1).copied().unwrap_or(0);
        let cols: usize = ranges.iter().map(|r| r.len()).sum();
        let bad_range = ranges.iter().any(|r| r.end > width || r.start > r.end);
        if info.shape != shape || shape.len() != 2 || bad_range {
            return Err(Error::load(
                self.file.path(),
                format!(
                    "tensor {name} has shape {:?}; columns {ranges:?} of {shape:?} were asked for",
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
        let mut out = Vec::with_capacity(shape[0] * cols * el);
        for r in 0..shape[0] {
            let row = &bytes[r * width * el..(r + 1) * width * el];
            for c in ranges {
                out.extend_from_slice(&row[c.start * el..c.end * el]);
            }
        }
        *self.counts.entry(info.dtype).or_insert(0) += 1;
        self.n_params += (shape[0] * cols) as u64;
        self.ex
            .upload(&TensorDesc::new(info.dtype, [shape[0], cols]), &out)
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
        crate::quant::dequantize(info.dtype, &bytes, &mut v)?;
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
