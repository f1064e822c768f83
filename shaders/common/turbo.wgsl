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

// The positive half of a TurboQuant codebook, point k (k < 2^(bits-1)): the Lloyd-Max
// points of a standard normal (the CPU's f32 values), chosen by selects rather than read from
// an array (a dynamically indexed constant array is a copy in private memory on some drivers).
fn tq_half(bits: u32, k: u32) -> f32 {
    if (bits == 4u) {
        let lo = select(select(0.128395, 0.3880483, k == 1u), select(0.6567591, 0.9423405, k == 3u), k >= 2u);
        let hi = select(select(1.2562312, 1.6180464, k == 5u), select(2.0690172, 2.7325896, k >= 7u), k >= 6u);
        return select(lo, hi, k >= 4u);
    }
    if (bits == 3u) {
        return select(select(0.2450942, 0.7560053, k == 1u), select(1.3439093, 2.1519457, k >= 3u), k >= 2u);
    }
    return select(0.45278, 1.5104176, k >= 1u);
}

// Point `code` of the increasing codebook: codes below n = 2^(bits-1) are the mirrored
// negative half.
fn tq_point(bits: u32, code: u32) -> f32 {
    let n = 1u << (bits - 1u);
    let neg = code < n;
    let h = tq_half(bits, select(code - n, n - 1u - code, neg));
    return select(h, -h, neg);
}
