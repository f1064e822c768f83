//! The reduction family's launches: argmax and top-k.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &ReduceOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let i = &desc.inputs[..];
    use Arg::{In, Out, U32};
    match op {
        ReduceOp::Argmax => {
            (i[0].dtype == DType::F32).then_some(())?;
            let n = i[0].shape.last();
            let rows = i[0].numel() / n.max(1);
            (n > 0).then_some(())?;
            one(
                "argmax_f32",
                (u(rows)?, 1, 1),
                (ARGMAX_THREADS, 1, 1),
                vec![In(0), Out(0), U32(u(n)?)],
            )
        }
        ReduceOp::TopK(k) => {
            // k rounds over the row: for sampling's small k; a large k runs on the CPU.
            (i[0].dtype == DType::F32 && *k <= MAX_TOP_K).then_some(())?;
            let n = i[0].shape.last();
            let rows = i[0].numel() / n.max(1);
            (n > 0 && *k >= 1 && *k <= n).then_some(())?;
            one(
                "top_k_f32",
                (u(rows)?, 1, 1),
                (TOPK_THREADS, 1, 1),
                vec![In(0), Out(0), Out(1), U32(u(n)?), U32(u(*k)?)],
            )
        }
    }
}
