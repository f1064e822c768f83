//! Continuous batching: which tokens of which requests go into the next forward pass, and
//! where their K/V go.
//!
//! The scheduler owns the [`KvCoordinator`] and is the only code that allocates from it while
//! serving. One request's path, top-down:
//! 1. **admission** ([`Scheduler::admit`]): a [`Request`] record joins the queue;
//! 2. **planning** ([`Scheduler::schedule`]): running requests first (a decode token, plus the
//!    lookahead of its drafts, or the next prefill chunk), oldest first, then queued ones
//!    under the token budget (chunked prefill). A request starting (again) is looked up in
//!    the prefix cache once, here, and takes the cached blocks. Every item's slots are
//!    allocated at once ([`KvCoordinator::allocate_slots`]); when a pool cannot take them,
//!    the item's drafts are dropped, then the newest running request is preempted (its
//!    blocks freed; it goes back to the front of the queue with every token it has, to be
//!    recomputed: vLLM's recompute preemption). The returned [`Plan`] carries the forward
//!    batch (block tables, slot mappings, state slots) and is never rewritten;
//! 3. **forward**: the engine runs the plan's batch ([`crate::runner::Forward::run`]), which
//!    holds nothing per request;
//! 4. **update** ([`Scheduler::update`]): each item's fed tokens are committed; rejected
//!    drafts are rewound (a recurrent state that has to go back further drops the request's
//!    computed count, so the next plan feeds those tokens again); sampled tokens are
//!    appended. [`Scheduler::finish`] ends a request and frees its blocks.
//!
//! `core/src/engine/toy_tests.rs` walks requests through this on a toy model.

pub mod kv;

use std::collections::{HashMap, VecDeque};

use crate::error::Result;
use crate::model::ForwardBatch;
pub use kv::{BlockCopy, KvCoordinator, Logits};

/// A request's id (also its KV sequence id).
pub type ReqId = u64;

/// Limits of one step.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Most requests resident in the KV cache at once.
    pub max_running: usize,
    /// The context length: no request grows past it.
    pub max_len: usize,
    /// With `Some(block_size)`, a prefill chunk that would run past the last full block before
    /// the prompt's end stops there, so the step ends on a block boundary (a recurrent model's
    /// state after it can be kept as a prefix-cache snapshot); the rest follows as a chunk of
    /// its own.
    pub snapshot_blocks: Option<usize>,
    /// A block-diffusion model's canvas length (0: the model has no canvases).
    pub canvas: usize,
}

/// Why a request ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token, or the sampler's grammar completed.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

/// How a request's steps run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Token by token in the scheduler's plans (prefill chunks, decodes, verifications).
    Generate,
    /// A block-diffusion request: its tokens (prompt, then committed canvases) are fed as
    /// prefill chunks; once all are in the cache, each step denoises its canvas (a
    /// [`StepKind::Denoise`] item of [`SchedConfig::canvas`] rows, in the same pass as the
    /// other requests' items); a canvas the engine commits comes back as its tokens, fed next.
    Denoise,
    /// An embedding: its tokens fed as prefill chunks under the same budget and pools as any
    /// other request's (never from the prefix cache: every token's hidden state is read), and
    /// it ends when the last is in.
    Embed,
}

/// One request, the one record of it: its tokens so far (prompt, then generated), how many
/// of them are in the KV cache, the drafts proposed for its next step, its limits and stop
/// tokens, and what it asked for with each token. The engine keeps only its sampler and the
/// sink its events go to.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: ReqId,
    pub tokens: Vec<u32>,
    /// Tokens of the prompt (the first ones of `tokens`).
    pub prompt_len: usize,
    /// Tokens whose K/V are computed (0 after a preemption).
    pub computed: usize,
    /// Times this request was preempted.
    pub preemptions: u32,
    /// Tokens a drafter proposed after the last one: the next plan feeds them as lookahead
    /// when the budget and the pools allow (replaced at each proposal, cleared by `update`).
    pub draft: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end the generation (not sent).
    pub stop_ids: Vec<u32>,
    /// With `Some(n)`, each token goes out with its log-probability and the `n` most likely
    /// alternatives.
    pub logprobs: Option<usize>,
    /// Tokens generated and sent (a stop token is not one).
    pub generated: usize,
    pub kind: Kind,
    /// The prompt's images: the positions of each one's soft tokens and its digest, in
    /// order. A prefill chunk never ends inside one (its tokens see each other both ways in
    /// some models), and the prefix cache keys their blocks by them.
    pub images: Vec<crate::kv::ContentSpan>,
}

impl Request {
    /// A request with no limit but the context, and no stop tokens.
    pub fn new(id: ReqId, prompt: Vec<u32>) -> Request {
        Request {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            preemptions: 0,
            draft: Vec::new(),
            max_tokens: usize::MAX,
            stop_ids: Vec::new(),
            logprobs: None,
            generated: 0,
            kind: Kind::Generate,
            images: Vec::new(),
        }
    }
    /// Tokens it may still generate after the next one.
    pub fn room(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated + 1)
    }
    /// Tokens still to feed before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }
    /// Whether the next step only decodes: every token but the last is computed.
    pub fn decoding(&self) -> bool {
        self.pending() == 1
    }
}

/// What one item of a plan does.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// A chunk of tokens to compute (a prompt, or tokens to recompute after a preemption or
    /// a rewind); the last chunk samples.
    Prefill,
    /// One token in, one sampled.
    Decode,
    /// The pending token and `k` drafts in, the target's verdict on them out.
    Verify { k: usize },
    /// A block-diffusion request's canvas of `canvas` positions, denoised once: its logits
    /// out, nothing committed (its K/V are scratch in the slots the canvas will be committed
    /// to).
    Denoise { canvas: usize },
}

/// One request's share of a step: `tokens[start..end]` of it, then `lookahead` of its drafts,
/// and whether the step gives the logits for its next token (with drafts, one row for each
/// token fed); or, for a block-diffusion request, a canvas of `canvas` rows after its
/// `start` tokens (`end == start`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Item {
    pub id: ReqId,
    pub start: usize,
    pub end: usize,
    pub sample: bool,
    pub lookahead: usize,
    pub canvas: usize,
}

impl Item {
    /// The logits rows this item's step wants.
    pub fn logits(&self) -> Logits {
        match (self.lookahead > 0 || self.canvas > 0, self.sample) {
            (true, _) => Logits::All,
            (false, true) => Logits::Last,
            (false, false) => Logits::None,
        }
    }
    pub fn kind(&self) -> StepKind {
        match (self.lookahead, self.sample && self.end - self.start == 1) {
            _ if self.canvas > 0 => StepKind::Denoise {
                canvas: self.canvas,
            },
            (k, _) if k > 0 => StepKind::Verify { k },
            (_, true) => StepKind::Decode,
            _ => StepKind::Prefill,
        }
    }
    /// Rows fed.
    pub fn len(&self) -> usize {
        self.end - self.start + self.lookahead + self.canvas
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A step's plan: what to feed, and the forward batch that feeds it. Canvas items come last
/// (the batch's last sequences are its canvases).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub items: Vec<Item>,
    /// Requests preempted while planning (their blocks are already free).
    pub preempted: Vec<ReqId>,
    /// Requests that started (or restarted after a preemption) this step, with the prompt
    /// tokens the prefix cache gave them.
    pub admitted: Vec<(ReqId, usize)>,
    /// Block tables, slot mappings, state slots, positions and logits rows of `items`.
    pub batch: ForwardBatch,
}

impl Plan {
    pub fn tokens(&self) -> usize {
        self.items.iter().map(Item::len).sum()
    }
    /// The canvas items (the last ones).
    pub fn canvases(&self) -> usize {
        self.items.iter().filter(|it| it.canvas > 0).count()
    }
}

/// What a step produced for one item, for [`Scheduler::update`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub id: ReqId,
    /// Drafts the target accepted (a prefix of the item's lookahead).
    pub accepted: usize,
    /// Tokens to append: the accepted drafts and the sampled token (empty when the item did
    /// not sample, or sampling failed).
    pub tokens: Vec<u32>,
    /// The sampler ends the request after its last token (its grammar is complete).
    pub done: bool,
}

/// What [`Scheduler::update`] decided for one outcome: how many of its tokens go out (a
/// stop token does not), how many were sampled, and whether the request ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emit {
    pub id: ReqId,
    pub send: usize,
    pub sampled: usize,
    pub finish: Option<Finish>,
}

/// What [`Scheduler::update`] returns: the block copies its rewinds need on the device
/// before the next pass, and per outcome what goes out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Updated {
    pub copies: Vec<BlockCopy>,
    pub emits: Vec<Emit>,
}

/// Whether an entry waits in the queue.
fn queued(e: &Entry) -> bool {
    !e.resident
}

/// The queue, the running set and the KV coordinator. Every lookup by id is a hash lookup; a
/// request that ends while queued leaves its place in the queue to be skipped when it comes
/// up (the queue is compacted when such places outnumber the live ones), so no operation
/// scans the queue.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    kv: KvCoordinator,
    /// Every request held, queued or resident.
    seqs: HashMap<ReqId, Entry>,
    /// Queue order. An id whose request is no longer queued is a stale place.
    waiting: VecDeque<ReqId>,
    /// Live places in `waiting`.
    n_waiting: usize,
    /// Resident requests, oldest first (at most `max_running`).
    running: Vec<ReqId>,
}

#[derive(Debug)]
struct Entry {
    seq: Request,
    /// In the KV cache and in `running`.
    resident: bool,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, kv: KvCoordinator) -> Scheduler {
        Scheduler {
            cfg: SchedConfig {
                max_batch_tokens: cfg.max_batch_tokens.max(1),
                max_running: cfg.max_running.max(1),
                max_len: cfg.max_len.max(1),
                snapshot_blocks: cfg.snapshot_blocks.filter(|&b| b > 0),
                canvas: cfg.canvas,
            },
            kv,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            n_waiting: 0,
            running: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// The KV coordinator (to read; only the scheduler allocates from it).
    pub fn kv(&self) -> &KvCoordinator {
        &self.kv
    }

    /// Queues a new request (it needs at least one token). An id already held is ignored.
    pub fn admit(&mut self, seq: Request) {
        let id = seq.id;
        if self.seqs.contains_key(&id) {
            return;
        }
        self.seqs.insert(
            id,
            Entry {
                seq,
                resident: false,
            },
        );
        self.waiting.push_back(id);
        self.n_waiting += 1;
    }

    pub fn waiting(&self) -> usize {
        self.n_waiting
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    /// Resident requests, oldest first.
    pub fn running(&self) -> impl Iterator<Item = &Request> {
        self.running.iter().filter_map(|id| self.get(*id))
    }
    /// Queued requests, next first.
    pub fn queued(&self) -> impl Iterator<Item = &Request> {
        self.waiting
            .iter()
            .filter_map(|id| self.seqs.get(id).filter(|e| queued(e)))
            .map(|e| &e.seq)
    }
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }
    /// A resident or queued request.
    pub fn get(&self, id: ReqId) -> Option<&Request> {
        self.seqs.get(&id).map(|e| &e.seq)
    }

    /// Drafts for `id`'s next step (replacing any earlier ones); ignored unless it is
    /// resident and decoding.
    pub fn propose(&mut self, id: ReqId, draft: Vec<u32>) {
        if let Some(e) = self.seqs.get_mut(&id).filter(|e| e.resident) {
            if e.seq.decoding() {
                e.seq.draft = draft;
            }
        }
    }

    /// The next queued request, dropping the stale places before it.
    fn head(&mut self) -> Option<ReqId> {
        while let Some(&id) = self.waiting.front() {
            if self.seqs.get(&id).is_some_and(queued) {
                return Some(id);
            }
            self.waiting.pop_front();
        }
        None
    }

    /// How many of `n` tokens from `start` (of `len`) one step takes: all of them, or with
    /// `snapshot_blocks` those up to the last block boundary before `len` when they cross it;
    /// then never ending inside an image of `images`: the chunk stops before the image, or
    /// when it starts inside it, takes it to its end (past the budget if need be).
    fn chunk(
        &self,
        start: usize,
        n: usize,
        len: usize,
        images: &[crate::kv::ContentSpan],
    ) -> usize {
        let n = self.chunk_blocks(start, n, len);
        let end = start + n;
        match images
            .iter()
            .find(|im| im.start < end && end < im.start + im.len)
        {
            Some(im) if im.start > start => im.start - start,
            Some(im) => (im.start + im.len).min(len) - start,
            None => n,
        }
    }

    fn chunk_blocks(&self, start: usize, n: usize, len: usize) -> usize {
        match self.cfg.snapshot_blocks {
            Some(bs) => {
                let boundary = (len.saturating_sub(1) / bs) * bs;
                if start < boundary && start + n > boundary {
                    boundary - start
                } else {
                    n
                }
            }
            None => n,
        }
    }

    /// Plans the next step: decodes (with their drafts), then prefill chunks, allocating every
    /// item's slots and preempting when a pool is short; the plan's batch is built last.
    pub fn schedule(&mut self) -> Result<Plan> {
        let mut plan = Plan::default();
        let mut budget = self.cfg.max_batch_tokens;
        self.schedule_running(&mut plan, &mut budget)?;
        self.schedule_waiting(&mut plan, &mut budget)?;
        // Canvases last, in the order planned (the pass's last sequences).
        plan.items.sort_by_key(|it| it.canvas > 0);
        let inputs: Vec<(ReqId, Vec<u32>, Logits)> = plan
            .items
            .iter()
            .filter_map(|it| {
                let s = self.get(it.id)?;
                let mut toks = s.tokens[it.start..it.end].to_vec();
                toks.extend_from_slice(&s.draft[..it.lookahead]);
                // A canvas's ids live on the device; the batch holds placeholders.
                toks.resize(toks.len() + it.canvas, 0);
                Some((it.id, toks, it.logits()))
            })
            .collect();
        let refs: Vec<(ReqId, &[u32], Logits)> =
            inputs.iter().map(|(id, t, w)| (*id, &t[..], *w)).collect();
        plan.batch = self.kv.batch(&refs);
        Ok(plan)
    }

    /// Running requests, oldest first: a decode token (and as many of its drafts as fit), the
    /// next prefill chunk, or a block-diffusion request's canvas each. A request whose slots
    /// the pools cannot take drops its drafts, then preempts the newest running request
    /// (possibly itself).
    fn schedule_running(&mut self, plan: &mut Plan, budget: &mut usize) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let Some(s) = self.get(id) else {
                self.running.remove(i);
                continue;
            };
            let (computed, pending, len) = (s.computed, s.pending(), s.tokens.len());
            let (denoise, generate) = (s.kind == Kind::Denoise, s.kind == Kind::Generate);
            // A diffusion request with everything fed denoises its canvas (whole, or not
            // this step).
            let canvas = match denoise && pending == 0 {
                true if self.cfg.canvas <= *budget => self.cfg.canvas,
                true => {
                    i += 1;
                    continue;
                }
                false => 0,
            };
            let n = self.chunk(computed, pending.min(*budget), len, &s.images);
            if n == 0 && canvas == 0 {
                i += 1;
                continue;
            }
            let mut k = match s.decoding() && generate {
                true => s.draft.len().min(budget.saturating_sub(n)),
                false => canvas,
            };
            let fits = loop {
                if self.kv.allocate_slots(id, n, k)? {
                    break true;
                }
                if k > 0 && canvas == 0 {
                    k = 0;
                    continue;
                }
                // Out of blocks: preempt the newest running request, then retry this one.
                let newest_is_this = i + 1 == self.running.len();
                let Some(victim) = self.preempt_newest()? else {
                    break false;
                };
                if let Some(p) = plan.items.iter().position(|it| it.id == victim) {
                    *budget += plan.items.remove(p).len();
                }
                plan.preempted.push(victim);
                if newest_is_this {
                    break false;
                }
            };
            if !fits {
                break;
            }
            *budget = budget.saturating_sub(n + k);
            plan.items.push(Item {
                id,
                start: computed,
                end: computed + n,
                sample: computed + n == len && generate,
                lookahead: k - canvas,
                canvas,
            });
            i += 1;
        }
        Ok(())
    }

    /// Waiting requests in order, while the budget, the pools and the running limit allow.
    /// A request starting afresh takes its prompt's cached blocks first (the one prefix
    /// lookup it gets); should the rest not fit, it lets them go again and waits.
    fn schedule_waiting(&mut self, plan: &mut Plan, budget: &mut usize) -> Result<()> {
        while *budget > 0 && self.running.len() < self.cfg.max_running {
            let Some(id) = self.head() else {
                break;
            };
            // A request preempted while planning this step waits for the next one.
            if plan.preempted.contains(&id) {
                break;
            }
            let Some(s) = self.seqs.get(&id).map(|e| &e.seq) else {
                break;
            };
            let len = s.tokens.len();
            let fresh = s.computed == 0 && !self.kv.contains(id);
            let hit = match fresh && s.kind != Kind::Embed {
                true => self
                    .kv
                    .attach_prefix(id, &s.tokens, &s.images, len.saturating_sub(1))?,
                false => 0,
            };
            let start = s.computed.max(hit);
            let n = self.chunk(start, (len - start).min(*budget), len, &s.images);
            if n == 0 || !self.kv.allocate_slots(id, n, 0)? {
                if fresh {
                    self.kv.free(id)?;
                }
                break;
            }
            *budget = budget.saturating_sub(n);
            plan.items.push(Item {
                id,
                start,
                end: start + n,
                sample: start + n == len && s.kind == Kind::Generate,
                ..Item::default()
            });
            if fresh {
                plan.admitted.push((id, hit));
            }
            self.waiting.pop_front();
            self.n_waiting -= 1;
            if let Some(e) = self.seqs.get_mut(&id) {
                e.resident = true;
                e.seq.computed = start;
            }
            self.running.push(id);
        }
        Ok(())
    }

    /// Takes the newest running request back to the front of the queue, to be recomputed
    /// from scratch; its blocks are freed.
    fn preempt_newest(&mut self) -> Result<Option<ReqId>> {
        let Some(id) = self.running.pop() else {
            return Ok(None);
        };
        if let Some(e) = self.seqs.get_mut(&id) {
            e.seq.computed = 0;
            e.seq.preemptions += 1;
            e.seq.draft.clear();
            e.resident = false;
        }
        self.waiting.push_front(id);
        self.n_waiting += 1;
        self.kv.free(id)?;
        Ok(Some(id))
    }

    /// After the plan's forward pass: each item's fed tokens are committed, rejected drafts
    /// rewound, and its new tokens appended and checked against its stop tokens, its
    /// `max_tokens` and the context (the engine ends the requests whose [`Emit`] says so). An
    /// outcome for a request no longer held is skipped.
    pub fn update(&mut self, plan: &Plan, outcomes: &[Outcome]) -> Result<Updated> {
        let mut up = Updated::default();
        let copies = &mut up.copies;
        let max_len = self.cfg.max_len;
        for (it, out) in plan.items.iter().zip(outcomes) {
            let Some(e) = self.seqs.get_mut(&it.id).filter(|e| e.resident) else {
                continue;
            };
            let s = &mut e.seq;
            let mut fed = s.tokens[it.start..it.end].to_vec();
            fed.extend_from_slice(&s.draft[..it.lookahead.min(s.draft.len())]);
            // A canvas commits nothing: its slots stay allocated for the next step.
            if !fed.is_empty() {
                self.kv.commit(it.id, &fed)?;
            }
            let accepted = out.accepted.min(it.lookahead);
            s.computed = it.end + accepted;
            if accepted < it.lookahead {
                let r = self.kv.rewind(it.id, it.lookahead - accepted)?;
                // A recurrent state may resume further back: those tokens are fed again.
                s.computed = r.from;
                copies.extend(r.copies);
            }
            s.draft.clear();
            if s.kind == Kind::Embed && s.computed == s.tokens.len() {
                up.emits.push(Emit {
                    id: it.id,
                    send: 0,
                    sampled: 0,
                    finish: Some(Finish::Stop),
                });
            }
            if out.tokens.is_empty() {
                continue;
            }
            let base = s.tokens.len();
            s.tokens.extend_from_slice(&out.tokens);
            let mut emit = Emit {
                id: it.id,
                send: 0,
                sampled: 0,
                finish: None,
            };
            for (j, t) in out.tokens.iter().enumerate() {
                emit.sampled += 1;
                if s.stop_ids.contains(t) {
                    emit.finish = Some(Finish::Stop);
                    break;
                }
                emit.send += 1;
                s.generated += 1;
                // A canvas fits the context whole (its tokens are checked together below).
                let full = base + j + 1 >= max_len && s.kind == Kind::Generate;
                if out.done && j + 1 == out.tokens.len() {
                    emit.finish = Some(Finish::Stop);
                } else if s.generated >= s.max_tokens || full {
                    emit.finish = Some(Finish::Length);
                }
                if emit.finish.is_some() {
                    break;
                }
            }
            // A diffusion request goes on only while another canvas fits after this one.
            let c = self.cfg.canvas;
            if s.kind == Kind::Denoise && emit.finish.is_none() && s.tokens.len() + c > max_len {
                emit.finish = Some(Finish::Length);
            }
            up.emits.push(emit);
        }
        Ok(up)
    }

    /// Removes a finished or cancelled request (running or queued) and frees its blocks; true
    /// if it was resident. A queued one leaves a stale place behind.
    pub fn finish(&mut self, id: ReqId) -> Result<bool> {
        let Some(e) = self.seqs.remove(&id) else {
            return Ok(false);
        };
        if e.resident {
            // At most `max_running` ids.
            self.running.retain(|&r| r != id);
            self.kv.free(id)?;
            return Ok(true);
        }
        self.n_waiting -= 1;
        // Stale places are dropped as they reach the front; should they pile up behind a
        // head that cannot start, the queue is rebuilt (amortized O(1) per request).
        if self.waiting.len() > 2 * self.n_waiting + 64 {
            let seqs = &self.seqs;
            self.waiting.retain(|id| seqs.get(id).is_some_and(queued));
        }
        Ok(false)
    }

    /// Places in the queue, stale ones included (for tests of the compaction).
    #[cfg(test)]
    fn queue_places(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests;
