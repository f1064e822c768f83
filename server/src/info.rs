//! `kiln info`: the backends on this machine and what each supports.

use anyhow::Result;
use kiln_core::validate::cases;

use crate::backends::{open, BackendName};

#[derive(clap::Args, Debug)]
pub struct InfoArgs {}

pub fn run(_args: &InfoArgs) -> Result<()> {
    let all = cases()?;
    for name in BackendName::ALL {
        match open(name, None) {
            Ok(b) => {
                let caps = b.capabilities();
                let mut ops: Vec<&str> = all
                    .iter()
                    .filter(|c| b.supports_op(&c.desc()))
                    .map(|c| c.op.name())
                    .collect();
                ops.dedup();
                let claimed = all.iter().filter(|c| b.supports_op(&c.desc())).count();
                println!(
                    "{}: {} ({:?}, {} threads/units)",
                    name.as_str(),
                    caps.device,
                    caps.kind,
                    caps.parallelism
                );
                println!(
                    "  supports {claimed} of {} conformance cases; ops: {}",
                    all.len(),
                    ops.join(" ")
                );
            }
            Err(e) => println!("{}: not available: {e}", name.as_str()),
        }
    }
    Ok(())
}
