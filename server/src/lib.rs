//! The `kiln` command's pieces, as a library so the end-to-end tests can drive them.

pub mod backends;
pub mod bench;
pub mod diffusion;
pub mod generate;
pub mod hub;
pub mod images;
pub mod info;
pub mod kld;
pub mod kv_auto;
pub mod load;
pub mod models;
pub mod roofline;
pub mod serve;
pub mod spec;
pub mod timings;
pub mod validate;
