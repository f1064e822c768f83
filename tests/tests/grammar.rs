//! Constrained decoding in the engine: requests under a grammar batched with plain ones, with
//! speculative decoding on. The grammar requests' text is checked with the `regex` crate and
//! `serde_json` (not llguidance); the plain requests must be untouched by their neighbours.

use std::path::Path;

use kiln_core::engine::{spawn, Engine, EngineStats, Event, Finish, GenRequest};
use kiln_core::engine::{Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::grammar::{GrammarSpec, Grammars};
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::sample::SamplingParams;
use kiln_core::spec::Ngram;
use kiln_core::tokenizer::{open_tokenizer, Tokenizer};
use kiln_tests::{fixtures, model_file, GEMMA3, SMOLLM2};

fn engine(path: &Path, spec: bool, max_seqs: usize) -> (Engine, Tokenizer) {
    let file = open_model(path).expect("opens");
    let ex = Executor::cpu();
    let model = build_from_gguf(&file, &ex).expect("builds");
    let tok = open_tokenizer(path, &file).expect("tokenizer");
    let cfg = RunnerConfig {
        ctx: 512,
        max_seqs,
        max_batch_tokens: 64,
        max_rollback: 4,
        ..RunnerConfig::default()
    };
    let e = Engine::new(Runner::new(ex, model, cfg).expect("runner"), max_seqs);
    let e = if spec {
        e.with_spec(Box::new(Ngram::default()), 4)
            .expect("speculation")
    } else {
        e
    };
    (e, tok)
}

/// Each request's tokens and how it ended, run together; and the engine's counters.
fn run(e: Engine, reqs: &[GenRequest]) -> (Vec<(Vec<u32>, Finish)>, EngineStats) {
    let h = spawn(e);
    let streams: Vec<_> = reqs.iter().map(|r| h.submit(r.clone())).collect();
    let outs = streams
        .iter()
        .map(|s| {
            let mut out = Vec::new();
            loop {
                match s.recv().expect("event") {
                    Event::Token(t, _) => out.push(t),
                    Event::Done { finish, .. } => return (out, finish),
                    Event::Error(e) => panic!("{e}"),
                    Event::Embedding(_) => panic!("an embedding for a generation"),
                    Event::Cached(_) | Event::Draft { .. } | Event::Canvas { .. } => {}
                }
            }
        })
        .collect();
    (outs, h.shutdown().expect("engine"))
}

const WORDS: &str = r"(yes|no), (because|since) [a-z]{1,8}( [a-z]{1,8}){0,3}\.";

/// Two grammar requests (a regex, sampled; a JSON object, greedy) among three plain greedy
/// ones, on an engine drafting n-grams: the grammar outputs match their language and end
/// when it is complete; every output equals its request run alone without speculation.
fn check(path: &Path) {
    let (e, tok) = engine(path, true, 8);
    let vocab = e.forward().model().info().vocab;
    let grammars = Grammars::new(&tok, vocab).expect("trie");
    let enc = |s: &str| tok.encode(s, true).expect("encode");
    let plain = |p: &str| {
        let mut r = GenRequest::new(enc(p), SamplingParams::greedy(), 48);
        r.stop_ids = tok.eog_ids().to_vec();
        r
    };
    let mut words = GenRequest::new(
        enc("Is the sky blue?"),
        SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..SamplingParams::default()
        },
        80,
    );
    words.stop_ids = tok.eog_ids().to_vec();
    words.constraint = Some(
        grammars
            .compile(&GrammarSpec::Regex(WORDS.into()))
            .expect("regex compiles"),
    );
    let mut object = plain("A JSON object describing a cat:");
    object.max_tokens = 120;
    object.constraint = Some(
        grammars
            .compile(&GrammarSpec::json_object())
            .expect("compiles"),
    );
    let reqs = vec![
        plain("one two three one two three one two three one two"),
        words,
        plain("The capital of France is"),
        object,
        plain("a b c d a b c d a b c d a b"),
    ];
    let (together, st) = run(e, &reqs);
    assert!(st.masks > 0, "no grammar mask was computed: {st:?}");
    assert!(st.spec.drafted > 0, "nothing was drafted: {st:?}");
    let rx = regex::Regex::new(&format!("^(?:{WORDS})$")).expect("regex");
    let text = tok.decode(&together[1].0);
    assert!(rx.is_match(&text), "{}: {text:?}", path.display());
    assert_eq!(together[1].1, Finish::Stop, "{text:?}");
    let json = tok.decode(&together[3].0);
    if together[3].1 == Finish::Stop {
        let v: serde_json::Value = serde_json::from_str(&json).expect("a JSON object");
        assert!(v.is_object(), "{json}");
    } else {
        assert!(json.starts_with('{'), "{json}");
    }
    for (i, r) in reqs.iter().enumerate() {
        let mut r = r.clone();
        if let Some(c) = &r.constraint {
            // A fresh copy: the one above was not consumed (requests are cloned on submit).
            r.constraint = Some(c.clone());
        }
        let (alone, _) = run(engine(path, false, 1).0, &[r]);
        assert_eq!(alone[0], together[i], "{}: request {i}", path.display());
    }
    eprintln!("{}: {text:?} {json:?}", path.display());
}

#[test]
fn grammar_requests_batched_with_plain_ones_under_speculation() {
    check(&fixtures().join("hf").join("llama"));
    for name in [SMOLLM2, GEMMA3] {
        if let Some(path) = model_file(name) {
            check(&path);
        }
    }
}
