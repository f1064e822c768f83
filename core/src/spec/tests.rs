use super::*;
use crate::rng::Rng;

fn dist(p: &[f64]) -> Dist {
    Dist {
        tokens: (0..p.len() as u32).collect(),
        probs: p.iter().map(|&x| x as f32).collect(),
        greedy: false,
    }
}

fn random_probs(r: &mut Rng, n: usize, zeros: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n).map(|_| r.f64() + 0.05).collect();
    for z in 0..zeros {
        v[(z * 3) % n] = 0.0;
    }
    let s: f64 = v.iter().sum();
    v.iter().map(|x| x / s).collect()
}

fn sampler(seed: u64) -> Sampler {
    Sampler::new(SamplingParams {
        seed: Some(seed),
        ..SamplingParams::default()
    })
    .expect("sampler")
}

/// Pearson's chi-square of `counts` against probabilities `p`, and its degrees of freedom
/// (cells with expected count under 5 pooled).
fn chi_square(counts: &[u64], p: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let (mut chi, mut cells, mut pool_o, mut pool_e) = (0.0, 0usize, 0.0, 0.0);
    for (&c, &pi) in counts.iter().zip(p) {
        let e = pi * n as f64;
        if e < 5.0 {
            pool_o += c as f64;
            pool_e += e;
            continue;
        }
        chi += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pool_e > 0.0 {
        chi += (pool_o - pool_e).powi(2) / pool_e.max(1e-9);
        cells += 1;
    }
    (chi, cells.saturating_sub(1))
}

#[test]
fn greedy_keeps_the_agreeing_prefix_and_the_targets_token() {
    let p: Vec<Dist> = [4u32, 7, 1, 9].iter().map(|&t| Dist::point(t)).collect();
    let mut s = sampler(1);
    let all = verify(&p, &[4, 7, 1], None, &mut s);
    assert_eq!((all.accepted, all.tokens), (3, vec![4, 7, 1, 9]));
    let some = verify(&p, &[4, 2, 1], None, &mut s);
    assert_eq!((some.accepted, some.tokens), (1, vec![4, 7]));
    let none = verify(&p, &[5], None, &mut s);
    assert_eq!((none.accepted, none.tokens), (0, vec![4]));
    // A drafter's own distribution changes nothing about a greedy target.
    let q = vec![dist(&[0.1, 0.2, 0.3, 0.4]), dist(&[0.25; 4])];
    let v = verify(&p[..3], &[4, 3], Some(&q), &mut s);
    assert_eq!((v.accepted, v.tokens), (1, vec![4, 7]));
}

/// The first token out of a verification is distributed as the target's p, whatever q the
/// draft came from (a poor q, a point mass, a q wider than p's support).
#[test]
fn rejection_sampling_leaves_the_targets_distribution() {
    let mut r = Rng::new(7);
    let n = 6;
    for case in 0..4 {
        let p = random_probs(&mut r, n, case % 2);
        let q = match case {
            0 => None,
            1 => Some(random_probs(&mut r, n, 0)),
            2 => Some(vec![0.9, 0.02, 0.02, 0.02, 0.02, 0.02]),
            _ => Some(random_probs(&mut r, n, 2)),
        };
        let point = 3u32;
        let mut s = sampler(100 + case as u64);
        let mut draws = sampler(200 + case as u64);
        let mut counts = vec![0u64; n];
        let trials = 60_000;
        for _ in 0..trials {
            let (d, qd) = match &q {
                None => (point, None),
                Some(q) => {
                    let qd = dist(q);
                    (draws.draw(&qd), Some(vec![qd]))
                }
            };
            let v = verify(&[dist(&p), dist(&p)], &[d], qd.as_deref(), &mut s);
            counts[v.tokens[0] as usize] += 1;
        }
        let (chi, df) = chi_square(&counts, &p);
        // The 0.999 quantile of chi-square with 5 degrees of freedom is 20.5.
        assert!(
            df <= 5 && chi < 20.5,
            "case {case}: chi² {chi:.2} ({df} df), {counts:?} vs {p:?}"
        );
    }
}

#[test]
fn ngram_drafts_what_followed_the_longest_latest_match() {
    let ng = Ngram { max: 3, min: 1 };
    // "1 2 3 4 … 1 2 3" → 4 5 follow; the latest occurrence wins.
    let t = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3];
    assert_eq!(ng.lookup(&t, 2), vec![7, 8]);
    // Past the end, the text since the match repeats.
    assert_eq!(ng.lookup(&t, 10), vec![7, 8, 6, 1, 2, 3, 7, 8, 6, 1]);
    assert_eq!(ng.lookup(&[9, 4, 4, 4], 3), vec![4, 4, 4]);
    // Only a one-token match: its continuation.
    assert_eq!(ng.lookup(&[5, 6, 5], 3), vec![6, 5, 6]);
    // No match, nothing to draft; min above the match length, nothing either.
    assert!(ng.lookup(&[1, 2, 3], 4).is_empty());
    assert!(Ngram { max: 4, min: 2 }.lookup(&[5, 6, 5], 2).is_empty());
    assert!(ng.lookup(&t, 0).is_empty());
    assert!(ng.lookup(&[], 3).is_empty());
}
