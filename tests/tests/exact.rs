//! kiln's fast CPU kernels against an f64 forward pass written here, over the same GGUF
//! weights dequantized (the dequantizers are checked against the `gguf` Python package in
//! `gguf.rs`): the logits of SmolLM2-135M at every position of a short prompt must agree to
//! 1e-3. This is what "exact" means for kiln's CPU: no activation quantization, f32
//! accumulation, only the order of the additions differs from the f64 sums.

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
use kiln_core::quant;
use kiln_core::tensor::DType;
use kiln_tests::{model_file, SMOLLM2};

/// A GGUF tensor as f64, row-major `[rows, cols]` (`cols` = the GGUF's first dimension).
fn tensor(f: &GgufFile, name: &str) -> Vec<f64> {
    let (t, bytes) = f.data(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let n: usize = t.shape.iter().product();
    let mut v = vec![0f32; n];
    quant::dequantize(t.dtype, &bytes, &mut v).expect("dequantize");
    v.into_iter().map(f64::from).collect()
}

/// `y = W x` for `W` of `rows × x.len()`.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// Adjacent-pair RoPE (ggml's "normal" mode, which Llama GGUF files use).
fn rope(x: &mut [f64], pos: usize, head_dim: usize, base: f64) {
    for head in x.chunks_exact_mut(head_dim) {
        for j in 0..head_dim / 2 {
            let theta = pos as f64 * base.powf(-2.0 * j as f64 / head_dim as f64);
            let (c, s) = (theta.cos(), theta.sin());
            let (a, b) = (head[2 * j], head[2 * j + 1]);
            head[2 * j] = a * c - b * s;
            head[2 * j + 1] = a * s + b * c;
        }
    }
}

/// The Llama forward pass in f64 over `tokens`: logits at every position.
fn forward_f64(f: &GgufFile, tokens: &[u32]) -> Vec<Vec<f64>> {
    let key = |k: &str| f.arch_key(k);
    let n_layer = f.get_u64(&key("block_count")).unwrap() as usize;
    let n_embd = f.get_u64(&key("embedding_length")).unwrap() as usize;
    let n_head = f.get_u64(&key("attention.head_count")).unwrap() as usize;
    let n_kv = f.get_u64(&key("attention.head_count_kv")).unwrap() as usize;
    let eps = f.get_f32(&key("attention.layer_norm_rms_epsilon")).unwrap() as f64;
    let base = f.get_f32(&key("rope.freq_base")).unwrap() as f64;
    let hd = n_embd / n_head;
    let group = n_head / n_kv;
    let embd = tensor(f, "token_embd.weight");
    let out_norm = tensor(f, "output_norm.weight");
    let output = if f.tensors().iter().any(|t| t.name == "output.weight") {
        tensor(f, "output.weight")
    } else {
        embd.clone()
    };
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embd[t as usize * n_embd..(t as usize + 1) * n_embd].to_vec())
        .collect();
    for l in 0..n_layer {
        let w = |s: &str| tensor(f, &format!("blk.{l}.{s}.weight"));
        let (wq, wk, wv, wo) = (w("attn_q"), w("attn_k"), w("attn_v"), w("attn_output"));
        let (an, fnorm) = (w("attn_norm"), w("ffn_norm"));
        let (wg, wu, wd) = (w("ffn_gate"), w("ffn_up"), w("ffn_down"));
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &an, eps);
            let mut q = matvec(&wq, &h);
            let mut k = matvec(&wk, &h);
            rope(&mut q, p, hd, base);
            rope(&mut k, p, hd, base);
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&wv, &h));
        }
        for (p, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0f64; n_head * hd];
            for h in 0..n_head {
                let g = h / group;
                let q = &qs[p][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=p)
                    .map(|j| {
                        let k = &ks[j][g * hd..(g + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    let v = &vs[j][g * hd..(g + 1) * hd];
                    for d in 0..hd {
                        att[h * hd + d] += ej / sum * v[d];
                    }
                }
            }
            for (xi, o) in x.iter_mut().zip(matvec(&wo, &att)) {
                *xi += o;
            }
            let h = rms_norm(x, &fnorm, eps);
            let gate = matvec(&wg, &h);
            let up = matvec(&wu, &h);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (xi, d) in x.iter_mut().zip(matvec(&wd, &act)) {
                *xi += d;
            }
        }
    }
    xs.iter()
        .map(|x| matvec(&output, &rms_norm(x, &out_norm, eps)))
        .collect()
}

/// The logits of `file` (a Llama-family model) at every position of a short prompt, by
/// prefill and by token-by-token decode, against the f64 forward over the same weights.
fn check_against_f64(file: &GgufFile) {
    // A prompt of real text's ids and a few arbitrary ones, 9 positions in all.
    check_tokens_against_f64(file, &[504, 3458, 282, 4649, 314, 7042, 30, 1116, 40000]);
}

fn check_tokens_against_f64(file: &GgufFile, tokens: &[u32]) {
    let tokens = tokens.to_vec();
    let want = forward_f64(file, &tokens);
    let ex = Executor::cpu();
    let model = build_from_gguf(file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 64,
        max_batch_tokens: 64,
        ..RunnerConfig::default()
    };
    let mut runner = Runner::new(ex, model, cfg).expect("runner");
    // The prompt as one prefill (the GEMM path) ...
    let got = runner.feed(1, &tokens, Logits::All).expect("forward");
    // ... and token by token (the fused decode kernels).
    let mut stepped = Vec::new();
    for t in &tokens {
        stepped.extend(
            runner
                .feed(2, std::slice::from_ref(t), Logits::Last)
                .expect("step"),
        );
    }
    for (name, rows) in [("prefill", &got), ("decode", &stepped)] {
        let mut worst = 0f64;
        for (p, (g, w)) in rows.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len());
            for (a, b) in g.iter().zip(w) {
                let d = (*a as f64 - b).abs();
                assert!(d <= 1e-3, "{name}: position {p}: {a} vs f64 {b}");
                worst = worst.max(d);
            }
        }
        let top = want.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
        println!(
            "{name}: max |logit - f64 logit| = {worst:.2e} over {} positions (logits up to {top:.2})",
            rows.len()
        );
    }
}

#[test]
fn smollm2_logits_match_an_f64_forward_at_every_position() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let file = GgufFile::open(&path).expect("model parses");
    check_against_f64(&file);
}

/// SmolLM2 with every matrix whose rows are whole blocks of `dtype` re-encoded in it (for the
/// K-quants' 256-element blocks, its FFN down projections: 1,536 wide; the others are 576), so
/// that format's kernels (the integer ones for the K-quants on AVX2 and AVX-512 VNNI, the 16-row
/// interleaved ones for the 4-bit formats on AVX-512) run on real activations, outliers included.
fn smollm2_as(dtype: DType) {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let file = GgufFile::open(&path).expect("model parses");
    let file = file
        .requantized(|t| {
            let k = t.shape.last().copied().unwrap_or(0);
            (t.shape.len() == 2 && k % dtype.block_size() == 0 && t.name != "token_embd.weight")
                .then_some(dtype)
        })
        .expect("requantize");
    let n = file.tensors().iter().filter(|t| t.dtype == dtype).count();
    assert!(n >= 30, "{n} tensors in {dtype:?}");
    check_against_f64(&file);
}

/// A random-weight Llama (hidden 256, 2 layers) whose 14 matrices take the i-quants and
/// ternary types in turn (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL, IQ4_XS,
/// TQ1_0, TQ2_0, ...; fixture by `scripts/gpu/random-gguf.py --types`): loaded and run by the
/// CPU, prefill and decode, with the f64 forward's logits.
#[test]
fn a_model_in_every_i_quant_matches_an_f64_forward() {
    let path = kiln_tests::fixtures().join("hf/gguf/llama_iquants.gguf");
    let file = GgufFile::open(&path).expect("fixture parses");
    let types: std::collections::BTreeSet<DType> = file.tensors().iter().map(|t| t.dtype).collect();
    for d in DType::IQUANTS {
        assert!(types.contains(&d), "the fixture has no {d} tensor");
    }
    check_tokens_against_f64(&file, &[259, 283, 81, 223, 89, 81, 84, 78, 70]);
}

/// Local i-quant files against the f64 forward (llama-quantize's, say, to adjudicate where
/// llama.cpp's perplexity and kiln's differ): every `.gguf` in `KILN_TEST_IQ_MODELS`, a
/// Llama-family model each. Skipped when the variable is unset.
#[test]
fn local_quantized_files_match_an_f64_forward() {
    let Some(files) = kiln_tests::local_iq_models() else {
        return;
    };
    for p in files {
        println!("{}", p.display());
        check_against_f64(&GgufFile::open(&p).expect("model parses"));
    }
}

#[test]
fn smollm2_with_q4_k_matrices_matches_an_f64_forward() {
    smollm2_as(DType::Q4_K);
}

#[test]
fn smollm2_with_q5_k_matrices_matches_an_f64_forward() {
    smollm2_as(DType::Q5_K);
}

#[test]
fn smollm2_with_q6_k_matrices_matches_an_f64_forward() {
    smollm2_as(DType::Q6_K);
}

#[test]
fn smollm2_with_q8_0_matrices_matches_an_f64_forward() {
    smollm2_as(DType::Q8_0);
}

/// Q5_1 in every matrix and IQ4_XS in the FFN down projections (the 16-row interleaved kernel
/// on AVX-512; the integer kernels on VNNI for a matrix whose rows are not a multiple of 16).
#[test]
fn smollm2_with_q5_1_and_iq4_xs_matrices_matches_an_f64_forward() {
    for dtype in [DType::Q5_1, DType::IQ4_XS] {
        println!("{dtype:?}");
        smollm2_as(dtype);
    }
}

/// The formats the CPU keeps 16 rows interleaved on AVX-512 (`cpu/qdot_x16.rs`; the model's own
/// Q4_1 above, Q4_K, Q5_1 and IQ4_XS beside): IQ4_NL, Q4_0 and Q5_0 in every matrix.
#[test]
fn smollm2_with_iq4_nl_q4_0_and_q5_0_matrices_matches_an_f64_forward() {
    for dtype in [DType::IQ4_NL, DType::Q4_0, DType::Q5_0] {
        println!("{dtype:?}");
        smollm2_as(dtype);
    }
}
