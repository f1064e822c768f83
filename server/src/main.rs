//! The `kiln` command.

mod backends;
mod info;
mod validate;

use clap::{Parser, Subcommand};

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
    /// Show the backends found on this machine and what each supports.
    Info(info::InfoArgs),
}

fn main() -> std::process::ExitCode {
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
        Command::Info(a) => info::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
