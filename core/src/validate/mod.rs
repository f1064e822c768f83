//! The op conformance suite, in the manner of llama.cpp's test-backend-ops: a table of cases
//! (op, dtypes, decode and prefill shapes, odd sizes), random inputs, normalised mean squared
//! error against the CPU reference, guard regions around every output, and "not supported"
//! counted rather than failed. `kiln validate` and the test suite both run it.

mod cases;
pub use crate::rng;

use crate::time::Instant;
use std::io::{self, Write};

pub use cases::cases;
use rng::Rng;

use crate::backend::Backend;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::op::{CanvasOp, Op, OpDesc};
use crate::quant;
use crate::tensor::{DType, Tensor, TensorDesc};

/// How a case's input is filled.
#[derive(Clone, Debug)]
pub enum Gen {
    /// Normal values with this standard deviation (quantized into block dtypes).
    Normal(f32),
    /// Uniform in `[lo, hi)`.
    Uniform(f32, f32),
    /// Exactly these integers.
    Ints(Vec<i32>),
    /// Exactly these values (encoded in the tensor's dtype).
    Values(Vec<f32>),
}

#[derive(Clone, Debug)]
pub struct Input {
    pub desc: TensorDesc,
    pub gen: Gen,
}

impl Input {
    pub fn normal(dtype: DType, shape: &[usize]) -> Self {
        Input {
            desc: TensorDesc::new(dtype, shape),
            gen: Gen::Normal(1.0),
        }
    }
    pub fn uniform(dtype: DType, shape: &[usize], lo: f32, hi: f32) -> Self {
        Input {
            desc: TensorDesc::new(dtype, shape),
            gen: Gen::Uniform(lo, hi),
        }
    }
    pub fn ints(shape: &[usize], v: Vec<i32>) -> Self {
        Input {
            desc: TensorDesc::new(DType::I32, shape),
            gen: Gen::Ints(v),
        }
    }

    /// The input's bytes.
    pub fn bytes(&self, rng: &mut Rng) -> Result<Vec<u8>> {
        let n = self.desc.numel();
        let vals: Vec<f32> = match &self.gen {
            Gen::Ints(v) => {
                if v.len() != n {
                    return Err(Error::Tensor(format!(
                        "{} integers for {}",
                        v.len(),
                        self.desc
                    )));
                }
                return Ok(match self.desc.dtype {
                    DType::I32 | DType::U32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    _ => quant::quantize(
                        self.desc.dtype,
                        &v.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                    )?,
                });
            }
            Gen::Values(v) if v.len() == n => v.clone(),
            Gen::Values(v) => {
                return Err(Error::Tensor(format!(
                    "{} values for {}",
                    v.len(),
                    self.desc
                )))
            }
            // Formats kiln cannot quantize into (the i-quants): random valid blocks.
            _ if self.desc.dtype.is_quantized() && !quant::quantize_supported(self.desc.dtype) => {
                let blocks = n / self.desc.dtype.block_size();
                return Ok(quant::random_blocks(self.desc.dtype, blocks, rng));
            }
            Gen::Normal(s) => (0..n).map(|_| rng.normal() * s).collect(),
            Gen::Uniform(lo, hi) => (0..n).map(|_| rng.uniform(*lo, *hi)).collect(),
        };
        match self.desc.dtype {
            DType::I32 => Ok(vals
                .iter()
                .flat_map(|x| (*x as i32).to_le_bytes())
                .collect()),
            DType::U32 => Ok(vals
                .iter()
                .flat_map(|x| (*x as u32).to_le_bytes())
                .collect()),
            d => quant::quantize(d, &vals),
        }
    }
}

/// One conformance case.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: Op,
    /// What distinguishes this case: dtypes, shapes, parameters.
    pub label: String,
    pub inputs: Vec<Input>,
    pub outputs: Vec<TensorDesc>,
    /// For in-place ops: how each output starts.
    pub init: Vec<Option<Gen>>,
    /// NMSE bound; by default 1e-7, or 1e-4 where an f16/bf16 tensor takes part.
    pub tol: Option<f64>,
    /// Pass each input as a view one block (one element for floats) into a larger buffer, so
    /// kernels meet operands that do not start where an allocation does (a 4-byte offset for
    /// f32, 34 bytes for Q8_0): what a tensor view into a weight file or a split row gives.
    pub offset_inputs: bool,
}

impl Case {
    pub fn new(op: Op, label: impl Into<String>, inputs: Vec<Input>) -> Result<Case> {
        let descs: Vec<TensorDesc> = inputs.iter().map(|i| i.desc.clone()).collect();
        let outputs = op.output_descs(&descs)?;
        let init = vec![None; outputs.len()];
        Ok(Case {
            op,
            label: label.into(),
            inputs,
            outputs,
            init,
            tol: None,
            offset_inputs: false,
        })
    }
    /// A case for an in-place op, with its outputs' starting contents.
    pub fn in_place(
        op: Op,
        label: impl Into<String>,
        inputs: Vec<Input>,
        outputs: Vec<(TensorDesc, Gen)>,
    ) -> Case {
        let init = outputs.iter().map(|o| Some(o.1.clone())).collect();
        Case {
            op,
            label: label.into(),
            inputs,
            outputs: outputs.into_iter().map(|o| o.0).collect(),
            init,
            tol: None,
            offset_inputs: false,
        }
    }

    /// The same case with its inputs passed as offset views (`offset_inputs`).
    pub fn offset_inputs(mut self) -> Case {
        self.offset_inputs = true;
        self.label.push_str(", inputs at an offset");
        self
    }
    pub fn desc(&self) -> OpDesc {
        OpDesc::new(
            self.op.clone(),
            self.inputs.iter().map(|i| i.desc.clone()).collect(),
            self.outputs.clone(),
        )
    }
    pub fn tolerance(&self) -> f64 {
        if let Some(t) = self.tol {
            return t;
        }
        let half = |d: DType| {
            matches!(d, DType::F16 | DType::BF16) || (d.is_quantized() && self.op.reads_outputs())
        };
        let any_half = self.inputs.iter().any(|i| half(i.desc.dtype))
            || self.outputs.iter().any(|o| half(o.dtype));
        if any_half {
            1e-4
        } else {
            1e-7
        }
    }
    /// The case's inputs and starting outputs, the same every run.
    pub fn data(&self) -> Result<(Vec<Vec<u8>>, Vec<Option<Vec<u8>>>)> {
        let mut rng = Rng::from_label(&format!("{}/{}", self.op.name(), self.label));
        let ins = self
            .inputs
            .iter()
            .map(|i| i.bytes(&mut rng))
            .collect::<Result<Vec<_>>>()?;
        let outs = self
            .outputs
            .iter()
            .zip(&self.init)
            .map(|(d, g)| {
                g.as_ref()
                    .map(|g| {
                        Input {
                            desc: d.clone(),
                            gen: g.clone(),
                        }
                        .bytes(&mut rng)
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((ins, outs))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Pass,
    Fail(String),
    /// The backend does not claim the op: counted, not failed.
    NotSupported,
}

#[derive(Clone, Debug)]
pub struct CaseResult {
    pub op: &'static str,
    pub case: String,
    pub backend: String,
    pub status: Status,
    pub nmse: Option<f64>,
    /// Mean microseconds per run (with `--perf`).
    pub micros: Option<f64>,
}

/// Normalised mean squared error: `Σ(a−b)² / Σb²` (`b` the reference); NaN when either has a
/// NaN where the other does not.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() != y.is_nan() || x.is_infinite() != y.is_infinite() {
            return f64::NAN;
        }
        if x.is_nan() || x.is_infinite() {
            continue;
        }
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if a.len() != b.len() {
        return f64::NAN;
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    num / den
}

/// Guard region around each output, in elements (whole blocks of the dtype).
fn guard_elems(d: DType) -> usize {
    let bs = d.block_size();
    64usize.div_ceil(bs) * bs
}

const SENTINEL: u8 = 0xA5;

/// A case's tensors on a backend after its op ran: the inputs, and each output's guarded
/// buffer (with the bytes of its guard) and its view.
struct Staged {
    inputs: Vec<Tensor>,
    guarded: Vec<(Tensor, usize)>,
    views: Vec<Tensor>,
}

/// Uploads the case's inputs and its outputs inside guarded buffers, and runs `op`.
fn stage(
    backend: &dyn Backend,
    case: &Case,
    ins: &[Vec<u8>],
    outs: &[Option<Vec<u8>>],
) -> Result<Staged> {
    let inputs = case
        .inputs
        .iter()
        .zip(ins)
        .map(|(i, b)| {
            if !case.offset_inputs {
                let t = backend.alloc(&i.desc)?;
                backend.upload(&t, b)?;
                return Ok(t);
            }
            let off = i.desc.dtype.block_size();
            let whole = backend.alloc(&TensorDesc::new(i.desc.dtype, [i.desc.numel() + off]))?;
            let head = i.desc.dtype.bytes_for(off).unwrap_or(0);
            let mut bytes = vec![SENTINEL; head];
            bytes.extend_from_slice(b);
            backend.upload(&whole, &bytes)?;
            whole.view(off, i.desc.shape.clone())
        })
        .collect::<Result<Vec<_>>>()?;
    let mut guarded = Vec::new();
    let mut views = Vec::new();
    for (d, init) in case.outputs.iter().zip(outs) {
        let g = guard_elems(d.dtype);
        let total = d.numel() + 2 * g;
        let whole = backend.alloc(&TensorDesc::new(d.dtype, [total]))?;
        let gb = d.dtype.bytes_for(g).unwrap_or(0);
        let mut bytes = vec![SENTINEL; whole.nbytes()];
        if let Some(init) = init {
            bytes[gb..gb + init.len()].copy_from_slice(init);
        }
        backend.upload(&whole, &bytes)?;
        let view = whole.view(g, d.shape.clone())?;
        guarded.push((whole, gb));
        views.push(view);
    }
    let in_refs: Vec<&Tensor> = inputs.iter().collect();
    let out_refs: Vec<&Tensor> = views.iter().collect();
    backend.execute(&case.op, &in_refs, &out_refs)?;
    backend.synchronize()?;
    Ok(Staged {
        inputs,
        guarded,
        views,
    })
}

/// Output `o`'s bytes from its guarded buffer's, or an error if the op wrote past either end.
fn unguard(
    backend: &dyn Backend,
    case: &Case,
    o: usize,
    bytes: &[u8],
    gb: usize,
) -> Result<Vec<u8>> {
    let (head, tail) = (&bytes[..gb], &bytes[bytes.len() - gb..]);
    if head.iter().chain(tail).any(|&b| b != SENTINEL) {
        return Err(Error::backend(
            backend.name(),
            format!(
                "{}: output {o} was written outside its bounds",
                case.op.name()
            ),
        ));
    }
    Ok(bytes[gb..bytes.len() - gb].to_vec())
}

/// Runs `op` on `backend` with the given bytes; outputs live inside guarded buffers, and a
/// write past either end is reported as an error.
fn execute_guarded(
    backend: &dyn Backend,
    case: &Case,
    ins: &[Vec<u8>],
    outs: &[Option<Vec<u8>>],
    perf: bool,
) -> Result<(Vec<Vec<u8>>, Option<f64>)> {
    let st = stage(backend, case, ins, outs)?;
    let mut results = Vec::new();
    for (o, (whole, gb)) in st.guarded.iter().enumerate() {
        results.push(unguard(backend, case, o, &backend.download(whole)?, *gb)?);
    }
    let micros = if perf {
        // Re-run (in-place ops keep updating their state: fine for timing).
        let in_refs: Vec<&Tensor> = st.inputs.iter().collect();
        let out_refs: Vec<&Tensor> = st.views.iter().collect();
        let start = Instant::now();
        let mut runs = 0u32;
        while runs < 3 || (start.elapsed().as_millis() < 100 && runs < 1000) {
            backend.execute(&case.op, &in_refs, &out_refs)?;
            runs += 1;
        }
        backend.synchronize()?;
        Some(start.elapsed().as_secs_f64() * 1e6 / runs as f64)
    } else {
        None
    };
    Ok((results, micros))
}

/// `execute_guarded` reading the outputs back with `download_async` (no timing).
async fn execute_guarded_async(
    backend: &dyn Backend,
    case: &Case,
    ins: &[Vec<u8>],
    outs: &[Option<Vec<u8>>],
) -> Result<Vec<Vec<u8>>> {
    let st = stage(backend, case, ins, outs)?;
    let mut results = Vec::new();
    for (o, (whole, gb)) in st.guarded.iter().enumerate() {
        let bytes = backend.download_async(whole).await?;
        results.push(unguard(backend, case, o, &bytes, *gb)?);
    }
    Ok(results)
}

fn to_f32(d: &TensorDesc, bytes: &[u8]) -> Result<Vec<f32>> {
    let mut v = vec![0f32; d.numel()];
    quant::dequantize(d.dtype, bytes, &mut v)?;
    Ok(v)
}

/// A canvas draw's tokens may differ from the reference's only where the noisy scores of the
/// two picks tie to within the last bits of the logarithms in the Gumbel noise (each
/// backend's `log` rounds its own way).
fn draws_tie(
    case: &Case,
    processed: &[u8],
    got: &[u8],
    want: &[u8],
) -> std::result::Result<(), String> {
    let Op::Canvas(CanvasOp::CanvasDraw { seed, .. }) = case.op else {
        return Err("not a draw".into());
    };
    let p: Vec<f32> = processed
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let ids = |b: &[u8]| -> Vec<usize> {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect()
    };
    let (got, want) = (ids(got), ids(want));
    let v = p.len() / want.len().max(1);
    for (row, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if g == w {
            continue;
        }
        if g >= v {
            return Err(format!(
                "row {row}: drew {g}, outside the vocabulary of {v}"
            ));
        }
        let key = crate::op::canvas::row_key(seed, row as u32);
        let score = |j: usize| p[row * v + j] + crate::op::canvas::gumbel(key, j as u32);
        let (sg, sw) = (score(g), score(w));
        if (sg - sw).abs() > 1e-5 * sw.abs().max(1.0) {
            return Err(format!(
                "row {row}: drew {g} (score {sg}), the CPU reference {w} (score {sw})"
            ));
        }
    }
    Ok(())
}

/// A case's result before it is run: its names, and whether it can run on `candidate`
/// (`Err`: the finished result, failed or not supported).
fn start_case(case: &Case, candidate: &dyn Backend) -> std::result::Result<CaseResult, CaseResult> {
    let mut r = CaseResult {
        op: case.op.name(),
        case: case.label.clone(),
        backend: candidate.name().to_string(),
        status: Status::Pass,
        nmse: None,
        micros: None,
    };
    if let Err(e) = case.desc().check() {
        r.status = Status::Fail(format!("invalid case: {e}"));
        return Err(r);
    }
    if !candidate.supports_op(&case.desc()) {
        r.status = Status::NotSupported;
        return Err(r);
    }
    Ok(r)
}

/// The worst NMSE of the candidate's outputs against the reference's (integer outputs must be
/// equal, a canvas draw's up to ties).
fn compare(case: &Case, candidate: &dyn Backend, want: &[Vec<u8>], got: &[Vec<u8>]) -> Result<f64> {
    let mut worst = 0f64;
    for (o, d) in case.outputs.iter().enumerate() {
        if d.dtype.is_int() {
            let draws = matches!(case.op, Op::Canvas(CanvasOp::CanvasDraw { .. })) && o == 2;
            if draws && got[o] != want[o] {
                draws_tie(case, &want[0], &got[o], &want[o])
                    .map_err(|e| Error::backend(candidate.name(), e))?;
            } else if got[o] != want[o] {
                return Err(Error::backend(
                    candidate.name(),
                    format!("integer output {o} differs from the CPU reference"),
                ));
            }
        } else {
            let e = nmse(&to_f32(d, &got[o])?, &to_f32(d, &want[o])?);
            worst = if e.is_nan() || e > worst { e } else { worst };
        }
    }
    Ok(worst)
}

/// Pass or fail by the case's tolerance.
fn finish_case(case: &Case, mut r: CaseResult, outcome: Result<(f64, Option<f64>)>) -> CaseResult {
    match outcome {
        Ok((e, micros)) => {
            r.nmse = Some(e);
            r.micros = micros;
            let tol = case.tolerance();
            if !(e <= tol) {
                r.status = Status::Fail(format!("NMSE {e:.3e} > {tol:.0e}"));
            }
        }
        Err(e) => r.status = Status::Fail(e.to_string()),
    }
    r
}

/// Runs one case on `candidate` and compares with `reference`.
pub fn run_case(
    case: &Case,
    reference: &CpuBackend,
    candidate: &dyn Backend,
    perf: bool,
) -> CaseResult {
    let r = match start_case(case, candidate) {
        Ok(r) => r,
        Err(done) => return done,
    };
    let outcome = (|| -> Result<(f64, Option<f64>)> {
        let (ins, outs) = case.data()?;
        let (want, _) = execute_guarded(reference, case, &ins, &outs, false)?;
        let (got, micros) = execute_guarded(candidate, case, &ins, &outs, perf)?;
        Ok((compare(case, candidate, &want, &got)?, micros))
    })();
    finish_case(case, r, outcome)
}

/// [`run_case`] reading the candidate's outputs with `download_async`: what runs in a browser,
/// where a GPU buffer is read only after control returns to the event loop.
pub async fn run_case_async(
    case: &Case,
    reference: &CpuBackend,
    candidate: &dyn Backend,
) -> CaseResult {
    let r = match start_case(case, candidate) {
        Ok(r) => r,
        Err(done) => return done,
    };
    let outcome = async {
        let (ins, outs) = case.data()?;
        let (want, _) = execute_guarded(reference, case, &ins, &outs, false)?;
        let got = execute_guarded_async(candidate, case, &ins, &outs).await?;
        Ok((compare(case, candidate, &want, &got)?, None))
    }
    .await;
    finish_case(case, r, outcome)
}

/// Runs every case whose op name or label contains `filter`.
pub fn run_all(
    filter: Option<&str>,
    reference: &CpuBackend,
    candidate: &dyn Backend,
    perf: bool,
    mut progress: impl FnMut(&CaseResult),
) -> Result<Vec<CaseResult>> {
    let mut out = Vec::new();
    for case in cases()? {
        if let Some(f) = filter {
            if !case.op.name().contains(f) && !case.label.contains(f) {
                continue;
            }
        }
        let r = run_case(&case, reference, candidate, perf);
        progress(&r);
        out.push(r);
    }
    Ok(out)
}

/// Counts of a run: (passed, failed, not supported).
pub fn tally(results: &[CaseResult]) -> (usize, usize, usize) {
    let mut t = (0, 0, 0);
    for r in results {
        match r.status {
            Status::Pass => t.0 += 1,
            Status::Fail(_) => t.1 += 1,
            Status::NotSupported => t.2 += 1,
        }
    }
    t
}

/// Writes one table row.
pub fn write_row(w: &mut impl Write, r: &CaseResult, perf: bool) -> io::Result<()> {
    let status = match &r.status {
        Status::Pass => "ok".to_string(),
        Status::Fail(m) => format!("FAIL: {m}"),
        Status::NotSupported => "not supported".to_string(),
    };
    let nmse = r.nmse.map_or("-".to_string(), |e| format!("{e:.2e}"));
    if perf {
        let us = r.micros.map_or("-".to_string(), |u| format!("{u:.1}"));
        writeln!(
            w,
            "{:<18} {:<44} {:<6} {:>10} {:>10}  {status}",
            r.op, r.case, r.backend, nmse, us
        )
    } else {
        writeln!(
            w,
            "{:<18} {:<44} {:<6} {:>10}  {status}",
            r.op, r.case, r.backend, nmse
        )
    }
}

pub fn write_header(w: &mut impl Write, perf: bool) -> io::Result<()> {
    if perf {
        writeln!(
            w,
            "{:<18} {:<44} {:<6} {:>10} {:>10}  result",
            "op", "case", "backend", "nmse", "us/run"
        )
    } else {
        writeln!(
            w,
            "{:<18} {:<44} {:<6} {:>10}  result",
            "op", "case", "backend", "nmse"
        )
    }
}
