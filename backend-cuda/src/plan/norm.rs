//! The normalisation family's launches.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &NormOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Out, F32, U32};
    match op {
        NormOp::RmsNorm { eps, one_plus } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let d = i[0].shape.last();
            let rows = i[0].numel() / d.max(1);
            one(
                "rms_norm_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![
                    In(0),
                    In(1),
                    Out(0),
                    U32(u(d)?),
                    F32(*eps),
                    U32(*one_plus as u32),
                ],
            )
        }
        NormOp::L2Norm { eps } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let d = i[0].shape.last();
            let rows = i[0].numel() / d.max(1);
            one(
                "l2_norm_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![In(0), Out(0), U32(u(d)?), F32(*eps)],
            )
        }
        NormOp::LayerNorm { eps } => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let d = i[0].shape.last();
            let rows = i[0].numel() / d.max(1);
            one(
                "layer_norm_f32",
                (u(rows)?, 1, 1),
                (BLOCK, 1, 1),
                vec![In(0), In(1), In(2), Out(0), U32(u(d)?), F32(*eps)],
            )
        }
    }
}
