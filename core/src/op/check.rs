//! Shape, dtype and parameter checks for every op: the one place that says what a valid call is.

use super::{Mask, Op};
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

struct Ctx<'a> {
    op: &'a Op,
    inputs: &'a [TensorDesc],
    outputs: &'a [TensorDesc],
}

impl Ctx<'_> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::Op {
            op: self.op.name().to_string(),
            msg: msg.into(),
            inputs: list(self.inputs),
            outputs: list(self.outputs),
        }
    }
    fn ensure(&self, cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
        if cond {
            Ok(())
        } else {
            Err(self.err(msg()))
        }
    }
    fn n_inputs(&self, allowed: &[usize]) -> Result<()> {
        self.ensure(allowed.contains(&self.inputs.len()), || {
            format!("takes {allowed:?} inputs, got {}", self.inputs.len())
        })
    }
    fn float(&self, t: &TensorDesc, what: &str) -> Result<()> {
        self.ensure(t.dtype.is_float(), || {
            format!("{what} must be f32, f16 or bf16, got {}", t.dtype)
        })
    }
    fn dtype(&self, t: &TensorDesc, d: DType, what: &str) -> Result<()> {
        self.ensure(t.dtype == d, || {
            format!("{what} must be {d}, got {}", t.dtype)
        })
    }
    fn rank(&self, t: &TensorDesc, r: usize, what: &str) -> Result<()> {
        self.ensure(t.shape.rank() == r, || {
            format!("{what} must have rank {r}, got {}", t.shape)
        })
    }
    fn min_rank(&self, t: &TensorDesc, r: usize, what: &str) -> Result<()> {
        self.ensure(t.shape.rank() >= r, || {
            format!("{what} must have rank at least {r}, got {}", t.shape)
        })
    }
    /// Whole blocks along the last dimension.
    fn blocks(&self, t: &TensorDesc, what: &str) -> Result<()> {
        let bs = t.dtype.block_size();
        self.ensure(t.shape.last() % bs == 0, || {
            format!(
                "{what}: last dimension {} is not a multiple of the {} block size {bs}",
                t.shape.last(),
                t.dtype
            )
        })
    }
    fn dims(&self, t: &TensorDesc) -> Vec<usize> {
        t.shape.0.clone()
    }
}

fn with_last(shape: &Shape, last: usize) -> Shape {
    let mut d = shape.0.clone();
    match d.last_mut() {
        Some(l) => *l = last,
        None => d.push(last),
    }
    Shape(d)
}

fn lead(shape: &Shape) -> Vec<usize> {
    shape.0[..shape.rank().saturating_sub(1)].to_vec()
}

/// Expected outputs, computed from the inputs (after checking the inputs).
pub(super) fn output_descs(op: &Op, inputs: &[TensorDesc]) -> Result<Vec<TensorDesc>> {
    let c = Ctx {
        op,
        inputs,
        outputs: &[],
    };
    check_inputs(&c)?;
    infer(&c)
}

pub(super) fn check(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let c = Ctx {
        op,
        inputs,
        outputs,
    };
    check_inputs(&c)?;
    if op.reads_outputs() {
        return check_inplace_outputs(&c);
    }
    let want = infer(&c)?;
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
    // Cast and Copy: the output dtype is the caller's choice within the rules above.
    if matches!(op, Op::Copy) {
        c.ensure(outputs[0].dtype == inputs[0].dtype, || {
            "copy keeps the dtype; use cast to convert".into()
        })?;
    }
    Ok(())
}

fn check_inputs(c: &Ctx) -> Result<()> {
    let i = c.inputs;
    match c.op {
        Op::MatMul | Op::MatMulAdd | Op::RmsNormMatMul { .. } | Op::GluMatMul(_) => {
            let (x, w) = match c.op {
                Op::MatMul => {
                    c.n_inputs(&[2])?;
                    (&i[0], &i[1])
                }
                Op::MatMulAdd => {
                    c.n_inputs(&[3])?;
                    (&i[0], &i[1])
                }
                Op::RmsNormMatMul { eps, .. } => {
                    c.ensure(
                        i.len() >= 3 && i.len() <= 2 + super::MAX_SHARED_NORM,
                        || {
                            format!(
                                "takes x, the norm weight and 1 to {} weights, got {} inputs",
                                super::MAX_SHARED_NORM,
                                i.len()
                            )
                        },
                    )?;
                    for (j, w) in i.iter().enumerate().skip(3) {
                        c.rank(w, 2, "weight")?;
                        c.ensure(!w.dtype.is_int(), || {
                            format!("weight {j} dtype {} is not a weight type", w.dtype)
                        })?;
                        c.blocks(w, "weight")?;
                        c.ensure(w.shape.0[1] == i[0].shape.last(), || {
                            format!(
                                "weight {j} width {} != activation width {}",
                                w.shape.0[1],
                                i[0].shape.last()
                            )
                        })?;
                    }
                    c.float(&i[1], "norm weight")?;
                    c.ensure(i[1].shape.0 == [i[0].shape.last()], || {
                        format!("norm weight must be [{}]", i[0].shape.last())
                    })?;
                    c.ensure(*eps >= 0.0, || "eps must be non-negative".into())?;
                    (&i[0], &i[2])
                }
                _ => {
                    c.n_inputs(&[3, 4])?;
                    c.float(&i[1], "up")?;
                    c.ensure(i[0].shape == i[1].shape, || {
                        "gate and up must have one shape".into()
                    })?;
                    (&i[0], &i[2])
                }
            };
            c.float(x, "activation")?;
            c.min_rank(x, 1, "activation")?;
            c.rank(w, 2, "weight")?;
            c.ensure(!w.dtype.is_int(), || {
                format!("weight dtype {} is not a weight type", w.dtype)
            })?;
            c.blocks(w, "weight")?;
            c.ensure(x.shape.last() == w.shape.0[1], || {
                format!(
                    "activation width {} != weight width {}",
                    x.shape.last(),
                    w.shape.0[1]
                )
            })?;
            // The residual of MatMulAdd (input 2) and of GluMatMul (input 3): the output's
            // shape, in the activation's dtype.
            let res = match c.op {
                Op::MatMulAdd => i.get(2),
                Op::GluMatMul(_) => i.get(3),
                _ => None,
            };
            match res {
                Some(r) => {
                    c.dtype(r, x.dtype, "residual")?;
                    c.ensure(r.shape == with_last(&x.shape, w.shape.0[0]), || {
                        format!(
                            "residual must have the output's shape {}",
                            with_last(&x.shape, w.shape.0[0])
                        )
                    })
                }
                None => Ok(()),
            }
        }
        Op::MatMulId => {
            c.n_inputs(&[3])?;
            let (x, w, ids) = (&i[0], &i[1], &i[2]);
            c.float(x, "activation")?;
            c.rank(w, 3, "expert weights")?;
            c.ensure(!w.dtype.is_int(), || {
                format!("weight dtype {} is not a weight type", w.dtype)
            })?;
            c.blocks(w, "expert weights")?;
            c.dtype(ids, DType::I32, "ids")?;
            c.rank(ids, 2, "ids")?;
            let (t, k) = (ids.shape.0[0], ids.shape.0[1]);
            let kdim = w.shape.0[2];
            let ok =
                x.shape.0 == [t, kdim] || x.shape.0 == [t, k, kdim] || x.shape.0 == [t, 1, kdim];
            c.ensure(ok, || {
                format!("activation must be [{t}, {kdim}] or [{t}, {k}, {kdim}]")
            })
        }
        Op::GetRows => {
            c.n_inputs(&[2])?;
            c.rank(&i[0], 2, "table")?;
            c.blocks(&i[0], "table")?;
            c.ensure(!i[0].dtype.is_int(), || {
                "table must be a float or block type".into()
            })?;
            c.dtype(&i[1], DType::I32, "ids")?;
            c.rank(&i[1], 1, "ids")
        }
        Op::Add | Op::Mul => {
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
        Op::Scale(_) | Op::Unary(_) | Op::Cast | Op::Copy => {
            c.n_inputs(&[1])?;
            if matches!(c.op, Op::Copy) {
                c.ensure(
                    !i[0].dtype.is_quantized() || i[0].shape.last() % i[0].dtype.block_size() == 0,
                    || "whole blocks only".into(),
                )
            } else {
                c.float(&i[0], "x")
            }
        }
        Op::Glu(_) => {
            c.n_inputs(&[2])?;
            c.float(&i[0], "gate")?;
            c.float(&i[1], "up")?;
            c.ensure(i[0].shape == i[1].shape, || {
                "gate and up must have one shape".into()
            })
        }
        Op::RmsNorm { eps, .. } => {
            c.n_inputs(&[2])?;
            c.float(&i[0], "x")?;
            c.float(&i[1], "weight")?;
            c.ensure(i[1].shape.0 == [i[0].shape.last()], || {
                format!("weight must be [{}]", i[0].shape.last())
            })?;
            c.ensure(*eps >= 0.0, || "eps must be non-negative".into())
        }
        Op::L2Norm { eps } => {
            c.n_inputs(&[1])?;
            c.float(&i[0], "x")?;
            c.ensure(*eps >= 0.0, || "eps must be non-negative".into())
        }
        Op::Rope(p) => {
            c.n_inputs(&[2, 3])?;
            c.float(&i[0], "x")?;
            c.rank(&i[0], 3, "x")?;
            c.dtype(&i[1], DType::I32, "positions")?;
            let d = c.dims(&i[0]);
            c.ensure(i[1].shape.0 == [d[0]], || {
                format!("positions must be [{}]", d[0])
            })?;
            c.ensure(p.n_rot % 2 == 0 && p.n_rot > 0 && p.n_rot <= d[2], || {
                format!(
                    "n_rot {} must be even, positive and at most the head dim {}",
                    p.n_rot, d[2]
                )
            })?;
            c.ensure(p.base > 0.0 && p.freq_scale > 0.0, || {
                "base and freq_scale must be positive".into()
            })?;
            if i.len() == 3 {
                c.dtype(&i[2], DType::F32, "freq_factors")?;
                c.ensure(i[2].shape.0 == [p.n_rot / 2], || {
                    format!("freq_factors must be [{}]", p.n_rot / 2)
                })?;
            }
            Ok(())
        }
        Op::Softmax { soft_cap, .. } => {
            c.n_inputs(&[1, 2])?;
            c.float(&i[0], "x")?;
            c.min_rank(&i[0], 1, "x")?;
            if let Some(cap) = soft_cap {
                c.ensure(*cap > 0.0, || "soft cap must be positive".into())?;
            }
            if i.len() == 2 {
                c.dtype(&i[1], DType::F32, "mask")?;
                let rows = i[0].shape.rows();
                let mrows = i[1].shape.rows();
                c.ensure(
                    i[1].shape.last() == i[0].shape.last() && mrows > 0 && rows % mrows == 0,
                    || "mask must be [R', N] with R' dividing x's rows".into(),
                )?;
            }
            Ok(())
        }
        Op::Attention(p) | Op::PagedAttention(p) => {
            if let Some(cap) = p.soft_cap {
                c.ensure(cap > 0.0, || "soft cap must be positive".into())?;
            }
            if let Mask::SlidingWindow(w) = p.mask {
                c.ensure(w > 0, || "sliding window must be at least 1".into())?;
            }
            let paged = matches!(c.op, Op::PagedAttention(_));
            c.n_inputs(if paged { &[6] } else { &[3] })?;
            c.float(&i[0], "q")?;
            c.rank(&i[0], 3, "q")?;
            let q = c.dims(&i[0]);
            let kr = if paged { 4 } else { 3 };
            c.rank(&i[1], kr, "k")?;
            c.rank(&i[2], kr, "v")?;
            let k = c.dims(&i[1]);
            let v = c.dims(&i[2]);
            let (hkv, d) = (k[kr - 2], k[kr - 1]);
            c.ensure(v[kr - 2] == hkv, || {
                "k and v must have the same number of heads".into()
            })?;
            c.ensure(v[..kr - 2] == k[..kr - 2], || {
                "k and v must have the same leading dims".into()
            })?;
            c.ensure(d == q[2], || {
                format!("q head dim {} != k head dim {d}", q[2])
            })?;
            c.ensure(hkv > 0 && q[1] % hkv == 0, || {
                format!("query heads {} must be a multiple of kv heads {hkv}", q[1])
            })?;
            if paged {
                c.blocks(&i[1], "k_cache")?;
                c.blocks(&i[2], "v_cache")?;
                c.ensure(!i[1].dtype.is_int() && !i[2].dtype.is_int(), || {
                    "caches must be float or block types".into()
                })?;
                for (t, what) in [
                    (&i[3], "block_table"),
                    (&i[4], "seq_lens"),
                    (&i[5], "q_start"),
                ] {
                    c.dtype(t, DType::I32, what)?;
                }
                c.rank(&i[3], 2, "block_table")?;
                let s = i[3].shape.0[0];
                c.ensure(i[4].shape.0 == [s], || format!("seq_lens must be [{s}]"))?;
                c.ensure(i[5].shape.0 == [s + 1], || {
                    format!("q_start must be [{}]", s + 1)
                })?;
            } else {
                c.float(&i[1], "k")?;
                c.float(&i[2], "v")?;
                c.ensure(k[0] >= q[0], || {
                    format!("{} queries but only {} keys", q[0], k[0])
                })?;
            }
            Ok(())
        }
        Op::KvWrite => {
            c.n_inputs(&[3])?;
            c.float(&i[0], "k")?;
            c.float(&i[1], "v")?;
            c.rank(&i[0], 3, "k")?;
            c.rank(&i[1], 3, "v")?;
            c.ensure(i[0].shape.0[..2] == i[1].shape.0[..2], || {
                "k and v must be [T, Hkv, _] alike".into()
            })?;
            c.dtype(&i[2], DType::I32, "slots")?;
            c.ensure(i[2].shape.0 == [i[0].shape.0[0]], || {
                "slots must be [T]".into()
            })
        }
        Op::Argmax | Op::TopK(_) => {
            c.n_inputs(&[1])?;
            c.float(&i[0], "x")?;
            c.min_rank(&i[0], 1, "x")?;
            if let Op::TopK(k) = c.op {
                c.ensure(*k >= 1 && *k <= i[0].shape.last(), || {
                    format!("k = {k} must be in 1..={}", i[0].shape.last())
                })?;
            }
            c.ensure(i[0].shape.last() > 0, || "rows must not be empty".into())
        }
        Op::Conv1d { .. } => {
            c.n_inputs(&[4])?;
            c.float(&i[0], "x")?;
            c.float(&i[1], "w")?;
            c.float(&i[2], "state")?;
            c.rank(&i[0], 2, "x")?;
            c.rank(&i[1], 2, "w")?;
            c.rank(&i[2], 3, "state")?;
            c.dtype(&i[3], DType::I32, "seq_start")?;
            let ch = i[0].shape.0[1];
            let kw = i[1].shape.0[1];
            c.ensure(i[1].shape.0[0] == ch && kw >= 1, || {
                format!("w must be [{ch}, K]")
            })?;
            let s = i[2].shape.0[0];
            c.ensure(i[2].shape.0[1..] == [kw - 1, ch], || {
                format!("state must be [S, {}, {ch}]", kw - 1)
            })?;
            c.ensure(i[3].shape.0 == [s + 1], || {
                format!("seq_start must be [{}]", s + 1)
            })
        }
        Op::Conv1dDecode { .. } => {
            c.n_inputs(&[3])?;
            c.float(&i[0], "x")?;
            c.float(&i[1], "w")?;
            c.rank(&i[0], 2, "x")?;
            c.rank(&i[1], 2, "w")?;
            c.dtype(&i[2], DType::I32, "slots")?;
            c.ensure(
                i[1].shape.0[0] == i[0].shape.0[1] && i[1].shape.0[1] >= 1,
                || "w must be [C, K]".into(),
            )?;
            c.ensure(i[2].shape.0 == [i[0].shape.0[0]], || {
                "slots must be [S]".into()
            })
        }
        Op::DeltaNet { .. } | Op::DeltaNetDecode { .. } => {
            let chunk = match c.op {
                Op::DeltaNet { chunk, .. } => *chunk,
                _ => None,
            };
            let decode = matches!(c.op, Op::DeltaNetDecode { .. });
            c.n_inputs(if decode { &[6] } else { &[7] })?;
            for (t, what) in i[..5].iter().zip(["q", "k", "v", "g", "beta"]) {
                c.float(t, what)?;
            }
            c.rank(&i[0], 3, "q")?;
            c.rank(&i[2], 3, "v")?;
            let q = c.dims(&i[0]);
            let v = c.dims(&i[2]);
            c.ensure(i[1].shape == i[0].shape, || "k must have q's shape".into())?;
            c.ensure(v[0] == q[0], || {
                "q and v must have the same token count".into()
            })?;
            c.ensure(q[1] > 0 && v[1] % q[1] == 0, || {
                format!(
                    "value heads {} must be a multiple of key heads {}",
                    v[1], q[1]
                )
            })?;
            c.ensure(
                i[3].shape.0 == [v[0], v[1]] && i[4].shape.0 == [v[0], v[1]],
                || format!("g and beta must be [{}, {}]", v[0], v[1]),
            )?;
            if decode {
                c.dtype(&i[5], DType::I32, "slots")?;
                c.ensure(i[5].shape.0 == [q[0]], || "slots must be [S]".into())
            } else {
                if let Some(ch) = chunk {
                    c.ensure(ch >= 1, || "chunk size must be at least 1".into())?;
                }
                c.float(&i[5], "state")?;
                c.rank(&i[5], 4, "state")?;
                let s = i[5].shape.0[0];
                c.ensure(i[5].shape.0[1..] == [v[1], q[2], v[2]], || {
                    format!("state must be [S, {}, {}, {}]", v[1], q[2], v[2])
                })?;
                c.dtype(&i[6], DType::I32, "seq_start")?;
                c.ensure(i[6].shape.0 == [s + 1], || {
                    format!("seq_start must be [{}]", s + 1)
                })
            }
        }
        Op::MoeSum => {
            c.n_inputs(&[2])?;
            c.float(&i[0], "y")?;
            c.rank(&i[0], 3, "y")?;
            c.dtype(&i[1], DType::F32, "w")?;
            c.ensure(i[1].shape.0 == i[0].shape.0[..2], || {
                format!("w must be [{}, {}]", i[0].shape.0[0], i[0].shape.0[1])
            })
        }
        Op::SoftEmbedding { .. } => {
            c.n_inputs(&[2])?;
            c.dtype(&i[0], DType::F32, "logits")?;
            c.rank(&i[0], 2, "logits")?;
            c.rank(&i[1], 2, "table")?;
            c.ensure(i[1].shape.0[0] == i[0].shape.0[1], || {
                format!("table must have {} rows", i[0].shape.0[1])
            })
        }
        Op::CanvasDraw { scale, .. } => {
            c.n_inputs(&[1])?;
            c.dtype(&i[0], DType::F32, "logits")?;
            c.rank(&i[0], 2, "logits")?;
            c.ensure(i[0].shape.0[1] >= 1, || "the vocabulary is empty".into())?;
            c.ensure(i[0].shape.0[1] <= i32::MAX as usize, || {
                "the vocabulary must fit an i32 id".into()
            })?;
            c.ensure(scale.is_finite() && *scale > 0.0, || {
                format!("scale {scale} must be finite and above 0")
            })
        }
        Op::CanvasAccept {
            entropy_bound,
            confidence,
            vocab,
            ..
        } => {
            c.n_inputs(&[3])?;
            c.dtype(&i[0], DType::I32, "argmax")?;
            c.dtype(&i[1], DType::I32, "drawn")?;
            c.dtype(&i[2], DType::F32, "entropy")?;
            let t = i[0].shape.0.clone();
            c.ensure(
                t.len() == 1 && i[1].shape.0 == t && i[2].shape.0 == t,
                || "argmax, drawn and entropy must be [T]".into(),
            )?;
            c.ensure(t[0] >= 1 && t[0] <= super::canvas::MAX_CANVAS, || {
                format!("a canvas of 1 to {} positions", super::canvas::MAX_CANVAS)
            })?;
            c.ensure(*vocab >= 1 && *vocab <= i32::MAX as usize, || {
                format!("vocabulary {vocab} must be 1 to {}", i32::MAX)
            })?;
            c.ensure(!entropy_bound.is_nan() && !confidence.is_nan(), || {
                "bounds must not be NaN".into()
            })
        }
        Op::MoeRoute { k, .. } => {
            c.n_inputs(&[1])?;
            c.float(&i[0], "logits")?;
            c.rank(&i[0], 2, "logits")?;
            c.ensure(*k >= 1 && *k <= i[0].shape.0[1], || {
                format!("k = {k} must be in 1..={}", i[0].shape.0[1])
            })
        }
    }
}

fn infer(c: &Ctx) -> Result<Vec<TensorDesc>> {
    let i = c.inputs;
    let act = i[0].dtype;
    let one = |s: Shape| Ok(vec![TensorDesc::new(act, s)]);
    match c.op {
        Op::RmsNormMatMul { .. } => Ok(i[2..]
            .iter()
            .map(|w| TensorDesc::new(act, with_last(&i[0].shape, w.shape.0[0])))
            .collect()),
        Op::MatMul | Op::MatMulAdd | Op::GluMatMul(_) => {
            let w = if matches!(c.op, Op::MatMul | Op::MatMulAdd) {
                &i[1]
            } else {
                &i[2]
            };
            one(with_last(&i[0].shape, w.shape.0[0]))
        }
        Op::MatMulId => {
            let ids = &i[2].shape.0;
            one(Shape(vec![ids[0], ids[1], i[1].shape.0[1]]))
        }
        Op::GetRows => Ok(vec![TensorDesc::new(
            DType::F32,
            [i[1].shape.0[0], i[0].shape.0[1]],
        )]),
        Op::Add
        | Op::Mul
        | Op::Scale(_)
        | Op::Unary(_)
        | Op::Glu(_)
        | Op::RmsNorm { .. }
        | Op::L2Norm { .. }
        | Op::Rope(_)
        | Op::Softmax { .. }
        | Op::Cast
        | Op::Copy => one(i[0].shape.clone()),
        Op::Attention(_) | Op::PagedAttention(_) => {
            let q = &i[0].shape.0;
            let dv = *i[2].shape.0.last().unwrap_or(&0);
            one(Shape(vec![q[0], q[1], dv]))
        }
        Op::Argmax => Ok(vec![TensorDesc::new(DType::I32, lead(&i[0].shape))]),
        Op::TopK(k) => {
            let s = with_last(&i[0].shape, *k);
            Ok(vec![
                TensorDesc::new(DType::F32, s.clone()),
                TensorDesc::new(DType::I32, s),
            ])
        }
        Op::Conv1d { .. } => Ok(vec![
            TensorDesc::new(act, i[0].shape.clone()),
            TensorDesc::new(i[2].dtype, i[2].shape.clone()),
        ]),
        Op::DeltaNet { .. } => Ok(vec![
            TensorDesc::new(act, i[2].shape.clone()),
            TensorDesc::new(i[5].dtype, i[5].shape.clone()),
        ]),
        Op::MoeSum => Ok(vec![TensorDesc::new(
            act,
            Shape(vec![i[0].shape.0[0], i[0].shape.0[2]]),
        )]),
        Op::SoftEmbedding { .. } => Ok(vec![TensorDesc::new(
            DType::F32,
            Shape(vec![i[0].shape.0[0], i[1].shape.0[1]]),
        )]),
        Op::MoeRoute { k, .. } => {
            let s = Shape(vec![i[0].shape.0[0], *k]);
            Ok(vec![
                TensorDesc::new(DType::F32, s.clone()),
                TensorDesc::new(DType::I32, s),
            ])
        }
        Op::CanvasDraw { .. } => {
            let (t, v) = (i[0].shape.0[0], i[0].shape.0[1]);
            Ok(vec![
                TensorDesc::new(DType::F32, Shape(vec![t, v])),
                TensorDesc::new(DType::I32, Shape(vec![t])),
                TensorDesc::new(DType::I32, Shape(vec![t])),
                TensorDesc::new(DType::F32, Shape(vec![t])),
            ])
        }
        Op::KvWrite
        | Op::DeltaNetDecode { .. }
        | Op::Conv1dDecode { .. }
        | Op::CanvasAccept { .. } => Err(c.err(
            "updates its outputs in place: the caller supplies them, so they cannot be inferred",
        )),
    }
}

fn check_inplace_outputs(c: &Ctx) -> Result<()> {
    let (i, o) = (c.inputs, c.outputs);
    match c.op {
        Op::KvWrite => {
            c.ensure(o.len() == 2, || {
                format!("updates 2 outputs (k_cache, v_cache), got {}", o.len())
            })?;
            c.rank(&o[0], 4, "k_cache")?;
            c.rank(&o[1], 4, "v_cache")?;
            c.blocks(&o[0], "k_cache")?;
            c.blocks(&o[1], "v_cache")?;
            c.ensure(!o[0].dtype.is_int() && !o[1].dtype.is_int(), || {
                "caches must be float or block types".into()
            })?;
            let (k, v) = (&i[0].shape.0, &i[1].shape.0);
            c.ensure(
                o[0].shape.0[2..] == k[1..] && o[1].shape.0[2..] == v[1..],
                || "caches must be [B, bs, Hkv, D] with k's and v's head shapes".into(),
            )?;
            c.ensure(o[0].shape.0[..2] == o[1].shape.0[..2], || {
                "k_cache and v_cache must have the same blocks".into()
            })
        }
        Op::DeltaNetDecode { .. } => {
            c.ensure(o.len() == 2, || {
                format!(
                    "produces o and updates state_pool: 2 outputs, got {}",
                    o.len()
                )
            })?;
            let v = &i[2].shape.0;
            c.ensure(o[0].shape == i[2].shape && o[0].dtype.is_float(), || {
                format!("o must be a float [{}, {}, {}]", v[0], v[1], v[2])
            })?;
            c.float(&o[1], "state_pool")?;
            c.rank(&o[1], 4, "state_pool")?;
            c.ensure(o[1].shape.0[1..] == [v[1], i[0].shape.0[2], v[2]], || {
                format!(
                    "state_pool must be [P, {}, {}, {}]",
                    v[1], i[0].shape.0[2], v[2]
                )
            })
        }
        Op::Conv1dDecode { .. } => {
            c.ensure(o.len() == 2, || {
                format!(
                    "produces y and updates state_pool: 2 outputs, got {}",
                    o.len()
                )
            })?;
            c.ensure(o[0].shape == i[0].shape && o[0].dtype.is_float(), || {
                "y must be a float tensor of x's shape".into()
            })?;
            c.float(&o[1], "state_pool")?;
            c.rank(&o[1], 3, "state_pool")?;
            let (ch, kw) = (i[0].shape.0[1], i[1].shape.0[1]);
            c.ensure(o[1].shape.0[1..] == [kw - 1, ch], || {
                format!("state_pool must be [P, {}, {ch}]", kw - 1)
            })
        }
        Op::CanvasAccept { stability, .. } => {
            let t = i[0].shape.0[0];
            c.ensure(o.len() == 3, || {
                format!(
                    "updates canvas, history and status: 3 outputs, got {}",
                    o.len()
                )
            })?;
            let s = (*stability).max(1);
            c.ensure(
                o.iter().all(|d| d.dtype == DType::I32)
                    && o[0].shape.0 == [t]
                    && o[1].shape.0 == [s, t]
                    && o[2].shape.0 == [2],
                || format!("outputs must be i32 canvas [{t}], history [{s}, {t}], status [2]"),
            )
        }
        _ => Err(c.err("is not an in-place op")),
    }
}
