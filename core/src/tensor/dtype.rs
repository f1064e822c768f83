//! Element types: plain numbers and the GGUF block formats (byte layouts identical to ggml's).

use std::fmt;

/// Elements per super-block of the K-quant formats.
pub const QK_K: usize = 256;

/// Every element type kiln stores. Block types keep ggml's names so a reader can go from a
/// GGUF file's tensor type to ours without a table.
#[allow(non_camel_case_types)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    U32,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    MXFP4,
    NVFP4,
    /// The i-quants: grid-coded blocks (`quant/iquants.rs`).
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    IQ1_M,
    /// Ternary weights (BitNet-style): 1.6 and 2 bits a value.
    TQ1_0,
    TQ2_0,
    /// TurboQuant-style KV cache blocks (rotated coordinates, Gaussian codebooks; layout in
    /// `quant/turbo.rs`). Cache-only: no GGUF type id, never a weight.
    TQ4,
    TQ3,
    TQ2,
    /// TurboQuant's inner-product variant for keys: (b−1)-bit codes plus a 1-bit QJL sketch
    /// of the residual, scored by the unbiased estimator (`quant/turbo.rs`). Cache-only.
    TQ4P,
    TQ3P,
    /// Trellis-coded TurboQuant blocks (`tq3`'s and `tq2`'s sizes, an 8-state trellis over the
    /// next codebook up; `quant/turbo.rs`). Cache-only.
    TQ3T,
    TQ2T,
}

impl DType {
    pub const ALL: [DType; 29] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::MXFP4,
        DType::NVFP4,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::IQ1_M,
        DType::TQ1_0,
        DType::TQ2_0,
    ];

    /// The block types, in the order above.
    pub const QUANTIZED: [DType; 24] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::MXFP4,
        DType::NVFP4,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::IQ1_M,
        DType::TQ1_0,
        DType::TQ2_0,
    ];

    /// The i-quants and ternary types (in [`DType::ALL`] and [`DType::QUANTIZED`]): decoded by
    /// the CPU reference; of these the GPU backends have kernels for IQ4_NL and IQ4_XS only.
    pub const IQUANTS: [DType; 11] = [
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::IQ1_M,
        DType::TQ1_0,
        DType::TQ2_0,
    ];

    /// The KV-cache-only types (not in [`DType::ALL`]: no weight is ever stored in them).
    pub const KV_ONLY: [DType; 7] = [
        DType::TQ4,
        DType::TQ3,
        DType::TQ2,
        DType::TQ4P,
        DType::TQ3P,
        DType::TQ3T,
        DType::TQ2T,
    ];

    /// The types a KV cache can hold (`--kv-type`), widest first.
    pub const KV_CACHE: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::TQ4,
        DType::TQ3,
        DType::TQ2,
        DType::TQ4P,
        DType::TQ3P,
        DType::TQ3T,
        DType::TQ2T,
    ];

    /// Lower-case name as ggml prints it (`q4_K`, `f16`, `mxfp4`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2_K => "q2_K",
            DType::Q3_K => "q3_K",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::Q8_K => "q8_K",
            DType::MXFP4 => "mxfp4",
            DType::NVFP4 => "nvfp4",
            DType::IQ2_XXS => "iq2_xxs",
            DType::IQ2_XS => "iq2_xs",
            DType::IQ3_XXS => "iq3_xxs",
            DType::IQ1_S => "iq1_s",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ3_S => "iq3_s",
            DType::IQ2_S => "iq2_s",
            DType::IQ4_XS => "iq4_xs",
            DType::IQ1_M => "iq1_m",
            DType::TQ1_0 => "tq1_0",
            DType::TQ2_0 => "tq2_0",
            DType::TQ4 => "tq4",
            DType::TQ3 => "tq3",
            DType::TQ2 => "tq2",
            DType::TQ4P => "tq4p",
            DType::TQ3P => "tq3p",
            DType::TQ3T => "tq3t",
            DType::TQ2T => "tq2t",
        }
    }

    /// Parses [`DType::name`] (case-insensitive).
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .chain(&DType::KV_ONLY)
            .copied()
            .find(|d| d.name().eq_ignore_ascii_case(s))
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::U32 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::MXFP4
            | DType::TQ4
            | DType::TQ3
            | DType::TQ2
            | DType::TQ4P
            | DType::TQ3P
            | DType::TQ3T
            | DType::TQ2T
            | DType::IQ4_NL => 32,
            DType::NVFP4 => 64,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ3_XXS
            | DType::IQ1_S
            | DType::IQ3_S
            | DType::IQ2_S
            | DType::IQ4_XS
            | DType::IQ1_M
            | DType::TQ1_0
            | DType::TQ2_0 => QK_K,
        }
    }

    /// Bytes per block (bytes per element for plain types).
    pub fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 2 + 16,
            DType::Q4_1 => 2 + 2 + 16,
            DType::Q5_0 => 2 + 4 + 16,
            DType::Q5_1 => 2 + 2 + 4 + 16,
            DType::Q8_0 => 2 + 32,
            DType::Q2_K => 2 + 2 + QK_K / 16 + QK_K / 4,
            DType::Q3_K => 2 + QK_K / 4 + QK_K / 8 + 12,
            DType::Q4_K => 2 + 2 + 12 + QK_K / 2,
            DType::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            DType::Q6_K => 2 + QK_K / 2 + QK_K / 4 + QK_K / 16,
            DType::Q8_K => 4 + QK_K + QK_K / 8,
            DType::MXFP4 => 1 + 16,
            DType::NVFP4 => 4 + 32,
            DType::IQ2_XXS => 2 + QK_K / 4,
            DType::IQ2_XS => 2 + QK_K / 4 + QK_K / 32,
            DType::IQ3_XXS => 2 + 3 * QK_K / 8,
            DType::IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            DType::IQ4_NL => 2 + 16,
            DType::IQ3_S => 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64,
            DType::IQ2_S => 2 + QK_K / 4 + QK_K / 32 + QK_K / 32,
            DType::IQ4_XS => 2 + 2 + QK_K / 64 + QK_K / 2,
            DType::IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            DType::TQ1_0 => (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2,
            DType::TQ2_0 => QK_K / 4 + 2,
            DType::TQ4 => 2 + 16,
            DType::TQ3 => 2 + 12,
            DType::TQ2 => 2 + 8,
            DType::TQ4P => 2 + 12 + 4 + 2,
            DType::TQ3P => 2 + 8 + 4 + 2,
            DType::TQ3T => 2 + 12,
            DType::TQ2T => 2 + 8,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// f32, f16 or bf16: the activation types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// A TurboQuant KV type: rows stored rotated (`quant/turbo.rs`).
    pub fn is_turbo(self) -> bool {
        matches!(
            self,
            DType::TQ4
                | DType::TQ3
                | DType::TQ2
                | DType::TQ4P
                | DType::TQ3P
                | DType::TQ3T
                | DType::TQ2T
        )
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.type_size())
    }

    /// ggml's numeric type id (the value stored in GGUF tensor infos).
    pub fn ggml_type(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::I32 => 26,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
            DType::NVFP4 => 40,
            DType::IQ2_XXS => 16,
            DType::IQ2_XS => 17,
            DType::IQ3_XXS => 18,
            DType::IQ1_S => 19,
            DType::IQ4_NL => 20,
            DType::IQ3_S => 21,
            DType::IQ2_S => 22,
            DType::IQ4_XS => 23,
            DType::IQ1_M => 29,
            DType::TQ1_0 => 34,
            DType::TQ2_0 => 35,
            // ggml has no u32 tensor type; kiln uses it only for its own index tensors.
            DType::U32 => u32::MAX,
            // Cache-only types (never in a file).
            DType::TQ4
            | DType::TQ3
            | DType::TQ2
            | DType::TQ4P
            | DType::TQ3P
            | DType::TQ3T
            | DType::TQ2T => u32::MAX,
        }
    }

    pub fn from_ggml_type(t: u32) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| *d != DType::U32 && d.ggml_type() == t)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ggml_ids_are_unique() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            if d != DType::U32 {
                assert_eq!(DType::from_ggml_type(d.ggml_type()), Some(d), "{d}");
            }
        }
        assert_eq!(
            DType::from_ggml_type(9),
            None,
            "q8_1 is not a storage type of kiln"
        );
    }

    #[test]
    fn block_sizes_match_ggml() {
        // Sizes from ggml's block structs.
        let expect = [
            (DType::Q4_0, 18),
            (DType::Q4_1, 20),
            (DType::Q5_0, 22),
            (DType::Q5_1, 24),
            (DType::Q8_0, 34),
            (DType::Q2_K, 84),
            (DType::Q3_K, 110),
            (DType::Q4_K, 144),
            (DType::Q5_K, 176),
            (DType::Q6_K, 210),
            (DType::Q8_K, 292),
            (DType::MXFP4, 17),
            (DType::NVFP4, 36),
            (DType::IQ2_XXS, 66),
            (DType::IQ2_XS, 74),
            (DType::IQ3_XXS, 98),
            (DType::IQ1_S, 50),
            (DType::IQ4_NL, 18),
            (DType::IQ3_S, 110),
            (DType::IQ2_S, 82),
            (DType::IQ4_XS, 136),
            (DType::IQ1_M, 56),
            (DType::TQ1_0, 54),
            (DType::TQ2_0, 66),
        ];
        for (d, size) in expect {
            assert_eq!(d.type_size(), size, "{d}");
        }
        assert_eq!(DType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(DType::Q4_K.bytes_for(100), None);
    }
}
