//! The scheduler's tests: plans, preemption, the prefix cache, drafts and stop criteria, on a
//! real KV coordinator.

use super::*;

/// A scheduler over one full-attention pool of `blocks` usable blocks of `bs` tokens.
fn sched_with(tokens: usize, running: usize, blocks: usize, bs: usize, prefix: bool) -> Scheduler {
    // The pool's block 0 is the null block.
    let kv =
        KvCoordinator::new(vec![None], &[blocks + 1], bs, prefix, 4, None).expect("coordinator");
    assert_eq!(kv.free_blocks(), blocks);
    Scheduler::new(
        SchedConfig {
            max_batch_tokens: tokens,
            max_running: running,
            max_len: 1 << 20,
            snapshot_blocks: None,
            canvas: 0,
        },
        kv,
    )
}

fn sched(tokens: usize, running: usize, blocks: usize) -> Scheduler {
    sched_with(tokens, running, blocks, 4, false)
}

/// Carries out a plan as the engine would: every sampling item gets token 7.
fn run(s: &mut Scheduler, plan: &Plan) {
    let outs: Vec<Outcome> = plan
        .items
        .iter()
        .map(|it| Outcome {
            id: it.id,
            tokens: if it.sample { vec![7] } else { Vec::new() },
            ..Outcome::default()
        })
        .collect();
    let up = s.update(plan, &outs).expect("update");
    assert!(up.copies.is_empty());
}

fn item(id: ReqId, start: usize, end: usize, sample: bool) -> Item {
    Item {
        id,
        start,
        end,
        sample,
        ..Item::default()
    }
}

/// What the coordinator holds of every resident request agrees with the scheduler's
/// record, and the plan's batch feeds each item at its positions.
fn check(s: &Scheduler, plan: &Plan) {
    for r in s.running() {
        assert_eq!(s.kv().seq_len(r.id), r.computed, "request {}", r.id);
    }
    assert_eq!(plan.batch.seqs.len(), plan.items.len());
    assert_eq!(plan.batch.tokens.len(), plan.tokens());
    for (it, si) in plan.items.iter().zip(&plan.batch.seqs) {
        assert_eq!(si.q_len, it.len());
        assert_eq!(si.seq_len, it.end + it.lookahead + it.canvas);
        assert_eq!(plan.batch.positions[si.q_start] as usize, it.start);
    }
}

#[test]
fn snapshot_blocks_end_a_prefill_chunk_on_the_last_block_boundary() {
    let kv = KvCoordinator::new(vec![None], &[101], 16, false, 0, None).expect("kv");
    let mut s = Scheduler::new(
        SchedConfig {
            max_batch_tokens: 64,
            max_running: 2,
            max_len: 1 << 20,
            snapshot_blocks: Some(16),
            canvas: 0,
        },
        kv,
    );
    // 40 tokens: the last boundary before the end is 32.
    s.admit(Request::new(1, (0..40).collect()));
    // 32 tokens end exactly on a boundary: the one before the last token is 16.
    s.admit(Request::new(2, (0..32).collect()));
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(1, 0, 32, false), item(2, 0, 16, false)]);
    run(&mut s, &p);
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(1, 32, 40, true), item(2, 16, 32, true)]);
    check(&s, &p);
}

#[test]
fn decodes_go_first_then_prefill_chunks_fill_the_budget() {
    let mut s = sched(8, 4, 100);
    s.admit(Request::new(1, vec![1; 3]));
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(1, 0, 3, true)]);
    run(&mut s, &p);
    // A long prompt arrives: request 1 decodes one token, the prompt takes the other 7.
    s.admit(Request::new(2, vec![2; 20]));
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(1, 3, 4, true), item(2, 0, 7, false)]);
    check(&s, &p);
    run(&mut s, &p);
    // Chunked prefill continues until the prompt is done, then 2 samples.
    let p = s.schedule().expect("plan");
    assert_eq!(p.items[1], item(2, 7, 14, false));
    run(&mut s, &p);
    let p = s.schedule().expect("plan");
    assert_eq!(p.items[1], item(2, 14, 20, true));
    assert_eq!(p.tokens(), 7);
    check(&s, &p);
}

#[test]
fn a_new_request_starts_after_its_cached_prefix_looked_up_once_at_admission() {
    let mut s = sched_with(64, 4, 8, 4, true);
    s.admit(Request::new(1, vec![3; 20]));
    let p = s.schedule().expect("plan");
    assert_eq!(p.admitted, vec![(1, 0)]);
    run(&mut s, &p);
    assert!(s.finish(1).expect("finish"));
    // Its five blocks are free again, four of them full and cached.
    assert_eq!(s.kv().free_blocks(), 8);
    s.admit(Request::new(2, [vec![3; 18], vec![4; 6]].concat()));
    let p = s.schedule().expect("plan");
    // 16 of the shared 18 tokens are in full blocks.
    assert_eq!(p.admitted, vec![(2, 16)]);
    assert_eq!(p.items, vec![item(2, 16, 24, true)]);
    check(&s, &p);
    run(&mut s, &p);
    // Once resident, it is not looked up again.
    let p = s.schedule().expect("plan");
    assert!(p.admitted.is_empty());
    assert_eq!(p.items, vec![item(2, 24, 25, true)]);
}

#[test]
fn a_request_whose_rest_does_not_fit_lets_its_cached_blocks_go_and_waits() {
    let mut s = sched_with(64, 4, 6, 4, true);
    s.admit(Request::new(1, vec![3; 16]));
    let p = s.schedule().expect("plan");
    run(&mut s, &p);
    assert!(s.finish(1).expect("finish"));
    // 2 runs in two blocks; 3 shares 12 cached tokens but needs 4 more blocks.
    s.admit(Request::new(2, vec![9; 7]));
    let p = s.schedule().expect("plan");
    run(&mut s, &p);
    let third = [vec![3; 12], vec![5; 14]].concat();
    assert_eq!(s.kv().cached_prefix(&third, &[]), (12, 3));
    s.admit(Request::new(3, third.clone()));
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(2, 7, 8, true)]);
    assert!(p.admitted.is_empty());
    assert_eq!(s.waiting(), 1);
    // Nothing of 3 stays held: the cached blocks it took went back, still cached.
    assert!(!s.kv().contains(3));
    assert_eq!(s.kv().free_blocks(), 6 - 2);
    assert_eq!(s.kv().cached_prefix(&third, &[]), (12, 3));
}

#[test]
fn the_running_limit_keeps_requests_queued() {
    let mut s = sched(64, 2, 100);
    for id in 1..=3 {
        s.admit(Request::new(id, vec![5; 4]));
    }
    let p = s.schedule().expect("plan");
    assert_eq!(p.items.iter().map(|i| i.id).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(s.waiting(), 1);
}

#[test]
fn an_exhausted_pool_preempts_the_newest_and_recomputes_it_later() {
    // 4 blocks of 4 tokens: two 8-token prompts take 2 blocks each.
    let mut s = sched(64, 4, 4);
    s.admit(Request::new(1, vec![1; 8]));
    s.admit(Request::new(2, vec![2; 8]));
    let p = s.schedule().expect("plan");
    assert_eq!(p.items.len(), 2);
    run(&mut s, &p);
    // Both hold 8 computed tokens in full blocks; 1's next token needs a block: 2 goes.
    let p = s.schedule().expect("plan");
    assert_eq!(p.preempted, vec![2]);
    assert_eq!(p.items, vec![item(1, 8, 9, true)]);
    assert!(
        !s.kv().contains(2),
        "a preempted request's blocks are freed at once"
    );
    run(&mut s, &p);
    let again = s.get(2).expect("2 is queued again");
    assert_eq!(
        (again.computed, again.preemptions, again.tokens.len()),
        (0, 1, 9)
    );
    // When 1 finishes, 2 is recomputed from its prompt and the token it had generated.
    assert!(s.finish(1).expect("finish"));
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(2, 0, 9, true)]);
    run(&mut s, &p);
    assert_eq!(s.kv().free_blocks(), 4 - 3);
}

#[test]
fn a_request_alone_that_outgrows_the_pool_preempts_itself() {
    let mut s = sched(64, 4, 1);
    s.admit(Request::new(1, vec![1; 4]));
    let p = s.schedule().expect("plan");
    run(&mut s, &p);
    let p = s.schedule().expect("plan");
    assert_eq!(p.preempted, vec![1]);
    assert!(p.items.is_empty());
    // It cannot come back either: the engine sees an empty plan with nothing running.
    let p = s.schedule().expect("plan");
    assert!(p.items.is_empty() && s.num_running() == 0 && s.waiting() == 1);
    assert_eq!(s.kv().free_blocks(), 1);
}

#[test]
fn drafts_ride_as_lookahead_and_are_dropped_before_anyone_is_preempted() {
    // Two blocks of 4: request 1 decodes in one; four drafts would need the second,
    // which another request holds.
    let mut s = sched(64, 4, 2);
    s.admit(Request::new(1, vec![1; 2]));
    s.admit(Request::new(2, vec![2; 4]));
    let p = s.schedule().expect("plan");
    run(&mut s, &p);
    assert!(s.finish(2).is_ok_and(|r| r));
    s.admit(Request::new(3, vec![2; 3]));
    let p = s.schedule().expect("plan");
    run(&mut s, &p);
    // 1 has 4 tokens, 3 computed, in one block; 3 holds the other.
    s.propose(1, vec![8, 9, 10, 11]);
    let p = s.schedule().expect("plan");
    assert!(p.preempted.is_empty());
    assert_eq!(p.items[0], item(1, 3, 4, true));
    assert!(s.finish(3).is_ok_and(|r| r));
    run(&mut s, &p);
    // With room, the drafts go in: the batch feeds the pending token and every draft.
    s.propose(1, vec![8, 9, 10]);
    let p = s.schedule().expect("plan");
    assert_eq!(
        p.items,
        vec![Item {
            lookahead: 3,
            ..item(1, 4, 5, true)
        }]
    );
    assert_eq!(p.batch.tokens, vec![7, 8, 9, 10]);
    assert_eq!(p.batch.logits_rows, vec![0, 1, 2, 3]);
    check(&s, &p);
    // The target accepts one draft and samples 5: of the 4 tokens fed, 2 stay.
    let up = s
        .update(
            &p,
            &[Outcome {
                id: 1,
                accepted: 1,
                tokens: vec![8, 5],
                done: false,
            }],
        )
        .expect("update");
    assert!(up.copies.is_empty());
    assert_eq!(
        up.emits,
        vec![Emit {
            id: 1,
            send: 2,
            sampled: 2,
            finish: None
        }]
    );
    let r = s.get(1).expect("held");
    assert_eq!((r.computed, r.tokens.len()), (6, 7));
    assert_eq!(s.kv().seq_len(1), 6);
    assert_eq!(s.kv().computed_tokens(1), &[1, 1, 7, 7, 7, 8]);
}

#[test]
fn update_ends_a_request_at_a_stop_token_its_limit_the_context_or_its_grammar() {
    let mut s = sched_with(64, 4, 100, 4, false);
    s.cfg.max_len = 12;
    let mut stop = Request::new(1, vec![1; 3]);
    stop.stop_ids = vec![9];
    let mut limit = Request::new(2, vec![1; 3]);
    limit.max_tokens = 2;
    let ctx = Request::new(3, vec![1; 10]);
    let grammar = Request::new(4, vec![1; 3]);
    for r in [stop, limit, ctx, grammar] {
        s.admit(r);
    }
    let p = s.schedule().expect("plan");
    assert!(p.items.iter().all(|i| i.kind() == StepKind::Prefill));
    let out = |id, tokens: Vec<u32>, done| Outcome {
        id,
        tokens,
        done,
        ..Outcome::default()
    };
    let up = s
        .update(
            &p,
            &[
                // Accepted drafts past a stop token are not sent.
                out(1, vec![5, 9, 6], false),
                out(2, vec![5, 6, 7], false),
                out(3, vec![5, 6, 7], false),
                out(4, vec![5], true),
            ],
        )
        .expect("update");
    let e = |id, send, sampled, finish| Emit {
        id,
        send,
        sampled,
        finish: Some(finish),
    };
    assert_eq!(
        up.emits,
        vec![
            e(1, 1, 2, Finish::Stop),
            e(2, 2, 2, Finish::Length),
            e(3, 2, 2, Finish::Length),
            e(4, 1, 1, Finish::Stop),
        ]
    );
    assert_eq!(s.get(2).map(|r| r.generated), Some(2));
}

/// The outcomes of a plan: `tokens` for the items of the ids it names, nothing for the rest.
fn outcomes(plan: &Plan, tokens: &[(ReqId, &[u32])]) -> Vec<Outcome> {
    (plan.items.iter())
        .map(|it| Outcome {
            id: it.id,
            tokens: (tokens.iter())
                .find(|(id, _)| *id == it.id)
                .map_or(Vec::new(), |(_, t)| t.to_vec()),
            ..Outcome::default()
        })
        .collect()
}

#[test]
fn a_denoise_request_feeds_its_prompt_then_denoises_canvases_planned_after_the_others() {
    let kv = KvCoordinator::new(vec![None], &[101], 4, false, 0, None).expect("kv");
    let mut s = Scheduler::new(
        SchedConfig {
            max_batch_tokens: 64,
            max_running: 4,
            max_len: 1 << 20,
            snapshot_blocks: None,
            canvas: 4,
        },
        kv,
    );
    let mut d = Request::new(1, vec![1; 5]);
    d.kind = Kind::Denoise;
    d.max_tokens = 7;
    d.stop_ids = vec![9];
    s.admit(d);
    s.admit(Request::new(2, vec![2; 3]));
    // The whole prompt goes in, with no token sampled.
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(1, 0, 5, false), item(2, 0, 3, true)]);
    check(&s, &p);
    s.update(&p, &outcomes(&p, &[(2, &[7])])).expect("update");
    // Then a canvas of 4 rows, after the other request's decode; it commits nothing.
    let canvas = Item {
        canvas: 4,
        ..item(1, 5, 5, false)
    };
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(2, 3, 4, true), canvas.clone()]);
    assert_eq!(p.items[1].kind(), StepKind::Denoise { canvas: 4 });
    assert_eq!(p.items[1].logits(), Logits::All);
    assert_eq!(p.canvases(), 1);
    check(&s, &p);
    assert_eq!(&p.batch.tokens[1..], &[0; 4]);
    let up = s.update(&p, &outcomes(&p, &[(2, &[7])])).expect("update");
    assert_eq!(up.emits.iter().map(|e| e.id).collect::<Vec<_>>(), vec![2]);
    assert_eq!((s.kv().seq_len(1), s.kv().blocks_held(1)), (5, 3));
    // The canvas again, in the slots it has; this time it is done: its tokens go out.
    let p = s.schedule().expect("plan");
    assert_eq!(p.items[1], canvas);
    let up = (s.update(&p, &outcomes(&p, &[(2, &[7]), (1, &[3, 4, 5, 6])]))).expect("update");
    assert_eq!(
        up.emits[1],
        Emit {
            id: 1,
            send: 4,
            sampled: 4,
            finish: None
        }
    );
    assert_eq!(s.kv().blocks_held(1), 3);
    // The committed canvas is fed like a prompt chunk, then the next canvas runs; it holds
    // the stop token, and `max_tokens` would have cut it anyway.
    let p = s.schedule().expect("plan");
    assert_eq!(p.items, vec![item(1, 5, 9, false), item(2, 5, 6, true)]);
    s.update(&p, &outcomes(&p, &[(2, &[7])])).expect("update");
    let p = s.schedule().expect("plan");
    assert_eq!(
        p.items[1],
        Item {
            canvas: 4,
            ..item(1, 9, 9, false)
        }
    );
    let up = s
        .update(&p, &outcomes(&p, &[(1, &[5, 6, 9, 1])]))
        .expect("update");
    assert_eq!(
        up.emits[0],
        Emit {
            id: 1,
            send: 2,
            sampled: 3,
            finish: Some(Finish::Stop)
        }
    );
    assert_eq!(s.get(1).map(|r| r.generated), Some(6));
    assert!(s.finish(1).expect("finish"));
    assert_eq!(s.kv().blocks_held(1), 0);
}

#[test]
fn a_denoise_request_ends_at_max_tokens_or_when_no_canvas_fits_the_context() {
    let run_to_end = |max_len: usize, max_tokens: usize| -> (usize, Option<Finish>) {
        let kv = KvCoordinator::new(vec![None], &[101], 4, false, 0, None).expect("kv");
        let mut s = Scheduler::new(
            SchedConfig {
                max_batch_tokens: 64,
                max_running: 1,
                max_len,
                snapshot_blocks: None,
                canvas: 4,
            },
            kv,
        );
        let mut d = Request::new(1, vec![1; 3]);
        d.kind = Kind::Denoise;
        d.max_tokens = max_tokens;
        s.admit(d);
        for _ in 0..20 {
            let p = s.schedule().expect("plan");
            let done = p.items[0].canvas > 0;
            let up = match done {
                true => s.update(&p, &outcomes(&p, &[(1, &[2, 3, 4, 5])])),
                false => s.update(&p, &outcomes(&p, &[])),
            }
            .expect("update");
            if let Some(e) = up.emits.first().filter(|e| e.finish.is_some()) {
                return (s.get(1).map_or(0, |r| r.generated), e.finish);
            }
        }
        panic!("the request never ended");
    };
    // max_tokens cuts the second canvas.
    assert_eq!(run_to_end(1 << 20, 6), (6, Some(Finish::Length)));
    // 3 + 4 + 4 = 11 tokens fit a context of 14, a third canvas does not.
    assert_eq!(run_to_end(14, 100), (8, Some(Finish::Length)));
    assert_eq!(run_to_end(15, 100), (12, Some(Finish::Length)));
}

#[test]
fn items_say_what_kind_of_step_they_are() {
    assert_eq!(item(1, 0, 8, false).kind(), StepKind::Prefill);
    assert_eq!(item(1, 0, 8, true).kind(), StepKind::Prefill);
    assert_eq!(item(1, 8, 9, true).kind(), StepKind::Decode);
    let verify = Item {
        lookahead: 3,
        ..item(1, 8, 9, true)
    };
    assert_eq!(verify.kind(), StepKind::Verify { k: 3 });
    assert_eq!(verify.logits(), Logits::All);
}

/// Random prompts, generation lengths, drafts and acceptances over small pools: nothing
/// stalls, the coordinator always agrees with the records, and every block comes back.
#[test]
fn random_workloads_always_finish_and_free_every_block() {
    let mut rng = crate::rng::Rng::new(11);
    for _ in 0..50 {
        let blocks = 6 + (rng.next_u64() % 10) as usize;
        let mut s = sched(
            1 + (rng.next_u64() % 24) as usize,
            1 + (rng.next_u64() % 5) as usize,
            blocks,
        );
        let mut want = HashMap::new();
        for id in 1..=6u64 {
            let prompt = 1 + (rng.next_u64() % 9) as usize;
            let gen = 1 + (rng.next_u64() % 8) as usize;
            want.insert(id, prompt + gen);
            s.admit(Request::new(id, vec![3; prompt]));
        }
        let mut steps = 0;
        while !s.is_idle() {
            steps += 1;
            assert!(steps < 10_000, "no progress");
            let ids: Vec<ReqId> = s.running().map(|r| r.id).collect();
            for id in ids {
                let k = (rng.next_u64() % 4) as usize;
                s.propose(id, (0..k as u32).map(|t| 20 + t).collect());
            }
            let p = s.schedule().expect("plan");
            assert!(p.tokens() <= s.config().max_batch_tokens);
            if p.items.is_empty() && s.num_running() == 0 {
                // Only a request bigger than the pool can stall; none is here.
                panic!("stalled with {} waiting", s.waiting());
            }
            check(&s, &p);
            let outs: Vec<Outcome> = p
                .items
                .iter()
                .map(|it| {
                    let a = (rng.next_u64() as usize) % (it.lookahead + 1);
                    let d = &s.get(it.id).expect("held").draft;
                    let mut tokens = d[..a].to_vec();
                    if it.sample {
                        tokens.push(7);
                    }
                    Outcome {
                        id: it.id,
                        accepted: a,
                        tokens,
                        done: false,
                    }
                })
                .collect();
            s.update(&p, &outs).expect("update");
            let done: Vec<ReqId> = s
                .running()
                .filter(|q| q.tokens.len() >= want[&q.id])
                .map(|q| q.id)
                .collect();
            for id in done {
                assert!(s.finish(id).expect("finish"));
            }
        }
        assert_eq!(s.kv().free_blocks(), blocks);
    }
}

/// A long queue with requests cancelled anywhere in it: order, counts and lookups stay
/// right, and the places the cancelled ones leave behind are bounded by the live ones.
#[test]
fn cancelling_inside_a_long_queue_keeps_order_and_bounds_stale_places() {
    let mut rng = crate::rng::Rng::new(5);
    let mut s = sched(16, 2, 1_000);
    let mut live: Vec<ReqId> = Vec::new();
    for id in 1..=5_000u64 {
        s.admit(Request::new(
            id,
            vec![(id % 50) as u32; 1 + (id % 7) as usize],
        ));
        live.push(id);
        // Cancel a random queued request about two times in three.
        if !rng.next_u64().is_multiple_of(3) {
            let k = (rng.next_u64() as usize) % live.len();
            let gone = live.remove(k);
            assert!(!s.finish(gone).expect("finish"), "{gone} was queued");
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
    let p = s.schedule().expect("plan");
    let ids: Vec<ReqId> = p.items.iter().map(|i| i.id).collect();
    assert_eq!(ids, live[..2].to_vec());
    assert_eq!(s.waiting(), live.len() - 2);
    assert!(
        s.finish(live[0]).expect("finish"),
        "a running request is resident"
    );
    assert_eq!(s.num_running(), 1);
}

fn with_image(id: ReqId, prompt: Vec<u32>, start: usize, len: usize, d: u8) -> Request {
    let mut r = Request::new(id, prompt);
    r.images = vec![crate::kv::ContentSpan {
        start,
        len,
        digest: [d; 32],
    }];
    r
}

/// Prefill chunks never end inside an image: under a budget of 6, a 20-token prompt with an
/// image at 4..13 goes 0..4, then 4..13 whole (past the budget), then on.
#[test]
fn chunks_stop_before_an_image_or_take_it_whole() {
    let mut s = sched(6, 4, 100);
    s.admit(with_image(1, vec![3; 20], 4, 9, 1));
    let mut ends = Vec::new();
    for _ in 0..6 {
        let p = s.schedule().expect("plan");
        if p.items.is_empty() {
            break;
        }
        check(&s, &p);
        ends.push((p.items[0].start, p.items[0].end));
        run(&mut s, &p);
        if p.items[0].end >= 20 {
            break;
        }
    }
    assert_eq!(ends, vec![(0, 4), (4, 13), (13, 19), (19, 20)]);
}

/// The prefix cache keys image blocks by the image: the same tokens with the same image hit,
/// with another image only the blocks before it do; a hit that ends inside an image makes
/// the next chunk take the rest of it.
#[test]
fn cached_blocks_are_shared_only_with_the_same_image() {
    let mut s = sched_with(64, 4, 40, 4, true);
    let prompt = vec![3u32; 24];
    s.admit(with_image(1, prompt.clone(), 6, 9, 1));
    let p = s.schedule().expect("plan");
    run(&mut s, &p);
    assert!(s.finish(1).expect("finish"));
    // Same image: every full block but the last token's (20 tokens).
    s.admit(with_image(2, prompt.clone(), 6, 9, 1));
    let p = s.schedule().expect("plan");
    assert_eq!(p.admitted, vec![(2, 20)]);
    run(&mut s, &p);
    // Another image at the same place: only the block before it.
    s.admit(with_image(3, prompt.clone(), 6, 9, 2));
    let p = s.schedule().expect("plan");
    assert_eq!(p.admitted, vec![(3, 4)]);
    check(&s, &p);
    // A cached prefix ending inside an image: request 1 stops once it has computed the image
    // (15 tokens, so blocks up to 12 are cached); request 2's hit of 12 ends inside the image,
    // and its first chunk takes the image's rest (12..15) though the budget is 2.
    let mut s = sched_with(2, 4, 40, 4, true);
    s.admit(with_image(1, prompt.clone(), 6, 9, 1));
    let mut ends = Vec::new();
    while ends.last() != Some(&15) {
        let p = s.schedule().expect("plan");
        ends.push(p.items[0].end);
        run(&mut s, &p);
    }
    assert_eq!(ends, vec![2, 4, 6, 15]);
    assert!(s.finish(1).expect("finish"));
    s.admit(with_image(2, prompt, 6, 9, 1));
    let p = s.schedule().expect("plan");
    assert_eq!(p.admitted, vec![(2, 12)]);
    assert_eq!(p.items, vec![item(2, 12, 15, false)]);
    check(&s, &p);
}
