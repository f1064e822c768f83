// Matmul by expert id: y[r] = x[src(r)] . w[ids[r]]^T for the T*k rows r of ids [T, k], with
// src(r) = r (x [T, k, K], one input per slot) or r / k (x [T, K], shared by the slots).
// Template: DQ32 decodes a 32-element weight chunk, ENTRY names the entry point. A workgroup
// of 64 threads computes 4 output features of one row, 16 lanes per feature.

struct Params {
    rows: u32,        // T * k
    slots: u32,       // k
    per_slot: u32,
    n: u32,
    kdim: u32,
    n_experts: u32,
    x_off: u32,
    w_off: u32,
    w_row: u32,       // bytes per weight row
    ids_off: u32,
    y_off: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> p: Params;

const LANES: u32 = 16u;
const ROWS: u32 = 4u;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let n = (wid.x + wid.z * p.nx) * ROWS + li / LANES;
    let r = wid.y;
    let e = ids[p.ids_off + r];
    let ok = n < p.n && e >= 0 && u32(e) < p.n_experts;
    var acc = 0.0;
    if (ok) {
        let row = p.w_off + (u32(e) * p.n + n) * p.w_row;
        var src = r / p.slots;
        if (p.per_slot != 0u) {
            src = r;
        }
        let xb0 = p.x_off + src * p.kdim;
        let chunks = (p.kdim + 31u) / 32u;
        for (var c = lane; c < chunks; c += LANES) {
            let wv = DQ32(row, c);
            let xb = xb0 + c * 32u;
            let lim = min(32u, p.kdim - c * 32u);
            for (var j = 0u; j < lim; j++) {
                acc += x[xb + j] * wv[j];
            }
        }
    }
    partial[li] = acc;
    workgroupBarrier();
    if (lane == 0u && n < p.n) {
        var s = 0.0;
        for (var l = 0u; l < LANES; l++) {
            s += partial[li + l];
        }
        y[p.y_off + r * p.n + n] = s;
    }
}
