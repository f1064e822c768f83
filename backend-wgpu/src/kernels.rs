//! Every kernel entry point, declared once. A kernel is an entry point in one WGSL family
//! file of `shaders/`, with the shared helpers of `shaders/common/` it needs prepended and,
//! for the dtype-templated families, its placeholders filled in (`ENTRY`, the entry point's
//! name; `DQ32`, the weight format's chunk decoder; `KFMT`/`VFMT`/`FMT_CODE`, the KV cache
//! formats).

use kiln_core::tensor::DType;

const DEQUANT: &str = include_str!("../../shaders/common/dequant.wgsl");
const FLOAT_ROWS: &str = include_str!("../../shaders/common/float_rows.wgsl");
const DOT: &str = include_str!("../../shaders/common/dot.wgsl");
/// The decoders with the grid i-quants' and the ternary formats' (`iquant.wgsl`), for those
/// formats' kernels only: they declare the grid table's binding.
const DEQUANT_IQ: &str = concat!(
    include_str!("../../shaders/common/dequant.wgsl"),
    "\n",
    include_str!("../../shaders/common/iquant.wgsl"),
);
/// `dot.wgsl` with those formats' chunk dots.
const DOT_IQ: &str = concat!(
    include_str!("../../shaders/common/dot.wgsl"),
    "\n",
    include_str!("../../shaders/common/iquant_dot.wgsl"),
);
pub(crate) const ORDER: &str = include_str!("../../shaders/common/order.wgsl");
const TURBO: &str = include_str!("../../shaders/common/turbo.wgsl");
const MAT_MUL_IO: &str = include_str!("../../shaders/common/mat_mul_io.wgsl");
const MAT_VEC: &str = include_str!("../../shaders/mat_mul_vec.wgsl");
const MAT_MUL: &str = include_str!("../../shaders/mat_mul.wgsl");
const MAT_MUL_TILED: &str = include_str!("../../shaders/mat_mul_tiled.wgsl");
const GET_ROWS: &str = include_str!("../../shaders/get_rows.wgsl");
const ATTENTION: &str = include_str!("../../shaders/attention.wgsl");
const KV_WRITE: &str = include_str!("../../shaders/attention_kv_write.wgsl");
const MAT_MUL_ID: &str = include_str!("../../shaders/moe_mat_mul_id.wgsl");
pub(crate) const CANVAS_HASH: &str = include_str!("../../shaders/common/canvas_hash.wgsl");

/// One compute entry point and how to build its module.
pub struct Kernel {
    /// Entry point name, `<op>_<dtype>[_<variant>]`; also the pipeline cache key.
    pub entry: &'static str,
    /// The family file in `shaders/` (without `.wgsl`).
    pub file: &'static str,
    pub(crate) source: &'static str,
    pub(crate) commons: &'static [&'static str],
    pub(crate) subst: &'static [(&'static str, &'static str)],
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

/// A kernel of no weight format, with no commons: `plain!(NAME, "entry", "file", SOURCE)`.
macro_rules! plain {
    ($name:ident, $entry:literal, $file:literal, $src:ident) => {
        pub const $name: $crate::kernels::Kernel = $crate::kernels::Kernel {
            entry: $entry,
            file: $file,
            source: $src,
            commons: &[],
            subst: &[],
        };
    };
}

/// A kernel with the total-order helpers prepended.
macro_rules! ranked {
    ($name:ident, $entry:literal, $file:literal, $src:ident) => {
        pub const $name: $crate::kernels::Kernel = $crate::kernels::Kernel {
            entry: $entry,
            file: $file,
            source: $src,
            commons: &[$crate::kernels::ORDER],
            subst: &[],
        };
    };
}

pub(crate) use {plain, ranked};

/// A kernel of a per-format family: entry `<family>_<format>`, the format's chunk decoder
/// (`DQ32` ← `dq32_<format>`) filled in; the decoders prepended, or the commons given. The
/// file is the entry's family unless named (`file = "..."` first).
macro_rules! weighted {
    (file = $file:literal, $family:literal, $format:literal, $src:ident $(, $common:ident)*) => {
        Kernel {
            file: $file,
            ..weighted!($family, $format, $src $(, $common)*)
        }
    };
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
/// The formats after `grids:` get the grid decoders (`DEQUANT_IQ`, `DOT_IQ`).
macro_rules! per_format {
    (@emit $($dtype:ident $format:literal $dq:ident $dot:ident,)*) => {
        /// The weight formats of the per-format tables, in their order.
        pub const FORMATS: &[DType] = &[$(DType::$dtype),*];
        /// `mat_vec_<format>`: one activation row times a weight matrix (decode), a residual added
        /// where given.
        pub const MAT_VEC_KERNELS: &[Kernel] = &[$(Kernel {
            entry: concat!("mat_vec_", $format),
            file: "mat_mul_vec",
            source: MAT_VEC,
            commons: &[$dq, $dot],
            subst: &[
                ("ENTRY", concat!("mat_vec_", $format)),
                ("DOT32", concat!("dot32_", $format)),
            ],
        }),*];
        /// `mat_mul_<format>`: tiled matrix product (prefill).
        pub const MAT_MUL_KERNELS: &[Kernel] = &[$(weighted!("mat_mul", $format, MAT_MUL, $dq, FLOAT_ROWS, MAT_MUL_IO)),*];
        /// `mat_mul_tiled_<format>`: workgroup-tiled matrix product (prefill of many tokens).
        pub const MAT_MUL_TILED_KERNELS: &[Kernel] =
            &[$(weighted!("mat_mul_tiled", $format, MAT_MUL_TILED, $dq, FLOAT_ROWS, MAT_MUL_IO)),*];
        /// `get_rows_<format>`: rows of a table (embeddings), dequantized.
        pub const GET_ROWS_KERNELS: &[Kernel] = &[$(weighted!("get_rows", $format, GET_ROWS, $dq, FLOAT_ROWS)),*];
        /// `mat_mul_id_<format>`: each token's rows through its chosen experts.
        pub const MAT_MUL_ID_KERNELS: &[Kernel] =
            &[$(weighted!(file = "moe_mat_mul_id", "mat_mul_id", $format, MAT_MUL_ID, $dq, FLOAT_ROWS)),*];
    };
    ($($dtype:ident $format:literal),* ; grids: $($gdtype:ident $gformat:literal),* $(,)?) => {
        per_format!(@emit $($dtype $format DEQUANT DOT,)* $($gdtype $gformat DEQUANT_IQ DOT_IQ,)*);
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
    IQ4_NL "iq4_nl",
    IQ4_XS "iq4_xs";
    grids:
    IQ2_XXS "iq2_xxs",
    IQ2_XS "iq2_xs",
    IQ2_S "iq2_s",
    IQ3_XXS "iq3_xxs",
    IQ3_S "iq3_s",
    IQ1_S "iq1_s",
    IQ1_M "iq1_m",
    TQ1_0 "tq1_0",
    TQ2_0 "tq2_0",
);

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
            file: "attention_kv_write",
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
    TQ4P "tq4p" "8u",
    TQ3P "tq3p" "9u",
    TQ3T "tq3t" "10u",
    TQ2T "tq2t" "11u",
);

/// Every declared kernel: the op families' own (declared in their launchers' files), then each
/// per-format table (a test builds each
/// module and finds each entry point).
pub fn all() -> impl Iterator<Item = &'static Kernel> {
    let tables = [
        MAT_VEC_KERNELS,
        MAT_MUL_KERNELS,
        MAT_MUL_TILED_KERNELS,
        GET_ROWS_KERNELS,
        MAT_MUL_ID_KERNELS,
    ];
    crate::ops::plain_kernels()
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
