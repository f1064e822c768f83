//! The block pool: `num_blocks` KV blocks of `block_size` tokens, with vLLM's semantics.
//!
//! - Block 0 is the **null block**. It is never handed out and never freed; block tables use it
//!   for padding and for blocks released by a sliding window.
//! - Every other block has a ref count. Blocks with ref count 0 sit in the **free queue**, a
//!   doubly linked list over block ids (`prev`/`next` index arrays, with one sentinel slot) that
//!   supports O(1) append at the tail, pop at the head and removal from the middle.
//! - The queue order is the eviction order (LRU): `free` appends blocks reaching ref count 0 at
//!   the tail in the order given; `allocate` pops from the head. The pool frees in exactly the
//!   order of the slice it is given; the manager passes a sequence's blocks in *reverse* so the
//!   tail of a sequence, the part least likely to be shared as a prefix, is evicted first.
//! - A free block may still hold valid KV for a cached hash (prefix caching). `touch` revives it
//!   on a cache hit (ref 0 → 1 takes it out of the queue); `allocate` evicts it: the block's entry
//!   in the cached-block map is dropped before the block is reused.
//!
//! Every operation validates its input first and returns a [`KvError`] instead of panicking; a
//! failed call leaves the pool unchanged.

use std::collections::HashMap;

use super::block_hash::BlockHash;
use super::error::KvError;
use super::{BlockId, NULL_BLOCK};

/// What the pool remembers of a block cached for prefix reuse.
#[derive(Debug, Clone)]
struct CachedBlock {
    hash: BlockHash,
    /// The block's token ids, checked on every lookup so a hash collision cannot return a block
    /// holding other tokens.
    tokens: Box<[u32]>,
}

#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    /// Free queue links; index `num_blocks` is the sentinel (head = `next[sentinel]`).
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    num_free: usize,
    cached: Vec<Option<CachedBlock>>,
    cache_map: HashMap<BlockHash, BlockId>,
}

impl BlockPool {
    /// A pool with blocks `0..num_blocks` (block 0 is the null block, so `num_blocks - 1` are
    /// usable), all free, queued in id order. Every slot id `block * block_size + offset` must fit
    /// in an `i32` (slot mappings are `i32`).
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        let invalid = |reason| KvError::InvalidConfig {
            num_blocks,
            block_size,
            reason,
        };
        if num_blocks == 0 {
            return Err(invalid("the pool needs at least the null block"));
        }
        if block_size == 0 {
            return Err(invalid("block_size must be at least 1"));
        }
        match num_blocks.checked_mul(block_size) {
            Some(slots) if slots <= i32::MAX as usize => {}
            _ => {
                return Err(invalid(
                    "num_blocks * block_size must fit in an i32 slot id",
                ))
            }
        }
        let mut pool = BlockPool {
            block_size,
            refs: vec![0; num_blocks],
            prev: vec![0; num_blocks + 1],
            next: vec![0; num_blocks + 1],
            in_queue: vec![false; num_blocks],
            num_free: 0,
            cached: vec![None; num_blocks],
            cache_map: HashMap::new(),
        };
        let sentinel = pool.sentinel();
        pool.prev[sentinel as usize] = sentinel;
        pool.next[sentinel as usize] = sentinel;
        for block in 1..num_blocks as BlockId {
            pool.push_back(block);
        }
        Ok(pool)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// All blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks in the free queue (ref count 0), cached or not.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks held by someone (ref count > 0).
    pub fn num_used(&self) -> usize {
        self.num_blocks() - 1 - self.num_free
    }

    /// Entries in the cached-block map.
    pub fn num_cached(&self) -> usize {
        self.cache_map.len()
    }

    /// Fraction of the usable blocks (all but the null block) in use, 0.0..=1.0.
    pub fn usage(&self) -> f64 {
        let usable = self.num_blocks() - 1;
        if usable == 0 {
            return 0.0;
        }
        self.num_used() as f64 / usable as f64
    }

    /// The ref count of `block`, or `None` for an id outside the pool.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.refs.get(block as usize).copied()
    }

    /// Whether `block` is in the free queue.
    pub fn is_free(&self, block: BlockId) -> bool {
        self.in_queue.get(block as usize).copied().unwrap_or(false)
    }

    /// The hash `block` is cached under, if any.
    pub fn cached_hash(&self, block: BlockId) -> Option<BlockHash> {
        let cached = self.cached.get(block as usize)?.as_ref()?;
        Some(cached.hash)
    }

    /// The free queue from head (next to be allocated) to tail. O(num_free); for tests and
    /// debugging.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let sentinel = self.sentinel();
        let mut out = Vec::with_capacity(self.num_free);
        let mut cur = self.next[sentinel as usize];
        while cur != sentinel {
            out.push(cur);
            cur = self.next[cur as usize];
        }
        out
    }

    /// Takes `n` blocks from the head of the free queue, each with ref count 1, evicting any
    /// cached hash they still carry. All or nothing: `OutOfBlocks` when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, KvError> {
        if n > self.num_free {
            return Err(KvError::OutOfBlocks {
                requested: n,
                free: self.num_free,
            });
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(block) = self.pop_front() else {
                break;
            };
            self.evict(block);
            self.refs[block as usize] = 1;
            out.push(block);
        }
        Ok(out)
    }

    /// Drops one reference from each block (a block may appear several times); blocks reaching 0
    /// are appended to the free queue tail in slice order. A block already free is a
    /// `DoubleFree`; more drops in one call than refs held is a `RefUnderflow`. All or nothing.
    pub fn free(&mut self, blocks: &[BlockId]) -> Result<(), KvError> {
        for (i, &block) in blocks.iter().enumerate() {
            if let Err(e) = self.decref(block, &blocks[..i]) {
                self.undo_decrefs(&blocks[..i]);
                return Err(e);
            }
        }
        for &block in blocks {
            if self.refs[block as usize] == 0 && !self.in_queue[block as usize] {
                self.push_back(block);
            }
        }
        Ok(())
    }

    /// Adds one reference to each block (a prefix-cache hit); a block in the free queue
    /// (ref 0 → 1) leaves it but keeps its cached hash. All or nothing.
    pub fn touch(&mut self, blocks: &[BlockId]) -> Result<(), KvError> {
        for &block in blocks {
            self.check_id(block, "touch")?;
            if self.refs[block as usize] as u64 + blocks.len() as u64 > u32::MAX as u64 {
                return Err(KvError::RefOverflow { block });
            }
        }
        for &block in blocks {
            if self.in_queue[block as usize] {
                self.unlink(block);
            }
            self.refs[block as usize] += 1;
        }
        Ok(())
    }

    /// Registers the full, computed `block` holding `tokens` under `hash`. Returns whether it was
    /// added: `false` when `hash` already names a block (the first one stays; a collision with
    /// other tokens is simply not cached) or this block is already cached under `hash`.
    pub fn cache_full_block(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        tokens: &[u32],
    ) -> Result<bool, KvError> {
        self.check_id(block, "cache_full_block")?;
        if tokens.len() != self.block_size {
            return Err(KvError::WrongBlockLength {
                expected: self.block_size,
                got: tokens.len(),
            });
        }
        if self.refs[block as usize] == 0 {
            return Err(KvError::NotInUse { block });
        }
        if let Some(cached) = &self.cached[block as usize] {
            if cached.hash == hash && *cached.tokens == *tokens {
                return Ok(false);
            }
            return Err(KvError::AlreadyCached { block });
        }
        if self.cache_map.contains_key(&hash) {
            return Ok(false);
        }
        self.cache_map.insert(hash, block);
        self.cached[block as usize] = Some(CachedBlock {
            hash,
            tokens: tokens.into(),
        });
        Ok(true)
    }

    /// Forgets `block`'s prefix-cache entry (its contents are about to change). Only a block
    /// held by exactly one owner may be uncached.
    pub fn uncache(&mut self, block: BlockId) -> Result<(), KvError> {
        self.check_id(block, "uncache")?;
        if self.refs[block as usize] != 1 {
            return Err(KvError::NotInUse { block });
        }
        self.evict(block);
        Ok(())
    }

    /// The block cached under `hash`, if its stored tokens equal `tokens`. Does not touch it.
    pub fn get_cached(&self, hash: BlockHash, tokens: &[u32]) -> Option<BlockId> {
        let &block = self.cache_map.get(&hash)?;
        let cached = self.cached[block as usize].as_ref()?;
        (*cached.tokens == *tokens).then_some(block)
    }

    fn sentinel(&self) -> BlockId {
        self.refs.len() as BlockId
    }

    fn check_id(&self, block: BlockId, op: &'static str) -> Result<(), KvError> {
        if block == NULL_BLOCK {
            return Err(KvError::NullBlock { op });
        }
        if block as usize >= self.refs.len() {
            return Err(KvError::UnknownBlock {
                op,
                block,
                num_blocks: self.refs.len(),
            });
        }
        Ok(())
    }

    /// Drops one ref of `block`; `earlier` are the blocks this `free` call already dropped.
    fn decref(&mut self, block: BlockId, earlier: &[BlockId]) -> Result<(), KvError> {
        self.check_id(block, "free")?;
        let i = block as usize;
        if self.refs[i] == 0 {
            if self.in_queue[i] {
                return Err(KvError::DoubleFree { block });
            }
            let held = earlier.iter().filter(|&&b| b == block).count();
            return Err(KvError::RefUnderflow { block, held });
        }
        self.refs[i] -= 1;
        Ok(())
    }

    fn undo_decrefs(&mut self, blocks: &[BlockId]) {
        for &block in blocks {
            self.refs[block as usize] += 1;
        }
    }

    /// Drops the cached-map entry of a block about to be reused.
    fn evict(&mut self, block: BlockId) {
        let Some(cached) = self.cached[block as usize].take() else {
            return;
        };
        if self.cache_map.get(&cached.hash) == Some(&block) {
            self.cache_map.remove(&cached.hash);
        }
    }

    fn push_back(&mut self, block: BlockId) {
        let sentinel = self.sentinel();
        let tail = self.prev[sentinel as usize];
        self.next[tail as usize] = block;
        self.prev[block as usize] = tail;
        self.next[block as usize] = sentinel;
        self.prev[sentinel as usize] = block;
        self.in_queue[block as usize] = true;
        self.num_free += 1;
    }

    fn pop_front(&mut self) -> Option<BlockId> {
        let head = self.next[self.sentinel() as usize];
        if head == self.sentinel() {
            return None;
        }
        self.unlink(head);
        Some(head)
    }

    fn unlink(&mut self, block: BlockId) {
        let (prev, next) = (self.prev[block as usize], self.next[block as usize]);
        self.next[prev as usize] = next;
        self.prev[next as usize] = prev;
        self.in_queue[block as usize] = false;
        self.num_free -= 1;
    }

    /// Checks every internal invariant; panics with a message on the first broken one.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let queue = self.free_queue();
        assert_eq!(queue.len(), self.num_free, "queue length vs num_free");
        assert_eq!(self.refs[0], 0, "null block ref count");
        assert!(!self.in_queue[0], "null block in queue");
        for &b in &queue {
            assert_eq!(self.refs[b as usize], 0, "block {b} in queue with refs");
            assert!(self.in_queue[b as usize], "block {b} in queue, flag unset");
        }
        let unqueued_free = (1..self.refs.len())
            .filter(|&b| self.refs[b] == 0 && !self.in_queue[b])
            .count();
        assert_eq!(unqueued_free, 0, "blocks with ref 0 missing from the queue");
        let used = self.refs.iter().filter(|&&r| r > 0).count();
        assert_eq!(queue.len() + used, self.num_blocks() - 1, "free + used");
        for (hash, &b) in &self.cache_map {
            let cached = self.cached[b as usize].as_ref();
            assert_eq!(
                cached.map(|c| c.hash),
                Some(*hash),
                "map entry of block {b}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::block_hash::hash_block;

    fn pool(num_blocks: usize) -> BlockPool {
        BlockPool::new(num_blocks, 4).unwrap()
    }

    #[test]
    fn new_rejects_bad_configs() {
        assert!(matches!(
            BlockPool::new(0, 4),
            Err(KvError::InvalidConfig { .. })
        ));
        assert!(matches!(
            BlockPool::new(4, 0),
            Err(KvError::InvalidConfig { .. })
        ));
        assert!(matches!(
            BlockPool::new(1 << 20, 1 << 12),
            Err(KvError::InvalidConfig { .. })
        ));
        let only_null = BlockPool::new(1, 4).unwrap();
        assert_eq!(only_null.num_free(), 0);
        assert_eq!(only_null.usage(), 0.0);
    }

    #[test]
    fn double_free_is_an_error() {
        let mut p = pool(4);
        let b = p.allocate(1).unwrap();
        p.free(&b).unwrap();
        let err = p.free(&b).unwrap_err();
        assert_eq!(err, KvError::DoubleFree { block: b[0] });
        assert!(err.to_string().contains(&format!("block {}", b[0])));
        p.check_invariants();
    }

    #[test]
    fn ref_underflow_is_an_error_and_changes_nothing() {
        let mut p = pool(4);
        let b = p.allocate(2).unwrap();
        p.touch(&b[..1]).unwrap();
        let err = p.free(&[b[1], b[0], b[0], b[0]]).unwrap_err();
        assert_eq!(
            err,
            KvError::RefUnderflow {
                block: b[0],
                held: 2
            }
        );
        assert_eq!(p.ref_count(b[0]), Some(2));
        assert_eq!(p.ref_count(b[1]), Some(1));
        assert_eq!(p.num_free(), 1);
        p.check_invariants();
    }

    #[test]
    fn null_block_is_never_allocated() {
        let mut p = pool(8);
        let all = p.allocate(7).unwrap();
        assert!(!all.contains(&NULL_BLOCK));
        assert_eq!(p.num_free(), 0);
        assert_eq!(p.usage(), 1.0);
        assert!(matches!(p.allocate(1), Err(KvError::OutOfBlocks { .. })));
        p.free(&all).unwrap();
        assert!(!p.allocate(7).unwrap().contains(&NULL_BLOCK));
    }

    #[test]
    fn null_block_cannot_be_freed_or_touched() {
        let mut p = pool(4);
        assert_eq!(
            p.free(&[NULL_BLOCK]),
            Err(KvError::NullBlock { op: "free" })
        );
        assert_eq!(
            p.touch(&[NULL_BLOCK]),
            Err(KvError::NullBlock { op: "touch" })
        );
        let h = hash_block(None, &[1, 2, 3, 4], None);
        assert!(matches!(
            p.cache_full_block(NULL_BLOCK, h, &[1, 2, 3, 4]),
            Err(KvError::NullBlock { .. })
        ));
        assert_eq!(p.num_free(), 3);
        p.check_invariants();
    }

    #[test]
    fn unknown_block_is_an_error() {
        let mut p = pool(4);
        let b = p.allocate(1).unwrap();
        let err = p.free(&[b[0], 9]).unwrap_err();
        assert!(matches!(err, KvError::UnknownBlock { block: 9, .. }));
        assert_eq!(p.ref_count(b[0]), Some(1), "failed free changes nothing");
        assert!(matches!(
            p.touch(&[4]),
            Err(KvError::UnknownBlock { block: 4, .. })
        ));
        p.check_invariants();
    }

    #[test]
    fn freed_blocks_are_reused_in_the_order_they_were_freed() {
        let mut p = pool(5);
        assert_eq!(p.free_queue(), vec![1, 2, 3, 4]);
        let b = p.allocate(4).unwrap();
        assert_eq!(b, vec![1, 2, 3, 4]);
        p.free(&[3]).unwrap();
        p.free(&[1]).unwrap();
        p.free(&[4, 2]).unwrap();
        assert_eq!(p.free_queue(), vec![3, 1, 4, 2]);
        assert_eq!(p.allocate(4).unwrap(), vec![3, 1, 4, 2]);
        p.check_invariants();
    }

    #[test]
    fn touched_free_block_leaves_the_queue() {
        let mut p = pool(6);
        let b = p.allocate(5).unwrap();
        p.free(&b).unwrap();
        p.touch(&[3]).unwrap();
        assert_eq!(p.ref_count(3), Some(1));
        assert!(!p.is_free(3));
        assert_eq!(p.free_queue(), vec![1, 2, 4, 5]);
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.allocate(4).unwrap(), vec![1, 2, 4, 5]);
        p.check_invariants();
    }

    #[test]
    fn removal_from_head_middle_and_tail() {
        let mut p = pool(6);
        p.touch(&[1]).unwrap();
        assert_eq!(p.free_queue(), vec![2, 3, 4, 5]);
        p.touch(&[5]).unwrap();
        assert_eq!(p.free_queue(), vec![2, 3, 4]);
        p.touch(&[3]).unwrap();
        assert_eq!(p.free_queue(), vec![2, 4]);
        p.free(&[5, 1, 3]).unwrap();
        assert_eq!(p.free_queue(), vec![2, 4, 5, 1, 3]);
        p.check_invariants();
    }

    #[test]
    fn touching_an_in_use_block_adds_a_ref() {
        let mut p = pool(4);
        let b = p.allocate(1).unwrap()[0];
        p.touch(&[b, b]).unwrap();
        assert_eq!(p.ref_count(b), Some(3));
        p.free(&[b, b]).unwrap();
        assert!(!p.is_free(b));
        p.free(&[b]).unwrap();
        assert!(p.is_free(b));
        p.check_invariants();
    }

    #[test]
    fn eviction_drops_the_hash_entry() {
        let mut p = pool(3);
        let toks = [5, 6, 7, 8];
        let h = hash_block(None, &toks, None);
        let b = p.allocate(1).unwrap()[0];
        assert_eq!(p.cache_full_block(b, h, &toks), Ok(true));
        p.free(&[b]).unwrap();
        assert_eq!(p.get_cached(h, &toks), Some(b), "a free block stays cached");
        assert_eq!(p.num_cached(), 1);
        let all = p.allocate(2).unwrap();
        assert!(all.contains(&b));
        assert_eq!(p.get_cached(h, &toks), None);
        assert_eq!(p.cached_hash(b), None);
        assert_eq!(p.num_cached(), 0);
        p.check_invariants();
    }

    #[test]
    fn cache_hit_revives_a_free_block() {
        let mut p = pool(3);
        let toks = [1, 1, 1, 1];
        let h = hash_block(None, &toks, None);
        let b = p.allocate(1).unwrap()[0];
        p.cache_full_block(b, h, &toks).unwrap();
        p.free(&[b]).unwrap();
        let hit = p.get_cached(h, &toks).unwrap();
        p.touch(&[hit]).unwrap();
        assert_eq!(p.allocate(1).unwrap(), vec![2]);
        assert_eq!(
            p.get_cached(h, &toks),
            Some(b),
            "touched block was not evicted"
        );
        p.check_invariants();
    }

    #[test]
    fn cache_lookup_verifies_tokens() {
        let mut p = pool(4);
        let h = BlockHash::from_u128(42);
        let b = p.allocate(2).unwrap();
        p.cache_full_block(b[0], h, &[1, 2, 3, 4]).unwrap();
        assert_eq!(p.get_cached(h, &[1, 2, 3, 4]), Some(b[0]));
        assert_eq!(p.get_cached(h, &[1, 2, 3, 5]), None, "collision is a miss");
        assert_eq!(p.cache_full_block(b[1], h, &[1, 2, 3, 5]), Ok(false));
        assert_eq!(p.cache_full_block(b[0], h, &[1, 2, 3, 4]), Ok(false));
        assert_eq!(
            p.cache_full_block(b[0], BlockHash::from_u128(7), &[1, 2, 3, 4]),
            Err(KvError::AlreadyCached { block: b[0] })
        );
        assert_eq!(
            p.cache_full_block(b[1], h, &[1, 2]),
            Err(KvError::WrongBlockLength {
                expected: 4,
                got: 2
            })
        );
        assert_eq!(
            p.cache_full_block(3, BlockHash::from_u128(9), &[0; 4]),
            Err(KvError::NotInUse { block: 3 })
        );
        assert_eq!(p.num_cached(), 1);
        p.check_invariants();
    }

    #[test]
    fn allocate_is_all_or_nothing() {
        let mut p = pool(5);
        let b = p.allocate(3).unwrap();
        assert_eq!(
            p.allocate(2),
            Err(KvError::OutOfBlocks {
                requested: 2,
                free: 1
            })
        );
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.free_queue(), vec![4]);
        assert_eq!(p.allocate(0).unwrap(), Vec::<BlockId>::new());
        p.free(&b).unwrap();
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.usage(), 0.0);
        p.check_invariants();
    }
}
