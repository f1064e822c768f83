//! The conv1d family's launches, over a prompt and as a decode step on a state pool.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &ConvOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Out, U32};
    match op {
        ConvOp::Conv1dDecode { silu } => {
            (all_f32(&i[..2]) && all_f32(o)).then_some(())?;
            let (s, c) = (dim(&i[0], 0), dim(&i[0], 1));
            let k = dim(&i[1], 1);
            let pool = dim(&o[1], 0);
            launch1(
                "conv1d_decode_f32",
                s * c,
                with_tensors(
                    3,
                    2,
                    [
                        U32(u(s)?),
                        U32(u(c)?),
                        U32(u(k)?),
                        U32(*silu as u32),
                        U32(u(pool)?),
                    ],
                ),
            )
        }
        ConvOp::Conv1d { silu } => {
            (all_f32(&i[..3]) && all_f32(o)).then_some(())?;
            let (t, c) = (dim(&i[0], 0), dim(&i[0], 1));
            let (k, s) = (dim(&i[1], 1), dim(&i[2], 0));
            let mut steps = launch1(
                "conv1d_f32",
                t * c,
                with_tensors(
                    4,
                    1,
                    [
                        U32(u(t)?),
                        U32(u(c)?),
                        U32(u(k)?),
                        U32(u(s)?),
                        U32(*silu as u32),
                    ],
                ),
            )?;
            if s * (k - 1) * c > 0 {
                steps.extend(launch1(
                    "conv1d_state_f32",
                    s * (k - 1) * c,
                    vec![
                        In(0),
                        In(2),
                        In(3),
                        Out(1),
                        U32(u(t)?),
                        U32(u(c)?),
                        U32(u(k)?),
                        U32(u(s)?),
                    ],
                )?);
            }
            Some(steps)
        }
    }
}
