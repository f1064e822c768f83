//! The closed set of ops every backend implements or falls back on, and `OpDesc`, what a
//! backend's `supports_op` sees.
//!
//! Tensor layouts are row-major, last dimension contiguous. Weights are `[out, in]` (ggml's
//! order: a row of the weight is one output feature), so `MatMul` computes `y = x · Wᵀ`.
//! Float inputs and outputs of an op may each be f32, f16 or bf16 unless noted; the CPU
//! reference computes in f32 whatever they are. Index tensors are i32.
//!
//! Ops come in families, and a family is one stem. `op/<family>.rs` declares the family's ops
//! (a sub-enum: each op's parameters, and its inputs → outputs in the doc) and implements
//! [`Family`]: the shape, dtype and parameter checks and the outputs' shapes. The same stem
//! names every other file of the family: the CPU reference (`cpu/<family>.rs`), the
//! conformance cases (`validate/cases/<family>.rs`), the WGSL kernels and their launchers
//! (`shaders/<family>*.wgsl`, `backend-wgpu/src/ops/<family>.rs`) and the CUDA kernels and
//! their launch plans (`kernels/<family>*.cu`, `backend-cuda/src/plan/<family>.rs`; the one
//! kernel file of several families is `quant.cu`, the K-quant formats' per-format kernels). The
//! central code (this file, the backends' `supports_op` and dispatch, the case table)
//! matches on the family only, so a new op of a family is written in that family's files and
//! nowhere else.
//!
//! Fused ops are ops of their family too (a norm or GLU fused into a matmul is a `MatMulOp`).
//! The CPU implements each as the composition of its plain ops, so a backend's fused kernel
//! always has an oracle.

pub mod attention;
pub mod canvas;
mod check;
pub mod conv;
pub mod delta_net;
pub mod elementwise;
pub mod get_rows;
pub mod mat_mul;
pub mod moe;
pub mod norm;
pub mod reduce;
pub mod rope;
pub mod softmax;

use std::fmt;

use crate::error::Result;
use crate::tensor::TensorDesc;

pub use attention::{AttentionOp, AttnParams, Mask};
pub use canvas::CanvasOp;
pub(crate) use check::Ctx;
pub use conv::ConvOp;
pub use delta_net::DeltaNetOp;
pub use elementwise::{ElementwiseOp, GluOp, UnaryOp};
pub use get_rows::GetRowsOp;
pub use mat_mul::{MatMulOp, MAX_SHARED_NORM};
pub use moe::{MoeGating, MoeOp};
pub use norm::NormOp;
pub use reduce::ReduceOp;
pub use rope::{RopeMode, RopeOp, RopeParams};
pub use softmax::SoftmaxOp;

/// The op set: one variant per family, the op itself in the family's sub-enum.
#[derive(Clone, Debug, PartialEq, strum::EnumIter)]
pub enum Op {
    /// Matmuls by a weight, and the norm, GLU and residual fusions around them.
    MatMul(MatMulOp),
    /// Embedding lookups.
    GetRows(GetRowsOp),
    /// Arithmetic, activations, gated linear units, copies and casts.
    Elementwise(ElementwiseOp),
    /// Row normalisations.
    Norm(NormOp),
    /// Rotary position embeddings.
    Rope(RopeOp),
    Softmax(SoftmaxOp),
    /// Attention over contiguous or paged K/V, and writes into the paged caches.
    Attention(AttentionOp),
    /// Argmax and top-k over rows.
    Reduce(ReduceOp),
    /// Causal depthwise convolutions with carried state.
    Conv(ConvOp),
    /// The Gated DeltaNet recurrence.
    DeltaNet(DeltaNetOp),
    /// Mixture-of-experts routing, matmuls by expert and mixing.
    Moe(MoeOp),
    /// DiffusionGemma's denoising draw and acceptance.
    Canvas(CanvasOp),
}

/// What a family's file says about its ops: names, checks and output shapes. [`Op`]'s methods
/// hand each call to the op's family.
pub(crate) trait Family: strum::IntoEnumIterator {
    /// The op's name, as counters, logs and `kiln validate` show it.
    fn name(&self) -> &'static str;
    /// Every name the family's ops go by, each once. By default one per op; a family whose
    /// ops take a kind (unary activations) lists each kind.
    fn names() -> Vec<&'static str> {
        Self::iter().map(|op| op.name()).collect()
    }
    /// Input counts, dtypes, shapes and parameters.
    fn check_inputs(&self, c: &Ctx) -> Result<()>;
    /// The outputs for the (checked) inputs. In-place ops have none to infer: their outputs
    /// are the caller's buffers.
    fn infer(&self, c: &Ctx) -> Result<Vec<TensorDesc>>;
    /// Whether the op reads its outputs' previous contents (updates them in place).
    fn reads_outputs(&self) -> bool {
        false
    }
    /// The caller's outputs of an in-place op.
    fn check_in_place(&self, c: &Ctx) -> Result<()> {
        Err(c.err("is not an in-place op"))
    }
    /// Rules on the outputs beyond the inferred shapes and dtype classes.
    fn check_outputs(&self, _c: &Ctx) -> Result<()> {
        Ok(())
    }
}

/// `$body` with `$f` bound to the family op inside `$op` (a `&Op`), whichever family it is.
macro_rules! each_family {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            $crate::op::Op::MatMul($f) => $body,
            $crate::op::Op::GetRows($f) => $body,
            $crate::op::Op::Elementwise($f) => $body,
            $crate::op::Op::Norm($f) => $body,
            $crate::op::Op::Rope($f) => $body,
            $crate::op::Op::Softmax($f) => $body,
            $crate::op::Op::Attention($f) => $body,
            $crate::op::Op::Reduce($f) => $body,
            $crate::op::Op::Conv($f) => $body,
            $crate::op::Op::DeltaNet($f) => $body,
            $crate::op::Op::Moe($f) => $body,
            $crate::op::Op::Canvas($f) => $body,
        }
    };
}
pub(crate) use each_family;

impl Op {
    /// Every name [`Op::name`] gives, each once, family by family: each op under its own name,
    /// each unary and GLU op under its own. Derived from the enums (`EnumIter`), so a new op
    /// is listed by being declared. Tests that go through every op use this list.
    pub fn names() -> Vec<&'static str> {
        use strum::IntoEnumIterator;
        Op::iter()
            .flat_map(|op| each_family!(&op, f => family_names(f)))
            .collect()
    }

    /// The op's name, as counters, logs and `kiln validate` show it.
    pub fn name(&self) -> &'static str {
        each_family!(self, f => f.name())
    }

    /// Whether the op reads its outputs' previous contents (in-place updates: KV caches and
    /// state pools). A fallback must copy such outputs down before running and back after.
    pub fn reads_outputs(&self) -> bool {
        each_family!(self, f => f.reads_outputs())
    }

    /// Checks that `inputs` and `outputs` fit this op: counts, dtypes, shapes and parameters.
    /// The error names the op and every shape.
    pub fn check(&self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        check::check(self, inputs, outputs)
    }

    /// The outputs this op produces for `inputs`, with float outputs in the first float
    /// input's dtype (f32 for `GetRows`). Not defined for in-place ops, whose outputs are the
    /// caller's existing buffers.
    pub fn output_descs(&self, inputs: &[TensorDesc]) -> Result<Vec<TensorDesc>> {
        check::output_descs(self, inputs)
    }
}

/// The names of `op`'s family (the value only picks the family).
fn family_names<F: Family>(_op: &F) -> Vec<&'static str> {
    F::names()
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a backend is asked about: the exact op (with its parameters), and the dtypes and
/// shapes of its inputs and outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct OpDesc {
    pub op: Op,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
}

impl OpDesc {
    pub fn new(op: Op, inputs: Vec<TensorDesc>, outputs: Vec<TensorDesc>) -> Self {
        OpDesc {
            op,
            inputs,
            outputs,
        }
    }
    pub fn check(&self) -> Result<()> {
        self.op.check(&self.inputs, &self.outputs)
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.op.name())?;
        for (i, t) in self.inputs.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{t}")?;
        }
        write!(f, ") -> (")?;
        for (i, t) in self.outputs.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{t}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod names_tests {
    use super::Op;

    /// Each name once, every unary and GLU op by its own name, and the families by theirs.
    #[test]
    fn names_are_derived_once_each() {
        let names = Op::names();
        let set: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(set.len(), names.len(), "a name twice: {names:?}");
        for n in [
            "mat_mul",
            "silu",
            "tanh",
            "swiglu",
            "geglu",
            "mat_mul_add",
            "canvas_accept",
        ] {
            assert!(names.contains(&n), "{n} missing");
        }
        assert!(!names.contains(&"unary") && !names.contains(&"glu"));
    }
}
