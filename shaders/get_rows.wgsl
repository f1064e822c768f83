// Embedding lookup: y[i, :] = table[ids[i], :], the table in any block format (template:
// DQ32 decodes a 32-element chunk, ENTRY names the entry point). One thread per output
// chunk. A launch covers table rows row0 .. row0 + rows (tables larger than one storage
// binding are looked up in several launches); ids outside it are left to the other launches.

struct Params {
    n_ids: u32,
    d: u32,        // row length in elements
    ids_off: u32,
    w_off: u32,    // byte of table row row0
    w_row: u32,    // bytes per table row
    y_off: u32,
    row0: u32,
    rows: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> p: Params;

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let chunks = (p.d + 31u) / 32u;
    let g = (wid.x + wid.y * p.nx) * 64u + li;
    if (g >= p.n_ids * chunks) {
        return;
    }
    let i = g / chunks;
    let c = g % chunks;
    let id = ids[p.ids_off + i];
    if (id < i32(p.row0) || id >= i32(p.row0 + p.rows)) {
        return;
    }
    let row = p.w_off + (u32(id) - p.row0) * p.w_row;
    let v = DQ32(row, c);
    let lim = min(32u, p.d - c * 32u);
    for (var j = 0u; j < lim; j++) {
        y[p.y_off + i * p.d + c * 32u + j] = v[j];
    }
}
