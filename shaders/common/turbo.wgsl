// turbo.wgsl: the KV cache format codes shared by the attention and KV-write shaders, and the
// TurboQuant-style codebooks (core/src/quant/turbo.rs documents the layout; the points are
// the Lloyd-Max points of a standard normal, the same f32 values as the CPU's).
//
// Format codes (a shader's KFMT/VFMT/FMT constant):
//   0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4_0, 5 tq4, 6 tq3, 7 tq2

// Bytes of a row of n elements (n a multiple of 32 for the block formats).
fn kvf_row_bytes(f: u32, n: u32) -> u32 {
    switch f {
        case 0u: { return 4u * n; }
        case 1u, 2u: { return 2u * n; }
        case 3u: { return n / 32u * 34u; }
        case 4u, 5u: { return n / 32u * 18u; }
        case 6u: { return n / 32u * 14u; }
        default: { return n / 32u * 10u; }
    }
}

// Bits per code of a TurboQuant format (5, 6, 7 -> 4, 3, 2).
fn tq_bits(f: u32) -> u32 {
    return 9u - f;
}

const TQ4_HALF = array<f32, 8>(0.128395, 0.3880483, 0.6567591, 0.9423405, 1.2562312, 1.6180464,
                               2.0690172, 2.7325896);
const TQ3_HALF = array<f32, 4>(0.2450942, 0.7560053, 1.3439093, 2.1519457);
const TQ2_HALF = array<f32, 2>(0.45278, 1.5104176);

// The positive half of a TurboQuant codebook, point k (k < 2^(bits-1)).
fn tq_half(bits: u32, k: u32) -> f32 {
    if (bits == 4u) {
        return TQ4_HALF[min(k, 7u)];
    }
    if (bits == 3u) {
        return TQ3_HALF[min(k, 3u)];
    }
    return TQ2_HALF[min(k, 1u)];
}

// Point `code` of the increasing codebook: codes below n = 2^(bits-1) are the mirrored
// negative half.
fn tq_point(bits: u32, code: u32) -> f32 {
    let n = 1u << (bits - 1u);
    if (code < n) {
        return -tq_half(bits, n - 1u - code);
    }
    return tq_half(bits, code - n);
}
