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
    match name {
        BackendName::Cpu => Ok(Arc::new(match threads {
            Some(t) => CpuBackend::with_threads(t),
            None => CpuBackend::new(),
        })),
        BackendName::Wgpu => open_wgpu(),
        BackendName::Cuda => open_cuda(),
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
fn open_cuda() -> kiln_core::Result<Arc<dyn Backend>> {
    kiln_backend_cuda::open()
}
#[cfg(not(feature = "cuda"))]
fn open_cuda() -> kiln_core::Result<Arc<dyn Backend>> {
    Err(kiln_core::Error::NotAvailable(
        "cuda: this kiln was built without the `cuda` feature".into(),
    ))
}
