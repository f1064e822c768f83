//! The executor: the one dispatcher between model code and a backend (checks, dispatch, CPU
//! fallback, counters, profiling), and in `ops` the typed op helpers models call.

mod ops;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, GraphId};
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::op::{Op, OpDesc};
use crate::tensor::{Tensor, TensorDesc};

/// How often one op fell back to the CPU on one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackCount {
    pub backend: String,
    pub op: &'static str,
    pub count: u64,
}

/// The one dispatcher. Every op of a model goes through `run`/`exec`: the call is checked,
/// then executed on the backend if it supports the exact op, else on the CPU reference with
/// inputs copied down and outputs copied back (counted, warned about once, or refused in
/// strict mode).
pub struct Executor {
    backend: Arc<dyn Backend>,
    cpu: Arc<CpuBackend>,
    strict: bool,
    /// Whether `backend` is the CPU reference itself (then nothing ever falls back).
    is_cpu: bool,
    fallbacks: Mutex<HashMap<&'static str, u64>>,
    warned: Mutex<HashSet<&'static str>>,
    /// Per-op-family time and calls while profiling (`set_profiling`); off by default.
    profile: Mutex<Option<HashMap<&'static str, OpTime>>>,
    /// Whether `profile` is on: read on every op without taking its lock.
    profiling: std::sync::atomic::AtomicBool,
    /// The TurboQuant rotation matrices uploaded so far, by (head dim, inverse).
    rotations: Mutex<HashMap<(usize, bool), Tensor>>,
    /// While a step is being recorded into a graph: the batch it records and the step inputs
    /// it has read so far.
    capture: Mutex<Option<Capture>>,
    capturing: std::sync::atomic::AtomicBool,
}

/// The index arrays a forward pass reads of its batch ([`crate::model::ForwardBatch`]), each
/// uploaded once a pass ([`Executor::step_input`]; `StepInput::of` makes them). They are the
/// whole of what a recorded decode step takes fresh before each replay, so every model reads
/// its batch through them and uploads nothing else per pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepInput {
    /// The token ids, `[t]`.
    Tokens,
    /// Each row's position, `[t]`.
    Positions,
    /// Each sequence's context length after the step, `[s]`.
    SeqLens,
    /// Each sequence's first row, and the row count last, `[s + 1]`.
    QStart,
    /// KV group g's block tables, `[s, width]` (width: the longest table, at least 1; shorter
    /// rows padded with block 0, which no kernel reads past a sequence's length).
    Table(usize),
    /// KV group g's slot for every row, `[t]` (negative: written nowhere).
    Slots(usize),
    /// The rows whose logits the pass returns, `[rows]`.
    LogitsRows,
    /// The recurrent-state slot each sequence reads, `[s]`.
    StateRead,
    /// The recurrent-state slot each sequence writes, `[s]`.
    StateWrite,
}

/// A step input recorded with a graph: its tensor (filled before each replay) and the values
/// the recording pass read, which the caller checks against its batch's.
pub type RecordedInput = (StepInput, Tensor, Vec<i32>);

/// A step being recorded (see [`Executor::begin_capture`]).
struct Capture {
    inputs: Vec<RecordedInput>,
}

/// Time spent in one op family while profiling.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpTime {
    pub calls: u64,
    pub seconds: f64,
}

impl Executor {
    /// An executor over `backend`, with a CPU reference for fallbacks.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        let cpu = Arc::new(CpuBackend::new());
        Self::with_cpu(backend, cpu)
    }

    /// Whether the backend is the CPU reference itself.
    pub fn on_cpu(&self) -> bool {
        self.is_cpu
    }

    /// An executor over the CPU reference alone.
    pub fn cpu() -> Self {
        let cpu = Arc::new(CpuBackend::new());
        Self::with_cpu(cpu.clone(), cpu)
    }

    pub fn with_cpu(backend: Arc<dyn Backend>, cpu: Arc<CpuBackend>) -> Self {
        let is_cpu = backend.id() == cpu.id();
        Executor {
            backend,
            cpu,
            strict: false,
            is_cpu,
            fallbacks: Mutex::new(HashMap::new()),
            warned: Mutex::new(HashSet::new()),
            profile: Mutex::new(None),
            profiling: std::sync::atomic::AtomicBool::new(false),
            rotations: Mutex::new(HashMap::new()),
            capture: Mutex::new(None),
            capturing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// In strict mode a fallback is an error instead.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Another executor over the same backend and CPU reference, with the same strictness
    /// and its own fallback counters (a draft model beside the target).
    pub fn sibling(&self) -> Executor {
        Executor::with_cpu(self.backend.clone(), self.cpu.clone()).strict(self.strict)
    }

    /// Whether the backend runs `desc` itself. Model code asks this before choosing a fused
    /// op: this is the fused-op gate.
    pub fn supports(&self, desc: &OpDesc) -> bool {
        self.is_cpu || self.backend.supports_op(desc)
    }

    /// Whether `op` on tensors of `inputs`/`outputs` runs on the backend itself.
    pub fn supports_op(&self, op: &Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc]) -> bool {
        let desc = OpDesc::new(
            op.clone(),
            inputs.iter().map(|t| (*t).clone()).collect(),
            outputs.iter().map(|t| (*t).clone()).collect(),
        );
        desc.check().is_ok() && self.supports(&desc)
    }

    /// Allocates the outputs `op` produces for `inputs` and runs it.
    pub fn run(&self, op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let in_descs: Vec<TensorDesc> = inputs.iter().map(|t| t.desc().clone()).collect();
        let out_descs = op.output_descs(&in_descs)?;
        let outs = out_descs
            .iter()
            .map(|d| self.backend.alloc(d))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = outs.iter().collect();
        self.exec(op, inputs, &refs)?;
        Ok(outs)
    }

    /// Runs `op` into existing outputs.
    pub fn exec(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        let desc = OpDesc::new(
            op.clone(),
            inputs.iter().map(|t| t.desc().clone()).collect(),
            outputs.iter().map(|t| t.desc().clone()).collect(),
        );
        desc.check()?;
        let profiling = self.profiling.load(std::sync::atomic::Ordering::Relaxed);
        let t0 = profiling.then(crate::time::Instant::now);
        let r = if self.supports(&desc) {
            self.backend.execute(op, inputs, outputs)
        } else {
            self.fallback(&desc, inputs, outputs)
        };
        if let Some(t0) = t0 {
            // A device runs ops asynchronously: wait, so the time is this op's.
            self.backend.synchronize()?;
            let dt = t0.elapsed().as_secs_f64();
            if let Some(p) = self.lock_profile().as_mut() {
                let e = p.entry(op.name()).or_default();
                e.calls += 1;
                e.seconds += dt;
            }
        }
        r
    }

    fn lock_profile(&self) -> std::sync::MutexGuard<'_, Option<HashMap<&'static str, OpTime>>> {
        self.profile.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts (clearing what was gathered) or stops timing every op by family. While on, a
    /// device backend is synchronised after each op, which slows it: profile, then measure.
    pub fn set_profiling(&self, on: bool) {
        *self.lock_profile() = on.then(HashMap::new);
        self.profiling
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Time per op family since profiling started, most expensive first.
    pub fn profile(&self) -> Vec<(&'static str, OpTime)> {
        let mut v: Vec<_> = self
            .lock_profile()
            .as_ref()
            .map(|p| p.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds).then(a.0.cmp(b.0)));
        v
    }

    fn fallback(&self, desc: &OpDesc, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        let name = desc.op.name();
        if self.capturing() {
            return Err(Error::backend(
                self.backend.name(),
                format!("{desc} runs on the CPU reference, so a step with it cannot be recorded"),
            ));
        }
        if self.strict {
            return Err(Error::StrictFallback {
                backend: self.backend.name().to_string(),
                op: desc.to_string(),
            });
        }
        *self.lock_counts().entry(name).or_insert(0) += 1;
        let first = self
            .warned
            .lock()
            .map(|mut w| w.insert(name))
            .unwrap_or(false);
        if first {
            tracing::warn!(
                backend = self.backend.name(),
                op = %desc,
                "op not supported by the backend; running it on the CPU reference"
            );
        }
        let cpu = &*self.cpu;
        let copy_down = |t: &Tensor| -> Result<Tensor> {
            let c = cpu.alloc(t.desc())?;
            let bytes = self.backend.download(t)?;
            cpu.upload(&c, &bytes)?;
            Ok(c)
        };
        let cin = inputs
            .iter()
            .map(|t| copy_down(t))
            .collect::<Result<Vec<_>>>()?;
        let cout = if desc.op.reads_outputs() {
            outputs
                .iter()
                .map(|t| copy_down(t))
                .collect::<Result<Vec<_>>>()?
        } else {
            outputs
                .iter()
                .map(|t| cpu.alloc(t.desc()))
                .collect::<Result<Vec<_>>>()?
        };
        let in_refs: Vec<&Tensor> = cin.iter().collect();
        let out_refs: Vec<&Tensor> = cout.iter().collect();
        cpu.execute(&desc.op, &in_refs, &out_refs)?;
        for (dst, src) in outputs.iter().zip(&cout) {
            self.backend.upload(dst, &cpu.download(src)?)?;
        }
        Ok(())
    }

    fn lock_counts(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, u64>> {
        // A poisoned counter map still holds valid counts.
        self.fallbacks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fallbacks so far, per op, most frequent first.
    pub fn fallbacks(&self) -> Vec<FallbackCount> {
        let mut v: Vec<FallbackCount> = self
            .lock_counts()
            .iter()
            .map(|(op, n)| FallbackCount {
                backend: self.backend.name().to_string(),
                op,
                count: *n,
            })
            .collect();
        v.sort_by(|a, b| b.count.cmp(&a.count).then(a.op.cmp(b.op)));
        v
    }

    pub fn total_fallbacks(&self) -> u64 {
        self.lock_counts().values().sum()
    }

    /// Whether profiling is on (it waits for every op, which a recorded step cannot).
    pub fn profiling(&self) -> bool {
        self.profiling.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a step is being recorded.
    pub fn capturing(&self) -> bool {
        self.capturing.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock_capture(&self) -> std::sync::MutexGuard<'_, Option<Capture>> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts recording a forward pass into a graph on the backend
    /// ([`Backend::begin_capture`]): until [`end_capture`](Executor::end_capture) the ops are
    /// recorded, not run; the pass must read its batch only through
    /// [`step_input`](Executor::step_input), and an op the backend does not run, an upload or a
    /// download fails the recording.
    pub fn begin_capture(&self) -> Result<()> {
        if self.profiling() {
            return Err(Error::backend(
                self.backend.name(),
                "profiling waits for every op: no step is recorded while it is on",
            ));
        }
        let mut c = self.lock_capture();
        if c.is_some() {
            return Err(Error::backend(
                self.backend.name(),
                "a step is already being recorded",
            ));
        }
        self.backend.begin_capture()?;
        *c = Some(Capture { inputs: Vec::new() });
        self.capturing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Ends the recording: the graph, and the step inputs it reads (each filled before every
    /// replay), with the values the recording pass read.
    pub fn end_capture(&self) -> Result<(GraphId, Vec<RecordedInput>)> {
        let c = self.lock_capture().take();
        self.capturing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let c =
            c.ok_or_else(|| Error::backend(self.backend.name(), "no step is being recorded"))?;
        match self.backend.end_capture() {
            Ok(id) => Ok((id, c.inputs)),
            Err(e) => {
                self.backend.abort_capture();
                Err(e)
            }
        }
    }

    /// Ends a recording that failed, keeping nothing.
    pub fn abort_capture(&self) {
        let had = self.lock_capture().take().is_some();
        self.capturing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if had {
            self.backend.abort_capture();
        }
    }

    /// Step input `which` (of `shape`, holding `data`) on the device: uploaded, or while a
    /// step is being recorded, a tensor of the graph's that is filled before each replay (the
    /// values are recorded for the caller to check; the same input read twice with other
    /// values is refused).
    pub fn step_input(&self, which: StepInput, shape: &[usize], data: &[i32]) -> Result<Tensor> {
        if !self.capturing() {
            return self.upload_i32(shape, data);
        }
        let mut guard = self.lock_capture();
        let c = guard
            .as_mut()
            .ok_or_else(|| Error::backend(self.backend.name(), "no step is being recorded"))?;
        if let Some((_, t, d)) = c.inputs.iter().find(|r| r.0 == which) {
            if t.shape().dims() == shape && d.as_slice() == data {
                return Ok(t.clone());
            }
            return Err(Error::backend(
                self.backend.name(),
                format!("the pass reads {which:?} with two different values"),
            ));
        }
        let t = self
            .backend
            .alloc_input(&TensorDesc::new(crate::DType::I32, shape))?;
        c.inputs.push((which, t.clone(), data.to_vec()));
        Ok(t)
    }
}
