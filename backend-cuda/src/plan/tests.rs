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
    // Every matmul weight type with a kernel, at decode and prefill sizes.
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
