//! A linear map of a layer's keys fitted to its queries, for lossy K caches
//! (`--kv-fit-keys`): keys are written as `T·k` and queries scored as `T⁻ᵀ·q`, so every score
//! `(T⁻ᵀq)·(Tk) = q·k` is unchanged, while the cache's rounding error lands where the queries
//! do not look.
//!
//! Why it helps. A block quantizer (q8_0, q4_0, the TurboQuant blocks after their rotation)
//! leaves an error `e` in a stored key of about the same size in every direction, scaled by
//! the key's own size. The score error is `q·e`, and its mean square over the queries is
//! `eᵀ Σq e` with `Σq = E[q qᵀ]`: what matters is the error along the directions queries
//! take. Keys and queries of a layer are far from isotropic (a few channels carry most of
//! either, not always the same ones). Storing `k' = T k` with error `e'` (isotropic, of mean
//! square `∝ |T k|²`) makes the score error `(T⁻ᵀq)·e'`, of mean square proportional to
//! `tr(T Σk Tᵀ) · tr(T⁻ᵀ Σq T⁻¹)` (with `Σk = E[k kᵀ]`). Over all invertible `T` that product
//! is smallest, `(tr M^½)²` with `M = Σk^½ Σq Σk^½`, at
//!
//! ```text
//! T = M^¼ Σk^-½        T⁻ᵀ = M^-¼ Σk^½
//! ```
//!
//! (substitute `A = T Σk^½`: the product is `tr(A Aᵀ)·tr(A⁻ᵀ M A⁻¹)`, smallest when
//! `Aᵀ A ∝ M^½`). Against the identity, whose value is `tr Σk · tr Σq`, the gain is largest
//! where the keys' large directions are not the queries'. `T` is then scaled so that the keys
//! keep their mean square (`tr(T Σk Tᵀ) = tr Σk`), which keeps the stored blocks' scales in
//! the range they had.
//!
//! The statistics come from one calibration pass (every head of the layer pooled: one `T` a
//! layer, applied to every KV head, and `T⁻ᵀ` to every query head, by the matmul every
//! backend has). They must describe the keys and queries after RoPE over every position of
//! the context: a pair of channels whose rotation is slow against a pass keeps one direction
//! there, and a map fitted to those directions fails past them (fitted after RoPE over 512
//! positions, it cost SmolLM2 more than no map at 4,096: tq3 K and V +73 % against +33 %).
//! So the pass takes them before RoPE, where a short pass holds at any position, and
//! [`super::rope_moments`] averages them over the context's positions analytically (SmolLM2 at
//! 4,096 with a pass of 1,024: +19.9 %, as with the pass over all 4,096 positions after RoPE,
//! +19.1 %). Both covariances get a ridge of [`RIDGE`] times their mean eigenvalue, so channels
//! a model never uses (Gemma 3's keys have some with a zero norm weight) stay finite.

use super::eigen::sym_eigen;

/// The ridge added to each covariance, relative to its mean eigenvalue `tr Σ / d`.
pub const RIDGE: f64 = 1e-4;

/// Rows of products [`SecondMoments::add_sampled`] sums in f32 before adding them in f64.
const F32_ROWS: usize = 256;

/// Running sums of `x xᵀ` for rows of width `d` (upper triangle, f64).
#[derive(Clone, Debug)]
pub struct SecondMoments {
    d: usize,
    sum: Vec<f64>,
    n: usize,
}

impl SecondMoments {
    pub fn new(d: usize) -> SecondMoments {
        SecondMoments {
            d,
            sum: vec![0.0; d * d],
            n: 0,
        }
    }

    pub fn dim(&self) -> usize {
        self.d
    }

    /// Adds every row of `rows` (a multiple of `d` values; a ragged tail is ignored).
    pub fn add(&mut self, rows: &[f32]) {
        self.add_sampled(rows, 1, usize::MAX);
    }

    /// Adds the rows of `rows` (`per_token` rows a token, `d` values a row) of every
    /// `s`-th token, `s` the smallest step that keeps them to `max_rows` (a calibration
    /// pass over a long context has many more rows than a covariance of `d × d` needs, and
    /// each costs `d²/2` products). The products are summed in f32 over [`F32_ROWS`] rows at
    /// a time (a relative error of about `F32_ROWS · 2⁻²⁴`), then in f64.
    pub fn add_sampled(&mut self, rows: &[f32], per_token: usize, max_rows: usize) {
        let d = self.d;
        let per = per_token.max(1);
        if d == 0 || rows.len() < d * per {
            return;
        }
        let tokens = rows.len() / (d * per);
        let step = (tokens * per).div_ceil(max_rows.max(per)).max(1);
        let mut acc = vec![0.0f32; d * d];
        let mut in_acc = 0;
        for t in (0..tokens).step_by(step) {
            for r in rows[t * per * d..(t + 1) * per * d].chunks_exact(d) {
                for i in 0..d {
                    let ri = r[i];
                    let row = &mut acc[i * d..(i + 1) * d];
                    for (s, &rj) in row[i..].iter_mut().zip(&r[i..]) {
                        *s += ri * rj;
                    }
                }
                self.n += 1;
                in_acc += 1;
                if in_acc == F32_ROWS {
                    self.flush(&mut acc);
                    in_acc = 0;
                }
            }
        }
        self.flush(&mut acc);
    }

    /// Adds the f32 partial sums into the f64 ones and clears them.
    fn flush(&mut self, acc: &mut [f32]) {
        for (s, a) in self.sum.iter_mut().zip(acc.iter_mut()) {
            *s += *a as f64;
            *a = 0.0;
        }
    }

    /// The mean of `x xᵀ` (both triangles), or `None` without rows.
    pub fn mean(&self) -> Option<Vec<f64>> {
        if self.n == 0 {
            return None;
        }
        let d = self.d;
        let mut m = vec![0.0; d * d];
        for i in 0..d {
            for j in i..d {
                let v = self.sum[i * d + j] / self.n as f64;
                m[i * d + j] = v;
                m[j * d + i] = v;
            }
        }
        Some(m)
    }
}

/// `V diag(f(values)) Vᵀ` for the eigen-decomposition of a symmetric matrix.
fn sym_fn(values: &[f64], vectors: &[f64], f: impl Fn(f64) -> f64) -> Vec<f64> {
    let d = values.len();
    let fv: Vec<f64> = values.iter().map(|&x| f(x)).collect();
    let mut out = vec![0.0; d * d];
    for i in 0..d {
        for j in i..d {
            let s: f64 = (0..d)
                .map(|k| vectors[i * d + k] * fv[k] * vectors[j * d + k])
                .sum();
            out[i * d + j] = s;
            out[j * d + i] = s;
        }
    }
    out
}

fn mul(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let mut out = vec![0.0; d * d];
    for i in 0..d {
        for k in 0..d {
            let aik = a[i * d + k];
            if aik == 0.0 {
                continue;
            }
            for j in 0..d {
                out[i * d + j] += aik * b[k * d + j];
            }
        }
    }
    out
}

fn trace(a: &[f64], d: usize) -> f64 {
    (0..d).map(|i| a[i * d + i]).sum()
}

/// `a + ridge · (tr a / d) · I`, its eigenvalues clamped at that ridge (a covariance is
/// positive semi-definite; rounding may leave tiny negative ones).
fn ridged(a: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let lam = RIDGE * (trace(a, d) / d as f64).max(f64::MIN_POSITIVE);
    let (vals, vecs) = sym_eigen(a, d);
    (vals.into_iter().map(|x| x.max(0.0) + lam).collect(), vecs)
}

/// The key map `T` and the query map `T⁻ᵀ` (row-major `d × d`, f32: `out = M · x`) for the
/// key and query second moments `sk`, `sq` (`d × d`, row-major), as the module comment
/// derives; `None` where either is not finite or has no energy.
pub fn fit(sk: &[f64], sq: &[f64], d: usize) -> Option<(Vec<f32>, Vec<f32>)> {
    if d == 0 || sk.len() != d * d || sq.len() != d * d {
        return None;
    }
    if !sk.iter().chain(sq).all(|x| x.is_finite()) || trace(sk, d) <= 0.0 || trace(sq, d) <= 0.0 {
        return None;
    }
    let (ek, vk) = ridged(sk, d);
    let sk_half = sym_fn(&ek, &vk, f64::sqrt);
    let sk_neg_half = sym_fn(&ek, &vk, |x| 1.0 / x.sqrt());
    // Σq's ridge needs no eigenvalues: its diagonal plus λ (rounding can leave a covariance
    // a hair short of positive semi-definite; the ridge covers that).
    let lam_q = RIDGE * (trace(sq, d) / d as f64).max(f64::MIN_POSITIVE);
    let mut sq_r = sq.to_vec();
    for i in 0..d {
        sq_r[i * d + i] += lam_q;
    }
    let m = mul(&mul(&sk_half, &sq_r, d), &sk_half, d);
    let (em, vm) = sym_eigen(&m, d);
    let floor = em.iter().cloned().fold(0.0f64, f64::max) * 1e-12;
    let m_q = sym_fn(&em, &vm, |x| x.max(floor).powf(0.25));
    let m_nq = sym_fn(&em, &vm, |x| x.max(floor).powf(-0.25));
    let t = mul(&m_q, &sk_neg_half, d);
    let t_inv_t = mul(&m_nq, &sk_half, d);
    // Keys keep their mean square: tr(T Σk Tᵀ) = tr Σk.
    let tk = mul(&mul(&t, sk, d), &transpose(&t, d), d);
    let c = (trace(sk, d) / trace(&tk, d)).sqrt();
    if !c.is_finite() || c <= 0.0 {
        return None;
    }
    let key: Vec<f32> = t.iter().map(|&x| (x * c) as f32).collect();
    let query: Vec<f32> = t_inv_t.iter().map(|&x| (x / c) as f32).collect();
    (key.iter().chain(&query).all(|x| x.is_finite())).then_some((key, query))
}

fn transpose(a: &[f64], d: usize) -> Vec<f64> {
    let mut out = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..d {
            out[j * d + i] = a[i * d + j];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// A random covariance with a spread spectrum: `B Bᵀ` of a random `d × d` `B` whose
    /// columns are scaled by `1 .. 30`.
    fn covariance(r: &mut Rng, d: usize) -> Vec<f64> {
        let b: Vec<f64> = (0..d * d)
            .map(|i| r.normal() as f64 * (1.0 + 29.0 * ((i % d) as f64 / d as f64).powi(3)))
            .collect();
        mul(&b, &transpose(&b, d), d)
    }

    /// Scores are unchanged (`(T⁻ᵀq)·(Tk) = q·k`), and the fitted map's error product
    /// `tr(TΣkTᵀ)·tr(T⁻ᵀΣqT⁻¹)` is the optimum `(tr M^½)²`, below the identity's
    /// `tr Σk · tr Σq` and below a random invertible map's.
    #[test]
    fn the_fitted_map_keeps_scores_and_minimises_the_error_product() {
        let mut r = Rng::new(11);
        let d = 32;
        let sk = covariance(&mut r, d);
        let sq = covariance(&mut r, d);
        let (t, ti) = fit(&sk, &sq, d).expect("fit");
        let t64: Vec<f64> = t.iter().map(|&x| x as f64).collect();
        let ti64: Vec<f64> = ti.iter().map(|&x| x as f64).collect();
        for _ in 0..20 {
            let q: Vec<f64> = (0..d).map(|_| r.normal() as f64).collect();
            let k: Vec<f64> = (0..d).map(|_| r.normal() as f64).collect();
            let apply = |m: &[f64], x: &[f64]| -> Vec<f64> {
                (0..d)
                    .map(|i| (0..d).map(|j| m[i * d + j] * x[j]).sum())
                    .collect()
            };
            let (tk, tq) = (apply(&t64, &k), apply(&ti64, &q));
            let a: f64 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
            let b: f64 = tq.iter().zip(&tk).map(|(a, b)| a * b).sum();
            let norm = q.iter().map(|x| x * x).sum::<f64>().sqrt()
                * k.iter().map(|x| x * x).sum::<f64>().sqrt();
            assert!((a - b).abs() <= 1e-4 * norm, "{a} vs {b}");
        }
        let product = |m: &[f64], mi_t: &[f64]| {
            let k = trace(&mul(&mul(m, &sk, d), &transpose(m, d), d), d);
            let q = trace(&mul(&mul(mi_t, &sq, d), &transpose(mi_t, d), d), d);
            k * q
        };
        let fitted = product(&t64, &ti64);
        let identity = trace(&sk, d) * trace(&sq, d);
        let (ek, vk) = sym_eigen(&sk, d);
        let half = sym_fn(&ek, &vk, |x| x.max(0.0).sqrt());
        let m = mul(&mul(&half, &sq, d), &half, d);
        let (em, _) = sym_eigen(&m, d);
        let optimum = em.iter().map(|x| x.max(0.0).sqrt()).sum::<f64>().powi(2);
        assert!(
            (fitted - optimum).abs() <= 1e-3 * optimum,
            "fitted {fitted} against the optimum {optimum}"
        );
        assert!(
            fitted < 0.9 * identity,
            "fitted {fitted}, identity {identity}"
        );
        // A random invertible map does no better.
        let b: Vec<f64> = (0..d * d)
            .map(|i| r.normal() as f64 + if i % (d + 1) == 0 { 3.0 } else { 0.0 })
            .collect();
        let (eb, vb) = sym_eigen(&mul(&b, &transpose(&b, d), d), d);
        let b_sym = sym_fn(&eb, &vb, f64::sqrt);
        let b_inv = sym_fn(&eb, &vb, |x| 1.0 / x.sqrt());
        assert!(product(&b_sym, &b_inv) >= fitted * (1.0 - 1e-6));
    }

    /// Channels with no energy (a key channel a model never uses) leave the map finite.
    #[test]
    fn dead_channels_are_ridged() {
        let mut r = Rng::new(3);
        let d = 16;
        let mut sk = covariance(&mut r, d);
        for i in 0..d {
            sk[i * d + 5] = 0.0;
            sk[5 * d + i] = 0.0;
        }
        let sq = covariance(&mut r, d);
        let (t, ti) = fit(&sk, &sq, d).expect("fit");
        assert!(t.iter().chain(&ti).all(|x| x.is_finite()));
        assert!(fit(&vec![0.0; d * d], &sq, d).is_none());
    }

    /// Sampling keeps whole tokens (every head's row of a token) and the mean stays a mean.
    #[test]
    fn sampled_moments_take_whole_tokens() {
        let mut r = Rng::new(5);
        let (d, heads, tokens) = (8, 3, 40);
        let rows: Vec<f32> = (0..d * heads * tokens).map(|_| r.normal()).collect();
        let mut all = SecondMoments::new(d);
        all.add(&rows);
        let mut some = SecondMoments::new(d);
        some.add_sampled(&rows, heads, 30);
        // 120 rows into at most 30: every 4th token, all 3 heads.
        assert_eq!(some.n, 30);
        let mut want = SecondMoments::new(d);
        for t in (0..tokens).step_by(4) {
            want.add(&rows[t * heads * d..(t + 1) * heads * d]);
        }
        let (a, b) = (some.mean().expect("rows"), want.mean().expect("rows"));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
        assert_eq!(all.n, 120);
    }

    #[test]
    fn second_moments_are_means_of_outer_products() {
        let mut m = SecondMoments::new(3);
        m.add(&[1.0, 2.0, 3.0, -1.0, 0.0, 2.0]);
        let s = m.mean().expect("rows");
        assert_eq!(s[0 * 3 + 1], (2.0 + 0.0) / 2.0);
        assert_eq!(s[2 * 3 + 0], (3.0 - 2.0) / 2.0);
        assert_eq!(s[2 * 3 + 2], (9.0 + 4.0) / 2.0);
        assert!(SecondMoments::new(3).mean().is_none());
    }
}
