//! Compiling `kernels/*.cu` with NVRTC for one exact architecture, with no GPU needed.
//!
//! NVRTC is loaded from a path (not only from the loader's search path), so the PyPI wheels
//! `nvidia-cuda-nvrtc`, `nvidia-cuda-runtime` and `nvidia-cuda-cccl` unpacked in any folder
//! work as well as a CUDA toolkit. [`Toolchain::find`] looks, in order, in `KILN_CUDA_ROOT`,
//! `CUDA_HOME`, `CUDA_PATH` and `/usr/local/cuda`, and says exactly what is missing.
//! Compiled cubins are cached on disk, keyed by a hash of the source, the options, the
//! architecture and the NVRTC version.

use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};

use kiln_core::{Error, Result};

/// Headers kiln's kernels include.
pub const HEADERS: &[&str] = &["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_fp4.h"];

/// Where the CUDA pieces were found.
#[derive(Clone, Debug)]
pub struct Toolchain {
    /// The NVRTC shared library.
    pub nvrtc: PathBuf,
    /// `-I` folders: the CUDA headers, and CCCL's (for `nv/target`).
    pub includes: Vec<PathBuf>,
}

fn nvrtc_in(dir: &Path) -> Option<PathBuf> {
    [
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so",
        "nvrtc64_130_0.dll",
        "nvrtc64_120_0.dll",
    ]
    .iter()
    .map(|n| dir.join(n))
    .find(|p| p.is_file())
}

impl Toolchain {
    /// Finds NVRTC and the headers; the error names the roots tried and what each lacked.
    pub fn find() -> Result<Toolchain> {
        let mut roots: Vec<PathBuf> = Vec::new();
        for var in ["KILN_CUDA_ROOT", "CUDA_HOME", "CUDA_PATH"] {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                roots.push(PathBuf::from(v));
            }
        }
        roots.push(PathBuf::from("/usr/local/cuda"));
        let mut notes = Vec::new();
        for root in &roots {
            match Self::at(root) {
                Ok(t) => return Ok(t),
                Err(why) => notes.push(format!("{}: {why}", root.display())),
            }
        }
        Err(Error::NotAvailable(format!(
            "cuda: no usable NVRTC toolchain ({}). Set KILN_CUDA_ROOT to a CUDA toolkit, or to \
             nvidia/cu13 of the PyPI packages nvidia-cuda-nvrtc, nvidia-cuda-runtime and \
             nvidia-cuda-cccl installed with pip --target",
            notes.join("; ")
        )))
    }

    /// The toolchain under one root, or what it lacks.
    pub fn at(root: &Path) -> std::result::Result<Toolchain, String> {
        if !root.is_dir() {
            return Err("no such folder".into());
        }
        let nvrtc = ["lib64", "lib", "bin"]
            .iter()
            .find_map(|d| nvrtc_in(&root.join(d)))
            .ok_or("no libnvrtc in lib64/, lib/ or bin/ (package nvidia-cuda-nvrtc)")?;
        let inc = root.join("include");
        let missing: Vec<&str> = HEADERS
            .iter()
            .copied()
            .filter(|h| !inc.join(h).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "include/ lacks {} (package nvidia-cuda-runtime)",
                missing.join(", ")
            ));
        }
        let cccl = [inc.join("cccl"), inc.clone()]
            .into_iter()
            .find(|d| d.join("nv").join("target").is_file())
            .ok_or("no nv/target header in include/cccl or include (package nvidia-cuda-cccl)")?;
        let mut includes = vec![inc];
        if !includes.contains(&cccl) {
            includes.push(cccl);
        }
        Ok(Toolchain { nvrtc, includes })
    }
}

type Program = *mut std::ffi::c_void;

/// The NVRTC entry points kiln uses, loaded from the library file.
pub struct Nvrtc {
    _lib: libloading::Library,
    version: (i32, i32),
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
}

/// A compiled kernel file.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// NVRTC's and ptxas's messages (with `-Xptxas=-v`: registers and spills per kernel).
    pub log: String,
}

impl Nvrtc {
    pub fn load(path: &Path) -> Result<Nvrtc> {
        let na = |e: String| Error::NotAvailable(format!("cuda: {}: {e}", path.display()));
        // SAFETY: NVRTC's initialisers are well-behaved; the symbols below are looked up by
        // their documented names and called with their documented C signatures.
        unsafe {
            let lib = libloading::Library::new(path).map_err(|e| na(e.to_string()))?;
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get($name).map_err(|e| na(e.to_string()))?
                };
            }
            let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int =
                sym!(b"nvrtcVersion\0");
            let (mut major, mut minor) = (0, 0);
            version_fn(&mut major, &mut minor);
            Ok(Nvrtc {
                version: (major, minor),
                create: sym!(b"nvrtcCreateProgram\0"),
                compile: sym!(b"nvrtcCompileProgram\0"),
                destroy: sym!(b"nvrtcDestroyProgram\0"),
                log_size: sym!(b"nvrtcGetProgramLogSize\0"),
                log: sym!(b"nvrtcGetProgramLog\0"),
                cubin_size: sym!(b"nvrtcGetCUBINSize\0"),
                cubin: sym!(b"nvrtcGetCUBIN\0"),
                _lib: lib,
            })
        }
    }

    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Compiles `source` (named `name` in messages) to a cubin for `arch` (e.g. "sm_90a").
    pub fn compile(
        &self,
        tc: &Toolchain,
        name: &str,
        source: &str,
        arch: &str,
    ) -> Result<Compiled> {
        let err = |m: String| Error::Backend {
            backend: "cuda".into(),
            msg: format!("nvrtc {name} ({arch}): {m}"),
        };
        let src = CString::new(source).map_err(|_| err("a NUL byte in the source".into()))?;
        let cname = CString::new(name).map_err(|_| err("a NUL byte in the name".into()))?;
        let mut opts: Vec<String> = vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            "--device-as-default-execution-space".into(),
            "-Xptxas=-v".into(),
        ];
        opts.extend(tc.includes.iter().map(|i| format!("-I{}", i.display())));
        let copts: Vec<CString> = opts
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| err("a NUL byte in an option".into()))?;
        let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: every pointer passed lives until the calls return; the program is destroyed
        // on every path.
        unsafe {
            let mut prog: Program = std::ptr::null_mut();
            let rc = (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if rc != 0 {
                return Err(err(format!("nvrtcCreateProgram failed ({rc})")));
            }
            let rc = (self.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr());
            let mut n = 0usize;
            let log = if (self.log_size)(prog, &mut n) == 0 && n > 1 {
                let mut buf = vec![0u8; n];
                (self.log)(prog, buf.as_mut_ptr() as *mut c_char);
                String::from_utf8_lossy(&buf[..n - 1]).into_owned()
            } else {
                String::new()
            };
            if rc != 0 {
                (self.destroy)(&mut prog);
                return Err(err(format!("compile error ({rc}):\n{log}")));
            }
            let mut size = 0usize;
            if (self.cubin_size)(prog, &mut size) != 0 || size == 0 {
                (self.destroy)(&mut prog);
                return Err(err("no cubin".into()));
            }
            let mut cubin = vec![0u8; size];
            let rc = (self.cubin)(prog, cubin.as_mut_ptr() as *mut c_char);
            (self.destroy)(&mut prog);
            if rc != 0 {
                return Err(err(format!("nvrtcGetCUBIN failed ({rc})")));
            }
            Ok(Compiled { cubin, log })
        }
    }

    /// `compile`, through an on-disk cache in `dir` keyed by the source, the options'
    /// inputs, the architecture and the NVRTC version.
    pub fn compile_cached(
        &self,
        tc: &Toolchain,
        dir: &Path,
        name: &str,
        source: &str,
        arch: &str,
    ) -> Result<Vec<u8>> {
        let key = fnv1a(&[
            source.as_bytes(),
            arch.as_bytes(),
            format!("{:?}{:?}", self.version, tc.includes).as_bytes(),
        ]);
        let path = dir.join(arch).join(format!("{name}-{key:016x}.cubin"));
        if let Ok(bytes) = std::fs::read(&path) {
            return Ok(bytes);
        }
        let c = self.compile(tc, name, source, arch)?;
        // A cache that cannot be written only costs a recompile next time.
        if std::fs::create_dir_all(path.parent().unwrap_or(dir)).is_ok() {
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, &c.cubin).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        Ok(c.cubin)
    }
}

/// 64-bit FNV-1a over the parts.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in p.iter().chain(&[0xff]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Per kernel, from a `-Xptxas=-v` log: (name, registers, spill store bytes, spill load
/// bytes, stack frame bytes).
pub fn ptxas_usage(log: &str) -> Vec<(String, u32, u32, u32, u32)> {
    let mut out = Vec::new();
    let mut current: Option<(String, u32, u32, u32)> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = Some((rest.trim().to_string(), 0, 0, 0));
        } else if line.contains("bytes spill stores") {
            let nums: Vec<u32> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect();
            if let (Some(c), [stack, stores, loads, ..]) = (current.as_mut(), nums.as_slice()) {
                c.1 = *stores;
                c.2 = *loads;
                c.3 = *stack;
            }
        } else if let Some(rest) = line.split("Used ").nth(1) {
            let regs = rest
                .split_whitespace()
                .next()
                .and_then(|w| w.parse().ok())
                .unwrap_or(0);
            if let Some((name, st, ld, stack)) = current.take() {
                out.push((name, regs, st, ld, stack));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_log_is_read_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'k1' for 'sm_90a'\nptxas info    : Function properties for k1\n    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\nptxas info    : Used 40 registers, used 0 barriers, 380 bytes cmem[0]\nptxas info    : Function properties for k2\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info    : Used 12 registers\n";
        assert_eq!(
            ptxas_usage(log),
            vec![
                ("k1".to_string(), 40, 8, 4, 16),
                ("k2".to_string(), 12, 0, 0, 0)
            ]
        );
    }

    #[test]
    fn a_missing_root_says_what_is_missing() {
        let e = Toolchain::at(Path::new("/nonexistent/cuda")).unwrap_err();
        assert!(e.contains("no such folder"), "{e}");
        let tmp = std::env::temp_dir().join(format!("kiln-cuda-root-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("lib")).unwrap();
        std::fs::write(tmp.join("lib/libnvrtc.so.13"), b"").unwrap();
        std::fs::create_dir_all(tmp.join("include")).unwrap();
        std::fs::write(tmp.join("include/cuda_fp16.h"), b"").unwrap();
        let e = Toolchain::at(&tmp).unwrap_err();
        assert!(
            e.contains("cuda_bf16.h") && e.contains("nvidia-cuda-runtime"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
