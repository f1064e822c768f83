//! `kiln info`: the model's sizes and dtypes, and the backends on this machine with what each
//! supports.

use anyhow::Result;
use kiln_core::engine::RunnerConfig;
use kiln_core::validate::cases;

use crate::backends::{open, BackendName};
use crate::load::{load, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Only the backends, without loading a model.
    #[arg(long)]
    pub backends_only: bool,
}

pub fn run(args: &InfoArgs) -> Result<()> {
    if !args.backends_only {
        let m = load(&args.model, RunnerConfig::default())?;
        let i = m.runner.model().info();
        println!("model: {}", m.path.display());
        println!("  name: {}", i.name.as_deref().unwrap_or("-"));
        println!("  architecture: {}", i.architecture);
        let hf = m.file.get("kiln.source").and_then(|v| v.as_str()) == Some("huggingface");
        println!(
            "  format: {}",
            if hf {
                "Hugging Face (config.json + safetensors)"
            } else {
                "GGUF"
            }
        );
        if let Ok(skipped) = m.file.get_str_array("kiln.skipped") {
            println!("  not loaded (text only for now): {}", skipped.join(", "));
        }
        println!("  parameters: {:.1} M", i.n_params as f64 / 1e6);
        println!("  layers {}, embedding {}, heads {} (KV {}), head dim {}, FFN {}, vocab {}, context {}", i.n_layer, i.n_embd, i.n_head, i.n_head_kv, i.head_dim, i.n_ff, i.vocab, i.context_length);
        println!(
            "  weights: {}",
            i.dtypes
                .iter()
                .map(|(d, n)| format!("{n}×{d}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (g, grp) in m.runner.model().kv_groups().iter().enumerate() {
            println!(
                "  kv group {g}: {} layers, window {}",
                grp.layers.len(),
                grp.window.map_or("full".to_string(), |w| w.to_string())
            );
        }
        let cfg = m.runner.config();
        let per_token = cfg.kv_types.bytes_per_token(m.runner.model().kv_groups());
        let capacity = m
            .runner
            .kv_managers()
            .iter()
            .map(|k| (k.pool().num_blocks() - 1) * cfg.block_size)
            .max()
            .unwrap_or(0);
        println!(
            "  kv cache: {} — {} bytes per token over all layers ({:.1} KiB); the pool holds {} tokens ({:.1} MiB at that rate)",
            cfg.kv_types,
            per_token,
            per_token as f64 / 1024.0,
            capacity,
            (per_token * capacity) as f64 / (1024.0 * 1024.0)
        );
        println!(
            "  tokenizer: {} tokens, BOS {:?} (added: {}), EOS {:?}",
            m.tokenizer.vocab_size(),
            m.tokenizer.bos(),
            m.tokenizer.add_bos(),
            m.tokenizer.eos()
        );
        println!("  running on: {}", m.runner.executor().backend().name());
    }
    let all = cases()?;
    for name in BackendName::ALL {
        match open(name, None) {
            Ok(b) => {
                let caps = b.capabilities();
                let mut ops: Vec<&str> = Vec::new();
                for c in all.iter().filter(|c| b.supports_op(&c.desc())) {
                    if !ops.contains(&c.op.name()) {
                        ops.push(c.op.name());
                    }
                }
                let claimed = all.iter().filter(|c| b.supports_op(&c.desc())).count();
                let mut feats = vec![format!("{:?}", caps.kind)];
                if caps.kind == kiln_core::backend::DeviceKind::Cpu {
                    feats.push(format!("{} threads", caps.parallelism));
                } else {
                    feats.push(format!("f16 {}", if caps.f16 { "yes" } else { "no" }));
                    feats.push(match caps.subgroup_size {
                        Some(n) => format!("subgroups of {n}"),
                        None => "no subgroups".into(),
                    });
                    feats.push(format!(
                        "largest binding {} MiB",
                        caps.max_buffer_bytes >> 20
                    ));
                }
                println!(
                    "backend {}: {} ({})",
                    name.as_str(),
                    caps.device,
                    feats.join(", ")
                );
                println!(
                    "  supports {claimed} of {} conformance cases; ops: {}",
                    all.len(),
                    ops.join(" ")
                );
            }
            Err(e) => println!("backend {}: {e}", name.as_str()),
        }
    }
    Ok(())
}
