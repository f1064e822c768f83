//! The canvas family's launches: the denoising draw and acceptance.

use super::*;

/// The launches of one of the family's ops, or `None` where no kernel fits (the executor then
/// runs it on the CPU reference).
pub(super) fn plan_op(op: &CanvasOp, desc: &OpDesc) -> Option<Vec<Step>> {
    let (i, o) = (&desc.inputs[..], &desc.outputs[..]);
    use Arg::{F32, U32};
    match op {
        CanvasOp::CanvasDraw { scale, seed } => {
            let (t, v) = (dim(&i[0], 0), dim(&i[0], 1));
            (o[0].dtype == DType::F32 && o[3].dtype == DType::F32 && v > 0).then_some(())?;
            one(
                "canvas_draw_f32",
                (u(t)?, 1, 1),
                (CANVAS_THREADS, 1, 1),
                with_tensors(
                    1,
                    4,
                    [
                        U32(u(v)?),
                        F32(*scale),
                        U32(*seed as u32),
                        U32((*seed >> 32) as u32),
                    ],
                ),
            )
        }
        CanvasOp::CanvasAccept {
            entropy_bound,
            confidence,
            stability,
            vocab,
            seed,
        } => one(
            "canvas_accept",
            (1, 1, 1),
            (CANVAS_THREADS, 1, 1),
            with_tensors(
                3,
                3,
                [
                    U32(u(dim(&i[0], 0))?),
                    U32(u(*stability)?),
                    U32(u(*vocab)?),
                    F32(*entropy_bound),
                    F32(*confidence),
                    U32(*seed as u32),
                    U32((*seed >> 32) as u32),
                ],
            ),
        ),
    }
}
