//! What a request is and what it hears back: the request, its events, where they go.

use std::sync::mpsc::Sender;

use crate::grammar::Constraint;
use crate::sample::{SamplingParams, TokenLogprobs};

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end the generation (not sent).
    pub stop_ids: Vec<u32>,
    /// With `Some(n)`, each token comes with its log-probability and the `n` most likely
    /// alternatives (at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
    /// A block-diffusion model sends each denoising step's argmax canvas ([`Event::Draft`]).
    pub drafts: bool,
    /// A block-diffusion model's first canvas (one id per canvas position) instead of noise.
    pub init_canvas: Option<Vec<u32>>,
    /// On a block-diffusion model: generate token by token from its encoder's logits (as a
    /// causal language model) instead of denoising canvases. Refused by other models.
    pub autoregressive: bool,
    /// A grammar the output must follow ([`crate::grammar`]); the request ends when the
    /// grammar is complete. Such a request is never drafted for.
    pub constraint: Option<Constraint>,
    /// The prompt's images, in order (the prompt holds each one's soft tokens).
    pub images: Vec<super::vision::PromptImage>,
}

impl GenRequest {
    /// A request with no stop tokens and no log-probabilities.
    pub fn new(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt,
            params,
            max_tokens,
            stop_ids: Vec::new(),
            logprobs: None,
            drafts: false,
            init_canvas: None,
            autoregressive: false,
            constraint: None,
            images: Vec::new(),
        }
    }
}

/// Where a request's events go: a channel end the engine never blocks on. `send` returns
/// false once nobody listens; the request is then cancelled.
pub trait EventSink: Send {
    fn send(&mut self, ev: Event) -> bool;
}

impl EventSink for Sender<Event> {
    fn send(&mut self, ev: Event) -> bool {
        Sender::send(self, ev).is_ok()
    }
}

pub use crate::sched::Finish;

/// What a request's channel carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// How many prompt tokens came from the prefix cache, when the request starts (again,
    /// after a preemption) from a cached prefix; before its first token.
    Cached(usize),
    /// A generated token, with its log-probabilities when the request asked for them.
    Token(u32, Option<TokenLogprobs>),
    /// A block-diffusion model's denoising step `step` of canvas `canvas`: its argmax canvas
    /// (when the request asked for drafts).
    Draft {
        canvas: usize,
        step: usize,
        tokens: Vec<u32>,
    },
    /// A block-diffusion model committed a canvas after `steps` denoising steps (its tokens
    /// follow, as `Token`s).
    Canvas { steps: usize },
    Done {
        finish: Finish,
        prompt_tokens: usize,
        generated: usize,
    },
    /// An embedding request's vector (unit length); `Done` follows.
    Embedding(Vec<f32>),
    /// The request failed; nothing more follows.
    Error(String),
}
