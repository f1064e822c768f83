//! The mixture-of-experts family's launches: routing, matmuls by expert id, mixing.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &MoeOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Out, U32};
    match op {
        MoeOp::MatMulId => mat_mul::plan_mat_mul_id(i, o),
        MoeOp::MoeSum => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let (t, k, n) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            launch1(
                "moe_sum_f32",
                t * n,
                vec![In(0), In(1), Out(0), U32(u(t)?), U32(u(k)?), U32(u(n)?)],
            )
        }
        MoeOp::MoeRoute {
            k,
            gating,
            normalize,
        } => {
            (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
            let (t, e) = (dim(&i[0], 0), dim(&i[0], 1));
            launch1(
                "moe_route_f32",
                t,
                vec![
                    In(0),
                    Out(0),
                    Out(1),
                    U32(u(t)?),
                    U32(u(e)?),
                    U32(u(*k)?),
                    U32((*gating == MoeGating::Sigmoid) as u32),
                    U32(*normalize as u32),
                ],
            )
        }
    }
}
