//! kiln's CUDA backend (cudarc with dynamic loading + NVRTC-compiled kernels from `kernels/`).
//!
//! cudarc panics when a CUDA library is missing the first time a call needs it, so this crate
//! probes for the driver and NVRTC itself before any cudarc call. The kernels and the `Backend`
//! implementation are not written yet: `open` reports the backend as not available.

use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::Error;

/// The driver library names tried, in order.
const DRIVER_LIBS: &[&str] = &["libcuda.so.1", "libcuda.so", "nvcuda.dll"];
/// NVRTC library names tried, in order.
const NVRTC_LIBS: &[&str] = &[
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so",
    "nvrtc64_130_0.dll",
    "nvrtc64_120_0.dll",
];

/// The first of `names` that loads, if any.
fn find_library(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| {
        // SAFETY: loading a system library runs its initialisers; the CUDA libraries' are
        // well-behaved, and we unload it again at once.
        let lib = unsafe { libloading::Library::new(n) };
        lib.ok().map(|_| n.to_string())
    })
}

/// What the probe found.
#[derive(Clone, Debug)]
pub struct Probe {
    pub driver: Option<String>,
    pub nvrtc: Option<String>,
}

pub fn probe() -> Probe {
    Probe {
        driver: find_library(DRIVER_LIBS),
        nvrtc: find_library(NVRTC_LIBS),
    }
}

/// Opens the CUDA backend.
pub fn open() -> kiln_core::Result<Arc<dyn Backend>> {
    let p = probe();
    match (&p.driver, &p.nvrtc) {
        (None, _) => Err(Error::NotAvailable("cuda: no NVIDIA driver (libcuda.so.1 not found)".into())),
        (Some(_), None) => Err(Error::NotAvailable(
            "cuda: NVRTC not found (install the CUDA toolkit or the PyPI package nvidia-cuda-nvrtc and put its lib folder on LD_LIBRARY_PATH)".into(),
        )),
        (Some(d), Some(n)) => Err(Error::NotAvailable(format!(
            "cuda: driver {d} and {n} found, but kiln's CUDA kernels are not built yet"
        ))),
    }
}

/// cudarc is linked (dynamic loading, so no toolkit at build time); referenced here so the
/// dependency stays exercised until the kernels land.
pub fn cudarc_linked() -> &'static str {
    std::any::type_name::<cudarc::driver::CudaContext>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_reports_not_available_instead_of_panicking() {
        match open() {
            Err(Error::NotAvailable(msg)) => assert!(msg.starts_with("cuda:"), "{msg}"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("the CUDA backend has no kernels yet"),
        }
        assert!(cudarc_linked().contains("CudaContext"));
    }
}
