//! Loading a model for a command: file, tokenizer, backend, executor, runner.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use kiln_core::cpu::CpuBackend;
use kiln_core::engine::{Engine, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::kv::KvTypes;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::{build_from_gguf, VisionTower};
use kiln_core::tokenizer::Tokenizer;
use kiln_core::DType;

use crate::backends::{open, BackendName};

/// Options every model command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file or an alias (smollm2-135m-instruct, gemma3-270m); default smollm2-135m-instruct.
    #[arg(long, short)]
    pub model: Option<String>,
    /// Backend: cpu, wgpu, cuda, or auto (the fastest available).
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// CPU threads (default: all cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
    /// Longest context (tokens); default the model's, capped at 4096 (`kiln perplexity`: the
    /// chunk length, default 128).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Fail instead of running an op on the CPU when the backend lacks it.
    #[arg(long)]
    pub strict: bool,
    /// KV cache type of K and V: f32 (exact; the CPU's default), f16 (GPU backends' default)
    /// or bf16 (half of f32), q8_0 (8.5 bits a value), q4_0 (4.5), the TurboQuant-style
    /// tq4, tq3, tq2 (4.5, 3.5, 2.5 bits: rows rotated so a Gaussian codebook fits them), the
    /// key types tq4p, tq3p (5.0, 4.0 bits: codes plus a sign sketch that scores q·k without
    /// bias), the trellis-coded tq3t, tq2t (3.5, 2.5 bits), or `auto`: each layer's K and V
    /// types measured at load for the smallest cache within 1 % perplexity of f16 (cached per
    /// model; the choice is printed).
    /// `kiln info` shows the bytes per token and how many tokens fit.
    #[arg(long, value_parser = parse_kv_choice)]
    pub kv_type: Option<KvChoice>,
    /// K cache type (overrides --kv-type for K).
    #[arg(long, value_parser = parse_kv_type)]
    pub kv_type_k: Option<DType>,
    /// V cache type (overrides --kv-type for V).
    #[arg(long, value_parser = parse_kv_type)]
    pub kv_type_v: Option<DType>,
    /// Per-layer cache types, comma-separated `FIRST-LAST:TYPE` or `FIRST-LAST:KTYPE/VTYPE`,
    /// e.g. `0-3:q8_0` to keep the first four layers at 8 bits.
    #[arg(long, value_name = "LAYERS")]
    pub kv_type_layers: Option<String>,
    /// Subtract each layer's mean key (measured by a calibration pass over a built-in text
    /// at start) before a quantized K cache stores it. Attention is unchanged (every score
    /// shifts by the same amount); the rounding error shrinks where a model's keys share a
    /// large constant part.
    #[arg(long)]
    pub kv_center_keys: bool,
    /// Fit a map of each layer's keys to its queries (from the same calibration pass) before
    /// a quantized K cache stores them: keys go in as T·k and queries are scored as T⁻ᵀ·q, so
    /// every score is unchanged, while the cache's rounding error moves to the directions the
    /// queries do not take. See README, "Keys fitted to the queries".
    #[arg(long)]
    pub kv_fit_keys: bool,
    /// The vision tower of a GGUF model: llama.cpp's split projector file (`mmproj-*.gguf`).
    /// Without it, a lone `mmproj*.gguf` beside the model is used; a Hugging Face
    /// directory's own tower is read from it. Images then go in (`--image`, `image_url`).
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// At most this many soft tokens an image, for towers that size images by their own
    /// aspect ratio (Gemma 4: its processor's `max_soft_tokens`, else 280; 70, 140, 280, 560
    /// or 1120. Qwen3.5: any number, its processor's `longest_edge` over 32² by default, 4096
    /// from an mmproj). More tokens see more detail and take longer to encode and attend.
    #[arg(long, value_name = "N")]
    pub image_max_tokens: Option<usize>,
}

impl ModelArgs {
    /// The cache types these flags ask for; unset types default to f32 on the CPU reference
    /// and f16 on a GPU backend.
    pub fn kv_types(&self, on_cpu: bool) -> Result<KvTypes> {
        let base = match self.kv_type {
            Some(KvChoice::Type(t)) => t,
            // Measured after load (`kv_auto`); f16 until then.
            Some(KvChoice::Auto) => DType::F16,
            None if on_cpu => DType::F32,
            None => DType::F16,
        };
        Ok(KvTypes {
            k: self.kv_type_k.unwrap_or(base),
            v: self.kv_type_v.unwrap_or(base),
            layers: match &self.kv_type_layers {
                Some(s) => KvTypes::parse_layers(s)?,
                None => Vec::new(),
            },
        })
    }

    /// Flags for `model` on `backend` with every other option at its default.
    pub fn new(model: Option<String>, backend: &str) -> ModelArgs {
        ModelArgs {
            model,
            backend: backend.into(),
            threads: None,
            ctx: None,
            strict: false,
            kv_type: None,
            kv_type_k: None,
            kv_type_v: None,
            kv_type_layers: None,
            kv_center_keys: false,
            kv_fit_keys: false,
            mmproj: None,
            image_max_tokens: None,
        }
    }
}

/// `--kv-type`: a cache type, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvChoice {
    Type(DType),
    Auto,
}

fn parse_kv_choice(s: &str) -> std::result::Result<KvChoice, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(KvChoice::Auto);
    }
    parse_kv_type(s)
        .map(KvChoice::Type)
        .map_err(|e| format!("{e}, or auto"))
}

fn parse_kv_type(s: &str) -> std::result::Result<DType, String> {
    KvTypes::parse_type(s).map_err(|e| e.to_string())
}

pub struct Loaded {
    pub path: PathBuf,
    pub file: GgufFile,
    pub tokenizer: Tokenizer,
    pub runner: Runner,
    /// The vision tower and its soft token's id, for a model that takes images.
    pub vision: Option<(Arc<VisionTower>, u32)>,
}

/// `engine` with the vision tower `vision` where there is one.
pub fn with_vision(mut engine: Engine, vision: &Option<(Arc<VisionTower>, u32)>) -> Engine {
    if let Some((tower, token)) = vision {
        engine.set_vision(tower.clone(), *token);
    }
    engine
}

/// The vision tower that goes with the model at `path`: `--mmproj`, a lone `mmproj*.gguf`
/// beside a GGUF file, or a Hugging Face directory's own. One given by `--mmproj` must load;
/// one found is skipped with a warning when it does not.
fn load_vision(
    args: &ModelArgs,
    path: &std::path::Path,
    runner: &Runner,
    tok: &Tokenizer,
) -> Result<Option<(Arc<VisionTower>, u32)>> {
    let found = match &args.mmproj {
        Some(p) => Some(p.clone()),
        None if path.is_file() => beside(path),
        None => None,
    };
    let explicit = args.mmproj.is_some();
    let tower = match VisionTower::open(path, found.as_deref(), runner.executor()) {
        Ok(Some(mut t)) => {
            if let Some(n) = args.image_max_tokens {
                t.set_max_soft_tokens(n).context("--image-max-tokens")?;
            }
            t
        }
        Ok(None) => return Ok(None),
        Err(e) if explicit => return Err(e).context("loading the vision tower (--mmproj)"),
        Err(e) => {
            tracing::warn!("the vision tower is not loaded, images will be refused: {e}");
            return Ok(None);
        }
    };
    let Some(token) = tok.token_to_id(&tower.soft_token) else {
        let msg = format!(
            "the tokenizer has no {:?} token for the vision tower's soft tokens",
            tower.soft_token
        );
        if explicit {
            anyhow::bail!(msg);
        }
        tracing::warn!("{msg}; images will be refused");
        return Ok(None);
    };
    tracing::info!("vision tower: {}", tower.describe());
    Ok(Some((Arc::new(tower), token)))
}

/// The one `mmproj*.gguf` in the folder of the GGUF at `model` (none, or several: `None`).
fn beside(model: &std::path::Path) -> Option<PathBuf> {
    let dir = model.parent()?;
    let mut found = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.to_ascii_lowercase().starts_with("mmproj") && n.ends_with(".gguf")
            })
        });
    let one = found.next()?;
    found.next().is_none().then_some(one)
}

/// The executor for `--backend`: `auto` tries CUDA, then WebGPU on a real GPU, then the CPU
/// (a software Vulkan driver such as lavapipe is correct but slower than the CPU backend, so
/// `auto` passes it over; `--backend wgpu` still uses it).
pub fn executor(backend: &str, threads: Option<usize>, strict: bool) -> Result<Executor> {
    let cpu = Arc::new(match threads {
        Some(t) => CpuBackend::with_threads(t),
        None => CpuBackend::new(),
    });
    let pick = |name: BackendName| -> Result<Executor> {
        Ok(match name {
            BackendName::Cpu => Executor::with_cpu(cpu.clone(), cpu.clone()),
            other => Executor::with_cpu(open(other, threads)?, cpu.clone()),
        }
        .strict(strict))
    };
    match backend {
        "cpu" => pick(BackendName::Cpu),
        "wgpu" => pick(BackendName::Wgpu),
        "cuda" => pick(BackendName::Cuda),
        "auto" => pick(BackendName::Cuda)
            .or_else(|_| {
                let ex = pick(BackendName::Wgpu)?;
                if ex.backend().capabilities().kind == kiln_core::backend::DeviceKind::SoftwareGpu {
                    anyhow::bail!("wgpu: only a software adapter");
                }
                Ok(ex)
            })
            .or_else(|_| pick(BackendName::Cpu)),
        other => anyhow::bail!("unknown backend {other:?}: use cpu, wgpu, cuda or auto"),
    }
}

pub fn load(args: &ModelArgs, cfg: RunnerConfig) -> Result<Loaded> {
    let path = crate::models::resolve(args.model.as_deref())?;
    let file = kiln_core::load::open_model(&path)?;
    let tokenizer = kiln_core::tokenizer::open_tokenizer(&path, &file)
        .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    let ex = executor(&args.backend, args.threads, args.strict)?;
    let model = build_from_gguf(&file, &ex)?;
    let mut cfg = cfg;
    cfg.ctx = args.ctx.unwrap_or(model.info().context_length.min(4096));
    cfg.kv_types = args.kv_types(ex.on_cpu())?;
    cfg.kv_center_keys = args.kv_center_keys;
    cfg.kv_fit_keys = args.kv_fit_keys;
    if args.kv_center_keys || args.kv_fit_keys {
        cfg.kv_calibration = crate::kv_auto::key_calibration_tokens(&tokenizer)?;
    }
    if args.kv_fit_keys {
        eprintln!(
            "kiln: --kv-fit-keys: calibrating the keys over {} tokens of a built-in text where the K cache is lossy",
            kiln_core::engine::CALIBRATION_FIT_TOKENS.min(cfg.ctx)
        );
    }
    let mut runner = Runner::new(ex, model, cfg)?;
    if args.kv_type == Some(KvChoice::Auto) {
        auto_kv_types(args, &path, &mut runner, &tokenizer)?;
    }
    let vision = load_vision(args, &path, &runner, &tokenizer)?;
    Ok(Loaded {
        path,
        file,
        tokenizer,
        runner,
        vision,
    })
}

/// `--kv-type auto`: the cached choice for this model, backend and flags, or a measurement
/// (`kv_auto`), applied to `runner` and printed.
fn auto_kv_types(
    args: &ModelArgs,
    path: &std::path::Path,
    runner: &mut Runner,
    tokenizer: &kiln_core::tokenizer::Tokenizer,
) -> Result<()> {
    use crate::kv_auto;
    if args.kv_type_layers.is_some() {
        anyhow::bail!("--kv-type auto chooses every layer's types: drop --kv-type-layers");
    }
    let fixed = (args.kv_type_k, args.kv_type_v);
    let budget = kv_auto::default_budget();
    let backend = runner.executor().backend().name().to_string();
    let file = kv_auto::cache_file(
        path,
        &backend,
        fixed,
        budget,
        (runner.config().ctx, args.kv_center_keys, args.kv_fit_keys),
    )?;
    let pin = |mut t: KvTypes| {
        t.k = fixed.0.unwrap_or(t.k);
        t.v = fixed.1.unwrap_or(t.v);
        for r in &mut t.layers {
            r.k = fixed.0.unwrap_or(r.k);
            r.v = fixed.1.unwrap_or(r.v);
        }
        t
    };
    if let Some(t) = kv_auto::read_cached(&file) {
        let t = pin(t);
        match runner.set_kv_types(t.clone()) {
            Ok(()) => {
                let groups = runner.model().kv_groups().to_vec();
                eprintln!(
                    "kiln: --kv-type auto: {} ({} bytes per token; measured before, {}: delete it to measure again)",
                    kv_auto::flags(&t),
                    t.bytes_per_token(&groups),
                    file.display()
                );
                return Ok(());
            }
            // A file edited or left by another version: measure again.
            Err(e) => eprintln!(
                "kiln: --kv-type auto: {} does not fit this model ({e}); measuring again",
                file.display()
            ),
        }
    }
    eprintln!("kiln: --kv-type auto: measuring each layer's KV cache types on a calibration text (once per model and backend)");
    let start = std::time::Instant::now();
    let c = kv_auto::choose(runner, tokenizer, fixed, budget, |i, n| {
        eprint!("\r  [{i}/{n}] {:.0} s   ", start.elapsed().as_secs_f64());
    })?;
    eprintln!();
    runner.set_kv_types(c.types.clone())?;
    eprintln!("kiln: --kv-type auto: {}", c.describe());
    match kv_auto::write_cached(&file, &c) {
        Ok(()) => eprintln!("kiln: saved as {}", file.display()),
        Err(e) => eprintln!("kiln: warning: the choice was not saved: {e:#}"),
    }
    Ok(())
}
