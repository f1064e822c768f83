//! The DFlash block-diffusion drafter (tests/fixtures/hf/dflash: tiny random weights made
//! by `make_fixtures.py dflash` from the reference code of z-lab/dflash, reading layers 0
//! and 1 of the qwen3 fixture, a block of 16) against that reference: two drafting rounds
//! as its `dflash_generate` runs them greedily — the block after a 12-token prompt, then,
//! after the target verified it, the block after the accepted tokens (so the drafter's own
//! context cache grows between rounds) — every round's drafter logits within 1e-3 and the
//! same drafts. On the CPU, strictly on WebGPU and on the emulated CUDA kernels.

use std::path::PathBuf;

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::model::dflash::DFlash;
use kiln_core::model::Features;
use kiln_core::sample::{argmax, SamplingParams};
use kiln_core::spec::{DFlashDrafter, DraftReq, Drafter};
use kiln_tests::{fixtures, optional_backend};
use serde_json::Value;

const TOL: f32 = 1e-3;

fn dir(name: &str) -> PathBuf {
    fixtures().join("hf").join(name)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn check(ex: impl Fn() -> Executor, backend: &str) {
    let v: Value = serde_json::from_slice(
        &std::fs::read(dir("dflash").join("reference.json")).expect("reference"),
    )
    .expect("reference JSON");
    let want: Vec<f32> = std::fs::read(dir("dflash").join("logits.f32"))
        .expect("logits")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let tex = ex();
    let file = open_model(&dir("qwen3")).expect("target opens");
    let target = build_from_gguf(&file, &tex).expect("target builds");
    let cfg = RunnerConfig {
        ctx: 96,
        block_size: 4,
        max_batch_tokens: 32,
        max_rollback: 16,
        ..RunnerConfig::default()
    };
    let mut r = Runner::new(tex.sibling(), target, cfg).expect("runner");
    let vocab = r.model().info().vocab;
    let dex = tex.sibling();
    let model = DFlash::load(&open_model(&dir("dflash")).expect("drafter opens"), &dex)
        .expect("drafter loads");
    let block = model.block();
    let taps = Features::Layers(model.target_layers().to_vec());
    let mut d = DFlashDrafter::new(model, dex.sibling(), r.forward(), 1).expect("drafter binds");

    let mut tokens = ids(&v["prompt"]);
    let (rows, feats) = r
        .step_features(&[(1, &tokens, Logits::Last)], &taps)
        .expect("target prefill");
    d.observe(1, 0, feats.expect("features").remove(0));
    tokens.push(argmax(&rows[0][0]));
    let params = SamplingParams::greedy();
    let mut worst = 0f32;
    for (round, want) in v["rounds"]
        .as_array()
        .expect("rounds")
        .iter()
        .zip(want.chunks_exact((block - 1) * vocab))
    {
        let start = round["start"].as_u64().expect("start") as usize;
        let reference_block = ids(&round["block"]);
        assert_eq!(tokens.len() - 1, start, "{backend}: round start");
        assert_eq!(
            tokens[start], reference_block[0],
            "{backend}: pending token"
        );
        let req = DraftReq {
            id: 1,
            tokens: &tokens,
            k: block - 1,
            params: &params,
        };
        let got = d.block_logits(&[req]).expect("drafting").remove(0);
        assert_eq!(got.len(), block - 1, "{backend}: rows");
        let err = got
            .concat()
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err < TOL,
            "{backend}: round at {start}: logits off by {err}"
        );
        worst = worst.max(err);
        let drafts: Vec<u32> = got.iter().map(|row| argmax(row)).collect();
        assert_eq!(drafts, reference_block[1..], "{backend}: drafts at {start}");
        // The target verifies the block as the reference does (greedy, longest agreeing
        // prefix, then its own token), and hands the drafter the accepted tokens' states.
        let (rows, feats) = r
            .step_features(&[(1, &reference_block, Logits::All)], &taps)
            .expect("verification");
        let post: Vec<u32> = rows[0].iter().map(|row| argmax(row)).collect();
        let acc = drafts.iter().zip(&post).take_while(|(a, b)| a == b).count();
        r.rollback(1, block - acc - 1).expect("rollback");
        let mut feats = feats.expect("features").remove(0);
        feats.truncate(acc + 1);
        d.observe(1, start, feats);
        tokens.extend_from_slice(&reference_block[1..=acc]);
        tokens.push(post[acc]);
    }
    println!("{backend}: drafter logits within {worst:.2e} over two rounds");
    assert_eq!(
        dex.fallbacks().iter().map(|f| f.count).sum::<u64>(),
        0,
        "{backend}: fell back to the CPU"
    );
}

#[test]
fn dflash_drafts_match_the_reference_on_the_cpu() {
    check(Executor::cpu, "cpu");
}

#[test]
fn dflash_drafts_match_the_reference_on_webgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    check(|| Executor::new(gpu.clone()).strict(true), "wgpu");
}

#[test]
fn dflash_drafts_match_the_reference_on_emulated_cuda_kernels() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    check(|| Executor::new(emu.clone()).strict(true), "cuda-emu");
}
