//! `kiln bench`: prompt and generation speed through the engine `kiln serve` runs, the decode
//! roofline, many requests at once (`-c`), decoding over a long cache (`-d`), under a grammar
//! (`--grammar`), and where the time goes (`--profile`).

use std::time::Instant;

use anyhow::{bail, Result};
use kiln_core::chat::{ChatPrompter, Message};
use kiln_core::engine::RunnerConfig;
use kiln_core::engine::{Engine, Event, GenRequest};
use kiln_core::grammar::{GrammarSpec, Grammars};
use kiln_core::sample::SamplingParams;
use serde::Serialize;

use crate::load::{load, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Prompt tokens (processed as one batch).
    #[arg(short = 'p', long, default_value_t = 128)]
    pub n_prompt: usize,
    /// Generated tokens (one at a time).
    #[arg(short = 'n', long, default_value_t = 64)]
    pub n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
    /// Decode after this many tokens of context (llama-bench's depth): the generation test
    /// prefills a prompt of this length first (not timed) and times its -n decode steps, so
    /// each reads a KV cache this long.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
    /// Also serve this many requests at once through the continuous-batching engine (each a
    /// prompt of -p tokens and -n generated), next to one request alone, and print the
    /// aggregate generation tokens/s of both (prefill included). With -d, each prompt is -d
    /// tokens and the figure is decoding alone: the tokens a second while every request
    /// decodes, so a step of that many sequences each reading a cache that long.
    #[arg(short = 'c', long)]
    pub concurrent: Option<usize>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// After the timed runs, run one prompt and one generation again with every op timed,
    /// and print where the time goes: milliseconds per token per op family (device backends
    /// are synchronised after each op for this, so it is not part of the speed figures). With
    /// -d, the generation decodes after that many tokens of context.
    #[arg(long)]
    pub profile: bool,
    /// A diffusion model: denoising steps per canvas (each canvas takes all of them).
    #[arg(long, default_value_t = 16)]
    pub denoising_steps: usize,
    /// With --spec: a code-editing prompt (-p is not used) generated greedily with and
    /// without speculation, alternately; prints both speeds, the speedup, the acceptance
    /// rate and the accepted-length distribution.
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Decode under a grammar (`json`, `regex:EXPR`, a `.json` schema file or a Lark file):
    /// a prompt asking for JSON is generated greedily with and without the grammar,
    /// alternately; prints both decode speeds and the mask time per token (computed beside
    /// the forward pass, and the part of it the step waited for).
    #[arg(long, value_name = "SPEC")]
    pub grammar: Option<String>,
}

/// One request alone, then `c` at once, through the batching engine: aggregate generated
/// tokens per second (from the first submission to the last token, prefill included). With
/// `-d`, each request's prompt is that long and the figure is decoding alone: the tokens that
/// arrive while every request is decoding (from the last first token to the first last one)
/// over that window's length, so a decode step of `c` sequences each reading a long cache.
fn bench_concurrent(a: &BenchArgs, c: usize) -> Result<()> {
    use kiln_core::engine::spawn;
    let prompt = if a.depth > 0 { a.depth } else { a.n_prompt }.max(1);
    if a.depth > 0 && a.n_gen < 4 {
        bail!("-n must be at least 4 to time decoding after --depth with -c");
    }
    let cfg = RunnerConfig {
        max_seqs: c,
        max_batch_tokens: prompt.max(c).max(64),
        ..RunnerConfig::default()
    };
    let mut margs = a.model.clone();
    margs.ctx = Some((prompt + a.n_gen + 1).max(margs.ctx.unwrap_or(0)));
    let m = load(&margs, cfg)?;
    let vocab = m.runner.model().info().vocab as u64;
    let backend = m.runner.executor().backend().name().to_string();
    let name = m
        .path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let handle = spawn(Engine::new(m.runner, c));
    let mut rng = kiln_core::rng::Rng::new(42);
    let mut run = |k: usize| -> Result<f64> {
        let t0 = Instant::now();
        let rxs: Vec<_> = (0..k)
            .map(|_| {
                handle.submit(GenRequest::new(
                    (0..prompt)
                        .map(|_| (rng.next_u64() % vocab) as u32)
                        .collect(),
                    SamplingParams::greedy(),
                    a.n_gen.max(1),
                ))
            })
            .collect();
        // Each request's token arrival times, taken as they come (one receiver a thread).
        let times = std::thread::scope(|s| {
            let joins: Vec<_> = rxs
                .into_iter()
                .map(|rx| {
                    s.spawn(move || -> Result<Vec<Instant>> {
                        let mut at = Vec::new();
                        loop {
                            match rx.recv() {
                                Ok(Event::Token(..)) => at.push(Instant::now()),
                                Ok(Event::Done { .. }) => return Ok(at),
                                Ok(
                                    Event::Cached(_)
                                    | Event::Draft { .. }
                                    | Event::Canvas { .. }
                                    | Event::Embedding(_),
                                ) => {}
                                Ok(Event::Error(e)) => bail!("request failed: {e}"),
                                Err(_) => bail!("the engine stopped"),
                            }
                        }
                    })
                })
                .collect();
            joins
                .into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a receiver panicked")))
                })
                .collect::<Result<Vec<_>>>()
        })?;
        if a.depth == 0 {
            let generated: usize = times.iter().map(Vec::len).sum();
            return Ok(generated as f64 / t0.elapsed().as_secs_f64());
        }
        decode_window(&times).ok_or_else(|| {
            anyhow::anyhow!(
                "the requests did not decode side by side long enough to time (raise -n)"
            )
        })
    };
    run(1)?; // warm-up
    println!("| model | backend | requests | test | aggregate gen t/s |");
    println!("|---|---|---|---|---|");
    let test = if a.depth > 0 {
        format!("tg{} @ d{}", a.n_gen, a.depth)
    } else {
        format!("pp{}+tg{}", a.n_prompt, a.n_gen)
    };
    for k in [1, c] {
        let mut v = Vec::new();
        for _ in 0..a.reps.max(1) {
            v.push(run(k)?);
        }
        let (mean, std) = mean_std(&v);
        println!("| {name} | {backend} | {k} | {test} | {mean:.2} ± {std:.2} |");
    }
    Ok(())
}

/// Tokens a second while every request decodes: the window from the latest first token to
/// the earliest last token, and the tokens of every request that arrive after its start and
/// by its end. `None` where the window is empty or holds no token past its start.
fn decode_window(times: &[Vec<Instant>]) -> Option<f64> {
    let start = times.iter().map(|t| t.first().copied()).max()??;
    let end = times.iter().map(|t| t.last().copied()).min()??;
    let secs = end.checked_duration_since(start)?.as_secs_f64();
    let n = times
        .iter()
        .flatten()
        .filter(|&&t| t > start && t <= end)
        .count();
    (secs > 0.0 && n > 0).then(|| n as f64 / secs)
}

#[derive(Serialize)]
struct BenchJson {
    model: String,
    backend: String,
    /// CPU threads; null on a GPU backend.
    threads: Option<usize>,
    n_prompt: usize,
    n_gen: usize,
    prompt_tps: f64,
    prompt_tps_std: f64,
    gen_tps: f64,
    gen_tps_std: f64,
    /// Weight bytes one decode token reads.
    decode_bytes: u64,
    /// A device's copy bandwidth (read + write), GB/s; null on a CPU and without generation.
    copy_bandwidth_gbs: Option<f64>,
    /// A CPU's read bandwidth with the bench's threads, GB/s (its roofline divides by this);
    /// null on a device and without generation.
    read_bandwidth_gbs: Option<f64>,
    /// The decode rate the bandwidth allows: copy (or, on a CPU, read) bandwidth / decode bytes.
    roofline_tps: Option<f64>,
    /// gen_tps / roofline_tps.
    roofline_ratio: Option<f64>,
    /// Kernel launches a generated token takes, where the backend counts them.
    launches_per_token: Option<f64>,
    /// Host milliseconds a generated token's ops take to enqueue (the backend's `execute`).
    submit_ms_per_token: Option<f64>,
    /// Decode steps replayed from recorded graphs (0 where the backend has none).
    graph_steps: u64,
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (m, var.sqrt())
}

pub fn bench(a: &BenchArgs) -> Result<()> {
    if a.spec.spec.is_some() {
        return crate::spec::bench(&a.model, &a.spec, a.n_gen, a.reps, a.json);
    }
    if let Some(c) = a.concurrent {
        return bench_concurrent(a, c.max(1));
    }
    if let Some(g) = &a.grammar {
        return bench_grammar(a, g);
    }
    let cfg = RunnerConfig {
        max_batch_tokens: a.n_prompt.max(a.depth).max(1),
        // `--profile -d` finds its context in the prefix cache (see `profile`).
        prefix_caching: a.profile && a.depth > 0,
        ..RunnerConfig::default()
    };
    let mut margs = a.model.clone();
    margs.ctx = Some((a.n_prompt.max(a.depth) + a.n_gen + 1).max(margs.ctx.unwrap_or(0)));
    let mut m = load(&margs, cfg)?;
    if m.runner.model().canvas_length().is_some() {
        let c = m.runner.model().canvas_length().unwrap_or(1);
        if margs.ctx.unwrap_or(0) < a.n_prompt + a.n_gen + c {
            bail!("--ctx must hold the prompt, the generated tokens and a canvas of {c}");
        }
        let j = crate::diffusion::bench(&mut m, a.n_prompt, a.n_gen, a.reps, a.denoising_steps)?;
        if a.json {
            println!("{j}");
        } else {
            println!(
                "{} canvas {} × {} steps: {:.2} ms per denoising step (decoder {:.2}, sampler \
                 {:.2}), {:.1} tokens/s per canvas, {:.1}% of step time on the host",
                j["backend"].as_str().unwrap_or(""),
                j["canvas"],
                j["denoising_steps"],
                j["seconds_per_step"].as_f64().unwrap_or(0.0) * 1e3,
                j["decoder_seconds_per_step"].as_f64().unwrap_or(0.0) * 1e3,
                j["sampler_seconds_per_step"].as_f64().unwrap_or(0.0) * 1e3,
                j["tokens_per_second_per_canvas"].as_f64().unwrap_or(0.0),
                j["host_share"].as_f64().unwrap_or(0.0) * 100.0
            );
        }
        return Ok(());
    }
    let vocab = m.runner.model().info().vocab as u64;
    let mut rng = kiln_core::rng::Rng::new(42);
    let mut toks =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect() };
    // Threads mean something only on the CPU; a device's own parallelism is not threads.
    let caps = m.runner.executor().backend().capabilities();
    let threads = (caps.kind == kiln_core::backend::DeviceKind::Cpu).then_some(caps.parallelism);
    let backend = m.runner.executor().backend().name().to_string();
    let (file, path) = (m.file, m.path);
    // The engine `kiln serve` runs, with one request at a time: pp is a prompt and its first
    // token, tg one token in and `n_gen` generated (as many forward passes).
    let mut engine = Engine::new(m.runner, 1);
    // One warm-up of each.
    timed(&mut engine, toks(a.n_prompt.max(1)), 1)?;
    timed(&mut engine, toks(1), 2)?;
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    // Launches and host submission time over the generation runs (device backends).
    let mut submit = (0u64, 0.0f64, 0usize);
    for _ in 0..a.reps.max(1) {
        if a.n_prompt > 0 {
            pp.push(a.n_prompt as f64 / timed(&mut engine, toks(a.n_prompt), 1)?);
        }
        if a.n_gen > 0 {
            let before = engine_submit_stats(&engine);
            tg.push(if a.depth > 0 {
                decode_at_depth(&mut engine, toks(a.depth), a.n_gen)?
            } else {
                a.n_gen as f64 / timed(&mut engine, toks(1), a.n_gen)?
            });
            if let (Some(b), Some(e), 0) = (before, engine_submit_stats(&engine), a.depth) {
                submit.0 += e.launches - b.launches;
                submit.1 += e.host_seconds - b.host_seconds;
                submit.2 += a.n_gen;
            }
        }
    }
    // Per generated token: launches, and host milliseconds spent enqueueing them.
    let per_token = (submit.2 > 0).then(|| {
        (
            submit.0 as f64 / submit.2 as f64,
            1e3 * submit.1 / submit.2 as f64,
        )
    });
    let (pm, ps) = mean_std(&pp);
    let (gm, gs) = mean_std(&tg);
    // The roofline: the weights a decode token reads over the measured bandwidth: on a CPU,
    // what its threads read; on a device, what a copy moves (read and written).
    let decode_bytes = crate::roofline::decode_bytes(&file);
    // Measured after the runs; a device too full for the copy's buffers loses only this.
    let (bandwidth, read_bandwidth) = match (a.n_gen > 0, threads) {
        (false, _) => (None, None),
        (true, Some(t)) => (None, Some(crate::roofline::host_read_bandwidth(t))),
        (true, None) => (
            crate::roofline::copy_bandwidth(engine.forward().executor())
                .map_err(|e| eprintln!("kiln: copy bandwidth not measured: {e}"))
                .ok(),
            None,
        ),
    };
    let roof = bandwidth
        .or(read_bandwidth)
        .map(|bw| bw / decode_bytes.max(1) as f64);
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    if a.json {
        let j = BenchJson {
            model: name,
            backend,
            threads,
            n_prompt: a.n_prompt,
            n_gen: a.n_gen,
            prompt_tps: pm,
            prompt_tps_std: ps,
            gen_tps: gm,
            gen_tps_std: gs,
            decode_bytes,
            copy_bandwidth_gbs: bandwidth.map(|b| b / 1e9),
            read_bandwidth_gbs: read_bandwidth.map(|b| b / 1e9),
            roofline_tps: roof,
            roofline_ratio: roof.map(|r| gm / r),
            launches_per_token: per_token.map(|p| p.0),
            graph_steps: engine.forward().graph_stats().replayed,
            submit_ms_per_token: per_token.map(|p| p.1),
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        let threads = threads.map_or("-".to_string(), |t| t.to_string());
        println!("| model | backend | threads | test | t/s |");
        println!("|---|---|---|---|---|");
        if a.n_prompt > 0 {
            println!(
                "| {name} | {backend} | {threads} | pp{} | {pm:.2} ± {ps:.2} |",
                a.n_prompt
            );
        }
        if a.n_gen > 0 {
            let at = if a.depth > 0 {
                format!(" @ d{}", a.depth)
            } else {
                String::new()
            };
            println!(
                "| {name} | {backend} | {threads} | tg{}{at} | {gm:.2} ± {gs:.2} |",
                a.n_gen
            );
        }
        let rate = match (bandwidth, read_bandwidth) {
            (Some(bw), _) => Some((bw, "a copy reaches".to_string())),
            (None, Some(bw)) => Some((bw, format!("{threads} threads read memory at"))),
            _ => None,
        };
        if let (Some((bw, how)), Some(r)) = (rate, roof) {
            println!(
                "\nroofline: a decode token reads {:.1} MB of weights; {how} {:.1} GB/s here, \
                 which allows {r:.1} t/s, and tg{} ran at {:.0}% of it",
                decode_bytes as f64 / 1e6,
                bw / 1e9,
                a.n_gen,
                100.0 * gm / r
            );
        }
    }
    if let (Some((l, ms)), false, true) = (per_token, a.json, gm > 0.0) {
        println!(
            "submission: {l:.0} kernel launches a generated token, enqueued in {ms:.3} ms of \
             host time ({:.0}% of the {:.3} ms a token took)",
            100.0 * ms * gm / 1e3,
            1e3 / gm
        );
    }
    if !a.json {
        if let Some(line) = graphs_line(engine.forward()) {
            println!("{line}");
        }
    }
    if a.profile {
        profile(&mut engine, a, &mut toks)?;
    }
    let fb = engine.forward().executor().fallbacks();
    if !fb.is_empty() {
        eprintln!(
            "kiln: CPU fallbacks: {}",
            fb.iter()
                .map(|f| format!("{}×{}", f.op, f.count))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// `kiln bench --grammar`: decode speed with and without a grammar, and the mask time.
fn bench_grammar(a: &BenchArgs, grammar: &str) -> Result<()> {
    let spec = GrammarSpec::parse_arg(grammar)?;
    let m = load(&a.model, RunnerConfig::default())?;
    let tok = m.tokenizer;
    let vocab = m.runner.model().info().vocab;
    let backend = m.runner.executor().backend().name().to_string();
    let name = m
        .path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let grammars = Grammars::new(&tok, vocab)?;
    let ask = "Describe a person as a JSON object with a name, an age, a city and a list of \
               hobbies.";
    let text = match tok.chat_template() {
        Some(src) => ChatPrompter::new(&tok, src)?.render(&[Message::new("user", ask)])?,
        None => format!("{ask}\n"),
    };
    let prompt = match tok.chat_template() {
        Some(_) => tok.encode_chat(&text)?,
        None => tok.encode(&text, true)?,
    };
    let mut engine = Engine::new(m.runner, 1);
    let run = decode_timed;
    let constrained = |engine: &mut Engine| -> Result<(usize, f64)> {
        let mut req = GenRequest::new(prompt.clone(), SamplingParams::greedy(), a.n_gen);
        req.stop_ids = tok.eog_ids().to_vec();
        req.constraint = Some(grammars.compile(&spec)?);
        run(engine, req)
    };
    constrained(&mut engine)?;
    let before = engine.stats().clone();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut generated = 0;
    for _ in 0..a.reps.max(1) {
        let (n, secs) = constrained(&mut engine)?;
        generated += n;
        if n < 2 {
            bail!("the grammar let the model write {n} token(s); nothing to time");
        }
        with.push((n - 1) as f64 / secs);
        let (m2, secs2) = run(
            &mut engine,
            GenRequest::new(prompt.clone(), SamplingParams::greedy(), n),
        )?;
        without.push((m2.max(2) - 1) as f64 / secs2.max(1e-9));
    }
    let st = engine.stats();
    let masks = (st.masks - before.masks).max(1) as f64;
    let mask_us = (st.mask_us - before.mask_us) as f64 / masks;
    let wait_us = (st.mask_wait_us - before.mask_wait_us) as f64 / generated.max(1) as f64;
    let (wm, ws) = mean_std(&with);
    let (om, os) = mean_std(&without);
    if a.json {
        let j = serde_json::json!({
            "model": name, "backend": backend, "grammar": grammar,
            "tokens_per_run": generated / a.reps.max(1),
            "gen_tps_grammar": wm, "gen_tps_grammar_std": ws,
            "gen_tps_plain": om, "gen_tps_plain_std": os,
            "mask_us_per_token": mask_us, "mask_wait_us_per_token": wait_us,
        });
        println!("{j}");
    } else {
        println!("| model | backend | grammar | tokens | plain t/s | grammar t/s | ratio | mask µs/token | waited µs/token |");
        println!("|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {name} | {backend} | {grammar} | {} | {om:.2} ± {os:.2} | {wm:.2} ± {ws:.2} | {:.3} | {mask_us:.0} | {wait_us:.0} |",
            generated / a.reps.max(1),
            wm / om.max(1e-9)
        );
    }
    Ok(())
}

/// Decode tokens per second after `prompt`: `n` greedy tokens, timed from the first (which
/// the prompt's prefill produces) to the last, so `n - 1` decode steps over a cache of at
/// least the prompt's length.
fn decode_at_depth(engine: &mut Engine, prompt: Vec<u32>, n: usize) -> Result<f64> {
    if n < 2 {
        bail!("-n must be at least 2 to time decoding after --depth");
    }
    let (got, secs) = decode_timed(engine, GenRequest::new(prompt, SamplingParams::greedy(), n))?;
    if got != n {
        bail!("the engine generated {got} tokens of {n}");
    }
    Ok((n - 1) as f64 / secs.max(1e-9))
}

/// Runs `req`: the tokens it generated and the seconds from the first to the last (its
/// decoding, the prompt's prefill left out).
fn decode_timed(engine: &mut Engine, req: GenRequest) -> Result<(usize, f64)> {
    let (mut first, mut last, mut n) = (None, Instant::now(), 0usize);
    engine.run_one(req, |ev| {
        if let Event::Token(..) = ev {
            last = Instant::now();
            first.get_or_insert(last);
            n += 1;
        }
        Ok(true)
    })?;
    Ok((n, first.map_or(0.0, |f| (last - f).as_secs_f64())))
}

/// One greedy request of `prompt` generating exactly `n` tokens (no stop tokens): seconds from
/// submission to its end.
fn timed(engine: &mut Engine, prompt: Vec<u32>, n: usize) -> Result<f64> {
    let req = GenRequest::new(prompt, SamplingParams::greedy(), n);
    let t0 = Instant::now();
    let mut got = 0;
    engine.run_one(req, |ev| {
        if let Event::Token(..) = ev {
            got += 1;
        }
        Ok(true)
    })?;
    let secs = t0.elapsed().as_secs_f64();
    if got != n {
        bail!("the engine generated {got} tokens of {n}");
    }
    Ok(secs)
}

/// What recording decode steps as graphs did, on a backend that records them.
fn graphs_line(f: &kiln_core::runner::Forward) -> Option<String> {
    let (on, off) = f.graphs();
    if !f.executor().backend().graphs() {
        return None;
    }
    let st = f.graph_stats();
    Some(match (on, off) {
        (false, _) => "graphs: off (KILN_GRAPHS=0); every op launched on its own".into(),
        (true, Some(why)) => {
            format!("graphs: off for this model ({why}); every op launched on its own")
        }
        (true, None) => format!(
            "graphs: {} decode steps replayed from {} recorded graph(s) (no model code per step)",
            st.replayed, st.captured
        ),
    })
}

fn engine_submit_stats(engine: &Engine) -> Option<kiln_core::backend::SubmitStats> {
    engine.forward().executor().backend().submit_stats()
}

/// `kiln bench --profile`: one prompt and one generation with every op timed; a table of
/// milliseconds per token per op family (and the rest of the step: scheduling, uploads,
/// logits download), in the order of their share of the generation time.
fn profile(
    engine: &mut Engine,
    a: &BenchArgs,
    toks: &mut impl FnMut(usize) -> Vec<u32>,
) -> Result<()> {
    use std::collections::BTreeMap;
    /// One phase: (seconds, calls) per op family, wall seconds, tokens.
    type Phase = (BTreeMap<&'static str, (f64, u64)>, f64, usize);
    let mut phases: Vec<Phase> = Vec::new();
    for (n, decode) in [(a.n_prompt, false), (a.n_gen, true)] {
        let mut fam = BTreeMap::new();
        let mut wall = 0.0;
        if n > 0 {
            let (prompt, gen) = if decode {
                (toks(a.depth.max(1)), n)
            } else {
                (toks(n), 1)
            };
            if decode && a.depth > 0 {
                // The context first, unprofiled: the profiled request finds it in the prefix
                // cache and computes its last block's tokens at most before decoding.
                timed(engine, prompt.clone(), 1)?;
            }
            engine.forward().executor().set_profiling(true);
            wall = timed(engine, prompt, gen)?;
            for (op, ot) in engine.forward().executor().profile() {
                fam.insert(op, (ot.seconds, ot.calls));
            }
            engine.forward().executor().set_profiling(false);
        }
        phases.push((fam, wall, n));
    }
    let mut names: Vec<&'static str> = phases.iter().flat_map(|p| p.0.keys().copied()).collect();
    names.sort();
    names.dedup();
    let ms = |p: &Phase, op: &str| p.0.get(op).map_or(0.0, |v| 1e3 * v.0 / p.2.max(1) as f64);
    names.sort_by(|x, y| {
        ms(&phases[1], y)
            .total_cmp(&ms(&phases[1], x))
            .then(x.cmp(y))
    });
    let at = if a.depth > 0 {
        format!(" after {} tokens of context", a.depth)
    } else {
        String::new()
    };
    println!(
        "\nprofile (ms per token; pp{} over its {} tokens, tg{} per generated token{at}):\n",
        a.n_prompt, a.n_prompt, a.n_gen
    );
    println!("| op | pp ms/token | tg ms/token | tg calls/token |");
    println!("|---|---|---|---|");
    for op in &names {
        let calls = phases[1].0.get(op).map_or(0, |v| v.1) as f64 / a.n_gen.max(1) as f64;
        println!(
            "| {op} | {:.4} | {:.4} | {calls:.0} |",
            ms(&phases[0], op),
            ms(&phases[1], op)
        );
    }
    let rest = |p: &Phase| {
        let ops: f64 = p.0.values().map(|v| v.0).sum();
        1e3 * (p.1 - ops).max(0.0) / p.2.max(1) as f64
    };
    let total =
        |p: &(BTreeMap<&'static str, (f64, u64)>, f64, usize)| 1e3 * p.1 / p.2.max(1) as f64;
    println!(
        "| (outside ops: scheduling, batch set-up, uploads, logits download, sampling) | {:.4} | {:.4} | |",
        rest(&phases[0]),
        rest(&phases[1])
    );
    println!(
        "| **total** | {:.4} | {:.4} | |",
        total(&phases[0]),
        total(&phases[1])
    );
    Ok(())
}
