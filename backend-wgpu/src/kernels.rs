//! Every kernel entry point, declared once. A kernel is an entry point in one WGSL family
//! file of `shaders/`, with the shared helpers of `shaders/common/` it needs prepended and,
//! for the dtype-templated families, its placeholders filled in (`ENTRY`, the entry point's
//! name; `DQ32`, the weight format's chunk decoder; `KVF16`, the cache format).

use kiln_core::tensor::DType;

const DEQUANT: &str = include_str!("../../shaders/common/dequant.wgsl");
const FLOAT_ROWS: &str = include_str!("../../shaders/common/float_rows.wgsl");
const DOT: &str = include_str!("../../shaders/common/dot.wgsl");
const ORDER: &str = include_str!("../../shaders/common/order.wgsl");
const MAT_VEC: &str = include_str!("../../shaders/mat_vec.wgsl");
const MAT_MUL: &str = include_str!("../../shaders/mat_mul.wgsl");
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

macro_rules! weighted {
    ($name:ident, $entry:literal, $file:literal, $src:ident, $dq:literal) => {
        pub const $name: Kernel = Kernel {
            entry: $entry,
            file: $file,
            source: $src,
            commons: &[DEQUANT, FLOAT_ROWS],
            subst: &[("ENTRY", $entry), ("DQ32", $dq)],
        };
    };
}

macro_rules! vec_kernel {
    ($name:ident, $entry:literal, $dot:literal) => {
        pub const $name: Kernel = Kernel {
            entry: $entry,
            file: "mat_vec",
            source: MAT_VEC,
            commons: &[DEQUANT, DOT],
            subst: &[("ENTRY", $entry), ("DOT32", $dot)],
        };
    };
}

vec_kernel!(MAT_VEC_F32, "mat_vec_f32", "dot32_f32");
vec_kernel!(MAT_VEC_F16, "mat_vec_f16", "dot32_f16");
vec_kernel!(MAT_VEC_BF16, "mat_vec_bf16", "dot32_bf16");
vec_kernel!(MAT_VEC_Q4_0, "mat_vec_q4_0", "dot32_q4_0");
vec_kernel!(MAT_VEC_Q4_1, "mat_vec_q4_1", "dot32_q4_1");
vec_kernel!(MAT_VEC_Q5_0, "mat_vec_q5_0", "dot32_q5_0");
vec_kernel!(MAT_VEC_Q5_1, "mat_vec_q5_1", "dot32_q5_1");
vec_kernel!(MAT_VEC_Q8_0, "mat_vec_q8_0", "dot32_q8_0");
vec_kernel!(MAT_VEC_Q2_K, "mat_vec_q2_k", "dot32_q2_k");
vec_kernel!(MAT_VEC_Q3_K, "mat_vec_q3_k", "dot32_q3_k");
vec_kernel!(MAT_VEC_Q4_K, "mat_vec_q4_k", "dot32_q4_k");
vec_kernel!(MAT_VEC_Q5_K, "mat_vec_q5_k", "dot32_q5_k");
vec_kernel!(MAT_VEC_Q6_K, "mat_vec_q6_k", "dot32_q6_k");
vec_kernel!(MAT_VEC_Q8_K, "mat_vec_q8_k", "dot32_q8_k");
vec_kernel!(MAT_VEC_MXFP4, "mat_vec_mxfp4", "dot32_mxfp4");
vec_kernel!(MAT_VEC_NVFP4, "mat_vec_nvfp4", "dot32_nvfp4");

weighted!(MAT_MUL_F32, "mat_mul_f32", "mat_mul", MAT_MUL, "dq32_f32");
weighted!(MAT_MUL_F16, "mat_mul_f16", "mat_mul", MAT_MUL, "dq32_f16");
weighted!(
    MAT_MUL_BF16,
    "mat_mul_bf16",
    "mat_mul",
    MAT_MUL,
    "dq32_bf16"
);
weighted!(
    MAT_MUL_Q4_0,
    "mat_mul_q4_0",
    "mat_mul",
    MAT_MUL,
    "dq32_q4_0"
);
weighted!(
    MAT_MUL_Q4_1,
    "mat_mul_q4_1",
    "mat_mul",
    MAT_MUL,
    "dq32_q4_1"
);
weighted!(
    MAT_MUL_Q5_0,
    "mat_mul_q5_0",
    "mat_mul",
    MAT_MUL,
    "dq32_q5_0"
);
weighted!(
    MAT_MUL_Q5_1,
    "mat_mul_q5_1",
    "mat_mul",
    MAT_MUL,
    "dq32_q5_1"
);
weighted!(
    MAT_MUL_Q8_0,
    "mat_mul_q8_0",
    "mat_mul",
    MAT_MUL,
    "dq32_q8_0"
);
weighted!(
    MAT_MUL_Q2_K,
    "mat_mul_q2_k",
    "mat_mul",
    MAT_MUL,
    "dq32_q2_k"
);
weighted!(
    MAT_MUL_Q3_K,
    "mat_mul_q3_k",
    "mat_mul",
    MAT_MUL,
    "dq32_q3_k"
);
weighted!(
    MAT_MUL_Q4_K,
    "mat_mul_q4_k",
    "mat_mul",
    MAT_MUL,
    "dq32_q4_k"
);
weighted!(
    MAT_MUL_Q5_K,
    "mat_mul_q5_k",
    "mat_mul",
    MAT_MUL,
    "dq32_q5_k"
);
weighted!(
    MAT_MUL_Q6_K,
    "mat_mul_q6_k",
    "mat_mul",
    MAT_MUL,
    "dq32_q6_k"
);
weighted!(
    MAT_MUL_Q8_K,
    "mat_mul_q8_k",
    "mat_mul",
    MAT_MUL,
    "dq32_q8_k"
);
weighted!(
    MAT_MUL_MXFP4,
    "mat_mul_mxfp4",
    "mat_mul",
    MAT_MUL,
    "dq32_mxfp4"
);
weighted!(
    MAT_MUL_NVFP4,
    "mat_mul_nvfp4",
    "mat_mul",
    MAT_MUL,
    "dq32_nvfp4"
);

weighted!(
    GET_ROWS_F32,
    "get_rows_f32",
    "get_rows",
    GET_ROWS,
    "dq32_f32"
);
weighted!(
    GET_ROWS_F16,
    "get_rows_f16",
    "get_rows",
    GET_ROWS,
    "dq32_f16"
);
weighted!(
    GET_ROWS_BF16,
    "get_rows_bf16",
    "get_rows",
    GET_ROWS,
    "dq32_bf16"
);
weighted!(
    GET_ROWS_Q4_0,
    "get_rows_q4_0",
    "get_rows",
    GET_ROWS,
    "dq32_q4_0"
);
weighted!(
    GET_ROWS_Q4_1,
    "get_rows_q4_1",
    "get_rows",
    GET_ROWS,
    "dq32_q4_1"
);
weighted!(
    GET_ROWS_Q5_0,
    "get_rows_q5_0",
    "get_rows",
    GET_ROWS,
    "dq32_q5_0"
);
weighted!(
    GET_ROWS_Q5_1,
    "get_rows_q5_1",
    "get_rows",
    GET_ROWS,
    "dq32_q5_1"
);
weighted!(
    GET_ROWS_Q8_0,
    "get_rows_q8_0",
    "get_rows",
    GET_ROWS,
    "dq32_q8_0"
);
weighted!(
    GET_ROWS_Q2_K,
    "get_rows_q2_k",
    "get_rows",
    GET_ROWS,
    "dq32_q2_k"
);
weighted!(
    GET_ROWS_Q3_K,
    "get_rows_q3_k",
    "get_rows",
    GET_ROWS,
    "dq32_q3_k"
);
weighted!(
    GET_ROWS_Q4_K,
    "get_rows_q4_k",
    "get_rows",
    GET_ROWS,
    "dq32_q4_k"
);
weighted!(
    GET_ROWS_Q5_K,
    "get_rows_q5_k",
    "get_rows",
    GET_ROWS,
    "dq32_q5_k"
);
weighted!(
    GET_ROWS_Q6_K,
    "get_rows_q6_k",
    "get_rows",
    GET_ROWS,
    "dq32_q6_k"
);
weighted!(
    GET_ROWS_Q8_K,
    "get_rows_q8_k",
    "get_rows",
    GET_ROWS,
    "dq32_q8_k"
);
weighted!(
    GET_ROWS_MXFP4,
    "get_rows_mxfp4",
    "get_rows",
    GET_ROWS,
    "dq32_mxfp4"
);
weighted!(
    GET_ROWS_NVFP4,
    "get_rows_nvfp4",
    "get_rows",
    GET_ROWS,
    "dq32_nvfp4"
);

weighted!(
    MAT_MUL_ID_F32,
    "mat_mul_id_f32",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_f32"
);
weighted!(
    MAT_MUL_ID_F16,
    "mat_mul_id_f16",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_f16"
);
weighted!(
    MAT_MUL_ID_BF16,
    "mat_mul_id_bf16",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_bf16"
);
weighted!(
    MAT_MUL_ID_Q4_0,
    "mat_mul_id_q4_0",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q4_0"
);
weighted!(
    MAT_MUL_ID_Q4_1,
    "mat_mul_id_q4_1",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q4_1"
);
weighted!(
    MAT_MUL_ID_Q5_0,
    "mat_mul_id_q5_0",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q5_0"
);
weighted!(
    MAT_MUL_ID_Q5_1,
    "mat_mul_id_q5_1",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q5_1"
);
weighted!(
    MAT_MUL_ID_Q8_0,
    "mat_mul_id_q8_0",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q8_0"
);
weighted!(
    MAT_MUL_ID_Q2_K,
    "mat_mul_id_q2_k",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q2_k"
);
weighted!(
    MAT_MUL_ID_Q3_K,
    "mat_mul_id_q3_k",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q3_k"
);
weighted!(
    MAT_MUL_ID_Q4_K,
    "mat_mul_id_q4_k",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q4_k"
);
weighted!(
    MAT_MUL_ID_Q5_K,
    "mat_mul_id_q5_k",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q5_k"
);
weighted!(
    MAT_MUL_ID_Q6_K,
    "mat_mul_id_q6_k",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q6_k"
);
weighted!(
    MAT_MUL_ID_Q8_K,
    "mat_mul_id_q8_k",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_q8_k"
);
weighted!(
    MAT_MUL_ID_MXFP4,
    "mat_mul_id_mxfp4",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_mxfp4"
);
weighted!(
    MAT_MUL_ID_NVFP4,
    "mat_mul_id_nvfp4",
    "mat_mul_id",
    MAT_MUL_ID,
    "dq32_nvfp4"
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

pub const PAGED_ATTENTION_F32: Kernel = Kernel {
    entry: "paged_attention_f32",
    file: "attention",
    source: ATTENTION,
    commons: &[],
    subst: &[("ENTRY", "paged_attention_f32"), ("KVF16", "false")],
};
pub const PAGED_ATTENTION_F16: Kernel = Kernel {
    entry: "paged_attention_f16",
    file: "attention",
    source: ATTENTION,
    commons: &[],
    subst: &[("ENTRY", "paged_attention_f16"), ("KVF16", "true")],
};
plain!(
    PAGED_ATTENTION_COMBINE,
    "paged_attention_combine",
    "attention_combine",
    ATTENTION_COMBINE
);
plain!(KV_WRITE_F32, "kv_write_f32", "kv_write", KV_WRITE);
plain!(KV_WRITE_F16, "kv_write_f16", "kv_write", KV_WRITE);
plain!(CONV1D_F32, "conv1d_f32", "conv", CONV);
plain!(CONV1D_STATE_F32, "conv1d_state_f32", "conv", CONV);
plain!(DELTA_NET_F32, "delta_net_f32", "delta_net", DELTA_NET);
ranked!(MOE_ROUTE_F32, "moe_route_f32", "moe", MOE);
plain!(MOE_SUM_F32, "moe_sum_f32", "moe_sum", MOE_SUM);

/// Every declared kernel (a test builds each module and finds each entry point).
pub const ALL: &[&Kernel] = &[
    &MAT_VEC_F32,
    &MAT_VEC_F16,
    &MAT_VEC_BF16,
    &MAT_VEC_Q4_0,
    &MAT_VEC_Q4_1,
    &MAT_VEC_Q5_0,
    &MAT_VEC_Q5_1,
    &MAT_VEC_Q8_0,
    &MAT_VEC_Q2_K,
    &MAT_VEC_Q3_K,
    &MAT_VEC_Q4_K,
    &MAT_VEC_Q5_K,
    &MAT_VEC_Q6_K,
    &MAT_VEC_Q8_K,
    &MAT_VEC_MXFP4,
    &MAT_VEC_NVFP4,
    &MAT_MUL_F32,
    &MAT_MUL_F16,
    &MAT_MUL_BF16,
    &MAT_MUL_Q4_0,
    &MAT_MUL_Q4_1,
    &MAT_MUL_Q5_0,
    &MAT_MUL_Q5_1,
    &MAT_MUL_Q8_0,
    &MAT_MUL_Q2_K,
    &MAT_MUL_Q3_K,
    &MAT_MUL_Q4_K,
    &MAT_MUL_Q5_K,
    &MAT_MUL_Q6_K,
    &MAT_MUL_Q8_K,
    &MAT_MUL_MXFP4,
    &MAT_MUL_NVFP4,
    &GET_ROWS_F32,
    &GET_ROWS_F16,
    &GET_ROWS_BF16,
    &GET_ROWS_Q4_0,
    &GET_ROWS_Q4_1,
    &GET_ROWS_Q5_0,
    &GET_ROWS_Q5_1,
    &GET_ROWS_Q8_0,
    &GET_ROWS_Q2_K,
    &GET_ROWS_Q3_K,
    &GET_ROWS_Q4_K,
    &GET_ROWS_Q5_K,
    &GET_ROWS_Q6_K,
    &GET_ROWS_Q8_K,
    &GET_ROWS_MXFP4,
    &GET_ROWS_NVFP4,
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
    &PAGED_ATTENTION_F32,
    &PAGED_ATTENTION_F16,
    &PAGED_ATTENTION_COMBINE,
    &KV_WRITE_F32,
    &KV_WRITE_F16,
    &CONV1D_F32,
    &CONV1D_STATE_F32,
    &DELTA_NET_F32,
    &MOE_ROUTE_F32,
    &MOE_SUM_F32,
    &MAT_MUL_ID_F32,
    &MAT_MUL_ID_F16,
    &MAT_MUL_ID_BF16,
    &MAT_MUL_ID_Q4_0,
    &MAT_MUL_ID_Q4_1,
    &MAT_MUL_ID_Q5_0,
    &MAT_MUL_ID_Q5_1,
    &MAT_MUL_ID_Q8_0,
    &MAT_MUL_ID_Q2_K,
    &MAT_MUL_ID_Q3_K,
    &MAT_MUL_ID_Q4_K,
    &MAT_MUL_ID_Q5_K,
    &MAT_MUL_ID_Q6_K,
    &MAT_MUL_ID_Q8_K,
    &MAT_MUL_ID_MXFP4,
    &MAT_MUL_ID_NVFP4,
];

/// The matmul kernel for a weight dtype.
pub fn mat_mul(w: DType) -> Option<&'static Kernel> {
    Some(match w {
        DType::F32 => &MAT_MUL_F32,
        DType::F16 => &MAT_MUL_F16,
        DType::BF16 => &MAT_MUL_BF16,
        DType::Q4_0 => &MAT_MUL_Q4_0,
        DType::Q4_1 => &MAT_MUL_Q4_1,
        DType::Q5_0 => &MAT_MUL_Q5_0,
        DType::Q5_1 => &MAT_MUL_Q5_1,
        DType::Q8_0 => &MAT_MUL_Q8_0,
        DType::Q2_K => &MAT_MUL_Q2_K,
        DType::Q3_K => &MAT_MUL_Q3_K,
        DType::Q4_K => &MAT_MUL_Q4_K,
        DType::Q5_K => &MAT_MUL_Q5_K,
        DType::Q6_K => &MAT_MUL_Q6_K,
        DType::Q8_K => &MAT_MUL_Q8_K,
        DType::MXFP4 => &MAT_MUL_MXFP4,
        DType::NVFP4 => &MAT_MUL_NVFP4,
        DType::I32 | DType::U32 => return None,
    })
}

/// The embedding-lookup kernel for a table dtype.
pub fn get_rows(w: DType) -> Option<&'static Kernel> {
    Some(match w {
        DType::F32 => &GET_ROWS_F32,
        DType::F16 => &GET_ROWS_F16,
        DType::BF16 => &GET_ROWS_BF16,
        DType::Q4_0 => &GET_ROWS_Q4_0,
        DType::Q4_1 => &GET_ROWS_Q4_1,
        DType::Q5_0 => &GET_ROWS_Q5_0,
        DType::Q5_1 => &GET_ROWS_Q5_1,
        DType::Q8_0 => &GET_ROWS_Q8_0,
        DType::Q2_K => &GET_ROWS_Q2_K,
        DType::Q3_K => &GET_ROWS_Q3_K,
        DType::Q4_K => &GET_ROWS_Q4_K,
        DType::Q5_K => &GET_ROWS_Q5_K,
        DType::Q6_K => &GET_ROWS_Q6_K,
        DType::Q8_K => &GET_ROWS_Q8_K,
        DType::MXFP4 => &GET_ROWS_MXFP4,
        DType::NVFP4 => &GET_ROWS_NVFP4,
        DType::I32 | DType::U32 => return None,
    })
}

/// The matmul-by-expert-id kernel for a weight dtype.
pub fn mat_mul_id(w: DType) -> Option<&'static Kernel> {
    Some(match w {
        DType::F32 => &MAT_MUL_ID_F32,
        DType::F16 => &MAT_MUL_ID_F16,
        DType::BF16 => &MAT_MUL_ID_BF16,
        DType::Q4_0 => &MAT_MUL_ID_Q4_0,
        DType::Q4_1 => &MAT_MUL_ID_Q4_1,
        DType::Q5_0 => &MAT_MUL_ID_Q5_0,
        DType::Q5_1 => &MAT_MUL_ID_Q5_1,
        DType::Q8_0 => &MAT_MUL_ID_Q8_0,
        DType::Q2_K => &MAT_MUL_ID_Q2_K,
        DType::Q3_K => &MAT_MUL_ID_Q3_K,
        DType::Q4_K => &MAT_MUL_ID_Q4_K,
        DType::Q5_K => &MAT_MUL_ID_Q5_K,
        DType::Q6_K => &MAT_MUL_ID_Q6_K,
        DType::Q8_K => &MAT_MUL_ID_Q8_K,
        DType::MXFP4 => &MAT_MUL_ID_MXFP4,
        DType::NVFP4 => &MAT_MUL_ID_NVFP4,
        DType::I32 | DType::U32 => return None,
    })
}

/// The decode (one token) matvec kernel for a weight dtype; it reads whole 32-element chunks,
/// so it serves only rows whose length is a multiple of 32.
pub fn mat_vec(w: DType) -> Option<&'static Kernel> {
    Some(match w {
        DType::F32 => &MAT_VEC_F32,
        DType::F16 => &MAT_VEC_F16,
        DType::BF16 => &MAT_VEC_BF16,
        DType::Q4_0 => &MAT_VEC_Q4_0,
        DType::Q4_1 => &MAT_VEC_Q4_1,
        DType::Q5_0 => &MAT_VEC_Q5_0,
        DType::Q5_1 => &MAT_VEC_Q5_1,
        DType::Q8_0 => &MAT_VEC_Q8_0,
        DType::Q2_K => &MAT_VEC_Q2_K,
        DType::Q3_K => &MAT_VEC_Q3_K,
        DType::Q4_K => &MAT_VEC_Q4_K,
        DType::Q5_K => &MAT_VEC_Q5_K,
        DType::Q6_K => &MAT_VEC_Q6_K,
        DType::Q8_K => &MAT_VEC_Q8_K,
        DType::MXFP4 => &MAT_VEC_MXFP4,
        DType::NVFP4 => &MAT_VEC_NVFP4,
        DType::I32 | DType::U32 => return None,
    })
}
