//! Running a model over the paged KV cache: the `Runner` owns the model, the executor, the
//! cache tensors and one KV manager per KV group, and turns "these tokens of these sequences"
//! into one forward pass (block tables, slot mappings, sliding-window release included).
//! The continuous-batching engine ([`batching`]) builds on `Runner::step`.

pub mod batching;

use crate::backend::Executor;
use crate::error::{Error, Result};
use crate::kv::{KvManager, SeqId};
use crate::model::{ForwardBatch, KvCaches, Model, SeqInput};
use crate::tensor::DType;

/// Which rows of a sequence's new tokens want logits.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
    /// Rows from this index (within the tokens fed) to the end.
    From(usize),
}

impl Logits {
    fn rows(self, n: usize) -> std::ops::Range<usize> {
        match self {
            Logits::None => 0..0,
            Logits::Last => n.saturating_sub(1)..n,
            Logits::All => 0..n,
            Logits::From(i) => i.min(n)..n,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Longest context of one sequence.
    pub ctx: usize,
    /// Sequences that may be resident at once.
    pub max_seqs: usize,
    /// Most tokens per forward pass (prefill chunk size).
    pub max_batch_tokens: usize,
    pub kv_dtype: DType,
    pub prefix_caching: bool,
    /// Blocks in each full-attention KV pool; default enough for `max_seqs` full contexts.
    /// Smaller pools make the batching engine preempt instead.
    pub kv_blocks: Option<usize>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            block_size: 16,
            ctx: 4096,
            max_seqs: 1,
            max_batch_tokens: 512,
            kv_dtype: DType::F32,
            prefix_caching: false,
            kv_blocks: None,
        }
    }
}

pub struct Runner {
    ex: Executor,
    model: Box<dyn Model>,
    caches: KvCaches,
    kv: Vec<KvManager>,
    cfg: RunnerConfig,
    /// Recurrent-state slots: which sequence holds which, and the free ones (slot 0 is the
    /// zero state and never handed out).
    state_slots: std::collections::HashMap<SeqId, usize>,
    free_state_slots: Vec<usize>,
}

impl Runner {
    pub fn new(ex: Executor, model: Box<dyn Model>, mut cfg: RunnerConfig) -> Result<Runner> {
        cfg.ctx = cfg.ctx.min(model.info().context_length.max(1));
        cfg.block_size = cfg.block_size.max(1);
        cfg.max_batch_tokens = cfg.max_batch_tokens.max(1);
        let bs = cfg.block_size;
        let full = cfg
            .kv_blocks
            .unwrap_or(cfg.max_seqs * cfg.ctx.div_ceil(bs) + 1)
            .max(2);
        let blocks: Vec<usize> = model
            .kv_groups()
            .iter()
            .map(|g| match g.window {
                // Blocks in the window, the chunk being computed, and one partly filled.
                Some(w) => {
                    (cfg.max_seqs * ((w + cfg.max_batch_tokens).div_ceil(bs) + 2) + 1).min(full)
                }
                None => full,
            })
            .collect();
        let mut caches = KvCaches::alloc(&ex, model.kv_groups(), bs, &blocks, cfg.kv_dtype)?;
        let state_shapes = model.state_shapes();
        let n_state_slots = if state_shapes.is_empty() {
            0
        } else {
            cfg.max_seqs + 1
        };
        caches.alloc_states(&ex, &state_shapes, n_state_slots)?;
        // Prefix caching needs one full-attention KV group (sliding-window layers drop the
        // blocks a later request would reuse) and no recurrent state (which a cached prefix
        // cannot restore).
        let groups = model.kv_groups();
        cfg.prefix_caching &= groups.len() == 1
            && groups.iter().all(|g| g.window.is_none())
            && state_shapes.is_empty();
        let kv = blocks
            .iter()
            .map(|&n| KvManager::new(n, bs, cfg.prefix_caching).map_err(kv_err))
            .collect::<Result<Vec<_>>>()?;
        Ok(Runner {
            ex,
            model,
            caches,
            kv,
            cfg,
            state_slots: Default::default(),
            free_state_slots: (1..n_state_slots).rev().collect(),
        })
    }

    pub fn executor(&self) -> &Executor {
        &self.ex
    }
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }
    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }
    pub fn kv_managers(&self) -> &[KvManager] {
        &self.kv
    }

    /// Tokens of `seq` already in the cache.
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.kv
            .first()
            .and_then(|m| m.num_computed(seq))
            .unwrap_or(0)
    }

    /// One forward pass over several sequences' new tokens. Sequences not seen before start
    /// empty. Returns, per item, the logits rows asked for.
    pub fn step(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<Vec<Vec<Vec<f32>>>> {
        let total: usize = items.iter().map(|i| i.1.len()).sum();
        if total == 0 {
            return Err(Error::Model(
                "a forward pass needs at least one token".into(),
            ));
        }
        if total > self.cfg.max_batch_tokens {
            return Err(Error::Model(format!(
                "{total} tokens exceed the batch limit of {}",
                self.cfg.max_batch_tokens
            )));
        }
        for (seq, toks, _) in items {
            let after = self.seq_len(*seq) + toks.len();
            if after > self.cfg.ctx {
                return Err(Error::Model(format!(
                    "sequence {seq} would reach {after} tokens, over the context of {}",
                    self.cfg.ctx
                )));
            }
        }
        self.reserve(items)?;
        let batch = self.build_batch(items);
        let logits = self.model.forward(&self.ex, &batch, &self.caches)?;
        let mut flat = self.ex.download_f32(&logits)?;
        let vocab = self.model.info().vocab;
        // One row in all (a single decode step): hand the download over as it is.
        let single = flat.len() == vocab;
        // Hand the rows back per item, then mark the tokens computed.
        let mut out = Vec::with_capacity(items.len());
        let mut row = 0;
        for (seq, toks, want) in items {
            let n = want.rows(toks.len()).len();
            out.push(if single && n == 1 {
                vec![std::mem::take(&mut flat)]
            } else {
                (row..row + n)
                    .map(|r| flat[r * vocab..(r + 1) * vocab].to_vec())
                    .collect()
            });
            row += n;
            for (m, g) in self.kv.iter_mut().zip(self.model.kv_groups()) {
                m.commit_tokens(*seq, toks).map_err(kv_err)?;
                if let Some(w) = g.window {
                    m.release_outside_window(*seq, w).map_err(kv_err)?;
                }
            }
        }
        Ok(out)
    }

    /// Reserves cache slots for every item in every KV group (all or nothing per group), and a
    /// recurrent-state slot for each new sequence of a model that has state.
    fn reserve(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<()> {
        if !self.caches.states.is_empty() {
            for (seq, _, _) in items {
                if !self.state_slots.contains_key(seq) {
                    let slot = self.free_state_slots.pop().ok_or_else(|| {
                        Error::Model(format!(
                            "no recurrent-state slot left for sequence {seq} ({} in use)",
                            self.state_slots.len()
                        ))
                    })?;
                    self.state_slots.insert(*seq, slot);
                }
            }
        }
        for m in self.kv.iter_mut() {
            for (seq, toks, _) in items {
                if !m.contains(*seq) {
                    m.add_sequence(*seq, &[]).map_err(kv_err)?;
                }
                let have = m.seq_len(*seq).unwrap_or(0);
                let computed = m.num_computed(*seq).unwrap_or(0);
                let more = (computed + toks.len()).saturating_sub(have);
                m.append_slots(*seq, more).map_err(kv_err)?;
            }
        }
        Ok(())
    }

    /// Starts a new sequence from the cached full blocks of its prompt's first `max` tokens
    /// (only those blocks are taken; the rest is reserved as it is fed). Returns how many
    /// leading tokens are already computed: 0 without prefix caching, without a hit, or when the
    /// pool cannot take the blocks now (the sequence then starts empty on its first step).
    pub fn start_cached(&mut self, seq: SeqId, prompt: &[u32], max: usize) -> Result<usize> {
        if !self.cfg.prefix_caching || self.kv.len() != 1 || self.kv[0].contains(seq) {
            return Ok(0);
        }
        match self.kv[0].attach_prefix(seq, prompt, max) {
            Ok(reused) => Ok(reused),
            Err(crate::kv::KvError::OutOfBlocks { .. }) => Ok(0),
            Err(e) => Err(kv_err(e)),
        }
    }

    /// Leading tokens of `prompt` the prefix cache holds now, and the free blocks taking them
    /// would use; (0, 0) without prefix caching.
    pub fn cached_prefix(&self, prompt: &[u32]) -> (usize, usize) {
        match (&self.kv[..], self.cfg.prefix_caching) {
            ([m], true) => m.cached_prefix(prompt),
            _ => (0, 0),
        }
    }

    /// Whether `seq` has KV state.
    pub fn has_sequence(&self, seq: SeqId) -> bool {
        self.kv.iter().any(|m| m.contains(seq))
    }

    fn build_batch(&self, items: &[(SeqId, &[u32], Logits)]) -> ForwardBatch {
        let mut b = ForwardBatch {
            slots: vec![Vec::new(); self.kv.len()],
            ..Default::default()
        };
        for (seq, toks, want) in items {
            let start = self.seq_len(*seq);
            let q_start = b.tokens.len();
            b.tokens.extend_from_slice(toks);
            b.positions
                .extend((start..start + toks.len()).map(|p| p as i32));
            for r in want.rows(toks.len()) {
                b.logits_rows.push(q_start + r);
            }
            for (g, m) in self.kv.iter().enumerate() {
                b.slots[g].extend(
                    m.slot_mapping(*seq, start..start + toks.len())
                        .unwrap_or_default(),
                );
            }
            b.seqs.push(SeqInput {
                q_start,
                q_len: toks.len(),
                seq_len: start + toks.len(),
                block_tables: self
                    .kv
                    .iter()
                    .map(|m| m.block_table(*seq).unwrap_or(&[]).to_vec())
                    .collect(),
                state_slot: self.state_slots.get(seq).copied().unwrap_or(0),
            });
        }
        b
    }

    /// Feeds `tokens` to one sequence in chunks of at most `max_batch_tokens`; returns the
    /// logits rows asked for (indices relative to `tokens`).
    pub fn feed(&mut self, seq: SeqId, tokens: &[u32], want: Logits) -> Result<Vec<Vec<f32>>> {
        let rows = want.rows(tokens.len());
        let mut out = Vec::with_capacity(rows.len());
        let chunk = self.cfg.max_batch_tokens;
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + chunk).min(tokens.len());
            let lo = rows.start.clamp(start, end) - start;
            let hi = rows.end.clamp(start, end) - start;
            let w = if hi > lo {
                Logits::From(lo)
            } else {
                Logits::None
            };
            // `From(lo)` runs to the chunk's end; trim to `hi`.
            let mut got = self
                .step(&[(seq, &tokens[start..end], w)])?
                .pop()
                .unwrap_or_default();
            got.truncate(hi.saturating_sub(lo));
            out.extend(got);
            start = end;
        }
        Ok(out)
    }

    /// Frees a sequence's cache blocks.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        if let Some(slot) = self.state_slots.remove(&seq) {
            self.free_state_slots.push(slot);
        }
        for m in self.kv.iter_mut() {
            if m.contains(seq) {
                m.free_sequence(seq).map_err(kv_err)?;
            }
        }
        Ok(())
    }
}

fn kv_err(e: crate::kv::KvError) -> Error {
    match e {
        crate::kv::KvError::OutOfBlocks { .. } => Error::KvFull(e.to_string()),
        _ => Error::Model(format!("kv cache: {e}")),
    }
}
