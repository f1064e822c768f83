// Mixing expert outputs: y [T, k, N], w [T, k] (f32) -> out [T, N], out[t, j] = sum over the k
// slots, in slot order, of w[t, i] * y[t, i, j]. One thread per output element.

struct Params {
    t: u32,
    k: u32,
    n: u32,
    y_off: u32,
    w_off: u32,
    o_off: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> y: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> p: Params;

@compute @workgroup_size(64)
fn moe_sum_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let idx = (wid.x + wid.y * p.nx) * 64u + li;
    if (idx >= p.t * p.n) {
        return;
    }
    let t = idx / p.n;
    let j = idx % p.n;
    var acc = 0.0;
    for (var i = 0u; i < p.k; i++) {
        acc += w[p.w_off + t * p.k + i] * y[p.y_off + (t * p.k + i) * p.n + j];
    }
    out[p.o_off + idx] = acc;
}
