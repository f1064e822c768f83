//! `kiln perplexity --save-base` / `--compare`: a run's next-token distributions against a
//! saved base run over the same tokens (another backend, cache type or weight format), the
//! way quantization is judged: the change in log-perplexity with its standard error, the KL
//! divergence from the base, and how often the most likely token is the same.
//!
//! The base file keeps, per scored token, the target token's log-probability and the base's
//! `TOP` most likely tokens with theirs (not the whole vocabulary: a full row of a 262k
//! vocabulary is a megabyte). The KL divergence is therefore computed over the base's top
//! tokens plus one bucket for the rest of the vocabulary: merging outcomes can only lower a
//! KL divergence, so the figure is a lower bound of the full one (equal to it where the run's
//! tail is proportional to the base's), the same coarsening for every run compared to one
//! base. llama.cpp's KLD sums the whole vocabulary; the two agree where the tail is small.
//!
//! Layout (little-endian): `KILNKLD1`, then u32 ctx, u32 first scored position of a chunk,
//! u32 chunks, u32 TOP, u32 vocabulary size, u64 FNV-1a hash of the scored chunks' tokens,
//! u64 records; then per record u32 target, f32 its log-probability, and TOP × (u32 token,
//! f32 log-probability), most likely first.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Tokens of the base distribution kept per position.
pub const TOP: usize = 32;
const MAGIC: &[u8; 8] = b"KILNKLD1";
const HEADER: usize = 8 + 5 * 4 + 2 * 8;
/// Bytes of a record: target, its log-probability, TOP × (token, log-probability).
const RECORD: usize = 8 + 8 * TOP;

/// What identifies the scored text: a comparison needs the same chunks of the same tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub ctx: u32,
    pub first: u32,
    pub chunks: u32,
    pub vocab: u32,
    pub hash: u64,
}

impl Shape {
    /// The shape of scoring `chunks` chunks of `ctx` of `tokens` from position `first`.
    pub fn of(tokens: &[u32], ctx: usize, first: usize, chunks: usize, vocab: usize) -> Shape {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &t in &tokens[..(chunks * ctx).min(tokens.len())] {
            for b in t.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Shape {
            ctx: ctx as u32,
            first: first as u32,
            chunks: chunks as u32,
            vocab: vocab as u32,
            hash: h,
        }
    }
}

/// One scored position of the base: the token that came next with its log-probability, and
/// the base's most likely tokens with theirs, most likely first.
pub type Record = kiln_core::sample::TokenLogprobs;

/// The record of a row of log-probabilities and the token that came next.
pub fn record(lp: &[f64], next: u32) -> Record {
    Record::of_logprobs(lp, next, TOP)
}

/// A base file being written.
pub struct BaseWriter {
    path: std::path::PathBuf,
    shape: Shape,
    body: Vec<u8>,
    n: u64,
}

impl BaseWriter {
    pub fn new(path: &Path, shape: Shape) -> BaseWriter {
        BaseWriter {
            path: path.to_path_buf(),
            shape,
            body: Vec::new(),
            n: 0,
        }
    }

    pub fn push(&mut self, r: &Record) {
        self.body.extend_from_slice(&r.token.to_le_bytes());
        self.body.extend_from_slice(&r.logprob.to_le_bytes());
        for k in 0..TOP {
            // Fewer tokens than TOP (a tiny vocabulary): the slot is padded with an
            // impossible token.
            let (t, l) = r
                .top
                .get(k)
                .copied()
                .unwrap_or((u32::MAX, f32::NEG_INFINITY));
            self.body.extend_from_slice(&t.to_le_bytes());
            self.body.extend_from_slice(&l.to_le_bytes());
        }
        self.n += 1;
    }

    /// Writes the file (through a temporary name, so a failed run leaves no half file).
    pub fn finish(self) -> Result<()> {
        let mut out = Vec::with_capacity(HEADER + self.body.len());
        out.extend_from_slice(MAGIC);
        let s = self.shape;
        for v in [s.ctx, s.first, s.chunks, TOP as u32, s.vocab] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&s.hash.to_le_bytes());
        out.extend_from_slice(&self.n.to_le_bytes());
        out.extend_from_slice(&self.body);
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".partial");
        let tmp = std::path::PathBuf::from(tmp);
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(&out)
            .with_context(|| format!("writing {}", tmp.display()))?;
        drop(f);
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.path.display()))?;
        Ok(())
    }
}

/// A saved base: its shape and records.
#[derive(Debug)]
pub struct Base {
    pub shape: Shape,
    pub records: Vec<Record>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Base {
    pub fn read(path: &Path) -> Result<Base> {
        let what = || format!("{} is not a usable base file", path.display());
        let mut f =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // The header says how long the file must be: nothing more is read than that.
        let mut b = vec![0u8; HEADER];
        f.read_exact(&mut b)
            .map_err(|_| anyhow::anyhow!("shorter than a header"))
            .with_context(what)?;
        let want = Base::file_len(&b).with_context(what)?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len != want {
            bail!(
                "{}: its header says {want} bytes, the file has {len}",
                what()
            );
        }
        f.read_to_end(&mut b)
            .with_context(|| format!("reading {}", path.display()))?;
        Base::parse(&b).with_context(what)
    }

    /// The length a file with this header has (the header checked).
    fn file_len(b: &[u8]) -> Result<u64> {
        if b.len() < HEADER || &b[..8] != MAGIC {
            bail!("no KILNKLD1 header (write one with `kiln perplexity --save-base FILE`)");
        }
        let top = u32_at(b, 20);
        if top as usize != TOP {
            bail!("it keeps {top} tokens a position; this kiln reads {TOP}");
        }
        let n = u64::from_le_bytes(b[36..44].try_into()?);
        n.checked_mul(RECORD as u64)
            .and_then(|x| x.checked_add(HEADER as u64))
            .ok_or_else(|| anyhow::anyhow!("it says {n} positions, more than any file holds"))
    }

    /// Parses a base file's bytes; every count is checked against the length first.
    pub fn parse(b: &[u8]) -> Result<Base> {
        let want = Base::file_len(b)?;
        if want != b.len() as u64 {
            bail!("its header says {want} bytes, it has {}", b.len());
        }
        let f = |i: usize| u32_at(b, 8 + 4 * i);
        let (ctx, first, chunks, vocab) = (f(0), f(1), f(2), f(4));
        let hash = u64::from_le_bytes(b[28..36].try_into()?);
        let mut records = Vec::with_capacity(b.len() / RECORD);
        for (i, r) in b[HEADER..].chunks_exact(RECORD).enumerate() {
            let target = u32_at(r, 0);
            let logprob = f32::from_le_bytes([r[4], r[5], r[6], r[7]]);
            if target >= vocab {
                bail!("position {i}: a target token {target} outside its vocabulary of {vocab}");
            }
            // A log-probability is at most 0 (f32 rounding aside) and never NaN.
            let lp_ok = |l: f32| l <= 1e-4;
            if !lp_ok(logprob) {
                bail!("position {i}: the target's log-probability is {logprob}");
            }
            let mut top: Vec<(u32, f32)> = Vec::with_capacity(TOP);
            for k in 0..TOP {
                let t = u32_at(r, 8 + 8 * k);
                let l = f32::from_le_bytes([
                    r[12 + 8 * k],
                    r[13 + 8 * k],
                    r[14 + 8 * k],
                    r[15 + 8 * k],
                ]);
                if t == u32::MAX {
                    // Padding runs to the end of the record.
                    if (k..TOP).any(|j| u32_at(r, 8 + 8 * j) != u32::MAX) {
                        bail!("position {i}: a token after the padding");
                    }
                    break;
                }
                if t >= vocab {
                    bail!("position {i}: a top token {t} outside its vocabulary of {vocab}");
                }
                if !lp_ok(l)
                    || top.last().is_some_and(|&(_, p)| l > p)
                    || top.iter().any(|&(u, _)| u == t)
                {
                    bail!("position {i}: its top tokens are not distinct log-probabilities, most likely first");
                }
                top.push((t, l));
            }
            if top.is_empty() {
                bail!("position {i}: no tokens");
            }
            if top.iter().map(|&(_, l)| (l as f64).exp()).sum::<f64>() > 1.001 {
                bail!("position {i}: its top tokens' probabilities sum past 1");
            }
            records.push(Record {
                token: target,
                logprob,
                top,
            });
        }
        Ok(Base {
            shape: Shape {
                ctx,
                first,
                chunks,
                vocab,
                hash,
            },
            records,
        })
    }
}

/// Running sums of a comparison.
#[derive(Default, Debug)]
pub struct Stats {
    /// Scored positions per chunk (0: one chunk).
    per_chunk: usize,
    /// Σ of the change per chunk.
    chunk_d: Vec<f64>,
    n: usize,
    /// Σ and Σ² of the per-token change of the target's negative log-likelihood.
    d: f64,
    d2: f64,
    nll_base: f64,
    nll: f64,
    kl: f64,
    kl2: f64,
    kls: Vec<f64>,
    same_top: usize,
}

/// The coarsened KL divergence of `q` (a run's log-probabilities) from the base `r`: over
/// the base's top tokens and the rest of the vocabulary as one outcome.
pub fn kl_top(r: &Record, q: &[f64]) -> f64 {
    let (mut kl, mut pm, mut qm) = (0f64, 0f64, 0f64);
    for &(t, lp) in &r.top {
        let (lp, lq) = (
            lp as f64,
            q.get(t as usize).copied().unwrap_or(f64::NEG_INFINITY),
        );
        let p = lp.exp();
        pm += p;
        qm += lq.exp();
        if p > 0.0 {
            kl += p * (lp - lq);
        }
    }
    // Rounding can take the sums a hair past 1; a NaN stays NaN (`f64::max` would drop it).
    let clamp = |x: f64| if x < 0.0 { 0.0 } else { x };
    let (pr, qr) = (clamp(1.0 - pm), clamp(1.0 - qm));
    if pr > 1e-12 {
        kl += pr * (pr.ln() - qr.max(1e-300).ln());
    }
    clamp(kl)
}

impl Stats {
    /// A comparison of chunks of `per_chunk` scored positions each.
    pub fn new(per_chunk: usize) -> Stats {
        Stats {
            per_chunk,
            ..Stats::default()
        }
    }

    /// Adds a position: the base's record and this run's log-probabilities.
    pub fn add(&mut self, r: &Record, q: &[f64]) {
        let nll = -q
            .get(r.token as usize)
            .copied()
            .unwrap_or(f64::NEG_INFINITY);
        let nb = -(r.logprob as f64);
        let d = nll - nb;
        let c = self.n.checked_div(self.per_chunk).unwrap_or(0);
        if self.chunk_d.len() <= c {
            self.chunk_d.resize(c + 1, 0.0);
        }
        self.chunk_d[c] += d;
        self.n += 1;
        self.d += d;
        self.d2 += d * d;
        self.nll += nll;
        self.nll_base += nb;
        let kl = kl_top(r, q);
        self.kl += kl;
        self.kl2 += kl * kl;
        self.kls.push(kl);
        // This run's most likely token (lowest id on ties, as the base's order has it).
        let mut best = 0usize;
        for (i, &x) in q.iter().enumerate() {
            if x > q[best] {
                best = i;
            }
        }
        if r.top.first().map(|t| t.0 as usize) == Some(best) {
            self.same_top += 1;
        }
    }

    /// The figures of the positions added so far.
    pub fn summary(&self) -> Summary {
        let n = self.n.max(1) as f64;
        // One position has no spread to estimate: its standard errors are NaN.
        let one = if self.n < 2 { f64::NAN } else { 1.0 };
        let se = |s: f64, s2: f64| {
            let m = s / n;
            let var = (s2 / n - m * m).max(0.0) * n / (n - 1.0).max(1.0);
            (m, one * (var / n).sqrt())
        };
        let (ln_ratio, ln_ratio_se) = se(self.d, self.d2);
        let (kl_mean, kl_se) = se(self.kl, self.kl2);
        let mut kls = self.kls.clone();
        kls.sort_by(f64::total_cmp);
        let same_top = self.same_top as f64 / n;
        // The chunks' mean changes as the samples: positions of a chunk share its cache, so
        // a difference early in a chunk carries on through it. (A last chunk shorter than the
        // others counts as much as they do; `perplexity_with` scores whole chunks.)
        let ln_ratio_se_chunks = (self.per_chunk > 0 && self.chunk_d.len() >= 2).then(|| {
            let means: Vec<f64> = self
                .chunk_d
                .iter()
                .enumerate()
                .map(|(c, s)| s / (self.n - c * self.per_chunk).min(self.per_chunk) as f64)
                .collect();
            let k = means.len() as f64;
            let m = means.iter().sum::<f64>() / k;
            let var = means.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (k - 1.0);
            (var / k).sqrt()
        });
        Summary {
            n: self.n,
            ppl_base: (self.nll_base / n).exp(),
            ppl: (self.nll / n).exp(),
            ln_ratio,
            ln_ratio_se,
            ln_ratio_se_chunks,
            kl_mean,
            kl_se,
            kl_median: percentile(&kls, 0.5),
            kl_p99: percentile(&kls, 0.99),
            kl_max: kls.last().copied().unwrap_or(0.0),
            same_top,
            same_top_se: one * (same_top * (1.0 - same_top) / n).sqrt(),
            chunks: self.chunk_d.len(),
        }
    }
}

/// The value at fraction `p` of the way through `sorted` (nearest rank; 0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let last = sorted.len().saturating_sub(1);
    sorted
        .get(((last as f64) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

/// A comparison's figures. Standard errors by position treat positions as independent (as
/// llama.cpp's do); positions of one chunk are not, so read those as a lower bound.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub ppl_base: f64,
    pub ppl: f64,
    /// Mean change of the target's negative log-likelihood: ln(ppl / ppl base).
    pub ln_ratio: f64,
    pub ln_ratio_se: f64,
    /// The same from the chunks' means (two chunks or more): positions of a chunk are not
    /// independent, so this is the more honest of the two where chunks are many.
    pub ln_ratio_se_chunks: Option<f64>,
    /// Chunks behind `ln_ratio_se_chunks` (few chunks: the estimate is itself rough).
    pub chunks: usize,
    pub kl_mean: f64,
    pub kl_se: f64,
    pub kl_median: f64,
    pub kl_p99: f64,
    pub kl_max: f64,
    /// Share of positions whose most likely token is the base's.
    pub same_top: f64,
    pub same_top_se: f64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.ln_ratio.exp();
        writeln!(f, "positions compared: {}", self.n)?;
        writeln!(f, "ppl base = {:.4}, ppl = {:.4}", self.ppl_base, self.ppl)?;
        write!(
            f,
            "ln(ppl / ppl base) = {:+.5} ± {:.5} by position (ppl {:+.3} % ± {:.3} %)",
            self.ln_ratio,
            self.ln_ratio_se,
            100.0 * (r - 1.0),
            100.0 * r * self.ln_ratio_se
        )?;
        match self.ln_ratio_se_chunks {
            Some(se) => writeln!(
                f,
                ", ± {se:.5} by chunk (± {:.3} %, {} chunks)",
                100.0 * r * se,
                self.chunks
            )?,
            None => writeln!(f)?,
        }
        writeln!(
            f,
            "KL divergence from base (its top {TOP} + the rest as one, a lower bound): mean {:.6} ± {:.6} by position, median {:.6}, 99 % {:.6}, max {:.6}",
            self.kl_mean, self.kl_se, self.kl_median, self.kl_p99, self.kl_max
        )?;
        write!(
            f,
            "same most likely token: {:.3} % ± {:.3} % by position",
            100.0 * self.same_top,
            100.0 * self.same_top_se
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsm(v: &[f64]) -> Vec<f64> {
        let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let l = v.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m;
        v.iter().map(|x| x - l).collect()
    }

    fn rows(seed: u64, n: usize, vocab: usize) -> Vec<Vec<f64>> {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| lsm(&(0..vocab).map(|_| 6.0 * next()).collect::<Vec<_>>()))
            .collect()
    }

    #[test]
    fn records_round_trip_and_keep_the_most_likely() {
        let rs = rows(7, 5, 300);
        let shape = Shape::of(&[1, 2, 3, 4], 2, 1, 2, 300);
        let path = std::env::temp_dir().join(format!("kiln-kld-{}.bin", std::process::id()));
        let mut w = BaseWriter::new(&path, shape);
        let recs: Vec<Record> = rs
            .iter()
            .enumerate()
            .map(|(i, r)| record(r, (i * 37) as u32))
            .collect();
        for r in &recs {
            w.push(r);
        }
        w.finish().unwrap();
        let b = Base::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(b.shape, shape);
        assert_eq!(b.records, recs);
        for (r, row) in recs.iter().zip(&rs) {
            let mut sorted = row.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(r.top.len(), TOP);
            for (k, &(t, l)) in r.top.iter().enumerate() {
                assert_eq!(l, sorted[k] as f32);
                assert_eq!(row[t as usize] as f32, l);
            }
        }
    }

    /// Σ p ln(p/q) over explicit probabilities.
    fn kl_of(p: &[f64], q: &[f64]) -> f64 {
        p.iter().zip(q).map(|(a, b)| a * (a / b).ln()).sum()
    }

    #[test]
    fn kl_over_the_top_tokens_and_the_rest() {
        // Base: tokens 0 and 1 kept (0.5, 0.3), the rest 0.2 spread over tokens 2 and 3.
        let r = Record {
            token: 0,
            logprob: 0.5f32.ln(),
            top: vec![(0, 0.5f32.ln()), (1, 0.3f32.ln())],
        };
        // The probabilities the record's f32 log-probabilities stand for.
        let p = [(0.5f32.ln() as f64).exp(), (0.3f32.ln() as f64).exp()];
        let rest = 1.0 - p[0] - p[1];
        // A run whose tail is not proportional: the coarsened KL is three outcomes' KL.
        let q = [0.4, 0.35, 0.2, 0.05];
        let lq: Vec<f64> = q.iter().map(|x: &f64| x.ln()).collect();
        let want = kl_of(&[p[0], p[1], rest], &[0.4, 0.35, 0.25]);
        assert!(
            (kl_top(&r, &lq) - want).abs() < 1e-12,
            "{} vs {want}",
            kl_top(&r, &lq)
        );
        // A tail proportional to the base's (0.15 : 0.05 both): it equals the full KL.
        let pf = [p[0], p[1], rest * 0.75, rest * 0.25];
        let q = [0.45, 0.35, 0.2 * 0.75, 0.2 * 0.25];
        let lq: Vec<f64> = q.iter().map(|x: &f64| x.ln()).collect();
        assert!((kl_top(&r, &lq) - kl_of(&pf, &q)).abs() < 1e-12);
        // A run of NaN (a broken backend) shows NaN, not a perfect 0.
        assert!(kl_top(&r, &[f64::NAN; 4]).is_nan());
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (0..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn kl_is_zero_against_itself_and_bounded_by_the_full_kl() {
        let rs = rows(11, 20, 200);
        let qs = rows(12, 20, 200);
        for (p, q) in rs.iter().zip(&qs) {
            let r = record(p, 3);
            assert!(kl_top(&r, p) < 1e-6, "{}", kl_top(&r, p));
            // A perturbed row: the coarsened KL is positive and at most the full one.
            let mixed = lsm(&p
                .iter()
                .zip(q)
                .map(|(a, b)| a + 0.3 * b)
                .collect::<Vec<_>>());
            let full: f64 = p.iter().zip(&mixed).map(|(a, b)| a.exp() * (a - b)).sum();
            let top = kl_top(&r, &mixed);
            assert!(top > 0.0 && top <= full + 1e-9, "top {top} full {full}");
        }
    }

    #[test]
    fn stats_of_a_run_against_itself_show_no_change() {
        let rs = rows(3, 50, 100);
        let mut st = Stats::default();
        for (i, p) in rs.iter().enumerate() {
            st.add(&record(p, (i % 100) as u32), p);
        }
        let s = st.summary();
        assert_eq!(s.n, 50);
        assert_eq!(s.same_top, 1.0);
        // The base keeps f32 log-probabilities: a run against itself differs by their rounding.
        assert!(s.ln_ratio.abs() < 1e-6 && s.kl_max < 1e-6, "{s}");
        assert!((s.ppl / s.ppl_base - 1.0).abs() < 1e-6, "{s}");
    }

    #[test]
    fn stats_of_a_changed_run_match_its_perplexities() {
        let ps = rows(21, 400, 64);
        let noise = rows(22, 400, 64);
        let mut st = Stats::new(100);
        let (mut nb, mut nq, mut same) = (0f64, 0f64, 0usize);
        for (i, (p, e)) in ps.iter().zip(&noise).enumerate() {
            let q = lsm(&p
                .iter()
                .zip(e)
                .map(|(a, b)| a + 0.8 * b)
                .collect::<Vec<_>>());
            let t = (i * 7 % 64) as u32;
            nb -= p[t as usize] as f32 as f64;
            nq -= q[t as usize];
            let arg = |v: &[f64]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b });
            same += (arg(p) == arg(&q)) as usize;
            st.add(&record(p, t), &q);
        }
        let s = st.summary();
        let n = ps.len() as f64;
        assert!(
            (s.ppl_base - (nb / n).exp()).abs() < 1e-9 * s.ppl_base,
            "{s}"
        );
        assert!((s.ppl - (nq / n).exp()).abs() < 1e-9 * s.ppl, "{s}");
        assert!((s.ln_ratio - (s.ppl / s.ppl_base).ln()).abs() < 1e-9, "{s}");
        assert_eq!(s.same_top, same as f64 / n);
        assert!(
            same < ps.len() && s.kl_mean > 0.0 && s.kl_se > 0.0 && s.ln_ratio_se > 0.0,
            "{s}"
        );
        assert!(s.kl_median <= s.kl_p99 && s.kl_p99 <= s.kl_max, "{s}");
        // Four chunks of 100: the spread of their mean changes, recomputed here.
        let d: Vec<f64> = ps
            .iter()
            .zip(&noise)
            .enumerate()
            .map(|(i, (p, e))| {
                let q = lsm(&p
                    .iter()
                    .zip(e)
                    .map(|(a, b)| a + 0.8 * b)
                    .collect::<Vec<_>>());
                let t = i * 7 % 64;
                p[t] as f32 as f64 - q[t]
            })
            .collect();
        let means: Vec<f64> = d
            .chunks(100)
            .map(|c| c.iter().sum::<f64>() / 100.0)
            .collect();
        let m = means.iter().sum::<f64>() / 4.0;
        let sd = (means.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 3.0).sqrt();
        let se = s.ln_ratio_se_chunks.expect("four chunks");
        assert!((se - sd / 2.0).abs() < 1e-9, "{se} vs {}", sd / 2.0);
    }

    #[test]
    fn bad_files_are_errors_not_panics() {
        let shape = Shape::of(&[5; 8], 4, 2, 2, 50);
        let path = std::env::temp_dir().join(format!("kiln-kld-bad-{}.bin", std::process::id()));
        let mut w = BaseWriter::new(&path, shape);
        w.push(&record(&rows(1, 1, 50)[0], 9));
        w.finish().unwrap();
        let good = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(Base::parse(&good).is_ok());
        for cut in [0, 7, 20, HEADER, good.len() - 1] {
            assert!(Base::parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = good.clone();
        bad[HEADER] = 200; // target 200 in a vocabulary of 50
        assert!(Base::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[36] = 9; // more records than bytes
        assert!(Base::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(Base::parse(&bad).is_err());
        // Record contents: a top token's bytes at 8 + 8k, its log-probability at 12 + 8k.
        let at = |k: usize| HEADER + 8 + 8 * k;
        let cases: [(&str, Box<dyn Fn(&mut Vec<u8>)>); 5] = [
            (
                "second token = first",
                Box::new(move |b| b.copy_within(at(0)..at(0) + 4, at(1))),
            ),
            (
                "order",
                Box::new(move |b| b[at(1) + 4..at(1) + 8].copy_from_slice(&0.0f32.to_le_bytes())),
            ),
            (
                "positive log-prob",
                Box::new(move |b| b[at(0) + 4..at(0) + 8].copy_from_slice(&0.5f32.to_le_bytes())),
            ),
            (
                "NaN target log-prob",
                Box::new(|b| b[HEADER + 4..HEADER + 8].copy_from_slice(&f32::NAN.to_le_bytes())),
            ),
            (
                "token after padding",
                Box::new(move |b| b[at(3)..at(3) + 4].copy_from_slice(&u32::MAX.to_le_bytes())),
            ),
        ];
        for (what, f) in cases {
            let mut bad = good.clone();
            f(&mut bad);
            assert!(Base::parse(&bad).is_err(), "{what}");
        }
    }
}
