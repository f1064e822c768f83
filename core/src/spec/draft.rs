//! A smaller model sharing the target's vocabulary drafts autoregressively, in its own
//! runner (its own paged KV cache, on the same backend). Each step rolls back what the
//! target rejected and drafts `k` tokens in `k` batched forward passes (the first also feeds
//! what the target accepted since the last step), drawing them with the request's own sampling parameters so
//! that rejection sampling sees the distribution each draft came from.

use std::collections::HashMap;

use super::{Draft, DraftReq, Drafter};
use crate::error::{Error, Result};
use crate::runner::{Logits, Runner, Target};
use crate::sample::Sampler;
use crate::sched::ReqId;

pub struct DraftModel {
    runner: Runner,
    samplers: HashMap<ReqId, Sampler>,
}

impl DraftModel {
    /// Drafts with `runner`'s model; fails when its vocabulary is not `target_vocab`.
    pub fn new(runner: Runner, target_vocab: usize) -> Result<DraftModel> {
        let v = runner.model().info().vocab;
        if v != target_vocab {
            return Err(Error::Model(format!(
                "the draft model's vocabulary has {v} tokens, the target's {target_vocab}: \
                 a draft model must share the target's tokenizer"
            )));
        }
        Ok(DraftModel {
            runner,
            samplers: HashMap::new(),
        })
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Rolls the draft sequence `id` back to the longest prefix of `tokens` it holds
    /// computed, and returns what is still to feed of `tokens` (never empty: `tokens` ends
    /// with the pending token). `None` when the context is too short; the sequence is then
    /// dropped.
    fn catch_up(&mut self, id: ReqId, tokens: &[u32]) -> Result<Option<Vec<u32>>> {
        if tokens.len() > self.runner.config().ctx {
            self.runner.release(id)?;
            return Ok(None);
        }
        let have = self.runner.computed_tokens(id);
        // The pending token is always fed: it is the first draft pass's input.
        let common = have
            .iter()
            .zip(&tokens[..tokens.len() - 1])
            .take_while(|(a, b)| a == b)
            .count();
        let extra = have.len() - common;
        if extra > 0 && self.runner.rollback(id, extra).is_err() {
            // Too far back for a sliding window or a recurrent state: start again.
            self.runner.release(id)?;
        }
        let at = self.runner.seq_len(id);
        Ok(Some(tokens[at..].to_vec()))
    }
}

impl Drafter for DraftModel {
    fn name(&self) -> &'static str {
        "draft"
    }

    fn propose(&mut self, reqs: &[DraftReq<'_>], _target: &Target<'_>) -> Result<Vec<Draft>> {
        let mut out: Vec<Draft> = reqs.iter().map(|_| Draft::default()).collect();
        // The first pass feeds each request what the draft cache lacks (what the target
        // accepted since, and the pending token) and drafts the first token; the later
        // passes feed one drafted token each.
        let mut first: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if r.tokens.is_empty() || r.k == 0 || r.tokens.len() + r.k > self.runner.config().ctx {
                continue;
            }
            let Some(missing) = self.catch_up(r.id, r.tokens)? else {
                continue;
            };
            if !self.samplers.contains_key(&r.id) {
                let s = super::draft_sampler(r.params, 0xD7AF_7000_5EED_0001)?;
                self.samplers.insert(r.id, s);
            }
            first.push((i, missing));
        }
        // Over the pass's token limit (a new request's prompt): the longest go ahead alone.
        let limit = self.runner.config().max_batch_tokens;
        first.sort_by_key(|(_, m)| m.len());
        while first.iter().map(|(_, m)| m.len()).sum::<usize>() > limit {
            let Some((i, m)) = first.iter_mut().rev().find(|(_, m)| m.len() > 1) else {
                break;
            };
            let n = m.len() - 1;
            self.runner.feed(reqs[*i].id, &m[..n], Logits::None)?;
            m.drain(..n);
        }
        first.sort_by_key(|(i, _)| *i);
        let live: Vec<(usize, Vec<u32>)> = first;
        let k_max = reqs.iter().map(|r| r.k).max().unwrap_or(0);
        let mut feed: Vec<(usize, Vec<u32>)> = live;
        for step in 0..k_max {
            feed.retain(|(i, _)| reqs[*i].k > step);
            if feed.is_empty() {
                break;
            }
            let refs: Vec<(ReqId, &[u32], Logits)> = feed
                .iter()
                .map(|(i, t)| (reqs[*i].id, &t[..], Logits::Last))
                .collect();
            let rows = self.runner.step(&refs)?;
            for ((i, t), mut row) in feed.iter_mut().zip(rows) {
                let Some(mut logits) = row.pop() else {
                    continue;
                };
                let r = &reqs[*i];
                let mut history = r.tokens.to_vec();
                history.extend_from_slice(&out[*i].tokens);
                let Some(s) = self.samplers.get_mut(&r.id) else {
                    continue;
                };
                let d = s.distribution(&mut logits, &history);
                let tok = s.draw(&d);
                out[*i].tokens.push(tok);
                out[*i].q.get_or_insert_with(Vec::new).push(d);
                *t = vec![tok];
            }
        }
        Ok(out)
    }

    fn release(&mut self, id: ReqId) {
        self.samplers.remove(&id);
        // A sequence the draft cache never held is not an error worth reporting.
        let _ = self.runner.release(id);
    }
}
