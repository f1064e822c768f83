//! Speculative decoding inside the continuous-batching engine: before a step, every request
//! that is decoding gets up to `k` drafts (within its `max_tokens` and the context), which
//! the scheduler plans as lookahead slots (as many as the step's token budget and the pools
//! allow); the step scores the pending token and the drafts in one pass (`Logits::All`),
//! [`crate::spec::verify`] keeps the longest verified prefix plus one target token, and the
//! scheduler's update rewinds the rejected drafts (KV slots released, recurrent state
//! restored). Requests with and without drafts share the step.
//!
//! This is a part the engine holds; it sees the scheduler and the target model, never the
//! engine.

use crate::model::Features;
use crate::runner::{Forward, Target};
use crate::sample::{Sampler, SamplingParams, TokenLogprobs};
use crate::sched::{Item, Outcome, ReqId, Request, Scheduler};
use crate::spec::{verify, Draft, DraftReq, Drafter};

/// The engine's drafter and how far it drafts.
pub struct Spec {
    drafter: Box<dyn Drafter>,
    k: usize,
    /// Off: steps decode one token at a time (a benchmark's baseline, same engine).
    pub on: bool,
}

/// Speculation's counters, part of [`super::batching::EngineStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verifications: one per request per step that carried drafts.
    pub verifications: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// `accept_lengths[a]`: verifications that accepted `a` drafts.
    pub accept_lengths: Vec<u64>,
}

impl SpecStats {
    /// Accepted drafts per drafted one.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
    /// Tokens each verifying pass produced on average (accepted drafts plus the target's).
    pub fn tokens_per_verification(&self) -> f64 {
        (self.accepted + self.verifications) as f64 / self.verifications.max(1) as f64
    }
    /// Counts one verification of `drafted` drafts, `accepted` of them kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.verifications += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        if self.accept_lengths.len() <= accepted {
            self.accept_lengths.resize(accepted + 1, 0);
        }
        self.accept_lengths[accepted] += 1;
    }
}

/// What the engine knows of a request that a drafter needs: the most drafts its output and
/// the context leave room for, and its sampling parameters; `None`: not drafted for (a
/// grammar decides each token after the one before).
pub type Room<'a> = Option<(usize, &'a SamplingParams)>;

/// One verification's result for the scheduler and the stream: the outcome, each new token's
/// log-probabilities, the hidden rows of the tokens that stay, and the drafts verified.
pub type Verified = (Outcome, Vec<Option<TokenLogprobs>>, Vec<Vec<f32>>, usize);

impl Spec {
    pub fn new(drafter: Box<dyn Drafter>, k: usize) -> Spec {
        Spec {
            drafter,
            k,
            on: true,
        }
    }

    pub fn name(&self) -> &'static str {
        self.drafter.name()
    }

    /// Drafts for every running request that is decoding and that `room` allows, handed to
    /// the scheduler as lookahead; returned (with their distributions) for verification.
    pub fn propose<'a>(
        &mut self,
        sched: &mut Scheduler,
        fwd: &Forward,
        room: impl Fn(&Request) -> Room<'a>,
    ) -> Vec<(ReqId, Draft)> {
        if !self.on {
            return Vec::new();
        }
        let ctx = fwd.config().ctx;
        let mut ks: Vec<(ReqId, usize)> = Vec::new();
        let mut reqs: Vec<DraftReq> = Vec::new();
        for r in sched.running().filter(|r| r.decoding()) {
            let Some((left, params)) = room(r) else {
                continue;
            };
            let len = r.tokens.len();
            let k = self.k.min(left).min(ctx.saturating_sub(len + 1));
            if k > 0 {
                ks.push((r.id, k));
                reqs.push(DraftReq {
                    id: r.id,
                    tokens: &r.tokens,
                    k,
                    params,
                });
            }
        }
        if ks.is_empty() {
            return Vec::new();
        }
        let target = Target {
            fwd,
            kv: sched.kv(),
        };
        let drafts = match self.drafter.propose(&reqs, &target) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(
                    "{} drafter failed, not drafting this step: {e}",
                    self.drafter.name()
                );
                return Vec::new();
            }
        };
        drop(reqs);
        let mut out = Vec::with_capacity(ks.len());
        for (&(id, k), mut d) in ks.iter().zip(drafts) {
            d.tokens.truncate(k);
            if let Some(q) = &mut d.q {
                q.truncate(k);
            }
            sched.propose(id, d.tokens.clone());
            if !d.tokens.is_empty() {
                out.push((id, d));
            }
        }
        out
    }

    /// The target's hidden states steps should return for the drafter.
    pub fn features(&self) -> Option<Features> {
        self.on.then(|| self.drafter.features()).flatten()
    }

    /// The hidden states the drafter reads when it is on.
    pub fn reads(&self) -> Option<Features> {
        self.drafter.features()
    }

    /// Hands the drafter the target's hidden states of `id`'s tokens from `first` on.
    pub fn observe(&mut self, id: ReqId, first: usize, rows: Vec<Vec<f32>>) {
        if !rows.is_empty() {
            self.drafter.observe(id, first, rows);
        }
    }

    /// The request ended: the drafter forgets it.
    pub fn release(&mut self, id: ReqId) {
        self.drafter.release(id);
    }
}

/// After a step scored `it`'s pending token and the `it.lookahead` drafts it fed (`rows`: one
/// logits row each, the pending token's first; `hidden`: the hidden states beside them, when
/// the drafter wants them; `history`: the request's tokens before the drafts): what the target
/// verifies with `sampler`, with `logprobs` alternatives per token when asked for.
#[allow(clippy::too_many_arguments)]
pub fn verify_item(
    it: &Item,
    rows: Vec<Vec<f32>>,
    mut hidden: Vec<Vec<f32>>,
    mut history: Vec<u32>,
    sampler: &mut Sampler,
    logprobs: Option<usize>,
    mut draft: Draft,
) -> Verified {
    draft.tokens.truncate(it.lookahead);
    if let Some(q) = &mut draft.q {
        q.truncate(it.lookahead);
    }
    let k = draft.tokens.len();
    let mut raws = Vec::new();
    let mut p = Vec::with_capacity(rows.len());
    for (j, mut row) in rows.into_iter().enumerate() {
        if let Some(n) = logprobs {
            raws.push((row.clone(), n));
        }
        p.push(sampler.distribution(&mut row, &history));
        if let Some(&d) = draft.tokens.get(j) {
            history.push(d);
        }
    }
    let v = verify(&p, &draft.tokens, draft.q.as_deref(), sampler);
    // The cache keeps the pending token and the accepted drafts.
    hidden.truncate(v.accepted + 1);
    let lps = (v.tokens.iter().enumerate())
        .map(|(j, &t)| raws.get(j).map(|(l, n)| TokenLogprobs::of(l, t, *n)))
        .collect();
    (
        Outcome {
            id: it.id,
            accepted: v.accepted,
            tokens: v.tokens,
            done: false,
        },
        lps,
        hidden,
        k,
    )
}
