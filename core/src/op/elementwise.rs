//! The elementwise family: arithmetic with row broadcast, activations, gated linear units,
//! copies and casts.

use super::{Ctx, Family};
use crate::error::Result;
use crate::tensor::TensorDesc;

/// Elementwise activations.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum UnaryOp {
    #[default]
    Silu,
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    Sigmoid,
    /// `ln(1 + e^x)`, linear above 20 as torch does.
    Softplus,
    Exp,
    Neg,
    Tanh,
    /// GELU as `½x(1 + erf(x/√2))` (torch's `nn.GELU()`, Qwen's vision merger).
    GeluErf,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 8] = [
        UnaryOp::Silu,
        UnaryOp::GeluTanh,
        UnaryOp::Sigmoid,
        UnaryOp::Softplus,
        UnaryOp::Exp,
        UnaryOp::Neg,
        UnaryOp::Tanh,
        UnaryOp::GeluErf,
    ];
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Silu => "silu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Softplus => "softplus",
            UnaryOp::Exp => "exp",
            UnaryOp::Neg => "neg",
            UnaryOp::Tanh => "tanh",
            UnaryOp::GeluErf => "gelu_erf",
        }
    }
}

/// Gated linear units: `act(gate) * up`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum GluOp {
    /// SiLU gate (Llama, Qwen).
    #[default]
    SwiGlu,
    /// GELU-tanh gate (Gemma).
    GeGlu,
}

impl GluOp {
    pub const ALL: [GluOp; 2] = [GluOp::SwiGlu, GluOp::GeGlu];
    pub fn activation(self) -> UnaryOp {
        match self {
            GluOp::SwiGlu => UnaryOp::Silu,
            GluOp::GeGlu => UnaryOp::GeluTanh,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GluOp::SwiGlu => "swiglu",
            GluOp::GeGlu => "geglu",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Default, strum::EnumIter)]
pub enum ElementwiseOp {
    /// `a [.., D] + b`, with `b` of `a`'s shape or broadcast from `[D]` or `[R', D]` (rows repeat).
    #[default]
    Add,
    /// `a * b`, broadcast as in `Add`.
    Mul,
    /// `x * scale`.
    Scale(f32),
    Unary(UnaryOp),
    /// `gate [.., F]`, `up [.., F]` → `act(gate) * up`.
    Glu(GluOp),
    /// Float → float of another (or the same) dtype, same shape.
    Cast,
    /// Same dtype and shape: a plain copy (views make reshapes free).
    Copy,
}

impl Family for ElementwiseOp {
    fn name(&self) -> &'static str {
        match self {
            ElementwiseOp::Add => "add",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Scale(_) => "scale",
            ElementwiseOp::Unary(u) => u.name(),
            ElementwiseOp::Glu(g) => g.name(),
            ElementwiseOp::Cast => "cast",
            ElementwiseOp::Copy => "copy",
        }
    }

    /// Each unary and GLU op under its own name.
    fn names() -> Vec<&'static str> {
        use strum::IntoEnumIterator;
        let mut out = Vec::new();
        for op in ElementwiseOp::iter() {
            match op {
                ElementwiseOp::Unary(_) => out.extend(UnaryOp::ALL.map(UnaryOp::name)),
                ElementwiseOp::Glu(_) => out.extend(GluOp::ALL.map(GluOp::name)),
                op => out.push(op.name()),
            }
        }
        out
    }

    fn check_inputs(&self, c: &Ctx) -> Result<()> {
        let i = c.inputs;
        match self {
            ElementwiseOp::Add | ElementwiseOp::Mul => {
                c.n_inputs(&[2])?;
                c.float(&i[0], "a")?;
                c.float(&i[1], "b")?;
                let (a, b) = (&i[0].shape, &i[1].shape);
                c.min_rank(&i[1], 1, "b")?;
                c.ensure(
                    a.last() == b.last() && b.numel() > 0 && a.numel() % b.numel() == 0,
                    || format!("b {b} does not broadcast over a {a}: it must be a's shape, [D] or [R', D] with R' dividing a's rows"),
                )
            }
            ElementwiseOp::Copy => {
                c.n_inputs(&[1])?;
                c.ensure(
                    !i[0].dtype.is_quantized() || i[0].shape.last() % i[0].dtype.block_size() == 0,
                    || "whole blocks only".into(),
                )
            }
            ElementwiseOp::Scale(_) | ElementwiseOp::Unary(_) | ElementwiseOp::Cast => {
                c.n_inputs(&[1])?;
                c.float(&i[0], "x")
            }
            ElementwiseOp::Glu(_) => {
                c.n_inputs(&[2])?;
                c.float(&i[0], "gate")?;
                c.float(&i[1], "up")?;
                c.ensure(i[0].shape == i[1].shape, || {
                    "gate and up must have one shape".into()
                })
            }
        }
    }

    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>> {
        Ok(vec![TensorDesc::new(
            c.inputs[0].dtype,
            c.inputs[0].shape.clone(),
        )])
    }

    /// Cast and Copy: the output dtype is the caller's choice within the float rule, except
    /// that a copy keeps it.
    fn check_outputs(&self, c: &Ctx) -> Result<()> {
        if *self == ElementwiseOp::Copy {
            c.ensure(c.outputs[0].dtype == c.inputs[0].dtype, || {
                "copy keeps the dtype; use cast to convert".into()
            })?;
        }
        Ok(())
    }
}
