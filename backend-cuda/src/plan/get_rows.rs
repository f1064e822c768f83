//! The embedding family's launches: lookups by id and the top-k soft embedding.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &GetRowsOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{In, Out, U32};
    match op {
        // The top-k form from the router (top-k, softmax over them), the row gather and the
        // weighted sum. The router takes a thread per position and k passes over the
        // vocabulary, so large k·V is left to a proper selection kernel (not written yet: the
        // model composes the op from the same kernels meanwhile). The dense form needs a
        // matmul by the untransposed table: composed by the model.
        GetRowsOp::SoftEmbedding { top_k } => {
            use Arg::Scratch;
            (i[0].dtype == DType::F32 && o[0].dtype == DType::F32).then_some(())?;
            let (t, v, e, k) = (dim(&i[0], 0), dim(&i[0], 1), dim(&i[1], 1), *top_k);
            (k > 0 && k < v && k.checked_mul(v)? <= 1 << 24).then_some(())?;
            let w = weight_kernels(i[1].dtype)?;
            let per_thread = match i[1].dtype {
                DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 => 1,
                _ => 8,
            };
            (e % per_thread == 0).then_some(())?;
            let mut steps = vec![
                Step::Scratch(TensorDesc::new(DType::F32, [t, k])),
                Step::Scratch(TensorDesc::new(DType::I32, [t, k])),
                Step::Scratch(TensorDesc::new(DType::F32, [t * k, e])),
            ];
            let route = vec![
                In(0),
                Scratch(0),
                Scratch(1),
                U32(u(t)?),
                U32(u(v)?),
                U32(u(k)?),
                U32(0),
                U32(1),
            ];
            steps.extend(launch1("moe_route_f32", t, route)?);
            let gather = vec![
                In(1),
                Scratch(1),
                Scratch(2),
                U32(u(t * k)?),
                U32(u(e)?),
                U32(u(v)?),
            ];
            steps.extend(launch1(w.get_rows, t * k * e / per_thread, gather)?);
            let sum = vec![
                Scratch(2),
                Scratch(0),
                Out(0),
                U32(u(t)?),
                U32(u(k)?),
                U32(u(e)?),
            ];
            steps.extend(launch1("moe_sum_f32", t * e, sum)?);
            Some(steps)
        }
        GetRowsOp::GetRows => {
            (o[0].dtype == DType::F32 && i[1].dtype == DType::I32).then_some(())?;
            let (v, d) = (dim(&i[0], 0), dim(&i[0], 1));
            let n = i[1].numel();
            let args = vec![In(0), In(1), Out(0), U32(u(n)?), U32(u(d)?), U32(u(v)?)];
            let w = weight_kernels(i[0].dtype)?;
            // get_rows.cu's kernels (floats, Q8_0, Q4_0) take a thread per value; quant.cu's
            // a thread per 8 values.
            let per_thread = match i[0].dtype {
                DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 => 1,
                _ => 8,
            };
            launch1(w.get_rows, n * d / per_thread, args)
        }
    }
}
