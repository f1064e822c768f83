//! Plumbing for the oracle tests: one CPU backend behind an executor, tensors made from random
//! f32 data in any dtype (with the exact values they hold, as f64), and error-bound checks that
//! report the worst error as a fraction of its bound.

use std::sync::{Arc, OnceLock};

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::exec::Executor;
use kiln_core::op::Op;
use kiln_core::quant::{dequantize, quantize};
use kiln_core::validate::rng::Rng;
use kiln_core::{DType, Result, Tensor, TensorDesc};

use super::naive;

/// f32's unit roundoff: storing an exact value as f32 costs at most this, relatively.
pub const U_F32: f64 = 1.0 / (1u64 << 24) as f64;

pub struct Kiln {
    pub cpu: Arc<CpuBackend>,
    pub ex: Executor,
}

/// The CPU reference behind an executor, shared by every test of this file.
pub fn kiln() -> &'static Kiln {
    static K: OnceLock<Kiln> = OnceLock::new();
    K.get_or_init(|| {
        let cpu = Arc::new(CpuBackend::new());
        let ex = Executor::with_cpu(cpu.clone(), cpu.clone());
        Kiln { cpu, ex }
    })
}

/// The values `bytes` of `dtype` hold, widened to f64.
pub fn held(dtype: DType, bytes: &[u8], n: usize) -> Vec<f64> {
    let mut v = vec![0f32; n];
    dequantize(dtype, bytes, &mut v).unwrap();
    v.into_iter().map(f64::from).collect()
}

impl Kiln {
    /// A tensor of `dtype` made from `data` (rounded or quantized into `dtype`), and the exact
    /// values it holds: what the oracle computes with.
    /// Formats kiln has no quantizer for (the i-quants) get random valid blocks seeded by
    /// `data`'s bits instead.
    pub fn tensor(&self, dtype: DType, shape: &[usize], data: &[f32]) -> (Tensor, Vec<f64>) {
        let bytes = if kiln_core::quant::quantize_supported(dtype) {
            quantize(dtype, data).unwrap()
        } else {
            let seed = data.iter().fold(0u64, |h, v| {
                (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
            });
            let blocks = data.len() / dtype.block_size();
            kiln_core::quant::random_blocks(dtype, blocks, &mut kiln_core::rng::Rng::new(seed))
        };
        let t = self
            .cpu
            .tensor_from_bytes(&TensorDesc::new(dtype, shape), &bytes)
            .unwrap();
        (t, held(dtype, &bytes, data.len()))
    }

    pub fn ints(&self, shape: &[usize], data: &[i32]) -> Tensor {
        self.cpu.tensor_i32(shape, data).unwrap()
    }

    /// A zero-filled tensor.
    pub fn alloc(&self, dtype: DType, shape: &[usize]) -> Tensor {
        self.cpu.alloc(&TensorDesc::new(dtype, shape)).unwrap()
    }

    pub fn try_run(&self, op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.ex.run(op, inputs)
    }

    pub fn run(&self, op: &Op, inputs: &[&Tensor]) -> Vec<Tensor> {
        self.try_run(op, inputs)
            .unwrap_or_else(|e| panic!("{op:?} failed: {e}"))
    }

    pub fn exec(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        self.ex.exec(op, inputs, outputs)
    }

    pub fn f32(&self, t: &Tensor) -> Vec<f32> {
        self.cpu.to_f32(t).unwrap()
    }

    pub fn i32(&self, t: &Tensor) -> Vec<i32> {
        self.cpu.to_i32(t).unwrap()
    }

    pub fn bytes(&self, t: &Tensor) -> Vec<u8> {
        self.cpu.download(t).unwrap()
    }
}

// ---- random inputs ----------------------------------------------------------------------------

pub fn normal(rng: &mut Rng, n: usize, sd: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * sd).collect()
}

pub fn uniform(rng: &mut Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

/// Rows of `d` random normal values, each scaled to unit L2 norm (as DeltaNet's q and k are).
pub fn unit_rows(rng: &mut Rng, rows: usize, d: usize) -> Vec<f32> {
    let mut v = normal(rng, rows * d, 1.0);
    for r in v.chunks_mut(d) {
        let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
        r.iter_mut().for_each(|x| *x /= n);
    }
    v
}

// ---- bounds -----------------------------------------------------------------------------------

/// The relative rounding of storing a value in a float output of `dt`.
pub fn unit(dt: DType) -> f64 {
    match dt {
        DType::F32 => U_F32,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        d => panic!("{d} is not a float output type"),
    }
}

/// The absolute rounding of a subnormal result in a float output of `dt` (half its spacing).
pub fn tiny(dt: DType) -> f64 {
    match dt {
        DType::F32 => 2f64.powi(-150),
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        d => panic!("{d} is not a float output type"),
    }
}

/// Asserts `|got[i] - want[i]| <= bound(i)` for every element (equal infinities pass) and
/// prints the worst `error / bound` so a run with `--nocapture` shows the margins.
pub fn assert_within(what: &str, got: &[f32], want: &[f64], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f64;
    let mut bad = Vec::new();
    for i in 0..got.len() {
        let g = got[i] as f64;
        let err = if g == want[i] {
            0.0
        } else {
            (g - want[i]).abs()
        };
        let b = bound(i);
        if !(err <= b) {
            bad.push(i);
        }
        if err > 0.0 {
            worst = worst.max(err / b);
        }
    }
    eprintln!("{what}: {} values, worst error/bound {worst:.3}", got.len());
    if let Some(&i) = bad.first() {
        panic!(
            "{what}: {} of {} values out of bounds; first at {i}: cpu {} vs oracle {} \
             (|diff| {:.3e} > bound {:.3e})",
            bad.len(),
            got.len(),
            got[i],
            want[i],
            (got[i] as f64 - want[i]).abs(),
            bound(i)
        );
    }
}

/// `|got - want| <= atol + rtol·|want|`, widened by the rounding of an output stored in `out`
/// (a value beyond the output type's range must come out infinite, as IEEE conversion does).
pub fn assert_close(what: &str, got: &[f32], want: &[f64], out: DType, atol: f64, rtol: f64) {
    let want: Vec<f64> = want
        .iter()
        .map(|&w| match out {
            DType::F16 if naive::round_f16(w).is_infinite() => naive::round_f16(w),
            DType::BF16 if naive::round_bf16(w).is_infinite() => naive::round_bf16(w),
            _ => w,
        })
        .collect();
    assert_within(what, got, &want, |i| {
        atol + (rtol + unit(out)) * want[i].abs() + tiny(out)
    });
}

/// Bit-for-bit equality of values (for selections, copies, casts and lookups).
pub fn assert_exact(what: &str, got: &[f32], want: &[f64]) {
    assert_within(what, got, want, |_| 0.0);
}
