//! The elementwise family's launches.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &ElementwiseOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Out, F32, U32};
    match op {
        ElementwiseOp::Add | ElementwiseOp::Mul => {
            if !all_f32(i) || !all_f32(o) || i[1].numel() == 0 {
                return None;
            }
            let k = if *op == ElementwiseOp::Add {
                "add_f32"
            } else {
                "mul_f32"
            };
            let n = o[0].numel();
            launch1(
                k,
                n,
                vec![In(0), In(1), Out(0), U32(u(n)?), U32(u(i[1].numel())?)],
            )
        }
        ElementwiseOp::Scale(s) => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let n = o[0].numel();
            launch1("scale_f32", n, vec![In(0), Out(0), U32(u(n)?), F32(*s)])
        }
        ElementwiseOp::Unary(op) => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let code = UnaryOp::ALL.iter().position(|x| x == op)?;
            let n = o[0].numel();
            launch1(
                "unary_f32",
                n,
                vec![In(0), Out(0), U32(u(n)?), U32(code as u32)],
            )
        }
        ElementwiseOp::Glu(g) => {
            (all_f32(i) && all_f32(o)).then_some(())?;
            let act = match g {
                GluOp::SwiGlu => 0,
                GluOp::GeGlu => 1,
            };
            let n = o[0].numel();
            launch1(
                "glu_f32",
                n,
                vec![In(0), In(1), Out(0), U32(u(n)?), U32(act)],
            )
        }
        ElementwiseOp::Cast => {
            let n = i[0].numel();
            let kernel = match (i[0].dtype, o[0].dtype) {
                (a, b) if a == b => return Some(vec![Step::Copy { from: 0, to: 0 }]),
                (DType::F32, DType::F16) => "cast_f32_f16",
                (DType::F32, DType::BF16) => "cast_f32_bf16",
                (DType::F16, DType::F32) => "cast_f16_f32",
                (DType::BF16, DType::F32) => "cast_bf16_f32",
                _ => return None,
            };
            launch1(kernel, n, vec![In(0), Out(0), U32(u(n)?)])
        }
        ElementwiseOp::Copy => Some(vec![Step::Copy { from: 0, to: 0 }]),
    }
}
