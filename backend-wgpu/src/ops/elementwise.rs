//! Elementwise launchers: add and mul (row broadcast), scale, activations, gated linear
//! units, copies and casts to f32.

use kiln_core::op::{ElementwiseOp, GluOp, OpDesc, UnaryOp};
use kiln_core::tensor::{DType, Tensor, TensorDesc};
use kiln_core::Result;

use super::{all_fit, bind, err, f32_all, launch_1d, u};
use crate::device::Device;
use crate::kernels::{plain, Kernel};

const ELEMENTWISE: &str = include_str!("../../../shaders/elementwise.wgsl");
const COPY: &str = include_str!("../../../shaders/elementwise_copy.wgsl");

plain!(ADD_F32, "add_f32", "elementwise", ELEMENTWISE);
plain!(MUL_F32, "mul_f32", "elementwise", ELEMENTWISE);
plain!(SCALE_F32, "scale_f32", "elementwise", ELEMENTWISE);
plain!(SILU_F32, "silu_f32", "elementwise", ELEMENTWISE);
plain!(GELU_TANH_F32, "gelu_tanh_f32", "elementwise", ELEMENTWISE);
plain!(SIGMOID_F32, "sigmoid_f32", "elementwise", ELEMENTWISE);
plain!(SOFTPLUS_F32, "softplus_f32", "elementwise", ELEMENTWISE);
plain!(EXP_F32, "exp_f32", "elementwise", ELEMENTWISE);
plain!(NEG_F32, "neg_f32", "elementwise", ELEMENTWISE);
plain!(TANH_F32, "tanh_f32", "elementwise", ELEMENTWISE);
plain!(GELU_ERF_F32, "gelu_erf_f32", "elementwise", ELEMENTWISE);
plain!(SWIGLU_F32, "swiglu_f32", "elementwise", ELEMENTWISE);
plain!(GEGLU_F32, "geglu_f32", "elementwise", ELEMENTWISE);
plain!(COPY_U32, "copy_u32", "elementwise_copy", COPY);
plain!(CAST_F16_F32, "cast_f16_f32", "elementwise_copy", COPY);
plain!(CAST_BF16_F32, "cast_bf16_f32", "elementwise_copy", COPY);
plain!(PATCH_BYTES, "patch_bytes", "elementwise_copy", COPY);

/// The family's kernels of no weight format.
pub(super) const KERNELS: &[&Kernel] = &[
    &ADD_F32,
    &MUL_F32,
    &SCALE_F32,
    &SILU_F32,
    &GELU_TANH_F32,
    &SIGMOID_F32,
    &SOFTPLUS_F32,
    &EXP_F32,
    &NEG_F32,
    &TANH_F32,
    &GELU_ERF_F32,
    &SWIGLU_F32,
    &GEGLU_F32,
    &COPY_U32,
    &CAST_F16_F32,
    &CAST_BF16_F32,
    &PATCH_BYTES,
];

/// Writes `piece` into the one-word tensor `dst` from its byte `head`, keeping the word's other
/// bytes (`patch_bytes`; the device's unaligned uploads use it for their partial words).
pub(crate) fn patch_word(dev: &Device, dst: &Tensor, head: usize, piece: &[u8]) -> Result<()> {
    if head + piece.len() > 4 || dst.nbytes() != 4 {
        return Err(err(format!(
            "a patch of {} bytes at byte {head} does not fit one word",
            piece.len()
        )));
    }
    let mut word = [0u8; 4];
    word[..piece.len()].copy_from_slice(piece);
    let src = dev.alloc(&TensorDesc::new(DType::U32, [1]))?;
    dev.upload(&src, &word)?;
    let (bound, offs) = bind(dev, &[(&src, 4), (dst, 4)])?;
    let params = vec![1, offs[1], u(head)?, u(piece.len())?];
    launch_1d(dev, &PATCH_BYTES, &bound, params, 1)
}

fn unary_kernel(op: UnaryOp) -> &'static Kernel {
    match op {
        UnaryOp::Silu => &SILU_F32,
        UnaryOp::GeluTanh => &GELU_TANH_F32,
        UnaryOp::Sigmoid => &SIGMOID_F32,
        UnaryOp::Softplus => &SOFTPLUS_F32,
        UnaryOp::Exp => &EXP_F32,
        UnaryOp::Neg => &NEG_F32,
        UnaryOp::Tanh => &TANH_F32,
        UnaryOp::GeluErf => &GELU_ERF_F32,
    }
}

/// An arithmetic kernel over `a` and, for the two-input ops, `b` (broadcast by rows).
fn arith(dev: &Device, kernel: &Kernel, scale: f32, i: &[&Tensor], y: &Tensor) -> Result<()> {
    let a = i[0];
    // Single-input ops bind `a` twice; the kernel never reads `b` for them.
    let b = i.get(1).copied().unwrap_or(a);
    let (bound, offs) = bind(dev, &[(a, 4), (b, 4), (y, 4)])?;
    let n = y.numel();
    let params = vec![
        u(n)?,
        offs[0],
        offs[1],
        offs[2],
        u(b.numel().max(1))?,
        scale.to_bits(),
    ];
    launch_1d(dev, kernel, &bound, params, n.div_ceil(256))
}

/// `Copy` (any dtype, as words) and `Cast` to f32 (from f32, f16 or bf16).
pub(super) fn copy(dev: &Device, x: &Tensor, y: &Tensor) -> Result<()> {
    let (kernel, n, tail) = match (x.dtype(), y.dtype()) {
        (a, b) if a == b => {
            if x.nbytes() % 4 != 0 {
                return Err(err(format!("copy of {}: not whole 32-bit words", x.desc())));
            }
            (&COPY_U32, x.nbytes() / 4, 0)
        }
        (DType::F16, DType::F32) => (&CAST_F16_F32, x.numel().div_ceil(2), x.numel() % 2),
        (DType::BF16, DType::F32) => (&CAST_BF16_F32, x.numel().div_ceil(2), x.numel() % 2),
        (a, b) => return Err(err(format!("cast {a} -> {b} has no WebGPU kernel"))),
    };
    let (bound, offs) = bind(dev, &[(x, 4), (y, 4)])?;
    let params = vec![u(n)?, offs[0], offs[1], u(tail)?];
    launch_1d(dev, kernel, &bound, params, n.div_ceil(256))
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, op: &ElementwiseOp, d: &OpDesc) -> bool {
    let (i, o) = (&d.inputs, &d.outputs);
    let fit = all_fit(dev, d);
    match op {
        ElementwiseOp::Add
        | ElementwiseOp::Mul
        | ElementwiseOp::Scale(_)
        | ElementwiseOp::Unary(_)
        | ElementwiseOp::Glu(_) => f32_all(i) && f32_all(o) && fit,
        ElementwiseOp::Copy => i[0].nbytes().is_some_and(|n| n % 4 == 0) && fit,
        ElementwiseOp::Cast => {
            let same = i[0].dtype == o[0].dtype && i[0].nbytes().is_some_and(|n| n % 4 == 0);
            let widen = matches!(i[0].dtype, DType::F32 | DType::F16 | DType::BF16)
                && o[0].dtype == DType::F32;
            (same || widen) && fit
        }
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &ElementwiseOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    let (kernel, scale): (&Kernel, f32) = match op {
        ElementwiseOp::Copy | ElementwiseOp::Cast => return copy(dev, i[0], o[0]),
        ElementwiseOp::Add => (&ADD_F32, 1.0),
        ElementwiseOp::Mul => (&MUL_F32, 1.0),
        ElementwiseOp::Scale(s) => (&SCALE_F32, *s),
        ElementwiseOp::Unary(u) => (unary_kernel(*u), 1.0),
        ElementwiseOp::Glu(GluOp::SwiGlu) => (&SWIGLU_F32, 1.0),
        ElementwiseOp::Glu(GluOp::GeGlu) => (&GEGLU_F32, 1.0),
    };
    arith(dev, kernel, scale, i, o[0])
}
