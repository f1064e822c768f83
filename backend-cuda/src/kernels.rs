//! The kernel files of `kernels/`, embedded, and the architectures kiln compiles them for.
//! Every file gets `common.cuh` prepended. A kernel preceded by a `// @hot` line is on the
//! decode path: the compile check fails if ptxas reports register spills in it.

/// `common.cuh`, prepended to every file.
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// (file name, source) of every kernel file.
pub const FILES: &[(&str, &str)] = &[
    (
        "elementwise.cu",
        include_str!("../../kernels/elementwise.cu"),
    ),
    ("norm.cu", include_str!("../../kernels/norm.cu")),
    ("rope.cu", include_str!("../../kernels/rope.cu")),
    ("softmax.cu", include_str!("../../kernels/softmax.cu")),
    ("get_rows.cu", include_str!("../../kernels/get_rows.cu")),
    ("mat_vec.cu", include_str!("../../kernels/mat_vec.cu")),
    ("mat_mul.cu", include_str!("../../kernels/mat_mul.cu")),
    ("kv_write.cu", include_str!("../../kernels/kv_write.cu")),
    (
        "paged_attention.cu",
        include_str!("../../kernels/paged_attention.cu"),
    ),
    ("recurrent.cu", include_str!("../../kernels/recurrent.cu")),
    ("moe.cu", include_str!("../../kernels/moe.cu")),
    ("quant_k.cu", include_str!("../../kernels/quant_k.cu")),
];

/// The architectures kiln builds for: Hopper, datacenter Blackwell, consumer Blackwell.
pub const ARCHS: &[&str] = &["sm_90a", "sm_100a", "sm_120a"];

/// A file's full source as NVRTC sees it.
pub fn source(file: &str) -> Option<String> {
    FILES
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, s)| format!("#line 1 \"common.cuh\"\n{COMMON}\n#line 1 \"{file}\"\n{s}"))
}

/// The `extern "C" __global__` kernels of a file, with whether each is marked hot.
pub fn entry_points(src: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut hot = false;
    let mut pending = false;
    for line in src.lines() {
        let l = line.trim();
        if l == "// @hot" {
            hot = true;
            continue;
        }
        if l.starts_with("extern \"C\" __global__") {
            pending = true;
        }
        if pending {
            // The name is the identifier right before the first '(' (after any
            // __launch_bounds__(...), which may sit on the same line or the one before).
            let text = l.replace("__launch_bounds__(DECODE_WARPS * WARP)", "");
            if let Some(at) = text.find('(') {
                let name = text[..at]
                    .split_whitespace()
                    .last()
                    .unwrap_or("")
                    .to_string();
                if !name.is_empty() && name != "__global__" && name != "void" {
                    out.push((name, hot));
                    pending = false;
                    hot = false;
                }
            }
        }
    }
    out
}
