// Writes k [T, Hkv*D] and v [T, Hkv*Dv] into the paged caches at slots [T] (negative slots
// are skipped). One thread per cache word: an f32 element, or a pair of f16 elements
// (kv_write_f16 needs even row widths, checked by the launcher).

struct Params {
    t: u32,
    width: u32,     // elements per token row (k or v: one launch each)
    x_off: u32,
    slots_off: u32,
    c_off: u32,     // cache offset in words
    n_slots: u32,   // slots in the cache; larger ones are skipped
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> slots: array<i32>;
@group(0) @binding(2) var<storage, read_write> cache: array<u32>;
@group(0) @binding(3) var<storage, read> p: Params;

@compute @workgroup_size(256)
fn kv_write_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = (wid.x + wid.y * p.nx) * 256u + li;
    if (g >= p.t * p.width) {
        return;
    }
    let tok = g / p.width;
    let e = g % p.width;
    let slot = slots[p.slots_off + tok];
    if (slot < 0 || u32(slot) >= p.n_slots) {
        return;
    }
    cache[p.c_off + u32(slot) * p.width + e] = bitcast<u32>(x[p.x_off + g]);
}

@compute @workgroup_size(256)
fn kv_write_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let half_w = p.width / 2u;
    let g = (wid.x + wid.y * p.nx) * 256u + li;
    if (g >= p.t * half_w) {
        return;
    }
    let tok = g / half_w;
    let e = g % half_w;
    let slot = slots[p.slots_off + tok];
    if (slot < 0 || u32(slot) >= p.n_slots) {
        return;
    }
    let xi = p.x_off + tok * p.width + 2u * e;
    cache[p.c_off + u32(slot) * half_w + e] = pack2x16float(vec2<f32>(x[xi], x[xi + 1u]));
}
