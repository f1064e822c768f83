//! Tests of the KV manager: block tables, prefix reuse, sliding-window release, rollback
//! truncation, and a randomized run against the pool's invariants.

use super::*;

fn manager(num_blocks: usize) -> KvManager {
    KvManager::new(num_blocks, 4, true).unwrap()
}

fn tokens(range: Range<u32>) -> Vec<u32> {
    range.collect()
}

/// Adds `seq` and commits its whole prompt; returns the reused token count.
fn add_and_compute(m: &mut KvManager, seq: SeqId, prompt: &[u32]) -> usize {
    let reused = m.add_sequence(seq, prompt).unwrap();
    m.commit_tokens(seq, &prompt[reused..]).unwrap();
    reused
}

#[test]
fn shared_prefix_shares_blocks() {
    let mut m = manager(16);
    let a = tokens(0..10);
    let mut b = tokens(0..8);
    b.extend([100, 101, 102]);
    assert_eq!(add_and_compute(&mut m, 1, &a), 0);
    assert_eq!(add_and_compute(&mut m, 2, &b), 8);
    let (ta, tb) = (m.block_table(1).unwrap(), m.block_table(2).unwrap());
    assert_eq!(ta[..2], tb[..2]);
    assert_ne!(ta[2], tb[2]);
    for &blk in &ta[..2] {
        assert_eq!(m.pool().ref_count(blk), Some(2));
    }
    assert_eq!(m.pool().ref_count(ta[2]), Some(1));
    assert_eq!(m.num_free_blocks(), 15 - 4);
    m.pool().check_invariants();
}

#[test]
fn attach_prefix_holds_only_the_cached_blocks_and_grows_from_there() {
    let mut m = manager(16);
    let a = tokens(0..13);
    add_and_compute(&mut m, 1, &a);
    m.free_sequence(1).unwrap();
    // Cached and unheld: the lookup counts them as free blocks it would take.
    assert_eq!(m.cached_prefix(&a), (12, 3));
    let mut b = tokens(0..9);
    b.extend([200, 201, 202, 203]);
    let free_before = m.num_free_blocks();
    // Capped at one block: only the first is held.
    assert_eq!(m.attach_prefix(2, &b, &[], 7).unwrap(), 4);
    assert_eq!((m.seq_len(2), m.num_computed(2)), (Some(4), Some(4)));
    assert_eq!(m.block_table(2).unwrap().len(), 1);
    assert_eq!(m.num_free_blocks(), free_before - 1);
    // The rest is appended and computed as usual; a prompt token that differs is caught.
    m.append_slots(2, 9).unwrap();
    assert!(m.commit_tokens(2, &[4, 5, 6, 7, 8, 9]).is_err());
    m.commit_tokens(2, &b[4..]).unwrap();
    assert_eq!(m.num_computed(2), Some(13));
    // Uncapped, a third sequence with `b`'s prompt reuses its three full blocks (the first
    // of them `a`'s).
    assert_eq!(m.attach_prefix(3, &b, &[], usize::MAX).unwrap(), 12);
    assert!(matches!(
        m.attach_prefix(3, &b, &[], 8),
        Err(KvError::SequenceExists { .. })
    ));
    // Its second block is `a`'s (seq 2 computed the same tokens into a block of its own,
    // and the cache keeps the first block with a given hash); the others are seq 2's.
    let (t2, t3) = (m.block_table(2).unwrap(), m.block_table(3).unwrap());
    assert_eq!(t3.len(), 3);
    assert_eq!((t3[0], t3[2]), (t2[0], t2[2]));
    assert_ne!(t3[1], t2[1]);
}

#[test]
fn third_sequence_reuses_cached_blocks_after_both_are_freed() {
    let mut m = manager(16);
    let a = tokens(0..10);
    add_and_compute(&mut m, 1, &a);
    add_and_compute(&mut m, 2, &a);
    let shared = m.block_table(1).unwrap()[..2].to_vec();
    m.free_sequence(1).unwrap();
    m.free_sequence(2).unwrap();
    assert_eq!(m.num_free_blocks(), 15);
    m.reset_prefix_cache_stats();
    assert_eq!(m.add_sequence(3, &a).unwrap(), 8);
    assert_eq!(m.block_table(3).unwrap()[..2], shared[..]);
    let stats = m.prefix_cache_stats();
    assert_eq!((stats.requests, stats.hit_tokens), (1, 8));
    assert_eq!(stats.queried_tokens, 10);
    assert_eq!(m.pool().ref_count(shared[0]), Some(1));
    m.pool().check_invariants();
}

#[test]
fn block_with_the_last_prompt_token_is_never_reused() {
    let mut m = manager(16);
    let p = tokens(0..8);
    add_and_compute(&mut m, 1, &p);
    assert_eq!(m.pool().num_cached(), 2);
    assert_eq!(m.add_sequence(2, &p).unwrap(), 4);
    let (t1, t2) = (m.block_table(1).unwrap(), m.block_table(2).unwrap());
    assert_eq!(t1[0], t2[0]);
    assert_ne!(t1[1], t2[1]);
    assert_eq!(m.add_sequence(3, &p[..1]).unwrap(), 0);
    assert_eq!(m.add_sequence(4, &p[..5]).unwrap(), 4);
}

#[test]
fn different_earlier_block_means_no_reuse() {
    let mut m = manager(16);
    add_and_compute(&mut m, 1, &tokens(0..12));
    let mut other = tokens(0..12);
    other[0] = 999;
    assert_eq!(m.add_sequence(2, &other).unwrap(), 0);
    let mut late = tokens(0..12);
    late[5] = 999;
    assert_eq!(m.add_sequence(3, &late).unwrap(), 4);
}

#[test]
fn extra_key_separates_caches() {
    let mut m = manager(16);
    let p = tokens(0..9);
    m.add_sequence_with_key(1, &p, Some(7)).unwrap();
    m.commit_tokens(1, &p).unwrap();
    assert_eq!(m.add_sequence_with_key(2, &p, Some(8)).unwrap(), 0);
    assert_eq!(m.add_sequence(3, &p).unwrap(), 0);
    assert_eq!(m.add_sequence_with_key(4, &p, Some(7)).unwrap(), 8);
}

#[test]
fn decode_tokens_fill_and_cache_blocks() {
    let mut m = manager(16);
    add_and_compute(&mut m, 1, &tokens(0..6));
    assert_eq!(m.pool().num_cached(), 1);
    for t in 6..9 {
        m.append_slots(1, 1).unwrap();
        m.commit_tokens(1, &[t]).unwrap();
    }
    assert_eq!(m.seq_len(1), Some(9));
    assert_eq!(m.num_computed(1), Some(9));
    assert_eq!(m.block_table(1).unwrap().len(), 3);
    assert_eq!(m.pool().num_cached(), 2);
    assert_eq!(m.add_sequence(2, &tokens(0..9)).unwrap(), 8);
}

#[test]
fn commit_is_checked() {
    let mut m = manager(16);
    m.add_sequence(1, &tokens(0..6)).unwrap();
    assert_eq!(
        m.commit_tokens(1, &[0, 1, 9]),
        Err(KvError::TokenMismatch {
            seq: 1,
            pos: 2,
            expected: 2,
            got: 9
        })
    );
    assert!(matches!(
        m.commit_tokens(1, &[0; 7]),
        Err(KvError::CommitPastEnd { .. })
    ));
    assert_eq!(m.num_computed(1), Some(0));
    m.commit_tokens(1, &[0, 1, 2]).unwrap();
    m.commit_tokens(1, &[3, 4, 5]).unwrap();
    assert_eq!(m.num_computed(1), Some(6));
    assert_eq!(
        m.commit_tokens(2, &[1]),
        Err(KvError::UnknownSequence { seq: 2 })
    );
}

#[test]
fn prefix_caching_off_never_hits() {
    let mut m = KvManager::new(16, 4, false).unwrap();
    let p = tokens(0..9);
    add_and_compute(&mut m, 1, &p);
    assert_eq!(m.pool().num_cached(), 0);
    assert_eq!(m.add_sequence(2, &p).unwrap(), 0);
    assert_eq!(m.prefix_cache_stats(), PrefixCacheStats::default());
}

#[test]
fn sliding_window_release_returns_blocks_and_leaves_null_entries() {
    let mut m = manager(16);
    add_and_compute(&mut m, 1, &tokens(0..20));
    let table = m.block_table(1).unwrap().to_vec();
    assert_eq!(m.num_free_blocks(), 10);
    assert_eq!(m.release_outside_window(1, 6).unwrap(), 3);
    let now = m.block_table(1).unwrap();
    assert_eq!(
        now,
        &[NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, table[3], table[4]]
    );
    assert_eq!(m.num_free_blocks(), 13);
    assert_eq!(m.pool().free_queue()[10..], [table[2], table[1], table[0]]);
    assert_eq!(m.slot(1, 0), None);
    assert_eq!(m.slot(1, 13), Some(table[3] as usize * 4 + 1));
    assert_eq!(m.release_outside_window(1, 6).unwrap(), 0);
    m.free_sequence(1).unwrap();
    assert_eq!(m.num_free_blocks(), 15);
    m.pool().check_invariants();
}

/// Slots reserved for a step that did not run are not in the window: only blocks wholly
/// before `computed - window` go.
#[test]
fn the_window_is_measured_from_the_computed_tokens() {
    let mut m = manager(16);
    add_and_compute(&mut m, 1, &tokens(0..20));
    // 12 more slots reserved (a step that failed), none computed.
    m.append_slots(1, 12).unwrap();
    assert_eq!(m.seq_len(1), Some(32));
    // The window of 6 over 20 computed tokens needs positions 14.. (block 3 on).
    assert_eq!(m.release_outside_window(1, 6).unwrap(), 3);
    assert!(m.slot(1, 14).is_some() && m.slot(1, 13).is_some());
    m.pool().check_invariants();
}

#[test]
fn slots_and_slot_mapping() {
    let mut m = manager(16);
    m.add_sequence(1, &tokens(0..6)).unwrap();
    let t = m.block_table(1).unwrap().to_vec();
    assert_eq!(m.slot(1, 5), Some(t[1] as usize * 4 + 1));
    assert_eq!(m.slot(1, 6), None);
    assert_eq!(m.slot(2, 0), None);
    let mapping = m.slot_mapping(1, 3..8).unwrap();
    let b0 = t[0] as i32 * 4;
    let b1 = t[1] as i32 * 4;
    assert_eq!(mapping, vec![b0 + 3, b1, b1 + 1, PAD_SLOT, PAD_SLOT]);
    assert_eq!(m.slot_mapping(2, 0..1), None);
}

#[test]
fn append_out_of_blocks_leaves_state_unchanged() {
    let mut m = manager(4);
    m.add_sequence(1, &tokens(0..5)).unwrap();
    assert_eq!(m.blocks_needed_for_append(1, 8).unwrap(), 2);
    assert_eq!(
        m.append_slots(1, 8),
        Err(KvError::OutOfBlocks {
            requested: 2,
            free: 1
        })
    );
    assert_eq!(m.seq_len(1), Some(5));
    assert_eq!(m.block_table(1).unwrap().len(), 2);
    assert_eq!(m.num_free_blocks(), 1);
    m.append_slots(1, 3).unwrap();
    assert_eq!(m.num_free_blocks(), 1);
    m.append_slots(1, 1).unwrap();
    assert_eq!(m.num_free_blocks(), 0);
    assert!(!m.can_allocate(1));
}

#[test]
fn add_out_of_blocks_counts_free_cached_hits_and_changes_nothing() {
    let mut m = manager(5);
    add_and_compute(&mut m, 1, &tokens(0..9));
    m.free_sequence(1).unwrap();
    let queue = m.pool().free_queue();
    let err = m.add_sequence(2, &tokens(0..17)).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            requested: 5,
            free: 4
        }
    );
    assert!(!m.contains(2));
    assert_eq!(m.pool().free_queue(), queue);
    assert_eq!(m.prefix_cache_stats().requests, 1);
    assert_eq!(m.add_sequence(2, &tokens(0..16)).unwrap(), 8);
    m.pool().check_invariants();
}

#[test]
fn sequence_errors() {
    let mut m = manager(8);
    m.add_sequence(1, &[1, 2]).unwrap();
    assert_eq!(
        m.add_sequence(1, &[1]),
        Err(KvError::SequenceExists { seq: 1 })
    );
    assert_eq!(m.free_sequence(2), Err(KvError::UnknownSequence { seq: 2 }));
    assert_eq!(
        m.append_slots(2, 1),
        Err(KvError::UnknownSequence { seq: 2 })
    );
    assert_eq!(m.add_sequence(3, &[]).unwrap(), 0);
    assert_eq!(m.block_table(3).unwrap().len(), 0);
    m.free_sequence(1).unwrap();
    m.free_sequence(3).unwrap();
    assert_eq!(m.num_free_blocks(), 7);
}

/// SplitMix64: a small seeded RNG so the randomized test is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Shadow KV memory: which token id each slot holds, to check that cache hits are real.
struct Sim {
    m: KvManager,
    memory: Vec<Option<u32>>,
    live: Vec<SeqId>,
    next_id: SeqId,
    out_of_blocks: usize,
    released: usize,
}

impl Sim {
    fn write(&mut self, seq: SeqId, from: usize, toks: &[u32]) {
        for (i, &t) in toks.iter().enumerate() {
            if let Some(slot) = self.m.slot(seq, from + i) {
                self.memory[slot] = Some(t);
            }
        }
    }

    fn compute(&mut self, seq: SeqId, toks: &[u32]) {
        let from = self.m.num_computed(seq).unwrap();
        self.m.commit_tokens(seq, toks).unwrap();
        self.write(seq, from, toks);
    }

    fn random_prompt(rng: &mut Rng) -> Vec<u32> {
        let family = rng.below(3) as u32;
        let len = 1 + rng.below(30);
        let diverge = rng.below(len + 1);
        let tail = rng.next() as u32 % 50;
        (0..len as u32)
            .map(|i| {
                if (i as usize) < diverge {
                    family * 1000 + i
                } else {
                    tail + i
                }
            })
            .collect()
    }

    fn add(&mut self, rng: &mut Rng) {
        let prompt = Self::random_prompt(rng);
        let seq = self.next_id;
        let Ok(reused) = self.m.add_sequence(seq, &prompt) else {
            self.out_of_blocks += 1;
            return;
        };
        self.next_id += 1;
        self.live.push(seq);
        for (pos, &t) in prompt.iter().enumerate().take(reused) {
            let slot = self.m.slot(seq, pos).unwrap();
            assert_eq!(self.memory[slot], Some(t), "stale prefix hit at {pos}");
        }
        let upto = reused + rng.below(prompt.len() - reused + 1);
        self.compute(seq, &prompt[reused..upto]);
    }

    fn append(&mut self, rng: &mut Rng, seq: SeqId) {
        let n = 1 + rng.below(6);
        if self.m.append_slots(seq, n).is_err() {
            self.out_of_blocks += 1;
            return;
        }
        let len = self.m.seq_len(seq).unwrap();
        let computed = self.m.num_computed(seq).unwrap();
        let known = self.m.seqs[&seq].tokens.len();
        let prompt_left = known.saturating_sub(computed);
        let known_toks = &self.m.seqs[&seq].tokens;
        let mut toks = known_toks[computed..].to_vec();
        toks.extend((known..len).map(|_| rng.next() as u32 % 7));
        let count = prompt_left.max(rng.below(toks.len() + 1));
        self.compute(seq, &toks[..count]);
    }

    fn step(&mut self, rng: &mut Rng) {
        let op = rng.below(10);
        if self.live.is_empty() || op < 3 {
            return self.add(rng);
        }
        let idx = rng.below(self.live.len());
        let seq = self.live[idx];
        match op {
            3..=6 => self.append(rng, seq),
            7 => {
                let window = 1 + rng.below(20);
                self.released += self.m.release_outside_window(seq, window).unwrap();
            }
            _ => {
                self.m.free_sequence(seq).unwrap();
                self.live.swap_remove(idx);
            }
        }
    }

    fn check(&self) {
        let pool = self.m.pool();
        pool.check_invariants();
        let bs = self.m.block_size();
        let mut refs = vec![0u32; pool.num_blocks()];
        for state in self.m.seqs.values() {
            assert_eq!(state.blocks.len(), state.len.div_ceil(bs));
            for &b in state.blocks.iter().filter(|&&b| b != NULL_BLOCK) {
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            assert_eq!(pool.ref_count(b as BlockId), Some(r), "refs of block {b}");
        }
        let ref_sum: u64 = refs.iter().map(|&r| r as u64).sum();
        let table_refs: usize = (self.m.seqs.values())
            .map(|s| s.blocks.iter().filter(|&&b| b != NULL_BLOCK).count())
            .sum();
        assert_eq!(ref_sum, table_refs as u64);
        let in_use = refs.iter().filter(|&&r| r > 0).count();
        assert_eq!(pool.free_queue().len() + in_use, pool.num_blocks() - 1);
    }
}

#[test]
fn randomized_sequences_keep_the_pool_consistent() {
    for seed in 0..8 {
        let mut rng = Rng(seed);
        let m = manager(48);
        let memory = vec![None; 48 * 4];
        let mut sim = Sim {
            m,
            memory,
            live: Vec::new(),
            next_id: 0,
            out_of_blocks: 0,
            released: 0,
        };
        for _ in 0..2000 {
            sim.step(&mut rng);
            sim.check();
        }
        assert!(sim.m.prefix_cache_stats().hit_tokens > 0, "seed {seed}");
        assert!(sim.out_of_blocks > 0 && sim.released > 0, "seed {seed}");
        for seq in std::mem::take(&mut sim.live) {
            sim.m.free_sequence(seq).unwrap();
            sim.check();
        }
        assert_eq!(sim.m.num_sequences(), 0);
        assert_eq!(sim.m.num_free_blocks(), 47);
        assert_eq!(sim.m.pool().usage(), 0.0);
    }
}
