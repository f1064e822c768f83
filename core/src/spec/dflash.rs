//! DFlash as a drafter: the target hands over its hidden states (the drafter's layers of
//! choice) of every token it computes; before each round the drafter writes the context
//! K/V of the tokens it has not seen into its own paged cache, then drafts a whole block in
//! one pass per step for every request at once (up to `block - 1` tokens each), drawing each
//! position with the request's own sampling parameters so rejection sampling sees the
//! distribution each draft came from.
//!
//! A request whose early tokens the target never computed (a prefix-cache hit) has no
//! context for them: it is not drafted for, which costs speed, never correctness.

use std::collections::{HashMap, HashSet};

use super::{Draft, DraftReq, Drafter};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::kv::KvManager;
use crate::model::dflash::DFlash;
use crate::model::{Features, ForwardBatch, KvCaches, SeqInput};
use crate::runner::{Forward, Target};
use crate::sample::Sampler;
use crate::sched::ReqId;

/// Context rows written per pass.
const CHUNK: usize = 512;

pub struct DFlashDrafter {
    model: DFlash,
    ex: Executor,
    caches: KvCaches,
    kv: KvManager,
    /// Longest context a request can have here.
    ctx: usize,
    /// Per request: hidden states handed over and not written yet, from this position.
    unseen: HashMap<ReqId, (usize, Vec<Vec<f32>>)>,
    /// Requests with a hole in their context.
    holes: HashSet<ReqId>,
    samplers: HashMap<ReqId, Sampler>,
}

fn kv_err(e: crate::kv::KvError) -> Error {
    Error::Model(format!("DFlash cache: {e}"))
}

impl DFlashDrafter {
    /// Drafts with `model` (loaded on `ex`, the target's backend) for `target`'s model, with
    /// a cache for `max_seqs` contexts of up to `ctx` tokens.
    pub fn new(
        mut model: DFlash,
        ex: Executor,
        target: &Forward,
        max_seqs: usize,
    ) -> Result<DFlashDrafter> {
        let m = target.model();
        let taps = Features::Layers(model.target_layers().to_vec());
        let src = m.draft_source().filter(|_| m.gives(&taps)).ok_or_else(|| {
            Error::Model(format!(
                "a DFlash drafter cannot read {}'s hidden states (layers {:?})",
                m.info().architecture,
                model.target_layers()
            ))
        })?;
        model.bind(&src)?;
        let ctx = target.config().ctx + model.block();
        let bs = 16;
        let blocks = max_seqs.max(1) * ctx.div_ceil(bs) + 1;
        let caches = KvCaches::alloc(
            &ex,
            model.kv_groups(),
            bs,
            &[blocks],
            &crate::kv::KvTypes::uniform(crate::DType::F32),
        )?;
        Ok(DFlashDrafter {
            model,
            ex,
            caches,
            kv: KvManager::new(blocks, bs, false).map_err(kv_err)?,
            ctx,
            unseen: HashMap::new(),
            holes: HashSet::new(),
            samplers: HashMap::new(),
        })
    }

    fn computed(&self, id: ReqId) -> usize {
        self.kv.num_computed(id).unwrap_or(0)
    }

    /// One request's batch entry of `n` rows from position `at`, slots reserved.
    fn entry(&mut self, id: ReqId, at: usize, n: usize, b: &mut ForwardBatch) -> Result<()> {
        if !self.kv.contains(id) {
            self.kv.add_sequence(id, &[]).map_err(kv_err)?;
        }
        let have = self.kv.seq_len(id).unwrap_or(0);
        self.kv
            .append_slots(id, (at + n).saturating_sub(have))
            .map_err(|e| match e {
                crate::kv::KvError::OutOfBlocks { .. } => Error::KvFull(e.to_string()),
                e => kv_err(e),
            })?;
        let slots = self
            .kv
            .slot_mapping(id, at..at + n)
            .ok_or_else(|| Error::Model("DFlash cache: no slots".into()))?;
        let q_start = b.positions.len();
        b.positions.extend((at..at + n).map(|p| p as i32));
        b.slots[0].extend(slots);
        b.seqs.push(SeqInput {
            q_start,
            q_len: n,
            seq_len: at + n,
            block_tables: vec![self.kv.block_table(id).unwrap_or(&[]).to_vec()],
            state_read: 0,
            state_slot: 0,
            images: Vec::new(),
        });
        Ok(())
    }

    /// Writes the context of the requests `ids` up to what was handed over.
    fn write_contexts(&mut self, reqs: &[&DraftReq<'_>]) -> Result<()> {
        let width = self.model.feature_width();
        let mut todo: Vec<(ReqId, usize, Vec<Vec<f32>>, Vec<u32>)> = Vec::new();
        for r in reqs {
            if let Some((at, rows)) = self.unseen.remove(&r.id) {
                let toks = r.tokens.get(at..at + rows.len()).map(<[u32]>::to_vec);
                match toks {
                    Some(t) if rows.iter().all(|x| x.len() == width) => {
                        todo.push((r.id, at, rows, t))
                    }
                    _ => {
                        self.holes.insert(r.id);
                    }
                }
            }
        }
        // Every request's rows go through one pass (split at CHUNK rows): the write is row by
        // row (projections, norm, rope, a slot each), so requests share a batch freely.
        let mut pieces: Vec<(ReqId, usize, &[Vec<f32>], &[u32])> = Vec::new();
        for (id, at, rows, toks) in &todo {
            for (c, (rows, toks)) in rows.chunks(CHUNK).zip(toks.chunks(CHUNK)).enumerate() {
                pieces.push((*id, at + c * CHUNK, rows, toks));
            }
        }
        let mut rest = pieces.as_slice();
        while !rest.is_empty() {
            let mut n = 0;
            let mut take = 0;
            while take < rest.len() && (take == 0 || n + rest[take].2.len() <= CHUNK) {
                n += rest[take].2.len();
                take += 1;
            }
            let (batch, tail) = rest.split_at(take);
            rest = tail;
            let mut b = ForwardBatch {
                slots: vec![Vec::new()],
                ..Default::default()
            };
            let mut flat: Vec<f32> = Vec::with_capacity(n * width);
            for &(id, at, rows, toks) in batch {
                b.tokens.extend_from_slice(toks);
                self.entry(id, at, toks.len(), &mut b)?;
                for r in rows {
                    flat.extend_from_slice(r);
                }
            }
            let feats = self.ex.upload_f32(&[b.tokens.len(), width], &flat)?;
            self.model
                .write_context(&self.ex, &b, &self.caches, &feats)?;
            for &(id, _, _, toks) in batch {
                self.kv.commit_tokens(id, toks).map_err(kv_err)?;
            }
        }
        Ok(())
    }

    /// One drafting pass for every request whose context reaches its pending token (the
    /// context handed over is written first): per request, the drafter's logits of the
    /// positions after the pending one (at most `k` and `block - 1` rows; none for a
    /// request it cannot draft for).
    pub fn block_logits(&mut self, reqs: &[DraftReq<'_>]) -> Result<Vec<Vec<Vec<f32>>>> {
        let mut out: Vec<Vec<Vec<f32>>> = reqs.iter().map(|_| Vec::new()).collect();
        let block = self.model.block();
        let ready: Vec<&DraftReq> = reqs
            .iter()
            .filter(|r| r.k > 0 && !r.tokens.is_empty() && !self.holes.contains(&r.id))
            .collect();
        self.write_contexts(&ready)?;
        let mut b = ForwardBatch {
            slots: vec![Vec::new()],
            ..Default::default()
        };
        let mut live: Vec<(usize, usize)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let p = r.tokens.len().saturating_sub(1);
            if r.k == 0
                || r.tokens.is_empty()
                || self.holes.contains(&r.id)
                || self.computed(r.id) != p
                || p + block > self.ctx
            {
                continue;
            }
            let k = r.k.min(block - 1);
            let q_start = b.tokens.len();
            b.tokens.push(r.tokens[p]);
            b.tokens
                .extend(std::iter::repeat_n(self.model.mask_token(), block - 1));
            self.entry(r.id, p, block, &mut b)?;
            b.logits_rows.extend(q_start + 1..q_start + 1 + k);
            live.push((i, k));
        }
        if live.is_empty() {
            return Ok(out);
        }
        let logits = self.model.draft(&self.ex, &b, &self.caches)?;
        let flat = self.ex.download_f32(&logits)?;
        let vocab = flat.len() / b.logits_rows.len();
        let mut rows = flat.chunks_exact(vocab.max(1));
        for (i, k) in live {
            out[i] = rows.by_ref().take(k).map(<[f32]>::to_vec).collect();
        }
        Ok(out)
    }
}

impl Drafter for DFlashDrafter {
    fn name(&self) -> &'static str {
        "dflash"
    }

    fn features(&self) -> Option<Features> {
        Some(Features::Layers(self.model.target_layers().to_vec()))
    }

    fn observe(&mut self, id: ReqId, first: usize, rows: Vec<Vec<f32>>) {
        if self.holes.contains(&id) {
            return;
        }
        let mut computed = self.computed(id);
        if first < computed {
            // The target recomputed tokens the context holds (preempted and resumed).
            if self.kv.truncate(id, first, None).is_err() {
                self.holes.insert(id);
                return;
            }
            self.unseen.remove(&id);
            computed = first;
        }
        let (at, held) = self.unseen.entry(id).or_insert((computed, Vec::new()));
        if first < *at || first > *at + held.len() {
            // Tokens the target computed without handing them over: a hole.
            self.unseen.remove(&id);
            self.holes.insert(id);
            return;
        }
        held.truncate(first - *at);
        held.extend(rows);
    }

    fn propose(&mut self, reqs: &[DraftReq<'_>], _target: &Target<'_>) -> Result<Vec<Draft>> {
        let logits = self.block_logits(reqs)?;
        let mut out: Vec<Draft> = reqs.iter().map(|_| Draft::default()).collect();
        for ((r, rows), d) in reqs.iter().zip(logits).zip(&mut out) {
            if rows.is_empty() {
                continue;
            }
            if !self.samplers.contains_key(&r.id) {
                let s = super::draft_sampler(r.params, 0xDF1A_5400_5EED_0001)?;
                self.samplers.insert(r.id, s);
            }
            let Some(sampler) = self.samplers.get_mut(&r.id) else {
                continue;
            };
            let mut history = r.tokens.to_vec();
            for mut row in rows {
                let q = sampler.distribution(&mut row, &history);
                let tok = sampler.draw(&q);
                history.push(tok);
                d.tokens.push(tok);
                d.q.get_or_insert_with(Vec::new).push(q);
            }
        }
        Ok(out)
    }

    fn release(&mut self, id: ReqId) {
        self.unseen.remove(&id);
        self.holes.remove(&id);
        self.samplers.remove(&id);
        if self.kv.contains(id) {
            // A sequence the cache holds always frees.
            let _ = self.kv.free_sequence(id);
        }
    }
}
