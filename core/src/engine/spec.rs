//! Speculative decoding inside the continuous-batching engine: before a step, every request
//! that is decoding gets up to `k` drafts (within its `max_tokens` and the context), which
//! the scheduler plans as lookahead slots (as many as the step's token budget and the pools
//! allow); the step scores the pending token and the drafts in one pass (`Logits::All`),
//! [`crate::spec::verify`] keeps the longest verified prefix plus one target token, and the
//! scheduler's update rewinds the rejected drafts (KV slots released, recurrent state
//! restored). Requests with and without drafts share the step.

use super::batching::Engine;
use super::Target;
use crate::error::{Error, Result};
use crate::model::Features;
use crate::sample::TokenLogprobs;
use crate::sched::{Item, Outcome, ReqId};
use crate::spec::{verify, DraftReq, Drafter};

/// The engine's drafter and how far it drafts.
pub(super) struct Spec {
    pub(super) drafter: Box<dyn Drafter>,
    pub(super) k: usize,
    /// Off: steps decode one token at a time (a benchmark's baseline, same engine).
    pub(super) on: bool,
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
}

impl Engine {
    /// Speculative decoding with `drafter`, up to `k` drafts per request per step. The
    /// runner must be able to roll `k` tokens back without recomputing a window
    /// ([`super::RunnerConfig::max_rollback`] ≥ `k`); a block-diffusion model does not
    /// decode token by token and is refused.
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
        self.spec = Some(Spec {
            drafter,
            k,
            on: true,
        });
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
        self.spec.as_ref().map(|s| s.drafter.name())
    }

    /// Before planning: drafts for every running request that is decoding (within its
    /// `max_tokens` and the context), handed to the scheduler as the lookahead it may feed
    /// (it feeds as many as the step's budget and the pools allow). Requests under a grammar
    /// are never drafted for: it decides each token after the one before.
    pub(super) fn propose(&mut self) {
        let Some(spec) = self.spec.as_ref().filter(|s| s.on) else {
            return;
        };
        let ctx = self.fwd.config().ctx;
        let mut ks: Vec<(ReqId, usize)> = Vec::new();
        for r in self.sched.running() {
            let Some(a) = self.active.get(&r.id) else {
                continue;
            };
            if !r.decoding() || a.constraint.is_some() {
                continue;
            }
            // Room for the drafts and the target's token in the output and the context.
            let len = r.tokens.len();
            let k = spec
                .k
                .min(a.max_tokens.saturating_sub(a.generated + 1))
                .min(ctx.saturating_sub(len + 1));
            if k > 0 {
                ks.push((r.id, k));
            }
        }
        if ks.is_empty() {
            return;
        }
        let reqs: Vec<DraftReq> = ks
            .iter()
            .filter_map(|&(id, k)| {
                Some(DraftReq {
                    id,
                    tokens: &self.sched.get(id)?.tokens,
                    k,
                    params: self.active.get(&id)?.sampler.params(),
                })
            })
            .collect();
        let target = Target {
            fwd: &self.fwd,
            kv: self.sched.kv(),
        };
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        let drafts = match spec.drafter.propose(&reqs, &target) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(
                    "{} drafter failed, not drafting this step: {e}",
                    spec.drafter.name()
                );
                return;
            }
        };
        for (&(id, k), mut d) in ks.iter().zip(drafts) {
            d.tokens.truncate(k);
            if let Some(q) = &mut d.q {
                q.truncate(k);
            }
            self.sched.propose(id, d.tokens.clone());
            if let Some(a) = self.active.get_mut(&id) {
                a.draft = (!d.tokens.is_empty()).then_some(d);
            }
        }
    }

    /// The target's hidden states steps should return for the drafter.
    pub(super) fn features(&self) -> Option<Features> {
        self.spec
            .as_ref()
            .filter(|s| s.on)
            .and_then(|s| s.drafter.features())
    }

    /// Hands the drafter the target's hidden states of `id`'s tokens from `first` on.
    pub(super) fn observe(&mut self, id: ReqId, first: usize, rows: Vec<Vec<f32>>) {
        if let (Some(s), false) = (&mut self.spec, rows.is_empty()) {
            s.drafter.observe(id, first, rows);
        }
    }

    /// After the step scored `it`'s pending token and the `it.lookahead` drafts it fed
    /// (`rows`: one logits row each, the pending token's first; `hidden`: the hidden states
    /// beside them, when the drafter wants them): what the target verifies, as the outcome
    /// for the scheduler (which rewinds the rest), each new token's log-probabilities, and
    /// the hidden rows of the tokens that stay.
    pub(super) fn verify_drafts(
        &mut self,
        it: &Item,
        rows: Vec<Vec<f32>>,
        mut hidden: Vec<Vec<f32>>,
    ) -> (Outcome, Vec<Option<TokenLogprobs>>, Vec<Vec<f32>>) {
        let id = it.id;
        let mut history = self
            .sched
            .get(id)
            .map(|s| s.tokens.clone())
            .unwrap_or_default();
        let draft = self.active.get_mut(&id).and_then(|a| a.draft.take());
        let (Some(a), Some(mut draft)) = (self.active.get_mut(&id), draft) else {
            // Not held any more (or no drafts kept): nothing stays of the lookahead.
            return (
                Outcome {
                    id,
                    accepted: 0,
                    tokens: Vec::new(),
                },
                Vec::new(),
                Vec::new(),
            );
        };
        draft.tokens.truncate(it.lookahead);
        if let Some(q) = &mut draft.q {
            q.truncate(it.lookahead);
        }
        let k = draft.tokens.len();
        let mut raws = Vec::new();
        let mut p = Vec::with_capacity(rows.len());
        for (j, mut row) in rows.into_iter().enumerate() {
            if let Some(n) = a.logprobs {
                raws.push((row.clone(), n));
            }
            p.push(a.sampler.distribution(&mut row, &history));
            if let Some(&d) = draft.tokens.get(j) {
                history.push(d);
            }
        }
        let v = verify(&p, &draft.tokens, draft.q.as_deref(), &mut a.sampler);
        let st = &mut self.stats.spec;
        st.verifications += 1;
        st.drafted += k as u64;
        st.accepted += v.accepted as u64;
        if st.accept_lengths.len() <= v.accepted {
            st.accept_lengths.resize(v.accepted + 1, 0);
        }
        st.accept_lengths[v.accepted] += 1;
        // The cache keeps the pending token and the accepted drafts.
        hidden.truncate(v.accepted + 1);
        let lps = (0..v.tokens.len())
            .map(|j| {
                raws.get(j)
                    .map(|(l, n)| TokenLogprobs::of(l, v.tokens[j], *n))
            })
            .collect();
        (
            Outcome {
                id,
                accepted: v.accepted,
                tokens: v.tokens,
            },
            lps,
            hidden,
        )
    }
}
