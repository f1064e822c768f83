//! The KV coordinator: every KV group of a model (full attention, sliding windows) and its
//! recurrent-state slots, kept in step for each sequence. The scheduler owns one and is the
//! only code that allocates from it during serving ([`KvCoordinator::allocate_slots`], called
//! inside its planning loop); it builds each step's [`ForwardBatch`] (block tables, slot
//! mappings, state slots) from it, and commits or rewinds it when the step's outputs come back.
//! A [`crate::runner::Runner`] used directly (tools, tests, a draft model) owns one too.

use crate::error::{Error, Result};
use crate::kv::{BlockId, ContentSpan, KvError, KvManager, SeqId, StatePool, StateStats};
use crate::model::{ForwardBatch, SeqInput};

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
    pub fn rows(self, n: usize) -> std::ops::Range<usize> {
        match self {
            Logits::None => 0..0,
            Logits::Last => n.saturating_sub(1)..n,
            Logits::All => 0..n,
            Logits::From(i) => i.min(n)..n,
        }
    }
}

/// A block a rewind made private by copy-on-write: the device must copy `src` to `dst` in
/// KV group `group` before the next forward pass.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub group: usize,
    pub src: BlockId,
    pub dst: BlockId,
}

/// What [`KvCoordinator::rewind`] did: the sequence's cache now ends at `from` tokens (at or
/// before the `target` asked for; the tokens between must be fed again), after `copies`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rewind {
    pub from: usize,
    pub target: usize,
    pub copies: Vec<BlockCopy>,
}

/// One KV manager per KV group (`windows[g]`: that group's sliding window, `None` for full
/// attention) and, for a model with recurrent layers, the state pool.
#[derive(Debug)]
pub struct KvCoordinator {
    managers: Vec<KvManager>,
    windows: Vec<Option<usize>>,
    states: Option<StatePool>,
    block_size: usize,
    prefix_caching: bool,
    /// Tokens a sequence can always rewind without recomputing (sliding windows keep that
    /// many more).
    margin: usize,
    /// The content spans (images) of the sequences that have them: their blocks' hashes
    /// cover them.
    spans: std::collections::HashMap<SeqId, Vec<ContentSpan>>,
    /// The image grids of the sequences whose model places image tokens by row and column
    /// (given by [`KvCoordinator::add_image_grid`]; every batch of the sequence carries them).
    grids: std::collections::HashMap<SeqId, Vec<crate::model::ImageGrid>>,
}

pub(crate) fn kv_err(e: KvError) -> Error {
    match e {
        KvError::OutOfBlocks { .. } | KvError::OutOfStateSlots { .. } => {
            Error::KvFull(e.to_string())
        }
        _ => Error::Model(format!("kv cache: {e}")),
    }
}

impl KvCoordinator {
    /// Managers with `blocks[g]` blocks of `block_size` tokens per group, the window of each,
    /// and the state pool (when the model has recurrent layers).
    pub fn new(
        windows: Vec<Option<usize>>,
        blocks: &[usize],
        block_size: usize,
        prefix_caching: bool,
        margin: usize,
        states: Option<StatePool>,
    ) -> Result<KvCoordinator> {
        if windows.len() != blocks.len() {
            return Err(Error::Model(format!(
                "{} KV groups with {} pool sizes",
                windows.len(),
                blocks.len()
            )));
        }
        let managers = blocks
            .iter()
            .map(|&n| KvManager::new(n, block_size, prefix_caching).map_err(kv_err))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCoordinator {
            managers,
            windows,
            states,
            block_size: block_size.max(1),
            prefix_caching,
            margin,
            spans: Default::default(),
            grids: Default::default(),
        })
    }

    pub fn managers(&self) -> &[KvManager] {
        &self.managers
    }
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// The recurrent-state pool's counters (a model without state has none).
    pub fn state_stats(&self) -> Option<StateStats> {
        self.states.as_ref().map(StatePool::stats)
    }
    /// Whether the model has recurrent state.
    pub fn has_states(&self) -> bool {
        self.states.is_some()
    }

    /// The (first) full-attention group's manager: the pool the scheduler's counts and the
    /// server's figures speak of.
    pub fn full_group(&self) -> Option<&KvManager> {
        let i = self.windows.iter().position(Option::is_none).unwrap_or(0);
        self.managers.get(i)
    }

    /// Blocks free in the full-attention pool (cached ones no request holds included).
    pub fn free_blocks(&self) -> usize {
        self.full_group().map_or(0, KvManager::num_free_blocks)
    }

    /// Blocks `seq` holds in the full-attention pool.
    pub fn blocks_held(&self, seq: SeqId) -> usize {
        self.full_group()
            .and_then(|m| m.block_table(seq))
            .map_or(0, <[BlockId]>::len)
    }

    /// Tokens of `seq` in the cache.
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.managers
            .first()
            .and_then(|m| m.num_computed(seq))
            .unwrap_or(0)
    }

    /// The tokens of `seq` in the cache, oldest first.
    pub fn computed_tokens(&self, seq: SeqId) -> &[u32] {
        self.managers
            .first()
            .and_then(|m| m.computed_tokens(seq))
            .unwrap_or(&[])
    }

    /// Whether `seq` has KV state.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.managers.iter().any(|m| m.contains(seq))
            || self.states.as_ref().is_some_and(|s| s.contains(seq))
    }

    /// The first block a KV group needs of a sequence `n` blocks long: 0, or for a sliding
    /// window the first one it still sees.
    fn first_needed(&self, window: Option<usize>, n: usize) -> usize {
        window.map_or(0, |w| {
            (n * self.block_size).saturating_sub(w) / self.block_size
        })
    }

    /// The most full blocks of `prompt` (at most `max` tokens' worth) that a new sequence can
    /// resume from: every KV group holds the cached blocks it needs of them (all of them for
    /// full attention, those inside the window for a sliding one) and, for a recurrent model,
    /// the state after them is kept as a snapshot. With the cached block per lookable block
    /// of each group, which it looked up on the way.
    fn prefix_blocks(
        &self,
        prompt: &[u32],
        spans: &[ContentSpan],
        max: usize,
    ) -> (usize, Vec<Vec<Option<BlockId>>>) {
        if !self.prefix_caching || self.managers.is_empty() {
            return (0, Vec::new());
        }
        let bs = self.block_size;
        let maps: Vec<Vec<Option<BlockId>>> = self
            .managers
            .iter()
            .map(|m| m.cached_blocks(prompt, spans))
            .collect();
        let mut most = max / bs;
        for (w, map) in self.windows.iter().zip(&maps) {
            most = most.min(map.len());
            if w.is_none() {
                most = most.min(map.iter().take_while(|b| b.is_some()).count());
            }
        }
        let hashes = match &self.states {
            Some(_) => {
                crate::kv::block_hash::hash_full_blocks_with(&prompt[..most * bs], spans, bs, None)
            }
            None => Vec::new(),
        };
        let n = (1..=most)
            .rev()
            .find(|&n| {
                let windows =
                    self.windows.iter().zip(&maps).all(|(w, map)| {
                        map[self.first_needed(*w, n)..n].iter().all(Option::is_some)
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
    /// (only those blocks are taken), and for a recurrent model from the state snapshot after
    /// them. Returns how many leading tokens are already computed: 0 without prefix caching,
    /// without a hit, or when the pool cannot take the blocks now (the sequence then holds
    /// nothing).
    pub fn attach_prefix(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        spans: &[ContentSpan],
        max: usize,
    ) -> Result<usize> {
        if self.contains(seq) {
            return Ok(0);
        }
        if !spans.is_empty() {
            self.spans.insert(seq, spans.to_vec());
        }
        let (n, _) = self.prefix_blocks(prompt, spans, max);
        if n == 0 {
            return Ok(0);
        }
        let want = n * self.block_size;
        let firsts: Vec<usize> = (self.windows.iter())
            .map(|w| self.first_needed(*w, n))
            .collect();
        let mut ok = true;
        for (m, first) in self.managers.iter_mut().zip(firsts) {
            match m.attach_blocks(seq, prompt, spans, n, first) {
                Ok(r) if r == want => {}
                Ok(_) | Err(KvError::OutOfBlocks { .. }) => {
                    ok = false;
                    break;
                }
                Err(e) => {
                    self.free(seq)?;
                    return Err(kv_err(e));
                }
            }
        }
        if let (true, Some(st)) = (ok, &mut self.states) {
            let hash = self.managers.first().and_then(|m| m.block_hash(seq, n - 1));
            ok = hash.is_some_and(|h| st.start_at(seq, want, &h));
        }
        if !ok {
            self.free(seq)?;
            return Ok(0);
        }
        Ok(want)
    }

    /// Leading tokens of `prompt` the prefix cache holds now, and the free blocks of the
    /// full-attention pool taking them would use; (0, 0) without prefix caching.
    pub fn cached_prefix(&self, prompt: &[u32], spans: &[ContentSpan]) -> (usize, usize) {
        let (n, maps) = self.prefix_blocks(prompt, spans, usize::MAX);
        if n == 0 {
            return (0, 0);
        }
        let g = self.windows.iter().position(Option::is_none).unwrap_or(0);
        let free = match (self.managers.get(g), maps.get(g)) {
            (Some(m), Some(map)) => {
                let held: Vec<BlockId> = map.iter().take(n).flatten().copied().collect();
                m.free_among(&held)
            }
            _ => 0,
        };
        (n * self.block_size, free)
    }

    /// Cache slots for the next `new_tokens + lookahead` tokens of `seq` (beyond those
    /// computed) in every KV group, and the recurrent-state slot its next step writes. All or
    /// nothing: `Ok(false)`, with nothing allocated, when some group's pool or the state pool
    /// cannot take them (the scheduler then preempts). A sequence not held starts empty.
    pub fn allocate_slots(
        &mut self,
        seq: SeqId,
        new_tokens: usize,
        lookahead: usize,
    ) -> Result<bool> {
        let n = new_tokens + lookahead;
        for m in &self.managers {
            let need = match m.seq_len(seq) {
                Some(have) => {
                    let computed = m.num_computed(seq).unwrap_or(0);
                    m.blocks_needed_for_append(seq, (computed + n).saturating_sub(have))
                        .map_err(kv_err)?
                }
                None => n.div_ceil(self.block_size),
            };
            if need > m.num_free_blocks() {
                return Ok(false);
            }
        }
        if let Some(st) = &mut self.states {
            let fresh = !st.contains(seq);
            st.start(seq);
            match st.begin(seq) {
                Ok(_) => {}
                Err(KvError::OutOfStateSlots { .. }) => {
                    if fresh {
                        st.free_seq(seq);
                    }
                    return Ok(false);
                }
                Err(e) => return Err(kv_err(e)),
            }
        }
        for m in self.managers.iter_mut() {
            if !m.contains(seq) {
                m.add_sequence(seq, &[]).map_err(kv_err)?;
                if let Some(sp) = self.spans.get(&seq) {
                    m.set_spans(seq, sp).map_err(kv_err)?;
                }
            }
            let have = m.seq_len(seq).unwrap_or(0);
            let computed = m.num_computed(seq).unwrap_or(0);
            m.append_slots(seq, (computed + n).saturating_sub(have))
                .map_err(kv_err)?;
        }
        Ok(true)
    }

    /// After a forward pass: `toks` of `seq` are computed in every KV group and its new
    /// recurrent state is current; the blocks a sliding window no longer sees go back, and a
    /// state that ends a full block is kept as that block's snapshot.
    pub fn commit(&mut self, seq: SeqId, toks: &[u32]) -> Result<()> {
        let margin = self.margin;
        for (m, w) in self.managers.iter_mut().zip(&self.windows) {
            m.commit_tokens(seq, toks).map_err(kv_err)?;
            if let Some(w) = w {
                m.release_outside_window(seq, w + margin).map_err(kv_err)?;
            }
        }
        let len = self.seq_len(seq);
        if let Some(st) = &mut self.states {
            st.commit(seq, len).map_err(kv_err)?;
            let bs = self.block_size;
            if self.prefix_caching && len.is_multiple_of(bs) && len > 0 {
                if let Some(h) = self
                    .managers
                    .first()
                    .and_then(|m| m.block_hash(seq, len / bs - 1))
                {
                    st.snapshot(seq, h);
                }
            }
        }
        Ok(())
    }

    /// Drops the last `k` computed tokens of `seq`, as if they had never been fed: their KV
    /// slots are released, and a recurrent state returns to its checkpoint (or prefix
    /// snapshot) at the new length, or to the newest earlier one (the tokens between are then
    /// to be fed again: [`Rewind::from`]). Fails, changing nothing, if a sliding window
    /// already released a block the shorter sequence needs or the pool has no block for a
    /// copy-on-write.
    pub fn rewind(&mut self, seq: SeqId, k: usize) -> Result<Rewind> {
        let len = self.seq_len(seq);
        if k > len {
            return Err(Error::Model(format!(
                "sequence {seq} has {len} tokens; cannot roll back {k}"
            )));
        }
        let target = len - k;
        if k == 0 {
            return Ok(Rewind {
                from: len,
                target: len,
                copies: Vec::new(),
            });
        }
        let bs = self.block_size;
        // Where the state can resume: a checkpoint, or a nearer prefix snapshot.
        let mut from = target;
        let mut snapshot = None;
        if let Some(st) = &self.states {
            from = st.checkpoint_at(seq, target);
            if self.prefix_caching {
                for i in (from / bs + 1..=target / bs).rev() {
                    let h = self.managers.first().and_then(|m| m.block_hash(seq, i - 1));
                    if let Some(h) = h.filter(|h| st.has_snapshot(h)) {
                        from = i * bs;
                        snapshot = Some(h);
                        break;
                    }
                }
            }
        }
        for (m, w) in self.managers.iter().zip(&self.windows) {
            m.check_truncate(seq, from, *w).map_err(kv_err)?;
        }
        let mut copies = Vec::new();
        for (group, (m, w)) in self.managers.iter_mut().zip(&self.windows).enumerate() {
            if let Some((src, dst)) = m.truncate(seq, from, *w).map_err(kv_err)? {
                copies.push(BlockCopy { group, src, dst });
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
        Ok(Rewind {
            from,
            target,
            copies,
        })
    }

    /// Frees a sequence's cache blocks and state slots.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        self.spans.remove(&seq);
        self.grids.remove(&seq);
        if let Some(st) = &mut self.states {
            st.free_seq(seq);
        }
        for m in self.managers.iter_mut() {
            if m.contains(seq) {
                m.free_sequence(seq).map_err(kv_err)?;
            }
        }
        Ok(())
    }

    /// Records an image of sequence `seq` (once per start) for its batches to carry.
    pub fn add_image_grid(&mut self, seq: SeqId, grid: crate::model::ImageGrid) {
        let g = self.grids.entry(seq).or_default();
        if !g.iter().any(|x| x.start == grid.start) {
            g.push(grid);
            g.sort_by_key(|x| x.start);
        }
    }

    /// The forward batch of `items` (each sequence's next tokens, after those computed, in
    /// slots [`KvCoordinator::allocate_slots`] gave them): positions, slot mappings per
    /// group, block tables, the state slots read and written, and the rows wanting logits.
    pub fn batch(&self, items: &[(SeqId, &[u32], Logits)]) -> ForwardBatch {
        let mut b = ForwardBatch {
            slots: vec![Vec::new(); self.managers.len()],
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
            for (g, m) in self.managers.iter().enumerate() {
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
                    .managers
                    .iter()
                    .map(|m| m.block_table(*seq).unwrap_or(&[]).to_vec())
                    .collect(),
                state_read,
                state_slot,
                images: self.grids.get(seq).cloned().unwrap_or_default(),
            });
        }
        b
    }

    /// A batch that reads the cache and writes nothing: one row per `(seq, token)` at the
    /// sequence's next position, attending to the tokens the cache holds of it (an MTP
    /// assistant's drafting step over its target's cache). Every row wants logits.
    pub fn lookahead_batch(&self, rows: &[(SeqId, u32)]) -> Result<ForwardBatch> {
        let mut b = ForwardBatch {
            slots: vec![vec![-1; rows.len()]; self.managers.len()],
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
                    .managers
                    .iter()
                    .map(|m| m.block_table(seq).unwrap_or(&[]).to_vec())
                    .collect(),
                state_read: 0,
                state_slot: 0,
                images: Vec::new(),
            });
        }
        Ok(b)
    }
}
