//! Tensors: element types, shapes and the backend-owned tensor handle.

pub(crate) mod dtype;
mod handle;
mod shape;

pub use dtype::{DType, QK_K};
pub use handle::{BackendId, Storage, Tensor, TensorDesc};
pub use shape::Shape;
