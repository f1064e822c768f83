//! Eigen-decomposition of a symmetric matrix in f64, for the key maps' matrix roots
//! ([`super::key_fit`]): Householder reflections take the matrix to tridiagonal form, then
//! implicit QL steps with a Wilkinson shift take the off-diagonal to zero, one eigenvalue at
//! a time from the top. Every loop runs along rows (the eigenvectors are kept as rows until
//! the end), about `(4/3)·d³` products for the reduction and a few `d²` rotations of `d` for
//! the QL steps: a 256 × 256 matrix in tens of milliseconds, where the cyclic Jacobi
//! rotations it replaces (the tests' oracle) took over a second, which Gemma 3's 18 layers
//! × 2 decompositions each paid at load.

/// Most QL steps for one eigenvalue; convergence is cubic, two or three steps are usual.
/// Past it the eigenvalue is taken as it stands (less exact, never a hang).
const MAX_STEPS: usize = 64;

/// Eigenvalues and eigenvectors of the symmetric `d × d` matrix `a` (row-major; the upper
/// triangle is read): `(values, vectors)` with eigenvector `k` in column `k` of `vectors`
/// (row-major), so `a = V diag(values) Vᵀ`. Empty for a malformed `a`.
pub fn sym_eigen(a: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    if a.len() != d * d {
        return (Vec::new(), Vec::new());
    }
    let (mut diag, mut off, mut rows) = tridiagonal(a, d);
    ql(&mut diag, &mut off, &mut rows, d);
    let mut vectors = vec![0.0; d * d];
    for k in 0..d {
        for i in 0..d {
            vectors[i * d + k] = rows[k * d + i];
        }
    }
    (diag, vectors)
}

/// `a = Q T Qᵀ` with `T` tridiagonal: its diagonal, its off-diagonal (`off[i]` couples `i`
/// and `i + 1`; `off[d - 1] = 0`) and `Qᵀ` (row-major, so row `k` is column `k` of `Q`).
fn tridiagonal(a: &[f64], d: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    // The symmetric matrix in full, from its upper triangle.
    let mut m = vec![0.0; d * d];
    for i in 0..d {
        for j in i..d {
            m[i * d + j] = a[i * d + j];
            m[j * d + i] = a[i * d + j];
        }
    }
    let mut qt = vec![0.0; d * d];
    for i in 0..d {
        qt[i * d + i] = 1.0;
    }
    let mut off = vec![0.0; d];
    let mut u = vec![0.0; d];
    let mut p = vec![0.0; d];
    let mut s = vec![0.0; d];
    for k in 0..d.saturating_sub(2) {
        // Reflect x = m[k + 1.., k] (row k, by symmetry) onto its first axis:
        // H = I − β u uᵀ with u = x − α e₁, |α| = |x|, α of x₀'s opposite sign.
        let n = d - k - 1;
        let x = &m[k * d + k + 1..(k + 1) * d];
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm == 0.0 {
            continue;
        }
        let alpha = if x[0] > 0.0 { -norm } else { norm };
        u[..n].copy_from_slice(x);
        u[0] -= alpha;
        let uu: f64 = u[..n].iter().map(|v| v * v).sum();
        if uu == 0.0 {
            off[k] = x[0];
            continue;
        }
        let beta = 2.0 / uu;
        // The trailing block B ← H B H = B − u wᵀ − w uᵀ, with p = β B u and
        // w = p − (β/2)(uᵀp) u.
        let sub = k + 1;
        for i in 0..n {
            let row = &m[(sub + i) * d + sub..(sub + i + 1) * d];
            p[i] = beta * row.iter().zip(&u[..n]).map(|(a, b)| a * b).sum::<f64>();
        }
        let kk = 0.5 * beta * u[..n].iter().zip(&p[..n]).map(|(a, b)| a * b).sum::<f64>();
        for i in 0..n {
            p[i] -= kk * u[i];
        }
        for i in 0..n {
            let (ui, wi) = (u[i], p[i]);
            let row = &mut m[(sub + i) * d + sub..(sub + i + 1) * d];
            for ((r, &uj), &wj) in row.iter_mut().zip(&u[..n]).zip(&p[..n]) {
                *r -= ui * wj + wi * uj;
            }
        }
        off[k] = alpha;
        // Qᵀ ← H Qᵀ on rows k + 1..: s = uᵀ Qᵀ[k + 1..], then each row less β u_i s.
        s.iter_mut().for_each(|v| *v = 0.0);
        for i in 0..n {
            let row = &qt[(sub + i) * d..(sub + i + 1) * d];
            for (sc, &r) in s.iter_mut().zip(row) {
                *sc += u[i] * r;
            }
        }
        for i in 0..n {
            let f = beta * u[i];
            let row = &mut qt[(sub + i) * d..(sub + i + 1) * d];
            for (r, &sc) in row.iter_mut().zip(&s) {
                *r -= f * sc;
            }
        }
    }
    if d >= 2 {
        off[d - 2] = m[(d - 2) * d + d - 1];
    }
    let diag = (0..d).map(|i| m[i * d + i]).collect();
    (diag, off, qt)
}

/// Diagonalizes the tridiagonal matrix (`diag`, `off`) by implicit QL steps, turning the
/// eigenvector rows `rows` (`Qᵀ` on entry) with each plane rotation.
fn ql(diag: &mut [f64], off: &mut [f64], rows: &mut [f64], d: usize) {
    for l in 0..d {
        for _ in 0..MAX_STEPS {
            // The first negligible coupling at or past l splits the matrix there.
            let mut m = l;
            while m + 1 < d {
                let scale = diag[m].abs() + diag[m + 1].abs();
                if off[m].abs() <= f64::EPSILON * scale {
                    break;
                }
                m += 1;
            }
            if m == l {
                break;
            }
            // The shift: the eigenvalue of the leading 2 × 2 block nearer diag[l].
            let g0 = (diag[l + 1] - diag[l]) / (2.0 * off[l]);
            let r0 = g0.hypot(1.0);
            let mut g = diag[m] - diag[l] + off[l] / (g0 + r0.copysign(g0));
            let (mut s, mut c, mut p) = (1.0f64, 1.0f64, 0.0f64);
            let mut split = false;
            for i in (l..m).rev() {
                let f = s * off[i];
                let b = c * off[i];
                let r = f.hypot(g);
                off[i + 1] = r;
                if r == 0.0 {
                    // An exact zero split the block: restart from l.
                    diag[i + 1] -= p;
                    off[m] = 0.0;
                    split = true;
                    break;
                }
                s = f / r;
                c = g / r;
                let g1 = diag[i + 1] - p;
                let r1 = (diag[i] - g1) * s + 2.0 * c * b;
                p = s * r1;
                diag[i + 1] = g1 + p;
                g = c * r1 - b;
                let (lo, hi) = rows.split_at_mut((i + 1) * d);
                let (ri, rj) = (&mut lo[i * d..], &mut hi[..d]);
                for (a, b) in ri.iter_mut().zip(rj.iter_mut()) {
                    let (x, y) = (*a, *b);
                    *b = s * x + c * y;
                    *a = c * x - s * y;
                }
            }
            if !split {
                diag[l] -= p;
                off[l] = g;
                off[m] = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The oracle: cyclic Jacobi rotations until the off-diagonal is gone.
    fn jacobi(a: &[f64], d: usize) -> Vec<f64> {
        let mut m = a.to_vec();
        for _ in 0..100 {
            let off: f64 = (0..d * d)
                .filter(|&x| x / d != x % d)
                .map(|x| m[x] * m[x])
                .sum();
            if off <= 1e-30 * m.iter().map(|x| x * x).sum::<f64>().max(1e-300) {
                break;
            }
            for p in 0..d {
                for q in p + 1..d {
                    let apq = m[p * d + q];
                    if apq == 0.0 {
                        continue;
                    }
                    let theta = (m[q * d + q] - m[p * d + p]) / (2.0 * apq);
                    let t = theta.signum().max(0.0) * 2.0 - 1.0;
                    let t = t / (theta.abs() + (theta * theta + 1.0).sqrt());
                    let c = 1.0 / (t * t + 1.0).sqrt();
                    let s = t * c;
                    for k in 0..d {
                        let (x, y) = (m[k * d + p], m[k * d + q]);
                        m[k * d + p] = c * x - s * y;
                        m[k * d + q] = s * x + c * y;
                    }
                    for k in 0..d {
                        let (x, y) = (m[p * d + k], m[q * d + k]);
                        m[p * d + k] = c * x - s * y;
                        m[q * d + k] = s * x + c * y;
                    }
                }
            }
        }
        let mut v: Vec<f64> = (0..d).map(|i| m[i * d + i]).collect();
        v.sort_by(f64::total_cmp);
        v
    }

    fn sym(d: usize, rank: usize, seed: u64) -> Vec<f64> {
        let mut r = Rng::new(seed);
        let b: Vec<f64> = (0..d * rank).map(|_| r.normal() as f64).collect();
        let mut a = vec![0.0; d * d];
        for i in 0..d {
            for j in 0..d {
                a[i * d + j] = (0..rank).map(|k| b[i * rank + k] * b[j * rank + k]).sum();
            }
        }
        a
    }

    fn check(a: &[f64], d: usize, what: &str) {
        let (vals, vecs) = sym_eigen(a, d);
        let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
        // V diag Vᵀ gives a back, and V is orthogonal.
        let mut worst = (0.0f64, 0.0f64);
        for i in 0..d {
            for j in 0..d {
                let r: f64 = (0..d)
                    .map(|k| vecs[i * d + k] * vals[k] * vecs[j * d + k])
                    .sum();
                let o: f64 = (0..d).map(|k| vecs[k * d + i] * vecs[k * d + j]).sum();
                worst.0 = worst.0.max((r - a[i * d + j]).abs() / scale);
                worst.1 = worst.1.max((o - if i == j { 1.0 } else { 0.0 }).abs());
            }
        }
        assert!(worst.0 < 1e-12, "{what}: reconstruction off by {}", worst.0);
        assert!(worst.1 < 1e-12, "{what}: orthogonality off by {}", worst.1);
        let mut sorted = vals.clone();
        sorted.sort_by(f64::total_cmp);
        let want = jacobi(a, d);
        for (x, y) in sorted.iter().zip(&want) {
            assert!(
                (x - y).abs() < 1e-11 * scale,
                "{what}: eigenvalue {x} against {y}"
            );
        }
    }

    #[test]
    fn the_decomposition_rebuilds_the_matrix_and_agrees_with_jacobi() {
        for (d, rank, seed) in [(1, 1, 1), (2, 2, 2), (3, 1, 3), (7, 7, 4), (64, 64, 5)] {
            check(&sym(d, rank, seed), d, &format!("{d} x {d} of rank {rank}"));
        }
        // Rank-deficient (Gemma 3's keys have dead channels), a non-definite matrix, an
        // already diagonal one with repeats, a zero one.
        check(&sym(48, 5, 6), 48, "48 x 48 of rank 5");
        let mut indef = sym(20, 20, 7);
        for i in 0..20 {
            indef[i * 20 + i] -= 15.0;
        }
        check(&indef, 20, "indefinite");
        let mut diag = vec![0.0; 16 * 16];
        for i in 0..16 {
            diag[i * 16 + i] = [3.0, -1.0, 3.0, 0.5][i % 4];
        }
        check(&diag, 16, "diagonal with repeats");
        check(&vec![0.0; 9], 3, "zero");
        // Identity plus rank one: one eigenvalue apart, the rest equal.
        let mut ones = sym(12, 1, 8);
        for i in 0..12 {
            ones[i * 12 + i] += 1.0;
        }
        check(&ones, 12, "identity plus rank one");
    }

    #[test]
    fn a_malformed_matrix_gives_nothing() {
        assert_eq!(sym_eigen(&[1.0, 2.0, 3.0], 2), (Vec::new(), Vec::new()));
    }
}
