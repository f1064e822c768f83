//! Speculative decoding inside the continuous-batching engine: before a step, every request
//! that is decoding gets up to `k` drafts (within the step's token and KV budget, the
//! request's `max_tokens` and the context); the step scores the pending token and the drafts
//! in one pass (`Logits::All`), [`crate::spec::verify`] keeps the longest verified prefix plus
//! one target token, and the runner rolls the rejected drafts back (KV slots released,
//! recurrent state restored). Requests with and without drafts share the step.

use super::batching::Engine;
use super::Logits;
use crate::error::{Error, Result};
use crate::model::Features;
use crate::sample::TokenLogprobs;
use crate::sched::{Item, KvBudget, ReqId};
use crate::spec::{verify, Draft, DraftReq, Drafter};

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
        let margin = self.runner.config().max_rollback;
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

    /// Drafts for the plan's decoding items (aligned with `items`; `None`: a plain step).
    pub(super) fn drafts(&mut self, items: &[Item]) -> Vec<Option<Draft>> {
        let mut out: Vec<Option<Draft>> = items.iter().map(|_| None).collect();
        let Some(spec) = self.spec.as_ref().filter(|s| s.on) else {
            return out;
        };
        let cfg = self.runner.config();
        let ctx = cfg.ctx;
        let mut spare_tokens = cfg
            .max_batch_tokens
            .saturating_sub(items.iter().map(|i| i.end - i.start).sum());
        let budget = super::batching::RunnerBudget(&self.runner);
        let mut spare_blocks = budget.free_blocks().saturating_sub(
            items
                .iter()
                .map(|i| budget.blocks_needed(i.id, i.end))
                .sum(),
        );
        let mut ks: Vec<(usize, usize)> = Vec::new();
        for (n, it) in items.iter().enumerate() {
            let (Some(seq), Some(a)) = (self.sched.get(it.id), self.active.get(&it.id)) else {
                continue;
            };
            let len = seq.tokens.len();
            // A grammar decides each token after the one before: nothing to draft.
            if !(it.sample && it.end == len && it.end - it.start == 1) || a.constraint.is_some() {
                continue;
            }
            // Room for the drafts and the target's token: output, context and step budget.
            let mut k = spec
                .k
                .min(a.max_tokens.saturating_sub(a.generated + 1))
                .min(ctx.saturating_sub(len + 1))
                .min(spare_tokens);
            let extra = |k: usize| {
                budget
                    .blocks_needed(it.id, it.end + k)
                    .saturating_sub(budget.blocks_needed(it.id, it.end))
            };
            while k > 0 && extra(k) > spare_blocks {
                k -= 1;
            }
            if k == 0 {
                continue;
            }
            spare_tokens -= k;
            spare_blocks -= extra(k);
            ks.push((n, k));
        }
        if ks.is_empty() {
            return out;
        }
        let reqs: Vec<DraftReq> = ks
            .iter()
            .filter_map(|&(n, k)| {
                let id = items[n].id;
                Some(DraftReq {
                    id,
                    tokens: &self.sched.get(id)?.tokens,
                    k,
                    params: self.active.get(&id)?.sampler.params(),
                })
            })
            .collect();
        let spec = self.spec.as_mut().expect("checked above");
        match spec.drafter.propose(&reqs, &self.runner) {
            Ok(drafts) => {
                for (&(n, k), mut d) in ks.iter().zip(drafts) {
                    d.tokens.truncate(k);
                    if let Some(q) = &mut d.q {
                        q.truncate(k);
                    }
                    if !d.tokens.is_empty() {
                        out[n] = Some(d);
                    }
                }
            }
            Err(e) => tracing::warn!(
                "{} drafter failed, not drafting this step: {e}",
                spec.drafter.name()
            ),
        }
        out
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

    /// After the step scored `item`'s pending token and `draft` (`rows`: one logits row each,
    /// the pending token's first; `hidden`: the hidden states beside them, when the drafter
    /// wants them): keeps what the target verifies, rolls the rest back, and streams the
    /// tokens.
    pub(super) fn accept(
        &mut self,
        it: &Item,
        rows: Vec<Vec<f32>>,
        mut hidden: Vec<Vec<f32>>,
        draft: Draft,
    ) -> Result<()> {
        let id = it.id;
        let k = draft.tokens.len();
        let mut history = self
            .sched
            .get(id)
            .map(|s| s.tokens.clone())
            .unwrap_or_default();
        let Some(a) = self.active.get_mut(&id) else {
            return self.end(id, None);
        };
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
        if v.accepted < k {
            if let Err(e) = self.runner.rollback(id, k - v.accepted) {
                return self.fail(id, format!("rolling back rejected drafts failed: {e}"));
            }
        }
        // The cache now ends at the last accepted draft.
        hidden.truncate(v.accepted + 1);
        self.observe(id, it.start, hidden);
        self.sched.advance(id, it.end + v.accepted, None);
        for (j, tok) in v.tokens.into_iter().enumerate() {
            if !self.active.contains_key(&id) {
                break;
            }
            self.sched.advance(id, it.end + v.accepted, Some(tok));
            let lp = raws.get(j).map(|(l, n)| TokenLogprobs::of(l, tok, *n));
            self.emit(id, tok, lp)?;
        }
        Ok(())
    }
}

/// Logits rows a step wants of an item with drafts: every fed token's.
pub(super) fn want(draft: Option<&Draft>, sample: bool) -> Logits {
    match (draft, sample) {
        (Some(_), _) => Logits::All,
        (None, true) => Logits::Last,
        (None, false) => Logits::None,
    }
}
