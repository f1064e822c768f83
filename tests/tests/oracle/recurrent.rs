//! The stateful ops: conv1d over sequences and its decode step on a state pool, and the Gated
//! DeltaNet in its recurrent and chunked forms and its fused decode step.

use kiln_core::op::{ConvOp, DeltaNetOp, Op};
use kiln_core::validate::rng::Rng;
use kiln_core::DType::*;
use kiln_core::Tensor;

use super::harness::*;
use super::naive::{self, DnDims};

#[test]
fn conv1d_several_sequences_state_carried() {
    let kx = kiln();
    let mut rng = Rng::new(30);
    let c = 7;
    // Lengths 5, 0 (state passes through), 1 (shorter than the window) and 13.
    let seq_start = [0, 5, 5, 6, 19];
    let (t, ns) = (19, 4);
    for kw in [4, 2] {
        for silu in [false, true] {
            for dt in [F32, F16] {
                let (x, xv) = kx.tensor(dt, &[t, c], &normal(&mut rng, t * c, 1.0));
                let (w, wv) = kx.tensor(F32, &[c, kw], &normal(&mut rng, c * kw, 0.7));
                let sn = ns * (kw - 1) * c;
                // The state in the activation's dtype (state_out keeps it).
                let (st, stv) = kx.tensor(dt, &[ns, kw - 1, c], &normal(&mut rng, sn, 1.0));
                let ss = kx.ints(&[ns + 1], &seq_start);
                let y = kx.run(&Op::Conv(ConvOp::Conv1d { silu }), &[&x, &w, &st, &ss]);
                let (wy, wst) = naive::conv1d(&xv, &wv, &stv, &seq_start, c, kw, silu);
                let what = format!("conv1d {dt} k {kw} silu {silu}");
                assert_close(&what, &kx.f32(&y[0]), &wy, dt, 1e-6, 1e-5);
                // The new state is made of inputs (and old state): exact in any dtype.
                assert_eq!(y[1].dtype(), dt);
                assert_exact(&format!("{what} state"), &kx.f32(&y[1]), &wst);
            }
        }
    }
}

#[test]
fn conv1d_decode_updates_only_its_slots() {
    let kx = kiln();
    let mut rng = Rng::new(31);
    let (s, p, c, kw) = (3, 6, 9, 4);
    for silu in [false, true] {
        let (x, xv) = kx.tensor(F32, &[s, c], &normal(&mut rng, s * c, 1.0));
        let (w, wv) = kx.tensor(F32, &[c, kw], &normal(&mut rng, c * kw, 0.7));
        let slotv: Vec<i32> = rng.permutation(p)[..s].iter().map(|&v| v as i32).collect();
        let slots = kx.ints(&[s], &slotv);
        let sl = (kw - 1) * c;
        let (pool, poolv) = kx.tensor(F32, &[p, kw - 1, c], &normal(&mut rng, p * sl, 1.0));
        let y = kx.alloc(F32, &[s, c]);
        kx.exec(
            &Op::Conv(ConvOp::Conv1dDecode { silu }),
            &[&x, &w, &slots],
            &[&y, &pool],
        )
        .unwrap();
        let mut wy = Vec::new();
        let mut wpool = poolv.clone();
        for si in 0..s {
            let slot = slotv[si] as usize;
            let st = &poolv[slot * sl..(slot + 1) * sl];
            let (ys, st2) = naive::conv1d_seq(&xv[si * c..(si + 1) * c], &wv, st, c, kw, silu);
            wy.extend(ys);
            wpool[slot * sl..(slot + 1) * sl].copy_from_slice(&st2);
        }
        assert_close(
            &format!("conv1d_decode silu {silu}"),
            &kx.f32(&y),
            &wy,
            F32,
            1e-6,
            1e-5,
        );
        // Slots not named keep their contents exactly; the named ones shift in x.
        assert_exact(
            &format!("conv1d_decode silu {silu} pool"),
            &kx.f32(&pool),
            &wpool,
        );
    }
}

/// DeltaNet inputs as the model feeds them: unit-norm q and k rows, β = σ(·) ∈ (0, 1) and a
/// log decay g ≤ 0 whose range depends on the head, so some heads remember across whole
/// 64-token chunks (g ∈ (-0.05, 0]) and others forget within a few tokens (g ∈ (-4, 0]).
struct DnCase {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl DnCase {
    fn new(rng: &mut Rng, t: usize, dm: DnDims) -> Self {
        DnCase {
            q: unit_rows(rng, t * dm.hk, dm.dk),
            k: unit_rows(rng, t * dm.hk, dm.dk),
            v: normal(rng, t * dm.hv * dm.dv, 1.0),
            g: (0..t * dm.hv)
                .map(|i| -[0.05, 0.5, 4.0][i % dm.hv % 3] * rng.uniform(0.0, 1.0).powi(2))
                .collect(),
            beta: (0..t * dm.hv)
                .map(|_| 1.0 / (1.0 + (-rng.normal()).exp()))
                .collect(),
        }
    }
}

/// DeltaNet tolerance. Over a sequence the f32 state accumulates rounding (each token adds a
/// few ulps of |S|; the decay and the β < 1 projection on unit-norm keys keep it from
/// growing). Observed errors stay under 1e-6·(1 + |x|) for sequences of up to 150 tokens, the
/// chunked forms included; this bound leaves a margin of about 10x.
const DN_TOL: f64 = 1e-5;

#[test]
fn delta_net_recurrent_and_chunked_match_the_f64_recurrence() {
    let kx = kiln();
    let mut rng = Rng::new(32);
    let cases: [(DnDims, &[i32]); 3] = [
        // GQA (Hv = 2·Hk), sequences of 1, 0, 37 and 70 tokens (70 = a full 64-chunk + 6).
        (
            DnDims {
                hk: 2,
                hv: 4,
                dk: 16,
                dv: 12,
            },
            &[0, 1, 1, 38, 108],
        ),
        // Hv = Hk, sequences around the 64-token chunk boundary.
        (
            DnDims {
                hk: 3,
                hv: 3,
                dk: 8,
                dv: 8,
            },
            &[0, 5, 69, 134],
        ),
        // Wider heads, one long sequence.
        (
            DnDims {
                hk: 1,
                hv: 2,
                dk: 32,
                dv: 24,
            },
            &[0, 150],
        ),
    ];
    for (dm, seq_start) in cases {
        let DnDims { hk, hv, dk, dv } = dm;
        let t = *seq_start.last().unwrap() as usize;
        let ns = seq_start.len() - 1;
        let inp = DnCase::new(&mut rng, t, dm);
        let scale = 1.0 / (dk as f32).sqrt();
        let (q, qv) = kx.tensor(F32, &[t, hk, dk], &inp.q);
        let (k, kv) = kx.tensor(F32, &[t, hk, dk], &inp.k);
        let (v, vv) = kx.tensor(F32, &[t, hv, dv], &inp.v);
        let (g, gv) = kx.tensor(F32, &[t, hv], &inp.g);
        let (b, bv) = kx.tensor(F32, &[t, hv], &inp.beta);
        let sn = ns * hv * dk * dv;
        let (st, stv) = kx.tensor(F32, &[ns, hv, dk, dv], &normal(&mut rng, sn, 0.5));
        let ss = kx.ints(&[ns + 1], seq_start);
        let (wo, wst) =
            naive::delta_net(&qv, &kv, &vv, &gv, &bv, &stv, seq_start, dm, scale as f64);
        for chunk in [None, Some(1), Some(3), Some(64)] {
            let y = kx.run(
                &Op::DeltaNet(DeltaNetOp::DeltaNet { scale, chunk }),
                &[&q, &k, &v, &g, &b, &st, &ss],
            );
            let what = format!("delta_net chunk {chunk:?} {dm:?} seqs {seq_start:?}");
            assert_close(&what, &kx.f32(&y[0]), &wo, F32, DN_TOL, DN_TOL);
            assert_close(
                &format!("{what} state"),
                &kx.f32(&y[1]),
                &wst,
                F32,
                DN_TOL,
                DN_TOL,
            );
        }
    }
}

#[test]
fn delta_net_half_precision_inputs_and_outputs() {
    let kx = kiln();
    let mut rng = Rng::new(33);
    let dm = DnDims {
        hk: 1,
        hv: 2,
        dk: 16,
        dv: 16,
    };
    let seq_start = [0, 20, 45];
    let (t, ns) = (45, 2);
    let inp = DnCase::new(&mut rng, t, dm);
    let (q, qv) = kx.tensor(BF16, &[t, 1, 16], &inp.q);
    let (k, kv) = kx.tensor(BF16, &[t, 1, 16], &inp.k);
    let (v, vv) = kx.tensor(BF16, &[t, 2, 16], &inp.v);
    let (g, gv) = kx.tensor(F32, &[t, 2], &inp.g);
    let (b, bv) = kx.tensor(F16, &[t, 2], &inp.beta);
    let (st, stv) = kx.tensor(F16, &[ns, 2, 16, 16], &normal(&mut rng, ns * 2 * 256, 0.5));
    let ss = kx.ints(&[ns + 1], &seq_start);
    let (wo, wst) = naive::delta_net(&qv, &kv, &vv, &gv, &bv, &stv, &seq_start, dm, 0.25);
    for chunk in [None, Some(8)] {
        let y = kx.run(
            &Op::DeltaNet(DeltaNetOp::DeltaNet { scale: 0.25, chunk }),
            &[&q, &k, &v, &g, &b, &st, &ss],
        );
        assert_eq!((y[0].dtype(), y[1].dtype()), (BF16, F16));
        let what = format!("delta_net bf16/f16 chunk {chunk:?}");
        assert_close(&what, &kx.f32(&y[0]), &wo, BF16, DN_TOL, DN_TOL);
        assert_close(
            &format!("{what} state"),
            &kx.f32(&y[1]),
            &wst,
            F16,
            DN_TOL,
            DN_TOL,
        );
    }
}

#[test]
fn delta_net_decode_on_a_state_pool() {
    let kx = kiln();
    let mut rng = Rng::new(34);
    let dm = DnDims {
        hk: 2,
        hv: 4,
        dk: 16,
        dv: 8,
    };
    let DnDims { hk, hv, dk, dv } = dm;
    let (s, p) = (3, 7);
    let per = hv * dk * dv;
    for qk_l2norm in [None, Some(1e-6f32), Some(0.5)] {
        // Raw q and k when the op normalises them, unit rows otherwise.
        let (qd, kd) = match qk_l2norm {
            Some(_) => (
                normal(&mut rng, s * hk * dk, 1.0),
                normal(&mut rng, s * hk * dk, 1.0),
            ),
            None => (
                unit_rows(&mut rng, s * hk, dk),
                unit_rows(&mut rng, s * hk, dk),
            ),
        };
        let inp = DnCase::new(&mut rng, s, dm);
        let (q, qv) = kx.tensor(F32, &[s, hk, dk], &qd);
        let (k, kv) = kx.tensor(F32, &[s, hk, dk], &kd);
        let (v, vv) = kx.tensor(F32, &[s, hv, dv], &inp.v);
        let (g, gv) = kx.tensor(F32, &[s, hv], &inp.g);
        let (b, bv) = kx.tensor(F32, &[s, hv], &inp.beta);
        let slotv: Vec<i32> = rng.permutation(p)[..s].iter().map(|&x| x as i32).collect();
        let slots = kx.ints(&[s], &slotv);
        let (pool, poolv) = kx.tensor(F32, &[p, hv, dk, dv], &normal(&mut rng, p * per, 0.5));
        let o: Tensor = kx.alloc(F32, &[s, hv, dv]);
        let op = Op::DeltaNet(DeltaNetOp::DeltaNetDecode {
            scale: 0.3,
            qk_l2norm,
        });
        kx.exec(&op, &[&q, &k, &v, &g, &b, &slots], &[&o, &pool])
            .unwrap();
        // Oracle: normalise, then one recurrence step per sequence on its slot's state.
        let (qn, kn) = match qk_l2norm {
            Some(eps) => (
                naive::l2_norm(&qv, dk, eps as f64),
                naive::l2_norm(&kv, dk, eps as f64),
            ),
            None => (qv.clone(), kv.clone()),
        };
        let mut wpool = poolv.clone();
        let mut wo = Vec::new();
        for si in 0..s {
            let slot = slotv[si] as usize;
            let seq = [0, 1];
            let row = |x: &[f64], h: usize, w: usize| x[(si * h) * w..(si + 1) * h * w].to_vec();
            let (os, st2) = naive::delta_net(
                &row(&qn, hk, dk),
                &row(&kn, hk, dk),
                &row(&vv, hv, dv),
                &row(&gv, hv, 1),
                &row(&bv, hv, 1),
                &poolv[slot * per..(slot + 1) * per],
                &seq,
                dm,
                0.3f32 as f64,
            );
            wo.extend(os);
            wpool[slot * per..(slot + 1) * per].copy_from_slice(&st2);
        }
        let what = format!("delta_net_decode qk_l2norm {qk_l2norm:?} slots {slotv:?}");
        assert_close(&what, &kx.f32(&o), &wo, F32, 1e-6, 1e-5);
        let got_pool = kx.f32(&pool);
        assert_close(&format!("{what} pool"), &got_pool, &wpool, F32, 1e-6, 1e-5);
        for slot in (0..p).filter(|x| !slotv.contains(&(*x as i32))) {
            let r = slot * per..(slot + 1) * per;
            assert_exact(
                &format!("{what} untouched slot {slot}"),
                &got_pool[r.clone()],
                &poolv[r],
            );
        }
    }
}

/// A sequence split across two calls, the state output of the first fed to the second, gives
/// the oracle's result for the whole sequence (prefill in pieces, then decode).
#[test]
fn state_carried_across_calls() {
    let kx = kiln();
    let mut rng = Rng::new(35);
    let (t, split) = (23, 9);

    // Conv1d.
    let (c, kw) = (6, 4);
    let x = normal(&mut rng, t * c, 1.0);
    let (w, wv) = kx.tensor(F32, &[c, kw], &normal(&mut rng, c * kw, 0.7));
    let (st0, st0v) = kx.tensor(F32, &[1, kw - 1, c], &normal(&mut rng, (kw - 1) * c, 1.0));
    let (xa, _) = kx.tensor(F32, &[split, c], &x[..split * c]);
    let (xb, _) = kx.tensor(F32, &[t - split, c], &x[split * c..]);
    let op = Op::Conv(ConvOp::Conv1d { silu: true });
    let a = kx.run(&op, &[&xa, &w, &st0, &kx.ints(&[2], &[0, split as i32])]);
    let b = kx.run(
        &op,
        &[&xb, &w, &a[1], &kx.ints(&[2], &[0, (t - split) as i32])],
    );
    let (wy, wst) = naive::conv1d(&f64s(&x), &wv, &st0v, &[0, t as i32], c, kw, true);
    let got = [kx.f32(&a[0]), kx.f32(&b[0])].concat();
    assert_close("conv1d in two calls", &got, &wy, F32, 1e-6, 1e-5);
    assert_exact("conv1d in two calls, state", &kx.f32(&b[1]), &wst);

    // DeltaNet: a chunked call, then a recurrent one.
    let dm = DnDims {
        hk: 1,
        hv: 2,
        dk: 8,
        dv: 8,
    };
    let inp = DnCase::new(&mut rng, t, dm);
    let (s0, s0v) = kx.tensor(F32, &[1, 2, 8, 8], &normal(&mut rng, 128, 0.5));
    let part = |r: std::ops::Range<usize>| {
        let n = r.len();
        let (q, _) = kx.tensor(F32, &[n, 1, 8], &inp.q[r.start * 8..r.end * 8]);
        let (k, _) = kx.tensor(F32, &[n, 1, 8], &inp.k[r.start * 8..r.end * 8]);
        let (v, _) = kx.tensor(F32, &[n, 2, 8], &inp.v[r.start * 16..r.end * 16]);
        let (g, _) = kx.tensor(F32, &[n, 2], &inp.g[r.start * 2..r.end * 2]);
        let (b, _) = kx.tensor(F32, &[n, 2], &inp.beta[r.start * 2..r.end * 2]);
        (q, k, v, g, b, kx.ints(&[2], &[0, n as i32]))
    };
    let (q, k, v, g, b, ss) = part(0..split);
    let a = kx.run(
        &Op::DeltaNet(DeltaNetOp::DeltaNet {
            scale: 0.35,
            chunk: Some(4),
        }),
        &[&q, &k, &v, &g, &b, &s0, &ss],
    );
    let (q, k, v, g, b, ss) = part(split..t);
    let b = kx.run(
        &Op::DeltaNet(DeltaNetOp::DeltaNet {
            scale: 0.35,
            chunk: None,
        }),
        &[&q, &k, &v, &g, &b, &a[1], &ss],
    );
    let (wo, wst) = naive::delta_net(
        &f64s(&inp.q),
        &f64s(&inp.k),
        &f64s(&inp.v),
        &f64s(&inp.g),
        &f64s(&inp.beta),
        &s0v,
        &[0, t as i32],
        dm,
        0.35f32 as f64,
    );
    let got = [kx.f32(&a[0]), kx.f32(&b[0])].concat();
    assert_close("delta_net in two calls", &got, &wo, F32, DN_TOL, DN_TOL);
    assert_close(
        "delta_net in two calls, state",
        &kx.f32(&b[1]),
        &wst,
        F32,
        DN_TOL,
        DN_TOL,
    );
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}
