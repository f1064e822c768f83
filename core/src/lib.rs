//! kiln-core: tensors, block formats, the closed op set, the `Backend` trait with its executor,
//! and the CPU reference backend that every other backend is judged against.

pub mod backend;
pub mod chat;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod exec;
pub mod grammar;
pub mod kv;
pub mod load;
pub mod model;
pub mod op;
pub mod quant;
pub mod rng;
pub mod runner;
pub mod sample;
pub mod sched;
pub mod spec;
pub mod tensor;
pub mod time;
pub mod tokenizer;
pub mod validate;
pub mod vision;

pub use error::{Error, Result};
pub use tensor::{DType, Shape, Tensor, TensorDesc};
