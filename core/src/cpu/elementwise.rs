//! Binary ops with broadcasting, scale, activations, gated units, cast and copy.

use super::{pool, In, KResult, Out};
use crate::op::{ElementwiseOp, GluOp, UnaryOp};

/// Elements per parallel task for cheap elementwise work.
const CHUNK: usize = 1 << 14;

pub(crate) fn binary(op: &ElementwiseOp, i: &[In], o: &mut [Out]) -> KResult {
    let a = i[0].f32()?;
    let b = i[1].f32()?;
    let mul = *op == ElementwiseOp::Mul;
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
        UnaryOp::Silu => silu(x),
        UnaryOp::GeluTanh => gelu_tanh(x),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Softplus => softplus(x),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Neg => -x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::GeluErf => gelu_erf(x),
    }
}

pub(crate) fn unary(u: UnaryOp, i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    o[0].with_f32(false, |y| {
        pool::par_rows(y, 1, CHUNK, |r0, y| {
            let x = &x[r0..];
            #[cfg(target_arch = "x86_64")]
            if super::simd::isa() == super::simd::Isa::Avx512 {
                // SAFETY: the CPU has AVX-512 (simd::isa checked it).
                unsafe { unary_piece_avx512(u, y, x) };
                return;
            }
            unary_piece(u, y, x);
        });
        Ok(())
    })
}

/// `y = act(x)` over one piece: a loop per activation for the ones built on [`exp_f32`]
/// (SiLU, tanh GELU), so they vectorise; others call the library per element.
#[inline(always)]
fn unary_piece(u: UnaryOp, y: &mut [f32], x: &[f32]) {
    match u {
        UnaryOp::Silu => y.iter_mut().zip(x).for_each(|(y, x)| *y = silu(*x)),
        UnaryOp::GeluTanh => y.iter_mut().zip(x).for_each(|(y, x)| *y = gelu_tanh(*x)),
        _ => y.iter_mut().zip(x).for_each(|(y, x)| *y = apply(u, *x)),
    }
}

/// [`unary_piece`] compiled for AVX-512 so the exponentials vectorise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn unary_piece_avx512(u: UnaryOp, y: &mut [f32], x: &[f32]) {
    unary_piece(u, y, x)
}

/// `e^x` in f32 arithmetic with no library call, so loops over it vectorise: `x = n·ln2 + r`
/// with `|r| ≤ ln2/2` (ln2 split in two for exactness), a degree-7 Taylor polynomial for
/// `e^r` (truncation error below 1e-9 relative) and `2^n` built from its exponent bits.
/// Within 2 ulp of the true value on [-87, 88]; saturates to about 1e-38 and 3e38 outside.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Round to nearest by the 1.5·2^23 trick (exact for |v| < 2^22), which vectorises.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let n = (x * LOG2E + MAGIC) - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let scale = f32::from_bits((((n as i32) + 127) as u32) << 23);
    p * scale
}

/// The exact GELU, `½x(1 + erf(x/√2))`, through libm's `erf` (within an ulp or two) in f64.
#[inline]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// `h = act(h) * up` over one piece, compiled for AVX-512 so the exponentials vectorise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn glu_piece_avx512(act: UnaryOp, h: &mut [f32], up: &[f32]) {
    glu_piece(act, h, up)
}

/// SiLU as `x / (1 + e^-x)`, through [`exp_f32`] so loops over it vectorise.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

/// The tanh GELU as `x / (1 + e^-2y)` with `y = √(2/π)(x + 0.044715x³)`: the same function
/// (`½(1 + tanh y)` is the logistic of `2y`), through [`exp_f32`] so loops over it vectorise.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let y = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp_f32(-2.0 * y))
}

/// `h = act(h) * up` over one piece: a loop per activation, so the two gates of the models
/// (SiLU, tanh GELU) vectorise; others call the library per element.
#[inline(always)]
fn glu_piece(act: UnaryOp, h: &mut [f32], up: &[f32]) {
    match act {
        UnaryOp::Silu => h.iter_mut().zip(up).for_each(|(h, u)| *h = silu(*h) * u),
        UnaryOp::GeluTanh => h
            .iter_mut()
            .zip(up)
            .for_each(|(h, u)| *h = gelu_tanh(*h) * u),
        _ => h
            .iter_mut()
            .zip(up)
            .for_each(|(h, u)| *h = apply(act, *h) * u),
    }
}

/// `h = act(h) * up`, in place.
pub(crate) fn glu_in_place(g: GluOp, h: &mut [f32], up: &[f32]) {
    let act = g.activation();
    pool::par_rows(h, 1, CHUNK, |r0, h| {
        let up = &up[r0..];
        #[cfg(target_arch = "x86_64")]
        if super::simd::isa() == super::simd::Isa::Avx512 {
            // SAFETY: the CPU has AVX-512 (simd::isa checked it).
            unsafe { glu_piece_avx512(act, h, up) };
            return;
        }
        glu_piece(act, h, up);
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

/// The family's CPU reference.
pub(super) fn run_op(op: &ElementwiseOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        ElementwiseOp::Add | ElementwiseOp::Mul => binary(op, i, o),
        ElementwiseOp::Scale(s) => scale(*s, i, o),
        ElementwiseOp::Unary(u) => unary(*u, i, o),
        ElementwiseOp::Glu(g) => glu(*g, i, o),
        ElementwiseOp::Cast | ElementwiseOp::Copy => copy(i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &ElementwiseOp) -> bool {
    true
}

#[cfg(test)]
mod exp_tests {
    use super::*;

    #[test]
    fn exp_f32_is_within_a_few_ulp_of_f64_exp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst relative error {worst}"
        );
        assert!(exp_f32(-200.0) < 1e-37 && exp_f32(200.0) > 1e38);
    }

    #[test]
    fn glu_activations_match_f64_formulas() {
        let mut rng = crate::rng::Rng::new(3);
        for g in [GluOp::SwiGlu, GluOp::GeGlu] {
            let h0: Vec<f32> = (0..4099).map(|_| rng.normal() * 6.0).collect();
            let up: Vec<f32> = (0..4099).map(|_| rng.normal()).collect();
            let mut h = h0.clone();
            glu_in_place(g, &mut h, &up);
            for i in 0..h.len() {
                let x = h0[i] as f64;
                let a = match g.activation() {
                    UnaryOp::Silu => x / (1.0 + (-x).exp()),
                    _ => {
                        0.5 * x
                            * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh())
                    }
                };
                let want = a * up[i] as f64;
                assert!(
                    (h[i] as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{g:?} x={x}: {} vs {want}",
                    h[i]
                );
            }
        }
    }
}
