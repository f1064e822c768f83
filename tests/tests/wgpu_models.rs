//! Both real models on the WebGPU backend against the CPU reference: the same greedy tokens,
//! with every op on the GPU (strict executor: a CPU fallback is an error, and the fallback
//! counters stay at zero). Two sequences decode in one batch, so the paged attention kernel
//! reads two block tables per step.

use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::kv::KvTypes;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
use kiln_core::sample::argmax;
use kiln_core::tokenizer::Tokenizer;
use kiln_core::DType;
use kiln_tests::{model_file, optional_backend, GEMMA3, SMOLLM2};

fn runner(file: &GgufFile, ex: Executor, kv: KvTypes) -> Runner {
    let model = build_from_gguf(file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        ctx: 512,
        max_batch_tokens: 128,
        kv_types: kv,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

/// Per step of each sequence: the runner-up token and its logit's distance below the top one.
type RunnerUps = Vec<Vec<(u32, f32)>>;

/// Greedy tokens for each prompt, the prompts prefilled one by one and then decoded together
/// in one batch per step. Also returns, per step, each sequence's runner-up and top-2 gap.
fn greedy(
    runner: &mut Runner,
    tok: &Tokenizer,
    prompts: &[&str],
    steps: usize,
) -> (Vec<Vec<u32>>, RunnerUps) {
    let mut last = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let ids = tok.encode(p, true).expect("encode");
        let logits = runner
            .feed(i as u64 + 1, &ids, Logits::Last)
            .expect("prefill")
            .pop()
            .expect("logits");
        last.push(logits);
    }
    let mut out = vec![Vec::new(); prompts.len()];
    let mut gaps = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let picks: Vec<u32> = last.iter().map(|l| argmax(l)).collect();
        for (s, l) in last.iter().enumerate() {
            let second = (0..l.len())
                .filter(|&i| i as u32 != picks[s])
                .max_by(|&a, &b| l[a].total_cmp(&l[b]))
                .expect("two tokens");
            gaps[s].push((second as u32, l[picks[s] as usize] - l[second]));
            out[s].push(picks[s]);
        }
        let toks: Vec<[u32; 1]> = picks.iter().map(|&t| [t]).collect();
        let items: Vec<(u64, &[u32], Logits)> = toks
            .iter()
            .enumerate()
            .map(|(s, t)| (s as u64 + 1, &t[..], Logits::Last))
            .collect();
        let res = runner.step(&items).expect("decode step");
        last = res
            .into_iter()
            .map(|mut rows| rows.pop().expect("logits"))
            .collect();
    }
    (out, gaps)
}

/// The largest top-2 logit gap at which a quantized cache may flip the pick. A lossy cache
/// turns the last-bit differences between the two backends' K and V (summation order) into
/// different roundings now and then, which moves later logits by ~0.1 (q8_0) to a few
/// units (tq2/tq3); a near-tie can then go the other way. A wrong kernel shows up as picks
/// outside the CPU's top two, or as a flip at a clear choice.
const LOSSY_TIE: f32 = 1.0;

/// The CPU's greedy tokens on WebGPU. With an f32 or f16 cache, every token; with a lossy one,
/// every token up to the first near-tie flip (the WebGPU pick being the CPU's runner-up at
/// a gap under [`LOSSY_TIE`]), after which the two histories differ and comparing stops.
fn same_greedy_tokens_as_the_cpu(model: &str, kv: KvTypes, prompts: &[&str], steps: usize) {
    let lossless = |t: DType| matches!(t, DType::F32 | DType::F16);
    let lossy = !(lossless(kv.k) && lossless(kv.v))
        || kv.layers.iter().any(|l| !(lossless(l.k) && lossless(l.v)));
    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    let Some(path) = model_file(model) else {
        return;
    };
    let file = GgufFile::open(&path).expect("model parses");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let mut cpu = runner(&file, Executor::cpu(), kv.clone());
    let (want, gaps) = greedy(&mut cpu, &tok, prompts, steps);
    let mut wgpu = runner(&file, Executor::new(gpu).strict(true), kv);
    let (got, _) = greedy(&mut wgpu, &tok, prompts, steps);
    let fallbacks = wgpu.executor().fallbacks();
    assert!(
        fallbacks.is_empty(),
        "{model} ran ops on the CPU: {fallbacks:?}"
    );
    for (s, p) in prompts.iter().enumerate() {
        println!(
            "{model} {p:?}: cpu {:?} / wgpu {:?}",
            tok.decode(&want[s]),
            tok.decode(&got[s])
        );
        if let Some(step) = (0..steps).find(|&i| want[s][i] != got[s][i]) {
            let (second, gap) = gaps[s][step];
            if lossy && got[s][step] == second && gap < LOSSY_TIE {
                println!(
                    "  near-tie at step {step} (CPU top-2 gap {gap:.4}): wgpu took the CPU's runner-up; {step} tokens compared"
                );
                continue;
            }
            panic!(
                "{model} {p:?}: wgpu chose token {} where the CPU chose {} at step {step} (CPU runner-up {second}, top-2 gap {gap:.4}); cpu {:?} wgpu {:?}",
                got[s][step], want[s][step], want[s], got[s]
            );
        }
    }
}

#[test]
fn smollm2_on_wgpu_gives_the_cpu_greedy_tokens_with_no_fallback() {
    same_greedy_tokens_as_the_cpu(
        SMOLLM2,
        KvTypes::uniform(DType::F32),
        &["The capital of France is", "def fibonacci(n):"],
        16,
    );
}

/// An f16 KV cache: written and read in f16 on the GPU, the same tokens as the CPU with the
/// same cache type.
#[test]
fn smollm2_on_wgpu_with_an_f16_kv_cache_gives_the_cpu_greedy_tokens() {
    same_greedy_tokens_as_the_cpu(
        SMOLLM2,
        KvTypes::uniform(DType::F16),
        &["Water boils at"],
        8,
    );
}

/// Quantized caches, K and V of different types (the TurboQuant ones rotated by the
/// executor's matmul, the blocks quantized on the GPU): the CPU's tokens with the same types.
#[test]
fn smollm2_on_wgpu_with_quantized_kv_caches_gives_the_cpu_greedy_tokens() {
    for (k, v) in [
        (DType::Q8_0, DType::TQ3),
        (DType::TQ4, DType::Q4_0),
        (DType::BF16, DType::TQ2),
    ] {
        let kv = KvTypes {
            k,
            v,
            layers: Vec::new(),
        };
        same_greedy_tokens_as_the_cpu(
            SMOLLM2,
            kv,
            &["The capital of France is", "Water boils at"],
            8,
        );
    }
}

/// Gemma 3's 256-wide heads in tq3, its sliding layers in q8_0 K.
#[test]
fn gemma3_on_wgpu_with_a_tq3_cache_gives_the_cpu_greedy_tokens() {
    let kv = KvTypes {
        k: DType::TQ3,
        v: DType::TQ3,
        layers: KvTypes::parse_layers("0-4:q8_0/tq3").expect("layers"),
    };
    same_greedy_tokens_as_the_cpu(GEMMA3, kv, &["Once upon a time"], 6);
}

#[test]
fn gemma3_on_wgpu_gives_the_cpu_greedy_tokens_with_no_fallback() {
    same_greedy_tokens_as_the_cpu(
        GEMMA3,
        KvTypes::uniform(DType::F32),
        &["The capital of France is", "Once upon a time"],
        8,
    );
}

/// An op the WebGPU backend lacks (here an add of f16 activations)
/// runs on the CPU reference through the executor: the right result, counted per op, and an
/// error in strict mode.
#[test]
fn wgpu_falls_back_to_the_cpu_visibly_and_correctly() {
    use kiln_core::op::{ElementwiseOp, Op};
    use kiln_core::tensor::TensorDesc;
    use kiln_core::validate::rng::Rng;

    let Some(gpu) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    let mut rng = Rng::new(7);
    let a: Vec<f32> = (0..6 * 64).map(|_| rng.normal()).collect();
    let b: Vec<f32> = (0..64).map(|_| rng.normal()).collect();
    let run = |ex: &Executor| -> Vec<f32> {
        let be = ex.backend().clone();
        let up = |d: DType, shape: &[usize], v: &[f32]| {
            let t = be.alloc(&TensorDesc::new(d, shape)).expect("alloc");
            be.upload(&t, &kiln_core::quant::quantize(d, v).expect("quantize"))
                .expect("upload");
            t
        };
        let x = up(DType::F16, &[6, 64], &a);
        let y = up(DType::F32, &[64], &b);
        // f16 + f32 (not on wgpu), then a cast to f32 (f16 -> f32 is on wgpu).
        let s = &ex
            .run(&Op::Elementwise(ElementwiseOp::Add), &[&x, &y])
            .expect("add")[0];
        let f = &ex
            .run(&Op::Elementwise(ElementwiseOp::Cast), &[s])
            .expect("cast")[0];
        ex.download_f32(f).expect("download")
    };
    let want = run(&Executor::cpu());
    let ex = Executor::new(gpu.clone());
    let got = run(&ex);
    assert_eq!(got, want, "the fallback result differs from the CPU's");
    let fb = ex.fallbacks();
    assert_eq!(fb.len(), 1, "{fb:?}");
    assert_eq!((fb[0].op, fb[0].count), ("add", 1), "{fb:?}");
    let strict = Executor::new(gpu).strict(true);
    let x = strict
        .backend()
        .alloc(&TensorDesc::new(DType::F16, [2, 64]))
        .expect("alloc");
    let err = strict
        .run(&Op::Elementwise(ElementwiseOp::Add), &[&x, &x])
        .expect_err("strict refuses a fallback");
    assert!(err.to_string().contains("add"), "{err}");
}
