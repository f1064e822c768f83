//! `kiln validate`: every op case on every chosen backend, checked against the CPU reference.

use std::io::Write;

use anyhow::{bail, Result};
use kiln_core::cpu::CpuBackend;
use kiln_core::validate::{run_all, tally, write_header, write_row, Status};

use crate::backends::{open_for_validation, BackendName};

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// Backend to check: cpu, wgpu, cuda, or all (those available here).
    #[arg(long, default_value = "all")]
    pub backend: String,
    /// Run only cases whose op name or case label contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Also time each case on the backend (microseconds per run).
    #[arg(long)]
    pub perf: bool,
    /// CPU worker threads for the CPU backend under test (the reference always uses one, so
    /// the CPU row checks that splitting work across threads changes nothing).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print only failures and the summary.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: &ValidateArgs) -> Result<()> {
    let names: Vec<BackendName> = match args.backend.as_str() {
        "all" => BackendName::ALL.to_vec(),
        "cpu" => vec![BackendName::Cpu],
        "wgpu" => vec![BackendName::Wgpu],
        "cuda" => vec![BackendName::Cuda],
        other => bail!("unknown backend {other:?}: use cpu, wgpu, cuda or all"),
    };
    let explicit = args.backend != "all";
    let reference = CpuBackend::with_threads(1);
    let mut out = std::io::stdout().lock();
    let mut failed = 0;
    let mut summaries = Vec::new();
    let mut header_done = false;
    for name in names {
        let backend = match open_for_validation(name, args.threads) {
            Ok(b) => b,
            Err(e) if explicit => bail!("{e}"),
            Err(e) => {
                summaries.push(format!("{}: skipped ({e})", name.as_str()));
                continue;
            }
        };
        if !header_done && !args.quiet {
            write_header(&mut out, args.perf)?;
            header_done = true;
        }
        let results = run_all(
            args.filter.as_deref(),
            &reference,
            backend.as_ref(),
            args.perf,
            |r| {
                if !args.quiet || matches!(r.status, Status::Fail(_)) {
                    // A closed stdout (e.g. piped into head) must not abort the run.
                    let _ = write_row(&mut out, r, args.perf);
                    let _ = out.flush();
                }
            },
        )?;
        let (pass, fail, unsupported) = tally(&results);
        failed += fail;
        summaries.push(format!(
            "{} ({}): {pass} passed, {fail} failed, {unsupported} not supported",
            name.as_str(),
            backend.capabilities().device
        ));
    }
    writeln!(out)?;
    for s in &summaries {
        writeln!(out, "{s}")?;
    }
    if failed > 0 {
        bail!("{failed} case(s) failed");
    }
    Ok(())
}
