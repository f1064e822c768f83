//! Wrong calls return errors that name the op and the shapes; nothing panics.

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::exec::Executor;
use kiln_core::op::{
    AttentionOp, AttnParams, ElementwiseOp, GetRowsOp, Mask, MatMulOp, NormOp, Op, ReduceOp,
    RopeMode, RopeOp, RopeParams,
};
use kiln_core::tensor::{DType, TensorDesc};
use kiln_core::Error;

fn op_err(r: kiln_core::Result<Vec<kiln_core::Tensor>>) -> String {
    match r {
        Err(e @ Error::Op { .. }) => e.to_string(),
        Err(e) => panic!("expected an op error, got {e}"),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn mismatched_shapes_name_the_op_and_the_shapes() {
    let ex = Executor::cpu();
    let b = ex.backend();
    let x = b.alloc(&TensorDesc::new(DType::F32, [3, 64])).unwrap();
    let w = b.alloc(&TensorDesc::new(DType::Q4_0, [16, 96])).unwrap();
    let msg = op_err(ex.run(&Op::MatMul(MatMulOp::MatMul), &[&x, &w]));
    assert!(msg.starts_with("mat_mul:"), "{msg}");
    assert!(
        msg.contains("f32[3, 64]") && msg.contains("q4_0[16, 96]"),
        "{msg}"
    );
    assert!(msg.contains("64") && msg.contains("96"), "{msg}");

    let a = b.alloc(&TensorDesc::new(DType::F32, [4, 10])).unwrap();
    let c = b.alloc(&TensorDesc::new(DType::F32, [3, 10])).unwrap();
    let msg = op_err(ex.run(&Op::Elementwise(ElementwiseOp::Add), &[&a, &c]));
    assert!(
        msg.starts_with("add:") && msg.contains("f32[3, 10]"),
        "{msg}"
    );

    let q = b.alloc(&TensorDesc::new(DType::F32, [2, 3, 64])).unwrap();
    let k = b.alloc(&TensorDesc::new(DType::F32, [5, 2, 64])).unwrap();
    let p = AttnParams {
        scale: 1.0,
        soft_cap: None,
        mask: Mask::Causal,
    };
    let msg = op_err(ex.run(&Op::Attention(AttentionOp::Attention(p)), &[&q, &k, &k]));
    assert!(
        msg.starts_with("attention:") && msg.contains("multiple of kv heads"),
        "{msg}"
    );
}

#[test]
fn unsupported_dtype_pairs_are_errors() {
    let ex = Executor::cpu();
    let b = ex.backend();
    let xi = b.alloc(&TensorDesc::new(DType::I32, [1, 32])).unwrap();
    let w = b.alloc(&TensorDesc::new(DType::F32, [8, 32])).unwrap();
    let msg = op_err(ex.run(&Op::MatMul(MatMulOp::MatMul), &[&xi, &w]));
    assert!(
        msg.contains("mat_mul") && msg.contains("i32[1, 32]"),
        "{msg}"
    );

    let xq = b.alloc(&TensorDesc::new(DType::Q8_0, [1, 32])).unwrap();
    let nw = b.alloc(&TensorDesc::new(DType::F32, [32])).unwrap();
    let msg = op_err(ex.run(
        &Op::Norm(NormOp::RmsNorm {
            eps: 1e-6,
            one_plus: false,
        }),
        &[&xq, &nw],
    ));
    assert!(msg.contains("rms_norm") && msg.contains("q8_0"), "{msg}");

    let x = b.alloc(&TensorDesc::new(DType::F32, [2, 2, 64])).unwrap();
    let pos_f = b.alloc(&TensorDesc::new(DType::F32, [2])).unwrap();
    let msg = op_err(ex.run(
        &Op::Rope(RopeOp::Rope(RopeParams::new(RopeMode::Neox, 64, 1e4))),
        &[&x, &pos_f],
    ));
    assert!(
        msg.contains("rope") && msg.contains("positions must be i32"),
        "{msg}"
    );
    let pos = b.alloc(&TensorDesc::new(DType::I32, [2])).unwrap();
    let msg = op_err(ex.run(
        &Op::Rope(RopeOp::Rope(RopeParams::new(RopeMode::Neox, 63, 1e4))),
        &[&x, &pos],
    ));
    assert!(msg.contains("n_rot 63"), "{msg}");
}

#[test]
fn wrong_counts_outputs_and_parameters_are_errors() {
    let ex = Executor::cpu();
    let b = ex.backend();
    let x = b.alloc(&TensorDesc::new(DType::F32, [2, 8])).unwrap();
    let msg = op_err(ex.run(&Op::Elementwise(ElementwiseOp::Add), &[&x]));
    assert!(msg.contains("takes [2] inputs, got 1"), "{msg}");
    let msg = op_err(ex.run(&Op::Reduce(ReduceOp::TopK(9)), &[&x]));
    assert!(msg.contains("k = 9"), "{msg}");
    // A wrong output shape.
    let out = b.alloc(&TensorDesc::new(DType::F32, [2, 7])).unwrap();
    match ex.exec(
        &Op::Elementwise(ElementwiseOp::Unary(kiln_core::op::UnaryOp::Silu)),
        &[&x],
        &[&out],
    ) {
        Err(e) => assert!(
            e.to_string().contains("output 0 must have shape [2, 8]"),
            "{e}"
        ),
        Ok(()) => panic!("accepted a wrong output shape"),
    }
    // In-place ops cannot allocate their outputs.
    let kv = b.alloc(&TensorDesc::new(DType::F32, [1, 1, 8])).unwrap();
    let slots = b.alloc(&TensorDesc::new(DType::I32, [1])).unwrap();
    assert!(ex
        .run(&Op::Attention(AttentionOp::KvWrite), &[&kv, &kv, &slots])
        .is_err());
}

#[test]
fn bad_tensor_use_is_an_error() {
    let one = CpuBackend::with_threads(1);
    let two = CpuBackend::with_threads(1);
    let x = one.alloc(&TensorDesc::new(DType::F32, [4])).unwrap();
    let y = two.alloc(&TensorDesc::new(DType::F32, [4])).unwrap();
    // A tensor of another backend.
    let e = one
        .execute(&Op::Elementwise(ElementwiseOp::Scale(2.0)), &[&y], &[&x])
        .unwrap_err();
    assert!(e.to_string().contains("another backend"), "{e}");
    // Output overlapping the input.
    let e = one
        .execute(&Op::Elementwise(ElementwiseOp::Scale(2.0)), &[&x], &[&x])
        .unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
    // Upload of the wrong size; a view past the end; a reshape that changes the count.
    assert!(one.upload(&x, &[0u8; 15]).is_err());
    assert!(x.view(2, [3]).is_err());
    assert!(x.reshape([5]).is_err());
    // A view that is not on a block boundary.
    let q = one.alloc(&TensorDesc::new(DType::Q4_K, [2, 256])).unwrap();
    assert!(q.view(100, [256]).is_err());
    assert!(q.view(256, [256]).is_ok());
}

#[test]
fn bad_index_data_is_an_error_not_a_panic() {
    let cpu = CpuBackend::with_threads(1);
    let ex = Executor::cpu();
    let table = ex
        .backend()
        .alloc(&TensorDesc::new(DType::Q8_0, [10, 32]))
        .unwrap();
    let ids = ex
        .backend()
        .alloc(&TensorDesc::new(DType::I32, [2]))
        .unwrap();
    ex.backend()
        .upload(&ids, &[3, 0, 0, 0, 10, 0, 0, 0])
        .unwrap();
    let e = ex
        .run(&Op::GetRows(GetRowsOp::GetRows), &[&table, &ids])
        .unwrap_err();
    assert!(
        e.to_string().contains("row id 10 is out of range 0..10"),
        "{e}"
    );
    drop(cpu);
}
