//! The continuous-batching engine: requests in, token streams out.
//!
//! - `batching.rs`: the [`Engine`] (the model's forward half, the scheduler that owns the KV
//!   coordinator, the requests' samplers and sinks), submission, cancellation, its state;
//! - `step.rs`: one step (plan, forward, sample or verify, update, stream);
//! - `denoise.rs`: a block-diffusion request's canvas before and after the passes that
//!   denoise it (the scheduler plans those passes like any other request's);
//! - `request.rs`: a request and the events it hears back;
//! - `handle.rs`: an engine on its own thread;
//! - parts the engine holds, which never see it: `spec.rs` (the drafter and verification) and
//!   `diffusion.rs` (a request's denoising state, and a direct generation loop).
//!
//! Running a model directly, without a scheduler, is [`crate::runner`]; its types are
//! re-exported here.

pub mod batching;
mod denoise;
pub mod diffusion;
mod handle;
mod images;
mod request;
mod spec;
mod step;
#[cfg(test)]
mod toy_tests;
mod vision;

pub use batching::{Engine, EngineStats, Slot, SlotState, Snapshot, SLOTS_EVERY};
pub use handle::{spawn, CancelOnDrop, EngineHandle, Stream};
pub use request::{Event, EventSink, Finish, GenRequest};
pub use spec::SpecStats;
pub use vision::PromptImage;

pub use crate::runner::embed::Pooling;
pub use crate::runner::{
    BlockCopy, Forward, KvCoordinator, Logits, Rewind, Runner, RunnerConfig, Session, StepRows,
    Target, CALIBRATION_FIT_TOKENS, CALIBRATION_TOKENS,
};
