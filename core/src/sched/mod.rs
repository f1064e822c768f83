//! Continuous batching: which tokens of which requests go into the next forward pass.
//!
//! Each step: running decodes first (one token each, oldest first), then prefill chunks of
//! waiting or partly prefilled requests under the token budget (chunked prefill). When the
//! KV pool cannot hold a step's tokens, the newest running request is preempted: its blocks
//! are freed and it goes back to the front of the queue with every token it has so far, to be
//! recomputed later (vLLM's recompute preemption). The scheduler only plans; the engine runs
//! the plan and reports back through [`Scheduler::advance`] and [`Scheduler::finish`].
//!
//! KV capacity is asked of a [`KvBudget`], so the planner can be tested without a model.

use std::collections::{HashMap, VecDeque};

/// A request's id (also its KV sequence id).
pub type ReqId = u64;

/// Limits of one step.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Most requests resident in the KV cache at once.
    pub max_running: usize,
    /// With `Some(block_size)`, a prefill chunk that would run past the last full block before
    /// the prompt's end stops there, so the step ends on a block boundary (a recurrent model's
    /// state after it can be kept as a prefix-cache snapshot); the rest follows as a chunk of
    /// its own.
    pub snapshot_blocks: Option<usize>,
}

/// What the KV cache can take; the engine answers from its KV managers.
pub trait KvBudget {
    /// Blocks that growing `req` (resident or not) to `len` tokens would newly allocate.
    fn blocks_needed(&self, req: ReqId, len: usize) -> usize;
    /// Blocks free now.
    fn free_blocks(&self) -> usize;
    /// Blocks `req` holds now.
    fn blocks_held(&self, req: ReqId) -> usize;
    /// Blocks preempting `req` would return to the pool: those it holds that no other request
    /// shares (a prefix block shared with a running request stays taken).
    fn blocks_freed(&self, req: ReqId) -> usize {
        self.blocks_held(req)
    }
    /// For a request not resident: how many leading `tokens` the prefix cache holds (a multiple
    /// of the block size, less than `tokens.len()`), and how many free blocks taking them uses
    /// (cached blocks no request holds count as free). Without a prefix cache, none.
    fn cached_prefix(&self, _tokens: &[u32]) -> (usize, usize) {
        (0, 0)
    }
}

/// One request as the scheduler sees it: its tokens so far (prompt, then generated) and how
/// many of them are in the KV cache.
#[derive(Clone, Debug)]
pub struct Seq {
    pub id: ReqId,
    pub tokens: Vec<u32>,
    /// Tokens whose K/V are computed (0 after a preemption).
    pub computed: usize,
    /// Times this request was preempted.
    pub preemptions: u32,
}

impl Seq {
    pub fn new(id: ReqId, prompt: Vec<u32>) -> Seq {
        Seq {
            id,
            tokens: prompt,
            computed: 0,
            preemptions: 0,
        }
    }
    /// Tokens still to feed before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }
}

/// One request's share of a step: `tokens[start..end]` of it, and whether the step's last row
/// gives the logits for its next token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub id: ReqId,
    pub start: usize,
    pub end: usize,
    pub sample: bool,
}

/// A step's plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub items: Vec<Item>,
    /// Requests preempted while planning: the engine frees their KV blocks.
    pub preempted: Vec<ReqId>,
}

impl Plan {
    pub fn tokens(&self) -> usize {
        self.items.iter().map(|i| i.end - i.start).sum()
    }
}

/// The queue and the running set. Every lookup by id is a hash lookup; a request that ends
/// while queued leaves its place in the queue to be skipped when it comes up (the queue is
/// compacted when such places outnumber the live ones), so no operation scans the queue.
#[derive(Debug, Default)]
pub struct Scheduler {
    cfg: Option<SchedConfig>,
    /// Every request held, queued or resident.
    seqs: HashMap<ReqId, Entry>,
    /// Queue order. An id whose request is no longer queued is a stale place.
    waiting: VecDeque<ReqId>,
    /// Live places in `waiting`.
    n_waiting: usize,
    /// Resident requests, oldest first (at most `max_running`).
    running: Vec<ReqId>,
}

#[derive(Debug)]
struct Entry {
    seq: Seq,
    resident: bool,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig) -> Scheduler {
        Scheduler {
            cfg: Some(SchedConfig {
                max_batch_tokens: cfg.max_batch_tokens.max(1),
                max_running: cfg.max_running.max(1),
                snapshot_blocks: cfg.snapshot_blocks.filter(|&b| b > 0),
            }),
            ..Scheduler::default()
        }
    }

    fn cfg(&self) -> SchedConfig {
        self.cfg.clone().unwrap_or(SchedConfig {
            max_batch_tokens: 512,
            max_running: 1,
            snapshot_blocks: None,
        })
    }

    /// Queues a new request (it needs at least one token). An id already held is ignored.
    pub fn admit(&mut self, seq: Seq) {
        let id = seq.id;
        if self.seqs.contains_key(&id) {
            return;
        }
        self.seqs.insert(
            id,
            Entry {
                seq,
                resident: false,
            },
        );
        self.waiting.push_back(id);
        self.n_waiting += 1;
    }

    pub fn waiting(&self) -> usize {
        self.n_waiting
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    /// Resident requests, oldest first.
    pub fn running(&self) -> impl Iterator<Item = &Seq> {
        self.running.iter().filter_map(|id| self.get(*id))
    }
    /// Queued requests, next first.
    pub fn queued(&self) -> impl Iterator<Item = &Seq> {
        self.waiting
            .iter()
            .filter_map(|id| self.seqs.get(id).filter(|e| !e.resident))
            .map(|e| &e.seq)
    }
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }
    /// A resident or queued request.
    pub fn get(&self, id: ReqId) -> Option<&Seq> {
        self.seqs.get(&id).map(|e| &e.seq)
    }

    /// The next queued request, dropping the stale places before it.
    fn head(&mut self) -> Option<ReqId> {
        while let Some(&id) = self.waiting.front() {
            if self.seqs.get(&id).is_some_and(|e| !e.resident) {
                return Some(id);
            }
            self.waiting.pop_front();
        }
        None
    }

    /// How many of `n` tokens from `start` (of `len`) one step takes: all of them, or with
    /// `snapshot_blocks` those up to the last block boundary before `len` when they cross it.
    fn chunk(&self, start: usize, n: usize, len: usize) -> usize {
        match self.cfg.as_ref().and_then(|c| c.snapshot_blocks) {
            Some(bs) => {
                let boundary = (len.saturating_sub(1) / bs) * bs;
                if start < boundary && start + n > boundary {
                    boundary - start
                } else {
                    n
                }
            }
            None => n,
        }
    }

    /// Plans the next step: decodes, then prefill chunks, preempting when the pool is short.
    pub fn schedule(&mut self, kv: &dyn KvBudget) -> Plan {
        let cfg = self.cfg();
        let mut plan = Plan::default();
        let mut budget = cfg.max_batch_tokens;
        let mut blocks = kv.free_blocks();
        self.schedule_running(kv, &mut plan, &mut budget, &mut blocks);
        self.schedule_waiting(kv, &cfg, &mut plan, &mut budget, &mut blocks);
        plan
    }

    /// Running requests, oldest first: a decode token or the next prefill chunk each. A request
    /// that does not fit the pool preempts the newest running one (possibly itself).
    fn schedule_running(
        &mut self,
        kv: &dyn KvBudget,
        plan: &mut Plan,
        budget: &mut usize,
        blocks: &mut usize,
    ) {
        // Blocks each planned item will allocate, to give back if its request is preempted.
        let mut planned: Vec<(ReqId, usize)> = Vec::new();
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let Some(s) = self.get(id) else {
                self.running.remove(i);
                continue;
            };
            let (computed, pending, len) = (s.computed, s.pending(), s.tokens.len());
            let n = self.chunk(computed, pending.min(*budget), len);
            if n == 0 {
                i += 1;
                continue;
            }
            let need = kv.blocks_needed(id, computed + n);
            if need <= *blocks {
                *blocks -= need;
                *budget -= n;
                planned.push((id, need));
                plan.items.push(Item {
                    id,
                    start: computed,
                    end: computed + n,
                    sample: computed + n == len,
                });
                i += 1;
                continue;
            }
            // Out of blocks: preempt the newest running request, then retry this one.
            let newest_is_this = i + 1 == self.running.len();
            let Some(victim) = self.preempt_newest() else {
                break;
            };
            *blocks += kv.blocks_freed(victim);
            if let Some(k) = plan.items.iter().position(|it| it.id == victim) {
                let it = plan.items.remove(k);
                *budget += it.end - it.start;
            }
            if let Some(k) = planned.iter().position(|p| p.0 == victim) {
                *blocks += planned.remove(k).1;
            }
            plan.preempted.push(victim);
            if newest_is_this {
                break;
            }
        }
    }

    /// Waiting requests in order, while the budget, the pool and the running limit allow.
    fn schedule_waiting(
        &mut self,
        kv: &dyn KvBudget,
        cfg: &SchedConfig,
        plan: &mut Plan,
        budget: &mut usize,
        blocks: &mut usize,
    ) {
        while *budget > 0 && self.running.len() < cfg.max_running {
            let Some(id) = self.head() else {
                break;
            };
            // A request preempted while planning this step waits for the next one (its blocks
            // are freed only after this plan).
            if plan.preempted.contains(&id) {
                break;
            }
            let Some(s) = self.get(id) else {
                break;
            };
            // A request starting afresh skips the blocks the prefix cache holds: those are
            // taken rather than allocated, and cost only the ones no request holds now.
            let fresh = s.computed == 0 && kv.blocks_held(id) == 0;
            let (hit, hit_blocks) = match fresh {
                true => kv.cached_prefix(&s.tokens),
                false => (0, 0),
            };
            let len = s.tokens.len();
            let hit = hit.min(len.saturating_sub(1));
            let start = s.computed.max(hit);
            let n = self.chunk(start, (len - start).min(*budget), len);
            let need = kv
                .blocks_needed(id, start + n)
                .saturating_sub(kv.blocks_needed(id, hit))
                + hit_blocks;
            if n == 0 || need > *blocks {
                break;
            }
            *blocks -= need;
            *budget -= n;
            plan.items.push(Item {
                id,
                start,
                end: start + n,
                sample: start + n == len,
            });
            self.waiting.pop_front();
            self.n_waiting -= 1;
            if let Some(e) = self.seqs.get_mut(&id) {
                e.resident = true;
            }
            self.running.push(id);
        }
    }

    /// Preempts the newest running request outside planning (a step the pool could not take
    /// after all): it goes back to the front of the queue; the engine frees its KV blocks.
    pub fn preempt(&mut self) -> Option<ReqId> {
        self.preempt_newest()
    }

    /// Takes the newest running request back to the front of the queue, to be recomputed from
    /// scratch; the engine frees its KV blocks.
    fn preempt_newest(&mut self) -> Option<ReqId> {
        let id = self.running.pop()?;
        if let Some(e) = self.seqs.get_mut(&id) {
            e.seq.computed = 0;
            e.seq.preemptions += 1;
            e.resident = false;
        }
        self.waiting.push_front(id);
        self.n_waiting += 1;
        Some(id)
    }

    /// After a step: the planned tokens of `id` are computed, and `sampled` (if any) is its
    /// new token.
    pub fn advance(&mut self, id: ReqId, end: usize, sampled: Option<u32>) {
        if let Some(e) = self.seqs.get_mut(&id).filter(|e| e.resident) {
            let s = &mut e.seq;
            s.computed = end.min(s.tokens.len());
            if let Some(t) = sampled {
                s.tokens.push(t);
            }
        }
    }

    /// Removes a finished or cancelled request (running or queued); true if it was resident
    /// (its KV blocks must be freed). A queued one leaves a stale place behind.
    pub fn finish(&mut self, id: ReqId) -> bool {
        let Some(e) = self.seqs.remove(&id) else {
            return false;
        };
        if e.resident {
            // At most `max_running` ids.
            self.running.retain(|&r| r != id);
            return true;
        }
        self.n_waiting -= 1;
        // Stale places are dropped as they reach the front; should they pile up behind a
        // head that cannot start, the queue is rebuilt (amortized O(1) per request).
        if self.waiting.len() > 2 * self.n_waiting + 64 {
            let seqs = &self.seqs;
            self.waiting
                .retain(|id| seqs.get(id).is_some_and(|e| !e.resident));
        }
        false
    }

    /// Places in the queue, stale ones included (for tests of the compaction).
    #[cfg(test)]
    fn queue_places(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `free` blocks of `bs` tokens, with each request's current allocation.
    struct Pool {
        bs: usize,
        free: usize,
        held: HashMap<ReqId, usize>,
    }

    impl KvBudget for Pool {
        fn blocks_needed(&self, req: ReqId, len: usize) -> usize {
            len.div_ceil(self.bs)
                .saturating_sub(self.held.get(&req).copied().unwrap_or(0))
        }
        fn free_blocks(&self) -> usize {
            self.free
        }
        fn blocks_held(&self, req: ReqId) -> usize {
            self.held.get(&req).copied().unwrap_or(0)
        }
    }

    impl Pool {
        /// Carries out a plan as the engine would: frees preempted requests, allocates for the
        /// items, and reports each item back (a fixed token 7 when it samples).
        fn run(&mut self, s: &mut Scheduler, plan: &Plan) {
            for id in &plan.preempted {
                self.free += self.held.remove(id).unwrap_or(0);
            }
            for it in &plan.items {
                let need = self.blocks_needed(it.id, it.end);
                assert!(need <= self.free, "plan over-commits the pool: {plan:?}");
                self.free -= need;
                *self.held.entry(it.id).or_insert(0) += need;
                s.advance(it.id, it.end, it.sample.then_some(7));
            }
        }
        fn finish(&mut self, s: &mut Scheduler, id: ReqId) {
            if s.finish(id) {
                self.free += self.held.remove(&id).unwrap_or(0);
            }
        }
    }

    fn item(id: ReqId, start: usize, end: usize, sample: bool) -> Item {
        Item {
            id,
            start,
            end,
            sample,
        }
    }

    fn sched(tokens: usize, running: usize) -> Scheduler {
        Scheduler::new(SchedConfig {
            max_batch_tokens: tokens,
            max_running: running,
            snapshot_blocks: None,
        })
    }

    #[test]
    fn snapshot_blocks_end_a_prefill_chunk_on_the_last_block_boundary() {
        let mut s = Scheduler::new(SchedConfig {
            max_batch_tokens: 64,
            max_running: 2,
            snapshot_blocks: Some(16),
        });
        let mut kv = Pool {
            bs: 16,
            free: 100,
            held: HashMap::new(),
        };
        // 40 tokens: the last boundary before the end is 32.
        s.admit(Seq::new(1, (0..40).collect()));
        // 32 tokens end exactly on a boundary: the one before the last token is 16.
        s.admit(Seq::new(2, (0..32).collect()));
        let p = s.schedule(&kv);
        assert_eq!(p.items, vec![item(1, 0, 32, false), item(2, 0, 16, false)]);
        kv.held.insert(1, 2);
        kv.held.insert(2, 1);
        s.advance(1, 32, None);
        s.advance(2, 16, None);
        let p = s.schedule(&kv);
        assert_eq!(p.items, vec![item(1, 32, 40, true), item(2, 16, 32, true)]);
    }

    #[test]
    fn decodes_go_first_then_prefill_chunks_fill_the_budget() {
        let mut s = sched(8, 4);
        let mut pool = Pool {
            bs: 4,
            free: 100,
            held: HashMap::new(),
        };
        s.admit(Seq::new(1, vec![1; 3]));
        let p = s.schedule(&pool);
        assert_eq!(p.items, vec![item(1, 0, 3, true)]);
        pool.run(&mut s, &p);
        // A long prompt arrives: request 1 decodes one token, the prompt takes the other 7.
        s.admit(Seq::new(2, vec![2; 20]));
        let p = s.schedule(&pool);
        assert_eq!(p.items, vec![item(1, 3, 4, true), item(2, 0, 7, false),]);
        pool.run(&mut s, &p);
        // Chunked prefill continues until the prompt is done, then 2 samples.
        let p = s.schedule(&pool);
        assert_eq!(p.items[1], item(2, 7, 14, false));
        pool.run(&mut s, &p);
        let p = s.schedule(&pool);
        assert_eq!(p.items[1], item(2, 14, 20, true));
        assert_eq!(p.tokens(), 7);
    }

    /// A pool whose prefix cache holds the first `hit` tokens of every prompt, `unheld` of
    /// those blocks being free ones.
    struct Cached {
        pool: Pool,
        hit: usize,
        unheld: usize,
    }

    impl KvBudget for Cached {
        fn blocks_needed(&self, req: ReqId, len: usize) -> usize {
            self.pool.blocks_needed(req, len)
        }
        fn free_blocks(&self) -> usize {
            self.pool.free_blocks()
        }
        fn blocks_held(&self, req: ReqId) -> usize {
            self.pool.blocks_held(req)
        }
        fn cached_prefix(&self, tokens: &[u32]) -> (usize, usize) {
            (self.hit.min(tokens.len() - 1), self.unheld)
        }
    }

    #[test]
    fn a_new_request_starts_after_its_cached_prefix_paying_only_for_unheld_blocks() {
        let mut s = sched(8, 4);
        s.admit(Seq::new(1, vec![3; 20]));
        // 12 cached tokens (3 blocks, 1 of them unheld); the 8 others need 2 new blocks.
        let tight = |free| Cached {
            pool: Pool {
                bs: 4,
                free,
                held: HashMap::new(),
            },
            hit: 12,
            unheld: 1,
        };
        assert!(s.schedule(&tight(2)).items.is_empty());
        assert_eq!(s.schedule(&tight(3)).items, vec![item(1, 12, 20, true)]);
        // A request already resident is not looked up again.
        let mut s = sched(8, 4);
        s.admit(Seq::new(2, vec![3; 20]));
        let mut c = tight(100);
        c.pool.held.insert(2, 1);
        assert_eq!(s.schedule(&c).items, vec![item(2, 0, 8, false)]);
    }

    #[test]
    fn the_running_limit_keeps_requests_queued() {
        let mut s = sched(64, 2);
        let pool = Pool {
            bs: 4,
            free: 100,
            held: HashMap::new(),
        };
        for id in 1..=3 {
            s.admit(Seq::new(id, vec![5; 4]));
        }
        let p = s.schedule(&pool);
        assert_eq!(p.items.iter().map(|i| i.id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(s.waiting(), 1);
    }

    #[test]
    fn an_exhausted_pool_preempts_the_newest_and_recomputes_it_later() {
        let mut s = sched(64, 4);
        // 4 blocks of 4 tokens: two 8-token prompts take 2 blocks each.
        let mut pool = Pool {
            bs: 4,
            free: 4,
            held: HashMap::new(),
        };
        s.admit(Seq::new(1, vec![1; 8]));
        s.admit(Seq::new(2, vec![2; 8]));
        let p = s.schedule(&pool);
        assert_eq!(p.items.len(), 2);
        pool.run(&mut s, &p);
        // Both hold 8 computed tokens in full blocks; 1's next token needs a block: 2 goes.
        let p = s.schedule(&pool);
        assert_eq!(p.preempted, vec![2]);
        assert_eq!(p.items, vec![item(1, 8, 9, true)]);
        pool.run(&mut s, &p);
        let again = s.get(2).expect("2 is queued again");
        assert_eq!(
            (again.computed, again.preemptions, again.tokens.len()),
            (0, 1, 9)
        );
        // When 1 finishes, 2 is recomputed from its prompt and the token it had generated.
        pool.finish(&mut s, 1);
        let p = s.schedule(&pool);
        assert_eq!(p.items, vec![item(2, 0, 9, true)]);
        pool.run(&mut s, &p);
        assert_eq!(pool.free, 4 - 3);
    }

    #[test]
    fn a_request_alone_that_outgrows_the_pool_preempts_itself() {
        let mut s = sched(64, 4);
        let mut pool = Pool {
            bs: 4,
            free: 1,
            held: HashMap::new(),
        };
        s.admit(Seq::new(1, vec![1; 4]));
        let p = s.schedule(&pool);
        pool.run(&mut s, &p);
        let p = s.schedule(&pool);
        assert_eq!(p.preempted, vec![1]);
        assert!(p.items.is_empty());
        pool.run(&mut s, &p);
        // It cannot come back either: the engine sees an empty plan with nothing running.
        let p = s.schedule(&pool);
        assert!(p.items.is_empty() && s.num_running() == 0 && s.waiting() == 1);
    }

    #[test]
    fn random_workloads_never_overcommit_and_always_finish() {
        let mut rng = crate::rng::Rng::new(11);
        for _ in 0..50 {
            let mut s = sched(
                1 + (rng.next_u64() % 24) as usize,
                1 + (rng.next_u64() % 5) as usize,
            );
            let mut pool = Pool {
                bs: 4,
                free: 6 + (rng.next_u64() % 10) as usize,
                held: HashMap::new(),
            };
            let mut want = HashMap::new();
            for id in 1..=6u64 {
                let prompt = 1 + (rng.next_u64() % 9) as usize;
                let gen = 1 + (rng.next_u64() % 8) as usize;
                want.insert(id, prompt + gen);
                s.admit(Seq::new(id, vec![3; prompt]));
            }
            let mut steps = 0;
            while !s.is_idle() {
                steps += 1;
                assert!(steps < 10_000, "no progress");
                let p = s.schedule(&pool);
                assert!(p.tokens() <= s.cfg().max_batch_tokens);
                if p.items.is_empty() && s.num_running() == 0 {
                    // Only a request bigger than the pool can stall; none is here.
                    panic!("stalled with {} waiting", s.waiting());
                }
                pool.run(&mut s, &p);
                let done: Vec<ReqId> = s
                    .running()
                    .filter(|q| q.tokens.len() >= want[&q.id])
                    .map(|q| q.id)
                    .collect();
                for id in done {
                    pool.finish(&mut s, id);
                }
            }
            assert!(pool.held.is_empty());
        }
    }

    /// A long queue with requests cancelled anywhere in it: order, counts and lookups stay
    /// right, and the places the cancelled ones leave behind are bounded by the live ones.
    #[test]
    fn cancelling_inside_a_long_queue_keeps_order_and_bounds_stale_places() {
        let mut rng = crate::rng::Rng::new(5);
        let mut s = sched(16, 2);
        let pool = Pool {
            bs: 4,
            free: 1_000,
            held: HashMap::new(),
        };
        let mut live: Vec<ReqId> = Vec::new();
        for id in 1..=5_000u64 {
            s.admit(Seq::new(id, vec![(id % 50) as u32; 1 + (id % 7) as usize]));
            live.push(id);
            // Cancel a random queued request about two times in three.
            if !rng.next_u64().is_multiple_of(3) {
                let k = (rng.next_u64() as usize) % live.len();
                let gone = live.remove(k);
                assert!(!s.finish(gone), "{gone} was queued, not resident");
                assert!(s.get(gone).is_none());
            }
            assert_eq!(s.waiting(), live.len());
            assert!(
                s.queue_places() <= 2 * live.len() + 65,
                "{} places for {} queued",
                s.queue_places(),
                live.len()
            );
        }
        let order: Vec<ReqId> = s.queued().map(|q| q.id).collect();
        assert_eq!(order, live);
        for &id in live.iter().step_by(97) {
            assert_eq!(
                s.get(id).map(|q| q.tokens.len()),
                Some(1 + (id % 7) as usize)
            );
        }
        // The next step starts the two oldest live requests, skipping the stale places.
        let p = s.schedule(&pool);
        let ids: Vec<ReqId> = p.items.iter().map(|i| i.id).collect();
        assert_eq!(ids, live[..2].to_vec());
        assert_eq!(s.waiting(), live.len() - 2);
        assert!(s.finish(live[0]), "a running request is resident");
        assert_eq!(s.num_running(), 1);
    }
}
