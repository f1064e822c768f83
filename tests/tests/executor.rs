//! The executor: capability-driven dispatch, CPU fallback with counters, strict mode, and the
//! fused-op gate, exercised through a backend that supports only some ops.

use std::sync::Arc;

use kiln_core::exec::Executor;
use kiln_core::op::{AttentionOp, AttnParams, ElementwiseOp, Mask, MatMulOp, NormOp, Op, OpDesc};
use kiln_core::tensor::{DType, Tensor, TensorDesc};
use kiln_core::validate::rng::Rng;
use kiln_core::Error;
use kiln_tests::FakeDevice;

/// A stand-in device: its own memory (an inner CPU backend, so a different id from the
/// executor's CPU), claiming only MatMul with f32 weights, Add and Mul.
fn partial() -> FakeDevice {
    FakeDevice::new("partial", |d| match d.op {
        Op::MatMul(MatMulOp::MatMul) => d.inputs[1].dtype == DType::F32,
        Op::Elementwise(ElementwiseOp::Add) | Op::Elementwise(ElementwiseOp::Mul) => true,
        _ => false,
    })
}

fn randn(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

/// A little block: x·W (device), RMSNorm (fallback), + residual (device), a KV write into a
/// cache (in-place fallback) and paged attention over it (fallback). Returns the attention
/// output, the normed sum, and the cache.
fn block(ex: &Executor, rng_seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let b = ex.backend().clone();
    let mut rng = Rng::new(rng_seed);
    let up = |d: DType, shape: &[usize], v: &[f32]| {
        let t = b.alloc(&TensorDesc::new(d, shape)).unwrap();
        b.upload(&t, &kiln_core::quant::quantize(d, v).unwrap())
            .unwrap();
        t
    };
    let (t, k, n) = (3usize, 64usize, 64usize);
    let x = up(DType::F32, &[t, k], &randn(&mut rng, t * k));
    let w = up(DType::F32, &[n, k], &randn(&mut rng, n * k));
    let nw = up(DType::F32, &[n], &randn(&mut rng, n));
    let y = &ex.run(&Op::MatMul(MatMulOp::MatMul), &[&x, &w]).unwrap()[0];
    let h = &ex
        .run(
            &Op::Norm(NormOp::RmsNorm {
                eps: 1e-6,
                one_plus: false,
            }),
            &[y, &nw],
        )
        .unwrap()[0];
    let s = &ex
        .run(&Op::Elementwise(ElementwiseOp::Add), &[h, &x])
        .unwrap()[0];
    // K/V for 3 tokens of one sequence: 1 head of 64; cache of 4 blocks of 4 slots.
    let kv = s.reshape([t, 1, 64]).unwrap();
    let kc = up(DType::F32, &[4, 4, 1, 64], &randn(&mut rng, 4 * 4 * 64));
    let vc = up(DType::F32, &[4, 4, 1, 64], &randn(&mut rng, 4 * 4 * 64));
    let int = |shape: &[usize], v: &[i32]| {
        let t = b.alloc(&TensorDesc::new(DType::I32, shape)).unwrap();
        b.upload(&t, bytemuck_i32(v).as_slice()).unwrap();
        t
    };
    let slots = int(&[t], &[9, 10, 11]); // block 2, offsets 1..4 → positions 5..7 of the table below
    ex.exec(
        &Op::Attention(AttentionOp::KvWrite),
        &[&kv, &kv, &slots],
        &[&kc, &vc],
    )
    .unwrap();
    let table = int(&[1, 2], &[3, 2]);
    let seq_lens = int(&[1], &[8]);
    let q_start = int(&[2], &[0, 3]);
    let p = AttnParams {
        scale: 0.125,
        soft_cap: None,
        mask: Mask::Causal,
    };
    let o = &ex
        .run(
            &Op::Attention(AttentionOp::PagedAttention(p)),
            &[&kv, &kc, &vc, &table, &seq_lens, &q_start],
        )
        .unwrap()[0];
    let get = |t: &Tensor| {
        let bytes = b.download(t).unwrap();
        let mut v = vec![0f32; t.numel()];
        kiln_core::quant::dequantize(t.dtype(), &bytes, &mut v).unwrap();
        v
    };
    (get(o), get(s), get(&kc))
}

fn bytemuck_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn unsupported_ops_fall_back_to_the_cpu_counted_and_give_the_same_results() {
    let cpu = Executor::cpu();
    let want = block(&cpu, 7);
    assert_eq!(cpu.total_fallbacks(), 0, "the CPU never falls back");

    let partial = Executor::new(Arc::new(partial()));
    let got = block(&partial, 7);
    assert_eq!(got, want, "fallback results must equal the CPU's exactly");
    let counts: Vec<(&str, u64)> = partial
        .fallbacks()
        .iter()
        .map(|f| (f.op, f.count))
        .collect();
    assert_eq!(counts.len(), 3, "{counts:?}");
    for op in ["rms_norm", "kv_write", "paged_attention"] {
        assert!(
            counts.contains(&(op, 1)),
            "{op} should have fallen back once: {counts:?}"
        );
    }
    assert!(partial.fallbacks().iter().all(|f| f.backend == "partial"));
    // Running again counts again.
    block(&partial, 8);
    assert_eq!(partial.total_fallbacks(), 6);
}

#[test]
fn strict_mode_turns_a_fallback_into_an_error_naming_the_op() {
    let ex = Executor::new(Arc::new(partial())).strict(true);
    let b = ex.backend().clone();
    let x = b.alloc(&TensorDesc::new(DType::F32, [2, 8])).unwrap();
    let w = b.alloc(&TensorDesc::new(DType::F32, [8])).unwrap();
    // Supported: fine.
    ex.run(&Op::Elementwise(ElementwiseOp::Add), &[&x, &w])
        .unwrap();
    // Unsupported: an error, nothing run, nothing counted.
    match ex.run(
        &Op::Norm(NormOp::RmsNorm {
            eps: 1e-6,
            one_plus: true,
        }),
        &[&x, &w],
    ) {
        Err(Error::StrictFallback { backend, op }) => {
            assert_eq!(backend, "partial");
            assert!(op.contains("rms_norm") && op.contains("f32[2, 8]"), "{op}");
        }
        other => panic!("expected a strict-mode error, got {other:?}"),
    }
    assert_eq!(ex.total_fallbacks(), 0);
}

#[test]
fn the_fused_op_gate_asks_the_backend() {
    let x = TensorDesc::new(DType::F32, [1, 64]);
    let nw = TensorDesc::new(DType::F32, [64]);
    let w = TensorDesc::new(DType::Q4_0, [32, 64]);
    let out = TensorDesc::new(DType::F32, [1, 32]);
    let fused = Op::MatMul(MatMulOp::RmsNormMatMul {
        eps: 1e-6,
        one_plus: false,
    });
    let partial = Executor::new(Arc::new(partial()));
    assert!(!partial.supports_op(&fused, &[&x, &nw, &w], &[&out]));
    assert!(Executor::cpu().supports_op(&fused, &[&x, &nw, &w], &[&out]));
    // A malformed call is never "supported".
    let bad = TensorDesc::new(DType::F32, [1, 63]);
    assert!(!Executor::cpu().supports_op(&fused, &[&bad, &nw, &w], &[&out]));
    // MatMul with f32 weights is claimed, with q4_0 weights it is not.
    let wf = TensorDesc::new(DType::F32, [32, 64]);
    assert!(partial.supports_op(&Op::MatMul(MatMulOp::MatMul), &[&x, &wf], &[&out]));
    assert!(!partial.supports_op(&Op::MatMul(MatMulOp::MatMul), &[&x, &w], &[&out]));
}

/// Q, K and V (or gate and up) behind one norm: the executor takes the widest fused op the
/// backend claims — all three weights in one op, else the fused op per weight, else one norm
/// and plain matmuls — and every path gives the CPU reference's values.
#[test]
fn projections_sharing_a_norm_take_the_widest_fused_op_the_backend_claims() {
    let mut rng = Rng::new(41);
    let (k, rows) = (64usize, [24usize, 8, 8]);
    let x_v = randn(&mut rng, 2 * k);
    let nw_v = randn(&mut rng, k);
    let w_v: Vec<Vec<f32>> = rows.iter().map(|&r| randn(&mut rng, r * k)).collect();
    let run = |ex: &Executor| -> Vec<Vec<f32>> {
        let b = ex.backend().clone();
        let up = |d: DType, shape: &[usize], v: &[f32]| {
            let t = b.alloc(&TensorDesc::new(d, shape)).unwrap();
            b.upload(&t, &kiln_core::quant::quantize(d, v).unwrap())
                .unwrap();
            t
        };
        let x = up(DType::F32, &[2, k], &x_v);
        let nw = up(DType::F32, &[k], &nw_v);
        let ws: Vec<Tensor> = rows
            .iter()
            .zip(&w_v)
            .map(|(&r, v)| up(DType::Q8_0, &[r, k], v))
            .collect();
        let refs: Vec<&Tensor> = ws.iter().collect();
        ex.set_profiling(true);
        let out = ex.rms_norm_matmuls(&x, &nw, 1e-6, false, &refs).unwrap();
        assert_eq!(out.len(), 3);
        out.iter().map(|t| ex.download_f32(t).unwrap()).collect()
    };
    let calls = |ex: &Executor, op: &str| {
        ex.profile()
            .iter()
            .find(|(n, _)| *n == op)
            .map_or(0, |(_, t)| t.calls)
    };
    let want = run(&Executor::cpu());
    for (r, w) in want.iter().zip(rows) {
        assert_eq!(r.len(), 2 * w);
    }
    // (weights per fused op the device claims, fused calls, plain matmul calls)
    fn many(d: &OpDesc) -> bool {
        match d.op {
            Op::MatMul(MatMulOp::RmsNormMatMul { .. }) => d.inputs.len() == 5,
            _ => matches!(
                d.op,
                Op::MatMul(MatMulOp::MatMul) | Op::Norm(NormOp::RmsNorm { .. })
            ),
        }
    }
    fn single(d: &OpDesc) -> bool {
        match d.op {
            Op::MatMul(MatMulOp::RmsNormMatMul { .. }) => d.inputs.len() == 3,
            _ => matches!(
                d.op,
                Op::MatMul(MatMulOp::MatMul) | Op::Norm(NormOp::RmsNorm { .. })
            ),
        }
    }
    fn plain(d: &OpDesc) -> bool {
        matches!(
            d.op,
            Op::MatMul(MatMulOp::MatMul) | Op::Norm(NormOp::RmsNorm { .. })
        )
    }
    type Device = (&'static str, fn(&OpDesc) -> bool, u64, u64);
    let devices: [Device; 3] = [
        ("all three in one", many, 1, 0),
        ("one a weight", single, 3, 0),
        ("none", plain, 0, 3),
    ];
    for (claimed, claims, fused_calls, plain_calls) in devices {
        let ex = Executor::new(Arc::new(FakeDevice::new("fused", claims)));
        let got = run(&ex);
        assert_eq!(calls(&ex, "rms_norm_mat_mul"), fused_calls, "{claimed:?}");
        assert_eq!(calls(&ex, "mat_mul"), plain_calls, "{claimed:?}");
        assert_eq!(ex.total_fallbacks(), 0);
        for (g, w) in got.iter().zip(&want) {
            let err = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(err < 1e-4, "{claimed:?}: max error {err}");
        }
    }
}

/// The residual add as a projection's epilogue: `matmul_add` and `glu_matmul_add` take the
/// fused op where the backend claims it, else the ops they fuse (a plain GLU-matmul and an
/// add), and both give the composed ops' values.
#[test]
fn residual_adds_fuse_into_the_projection_only_where_claimed() {
    let mut rng = Rng::new(43);
    let (m, k, f, n) = (2usize, 64usize, 96usize, 24usize);
    let vals: Vec<Vec<f32>> = [m * k, n * k, m * f, m * f, n * f, m * n]
        .iter()
        .map(|&len| randn(&mut rng, len))
        .collect();
    let run = |ex: &Executor| -> (Vec<f32>, Vec<f32>) {
        let b = ex.backend().clone();
        let up = |d: DType, shape: &[usize], v: &[f32]| {
            let t = b.alloc(&TensorDesc::new(d, shape)).unwrap();
            b.upload(&t, &kiln_core::quant::quantize(d, v).unwrap())
                .unwrap();
            t
        };
        let x = up(DType::F32, &[m, k], &vals[0]);
        let w = up(DType::Q8_0, &[n, k], &vals[1]);
        let gate = up(DType::F32, &[m, f], &vals[2]);
        let upv = up(DType::F32, &[m, f], &vals[3]);
        let wd = up(DType::Q8_0, &[n, f], &vals[4]);
        let r = up(DType::F32, &[m, n], &vals[5]);
        ex.set_profiling(true);
        let a = ex.matmul_add(&x, &w, &r).unwrap();
        let g = ex
            .glu_matmul_add(kiln_core::op::GluOp::SwiGlu, &gate, &upv, &wd, &r)
            .unwrap();
        (ex.download_f32(&a).unwrap(), ex.download_f32(&g).unwrap())
    };
    let calls = |ex: &Executor, op: &str| {
        ex.profile()
            .iter()
            .find(|(name, _)| *name == op)
            .map_or(0, |(_, t)| t.calls)
    };
    // The composed reference, on the CPU: the plain ops one by one.
    let cpu = Executor::cpu();
    let want = {
        let b = cpu.backend().clone();
        let up = |d: DType, shape: &[usize], v: &[f32]| {
            let t = b.alloc(&TensorDesc::new(d, shape)).unwrap();
            b.upload(&t, &kiln_core::quant::quantize(d, v).unwrap())
                .unwrap();
            t
        };
        let y = cpu
            .matmul(
                &up(DType::F32, &[m, k], &vals[0]),
                &up(DType::Q8_0, &[n, k], &vals[1]),
            )
            .unwrap();
        let r = up(DType::F32, &[m, n], &vals[5]);
        let h = cpu
            .glu(
                kiln_core::op::GluOp::SwiGlu,
                &up(DType::F32, &[m, f], &vals[2]),
                &up(DType::F32, &[m, f], &vals[3]),
            )
            .unwrap();
        let d = cpu.matmul(&h, &up(DType::Q8_0, &[n, f], &vals[4])).unwrap();
        (
            cpu.download_f32(&cpu.add(&r, &y).unwrap()).unwrap(),
            cpu.download_f32(&cpu.add(&r, &d).unwrap()).unwrap(),
        )
    };
    fn fused(d: &OpDesc) -> bool {
        matches!(
            d.op,
            Op::MatMul(MatMulOp::MatMulAdd) | Op::MatMul(MatMulOp::GluMatMul(_))
        )
    }
    fn unfused(d: &OpDesc) -> bool {
        match d.op {
            Op::MatMul(MatMulOp::GluMatMul(_)) => d.inputs.len() == 3,
            _ => matches!(
                d.op,
                Op::MatMul(MatMulOp::MatMul) | Op::Elementwise(ElementwiseOp::Add)
            ),
        }
    }
    // (device, its claims, calls of mat_mul_add, glu_mat_mul, mat_mul and add)
    type Device = (&'static str, fn(&OpDesc) -> bool, [u64; 4]);
    let devices: [Device; 2] = [
        ("fused", fused, [1, 1, 0, 0]),
        ("unfused", unfused, [0, 1, 1, 2]),
    ];
    for (name, claims, want_calls) in devices {
        let ex = Executor::new(Arc::new(FakeDevice::new("residual", claims)));
        let got = run(&ex);
        assert_eq!(
            [
                calls(&ex, "mat_mul_add"),
                calls(&ex, "glu_mat_mul"),
                calls(&ex, "mat_mul"),
                calls(&ex, "add")
            ],
            want_calls,
            "{name}"
        );
        assert_eq!(ex.total_fallbacks(), 0, "{name}");
        // The same roundings in the same order: the same values.
        assert_eq!(got.0, want.0, "{name}: matmul_add");
        assert_eq!(got.1, want.1, "{name}: glu_matmul_add");
    }
}
