//! The softmax family's launches.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &SoftmaxOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Null, Out, F32, U32};
    match op {
        SoftmaxOp::Softmax { scale, soft_cap } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let n = i[0].shape.last();
            let rows = i[0].numel() / n.max(1);
            let (mask, mask_rows) = match i.get(1) {
                Some(m) => (In(1), m.numel() / n.max(1)),
                None => (Null, 0),
            };
            let cap = soft_cap.unwrap_or(0.0);
            (cap >= 0.0).then_some(())?;
            one(
                "softmax_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![
                    In(0),
                    mask,
                    Out(0),
                    U32(u(n)?),
                    U32(u(mask_rows)?),
                    F32(*scale),
                    F32(cap),
                ],
            )
        }
    }
}
