//! The engine on the toy model ([`crate::model::toy`]): continuous batching with chunked
//! prefill and preemption, cancellation, the prefix cache, sliding-window release, speculative
//! verification and rollback, embeddings, and (on the toy as a block-diffusion model) canvases
//! sharing passes with token requests, each against the same requests run alone — in
//! milliseconds, with no model file.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};

use super::{Engine, EngineStats, Event, Finish, GenRequest};
use super::{Logits, Runner, RunnerConfig};
use crate::exec::Executor;
use crate::model::toy::{toy, Toy};
use crate::rng::Rng;
use crate::sample::SamplingParams;
use crate::spec::Ngram;

const VOCAB: usize = 48;
const WINDOW: usize = 6;

fn runner(max_seqs: usize, kv_blocks: Option<usize>, chunk: usize, cache: bool) -> Runner {
    let ex = Executor::cpu();
    let model = toy(&ex, VOCAB, WINDOW, 7).expect("toy");
    let cfg = RunnerConfig {
        ctx: 128,
        max_seqs,
        max_batch_tokens: chunk,
        kv_blocks,
        block_size: 4,
        prefix_caching: cache,
        // Speculation and the rollback test take back up to 4 tokens.
        max_rollback: 4,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

fn engine(max_seqs: usize, kv_blocks: Option<usize>, chunk: usize, cache: bool) -> Engine {
    Engine::new(runner(max_seqs, kv_blocks, chunk, cache), max_seqs)
}

/// Prompts of 5 to 20 random tokens, and one that repeats itself (for the n-gram drafter).
fn prompts(n: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(99);
    let mut out: Vec<Vec<u32>> = (0..n)
        .map(|_| {
            let len = 5 + rng.below(16);
            (0..len).map(|_| rng.below(VOCAB) as u32).collect()
        })
        .collect();
    out.push([3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4].to_vec());
    out
}

fn request(prompt: &[u32], n: usize) -> GenRequest {
    GenRequest::new(prompt.to_vec(), SamplingParams::greedy(), n)
}

/// Drives `e` until every request has ended: each one's tokens, in submission order.
fn run_all(mut e: Engine, reqs: Vec<GenRequest>) -> (Vec<Vec<u32>>, EngineStats) {
    let rxs: Vec<Receiver<Event>> = reqs
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            e.submit(r, tx).expect("submit");
            rx
        })
        .collect();
    let mut steps = 0;
    while e.step().expect("step") {
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    let got = rxs
        .iter()
        .map(|rx| {
            let mut out = Vec::new();
            for ev in rx.try_iter() {
                match ev {
                    Event::Token(t, _) => out.push(t),
                    Event::Done { finish, .. } => assert_eq!(finish, Finish::Length),
                    Event::Error(err) => panic!("request failed: {err}"),
                    _ => {}
                }
            }
            out
        })
        .collect();
    (got, e.stats().clone())
}

/// Each prompt's greedy tokens from the toy's oracle (a pass over the whole sequence per token,
/// contiguous attention: no cache, no scheduler) — and the same through a one-request engine
/// with room to spare, which must agree with it.
fn alone(prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let ex = Executor::cpu();
    let toy = Toy::new(&ex, VOCAB, WINDOW, 7).expect("toy");
    prompts
        .iter()
        .map(|p| {
            let want = toy.greedy_reference(&ex, p, n).expect("reference");
            let got = run_all(engine(1, None, 64, false), vec![request(p, n)]).0[0].clone();
            assert_eq!(
                got, want,
                "the engine alone against the oracle, prompt {p:?}"
            );
            want
        })
        .collect()
}

#[test]
fn batched_requests_get_the_tokens_they_get_alone_even_when_preempted() {
    let ps = prompts(6);
    let n = 12;
    let want = alone(&ps, n);
    let distinct: std::collections::BTreeSet<u32> = want.iter().flatten().copied().collect();
    assert!(distinct.len() > 6, "the toy's outputs vary: {want:?}");
    // Room for all; a pool that cannot hold them all (preemption, recomputation); the same
    // with the prefix cache (a preempted request restarts from its own cached blocks).
    for (blocks, cache, label) in [
        (None, false, "roomy"),
        (Some(12), false, "small pool"),
        (Some(12), true, "small pool, prefix cache"),
    ] {
        let reqs = ps.iter().map(|p| request(p, n)).collect();
        let (got, stats) = run_all(engine(ps.len(), blocks, 8, cache), reqs);
        assert_eq!(got, want, "{label}");
        if blocks.is_some() {
            assert!(stats.preemptions > 0, "{label}: never preempted");
        }
    }
}

#[test]
fn cancelled_requests_return_every_block_to_the_pool() {
    let ps = prompts(4);
    let mut e = engine(4, None, 8, false);
    let free = |e: &Engine| -> Vec<usize> {
        e.kv()
            .managers()
            .iter()
            .map(|m| m.num_free_blocks())
            .collect()
    };
    let before = free(&e);
    let mut rxs = HashMap::new();
    for p in &ps[..4] {
        let (tx, rx) = mpsc::channel();
        rxs.insert(e.submit(request(p, 100), tx).expect("submit"), rx);
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    while seen.len() < 4 || seen.values().any(|&n| n < 3) {
        assert!(e.step().expect("step"));
        for (id, rx) in &rxs {
            while let Ok(Event::Token(..)) = rx.try_recv() {
                *seen.entry(*id).or_default() += 1;
            }
        }
    }
    assert!(free(&e)[0] < before[0], "the requests hold blocks");
    drop(rxs);
    let mut steps = 0;
    while e.step().expect("step") {
        steps += 1;
        assert!(steps < 4, "cancellation took more than a step");
    }
    assert_eq!(free(&e), before, "blocks still held after cancellation");
    assert_eq!(e.stats().cancelled, 4);
}

#[test]
fn a_shared_prefix_comes_from_the_cache_with_the_same_tokens() {
    let base = prompts(1)[0].clone();
    let mut a = base.clone();
    a.extend([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let mut b = a[..a.len() - 3].to_vec();
    b.extend([11, 12]);
    let want = alone(&[a.clone(), b.clone()], 8);
    let mut e = engine(2, None, 64, true);
    let (got_a, _) = {
        let (tx, rx) = mpsc::channel();
        e.submit(request(&a, 8), tx).expect("submit");
        while e.step().expect("step") {}
        (rx.try_iter().collect::<Vec<_>>(), ())
    };
    let hits_before = e.stats().prefix_hit_tokens;
    let (got, stats) = run_all(e, vec![request(&b, 8)]);
    let tokens_a: Vec<u32> = got_a
        .iter()
        .filter_map(|ev| match ev {
            Event::Token(t, _) => Some(*t),
            _ => None,
        })
        .collect();
    assert_eq!(tokens_a, want[0]);
    assert_eq!(got[0], want[1]);
    // b shares a's first whole blocks (of 4 tokens).
    let shared = (a.len() - 3) / 4 * 4;
    assert!(
        stats.prefix_hit_tokens - hits_before >= shared as u64 - 4,
        "{} cached tokens of a {shared}-token shared prefix",
        stats.prefix_hit_tokens - hits_before
    );
}

#[test]
fn greedy_speculation_gives_the_tokens_plain_decoding_gives() {
    let ps = prompts(3);
    let n = 16;
    let want = alone(&ps, n);
    let e = engine(ps.len(), None, 16, false)
        .with_spec(Box::new(Ngram::default()), 4)
        .expect("speculation");
    let reqs = ps.iter().map(|p| request(p, n)).collect();
    let (got, stats) = run_all(e, reqs);
    assert_eq!(got, want);
    assert!(
        stats.spec.drafted > 0,
        "nothing was drafted: {:?}",
        stats.spec
    );
}

#[test]
fn rollback_restores_the_logits_of_the_shorter_sequence() {
    let ps = prompts(1);
    let p = &ps[0];
    let mut r = runner(1, None, 64, false);
    r.feed(1, p, Logits::None).expect("feed");
    // Four tokens (the runner's most to take back; with the prompt they reach past the
    // sliding window's 6), then back; then one more and back.
    r.feed(1, &[1, 2, 3, 4], Logits::None).expect("more");
    r.rollback(1, 4).expect("rollback");
    r.feed(1, &[9], Logits::None).expect("then a token");
    r.rollback(1, 1).expect("rollback");
    // The next token's logits are those of the prompt and that token fed afresh.
    let next = r
        .feed(1, &[5], Logits::Last)
        .expect("next")
        .pop()
        .expect("row");
    let mut whole = p.clone();
    whole.push(5);
    let direct = fresh_last(&whole);
    assert_eq!(
        next, direct,
        "after rollback the sequence is the prompt again"
    );
}

fn fresh_last(tokens: &[u32]) -> Vec<f32> {
    let mut r = runner(1, None, 64, false);
    r.feed(1, tokens, Logits::Last)
        .expect("feed")
        .pop()
        .expect("row")
}

#[test]
fn long_sequences_release_blocks_outside_the_window_and_keep_their_tokens() {
    // A prompt many windows long through small chunks: the sliding group releases what its
    // window no longer sees; the tokens equal the one-chunk run's.
    let mut rng = Rng::new(5);
    let p: Vec<u32> = (0..40).map(|_| rng.below(VOCAB) as u32).collect();
    let want = alone(std::slice::from_ref(&p), 10);
    let mut e = engine(1, None, 5, false);
    let (tx, rx) = mpsc::channel();
    e.submit(request(&p, 10), tx).expect("submit");
    // Most of the way through the prompt: the sliding group holds only its window's blocks.
    for _ in 0..6 {
        assert!(e.step().expect("step"));
    }
    let held = |e: &Engine, g: usize| {
        let m = &e.kv().managers()[g];
        m.pool().num_blocks() - m.num_free_blocks()
    };
    let (full, sliding) = (held(&e, 0), held(&e, 1));
    assert!(
        sliding < full,
        "the sliding group holds {sliding} blocks, the full one {full}: nothing was released"
    );
    while e.step().expect("step") {}
    let got: Vec<u32> = rx
        .try_iter()
        .filter_map(|ev| match ev {
            Event::Token(t, _) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(got, want[0]);
}

/// One request's path, top-down, with nothing between the pieces: admission, planning (where
/// the scheduler allocates every slot the step writes and builds the batch), the forward
/// pass (which holds nothing per request), and the update (which commits what was fed). Its
/// greedy tokens are the oracle's, and every block comes back when it ends.
#[test]
fn one_request_walks_admission_allocation_plan_forward_update() {
    use crate::sched::{Outcome, Request, SchedConfig, Scheduler};
    let p = prompts(1).remove(0);
    let n = 6;
    let (fwd, kv) = runner(1, None, 8, false).into_parts();
    let free = kv.free_blocks();
    let mut s = Scheduler::new(
        SchedConfig {
            max_batch_tokens: 8,
            max_running: 1,
            max_len: 128,
            snapshot_blocks: None,
            canvas: 0,
        },
        kv,
    );
    s.admit(Request::new(1, p.clone()));
    let mut got: Vec<u32> = Vec::new();
    while got.len() < n {
        let plan = s.schedule().expect("plan");
        let [it] = &plan.items[..] else {
            panic!("one item a step: {:?}", plan.items);
        };
        // Planning allocated the slots: the batch writes every fed token somewhere.
        assert!(plan.batch.slots.iter().all(|g| g.iter().all(|&x| x >= 0)));
        assert_eq!(
            s.kv().seq_len(1),
            it.start,
            "nothing is committed before the pass"
        );
        let (rows, _) = fwd.run(&plan.batch, None).expect("forward");
        let tokens = match (it.sample, rows[0].last()) {
            (true, Some(l)) => vec![crate::sample::argmax(l)],
            _ => Vec::new(),
        };
        got.extend(&tokens);
        s.update(
            &plan,
            &[Outcome {
                id: 1,
                tokens,
                ..Outcome::default()
            }],
        )
        .expect("update");
        assert_eq!(s.kv().seq_len(1), it.end);
    }
    let ex = Executor::cpu();
    let toy = Toy::new(&ex, VOCAB, WINDOW, 7).expect("toy");
    assert_eq!(got, toy.greedy_reference(&ex, &p, n).expect("oracle"));
    assert!(s.finish(1).expect("finish"));
    assert_eq!(s.kv().free_blocks(), free);
}

#[test]
fn a_starting_canvas_is_refused_by_a_model_that_does_not_denoise() {
    let mut e = engine(1, None, 8, false);
    let req = GenRequest {
        init_canvas: Some(vec![1, 2, 3]),
        ..request(&[1, 2], 4)
    };
    let (tx, _rx) = mpsc::channel();
    let err = e.submit(req, tx).expect_err("refused");
    assert!(err.to_string().contains("block-diffusion"), "{err}");
    assert!(e.is_idle());
}

/// An engine over the toy as a block-diffusion model (canvases of 4, at most 3 denoising
/// steps each), `max_seqs` at once.
fn diffusion_engine(max_seqs: usize, kv_blocks: Option<usize>) -> Engine {
    use crate::model::toy::ToyDiffusion;
    let ex = Executor::cpu();
    let model = ToyDiffusion::new(&ex, VOCAB, WINDOW, 7, 4).expect("toy");
    let cfg = RunnerConfig {
        ctx: 128,
        max_seqs,
        max_batch_tokens: 16,
        kv_blocks,
        block_size: 4,
        ..RunnerConfig::default()
    };
    let mut e = Engine::new(
        Runner::new(ex, Box::new(model), cfg).expect("runner"),
        max_seqs,
    );
    let p = crate::sample::diffusion::DiffusionParams {
        max_denoising_steps: 3,
        ..Default::default()
    };
    e.set_diffusion_defaults(p).expect("params");
    e
}

/// Three diffusion requests and three token-by-token ones on one toy: each alone, then all at
/// once with room for all, then in a pool too small for all (preempted mid-canvas and fed
/// again). Every request hears the same events either way; canvases share passes with each
/// other and with the token requests; every block comes back.
#[test]
fn canvases_share_passes_with_token_requests_and_match_each_alone() {
    let ps = prompts(6);
    let reqs: Vec<GenRequest> = ps[..6]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let params = SamplingParams {
                seed: Some(i as u64),
                ..SamplingParams::default()
            };
            GenRequest {
                autoregressive: i >= 3,
                ..GenRequest::new(p.clone(), params, 10)
            }
        })
        .collect();
    let hear = |rx: &Receiver<Event>| -> Vec<Event> { rx.try_iter().collect() };
    let alone: Vec<Vec<Event>> = reqs
        .iter()
        .map(|r| {
            let mut e = diffusion_engine(6, None);
            let (tx, rx) = mpsc::channel();
            e.submit(r.clone(), tx).expect("submit");
            while e.step().expect("step") {}
            hear(&rx)
        })
        .collect();
    for (events, r) in alone.iter().zip(&reqs) {
        let canvases = events
            .iter()
            .filter(|e| matches!(e, Event::Canvas { .. }))
            .count();
        assert_eq!(canvases > 0, !r.autoregressive, "{events:?}");
        assert!(
            matches!(events.last(), Some(Event::Done { .. })),
            "{events:?}"
        );
    }
    for blocks in [None, Some(9)] {
        let mut e = diffusion_engine(6, blocks);
        let rxs: Vec<Receiver<Event>> = reqs
            .iter()
            .map(|r| {
                let (tx, rx) = mpsc::channel();
                e.submit(r.clone(), tx).expect("submit");
                rx
            })
            .collect();
        while e.step().expect("step") {}
        let together: Vec<Vec<Event>> = rxs.iter().map(hear).collect();
        assert_eq!(together, alone, "pool {blocks:?}");
        let st = e.stats();
        // With room for all, canvases share passes (the small pool holds one at a time).
        if blocks.is_none() {
            assert!(st.diffusion_pass_canvases > st.diffusion_passes, "{st:?}");
        }
        assert!(st.diffusion_shared_passes > 0, "{st:?}");
        assert_eq!(st.preemptions > 0, blocks.is_some(), "{st:?}");
        let s = e.snapshot();
        assert_eq!(s.kv_free, s.kv_total);
    }
}

/// A diffusion request cancelled mid-canvas gives its blocks back; the one beside it goes on.
#[test]
fn a_cancelled_diffusion_request_frees_its_blocks() {
    let ps = prompts(2);
    let mut e = diffusion_engine(2, None);
    let (tx, rx) = mpsc::channel();
    let a = e.submit(request(&ps[0], 40), tx).expect("submit");
    let (tx2, rx2) = mpsc::channel();
    e.submit(request(&ps[1], 8), tx2).expect("submit");
    for _ in 0..4 {
        e.step().expect("step");
    }
    assert!(e.snapshot().kv_free < e.snapshot().kv_total);
    e.cancel(a).expect("cancel");
    while e.step().expect("step") {}
    assert!(!rx.try_iter().any(|ev| matches!(ev, Event::Done { .. })));
    assert!(rx2.try_iter().any(|ev| matches!(ev, Event::Done { .. })));
    let s = e.snapshot();
    assert_eq!(s.kv_free, s.kv_total);
    assert!(e.is_idle());
}

/// Embeddings on the toy: scheduled beside generations in a pool too small for all, each
/// vector equal to a lone embedding pass's, the generations unchanged.
#[test]
fn toy_embeddings_share_the_pool_and_match_a_lone_pass() {
    use crate::runner::embed::Pooling;
    let ps = prompts(6);
    let want_gen: Vec<Vec<u32>> = ps[..3]
        .iter()
        .map(|p| {
            let (got, _) = run_all(engine(1, None, 8, false), vec![request(p, 8)]);
            got[0].clone()
        })
        .collect();
    let want_vec: Vec<Vec<f32>> = ps[3..6]
        .iter()
        .map(|p| {
            let mut r = runner(1, None, 8, false);
            r.embed(1, p, Pooling::Mean).expect("lone embedding")
        })
        .collect();
    let mut e = engine(6, Some(8), 8, false);
    let gens: Vec<Receiver<Event>> = ps[..3]
        .iter()
        .map(|p| {
            let (tx, rx) = mpsc::channel();
            e.submit(request(p, 8), tx).expect("submit");
            rx
        })
        .collect();
    let embs: Vec<Receiver<Event>> = ps[3..6]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (tx, rx) = mpsc::channel();
            e.submit_embedding(100 + i as u64, p, Pooling::Mean, Box::new(tx))
                .expect("submit");
            rx
        })
        .collect();
    while e.step().expect("step") {}
    for (rx, want) in gens.iter().zip(&want_gen) {
        let got: Vec<u32> = rx
            .try_iter()
            .filter_map(|ev| match ev {
                Event::Token(t, _) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(&got, want);
    }
    for (rx, want) in embs.iter().zip(&want_vec) {
        let got = rx
            .try_iter()
            .find_map(|ev| match ev {
                Event::Embedding(v) => Some(v),
                _ => None,
            })
            .expect("an embedding");
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-5, "max |difference| {err}");
    }
    assert!(e.stats().preemptions > 0, "{:?}", e.stats());
    let s = e.snapshot();
    assert_eq!(s.kv_free, s.kv_total);
}
