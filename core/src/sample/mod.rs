//! Sampling: penalties, top-k, top-p, min-p, temperature and a seeded draw, in llama.cpp's
//! default order (penalties → top-k → top-p → min-p → temperature → draw). Temperature 0 is
//! greedy.

pub mod diffusion;
mod stop;

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::rng::Rng;
pub use stop::StopMatcher;

/// What a request asks of the sampler. Defaults: greedy off (temperature 0.8), top-k 40,
/// top-p 0.95, min-p 0.05, no penalties — llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below) picks the most likely token.
    pub temperature: f32,
    /// 0 turns top-k off.
    pub top_k: usize,
    /// 1 turns top-p off.
    pub top_p: f32,
    /// 0 turns min-p off.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the last
    /// `penalty_last_n`; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token seen (OpenAI's presence penalty).
    pub presence_penalty: f32,
    /// Subtracted per occurrence (OpenAI's frequency penalty).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at (0: all).
    pub penalty_last_n: usize,
    /// Seed of the draw; `None` seeds from the clock.
    pub seed: Option<u64>,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`; −100 bans a
    /// token, +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
    /// Rejects values no sampler can honour, naming the parameter.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f32| {
            Err(Error::Model(format!(
                "sampling: {what} = {v} is out of range"
            )))
        };
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", self.repetition_penalty);
        }
        if !self.presence_penalty.is_finite() || self.presence_penalty.abs() > 2.0 {
            return bad("presence_penalty", self.presence_penalty);
        }
        if !self.frequency_penalty.is_finite() || self.frequency_penalty.abs() > 2.0 {
            return bad("frequency_penalty", self.frequency_penalty);
        }
        if let Some(&(_, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !b.is_finite() || b.abs() > 100.0)
        {
            return bad("logit_bias", b);
        }
        Ok(())
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(|| {
            crate::time::SystemTime::now()
                .duration_since(crate::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5EED)
        });
        Ok(Sampler {
            rng: Rng::new(seed),
            params,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` given the tokens so far (`history`: prompt and
    /// output, for the penalties). `logits` is modified.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let d = self.distribution(logits, history);
        self.draw(&d)
    }

    /// The distribution [`Sampler::sample`] draws from: penalties, top-k, top-p, min-p and
    /// temperature applied to `logits` (which are modified). Greedy is the argmax alone.
    pub fn distribution(&self, logits: &mut [f32], history: &[u32]) -> Dist {
        for &(t, b) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        self.apply_penalties(logits, history);
        // Below the floor, logit / temperature overflows and the draw is the argmax anyway
        // (which passes over NaN).
        if self.params.temperature < GREEDY_BELOW {
            return Dist::point(argmax(logits));
        }
        // A NaN logit (a broken model or kernel) is never chosen.
        for l in logits.iter_mut().filter(|l| l.is_nan()) {
            *l = f32::NEG_INFINITY;
        }
        // Candidates sorted by logit, best first.
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let k = if self.params.top_k == 0 {
            cand.len()
        } else {
            self.params.top_k.min(cand.len())
        };
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            cand.truncate(k);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        // top-p over the softmax of what is left.
        let probs = softmax(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
        if self.params.top_p < 1.0 {
            let mut acc = 0f32;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        // min-p: drop tokens below min_p × the best probability (relative to the best logit).
        if self.params.min_p > 0.0 && !cand.is_empty() {
            let cut = cand[0].1 + self.params.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= cut).count();
            cand.truncate(keep.max(1));
        }
        // Scaled relative to the best logit, so nothing overflows to +inf.
        let t = self.params.temperature;
        let top = cand.first().map_or(0.0, |c| c.1);
        let scaled: Vec<f32> = cand
            .iter()
            .map(|c| if c.1 == top { 0.0 } else { (c.1 - top) / t })
            .collect();
        let probs = softmax(&scaled);
        Dist {
            tokens: cand.iter().map(|c| c.0).collect(),
            probs,
            greedy: false,
        }
    }

    /// A token drawn from `d` (one uniform number, unless `d` is greedy).
    pub fn draw(&mut self, d: &Dist) -> u32 {
        if d.greedy {
            return d.tokens.first().copied().unwrap_or(0);
        }
        let r = self.rng.f64() as f32;
        let mut acc = 0f32;
        for (&t, &p) in d.tokens.iter().zip(&d.probs) {
            acc += p;
            if r < acc {
                return t;
            }
        }
        d.tokens.last().copied().unwrap_or(0)
    }

    /// A uniform number in [0, 1) from the request's generator (speculative acceptance).
    pub fn uniform(&mut self) -> f64 {
        self.rng.f64()
    }

    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let window = if p.penalty_last_n == 0 {
            history.len()
        } else {
            p.penalty_last_n.min(history.len())
        };
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &history[history.len() - window..] {
            *counts.entry(t).or_insert(0) += 1;
        }
        for (&tok, &n) in &counts {
            let Some(l) = logits.get_mut(tok as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repetition_penalty;
            } else {
                *l *= p.repetition_penalty;
            }
            *l -= p.presence_penalty + p.frequency_penalty * n as f32;
        }
    }
}

/// Temperatures below this sample greedily (vLLM's floor): `logit / t` would overflow and
/// the softmax would put all its mass on the argmax anyway.
pub const GREEDY_BELOW: f32 = 1e-5;

/// A sampling distribution over a few tokens (those top-k, top-p and min-p left), most
/// likely first; `greedy` when it is the argmax alone, drawn without randomness.
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    pub tokens: Vec<u32>,
    pub probs: Vec<f32>,
    pub greedy: bool,
}

impl Dist {
    /// All the mass on `t`, drawn without randomness.
    pub fn point(t: u32) -> Dist {
        Dist {
            tokens: vec![t],
            probs: vec![1.0],
            greedy: true,
        }
    }
    /// The probability of `t` (0 outside the support).
    pub fn prob(&self, t: u32) -> f32 {
        self.tokens
            .iter()
            .position(|&x| x == t)
            .map_or(0.0, |i| self.probs[i])
    }
}

/// The first index of the largest value (NaN never wins; 0 when every value is NaN).
pub fn argmax(v: &[f32]) -> u32 {
    // The largest value, 16 lanes at a time (a comparison with NaN is false, so NaN never
    // wins; a vocabulary of 262 144 logits a row per decode step), then its first position.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = v.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            if x > *l {
                *l = x;
            }
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(rest) {
        if x > m {
            m = x;
        }
    }
    // Nothing above −∞: the first value that is not NaN, as a plain scan would keep.
    v.iter()
        .position(|&x| x == m)
        .or_else(|| v.iter().position(|x| !x.is_nan()))
        .map_or(0, |i| i as u32)
}

/// Softmax in f32 (max-subtracted), for any input: NaN counts as −∞; with +∞ present the
/// mass is shared by the +∞ entries; with nothing above −∞, it is uniform. The result is
/// always a distribution (no NaN).
pub fn softmax(v: &[f32]) -> Vec<f32> {
    let clean = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    let m = v
        .iter()
        .map(|&x| clean(x))
        .fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = if m == f32::INFINITY {
        v.iter()
            .map(|&x| (x == f32::INFINITY) as u32 as f32)
            .collect()
    } else if m == f32::NEG_INFINITY {
        vec![1.0; v.len()]
    } else {
        v.iter().map(|&x| (clean(x) - m).exp()).collect()
    };
    let s: f32 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Log-softmax in f64 of one row (for log-probabilities and perplexity).
pub fn log_softmax(v: &[f32]) -> Vec<f64> {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    v.iter().map(|&x| x as f64 - lse).collect()
}

/// Most alternatives a request may ask log-probabilities of (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A sampled token's log-probability under the model, with the most likely alternatives.
/// These are the log-softmax of the raw logits, before penalties, top-k/p and temperature
/// (what OpenAI's and vLLM's APIs report).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, most likely first (ties by lower id).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// `token`'s log-probability in `logits` and the `n` most likely tokens.
    pub fn of(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = logits
            .iter()
            .map(|&x| (x as f64 - m).exp())
            .sum::<f64>()
            .ln()
            + m;
        let lp = |t: u32| {
            logits
                .get(t as usize)
                .map_or(f32::NEG_INFINITY, |&x| (x as f64 - lse) as f32)
        };
        let order = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        TokenLogprobs {
            token,
            logprob: lp(token),
            top: top_ids(logits.len(), n, order)
                .into_iter()
                .map(|t| (t, lp(t)))
                .collect(),
        }
    }

    /// The same from a row that is already log-probabilities (`log_softmax`'s).
    pub fn of_logprobs(lp: &[f64], token: u32, n: usize) -> TokenLogprobs {
        let order = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
        TokenLogprobs {
            token,
            logprob: lp
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&x| x as f32),
            top: top_ids(lp.len(), n, order)
                .into_iter()
                .map(|t| (t, lp[t as usize] as f32))
                .collect(),
        }
    }
}

/// The first `n` of ids `0..len` in `order`, in order.
fn top_ids(len: usize, n: usize, order: impl Fn(&u32, &u32) -> std::cmp::Ordering) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..len as u32).collect();
    let n = n.min(idx.len());
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, &order);
    }
    idx.truncate(n);
    idx.sort_by(&order);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(seed: u64, n: usize) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| r.normal() * 3.0).collect()
    }

    #[test]
    fn token_logprobs_match_a_naive_f64_log_softmax() {
        let l = logits(7, 3000);
        // Naive: log(exp(x_i) / sum exp(x_j)) in f64 without the max shift.
        let sum: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        let naive: Vec<f64> = l.iter().map(|&x| ((x as f64).exp() / sum).ln()).collect();
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| naive[b].total_cmp(&naive[a]));
        let got = TokenLogprobs::of(&l, 1234, 5);
        assert_eq!(got.token, 1234);
        assert!((got.logprob as f64 - naive[1234]).abs() < 1e-5);
        assert_eq!(got.top.len(), 5);
        for ((t, lp), want) in got.top.iter().zip(&order) {
            assert_eq!(*t as usize, *want);
            assert!((*lp as f64 - naive[*want]).abs() < 1e-5);
        }
        assert!(TokenLogprobs::of(&l, 3, 0).top.is_empty());
        assert_eq!(TokenLogprobs::of(&l[..3], 0, 9).top.len(), 3);
    }

    /// Extreme logits and parameters never give NaN probabilities or the least likely token.
    #[test]
    fn extreme_logits_and_temperatures_sample_sensibly() {
        let base = logits(5, 300);
        let best = argmax(&base) as usize;
        let worst = base
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |x| x.0);
        // Tiny positive temperatures (logit / t overflows past the floor) are greedy.
        for t in [1e-30f32, 1e-12, 1e-6, GREEDY_BELOW * 0.999] {
            for seed in 0..20 {
                let p = SamplingParams {
                    temperature: t,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    seed: Some(seed),
                    ..SamplingParams::default()
                };
                let got = Sampler::new(p).unwrap().sample(&mut base.clone(), &[]);
                assert_eq!(got as usize, best, "temperature {t}");
            }
        }
        // Just above the floor, with logits near f32::MAX: still a valid, likely token.
        let mut huge = base.iter().map(|x| x * 1e37).collect::<Vec<_>>();
        let p = SamplingParams {
            temperature: GREEDY_BELOW * 2.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(3),
            ..SamplingParams::default()
        };
        let got = Sampler::new(p.clone()).unwrap().sample(&mut huge, &[]);
        assert_ne!(got as usize, worst);
        assert_eq!(got as usize, best);
        // +inf, -inf and NaN among the logits.
        let mut odd = base.clone();
        odd[17] = f32::INFINITY;
        odd[3] = f32::NAN;
        odd[4] = f32::NEG_INFINITY;
        for temperature in [0.0, 0.7, 100.0] {
            let p = SamplingParams {
                temperature,
                seed: Some(9),
                ..SamplingParams::default()
            };
            assert_eq!(Sampler::new(p).unwrap().sample(&mut odd.clone(), &[]), 17);
        }
        // Every logit NaN or -inf: some token, not a panic.
        let mut none = vec![f32::NAN; 8];
        none[5] = f32::NEG_INFINITY;
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(1),
            ..SamplingParams::default()
        };
        assert!(Sampler::new(p).unwrap().sample(&mut none, &[]) < 8);
        for v in [
            &odd[..],
            &none[..],
            &huge[..],
            &[f32::INFINITY, f32::INFINITY][..],
        ] {
            let probs = softmax(v);
            assert!(
                probs.iter().all(|p| p.is_finite() && *p >= 0.0),
                "{probs:?}"
            );
            assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0, f32::NAN]), 2);
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens() {
        let l = logits(4, 200);
        let best = argmax(&l);
        let worst = l
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |x| x.0 as u32);
        let greedy = |bias: Vec<(u32, f32)>| {
            let p = SamplingParams {
                logit_bias: bias,
                ..SamplingParams::greedy()
            };
            Sampler::new(p).unwrap().sample(&mut l.clone(), &[])
        };
        assert_ne!(greedy(vec![(best, -100.0)]), best);
        assert_eq!(greedy(vec![(worst, 100.0)]), worst);
        // Out of the vocabulary: no effect, no panic.
        assert_eq!(greedy(vec![(10_000, 100.0)]), best);
        let p = SamplingParams {
            logit_bias: vec![(1, 101.0)],
            ..SamplingParams::greedy()
        };
        assert!(p.validate().is_err());
    }

    /// `argmax` against a plain scan (the first largest value that is not NaN; the first
    /// non-NaN when nothing exceeds −∞; 0 for all NaN) on random rows with repeats, NaN and
    /// infinities, of lengths around its 16-lane chunks.
    #[test]
    fn argmax_is_the_first_largest_value_that_is_not_nan() {
        let plain = |v: &[f32]| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &x) in v.iter().enumerate() {
                if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
                    best = Some((i, x));
                }
            }
            best.map_or(0, |(i, _)| i as u32)
        };
        let mut r = Rng::new(7);
        for n in [0, 1, 5, 15, 16, 17, 33, 100, 1000] {
            for case in 0..40 {
                let v: Vec<f32> = (0..n)
                    .map(|_| match (r.next_u64() % 16, case % 4) {
                        (0, _) => f32::NAN,
                        (1, 1) => f32::INFINITY,
                        (_, 2) => f32::NEG_INFINITY,
                        (_, 3) => (r.next_u64() % 4) as f32,
                        _ => r.normal(),
                    })
                    .collect();
                assert_eq!(argmax(&v), plain(&v), "{v:?}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
    }

    #[test]
    fn greedy_picks_the_argmax() {
        let l = logits(1, 1000);
        let best = l
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|x| x.0 as u32);
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(Some(s.sample(&mut l.clone(), &[])), best);
    }

    #[test]
    fn a_seed_makes_runs_reproducible_and_different_seeds_differ() {
        let l = logits(2, 500);
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: Some(seed),
                ..Default::default()
            })
            .unwrap();
            (0..50)
                .map(|_| s.sample(&mut l.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_limits_the_choice() {
        let l = logits(3, 300);
        let greedy = argmax(&l);
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: Some(1),
            ..Default::default()
        })
        .unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&mut l.clone(), &[]), greedy);
        }
        let mut top5: Vec<u32> = (0..300).collect();
        top5.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        top5.truncate(5);
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(2),
            ..Default::default()
        })
        .unwrap();
        for _ in 0..200 {
            assert!(top5.contains(&s.sample(&mut l.clone(), &[])));
        }
    }

    #[test]
    fn top_p_and_min_p_drop_the_tail() {
        // Two dominant tokens and a long tail.
        let mut l = vec![-10.0f32; 100];
        l[3] = 5.0;
        l[7] = 4.5;
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
            seed: Some(3),
            ..Default::default()
        })
        .unwrap();
        for _ in 0..300 {
            let t = s.sample(&mut l.clone(), &[]);
            assert!(t == 3 || t == 7, "{t}");
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: Some(4),
            ..Default::default()
        })
        .unwrap();
        for _ in 0..300 {
            let t = s.sample(&mut l.clone(), &[]);
            assert!(t == 3 || t == 7, "{t}");
        }
    }

    #[test]
    fn penalties_push_repeated_tokens_down() {
        let mut l = vec![1.0f32, 0.9, -1.0];
        let s = Sampler::new(SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        })
        .unwrap();
        s.apply_penalties(&mut l, &[0, 2]);
        assert_eq!(l, vec![0.5, 0.9, -2.0]);
        let mut l = vec![1.0f32, 0.9];
        let s = Sampler::new(SamplingParams {
            temperature: 0.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        })
        .unwrap();
        s.apply_penalties(&mut l, &[0, 0, 1]);
        assert_eq!(l, vec![1.0 - 0.5 - 0.5, 0.9 - 0.5 - 0.25]);
    }

    #[test]
    fn out_of_range_parameters_are_errors() {
        for p in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }
}
