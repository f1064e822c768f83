//! Gemma 4's MTP assistant (tests/fixtures/hf/gemma4_assistant: tiny random weights made by
//! `make_fixtures.py gemma4_assistant` beside the gemma4 fixture, with a token-ordered
//! centroid head) against transformers: the target's pass over a prompt longer than the
//! sliding window, then four greedy drafting steps reading the target's K/V; every step's
//! drafter logits within 1e-3 and the same drafted tokens. On the CPU, strictly on WebGPU and
//! on the emulated CUDA kernels.

use std::path::PathBuf;

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::model::gemma4_assistant::Gemma4Assistant;
use kiln_core::model::Features;
use kiln_core::sample::argmax;
use kiln_tests::{fixtures, optional_backend};
use serde_json::Value;

const TOL: f32 = 1e-3;

fn dir(name: &str) -> PathBuf {
    fixtures().join("hf").join(name)
}

fn reference() -> Value {
    let p = dir("gemma4_assistant").join("reference.json");
    serde_json::from_slice(&std::fs::read(p).expect("reference")).expect("reference JSON")
}

fn ids(v: &Value, k: &str) -> Vec<u32> {
    v[k].as_array()
        .expect(k)
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn check(ex: impl Fn() -> Executor, backend: &str) {
    let v = reference();
    let prompt = ids(&v, "prompt");
    let want: Vec<f32> = std::fs::read(dir("gemma4_assistant").join("logits.f32"))
        .expect("logits")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let file = open_model(&dir("gemma4")).expect("target opens");
    let tex = ex();
    let target = build_from_gguf(&file, &tex).expect("target builds");
    let cfg = RunnerConfig {
        ctx: 64,
        block_size: 4,
        max_batch_tokens: 32,
        // The assistant's sliding layers read one key more than the target's window.
        max_rollback: 1,
        ..RunnerConfig::default()
    };
    let mut r = Runner::new(tex.sibling(), target, cfg).expect("runner");
    let vocab = r.model().info().vocab;
    let (rows, hidden) = r
        .step_features(&[(1, &prompt, Logits::Last)], &Features::Final)
        .expect("target pass");
    let first = argmax(&rows[0][0]);
    assert_eq!(
        first as u64,
        v["first"].as_u64().expect("first"),
        "{backend}"
    );
    let hidden = hidden
        .expect("Gemma 4 gives its hidden states")
        .remove(0)
        .pop()
        .expect("the last token's");

    let afile = open_model(&dir("gemma4_assistant")).expect("assistant opens");
    let aex = tex.sibling();
    let mut a = Gemma4Assistant::load(&afile, &aex).expect("assistant loads");
    a.bind(&r.model().draft_source().expect("source"), vocab)
        .expect("binds to the target");
    let mut h = aex.upload_f32(&[1, hidden.len()], &hidden).expect("upload");
    let mut tok = first;
    let mut drafts = Vec::new();
    let mut worst = 0f32;
    for (s, want) in want.chunks_exact(vocab).enumerate() {
        let b = r.lookahead_batch(&[(1, tok)]).expect("batch");
        let out = a.step(&aex, &b, r.caches(), &h).expect("assistant step");
        let got = &out.logits[0];
        let err = got
            .iter()
            .zip(want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(err < TOL, "{backend}: step {s} logits off by {err}");
        worst = worst.max(err);
        tok = argmax(got);
        drafts.push(tok);
        h = out.hidden;
    }
    println!("{backend}: drafter logits within {worst:.2e}, drafts {drafts:?}");
    assert_eq!(drafts, ids(&v, "drafts"), "{backend}");
    assert_eq!(
        aex.fallbacks().iter().map(|f| f.count).sum::<u64>(),
        0,
        "{backend}: fell back to the CPU"
    );
}

#[test]
fn assistant_drafts_match_transformers_on_the_cpu() {
    check(Executor::cpu, "cpu");
}

#[test]
fn assistant_drafts_match_transformers_on_webgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    check(|| Executor::new(gpu.clone()).strict(true), "wgpu");
}

#[test]
fn assistant_drafts_match_transformers_on_emulated_cuda_kernels() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    check(|| Executor::new(emu.clone()).strict(true), "cuda-emu");
}
