//! Naive f64 reference implementations of kiln's op set, written from the doc comments in
//! `core/src/op.rs` alone: nested loops over plainly indexed row-major arrays, no blocking, no
//! online softmax, no chunking. Every input is the exact value a tensor holds (dequantized),
//! widened to f64.

use kiln_core::op::{GluOp, MoeGating, RopeMode, RopeParams, UnaryOp};

/// Mask semantics restated from the `Mask` docs (absolute positions: key `j`, query at `p`).
/// Deliberately not `Mask::allows`, so the CPU's mask helper is under test too.
#[derive(Copy, Clone, Debug)]
pub enum Visible {
    Causal,
    Window(usize),
    All,
    Prefix(usize),
    /// The last `n` of the sequence's `len` keys, whatever the query's position.
    Last(usize),
}

impl Visible {
    pub fn sees(self, p: usize, j: usize, len: usize) -> bool {
        match self {
            Visible::Causal => j <= p,
            Visible::Window(w) => j <= p && p - j < w,
            Visible::All => true,
            Visible::Prefix(n) => j <= p || j < n,
            Visible::Last(n) => len - j <= n,
        }
    }
}

// ---- matmul -----------------------------------------------------------------------------------

/// `y [m, n] = x [m, k] · wᵀ` with `w [n, k]`.
pub fn matmul(x: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                s += x[i * k + p] * w[j * k + p];
            }
            y[i * n + j] = s;
        }
    }
    y
}

/// `Σ_p |x[i, p] · w[j, p]|`: the magnitude that bounds the rounding error of any f32 dot.
pub fn matmul_abs(x: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let xa: Vec<f64> = x.iter().map(|v| v.abs()).collect();
    let wa: Vec<f64> = w.iter().map(|v| v.abs()).collect();
    matmul(&xa, &wa, m, n, k)
}

// ---- elementwise ------------------------------------------------------------------------------

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn unary(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Softplus => {
            if x > 20.0 {
                x
            } else {
                (1.0 + x.exp()).ln()
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Neg => -x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
    }
}

/// erf in f64: its Maclaurin series below 3 (terms under e^9, so 1e-12 of cancellation), the
/// continued fraction of erfc above (converged in 80 terms there).
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let r = if z < 3.0 {
        let (mut term, mut sum, mut n) = (z, z, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(z) = e^{-z²}/√π · 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + …)))).
        let mut f = z;
        for k in (1..80).rev() {
            f = z + (k as f64 / 2.0) / f;
        }
        1.0 - (-z * z).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    r.copysign(x)
}

pub fn glu(g: GluOp, gate: f64, up: f64) -> f64 {
    let act = match g {
        GluOp::SwiGlu => UnaryOp::Silu,
        GluOp::GeGlu => UnaryOp::GeluTanh,
    };
    unary(act, gate) * up
}

/// `a + b` or `a * b` with `b` repeating every `b.len()` elements (rows of `b` repeat).
pub fn binary(a: &[f64], b: &[f64], mul: bool) -> Vec<f64> {
    let mut y = vec![0.0; a.len()];
    for i in 0..a.len() {
        let bv = b[i % b.len()];
        y[i] = if mul { a[i] * bv } else { a[i] + bv };
    }
    y
}

// ---- norms ------------------------------------------------------------------------------------

/// `x / sqrt(mean(x²) + eps) * w` (or `* (1 + w)`) per row of `d`.
pub fn rms_norm(x: &[f64], w: &[f64], d: usize, eps: f64, one_plus: bool) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for r in 0..x.len() / d {
        let mut ss = 0.0;
        for i in 0..d {
            ss += x[r * d + i] * x[r * d + i];
        }
        let rms = (ss / d as f64 + eps).sqrt();
        for i in 0..d {
            let wi = if one_plus { 1.0 + w[i] } else { w[i] };
            y[r * d + i] = x[r * d + i] / rms * wi;
        }
    }
    y
}

/// `x / sqrt(Σx² + eps)` per row of `d`.
pub fn l2_norm(x: &[f64], d: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for r in 0..x.len() / d {
        let mut ss = 0.0;
        for i in 0..d {
            ss += x[r * d + i] * x[r * d + i];
        }
        let n = (ss + eps).sqrt();
        for i in 0..d {
            y[r * d + i] = x[r * d + i] / n;
        }
    }
    y
}

// ---- rope -------------------------------------------------------------------------------------

/// The rotation angle of pair `i` at position `pos`.
pub fn rope_angle(p: &RopeParams, pos: i32, i: usize, factors: Option<&[f64]>) -> f64 {
    let base = p.base as f64;
    let inv = base.powf(-2.0 * i as f64 / p.n_rot as f64);
    let f = factors.map_or(1.0, |f| f[i]);
    pos as f64 * p.freq_scale as f64 * inv / f
}

/// `x [t, h, d]` rotated at positions `pos [t]`.
pub fn rope(
    x: &[f64],
    t: usize,
    h: usize,
    d: usize,
    pos: &[i32],
    p: &RopeParams,
    factors: Option<&[f64]>,
) -> Vec<f64> {
    let mut y = x.to_vec();
    let half = p.n_rot / 2;
    for ti in 0..t {
        for hi in 0..h {
            let base = (ti * h + hi) * d;
            for i in 0..half {
                let a = rope_angle(p, pos[ti], i, factors);
                let c = a.cos() * p.attn_factor as f64;
                let s = a.sin() * p.attn_factor as f64;
                let (ia, ib) = match p.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (x[base + ia], x[base + ib]);
                y[base + ia] = x0 * c - x1 * s;
                y[base + ib] = x0 * s + x1 * c;
            }
        }
    }
    y
}

// ---- softmax ----------------------------------------------------------------------------------

/// Softmax of one row (entries may be `-inf`; at least one is finite).
pub fn softmax(v: &[f64]) -> Vec<f64> {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = v.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

pub fn soft_cap(v: f64, cap: Option<f32>) -> f64 {
    match cap {
        Some(c) => c as f64 * (v / c as f64).tanh(),
        None => v,
    }
}

/// Row softmax of `cap(x · scale) + mask[r % mask_rows]` over rows of `n`.
pub fn softmax_rows(
    x: &[f64],
    n: usize,
    scale: f64,
    cap: Option<f32>,
    mask: Option<&[f64]>,
) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for r in 0..x.len() / n {
        let mut row = Vec::with_capacity(n);
        for j in 0..n {
            let mut v = soft_cap(x[r * n + j] * scale, cap);
            if let Some(m) = mask {
                let mrows = m.len() / n;
                v += m[(r % mrows) * n + j];
            }
            row.push(v);
        }
        y.extend(softmax(&row));
    }
    y
}

// ---- attention --------------------------------------------------------------------------------

/// Attention parameters as the oracle sees them.
#[derive(Copy, Clone, Debug)]
pub struct Attn {
    pub scale: f64,
    pub cap: Option<f32>,
    pub mask: Visible,
}

/// One query row attending over keys `0..len`: `key(j)` and `val(j)` give key position `j`'s
/// rows (only called for visible keys).
pub fn attend_row(
    a: &Attn,
    q: &[f64],
    pos: usize,
    len: usize,
    dv: usize,
    key: impl Fn(usize) -> Vec<f64>,
    val: impl Fn(usize) -> Vec<f64>,
) -> Vec<f64> {
    let visible: Vec<usize> = (0..len).filter(|&j| a.mask.sees(pos, j, len)).collect();
    let mut scores = Vec::new();
    for &j in &visible {
        let k = key(j);
        let mut s = 0.0;
        for i in 0..q.len() {
            s += q[i] * k[i];
        }
        scores.push(soft_cap(s * a.scale, a.cap));
    }
    let w = softmax(&scores);
    let mut out = vec![0.0; dv];
    for (n, &j) in visible.iter().enumerate() {
        let v = val(j);
        for e in 0..dv {
            out[e] += w[n] * v[e];
        }
    }
    out
}

/// Dimensions of an attention call.
#[derive(Copy, Clone, Debug)]
pub struct AttnDims {
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub dv: usize,
}

/// `q [t, hq, d]`, `k [s, hkv, d]`, `v [s, hkv, dv]`; query `i` at position `s - t + i`;
/// query head `h` reads kv head `h / (hq / hkv)`.
pub fn attention(
    a: &Attn,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    t: usize,
    s: usize,
    dm: AttnDims,
) -> Vec<f64> {
    let AttnDims { hq, hkv, d, dv } = dm;
    let group = hq / hkv;
    let mut y = Vec::with_capacity(t * hq * dv);
    for ti in 0..t {
        for h in 0..hq {
            let g = h / group;
            let qr = &q[(ti * hq + h) * d..(ti * hq + h + 1) * d];
            y.extend(attend_row(
                a,
                qr,
                s - t + ti,
                s,
                dv,
                |j| k[(j * hkv + g) * d..(j * hkv + g + 1) * d].to_vec(),
                |j| v[(j * hkv + g) * dv..(j * hkv + g + 1) * dv].to_vec(),
            ));
        }
    }
    y
}

/// Paged attention: caches `[blocks, bs, hkv, d]` (dequantized), `table [S, max_blocks]`,
/// per-sequence context lengths and query-row starts.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    a: &Attn,
    q: &[f64],
    kc: &[f64],
    vc: &[f64],
    bs: usize,
    table: &[i32],
    max_blocks: usize,
    seq_lens: &[i32],
    q_start: &[i32],
    dm: AttnDims,
) -> Vec<f64> {
    let AttnDims { hq, hkv, d, dv } = dm;
    let group = hq / hkv;
    let t = *q_start.last().unwrap() as usize;
    let mut y = vec![0.0; t * hq * dv];
    for s in 0..seq_lens.len() {
        let len = seq_lens[s] as usize;
        let (r0, r1) = (q_start[s] as usize, q_start[s + 1] as usize);
        let qlen = r1 - r0;
        // Cache row of key position `j` of this sequence (block table lookup).
        let row = |j: usize| -> usize {
            let blk = table[s * max_blocks + j / bs];
            assert!(blk >= 0, "oracle read a released block (seq {s}, key {j})");
            blk as usize * bs + j % bs
        };
        for (i, r) in (r0..r1).enumerate() {
            let pos = len - qlen + i;
            for h in 0..hq {
                let g = h / group;
                let out = attend_row(
                    a,
                    &q[(r * hq + h) * d..(r * hq + h + 1) * d],
                    pos,
                    len,
                    dv,
                    |j| kc[(row(j) * hkv + g) * d..(row(j) * hkv + g + 1) * d].to_vec(),
                    |j| vc[(row(j) * hkv + g) * dv..(row(j) * hkv + g + 1) * dv].to_vec(),
                );
                y[(r * hq + h) * dv..(r * hq + h + 1) * dv].copy_from_slice(&out);
            }
        }
    }
    y
}

// ---- selection --------------------------------------------------------------------------------

/// Indices of the `k` largest of `row`, largest first, ties to the lower index: repeated
/// selection of the maximum with a strict `>` scan.
pub fn top_k(row: &[f64], k: usize) -> Vec<usize> {
    let mut used = vec![false; row.len()];
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for j in 0..row.len() {
            if used[j] {
                continue;
            }
            if best.is_none_or(|b| row[j] > row[b]) {
                best = Some(j);
            }
        }
        let b = best.unwrap();
        used[b] = true;
        out.push(b);
    }
    out
}

/// Router weights and ids for one row of logits.
pub fn moe_route(
    logits: &[f64],
    k: usize,
    gating: MoeGating,
    normalize: bool,
) -> (Vec<f64>, Vec<usize>) {
    let p: Vec<f64> = match gating {
        MoeGating::Softmax => softmax(logits),
        MoeGating::Sigmoid => logits.iter().map(|&x| sigmoid(x)).collect(),
    };
    let ids = top_k(&p, k);
    let mut w: Vec<f64> = ids.iter().map(|&i| p[i]).collect();
    if normalize {
        let s: f64 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= s);
    }
    (w, ids)
}

// ---- conv1d -----------------------------------------------------------------------------------

/// One sequence of the causal depthwise conv: `x [l, c]` after `state [kw-1, c]` (oldest first).
/// `y[t, ch] = Σ_k w[ch, k] · in[t - (kw-1) + k, ch]`, where inputs before the sequence come
/// from the state. Returns `y` and the new state (the last `kw-1` inputs).
pub fn conv1d_seq(
    x: &[f64],
    w: &[f64],
    state: &[f64],
    c: usize,
    kw: usize,
    silu: bool,
) -> (Vec<f64>, Vec<f64>) {
    let l = x.len() / c;
    let input = |t: isize, ch: usize| -> f64 {
        if t >= 0 {
            x[t as usize * c + ch]
        } else {
            state[((kw - 1) as isize + t) as usize * c + ch]
        }
    };
    let mut y = vec![0.0; l * c];
    for t in 0..l {
        for ch in 0..c {
            let mut s = 0.0;
            for k in 0..kw {
                s += w[ch * kw + k] * input(t as isize - (kw as isize - 1) + k as isize, ch);
            }
            y[t * c + ch] = if silu { s * sigmoid(s) } else { s };
        }
    }
    let mut new_state = vec![0.0; (kw - 1) * c];
    for r in 0..kw - 1 {
        let t = l as isize - (kw as isize - 1) + r as isize;
        for ch in 0..c {
            new_state[r * c + ch] = input(t, ch);
        }
    }
    (y, new_state)
}

/// Conv1d over sequences `seq_start[s]..seq_start[s+1]`, states `[S, kw-1, c]`.
pub fn conv1d(
    x: &[f64],
    w: &[f64],
    state: &[f64],
    seq_start: &[i32],
    c: usize,
    kw: usize,
    silu: bool,
) -> (Vec<f64>, Vec<f64>) {
    let sl = (kw - 1) * c;
    let mut y = Vec::new();
    let mut st_out = Vec::new();
    for s in 0..seq_start.len() - 1 {
        let (a, b) = (seq_start[s] as usize, seq_start[s + 1] as usize);
        let (ys, st) = conv1d_seq(
            &x[a * c..b * c],
            w,
            &state[s * sl..(s + 1) * sl],
            c,
            kw,
            silu,
        );
        y.extend(ys);
        st_out.extend(st);
    }
    (y, st_out)
}

// ---- gated delta net --------------------------------------------------------------------------

/// Head counts and sizes of a DeltaNet call.
#[derive(Copy, Clone, Debug)]
pub struct DnDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// One token of one value head, state `st [dk, dv]` updated in place:
/// `S = e^g·S;  S += k ⊗ β(v − Sᵀk);  o = Sᵀ(q·scale)`.
#[allow(clippy::too_many_arguments)]
pub fn delta_step(
    st: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: f64,
    beta: f64,
    scale: f64,
    dk: usize,
    dv: usize,
) -> Vec<f64> {
    let decay = g.exp();
    for e in st.iter_mut() {
        *e *= decay;
    }
    for j in 0..dv {
        let mut stk = 0.0;
        for i in 0..dk {
            stk += st[i * dv + j] * k[i];
        }
        let delta = beta * (v[j] - stk);
        for i in 0..dk {
            st[i * dv + j] += k[i] * delta;
        }
    }
    let mut o = vec![0.0; dv];
    for j in 0..dv {
        for i in 0..dk {
            o[j] += st[i * dv + j] * q[i] * scale;
        }
    }
    o
}

/// The whole recurrence, token by token: `q, k [T, hk, dk]`, `v [T, hv, dv]`, `g, beta [T, hv]`,
/// `state [S, hv, dk, dv]`; value head `h` reads key head `h / (hv / hk)`.
#[allow(clippy::too_many_arguments)]
pub fn delta_net(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: &[f64],
    beta: &[f64],
    state: &[f64],
    seq_start: &[i32],
    dm: DnDims,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let DnDims { hk, hv, dk, dv } = dm;
    let t_total = *seq_start.last().unwrap() as usize;
    let mut o = vec![0.0; t_total * hv * dv];
    let mut st = state.to_vec();
    for s in 0..seq_start.len() - 1 {
        for h in 0..hv {
            let kh = h / (hv / hk);
            let base = (s * hv + h) * dk * dv;
            let sh = &mut st[base..base + dk * dv];
            for t in seq_start[s] as usize..seq_start[s + 1] as usize {
                let out = delta_step(
                    sh,
                    &q[(t * hk + kh) * dk..(t * hk + kh + 1) * dk],
                    &k[(t * hk + kh) * dk..(t * hk + kh + 1) * dk],
                    &v[(t * hv + h) * dv..(t * hv + h + 1) * dv],
                    g[t * hv + h],
                    beta[t * hv + h],
                    scale,
                    dk,
                    dv,
                );
                o[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(&out);
            }
        }
    }
    (o, st)
}

// ---- float rounding ---------------------------------------------------------------------------

/// Rounds `x` to nearest, ties to even, on a binary float grid with `p` bits of precision
/// (hidden bit included), smallest normal exponent `emin` and largest finite value `max`;
/// beyond the overflow threshold the result is infinite, as IEEE conversion does.
fn round_float(x: f64, p: i32, emin: i32, max: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    // The binade of x: 2^e <= |x| < 2^(e+1) (log2 may be off by one next to a power of two).
    let mut e = x.abs().log2().floor() as i32;
    while 2f64.powi(e) > x.abs() {
        e -= 1;
    }
    while 2f64.powi(e + 1) <= x.abs() {
        e += 1;
    }
    let e = e.max(emin);
    let q = 2f64.powi(e - (p - 1)); // spacing of the grid around x
    let n = x / q;
    let mut r = n.round();
    if (n - n.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r -= n.signum(); // a tie: take the even neighbour
    }
    let y = r * q;
    // Overflow: anything at or beyond max + half a spacing rounds to infinity.
    let top = 2f64.powi((max.log2().floor() as i32) - (p - 1));
    if y.abs() > max || x.abs() >= max + top / 2.0 {
        return f64::INFINITY.copysign(x);
    }
    y
}

/// IEEE binary16: 11 bits of precision, normals from 2^-14, max 65504.
pub fn round_f16(x: f64) -> f64 {
    round_float(x, 11, -14, 65504.0)
}

/// bfloat16: 8 bits of precision, f32's exponent range.
pub fn round_bf16(x: f64) -> f64 {
    round_float(x, 8, -126, (2.0 - 2f64.powi(-7)) * 2f64.powi(127))
}

/// A TurboQuant cache block (`tq4`/`tq3`/`tq2`, layout documented in kiln's
/// `quant/turbo.rs`) decoded the slow way: the f16 scale, then code `i` read one bit at a
/// time from the little-endian bit stream after it, looked up in `codebook` (increasing),
/// times the scale in f32.
pub fn dequant_tq_block(block: &[u8], bits: usize, codebook: &[f32]) -> Vec<f64> {
    let s = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
    (0..32)
        .map(|i| {
            let mut code = 0usize;
            for b in 0..bits {
                let at = i * bits + b;
                let bit = (block[2 + at / 8] >> (at % 8)) & 1;
                code |= (bit as usize) << b;
            }
            // The product is an f32 one, as the format defines it.
            (s * codebook[code]) as f64
        })
        .collect()
}
