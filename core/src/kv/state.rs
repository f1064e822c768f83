//! Recurrent state (short conv and Gated DeltaNet layers) as a KV group kind: a pool of state
//! slots (rows of the model's state tensors), a chain of checkpoints per sequence for rollback,
//! and snapshots kept beside block hashes for prefix caching.
//!
//! A forward pass never writes the slot it reads. Each step of a sequence reads its current
//! checkpoint and writes a fresh slot, which becomes the new current checkpoint. The slot it
//! read is then kept as a rollback checkpoint (the newest `keep` of them), kept as a prefix-cache
//! snapshot when it holds the state after a full KV block, or given back. Checkpoints and
//! snapshots therefore cost no copies, only slots. Slot 0 is the zero state every sequence
//! starts from; it is never handed out.
//!
//! Snapshots are keyed by the chained hash of the block they end ([`super::hash_block`]), so a
//! prompt whose leading blocks hash-match resumes from the state after them. They are evicted
//! least recently used first, when more than `max_snapshots` are held or a step needs a slot.

use std::collections::{HashMap, VecDeque};

use super::block_hash::BlockHash;
use super::error::KvError;
use super::SeqId;

/// Slot 0: the zero state.
pub const ZERO_STATE: usize = 0;

#[derive(Debug, Clone, Default)]
struct SeqStates {
    /// (tokens computed, slot), oldest first; the last is the current state.
    checkpoints: VecDeque<(usize, usize)>,
    /// The slot the step in flight writes.
    pending: Option<usize>,
}

/// Counters of the snapshot cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateStats {
    /// Snapshots held now.
    pub snapshots: usize,
    /// The most snapshots held at once.
    pub max_snapshots: usize,
    /// Slots in use (checkpoints, snapshots and steps in flight), and in all (slot 0 left out).
    pub slots_used: usize,
    pub slots_total: usize,
    /// Bytes of one slot (as the owner of the state tensors set them).
    pub slot_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct StatePool {
    /// References per slot: checkpoints, a step in flight, the snapshot cache.
    refs: Vec<u32>,
    free: Vec<usize>,
    seqs: HashMap<SeqId, SeqStates>,
    /// Snapshot slot per block hash, with the tick of its last use.
    cache: HashMap<BlockHash, (usize, u64)>,
    tick: u64,
    max_snapshots: usize,
    keep: usize,
    slot_bytes: usize,
}

impl StatePool {
    /// Slots a pool needs so that `max_seqs` sequences can each keep `keep` rollback checkpoints
    /// and run a step, beside `max_snapshots` snapshots (slot 0 included).
    pub fn slots_needed(max_seqs: usize, keep: usize, max_snapshots: usize) -> usize {
        1 + max_seqs * (keep + 2) + max_snapshots
    }

    /// A pool of `slots` slots (slot 0, the zero state, included).
    pub fn new(slots: usize, keep: usize, max_snapshots: usize) -> StatePool {
        let slots = slots.max(1);
        StatePool {
            refs: vec![0; slots],
            free: (1..slots).rev().collect(),
            seqs: HashMap::new(),
            cache: HashMap::new(),
            tick: 0,
            max_snapshots,
            keep,
            slot_bytes: 0,
        }
    }

    /// Records the bytes one slot takes, for [`StatePool::stats`].
    pub fn with_slot_bytes(mut self, bytes: usize) -> StatePool {
        self.slot_bytes = bytes;
        self
    }

    pub fn stats(&self) -> StateStats {
        StateStats {
            snapshots: self.cache.len(),
            max_snapshots: self.max_snapshots,
            slots_used: self.refs.len() - 1 - self.free.len(),
            slots_total: self.refs.len() - 1,
            slot_bytes: self.slot_bytes,
        }
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Starts `seq` from the zero state (nothing computed). No-op if it exists.
    pub fn start(&mut self, seq: SeqId) {
        self.seqs.entry(seq).or_insert_with(|| SeqStates {
            checkpoints: VecDeque::from([(0, ZERO_STATE)]),
            pending: None,
        });
    }

    /// Whether a snapshot for `hash` is held.
    pub fn has_snapshot(&self, hash: &BlockHash) -> bool {
        self.cache.contains_key(hash)
    }

    /// Starts `seq` from the snapshot for `hash`, the state after its first `pos` tokens. False
    /// (and nothing changes) when the snapshot is not held or `seq` exists.
    pub fn start_at(&mut self, seq: SeqId, pos: usize, hash: &BlockHash) -> bool {
        if self.seqs.contains_key(&seq) {
            return false;
        }
        let Some(slot) = self.use_snapshot(hash) else {
            return false;
        };
        self.refs[slot] += 1;
        self.seqs.insert(
            seq,
            SeqStates {
                checkpoints: VecDeque::from([(pos, slot)]),
                pending: None,
            },
        );
        true
    }

    /// The current checkpoint of `seq`: (tokens computed, slot).
    pub fn current(&self, seq: SeqId) -> Option<(usize, usize)> {
        self.seqs.get(&seq)?.checkpoints.back().copied()
    }

    /// The slot the step of `seq` in flight writes (after `begin`).
    pub fn pending(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq)?.pending
    }

    /// The position of the checkpoint `rollback(seq, pos)` would return to, without changing
    /// anything.
    pub fn checkpoint_at(&self, seq: SeqId, pos: usize) -> usize {
        self.seqs.get(&seq).map_or(0, |s| {
            s.checkpoints
                .iter()
                .rev()
                .find(|c| c.0 <= pos)
                .map_or(0, |c| c.0)
        })
    }

    /// The slots the next step of `seq` reads and writes. The write slot is taken now (a
    /// snapshot is evicted if the pool is out of slots) and kept until `commit` or `free_seq`.
    pub fn begin(&mut self, seq: SeqId) -> Result<(usize, usize), KvError> {
        let (read, pending) = {
            let s = self
                .seqs
                .get(&seq)
                .ok_or(KvError::UnknownSequence { seq })?;
            (s.checkpoints.back().map_or(ZERO_STATE, |c| c.1), s.pending)
        };
        if let Some(w) = pending {
            return Ok((read, w));
        }
        let w = self.take_slot()?;
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.pending = Some(w);
        }
        Ok((read, w))
    }

    /// The step of `seq` begun last has written its slot, which now holds the state after
    /// `pos` tokens. Checkpoints beyond the newest `keep + 1` are dropped.
    pub fn commit(&mut self, seq: SeqId, pos: usize) -> Result<(), KvError> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence { seq })?;
        let Some(w) = s.pending.take() else {
            return Err(KvError::NoStepInFlight { seq });
        };
        s.checkpoints.push_back((pos, w));
        let mut dropped = Vec::new();
        while s.checkpoints.len() > self.keep + 1 {
            if let Some((_, slot)) = s.checkpoints.pop_front() {
                dropped.push(slot);
            }
        }
        for slot in dropped {
            self.release(slot);
        }
        Ok(())
    }

    /// Keeps the current state of `seq` as the snapshot for `hash` (the chained hash of the
    /// block its last computed token ends). The least recently used snapshots beyond the limit
    /// are evicted.
    pub fn snapshot(&mut self, seq: SeqId, hash: BlockHash) {
        if self.max_snapshots == 0 || self.cache.contains_key(&hash) {
            return;
        }
        let Some((_, slot)) = self.current(seq) else {
            return;
        };
        if slot == ZERO_STATE {
            return;
        }
        self.tick += 1;
        self.refs[slot] += 1;
        self.cache.insert(hash, (slot, self.tick));
        while self.cache.len() > self.max_snapshots {
            if !self.evict_lru(false) {
                break;
            }
        }
    }

    /// Rolls `seq` back to its newest checkpoint at or before `pos` tokens, dropping the later
    /// ones; returns that checkpoint's position (the tokens from there to `pos` must be fed
    /// again). With none left, the sequence restarts from the zero state at 0.
    pub fn rollback(&mut self, seq: SeqId, pos: usize) -> Result<usize, KvError> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence { seq })?;
        let mut dropped: Vec<usize> = s.pending.take().into_iter().collect();
        while s.checkpoints.back().is_some_and(|c| c.0 > pos) {
            if let Some((_, slot)) = s.checkpoints.pop_back() {
                dropped.push(slot);
            }
        }
        if s.checkpoints.is_empty() {
            s.checkpoints.push_back((0, ZERO_STATE));
        }
        let at = s.checkpoints.back().map_or(0, |c| c.0);
        for slot in dropped {
            self.release(slot);
        }
        Ok(at)
    }

    /// Makes the snapshot for `hash` (the state after `pos` tokens) the current state of
    /// `seq`, in place of its checkpoints. False when the snapshot is not held.
    pub fn restore(&mut self, seq: SeqId, pos: usize, hash: &BlockHash) -> bool {
        if !self.seqs.contains_key(&seq) {
            return false;
        }
        let Some(slot) = self.use_snapshot(hash) else {
            return false;
        };
        self.refs[slot] += 1;
        let old = self.seqs.insert(
            seq,
            SeqStates {
                checkpoints: VecDeque::from([(pos, slot)]),
                pending: None,
            },
        );
        for (_, s) in old.into_iter().flat_map(|o| {
            o.checkpoints
                .into_iter()
                .chain(o.pending.map(|p| (0, p)))
                .collect::<Vec<_>>()
        }) {
            self.release(s);
        }
        true
    }

    /// Ends `seq`; its slots go back unless a snapshot holds them.
    pub fn free_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            for (_, slot) in s.checkpoints {
                self.release(slot);
            }
            if let Some(p) = s.pending {
                self.release(p);
            }
        }
    }

    fn use_snapshot(&mut self, hash: &BlockHash) -> Option<usize> {
        self.tick += 1;
        let tick = self.tick;
        let e = self.cache.get_mut(hash)?;
        e.1 = tick;
        Some(e.0)
    }

    fn take_slot(&mut self) -> Result<usize, KvError> {
        loop {
            if let Some(s) = self.free.pop() {
                self.refs[s] = 1;
                return Ok(s);
            }
            // Evict a snapshot nothing else holds, least recently used first.
            if !self.evict_lru(true) {
                return Err(KvError::OutOfStateSlots {
                    slots: self.refs.len() - 1,
                });
            }
        }
    }

    /// Drops the least recently used snapshot (with `only_unshared`, only one whose slot no
    /// sequence holds). False when there is none.
    fn evict_lru(&mut self, only_unshared: bool) -> bool {
        let victim = self
            .cache
            .iter()
            .filter(|(_, &(slot, _))| !only_unshared || self.refs[slot] == 1)
            .min_by_key(|(_, &(_, t))| t)
            .map(|(h, &(slot, _))| (*h, slot));
        let Some((hash, slot)) = victim else {
            return false;
        };
        self.cache.remove(&hash);
        self.release(slot);
        true
    }

    fn release(&mut self, slot: usize) {
        if slot == ZERO_STATE || slot >= self.refs.len() || self.refs[slot] == 0 {
            return;
        }
        self.refs[slot] -= 1;
        if self.refs[slot] == 0 {
            self.free.push(slot);
        }
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let mut refs = vec![0u32; self.refs.len()];
        for s in self.seqs.values() {
            for &(_, slot) in &s.checkpoints {
                refs[slot] += 1;
            }
            if let Some(p) = s.pending {
                refs[p] += 1;
            }
        }
        for &(slot, _) in self.cache.values() {
            refs[slot] += 1;
        }
        refs[ZERO_STATE] = 0;
        assert_eq!(refs, self.refs);
        for &f in &self.free {
            assert_eq!(self.refs[f], 0, "free slot {f} is referenced");
        }
        let in_use = self.refs.iter().skip(1).filter(|&&r| r > 0).count();
        assert_eq!(in_use + self.free.len(), self.refs.len() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u128) -> BlockHash {
        BlockHash::from_u128(i)
    }

    /// One step of `seq` to `pos`: the slot read and the slot written.
    fn step(p: &mut StatePool, seq: SeqId, pos: usize) -> (usize, usize) {
        let rw = p.begin(seq).expect("slot");
        p.commit(seq, pos).expect("commit");
        p.check_invariants();
        rw
    }

    #[test]
    fn a_step_never_writes_the_slot_it_reads() {
        let mut p = StatePool::new(4, 0, 0);
        p.start(1);
        let (r, w) = step(&mut p, 1, 5);
        assert_eq!(r, ZERO_STATE);
        assert_ne!(w, ZERO_STATE);
        let (r2, w2) = step(&mut p, 1, 6);
        assert_eq!(r2, w);
        assert_ne!(w2, r2);
        // With no checkpoints kept, one slot is held between steps.
        assert_eq!(p.stats().slots_used, 1);
        p.free_seq(1);
        assert_eq!(p.stats().slots_used, 0);
        p.check_invariants();
    }

    #[test]
    fn rollback_returns_to_the_newest_checkpoint_at_or_before() {
        let mut p = StatePool::new(8, 3, 0);
        p.start(1);
        let mut wrote = Vec::new();
        for pos in [10, 11, 12, 13, 14] {
            wrote.push((pos, step(&mut p, 1, pos).1));
        }
        // Kept: the current state (14) and three before it (11, 12, 13).
        assert_eq!(p.rollback(1, 12).expect("rollback"), 12);
        assert_eq!(p.current(1), Some((12, wrote[2].1)));
        p.check_invariants();
        // Older than every checkpoint: back to the zero state.
        assert_eq!(p.rollback(1, 5).expect("rollback"), 0);
        assert_eq!(p.current(1), Some((0, ZERO_STATE)));
        p.check_invariants();
        assert_eq!(p.stats().slots_used, 0);
    }

    #[test]
    fn snapshots_outlive_their_sequence_and_start_others() {
        let mut p = StatePool::new(6, 0, 2);
        p.start(1);
        let (_, w) = step(&mut p, 1, 16);
        p.snapshot(1, h(7));
        step(&mut p, 1, 17);
        p.free_seq(1);
        p.check_invariants();
        assert!(p.has_snapshot(&h(7)));
        assert!(p.start_at(2, 16, &h(7)));
        assert_eq!(p.current(2), Some((16, w)));
        // The next step reads the snapshot and writes elsewhere: the snapshot stays intact.
        let (r, w2) = step(&mut p, 2, 17);
        assert_eq!(r, w);
        assert_ne!(w2, w);
        assert!(p.has_snapshot(&h(7)));
        assert!(!p.start_at(3, 16, &h(8)));
        p.check_invariants();
    }

    #[test]
    fn snapshots_beyond_the_limit_go_least_recently_used_first() {
        let mut p = StatePool::new(8, 0, 2);
        p.start(1);
        for (i, pos) in [16, 32, 48].into_iter().enumerate() {
            step(&mut p, 1, pos);
            p.snapshot(1, h(i as u128));
            if i == 1 {
                // Using the first one makes the second the least recently used.
                assert!(p.start_at(9, 16, &h(0)));
                p.free_seq(9);
            }
        }
        assert!(p.has_snapshot(&h(0)));
        assert!(!p.has_snapshot(&h(1)));
        assert!(p.has_snapshot(&h(2)));
        p.check_invariants();
    }

    #[test]
    fn a_full_pool_evicts_snapshots_then_reports_out_of_slots() {
        // Slots 1..=3: one sequence holding one, two snapshots.
        let mut p = StatePool::new(4, 0, 8);
        p.start(1);
        step(&mut p, 1, 16);
        p.snapshot(1, h(1));
        step(&mut p, 1, 32);
        p.snapshot(1, h(2));
        // Slot 1 holds snapshot 1, slot 2 is current and snapshot 2; one free.
        p.start(2);
        step(&mut p, 2, 3);
        // No slot free: the next step of 2 evicts snapshot 1 (held by nothing else).
        step(&mut p, 2, 4);
        assert!(!p.has_snapshot(&h(1)));
        assert!(p.has_snapshot(&h(2)));
        // The slot 2 gave back is the last free one; then only snapshot 2 is left, and
        // sequence 1 holds it.
        p.start(3);
        p.begin(3).expect("the last free slot");
        p.start(4);
        let e = p.begin(4);
        assert!(matches!(e, Err(KvError::OutOfStateSlots { .. })), "{e:?}");
        assert!(p.has_snapshot(&h(2)));
        p.check_invariants();
    }

    #[test]
    fn restore_replaces_the_checkpoints_with_a_snapshot() {
        let mut p = StatePool::new(8, 1, 4);
        p.start(1);
        let (_, w) = step(&mut p, 1, 16);
        p.snapshot(1, h(3));
        step(&mut p, 1, 20);
        step(&mut p, 1, 21);
        assert!(p.restore(1, 16, &h(3)));
        assert_eq!(p.current(1), Some((16, w)));
        assert!(!p.restore(1, 16, &h(4)));
        p.check_invariants();
        p.free_seq(1);
        assert_eq!(p.stats().slots_used, 1);
        p.check_invariants();
    }
}
