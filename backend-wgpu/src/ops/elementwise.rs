//! Elementwise launchers: add and mul (row broadcast), scale, activations, gated linear
//! units, copies and casts to f32.

use kiln_core::op::{GluOp, Op, UnaryOp};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{bind, err, launch_1d, u};
use crate::device::Device;
use crate::kernels::{self, Kernel};

fn unary_kernel(op: UnaryOp) -> &'static Kernel {
    match op {
        UnaryOp::Silu => &kernels::SILU_F32,
        UnaryOp::GeluTanh => &kernels::GELU_TANH_F32,
        UnaryOp::Sigmoid => &kernels::SIGMOID_F32,
        UnaryOp::Softplus => &kernels::SOFTPLUS_F32,
        UnaryOp::Exp => &kernels::EXP_F32,
        UnaryOp::Neg => &kernels::NEG_F32,
        UnaryOp::Tanh => &kernels::TANH_F32,
    }
}

pub(super) fn run(dev: &Device, op: &Op, i: &[&Tensor], y: &Tensor) -> Result<()> {
    let a = i[0];
    // Single-input ops bind `a` twice; the kernel never reads `b` for them.
    let b = i.get(1).copied().unwrap_or(a);
    let (kernel, scale): (&Kernel, f32) = match op {
        Op::Add => (&kernels::ADD_F32, 1.0),
        Op::Mul => (&kernels::MUL_F32, 1.0),
        Op::Scale(s) => (&kernels::SCALE_F32, *s),
        Op::Unary(u) => (unary_kernel(*u), 1.0),
        Op::Glu(GluOp::SwiGlu) => (&kernels::SWIGLU_F32, 1.0),
        Op::Glu(GluOp::GeGlu) => (&kernels::GEGLU_F32, 1.0),
        other => return Err(err(format!("{} is not elementwise", other.name()))),
    };
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
            (&kernels::COPY_U32, x.nbytes() / 4, 0)
        }
        (DType::F16, DType::F32) => (&kernels::CAST_F16_F32, x.numel().div_ceil(2), x.numel() % 2),
        (DType::BF16, DType::F32) => (
            &kernels::CAST_BF16_F32,
            x.numel().div_ceil(2),
            x.numel() % 2,
        ),
        (a, b) => return Err(err(format!("cast {a} -> {b} has no WebGPU kernel"))),
    };
    let (bound, offs) = bind(dev, &[(x, 4), (y, 4)])?;
    let params = vec![u(n)?, offs[0], offs[1], u(tail)?];
    launch_1d(dev, kernel, &bound, params, n.div_ceil(256))
}
