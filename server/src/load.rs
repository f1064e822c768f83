//! Loading a model for a command: file, tokenizer, backend, executor, runner.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use kiln_core::cpu::CpuBackend;
use kiln_core::engine::{Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::model::build_from_gguf;
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
    /// Longest context (tokens); default the model's, capped at 4096.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Fail instead of running an op on the CPU when the backend lacks it.
    #[arg(long)]
    pub strict: bool,
    /// KV cache element type: f32 (exact), f16 or bf16 (half the memory), q8_0 (about a
    /// quarter). The WebGPU backend runs f32 and f16 caches; others fall back to the CPU.
    #[arg(long, default_value = "f32", value_parser = parse_kv_type)]
    pub kv_type: DType,
}

fn parse_kv_type(s: &str) -> std::result::Result<DType, String> {
    match DType::from_name(s) {
        Some(d @ (DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0)) => Ok(d),
        _ => Err(format!(
            "{s:?} is not a KV cache type: use f32, f16, bf16 or q8_0"
        )),
    }
}

pub struct Loaded {
    pub path: PathBuf,
    pub file: GgufFile,
    pub tokenizer: Tokenizer,
    pub runner: Runner,
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
    cfg.kv_dtype = args.kv_type;
    let runner = Runner::new(ex, model, cfg)?;
    Ok(Loaded {
        path,
        file,
        tokenizer,
        runner,
    })
}
