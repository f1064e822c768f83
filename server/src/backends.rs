//! Opening backends by name, behind the cargo features that build them.

use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;

/// The backends `--backend` accepts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendName {
    Cpu,
    Wgpu,
    Cuda,
}

impl BackendName {
    pub const ALL: [BackendName; 3] = [BackendName::Cpu, BackendName::Wgpu, BackendName::Cuda];
    pub fn as_str(self) -> &'static str {
        match self {
            BackendName::Cpu => "cpu",
            BackendName::Wgpu => "wgpu",
            BackendName::Cuda => "cuda",
        }
    }
}

/// Opens a backend, or says why it is not available here.
pub fn open(name: BackendName, threads: Option<usize>) -> kiln_core::Result<Arc<dyn Backend>> {
    open_with(name, threads, true)
}

/// Opens a backend as `kiln validate` needs it: with every op its kernels claim, even those a
/// self-check at open would have handed to the CPU (the CUDA backend's), so failures show.
pub fn open_for_validation(
    name: BackendName,
    threads: Option<usize>,
) -> kiln_core::Result<Arc<dyn Backend>> {
    open_with(name, threads, false)
}

fn open_with(
    name: BackendName,
    threads: Option<usize>,
    self_check: bool,
) -> kiln_core::Result<Arc<dyn Backend>> {
    match name {
        BackendName::Cpu => Ok(Arc::new(match threads {
            Some(t) => CpuBackend::with_threads(t),
            None => CpuBackend::new(),
        })),
        BackendName::Wgpu => open_wgpu(),
        BackendName::Cuda => open_cuda(self_check),
    }
}

#[cfg(feature = "wgpu")]
fn open_wgpu() -> kiln_core::Result<Arc<dyn Backend>> {
    kiln_backend_wgpu::open()
}
#[cfg(not(feature = "wgpu"))]
fn open_wgpu() -> kiln_core::Result<Arc<dyn Backend>> {
    Err(kiln_core::Error::NotAvailable(
        "wgpu: this kiln was built without the `wgpu` feature".into(),
    ))
}

#[cfg(feature = "cuda")]
fn open_cuda(self_check: bool) -> kiln_core::Result<Arc<dyn Backend>> {
    if self_check {
        kiln_backend_cuda::open()
    } else {
        kiln_backend_cuda::open_unchecked()
    }
}
#[cfg(not(feature = "cuda"))]
fn open_cuda(_self_check: bool) -> kiln_core::Result<Arc<dyn Backend>> {
    Err(kiln_core::Error::NotAvailable(
        "cuda: this kiln was built without the `cuda` feature".into(),
    ))
}
