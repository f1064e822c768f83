// Rotary position embedding of x [T, H, D] at positions pos [T]. One thread per element.
// The host computes base^(-2j/n_rot) for each pair j (inv_freq, exactly as the CPU does);
// the optional freq_factors divide it. Dims at or past n_rot pass through.
//   normal: pairs (2j, 2j+1)    neox: pairs (j, j + n_rot/2)

struct Params {
    t: u32,
    h: u32,
    d: u32,
    n_rot: u32,
    neox: u32,
    x_off: u32,
    pos_off: u32,
    ff_off: u32,
    has_ff: u32,
    y_off: u32,
    freq_scale: f32,
    attn_factor: f32,
    nx: u32,
    inv_freq: array<f32>,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> pos: array<i32>;
@group(0) @binding(2) var<storage, read> ff: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> p: Params;

@compute @workgroup_size(256)
fn rope_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = (wid.x + wid.y * p.nx) * 256u + li;
    if (g >= p.t * p.h * p.d) {
        return;
    }
    let i = g % p.d;
    let tok = g / (p.h * p.d);
    let head = g - i;
    if (i >= p.n_rot) {
        y[p.y_off + g] = x[p.x_off + g];
        return;
    }
    let half = p.n_rot / 2u;
    var j: u32;
    var a: u32;
    var b: u32;
    if (p.neox != 0u) {
        j = i % half;
        a = j;
        b = j + half;
    } else {
        j = i / 2u;
        a = 2u * j;
        b = 2u * j + 1u;
    }
    var f = p.inv_freq[j];
    if (p.has_ff != 0u) {
        f = f / ff[p.ff_off + j];
    }
    let theta = (f32(pos[p.pos_off + tok]) * p.freq_scale) * f;
    let c = cos(theta) * p.attn_factor;
    let s = sin(theta) * p.attn_factor;
    let x0 = x[p.x_off + head + a];
    let x1 = x[p.x_off + head + b];
    if (i == a) {
        y[p.y_off + g] = x0 * c - x1 * s;
    } else {
        y[p.y_off + g] = x0 * s + x1 * c;
    }
}
