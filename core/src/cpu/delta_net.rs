//! The Gated DeltaNet recurrence: per token (decode), chunked (prefill), and the fused decode
//! step over a state pool.
//!
//! State `S [Dk, Dv]` per (sequence, value head). Per token, with decay `a = e^g`:
//! `S ← a·S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀ(q·scale)`.

use rayon::prelude::*;

use super::conv::{pool_slots, seq_ranges};
use super::norm::l2_norm_rows;
use super::{In, KResult, Out};
use crate::op::DeltaNetOp;

/// Dimensions of one call.
#[derive(Copy, Clone)]
struct Dims {
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

/// The token rows of one (sequence, head): inputs for tokens `a..b`.
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

impl Inputs<'_> {
    fn q(&self, d: Dims, t: usize, h: usize) -> &[f32] {
        let kh = h / (d.hv / d.hk);
        &self.q[(t * d.hk + kh) * d.dk..(t * d.hk + kh + 1) * d.dk]
    }
    fn k(&self, d: Dims, t: usize, h: usize) -> &[f32] {
        let kh = h / (d.hv / d.hk);
        &self.k[(t * d.hk + kh) * d.dk..(t * d.hk + kh + 1) * d.dk]
    }
    fn v(&self, d: Dims, t: usize, h: usize) -> &[f32] {
        &self.v[(t * d.hv + h) * d.dv..(t * d.hv + h + 1) * d.dv]
    }
}

/// Per-token recurrence for tokens `a..b` of head `h`; returns the outputs `[b-a, Dv]`.
fn recurrent(
    x: &Inputs,
    d: Dims,
    h: usize,
    a: usize,
    b: usize,
    scale: f32,
    s: &mut [f32],
) -> Vec<f32> {
    let mut out = vec![0f32; (b - a) * d.dv];
    let mut kv = vec![0f32; d.dv];
    for t in a..b {
        let (q, k, v) = (x.q(d, t, h), x.k(d, t, h), x.v(d, t, h));
        let decay = x.g[t * d.hv + h].exp();
        let beta = x.beta[t * d.hv + h];
        s.iter_mut().for_each(|e| *e *= decay);
        kv.fill(0.0);
        for (i, ki) in k.iter().enumerate() {
            for (acc, sv) in kv.iter_mut().zip(&s[i * d.dv..(i + 1) * d.dv]) {
                *acc += ki * sv;
            }
        }
        for (j, acc) in kv.iter_mut().enumerate() {
            *acc = (v[j] - *acc) * beta; // now the delta
        }
        for (i, ki) in k.iter().enumerate() {
            for (sv, dl) in s[i * d.dv..(i + 1) * d.dv].iter_mut().zip(&kv) {
                *sv += ki * dl;
            }
        }
        let o = &mut out[(t - a) * d.dv..(t - a + 1) * d.dv];
        for (i, qi) in q.iter().enumerate() {
            let qs = qi * scale;
            for (ov, sv) in o.iter_mut().zip(&s[i * d.dv..(i + 1) * d.dv]) {
                *ov += qs * sv;
            }
        }
    }
    out
}

/// The chunked (WY) form of the same recurrence for tokens `a..b` of head `h`.
///
/// Within a chunk of `L` tokens with cumulative log decay `c`, the intra-chunk dependencies are
/// solved once: `T = (I + A)⁻¹` with `A[i][j] = β_i (k_i·k_j) e^{c_i−c_j}` (j < i), by forward
/// substitution. Then `U = T·(β v)` and `W = T·(β k e^{c})`, the corrected values are
/// `v'_i = U_i − W_iᵀ S`, the outputs `o_i = e^{c_i} (q_i s)ᵀS + Σ_{j≤i} (q_i s · k_j) e^{c_i−c_j} v'_j`,
/// and the state moves to `e^{c_L} S + Σ_j e^{c_L−c_j} k_j ⊗ v'_j`.
#[allow(clippy::too_many_arguments)]
fn chunked(
    x: &Inputs,
    d: Dims,
    h: usize,
    a: usize,
    b: usize,
    scale: f32,
    chunk: usize,
    s: &mut [f32],
) -> Vec<f32> {
    let (dk, dv) = (d.dk, d.dv);
    let mut out = vec![0f32; (b - a) * dv];
    let mut c0 = a;
    while c0 < b {
        let l = chunk.min(b - c0);
        let idx = |i: usize| c0 + i;
        // Cumulative log decay within the chunk.
        let mut cum = vec![0f32; l];
        let mut acc = 0f32;
        for (i, c) in cum.iter_mut().enumerate() {
            acc += x.g[idx(i) * d.hv + h];
            *c = acc;
        }
        let beta: Vec<f32> = (0..l).map(|i| x.beta[idx(i) * d.hv + h]).collect();
        // T = (I + A)^-1, lower triangular with unit diagonal, by forward substitution.
        let mut t = vec![0f32; l * l];
        for i in 0..l {
            let ki = x.k(d, idx(i), h);
            // Row i of -A.
            let mut row = vec![0f32; i];
            for (j, r) in row.iter_mut().enumerate() {
                let kk: f32 = ki.iter().zip(x.k(d, idx(j), h)).map(|(p, q)| p * q).sum();
                *r = -beta[i] * kk * (cum[i] - cum[j]).exp();
            }
            // T[i][j] = row[j] + Σ_{j<m<i} row[m] T[m][j]
            for j in 0..i {
                let mut v = row[j];
                for m in j + 1..i {
                    v += row[m] * t[m * l + j];
                }
                t[i * l + j] = v;
            }
            t[i * l + i] = 1.0;
        }
        // U = T (β v), W = T (β k e^c)
        let mut u = vec![0f32; l * dv];
        let mut w = vec![0f32; l * dk];
        for i in 0..l {
            for j in 0..=i {
                let tij = t[i * l + j];
                if tij == 0.0 {
                    continue;
                }
                let bv = tij * beta[j];
                for (uu, vv) in u[i * dv..(i + 1) * dv].iter_mut().zip(x.v(d, idx(j), h)) {
                    *uu += bv * vv;
                }
                let bk = bv * cum[j].exp();
                for (ww, kk) in w[i * dk..(i + 1) * dk].iter_mut().zip(x.k(d, idx(j), h)) {
                    *ww += bk * kk;
                }
            }
        }
        // v' = U − W S
        let mut vn = u;
        for i in 0..l {
            for (p, wp) in w[i * dk..(i + 1) * dk].iter().enumerate() {
                for (vv, sv) in vn[i * dv..(i + 1) * dv]
                    .iter_mut()
                    .zip(&s[p * dv..(p + 1) * dv])
                {
                    *vv -= wp * sv;
                }
            }
        }
        // Outputs.
        for i in 0..l {
            let q = x.q(d, idx(i), h);
            let o = &mut out[(idx(i) - a) * dv..(idx(i) - a + 1) * dv];
            let ei = cum[i].exp();
            for (p, qp) in q.iter().enumerate() {
                let f = qp * scale * ei;
                for (ov, sv) in o.iter_mut().zip(&s[p * dv..(p + 1) * dv]) {
                    *ov += f * sv;
                }
            }
            for j in 0..=i {
                let qk: f32 = q.iter().zip(x.k(d, idx(j), h)).map(|(p, q)| p * q).sum();
                let f = qk * scale * (cum[i] - cum[j]).exp();
                for (ov, vv) in o.iter_mut().zip(&vn[j * dv..(j + 1) * dv]) {
                    *ov += f * vv;
                }
            }
        }
        // State update.
        let last = cum[l - 1];
        let el = last.exp();
        s.iter_mut().for_each(|e| *e *= el);
        for j in 0..l {
            let f = (last - cum[j]).exp();
            for (p, kp) in x.k(d, idx(j), h).iter().enumerate() {
                let fk = f * kp;
                for (sv, vv) in s[p * dv..(p + 1) * dv]
                    .iter_mut()
                    .zip(&vn[j * dv..(j + 1) * dv])
                {
                    *sv += fk * vv;
                }
            }
        }
        c0 += l;
    }
    out
}

/// Runs every (sequence, head) in parallel; `states` holds one `[Hv, Dk, Dv]` per range.
#[allow(clippy::too_many_arguments)]
fn run(
    x: &Inputs,
    d: Dims,
    ranges: &[(usize, usize)],
    states: &mut [&mut [f32]],
    scale: f32,
    chunk: Option<usize>,
    y: &mut [f32],
) {
    let sl = d.dk * d.dv;
    let mut jobs: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (si, st) in states.iter_mut().enumerate() {
        for (h, s) in st.chunks_mut(sl).enumerate() {
            jobs.push((si, h, s));
        }
    }
    let outs: Vec<(usize, usize, Vec<f32>)> = jobs
        .into_par_iter()
        .map(|(si, h, s)| {
            let (a, b) = ranges[si];
            let o = match chunk {
                Some(c) => chunked(x, d, h, a, b, scale, c, s),
                None => recurrent(x, d, h, a, b, scale, s),
            };
            (si, h, o)
        })
        .collect();
    for (si, h, o) in outs {
        let a = ranges[si].0;
        for (r, row) in o.chunks(d.dv).enumerate() {
            let t = a + r;
            y[(t * d.hv + h) * d.dv..(t * d.hv + h + 1) * d.dv].copy_from_slice(row);
        }
    }
}

fn dims(i: &[In]) -> Dims {
    Dims {
        hk: i[0].dims()[1],
        dk: i[0].dims()[2],
        hv: i[2].dims()[1],
        dv: i[2].dims()[2],
    }
}

pub(crate) fn delta_net(scale: f32, chunk: Option<usize>, i: &[In], o: &mut [Out]) -> KResult {
    let d = dims(i);
    let (q, k, v, g, beta) = (
        i[0].f32()?,
        i[1].f32()?,
        i[2].f32()?,
        i[3].f32()?,
        i[4].f32()?,
    );
    let mut state = i[5].f32()?.into_owned();
    let t = i[0].dims()[0];
    let ranges = seq_ranges(&i[6].i32()?, t)?;
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
    };
    let per = d.hv * d.dk * d.dv;
    o[0].with_f32(false, |y| {
        let mut states: Vec<&mut [f32]> = state.chunks_mut(per.max(1)).collect();
        run(&x, d, &ranges, &mut states, scale, chunk, y);
        Ok(())
    })?;
    o[1].store_f32(&state)
}

pub(crate) fn delta_net_decode(
    scale: f32,
    qk_l2norm: Option<f32>,
    i: &[In],
    o: &mut [Out],
) -> KResult {
    let d = dims(i);
    let mut q = i[0].f32()?.into_owned();
    let mut k = i[1].f32()?.into_owned();
    if let Some(eps) = qk_l2norm {
        l2_norm_rows(&mut q, d.dk, eps);
        l2_norm_rows(&mut k, d.dk, eps);
    }
    let (v, g, beta) = (i[2].f32()?, i[3].f32()?, i[4].f32()?);
    let n = i[0].dims()[0];
    let ranges: Vec<(usize, usize)> = (0..n).map(|s| (s, s + 1)).collect();
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
    };
    let per = d.hv * d.dk * d.dv;
    let (y, pool) = o.split_at_mut(1);
    let slots = pool_slots(&i[5].i32()?, pool[0].dims()[0])?;
    pool[0].with_f32(true, |pool| {
        // Gather the slots' states (distinct, checked above) in sequence order.
        let mut by_slot: Vec<(usize, &mut [f32])> =
            pool.chunks_mut(per.max(1)).enumerate().collect();
        let mut states: Vec<&mut [f32]> = Vec::with_capacity(n);
        for &slot in &slots {
            let pos = by_slot.iter().position(|(s, _)| *s == slot).unwrap_or(0);
            states.push(by_slot.swap_remove(pos).1);
        }
        y[0].with_f32(false, |y| {
            run(&x, d, &ranges, &mut states, scale, None, y);
            Ok(())
        })
    })
}

/// The family's CPU reference.
pub(super) fn run_op(op: &DeltaNetOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        DeltaNetOp::DeltaNet { scale, chunk } => delta_net(*scale, *chunk, i, o),
        DeltaNetOp::DeltaNetDecode { scale, qk_l2norm } => {
            delta_net_decode(*scale, *qk_l2norm, i, o)
        }
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &DeltaNetOp) -> bool {
    false
}
