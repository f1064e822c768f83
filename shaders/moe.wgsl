// MoE router: logits [T, E] -> weights [T, k] (f32), ids [T, k] (i32), best first (ties to the
// lower index, IEEE total order on the gated probabilities, as the CPU reference). Softmax or
// sigmoid gating; renormalised to sum 1 when asked. One thread per token row: E is small
// (tens to a few hundred experts).

struct Params {
    t: u32,
    e: u32,
    k: u32,
    sigmoid: u32,
    normalize: u32,
    x_off: u32,
    w_off: u32,
    i_off: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> weights: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<i32>;
@group(0) @binding(3) var<storage, read> p: Params;

// order_key and before: shaders/common/order.wgsl.

@compute @workgroup_size(64)
fn moe_route_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = (wid.x + wid.y * p.nx) * 64u + li;
    if (r >= p.t) {
        return;
    }
    let base = p.x_off + r * p.e;
    // Softmax statistics (the gated value of expert j is computed on demand).
    var mx = -0x1.fffffep+127f;
    for (var j = 0u; j < p.e; j++) {
        mx = max(mx, logits[base + j]);
    }
    var sum = 0.0;
    for (var j = 0u; j < p.e; j++) {
        sum += exp(logits[base + j] - mx);
    }
    let inv = 1.0 / sum;
    var pk = 0u;
    var pi = 0u;
    var total = 0.0;
    for (var i = 0u; i < p.k; i++) {
        var bk = 0u;
        var bi = 0xFFFFFFFFu;
        var bv = 0.0;
        for (var j = 0u; j < p.e; j++) {
            var v: f32;
            if (p.sigmoid != 0u) {
                v = 1.0 / (1.0 + exp(-logits[base + j]));
            } else {
                v = exp(logits[base + j] - mx) * inv;
            }
            let kj = order_key(v);
            let eligible = i == 0u || before(pk, pi, kj, j);
            if (eligible && (bi == 0xFFFFFFFFu || before(kj, j, bk, bi))) {
                bk = kj;
                bi = j;
                bv = v;
            }
        }
        pk = bk;
        pi = bi;
        weights[p.w_off + r * p.k + i] = bv;
        ids[p.i_off + r * p.k + i] = i32(bi);
        total += bv;
    }
    if (p.normalize != 0u && total > 0.0) {
        for (var i = 0u; i < p.k; i++) {
            weights[p.w_off + r * p.k + i] = weights[p.w_off + r * p.k + i] / total;
        }
    }
}
