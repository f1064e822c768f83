// The canvas ops' counter-based hashes (core/src/op/canvas.rs): the same 32-bit values on
// every backend.

fn mix32(x0: u32) -> u32 {
    var x = x0;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

fn row_key(seed_lo: u32, seed_hi: u32, row: u32) -> u32 {
    let s = mix32(seed_hi ^ 0x9e3779b9u);
    return mix32(row ^ mix32(seed_lo ^ s));
}

// −ln(u) for u = ((h >> 8) + 0.5) / 2^24; near u = 1 the series of −ln(1 − w), w = 1 − u.
fn exponential(h: u32) -> f32 {
    let k = h >> 8u;
    let w = (f32(16777216u - k) - 0.5) * (1.0 / 16777216.0);
    if (w <= 0.0625) {
        return w * (1.0 + w * (0.5 + w * (1.0 / 3.0 + w * (0.25 + w * (0.2 + w * (1.0 / 6.0))))));
    }
    return -log((f32(k) + 0.5) * (1.0 / 16777216.0));
}

fn gumbel(key: u32, column: u32) -> f32 {
    return -log(exponential(mix32(column ^ key)));
}
