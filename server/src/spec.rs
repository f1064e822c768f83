//! `--spec`: speculative decoding for `kiln run`, `chat`, `serve` and `bench`, and the
//! benchmark that measures it against plain decoding in one run.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_core::engine::{Engine, Event, GenRequest};
use kiln_core::engine::{Runner, RunnerConfig};
use kiln_core::kv::KvTypes;
use kiln_core::model::build_from_gguf;
use kiln_core::model::dflash::DFlash;
use kiln_core::model::gemma4_assistant::Gemma4Assistant;
use kiln_core::sample::SamplingParams;
use kiln_core::spec::{DFlashDrafter, DraftModel, Drafter, Mtp, Ngram};

use crate::load::{load, ModelArgs};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// Prompt lookup: what followed the latest earlier occurrence of the text's last few
    /// tokens (free; pays off when the output repeats its input, as in code edits).
    Ngram,
    /// A smaller model with the same vocabulary (--draft-model) drafts autoregressively.
    Draft,
    /// Gemma 4's MTP assistant (--draft-model: its Hugging Face directory,
    /// `gemma4_assistant`): reads the model's own K/V and last hidden state, so it drafts
    /// with no cache or prefill of its own.
    Mtp,
    /// A DFlash block-diffusion drafter (--draft-model: its Hugging Face directory, from
    /// z-lab's DFlash checkpoints): drafts a whole block in one pass from the model's hidden
    /// states (Llama, Qwen3 and Gemma 3 families).
    Dflash,
}

#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: draft a few tokens cheaply, verify them in one forward pass of
    /// the model. Lossless: greedy output is unchanged, sampled output keeps the model's
    /// distribution (rejection sampling).
    #[arg(long, value_enum)]
    pub spec: Option<SpecKind>,
    /// The draft model for --spec draft (a .gguf file, a Hugging Face directory or an
    /// alias, sharing the model's tokenizer); the MTP assistant's directory for --spec mtp;
    /// the DFlash drafter's directory for --spec dflash.
    #[arg(long)]
    pub draft_model: Option<String>,
    /// Tokens drafted per step (1 to 16).
    #[arg(long, default_value_t = 4)]
    pub spec_tokens: usize,
}

impl SpecArgs {
    /// Checks the flags go together; the runner config then keeps room to roll drafts back.
    pub fn prepare(&self, cfg: &mut RunnerConfig) -> Result<()> {
        match (self.spec, &self.draft_model) {
            (Some(SpecKind::Draft), None) => bail!("--spec draft needs --draft-model"),
            (Some(SpecKind::Mtp), None) => {
                bail!("--spec mtp needs --draft-model (the MTP assistant's directory)")
            }
            (Some(SpecKind::Dflash), None) => {
                bail!("--spec dflash needs --draft-model (the DFlash drafter's directory)")
            }
            (Some(SpecKind::Ngram) | None, Some(_)) => {
                bail!("--draft-model is for --spec draft, mtp or dflash")
            }
            _ => {}
        }
        if self.spec.is_some() {
            if !(1..=16).contains(&self.spec_tokens) {
                bail!("--spec-tokens must be between 1 and 16");
            }
            cfg.max_rollback = cfg.max_rollback.max(self.spec_tokens);
        }
        Ok(())
    }

    /// The drafter for `engine`'s model (a draft model loads on the same backend, with the
    /// same context, batch and KV settings).
    pub fn drafter(&self, engine: &Engine) -> Result<Option<Box<dyn Drafter>>> {
        let Some(kind) = self.spec else {
            return Ok(None);
        };
        Ok(Some(match kind {
            SpecKind::Ngram => Box::new(Ngram::default()),
            SpecKind::Draft => {
                let file = self.open_draft("draft model")?;
                let target = engine.forward();
                let ex = target.executor().sibling();
                let m = build_from_gguf(&file, &ex)?;
                let cfg = RunnerConfig {
                    prefix_caching: false,
                    kv_blocks: None,
                    max_rollback: self.spec_tokens + 1,
                    state_snapshots: None,
                    // The target's K and V types; its per-layer ranges name its own layers.
                    kv_types: KvTypes {
                        layers: Vec::new(),
                        ..target.config().kv_types.clone()
                    },
                    ..target.config().clone()
                };
                let vocab = target.model().info().vocab;
                Box::new(DraftModel::new(Runner::new(ex, m, cfg)?, vocab)?)
            }
            SpecKind::Mtp => {
                let file = self.open_draft("MTP assistant")?;
                let target = engine.forward();
                let ex = target.executor().sibling();
                let a = Gemma4Assistant::load(&file, &ex)?;
                Box::new(Mtp::new(a, ex, target)?)
            }
            SpecKind::Dflash => {
                let file = self.open_draft("DFlash drafter")?;
                let target = engine.forward();
                let ex = target.executor().sibling();
                let m = DFlash::load(&file, &ex)?;
                let seqs = target.config().max_seqs;
                Box::new(DFlashDrafter::new(m, ex, target, seqs)?)
            }
        }))
    }

    /// The --draft-model file or directory, opened (`what` names it in errors).
    fn open_draft(&self, what: &str) -> Result<kiln_core::load::gguf::GgufFile> {
        let name = self.draft_model.as_deref().unwrap_or_default();
        let path = crate::models::resolve(Some(name))?;
        kiln_core::load::open_model(&path)
            .with_context(|| format!("opening the {what} {}", path.display()))
    }

    /// `engine`, speculating as the flags say.
    pub fn attach(&self, engine: Engine) -> Result<Engine> {
        match self.drafter(&engine)? {
            None => Ok(engine),
            Some(d) => Ok(engine.with_spec(d, self.spec_tokens)?),
        }
    }
}

/// A code edit: the model is asked to repeat a function with one name changed, so most of
/// its output is in the prompt already.
const EDIT_PROMPT: &str = "Rename the variable `total` to `acc` in this Python function and \
print the whole function again.\n\n```python\ndef summarize(orders, tax_rate=0.2):\n    total = 0\n    \
for order in orders:\n        if order.get(\"cancelled\"):\n            continue\n        price = \
order[\"price\"] * order.get(\"quantity\", 1)\n        total += price\n    total = total * (1 + \
tax_rate)\n    return {\"count\": len(orders), \"total\": round(total, 2)}\n```\n\nHere is the \
function with `total` renamed to `acc`:\n\n```python\n";

/// `kiln bench --spec …`: the same greedy request over a code-editing prompt, with and
/// without speculation, alternately; generation speed, acceptance and the speedup.
pub fn bench(
    model: &ModelArgs,
    spec: &SpecArgs,
    n_gen: usize,
    reps: usize,
    json: bool,
) -> Result<()> {
    let mut cfg = RunnerConfig {
        max_batch_tokens: 256,
        ..RunnerConfig::default()
    };
    spec.prepare(&mut cfg)?;
    let mut margs = model.clone();
    let m0 = load(&margs, cfg.clone())?;
    let prompt = m0.tokenizer.encode(EDIT_PROMPT, true)?;
    let need = prompt.len() + n_gen + spec.spec_tokens + 2;
    let m = if m0.runner.config().ctx < need {
        drop(m0);
        margs.ctx = Some(need);
        load(&margs, cfg)?
    } else {
        m0
    };
    let name = m
        .path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let backend = m.runner.executor().backend().name().to_string();
    let engine = Engine::new(m.runner, 1);
    let mut engine = spec.attach(engine)?;
    let drafter = engine.drafter().unwrap_or("none");
    let req = GenRequest::new(prompt, SamplingParams::greedy(), n_gen.max(2));
    // Decode speed: from the first token to the last.
    let once = |engine: &mut Engine, on: bool| -> Result<(f64, Vec<u32>)> {
        engine.set_speculation(on);
        let mut toks = Vec::new();
        let mut first = None;
        engine.run_one(req.clone(), |ev| {
            if let Event::Token(t, _) = ev {
                first.get_or_insert_with(Instant::now);
                toks.push(t);
            }
            Ok(true)
        })?;
        let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        Ok(((toks.len().saturating_sub(1)) as f64 / secs.max(1e-9), toks))
    };
    once(&mut engine, false)?; // warm-up
    once(&mut engine, true)?;
    let before = engine.stats().spec.clone();
    let (mut plain, mut fast) = (Vec::new(), Vec::new());
    let mut same = true;
    for _ in 0..reps.max(1) {
        let (a, ta) = once(&mut engine, false)?;
        let (b, tb) = once(&mut engine, true)?;
        same &= ta == tb;
        plain.push(a);
        fast.push(b);
    }
    let s = engine.stats().spec.clone();
    let drafted = s.drafted - before.drafted;
    let accepted = s.accepted - before.accepted;
    let verifications = s.verifications - before.verifications;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratios: Vec<f64> = fast.iter().zip(&plain).map(|(b, a)| b / a).collect();
    let (pm, sm, speedup) = (mean(&plain), mean(&fast), mean(&ratios));
    let acceptance = accepted as f64 / drafted.max(1) as f64;
    let per = (accepted + verifications) as f64 / verifications.max(1) as f64;
    let lengths: Vec<u64> = s
        .accept_lengths
        .iter()
        .enumerate()
        .map(|(i, &c)| c - before.accept_lengths.get(i).copied().unwrap_or(0))
        .collect();
    if json {
        let j = serde_json::json!({
            "model": name, "backend": backend, "spec": drafter, "spec_tokens": spec.spec_tokens,
            "n_gen": n_gen, "plain_tps": pm, "spec_tps": sm, "speedup": speedup,
            "drafted": drafted, "accepted": accepted, "acceptance": acceptance,
            "tokens_per_verification": per, "accept_lengths": lengths, "identical_output": same,
        });
        println!("{j}");
        return Ok(());
    }
    println!("| model | backend | spec | k | plain t/s | spec t/s | speedup | acceptance | tokens/pass |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {name} | {backend} | {drafter} | {} | {pm:.2} | {sm:.2} | {speedup:.2}× | {:.1}% | {per:.2} |",
        spec.spec_tokens,
        acceptance * 100.0
    );
    println!(
        "accepted drafts per verification (0..={}): {lengths:?}; output identical to plain \
         greedy decoding: {}",
        spec.spec_tokens,
        if same { "yes" } else { "NO" }
    );
    if !same {
        bail!("speculative output differed from plain greedy decoding");
    }
    Ok(())
}
