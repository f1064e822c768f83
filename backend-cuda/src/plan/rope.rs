//! The rotary embedding family's launches.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &RopeOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Null, Out, F32, U32};
    match op {
        RopeOp::Rope(p) => {
            (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
            (i.get(2).is_none_or(|f| f.dtype == DType::F32)).then_some(())?;
            let (t, h, d) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[0], 2));
            (p.n_rot % 2 == 0 && p.n_rot <= d && p.n_rot > 0).then_some(())?;
            let factors = if i.len() > 2 { In(2) } else { Null };
            let threads = t * h * (d - p.n_rot / 2);
            launch1(
                "rope_f32",
                threads,
                vec![
                    In(0),
                    In(1),
                    factors,
                    Out(0),
                    U32(u(t)?),
                    U32(u(h)?),
                    U32(u(d)?),
                    U32(u(p.n_rot)?),
                    U32((p.mode == kiln_core::op::RopeMode::Neox) as u32),
                    F32(p.base),
                    F32(p.freq_scale),
                    F32(p.attn_factor),
                    U32((i.len() > 2) as u32),
                ],
            )
        }
    }
}
