//! The Gated DeltaNet family's launches, over a prompt and as a decode step on a state pool.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &DeltaNetOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{F32, U32};
    match op {
        DeltaNetOp::DeltaNet { scale, .. } => {
            // Every chunk size computes the same function; the kernel is the sequential form.
            (all_f32(&i[..6]) && all_f32(o)).then_some(())?;
            let (t, hk, dk) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            let (hv, dv, s) = (dim(&i[2], 1), dim(&i[2], 2), dim(&i[5], 0));
            (dk <= MAX_DK).then_some(())?;
            one(
                "delta_net_f32",
                (u(s)?, u(hv)?, 1),
                (128, 1, 1),
                with_tensors(
                    7,
                    2,
                    [
                        U32(u(hk)?),
                        U32(u(hv)?),
                        U32(u(dk)?),
                        U32(u(dv)?),
                        U32(u(t)?),
                        F32(*scale),
                    ],
                ),
            )
        }
        DeltaNetOp::DeltaNetDecode { scale, qk_l2norm } => {
            (all_f32(&i[..5]) && all_f32(o)).then_some(())?;
            let (s, hk, dk) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            let (hv, dv) = (dim(&i[2], 1), dim(&i[2], 2));
            (dk <= MAX_DK).then_some(())?;
            let pool = dim(&o[1], 0);
            one(
                "delta_net_decode_f32",
                (u(s)?, u(hv)?, 1),
                (128, 1, 1),
                with_tensors(
                    6,
                    2,
                    [
                        U32(u(hk)?),
                        U32(u(hv)?),
                        U32(u(dk)?),
                        U32(u(dv)?),
                        F32(*scale),
                        F32(qk_l2norm.unwrap_or(0.0)),
                        U32(qk_l2norm.is_some() as u32),
                        U32(u(pool)?),
                    ],
                ),
            )
        }
    }
}
