//! `--kv-type auto`: the KV cache types of every layer chosen by measurement, the smallest
//! cache that keeps the model's next-token distributions within a budget of f16's.
//!
//! How: a calibration text (a public-domain passage built into the binary, not the text
//! `kiln perplexity` scores in the README) is run once with f16 K and V everywhere, keeping
//! each position's distribution (its 32 most likely tokens, as `--save-base` does). Then
//! each layer alone is run with each smaller type for K (tq4, then tq3) and for V (tq4, tq3,
//! then tq2), the other layers staying f16, and the mean KL divergence from f16's
//! distributions is that layer's cost for that type (a type that alone costs half the budget
//! ends the descent: the smaller ones are not run). q8_0 is counted as free (its whole-model
//! cost is under 0.1 % of perplexity on every model measured; README). A greedy knapsack
//! then starts from the smallest type everywhere and, while the summed costs exceed the
//! budget, upgrades the layer and side that buys the most KL per byte. Costs do not add
//! exactly, so the choice is run as a whole over a longer stretch of the passage and judged
//! by the change of its perplexity (and its KL), and the sum of costs allowed is searched
//! for the largest whose choice keeps both within the budget (six runs; f16 K and V if
//! none does). Up to three uniform choices smaller than the one found (the same types in
//! every layer) are judged too, as the per-layer costs only approximate the whole.
//!
//! The budget is ln(1.0075): a 0.75 % change of perplexity, so that other text lands within
//! 1 %. The result
//! is cached per model file, backend and budget in `$KILN_HOME/kv-auto` (else
//! `~/.cache/kiln/kv-auto`), so a model is measured once; the printout names the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kiln_core::kv::{KvTypes, LayerTypes};
use kiln_core::runner::{Logits, Runner};
use kiln_core::sample::log_softmax;
use kiln_core::tokenizer::Tokenizer;
use kiln_core::DType;

/// The calibration passage (Lewis Carroll, 1865, public domain).
const TEXT: &str = include_str!("kv_auto.txt");
/// Tokens of the passage each layer's types are measured over (fewer where the context is
/// shorter), and the longer run that judges a whole choice.
const TOKENS: usize = 256;
const JUDGE_TOKENS: usize = 512;
/// Positions before this one are not scored (too little context to judge a cache by).
const FIRST: usize = 32;
/// Calibration runs use this sequence id.
const SEQ: u64 = 0x6b76_6175_746f;
/// Changed when the method changes, so older cached choices are not reused.
const VERSION: u32 = 4;
/// Whole-model runs of the search for the largest sum of costs that keeps to the budget.
const TRIES: usize = 6;
/// Uniform choices judged after the search, at most.
const UNIFORM_TRIES: usize = 3;

/// K types tried below f16, smallest first (q8_0 is the free step after them).
const K_LADDER: [DType; 2] = [DType::TQ3, DType::TQ4];
/// V types tried below f16, smallest first.
const V_LADDER: [DType; 3] = [DType::TQ2, DType::TQ3, DType::TQ4];

/// What `--kv-type auto` settled on.
pub struct Choice {
    pub types: KvTypes,
    /// KL divergence from f16 on the calibration text, and the change of its perplexity.
    pub kl: f64,
    pub ppl_change: f64,
    pub bytes_per_token: usize,
    pub f16_bytes_per_token: usize,
}

impl Choice {
    /// One line for the log: the types as the flags that ask for them, the bytes and the
    /// measured cost.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} bytes per token, {:.2}x less than f16; KL {:.5} from f16, perplexity {:+.2} % on the calibration text)",
            flags(&self.types),
            self.bytes_per_token,
            self.f16_bytes_per_token as f64 / self.bytes_per_token.max(1) as f64,
            self.kl,
            100.0 * self.ppl_change
        )
    }
}

/// The flags that ask for `t`: `--kv-type-k K --kv-type-v V`, then `--kv-type-layers …`
/// where layers differ.
pub fn flags(t: &KvTypes) -> String {
    let mut s = format!("--kv-type-k {} --kv-type-v {}", t.k, t.v);
    if !t.layers.is_empty() {
        s += &format!(" --kv-type-layers {}", layers_flag(t));
    }
    s
}

/// The per-layer types as one `--kv-type-layers` value (runs of equal layers merged).
pub fn layers_flag(t: &KvTypes) -> String {
    let mut out: Vec<String> = Vec::new();
    for r in &t.layers {
        let ty = if r.k == r.v {
            r.k.to_string()
        } else {
            format!("{}/{}", r.k, r.v)
        };
        if r.first == r.last {
            out.push(format!("{}:{ty}", r.first));
        } else {
            out.push(format!("{}-{}:{ty}", r.first, r.last));
        }
    }
    out.join(",")
}

/// Types with `choice[l] = (k, v)` for each layer (runs merged), f16 elsewhere.
fn types_of(choice: &BTreeMap<usize, (DType, DType)>) -> KvTypes {
    let mut layers: Vec<LayerTypes> = Vec::new();
    for (&l, &(k, v)) in choice {
        match layers.last_mut() {
            Some(r) if r.last + 1 == l && r.k == k && r.v == v => r.last = l,
            _ => layers.push(LayerTypes {
                first: l,
                last: l,
                k,
                v,
            }),
        }
    }
    KvTypes {
        k: DType::F16,
        v: DType::F16,
        layers,
    }
}

/// The tokens `--kv-center-keys` and `--kv-fit-keys` calibrate on: the built-in passage past
/// the part `--kv-type auto` judges its choices on (its first [`JUDGE_TOKENS`]), after the
/// model's BOS where it adds one.
pub fn key_calibration_tokens(tok: &Tokenizer) -> Result<Vec<u32>> {
    let with = tok.encode(TEXT, true)?;
    let without = tok.encode(TEXT, false)?;
    let bos = with.len().saturating_sub(without.len()).min(with.len());
    let mut out = with[..bos].to_vec();
    out.extend(without.iter().skip(JUDGE_TOKENS));
    Ok(out)
}

/// The calibration tokens for a runner of context `ctx`.
fn calibration_tokens(tok: &Tokenizer, ctx: usize, n: usize) -> Result<Vec<u32>> {
    let mut t = tok.encode(TEXT, true)?;
    t.truncate(n.min(ctx));
    if t.len() < 4 * FIRST {
        bail!(
            "--kv-type auto needs a context of at least {} tokens to measure the cache (this one has {})",
            4 * FIRST,
            ctx
        );
    }
    Ok(t)
}

/// The distributions of the calibration run with `types`.
fn run(runner: &mut Runner, types: &KvTypes, tokens: &[u32]) -> Result<Vec<Vec<f64>>> {
    runner.set_kv_types(types.clone())?;
    let rows = runner.feed(SEQ, tokens, Logits::From(FIRST));
    runner.release(SEQ)?;
    Ok(rows?.iter().map(|r| log_softmax(r)).collect())
}

/// Mean KL divergence of `rows` from the base records, and the change of the mean negative
/// log-likelihood of the tokens that came next.
fn compare(base: &[crate::kld::Record], rows: &[Vec<f64>]) -> (f64, f64) {
    let mut s = crate::kld::Stats::new(0);
    for (r, q) in base.iter().zip(rows) {
        s.add(r, q);
    }
    let m = s.summary();
    (m.kl_mean, m.ln_ratio)
}

/// Bytes a token takes in layer `l`'s K or V cache of type `t`.
fn layer_bytes(heads: usize, dim: usize, t: DType) -> usize {
    t.bytes_for(heads * dim).unwrap_or(usize::MAX / 4)
}

/// The token runs of a calibration: the shorter one each layer's types are measured over,
/// the longer one a whole choice is judged by.
pub struct Calibration {
    pub short: Vec<u32>,
    pub long: Vec<u32>,
}

impl Calibration {
    /// The built-in passage, cut to `TOKENS` and `JUDGE_TOKENS` (at most `ctx`).
    pub fn of_text(tok: &Tokenizer, ctx: usize) -> Result<Calibration> {
        Self::with_lengths(tok, ctx, TOKENS, JUDGE_TOKENS)
    }

    /// The built-in passage cut to `short` and `long` tokens (at most `ctx`).
    pub fn with_lengths(
        tok: &Tokenizer,
        ctx: usize,
        short: usize,
        long: usize,
    ) -> Result<Calibration> {
        Ok(Calibration {
            short: calibration_tokens(tok, ctx, short)?,
            long: calibration_tokens(tok, ctx, long)?,
        })
    }
}

/// Per layer, each side's options smallest first: (type, bytes per token, measured cost).
type Options = [Vec<(DType, usize, f64)>; 2];

/// What [`measure`] found: each layer's options, and the f16 run of the longer passage that
/// whole choices are judged against.
pub struct Costs {
    layers: Vec<usize>,
    options: Vec<Options>,
    base_long: Vec<crate::kld::Record>,
    long: Vec<u32>,
    /// The types of layers not under test: f16, or the side `--kv-type-k`/`-v` pins.
    rest: KvTypes,
}

/// The distributions of `tokens` with `types` as base records.
fn base_of(
    runner: &mut Runner,
    types: &KvTypes,
    tokens: &[u32],
) -> Result<Vec<crate::kld::Record>> {
    let rows = run(runner, types, tokens)?;
    Ok(rows
        .iter()
        .zip(&tokens[FIRST + 1..])
        .map(|(lp, &next)| crate::kld::record(lp, next))
        .collect())
}

/// Runs of [`measure`] and [`search`] together, for progress.
pub fn runs(runner: &Runner, fixed: (Option<DType>, Option<DType>)) -> usize {
    let layers: usize = runner
        .model()
        .kv_groups()
        .iter()
        .map(|g| g.layers.len())
        .sum();
    let per = fixed.0.map_or(K_LADDER.len(), |_| 0) + fixed.1.map_or(V_LADDER.len(), |_| 0);
    2 + layers * per + TRIES + UNIFORM_TRIES
}

/// Each layer's cost for each smaller type (module docs). `fixed` pins a side; `budget` is
/// the one [`search`] will keep to (a type that alone costs half of it is the smallest
/// tried); `progress` is told each run.
pub fn measure(
    runner: &mut Runner,
    cal: &Calibration,
    fixed: (Option<DType>, Option<DType>),
    budget: f64,
    mut progress: impl FnMut(),
) -> Result<Costs> {
    let groups = runner.model().kv_groups().to_vec();
    // (layer, kv heads, K dim, V dim) of every layer with a cache.
    let mut layers: Vec<(usize, usize, usize, usize)> = groups
        .iter()
        .flat_map(|g| {
            g.layers
                .iter()
                .map(move |&l| (l, g.n_kv_heads, g.head_dim, g.v_head_dim))
        })
        .collect();
    layers.sort();
    let rest = KvTypes {
        k: fixed.0.unwrap_or(DType::F16),
        v: fixed.1.unwrap_or(DType::F16),
        layers: Vec::new(),
    };
    // A layer's cost is measured against the others' types (a pinned side stays pinned
    // everywhere); a whole choice is judged against f16.
    let base = base_of(runner, &rest, &cal.short)?;
    progress();
    let base_long = base_of(runner, &KvTypes::uniform(DType::F16), &cal.long)?;
    progress();
    let mut options: Vec<Options> = Vec::new();
    for &(l, heads, dk, dv) in &layers {
        let mut sides: Options = [Vec::new(), Vec::new()];
        for (side, ladder, dim, pin) in [
            (0, &K_LADDER[..], dk, fixed.0),
            (1, &V_LADDER[..], dv, fixed.1),
        ] {
            if let Some(t) = pin {
                sides[side].push((t, layer_bytes(heads, dim, t), 0.0));
                continue;
            }
            // Largest first: a type that alone costs half the budget ends the descent (the
            // smaller ones would cost more still; their runs are skipped).
            let mut tried = Vec::new();
            for &t in ladder.iter().rev() {
                progress();
                if !KvTypes::fits(t, dim) {
                    continue;
                }
                let (k, v) = if side == 0 { (t, rest.v) } else { (rest.k, t) };
                let mut ty = types_of(&BTreeMap::from([(l, (k, v))]));
                ty.k = rest.k;
                ty.v = rest.v;
                let rows = run(runner, &ty, &cal.short)?;
                let (kl, _) = compare(&base, &rows);
                // A NaN (broken output) costs as much as anything can.
                let kl = if kl.is_nan() { f64::MAX } else { kl };
                tried.push((t, layer_bytes(heads, dim, t), kl));
                if kl > budget / 2.0 {
                    break;
                }
            }
            tried.reverse();
            sides[side].extend(tried);
            for t in [DType::Q8_0, DType::F16] {
                if KvTypes::fits(t, dim) {
                    sides[side].push((t, layer_bytes(heads, dim, t), 0.0));
                }
            }
        }
        options.push(sides);
    }
    Ok(Costs {
        layers: layers.iter().map(|l| l.0).collect(),
        options,
        base_long,
        long: cal.long.clone(),
        rest,
    })
}

impl Costs {
    /// Greedy: from the smallest option everywhere, upgrade the one with the best cost saved
    /// per byte until the sum of costs is within `allowed`.
    fn pick(&self, allowed: f64) -> KvTypes {
        let options = &self.options;
        let mut at: Vec<[usize; 2]> = vec![[0, 0]; options.len()];
        let cost = |at: &[[usize; 2]]| -> f64 {
            at.iter()
                .zip(options)
                .map(|(a, o)| o[0][a[0]].2 + o[1][a[1]].2)
                .sum()
        };
        while cost(&at) > allowed {
            let mut best: Option<(f64, usize, usize)> = None;
            for (i, o) in options.iter().enumerate() {
                for side in 0..2 {
                    let j = at[i][side];
                    if j + 1 >= o[side].len() {
                        continue;
                    }
                    let (now, next) = (&o[side][j], &o[side][j + 1]);
                    let gain = (now.2 - next.2) / (next.1.saturating_sub(now.1)).max(1) as f64;
                    if best.is_none_or(|b| gain > b.0) {
                        best = Some((gain, i, side));
                    }
                }
            }
            let Some((_, i, side)) = best else { break };
            at[i][side] += 1;
        }
        let mut m = BTreeMap::new();
        for ((l, a), o) in self.layers.iter().zip(&at).zip(options) {
            m.insert(*l, (o[0][a[0]].0, o[1][a[1]].0));
        }
        let mut t = types_of(&m);
        t.k = self.rest.k;
        t.v = self.rest.v;
        t
    }

    /// The smallest choice of all (every layer at its smallest measured option).
    pub fn smallest(&self) -> KvTypes {
        self.pick(f64::INFINITY)
    }

    /// The types every layer has an option of on side `side` (0 K, 1 V).
    fn side_types(&self, side: usize) -> Vec<DType> {
        let mut out: Vec<DType> = Vec::new();
        for (i, o) in self.options.iter().enumerate() {
            let here: Vec<DType> = o[side].iter().map(|x| x.0).collect();
            if i == 0 {
                out = here;
            } else {
                out.retain(|t| here.contains(t));
            }
        }
        out
    }

    /// The summed measured costs of `types` (infinite where a layer's type was not measured).
    fn predicted(&self, types: &KvTypes) -> f64 {
        self.layers
            .iter()
            .zip(&self.options)
            .map(|(&l, o)| {
                let (k, v) = types.of_layer(l);
                let of = |side: usize, t: DType| {
                    o[side]
                        .iter()
                        .find(|x| x.0 == t)
                        .map_or(f64::INFINITY, |x| x.2)
                };
                of(0, k) + of(1, v)
            })
            .sum()
    }
}

/// KL divergence from f16 and change of ln perplexity of `types` over the longer passage.
pub fn judge(runner: &mut Runner, costs: &Costs, types: &KvTypes) -> Result<(f64, f64)> {
    let rows = run(runner, types, &costs.long)?;
    Ok(compare(&costs.base_long, &rows))
}

/// The smallest choice within `budget`: the sum of costs allowed is searched (by halves of
/// its logarithm) for the largest whose choice, run as a whole over the longer passage,
/// keeps both the change of perplexity and the KL within the budget; f16 (with the pinned
/// side) when no choice does.
pub fn search(
    runner: &mut Runner,
    costs: &Costs,
    budget: f64,
    mut progress: impl FnMut(),
) -> Result<Choice> {
    let mut allowed = budget;
    let mut pass: Option<(f64, KvTypes, f64, f64)> = None;
    let mut fail: Option<f64> = None;
    let mut judged: Vec<(KvTypes, f64, f64)> = Vec::new();
    for _ in 0..TRIES {
        progress();
        let chosen = costs.pick(allowed);
        let (kl, d) = match judged.iter().find(|j| j.0 == chosen) {
            Some(j) => (j.1, j.2),
            None => {
                let (kl, d) = judge(runner, costs, &chosen)?;
                judged.push((chosen.clone(), kl, d));
                (kl, d)
            }
        };
        if kl.max(d) <= budget {
            pass = Some((allowed, chosen, kl, d));
            allowed = fail.map_or(allowed * 4.0, |f| (allowed * f).sqrt());
        } else {
            fail = Some(allowed);
            allowed = pass
                .as_ref()
                .map_or(allowed / 4.0, |p| (allowed * p.0).sqrt());
        }
    }
    let groups = runner.model().kv_groups().to_vec();
    let (mut types, mut kl, mut d) = match pass {
        Some((_, t, kl, d)) => (t, kl, d),
        None => {
            // f16, or the pinned side with f16 beside it: what it costs is still measured.
            let (kl, d) = judge(runner, costs, &costs.rest)?;
            (costs.rest.clone(), kl, d)
        }
    };
    // The same type in every layer can beat the greedy's mix (the per-layer costs are
    // measured over a short run, and do not add exactly): judge the uniform choices smaller
    // than the one found whose summed costs are not hopeless, smallest first.
    let mut uniform: Vec<(usize, KvTypes)> = Vec::new();
    for k in costs.side_types(0) {
        for v in costs.side_types(1) {
            let t = KvTypes {
                k,
                v,
                layers: Vec::new(),
            };
            let bytes = t.bytes_per_token(&groups);
            if bytes < types.bytes_per_token(&groups) && costs.predicted(&t) <= 4.0 * budget {
                uniform.push((bytes, t));
            }
        }
    }
    uniform.sort_by_key(|u| u.0);
    for (_, t) in uniform.into_iter().take(UNIFORM_TRIES) {
        progress();
        let (k2, d2) = judge(runner, costs, &t)?;
        if k2.max(d2) <= budget {
            (types, kl, d) = (t, k2, d2);
            break;
        }
    }
    Ok(Choice {
        bytes_per_token: types.bytes_per_token(&groups),
        f16_bytes_per_token: KvTypes::uniform(DType::F16).bytes_per_token(&groups),
        types,
        kl,
        ppl_change: d.exp() - 1.0,
    })
}

/// [`measure`] then [`search`] over the built-in passage.
pub fn choose(
    runner: &mut Runner,
    tok: &Tokenizer,
    fixed: (Option<DType>, Option<DType>),
    budget: f64,
    mut progress: impl FnMut(usize, usize),
) -> Result<Choice> {
    let cal = Calibration::of_text(tok, runner.config().ctx)?;
    let total = runs(runner, fixed);
    let mut done = 0;
    let costs = measure(runner, &cal, fixed, budget, || {
        done += 1;
        progress(done, total);
    })?;
    search(runner, &costs, budget, || {
        done += 1;
        progress(done.min(total), total);
    })
}

/// The budget `--kv-type auto` keeps to on the calibration text: a 0.75 % change of
/// perplexity (ln 1.0075, the KL too), so that other text lands within 1 % (the passage's
/// 479 scored tokens judge a change to about ±0.2 %).
pub fn default_budget() -> f64 {
    1.0075f64.ln()
}

/// The folder cached choices live in.
fn cache_dir() -> PathBuf {
    crate::models::kiln_home().join("kv-auto")
}

/// The cache file of a model file measured on `backend` with `fixed` sides and `budget`:
/// named by a hash of the file's size, its first and last MiB, and the rest of the key.
pub fn cache_file(
    model: &Path,
    backend: &str,
    fixed: (Option<DType>, Option<DType>),
    budget: f64,
    (ctx, centered, fitted): (usize, bool, bool),
) -> Result<PathBuf> {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(model)
        .with_context(|| format!("opening {} to key its KV choice", model.display()))?;
    let len = f.metadata()?.len();
    let mut h = Sha256::new();
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; 1 << 20];
    for at in [0, len.saturating_sub(1 << 20)] {
        f.seek(SeekFrom::Start(at))?;
        let n = f.by_ref().take(1 << 20).read(&mut buf)?;
        h.update(&buf[..n]);
    }
    h.update(
        format!(
            "{VERSION} {backend} {:?} {:?} {budget:.6} {TOKENS} {JUDGE_TOKENS} {} {centered}{}",
            fixed.0,
            fixed.1,
            // Centered or fitted keys are calibrated for the whole context's positions.
            if centered || fitted {
                ctx
            } else {
                ctx.min(JUDGE_TOKENS)
            },
            if fitted { " fitted" } else { "" }
        )
        .as_bytes(),
    );
    let d = h.finalize();
    let name: String = d[..12].iter().map(|b| format!("{b:02x}")).collect();
    Ok(cache_dir().join(format!("{name}.txt")))
}

/// A cached choice, if the file's first line parses: `K V [LAYERS]` (the K and V types of
/// every layer, then a `--kv-type-layers` value).
pub fn read_cached(path: &Path) -> Option<KvTypes> {
    let s = std::fs::read_to_string(path).ok()?;
    let mut words = s.lines().next()?.split_whitespace();
    let k = KvTypes::parse_type(words.next()?).ok()?;
    let v = KvTypes::parse_type(words.next()?).ok()?;
    let layers = match words.next() {
        Some(w) => KvTypes::parse_layers(w).ok()?,
        None => Vec::new(),
    };
    if words.next().is_some() {
        return None;
    }
    Some(KvTypes { k, v, layers })
}

/// Saves a choice (`K V [LAYERS]`, then the figures as a comment line).
pub fn write_cached(path: &Path, c: &Choice) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let t = &c.types;
    let body = format!("{} {} {}\n# {}\n", t.k, t.v, layers_flag(t), c.describe());
    // Whole or not at all: a write cut short must not read back as another choice.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, body).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_choice_reads_back() {
        let dir = std::env::temp_dir().join(format!("kiln-kv-auto-{}", std::process::id()));
        let path = dir.join("choice.txt");
        let t = types_of(&BTreeMap::from([
            (0, (DType::Q8_0, DType::TQ4)),
            (1, (DType::TQ4, DType::TQ2)),
        ]));
        let c = Choice {
            types: t.clone(),
            kl: 0.001,
            ppl_change: 0.002,
            bytes_per_token: 100,
            f16_bytes_per_token: 300,
        };
        write_cached(&path, &c).unwrap();
        assert_eq!(read_cached(&path), Some(t));
        // The same types in every layer: no layer list.
        let u = KvTypes {
            k: DType::Q8_0,
            v: DType::TQ4,
            layers: Vec::new(),
        };
        write_cached(
            &path,
            &Choice {
                types: u.clone(),
                ..c
            },
        )
        .unwrap();
        assert_eq!(read_cached(&path), Some(u));
        for bad in ["f16 f16 0-1:q9_9\n", "f16\n", "", "f16 f16 0:q8_0 extra\n"] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(read_cached(&path), None, "{bad:?} is not a choice");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn runs_of_layers_merge_and_parse_back() {
        let mut m = BTreeMap::new();
        for l in 0..6 {
            m.insert(l, (DType::TQ4, DType::TQ3));
        }
        m.insert(6, (DType::Q8_0, DType::TQ3));
        m.insert(8, (DType::Q8_0, DType::TQ3));
        m.insert(9, (DType::TQ3, DType::TQ3));
        let t = types_of(&m);
        let flag = layers_flag(&t);
        assert_eq!(flag, "0-5:tq4/tq3,6:q8_0/tq3,8:q8_0/tq3,9:tq3");
        let back = KvTypes::parse_layers(&flag).unwrap();
        for l in 0..10 {
            let want = m.get(&l).copied().unwrap_or((DType::F16, DType::F16));
            let got = KvTypes {
                k: DType::F16,
                v: DType::F16,
                layers: back.clone(),
            }
            .of_layer(l);
            assert_eq!(got, want, "layer {l}");
        }
    }
}
