use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::{DType, Shape};
use crate::error::{Error, Result};

/// Identifies one backend instance; a tensor may only be used by the backend that made it.
pub type BackendId = u64;

/// Type and shape of a tensor: what `supports_op` and shape checks see.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorDesc {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Self {
        TensorDesc {
            dtype,
            shape: shape.into(),
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    /// Bytes of the tensor, or `None` if the last dimension is not a whole number of blocks.
    pub fn nbytes(&self) -> Option<usize> {
        if self.shape.last() % self.dtype.block_size() != 0 {
            return None;
        }
        self.dtype.bytes_for(self.numel())
    }
}

impl fmt::Display for TensorDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
impl fmt::Debug for TensorDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A backend's memory. Each backend downcasts to its own buffer type.
pub trait Storage: Any + Send + Sync {
    fn len_bytes(&self) -> usize;
    fn backend(&self) -> BackendId;
    fn as_any(&self) -> &dyn Any;
}

/// A typed, shaped window (offset + length) into a backend buffer. Cloning shares the buffer.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<dyn Storage>,
    offset: usize,
    desc: TensorDesc,
}

impl Tensor {
    /// Wraps `storage[offset..]` as a tensor of `desc`; fails if it does not fit.
    pub fn new(storage: Arc<dyn Storage>, offset: usize, desc: TensorDesc) -> Result<Tensor> {
        let nbytes = desc.nbytes().ok_or_else(|| {
            Error::Tensor(format!(
                "{desc}: last dimension is not a whole number of {} blocks",
                desc.dtype
            ))
        })?;
        match offset.checked_add(nbytes) {
            Some(end) if end <= storage.len_bytes() => Ok(Tensor {
                storage,
                offset,
                desc,
            }),
            _ => Err(Error::Tensor(format!(
                "{desc} at byte offset {offset} needs {nbytes} bytes but its buffer has {}",
                storage.len_bytes()
            ))),
        }
    }
    pub fn dtype(&self) -> DType {
        self.desc.dtype
    }
    pub fn shape(&self) -> &Shape {
        &self.desc.shape
    }
    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }
    pub fn numel(&self) -> usize {
        self.desc.numel()
    }
    /// Byte offset into the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn nbytes(&self) -> usize {
        // Checked in `new`.
        self.desc.nbytes().unwrap_or(0)
    }
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
    pub fn backend(&self) -> BackendId {
        self.storage.backend()
    }
    /// A view of `shape` starting `elem_offset` elements in; the offset must fall on a block boundary.
    pub fn view(&self, elem_offset: usize, shape: impl Into<Shape>) -> Result<Tensor> {
        let dtype = self.dtype();
        let byte_off = dtype.bytes_for(elem_offset).ok_or_else(|| {
            Error::Tensor(format!(
                "view of {} at element {elem_offset}: not on a {dtype} block boundary",
                self.desc
            ))
        })?;
        let desc = TensorDesc::new(dtype, shape);
        let nbytes = desc
            .nbytes()
            .ok_or_else(|| Error::Tensor(format!("view {desc}: not a whole number of blocks")))?;
        if byte_off
            .checked_add(nbytes)
            .is_none_or(|e| e > self.nbytes())
        {
            return Err(Error::Tensor(format!(
                "view {desc} at element {elem_offset} runs past the end of {}",
                self.desc
            )));
        }
        Tensor::new(self.storage.clone(), self.offset + byte_off, desc)
    }
    /// The same bytes with another shape of the same element count.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.numel() != self.numel() {
            return Err(Error::Tensor(format!(
                "reshape {} to {shape}: element counts differ",
                self.desc
            )));
        }
        Tensor::new(
            self.storage.clone(),
            self.offset,
            TensorDesc::new(self.dtype(), shape),
        )
    }
    /// Whether the two tensors' byte ranges in one buffer intersect.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
            && self.offset < other.offset + other.nbytes()
            && other.offset < self.offset + self.nbytes()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} @{}+{})",
            self.desc,
            self.backend(),
            self.offset
        )
    }
}
