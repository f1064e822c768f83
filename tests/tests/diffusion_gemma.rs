//! DiffusionGemma (tests/fixtures/hf/diffusion_gemma: tiny random weights, MoE on every layer,
//! sliding and full layers, a canvas of 8) against transformers: one decoder step's logits
//! after a 12-token prompt (longer than the sliding window, so the decoder's sliding layers
//! see only the tail of it), without and with self-conditioning; the top-k soft embedding
//! against the dense one; and the first canvas of a generation from a fixed canvas at
//! near-zero temperatures, on the CPU, on WebGPU and on the emulated CUDA kernels (both
//! strict: no CPU fallback).

use std::path::{Path, PathBuf};

use kiln_core::engine::diffusion::{generate, DiffusionEvent, DiffusionRequest, DiffusionSummary};
use kiln_core::engine::{Engine, Event, GenRequest, Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_core::model::SoftEmbedding;
use kiln_core::sample::diffusion::DiffusionParams;
use kiln_core::sample::SamplingParams;
use kiln_tests::{fixtures, optional_backend};
use serde_json::Value;

const TOL: f32 = 1e-3;

fn dir() -> PathBuf {
    fixtures().join("hf").join("diffusion_gemma")
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("reference.json")).expect("reference"))
        .expect("reference JSON")
}

fn ids(v: &Value, k: &str) -> Vec<u32> {
    v[k].as_array()
        .expect(k)
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn f32s(name: &str) -> Vec<f32> {
    kiln_tests::read_f32s(&dir().join(name))
}

fn runner(ex: Executor) -> Runner {
    runner_in(&dir(), ex)
}

fn runner_in(d: &Path, ex: Executor) -> Runner {
    let file = open_model(d).expect("checkpoint opens");
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 128,
        max_batch_tokens: 64,
        block_size: 4,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

fn max_err(got: &[Vec<f32>], want: &[f32]) -> f32 {
    let flat: Vec<f32> = got.concat();
    assert_eq!(flat.len(), want.len(), "logits size");
    flat.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// One decoder step over the reference canvas after the prompt, fed in chunks of `chunk`.
fn step(r: &mut Runner, seq: u64, chunk: usize, sc: Option<&[f32]>) -> Vec<Vec<f32>> {
    let v = reference();
    let prompt = ids(&v, "prompt");
    for part in prompt.chunks(chunk) {
        r.feed(seq, part, Logits::None).expect("encoder");
    }
    let out = r.denoise(seq, &ids(&v, "canvas"), sc).expect("decoder");
    r.release(seq).expect("release");
    out
}

fn check(ex: impl Fn() -> Executor, backend: &str) {
    let v = reference();
    let mut r = runner(ex());
    let plain = f32s("logits.f32");
    let cond = f32s("logits_self_cond.f32");
    let sc = f32s("self_cond.f32");
    for chunk in [12, 5] {
        let e = max_err(&step(&mut r, 1, chunk, None), &plain);
        println!("{backend}: decoder logits, prompt in chunks of {chunk}: max |Δ| {e:.2e}");
        assert!(e < TOL, "{backend}: {e}");
    }
    let e = max_err(&step(&mut r, 2, 12, Some(&sc)), &cond);
    println!("{backend}: self-conditioned decoder logits: max |Δ| {e:.2e}");
    assert!(e < TOL, "{backend}: {e}");
    // Self-conditioning changes the logits (the signal is not lost on the way).
    assert!(max_err(&step(&mut r, 3, 12, Some(&sc)), &plain) > 10.0 * TOL);
    // The top-64 soft embedding (the fused op where the backend has it, else top-k routing,
    // gathered rows and a weighted sum) against the dense one, on peaked inputs (see below).
    let peaked: Vec<f32> = plain.iter().map(|x| x / 0.1).collect();
    let set = |r: &Runner, s| {
        r.model()
            .denoiser()
            .expect("DiffusionGemma")
            .set_soft_embedding(s)
    };
    set(&r, SoftEmbedding::Dense);
    let dense = step(&mut r, 5, 12, Some(&peaked));
    set(&r, SoftEmbedding::TopK(64));
    let top = step(&mut r, 6, 12, Some(&peaked));
    set(&r, SoftEmbedding::Dense);
    let e = max_err(&top, &dense.concat());
    println!("{backend}: top-64 against dense self-conditioning: max |Δ| {e:.2e}");
    assert!(e < TOL, "{backend}: {e}");

    // The first canvas of a generation from the fixed canvas.
    let (canvas, sum) = first_canvas(&mut r, &v);
    println!(
        "{backend}: first canvas {canvas:?} after {} steps",
        sum.steps
    );
    assert_eq!(canvas, ids(&v, "first_canvas"), "{backend}");
    assert_eq!((sum.canvases, sum.generated), (1, 8));
}

/// Generates 8 tokens from the reference's fixed starting canvas: the canvas committed, and
/// the summary.
/// The reference generation's denoising settings, seed 7.
fn reference_params(v: &Value) -> DiffusionParams {
    let g = &v["generation"];
    let f = |k: &str| g[k].as_f64().expect(k) as f32;
    DiffusionParams {
        max_denoising_steps: g["max_denoising_steps"].as_u64().expect("steps") as usize,
        t_min: f("t_min"),
        t_max: f("t_max"),
        entropy_bound: f("entropy_bound"),
        stability_threshold: g["stability_threshold"].as_u64().expect("s") as usize,
        confidence_threshold: f("confidence_threshold"),
        seed: 7,
    }
}

fn first_canvas(r: &mut Runner, v: &Value) -> (Vec<u32>, DiffusionSummary) {
    let req = DiffusionRequest {
        prompt: ids(v, "prompt"),
        max_tokens: 8,
        params: reference_params(v),
        init_canvas: Some(ids(v, "init_canvas")),
        stop_ids: Vec::new(),
        drafts: true,
        timed: false,
    };
    let mut canvas = Vec::new();
    let sum = generate(r, 4, &req, |ev| {
        if let DiffusionEvent::Canvas { tokens, .. } = ev {
            canvas = tokens;
        }
        Ok(true)
    })
    .expect("generation");
    (canvas, sum)
}

/// `kiln run`'s path: the batching engine serves the request from the same starting canvas
/// (its canvas and tokens events) and commits the reference's first canvas; a starting
/// canvas for a model that does not denoise is refused.
#[test]
fn the_engine_serves_a_starting_canvas_like_the_direct_loop() {
    let v = reference();
    let mut e = Engine::new(runner(Executor::cpu()), 1);
    e.set_diffusion_defaults(reference_params(&v))
        .expect("params");
    let req = GenRequest {
        init_canvas: Some(ids(&v, "init_canvas")),
        ..GenRequest::new(
            ids(&v, "prompt"),
            SamplingParams {
                seed: Some(7),
                ..SamplingParams::default()
            },
            8,
        )
    };
    let (mut toks, mut canvases) = (Vec::new(), 0);
    e.run_one(req, |ev| {
        match ev {
            Event::Token(t, _) => toks.push(t),
            Event::Canvas { .. } => canvases += 1,
            _ => {}
        }
        Ok(true)
    })
    .expect("served");
    assert_eq!((toks, canvases), (ids(&v, "first_canvas"), 1));
    assert!(e.is_idle());
    assert_eq!(e.snapshot().kv_free, e.snapshot().kv_total);
}

/// An engine over the fixture with room for 8 requests at once (`kv_blocks`: a pool of that
/// many blocks of 4 tokens, else room for all).
fn engine8(ex: Executor, v: &Value, kv_blocks: Option<usize>) -> Engine {
    let file = open_model(&dir()).expect("checkpoint opens");
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 128,
        max_batch_tokens: 96,
        block_size: 4,
        max_seqs: 8,
        kv_blocks,
        ..RunnerConfig::default()
    };
    let mut e = Engine::new(Runner::new(ex, model, cfg).expect("runner"), 8);
    e.set_diffusion_defaults(reference_params(v))
        .expect("params");
    e
}

/// What a request heard: its tokens and the canvases announced.
#[derive(Debug, Default, PartialEq)]
struct Heard {
    tokens: Vec<u32>,
    canvases: usize,
    finished: bool,
}

fn hear(h: &mut Heard, ev: Event) {
    match ev {
        Event::Token(t, _) => h.tokens.push(t),
        Event::Canvas { .. } => h.canvases += 1,
        Event::Done { .. } => h.finished = true,
        Event::Error(e) => panic!("request failed: {e}"),
        _ => {}
    }
}

/// Four diffusion requests (two canvases each, different prompts and seeds) and four
/// token-by-token requests on the same model.
fn mixed_requests(v: &Value) -> Vec<GenRequest> {
    let prompt = ids(v, "prompt");
    let vary = |i: u32| -> Vec<u32> {
        let mut p = prompt.clone();
        p.truncate(prompt.len() - i as usize);
        p.push(17 + 31 * i);
        p
    };
    let mut out = Vec::new();
    for i in 0..4u32 {
        let params = SamplingParams {
            seed: Some(100 + u64::from(i)),
            ..SamplingParams::default()
        };
        out.push(GenRequest::new(vary(i), params, 16));
    }
    for i in 0..4u32 {
        let params = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        out.push(GenRequest {
            autoregressive: true,
            ..GenRequest::new(vary(i + 4), params, 6 + i as usize)
        });
    }
    out
}

/// Diffusion requests and token-by-token requests served at once share forward passes
/// (several canvases in one pass, beside the other requests' prompt chunks and decodes), and
/// each request's output is the one it gets alone.
fn mixed_batches_match_each_alone(ex: impl Fn() -> Executor) {
    let v = reference();
    let reqs = mixed_requests(&v);
    let alone: Vec<Heard> = reqs
        .iter()
        .map(|r| {
            let mut e = engine8(ex(), &v, None);
            let mut h = Heard::default();
            e.run_one(r.clone(), |ev| {
                hear(&mut h, ev);
                Ok(true)
            })
            .expect("served alone");
            assert_eq!(e.stats().diffusion_shared_passes, 0);
            h
        })
        .collect();
    for (h, r) in alone.iter().zip(&reqs) {
        assert!(h.finished && !h.tokens.is_empty());
        assert_eq!(h.canvases > 0, !r.autoregressive);
    }
    // Room for all of them; then a pool of 14 blocks (56 tokens) that cannot hold them all,
    // so requests (diffusion ones mid-canvas among them) are preempted, fed again, and go on
    // from the canvas they had.
    for blocks in [None, Some(14)] {
        let mut e = engine8(ex(), &v, blocks);
        let rxs: Vec<_> = reqs
            .iter()
            .map(|r| {
                let (tx, rx) = std::sync::mpsc::channel();
                e.submit(r.clone(), tx).expect("submitted");
                rx
            })
            .collect();
        while e.step().expect("step") {}
        let together: Vec<Heard> = rxs
            .iter()
            .map(|rx| {
                let mut h = Heard::default();
                rx.try_iter().for_each(|ev| hear(&mut h, ev));
                h
            })
            .collect();
        assert_eq!(together, alone, "pool {blocks:?}");
        let st = e.stats();
        assert!(
            st.diffusion_pass_canvases >= st.diffusion_passes + 2,
            "canvases shared passes: {st:?}"
        );
        assert!(st.diffusion_shared_passes > 0, "{st:?}");
        assert_eq!(st.preemptions > 0, blocks.is_some(), "{st:?}");
        assert_eq!(e.snapshot().kv_free, e.snapshot().kv_total);
    }
}

#[test]
fn mixed_batches_of_canvases_and_tokens_match_each_alone_on_the_cpu() {
    mixed_batches_match_each_alone(Executor::cpu);
}

#[test]
fn mixed_batches_of_canvases_and_tokens_match_each_alone_on_webgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    mixed_batches_match_each_alone(|| Executor::new(gpu.clone()).strict(true));
}

/// A prompt longer than a pass's token limit goes in chunks, one pass each (so a request
/// beside it waits for a chunk, not the whole prompt), and the canvas is the same.
#[test]
fn a_long_prompt_is_fed_in_chunks_with_the_same_canvas() {
    let v = reference();
    let prompt = ids(&v, "prompt").len();
    let canvas_len = runner(Executor::cpu())
        .model()
        .canvas_length()
        .expect("a diffusion model");
    assert!(prompt > canvas_len, "the fixture's prompt fits one chunk");
    let file = open_model(&dir()).expect("checkpoint opens");
    // The smallest limit a pass may have: one canvas.
    let ex = Executor::cpu();
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 128,
        max_batch_tokens: canvas_len,
        block_size: 4,
        ..RunnerConfig::default()
    };
    let mut small = Runner::new(ex, model, cfg).expect("runner");
    let (whole, one) = first_canvas(&mut runner(Executor::cpu()), &v);
    let (chunked, two) = first_canvas(&mut small, &v);
    assert_eq!(chunked, whole);
    assert_eq!(chunked, ids(&v, "first_canvas"));
    assert_eq!(
        (one.prompt_passes, two.prompt_passes),
        (1, prompt.div_ceil(canvas_len))
    );
}

/// The fixture with its text config's `final_logit_softcapping` absent, null or 12, in a
/// directory of its own (the weights and tokenizer linked, the config rewritten).
fn cap_variant(variant: &str, backend: &str) -> PathBuf {
    let out = std::env::temp_dir().join(format!(
        "kiln-dg-cap-{variant}-{backend}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("tmp dir");
    for e in std::fs::read_dir(dir()).expect("fixture") {
        let e = e.expect("entry");
        if e.file_name() != "config.json" {
            std::fs::copy(e.path(), out.join(e.file_name())).expect("copy");
        }
    }
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(dir().join("config.json")).expect("config"))
            .expect("config JSON");
    let text = cfg["text_config"].as_object_mut().expect("text_config");
    match variant {
        "absent" => {
            text.remove("final_logit_softcapping");
        }
        "null" => {
            text.insert("final_logit_softcapping".into(), Value::Null);
        }
        v => {
            let cap: f64 = v.parse().expect("a cap");
            text.insert("final_logit_softcapping".into(), cap.into());
        }
    }
    std::fs::write(out.join("config.json"), cfg.to_string()).expect("write config");
    out
}

/// The soft-cap absent means DiffusionGemma's class default (30), null means none, and a set
/// value is used: decoder logits against transformers' for each (config_defaults.py).
fn check_soft_cap(ex: impl Fn() -> Executor, backend: &str) {
    for variant in ["absent", "null", "12"] {
        let d = cap_variant(variant, backend);
        let mut r = runner_in(&d, ex());
        let want = f32s(&format!("logits_cap_{variant}.f32"));
        let e = max_err(&step(&mut r, 1, 12, None), &want);
        println!("{backend}: soft-cap {variant}: decoder logits max |Δ| {e:.2e}");
        assert!(e < TOL, "{backend}: soft-cap {variant}: {e}");
        let _ = std::fs::remove_dir_all(&d);
    }
    // The three references differ by far more than the tolerance, so each check can fail.
    let (a, n) = (f32s("logits_cap_absent.f32"), f32s("logits_cap_null.f32"));
    assert!(max_err(&[n], &a) > 10.0 * TOL);
}

#[test]
fn the_soft_cap_absent_null_or_set_matches_transformers_on_the_cpu() {
    check_soft_cap(Executor::cpu, "cpu");
}

#[test]
fn the_soft_cap_absent_null_or_set_matches_transformers_on_webgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    check_soft_cap(|| Executor::new(gpu.clone()).strict(true), "wgpu");
}

#[test]
fn decoder_logits_and_first_canvas_match_transformers_on_the_cpu() {
    check(Executor::cpu, "cpu");
}

#[test]
fn decoder_logits_and_first_canvas_match_transformers_on_webgpu() {
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    check(|| Executor::new(gpu.clone()).strict(true), "wgpu");
}

/// The CUDA backend's kernels and launch plan, emulated on the CPU, strict (no op falls back).
#[test]
fn decoder_logits_and_first_canvas_match_transformers_on_emulated_cuda_kernels() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    check(|| Executor::new(emu.clone()).strict(true), "cuda-emu");
}

/// The top-k soft embedding (softmax over the k largest logits, k rows of the table) against
/// the dense one (every row): within 1e-3 for k ≥ 64 on self-conditioning input spread as
/// a trained model's is. Its logits are soft-capped at 30 and span about 60 after the
/// schedule's temperatures (0.4 to 0.8); the random fixture's decoder logits span about 6, so
/// they are taken at a temperature of 0.1. (At the fixture's own spread and 0.8 a third of
/// the mass lies outside the top 64, and the forms differ: the soft embedding is normalized
/// before the self-conditioning MLP, which magnifies what the top-k leaves out.)
#[test]
fn top_k_self_conditioning_matches_the_dense_form() {
    let mut r = runner(Executor::cpu());
    let sc: Vec<f32> = step(&mut r, 9, 12, None)
        .concat()
        .iter()
        .map(|x| x / 0.1)
        .collect();
    let canvas = r.model().canvas_length().expect("a diffusion model");
    assert_eq!(sc.len(), canvas * r.model().info().vocab);
    let set = |r: &Runner, s: SoftEmbedding| {
        r.model()
            .denoiser()
            .expect("DiffusionGemma")
            .set_soft_embedding(s)
    };
    set(&r, SoftEmbedding::Dense);
    let dense = step(&mut r, 1, 12, Some(&sc));
    for k in [64, 128, 256] {
        set(&r, SoftEmbedding::TopK(k));
        let top = step(&mut r, 2, 12, Some(&sc));
        let e = max_err(&top, &dense.concat());
        println!("top-{k} against dense: max |Δ| {e:.2e}");
        assert!(e < TOL, "top-{k}: {e}");
    }
    // A small k is measurably different: the comparison can fail.
    set(&r, SoftEmbedding::TopK(2));
    let e = max_err(&step(&mut r, 3, 12, Some(&sc)), &dense.concat());
    assert!(e > TOL, "top-2 against dense: {e}");
}

/// `kiln logits --canvas … --self-cond FILE` (its library half): the self-conditioning logits
/// read from a JSON file give transformers' logits; bad files and canvases are refused with
/// errors. The denoising settings: flags over generation_config.json over the defaults.
#[test]
fn the_logits_command_reads_self_conditioning_from_json() {
    let v = reference();
    let args = kiln_server::load::ModelArgs {
        ctx: Some(128),
        ..kiln_server::load::ModelArgs::new(Some(dir().display().to_string()), "cpu")
    };
    let mut m = kiln_server::load::load(&args, RunnerConfig::default()).expect("loads");
    let sc = f32s("self_cond.f32");
    let vocab = m.runner.model().info().vocab;
    let rows: Vec<Vec<f32>> = sc.chunks(vocab).map(<[f32]>::to_vec).collect();
    let tmp = std::env::temp_dir().join(format!("kiln-sc-{}.json", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(&rows).expect("json")).expect("write");
    let (prompt, canvas) = (ids(&v, "prompt"), ids(&v, "canvas"));
    let got = kiln_server::diffusion::logits(&mut m, &prompt, &canvas, Some(&tmp)).expect("logits");
    let e = max_err(&got, &f32s("logits_self_cond.f32"));
    assert!(e < TOL, "{e}");
    m.runner.release(1).expect("release");
    // A canvas of the wrong length, and a file of the wrong shape.
    let err = kiln_server::diffusion::logits(&mut m, &prompt, &canvas[..5], None)
        .expect_err("a short canvas");
    assert!(err.to_string().contains("canvas holds 8"), "{err}");
    std::fs::write(&tmp, b"[[1, 2, 3]]").expect("write");
    let err = kiln_server::diffusion::logits(&mut m, &prompt, &canvas, Some(&tmp))
        .expect_err("a bad file");
    assert!(err.to_string().contains("rows"), "{err}");
    std::fs::remove_file(&tmp).ok();

    let d = kiln_server::diffusion::DiffusionArgs::default();
    // The fixture's generation_config.json sets nothing: transformers' defaults.
    let p = d.params(&dir(), Some(5)).expect("defaults");
    assert_eq!(
        p,
        DiffusionParams {
            seed: 5,
            ..DiffusionParams::default()
        }
    );
    let d = kiln_server::diffusion::DiffusionArgs {
        t_min: Some(0.2),
        max_denoising_steps: Some(12),
        ..Default::default()
    };
    let p = d.params(&dir(), Some(5)).expect("flags");
    assert_eq!((p.t_min, p.max_denoising_steps, p.t_max), (0.2, 12, 0.8));
    let bad = kiln_server::diffusion::DiffusionArgs {
        t_min: Some(0.9),
        ..Default::default()
    };
    assert!(bad.params(&dir(), None).is_err(), "t_min above t_max");
}

/// The CPU's soft-embedding op against a naive f64 loop, dense and top-k, on random logits
/// and a random table.
#[test]
fn the_soft_embedding_op_matches_a_naive_loop() {
    let mut rng = kiln_core::rng::Rng::new(21);
    let (t, v, e) = (5usize, 700usize, 24usize);
    let logits: Vec<f32> = (0..t * v).map(|_| 4.0 * rng.normal()).collect();
    let table: Vec<f32> = (0..v * e).map(|_| rng.normal()).collect();
    let ex = Executor::cpu();
    let lt = ex.upload_f32(&[t, v], &logits).expect("upload");
    let tt = ex.upload_f32(&[v, e], &table).expect("upload");
    for k in [0usize, 1, 40, 699] {
        let got = ex
            .soft_embedding(&lt, &tt, k, || unreachable!("the CPU has the fused op"))
            .and_then(|y| ex.download_f32(&y))
            .expect("soft embedding");
        for r in 0..t {
            let row = &logits[r * v..(r + 1) * v];
            let mut ids: Vec<usize> = (0..v).collect();
            ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            if k > 0 {
                ids.truncate(k);
            }
            let m = row[ids[0]] as f64;
            let z: f64 = ids.iter().map(|&j| (row[j] as f64 - m).exp()).sum();
            for c in 0..e {
                let want: f64 = ids
                    .iter()
                    .map(|&j| (row[j] as f64 - m).exp() / z * table[j * e + c] as f64)
                    .sum();
                let d = (got[r * e + c] as f64 - want).abs();
                assert!(
                    d < 1e-5,
                    "k={k} row {r} col {c}: {} vs {want}",
                    got[r * e + c]
                );
            }
        }
    }
}
