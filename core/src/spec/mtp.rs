//! Gemma 4's MTP assistant as a drafter: a small model that computes no K/V of its own and
//! reads the target's cache. Each round starts from the target's final-normed hidden state
//! after the last token it computed (the engine hands it over after every step) and the
//! pending token; the assistant then drafts `k` tokens in `k` passes of one row per
//! request, all at the pending token's position, each fed its own drafted token and its
//! own output projected back to the target's width. Drafts are drawn with the request's
//! own sampling parameters, so rejection sampling sees the distribution each came from.

use std::collections::HashMap;

use super::{Draft, DraftReq, Drafter};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::model::gemma4_assistant::Gemma4Assistant;
use crate::model::Features;
use crate::runner::{Forward, Target};
use crate::sample::Sampler;
use crate::sched::ReqId;

pub struct Mtp {
    assistant: Gemma4Assistant,
    ex: Executor,
    /// Per request: the target's hidden state after its last computed token.
    hidden: HashMap<ReqId, Vec<f32>>,
    samplers: HashMap<ReqId, Sampler>,
}

impl Mtp {
    /// Drafts with `assistant` (loaded on `ex`, the target's backend) for `target`'s model:
    /// fails when that model has no caches an assistant can read or the sizes differ.
    pub fn new(mut assistant: Gemma4Assistant, ex: Executor, target: &Forward) -> Result<Mtp> {
        let m = target.model();
        let src = m
            .draft_source()
            .filter(|s| (s.sliding.is_some() || s.full.is_some()) && m.gives(&Features::Final))
            .ok_or_else(|| {
                Error::Model(format!(
                    "an MTP assistant drafts for Gemma 4 models; this one is {}",
                    m.info().architecture
                ))
            })?;
        assistant.bind(&src, m.info().vocab)?;
        Ok(Mtp {
            assistant,
            ex,
            hidden: HashMap::new(),
            samplers: HashMap::new(),
        })
    }
}

impl Drafter for Mtp {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn features(&self) -> Option<Features> {
        Some(Features::Final)
    }

    fn observe(&mut self, id: ReqId, _first: usize, mut rows: Vec<Vec<f32>>) {
        if let Some(h) = rows.pop() {
            self.hidden.insert(id, h);
        }
    }

    fn propose(&mut self, reqs: &[DraftReq<'_>], target: &Target<'_>) -> Result<Vec<Draft>> {
        let mut out: Vec<Draft> = reqs.iter().map(|_| Draft::default()).collect();
        let width = self.assistant.backbone();
        // Requests whose target state is known: the pending token follows exactly what the
        // cache holds, and the hidden state is that of the cache's last token.
        let mut live: Vec<usize> = Vec::new();
        let mut hid = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let Some(h) = self.hidden.get(&r.id).filter(|h| h.len() == width) else {
                continue;
            };
            if r.k == 0 || r.tokens.is_empty() || target.kv.seq_len(r.id) + 1 != r.tokens.len() {
                continue;
            }
            if !self.samplers.contains_key(&r.id) {
                let s = super::draft_sampler(r.params, 0x4D54_5000_5EED_0001)?;
                self.samplers.insert(r.id, s);
            }
            live.push(i);
            hid.extend_from_slice(h);
        }
        if live.is_empty() {
            return Ok(out);
        }
        let k_max = live.iter().map(|&i| reqs[i].k).max().unwrap_or(0);
        let mut toks: Vec<u32> = live
            .iter()
            .filter_map(|&i| reqs[i].tokens.last().copied())
            .collect();
        let mut hidden = self.ex.upload_f32(&[live.len(), width], &hid)?;
        for step in 0..k_max {
            // Requests that asked for no more drafts leave the batch.
            let keep: Vec<usize> = (0..live.len())
                .filter(|&n| reqs[live[n]].k > step)
                .collect();
            if keep.is_empty() {
                break;
            }
            if keep.len() < live.len() {
                let idx: Vec<i32> = keep.iter().map(|&n| n as i32).collect();
                hidden = self
                    .ex
                    .get_rows(&hidden, &self.ex.upload_i32(&[idx.len()], &idx)?)?;
                live = keep.iter().map(|&n| live[n]).collect();
                toks = keep.iter().map(|&n| toks[n]).collect();
            }
            let rows: Vec<(ReqId, u32)> = live
                .iter()
                .zip(&toks)
                .map(|(&i, &t)| (reqs[i].id, t))
                .collect();
            let b = target.kv.lookahead_batch(&rows)?;
            let s = self
                .assistant
                .step(&self.ex, &b, target.fwd.caches(), &hidden)?;
            for ((n, &i), mut logits) in live.iter().enumerate().zip(s.logits) {
                let r = &reqs[i];
                let Some(sampler) = self.samplers.get_mut(&r.id) else {
                    continue;
                };
                let mut history = r.tokens.to_vec();
                history.extend_from_slice(&out[i].tokens);
                let d = sampler.distribution(&mut logits, &history);
                let tok = sampler.draw(&d);
                out[i].tokens.push(tok);
                out[i].q.get_or_insert_with(Vec::new).push(d);
                toks[n] = tok;
            }
            hidden = s.hidden;
        }
        Ok(out)
    }

    fn release(&mut self, id: ReqId) {
        self.hidden.remove(&id);
        self.samplers.remove(&id);
    }
}
