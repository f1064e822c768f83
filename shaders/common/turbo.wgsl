// turbo.wgsl: the KV cache format codes shared by the attention and KV-write shaders, and the
// TurboQuant-style codebooks (core/src/quant/turbo.rs documents the layout; the points are
// the Lloyd-Max points of a standard normal, the same f32 values as the CPU's).
//
// Format codes (a shader's KFMT/VFMT/FMT constant):
//   0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4_0, 5 tq4, 6 tq3, 7 tq2, 8 tq4p, 9 tq3p, 10 tq3t, 11 tq2t
//
// tq4p and tq3p are a tq3 or tq2 block followed by a u32 of sketch signs and an f16 rho; their
// element i adds rho * qjl_factor(i, signs) to the codes' value. tq3t and tq2t are tq3 and tq2
// blocks whose codes are trellis-coded: element i's point depends on its code and on the branch
// bits (bit 0) of the codes i-1 and i-3 (tcq_state, tcq_point).

// Bytes of a row of n elements (n a multiple of 32 for the block formats).
fn kvf_row_bytes(f: u32, n: u32) -> u32 {
    switch f {
        case 0u: { return 4u * n; }
        case 1u, 2u: { return 2u * n; }
        case 3u: { return n / 32u * 34u; }
        case 4u, 5u: { return n / 32u * 18u; }
        case 6u, 10u: { return n / 32u * 14u; }
        case 8u: { return n / 32u * 20u; }
        case 9u: { return n / 32u * 16u; }
        default: { return n / 32u * 10u; }
    }
}

// Bits per code of a TurboQuant format (5, 6, 7 -> 4, 3, 2; 8, 9 -> 3, 2; 10, 11 -> 3, 2).
fn tq_bits(f: u32) -> u32 {
    return select(select(9u - f, 11u - f, f >= 8u), 13u - f, f >= 10u);
}

// Whether a TurboQuant format carries a residual sketch (tq4p, tq3p).
fn tq_sketched(f: u32) -> bool {
    return f == 8u || f == 9u;
}

// Bytes of a TurboQuant block of 32.
fn tq_block_bytes(f: u32) -> u32 {
    return 2u + 4u * tq_bits(f) + select(0u, 6u, tq_sketched(f));
}

// The sketch diagonal of tq4p/tq3p (turbo.rs QJL_SIGNS): bit i set where D_i = -1.
const QJL_SIGNS: u32 = 0x9E3779B9u;

// D_i times row i of H32 applied to the signs `sigma` (bit j set: -1): 32 - 2 * the number of
// places where H32's row i (bit j set where i & j has odd parity) and sigma differ.
fn qjl_factor(i: u32, sigma: u32) -> f32 {
    var m = 0u;
    m ^= select(0u, 0xAAAAAAAAu, (i & 1u) != 0u);
    m ^= select(0u, 0xCCCCCCCCu, (i & 2u) != 0u);
    m ^= select(0u, 0xF0F0F0F0u, (i & 4u) != 0u);
    m ^= select(0u, 0xFF00FF00u, (i & 8u) != 0u);
    m ^= select(0u, 0xFFFF0000u, (i & 16u) != 0u);
    let t = 32 - 2 * i32(countOneBits(m ^ sigma));
    return f32(select(t, -t, ((QJL_SIGNS >> i) & 1u) != 0u));
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

// The trellis blocks (tq3t, tq2t; turbo.rs documents them): the unit-scale point of a `bits`-bit
// code at a step whose state has tap parity `par` (the branch bits of codes i-1 and i-3 XORed):
// point 2 * code + par of the next codebook up, times the trellis scale 0.9.
fn tcq_point(bits: u32, code: u32, par: u32) -> f32 {
    return 0.9 * tq_point(bits + 1u, 2u * code + par);
}

// The tap parity of a trellis state (its bits 0 and 2).
fn tcq_parity(t: u32) -> u32 {
    return countOneBits(t & 5u) & 1u;
}

// The state after one more code: the branch bits of the last three codes.
fn tcq_next(t: u32, code: u32) -> u32 {
    return (2u * t + (code & 1u)) & 7u;
}
