//! One step of the batching engine: the scheduler plans (allocating every slot), the forward
//! pass runs the plan's batch, each item samples or verifies its drafts, the scheduler's
//! update takes the outcomes, and the tokens go out.

use std::time::Duration;

use super::batching::Engine;
use std::collections::HashMap;

use super::request::Event;
use super::spec::verify_item;
use crate::error::Result;
use crate::grammar::Constraint;
use crate::sample::TokenLogprobs;
use crate::sched::{Item, Outcome, Plan, ReqId};

impl Engine {
    /// Runs one forward pass. Returns false when there is nothing to do.
    pub fn step(&mut self) -> Result<bool> {
        if self.sched.is_idle() {
            return Ok(false);
        }
        self.propose();
        let mut plan = self.sched.schedule()?;
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
        match self.image_rows(&mut plan) {
            Ok(()) => {}
            Err(e) => {
                for it in &plan.items {
                    self.fail(it.id, format!("encoding an image failed: {e}"))?;
                }
                return Ok(true);
            }
        }
        self.run(&plan)?;
        self.last_step = crate::time::Instant::now();
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
        // An embedding in the pass reads the final hidden states (so does an MTP or draft
        // drafter, when there is one; `submit_embedding` refuses other drafters).
        let embeds = plan
            .items
            .iter()
            .any(|it| self.active.get(&it.id).is_some_and(|a| a.embed.is_some()));
        let features = match self.features() {
            None if embeds => Some(crate::model::Features::Final),
            f => f,
        };
        // The canvas items come last: their logits stay on the device.
        let n_canvas = plan.canvases();
        let (token_items, canvas_items) = plan.items.split_at(plan.items.len() - n_canvas);
        if n_canvas > 0 {
            self.stats.diffusion_passes += 1;
            self.stats.diffusion_pass_canvases += n_canvas as u64;
            if n_canvas < plan.items.len() {
                self.stats.diffusion_shared_passes += 1;
            }
        }
        if let Err(e) = self.prepare_canvases(canvas_items) {
            for it in &plan.items {
                self.fail(it.id, format!("forward pass failed: {e}"))?;
            }
            return Ok(());
        }
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
        let canvases = self.canvas_inputs(canvas_items);
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
            let step = canvases.and_then(|c| fwd.run_with(&plan.batch, features.as_ref(), &c));
            let t = crate::time::Instant::now();
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
        let ((out, hidden), canvas_logits) = match step {
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
        for (it, mut rows) in token_items.iter().zip(out) {
            let hid = hidden.as_mut().and_then(Iterator::next).unwrap_or_default();
            let mut outcome = Outcome {
                id: it.id,
                ..Outcome::default()
            };
            let mut lps = Vec::new();
            // Drafts are verified; should their record be gone, the pending token's row
            // samples alone and the scheduler drops every draft.
            let mut hid = Some(hid);
            let verified = match it.lookahead > 0 {
                true => self.verify_drafts(it, &mut rows, &mut hid),
                false => None,
            };
            if let Some((o, l, kept)) = verified {
                self.observe(it.id, it.start, kept);
                (outcome, lps) = (o, l);
            } else if let Some(p) = self.active.get_mut(&it.id).and_then(|a| a.embed.as_mut()) {
                p.add(it.start, &hid.unwrap_or_default());
            } else {
                self.observe(it.id, it.start, hid.unwrap_or_default());
                // Drafts proposed but not fed (the scheduler had no room) are dropped.
                if let Some(a) = self.active.get_mut(&it.id) {
                    a.draft = None;
                }
                rows.truncate(it.end - it.start);
                if let (true, Some(mut logits)) = (it.sample, rows.pop()) {
                    match self.sample(it.id, &mut logits) {
                        Ok((tok, lp)) => {
                            outcome.tokens.push(tok);
                            lps.push(lp);
                            // A grammar that is complete ends the request.
                            outcome.done = (self.active.get(&it.id))
                                .and_then(|a| a.constraint.as_ref())
                                .is_some_and(Constraint::finished);
                        }
                        Err(e) => failed.push((it.id, e.to_string())),
                    }
                }
            }
            streams.push(lps);
            outcomes.push(outcome);
        }
        // Each canvas drawn and accepted on the device; a finished one's tokens are the
        // outcome (committed by the encoder in a later pass).
        let mut canvas_steps = HashMap::new();
        for (it, logits) in canvas_items.iter().zip(canvas_logits) {
            let mut outcome = Outcome {
                id: it.id,
                ..Outcome::default()
            };
            match self.denoised(it.id, &logits) {
                Ok(Some((tokens, steps))) => {
                    if !tokens.is_empty() {
                        canvas_steps.insert(it.id, steps);
                    }
                    streams.push(vec![None; tokens.len()]);
                    outcome.tokens = tokens;
                }
                Ok(None) => streams.push(Vec::new()),
                Err(e) => {
                    failed.push((it.id, format!("denoising failed: {e}")));
                    streams.push(Vec::new());
                }
            }
            outcomes.push(outcome);
        }
        let up = self.sched.update(plan, &outcomes)?;
        self.fwd.copy_blocks(&up.copies)?;
        for (id, msg) in failed {
            self.fail(id, msg)?;
        }
        let mut sent: HashMap<ReqId, Vec<(u32, Option<TokenLogprobs>)>> = outcomes
            .into_iter()
            .zip(streams)
            .map(|(o, lps)| (o.id, o.tokens.into_iter().zip(lps).collect()))
            .collect();
        for e in up.emits {
            let toks = sent.remove(&e.id).unwrap_or_default();
            // A committed canvas is announced before its tokens: a stop string inside them
            // ends the client's choice, and the canvas must be counted by then.
            if let Some(steps) = canvas_steps.remove(&e.id) {
                self.stats.canvases += 1;
                if !self.send(e.id, Event::Canvas { steps })? {
                    continue;
                }
            }
            self.stats.generated += e.sampled as u64;
            // An embedding ends when its last token is in: its vector goes out first.
            if let Some(p) = self.active.get_mut(&e.id).and_then(|a| a.embed.take()) {
                match p.finish() {
                    Ok(v) => {
                        if !self.send(e.id, Event::Embedding(v))? {
                            continue;
                        }
                    }
                    Err(err) => {
                        self.fail(e.id, err.to_string())?;
                        continue;
                    }
                }
            }
            if !self.stream(e.id, toks.into_iter().take(e.send))? {
                continue;
            }
            if let Some(f) = e.finish {
                self.end(e.id, Some(f))?;
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
        let raw = self
            .sched
            .get(id)
            .and_then(|r| r.logprobs)
            .map(|n| (logits.to_vec(), n));
        if let Some(c) = a.constraint.as_mut() {
            c.apply(logits)?;
        }
        let tok = a.sampler.sample(logits, history);
        if let Some(c) = a.constraint.as_mut() {
            c.consume(tok)?;
        }
        Ok((tok, raw.map(|(l, n)| TokenLogprobs::of(&l, tok, n))))
    }

    /// Sends `id`'s tokens; false (the request cancelled and ended) once its receiver is
    /// gone.
    fn stream(
        &mut self,
        id: ReqId,
        toks: impl Iterator<Item = (u32, Option<TokenLogprobs>)>,
    ) -> Result<bool> {
        for (tok, lp) in toks {
            if !self.active.contains_key(&id) || !self.send(id, Event::Token(tok, lp))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Before planning: drafts for every running request that is decoding, within its
    /// `max_tokens` (the scheduler feeds as many as the step's budget and the pools allow).
    /// Requests under a grammar are never drafted for: it decides each token after the one
    /// before.
    fn propose(&mut self) {
        let Some(spec) = &mut self.spec else {
            return;
        };
        let active = &self.active;
        let drafts = spec.propose(&mut self.sched, &self.fwd, |r| {
            let a = active.get(&r.id).filter(|a| a.constraint.is_none())?;
            Some((r.room(), a.sampler.params()))
        });
        for (id, d) in drafts {
            if let Some(a) = self.active.get_mut(&id) {
                a.draft = Some(d);
            }
        }
    }

    /// The target's hidden states steps should return for the drafter.
    fn features(&self) -> Option<crate::model::Features> {
        self.spec.as_ref().and_then(|s| s.features())
    }

    /// Hands the drafter the target's hidden states of `id`'s tokens from `first` on.
    fn observe(&mut self, id: ReqId, first: usize, rows: Vec<Vec<f32>>) {
        if let Some(s) = &mut self.spec {
            s.observe(id, first, rows);
        }
    }

    /// Verifies the drafts `it` fed against the target's rows; `None` when the request is
    /// not held any more (or kept no drafts): nothing of the lookahead stays.
    fn verify_drafts(
        &mut self,
        it: &Item,
        rows: &mut Vec<Vec<f32>>,
        hidden: &mut Option<Vec<Vec<f32>>>,
    ) -> Option<(Outcome, Vec<Option<TokenLogprobs>>, Vec<Vec<f32>>)> {
        let r = self.sched.get(it.id)?;
        let (history, logprobs) = (r.tokens.clone(), r.logprobs);
        let a = self.active.get_mut(&it.id)?;
        let draft = a.draft.take()?;
        let rows = std::mem::take(rows);
        let hidden = hidden.take().unwrap_or_default();
        let (o, lps, hid, k) =
            verify_item(it, rows, hidden, history, &mut a.sampler, logprobs, draft);
        self.stats.spec.record(k, o.accepted);
        Some((o, lps, hid))
    }
}
