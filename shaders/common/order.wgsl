// Ranking for argmax, top-k and MoE routing: larger first in IEEE total order (as the CPU
// reference's f32::total_cmp), ties to the lower index.

// An unsigned key whose order is f32 total order.
fn order_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Whether (ka, ia) ranks before (kb, ib): larger key, then lower index.
fn before(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}
