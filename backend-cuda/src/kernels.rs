//! The kernel files of `kernels/`, embedded, and the architectures kiln compiles them for.
//! Every file gets `common.cuh`, `iq_grids.cuh`, `formats.cuh` and `mat_vec.cuh` prepended. A kernel preceded
//! by a `// @hot` line is on the decode path: the compile check fails if ptxas reports register
//! spills in it.

/// `common.cuh`, prepended to every file.
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// `iq_grids.cuh`, the i-quants' lattice grids (generated), prepended after `COMMON`.
pub const IQ_GRIDS: &str = include_str!("../../kernels/iq_grids.cuh");
/// `formats.cuh`, the weight formats' loaders, prepended to every file after `IQ_GRIDS`.
pub const FORMATS: &str = include_str!("../../kernels/formats.cuh");
/// `mat_vec.cuh`, the decode mat-vec kernels' bodies, prepended after `FORMATS`.
pub const MAT_VEC: &str = include_str!("../../kernels/mat_vec.cuh");

/// (file name, source) of every kernel file. A file's name starts with its op family's stem
/// (`attention_kv_write.cu`), except `quant.cu`: the K-quant formats' per-format kernels of
/// several families (mat-vec, embedding rows, matmul by expert).
pub const FILES: &[(&str, &str)] = &[
    (
        "elementwise.cu",
        include_str!("../../kernels/elementwise.cu"),
    ),
    ("norm.cu", include_str!("../../kernels/norm.cu")),
    ("rope.cu", include_str!("../../kernels/rope.cu")),
    ("softmax.cu", include_str!("../../kernels/softmax.cu")),
    ("get_rows.cu", include_str!("../../kernels/get_rows.cu")),
    (
        "mat_mul_vec.cu",
        include_str!("../../kernels/mat_mul_vec.cu"),
    ),
    (
        "mat_mul_vec_x8.cu",
        include_str!("../../kernels/mat_mul_vec_x8.cu"),
    ),
    ("mat_mul.cu", include_str!("../../kernels/mat_mul.cu")),
    ("mat_mul_tc.cu", include_str!("../../kernels/mat_mul_tc.cu")),
    (
        "mat_mul_fused.cu",
        include_str!("../../kernels/mat_mul_fused.cu"),
    ),
    ("quant.cu", include_str!("../../kernels/quant.cu")),
    ("attention.cu", include_str!("../../kernels/attention.cu")),
    (
        "attention_kv_write.cu",
        include_str!("../../kernels/attention_kv_write.cu"),
    ),
    ("conv.cu", include_str!("../../kernels/conv.cu")),
    ("delta_net.cu", include_str!("../../kernels/delta_net.cu")),
    ("moe.cu", include_str!("../../kernels/moe.cu")),
    ("reduce.cu", include_str!("../../kernels/reduce.cu")),
    ("canvas.cu", include_str!("../../kernels/canvas.cu")),
];

/// The architectures kiln builds for: Hopper, datacenter Blackwell, consumer Blackwell.
pub const ARCHS: &[&str] = &["sm_90a", "sm_100a", "sm_120a"];

/// A file's full source as NVRTC sees it, after the tuning defines of `KILN_CUDA_DEFINES`.
pub fn source(file: &str) -> Option<String> {
    source_with(file, None)
}

/// `source` with the knobs of `spec` (`NAME=VALUE,...`, as `KILN_CUDA_DEFINES` takes them)
/// instead of the environment's, where given.
pub fn source_with(file: &str, spec: Option<&str>) -> Option<String> {
    let defines = spec.map(defines_from).unwrap_or_else(tuning_defines);
    FILES
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, s)| {
            format!(
                "{defines}#line 1 \"common.cuh\"\n{COMMON}\n#line 1 \"iq_grids.cuh\"\n{IQ_GRIDS}\n#line 1 \"formats.cuh\"\n{FORMATS}\n#line 1 \"mat_vec.cuh\"\n{MAT_VEC}\n#line 1 \"{file}\"\n{s}"
            )
        })
}

/// The kernels' tuning knobs (behind `#ifndef` in mat_vec.cuh) and the values each may take.
const TUNING_KNOBS: &[(&str, i64, i64)] = &[
    ("MV_DEPTH", 1, 8),
    ("MV_X_EARLY", 0, 1),
    ("MV_STAGED", 0, 3),
    ("MV_STAGES", 2, 4),
    ("MV_MIN_BLOCKS", 1, 16),
    // mat_mul.cu, mat_mul_tc.cu: the prefill tile on f32 FMA (0, the default) or tensor cores
    // (1), and the bf16 parts an activation takes in the codes tiles (3 exact, 2 to 2^-16 of it).
    ("MM_TC", 0, 1),
    ("MM_PARTS", 2, 3),
    // mat_mul_tc.cu: the blocks an SM must hold (its __launch_bounds__, so the registers a
    // thread).
    ("TC_BLOCKS", 1, 2),
    // Not a kernel's: the K splits of mat_mul_tc_* (plan/mat_mul.rs picks them by the tiles).
    ("TC_SPLITS", 1, 16),
    // Not a kernel's: prefill attention over f16 caches on the tensor cores (1: attention.cu's
    // paged_prefill_tc_f16_*, planned in plan/attention.rs) or the f32 FMA tile (0, the default).
    ("FA_TC", 0, 1),
    // mat_mul_vec_x8.cu: the decode mat-vec over int8 activation parts (1, the default: planned
    // for the formats that have it, plan/mat_mul.rs; 0: the f32 kernels of mat_vec.cuh), the parts a value (3 is f32's precision; fewer
    // are for measuring what the third costs), the split kernel or the staged one, the rows a
    // block (split) or warp (staged) takes, and the staged kernel's steps in flight.
    ("MV_X8", 0, 1),
    ("MVX_PARTS", 1, 3),
    ("MVX_SPLIT", 0, 1),
    ("MVX_ROWS", 1, 8),
    ("MVX_STAGES", 2, 8),
    // The tensor-core form of the Q4_K kernel (mat_vec_x8_q4_k_mma: 16 rows a block, one
    // mma.m16n8k32 a group for all of them), its warps a block, 256-value blocks in flight a
    // warp and blocks an SM (its __launch_bounds__).
    ("MVX_MMA", 0, 1),
    ("MVX_WARPS", 1, 8),
    ("MVX_DEPTH", 1, 4),
    ("MVX_BLOCKS", 1, 8),
    // Not a kernel's: 0 makes the CUDA launcher start every kernel after the one before has
    // finished (no programmatic dependent launch for the `// @pdl` kernels).
    ("PDL", 0, 1),
    // Not a kernel's: 0 makes the launch planner decline the launch-saving fusions (plan.rs:
    // the norm shared by several weights in one launch, the residual add as a mat-vec's
    // epilogue), so their before/after is one more variant of a sweep.
    ("FUSE_LAUNCHES", 0, 1),
];

thread_local! {
    /// The knobs `with_knobs` gives the calling thread instead of the environment's.
    static KNOBS_HERE: std::cell::RefCell<Option<Vec<(String, i64)>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `knob` reading the knobs of `spec` (as `KILN_CUDA_DEFINES` takes them) on this
/// thread, where given: a backend built with its own knobs (the emulator's variants) plans its
/// launches with the same knobs its kernels were compiled with.
pub fn with_knobs<T>(spec: Option<&str>, f: impl FnOnce() -> T) -> T {
    let Some(spec) = spec else { return f() };
    let before = KNOBS_HERE.with(|k| k.replace(Some(known_knobs(spec))));
    let out = f();
    KNOBS_HERE.with(|k| k.replace(before));
    out
}

/// The value `KILN_CUDA_DEFINES` gives knob `name`, if it gives a valid one (read once; or the
/// value `with_knobs` gives it on this thread).
pub fn knob(name: &str) -> Option<i64> {
    if let Some(v) = KNOBS_HERE.with(|k| {
        k.borrow()
            .as_ref()
            .map(|ks| ks.iter().find(|(n, _)| n == name).map(|&(_, v)| v))
    }) {
        return v;
    }
    static KNOBS: std::sync::OnceLock<Vec<(String, i64)>> = std::sync::OnceLock::new();
    KNOBS
        .get_or_init(|| {
            let spec = std::env::var("KILN_CUDA_DEFINES").unwrap_or_default();
            known_knobs(&spec)
        })
        .iter()
        .find(|(n, _)| n == name)
        .map(|&(_, v)| v)
}

/// The valid `NAME=VALUE` items of a `KILN_CUDA_DEFINES` spec, less combinations the kernels
/// cannot be built with (the staged x8 mat-vec's ring past 48 KiB of static shared memory:
/// then its `MVX_ROWS` and `MVX_STAGES` are dropped, with a warning).
fn known_knobs(spec: &str) -> Vec<(String, i64)> {
    let mut knobs: Vec<(String, i64)> = spec
        .split(',')
        .filter_map(|item| {
            let (n, v) = item.trim().split_once('=')?;
            let v = v.trim().parse::<i64>().ok()?;
            let &(name, lo, hi) = TUNING_KNOBS.iter().find(|k| k.0 == n.trim())?;
            (lo..=hi).contains(&v).then(|| (name.to_string(), v))
        })
        .collect();
    let get = |n: &str, default: i64, ks: &[(String, i64)]| {
        ks.iter().rev().find(|k| k.0 == n).map_or(default, |k| k.1)
    };
    if get("MVX_SPLIT", 1, &knobs) == 0 {
        // 4 warps × stages × rows × 576 bytes (mat_mul_vec_x8.cu's X8Ring).
        let ring = 4 * get("MVX_STAGES", 4, &knobs) * get("MVX_ROWS", 2, &knobs) * 576;
        if ring > 48 * 1024 {
            tracing::warn!(
                "KILN_CUDA_DEFINES: the staged x8 mat-vec's ring would take {ring} bytes (at most 49152); ignoring MVX_ROWS and MVX_STAGES"
            );
            knobs.retain(|k| k.0 != "MVX_ROWS" && k.0 != "MVX_STAGES");
        }
    }
    knobs
}

/// `KILN_CUDA_DEFINES=NAME=VALUE,...` as `#define` lines: the kernels' tuning knobs (e.g.
/// `MV_DEPTH=3`), for measuring variants without a rebuild. The cubin cache keys on the
/// source, so each variant compiles once. Unknown names and values out of range are ignored,
/// with a warning.
fn tuning_defines() -> String {
    std::env::var("KILN_CUDA_DEFINES")
        .map(|spec| defines_from(&spec))
        .unwrap_or_default()
}

fn defines_from(spec: &str) -> String {
    let known = known_knobs(spec);
    let mut out = String::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match known_knobs(item)
            .pop()
            .filter(|k| known.iter().any(|j| j.0 == k.0))
        {
            Some((n, v)) => out.push_str(&format!("#define {n} {v}\n")),
            None => tracing::warn!(
                "KILN_CUDA_DEFINES: ignoring {item:?} (known: {})",
                TUNING_KNOBS
                    .iter()
                    .map(|(n, lo, hi)| format!("{n}={lo}..{hi}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    out
}

/// The `extern "C" __global__` kernels of a file, with whether each is marked hot.
pub fn entry_points(src: &str) -> Vec<(String, bool)> {
    marked_entry_points(src)
        .into_iter()
        .map(|(n, hot, _)| (n, hot))
        .collect()
}

/// The kernels of every file marked `// @pdl` (in the comment lines above their declaration):
/// those that call `grid_wait()` before touching what earlier kernels wrote, so the launcher
/// may start them with programmatic dependent launch (common.cuh).
pub fn pdl_kernels() -> Vec<String> {
    FILES
        .iter()
        .flat_map(|(_, src)| marked_entry_points(src))
        .filter(|e| e.2)
        .map(|e| e.0)
        .collect()
}

/// The kernels of a file with whether each is marked `// @hot` and `// @pdl`.
fn marked_entry_points(src: &str) -> Vec<(String, bool, bool)> {
    let mut out = Vec::new();
    let (mut hot, mut pdl) = (false, false);
    let mut pending = false;
    for line in src.lines() {
        let l = line.trim();
        if l == "// @hot" {
            hot = true;
            continue;
        }
        if l == "// @pdl" {
            pdl = true;
            continue;
        }
        if l.starts_with("extern \"C\" __global__") {
            pending = true;
        }
        if pending {
            // The name is the identifier right before the first '(' (after any
            // __launch_bounds__(...), which may sit on the same line or the one before).
            let text = strip_launch_bounds(l);
            if let Some(at) = text.find('(') {
                let name = text[..at]
                    .split_whitespace()
                    .last()
                    .unwrap_or("")
                    .to_string();
                if !name.is_empty() && name != "__global__" && name != "void" {
                    out.push((name, hot, pdl));
                    pending = false;
                    hot = false;
                    pdl = false;
                }
            }
        }
    }
    out
}

/// `line` without a `__launch_bounds__(...)` (no nested parentheses inside).
fn strip_launch_bounds(line: &str) -> String {
    match line.find("__launch_bounds__(") {
        Some(at) => match line[at..].find(')') {
            Some(close) => format!("{}{}", &line[..at], &line[at + close + 1..]),
            None => line[..at].to_string(),
        },
        None => line.to_string(),
    }
}

/// What a pointer parameter points at, as far as the launcher's tensors are concerned.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    BF16,
    I32,
    /// Raw bytes of a block-quantized tensor (`u8` or one of `common.cuh`'s block structs).
    Bytes,
}

/// One kernel parameter.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Param {
    Ptr { elem: Elem, mutable: bool },
    U32,
    I32,
    F32,
}

/// A kernel's declaration: the file it lives in and its parameters in order.
#[derive(Clone, Debug)]
pub struct Signature {
    pub file: &'static str,
    pub params: Vec<Param>,
}

fn param_of(decl: &str) -> Option<Param> {
    let decl = decl.trim();
    // The type is everything before the parameter's name.
    let name_at = decl.rfind(|c: char| !(c.is_alphanumeric() || c == '_'))? + 1;
    let ty = decl[..name_at].trim();
    if let Some(base) = ty.strip_suffix('*') {
        let base = base.trim();
        let (mutable, base) = match base.strip_prefix("const ") {
            Some(b) => (false, b.trim()),
            None => (true, base),
        };
        let elem = match base {
            "float" => Elem::F32,
            "__half" => Elem::F16,
            "__nv_bfloat16" => Elem::BF16,
            "int" => Elem::I32,
            "u8" | "block_q8_0" | "block_q4_0" => Elem::Bytes,
            _ => return None,
        };
        return Some(Param::Ptr { elem, mutable });
    }
    match ty {
        "u32" | "unsigned int" => Some(Param::U32),
        "int" => Some(Param::I32),
        "float" => Some(Param::F32),
        _ => None,
    }
}

/// Every `extern "C" __global__` kernel's signature, by name. An error names a kernel whose
/// parameter the launcher could not pass (a type this parser does not know).
pub fn signatures() -> Result<std::collections::HashMap<String, Signature>, String> {
    let mut out = std::collections::HashMap::new();
    for (file, src) in FILES {
        let mut rest = *src;
        while let Some(at) = rest.find("extern \"C\" __global__") {
            rest = &rest[at + "extern \"C\" __global__".len()..];
            let mut head = rest.trim_start();
            if let Some(after) = head.strip_prefix("void") {
                head = after.trim_start();
            }
            if let Some(after) = head.strip_prefix("__launch_bounds__(") {
                let close = after
                    .find(')')
                    .ok_or(format!("{file}: unclosed __launch_bounds__"))?;
                head = after[close + 1..].trim_start();
                head = head.strip_prefix("void").unwrap_or(head).trim_start();
            }
            let open = head
                .find('(')
                .ok_or(format!("{file}: a kernel without parameters"))?;
            let name = head[..open].trim().to_string();
            let close = head[open..]
                .find(')')
                .ok_or(format!("{file}: {name}: unclosed parameter list"))?;
            let list = &head[open + 1..open + close];
            let params = list
                .split(',')
                .filter(|p| !p.trim().is_empty())
                .map(|p| {
                    param_of(p).ok_or(format!("{file}: {name}: unknown parameter type in {p:?}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if out
                .insert(name.clone(), Signature { file, params })
                .is_some()
            {
                return Err(format!("kernel {name} is declared twice"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_parsed_for_every_entry_point() {
        let sigs = signatures().expect("every kernel parameter has a known type");
        let mut n = 0;
        for (file, src) in FILES {
            for (name, _) in entry_points(src) {
                let s = sigs
                    .get(&name)
                    .unwrap_or_else(|| panic!("{file}: no signature for {name}"));
                assert_eq!(s.file, *file);
                assert!(!s.params.is_empty(), "{name}");
                n += 1;
            }
        }
        assert_eq!(
            n,
            sigs.len(),
            "signatures found that entry_points does not list"
        );
        let rms = &sigs["rms_norm_f32"].params;
        assert_eq!(
            rms,
            &[
                Param::Ptr {
                    elem: Elem::F32,
                    mutable: false
                },
                Param::Ptr {
                    elem: Elem::F32,
                    mutable: false
                },
                Param::Ptr {
                    elem: Elem::F32,
                    mutable: true
                },
                Param::U32,
                Param::F32,
                Param::U32
            ]
        );
        let pd = &sigs["paged_decode_f16"].params;
        assert_eq!(
            pd[1],
            Param::Ptr {
                elem: Elem::F16,
                mutable: false
            }
        );
        assert_eq!(pd.len(), 19);
        assert_eq!(
            sigs["mat_vec_q8_0"].params[1],
            Param::Ptr {
                elem: Elem::Bytes,
                mutable: false
            }
        );
    }
}

#[cfg(test)]
mod tuning_tests {
    use super::defines_from;

    #[test]
    fn only_known_knobs_in_range_become_defines() {
        assert_eq!(
            defines_from("MV_DEPTH=3, MV_X_EARLY=0"),
            "#define MV_DEPTH 3\n#define MV_X_EARLY 0\n"
        );
        // Unknown names, out-of-range values, junk and injection attempts are dropped.
        assert_eq!(
            defines_from("MV_DEPTH=0,MV_ROWS=8,FOO=1,MV_X_EARLY=2,MV_DEPTH=x,=3,MV_DEPTH=2\n#x"),
            ""
        );
        assert_eq!(defines_from(""), "");
    }
}

#[cfg(test)]
mod pdl_tests {
    use super::*;

    /// The kernels started with programmatic dependent launch are the marked ones, and each
    /// file that marks one waits for the kernel before (`grid_wait`) — and the knobs a backend
    /// is given on its thread are the ones its planner reads.
    #[test]
    fn the_marked_kernels_are_started_early_and_wait() {
        let mut pdl = pdl_kernels();
        pdl.sort();
        assert_eq!(
            pdl,
            ["mat_vec_x8_q4_k", "mat_vec_x8_q4_k_mma", "quantize_x8"]
        );
        for (file, src) in FILES {
            let marks = marked_entry_points(src).iter().filter(|e| e.2).count();
            let waits = src.matches("grid_wait();").count();
            assert!(
                marks == 0 || waits >= marks,
                "{file}: {marks} kernels marked @pdl, {waits} calls of grid_wait"
            );
        }
        assert_eq!(
            with_knobs(Some("MV_X8=1,PDL=0"), || (knob("MV_X8"), knob("PDL"))),
            (Some(1), Some(0))
        );
        assert_eq!(with_knobs(Some("MVX_PARTS=9"), || knob("MVX_PARTS")), None);
        // A staged ring past 48 KiB is not built: its sizes fall back to the defaults.
        assert_eq!(
            with_knobs(Some("MVX_SPLIT=0,MVX_ROWS=8,MVX_STAGES=8"), || (
                knob("MVX_SPLIT"),
                knob("MVX_ROWS"),
                knob("MVX_STAGES")
            )),
            (Some(0), None, None)
        );
        assert!(!defines_from("MVX_SPLIT=0,MVX_ROWS=8").contains("MVX_ROWS"));
        assert!(defines_from("MVX_SPLIT=0,MVX_ROWS=4").contains("#define MVX_ROWS 4"));
    }
}
