//! kiln's CUDA backend (cudarc with dynamic loading + NVRTC-compiled kernels from `kernels/`).
//!
//! cudarc panics when a CUDA library is missing the first time a call needs it, so this crate
//! probes for the driver and NVRTC itself before any cudarc call. The kernels are written and
//! compile-checked for every target architecture ([`kernels`], [`nvrtc`], the test below);
//! the `Backend` implementation that launches them is not written yet, so `open` reports the
//! backend as not available.

pub mod kernels;
pub mod nvrtc;

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

/// The compile check: every kernel file compiled by NVRTC to a cubin for every architecture
/// (so ptxas runs), and no register spills in the kernels marked hot. Skips without NVRTC
/// unless `KILN_REQUIRE_NVRTC=1`, which CI sets.
#[cfg(test)]
mod compile_check {
    use super::kernels::{entry_points, source, ARCHS, FILES};
    use super::nvrtc::{ptxas_usage, Nvrtc, Toolchain};

    fn required() -> bool {
        std::env::var("KILN_REQUIRE_NVRTC").is_ok_and(|v| v == "1" || v == "true")
    }

    #[test]
    fn every_kernel_file_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("kernels/")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".cu"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = FILES.iter().map(|f| f.0.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "kernels/*.cu and kernels::FILES differ");
        for (name, src) in FILES {
            assert!(!entry_points(src).is_empty(), "{name} declares no kernels");
        }
    }

    #[test]
    fn nvrtc_compiles_every_kernel_for_every_architecture() {
        let tc = match Toolchain::find() {
            Ok(t) => t,
            Err(e) => {
                assert!(!required(), "KILN_REQUIRE_NVRTC is set: {e}");
                println!("skipping the NVRTC compile check: {e}");
                return;
            }
        };
        let nvrtc = Nvrtc::load(&tc.nvrtc).expect("NVRTC loads");
        println!("nvrtc {:?} from {}", nvrtc.version(), tc.nvrtc.display());
        let mut failures = Vec::new();
        for arch in ARCHS {
            let mut kernels = 0;
            for (file, src) in FILES {
                let full = source(file).expect("listed");
                let c = match nvrtc.compile(&tc, file, &full, arch) {
                    Ok(c) => c,
                    Err(e) => {
                        failures.push(e.to_string());
                        continue;
                    }
                };
                assert!(
                    c.cubin.starts_with(b"\x7fELF"),
                    "{file} {arch}: not an ELF cubin"
                );
                let usage = ptxas_usage(&c.log);
                for (name, hot) in entry_points(src) {
                    let Some(u) = usage.iter().find(|u| u.0 == name) else {
                        failures.push(format!("{file} {arch}: ptxas reported nothing for {name}"));
                        continue;
                    };
                    kernels += 1;
                    if hot {
                        println!("  {arch} {name}: {} registers, {} bytes stack", u.1, u.4);
                    }
                    // Spills, or arrays put in local memory (a stack frame), on the decode
                    // path fail the check.
                    if hot && (u.2 > 0 || u.3 > 0 || u.4 > 0) {
                        failures.push(format!(
                            "{file} {arch}: hot kernel {name} uses local memory ({} registers, {} bytes spilled, {} reloaded, {} bytes of stack)",
                            u.1, u.2, u.3, u.4
                        ));
                    }
                }
            }
            println!("nvrtc: compiled {kernels} kernels for {arch}");
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
