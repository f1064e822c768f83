//! The image parts of a request and of the engine, as plain data (the engine's image steps
//! are `images.rs`).

use std::sync::Arc;

use crate::kv::ContentSpan;
use crate::model::VisionTower;
use crate::tensor::Tensor;
use crate::vision::Image;

/// An image of a prompt: its soft tokens start at `start` (the prompt holds the tower's
/// soft-token id there, [`VisionTower::tokens_for`] the image times).
#[derive(Clone, Debug)]
pub struct PromptImage {
    pub start: usize,
    pub image: Arc<Image>,
}

/// The engine's vision tower and the id of its soft token in the model's vocabulary.
pub(crate) struct Vision {
    pub(crate) tower: Arc<VisionTower>,
    pub(crate) token: u32,
}

/// One image of a running request: its place, the image, its soft tokens once encoded.
pub(crate) struct ImageSlot {
    pub(crate) span: ContentSpan,
    pub(crate) image: Arc<Image>,
    pub(crate) embeds: Option<Tensor>,
}
