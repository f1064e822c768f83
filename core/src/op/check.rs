//! The machinery of the shape, dtype and parameter checks: what every op's check goes through.
//! Each family's own rules are in its file (`Family::check_inputs`, `infer`, `check_in_place`).

use super::{Family, Op};
use crate::error::{Error, Result};
use crate::tensor::{DType, Shape, TensorDesc};

fn list(ts: &[TensorDesc]) -> String {
    if ts.is_empty() {
        return "none".into();
    }
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) struct Ctx<'a> {
    pub op: &'a Op,
    pub inputs: &'a [TensorDesc],
    pub outputs: &'a [TensorDesc],
}

impl Ctx<'_> {
    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::Op {
            op: self.op.name().to_string(),
            msg: msg.into(),
            inputs: list(self.inputs),
            outputs: list(self.outputs),
        }
    }
    pub fn ensure(&self, cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
        if cond {
            Ok(())
        } else {
            Err(self.err(msg()))
        }
    }
    pub fn n_inputs(&self, allowed: &[usize]) -> Result<()> {
        self.ensure(allowed.contains(&self.inputs.len()), || {
            format!("takes {allowed:?} inputs, got {}", self.inputs.len())
        })
    }
    pub fn float(&self, t: &TensorDesc, what: &str) -> Result<()> {
        self.ensure(t.dtype.is_float(), || {
            format!("{what} must be f32, f16 or bf16, got {}", t.dtype)
        })
    }
    pub fn dtype(&self, t: &TensorDesc, d: DType, what: &str) -> Result<()> {
        self.ensure(t.dtype == d, || {
            format!("{what} must be {d}, got {}", t.dtype)
        })
    }
    pub fn rank(&self, t: &TensorDesc, r: usize, what: &str) -> Result<()> {
        self.ensure(t.shape.rank() == r, || {
            format!("{what} must have rank {r}, got {}", t.shape)
        })
    }
    pub fn min_rank(&self, t: &TensorDesc, r: usize, what: &str) -> Result<()> {
        self.ensure(t.shape.rank() >= r, || {
            format!("{what} must have rank at least {r}, got {}", t.shape)
        })
    }
    /// Whole blocks along the last dimension.
    pub fn blocks(&self, t: &TensorDesc, what: &str) -> Result<()> {
        let bs = t.dtype.block_size();
        self.ensure(t.shape.last() % bs == 0, || {
            format!(
                "{what}: last dimension {} is not a multiple of the {} block size {bs}",
                t.shape.last(),
                t.dtype
            )
        })
    }
    pub fn dims(&self, t: &TensorDesc) -> Vec<usize> {
        t.shape.0.clone()
    }
}

pub(crate) fn with_last(shape: &Shape, last: usize) -> Shape {
    let mut d = shape.0.clone();
    match d.last_mut() {
        Some(l) => *l = last,
        None => d.push(last),
    }
    Shape(d)
}

pub(crate) fn lead(shape: &Shape) -> Vec<usize> {
    shape.0[..shape.rank().saturating_sub(1)].to_vec()
}

/// Expected outputs, computed from the inputs (after checking the inputs).
pub(super) fn output_descs(op: &Op, inputs: &[TensorDesc]) -> Result<Vec<TensorDesc>> {
    let c = Ctx {
        op,
        inputs,
        outputs: &[],
    };
    super::each_family!(op, f => {
        f.check_inputs(&c)?;
        f.infer(&c)
    })
}

pub(super) fn check(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let c = Ctx {
        op,
        inputs,
        outputs,
    };
    super::each_family!(op, f => f.check_inputs(&c))?;
    if op.reads_outputs() {
        return super::each_family!(op, f => f.check_in_place(&c));
    }
    let want = super::each_family!(op, f => f.infer(&c))?;
    c.ensure(outputs.len() == want.len(), || {
        format!("produces {} outputs, got {}", want.len(), outputs.len())
    })?;
    for (i, (got, w)) in outputs.iter().zip(&want).enumerate() {
        c.ensure(got.shape == w.shape, || {
            format!("output {i} must have shape {}, got {}", w.shape, got.shape)
        })?;
        let dtype_ok = if w.dtype.is_float() {
            got.dtype.is_float()
        } else {
            got.dtype == w.dtype
        };
        c.ensure(dtype_ok, || {
            format!(
                "output {i} must be {}, got {}",
                if w.dtype.is_float() {
                    "a float type".to_string()
                } else {
                    w.dtype.to_string()
                },
                got.dtype
            )
        })?;
    }
    super::each_family!(op, f => f.check_outputs(&c))
}
