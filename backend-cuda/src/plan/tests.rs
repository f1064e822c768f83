//! The plan against the kernels' declarations, for every conformance case.

use super::*;
use kiln_core::op::{ElementwiseOp, MatMulOp, MoeOp, NormOp};
use kiln_core::validate::cases;
use std::collections::BTreeSet;

/// Every launch the plan makes for every conformance case fits its kernel's declaration
/// and CUDA's limits, and the ops the kernels exist for are all claimed.
#[test]
fn every_planned_launch_matches_its_kernel() {
    let sigs = crate::kernels::signatures().expect("signatures parse");
    let mut claimed: BTreeSet<String> = BTreeSet::new();
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let all = cases().expect("cases");
    for c in &all {
        let desc = c.desc();
        let Some(steps) = plan(&desc) else { continue };
        claimed.insert(c.op.name().to_string());
        assert!(!steps.is_empty(), "{} {}: no steps", c.op.name(), c.label);
        for s in &steps {
            match s {
                Step::Launch(l) => {
                    let sig = sigs
                        .get(l.kernel)
                        .unwrap_or_else(|| panic!("{}: no kernel {}", c.label, l.kernel));
                    check_launch(sig, l, &desc.inputs, &desc.outputs, &scratch_descs(&steps))
                        .unwrap_or_else(|e| panic!("{} {}: {e}", c.op.name(), c.label));
                    assert!(l.grid.0 >= 1 && l.grid.1 >= 1 && l.grid.2 >= 1);
                    used.insert(l.kernel);
                }
                Step::Copy { from, to } => {
                    assert_eq!(desc.inputs[*from].nbytes(), desc.outputs[*to].nbytes());
                }
                Step::Scratch(t) => assert!(t.nbytes().is_some_and(|n| n > 0)),
            }
        }
    }
    for op in Op::names() {
        assert!(claimed.contains(op), "no case of {op} is planned");
    }
    // Every matmul weight type, at decode and prefill sizes.
    for w in kiln_core::DType::ALL
        .iter()
        .filter(|d| !d.is_int())
        .map(|d| d.name())
    {
        for phase in ["decode", "prefill"] {
            assert!(
                all.iter().any(|c| c.op == Op::MatMul(MatMulOp::MatMul)
                    && c.label.contains(&format!("x {w} {phase}"))
                    && plan(&c.desc()).is_some()),
                "mat_mul {w} {phase} is not planned"
            );
        }
    }
    println!("{} ops planned, {} kernels used", claimed.len(), used.len());
}

/// Ops whose one-dimensional grid would number threads past 2³² (the kernels index in 32
/// bits) are not planned, while the same op a little smaller is.
#[test]
fn grids_past_32_bit_thread_indices_are_not_planned() {
    let desc = |n: usize| {
        OpDesc::new(
            Op::Moe(MoeOp::MatMulId),
            vec![
                TensorDesc::new(DType::F32, [4, 64]),
                TensorDesc::new(DType::Q8_0, [8, n, 64]),
                TensorDesc::new(DType::I32, [4, 8]),
            ],
            vec![TensorDesc::new(DType::F32, [4, 8, n])],
        )
    };
    // Decode-sized: 4 · 8 · n warps of 32 threads.
    assert!(plan(&desc(1 << 20)).is_some());
    assert!(plan(&desc(1 << 23)).is_none());
    let add = |n: usize| {
        let t = TensorDesc::new(DType::F32, [n]);
        OpDesc::new(
            Op::Elementwise(ElementwiseOp::Add),
            vec![t.clone(), t.clone()],
            vec![t],
        )
    };
    assert!(plan(&add(1 << 31)).is_some());
    assert!(plan(&add((1 << 32) + 1)).is_none());
}

#[test]
fn a_wrong_launch_is_caught() {
    let sigs = crate::kernels::signatures().unwrap();
    let x = TensorDesc::new(DType::F32, [2, 64]);
    let w = TensorDesc::new(DType::F32, [64]);
    let desc = OpDesc::new(
        Op::Norm(NormOp::RmsNorm {
            eps: 1e-6,
            one_plus: false,
        }),
        vec![x.clone(), w],
        vec![x],
    );
    let Some(steps) = plan(&desc) else {
        panic!("rms_norm f32 is planned")
    };
    let Step::Launch(good) = &steps[0] else {
        panic!("a launch")
    };
    let sig = &sigs[good.kernel];
    let none: &[TensorDesc] = &[];
    assert!(check_launch(sig, good, &desc.inputs, &desc.outputs, none).is_ok());
    // Output and input swapped: the kernel would write an input.
    let mut bad = good.clone();
    bad.args.swap(0, 2);
    assert!(check_launch(sig, &bad, &desc.inputs, &desc.outputs, none).is_err());
    // A missing argument.
    let mut bad = good.clone();
    bad.args.pop();
    assert!(check_launch(sig, &bad, &desc.inputs, &desc.outputs, none).is_err());
    // An f32 where the kernel takes a u32.
    let mut bad = good.clone();
    bad.args[3] = Arg::F32(64.0);
    assert!(check_launch(sig, &bad, &desc.inputs, &desc.outputs, none).is_err());
    // A pointer to f16 data where the kernel reads f32.
    let half = vec![TensorDesc::new(DType::F16, [2, 64]), desc.inputs[1].clone()];
    assert!(check_launch(sig, good, &half, &desc.outputs, none).is_err());
}

/// By default (`MV_X8=1`) every decode matmul of a Q4_K weight with rows of whole 256s (plain, with a
/// residual, behind an RMSNorm over one to three weights, behind a GLU) is planned as
/// `quantize_x8` into scratch sized for the knob's parts, then `mat_vec_x8_q4_k`, and each
/// launch fits its kernel; other weight types, prefill sizes and the default plan are as
/// with `MV_X8=0`.
#[test]
fn the_int8_activation_knob_plans_quantize_then_the_x8_mat_vec() {
    let sigs = crate::kernels::signatures().expect("signatures parse");
    let all = cases().expect("cases");
    let mut x8 = 0;
    for spec in ["MV_X8=1", "MV_X8=1,MVX_PARTS=2", ""] {
        let parts = if spec.contains("PARTS=2") { 2 } else { 3 };
        for c in all.iter().filter(|c| matches!(c.op, Op::MatMul(_))) {
            let desc = c.desc();
            let Some(steps) = crate::kernels::with_knobs(Some(spec), || plan(&desc)) else {
                continue;
            };
            let by_default = crate::kernels::with_knobs(Some("MV_X8=0"), || plan(&desc))
                .expect("planned with the f32 kernels too");
            let kernels: Vec<&str> = steps
                .iter()
                .filter_map(|s| match s {
                    Step::Launch(l) => Some(l.kernel),
                    _ => None,
                })
                .collect();
            let q4k_decode = desc.inputs.iter().any(|t| t.dtype == DType::Q4_K)
                && by_default
                    .iter()
                    .any(|s| matches!(s, Step::Launch(l) if l.kernel.contains("mat_vec")));
            if q4k_decode {
                assert_eq!(kernels, ["quantize_x8", "mat_vec_x8_q4_k"], "{}", c.label);
                let Step::Scratch(t) = &steps[0] else {
                    panic!("{}: scratch first", c.label)
                };
                let k = desc
                    .inputs
                    .iter()
                    .find(|t| t.dtype == DType::Q4_K)
                    .map(|w| dim(w, 1))
                    .unwrap_or(0);
                let m = desc.outputs[0].numel()
                    / dim(&desc.outputs[0], desc.outputs[0].shape.rank() - 1).max(1);
                assert_eq!(t.nbytes(), Some(m * (k * parts + k / 4)), "{}", c.label);
                for s in &steps {
                    if let Step::Launch(l) = s {
                        check_launch(
                            &sigs[l.kernel],
                            l,
                            &desc.inputs,
                            &desc.outputs,
                            &scratch_descs(&steps),
                        )
                        .unwrap_or_else(|e| panic!("{}: {e}", c.label));
                    }
                }
                x8 += 1;
            } else {
                assert_eq!(steps, by_default, "{}", c.label);
            }
        }
    }
    assert!(x8 >= 10, "{x8} Q4_K decode cases");
}

/// With `MM_TC=1`, a prefill-sized matmul of a weight with codes is planned as `tc_split`
/// then `mat_mul_tc_<fmt>`, and K is split among blocks (summed by `tc_reduce`) only when the
/// tiles alone would leave the GPU idle: a batch of 64 decodes of a 4096 × 4096 weight has 32
/// tiles; 2048 prompt rows have 1024. Every launch fits its kernel.
#[test]
fn the_tensor_core_knob_splits_k_only_for_few_tiles() {
    let sigs = crate::kernels::signatures().expect("signatures parse");
    for (m, split) in [(64usize, true), (2048, false)] {
        let desc = OpDesc::new(
            Op::MatMul(MatMulOp::MatMul),
            vec![
                TensorDesc::new(DType::F32, [m, 4096]),
                TensorDesc::new(DType::Q4_K, [4096, 4096]),
            ],
            vec![TensorDesc::new(DType::F32, [m, 4096])],
        );
        let steps = crate::kernels::with_knobs(Some("MM_TC=1"), || plan(&desc)).expect("planned");
        let launches: Vec<&Launch> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Launch(l) => Some(l),
                _ => None,
            })
            .collect();
        let names: Vec<&str> = launches.iter().map(|l| l.kernel).collect();
        if split {
            assert_eq!(names, ["tc_split", "mat_mul_tc_q4_k", "tc_reduce"]);
            assert!(launches[1].grid.2 > 1 && launches[1].grid.0 * launches[1].grid.1 == 32);
        } else {
            assert_eq!(names, ["tc_split", "mat_mul_tc_q4_k"]);
            assert_eq!(launches[1].grid, (32, 32, 1));
        }
        for l in launches {
            check_launch(
                &sigs[l.kernel],
                l,
                &desc.inputs,
                &desc.outputs,
                &scratch_descs(&steps),
            )
            .unwrap_or_else(|e| panic!("m={m} {}: {e}", l.kernel));
        }
        // Without the knob: the FMA tile.
        let plain = plan(&desc).expect("planned");
        assert!(plain
            .iter()
            .all(|s| !matches!(s, Step::Launch(l) if l.kernel.contains("tc"))));
    }
}
