// Argmax and top-k over the last dimension: largest first in IEEE total order (as the CPU
// reference's f32::total_cmp), ties to the lower index. One workgroup of 256 threads per row.
// top_k runs k rounds; round r finds the best element ranked after round r-1's pick, so no
// selected set is kept.

struct Params {
    rows: u32,
    n: u32,
    k: u32,
    x_off: u32,
    v_off: u32,    // top_k values (f32)
    i_off: u32,    // indices (i32)
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> vals: array<f32>;
@group(0) @binding(2) var<storage, read_write> idx: array<i32>;
@group(0) @binding(3) var<storage, read> p: Params;

var<workgroup> bkey: array<u32, 256>;
var<workgroup> bidx: array<u32, 256>;

// order_key and before: shaders/common/order.wgsl.

// The best element of row `base` ranked strictly after (pk, pi); has_prev = false: the best.
fn best_after(base: u32, li: u32, has_prev: bool, pk: u32, pi: u32) -> vec2<u32> {
    var bk = 0u;
    var bi = 0xFFFFFFFFu;
    for (var j = li; j < p.n; j += 256u) {
        let kj = order_key(x[base + j]);
        let eligible = !has_prev || before(pk, pi, kj, j);
        if (eligible && (bi == 0xFFFFFFFFu || before(kj, j, bk, bi))) {
            bk = kj;
            bi = j;
        }
    }
    bkey[li] = bk;
    bidx[li] = bi;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if (li < step) {
            let ok = bkey[li + step];
            let oi = bidx[li + step];
            if (oi != 0xFFFFFFFFu && (bidx[li] == 0xFFFFFFFFu || before(ok, oi, bkey[li], bidx[li]))) {
                bkey[li] = ok;
                bidx[li] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(bkey[0], bidx[0]);
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn argmax_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    let best = best_after(p.x_off + r * p.n, li, false, 0u, 0u);
    if (li == 0u) {
        idx[p.i_off + r] = i32(best.y);
    }
}

@compute @workgroup_size(256)
fn top_k_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    let base = p.x_off + r * p.n;
    var prev = vec2<u32>(0u, 0u);
    for (var i = 0u; i < p.k; i++) {
        prev = best_after(base, li, i > 0u, prev.x, prev.y);
        if (li == 0u) {
            vals[p.v_off + r * p.k + i] = x[base + prev.y];
            idx[p.i_off + r * p.k + i] = i32(prev.y);
        }
    }
}
