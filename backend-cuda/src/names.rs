//! Which kernel runs each weight-type-specific op: the per-format entry points that
//! `quant.cu`, `mat_mul_vec.cu`, `mat_mul.cu`, `get_rows.cu` and `mat_mul_fused.cu` define.

use kiln_core::tensor::DType;

/// The kernels of one weight type. Every name follows the `<op>_<format>` pattern of the
/// kernel files, so the table is written with [`weight_kernels!`].
#[derive(Debug)]
pub struct WeightKernels {
    pub dtype: DType,
    /// Decode matmul: 4 outputs a block (mat_vec.cuh's `mat_vec_rows`; `mat_mul_vec.cu` for
    /// floats, Q8_0 and Q4_0, `quant.cu` otherwise).
    pub mat_vec: &'static str,
    /// Prefill matmul over output tiles (`mat_mul.cu`): 64 × 64 (on tensor cores with MM_TC=1) for
    /// the block formats; 32 × 32 for floats, which take `mat_mul_tiles` where K is a multiple
    /// of 32.
    pub mat_mul: &'static str,
    /// The 64 × 64 prefill tile of `mat_mul.cu` for this type (K a multiple of 32): `mat_mul`
    /// itself for the block formats.
    pub mat_mul_tiles: &'static str,
    /// Embedding lookup (`get_rows.cu` / `quant.cu`).
    pub get_rows: &'static str,
    /// RMSNorm fused into the decode matmul's activation load (`mat_mul_fused.cu`).
    pub rms_norm_mat_vec: &'static str,
    /// The same over two or three weights of this type sharing the norm, in one launch
    /// (`mat_mul_fused.cu`).
    pub rms_norm_mat_vecs: &'static str,
    /// SwiGLU/GeGLU fused into the decode matmul's input (`mat_mul_fused.cu`).
    pub glu_mat_vec: &'static str,
    /// Matmul by expert id, for MoE (`moe.cu` / `quant.cu`); F16 has none.
    pub mat_mul_id: Option<&'static str>,
    /// The grouped MoE matmul over slots sorted by expert (`mat_mul.cu`): the block formats,
    /// F32 and BF16.
    pub mat_mul_id_grouped: Option<&'static str>,
}

macro_rules! weight_kernels {
    ($dtype:ident, $fmt:literal, $tiles:expr, $id:expr, $grouped:expr) => {
        WeightKernels {
            dtype: DType::$dtype,
            mat_vec: concat!("mat_vec_", $fmt),
            mat_mul: concat!("mat_mul_", $fmt),
            mat_mul_tiles: $tiles,
            get_rows: concat!("get_rows_", $fmt),
            rms_norm_mat_vec: concat!("rms_norm_mat_vec_", $fmt),
            rms_norm_mat_vecs: concat!("rms_norm_mat_vecs_", $fmt),
            glu_mat_vec: concat!("glu_mat_vec_", $fmt),
            mat_mul_id: $id,
            mat_mul_id_grouped: $grouped,
        }
    };
    (float $dtype:ident, $fmt:literal) => {
        weight_kernels!(
            $dtype,
            $fmt,
            concat!("mat_mul_tiles_", $fmt),
            Some(concat!("mat_mul_id_", $fmt)),
            Some(concat!("mat_mul_id_grouped_", $fmt))
        )
    };
    ($dtype:ident, $fmt:literal) => {
        weight_kernels!(
            $dtype,
            $fmt,
            concat!("mat_mul_", $fmt),
            Some(concat!("mat_mul_id_", $fmt)),
            Some(concat!("mat_mul_id_grouped_", $fmt))
        )
    };
}

/// Every weight type the CUDA backend reads.
pub const WEIGHT_KERNELS: &[WeightKernels] = &[
    weight_kernels!(float F32, "f32"),
    weight_kernels!(F16, "f16", "mat_mul_tiles_f16", None, None),
    weight_kernels!(float BF16, "bf16"),
    weight_kernels!(Q8_0, "q8_0"),
    weight_kernels!(Q4_0, "q4_0"),
    weight_kernels!(Q4_1, "q4_1"),
    weight_kernels!(Q5_0, "q5_0"),
    weight_kernels!(Q5_1, "q5_1"),
    weight_kernels!(Q2_K, "q2_k"),
    weight_kernels!(Q3_K, "q3_k"),
    weight_kernels!(Q4_K, "q4_k"),
    weight_kernels!(Q5_K, "q5_k"),
    weight_kernels!(Q6_K, "q6_k"),
    weight_kernels!(Q8_K, "q8_k"),
    weight_kernels!(MXFP4, "mxfp4"),
    weight_kernels!(NVFP4, "nvfp4"),
    weight_kernels!(IQ4_NL, "iq4_nl"),
    weight_kernels!(IQ4_XS, "iq4_xs"),
    weight_kernels!(IQ2_XXS, "iq2_xxs"),
    weight_kernels!(IQ2_XS, "iq2_xs"),
    weight_kernels!(IQ2_S, "iq2_s"),
    weight_kernels!(IQ3_XXS, "iq3_xxs"),
    weight_kernels!(IQ3_S, "iq3_s"),
    weight_kernels!(IQ1_S, "iq1_s"),
    weight_kernels!(IQ1_M, "iq1_m"),
    weight_kernels!(TQ1_0, "tq1_0"),
    weight_kernels!(TQ2_0, "tq2_0"),
];

/// The kernels for weights of type `d`, if the backend reads that type.
pub fn weight_kernels(d: DType) -> Option<&'static WeightKernels> {
    WEIGHT_KERNELS.iter().find(|w| w.dtype == d)
}

/// Whether `d` is a block-quantized type (its rows are whole blocks of 32 or more values).
pub fn is_block_quantized(d: DType) -> bool {
    !matches!(d, DType::F32 | DType::F16 | DType::BF16) && weight_kernels(d).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;

    /// Every name in the table is a kernel some file defines, so a renamed kernel fails here
    /// rather than at first launch on a GPU.
    #[test]
    fn every_named_kernel_exists() {
        let defined = kernels::signatures().expect("kernel sources parse");
        for w in WEIGHT_KERNELS {
            let names = [
                Some(w.mat_vec),
                Some(w.mat_mul),
                Some(w.mat_mul_tiles),
                Some(w.get_rows),
                Some(w.rms_norm_mat_vec),
                Some(w.rms_norm_mat_vecs),
                Some(w.glu_mat_vec),
                w.mat_mul_id,
                w.mat_mul_id_grouped,
            ];
            for n in names.into_iter().flatten() {
                assert!(
                    defined.contains_key(n),
                    "{n} ({:?}) is not defined",
                    w.dtype
                );
            }
        }
    }
}

/// The KV cache formats the `_kv` attention and KV-write kernels decode and encode, with
/// their codes (`formats.cuh`; the WGSL shaders use the same).
pub const KV_FORMATS: &[(DType, u32)] = &[
    (DType::F32, 0),
    (DType::F16, 1),
    (DType::BF16, 2),
    (DType::Q8_0, 3),
    (DType::Q4_0, 4),
    (DType::TQ4, 5),
    (DType::TQ3, 6),
    (DType::TQ2, 7),
    (DType::TQ4P, 8),
    (DType::TQ3P, 9),
    (DType::TQ3T, 10),
    (DType::TQ2T, 11),
];

/// The code of a KV cache format, if the `_kv` kernels read it.
pub fn kv_format(d: DType) -> Option<u32> {
    KV_FORMATS.iter().find(|(t, _)| *t == d).map(|&(_, c)| c)
}
