// Block diffusion's canvas ops (DiffusionGemma), as the CPU reference defines them
// (core/src/cpu/canvas.rs, core/src/op/canvas.rs for the hashes).
//
// canvas_draw: one workgroup of 256 threads per canvas row. Pass 1 writes the processed row
// (logits · scale) and finds the argmax of the logits; pass 2 sums exp(p − m) and
// exp(p − m)·(p − m) for the entropy and finds the Gumbel-max draw, argmax of p + g.
//
// canvas_accept: one workgroup for the whole canvas (T ≤ 1024). Each thread ranks its
// positions by (entropy, index); thread 0 forms the running sums in rank order; then each
// position is accepted or re-noised, the argmax history is checked and shifted, and the
// status (accepted, stop) written.

struct Params {
    rows: u32,
    n: u32,
    x_off: u32,
    p_off: u32,
    a_off: u32,
    d_off: u32,
    e_off: u32,
    scale: u32,      // f32 bits
    seed_lo: u32,
    seed_hi: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> processed: array<f32>;
@group(0) @binding(2) var<storage, read_write> amax: array<i32>;
@group(0) @binding(3) var<storage, read_write> drawn: array<i32>;
@group(0) @binding(4) var<storage, read_write> ent: array<f32>;
@group(0) @binding(5) var<storage, read> p: Params;

// order_key and before: shaders/common/order.wgsl. mix32, row_key, gumbel:
// shaders/common/canvas_hash.wgsl.

var<workgroup> bkey: array<u32, 256>;
var<workgroup> bidx: array<u32, 256>;
var<workgroup> sz: array<f32, 256>;
var<workgroup> sez: array<f32, 256>;

// The best (key, index) over the workgroup; every thread gets it.
fn reduce_best(li: u32, k: u32, i: u32) -> vec2<u32> {
    bkey[li] = k;
    bidx[li] = i;
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
    // Loaded as uniform values (each load is a barrier too): a browser's shader compiler
    // then knows every thread takes the same branch on them.
    let r = vec2<u32>(workgroupUniformLoad(&bkey[0]), workgroupUniformLoad(&bidx[0]));
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn canvas_draw_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    let scale = bitcast<f32>(p.scale);
    let xb = p.x_off + r * p.n;
    let pb = p.p_off + r * p.n;
    var bk = 0u;
    var bi = 0xFFFFFFFFu;
    for (var j = li; j < p.n; j += 256u) {
        let v = x[xb + j];
        processed[pb + j] = v * scale;
        let k = order_key(v);
        if (bi == 0xFFFFFFFFu || before(k, j, bk, bi)) {
            bk = k;
            bi = j;
        }
    }
    let a = reduce_best(li, bk, bi).y;
    let m = x[xb + a] * scale;
    // Not finite (an infinite or NaN maximum): no entropy, the argmax drawn.
    if ((bitcast<u32>(m) & 0x7f800000u) == 0x7f800000u) {
        if (li == 0u) {
            amax[p.a_off + r] = i32(a);
            drawn[p.d_off + r] = i32(a);
            ent[p.e_off + r] = 0.0;
        }
        return;
    }
    let key = row_key(p.seed_lo, p.seed_hi, r);
    var z = 0.0;
    var ez = 0.0;
    bk = 0u;
    bi = 0xFFFFFFFFu;
    for (var j = li; j < p.n; j += 256u) {
        let v = x[xb + j] * scale;
        let d = v - m;
        if (d > -3.4e38) {
            let e = exp(d);
            z += e;
            ez += e * d;
        }
        let k = order_key(v + gumbel(key, j));
        if (bi == 0xFFFFFFFFu || before(k, j, bk, bi)) {
            bk = k;
            bi = j;
        }
    }
    sz[li] = z;
    sez[li] = ez;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if (li < step) {
            sz[li] += sz[li + step];
            sez[li] += sez[li + step];
        }
        workgroupBarrier();
    }
    let tz = sz[0];
    let tez = sez[0];
    let d = reduce_best(li, bk, bi).y;
    if (li == 0u) {
        amax[p.a_off + r] = i32(a);
        drawn[p.d_off + r] = i32(d);
        ent[p.e_off + r] = max(log(tz) - tez / tz, 0.0);
    }
}
