//! Lossless speculative decoding: a [`Drafter`] proposes a few tokens cheaply, the target
//! scores the pending token and every draft in one forward pass, and [`verify`] keeps the
//! longest prefix the target agrees with plus one token of its own. Greedy, the output is
//! exactly the target's greedy output; sampling, standard rejection sampling (accept a draft
//! with probability min(1, p/q), else draw from the normalised (p − q)⁺) leaves the output
//! distributed exactly as the target's.
//!
//! The engine ([`crate::engine::Engine::with_spec`]) drafts for every decoding
//! request of a step, verifies inside the same continuous batch, and rolls the rejected
//! drafts back ([`crate::sched::Scheduler::update`]).

mod dflash;
mod draft;
mod mtp;
mod ngram;

pub use dflash::DFlashDrafter;
pub use draft::DraftModel;
pub use mtp::Mtp;
pub use ngram::Ngram;

use crate::error::Result;
use crate::model::Features;
use crate::runner::Target;
use crate::sample::{Dist, Sampler, SamplingParams};
use crate::sched::ReqId;

/// One request a drafter drafts for.
pub struct DraftReq<'a> {
    pub id: ReqId,
    /// The request's tokens so far: the prompt, then the output; the last one is the pending
    /// token the target has not computed yet.
    pub tokens: &'a [u32],
    /// Most tokens to draft.
    pub k: usize,
    pub params: &'a SamplingParams,
}

/// A drafter's proposal for one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// The distribution each token was drawn from; `None` for a drafter that proposes
    /// deterministically (all its mass on the token).
    pub q: Option<Vec<Dist>>,
}

/// Proposes tokens that the target is likely to produce next.
pub trait Drafter: Send {
    /// `ngram`, `draft`, …
    fn name(&self) -> &'static str;
    /// One proposal per request (possibly empty), in order; `target` is the runner the
    /// drafts will be verified on (its caches hold every request's computed tokens). An
    /// error turns speculation off for this step only; the requests go on.
    fn propose(&mut self, reqs: &[DraftReq<'_>], target: &Target<'_>) -> Result<Vec<Draft>>;
    /// The request ended: forget what is kept for it.
    fn release(&mut self, _id: ReqId) {}
    /// The hidden states of the target the drafter is fed ([`Drafter::observe`]); `None`:
    /// none.
    fn features(&self) -> Option<Features> {
        None
    }
    /// After a step: the target's hidden states (as [`Drafter::features`] names them) of
    /// `id`'s tokens from position `first` on, one row per token its cache now holds.
    fn observe(&mut self, _id: ReqId, _first: usize, _rows: Vec<Vec<f32>>) {}
}

/// The sampler a drafter draws one request's drafts with: the request's own parameters,
/// its seed mixed with the drafter's `salt` so the drafts' randomness is not the target's.
pub(crate) fn draft_sampler(params: &SamplingParams, salt: u64) -> Result<Sampler> {
    Sampler::new(SamplingParams {
        seed: Some(params.seed.unwrap_or(0) ^ salt),
        ..params.clone()
    })
}

/// The outcome of verifying one request's drafts.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Drafts the target accepted (a prefix).
    pub accepted: usize,
    /// The tokens to append: the accepted drafts, then one from the target (a correction
    /// where a draft was rejected, else the token after the last draft).
    pub tokens: Vec<u32>,
}

/// Verifies `drafts` against the target's distributions: `p[i]` follows the pending token
/// and `drafts[..i]` (so `p` has one more entry than `drafts`); `q[i]` is the distribution
/// `drafts[i]` was drawn from (`None`: all the mass on the draft). Randomness comes from the
/// request's sampler, and none is used where the outcome is certain (greedy, or p ≥ q).
pub fn verify(p: &[Dist], drafts: &[u32], q: Option<&[Dist]>, sampler: &mut Sampler) -> Verdict {
    let k = drafts.len().min(p.len().saturating_sub(1));
    let mut tokens = Vec::with_capacity(k + 1);
    for (i, &d) in drafts.iter().enumerate().take(k) {
        let pi = &p[i];
        let qi = q.and_then(|q| q.get(i));
        let qd = qi.map_or(1.0, |q| q.prob(d)) as f64;
        let pd = pi.prob(d) as f64;
        let accept = if pi.greedy {
            pi.tokens.first() == Some(&d)
        } else if pd <= 0.0 {
            false
        } else if qd <= 0.0 || pd >= qd {
            true
        } else {
            sampler.uniform() < pd / qd
        };
        if accept {
            tokens.push(d);
            continue;
        }
        let fix = if pi.greedy {
            pi.tokens.first().copied().unwrap_or(0)
        } else {
            sampler.draw(&residual(pi, qi, d))
        };
        tokens.push(fix);
        return Verdict {
            accepted: i,
            tokens,
        };
    }
    if let Some(last) = p.get(k) {
        tokens.push(sampler.draw(last));
    }
    Verdict {
        accepted: k,
        tokens,
    }
}

/// The normalised (p − q)⁺ a rejected draft `d` leaves to draw from (`q` `None`: a point
/// mass on `d`); `p` itself should nothing be left (rounding).
fn residual(p: &Dist, q: Option<&Dist>, d: u32) -> Dist {
    let mut tokens = Vec::with_capacity(p.tokens.len());
    let mut probs = Vec::with_capacity(p.tokens.len());
    let mut sum = 0f64;
    for (&t, &pt) in p.tokens.iter().zip(&p.probs) {
        let qt = match q {
            Some(q) => q.prob(t),
            None => (t == d) as u32 as f32,
        };
        let r = (pt - qt).max(0.0);
        if r > 0.0 {
            tokens.push(t);
            probs.push(r);
            sum += r as f64;
        }
    }
    if sum <= 0.0 {
        return p.clone();
    }
    Dist {
        tokens,
        probs: probs.iter().map(|&r| (r as f64 / sum) as f32).collect(),
        greedy: false,
    }
}

#[cfg(test)]
mod tests;
