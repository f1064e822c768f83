//! Speculative decoding is lossless. Greedy: with n-gram and draft-model drafters, every
//! model family (the transformers fixtures and both real GGUF models) gives token for token
//! the output it gives without speculation, over 256 tokens (the real models 128 in CI), alone and in a batch of 8 mixed
//! requests (greedy and sampled, different prompts and lengths), on the CPU and on WebGPU.
//! Sampling: with a deliberately poor draft model, the distribution of the token that
//! rejection sampling decides is the target's (chi-square against the exact marginal).

use std::path::{Path, PathBuf};

use kiln_core::engine::{spawn, Engine, EngineStats, Event, GenRequest};
use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::model::dflash::DFlash;
use kiln_core::model::gemma4_assistant::Gemma4Assistant;
use kiln_core::rng::Rng;
use kiln_core::sample::SamplingParams;
use kiln_core::spec::{DFlashDrafter, DraftModel, Drafter, Mtp, Ngram};
use kiln_tests::{fixtures, model_file, optional_backend, GEMMA3, HF_MODELS, SMOLLM2};

/// Drafts per step.
const K: usize = 4;
/// Tokens each greedy request generates.
const N: usize = 256;
/// Tokens each greedy request generates on the real models (SmolLM2, Gemma 3): half of `N`,
/// for CI's time (their batched runs are most of this file's five minutes; every verification
/// path is exercised within the first hundred tokens); `N` with `KILN_SPEC_FULL=1`.
fn real_tokens() -> usize {
    if full() {
        N
    } else {
        N / 2
    }
}
/// The context of every engine under test (the longest prompt plus `N`, with room).
const CTX: usize = 320;

/// Tokens per greedy request on WebGPU: `N` with `KILN_SPEC_FULL=1`; in CI fewer, because the
/// software Vulkan driver runs a verified batch with a drafter at about 1 step per second
/// (the whole matrix at `N` is a by-hand run).
fn gpu_tokens() -> usize {
    if full() {
        N
    } else {
        64
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Spec {
    Off,
    Ngram,
    Draft,
    /// Gemma 4's MTP assistant (`draft` is its directory).
    Mtp,
    /// A DFlash block drafter (`draft` is its directory).
    DFlash,
}

const BOTH: &[Spec] = &[Spec::Ngram, Spec::Draft];

fn runner(path: &Path, ex: Executor, max_seqs: usize, ctx: usize) -> Runner {
    let file = open_model(path).expect("opens");
    let model = build_from_gguf(&file, &ex).expect("builds");
    let cfg = RunnerConfig {
        ctx,
        max_seqs,
        max_batch_tokens: 64,
        max_rollback: K,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

/// An engine over `target`, speculating with `spec` (the draft model from `draft`).
fn engine(
    target: &Path,
    draft: &Path,
    ex: &dyn Fn() -> Executor,
    spec: Spec,
    max_seqs: usize,
    ctx: usize,
) -> Engine {
    let r = runner(target, ex(), max_seqs, ctx);
    let vocab = r.model().info().vocab;
    let e = Engine::new(r, max_seqs);
    let drafter: Box<dyn Drafter> = match spec {
        Spec::Off => return e,
        Spec::Ngram => Box::new(Ngram::default()),
        Spec::Draft => Box::new(
            DraftModel::new(runner(draft, ex(), max_seqs, ctx), vocab).expect("same vocabulary"),
        ),
        Spec::Mtp => {
            let aex = e.forward().executor().sibling();
            let file = open_model(draft).expect("assistant opens");
            let a = Gemma4Assistant::load(&file, &aex).expect("assistant loads");
            Box::new(Mtp::new(a, aex, e.forward()).expect("assistant binds"))
        }
        Spec::DFlash => {
            let dex = e.forward().executor().sibling();
            let file = open_model(draft).expect("drafter opens");
            let m = DFlash::load(&file, &dex).expect("drafter loads");
            Box::new(DFlashDrafter::new(m, dex, e.forward(), max_seqs).expect("drafter binds"))
        }
    };
    e.with_spec(drafter, K).expect("speculation")
}

/// Runs `reqs` together; each one's tokens, and the engine's counters.
fn run(e: Engine, reqs: &[GenRequest]) -> (Vec<Vec<u32>>, EngineStats) {
    let t0 = std::time::Instant::now();
    let h = spawn(e);
    let streams: Vec<_> = reqs.iter().map(|r| h.submit(r.clone())).collect();
    let outs = streams
        .iter()
        .map(|s| {
            let mut out = Vec::new();
            loop {
                match s.recv().expect("event") {
                    Event::Token(t, _) => out.push(t),
                    Event::Done { .. } => return out,
                    Event::Error(e) => panic!("{e}"),
                    Event::Embedding(_) => panic!("an embedding for a generation"),
                    Event::Cached(_) | Event::Draft { .. } | Event::Canvas { .. } => {}
                }
            }
        })
        .collect::<Vec<Vec<u32>>>();
    let st = h.shutdown().expect("engine");
    eprintln!(
        "  {} requests, {} steps in {:.1} s",
        reqs.len(),
        st.steps,
        t0.elapsed().as_secs_f64()
    );
    (outs, st)
}

/// Eight requests: prompts with and without repetition (so n-gram lookup has something to
/// find, and sometimes nothing), six greedy with `n` tokens or fewer, two sampled.
fn requests(vocab: usize, seed: u64, n: usize) -> Vec<GenRequest> {
    let mut r = Rng::new(seed);
    (0..8)
        .map(|i| {
            let len = 6 + 5 * i;
            let mut prompt: Vec<u32> = (0..len).map(|_| 3 + r.below(vocab - 3) as u32).collect();
            if i % 2 == 0 {
                let again = prompt[..len / 2].to_vec();
                prompt.extend(again);
            }
            let params = if i == 3 || i == 6 {
                SamplingParams {
                    seed: Some(seed + i as u64),
                    ..SamplingParams::default()
                }
            } else {
                SamplingParams::greedy()
            };
            let n = if i % 3 == 1 { n / 2 + 7 * i } else { n };
            GenRequest::new(prompt, params, n)
        })
        .collect()
}

/// Greedy output with each drafter equals the output without (`n` tokens), batched and
/// (`alone`) for a request on its own.
fn check(
    label: &str,
    target: &Path,
    draft: &Path,
    ex: &dyn Fn() -> Executor,
    n: usize,
    alone: bool,
    specs: &[Spec],
) {
    let vocab = runner(target, Executor::cpu(), 1, 16).model().info().vocab;
    let reqs = requests(vocab, 11, n);
    let greedy: Vec<usize> = (0..reqs.len())
        .filter(|&i| reqs[i].params.temperature == 0.0)
        .collect();
    let (base, _) = run(engine(target, draft, ex, Spec::Off, 8, CTX), &reqs);
    assert!(base[0].len() == n, "{label}: {} tokens", base[0].len());
    for &spec in specs {
        let st = if alone {
            let (one, st) = run(engine(target, draft, ex, spec, 1, CTX), &reqs[..1]);
            assert_eq!(one[0], base[0], "{label} {spec:?} alone");
            st.spec
        } else {
            Default::default()
        };
        let (batched, sb) = run(engine(target, draft, ex, spec, 8, CTX), &reqs);
        for &i in &greedy {
            assert_eq!(batched[i], base[i], "{label} {spec:?} batched, request {i}");
        }
        for (i, out) in batched.iter().enumerate() {
            assert_eq!(
                out.len(),
                reqs[i].max_tokens,
                "{label} {spec:?} request {i}"
            );
        }
        let s = &sb.spec;
        println!(
            "{label} {spec:?}: alone {}/{} drafts accepted; batched {}/{} ({:.2} tokens per \
             verification), lengths {:?}",
            st.accepted,
            st.drafted,
            s.accepted,
            s.drafted,
            s.tokens_per_verification(),
            s.accept_lengths
        );
        assert!(s.drafted > 0, "{label} {spec:?}: nothing drafted");
    }
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join("hf").join(name)
}

/// A draft model for a fixture: another family's fixture (same tokenizer, other weights).
fn fixture_draft(name: &str) -> PathBuf {
    fixture(if name == "llama" { "qwen3" } else { "llama" })
}

/// `KILN_SPEC_FULL=1`: the whole matrix on WebGPU (every family, alone and batched; about
/// 20 minutes on the software Vulkan driver), by hand rather than in CI.
fn full() -> bool {
    std::env::var("KILN_SPEC_FULL").is_ok_and(|v| v == "1")
}

#[test]
fn greedy_speculation_is_exact_for_every_fixture_on_the_cpu() {
    for name in HF_MODELS {
        check(
            name,
            &fixture(name),
            &fixture_draft(name),
            &Executor::cpu,
            N,
            true,
            BOTH,
        );
    }
}

/// Gemma 4 with its MTP assistant (the tiny random one beside the gemma4 fixture, so most
/// drafts are rejected): the same greedy output, alone and batched, on the CPU and strictly
/// on WebGPU.
#[test]
fn greedy_mtp_speculation_is_exact_for_gemma4() {
    let (target, assistant) = (fixture("gemma4"), fixture("gemma4_assistant"));
    check(
        "gemma4 mtp",
        &target,
        &assistant,
        &Executor::cpu,
        N,
        true,
        &[Spec::Mtp],
    );
    if let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) {
        let ex = move || Executor::new(gpu.clone()).strict(true);
        check(
            "gemma4 mtp wgpu",
            &target,
            &assistant,
            &ex,
            gpu_tokens(),
            full(),
            &[Spec::Mtp],
        );
    }
}

/// A DFlash block drafter (the tiny random one made beside the qwen3 fixture; every family
/// whose fixture is as wide can host it): the same greedy output, alone and batched, for
/// the Llama, Qwen3, Gemma 3 and Qwen3.5 (dense and MoE, recurrent layers rolled back)
/// fixtures on the CPU, and strictly on WebGPU for Qwen3 (every one with
/// `KILN_SPEC_FULL=1`).
#[test]
fn greedy_dflash_speculation_is_exact() {
    let drafter = fixture("dflash");
    let names = ["llama", "qwen3", "gemma3", "qwen3_5", "qwen3_5_moe"];
    for name in names {
        let label = format!("{name} dflash");
        let t = fixture(name);
        check(
            &label,
            &t,
            &drafter,
            &Executor::cpu,
            N,
            true,
            &[Spec::DFlash],
        );
    }
    if let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) {
        let ex = move || Executor::new(gpu.clone()).strict(true);
        let on_gpu: &[&str] = if full() { &names } else { &["qwen3"] };
        for name in on_gpu {
            let label = format!("{name} dflash wgpu");
            let t = fixture(name);
            check(
                &label,
                &t,
                &drafter,
                &ex,
                gpu_tokens(),
                full(),
                &[Spec::DFlash],
            );
        }
    }
}

/// Strict: every op of the target and of the draft model on WebGPU kernels. In CI, batched,
/// on a plain transformer, the recurrent hybrid and Gemma 4 (sliding windows, shared KV);
/// `KILN_SPEC_FULL=1` runs every family, alone too.
#[test]
fn greedy_speculation_is_exact_on_wgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    let ex = move || Executor::new(gpu.clone()).strict(true);
    // The model drafts for itself here: greedy, nearly all its drafts are accepted, so the
    // software Vulkan driver runs about as many passes as without speculation. (The CPU test
    // above covers a drafter whose drafts are mostly rejected.)
    let names: Vec<&str> = if full() {
        HF_MODELS.to_vec()
    } else {
        vec!["llama", "qwen3_5", "gemma4"]
    };
    for name in names {
        let f = fixture(name);
        check(name, &f, &f, &ex, gpu_tokens(), full(), BOTH);
    }
}

/// The real models draft for themselves (the only same-vocabulary pair at hand): greedy,
/// nearly every draft is accepted, which exercises long accepted runs. In CI on the CPU,
/// both drafters on SmolLM2 and n-gram on Gemma 3 (its 262,144-token vocabulary makes each
/// verified row costly here); `KILN_SPEC_FULL=1`: both drafters on both, on the CPU and on
/// WebGPU.
#[test]
fn greedy_speculation_is_exact_for_the_real_models() {
    let gpu = optional_backend("wgpu", kiln_backend_wgpu::open);
    for name in [SMOLLM2, GEMMA3] {
        let Some(path) = model_file(name) else {
            continue;
        };
        let specs = if full() || name == SMOLLM2 {
            BOTH
        } else {
            &[Spec::Ngram][..]
        };
        check(
            name,
            &path,
            &path,
            &Executor::cpu,
            real_tokens(),
            true,
            specs,
        );
        if let Some(gpu) = gpu.as_ref().filter(|_| full()) {
            let gpu = gpu.clone();
            let ex = move || Executor::new(gpu.clone());
            let label = format!("{name} wgpu");
            check(&label, &path, &path, &ex, real_tokens(), true, BOTH);
        }
    }
}

/// A DFlash drafter with random weights (one layer reading two of the target's), for a
/// target `hidden` wide with `layers` layers and `vocab` tokens, written as a Hugging Face
/// directory under the temporary folder. Its drafts are nonsense: nearly all are rejected.
fn random_dflash(hidden: usize, layers: usize, vocab: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kiln-dflash-{hidden}-{layers}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let (heads, kv, hd, ff) = (4usize, 2usize, 64usize, 256usize);
    let config = serde_json::json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": ff,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 1e6,
        "vocab_size": vocab,
        "block_size": 16,
        "num_target_layers": layers,
        "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": [1, layers - 3]},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let shapes: Vec<(String, Vec<usize>)> = [
        ("fc.weight", vec![hidden, 2 * hidden]),
        ("hidden_norm.weight", vec![hidden]),
        ("norm.weight", vec![hidden]),
        ("layers.0.input_layernorm.weight", vec![hidden]),
        ("layers.0.post_attention_layernorm.weight", vec![hidden]),
        ("layers.0.self_attn.q_proj.weight", vec![heads * hd, hidden]),
        ("layers.0.self_attn.k_proj.weight", vec![kv * hd, hidden]),
        ("layers.0.self_attn.v_proj.weight", vec![kv * hd, hidden]),
        ("layers.0.self_attn.o_proj.weight", vec![hidden, heads * hd]),
        ("layers.0.self_attn.q_norm.weight", vec![hd]),
        ("layers.0.self_attn.k_norm.weight", vec![hd]),
        ("layers.0.mlp.gate_proj.weight", vec![ff, hidden]),
        ("layers.0.mlp.up_proj.weight", vec![ff, hidden]),
        ("layers.0.mlp.down_proj.weight", vec![hidden, ff]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    let mut r = Rng::new(hidden as u64 * 31 + layers as u64);
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    for (name, shape) in &shapes {
        let n: usize = shape.iter().product();
        let scale = 1.0 / (shape.last().copied().unwrap_or(1) as f32).sqrt();
        let start = data.len();
        for _ in 0..n {
            let v = if shape.len() == 1 {
                1.0 + 0.1 * r.normal()
            } else {
                scale * r.normal()
            };
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::Value::Object(header).to_string().into_bytes();
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).expect("weights");
    dir
}

/// The real models with a random DFlash drafter sized for each (nearly every draft
/// rejected): the same greedy output, alone and batched. SmolLM2 on the CPU in CI; Gemma 3
/// (a 262,144-token head for every drafted row) with `KILN_SPEC_FULL=1`.
#[test]
fn greedy_dflash_speculation_is_exact_for_the_real_models() {
    for name in [SMOLLM2, GEMMA3] {
        if name == GEMMA3 && !full() {
            continue;
        }
        let Some(path) = model_file(name) else {
            continue;
        };
        let info = runner(&path, Executor::cpu(), 1, 16).model().info().clone();
        let drafter = random_dflash(info.n_embd, info.n_layer, info.vocab);
        check(
            &format!("{name} dflash"),
            &path,
            &drafter,
            &Executor::cpu,
            real_tokens(),
            true,
            &[Spec::DFlash],
        );
        let _ = std::fs::remove_dir_all(&drafter);
    }
}

/// Upper tail of the chi-square distribution (Wilson–Hilferty).
fn chi_square_p(chi: f64, df: usize) -> f64 {
    let k = df as f64;
    let z = ((chi / k).powf(1.0 / 3.0) - (1.0 - 2.0 / (9.0 * k))) / (2.0 / (9.0 * k)).sqrt();
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    // Abramowitz–Stegun 7.1.26, |error| < 1.5e-7.
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))))
        * (-x * x).exp();
    if x >= 0.0 {
        y
    } else {
        2.0 - y
    }
}

/// Softmax of `logits / t` in f64.
fn probs(logits: &[f32], t: f64) -> Vec<f64> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = logits.iter().map(|&x| ((x as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// The second generated token is the first one a draft decides (the first follows the
/// prompt's prefill). Its exact marginal, Σ over t1 of p(t1 | prompt) · p(t2 | prompt, t1),
/// comes from the target's CPU logits; 6000 requests sampled with speculation from a draft
/// model of other weights (most of its drafts are rejected) must fit it.
#[test]
fn sampled_speculation_keeps_the_targets_distribution() {
    let (target, draft) = (fixture("qwen3"), fixture("llama"));
    let temp = 0.7;
    let prompt: Vec<u32> = vec![5, 17, 42, 99, 7, 64, 12];
    // The exact marginal.
    let mut r = runner(&target, Executor::cpu(), 1, 64);
    let p1 = probs(&r.feed(1, &prompt, Logits::Last).expect("prompt")[0], temp);
    let vocab = p1.len();
    let mut want = vec![0.0f64; vocab];
    for (t1, &w) in p1.iter().enumerate() {
        if w < 1e-12 {
            continue;
        }
        let mut seq = prompt.clone();
        seq.push(t1 as u32);
        let id = 100 + t1 as u64;
        let row = r.feed(id, &seq, Logits::Last).expect("t1")[0].clone();
        r.release(id).expect("release");
        for (x, p) in probs(&row, temp).iter().enumerate() {
            want[x] += w * p;
        }
    }
    // Sampled with speculation: top-k, top-p and min-p off, so p is the plain softmax.
    let params = |seed| SamplingParams {
        temperature: temp as f32,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let n = 6000;
    let reqs: Vec<GenRequest> = (0..n)
        .map(|i| GenRequest::new(prompt.clone(), params(1000 + i as u64), 2 + 3))
        .collect();
    let (outs, stats) = run(
        engine(&target, &draft, &Executor::cpu, Spec::Draft, 8, 64),
        &reqs,
    );
    let mut counts = vec![0u64; vocab];
    for o in &outs {
        counts[o[1] as usize] += 1;
    }
    let s = &stats.spec;
    assert!(
        s.accepted > 0 && s.accepted < s.drafted,
        "drafts both accepted and rejected: {}/{} accepted",
        s.accepted,
        s.drafted
    );
    // Pearson's chi-square, cells with an expected count under 5 pooled.
    let (mut chi, mut cells, mut pool_o, mut pool_e) = (0.0, 0usize, 0.0, 0.0);
    for (&c, &p) in counts.iter().zip(&want) {
        let e = p * n as f64;
        if e < 5.0 {
            pool_o += c as f64;
            pool_e += e;
        } else {
            chi += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e >= 5.0 {
        chi += (pool_o - pool_e).powi(2) / pool_e;
        cells += 1;
    }
    let df = cells - 1;
    let pv = chi_square_p(chi, df);
    println!(
        "second token, {n} samples: chi² = {chi:.1} with {df} degrees of freedom, p = {pv:.3}; \
         drafts accepted {}/{}",
        s.accepted, s.drafted
    );
    assert!(df >= 10, "too few cells: {df}");
    assert!(pv > 0.001, "chi² {chi:.1} ({df} df): p = {pv:.2e}");
}
