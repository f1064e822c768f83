// canvas_accept: entropy-bound acceptance of one canvas's draws, in place (see
// shaders/canvas.wgsl and core/src/cpu/canvas.rs). One workgroup of 256 threads; T ≤ 1024.

struct Params {
    t: u32,
    stability: u32,
    vocab: u32,
    bound: u32,      // f32 bits
    confidence: u32, // f32 bits
    seed_lo: u32,
    seed_hi: u32,
    a_off: u32,
    d_off: u32,
    e_off: u32,
    c_off: u32,
    h_off: u32,
    s_off: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> amax: array<i32>;
@group(0) @binding(1) var<storage, read> drawn: array<i32>;
@group(0) @binding(2) var<storage, read> ent: array<f32>;
@group(0) @binding(3) var<storage, read_write> canvas: array<i32>;
@group(0) @binding(4) var<storage, read_write> history: array<i32>;
@group(0) @binding(5) var<storage, read_write> status: array<i32>;
@group(0) @binding(6) var<storage, read> p: Params;

var<workgroup> sorted: array<f32, 1024>;
var<workgroup> cum: array<f32, 1024>;
var<workgroup> n_accepted: atomic<u32>;
var<workgroup> unstable: atomic<u32>;

// An unsigned key whose order is f32 total order, ascending.
fn asc_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

@compute @workgroup_size(256)
fn canvas_accept(@builtin(local_invocation_index) li: u32) {
    let t = p.t;
    if (li == 0u) {
        atomicStore(&n_accepted, 0u);
        atomicStore(&unstable, 0u);
    }
    // Ranks: lower entropy first, then lower index (at most 4 positions per thread).
    var ranks: array<u32, 4>;
    for (var q = 0u; q < 4u; q++) {
        let i = li + q * 256u;
        if (i < t) {
            let ki = asc_key(ent[p.e_off + i]);
            var rank = 0u;
            for (var j = 0u; j < t; j++) {
                let kj = asc_key(ent[p.e_off + j]);
                if (kj < ki || (kj == ki && j < i)) {
                    rank++;
                }
            }
            ranks[q] = rank;
            sorted[rank] = ent[p.e_off + i];
        }
    }
    workgroupBarrier();
    if (li == 0u) {
        var s = 0.0;
        for (var r = 0u; r < t; r++) {
            s += sorted[r];
            cum[r] = s;
        }
    }
    // Stability: every kept history row equals the argmax.
    for (var q = 0u; q < 4u; q++) {
        let i = li + q * 256u;
        if (i < t) {
            for (var h = 0u; h < p.stability; h++) {
                if (history[p.h_off + h * t + i] != amax[p.a_off + i]) {
                    atomicStore(&unstable, 1u);
                }
            }
        }
    }
    workgroupBarrier();
    let bound = bitcast<f32>(p.bound);
    for (var q = 0u; q < 4u; q++) {
        let i = li + q * 256u;
        if (i < t) {
            let e = ent[p.e_off + i];
            if (cum[ranks[q]] - e <= bound) {
                canvas[p.c_off + i] = drawn[p.d_off + i];
                atomicAdd(&n_accepted, 1u);
            } else {
                let h = mix32(0xFFFFFFFFu ^ row_key(p.seed_lo, p.seed_hi, i));
                canvas[p.c_off + i] = i32(h % p.vocab);
            }
            for (var h = 0u; h + 1u < p.stability; h++) {
                history[p.h_off + h * t + i] = history[p.h_off + (h + 1u) * t + i];
            }
            if (p.stability > 0u) {
                history[p.h_off + (p.stability - 1u) * t + i] = amax[p.a_off + i];
            }
        }
    }
    workgroupBarrier();
    if (li == 0u) {
        let stable = atomicLoad(&unstable) == 0u;
        let stop = stable && cum[t - 1u] < bitcast<f32>(p.confidence) * f32(t);
        status[p.s_off] = i32(atomicLoad(&n_accepted));
        status[p.s_off + 1u] = select(0, 1, stop);
    }
}
