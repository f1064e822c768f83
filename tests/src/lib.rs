//! Shared helpers of kiln's cross-backend tests.

use std::sync::Arc;

use kiln_core::backend::Backend;

/// Whether CI demands this capability (`KILN_REQUIRE_<NAME>=1`), turning skips into failures.
pub fn required(name: &str) -> bool {
    std::env::var(format!("KILN_REQUIRE_{name}"))
        .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Opens an optional backend: `Some` when available; `None` with a printed reason when not
/// (a panic instead when `KILN_REQUIRE_<NAME>` is set).
pub fn optional_backend(
    name: &str,
    open: impl FnOnce() -> kiln_core::Result<Arc<dyn Backend>>,
) -> Option<Arc<dyn Backend>> {
    match open() {
        Ok(b) => Some(b),
        Err(e) => {
            if required(&name.to_ascii_uppercase()) {
                panic!(
                    "KILN_REQUIRE_{} is set but the backend is not available: {e}",
                    name.to_ascii_uppercase()
                );
            }
            println!("skipping {name}: {e}");
            None
        }
    }
}

/// The CUDA backend's kernels and launch plan emulated on the CPU (needs a C++ compiler):
/// `None` with a printed reason when unavailable, a panic when `KILN_REQUIRE_CUDA_EMU` is set.
pub fn cuda_emu() -> Option<Arc<dyn Backend>> {
    optional_backend("cuda_emu", || {
        kiln_backend_cuda::emu::EmuBackend::open()
            .map(|b| b as Arc<dyn Backend>)
            .map_err(kiln_core::Error::Model)
    })
}

/// A real model file for end-to-end tests: from `KILN_TEST_MODELS` (a folder), else kiln's
/// model cache. `None` (with a printed reason) when absent, unless `KILN_REQUIRE_MODELS` is set.
pub fn model_file(name: &str) -> Option<std::path::PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("KILN_TEST_MODELS") {
        dirs.push(std::path::PathBuf::from(d));
    }
    dirs.push(kiln_server::models::cache_dir());
    for d in &dirs {
        let p = d.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    if required("MODELS") {
        panic!(
            "KILN_REQUIRE_MODELS is set but {name} is in none of {dirs:?} (run `kiln pull ALIAS`)"
        );
    }
    println!("skipping: model {name} not found in {dirs:?} (run `kiln pull ALIAS` or set KILN_TEST_MODELS)");
    None
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// The fixtures folder of the source tree.
/// The transformers fixture checkpoints in `tests/fixtures/hf/`, one per family variant.
pub const HF_MODELS: &[&str] = &[
    "llama",
    "qwen3",
    "gemma3",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma4",
    "gemma4_moe",
];

pub fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A file of little-endian f32s (a reference's logits or features).
pub fn read_f32s(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The `.gguf` files in the folder `KILN_TEST_IQ_MODELS` names (local i-quant files made by
/// llama-quantize), sorted; `None` when it is unset.
pub fn local_iq_models() -> Option<Vec<std::path::PathBuf>> {
    let dir = std::env::var_os("KILN_TEST_IQ_MODELS")?;
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("KILN_TEST_IQ_MODELS is a folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    Some(files)
}

/// The runs of the soft token `image` in `tokens`: (first index, length).
pub fn image_runs(tokens: &[u32], image: u32) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let s = i;
        while i < tokens.len() && tokens[i] == image {
            i += 1;
        }
        if i > s {
            runs.push((s, i - s));
        } else {
            i += 1;
        }
    }
    runs
}

/// The logits at every position of `tokens` (sequence 1) fed to `runner` in chunks ending at
/// each of `cut`, each image run of `runs` taking the soft tokens `feats` of its image.
pub fn image_prompt_logits(
    runner: &mut kiln_core::engine::Runner,
    tokens: &[u32],
    runs: &[(usize, usize)],
    feats: &[kiln_core::tensor::Tensor],
    cut: &[usize],
) -> Vec<Vec<f32>> {
    image_prompt_logits_in_grids(runner, tokens, runs, feats, cut, &[])
}

/// [`image_prompt_logits`] for a model that places image tokens by row and column: image
/// `i`'s soft tokens are `grids[i]` (rows, columns).
pub fn image_prompt_logits_in_grids(
    runner: &mut kiln_core::engine::Runner,
    tokens: &[u32],
    runs: &[(usize, usize)],
    feats: &[kiln_core::tensor::Tensor],
    cut: &[usize],
    grids: &[(usize, usize)],
) -> Vec<Vec<f32>> {
    use kiln_core::engine::Logits;
    use kiln_core::model::RowEmbeds;
    let mut got: Vec<Vec<f32>> = Vec::new();
    let mut at = 0;
    for &end in cut {
        if end == at {
            continue;
        }
        let embeds = runs
            .iter()
            .zip(feats)
            .enumerate()
            .filter(|(_, ((s, _), _))| (at..end).contains(s))
            .map(|(i, (&(s, n), f))| RowEmbeds {
                row: s - at,
                embeds: f.clone(),
                span_end: s + n,
                grid: grids
                    .get(i)
                    .map(|&(rows, cols)| kiln_core::model::ImageGrid {
                        start: s,
                        rows,
                        cols,
                    }),
            })
            .collect();
        let out = runner
            .step_with_embeds(&[(1, &tokens[at..end], Logits::All)], embeds)
            .expect("step");
        got.extend(out.into_iter().flatten());
        at = end;
    }
    got
}

/// One prompt of a vision fixture: its tokens (the images' soft tokens in place), its images
/// in order (with their soft-token grids, for a model that places image tokens by row and
/// column: else empty), and transformers' logits at every position.
pub struct ImageCase {
    pub name: String,
    pub tokens: Vec<u32>,
    pub images: Vec<kiln_core::vision::Image>,
    pub grids: Vec<(usize, usize)>,
    pub logits: Vec<f32>,
}

/// Checks kiln's logits of each case against transformers' (within 1e-3): each prompt fed
/// whole, and (unless `whole_only`) cut at its images' edges, on fresh runners of `ex`'s
/// backend, the model and its tower from `open`.
pub fn check_image_logits(
    ex: &dyn Fn() -> kiln_core::exec::Executor,
    open: &dyn Fn(
        &kiln_core::exec::Executor,
    ) -> (kiln_core::model::VisionTower, std::path::PathBuf),
    cases: &[ImageCase],
    image_token: u32,
    whole_only: bool,
    label: &str,
) {
    use kiln_core::engine::{Runner, RunnerConfig};
    for c in cases {
        let tokens = &c.tokens;
        let vocab = c.logits.len() / tokens.len();
        let runs = image_runs(tokens, image_token);
        let mut edges: Vec<usize> = runs.iter().flat_map(|&(s, n)| [s, s + n]).collect();
        edges.push(tokens.len());
        let cuts = match whole_only {
            true => vec![vec![tokens.len()]],
            false => vec![vec![tokens.len()], edges],
        };
        for cut in cuts {
            let e = ex();
            let (tower, path) = open(&e);
            let file = kiln_core::load::open_model(&path).expect("model opens");
            let model = kiln_core::model::build_from_gguf(&file, &e).expect("model builds");
            let cfg = RunnerConfig {
                max_batch_tokens: 256,
                block_size: 4,
                ..RunnerConfig::default()
            };
            let mut runner = Runner::new(ex(), model, cfg).expect("runner");
            let feats: Vec<_> = (c.images.iter())
                .map(|i| tower.encode(&e, &i.rgb).expect("image encodes"))
                .collect();
            let got =
                image_prompt_logits_in_grids(&mut runner, tokens, &runs, &feats, &cut, &c.grids);
            assert_eq!(got.len(), tokens.len());
            let err = worst_logits(&got, &c.logits, vocab);
            println!(
                "{label} {} cut at {cut:?}: logits max |Δ| {err:.2e}",
                c.name
            );
            assert!(
                err <= 1e-3,
                "{label} {} cut at {cut:?}: logits differ by {err}",
                c.name
            );
        }
    }
}

/// The largest |Δ| between `got` (a row a position) and `want` (rows of `vocab`), over the
/// ids both have (llama.cpp's conversions trim the vocabulary to the tokenizer's tokens).
pub fn worst_logits(got: &[Vec<f32>], want: &[f32], vocab: usize) -> f32 {
    let v = got.first().map_or(0, |g| g.len().min(vocab));
    got.iter()
        .zip(want.chunks(vocab))
        .map(|(g, w)| {
            g[..v]
                .iter()
                .zip(&w[..v])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        })
        .fold(0f32, f32::max)
}

/// Greedy decoding of sequence 1: the prompt, then `steps` tokens one at a time, each the
/// argmax of the last logits. Returns the tokens and every step's last logits (the prompt's
/// first, `steps + 1` rows).
pub fn greedy_logits(
    run: &mut kiln_core::engine::Runner,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    use kiln_core::engine::Logits;
    let mut logits = Vec::new();
    let mut tokens = Vec::new();
    let mut rows = run.feed(1, prompt, Logits::Last).expect("prefill");
    for _ in 0..steps {
        let last = rows.pop().expect("a row");
        let t = last
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32;
        tokens.push(t);
        logits.push(last);
        rows = run.feed(1, &[t], Logits::Last).expect("decode");
    }
    logits.push(rows.pop().expect("a row"));
    (tokens, logits)
}

use kiln_core::backend::Capabilities;
use kiln_core::cpu::CpuBackend;
use kiln_core::op::{Op, OpDesc};
use kiln_core::tensor::{BackendId, Tensor, TensorDesc};

/// A test double for a device: the CPU backend's memory and kernels under another name (and
/// id), claiming only the ops `claims` accepts, with an optional hook run on the outputs after
/// each op (to simulate a faulty kernel).
pub struct FakeDevice {
    pub inner: CpuBackend,
    pub name: &'static str,
    pub claims: fn(&OpDesc) -> bool,
    pub after: Option<fn(&CpuBackend, &[&Tensor]) -> kiln_core::Result<()>>,
}

impl FakeDevice {
    pub fn new(name: &'static str, claims: fn(&OpDesc) -> bool) -> Self {
        FakeDevice {
            inner: CpuBackend::with_threads(1),
            name,
            claims,
            after: None,
        }
    }
}

impl Backend for FakeDevice {
    fn name(&self) -> &str {
        self.name
    }
    fn id(&self) -> BackendId {
        self.inner.id()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn alloc(&self, d: &TensorDesc) -> kiln_core::Result<Tensor> {
        self.inner.alloc(d)
    }
    fn upload(&self, t: &Tensor, b: &[u8]) -> kiln_core::Result<()> {
        self.inner.upload(t, b)
    }
    fn download(&self, t: &Tensor) -> kiln_core::Result<Vec<u8>> {
        self.inner.download(t)
    }
    fn supports_op(&self, d: &OpDesc) -> bool {
        d.check().is_ok() && (self.claims)(d)
    }
    fn execute(&self, op: &Op, i: &[&Tensor], o: &[&Tensor]) -> kiln_core::Result<()> {
        let desc = OpDesc::new(
            op.clone(),
            i.iter().map(|t| t.desc().clone()).collect(),
            o.iter().map(|t| t.desc().clone()).collect(),
        );
        if !(self.claims)(&desc) {
            return Err(kiln_core::Error::backend(
                self.name,
                format!("asked to run {desc}, which it does not claim"),
            ));
        }
        self.inner.execute(op, i, o)?;
        match self.after {
            Some(f) => f(&self.inner, o),
            None => Ok(()),
        }
    }
    fn synchronize(&self) -> kiln_core::Result<()> {
        Ok(())
    }
}

/// Grammars in the shapes that once overflowed the grammar compiler's stack.
pub mod grammars {
    /// Definitions `d0 … d(n-1)`, each an object whose property refers to the next: `n` `$ref`s
    /// from the root to an integer.
    pub fn ref_chain(n: usize) -> serde_json::Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let d = if i + 1 < n {
                serde_json::json!({"properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            } else {
                serde_json::json!({"type": "integer"})
            };
            defs.insert(format!("d{i}"), d);
        }
        serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    /// `start` naming `r0`, each `ri` naming `r(i+1)`: a chain of `n + 1` rule references.
    pub fn lark_chain(n: usize) -> String {
        let mut s = String::from("start: r0\n");
        for i in 0..n {
            s.push_str(&format!("r{i}: r{} \"a\"\n", i + 1));
        }
        s + &format!("r{n}: \"b\"\n")
    }
}
