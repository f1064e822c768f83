//! The continuous-batching engine: requests in, token streams out.
//!
//! [`Engine`] owns the model's [`Forward`] half and a [`Scheduler`] (which owns the KV
//! coordinator). Each [`Engine::step`] has the scheduler plan one forward pass over every
//! running request (decodes first, with their drafts, then prefill chunks; every slot
//! allocated in planning), runs the plan's batch, samples a token for each request whose
//! pending tokens are all computed, reports the outcomes to [`Scheduler::update`], and sends
//! the tokens on the requests' channels. A request whose receiver is gone is cancelled at that point and its KV blocks go
//! back to the pool. [`spawn`] runs an engine on its own thread (the one thread that owns the
//! model and the backend); requests reach it over a channel.

use std::collections::HashMap;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

pub use super::handle::{spawn, CancelOnDrop, EngineHandle, Stream, SLOTS_EVERY};
use super::{Forward, Runner, Session};
use crate::error::{Error, Result};
use crate::grammar::Constraint;
use crate::sample::{Sampler, SamplingParams, TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::sched::{KvCoordinator, Outcome, Plan, ReqId, Request, SchedConfig, Scheduler};

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
    /// A grammar the output must follow ([`crate::grammar`]); the request ends when the
    /// grammar is complete. Such a request is never drafted for.
    pub constraint: Option<Constraint>,
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
            constraint: None,
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

/// Why a generation ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

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
    /// The request failed; nothing more follows.
    Error(String),
}

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
    /// Speculative decoding's drafts and what the target accepted of them.
    pub spec: super::SpecStats,
    /// Grammar masks computed, their total time, and the time the engine waited for them
    /// after the forward pass (the part not hidden behind it), in microseconds.
    pub masks: u64,
    pub mask_us: u64,
    pub mask_wait_us: u64,
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
    pub last_step: Option<std::time::Instant>,
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
}

impl SlotState {
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Queued => "queued",
            SlotState::Prefill => "prefill",
            SlotState::Decode => "decode",
        }
    }
}

pub(super) struct Active {
    pub(super) sampler: Sampler,
    pub(super) max_tokens: usize,
    stop_ids: Vec<u32>,
    prompt_len: usize,
    /// The drafts proposed for the next step, with their distributions (the scheduler holds
    /// the tokens and decides how many of them it feeds).
    pub(super) draft: Option<crate::spec::Draft>,
    pub(super) generated: usize,
    pub(super) logprobs: Option<usize>,
    pub(super) constraint: Option<Constraint>,
    pub(super) tx: Box<dyn EventSink>,
}

pub struct Engine {
    pub(super) fwd: Forward,
    pub(super) sched: Scheduler,
    pub(super) active: HashMap<ReqId, Active>,
    pub(super) next_id: ReqId,
    pub(super) stats: EngineStats,
    /// A block-diffusion model's requests (its engine runs only these; the scheduler stays
    /// empty).
    pub(super) diffusion: Option<super::diffusion::Tasks>,
    /// The drafter, when the engine decodes speculatively.
    pub(super) spec: Option<super::spec::Spec>,
    /// Where a spawned engine publishes its state for other threads.
    pub(super) published: Option<Arc<std::sync::Mutex<Snapshot>>>,
    /// When the full snapshot (every request's slot) was last published.
    published_slots: Option<std::time::Instant>,
    pub(super) last_step: std::time::Instant,
}

impl Engine {
    /// An engine over `runner`, with at most `max_running` requests resident (capped by the
    /// runner's `max_seqs`, which sized its KV pools).
    pub fn new(runner: Runner, max_running: usize) -> Engine {
        let cfg = runner.config().clone();
        // A recurrent model's prefix snapshots are states after a full block: prefills stop
        // at the last block boundary of the prompt to leave one there.
        let snapshots = cfg.prefix_caching && runner.state_stats().is_some();
        let runner_is_diffusion = runner.model().canvas_length().is_some();
        let resident = max_running.clamp(1, cfg.max_seqs.max(1));
        let (fwd, kv) = runner.into_parts();
        let sched = Scheduler::new(
            SchedConfig {
                max_batch_tokens: cfg.max_batch_tokens,
                max_running: resident,
                snapshot_blocks: snapshots.then_some(cfg.block_size),
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
            diffusion: runner_is_diffusion.then(|| super::diffusion::Tasks::new(resident)),
            spec: None,
            last_step: std::time::Instant::now(),
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
    /// The model and the KV coordinator for work that runs outside the scheduler's plans.
    pub(super) fn session(&mut self) -> Session<'_> {
        Session {
            fwd: &self.fwd,
            kv: self.sched.kv_mut(),
        }
    }
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }
    pub fn is_idle(&self) -> bool {
        self.sched.is_idle() && self.diffusion.as_ref().is_none_or(|d| d.is_empty())
    }
    /// Requests queued and running.
    pub fn load(&self) -> (usize, usize) {
        (self.num_waiting(), self.num_running())
    }
    fn num_running(&self) -> usize {
        self.sched.num_running() + self.diffusion.as_ref().map_or(0, |d| d.running())
    }
    fn num_waiting(&self) -> usize {
        self.sched.waiting() + self.diffusion.as_ref().map_or(0, |d| d.waiting())
    }

    /// Publishes the current state where a spawned engine's handle reads it. The counters go
    /// out every time; the list of every request's slot (a walk over the whole queue) at most
    /// every [`SLOTS_EVERY`], and whenever the engine is idle.
    pub(super) fn publish(&mut self) {
        let Some(p) = &self.published else {
            return;
        };
        let now = std::time::Instant::now();
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
            let a = self.active.get(&s.id);
            let prompt_tokens = a.map_or(0, |a| a.prompt_len);
            Slot {
                id: s.id,
                state: match (running, s.computed >= prompt_tokens) {
                    (false, _) => SlotState::Queued,
                    (true, false) => SlotState::Prefill,
                    (true, true) => SlotState::Decode,
                },
                prompt_tokens,
                generated: a.map_or(0, |a| a.generated),
                computed: s.computed,
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
        self.check(&req)?;
        if self.active.contains_key(&id) {
            return Err(Error::Model(format!("request id {id} is in use")));
        }
        let sampler = Sampler::new(req.params.clone())?;
        self.next_id = self.next_id.max(id + 1);
        self.active.insert(
            id,
            Active {
                sampler,
                max_tokens: req.max_tokens,
                stop_ids: req.stop_ids.clone(),
                prompt_len: req.prompt.len(),
                draft: None,
                generated: 0,
                logprobs: req.logprobs,
                constraint: req.constraint.clone(),
                tx,
            },
        );
        if req.max_tokens == 0 {
            return self.end(id, Some(Finish::Length));
        }
        if self.diffusion.is_some() {
            return self.admit_diffusion(id, req);
        }
        self.sched.admit(Request::new(id, req.prompt));
        Ok(())
    }

    /// Whether `submit` would take `req`: a prompt that is not empty, leaves room in the
    /// context and stays in the vocabulary; sampling parameters in range.
    pub fn check(&self, req: &GenRequest) -> Result<()> {
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
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        if self.diffusion.is_some() && req.logprobs.is_some() {
            return Err(Error::Model(
                "log-probabilities are not available from a diffusion model".into(),
            ));
        }
        if self.diffusion.is_some() && req.constraint.is_some() {
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
        crate::sample::SamplingParams::validate(&req.params)
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
        self.sched.finish(id)?;
        self.drop_diffusion(id)?;
        if let Some(s) = &mut self.spec {
            s.drafter.release(id);
        }
        if let (Some(mut a), Some(finish)) = (self.active.remove(&id), finish) {
            // Whoever is told the request ended finds the engine's state already past it.
            self.publish();
            a.tx.send(Event::Done {
                finish,
                prompt_tokens: a.prompt_len,
                generated: a.generated,
            });
        }
        Ok(())
    }

    pub(super) fn fail(&mut self, id: ReqId, msg: String) -> Result<()> {
        if let Some(a) = self.active.get_mut(&id) {
            a.tx.send(Event::Error(msg));
        }
        self.active.remove(&id);
        self.end(id, None)
    }

    /// Runs one forward pass. Returns false when there is nothing to do.
    pub fn step(&mut self) -> Result<bool> {
        if self.diffusion.is_some() {
            return self.diffusion_step();
        }
        if self.sched.is_idle() {
            return Ok(false);
        }
        self.propose();
        let plan = self.sched.schedule()?;
        self.stats.preemptions += plan.preempted.len() as u64;
        for &(id, hit) in &plan.admitted {
            let len = self.sched.get(id).map_or(0, |s| s.tokens.len());
            self.stats.prefix_queried_tokens += len as u64;
            self.stats.prefix_hit_tokens += hit as u64;
            if let (true, Some(a)) = (hit > 0, self.active.get_mut(&id)) {
                a.tx.send(Event::Cached(hit));
            }
        }
        if plan.items.is_empty() {
            self.unblock()?;
            return Ok(!self.sched.is_idle());
        }
        self.run(&plan)?;
        self.last_step = std::time::Instant::now();
        Ok(true)
    }

    /// Nothing could be scheduled: with nothing running, the queue's head needs more KV than
    /// the whole pool has. It fails alone.
    fn unblock(&mut self) -> Result<()> {
        if self.sched.num_running() > 0 {
            return Ok(());
        }
        let head = self.sched.queued().next().map(|s| s.id);
        if let Some(id) = head {
            let len = self.sched.get(id).map_or(0, |s| s.tokens.len());
            self.fail(
                id,
                format!("{len} tokens need more KV cache blocks than the pool holds"),
            )?;
        }
        Ok(())
    }

    /// Runs a plan's forward pass, samples (or verifies drafts), reports the outcomes to the
    /// scheduler, and streams the tokens.
    fn run(&mut self, plan: &Plan) -> Result<()> {
        self.stats.steps += 1;
        let features = self.features();
        // The grammar masks of the rows about to sample, computed beside the forward pass.
        let mut masks: Vec<(ReqId, Constraint)> = plan
            .items
            .iter()
            .filter(|it| it.sample)
            .filter_map(|it| {
                let c = self.active.get_mut(&it.id)?.constraint.take()?;
                Some((it.id, c))
            })
            .collect();
        let fwd = &self.fwd;
        let (step, spent, waited) = std::thread::scope(|s| {
            let worker = (!masks.is_empty()).then(|| {
                s.spawn(|| {
                    let mut spent = (0u64, Duration::ZERO);
                    for (_, c) in masks.iter_mut() {
                        if let Some(t) = c.prepare() {
                            spent.0 += 1;
                            spent.1 += t;
                        }
                    }
                    spent
                })
            });
            let step = fwd.run(&plan.batch, features.as_ref());
            let t = std::time::Instant::now();
            let spent = worker.map(|w| w.join().unwrap_or_default());
            (step, spent.unwrap_or_default(), t.elapsed())
        });
        if !masks.is_empty() {
            self.stats.masks += spent.0;
            self.stats.mask_us += spent.1.as_micros() as u64;
            self.stats.mask_wait_us += waited.as_micros() as u64;
        }
        for (id, c) in masks {
            if let Some(a) = self.active.get_mut(&id) {
                a.constraint = Some(c);
            }
        }
        let (out, hidden) = match step {
            Ok(out) => out,
            Err(e) => {
                // The step's requests fail (their slots are freed); the engine and the
                // others go on.
                for it in &plan.items {
                    self.fail(it.id, format!("forward pass failed: {e}"))?;
                }
                return Ok(());
            }
        };
        self.stats.tokens_computed += plan.tokens() as u64;
        let mut hidden = hidden.map(Vec::into_iter);
        let mut outcomes = Vec::with_capacity(plan.items.len());
        let mut streams = Vec::with_capacity(plan.items.len());
        let mut failed = Vec::new();
        for (it, mut rows) in plan.items.iter().zip(out) {
            let hid = hidden.as_mut().and_then(Iterator::next).unwrap_or_default();
            let mut outcome = Outcome {
                id: it.id,
                accepted: 0,
                tokens: Vec::new(),
            };
            let mut lps = Vec::new();
            if it.lookahead > 0 {
                let (o, l, hid) = self.verify_drafts(it, rows, hid);
                self.observe(it.id, it.start, hid);
                (outcome, lps) = (o, l);
            } else {
                self.observe(it.id, it.start, hid);
                if let (true, Some(mut logits)) = (it.sample, rows.pop()) {
                    match self.sample(it.id, &mut logits) {
                        Ok((tok, lp)) => {
                            outcome.tokens.push(tok);
                            lps.push(lp);
                        }
                        Err(e) => failed.push((it.id, e.to_string())),
                    }
                }
            }
            streams.push(lps);
            outcomes.push(outcome);
        }
        let copies = self.sched.update(plan, &outcomes)?;
        self.fwd.copy_blocks(&copies)?;
        for (id, msg) in failed {
            self.fail(id, msg)?;
        }
        for (o, lps) in outcomes.into_iter().zip(streams) {
            let len = self.sched.get(o.id).map_or(0, |s| s.tokens.len());
            let first = len.saturating_sub(o.tokens.len());
            for (j, (tok, lp)) in o.tokens.into_iter().zip(lps).enumerate() {
                if !self.active.contains_key(&o.id) {
                    break;
                }
                self.emit(o.id, tok, lp, first + j + 1)?;
            }
        }
        Ok(())
    }

    /// Samples `id`'s next token; with its log-probabilities when the request wants them
    /// (taken from the logits before the sampler changes them).
    /// A grammar's mask applies before the sampler; a grammar that cannot go on is an error
    /// (the request fails).
    fn sample(&mut self, id: ReqId, logits: &mut [f32]) -> Result<(u32, Option<TokenLogprobs>)> {
        let history: &[u32] = self.sched.get(id).map_or(&[], |s| &s.tokens[..]);
        let Some(a) = self.active.get_mut(&id) else {
            return Ok((crate::sample::argmax(logits), None));
        };
        let raw = a.logprobs.map(|n| (logits.to_vec(), n));
        if let Some(c) = a.constraint.as_mut() {
            c.apply(logits)?;
        }
        let tok = a.sampler.sample(logits, history);
        if let Some(c) = a.constraint.as_mut() {
            c.consume(tok)?;
        }
        Ok((tok, raw.map(|(l, n)| TokenLogprobs::of(&l, tok, n))))
    }

    /// Sends a sampled token (after which the request holds `len` tokens) and ends the
    /// request when it is done or its receiver is gone.
    pub(super) fn emit(
        &mut self,
        id: ReqId,
        tok: u32,
        lp: Option<TokenLogprobs>,
        len: usize,
    ) -> Result<()> {
        let ctx = self.fwd.config().ctx;
        let Some(a) = self.active.get_mut(&id) else {
            return self.end(id, None);
        };
        self.stats.generated += 1;
        let finish = if a.stop_ids.contains(&tok) {
            Some(Finish::Stop)
        } else {
            a.generated += 1;
            if !a.tx.send(Event::Token(tok, lp)) {
                self.stats.cancelled += 1;
                self.active.remove(&id);
                return self.end(id, None);
            }
            if a.constraint.as_ref().is_some_and(Constraint::finished) {
                Some(Finish::Stop)
            } else {
                (a.generated >= a.max_tokens || len >= ctx).then_some(Finish::Length)
            }
        };
        match finish {
            Some(f) => self.end(id, Some(f)),
            None => Ok(()),
        }
    }
}
