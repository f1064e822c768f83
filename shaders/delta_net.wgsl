// The Gated DeltaNet recurrence, non-fused: one thread per (sequence, value head, state
// column j). Column j of a head's state S [Dk, Dv] evolves on its own:
//   S *= e^g;  delta = (v_j - k . S[:, j]) * beta;  S[:, j] += k * delta;  o_j = (q*scale) . S[:, j]
// The state is copied to state_out first and updated there, token by token. Ten bindings:
// adapters with fewer storage buffers per stage run it on the CPU (supports_op says so).

struct Params {
    hk: u32,
    hv: u32,
    dk: u32,
    dv: u32,
    n_seqs: u32,
    q_off: u32,
    k_off: u32,
    v_off: u32,
    g_off: u32,
    b_off: u32,
    st_off: u32,
    ss_off: u32,
    o_off: u32,
    so_off: u32,
    scale: f32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> beta: array<f32>;
@group(0) @binding(5) var<storage, read> state: array<f32>;
@group(0) @binding(6) var<storage, read> seq_start: array<i32>;
@group(0) @binding(7) var<storage, read_write> o: array<f32>;
@group(0) @binding(8) var<storage, read_write> state_out: array<f32>;
@group(0) @binding(9) var<storage, read> p: Params;

@compute @workgroup_size(64)
fn delta_net_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let sh = wid.x + wid.z * p.nx;     // sequence * hv + head
    let j = wid.y * 64u + li;
    if (sh >= p.n_seqs * p.hv || j >= p.dv) {
        return;
    }
    let s = sh / p.hv;
    let h = sh % p.hv;
    let kh = h / (p.hv / p.hk);
    let col = (sh * p.dk) * p.dv + j;    // S[s, h, 0, j]
    for (var i = 0u; i < p.dk; i++) {
        state_out[p.so_off + col + i * p.dv] = state[p.st_off + col + i * p.dv];
    }
    let a = u32(seq_start[p.ss_off + s]);
    let b = u32(seq_start[p.ss_off + s + 1u]);
    for (var t = a; t < b; t++) {
        let decay = exp(g[p.g_off + t * p.hv + h]);
        let bt = beta[p.b_off + t * p.hv + h];
        let kb = p.k_off + (t * p.hk + kh) * p.dk;
        var kv = 0.0;
        for (var i = 0u; i < p.dk; i++) {
            let e = p.so_off + col + i * p.dv;
            let sv = state_out[e] * decay;
            state_out[e] = sv;
            kv += k[kb + i] * sv;
        }
        let delta = (v[p.v_off + (t * p.hv + h) * p.dv + j] - kv) * bt;
        let qb = p.q_off + (t * p.hk + kh) * p.dk;
        var acc = 0.0;
        for (var i = 0u; i < p.dk; i++) {
            let e = p.so_off + col + i * p.dv;
            let sv = state_out[e] + k[kb + i] * delta;
            state_out[e] = sv;
            acc += (q[qb + i] * p.scale) * sv;
        }
        o[p.o_off + (t * p.hv + h) * p.dv + j] = acc;
    }
}
