// Copies and casts. `copy_u32` moves 32-bit words untouched (any dtype whose window is word
// aligned); the casts convert between f32 and the 16-bit floats, two elements per thread so
// every 32-bit word is written by one thread.

struct Params {
    n: u32,        // words (copy) or element pairs (casts)
    a_off: u32,    // first word of the input
    y_off: u32,    // first word of the output
    tail: u32,     // casts: 1 when the last pair has only one element
    nx: u32,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@group(0) @binding(2) var<storage, read> p: Params;

fn index(wid: vec3<u32>, li: u32) -> u32 {
    return (wid.x + wid.y * p.nx) * 256u + li;
}

@compute @workgroup_size(256)
fn copy_u32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        y[p.y_off + i] = a[p.a_off + i];
    }
}

// f16 -> f32: pair i is input word i, output words 2i and 2i+1.
@compute @workgroup_size(256)
fn cast_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        let v = unpack2x16float(a[p.a_off + i]);
        y[p.y_off + 2u * i] = bitcast<u32>(v.x);
        if (i + 1u < p.n || p.tail == 0u) {
            y[p.y_off + 2u * i + 1u] = bitcast<u32>(v.y);
        }
    }
}

@compute @workgroup_size(256)
fn cast_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        let v = a[p.a_off + i];
        y[p.y_off + 2u * i] = v << 16u;
        if (i + 1u < p.n || p.tail == 0u) {
            y[p.y_off + 2u * i + 1u] = v & 0xFFFF0000u;
        }
    }
}

// An upload's bytes into words it shares with other bytes (a browser cannot read them back
// first): thread w owns destination word w (from `pb.y_off`), taking the window's bytes
// (`src`, packed from the window's first byte) where they fall in it and keeping the word's
// other bytes. `pb.head` is the window's first byte within word 0.
struct PatchParams {
    n: u32,        // destination words
    y_off: u32,    // first destination word
    head: u32,     // byte of the window's start within the first word (0..3)
    len: u32,      // bytes in the window
    nx: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> pb: PatchParams;

@compute @workgroup_size(256)
fn patch_bytes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let w = (wid.x + wid.y * pb.nx) * 256u + li;
    if (w >= pb.n) {
        return;
    }
    var v = dst[pb.y_off + w];
    for (var b = 0u; b < 4u; b++) {
        let pos = w * 4u + b;
        if (pos >= pb.head && pos - pb.head < pb.len) {
            let i = pos - pb.head;
            let byte = (src[i / 4u] >> ((i % 4u) * 8u)) & 0xFFu;
            v = (v & ~(0xFFu << (b * 8u))) | (byte << (b * 8u));
        }
    }
    dst[pb.y_off + w] = v;
}
