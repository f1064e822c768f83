//! Every kernel entry point, declared once. A kernel is an entry point in one WGSL family
//! file of `shaders/`, with the shared helpers of `shaders/common/` it needs prepended and,
//! for the dtype-templated families, its placeholders filled in (`ENTRY`, the entry point's
//! name; `DQ32`, the weight format's chunk decoder; `KFMT`/`VFMT`/`FMT_CODE`, the KV cache
//! formats).

use kiln_core::tensor::DType;

const DEQUANT: &str = include_str!("../../shaders/common/dequant.wgsl");
const FLOAT_ROWS: &str = include_str!("../../shaders/common/float_rows.wgsl");
const DOT: &str = include_str!("../../shaders/common/dot.wgsl");
const ORDER: &str = include_str!("../../shaders/common/order.wgsl");
const TURBO: &str = include_str!("../../shaders/common/turbo.wgsl");
const MAT_MUL_IO: &str = include_str!("../../shaders/common/mat_mul_io.wgsl");
const MAT_VEC: &str = include_str!("../../shaders/mat_vec.wgsl");
const MAT_MUL: &str = include_str!("../../shaders/mat_mul.wgsl");
const MAT_MUL_TILED: &str = include_str!("../../shaders/mat_mul_tiled.wgsl");
const GET_ROWS: &str = include_str!("../../shaders/get_rows.wgsl");
const ELEMENTWISE: &str = include_str!("../../shaders/elementwise.wgsl");
const COPY: &str = include_str!("../../shaders/copy.wgsl");
const NORM: &str = include_str!("../../shaders/norm.wgsl");
const ROPE: &str = include_str!("../../shaders/rope.wgsl");
const ATTENTION: &str = include_str!("../../shaders/attention.wgsl");
const ATTENTION_COMBINE: &str = include_str!("../../shaders/attention_combine.wgsl");
const KV_WRITE: &str = include_str!("../../shaders/kv_write.wgsl");
const REDUCE: &str = include_str!("../../shaders/reduce.wgsl");
const SOFTMAX: &str = include_str!("../../shaders/softmax.wgsl");
const CONV: &str = include_str!("../../shaders/conv.wgsl");
const DELTA_NET: &str = include_str!("../../shaders/delta_net.wgsl");
const MOE: &str = include_str!("../../shaders/moe.wgsl");
const MOE_SUM: &str = include_str!("../../shaders/moe_sum.wgsl");
const MAT_MUL_ID: &str = include_str!("../../shaders/mat_mul_id.wgsl");
const CANVAS_HASH: &str = include_str!("../../shaders/common/canvas_hash.wgsl");
const CANVAS: &str = include_str!("../../shaders/canvas.wgsl");
const CANVAS_ACCEPT: &str = include_str!("../../shaders/canvas_accept.wgsl");

/// One compute entry point and how to build its module.
pub struct Kernel {
    /// Entry point name, `<op>_<dtype>[_<variant>]`; also the pipeline cache key.
    pub entry: &'static str,
    /// The family file in `shaders/` (without `.wgsl`).
    pub file: &'static str,
    source: &'static str,
    commons: &'static [&'static str],
    subst: &'static [(&'static str, &'static str)],
}

impl Kernel {
    /// The complete WGSL module for this entry point.
    pub fn source(&self) -> String {
        let mut s = String::new();
        for c in self.commons {
            s.push_str(c);
            s.push('\n');
        }
        let mut body = self.source.to_string();
        for (from, to) in self.subst {
            body = body.replace(from, to);
        }
        s.push_str(&body);
        s
    }
}

macro_rules! plain {
    ($name:ident, $entry:literal, $file:literal, $src:ident) => {
        pub const $name: Kernel = Kernel {
            entry: $entry,
            file: $file,
            source: $src,
            commons: &[],
            subst: &[],
        };
    };
}

macro_rules! ranked {
    ($name:ident, $entry:literal, $file:literal, $src:ident) => {
        pub const $name: Kernel = Kernel {
            entry: $entry,
            file: $file,
            source: $src,
            commons: &[ORDER],
            subst: &[],
        };
    };
}

/// A kernel of a per-format family: entry `<family>_<format>`, the format's chunk decoder
/// (`DQ32` ← `dq32_<format>`) filled in; the decoders prepended, or the commons given.
macro_rules! weighted {
    ($family:literal, $format:literal, $src:ident) => {
        weighted!($family, $format, $src, DEQUANT, FLOAT_ROWS)
    };
    ($family:literal, $format:literal, $src:ident, $($common:ident),+) => {
        Kernel {
            entry: concat!($family, "_", $format),
            file: $family,
            source: $src,
            commons: &[$($common),+],
            subst: &[
                ("ENTRY", concat!($family, "_", $format)),
                ("DQ32", concat!("dq32_", $format)),
            ],
        }
    };
}

/// The per-format kernel tables, all from one list of the weight formats WGSL decodes (the
/// dtype and its name in entry points): one kernel per format in each table, in that order.
macro_rules! per_format {
    ($($dtype:ident $format:literal),* $(,)?) => {
        /// The weight formats of the per-format tables, in their order.
        pub const FORMATS: &[DType] = &[$(DType::$dtype),*];
        /// `mat_vec_<format>`: one activation row times a weight matrix (decode).
        pub const MAT_VEC_KERNELS: &[Kernel] = &[$(Kernel {
            entry: concat!("mat_vec_", $format),
            file: "mat_vec",
            source: MAT_VEC,
            commons: &[DEQUANT, DOT],
            subst: &[
                ("ENTRY", concat!("mat_vec_", $format)),
                ("DOT32", concat!("dot32_", $format)),
            ],
        }),*];
        /// `mat_mul_<format>`: tiled matrix product (prefill).
        pub const MAT_MUL_KERNELS: &[Kernel] = &[$(weighted!("mat_mul", $format, MAT_MUL, DEQUANT, FLOAT_ROWS, MAT_MUL_IO)),*];
        /// `mat_mul_tiled_<format>`: workgroup-tiled matrix product (prefill of many tokens).
        pub const MAT_MUL_TILED_KERNELS: &[Kernel] =
            &[$(weighted!("mat_mul_tiled", $format, MAT_MUL_TILED, DEQUANT, FLOAT_ROWS, MAT_MUL_IO)),*];
        /// `get_rows_<format>`: rows of a table (embeddings), dequantized.
        pub const GET_ROWS_KERNELS: &[Kernel] = &[$(weighted!("get_rows", $format, GET_ROWS)),*];
        /// `mat_mul_id_<format>`: each token's rows through its chosen experts.
        pub const MAT_MUL_ID_KERNELS: &[Kernel] =
            &[$(weighted!("mat_mul_id", $format, MAT_MUL_ID)),*];
    };
}

per_format!(
    F32 "f32",
    F16 "f16",
    BF16 "bf16",
    Q4_0 "q4_0",
    Q4_1 "q4_1",
    Q5_0 "q5_0",
    Q5_1 "q5_1",
    Q8_0 "q8_0",
    Q2_K "q2_k",
    Q3_K "q3_k",
    Q4_K "q4_k",
    Q5_K "q5_k",
    Q6_K "q6_k",
    Q8_K "q8_k",
    MXFP4 "mxfp4",
    NVFP4 "nvfp4",
);

plain!(ADD_F32, "add_f32", "elementwise", ELEMENTWISE);
plain!(MUL_F32, "mul_f32", "elementwise", ELEMENTWISE);
plain!(SCALE_F32, "scale_f32", "elementwise", ELEMENTWISE);
plain!(SILU_F32, "silu_f32", "elementwise", ELEMENTWISE);
plain!(GELU_TANH_F32, "gelu_tanh_f32", "elementwise", ELEMENTWISE);
plain!(SIGMOID_F32, "sigmoid_f32", "elementwise", ELEMENTWISE);
plain!(SOFTPLUS_F32, "softplus_f32", "elementwise", ELEMENTWISE);
plain!(EXP_F32, "exp_f32", "elementwise", ELEMENTWISE);
plain!(NEG_F32, "neg_f32", "elementwise", ELEMENTWISE);
plain!(TANH_F32, "tanh_f32", "elementwise", ELEMENTWISE);
plain!(SWIGLU_F32, "swiglu_f32", "elementwise", ELEMENTWISE);
plain!(GEGLU_F32, "geglu_f32", "elementwise", ELEMENTWISE);

plain!(COPY_U32, "copy_u32", "copy", COPY);
plain!(CAST_F16_F32, "cast_f16_f32", "copy", COPY);
plain!(CAST_BF16_F32, "cast_bf16_f32", "copy", COPY);

plain!(RMS_NORM_F32, "rms_norm_f32", "norm", NORM);
plain!(L2_NORM_F32, "l2_norm_f32", "norm", NORM);
plain!(ROPE_F32, "rope_f32", "rope", ROPE);
plain!(SOFTMAX_F32, "softmax_f32", "softmax", SOFTMAX);
ranked!(ARGMAX_F32, "argmax_f32", "reduce", REDUCE);
ranked!(TOP_K_F32, "top_k_f32", "reduce", REDUCE);

/// The KV cache tables, from one list of the cache formats WGSL reads and writes (the dtype,
/// its name in entry points, its code in shaders/common/turbo.wgsl), in code order.
macro_rules! kv_formats {
    (@go $all:tt $($dtype:ident $name:literal $code:literal),* $(,)?) => {
        /// The cache formats of the KV tables, in their order.
        pub const KV_FORMATS: &[DType] = &[$(DType::$dtype),*];
        /// `paged_attention_<k>_<v>`, indexed by K format then V format.
        pub const PAGED_ATTENTION_KERNELS: &[&[Kernel]] =
            &[$(kv_formats!(@row $name $code $all)),*];
        /// `kv_write_<format>`: rows into a cache by slot.
        pub const KV_WRITE_KERNELS: &[Kernel] = &[$(Kernel {
            entry: concat!("kv_write_", $name),
            file: "kv_write",
            source: KV_WRITE,
            commons: &[TURBO],
            subst: &[("ENTRY", concat!("kv_write_", $name)), ("FMT_CODE", $code)],
        }),*];
    };
    (@row $kn:literal $kc:literal [$($vd:ident $vn:literal $vc:literal),* $(,)?]) => {
        &[$(Kernel {
            entry: concat!("paged_attention_", $kn, "_", $vn),
            file: "attention",
            source: ATTENTION,
            commons: &[TURBO],
            subst: &[
                ("ENTRY", concat!("paged_attention_", $kn, "_", $vn)),
                ("KFMT", $kc),
                ("VFMT", $vc),
            ],
        }),*]
    };
    // Last: it would match the internal rules' calls too.
    ($($t:tt)*) => {
        kv_formats!(@go [$($t)*] $($t)*);
    };
}

kv_formats!(
    F32 "f32" "0u",
    F16 "f16" "1u",
    BF16 "bf16" "2u",
    Q8_0 "q8_0" "3u",
    Q4_0 "q4_0" "4u",
    TQ4 "tq4" "5u",
    TQ3 "tq3" "6u",
    TQ2 "tq2" "7u",
);

plain!(
    PAGED_ATTENTION_COMBINE,
    "paged_attention_combine",
    "attention_combine",
    ATTENTION_COMBINE
);
plain!(CONV1D_F32, "conv1d_f32", "conv", CONV);
plain!(CONV1D_STATE_F32, "conv1d_state_f32", "conv", CONV);
plain!(DELTA_NET_F32, "delta_net_f32", "delta_net", DELTA_NET);
ranked!(MOE_ROUTE_F32, "moe_route_f32", "moe", MOE);
plain!(MOE_SUM_F32, "moe_sum_f32", "moe_sum", MOE_SUM);
pub const CANVAS_DRAW_F32: Kernel = Kernel {
    entry: "canvas_draw_f32",
    file: "canvas",
    source: CANVAS,
    commons: &[ORDER, CANVAS_HASH],
    subst: &[],
};
pub const CANVAS_ACCEPT_I32: Kernel = Kernel {
    entry: "canvas_accept",
    file: "canvas_accept",
    source: CANVAS_ACCEPT,
    commons: &[CANVAS_HASH],
    subst: &[],
};

/// The kernels of no weight format.
const PLAIN: &[&Kernel] = &[
    &ADD_F32,
    &MUL_F32,
    &SCALE_F32,
    &SILU_F32,
    &GELU_TANH_F32,
    &SIGMOID_F32,
    &SOFTPLUS_F32,
    &EXP_F32,
    &NEG_F32,
    &TANH_F32,
    &SWIGLU_F32,
    &GEGLU_F32,
    &COPY_U32,
    &CAST_F16_F32,
    &CAST_BF16_F32,
    &RMS_NORM_F32,
    &L2_NORM_F32,
    &ROPE_F32,
    &SOFTMAX_F32,
    &ARGMAX_F32,
    &TOP_K_F32,
    &PAGED_ATTENTION_COMBINE,
    &CONV1D_F32,
    &CONV1D_STATE_F32,
    &DELTA_NET_F32,
    &MOE_ROUTE_F32,
    &MOE_SUM_F32,
    &CANVAS_DRAW_F32,
    &CANVAS_ACCEPT_I32,
];

/// Every declared kernel, the plain ones then each per-format table (a test builds each
/// module and finds each entry point).
pub fn all() -> impl Iterator<Item = &'static Kernel> {
    let tables = [
        MAT_VEC_KERNELS,
        MAT_MUL_KERNELS,
        MAT_MUL_TILED_KERNELS,
        GET_ROWS_KERNELS,
        MAT_MUL_ID_KERNELS,
    ];
    PLAIN
        .iter()
        .copied()
        .chain(tables.into_iter().flatten())
        .chain(PAGED_ATTENTION_KERNELS.iter().copied().flatten())
        .chain(KV_WRITE_KERNELS)
}

/// The index of a KV cache dtype in the KV tables.
fn kv_format(t: DType) -> Option<usize> {
    KV_FORMATS.iter().position(|&d| d == t)
}

/// The paged attention kernel for K and V caches of these dtypes.
pub fn paged_attention(k: DType, v: DType) -> Option<&'static Kernel> {
    PAGED_ATTENTION_KERNELS
        .get(kv_format(k)?)?
        .get(kv_format(v)?)
}

/// The KV write kernel for a cache dtype.
pub fn kv_write(t: DType) -> Option<&'static Kernel> {
    KV_WRITE_KERNELS.get(kv_format(t)?)
}

/// The index of `w` in the per-format tables.
fn format(w: DType) -> Option<usize> {
    FORMATS.iter().position(|&d| d == w)
}

/// The matmul kernel for a weight dtype.
pub fn mat_mul(w: DType) -> Option<&'static Kernel> {
    MAT_MUL_KERNELS.get(format(w)?)
}

/// The workgroup-tiled matmul kernel for a weight dtype (many tokens).
pub fn mat_mul_tiled(w: DType) -> Option<&'static Kernel> {
    MAT_MUL_TILED_KERNELS.get(format(w)?)
}

/// The embedding-lookup kernel for a table dtype.
pub fn get_rows(w: DType) -> Option<&'static Kernel> {
    GET_ROWS_KERNELS.get(format(w)?)
}

/// The matmul-by-expert-id kernel for a weight dtype.
pub fn mat_mul_id(w: DType) -> Option<&'static Kernel> {
    MAT_MUL_ID_KERNELS.get(format(w)?)
}

/// The decode (one token) matvec kernel for a weight dtype; it reads whole 32-element chunks,
/// so it serves only rows whose length is a multiple of 32.
pub fn mat_vec(w: DType) -> Option<&'static Kernel> {
    MAT_VEC_KERNELS.get(format(w)?)
}
