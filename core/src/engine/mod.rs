//! Running a model over the paged KV cache: the `Runner` owns the model, the executor, the
//! cache tensors and one KV manager per KV group, and turns "these tokens of these sequences"
//! into one forward pass (block tables, slot mappings, sliding-window release included).
//! The continuous-batching engine ([`batching`]) builds on `Runner::step`.

pub mod batching;
pub mod diffusion;
pub mod embed;
mod handle;
mod spec;
#[cfg(test)]
mod toy_tests;

pub use spec::SpecStats;

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::kv::{BlockId, KvManager, SeqId, StatePool, StateStats};
use crate::model::{Features, ForwardBatch, KvCaches, Model, SeqInput};
use crate::tensor::{DType, Tensor};

/// Per item, the logits rows a pass returns, and (when asked for) the hidden-state rows of
/// every token it fed.
pub type StepRows = (Vec<Vec<Vec<f32>>>, Option<Vec<Vec<Vec<f32>>>>);

/// Tokens of the key-center calibration pass ([`Runner::new`] with a lossy K cache).
pub const CALIBRATION_TOKENS: usize = 64;
/// The sequence id the calibration pass runs as (released before any request).
const CALIBRATION_SEQ: SeqId = SeqId::MAX;

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
    /// The K and V cache types (per layer where overridden).
    pub kv_types: crate::kv::KvTypes,
    /// Subtract each layer's mean key (measured by one calibration pass at start) before a
    /// lossy K cache quantizes it ([`KvCaches::centered_keys`]; exact for attention).
    pub kv_center_keys: bool,
    pub prefix_caching: bool,
    /// Blocks in each full-attention KV pool; default enough for `max_seqs` full contexts.
    /// Smaller pools make the batching engine preempt instead.
    pub kv_blocks: Option<usize>,
    /// Tokens a sequence can always drop again with [`Runner::rollback`] without recomputing
    /// them: sliding windows keep that many more tokens, and a recurrent model keeps that many
    /// state checkpoints per sequence (one per step). Rolling back further recomputes from
    /// the newest checkpoint or snapshot before the target, where one exists.
    pub max_rollback: usize,
    /// Recurrent-state snapshots kept for prefix caching (the state after a full KV block);
    /// default: up to 256 MiB of them, at most `4 * max_seqs + 4`.
    pub state_snapshots: Option<usize>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            block_size: 16,
            ctx: 4096,
            max_seqs: 1,
            max_batch_tokens: 512,
            kv_types: crate::kv::KvTypes::uniform(DType::F32),
            kv_center_keys: false,
            prefix_caching: false,
            kv_blocks: None,
            max_rollback: 0,
            state_snapshots: None,
        }
    }
}

/// Memory the default recurrent-state snapshot budget may take.
const SNAPSHOT_BYTES: usize = 256 << 20;

pub struct Runner {
    ex: Executor,
    model: Box<dyn Model>,
    caches: KvCaches,
    kv: Vec<KvManager>,
    /// Recurrent-state slots, checkpoints and snapshots; `None` for a model without state.
    states: Option<StatePool>,
    cfg: RunnerConfig,
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
                // Blocks in the window (and the rollback margin), the chunk being computed,
                // and one partly filled.
                Some(w) => (cfg.max_seqs
                    * ((w + cfg.max_rollback + cfg.max_batch_tokens).div_ceil(bs) + 2)
                    + 1)
                .min(full),
                None => full,
            })
            .collect();
        let mut caches = KvCaches::alloc(&ex, model.kv_groups(), bs, &blocks, &cfg.kv_types)?;
        let state_shapes = model.state_shapes();
        let states = if state_shapes.is_empty() {
            None
        } else {
            let slot_bytes: usize = state_shapes
                .iter()
                .map(|s| s.iter().product::<usize>() * 4)
                .sum();
            let snapshots = match (cfg.prefix_caching, cfg.state_snapshots) {
                (false, _) => 0,
                (true, Some(n)) => n,
                (true, None) => (SNAPSHOT_BYTES / slot_bytes.max(1)).clamp(1, 4 * cfg.max_seqs + 4),
            };
            let slots = StatePool::slots_needed(cfg.max_seqs, cfg.max_rollback, snapshots);
            caches.alloc_states(&ex, &state_shapes, slots)?;
            Some(StatePool::new(slots, cfg.max_rollback, snapshots).with_slot_bytes(slot_bytes))
        };
        let kv = blocks
            .iter()
            .map(|&n| KvManager::new(n, bs, cfg.prefix_caching).map_err(kv_err))
            .collect::<Result<Vec<_>>>()?;
        let mut runner = Runner {
            ex,
            model,
            caches,
            kv,
            states,
            cfg,
        };
        runner.calibrate_key_centers()?;
        Ok(runner)
    }

    /// For lossy K caches with `kv_center_keys`: one pass over [`CALIBRATION_TOKENS`] fixed pseudo-random tokens
    /// measures each layer's mean key, which every later key has subtracted before it is
    /// quantized ([`KvCaches::centered_keys`]: attention is unchanged, the quantization error
    /// shrinks). The calibration sequence is released at once; its blocks are never cached.
    fn calibrate_key_centers(&mut self) -> Result<()> {
        let lossy = self.model.kv_groups().iter().any(|g| {
            g.layers
                .iter()
                .any(|&l| !self.cfg.kv_types.of_layer(l).0.is_float())
        });
        if !lossy || !self.cfg.kv_center_keys {
            return Ok(());
        }
        let n = CALIBRATION_TOKENS
            .min(self.cfg.ctx)
            .min(self.cfg.max_batch_tokens);
        let vocab = self.model.info().vocab.max(1);
        let mut rng = crate::rng::Rng::new(0x6b69_6c6e_6b65_7973);
        let toks: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
        self.caches.begin_calibration();
        let r = self.pass(&[(CALIBRATION_SEQ, &toks, Logits::None)], None);
        self.release(CALIBRATION_SEQ)?;
        r?;
        self.caches.finish_calibration(&self.ex)
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
    /// The recurrent-state pool's counters (a model without state has none).
    pub fn state_stats(&self) -> Option<StateStats> {
        self.states.as_ref().map(StatePool::stats)
    }

    /// Tokens of `seq` already in the cache.
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.kv
            .first()
            .and_then(|m| m.num_computed(seq))
            .unwrap_or(0)
    }

    /// The tokens of `seq` in the cache, oldest first.
    pub fn computed_tokens(&self, seq: SeqId) -> &[u32] {
        self.kv
            .first()
            .and_then(|m| m.computed_tokens(seq))
            .unwrap_or(&[])
    }

    /// One forward pass over several sequences' new tokens. Sequences not seen before start
    /// empty. Returns, per item, the logits rows asked for.
    pub fn step(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<Vec<Vec<Vec<f32>>>> {
        Ok(self.pass(items, None)?.0)
    }

    /// [`Runner::step`], and per item the hidden states `f` names of every token fed (what
    /// a drafter is fed), one row each.
    pub fn step_features(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        f: &Features,
    ) -> Result<StepRows> {
        self.pass(items, Some(f))
    }

    fn pass(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        f: Option<&Features>,
    ) -> Result<StepRows> {
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
        let (logits, h) = match f {
            Some(f) => {
                let (l, pieces) = self
                    .model
                    .forward_features(&self.ex, &batch, &self.caches, f)?;
                (l, Some(self.features(&pieces, total)?))
            }
            None => (self.model.forward(&self.ex, &batch, &self.caches)?, None),
        };
        let mut flat = self.ex.download_f32(&logits)?;
        let vocab = self.model.info().vocab;
        // One row in all (a single decode step): hand the download over as it is.
        let single = flat.len() == vocab;
        // Hand the rows back per item, then mark the tokens computed.
        let mut out = Vec::with_capacity(items.len());
        let mut hid = h.as_ref().map(|_| Vec::with_capacity(items.len()));
        let mut row = 0;
        let mut fed = 0;
        for (seq, toks, want) in items {
            let n = want.rows(toks.len()).len();
            if let (Some(hid), Some((h, w))) = (&mut hid, &h) {
                hid.push(
                    (fed..fed + toks.len())
                        .map(|r| h[r * w..(r + 1) * w].to_vec())
                        .collect(),
                );
            }
            fed += toks.len();
            out.push(if single && n == 1 {
                vec![std::mem::take(&mut flat)]
            } else {
                (row..row + n)
                    .map(|r| flat[r * vocab..(r + 1) * vocab].to_vec())
                    .collect()
            });
            row += n;
            self.commit(*seq, toks)?;
        }
        Ok((out, hid))
    }

    /// Column blocks `[t, w_i]` downloaded and laid side by side: `[t, Σ w_i]` row major,
    /// with the row width.
    fn features(&self, pieces: &[Tensor], t: usize) -> Result<(Vec<f32>, usize)> {
        let mut cols = Vec::with_capacity(pieces.len());
        for p in pieces {
            let w = p.shape().dims().last().copied().unwrap_or(0);
            let v = self.ex.download_f32(p)?;
            if v.len() != t * w {
                return Err(Error::Model(format!(
                    "hidden states of {} values for {t} rows of {w}",
                    v.len()
                )));
            }
            cols.push((v, w));
        }
        let width: usize = cols.iter().map(|c| c.1).sum();
        let mut out = Vec::with_capacity(t * width);
        for r in 0..t {
            for (v, w) in &cols {
                out.extend_from_slice(&v[r * w..(r + 1) * w]);
            }
        }
        Ok((out, width))
    }

    /// The KV caches (an MTP assistant reads the target's).
    pub fn caches(&self) -> &KvCaches {
        &self.caches
    }

    /// A batch that reads the cache and writes nothing: one row per `(seq, token)` at the
    /// sequence's next position, attending to the tokens the cache holds of it (an MTP
    /// assistant's drafting step over its target's cache). Every row wants logits.
    pub fn lookahead_batch(&self, rows: &[(SeqId, u32)]) -> Result<ForwardBatch> {
        let mut b = ForwardBatch {
            slots: vec![vec![-1; rows.len()]; self.kv.len()],
            ..Default::default()
        };
        for (i, &(seq, tok)) in rows.iter().enumerate() {
            let len = self.seq_len(seq);
            if len == 0 {
                return Err(Error::Model(format!(
                    "sequence {seq} has nothing in the cache to look ahead from"
                )));
            }
            b.tokens.push(tok);
            b.positions.push(len as i32);
            b.logits_rows.push(i);
            b.seqs.push(SeqInput {
                q_start: i,
                q_len: 1,
                seq_len: len,
                block_tables: self
                    .kv
                    .iter()
                    .map(|m| m.block_table(seq).unwrap_or(&[]).to_vec())
                    .collect(),
                state_read: 0,
                state_slot: 0,
            });
        }
        Ok(b)
    }

    /// After a forward pass: `toks` of `seq` are computed in every KV group and its new
    /// recurrent state is current; the blocks a sliding window no longer sees go back, and a
    /// state that ends a full block is kept as that block's snapshot.
    fn commit(&mut self, seq: SeqId, toks: &[u32]) -> Result<()> {
        let margin = self.cfg.max_rollback;
        for (m, g) in self.kv.iter_mut().zip(self.model.kv_groups()) {
            m.commit_tokens(seq, toks).map_err(kv_err)?;
            if let Some(w) = g.window {
                m.release_outside_window(seq, w + margin).map_err(kv_err)?;
            }
        }
        let len = self.seq_len(seq);
        if let Some(st) = &mut self.states {
            st.commit(seq, len).map_err(kv_err)?;
            let bs = self.cfg.block_size;
            if self.cfg.prefix_caching && len.is_multiple_of(bs) && len > 0 {
                if let Some(h) = self
                    .kv
                    .first()
                    .and_then(|m| m.block_hash(seq, len / bs - 1))
                {
                    st.snapshot(seq, h);
                }
            }
        }
        Ok(())
    }

    /// Reserves cache slots for every item in every KV group (all or nothing per group), and
    /// the recurrent-state slot each item's step writes.
    fn reserve(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<()> {
        if let Some(st) = &mut self.states {
            for (seq, _, _) in items {
                st.start(*seq);
                st.begin(*seq).map_err(kv_err)?;
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

    /// The first block a KV group needs of a sequence `n` blocks long: 0, or for a sliding
    /// window the first one it still sees.
    fn first_needed(&self, window: Option<usize>, n: usize) -> usize {
        window.map_or(0, |w| {
            (n * self.cfg.block_size).saturating_sub(w) / self.cfg.block_size
        })
    }

    /// The most full blocks of `prompt` (at most `max` tokens' worth) that a new sequence can
    /// resume from: every KV group holds the cached blocks it needs of them (all of them for
    /// full attention, those inside the window for a sliding one) and, for a recurrent model,
    /// the state after them is kept as a snapshot. With the cached block per lookable block
    /// of each group, which it looked up on the way.
    fn prefix_blocks(&self, prompt: &[u32], max: usize) -> (usize, Vec<Vec<Option<BlockId>>>) {
        if !self.cfg.prefix_caching || self.kv.is_empty() {
            return (0, Vec::new());
        }
        let bs = self.cfg.block_size;
        let groups = self.model.kv_groups();
        let maps: Vec<Vec<Option<BlockId>>> =
            self.kv.iter().map(|m| m.cached_blocks(prompt)).collect();
        let mut most = max / bs;
        for (g, map) in groups.iter().zip(&maps) {
            most = most.min(map.len());
            if g.window.is_none() {
                most = most.min(map.iter().take_while(|b| b.is_some()).count());
            }
        }
        let hashes = match &self.states {
            Some(_) => crate::kv::block_hash::hash_full_blocks(&prompt[..most * bs], bs, None),
            None => Vec::new(),
        };
        let n = (1..=most)
            .rev()
            .find(|&n| {
                let windows = groups.iter().zip(&maps).all(|(g, map)| {
                    map[self.first_needed(g.window, n)..n]
                        .iter()
                        .all(Option::is_some)
                });
                windows
                    && self
                        .states
                        .as_ref()
                        .is_none_or(|st| st.has_snapshot(&hashes[n - 1]))
            })
            .unwrap_or(0);
        (n, maps)
    }

    /// Starts a new sequence from the cached full blocks of its prompt's first `max` tokens
    /// (only those blocks are taken; the rest is reserved as it is fed), and for a recurrent
    /// model from the state snapshot after them. Returns how many leading tokens are already
    /// computed: 0 without prefix caching, without a hit, or when the pool cannot take the
    /// blocks now (the sequence then starts empty on its first step).
    pub fn start_cached(&mut self, seq: SeqId, prompt: &[u32], max: usize) -> Result<usize> {
        if self.has_sequence(seq) {
            return Ok(0);
        }
        let (n, _) = self.prefix_blocks(prompt, max);
        if n == 0 {
            return Ok(0);
        }
        let want = n * self.cfg.block_size;
        let firsts: Vec<usize> = (self.model.kv_groups().iter())
            .map(|g| self.first_needed(g.window, n))
            .collect();
        let mut ok = true;
        for (m, first) in self.kv.iter_mut().zip(firsts) {
            match m.attach_blocks(seq, prompt, n, first) {
                Ok(r) if r == want => {}
                Ok(_) | Err(crate::kv::KvError::OutOfBlocks { .. }) => {
                    ok = false;
                    break;
                }
                Err(e) => {
                    self.release(seq)?;
                    return Err(kv_err(e));
                }
            }
        }
        if let (true, Some(st)) = (ok, &mut self.states) {
            let hash = self.kv.first().and_then(|m| m.block_hash(seq, n - 1));
            ok = hash.is_some_and(|h| st.start_at(seq, want, &h));
        }
        if !ok {
            self.release(seq)?;
            return Ok(0);
        }
        Ok(want)
    }

    /// Leading tokens of `prompt` the prefix cache holds now, and the free blocks of the
    /// (first) full-attention pool taking them would use; (0, 0) without prefix caching.
    pub fn cached_prefix(&self, prompt: &[u32]) -> (usize, usize) {
        let (n, maps) = self.prefix_blocks(prompt, usize::MAX);
        if n == 0 {
            return (0, 0);
        }
        let groups = self.model.kv_groups();
        let g = groups.iter().position(|g| g.window.is_none()).unwrap_or(0);
        let free = match (self.kv.get(g), maps.get(g)) {
            (Some(m), Some(map)) => {
                let held: Vec<BlockId> = map.iter().take(n).flatten().copied().collect();
                m.free_among(&held)
            }
            _ => 0,
        };
        (n * self.cfg.block_size, free)
    }

    /// Whether `seq` has KV state.
    pub fn has_sequence(&self, seq: SeqId) -> bool {
        self.kv.iter().any(|m| m.contains(seq))
            || self.states.as_ref().is_some_and(|s| s.contains(seq))
    }

    /// Drops the last `k` computed tokens of `seq`, as if they had never been fed: their KV
    /// slots are released, and a recurrent state returns to its checkpoint (or prefix snapshot)
    /// at the new length. Without one there, the state restarts from the newest earlier one and
    /// the tokens between are fed again. Fails, changing nothing, if a sliding window already
    /// released a block the shorter sequence needs (see [`RunnerConfig::max_rollback`]) or
    /// the pool has no block for a copy-on-write; if feeding the tokens again fails, the
    /// sequence is left at the checkpoint it resumed from (`seq_len` says where).
    pub fn rollback(&mut self, seq: SeqId, k: usize) -> Result<()> {
        let len = self.seq_len(seq);
        if k > len {
            return Err(Error::Model(format!(
                "sequence {seq} has {len} tokens; cannot roll back {k}"
            )));
        }
        if k == 0 {
            return Ok(());
        }
        let target = len - k;
        let bs = self.cfg.block_size;
        let tokens: Vec<u32> = self
            .kv
            .first()
            .and_then(|m| m.computed_tokens(seq))
            .map(|t| t[..target].to_vec())
            .unwrap_or_default();
        // Where the state can resume: a checkpoint, or a nearer prefix snapshot.
        let mut from = target;
        let mut snapshot = None;
        if let Some(st) = &self.states {
            from = st.checkpoint_at(seq, target);
            if self.cfg.prefix_caching {
                for i in (from / bs + 1..=target / bs).rev() {
                    let h = self.kv.first().and_then(|m| m.block_hash(seq, i - 1));
                    if let Some(h) = h.filter(|h| st.has_snapshot(h)) {
                        from = i * bs;
                        snapshot = Some(h);
                        break;
                    }
                }
            }
        }
        let groups = self.model.kv_groups().to_vec();
        for (m, g) in self.kv.iter().zip(&groups) {
            m.check_truncate(seq, from, g.window).map_err(kv_err)?;
        }
        for (gi, (m, g)) in self.kv.iter_mut().zip(&groups).enumerate() {
            if let Some((src, dst)) = m.truncate(seq, from, g.window).map_err(kv_err)? {
                self.caches.copy_block(&self.ex, gi, src, dst)?;
            }
        }
        if let Some(st) = &mut self.states {
            match snapshot {
                Some(h) => {
                    st.restore(seq, from, &h);
                }
                None => {
                    st.rollback(seq, from).map_err(kv_err)?;
                }
            }
        }
        if from < target {
            self.feed(seq, &tokens[from..target], Logits::None)?;
        }
        Ok(())
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
            let (state_read, state_slot) = self.states.as_ref().map_or((0, 0), |st| {
                (
                    st.current(*seq).map_or(0, |c| c.1),
                    st.pending(*seq).unwrap_or(0),
                )
            });
            b.seqs.push(SeqInput {
                q_start,
                q_len: toks.len(),
                seq_len: start + toks.len(),
                block_tables: self
                    .kv
                    .iter()
                    .map(|m| m.block_table(*seq).unwrap_or(&[]).to_vec())
                    .collect(),
                state_read,
                state_slot,
            });
        }
        b
    }

    /// One denoising step of a block-diffusion model over `seq`'s next canvas (after its
    /// computed tokens), with the previous step's processed logits (`[canvas × vocab]`, row
    /// major) for self-conditioning. Returns the logits of every canvas position. The canvas
    /// stays uncomputed: its slots are reused by the next step and by the pass that commits
    /// the accepted canvas ([`Runner::feed`]).
    pub fn denoise(
        &mut self,
        seq: SeqId,
        canvas: &[u32],
        self_cond: Option<&[f32]>,
    ) -> Result<Vec<Vec<f32>>> {
        let c = self.canvas_len()?;
        if canvas.len() != c {
            return Err(Error::Model(format!(
                "a canvas of {} tokens; this model's canvas holds {c}",
                canvas.len()
            )));
        }
        let vocab = self.model.info().vocab;
        if let Some(t) = canvas.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        let sc = match self_cond {
            Some(l) if l.len() == c * vocab => Some(self.ex.upload_f32(&[c, vocab], l)?),
            Some(l) => {
                return Err(Error::Model(format!(
                    "{} self-conditioning logits; a canvas of {c} over a vocabulary of {vocab} \
                     takes {}",
                    l.len(),
                    c * vocab
                )))
            }
            None => None,
        };
        let ids: Vec<i32> = canvas.iter().map(|&t| t as i32).collect();
        let ids = self.ex.upload_i32(&[c], &ids)?;
        let logits = self.denoise_on_device(seq, &ids, sc.as_ref())?;
        let flat = self.ex.download_f32(&logits)?;
        Ok(flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    /// [`Runner::denoise`] with everything on the device: the canvas's ids (`[canvas]` i32,
    /// each below the vocabulary) and the self-conditioning logits in, the logits
    /// `[canvas, vocab]` out; nothing is read back.
    pub fn denoise_on_device(
        &mut self,
        seq: SeqId,
        canvas: &Tensor,
        self_cond: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = self.canvas_len()?;
        if canvas.numel() != c {
            return Err(Error::Model(format!(
                "a canvas of {} tokens; this model's canvas holds {c}",
                canvas.numel()
            )));
        }
        if c > self.cfg.max_batch_tokens {
            return Err(Error::Model(format!(
                "a canvas of {c} tokens exceeds the batch limit of {}",
                self.cfg.max_batch_tokens
            )));
        }
        let after = self.seq_len(seq) + c;
        if after > self.cfg.ctx {
            return Err(Error::Model(format!(
                "sequence {seq} would reach {after} tokens, over the context of {}",
                self.cfg.ctx
            )));
        }
        // The batch's token ids are placeholders: the embedding reads `canvas`.
        let placeholder = vec![0u32; c];
        let items = [(seq, &placeholder[..], Logits::All)];
        self.reserve(&items)?;
        let batch = self.build_batch(&items);
        self.model
            .denoiser()
            .ok_or_else(|| Error::Model("this model does not generate by diffusion".into()))?
            .denoise(&self.ex, &batch, &self.caches, Some(canvas), self_cond)
    }

    fn canvas_len(&self) -> Result<usize> {
        self.model
            .canvas_length()
            .ok_or_else(|| Error::Model("this model does not generate by diffusion".into()))
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

    /// Frees a sequence's cache blocks and state slots.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        if let Some(st) = &mut self.states {
            st.free_seq(seq);
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
        crate::kv::KvError::OutOfBlocks { .. } | crate::kv::KvError::OutOfStateSlots { .. } => {
            Error::KvFull(e.to_string())
        }
        _ => Error::Model(format!("kv cache: {e}")),
    }
}
