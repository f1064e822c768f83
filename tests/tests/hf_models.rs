//! Hugging Face checkpoints (tests/fixtures/hf, tiny random weights written by transformers)
//! against transformers' own logits and greedy tokens: every position's logits through the
//! paged path (whole prompt; chunked prefill then token-by-token decode), on the CPU and on
//! WebGPU.

use std::path::{Path, PathBuf};

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::tokenizer::open_tokenizer;
use kiln_tests::{fixtures, optional_backend};
use serde_json::Value;

use kiln_tests::HF_MODELS as MODELS;
/// Largest difference from transformers' f32 logits.
const TOL: f32 = 1e-3;

struct Reference {
    tokens: Vec<u32>,
    /// `[positions][vocab]`
    logits: Vec<Vec<f32>>,
    greedy_prompt: Vec<u32>,
    greedy: Vec<u32>,
}

fn dir(name: &str) -> PathBuf {
    fixtures().join("hf").join(name)
}

fn reference(d: &Path) -> Reference {
    let v: Value =
        serde_json::from_slice(&std::fs::read(d.join("reference.json")).expect("reference.json"))
            .expect("reference JSON");
    let ids = |k: &str| -> Vec<u32> {
        v[k].as_array()
            .expect(k)
            .iter()
            .map(|x| x.as_u64().expect("token id") as u32)
            .collect()
    };
    let shape: Vec<usize> = v["logits_shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|x| x.as_u64().expect("dim") as usize)
        .collect();
    let raw = std::fs::read(d.join("logits.f32")).expect("logits.f32");
    let flat: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(flat.len(), shape[0] * shape[1]);
    Reference {
        tokens: ids("tokens"),
        logits: flat.chunks(shape[1]).map(<[f32]>::to_vec).collect(),
        greedy_prompt: ids("greedy_prompt"),
        greedy: ids("greedy"),
    }
}

fn runner(d: &Path, ex: Executor, chunk: usize) -> Runner {
    runner_of(d, ex, chunk, 1, 4)
}

fn runner_of(d: &Path, ex: Executor, chunk: usize, max_seqs: usize, block_size: usize) -> Runner {
    let file = open_model(d).expect("checkpoint opens");
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        max_batch_tokens: chunk,
        block_size,
        max_seqs,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

fn max_err(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, usize) {
    assert_eq!(got.len(), want.len(), "rows");
    let mut worst = (0f32, 0);
    for (p, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "vocab");
        for (a, b) in g.iter().zip(w) {
            let e = (a - b).abs();
            if !(e <= worst.0) {
                worst = (e, p);
            }
        }
    }
    worst
}

fn argmax(v: &[f32]) -> u32 {
    kiln_core::sample::argmax(v)
}

/// Logits at every position: the whole input in one pass; then in chunks of 7 for the first
/// half and one token at a time after.
fn check_logits(name: &str, ex: impl Fn() -> Executor, label: &str) {
    let d = dir(name);
    let r = reference(&d);
    let mut whole = runner(&d, ex(), 512);
    let got = whole.feed(1, &r.tokens, Logits::All).expect("forward");
    let (e, p) = max_err(&got, &r.logits);
    println!("{name} {label}: whole prompt, max |Δ| {e:.2e} (position {p})");
    assert!(
        e <= TOL,
        "{name} {label}: logits differ by {e} at position {p}"
    );

    let mut stepped = runner(&d, ex(), 7);
    let half = r.tokens.len() / 2;
    let mut got = stepped
        .feed(1, &r.tokens[..half], Logits::All)
        .expect("chunked prefill");
    for &t in &r.tokens[half..] {
        got.extend(stepped.feed(1, &[t], Logits::All).expect("decode"));
    }
    let (e, p) = max_err(&got, &r.logits);
    println!("{name} {label}: chunked prefill + decode, max |Δ| {e:.2e} (position {p})");
    assert!(
        e <= TOL,
        "{name} {label}: stepped logits differ by {e} at position {p}"
    );

    let mut g = runner(&d, ex(), 7);
    let mut last = g
        .feed(2, &r.greedy_prompt, Logits::Last)
        .expect("prefill")
        .pop()
        .expect("a row");
    let mut out = Vec::new();
    for _ in 0..r.greedy.len() {
        let t = argmax(&last);
        out.push(t);
        last = g
            .feed(2, &[t], Logits::Last)
            .expect("decode")
            .pop()
            .expect("a row");
    }
    assert_eq!(
        out, r.greedy,
        "{name} {label}: greedy tokens differ from transformers"
    );
}

#[test]
fn hf_checkpoints_match_transformers_on_the_cpu() {
    for name in MODELS {
        check_logits(name, Executor::cpu, "cpu");
    }
}

#[test]
fn hf_checkpoints_match_transformers_on_wgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    for name in MODELS {
        let ex = || Executor::new(gpu.clone()).strict(true);
        check_logits(name, ex, "wgpu");
    }
}

/// The CUDA backend's kernels and launch plan, emulated on the CPU (no GPU here), run whole
/// models: every fixture (dense, the Gated DeltaNet hybrids, whose decode steps take the fused
/// recurrent kernels, and the MoEs). Strict: every op runs on a CUDA kernel, none falls back.
#[test]
fn hf_checkpoints_match_transformers_on_emulated_cuda_kernels() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    for &name in MODELS {
        let ex = || Executor::new(emu.clone()).strict(true);
        check_logits(name, ex, "cuda-emu");
    }
}

#[test]
fn the_tokenizer_and_chat_template_come_from_the_directory() {
    let d = dir("llama");
    let file = open_model(&d).expect("opens");
    let tok = open_tokenizer(&d, &file).expect("tokenizer.json");
    let ids = tok.encode("The quick brown fox", false).expect("encode");
    assert_eq!(tok.decode(&ids), "The quick brown fox");
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));
    assert!(tok.vocab_size() <= 320);
}

#[test]
fn broken_checkpoints_are_clear_errors() {
    let tmp = std::env::temp_dir().join(format!("kiln-hf-broken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("tmp dir");
    let src = dir("llama");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), tmp.join(f)).expect("copy");
    }
    let err = |what: &str| {
        let e = match open_model(&tmp) {
            Ok(f) => build_from_gguf(&f, &Executor::cpu()).err().expect(what),
            Err(e) => e,
        };
        println!("{what}: {e}");
        e.to_string()
    };
    // A config with an unknown model type.
    let cfg = std::fs::read_to_string(src.join("config.json")).expect("config");
    std::fs::write(
        tmp.join("config.json"),
        cfg.replace("\"llama\"", "\"mamba\""),
    )
    .expect("write");
    assert!(err("unknown model type").contains("mamba"));
    // A config whose sizes disagree with the weights.
    std::fs::write(
        tmp.join("config.json"),
        cfg.replace("\"intermediate_size\": 96", "\"intermediate_size\": 97"),
    )
    .expect("write");
    assert!(err("wrong size").contains("shape"));
    // A truncated weights file.
    std::fs::write(tmp.join("config.json"), &cfg).expect("write");
    let w = std::fs::read(src.join("model.safetensors")).expect("weights");
    std::fs::write(tmp.join("model.safetensors"), &w[..w.len() / 2]).expect("write");
    assert!(err("truncated").contains("model.safetensors") || err("truncated").contains("bytes"));
    // MoE configs with zero experts, or more per token than there are: errors, not panics.
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("tmp dir");
    let moe = dir("gemma4_moe");
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(moe.join(f), tmp.join(f)).expect("copy");
    }
    let cfg = std::fs::read_to_string(moe.join("config.json")).expect("config");
    for (from, to) in [
        ("\"num_experts\": 4", "\"num_experts\": 0"),
        ("\"top_k_experts\": 2", "\"top_k_experts\": 9"),
        ("\"top_k_experts\": 2", "\"top_k_experts\": 0"),
    ] {
        assert!(cfg.contains(from), "{from}");
        std::fs::write(tmp.join("config.json"), cfg.replace(from, to)).expect("write");
        let e = std::panic::catch_unwind(|| err(to)).unwrap_or_else(|_| panic!("{to}: a panic"));
        assert!(!e.is_empty());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A 1,000-token prompt on Qwen3.5: the same logits in one pass and in chunks of 96 (the
/// conv and delta-rule states carried from chunk to chunk).
#[test]
fn qwen3_5_long_prompt_same_logits_with_and_without_chunked_prefill() {
    let d = dir("qwen3_5");
    let mut rng = 0x1234_5678_u64;
    let tokens: Vec<u32> = (0..1000)
        .map(|_| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            3 + (rng >> 33) as u32 % 300
        })
        .collect();
    let mut whole = runner(&d, Executor::cpu(), 1000);
    let want = whole.feed(1, &tokens, Logits::All).expect("one pass");
    let mut chunked = runner(&d, Executor::cpu(), 96);
    let got = chunked.feed(1, &tokens, Logits::All).expect("chunks");
    let (e, p) = max_err(&got, &want);
    println!("1000 tokens, one pass vs chunks of 96: max |Δ| {e:.2e} (position {p})");
    assert!(
        e <= TOL,
        "chunked prefill changed the logits by {e} at position {p}"
    );
}

/// Several Qwen3.5 requests batched through the engine, in a pool small enough to preempt:
/// each gets the greedy tokens it gets alone (every sequence keeps its own recurrent state).
#[test]
fn qwen3_5_batched_requests_keep_their_own_state() {
    use kiln_core::engine::{spawn, Engine, Event, GenRequest};
    use kiln_core::sample::SamplingParams;
    let d = dir("qwen3_5");
    let r = reference(&d);
    let prompts: Vec<Vec<u32>> = (0..5)
        .map(|i| r.tokens[i * 3..i * 3 + 8 + 3 * i].to_vec())
        .collect();
    let run = |max_seqs: usize, blocks: Option<usize>| -> (Vec<Vec<u32>>, u64) {
        let file = open_model(&d).expect("opens");
        let ex = Executor::cpu();
        let model = build_from_gguf(&file, &ex).expect("builds");
        let cfg = RunnerConfig {
            max_seqs,
            max_batch_tokens: 8,
            block_size: 4,
            kv_blocks: blocks,
            ..RunnerConfig::default()
        };
        let h = spawn(Engine::new(
            Runner::new(ex, model, cfg).expect("runner"),
            max_seqs,
        ));
        let streams: Vec<_> = prompts
            .iter()
            .map(|p| h.submit(GenRequest::new(p.clone(), SamplingParams::greedy(), 12)))
            .collect();
        let outs = streams
            .iter()
            .map(|s| {
                let mut out = Vec::new();
                loop {
                    match s.recv().expect("event") {
                        Event::Token(t, _) => out.push(t),
                        Event::Done { .. } => return out,
                        Event::Error(e) => panic!("{e}"),
                        Event::Cached(_) => {}
                        e @ (Event::Draft { .. } | Event::Canvas { .. } | Event::Embedding(_)) => {
                            panic!("not a generation's event: {e:?}")
                        }
                    }
                }
            })
            .collect();
        let stats = h.shutdown().expect("engine");
        (outs, stats.preemptions)
    };
    let (alone, _) = run(1, None);
    let (batched, preempted) = run(5, Some(14));
    println!("preemptions: {preempted}");
    assert!(preempted > 0, "the small pool never preempted");
    assert_eq!(batched, alone);
}

/// What `kiln run --temp 0` does on each checkpoint: the directory's tokenizer turns the text
/// into transformers' ids, and greedy decoding gives transformers' tokens.
#[test]
fn text_prompts_tokenize_and_continue_as_in_transformers() {
    for name in MODELS {
        let d = dir(name);
        let v: Value =
            serde_json::from_slice(&std::fs::read(d.join("reference.json")).expect("reference"))
                .expect("JSON");
        let ids = |k: &str| -> Vec<u32> {
            v[k].as_array()
                .expect(k)
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect()
        };
        let file = open_model(&d).expect("opens");
        let tok = open_tokenizer(&d, &file).expect("tokenizer");
        let prompt = tok
            .encode(v["text_prompt"].as_str().expect("text"), true)
            .expect("encode");
        assert_eq!(prompt, ids("text_prompt_ids"), "{name}: tokenization");
        let mut g = runner(&d, Executor::cpu(), 512);
        let mut last = g
            .feed(1, &prompt, Logits::Last)
            .expect("prefill")
            .pop()
            .expect("row");
        let mut out = Vec::new();
        for _ in 0..ids("text_greedy").len() {
            let t = argmax(&last);
            out.push(t);
            last = g
                .feed(1, &[t], Logits::Last)
                .expect("decode")
                .pop()
                .expect("row");
        }
        assert_eq!(out, ids("text_greedy"), "{name}: greedy continuation");
    }
}

/// Gemma 4 over a prompt five times its sliding window (8): the logits match transformers at
/// every position while the sliding layers' cache holds only the blocks the window still
/// needs (the ones before it are released to the pool).
#[test]
fn gemma4_releases_blocks_that_leave_the_window() {
    let d = dir("gemma4");
    let r = reference(&d);
    assert!(r.tokens.len() > 2 * 8);
    let mut g = runner(&d, Executor::cpu(), 5);
    let groups = g.model().kv_groups().to_vec();
    let sliding = groups
        .iter()
        .position(|x| x.window == Some(8))
        .expect("a sliding-window KV group");
    let full = groups
        .iter()
        .position(|x| x.window.is_none())
        .expect("a full group");
    let mut got = Vec::new();
    let mut most_live = 0;
    for (p, &t) in r.tokens.iter().enumerate() {
        got.extend(g.feed(7, &[t], Logits::All).expect("decode"));
        let live = |grp: usize| {
            g.kv_managers()[grp]
                .block_table(7)
                .expect("table")
                .iter()
                .filter(|&&b| b != kiln_core::kv::NULL_BLOCK)
                .count()
        };
        // Block size 4: the window of 8 spans at most 3 blocks, plus the one being filled.
        most_live = most_live.max(live(sliding));
        assert_eq!(
            live(full),
            (p + 1).div_ceil(4),
            "the full layers keep every block"
        );
    }
    assert!(most_live <= 4, "the sliding layers held {most_live} blocks");
    let (e, p) = max_err(&got, &r.logits);
    println!("gemma4 token by token over 40 tokens: max |Δ| {e:.2e} (position {p}), at most {most_live} sliding blocks held");
    assert!(e <= TOL, "logits differ by {e} at position {p}");
}

/// The same checkpoints converted by llama.cpp's `convert_hf_to_gguf.py` (f32; see
/// tests/fixtures/hf/README.md; the Llama one by `llama_gguf.py`, in GGUF's Llama layout with
/// Q and K permuted): kiln reads llama.cpp's names, metadata and layouts (Qwen3.5's value
/// heads in llama.cpp's tiled order) and gives transformers' logits.
#[test]
fn llama_cpp_gguf_conversions_match_transformers() {
    for name in GGUF_MODELS {
        let d = dir(name);
        let r = reference(&d);
        let path = fixtures()
            .join("hf")
            .join("gguf")
            .join(format!("{name}.gguf"));
        let mut g = runner(&path, Executor::cpu(), 7);
        let got = g.feed(1, &r.tokens, Logits::All).expect("forward");
        // llama.cpp's Gemma 4 conversion trims the vocabulary to the tokenizer's (the toy
        // tokenizer has 315 of the model's 320 rows); logits are per row of the output
        // matrix, so the first columns compare one for one.
        let width = got[0].len();
        assert!(width >= 315, "{name}.gguf: a vocabulary of {width}");
        let want: Vec<Vec<f32>> = r.logits.iter().map(|l| l[..width].to_vec()).collect();
        let (e, p) = max_err(&got, &want);
        println!("{name}.gguf: max |Δ| {e:.2e} (position {p}, {width} logits)");
        assert!(
            e <= TOL,
            "{name}.gguf: logits differ by {e} at position {p}"
        );
    }
}

const GGUF_MODELS: &[&str] = &["llama", "qwen3_5", "qwen3_5_moe", "gemma4", "gemma4_moe"];

/// Kernel launches in one decode step of the Llama-family fixtures on the emulated CUDA
/// kernels, counted as a GPU would count them. With Q/K/V and gate/up each one launch and the
/// residual adds in the projections' epilogues, a layer takes 4 launches beside its attention's
/// (and Qwen3's two head norms); its attention is RoPE fused with the K/V write, the paged
/// kernel and at most a split's reduction. The unfused ops took 14.
/// `KILN_CUDA_DEFINES=FUSE_LAUNCHES=0` prints the unfused count (and skips the bound).
#[test]
fn a_dense_decode_step_launches_four_kernels_a_layer_beside_attention() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    let unfused = std::env::var("KILN_CUDA_DEFINES").is_ok_and(|v| v.contains("FUSE_LAUNCHES=0"));
    for (name, per_layer) in [("llama", 4u64), ("qwen3", 6)] {
        let d = dir(name);
        let cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(d.join("config.json")).expect("config.json"),
        )
        .expect("config parses");
        let layers = cfg["num_hidden_layers"]
            .as_u64()
            .expect("num_hidden_layers");
        let mut r = runner(&d, Executor::new(emu.clone()).strict(true), 7);
        r.feed(1, &[1, 2, 3], Logits::Last).expect("prefill");
        let before = emu.submit_stats().expect("counted").launches;
        r.feed(1, &[4], Logits::Last).expect("decode");
        let step = emu.submit_stats().expect("counted").launches - before;
        // Attention: the KV write and the paged attention kernel(s).
        let attention = step.saturating_sub(layers * per_layer);
        println!(
            "{name}: {step} launches for one decode token over {layers} layers ({:.1} a layer){}",
            step as f64 / layers as f64,
            if unfused { ", fusions off" } else { "" }
        );
        if !unfused {
            // Beside the per-layer ops: the embedding, the final norm and head, and 2 or 3
            // attention launches (RoPE with the K/V write, attention, a split's reduction) a
            // layer.
            assert!(
                step >= layers * (per_layer + 2) && attention <= layers * 3 + 4,
                "{name}: {step} launches over {layers} layers"
            );
        }
    }
}

/// Decode steps recorded once and replayed as graphs (the emulated CUDA backend records them
/// as the CUDA backend does: every launch with its arguments and addresses fixed, the memory
/// the step allocates kept by the graph, the step inputs filled before each replay) give
/// bit-for-bit the logits of the same steps run op by op, on every fixture: one sequence
/// through contexts whose block tables double several times (a new graph each time), then
/// three sequences decoding together, their contexts of different lengths.
#[test]
fn decode_steps_replayed_as_graphs_equal_the_steps_run_op_by_op() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    replayed_steps_equal_op_by_op(&|| Executor::new(emu.clone()).strict(true));
}

/// The same on the CPU backend, which records a step as its list of ops on their tensors.
#[test]
fn cpu_decode_steps_replayed_as_graphs_equal_the_steps_run_op_by_op() {
    replayed_steps_equal_op_by_op(&Executor::cpu);
}

fn replayed_steps_equal_op_by_op(ex: &dyn Fn() -> Executor) {
    for &name in MODELS {
        let d = dir(name);
        let r = reference(&d);
        let mut graphs = runner_of(&d, ex(), 7, 3, 2);
        let mut ops = runner_of(&d, ex(), 7, 3, 2);
        ops.set_graphs(false);
        assert!(graphs.forward().graphs().0, "{name}: recording is on");
        let prompt = &r.greedy_prompt;
        let next = |run: &mut Runner, items: &[(u64, &[u32])]| -> Vec<Vec<f32>> {
            let items: Vec<_> = items.iter().map(|&(s, t)| (s, t, Logits::Last)).collect();
            run.step(&items)
                .expect("step")
                .into_iter()
                .map(|mut rows| rows.pop().expect("a row"))
                .collect()
        };
        // One sequence: 2 prompt tokens, then 7 decode steps (block size 2: the table grows
        // from 2 to 5 blocks, widths 2, 4 and 8).
        let mut tok = prompt[..2].to_vec();
        let a = next(&mut graphs, &[(1, &tok)]);
        let b = next(&mut ops, &[(1, &tok)]);
        assert_eq!(a, b, "{name}: prefill");
        let mut t = argmax(&a[0]);
        for step in 0..7 {
            tok = vec![t];
            let a = next(&mut graphs, &[(1, &tok)]);
            let b = next(&mut ops, &[(1, &tok)]);
            assert!(
                a == b,
                "{name}: decode step {step}: replayed logits differ from the ops run one by one"
            );
            t = argmax(&a[0]);
        }
        // Three sequences of different lengths, decoding together.
        for (s, len) in [(2u64, 3usize), (3, 6)] {
            let p = &prompt[..len.min(prompt.len())];
            assert_eq!(next(&mut graphs, &[(s, p)]), next(&mut ops, &[(s, p)]));
        }
        let mut toks = [5u32, 6, 7];
        for step in 0..4 {
            let items: Vec<(u64, [u32; 1])> =
                (1..=3).map(|s| (s, [toks[s as usize - 1]])).collect();
            let items: Vec<(u64, &[u32])> = items.iter().map(|(s, t)| (*s, &t[..])).collect();
            let a = next(&mut graphs, &items);
            let b = next(&mut ops, &items);
            assert!(
                a == b,
                "{name}: batched decode step {step}: replayed logits differ"
            );
            for (k, row) in a.iter().enumerate() {
                toks[k] = argmax(row);
            }
        }
        let st = graphs.forward().graph_stats();
        let (_, off) = graphs.forward().graphs();
        println!(
            "{name}: {st:?}{}",
            off.as_ref()
                .map(|o| format!(", off: {o}"))
                .unwrap_or_default()
        );
        assert!(
            off.is_none(),
            "{name}: recording turned itself off: {off:?}"
        );
        // Widths 2, 4, 8 of one sequence, and the batch of three.
        assert!(st.captured >= 3, "{name}: {st:?}");
        assert_eq!(st.replayed, 7 + 4, "{name}: every decode step replayed");
        assert_eq!(ops.forward().graph_stats().replayed, 0);
    }
}

/// A decode step replayed at a context past 128 keys, where the paged decode kernel splits the
/// key range over several blocks (a scratch tensor and the combining kernel inside the graph),
/// agrees with the same step run op by op. Not bit for bit: the graph's block table is padded
/// to a power of two, so its split points differ.
#[test]
fn a_replayed_step_that_splits_the_keys_agrees_with_the_op_by_op_step() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    let d = dir("llama");
    let r = reference(&d);
    let mut graphs = runner_of(&d, Executor::new(emu.clone()).strict(true), 64, 1, 4);
    let mut ops = runner_of(&d, Executor::new(emu.clone()).strict(true), 64, 1, 4);
    ops.set_graphs(false);
    // 150 tokens of context (the reference prompt repeated), then 3 decode steps.
    let prompt: Vec<u32> = r.tokens.iter().copied().cycle().take(150).collect();
    for chunk in prompt.chunks(64) {
        graphs.feed(1, chunk, Logits::Last).expect("prefill");
        ops.feed(1, chunk, Logits::Last).expect("prefill");
    }
    let mut t = 7u32;
    for step in 0..3 {
        let a = graphs
            .feed(1, &[t], Logits::Last)
            .expect("decode")
            .pop()
            .expect("a row");
        let b = ops
            .feed(1, &[t], Logits::Last)
            .expect("decode")
            .pop()
            .expect("a row");
        let (e, _) = max_err(&[a.clone()], &[b]);
        assert!(
            e <= 1e-4,
            "decode step {step} at 150+ keys: replayed logits differ by {e}"
        );
        t = argmax(&a);
    }
    assert_eq!(
        graphs.forward().graph_stats().replayed,
        3,
        "every decode step replayed"
    );
}
