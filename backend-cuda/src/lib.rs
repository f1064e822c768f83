//! kiln's CUDA backend (cudarc with dynamic loading + NVRTC-compiled kernels from `kernels/`).
//!
//! cudarc panics when a CUDA library is missing the first time a call needs it, so this crate
//! probes for the driver and NVRTC itself before any cudarc call: on a machine without them
//! `open` says "not available" and nothing panics.
//!
//! - [`plan`]: which kernels run an op (pure; this is `supports_op`), and the check of every
//!   launch against the kernels' parsed signatures.
//! - [`device`](crate::device): context, stream, caching allocator ([`pool`]), NVRTC
//!   compilation for the device's exact architecture with an on-disk cubin cache, launches.
//! - A self-check when the backend opens: every conformance case the kernels claim runs
//!   against the CPU reference, and an op that fails on this device is not claimed (it runs
//!   on the CPU, counted and reported like any fallback). `kiln validate --backend cuda` opens
//!   the backend without it, to show the failures themselves.

mod device;
#[cfg(any(test, feature = "emulator"))]
pub mod emu;
pub mod kernels;
pub mod names;
pub mod nvrtc;
pub mod plan;
pub mod pool;

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use kiln_core::backend::{check_call, Backend, Capabilities, GraphId, SubmitStats};
use kiln_core::op::{Op, OpDesc};
use kiln_core::tensor::{BackendId, Tensor, TensorDesc};
use kiln_core::Error;

pub use device::arch_for;

/// The driver library names tried, in order.
const DRIVER_LIBS: &[&str] = &["libcuda.so.1", "libcuda.so", "nvcuda.dll"];

/// Whether a library of `names` loads.
fn find_library(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| {
        // SAFETY: loading a system library runs its initialisers; the CUDA driver's are
        // well-behaved, and we unload it again at once.
        let lib = unsafe { libloading::Library::new(n) };
        lib.ok().map(|_| n.to_string())
    })
}

/// The CUDA backend on one device.
pub struct CudaBackend {
    gpu: device::Gpu,
    /// Ops whose cases failed the self-check on this device: not claimed.
    failed: RwLock<BTreeSet<&'static str>>,
}

/// Opens the CUDA backend on device `KILN_CUDA_DEVICE` (default 0) and self-checks it (unless
/// `KILN_CUDA_SELF_CHECK=0`).
pub fn open() -> kiln_core::Result<Arc<dyn Backend>> {
    let b = CudaBackend::open()?;
    let skip = std::env::var("KILN_CUDA_SELF_CHECK").is_ok_and(|v| v == "0");
    if !skip {
        b.self_check();
    }
    Ok(Arc::new(b))
}

/// Opens the backend with no self-check, so every op its kernels claim runs on them: what
/// `kiln validate` and the conformance tests use.
pub fn open_unchecked() -> kiln_core::Result<Arc<dyn Backend>> {
    Ok(Arc::new(CudaBackend::open()?))
}

impl CudaBackend {
    pub fn open() -> kiln_core::Result<CudaBackend> {
        if find_library(DRIVER_LIBS).is_none() {
            return Err(Error::NotAvailable(
                "cuda: no NVIDIA driver (libcuda.so.1 not found)".into(),
            ));
        }
        let ordinal = match std::env::var("KILN_CUDA_DEVICE") {
            Ok(v) => v.trim().parse::<usize>().map_err(|_| {
                Error::NotAvailable(format!(
                    "cuda: KILN_CUDA_DEVICE={v:?} is not a device number"
                ))
            })?,
            Err(_) => 0,
        };
        Ok(CudaBackend {
            gpu: device::Gpu::open(ordinal)?,
            failed: RwLock::new(BTreeSet::new()),
        })
    }

    /// Runs the conformance cases on this device against the CPU reference and stops
    /// claiming every op with a failing case. Returns those ops.
    pub fn self_check(&self) -> Vec<&'static str> {
        let reference = kiln_core::cpu::CpuBackend::new();
        let results = match kiln_core::validate::run_all(None, &reference, self, false, |_| {}) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("cuda: the self-check could not run: {e}");
                return Vec::new();
            }
        };
        let bad: BTreeSet<&'static str> = results
            .iter()
            .filter(|r| matches!(r.status, kiln_core::validate::Status::Fail(_)))
            .map(|r| r.op)
            .collect();
        if !bad.is_empty() {
            let list: Vec<&str> = bad.iter().copied().collect();
            tracing::warn!(
                device = %self.gpu.caps.device,
                "cuda: kernels for {} failed the self-check on this device; those ops run on the CPU reference (`kiln validate --backend cuda` shows the failures)",
                list.join(", ")
            );
        }
        let out = bad.iter().copied().collect();
        *self.failed.write().unwrap_or_else(|p| p.into_inner()) = bad;
        out
    }

    /// The architecture the kernels were compiled for.
    pub fn arch(&self) -> &str {
        &self.gpu.arch
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }
    fn id(&self) -> BackendId {
        self.gpu.id
    }
    fn capabilities(&self) -> &Capabilities {
        &self.gpu.caps
    }
    fn alloc(&self, desc: &TensorDesc) -> kiln_core::Result<Tensor> {
        self.gpu.alloc(desc)
    }
    fn upload(&self, dst: &Tensor, bytes: &[u8]) -> kiln_core::Result<()> {
        self.gpu.upload(dst, bytes)
    }
    fn download(&self, src: &Tensor) -> kiln_core::Result<Vec<u8>> {
        self.gpu.download(src)
    }
    fn supports_op(&self, desc: &OpDesc) -> bool {
        let failed = self.failed.read().unwrap_or_else(|p| p.into_inner());
        !failed.contains(desc.op.name()) && plan::plan(desc).is_some()
    }
    fn execute(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> kiln_core::Result<()> {
        let desc = check_call(self, op, inputs, outputs)?;
        let steps = plan::plan(&desc).ok_or_else(|| {
            Error::backend(
                "cuda",
                format!("{desc} has no CUDA kernel (supports_op says no; the executor runs it on the CPU)"),
            )
        })?;
        let t0 = std::time::Instant::now();
        let r = self.gpu.run(&steps, inputs, outputs);
        self.gpu.count_submit(&steps, t0.elapsed());
        r
    }
    fn synchronize(&self) -> kiln_core::Result<()> {
        self.gpu.wait()
    }
    fn submit_stats(&self) -> Option<SubmitStats> {
        Some(self.gpu.submit_stats())
    }
    fn graphs(&self) -> bool {
        true
    }
    fn begin_capture(&self) -> kiln_core::Result<()> {
        self.gpu.begin_capture()
    }
    fn alloc_input(&self, desc: &TensorDesc) -> kiln_core::Result<Tensor> {
        self.gpu.alloc_input(desc)
    }
    fn end_capture(&self) -> kiln_core::Result<GraphId> {
        self.gpu.end_capture()
    }
    fn abort_capture(&self) {
        self.gpu.abort_capture()
    }
    fn replay(&self, id: GraphId) -> kiln_core::Result<()> {
        self.gpu.replay(id)
    }
    fn drop_graph(&self, id: GraphId) {
        self.gpu.drop_graph(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_reports_not_available_instead_of_panicking() {
        match open() {
            Err(Error::NotAvailable(msg)) => assert!(msg.starts_with("cuda:"), "{msg}"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(b) => println!("cuda backend on {}", b.capabilities().device),
        }
    }

    #[test]
    fn architectures_are_the_exact_targets() {
        assert_eq!(arch_for((9, 0)), "sm_90a");
        assert_eq!(arch_for((10, 0)), "sm_100a");
        assert_eq!(arch_for((12, 0)), "sm_120a");
        assert_eq!(arch_for((12, 1)), "sm_121a");
        assert_eq!(arch_for((8, 9)), "sm_89");
        assert_eq!(arch_for((8, 0)), "sm_80");
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

    /// NVRTC and the headers, or `None` (a skip, printed) unless KILN_REQUIRE_NVRTC is set.
    fn toolchain() -> Option<Toolchain> {
        match Toolchain::find() {
            Ok(t) => Some(t),
            Err(e) => {
                assert!(!required(), "KILN_REQUIRE_NVRTC is set: {e}");
                println!("skipping the NVRTC compile check: {e}");
                None
            }
        }
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

    /// The staged decode mat-vecs (the MV_STAGED knob, off by default) compile too, for
    /// Hopper, with no local memory in the formats that have their own staged decoders: the
    /// plain mat-vec of every weight format (mat_mul_fused.cu adds only its two sources, which the
    /// emulated conformance suite runs), staged (1) and lane-per-row (2).
    #[test]
    fn nvrtc_compiles_the_staged_mat_vec() {
        let Some(tc) = toolchain() else { return };
        let nvrtc = Nvrtc::load(&tc.nvrtc).expect("NVRTC loads");
        for (spec, file) in [
            ("MV_STAGED=1", "mat_mul_vec.cu"),
            ("MV_STAGED=1", "quant.cu"),
            ("MV_STAGED=2", "mat_mul_vec.cu"),
            ("MV_STAGED=2", "quant.cu"),
        ] {
            let full = super::kernels::source_with(file, Some(spec)).expect("listed");
            assert!(
                full.contains(&format!("#define {}\n", spec.replace('=', " "))),
                "the knob reaches the source"
            );
            let c = nvrtc
                .compile(&tc, file, &full, "sm_90a")
                .unwrap_or_else(|e| panic!("{file} {spec}: {e}"));
            for u in ptxas_usage(&c.log) {
                println!(
                    "  {spec} {}: {} registers, {} bytes of stack",
                    u.0, u.1, u.4
                );
                // The formats with their own staged decoders (ptxas may trade a few bytes of
                // stack for registers in the 8-value-item ones, which stay on the ring anyway).
                let own = ["q4_k", "q6_k", "q8_0", "f32", "f16", "bf16"]
                    .iter()
                    .any(|f| u.0 == format!("mat_vec_{f}"));
                assert!(
                    !own || u.2 == 0 && u.3 == 0 && u.4 == 0,
                    "{file}: {} uses local memory with {spec} ({} registers, {} bytes of stack)",
                    u.0,
                    u.1,
                    u.4
                );
            }
        }
    }

    /// The prefill tiles on the tensor cores (MM_TC=1, not the default) compile for every
    /// architecture, at 3 and 2 activation parts, and the codes tiles (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K,
    /// bf16 weights) keep everything in registers and shared memory.
    #[test]
    fn nvrtc_compiles_the_tensor_core_tiles() {
        let Some(tc) = toolchain() else { return };
        let nvrtc = Nvrtc::load(&tc.nvrtc).expect("NVRTC loads");
        for (spec, file) in [
            ("MM_TC=1", "mat_mul.cu"),
            ("MM_TC=1,MM_PARTS=2", "mat_mul.cu"),
            ("MM_TC=1", "mat_mul_tc.cu"),
            ("MM_TC=1,MM_PARTS=2", "mat_mul_tc.cu"),
        ] {
            let full = super::kernels::source_with(file, Some(spec)).expect("listed");
            for arch in ARCHS {
                let c = nvrtc
                    .compile(&tc, file, &full, arch)
                    .unwrap_or_else(|e| panic!("{file} {spec} {arch}: {e}"));
                // KILN_CUBIN_DIR=DIR keeps the cubins, for `cuobjdump --dump-sass`.
                if let Ok(dir) = std::env::var("KILN_CUBIN_DIR") {
                    let name = format!(
                        "{}-{}-{arch}.cubin",
                        file.trim_end_matches(".cu"),
                        spec.replace([',', '='], "_")
                    );
                    std::fs::write(std::path::Path::new(&dir).join(name), &c.cubin)
                        .expect("cubin written");
                }
                for u in ptxas_usage(&c.log) {
                    let codes = ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "bf16"]
                        .iter()
                        .any(|f| u.0.ends_with(&format!("_{f}")));
                    if codes {
                        println!(
                            "  {spec} {arch} {}: {} registers, {} bytes of stack",
                            u.0, u.1, u.4
                        );
                        assert!(
                            u.2 == 0 && u.3 == 0 && u.4 == 0,
                            "{spec} {arch}: {} uses local memory ({} registers, {} bytes of stack)",
                            u.0,
                            u.1,
                            u.4
                        );
                    }
                }
            }
        }
    }

    /// Every kernel file for every architecture, an architecture a thread (NVRTC programs
    /// are independent; the check is CI's longest single test when run one after another).
    #[test]
    fn nvrtc_compiles_every_kernel_for_every_architecture() {
        let Some(tc) = toolchain() else { return };
        let nvrtc = Nvrtc::load(&tc.nvrtc).expect("NVRTC loads");
        println!("nvrtc {:?} from {}", nvrtc.version(), tc.nvrtc.display());
        let (tc, nvrtc) = (&tc, &nvrtc);
        let per_arch: Vec<(Vec<String>, Vec<String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = ARCHS
                .iter()
                .map(|&arch| s.spawn(move || compile_arch(tc, nvrtc, arch)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("compile thread"))
                .collect()
        });
        let mut failures = Vec::new();
        for (lines, fails) in per_arch {
            for l in lines {
                println!("{l}");
            }
            failures.extend(fails);
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The SASS of the hot kernels for Hopper, from the cubins NVRTC makes (`cuobjdump
    /// --dump-sass`; the PyPI wheels `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` beside
    /// NVRTC): a table of what each kernel's code is made of, so a change in what the
    /// compiler emits (the asynchronous copies gone, local memory, fewer tensor-core
    /// instructions) shows in CI's log without a GPU. Fails on local memory in a hot kernel,
    /// and where the tensor-core prefill tiles (matmul and attention) lose their cp.async copies
    /// or their mma.
    /// Skips without the tools unless KILN_REQUIRE_NVRTC is set.
    #[test]
    fn the_hot_kernels_sass_is_reported() {
        let Some(tc) = toolchain() else { return };
        let bin = tc
            .nvrtc
            .parent()
            .and_then(|lib| lib.parent())
            .map(|root| root.join("bin"))
            .filter(|b| b.join("cuobjdump").is_file() && b.join("nvdisasm").is_file());
        let Some(bin) = bin else {
            assert!(
                !required(),
                "KILN_REQUIRE_NVRTC is set: no cuobjdump and nvdisasm beside NVRTC (the PyPI \
                 packages nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm)"
            );
            println!("skipping the SASS report: no cuobjdump and nvdisasm beside NVRTC");
            return;
        };
        let nvrtc = Nvrtc::load(&tc.nvrtc).expect("NVRTC loads");
        let dir = std::env::temp_dir().join(format!("kiln-sass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp folder");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let classes = [
            "HMMA", "IMMA", "LDGSTS", "LDG", "LDS", "STS", "FFMA", "IDP", "LDL", "STL",
        ];
        println!(
            "{:<28} {:>6} {}",
            "sm_90a kernel",
            "instr",
            classes.map(|c| format!("{c:>6}")).join("")
        );
        let mut failures = Vec::new();
        for (file, src) in FILES {
            let hot: Vec<String> = entry_points(src)
                .into_iter()
                .filter(|e| e.1)
                .map(|e| e.0)
                .collect();
            if hot.is_empty() {
                continue;
            }
            let full = source(file).expect("listed");
            let c = nvrtc
                .compile(&tc, file, &full, "sm_90a")
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let cubin = dir.join(file.replace(".cu", ".cubin"));
            std::fs::write(&cubin, &c.cubin).expect("cubin written");
            let out = std::process::Command::new(bin.join("cuobjdump"))
                .arg("--dump-sass")
                .arg(&cubin)
                .env("PATH", &path)
                .output()
                .expect("cuobjdump runs");
            assert!(
                out.status.success(),
                "cuobjdump: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let sass = String::from_utf8_lossy(&out.stdout);
            for (name, counts, total) in sass_counts(&sass, &classes) {
                if !hot.contains(&name) {
                    continue;
                }
                println!(
                    "{:<28} {:>6} {}",
                    name,
                    total,
                    counts.iter().map(|n| format!("{n:>6}")).collect::<String>()
                );
                let n = |c: &str| {
                    classes
                        .iter()
                        .position(|x| *x == c)
                        .map_or(0, |i| counts[i])
                };
                if n("LDL") + n("STL") > 0 {
                    failures.push(format!("{name}: local memory in a hot kernel"));
                }
                let tiles =
                    name.starts_with("mat_mul_tc_") || name.starts_with("paged_prefill_tc_");
                if tiles && (n("LDGSTS") == 0 || n("HMMA") == 0) {
                    failures.push(format!("{name}: no cp.async copies or no mma"));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Per function of a `cuobjdump --dump-sass` listing: its name, the count of instructions
    /// whose mnemonic starts with each of `classes`, and its instruction count.
    fn sass_counts(sass: &str, classes: &[&str]) -> Vec<(String, Vec<usize>, usize)> {
        let mut out: Vec<(String, Vec<usize>, usize)> = Vec::new();
        for line in sass.lines() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix("Function : ") {
                out.push((name.trim().to_string(), vec![0; classes.len()], 0));
                continue;
            }
            // "/*0a40*/   @!P1 LDGSTS.E.BYPASS.128 [R15], ... ;"
            let Some(rest) = t.strip_prefix("/*").and_then(|r| r.split_once("*/")) else {
                continue;
            };
            let mut words = rest.1.split_whitespace();
            let Some(mut op) = words.next() else { continue };
            if op.starts_with('@') {
                let Some(o) = words.next() else { continue };
                op = o;
            }
            let Some(f) = out.last_mut() else { continue };
            f.2 += 1;
            for (i, c) in classes.iter().enumerate() {
                if op.split('.').next() == Some(c) {
                    f.1[i] += 1;
                }
            }
        }
        out
    }

    #[test]
    fn a_sass_listing_is_counted_per_function() {
        let sass = "\t\tFunction : k1\n        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n        /*0010*/              @!P1 LDGSTS.E.BYPASS.128 [R15], desc[UR8][R6.64] ;\n        /*0020*/      HMMA.16816.F32.BF16 R48, R32, R40, RZ ;\n\t\tFunction : k2\n        /*0000*/      LDG.E.128 R4, desc[UR4][R2.64] ;\n";
        let c = sass_counts(sass, &["HMMA", "LDGSTS", "LDG"]);
        assert_eq!(
            c,
            vec![
                ("k1".to_string(), vec![1, 1, 0], 3),
                ("k2".to_string(), vec![0, 0, 1], 1)
            ]
        );
    }

    /// One architecture's compile of every kernel file: the lines to print, and the failures.
    fn compile_arch(tc: &Toolchain, nvrtc: &Nvrtc, arch: &str) -> (Vec<String>, Vec<String>) {
        let (mut lines, mut failures) = (Vec::new(), Vec::new());
        let mut kernels = 0;
        for (file, src) in FILES {
            let full = source(file).expect("listed");
            let c = match nvrtc.compile(tc, file, &full, arch) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(e.to_string());
                    continue;
                }
            };
            if !c.cubin.starts_with(b"\x7fELF") {
                failures.push(format!("{file} {arch}: not an ELF cubin"));
                continue;
            }
            let usage = ptxas_usage(&c.log);
            for (name, hot) in entry_points(src) {
                let Some(u) = usage.iter().find(|u| u.0 == name) else {
                    failures.push(format!("{file} {arch}: ptxas reported nothing for {name}"));
                    continue;
                };
                kernels += 1;
                if hot {
                    lines.push(format!(
                        "  {arch} {name}: {} registers, {} bytes stack",
                        u.1, u.4
                    ));
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
        lines.push(format!("nvrtc: compiled {kernels} kernels for {arch}"));
        (lines, failures)
    }
}
