//! The continuous-batching engine: requests in, token streams out.
//!
//! [`Engine`] owns the model's [`Forward`] half and a [`Scheduler`] (which owns the KV
//! coordinator). Each [`Engine::step`] has the scheduler plan one forward pass over every
//! running request (decodes first, with their drafts, then prefill chunks; every slot
//! allocated in planning), runs the plan's batch, samples a token for each request whose
//! pending tokens are all computed, reports the outcomes to [`Scheduler::update`], and sends
//! the tokens on the requests' channels (the step itself is in `step.rs`). A request whose
//! receiver is gone is cancelled at that point and its KV blocks go back to the pool.
//! [`super::spawn`] runs an engine on its own thread (the one thread that owns the model and
//! the backend); requests reach it over a channel.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::request::{Event, EventSink, Finish, GenRequest};
use super::spec::{Spec, SpecStats};
use crate::error::{Error, Result};
use crate::grammar::Constraint;
use crate::runner::{embed::Pooling, Forward, Runner};
use crate::sample::{Sampler, MAX_TOP_LOGPROBS};
use crate::sched::{Kind, KvCoordinator, ReqId, Request, SchedConfig, Scheduler};
use crate::spec::Drafter;

/// How often a busy engine lists every request's slot for /slots (the counters are
/// published after every step).
pub const SLOTS_EVERY: Duration = Duration::from_millis(50);

/// Counters since the engine started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub steps: u64,
    /// Tokens run through the model (prefill and decode, recomputation included).
    pub tokens_computed: u64,
    pub generated: u64,
    pub preemptions: u64,
    pub cancelled: u64,
    /// Prompt tokens whose K/V came from the prefix cache instead of being computed.
    pub prefix_hit_tokens: u64,
    /// Tokens of sequences starting (or restarting after a preemption), looked up in the
    /// prefix cache: the hit rate's denominator.
    pub prefix_queried_tokens: u64,
    /// A diffusion model's canvases committed and the denoising steps they took.
    pub canvases: u64,
    pub denoising_steps: u64,
    /// Forward passes that denoised canvases, the canvases they denoised (several requests'
    /// canvases share a pass), and those passes that also fed other requests' tokens (prompt
    /// chunks, committed canvases, token-by-token generation).
    pub diffusion_passes: u64,
    pub diffusion_pass_canvases: u64,
    pub diffusion_shared_passes: u64,
    /// Speculative decoding's drafts and what the target accepted of them.
    pub spec: SpecStats,
    /// Grammar masks computed, their total time, and the time the engine waited for them
    /// after the forward pass (the part not hidden behind it), in microseconds.
    pub masks: u64,
    pub mask_us: u64,
    pub mask_wait_us: u64,
    /// Images encoded by the vision tower and the time it took (microseconds, synchronized
    /// with the device).
    pub images_encoded: u64,
    pub image_encode_us: u64,
}

/// The engine's state as a server reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub stats: EngineStats,
    pub waiting: usize,
    pub running: usize,
    /// Usable blocks of the full-attention KV pool (the null block left out): free now (cached
    /// ones included), and in all.
    pub kv_free: usize,
    pub kv_total: usize,
    /// Tokens one block of that pool holds.
    pub kv_block_size: usize,
    /// Blocks of that pool registered in the prefix cache (held by a request or free).
    pub kv_cached: usize,
    /// Recurrent-state snapshots held for prefix caching, the most that may be, and the bytes
    /// one takes (all zero for a model without recurrent state).
    pub state_snapshots: usize,
    pub state_snapshots_max: usize,
    pub state_snapshot_bytes: usize,
    /// CPU fallbacks per op name.
    pub fallbacks: Vec<(String, &'static str, u64)>,
    /// Every request the engine holds, running ones first.
    pub slots: Vec<Slot>,
    /// When the engine last finished a step (or started, before the first).
    pub last_step: Option<crate::time::Instant>,
}

/// One request as /slots reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub id: ReqId,
    pub state: SlotState,
    pub prompt_tokens: usize,
    pub generated: usize,
    /// Tokens whose K/V are in the cache.
    pub computed: usize,
    /// KV blocks held (full-attention pool).
    pub kv_blocks: usize,
    pub preemptions: u32,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SlotState {
    Queued,
    Prefill,
    Decode,
    /// A block-diffusion request denoising its canvases.
    Denoise,
}

impl SlotState {
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Queued => "queued",
            SlotState::Prefill => "prefill",
            SlotState::Decode => "decode",
            SlotState::Denoise => "denoise",
        }
    }
}

/// What the engine keeps of a request beside the scheduler's record of it: how its tokens
/// are drawn and where they go.
pub(super) struct Active {
    pub(super) sampler: Sampler,
    /// The grammar its tokens follow.
    pub(super) constraint: Option<Constraint>,
    /// The drafts proposed for the next step, with their distributions (the scheduler holds
    /// the tokens and decides how many of them it feeds).
    pub(super) draft: Option<crate::spec::Draft>,
    /// A block-diffusion request's denoising state.
    pub(super) canvas: Option<super::diffusion::Canvas>,
    /// An embedding's hidden states pooled so far.
    pub(super) embed: Option<crate::runner::embed::Pooled>,
    /// Its prompt's images.
    pub(super) images: Vec<super::vision::ImageSlot>,
    pub(super) tx: Box<dyn EventSink>,
}

pub struct Engine {
    pub(super) fwd: Forward,
    pub(super) sched: Scheduler,
    pub(super) active: HashMap<ReqId, Active>,
    pub(super) next_id: ReqId,
    pub(super) stats: EngineStats,
    /// A block-diffusion model's denoising settings for its requests (`None`: the model
    /// generates token by token only).
    pub(super) diffusion: Option<crate::sample::diffusion::DiffusionParams>,
    /// The drafter, when the engine decodes speculatively.
    pub(super) spec: Option<Spec>,
    /// Where a spawned engine publishes its state for other threads.
    pub(super) published: Option<Arc<std::sync::Mutex<Snapshot>>>,
    /// When the full snapshot (every request's slot) was last published.
    published_slots: Option<crate::time::Instant>,
    pub(super) last_step: crate::time::Instant,
    /// The vision tower, for a model that takes images.
    pub(super) vision: Option<super::vision::Vision>,
}

impl Engine {
    /// An engine over `runner`, with at most `max_running` requests resident (capped by the
    /// runner's `max_seqs`, which sized its KV pools).
    pub fn new(runner: Runner, max_running: usize) -> Engine {
        let cfg = runner.config().clone();
        // A recurrent model's prefix snapshots are states after a full block: prefills stop
        // at the last block boundary of the prompt to leave one there.
        let snapshots = cfg.prefix_caching && runner.state_stats().is_some();
        let canvas = runner.model().canvas_length();
        let resident = max_running.clamp(1, cfg.max_seqs.max(1));
        let (fwd, kv) = runner.into_parts();
        let sched = Scheduler::new(
            SchedConfig {
                max_batch_tokens: cfg.max_batch_tokens,
                max_running: resident,
                max_len: cfg.ctx,
                snapshot_blocks: snapshots.then_some(cfg.block_size),
                canvas: canvas.unwrap_or(0),
            },
            kv,
        );
        Engine {
            fwd,
            sched,
            active: HashMap::new(),
            next_id: 1,
            stats: EngineStats::default(),
            published: None,
            published_slots: None,
            diffusion: canvas.map(|_| Default::default()),
            spec: None,
            last_step: crate::time::Instant::now(),
            vision: None,
        }
    }

    /// The model on its backend (model, executor, caches, configuration).
    pub fn forward(&self) -> &Forward {
        &self.fwd
    }
    /// The KV coordinator, as the scheduler keeps it.
    pub fn kv(&self) -> &KvCoordinator {
        self.sched.kv()
    }
    /// Speculative decoding with `drafter`, up to `k` drafts per request per step. The
    /// runner must be able to roll `k` tokens back without recomputing a window
    /// ([`RunnerConfig::max_rollback`](crate::runner::RunnerConfig::max_rollback) ≥ `k`); a
    /// block-diffusion model does not decode token by token and is refused.
    pub fn with_spec(mut self, drafter: Box<dyn Drafter>, k: usize) -> Result<Engine> {
        if self.diffusion.is_some() {
            return Err(Error::Model(
                "speculative decoding needs an autoregressive model; this one denoises \
                 canvases"
                    .into(),
            ));
        }
        if k == 0 {
            return Err(Error::Model("--spec-tokens must be at least 1".into()));
        }
        let margin = self.fwd.config().max_rollback;
        if margin < k {
            return Err(Error::Model(format!(
                "speculating {k} tokens needs a runner that can roll {k} back (max_rollback \
                 is {margin})"
            )));
        }
        self.spec = Some(Spec::new(drafter, k));
        Ok(self)
    }

    /// Turns drafting on or off (an engine without a drafter stays as it is).
    pub fn set_speculation(&mut self, on: bool) {
        if let Some(s) = &mut self.spec {
            s.on = on;
        }
    }

    /// The drafter's name, when the engine speculates.
    pub fn drafter(&self) -> Option<&'static str> {
        self.spec.as_ref().map(Spec::name)
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }
    pub fn is_idle(&self) -> bool {
        self.sched.is_idle()
    }
    /// Requests queued and running.
    pub fn load(&self) -> (usize, usize) {
        (self.num_waiting(), self.num_running())
    }
    fn num_running(&self) -> usize {
        self.sched.num_running()
    }
    fn num_waiting(&self) -> usize {
        self.sched.waiting()
    }

    /// Publishes the current state where a spawned engine's handle reads it. The counters go
    /// out every time; the list of every request's slot (a walk over the whole queue) at most
    /// every [`SLOTS_EVERY`], and whenever the engine is idle.
    pub(super) fn publish(&mut self) {
        let Some(p) = &self.published else {
            return;
        };
        let now = crate::time::Instant::now();
        let slots = self.sched.is_idle()
            || self
                .published_slots
                .is_none_or(|t| now.duration_since(t) >= SLOTS_EVERY);
        let snap = self.snapshot_with(slots);
        if let Ok(mut s) = p.lock() {
            if !slots {
                // Keep the slots last listed, less the requests that ended since.
                let held = &self.active;
                let mut old = std::mem::take(&mut s.slots);
                old.retain(|x| held.contains_key(&x.id));
                *s = Snapshot { slots: old, ..snap };
            } else {
                *s = snap;
            }
        }
        if slots {
            self.published_slots = Some(now);
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with(true)
    }

    /// The state; with `slots`, every request's slot too.
    fn snapshot_with(&self, slots: bool) -> Snapshot {
        let kv = self.sched.kv();
        let slot = |s: &Request, running: bool| {
            let (state, computed) = match (s.kind, running) {
                (_, false) => (SlotState::Queued, s.computed),
                (Kind::Denoise, true) => (SlotState::Denoise, s.computed),
                (Kind::Embed, true) => (SlotState::Prefill, s.computed),
                (Kind::Generate, true) if s.computed < s.prompt_len => {
                    (SlotState::Prefill, s.computed)
                }
                (Kind::Generate, true) => (SlotState::Decode, s.computed),
            };
            Slot {
                id: s.id,
                state,
                prompt_tokens: s.prompt_len,
                generated: s.generated,
                computed,
                kv_blocks: kv.blocks_held(s.id),
                preemptions: s.preemptions,
            }
        };
        let slots = match slots {
            true => (self.sched.running().map(|s| slot(s, true)))
                .chain(self.sched.queued().map(|s| slot(s, false)))
                .collect(),
            false => Vec::new(),
        };
        let st = kv.state_stats().unwrap_or_default();
        Snapshot {
            last_step: Some(self.last_step),
            state_snapshots: st.snapshots,
            state_snapshots_max: st.max_snapshots,
            state_snapshot_bytes: st.slot_bytes,
            slots,
            kv_cached: kv.full_group().map_or(0, |m| m.pool().num_cached()),
            stats: self.stats.clone(),
            waiting: self.num_waiting(),
            running: self.num_running(),
            kv_free: kv.free_blocks(),
            kv_total: kv.full_group().map_or(0, |m| m.pool().num_blocks() - 1),
            kv_block_size: kv.full_group().map_or(0, |m| m.block_size()),
            fallbacks: self
                .fwd
                .executor()
                .fallbacks()
                .into_iter()
                .map(|f| (f.backend, f.op, f.count))
                .collect(),
        }
    }

    /// Queues a request; its tokens and its end arrive on `tx`. Fails (and sends nothing) on
    /// an empty prompt, a prompt that leaves no room in the context, or bad sampling
    /// parameters.
    pub fn submit(&mut self, req: GenRequest, tx: impl EventSink + 'static) -> Result<ReqId> {
        let id = self.next_id;
        self.submit_as(id, req, Box::new(tx))?;
        Ok(id)
    }

    /// `submit` under an id the caller chose (a spawned engine's handle numbers its
    /// requests, so it can cancel them; they may arrive out of order): one not held now.
    pub(super) fn submit_as(
        &mut self,
        id: ReqId,
        req: GenRequest,
        tx: Box<dyn EventSink>,
    ) -> Result<()> {
        let spans = self.checked(&req)?;
        if self.active.contains_key(&id) {
            return Err(Error::Model(format!("request id {id} is in use")));
        }
        let sampler = Sampler::new(req.params.clone())?;
        let canvas = match self.denoises(&req) {
            true => Some(self.canvas_for(id, &req)?),
            false => None,
        };
        self.next_id = self.next_id.max(id + 1);
        self.active.insert(
            id,
            Active {
                sampler,
                constraint: req.constraint.clone(),
                draft: None,
                tx,
                canvas,
                embed: None,
                images: (spans.iter().zip(&req.images))
                    .map(|(span, im)| super::vision::ImageSlot {
                        span: *span,
                        image: im.image.clone(),
                        embeds: None,
                    })
                    .collect(),
            },
        );
        let mut r = Request::new(id, req.prompt.clone());
        r.max_tokens = req.max_tokens;
        r.stop_ids = req.stop_ids.clone();
        r.logprobs = req.logprobs;
        r.images = spans;
        if self.denoises(&req) {
            r.kind = Kind::Denoise;
        }
        self.sched.admit(r);
        if req.max_tokens == 0 {
            return self.end(id, Some(Finish::Length));
        }
        Ok(())
    }

    /// Whether `req` is served by denoising canvases: on a block-diffusion model, unless it
    /// asks to be generated token by token.
    fn denoises(&self, req: &GenRequest) -> bool {
        self.diffusion.is_some() && !req.autoregressive
    }

    /// Whether `submit` would take `req`: a prompt that is not empty, leaves room in the
    /// context and stays in the vocabulary; sampling parameters in range.
    pub fn check(&self, req: &GenRequest) -> Result<()> {
        self.checked(req).map(|_| ())
    }

    /// [`Engine::check`], and the spans of the request's images (what the scheduler keys its
    /// cache blocks by).
    fn checked(&self, req: &GenRequest) -> Result<Vec<crate::kv::ContentSpan>> {
        let ctx = self.fwd.config().ctx;
        if req.prompt.is_empty() {
            return Err(Error::Model("the prompt is empty".into()));
        }
        if req.prompt.len() >= ctx {
            return Err(Error::Model(format!(
                "the prompt has {} tokens; the context holds {ctx}",
                req.prompt.len()
            )));
        }
        let vocab = self.fwd.model().info().vocab;
        // An image's soft-token id may lie past the vocabulary (Gemma 3's does): its rows
        // take the vision tower's embeddings ([`Engine::image_spans`] places them).
        let soft = self.vision.as_ref().map(|v| v.token);
        if let Some(t) = req
            .prompt
            .iter()
            .find(|&&t| t as usize >= vocab && Some(t) != soft)
        {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        let denoises = self.denoises(req);
        if denoises && req.logprobs.is_some() {
            return Err(Error::Model(
                "log-probabilities are not available from a diffusion model".into(),
            ));
        }
        if self.diffusion.is_none() && req.init_canvas.is_some() {
            return Err(Error::Model(
                "a starting canvas needs a block-diffusion model; this one generates token by \
                 token"
                    .into(),
            ));
        }
        if !denoises && req.init_canvas.is_some() {
            return Err(Error::Model(
                "a starting canvas is for a request served by denoising, not token by token".into(),
            ));
        }
        if denoises && req.constraint.is_some() {
            return Err(Error::Model(
                "grammars are not available with a diffusion model (it samples whole blocks)"
                    .into(),
            ));
        }
        if req.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return Err(Error::Model(format!(
                "at most {MAX_TOP_LOGPROBS} top log-probabilities per token"
            )));
        }
        crate::sample::SamplingParams::validate(&req.params)?;
        self.image_spans(&req.prompt, &req.images)
    }

    /// Runs one request to its end on this thread, stepping the engine (requests queued
    /// beside it advance too): `kiln run`, `chat` and `bench` are this with one request.
    /// `on` sees each of the request's events as it happens and returns `Ok(false)` to stop
    /// early; the request is then cancelled and its blocks freed (so it is on an error from
    /// `on`, which is returned). A request the engine fails returns its error.
    pub fn run_one(
        &mut self,
        req: GenRequest,
        mut on: impl FnMut(Event) -> Result<bool>,
    ) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        let id = self.submit(req, tx)?;
        let mut idle = false;
        loop {
            let mut any = false;
            for ev in rx.try_iter() {
                any = true;
                let end = match &ev {
                    Event::Done { .. } => true,
                    Event::Error(e) => return Err(Error::Model(e.clone())),
                    _ => false,
                };
                match on(ev) {
                    Ok(true) if end => return Ok(()),
                    Ok(true) => {}
                    Ok(false) => return self.cancel(id),
                    Err(e) => {
                        self.cancel(id)?;
                        return Err(e);
                    }
                }
            }
            if idle && !any {
                return Err(Error::Model(
                    "the engine went idle before the request ended".into(),
                ));
            }
            idle = !self.step()?;
        }
    }

    /// Cancels a request (queued or running); its blocks return to the pool.
    pub fn cancel(&mut self, id: ReqId) -> Result<()> {
        if self.active.contains_key(&id) {
            self.stats.cancelled += 1;
        }
        self.end(id, None)
    }

    /// Removes a request, frees its KV blocks and, with `finish`, tells its receiver.
    pub(super) fn end(&mut self, id: ReqId, finish: Option<Finish>) -> Result<()> {
        let (prompt_tokens, generated) =
            (self.sched.get(id)).map_or((0, 0), |r| (r.prompt_len, r.generated));
        self.sched.finish(id)?;
        if let Some(s) = &mut self.spec {
            s.release(id);
        }
        if let (Some(mut a), Some(finish)) = (self.active.remove(&id), finish) {
            // Whoever is told the request ended finds the engine's state already past it.
            self.publish();
            a.tx.send(Event::Done {
                finish,
                prompt_tokens,
                generated,
            });
        }
        Ok(())
    }

    /// Sends `ev` to `id`'s receiver. False once nobody listens: the request is then counted
    /// as cancelled and ended. A request not held has nobody to tell (true).
    pub(super) fn send(&mut self, id: ReqId, ev: Event) -> Result<bool> {
        let Some(a) = self.active.get_mut(&id) else {
            return Ok(true);
        };
        if a.tx.send(ev) {
            return Ok(true);
        }
        self.stats.cancelled += 1;
        self.active.remove(&id);
        self.end(id, None)?;
        Ok(false)
    }

    pub(super) fn fail(&mut self, id: ReqId, msg: String) -> Result<()> {
        if let Some(a) = self.active.get_mut(&id) {
            a.tx.send(Event::Error(msg));
        }
        self.active.remove(&id);
        self.end(id, None)
    }
}
impl Engine {
    /// Queues the embedding of `tokens` (its final-normed hidden states pooled by `pooling`
    /// and scaled to unit length) under `id`: scheduled like any request's prompt, under the
    /// same token budget and KV pools, beside the others. The vector arrives on `tx` as
    /// [`Event::Embedding`], then `Done`.
    pub fn submit_embedding(
        &mut self,
        id: ReqId,
        tokens: &[u32],
        pooling: Pooling,
        tx: Box<dyn EventSink>,
    ) -> Result<()> {
        self.check_embedding(tokens)?;
        if self.active.contains_key(&id) {
            return Err(Error::Model(format!("request id {id} is in use")));
        }
        self.next_id = self.next_id.max(id + 1);
        self.active.insert(
            id,
            Active {
                sampler: Sampler::new(crate::sample::SamplingParams::default())?,
                constraint: None,
                draft: None,
                tx,
                canvas: None,
                embed: Some(crate::runner::embed::Pooled::new(pooling, tokens.len())),
                images: Vec::new(),
            },
        );
        let mut r = Request::new(id, tokens.to_vec());
        r.kind = Kind::Embed;
        r.max_tokens = 0;
        self.sched.admit(r);
        Ok(())
    }

    /// Whether the engine can embed `tokens`.
    fn check_embedding(&self, tokens: &[u32]) -> Result<()> {
        if self.diffusion.is_some() {
            return Err(Error::Model(
                "embeddings are not available from a diffusion model".into(),
            ));
        }
        let model = self.fwd.model();
        if !model.gives(&crate::model::Features::Final) {
            return Err(Error::Model(format!(
                "{} does not hand out its hidden states, so it has no embeddings",
                model.info().architecture
            )));
        }
        if let Some(f) = self.spec.as_ref().and_then(|s| s.reads()) {
            if f != crate::model::Features::Final {
                return Err(Error::Model(
                    "embeddings are not served beside a drafter that reads other hidden states \
                     than the final one"
                        .into(),
                ));
            }
        }
        if tokens.is_empty() {
            return Err(Error::Model("nothing to embed: the input is empty".into()));
        }
        let ctx = self.fwd.config().ctx;
        if tokens.len() >= ctx {
            return Err(Error::Model(format!(
                "the input has {} tokens; the context holds {ctx}",
                tokens.len()
            )));
        }
        let vocab = model.info().vocab;
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        Ok(())
    }

    /// The embedding of `tokens`, served on this thread (stepping the engine: requests queued
    /// beside it advance too).
    pub fn embed(&mut self, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
        let (tx, rx) = mpsc::channel();
        let id = self.next_id;
        self.submit_embedding(id, tokens, pooling, Box::new(tx))?;
        loop {
            for ev in rx.try_iter() {
                match ev {
                    Event::Embedding(v) => return Ok(v),
                    Event::Error(e) => return Err(Error::Model(e)),
                    _ => {}
                }
            }
            if !self.step()? {
                return Err(Error::Model(
                    "the engine went idle before the embedding was made".into(),
                ));
            }
        }
    }
}
