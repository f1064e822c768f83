// y[n] = x . w[n] for one token (decode), w in a block format (template: DOT32 is the format's
// fused decode-and-dot of one 32-element chunk, ENTRY the entry point name). No per-thread
// arrays: each chunk is decoded four values at a time straight into vector dot products.
// A workgroup of 64 threads computes 4 features, 16 lanes per feature. With `has_r`, the
// residual r is added as each feature is written (mat_mul_add, and glu_mat_mul's down
// projection after its GLU: one dispatch where the composed op made two; the RMS norm folded
// in the same way, its sum of squares taken by every workgroup, made SmolLM2's decode on
// lavapipe 3.3 → 2.1 t/s, so the norm stays its own pass).

struct Params {
    n: u32,
    k: u32,
    x_off: u32,
    w_off: u32,
    w_row: u32,
    y_off: u32,
    y_col0: u32,
    nx: u32,
    r_off: u32,
    has_r: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> r: array<f32>;
@group(0) @binding(4) var<storage, read> p: Params;

const LANES: u32 = 16u;
const ROWS: u32 = 4u;

var<workgroup> partial: array<f32, 64>;

fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let n = (wid.x + wid.z * p.nx) * ROWS + li / LANES;
    var acc = 0.0;
    if (n < p.n) {
        let row = p.w_off + n * p.w_row;
        let chunks = p.k / 32u;
        for (var c = lane; c < chunks; c += LANES) {
            acc += DOT32(row, c, p.x_off + c * 32u);
        }
    }
    partial[li] = acc;
    workgroupBarrier();
    if (lane == 0u && n < p.n) {
        var s = 0.0;
        for (var l = 0u; l < LANES; l++) {
            s += partial[li + l];
        }
        if (p.has_r != 0u) {
            s += r[p.r_off + p.y_col0 + n];
        }
        y[p.y_off + p.y_col0 + n] = s;
    }
}
