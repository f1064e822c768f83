//! Binary ops with broadcasting, scale, activations, gated units, cast and copy.

use super::{pool, In, KResult, Out};
use crate::op::{GluOp, Op, UnaryOp};

/// Elements per parallel task for cheap elementwise work.
const CHUNK: usize = 1 << 14;

pub(crate) fn binary(op: &Op, i: &[In], o: &mut [Out]) -> KResult {
    let a = i[0].f32()?;
    let b = i[1].f32()?;
    let mul = matches!(op, Op::Mul);
    // `b` repeats every b.len() elements (its shape divides a's: same, [D] or [R', D]).
    let bl = b.len();
    o[0].with_f32(false, |y| {
        let bl = bl.max(1);
        pool::par_rows(y, bl, CHUNK, |r0, y| {
            let a = &a[r0 * bl..];
            for (y, a) in y.chunks_mut(bl).zip(a.chunks(bl)) {
                for ((y, a), b) in y.iter_mut().zip(a).zip(b.iter()) {
                    *y = if mul { a * b } else { a + b };
                }
            }
        });
        Ok(())
    })
}

pub(crate) fn scale(s: f32, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    o[0].with_f32(false, |y| {
        pool::par_rows(y, 1, CHUNK, |r0, y| {
            for (y, x) in y.iter_mut().zip(&x[r0..]) {
                *y = x * s;
            }
        });
        Ok(())
    })
}

#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub(crate) fn softplus(x: f32) -> f32 {
    // torch's threshold: linear above 20.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[inline]
pub(crate) fn apply(u: UnaryOp, x: f32) -> f32 {
    match u {
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
        }
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Softplus => softplus(x),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Neg => -x,
        UnaryOp::Tanh => x.tanh(),
    }
}

pub(crate) fn unary(u: UnaryOp, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    o[0].with_f32(false, |y| {
        pool::par_rows(y, 1, CHUNK, |r0, y| {
            for (y, x) in y.iter_mut().zip(&x[r0..]) {
                *y = apply(u, *x);
            }
        });
        Ok(())
    })
}

/// `h = act(h) * up`, in place.
pub(crate) fn glu_in_place(g: GluOp, h: &mut [f32], up: &[f32]) {
    let act = g.activation();
    pool::par_rows(h, 1, CHUNK, |r0, h| {
        for (h, u) in h.iter_mut().zip(&up[r0..]) {
            *h = apply(act, *h) * u;
        }
    });
}

pub(crate) fn glu(g: GluOp, i: &[In], o: &mut [Out]) -> KResult {
    let gate = i[0].f32()?;
    let up = i[1].f32()?;
    o[0].with_f32(false, |y| {
        y.copy_from_slice(&gate);
        glu_in_place(g, y, &up);
        Ok(())
    })
}

/// Cast (through f32) or copy (bytes as they are).
pub(crate) fn copy(i: &[In], o: &mut [Out]) -> KResult {
    if i[0].desc.dtype == o[0].desc.dtype {
        o[0].bytes.copy_from_slice(i[0].bytes);
        return Ok(());
    }
    let x = i[0].f32()?;
    o[0].store_f32(&x)
}
