//! The CPU reference backend checked against naive f64 implementations of every op.
//!
//! The CPU backend is the oracle every other backend is judged by, so it is itself checked
//! here against plain nested-loop f64 code written from the op docs (`core/src/op.rs`), in
//! `oracle/naive.rs`. Inputs are random (never zeros) at odd sizes; quantized and half
//! tensors are made with `quantize` and the oracle computes on the exact values they hold
//! (`dequantize`), so every tolerance bounds the CPU's f32 arithmetic (and the rounding of a
//! half-precision output), never the storage format. Each check prints its worst
//! error/bound ratio (`cargo test -p kiln-tests --test oracle -- --nocapture`).
//!
//! - `oracle/naive.rs`: the f64 implementations.
//! - `oracle/harness.rs`: tensors, random inputs, bound checks.
//! - `oracle/dense.rs`: matmuls, lookups, elementwise, norms, rope, softmax, selection,
//!   routing, cast/copy, fused matmuls.
//! - `oracle/attention.rs`: attention, paged attention, KV write.
//! - `oracle/recurrent.rs`: conv1d and Gated DeltaNet (sequence and decode forms).
//! - here: bad data in index tensors, and hand-worked checks of the naive code itself.

#[path = "oracle/attention.rs"]
mod attention;
#[path = "oracle/dense.rs"]
mod dense;
#[path = "oracle/harness.rs"]
mod harness;
#[path = "oracle/naive.rs"]
mod naive;
#[path = "oracle/recurrent.rs"]
mod recurrent;

use kiln_core::op::{
    AttentionOp, AttnParams, ConvOp, DeltaNetOp, GetRowsOp, Mask, MoeOp, Op, RopeMode, RopeParams,
};
use kiln_core::validate::rng::Rng;
use kiln_core::DType::*;

use harness::*;

/// Index tensors with bad data are refused with an error, never a panic or a wild read. Each
/// case runs first with good indices (which must succeed, so the error cannot come from the
/// call's shapes), then with each bad variant.
#[test]
fn bad_indices_are_errors() {
    let kx = kiln();
    let mut rng = Rng::new(40);
    let expect = |what: &str, good: bool, r: kiln_core::Result<()>| match (good, r) {
        (true, Err(e)) => panic!("{what}: good indices refused: {e}"),
        (false, Ok(())) => panic!("{what}: bad indices accepted"),
        (false, Err(e)) => eprintln!("{what}: {e}"),
        (true, Ok(())) => {}
    };

    // GetRows: an id past the table, and a negative one.
    let (table, _) = kx.tensor(Q8_0, &[4, 32], &normal(&mut rng, 128, 1.0));
    for (id, good) in [(3, true), (4, false), (-1, false)] {
        let ids = kx.ints(&[3], &[0, id, 2]);
        let r = kx
            .try_run(&Op::GetRows(GetRowsOp::GetRows), &[&table, &ids])
            .map(drop);
        expect(&format!("get_rows id {id}"), good, r);
    }

    // MatMulId: an expert id past the experts.
    let (x, _) = kx.tensor(F32, &[2, 32], &normal(&mut rng, 64, 1.0));
    let (w, _) = kx.tensor(F16, &[3, 5, 32], &normal(&mut rng, 480, 1.0));
    for (id, good) in [(2, true), (3, false), (-1, false)] {
        let ids = kx.ints(&[2, 2], &[0, 1, id, 2]);
        let r = kx
            .try_run(&Op::Moe(MoeOp::MatMulId), &[&x, &w, &ids])
            .map(drop);
        expect(&format!("mat_mul_id expert {id} of 3"), good, r);
    }

    // PagedAttention: a block id past the cache, or released, inside the context (7 keys in
    // blocks of 4 use both table entries).
    let (nb, bs) = (3, 4);
    let (q, _) = kx.tensor(F32, &[1, 2, 8], &normal(&mut rng, 16, 1.0));
    let (kc, _) = kx.tensor(F16, &[nb, bs, 1, 8], &normal(&mut rng, nb * bs * 8, 1.0));
    let (vc, _) = kx.tensor(F16, &[nb, bs, 1, 8], &normal(&mut rng, nb * bs * 8, 1.0));
    let (sl, qs) = (kx.ints(&[1], &[7]), kx.ints(&[2], &[0, 1]));
    let p = AttnParams {
        scale: 0.3,
        soft_cap: None,
        mask: Mask::Causal,
    };
    for (table, good) in [([2, 0], true), ([1, 3], false), ([-1, 0], false)] {
        let tab = kx.ints(&[1, 2], &table);
        let r = kx.try_run(
            &Op::Attention(AttentionOp::PagedAttention(p)),
            &[&q, &kc, &vc, &tab, &sl, &qs],
        );
        expect(
            &format!("paged_attention table {table:?}"),
            good,
            r.map(drop),
        );
    }

    // KvWrite: a slot past the cache.
    let (k, _) = kx.tensor(F32, &[2, 1, 8], &normal(&mut rng, 16, 1.0));
    for (slot, good) in [(11, true), (12, false)] {
        let slots = kx.ints(&[2], &[0, slot]);
        let r = kx.exec(
            &Op::Attention(AttentionOp::KvWrite),
            &[&k, &k, &slots],
            &[&kc, &vc],
        );
        expect(&format!("kv_write slot {slot} of 12"), good, r);
    }

    // DeltaNetDecode: two sequences on one state slot, and a slot past the pool.
    let (hk, hv, dk, dv, np) = (1, 2, 4, 4, 3);
    let (q, _) = kx.tensor(F32, &[2, hk, dk], &normal(&mut rng, 8, 1.0));
    let (v, _) = kx.tensor(F32, &[2, hv, dv], &normal(&mut rng, 16, 1.0));
    let (g, _) = kx.tensor(F32, &[2, hv], &[-0.1, -0.2, -0.3, -0.4]);
    let (beta, _) = kx.tensor(F32, &[2, hv], &[0.1, 0.2, 0.3, 0.4]);
    let o = kx.alloc(F32, &[2, hv, dv]);
    let (pool, _) = kx.tensor(F32, &[np, hv, dk, dv], &normal(&mut rng, np * 32, 1.0));
    let op = Op::DeltaNet(DeltaNetOp::DeltaNetDecode {
        scale: 0.5,
        qk_l2norm: None,
    });
    for (slots, good) in [([2, 0], true), ([1, 1], false), ([0, 3], false)] {
        let st = kx.ints(&[2], &slots);
        let r = kx.exec(&op, &[&q, &q, &v, &g, &beta, &st], &[&o, &pool]);
        expect(&format!("delta_net_decode slots {slots:?}"), good, r);
    }

    // Conv1dDecode: two sequences on one state slot.
    let (x, _) = kx.tensor(F32, &[2, 5], &normal(&mut rng, 10, 1.0));
    let (w, _) = kx.tensor(F32, &[5, 3], &normal(&mut rng, 15, 1.0));
    let y = kx.alloc(F32, &[2, 5]);
    let (pool, _) = kx.tensor(F32, &[4, 2, 5], &normal(&mut rng, 40, 1.0));
    for (slots, good) in [([3, 2], true), ([2, 2], false), ([0, -1], false)] {
        let st = kx.ints(&[2], &slots);
        let op = Op::Conv(ConvOp::Conv1dDecode { silu: false });
        let r = kx.exec(&op, &[&x, &w, &st], &[&y, &pool]);
        expect(&format!("conv1d_decode slots {slots:?}"), good, r);
    }
}

/// The naive implementations on inputs small enough to work by hand.
#[test]
fn naive_oracle_hand_checks() {
    // Rope: position 1 with n_rot = 2 and base 1 turns the pair by 1 radian; the rest passes.
    let p = RopeParams::new(RopeMode::Normal, 2, 1.0);
    let y = naive::rope(&[1.0, 0.0, 5.0], 1, 1, 3, &[1], &p, None);
    assert!((y[0] - 1f64.cos()).abs() < 1e-15 && (y[1] - 1f64.sin()).abs() < 1e-15);
    assert_eq!(y[2], 5.0);
    // Neox pairs halves: (x0, x2) and (x1, x3) with inverse frequencies 1 and base^(-1/2).
    let p = RopeParams::new(RopeMode::Neox, 4, 100.0);
    let y = naive::rope(&[1.0, 1.0, 0.0, 0.0], 1, 1, 4, &[10], &p, None);
    assert!((y[0] - 10f64.cos()).abs() < 1e-15 && (y[2] - 10f64.sin()).abs() < 1e-15);
    assert!((y[1] - 1f64.cos()).abs() < 1e-15 && (y[3] - 1f64.sin()).abs() < 1e-15);

    // Softmax of (0, ln 2, -inf) is (1/3, 2/3, 0).
    let s = naive::softmax(&[0.0, 2f64.ln(), f64::NEG_INFINITY]);
    assert!((s[0] - 1.0 / 3.0).abs() < 1e-15 && (s[1] - 2.0 / 3.0).abs() < 1e-15 && s[2] == 0.0);

    // Conv1d with w = (1, 10, 100) on state (1, 2) then x = (3, 4): y = 1 + 20 + 300 and
    // 2 + 30 + 400; the new state is (3, 4).
    let (y, st) = naive::conv1d_seq(&[3.0, 4.0], &[1.0, 10.0, 100.0], &[1.0, 2.0], 1, 3, false);
    assert_eq!((y, st), (vec![321.0, 432.0], vec![3.0, 4.0]));

    // DeltaNet from a zero state: S = β k vᵀ, so o = scale (q·k) β v; a second token with the
    // same k and β = 1 replaces k's value entirely: S = e^g S + k (v2 − e^g Sᵀk)ᵀ.
    let mut st = vec![0.0; 4];
    let o = naive::delta_step(
        &mut st,
        &[1.0, 1.0],
        &[1.0, 0.0],
        &[2.0, 4.0],
        0.0,
        0.5,
        2.0,
        2,
        2,
    );
    assert_eq!(o, vec![2.0, 4.0]);
    let o = naive::delta_step(
        &mut st,
        &[1.0, 0.0],
        &[1.0, 0.0],
        &[7.0, 9.0],
        -1.0,
        1.0,
        1.0,
        2,
        2,
    );
    assert!((o[0] - 7.0).abs() < 1e-15 && (o[1] - 9.0).abs() < 1e-15);

    // Top-k: ties go to the lower index.
    assert_eq!(
        naive::top_k(&[1.0, 3.0, 3.0, 2.0, 3.0], 4),
        vec![1, 2, 4, 3]
    );

    // Round to nearest even at f16's and bf16's ties; overflow and subnormals.
    assert_eq!(naive::round_f16(1.0 + 2f64.powi(-11)), 1.0);
    assert_eq!(
        naive::round_f16(1.0 + 3.0 * 2f64.powi(-11)),
        1.0 + 2f64.powi(-9)
    );
    assert_eq!(naive::round_f16(65519.0), 65504.0);
    assert_eq!(naive::round_f16(65520.0), f64::INFINITY);
    assert_eq!(naive::round_f16(3.0 * 2f64.powi(-25)), 2f64.powi(-23));
    assert_eq!(naive::round_bf16(1.0 + 2f64.powi(-8)), 1.0);
    assert_eq!(
        naive::round_bf16(-(1.0 + 3.0 * 2f64.powi(-8))),
        -(1.0 + 2f64.powi(-6))
    );

    // Masks: window 3 at position 5 sees 3, 4, 5; a prefix of 4 sees up to 3 from anywhere.
    let w: Vec<usize> = (0..8)
        .filter(|&j| naive::Visible::Window(3).sees(5, j, 9))
        .collect();
    assert_eq!(w, vec![3, 4, 5]);
    assert!(naive::Visible::Prefix(4).sees(1, 3, 9) && !naive::Visible::Prefix(4).sees(1, 4, 9));
    // The last 3 of 9 keys, from any position.
    let l: Vec<usize> = (0..9)
        .filter(|&j| naive::Visible::Last(3).sees(0, j, 9))
        .collect();
    assert_eq!(l, vec![6, 7, 8]);
}
