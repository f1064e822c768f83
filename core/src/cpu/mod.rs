//! The CPU reference backend: every op, plain and obviously right, multithreaded across rows.
//! It is the oracle the other backends are judged against and the fallback when they lack an op.
//!
//! Float inputs of any float dtype are read as f32, computed in f32 and written in the output's
//! dtype. Weights and caches stay in their block formats and are dequantized a row at a time.

mod attention;
mod attention_tile;
mod canvas;
mod conv;
mod delta_net;
mod elementwise;
mod get_rows;
mod mat_mul;
mod moe;
mod norm;
pub(crate) mod pool;
mod qdot;
mod qdot256;
mod qdot_int;
mod qdot_vnni;
mod qdot_x16;
mod qdot_x16f;
mod qdot_x16i;
mod reduce;
mod rope;
pub mod simd;
mod softmax;

use std::any::Any;
use std::borrow::Cow;
use std::cell::UnsafeCell;
use std::sync::{Arc, Mutex};

use crate::backend::{check_call, next_backend_id, Backend, Capabilities, DeviceKind, GraphId};
use crate::error::{Error, Result};
use crate::op::{Op, OpDesc};
use crate::quant;
use crate::tensor::{BackendId, DType, Storage, Tensor, TensorDesc};

/// Host memory of the CPU backend: 8-byte aligned so f32/i32 views borrow without copying.
struct CpuStorage {
    backend: BackendId,
    len: usize,
    words: UnsafeCell<Vec<u64>>,
    /// Where the words go back when the tensor is dropped.
    recycle: Arc<Recycler>,
    /// A matrix the fast kernel reads 16 rows interleaved (`qdot_x16`): its format and row
    /// length, where the allocation's shape allows it.
    pack: Option<(DType, usize)>,
    /// Whether the bytes are interleaved: set by the first upload of the whole tensor (a
    /// weight), so tensors only ever written by ops keep the file layout.
    packed: std::sync::atomic::AtomicBool,
}

impl Drop for CpuStorage {
    fn drop(&mut self) {
        self.recycle.put(std::mem::take(self.words.get_mut()));
    }
}

/// Freed tensor memory kept for the next allocation of the same size, so a decode step (the
/// same op shapes every time) allocates nothing from the OS and takes no page faults.
#[derive(Default)]
struct Recycler {
    free: Mutex<RecycleLists>,
}

#[derive(Default)]
struct RecycleLists {
    by_words: std::collections::HashMap<usize, Vec<Vec<u64>>>,
    bytes: usize,
}

impl Recycler {
    /// At most this much memory is kept.
    const MAX_BYTES: usize = 256 << 20;
    /// Buffers larger than this are returned to the allocator (weights, caches).
    const MAX_ONE: usize = 64 << 20;

    fn lists(&self) -> std::sync::MutexGuard<'_, RecycleLists> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, v: Vec<u64>) {
        let bytes = v.len() * 8;
        if v.is_empty() || bytes > Self::MAX_ONE {
            return;
        }
        let mut l = self.lists();
        if l.bytes + bytes > Self::MAX_BYTES {
            return;
        }
        l.bytes += bytes;
        l.by_words.entry(v.len()).or_default().push(v);
    }

    /// `words` zeroed words, recycled when one of that size is free.
    fn take(&self, words: usize) -> Vec<u64> {
        let reused = {
            let mut l = self.lists();
            let v = l.by_words.get_mut(&words).and_then(|s| s.pop());
            if v.is_some() {
                l.bytes -= words * 8;
            }
            v
        };
        match reused {
            Some(mut v) => {
                v.fill(0);
                v
            }
            None => {
                let v = vec![0u64; words];
                huge_pages(&v);
                v
            }
        }
    }
}

/// Asks the kernel to back a large buffer's whole 2 MB pages with huge pages (`madvise`,
/// honoured where transparent huge pages are `always` or `madvise`, the default of many
/// distributions), unless `KILN_CPU_HUGE_PAGES=0`. Weights and caches are streamed: on 4 KB
/// pages a stream crosses a page every 64 lines, each a TLB entry of its own (a 2 GB model
/// is half a million of them), and the hardware prefetchers stop at every page's end. On the
/// Zen 4 machine of the README (2026-12-01, old and new binaries alternating, medians of 4–5,
/// one thread) the 1 B Llama shape decoded Q4_K 35.4 → 38.3 t/s, Q6_K 23.0 → 24.9, Q8_0 17.3
/// → 18.4; its load took ~0.3 s longer (the kernel zeroes and finds 2 MB pages). A hint
/// only: nothing else changes where the kernel declines. Called before the pages are first
/// touched (a fresh zeroed allocation of this size is mapped, not yet faulted in).
fn huge_pages(v: &[u64]) {
    #[cfg(target_os = "linux")]
    {
        use std::sync::OnceLock;
        const HUGE: usize = 2 << 20;
        static ON: OnceLock<bool> = OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("KILN_CPU_HUGE_PAGES").as_deref() != Ok("0"));
        let (start, len) = (v.as_ptr() as usize, std::mem::size_of_val(v));
        if !on || len < 2 * HUGE {
            return;
        }
        let from = start.next_multiple_of(HUGE);
        let to = (start + len) / HUGE * HUGE;
        if to > from {
            // SAFETY: the range lies inside `v`'s allocation; MADV_HUGEPAGE only changes how
            // its pages are backed, never their contents.
            unsafe {
                libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

// SAFETY: the contents are only touched by the owning `CpuBackend` while it holds its `gate`
// mutex (upload, download, execute), and `check_call` guarantees an output never overlaps an
// input or another output, so no byte is aliased mutably.
unsafe impl Sync for CpuStorage {}
unsafe impl Send for CpuStorage {}

impl Storage for CpuStorage {
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn backend(&self) -> BackendId {
        self.backend
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CpuStorage {
    /// # Safety
    /// The caller holds the backend's gate and no mutable slice overlaps the returned one.
    unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        let v = &*self.words.get();
        &bytemuck::cast_slice::<u64, u8>(v)[off..off + len]
    }
    /// # Safety
    /// The caller holds the backend's gate and no other slice overlaps the returned one.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        let v = &mut *self.words.get();
        &mut bytemuck::cast_slice_mut::<u64, u8>(v)[off..off + len]
    }
    /// The format and row length of the interleaved bytes, when they are.
    fn packed(&self) -> Option<(DType, usize)> {
        self.pack
            .filter(|_| self.packed.load(std::sync::atomic::Ordering::Relaxed))
    }
    /// The whole tensor's bytes in the file layout: borrowed, or a copy when interleaved.
    ///
    /// # Safety
    /// As for [`CpuStorage::bytes`].
    unsafe fn file_bytes(&self) -> Cow<'_, [u8]> {
        let b = self.bytes(0, self.len);
        match self.packed() {
            Some((dtype, k)) => {
                let mut out = vec![0u8; self.len];
                qdot_x16::unpack(dtype, k, b, &mut out);
                Cow::Owned(out)
            }
            None => Cow::Borrowed(b),
        }
    }
    /// Stores the whole tensor from `all`, in the file layout, in the storage's layout.
    ///
    /// # Safety
    /// As for [`CpuStorage::bytes_mut`].
    unsafe fn store_file(&self, all: &[u8]) {
        let dst = self.bytes_mut(0, self.len);
        match self.packed() {
            Some((dtype, k)) => qdot_x16::pack(dtype, k, all, dst),
            None => dst.copy_from_slice(all),
        }
    }
    /// Whether `t`, a tensor of this storage, is the whole interleaved matrix (which the
    /// matmul and row-lookup kernels read in place).
    fn is_packed_whole(&self, t: &Tensor) -> bool {
        self.packed().is_some_and(|(dtype, k)| {
            t.offset() == 0
                && t.nbytes() == self.len
                && t.dtype() == dtype
                && t.shape().dims().len() == 2
                && t.shape().last() == k
        })
    }
}

/// The CPU reference backend.
pub struct CpuBackend {
    id: BackendId,
    caps: Capabilities,
    /// The fork/join pool the hot ops (matmul, attention, norms, elementwise) split over.
    workers: pool::Pool,
    /// rayon's pool, for the ops not moved to `workers` yet (`None` where no thread can
    /// start: they then run on the calling thread).
    pool: Option<rayon::ThreadPool>,
    gate: Mutex<()>,
    recycle: Arc<Recycler>,
    /// Recorded decode steps ([`Backend::begin_capture`]).
    graphs: Mutex<CpuGraphs>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A CPU backend on every available core.
    pub fn new() -> Self {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self::with_threads(n)
    }

    /// A CPU backend on `threads` worker threads (at least 1).
    pub fn with_threads(threads: usize) -> Self {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kiln-cpu-{i}"))
            .build()
            .or_else(|_| rayon::ThreadPoolBuilder::new().num_threads(1).build())
            // Where no thread can start at all (a browser's wasm): no pool of our own; rayon's
            // global pool runs on the calling thread there.
            .ok();
        CpuBackend {
            id: next_backend_id(),
            caps: Capabilities {
                device: cpu_name(),
                kind: DeviceKind::Cpu,
                f16: false,
                bf16: false,
                subgroup_size: None,
                max_buffer_bytes: isize::MAX as u64,
                memory_bytes: None,
                parallelism: threads,
            },
            workers: pool::Pool::new(threads),
            pool,
            gate: Mutex::new(()),
            recycle: Arc::new(Recycler::default()),
            graphs: Mutex::new(CpuGraphs::default()),
        }
    }

    pub fn threads(&self) -> usize {
        self.caps.parallelism
    }

    fn storage<'a>(&self, t: &'a Tensor) -> Result<&'a CpuStorage> {
        if t.backend() != self.id {
            return Err(Error::backend(
                "cpu",
                format!("{t:?} belongs to another backend"),
            ));
        }
        t.storage()
            .as_any()
            .downcast_ref::<CpuStorage>()
            .ok_or_else(|| Error::backend("cpu", format!("{t:?} is not CPU memory")))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Convenience for tests and tools: a tensor holding `bytes`.
    pub fn tensor_from_bytes(&self, desc: &TensorDesc, bytes: &[u8]) -> Result<Tensor> {
        let t = self.alloc(desc)?;
        self.upload(&t, bytes)?;
        Ok(t)
    }

    /// Convenience: an f32 tensor.
    pub fn tensor_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        self.tensor_from_bytes(
            &TensorDesc::new(DType::F32, shape),
            bytemuck::cast_slice(data),
        )
    }

    /// Convenience: an i32 tensor.
    pub fn tensor_i32(&self, shape: &[usize], data: &[i32]) -> Result<Tensor> {
        self.tensor_from_bytes(
            &TensorDesc::new(DType::I32, shape),
            bytemuck::cast_slice(data),
        )
    }

    /// Convenience: a tensor's elements as f32 (dequantized if need be).
    pub fn to_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        let bytes = self.download(t)?;
        let mut out = vec![0f32; t.numel()];
        quant::dequantize(t.dtype(), &bytes, &mut out)?;
        Ok(out)
    }

    /// Convenience: an i32 tensor's elements.
    pub fn to_i32(&self, t: &Tensor) -> Result<Vec<i32>> {
        if t.dtype() != DType::I32 {
            return Err(Error::Tensor(format!("{t:?} is not i32")));
        }
        let bytes = self.download(t)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

fn cpu_name() -> String {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let s = if n == 1 { "" } else { "s" };
    format!("{} CPU ({n} thread{s} available)", std::env::consts::ARCH)
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }
    fn id(&self) -> BackendId {
        self.id
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn alloc(&self, desc: &TensorDesc) -> Result<Tensor> {
        let len = desc
            .nbytes()
            .ok_or_else(|| Error::Tensor(format!("{desc}: not a whole number of blocks")))?;
        let words = self.recycle.take(len.div_ceil(8));
        let dims = desc.shape.dims();
        let pack = qdot_x16::packs(simd::isa(), desc.dtype, dims).then(|| (desc.dtype, dims[1]));
        let storage = Arc::new(CpuStorage {
            backend: self.id,
            len,
            words: UnsafeCell::new(words),
            recycle: self.recycle.clone(),
            pack,
            packed: std::sync::atomic::AtomicBool::new(false),
        });
        Tensor::new(storage, 0, desc.clone())
    }

    fn upload(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        self.recording()?;
        let s = self.storage(dst)?;
        if bytes.len() != dst.nbytes() {
            return Err(Error::Tensor(format!(
                "upload to {dst:?}: {} bytes given, {} needed",
                bytes.len(),
                dst.nbytes()
            )));
        }
        let _g = self.lock();
        let whole = dst.offset() == 0 && dst.nbytes() == s.len;
        // A matrix the interleaved kernel reads is interleaved from its first whole upload on.
        if whole
            && s.pack
                .is_some_and(|(dtype, k)| dst.dtype() == dtype && dst.shape().last() == k)
        {
            s.packed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: gate held; one mutable slice at a time.
        unsafe {
            if s.packed().is_none() {
                s.bytes_mut(dst.offset(), dst.nbytes())
                    .copy_from_slice(bytes);
            } else if whole {
                s.store_file(bytes);
            } else {
                let mut all = s.file_bytes().into_owned();
                all[dst.offset()..dst.offset() + dst.nbytes()].copy_from_slice(bytes);
                s.store_file(&all);
            }
        }
        Ok(())
    }

    fn download(&self, src: &Tensor) -> Result<Vec<u8>> {
        self.recording()?;
        let s = self.storage(src)?;
        let _g = self.lock();
        // SAFETY: gate held; no mutable slice exists.
        let all = unsafe { s.file_bytes() };
        Ok(all[src.offset()..src.offset() + src.nbytes()].to_vec())
    }

    fn supports_op(&self, desc: &OpDesc) -> bool {
        // The reference runs every valid call.
        desc.check().is_ok()
    }

    fn execute(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        check_call(self, op, inputs, outputs)?;
        if let Some(rec) = self.lock_graphs().recording.as_mut() {
            rec.push(Recorded {
                op: op.clone(),
                inputs: inputs.iter().map(|&t| t.clone()).collect(),
                outputs: outputs.iter().map(|&t| t.clone()).collect(),
            });
            return Ok(());
        }
        self.run(op, inputs, outputs)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<()> {
        let mut g = self.lock_graphs();
        if g.recording.is_some() {
            return Err(Error::backend("cpu", "a graph is already being recorded"));
        }
        g.recording = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self) -> Result<GraphId> {
        let mut g = self.lock_graphs();
        let ops = g
            .recording
            .take()
            .ok_or_else(|| Error::backend("cpu", "no graph is being recorded"))?;
        g.next += 1;
        let id = g.next;
        g.graphs.insert(id, Arc::new(ops));
        Ok(id)
    }

    fn abort_capture(&self) {
        self.lock_graphs().recording = None;
    }

    fn replay(&self, id: GraphId) -> Result<()> {
        let ops = self
            .lock_graphs()
            .graphs
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::backend("cpu", format!("no graph {id}")))?;
        for r in ops.iter() {
            let ins: Vec<&Tensor> = r.inputs.iter().collect();
            let outs: Vec<&Tensor> = r.outputs.iter().collect();
            self.run(&r.op, &ins, &outs)?;
        }
        Ok(())
    }

    fn drop_graph(&self, id: GraphId) {
        self.lock_graphs().graphs.remove(&id);
    }
}

/// A decode step recorded by [`Backend::begin_capture`]: its ops, in order, on the tensors
/// they were given (the graph keeps them, and with them their memory).
struct Recorded {
    op: Op,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
}

#[derive(Default)]
struct CpuGraphs {
    /// The ops of the step being recorded.
    recording: Option<Vec<Recorded>>,
    graphs: std::collections::HashMap<GraphId, Arc<Vec<Recorded>>>,
    next: GraphId,
}

impl CpuBackend {
    fn lock_graphs(&self) -> std::sync::MutexGuard<'_, CpuGraphs> {
        self.graphs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a step is being recorded (uploads and downloads are refused meanwhile: a
    /// recorded step reads its inputs from tensors filled before each replay).
    fn recording(&self) -> Result<()> {
        match self.lock_graphs().recording {
            Some(_) => Err(Error::backend(
                "cpu",
                "no upload or download while a step is being recorded",
            )),
            None => Ok(()),
        }
    }

    /// Runs `op` now (its call checked by the caller).
    fn run(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        let ins = inputs
            .iter()
            .map(|t| self.storage(t))
            .collect::<Result<Vec<_>>>()?;
        let outs = outputs
            .iter()
            .map(|t| self.storage(t))
            .collect::<Result<Vec<_>>>()?;
        let _g = self.lock();
        // Interleaved matrices are read in place by the matmuls and row lookups when whole;
        // any other use gets a copy in the file layout (and an output so stored is written
        // back interleaved after the op).
        let in_place = matches!(op, Op::MatMul(_) | Op::GetRows(_));
        // SAFETY (these blocks): the gate is held for the whole op, and `check_call` proved
        // that no output overlaps an input or another output, so the mutable slices alias
        // nothing.
        let in_copies: Vec<Option<Vec<u8>>> = ins
            .iter()
            .zip(inputs)
            .map(|(s, t)| {
                (s.packed().is_some() && !(in_place && s.is_packed_whole(t))).then(|| {
                    let all = unsafe { s.file_bytes() };
                    all[t.offset()..t.offset() + t.nbytes()].to_vec()
                })
            })
            .collect();
        let mut out_copies: Vec<Option<Vec<u8>>> = outs
            .iter()
            .map(|s| s.packed().map(|_| unsafe { s.file_bytes() }.into_owned()))
            .collect();
        let in_bytes: Vec<In> = ins
            .iter()
            .zip(inputs)
            .zip(&in_copies)
            .map(|((s, t), c)| match c {
                Some(c) => In::new(t.desc(), c),
                None => In {
                    desc: t.desc(),
                    bytes: unsafe { s.bytes(t.offset(), t.nbytes()) },
                    x16: s.packed().is_some(),
                },
            })
            .collect();
        let mut out_bytes: Vec<Out> = outs
            .iter()
            .zip(outputs)
            .zip(out_copies.iter_mut())
            .map(|((s, t), c)| Out {
                desc: t.desc(),
                bytes: match c {
                    Some(c) => &mut c[t.offset()..t.offset() + t.nbytes()],
                    None => unsafe { s.bytes_mut(t.offset(), t.nbytes()) },
                },
            })
            .collect();
        let err = |msg: String| Error::Op {
            op: op.name().into(),
            msg,
            inputs: inputs
                .iter()
                .map(|t| t.desc().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            outputs: outputs
                .iter()
                .map(|t| t.desc().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let r = pool::with_pool(&self.workers, || {
            if on_workers(op) {
                dispatch(op, &in_bytes, &mut out_bytes)
            } else {
                match &self.pool {
                    Some(p) => p.install(|| dispatch(op, &in_bytes, &mut out_bytes)),
                    None => dispatch(op, &in_bytes, &mut out_bytes),
                }
            }
        });
        drop(out_bytes);
        for (s, c) in outs.iter().zip(&out_copies) {
            if let Some(c) = c {
                // SAFETY: gate held; the op's slices are gone.
                unsafe { s.store_file(c) };
            }
        }
        r.map_err(|e| match e {
            KernelError::Data(msg) => err(msg),
            KernelError::Other(e) => e,
        })
    }
}

/// An input as the kernels see it.
pub(crate) struct In<'a> {
    pub desc: &'a TensorDesc,
    pub bytes: &'a [u8],
    /// The bytes are a matrix of 16-row interleaved blocks (`qdot_x16`), which only the
    /// matmuls' weights and the row lookups' tables can be.
    pub x16: bool,
}

/// An output as the kernels see it.
pub(crate) struct Out<'a> {
    pub desc: &'a TensorDesc,
    pub bytes: &'a mut [u8],
}

/// A kernel failure: bad data in a tensor (an id out of range) or a lower-level error.
pub(crate) enum KernelError {
    Data(String),
    Other(Error),
}

impl From<Error> for KernelError {
    fn from(e: Error) -> Self {
        KernelError::Other(e)
    }
}

pub(crate) type KResult<T = ()> = std::result::Result<T, KernelError>;

impl<'a> In<'a> {
    /// An input of bytes in the file layout.
    pub fn new(desc: &'a TensorDesc, bytes: &'a [u8]) -> Self {
        In {
            desc,
            bytes,
            x16: false,
        }
    }
    /// The elements as f32: borrowed when already aligned f32, else converted.
    pub fn f32(&self) -> KResult<Cow<'a, [f32]>> {
        if self.desc.dtype == DType::F32 {
            if let Ok(s) = bytemuck::try_cast_slice::<u8, f32>(self.bytes) {
                return Ok(Cow::Borrowed(s));
            }
        }
        let mut v = vec![0f32; self.desc.numel()];
        if self.x16 {
            let mut file = vec![0u8; self.bytes.len()];
            qdot_x16::unpack(
                self.desc.dtype,
                self.desc.shape.last(),
                self.bytes,
                &mut file,
            );
            quant::dequantize(self.desc.dtype, &file, &mut v)?;
        } else {
            quant::dequantize(self.desc.dtype, self.bytes, &mut v)?;
        }
        Ok(Cow::Owned(v))
    }
    /// Row `r` of a matrix (its last dimension) dequantized into `dst`.
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) {
        let rb = self.row_bytes();
        if self.x16 {
            let mut file = vec![0u8; rb];
            qdot_x16::unpack_row(
                self.desc.dtype,
                self.desc.shape.last(),
                self.bytes,
                r,
                &mut file,
            );
            quant::dequantize_row(self.desc.dtype, &file, dst);
        } else if let Some(src) = self.bytes.get(r * rb..(r + 1) * rb) {
            quant::dequantize_row(self.desc.dtype, src, dst);
        }
    }
    pub fn i32(&self) -> KResult<Cow<'a, [i32]>> {
        if let Ok(s) = bytemuck::try_cast_slice::<u8, i32>(self.bytes) {
            return Ok(Cow::Borrowed(s));
        }
        Ok(Cow::Owned(
            self.bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
    pub fn dims(&self) -> &[usize] {
        self.desc.shape.dims()
    }
    /// Bytes of one row of the last dimension.
    pub fn row_bytes(&self) -> usize {
        self.desc
            .dtype
            .bytes_for(self.desc.shape.last())
            .unwrap_or(0)
    }
}

impl Out<'_> {
    pub fn dims(&self) -> &[usize] {
        self.desc.shape.dims()
    }
    /// Runs `f` on the output as an f32 slice, converting to the output's dtype afterwards.
    /// With `init` the slice starts with the output's current contents (in-place ops).
    pub fn with_f32<R>(
        &mut self,
        init: bool,
        f: impl FnOnce(&mut [f32]) -> KResult<R>,
    ) -> KResult<R> {
        if self.desc.dtype == DType::F32 {
            if let Ok(s) = bytemuck::try_cast_slice_mut::<u8, f32>(self.bytes) {
                return f(s);
            }
        }
        let mut tmp = vec![0f32; self.desc.numel()];
        if init {
            quant::dequantize(self.desc.dtype, self.bytes, &mut tmp)?;
        }
        let r = f(&mut tmp)?;
        self.store_f32(&tmp)?;
        Ok(r)
    }
    /// Writes f32 values in the output's dtype.
    pub fn store_f32(&mut self, v: &[f32]) -> KResult {
        match self.desc.dtype {
            DType::F32 => {
                for (dst, x) in self.bytes.chunks_exact_mut(4).zip(v) {
                    dst.copy_from_slice(&x.to_le_bytes());
                }
            }
            DType::F16 => {
                for (dst, x) in self.bytes.chunks_exact_mut(2).zip(v) {
                    dst.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
                }
            }
            DType::BF16 => {
                for (dst, x) in self.bytes.chunks_exact_mut(2).zip(v) {
                    dst.copy_from_slice(&half::bf16::from_f32(*x).to_le_bytes());
                }
            }
            d => {
                let q = quant::quantize(d, v)?;
                self.bytes.copy_from_slice(&q);
            }
        }
        Ok(())
    }
    pub fn store_i32(&mut self, v: &[i32]) {
        for (dst, x) in self.bytes.chunks_exact_mut(4).zip(v) {
            dst.copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// Ops whose kernels split their work over `CpuBackend::workers` (the rest use rayon): each
/// family's file says which of its ops do.
fn on_workers(op: &Op) -> bool {
    match op {
        Op::MatMul(f) => mat_mul::on_workers(f),
        Op::GetRows(f) => get_rows::on_workers(f),
        Op::Elementwise(f) => elementwise::on_workers(f),
        Op::Norm(f) => norm::on_workers(f),
        Op::Rope(f) => rope::on_workers(f),
        Op::Softmax(f) => softmax::on_workers(f),
        Op::Attention(f) => attention::on_workers(f),
        Op::Reduce(f) => reduce::on_workers(f),
        Op::Conv(f) => conv::on_workers(f),
        Op::DeltaNet(f) => delta_net::on_workers(f),
        Op::Moe(f) => moe::on_workers(f),
        Op::Canvas(f) => canvas::on_workers(f),
    }
}

/// Runs `op`'s CPU reference: its family's `run_op`.
fn dispatch(op: &Op, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        Op::MatMul(f) => mat_mul::run_op(f, i, o),
        Op::GetRows(f) => get_rows::run_op(f, i, o),
        Op::Elementwise(f) => elementwise::run_op(f, i, o),
        Op::Norm(f) => norm::run_op(f, i, o),
        Op::Rope(f) => rope::run_op(f, i, o),
        Op::Softmax(f) => softmax::run_op(f, i, o),
        Op::Attention(f) => attention::run_op(f, i, o),
        Op::Reduce(f) => reduce::run_op(f, i, o),
        Op::Conv(f) => conv::run_op(f, i, o),
        Op::DeltaNet(f) => delta_net::run_op(f, i, o),
        Op::Moe(f) => moe::run_op(f, i, o),
        Op::Canvas(f) => canvas::run_op(f, i, o),
    }
}

/// Converts an index read from a tensor into a bounds-checked `usize`.
pub(crate) fn index(v: i32, len: usize, what: &str) -> KResult<usize> {
    if v < 0 || v as usize >= len {
        return Err(KernelError::Data(format!(
            "{what} {v} is out of range 0..{len}"
        )));
    }
    Ok(v as usize)
}
