//! Rollback (what speculative decoding does with rejected drafts): dropping a sequence's last
//! k tokens and feeding them again gives bit-identical logits to never having rolled back, on
//! every model family (full attention, sliding windows, KV sharing, recurrent Gated DeltaNet
//! state, MoE), on the CPU and on WebGPU.

use std::path::PathBuf;

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::rng::Rng;
use kiln_tests::{fixtures, optional_backend};

use kiln_tests::HF_MODELS as MODELS;

fn dir(name: &str) -> PathBuf {
    fixtures().join("hf").join(name)
}

fn runner(name: &str, ex: Executor, prefix_caching: bool) -> Runner {
    let file = open_model(&dir(name)).expect("checkpoint opens");
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        // Small blocks: rolling back crosses block boundaries (and Gemma 4's window of 8).
        block_size: 4,
        ctx: 128,
        max_batch_tokens: 32,
        max_rollback: 8,
        prefix_caching,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

fn one(r: &mut Runner, seq: u64, t: u32) -> Vec<f32> {
    let mut rows = r.feed(seq, &[t], Logits::Last).expect("decode step");
    rows.pop().expect("logits")
}

/// A prompt, then 8 tokens one at a time; for each k, roll back k and feed the same k tokens
/// again: every logit must be the one computed the first time, bit for bit.
fn check(name: &str, ex: impl Fn() -> Executor, what: &str) {
    for prefix_caching in [false, true] {
        let mut r = runner(name, ex(), prefix_caching);
        let vocab = r.model().info().vocab as u64;
        let mut rng = Rng::new(7);
        let mut tok = || (rng.next_u64() % vocab) as u32;
        let prompt: Vec<u32> = (0..13).map(|_| tok()).collect();
        let tail: Vec<u32> = (0..8).map(|_| tok()).collect();
        let seq = 1;
        r.feed(seq, &prompt, Logits::Last).expect("prefill");
        let first: Vec<Vec<f32>> = tail.iter().map(|&t| one(&mut r, seq, t)).collect();
        for k in 1..=8 {
            r.rollback(seq, k).expect("rollback");
            assert_eq!(r.seq_len(seq), prompt.len() + 8 - k);
            for (i, &t) in tail.iter().enumerate().skip(8 - k) {
                let again = one(&mut r, seq, t);
                let same = again
                    .iter()
                    .zip(&first[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{name} on {what} (prefix caching {prefix_caching}): rolling back {k} and \
                     feeding token {i} again changed its logits"
                );
            }
        }
        // Past what is kept: an error that changes nothing, or (recurrent state) a recompute
        // from the newest snapshot before the target.
        let len = r.seq_len(seq);
        if r.rollback(seq, 20).is_ok() {
            assert_eq!(r.seq_len(seq), len - 20, "{name}");
        } else {
            assert_eq!(
                r.seq_len(seq),
                len,
                "{name}: a failed rollback changed the sequence"
            );
            let again = one(&mut r, seq, tok());
            assert!(again.iter().all(|x| x.is_finite()));
        }
        r.release(seq).expect("release");
        for m in r.kv_managers() {
            assert_eq!(
                m.num_free_blocks(),
                m.pool().num_blocks() - 1,
                "{name}: blocks leaked"
            );
        }
    }
}

#[test]
fn rollback_then_refeeding_gives_identical_logits_on_the_cpu() {
    for name in MODELS {
        check(name, Executor::cpu, "cpu");
    }
}

#[test]
fn rollback_then_refeeding_gives_identical_logits_on_webgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    for name in MODELS {
        check(name, || Executor::new(gpu.clone()).strict(true), "wgpu");
    }
}

/// Rolling a recurrent model back further than its checkpoints reach recomputes from the
/// zero state (or a snapshot): the logits after that match a sequence that never went there.
#[test]
fn a_long_rollback_of_a_recurrent_model_recomputes_the_state() {
    let mut r = runner("qwen3_5", Executor::cpu(), true);
    let vocab = r.model().info().vocab as u64;
    let mut rng = Rng::new(11);
    let toks: Vec<u32> = (0..40).map(|_| (rng.next_u64() % vocab) as u32).collect();
    r.feed(1, &toks[..30], Logits::Last).expect("prefill");
    for &t in &toks[30..] {
        one(&mut r, 1, t);
    }
    // 40 → 22: well past the 8 checkpoints kept.
    r.rollback(1, 18).expect("rollback");
    assert_eq!(r.seq_len(1), 22);
    let after = one(&mut r, 1, toks[22]);
    r.feed(2, &toks[..22], Logits::Last).expect("prefill");
    let fresh = one(&mut r, 2, toks[22]);
    let worst = after
        .iter()
        .zip(&fresh)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "logits differ by {worst}");
}
