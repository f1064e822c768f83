//! The continuous-batching engine on a real model (SmolLM2 on the CPU): requests batched
//! together, with chunked prefill and preemption, give each the tokens it gets alone; a
//! cancelled request's blocks all return to the pool.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};

use kiln_core::engine::{spawn, Engine, EngineStats, Event, Finish, GenRequest, SlotState, Stream};
use kiln_core::engine::{Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
use kiln_core::sample::SamplingParams;
use kiln_core::tokenizer::Tokenizer;
use kiln_tests::{model_file, SMOLLM2};

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "List three colours:",
    "Water boils at",
    "The quick brown fox",
];

fn engine(file: &GgufFile, max_seqs: usize, kv_blocks: Option<usize>) -> Engine {
    // Small steps: prefills are chunked and share steps with decodes.
    engine_with(file, max_seqs, kv_blocks, 16, false)
}

fn engine_with(
    file: &GgufFile,
    max_seqs: usize,
    kv_blocks: Option<usize>,
    max_batch_tokens: usize,
    prefix_caching: bool,
) -> Engine {
    let ex = Executor::cpu();
    let model = build_from_gguf(file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 256,
        max_seqs,
        max_batch_tokens,
        kv_blocks,
        prefix_caching,
        ..RunnerConfig::default()
    };
    Engine::new(Runner::new(ex, model, cfg).expect("runner"), max_seqs)
}

fn request(tok: &Tokenizer, prompt: &str, max_tokens: usize) -> GenRequest {
    GenRequest::new(
        tok.encode(prompt, true).expect("encode"),
        SamplingParams::greedy(),
        max_tokens,
    )
}

fn collect(rx: &Receiver<Event>) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        match rx.recv().expect("the engine ends every stream") {
            Event::Token(t, _) => out.push(t),
            Event::Done {
                finish, generated, ..
            } => {
                assert_eq!(finish, Finish::Length);
                assert_eq!(generated, out.len());
                return out;
            }
            Event::Error(e) => panic!("request failed: {e}"),
            Event::Cached(_) => {}
            e @ (Event::Draft { .. } | Event::Canvas { .. } | Event::Embedding(_)) => {
                panic!("not a generation's event: {e:?}")
            }
        }
    }
}

/// Each prompt alone, one after another, through a one-request engine.
fn alone(file: &GgufFile, tok: &Tokenizer, n: usize) -> Vec<Vec<u32>> {
    let h = spawn(engine(file, 1, None));
    PROMPTS
        .iter()
        .map(|p| collect(&h.submit(request(tok, p, n))))
        .collect()
}

/// Every prompt submitted at once to `engine`, `n` tokens each: the tokens of each, and the
/// engine's counters once it has shut down.
fn all_at_once(
    engine: Engine,
    tok: &Tokenizer,
    prompts: &[impl AsRef<str>],
    n: usize,
) -> (Vec<Vec<u32>>, EngineStats) {
    let h = spawn(engine);
    let rxs: Vec<Stream> = prompts
        .iter()
        .map(|p| h.submit(request(tok, p.as_ref(), n)))
        .collect();
    let got = rxs.iter().map(|r| collect(r)).collect();
    (got, h.shutdown().expect("engine thread"))
}

fn load() -> Option<(GgufFile, Tokenizer)> {
    let path = model_file(SMOLLM2)?;
    let file = GgufFile::open(&path).expect("model parses");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    Some((file, tok))
}

#[test]
fn batched_requests_get_the_tokens_they_get_alone_even_when_preempted() {
    let Some((file, tok)) = load() else {
        return;
    };
    let n = 20;
    let want = alone(&file, &tok, n);
    // Enough KV for every request at once, then a pool of 7 blocks (112 tokens) that cannot
    // hold six 25-to-35-token requests and must preempt; then the small pool with prefix
    // caching, where a preempted request restarts from its own cached blocks.
    for (blocks, cache, label) in [
        (None, false, "roomy pool"),
        (Some(7), false, "small pool"),
        (Some(7), true, "small pool, prefix cache"),
    ] {
        let engine = engine_with(&file, PROMPTS.len(), blocks, 16, cache);
        let (got, stats) = all_at_once(engine, &tok, &PROMPTS, n);
        println!("{label}: {stats:?}");
        for (i, p) in PROMPTS.iter().enumerate() {
            assert_eq!(got[i], want[i], "{label}: {p:?} batched vs alone");
        }
        if blocks.is_some() {
            assert!(stats.preemptions > 0, "the small pool never preempted");
        }
    }
}

#[test]
fn cancelled_requests_return_every_block_to_the_pool() {
    let Some((file, tok)) = load() else {
        return;
    };
    let mut e = engine(&file, 4, None);
    let free_before: Vec<usize> = e
        .kv()
        .managers()
        .iter()
        .map(|m| m.num_free_blocks())
        .collect();
    let mut rxs = HashMap::new();
    for p in &PROMPTS[..4] {
        let (tx, rx) = mpsc::channel();
        let id = e.submit(request(&tok, p, 200), tx).expect("submit");
        rxs.insert(id, rx);
    }
    // Run until every request has streamed a few tokens, then drop the clients.
    let mut seen: HashMap<u64, usize> = HashMap::new();
    while seen.len() < 4 || seen.values().any(|&n| n < 3) {
        assert!(e.step().expect("step"));
        for (id, rx) in &rxs {
            while let Ok(Event::Token(..)) = rx.try_recv() {
                *seen.entry(*id).or_default() += 1;
            }
        }
    }
    let free_mid = e.kv().managers()[0].num_free_blocks();
    assert!(free_mid < free_before[0], "the requests hold blocks");
    drop(rxs);
    let mut steps = 0;
    while e.step().expect("step") {
        steps += 1;
        assert!(steps < 10, "cancellation took more than a step");
    }
    let free_after: Vec<usize> = e
        .kv()
        .managers()
        .iter()
        .map(|m| m.num_free_blocks())
        .collect();
    assert_eq!(
        free_after, free_before,
        "blocks still held after cancellation"
    );
    assert_eq!(e.stats().cancelled, 4);
}

#[test]
fn bad_requests_fail_alone() {
    let Some((file, tok)) = load() else {
        return;
    };
    let h = spawn(engine(&file, 2, None));
    let mut empty = request(&tok, "x", 4);
    empty.prompt.clear();
    let mut huge = request(&tok, "x", 4);
    huge.prompt = vec![1; 300];
    let mut out_of_vocab = request(&tok, "x", 4);
    out_of_vocab.prompt = vec![u32::MAX];
    let bad: Vec<_> = [empty, huge, out_of_vocab]
        .into_iter()
        .map(|r| h.submit(r))
        .collect();
    let good = h.submit(request(&tok, PROMPTS[0], 4));
    for rx in bad {
        match rx.recv() {
            Ok(Event::Error(msg)) => println!("refused: {msg}"),
            other => panic!("expected an error, got {other:?}"),
        }
    }
    assert_eq!(collect(&good).len(), 4);
}

/// Requests submitted from many threads at once (their ids are taken in one order and may
/// reach the engine in another) each finish with their tokens; none is lost or refused.
#[test]
fn requests_submitted_from_many_threads_all_finish() {
    let Some((file, tok)) = load() else {
        return;
    };
    let h = std::sync::Arc::new(spawn(engine(&file, 4, None)));
    let prompt = tok.encode(PROMPTS[4], true).expect("encode");
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (h, prompt) = (h.clone(), prompt.clone());
            std::thread::spawn(move || {
                let streams: Vec<Stream> = (0..16)
                    .map(|_| h.submit(GenRequest::new(prompt.clone(), SamplingParams::greedy(), 2)))
                    .collect();
                streams.iter().map(|s| collect(s)).collect::<Vec<_>>()
            })
        })
        .collect();
    let outs: Vec<Vec<u32>> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect();
    assert_eq!(outs.len(), 128);
    assert!(
        outs.iter().all(|o| o == &outs[0] && o.len() == 2),
        "{outs:?}"
    );
}

/// Two requests sharing a long prompt prefix: with prefix caching the second reuses the
/// first's full blocks (fewer tokens computed) and still gets exactly the tokens it gets
/// without the cache.
#[test]
fn a_shared_prefix_is_served_from_the_cache_without_changing_the_tokens() {
    let Some((file, tok)) = load() else {
        return;
    };
    let shared = "You are a careful assistant. Answer briefly and precisely, in plain English, \
                  without lists. Keep to the facts you are sure of and say so when unsure. ";
    let asks = [
        format!("{shared}Question: what is the capital of France? Answer:"),
        format!("{shared}Question: what is the boiling point of water? Answer:"),
    ];
    let prefix_len = tok.encode(shared, true).expect("encode").len();
    // Whole prompts in one step, then 16-token steps (the prompt is prefilled in chunks, the
    // first of which starts after the cached blocks).
    for step in [128, 16] {
        let mut results = Vec::new();
        for cache in [false, true] {
            let h = spawn(engine_with(&file, 2, None, step, cache));
            let outs: Vec<Vec<u32>> = asks
                .iter()
                .map(|p| collect(&h.submit(request(&tok, p, 8))))
                .collect();
            let stats = h.shutdown().expect("engine thread");
            println!("step {step}, prefix caching {cache}: {stats:?}");
            results.push((outs, stats));
        }
        let (plain, cached) = (&results[0], &results[1]);
        assert_eq!(
            plain.0, cached.0,
            "step {step}: the prefix cache changed the tokens"
        );
        assert_eq!(plain.1.prefix_hit_tokens, 0);
        assert!(
            cached.1.prefix_hit_tokens as usize >= prefix_len / 16 * 16 - 16,
            "step {step}: only {} cached tokens reused for a {prefix_len}-token shared prefix",
            cached.1.prefix_hit_tokens
        );
        assert_eq!(
            cached.1.tokens_computed + cached.1.prefix_hit_tokens,
            plain.1.tokens_computed
        );
    }
}

/// Waits (up to a minute) for the engine's snapshot to satisfy `ok`.
fn wait_for(
    h: &kiln_core::engine::EngineHandle,
    what: &str,
    ok: impl Fn(&kiln_core::engine::Snapshot) -> bool,
) -> kiln_core::engine::Snapshot {
    let t0 = std::time::Instant::now();
    loop {
        let s = h.snapshot();
        if ok(&s) {
            return s;
        }
        assert!(
            t0.elapsed().as_secs() < 60,
            "timed out waiting for {what}: {s:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Streams dropped while queued or in the middle of a chunked prefill (so no token was ever
/// sent to them) are cancelled by the engine, and their blocks go back to the pool, while the
/// request being decoded goes on undisturbed.
#[test]
fn dropped_streams_are_cancelled_while_queued_or_prefilling() {
    let Some((file, tok)) = load() else {
        return;
    };
    let want = alone(&file, &tok, 40)[2].clone();
    let h = spawn(engine(&file, 2, None));
    let idle = h.snapshot();
    let keep = h.submit(request(&tok, PROMPTS[2], 40));
    let long: String = PROMPTS
        .iter()
        .cycle()
        .take(24)
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    let prefilling = h.submit(request(&tok, &long, 40));
    // A third request waits in the queue (two run at once). Both are dropped as soon as the
    // long prompt is seen in the middle of its prefill and the third in the queue: a wait
    // between the two (submitting the third only then) let a fast engine finish the prefill
    // and sample a first token before the drop arrived.
    let queued = h.submit(request(&tok, PROMPTS[0], 40));
    let s = wait_for(&h, "the long prompt prefilling, the third queued", |s| {
        s.slots.iter().any(|x| {
            x.state == SlotState::Prefill && x.computed > 0 && x.computed < x.prompt_tokens
        }) && s.slots.iter().any(|x| x.state == SlotState::Queued)
    });
    println!("before the drop: {:?}", s.slots);
    drop(prefilling);
    drop(queued);
    let s = wait_for(&h, "both dropped requests to be cancelled", |s| {
        s.stats.cancelled == 2
    });
    assert_eq!(s.slots.len(), 1, "{:?}", s.slots);
    assert_eq!(collect(&keep), want);
    let s = wait_for(&h, "the pool to be free", |s| s.slots.is_empty());
    assert_eq!(s.kv_free, idle.kv_free);
    assert_eq!(s.kv_free, s.kv_total);
    // No token was generated for the two dropped requests. (The counters are published every
    // step, the slots at most every few milliseconds: compared at the end, when both are.)
    assert_eq!(s.stats.generated, want.len() as u64);
}

/// A pool just above one request's need, prefix caching on, and 3 to 7 requests that share a
/// long prefix: preempting one counts only the blocks no other request holds, so no step asks
/// the pool for more than it has and no request fails; each gets the tokens it gets alone.
#[test]
fn requests_sharing_a_prefix_finish_in_a_pool_just_above_one_request() {
    let Some((file, tok)) = load() else {
        return;
    };
    let shared = "You are a careful assistant. Answer briefly and precisely, in plain English, \
                  without lists. Keep to the facts you are sure of and say so when unsure. "
        .repeat(3);
    let asks: Vec<String> = [
        "France", "Spain", "Italy", "Peru", "Japan", "Chile", "Kenya",
    ]
    .iter()
    .map(|c| format!("{shared}Question: what is the capital of {c}? Answer:"))
    .collect();
    let n = 40;
    let alone: Vec<Vec<u32>> = {
        let h = spawn(engine(&file, 1, None));
        asks.iter()
            .map(|p| collect(&h.submit(request(&tok, p, n))))
            .collect()
    };
    let longest = asks
        .iter()
        .map(|p| tok.encode(p, true).expect("encode").len())
        .max()
        .unwrap_or(0);
    // (requests, blocks beyond one request's need, step tokens). Before preemption counted
    // shared blocks as freed, (7, 3, 512) failed every request of a step with "out of KV
    // blocks".
    for (reqs, extra, step) in [(3, 1, 16), (5, 2, 64), (7, 3, 512), (7, 4, 512)] {
        let blocks = (longest + n).div_ceil(16) + extra;
        let engine = engine_with(&file, reqs, Some(blocks), step, true);
        let (got, stats) = all_at_once(engine, &tok, &asks[..reqs], n);
        println!("{reqs} requests, {blocks} blocks, step {step}: {stats:?}");
        assert_eq!(
            got,
            alone[..reqs],
            "{reqs} requests, {blocks} blocks, step {step}"
        );
        assert!(
            stats.prefix_hit_tokens > 0,
            "the shared prefix was never reused"
        );
    }
}

/// Embeddings are scheduled like any prompt: beside generations, in chunks under the token
/// budget, in a pool too small for everything at once (so requests are preempted and fed
/// again). Each vector is the one a lone embedding pass gives, and the generations are
/// unchanged.
#[test]
fn embeddings_share_the_budget_and_the_pool_with_generations() {
    use kiln_core::engine::Pooling;
    let Some((file, tok)) = load() else {
        return;
    };
    let n = 12;
    let want_gen = alone(&file, &tok, n);
    let texts: Vec<Vec<u32>> = PROMPTS[..3]
        .iter()
        .map(|p| tok.encode(&p.repeat(4), true).expect("encode"))
        .collect();
    let want_vec: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| {
            let ex = Executor::cpu();
            let model = build_from_gguf(&file, &ex).expect("model");
            let cfg = RunnerConfig {
                ctx: 256,
                ..RunnerConfig::default()
            };
            let mut r = Runner::new(ex, model, cfg).expect("runner");
            r.embed(1, t, Pooling::Mean).expect("lone embedding")
        })
        .collect();
    let mut e = engine_with(&file, 6, Some(5), 16, false);
    let gens: Vec<Receiver<Event>> = PROMPTS[..3]
        .iter()
        .map(|p| {
            let (tx, rx) = mpsc::channel();
            e.submit(request(&tok, p, n), tx).expect("submit");
            rx
        })
        .collect();
    let embs: Vec<Receiver<Event>> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (tx, rx) = mpsc::channel();
            let id = 100 + i as u64;
            e.submit_embedding(id, t, Pooling::Mean, Box::new(tx))
                .expect("submit");
            rx
        })
        .collect();
    let mut most = 0;
    while e.step().expect("step") {
        most = most.max(e.snapshot().running);
    }
    assert!(most >= 4, "at most {most} requests ran at once");
    for (i, rx) in gens.iter().enumerate() {
        assert_eq!(collect(rx), want_gen[i], "{:?}", PROMPTS[i]);
    }
    for (i, rx) in embs.iter().enumerate() {
        let mut got = None;
        for ev in rx.try_iter() {
            match ev {
                Event::Embedding(v) => got = Some(v),
                Event::Done { finish, .. } => assert_eq!(finish, Finish::Stop),
                other => panic!("{other:?}"),
            }
        }
        let got = got.expect("an embedding");
        let err = got
            .iter()
            .zip(&want_vec[i])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-5, "embedding {i}: max |difference| {err}");
    }
    let st = e.stats();
    assert!(st.preemptions > 0, "the small pool never preempted: {st:?}");
    let s = e.snapshot();
    assert_eq!(s.kv_free, s.kv_total);
}
