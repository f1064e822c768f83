//! Per-sequence KV bookkeeping over a [`BlockPool`]: block tables, prefix caching and sliding
//! window release. No tensors here; slot ids index a backend's paged KV cache
//! (`slot = block * block_size + offset`).
//!
//! Life of a sequence:
//! 1. `add_sequence(seq, prompt)` reuses cached full prompt blocks (chained-hash lookup, stopping
//!    at the first miss, never the block holding the last prompt token) and allocates the rest.
//!    It returns the number of prompt tokens whose KV is already there.
//! 2. After the forward pass writes KV, `commit_tokens(seq, tokens)` says so: `tokens` are the ids
//!    of the next positions after those already computed (for a prompt, `&prompt[reused..]`; for a
//!    decode step, the token just fed). Full computed blocks are then hashed and cached.
//! 3. `append_slots(seq, n)` reserves room for `n` more tokens before a step writes them.
//! 4. `release_outside_window` frees blocks a sliding window no longer sees; `free_sequence` frees
//!    the rest. Freed cached blocks stay reusable until the pool evicts them.

use std::collections::HashMap;
use std::ops::Range;

use super::block_hash::{block_content, hash_block_with, BlockHash, ContentSpan};
use super::block_pool::BlockPool;
use super::error::KvError;
use super::{BlockId, SeqId, NULL_BLOCK};

/// The slot id of padding / positions with no KV block (vLLM's `PAD_SLOT_ID`).
pub const PAD_SLOT: i32 = -1;

/// Prefix-cache counters, in tokens like vLLM's: `queried_tokens` counts prompt tokens looked up,
/// `hit_tokens` those reused. Only successful `add_sequence` calls with prefix caching on count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queried_tokens: u64,
    pub hit_tokens: u64,
}

impl PrefixCacheStats {
    pub fn hit_rate(&self) -> f64 {
        if self.queried_tokens == 0 {
            return 0.0;
        }
        self.hit_tokens as f64 / self.queried_tokens as f64
    }
}

#[derive(Debug, Clone)]
struct SeqState {
    /// Token slots reserved (the sequence length as far as the KV cache is concerned).
    len: usize,
    /// One entry per `block_size` slots; `NULL_BLOCK` where a sliding window released it.
    blocks: Vec<BlockId>,
    /// Known token ids (the prompt, then committed tokens); at least `computed` long.
    tokens: Vec<u32>,
    /// Leading tokens whose KV has been written.
    computed: usize,
    /// Chained hashes of the leading full computed blocks (only with prefix caching).
    hashes: Vec<BlockHash>,
    /// Blocks before this index were already released by the sliding window.
    released: usize,
    extra: Option<u64>,
    /// Positions standing for content beyond their ids (images), part of their blocks' hashes.
    spans: Vec<ContentSpan>,
}

#[derive(Debug, Clone)]
pub struct KvManager {
    pool: BlockPool,
    seqs: HashMap<SeqId, SeqState>,
    prefix_caching: bool,
    stats: PrefixCacheStats,
}

impl KvManager {
    /// A manager over a fresh `BlockPool::new(num_blocks, block_size)`.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        prefix_caching: bool,
    ) -> Result<Self, KvError> {
        Ok(Self::with_pool(
            BlockPool::new(num_blocks, block_size)?,
            prefix_caching,
        ))
    }

    pub fn with_pool(pool: BlockPool, prefix_caching: bool) -> Self {
        KvManager {
            pool,
            seqs: HashMap::new(),
            prefix_caching,
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    pub fn can_allocate(&self, n_blocks: usize) -> bool {
        n_blocks <= self.pool.num_free()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    pub fn reset_prefix_cache_stats(&mut self) {
        self.stats = PrefixCacheStats::default();
    }

    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// `add_sequence_with_key` without an extra cache key.
    pub fn add_sequence(&mut self, seq: SeqId, prompt: &[u32]) -> Result<usize, KvError> {
        self.add_sequence_with_key(seq, prompt, None)
    }

    /// Starts `seq` with `prompt`, reusing cached prompt blocks whose chained hash (with `extra`,
    /// e.g. a LoRA id) matches, and allocating blocks for the rest. Returns the number of prompt
    /// tokens reused (a multiple of the block size, always `< prompt.len()` for a non-empty
    /// prompt). On error nothing changes.
    pub fn add_sequence_with_key(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        extra: Option<u64>,
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists { seq });
        }
        let (hits, hashes) = self.lookup_prefix(prompt, &[], extra);
        let blocks = self.take_blocks(&hits, prompt.len())?;
        let reused = hits.len() * self.block_size();
        if self.prefix_caching {
            self.stats.requests += 1;
            self.stats.queried_tokens += prompt.len() as u64;
            self.stats.hit_tokens += reused as u64;
        }
        let state = SeqState {
            len: prompt.len(),
            blocks,
            tokens: prompt.to_vec(),
            computed: reused,
            hashes,
            released: 0,
            extra,
            spans: Vec::new(),
        };
        self.seqs.insert(seq, state);
        Ok(reused)
    }

    /// Leading tokens of `prompt` that `attach_prefix` would reuse now, and how many of the
    /// pool's free blocks that takes (cached blocks no sequence holds are counted free).
    pub fn cached_prefix(&self, prompt: &[u32]) -> (usize, usize) {
        let (hits, _) = self.lookup_prefix(prompt, &[], None);
        let free = hits.iter().filter(|&&b| self.pool.is_free(b)).count();
        (hits.len() * self.block_size(), free)
    }

    /// Starts `seq` from the cached full blocks of `prompt`'s first `max` tokens, holding only
    /// those blocks: the sequence's length and computed tokens are the reused count (a multiple
    /// of the block size, `< prompt.len()`), and slots for the rest are appended as it is fed.
    /// Returns the tokens reused (0 without prefix caching or a hit). On error nothing changes.
    pub fn attach_prefix(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        spans: &[ContentSpan],
        max: usize,
    ) -> Result<usize, KvError> {
        let (hits, _) = self.lookup_prefix(prompt, spans, None);
        let n = hits.len().min(max / self.block_size());
        self.attach_blocks(seq, prompt, spans, n, 0)
    }

    /// The content spans (images) of `seq`'s positions, which its blocks' hashes cover from
    /// now on; a sequence started by [`KvManager::attach_blocks`] has them already.
    pub fn set_spans(&mut self, seq: SeqId, spans: &[ContentSpan]) -> Result<(), KvError> {
        self.state_mut(seq)?.spans = spans.to_vec();
        Ok(())
    }

    /// Per leading full block of `prompt` that a lookup may reuse (never the block of the last
    /// token): the cached block holding it, if any. Unlike a prefix lookup this goes on past a
    /// miss, as a sliding window needs only the blocks inside it.
    pub fn cached_blocks(&self, prompt: &[u32], spans: &[ContentSpan]) -> Vec<Option<BlockId>> {
        if !self.prefix_caching {
            return Vec::new();
        }
        let bs = self.block_size();
        let lookable = prompt.len().saturating_sub(1) / bs;
        let mut parent = None;
        prompt
            .chunks_exact(bs)
            .take(lookable)
            .enumerate()
            .map(|(i, tokens)| {
                let hash = hash_block_with(parent, tokens, None, block_content(spans, i, bs));
                parent = Some(hash);
                self.pool.get_cached(hash, tokens)
            })
            .collect()
    }

    /// Starts `seq` at the end of `prompt`'s first `n` full blocks, taking the cached blocks
    /// `first..n` (all must be cached) and leaving the ones before `first` null, as a sliding
    /// window that no longer sees them would have. The sequence's length and computed tokens
    /// are `n` blocks. Returns the tokens reused. On error nothing changes.
    pub fn attach_blocks(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        spans: &[ContentSpan],
        n: usize,
        first: usize,
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists { seq });
        }
        let bs = self.block_size();
        let first = first.min(n);
        let cached = self.cached_blocks(prompt, spans);
        let hits: Option<Vec<BlockId>> = cached
            .get(first..n)
            .and_then(|c| c.iter().copied().collect());
        let hits = match hits {
            Some(h) if n > 0 => h,
            _ => return Ok(0),
        };
        self.take_held(&hits)?;
        let reused = n * bs;
        let mut hashes = Vec::with_capacity(n);
        for (i, tokens) in prompt.chunks_exact(bs).take(n).enumerate() {
            let content = block_content(spans, i, bs);
            hashes.push(hash_block_with(
                hashes.last().copied(),
                tokens,
                None,
                content,
            ));
        }
        if self.prefix_caching {
            self.stats.requests += 1;
            self.stats.queried_tokens += prompt.len() as u64;
            self.stats.hit_tokens += reused as u64;
        }
        let mut blocks = vec![NULL_BLOCK; first];
        blocks.extend(hits);
        let state = SeqState {
            len: reused,
            blocks,
            tokens: prompt.to_vec(),
            computed: reused,
            hashes,
            released: first,
            extra: None,
            spans: spans.to_vec(),
        };
        self.seqs.insert(seq, state);
        Ok(reused)
    }

    /// How many of `blocks` are free now (cached but held by nobody): taking them uses that
    /// many free blocks.
    pub fn free_among(&self, blocks: &[BlockId]) -> usize {
        blocks.iter().filter(|&&b| self.pool.is_free(b)).count()
    }

    /// The chained hash of full block `i` of `seq`, once it is computed (prefix caching only).
    pub fn block_hash(&self, seq: SeqId, i: usize) -> Option<BlockHash> {
        self.seqs.get(&seq)?.hashes.get(i).copied()
    }

    /// The computed tokens of `seq`.
    pub fn computed_tokens(&self, seq: SeqId) -> Option<&[u32]> {
        let s = self.seqs.get(&seq)?;
        s.tokens.get(..s.computed)
    }

    /// Whether `truncate(seq, len, window)` can succeed.
    pub fn check_truncate(
        &self,
        seq: SeqId,
        len: usize,
        window: Option<usize>,
    ) -> Result<(), KvError> {
        let state = self.state(seq)?;
        if len > state.computed {
            return Err(KvError::Rollback {
                seq,
                to: len,
                reason: "past the computed tokens",
            });
        }
        let bs = self.block_size();
        let needed_from = window.map_or(0, |w| len.saturating_sub(w) / bs);
        if needed_from < state.released {
            return Err(KvError::Rollback {
                seq,
                to: len,
                reason: "the sliding window has released a block it needs",
            });
        }
        // A shared block the new end lies inside is copied to a fresh one.
        let shared_partial = !len.is_multiple_of(bs)
            && state.hashes.len() > len / bs
            && state
                .blocks
                .get(len / bs)
                .is_some_and(|&b| b != NULL_BLOCK && self.pool.ref_count(b) != Some(1));
        if shared_partial && self.pool.num_free() == 0 {
            return Err(KvError::OutOfBlocks {
                requested: 1,
                free: 0,
            });
        }
        Ok(())
    }

    /// Drops every token of `seq` from `len` on: blocks past it go back to the pool (tail
    /// first) and a block it now ends inside leaves the prefix cache, as its tail will be
    /// written again. Returns `Some((shared, fresh))` when that block is also held by another
    /// sequence: `seq` then holds the fresh block `fresh` in its place, and the caller must
    /// copy the block's contents from `shared` to `fresh` before writing. Fails (changing
    /// nothing) if a sliding window already released a block the shorter sequence needs.
    pub fn truncate(
        &mut self,
        seq: SeqId,
        len: usize,
        window: Option<usize>,
    ) -> Result<Option<(BlockId, BlockId)>, KvError> {
        self.check_truncate(seq, len, window)?;
        let bs = self.block_size();
        let state = self.state(seq)?;
        let keep = len.div_ceil(bs);
        let tail = live_blocks_reversed(&state.blocks[keep.min(state.blocks.len())..]);
        // The block the new end lies inside, if it was registered as full.
        let partial = (!len.is_multiple_of(bs) && state.hashes.len() > len / bs)
            .then(|| state.blocks[len / bs])
            .filter(|&b| b != NULL_BLOCK);
        let mut copy = None;
        if let Some(b) = partial {
            if self.pool.ref_count(b) == Some(1) {
                self.pool.uncache(b)?;
            } else {
                let fresh = self.pool.allocate(1)?;
                copy = fresh.first().map(|&f| (b, f));
            }
        }
        self.pool.free(&tail)?;
        let state = self.state_mut(seq)?;
        if let Some((old, fresh)) = copy {
            state.blocks[len / bs] = fresh;
            self.pool.free(&[old])?;
        }
        let state = self.state_mut(seq)?;
        state.blocks.truncate(keep);
        state.len = len;
        state.computed = len;
        state.tokens.truncate(len);
        state.hashes.truncate(len / bs);
        Ok(copy)
    }

    /// Grows `seq` by `n` token slots, allocating blocks as needed. On `OutOfBlocks` nothing
    /// changes.
    pub fn append_slots(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        let need = self.blocks_needed_for_append(seq, n)?;
        let fresh = self.pool.allocate(need)?;
        let state = self.state_mut(seq)?;
        state.blocks.extend(fresh);
        state.len = state.len.saturating_add(n);
        Ok(())
    }

    /// How many new blocks `append_slots(seq, n)` would allocate.
    pub fn blocks_needed_for_append(&self, seq: SeqId, n: usize) -> Result<usize, KvError> {
        let state = self.state(seq)?;
        let blocks = state.len.saturating_add(n).div_ceil(self.block_size());
        Ok(blocks.saturating_sub(state.blocks.len()))
    }

    /// Marks the next `tokens.len()` positions of `seq` (after those already computed) as
    /// computed, with these token ids; positions already known (the prompt) must match. Full
    /// computed blocks are then registered in the prefix cache. On error nothing changes.
    pub fn commit_tokens(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let state = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence { seq })?;
        check_commit(seq, state, tokens)?;
        let start = state.computed;
        let known = state.tokens.len();
        let new_from = known.saturating_sub(start).min(tokens.len());
        state.tokens.extend_from_slice(&tokens[new_from..]);
        state.computed += tokens.len();
        if self.prefix_caching {
            register_full_blocks(&mut self.pool, state)?;
        }
        Ok(())
    }

    /// The block table of `seq`: one entry per `block_size` slots, `NULL_BLOCK` where released.
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        Some(&self.seqs.get(&seq)?.blocks)
    }

    /// Token slots reserved for `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        Some(self.seqs.get(&seq)?.len)
    }

    /// Leading tokens of `seq` whose KV is computed.
    pub fn num_computed(&self, seq: SeqId) -> Option<usize> {
        Some(self.seqs.get(&seq)?.computed)
    }

    /// The KV slot of position `pos` of `seq`: `block_table[pos / bs] * bs + pos % bs`; `None`
    /// past the sequence length or in a released (null) block.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Option<usize> {
        let state = self.seqs.get(&seq)?;
        if pos >= state.len {
            return None;
        }
        let bs = self.block_size();
        let block = state.blocks[pos / bs];
        if block == NULL_BLOCK {
            return None;
        }
        Some(block as usize * bs + pos % bs)
    }

    /// The slots of `positions` of `seq`, `PAD_SLOT` (-1) where `slot` gives `None`. `None` for an
    /// unknown sequence.
    pub fn slot_mapping(&self, seq: SeqId, positions: Range<usize>) -> Option<Vec<i32>> {
        self.seqs.get(&seq)?;
        let to_i32 = |s: usize| i32::try_from(s).unwrap_or(PAD_SLOT);
        let slots = positions.map(|pos| self.slot(seq, pos).map_or(PAD_SLOT, to_i32));
        Some(slots.collect())
    }

    /// Frees the blocks of `seq` that lie wholly before `seq_len - window` (tail first, as in
    /// `free_sequence`); their table entries become `NULL_BLOCK` so indices stay stable. Returns
    /// how many blocks were freed.
    pub fn release_outside_window(&mut self, seq: SeqId, window: usize) -> Result<usize, KvError> {
        let bs = self.block_size();
        let state = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence { seq })?;
        // From the computed tokens: slots reserved ahead of them (a step that did not run)
        // are not yet in the window.
        let end = state.computed.saturating_sub(window) / bs;
        if end <= state.released {
            return Ok(0);
        }
        let range = state.released..end;
        let freed = live_blocks_reversed(&state.blocks[range.clone()]);
        self.pool.free(&freed)?;
        state.blocks[range].fill(NULL_BLOCK);
        state.released = end;
        Ok(freed.len())
    }

    /// Ends `seq`, freeing its blocks tail first so the tail is evicted before the shared prefix.
    /// Cached full blocks stay in the prefix cache until evicted.
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        let state = self.state(seq)?;
        let freed = live_blocks_reversed(&state.blocks);
        self.pool.free(&freed)?;
        self.seqs.remove(&seq);
        Ok(())
    }

    fn state(&self, seq: SeqId) -> Result<&SeqState, KvError> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence { seq })
    }

    fn state_mut(&mut self, seq: SeqId) -> Result<&mut SeqState, KvError> {
        self.seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence { seq })
    }

    /// Cached blocks for the leading full blocks of `prompt` (stopping at the first miss and
    /// never including the block of the last token), with their chained hashes.
    fn lookup_prefix(
        &self,
        prompt: &[u32],
        spans: &[ContentSpan],
        extra: Option<u64>,
    ) -> (Vec<BlockId>, Vec<BlockHash>) {
        let (mut hits, mut hashes) = (Vec::new(), Vec::new());
        if !self.prefix_caching {
            return (hits, hashes);
        }
        let bs = self.block_size();
        let lookable = prompt.len().saturating_sub(1) / bs;
        for (i, tokens) in prompt.chunks_exact(bs).take(lookable).enumerate() {
            let content = block_content(spans, i, bs);
            let hash = hash_block_with(hashes.last().copied(), tokens, extra, content);
            let Some(block) = self.pool.get_cached(hash, tokens) else {
                break;
            };
            hits.push(block);
            hashes.push(hash);
        }
        (hits, hashes)
    }

    /// Takes a ref on each of the cached `hits`; all or nothing.
    fn take_held(&mut self, hits: &[BlockId]) -> Result<(), KvError> {
        let free_hits = self.free_among(hits);
        if free_hits > self.pool.num_free() {
            return Err(KvError::OutOfBlocks {
                requested: free_hits,
                free: self.pool.num_free(),
            });
        }
        self.pool.touch(hits)
    }

    /// Touches `hits` and allocates the rest of a table for `len` tokens; all or nothing.
    fn take_blocks(&mut self, hits: &[BlockId], len: usize) -> Result<Vec<BlockId>, KvError> {
        let new = len.div_ceil(self.block_size()) - hits.len();
        let free_hits = hits.iter().filter(|&&b| self.pool.is_free(b)).count();
        if new + free_hits > self.pool.num_free() {
            return Err(KvError::OutOfBlocks {
                requested: new + free_hits,
                free: self.pool.num_free(),
            });
        }
        self.pool.touch(hits)?;
        let fresh = match self.pool.allocate(new) {
            Ok(fresh) => fresh,
            Err(e) => {
                self.pool.free(hits)?;
                return Err(e);
            }
        };
        Ok(hits.iter().copied().chain(fresh).collect())
    }
}

/// Checks a commit of `tokens` to `state` without changing it.
fn check_commit(seq: SeqId, state: &SeqState, tokens: &[u32]) -> Result<(), KvError> {
    if state.computed + tokens.len() > state.len {
        return Err(KvError::CommitPastEnd {
            seq,
            computed: state.computed,
            count: tokens.len(),
            len: state.len,
        });
    }
    let known = &state.tokens[state.computed..];
    for (i, (&expected, &got)) in known.iter().zip(tokens).enumerate() {
        if expected != got {
            let pos = state.computed + i;
            return Err(KvError::TokenMismatch {
                seq,
                pos,
                expected,
                got,
            });
        }
    }
    Ok(())
}

/// Hashes the full computed blocks of `state` not hashed yet and caches those still held.
fn register_full_blocks(pool: &mut BlockPool, state: &mut SeqState) -> Result<(), KvError> {
    let bs = pool.block_size();
    let full = state.computed / bs;
    for i in state.hashes.len()..full {
        let tokens = &state.tokens[i * bs..(i + 1) * bs];
        let content = block_content(&state.spans, i, bs);
        let hash = hash_block_with(state.hashes.last().copied(), tokens, state.extra, content);
        if state.blocks[i] != NULL_BLOCK {
            pool.cache_full_block(state.blocks[i], hash, tokens)?;
        }
        state.hashes.push(hash);
    }
    Ok(())
}

/// The non-null blocks of `table`, last first.
fn live_blocks_reversed(table: &[BlockId]) -> Vec<BlockId> {
    let live = table.iter().rev().filter(|&&b| b != NULL_BLOCK);
    live.copied().collect()
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
