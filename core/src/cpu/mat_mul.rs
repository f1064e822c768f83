//! MatMul and its fused forms: `y = x · Wᵀ` with W in any dtype, dequantized a row at a time.

use super::simd::{self, Isa};
use super::{
    elementwise, norm, pool, qdot, qdot256, qdot_int, qdot_vnni, qdot_x16, qdot_x16f, qdot_x16i,
    In, KResult, Out,
};
use crate::op::{GluOp, MatMulOp};
use crate::quant;
use crate::tensor::DType;

/// Weight rows dequantized at a time: one tile, reused by every activation row.
const TILE: usize = 8;
/// The same for the fused formats' prefill of at least as many activation rows: a larger
/// tile reads the activations fewer times (Gemma 3's pp128: +8% over 8 rows, at 1 and 2
/// threads; 64 rows measured slower). A small batch of decodes keeps [`TILE`].
const TILE_FUSED: usize = 32;

thread_local! {
    /// Dequantized weight rows of the current tile, reused across tiles on a thread.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// The activations of a fused prefill matmul in the tile kernel's pass order, reused
    /// across calls on the thread that starts them.
    static PASS_X: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// The activations of an integer-kernel matmul split into digits (`qdot_int`), reused
    /// across calls on the thread that starts them.
    static SPLIT_X: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The integer kernels' prefill: activation rows per pass over a piece's weight rows (their
/// split digits, ~6 KB a row at k = 2048, stay in L2) and weight rows per tile (in L1 while
/// the pass's rows go by).
const INT_ACT_ROWS: usize = 64;
const INT_TILE: usize = 16;
/// Activation rows per integer-kernel call in prefill: 1B Llama pp128 on 2 AVX2 threads, Q6_K
/// 15 / 19-22 / 25 t/s and Q4_K 26 / 29-30 / 27-33 at 4 / 2 / 3 rows (4 spills registers).
const INT_ROWS: usize = 3;
/// The same for the AVX-512 VNNI kernels (which pair weight rows when there are several
/// activation rows): 1B Llama Q4_K pp128 on 2 threads 66.6 / 63.5 / 71.0 t/s at 2 / 3 / 4 rows.
const VNNI_ROWS: usize = qdot_vnni::MAX_ROWS;

/// Activation rows up to which the fused kernel runs; more take the tile path (same bits).
/// Measured on the 2-core AVX-512 machine, prompt tokens/s of a pass of m rows, fused
/// against tiled: SmolLM2 Q4_1 m=2 165 vs 157, m=3 178 vs 205, m=4 186 vs 233, m=5 168 vs
/// 259, m=6 182 vs 281; Gemma 3 Q4_K_M m=4 150 vs 171, m=5 152 vs 211, m=6 174 vs 224. A
/// pass of a few rows is a speculative verification or a small batch of decodes.
const FUSED_ROWS: usize = 2;

/// Pieces per thread for the tiled paths: enough that a core slowed by other work hands some
/// to the other.
const TILE_PIECES: usize = 4;
/// The same for the fused formats' prefill, whose tiles are cheaper to decode.
const TILE_PIECES_FUSED: usize = 12;

/// Tile dequantization of one row, compiled for AVX-512 (the block decoders vectorise under it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dequantize_row_avx512(dtype: DType, src: &[u8], dst: &mut [f32]) {
    quant::dequantize_row(dtype, src, dst)
}

/// The same compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_row_avx2(dtype: DType, src: &[u8], dst: &mut [f32]) {
    quant::dequantize_row(dtype, src, dst)
}

fn dequantize_row_isa(isa: Isa, dtype: DType, src: &[u8], dst: &mut [f32]) {
    match isa {
        // SAFETY: `isa` is what the CPU has (simd::isa).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { dequantize_row_avx512(dtype, src, dst) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { dequantize_row_avx2(dtype, src, dst) },
        _ => quant::dequantize_row(dtype, src, dst),
    }
}

/// The tiled matmul shared by every path that dequantizes weights: the weight rows are split
/// over the pool in pieces of whole tiles; for each tile of up to `tile_rows` rows, `decode(src,
/// dst)` turns each weight row's `rb` bytes into its `k` f32 in the tile, and `dots(tile, rows,
/// y, n0)` multiplies the tile into columns `n0..n0 + rows` of `y`.
#[allow(clippy::too_many_arguments)]
fn tiled(
    k: usize,
    y: &pool::SendPtr<f32>,
    n: usize,
    w: &[u8],
    rb: usize,
    (tile_rows, pieces): (usize, usize),
    decode: impl Fn(&[u8], &mut [f32]) + Sync,
    dots: impl Fn(&[f32], usize, *mut f32, usize) + Sync,
) {
    pool::par_ranges(n, tile_rows, pieces, |range| {
        let mut tile = SCRATCH.with(|c| c.take());
        if tile.len() < tile_rows * k {
            tile.resize(tile_rows * k, 0.0);
        }
        let mut n0 = range.start;
        while n0 < range.end {
            let rows = tile_rows.min(range.end - n0);
            for r in 0..rows {
                let src = &w[(n0 + r) * rb..(n0 + r + 1) * rb];
                decode(src, &mut tile[r * k..(r + 1) * k]);
            }
            dots(&tile, rows, y.0, n0);
            n0 += rows;
        }
        SCRATCH.with(|c| c.replace(tile));
    });
}

/// [`tile_dots`] for tiles decoded by the fused kernels' decoders, through their tile kernel
/// (which sums in the fused decode order, so a row's bits do not depend on the batch). `x` and
/// the tile are in [`qdot::passes`] order.
///
/// # Safety
/// As for [`tile_dots`]; the weights' format has a fused kernel and `k` is a multiple of 32.
#[allow(clippy::too_many_arguments)]
unsafe fn fused_tile_dots(
    x: &[f32],
    m: usize,
    k: usize,
    wt: *const f32,
    rows: usize,
    y: *mut f32,
    ldy: usize,
    n0: usize,
) {
    const C: usize = qdot::TILE_COLS;
    let mut out = [[0f32; C]; qdot::TILE_ROWS];
    let mut i = 0;
    while i < m {
        let mr = qdot::TILE_ROWS.min(m - i);
        let mut j = 0;
        while j < rows {
            let nr = C.min(rows - j);
            // Fewer than four weight rows repeat the last one; its sums are not stored.
            let w = std::array::from_fn(|t| wt.add((j + t.min(nr - 1)) * k));
            qdot::tile_dots(
                x.as_ptr().add(i * k),
                k,
                mr,
                w,
                k,
                out.as_mut_ptr().cast(),
                C,
            );
            for (ii, o) in out.iter().enumerate().take(mr) {
                let dst = y.add((i + ii) * ldy + n0 + j);
                for (jj, v) in o.iter().enumerate().take(nr) {
                    *dst.add(jj) = *v;
                }
            }
            j += C;
        }
        i += mr;
    }
}

/// `y[i, n0 + j] = x[i] · wt[j]` for every activation row `i < m` and tile row `j < rows`,
/// where `wt` is `rows` f32 rows of `k`.
///
/// # Safety
/// `y` must point to `m` rows of `ldy` writable f32 that no other thread writes at columns
/// `n0..n0 + rows`; `x` holds `m · k` f32 and `wt` `rows · k`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_dots(
    isa: Isa,
    x: &[f32],
    m: usize,
    k: usize,
    wt: *const f32,
    rows: usize,
    y: *mut f32,
    ldy: usize,
    n0: usize,
) {
    let mr_max = simd::max_rows(isa);
    let mut out: simd::Sums = [[0f32; 4]; 4];
    let mut i = 0;
    while i < m {
        let mr = mr_max.min(m - i);
        let mut j = 0;
        while j < rows {
            let nr = 4.min(rows - j);
            // Fewer than four weight rows repeat the last one; its sums are not stored.
            let w = std::array::from_fn(|t| wt.add((j + t.min(nr - 1)) * k));
            simd::dots(isa, x.as_ptr().add(i * k), k, mr, w, k, &mut out);
            for (ii, o) in out.iter().enumerate().take(mr) {
                let dst = y.add((i + ii) * ldy + n0 + j);
                for (jj, v) in o.iter().enumerate().take(nr) {
                    *dst.add(jj) = *v;
                }
            }
            j += 4;
        }
        i += mr;
    }
}

/// Runs a row kernel over an `m × n` output: the weight rows (columns of y) are split over the
/// pool; each piece goes through the activation rows [`INT_ACT_ROWS`] at a time, a tile of
/// [`INT_TILE`] weight rows at a time, calling `kernel(i, mr, cols)` for activation rows
/// `i..i + mr` (`mr ≤ max_rows`) and weight rows `cols`. A call's columns belong to its piece
/// alone.
fn row_tiles(
    m: usize,
    n: usize,
    max_rows: usize,
    kernel: impl Fn(usize, usize, std::ops::Range<usize>) + Sync,
) {
    tiles(m, n, (4, INT_TILE), INT_ACT_ROWS, max_rows, kernel)
}

/// [`row_tiles`] with its sizes given: `n`'s pieces are multiples of `align` and walked
/// `tile` at a time, the activation rows `act_rows` at a time (`n` may count groups of weight
/// rows, as the interleaved layout's).
fn tiles(
    m: usize,
    n: usize,
    (align, tile): (usize, usize),
    act_rows: usize,
    max_rows: usize,
    kernel: impl Fn(usize, usize, std::ops::Range<usize>) + Sync,
) {
    let pieces = if m <= FUSED_ROWS {
        4
    } else {
        TILE_PIECES_FUSED
    };
    pool::par_ranges(n, align, pieces, |range| {
        let mut a0 = 0;
        while a0 < m {
            let a1 = (a0 + act_rows).min(m);
            let mut n0 = range.start;
            while n0 < range.end {
                let n1 = (n0 + tile).min(range.end);
                let mut i = a0;
                while i < a1 {
                    let mr = max_rows.min(a1 - i);
                    kernel(i, mr, n0..n1);
                    i += mr;
                }
                n0 = n1;
            }
            a0 = a1;
        }
    });
}

/// `y [m, n] = x [m, k] · Wᵀ` where `w` holds `n` rows of `k` elements of `dtype`: weight
/// rows are split over the CPU pool; each thread dequantizes a tile of rows once into a small
/// buffer that stays in cache and runs the vectorised dot micro-kernel over every activation
/// row. f32 weights are read in place.
pub(crate) fn gemm(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n: usize,
    y: &mut [f32],
) -> KResult {
    let rb = dtype.bytes_for(k).unwrap_or(0);
    if x.len() < m * k || y.len() < m * n || w.len() < n * rb || m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y[..m * n].fill(0.0);
        return Ok(());
    }
    let isa = simd::isa();
    let yp = pool::SendPtr(y.as_mut_ptr());
    // f32 weights in native byte order are used where they lie (unaligned loads).
    let direct = dtype == DType::F32 && cfg!(target_endian = "little");
    // Formats with a fused kernel. A few activation rows (decode, batched decode): dequantize
    // and dot in one pass over each weight row. More (prefill): decode each tile of weight rows
    // once with the same decoders and run the tile kernel, which sums in the fused kernel's
    // order. Both give the same bits for a row, so no result depends on the batch it came in
    // (a prefix-cache hit, a batch of sequences and a whole prompt agree exactly).
    // K-quants on AVX2, and on AVX-512 with VNNI: integer dot products over activations split
    // into three byte digits (`qdot_int`, `qdot_vnni`: within the f32 bound). Every batch size
    // runs the same row kernel, so a row's bits never depend on the batch.
    // On AVX-512 VNNI also Q8_0, Q5_1 and IQ4_XS (`qdot_vnni::split` says why not the others).
    let vnni = qdot_vnni::supported(isa, dtype) && qdot_vnni::fits(dtype, k);
    let int = qdot_int::supported(isa, dtype) && k.is_multiple_of(qdot_int::BLOCK);
    if vnni || int {
        let how = qdot_vnni::split(dtype)
            .filter(|_| vnni)
            .unwrap_or(qdot_int::K_SPLIT);
        let rl = qdot_int::row_bytes(k);
        let mut xs = SPLIT_X.with(|c| c.take());
        xs.resize(m * rl, 0);
        pool::par_rows(&mut xs[..], rl, norm::PAR_MIN, |r0, rows| {
            for (r, dst) in rows.chunks_exact_mut(rl).enumerate() {
                qdot_int::split_row(&x[(r0 + r) * k..(r0 + r + 1) * k], dst, how);
            }
        });
        let xp = pool::SendPtr(xs.as_ptr() as *mut u8);
        let rows = if vnni { VNNI_ROWS } else { INT_ROWS };
        row_tiles(m, n, rows, |i, mr, cols| {
            let (xp, yp) = (&xp, &yp);
            let (x, y) = (xp.0.wrapping_add(i * rl), (yp.0.wrapping_add(i * n), n));
            // SAFETY: the kernel handles `dtype` on this CPU (`supported`) and k is a multiple
            // of its block; rows i..i + mr of the split are filled; the weight rows in `cols`
            // lie inside `w`; y's columns in `cols` are this task's alone (`row_tiles`).
            unsafe {
                if vnni {
                    qdot_vnni::rows_dots(dtype, x, mr, k, (w.as_ptr(), rb), cols, y)
                } else {
                    qdot_int::rows_dots(dtype, x, mr, k, (w.as_ptr(), rb), cols, y)
                }
            };
        });
        SPLIT_X.with(|c| c.replace(xs));
        return Ok(());
    }
    // The 32-element formats on AVX2, a few activation rows (decode): the fused kernel, which does the tile
    // path's operations in its order (same bits); more rows take the tile path below.
    if qdot256::supported(isa, dtype) && k.is_multiple_of(32) && m <= qdot256::MAX_ROWS {
        pool::par_ranges(n, 4, 4, |range| {
            let yp = &yp;
            // SAFETY: the kernel handles `dtype` here and k is a multiple of 32; x holds m
            // rows of k; the rows in `range` lie inside `w`; y's columns in `range` are this
            // task's alone.
            unsafe {
                qdot256::rows_dots(
                    dtype,
                    x.as_ptr(),
                    k,
                    m,
                    k,
                    (w.as_ptr(), rb),
                    range,
                    (yp.0, n),
                )
            };
        });
        return Ok(());
    }
    if qdot::supported(isa, dtype) && k.is_multiple_of(32) {
        if m <= FUSED_ROWS {
            pool::par_ranges(n, 4, 4, |range| {
                let yp = &yp;
                // SAFETY: the fused kernel handles `dtype` here; the rows lie inside `w`, and
                // the columns of y in `range` are this task's alone.
                unsafe {
                    qdot::rows_dots(
                        dtype,
                        x.as_ptr(),
                        k,
                        m,
                        k,
                        (w.as_ptr(), rb),
                        range,
                        (yp.0, n),
                    )
                };
            });
        } else {
            // The activations in the tile kernel's pass order (as the tiles are decoded).
            let mut xp = PASS_X.with(|c| c.take());
            xp.resize(m * k, 0.0);
            pool::par_rows(&mut xp[..], k, norm::PAR_MIN, |r0, rows| {
                for (r, dst) in rows.chunks_exact_mut(k).enumerate() {
                    qdot::to_pass_order(&x[(r0 + r) * k..(r0 + r + 1) * k], dst);
                }
            });
            let x = &xp[..];
            tiled(
                k,
                &yp,
                n,
                w,
                rb,
                (
                    if m >= TILE_FUSED { TILE_FUSED } else { TILE },
                    TILE_PIECES_FUSED,
                ),
                // SAFETY: the fused kernels handle `dtype` and k is a multiple of 32; `src` is a
                // whole weight row and `dst` holds k f32.
                |src, dst| unsafe { qdot::decode_row(dtype, src.as_ptr(), k, dst.as_mut_ptr()) },
                // SAFETY: the tile holds `rows` rows of k; columns n0..n0+rows are this task's.
                |tile, rows, y, n0| unsafe {
                    fused_tile_dots(x, m, k, tile.as_ptr(), rows, y, n, n0)
                },
            );
            PASS_X.with(|c| c.replace(xp));
        }
        return Ok(());
    }
    if direct {
        // SAFETY: `w` holds n rows of k f32 (checked above); each piece's columns are its own.
        pool::par_ranges(n, TILE, TILE_PIECES, |range| unsafe {
            let y = &yp;
            let wt = (w.as_ptr() as *const f32).add(range.start * k);
            tile_dots(isa, x, m, k, wt, range.len(), y.0, n, range.start);
        });
        return Ok(());
    }
    tiled(
        k,
        &yp,
        n,
        w,
        rb,
        (TILE, TILE_PIECES),
        |src, dst| dequantize_row_isa(isa, dtype, src, dst),
        // SAFETY: the tile holds `rows` rows of k; columns n0..n0+rows are this task's.
        |tile, rows, y, n0| unsafe { tile_dots(isa, x, m, k, tile.as_ptr(), rows, y, n, n0) },
    );
    Ok(())
}

fn run(x: &[f32], w: &In, o: &mut Out) -> KResult {
    let (n, k) = (w.dims()[0], w.dims()[1]);
    let m = x.len() / k.max(1);
    if w.x16 {
        return o.with_f32(false, |y| gemm_x16(x, m, k, w.bytes, w.desc.dtype, n, y));
    }
    o.with_f32(false, |y| gemm(x, m, k, w.bytes, w.desc.dtype, n, y))
}

thread_local! {
    /// The activations' group sums (`qdot_x16::block_sums`), reused across calls.
    static BLOCK_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The activations split for `qdot_x16i`.
    static SPLIT_X16: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Groups of 16 weight rows a task takes at a time from its piece: every activation row goes
/// through them (64 rows of k, ~20 KB at k = 576, stay in L1 and L2) before the next.
const X16_TILE: usize = 4;

/// Bytes of activation rows (f32, or split for the integer kernel) one pass over a piece's
/// weights takes (see [`gemm_x16`]).
const X16_CHUNK_BYTES: usize = 512 << 10;

/// [`gemm`] for weights kept 16 rows interleaved (`qdot_x16`; `w.x16`): the same kernel for
/// every batch, up to eight activation rows a call (six for the f32 kernel), so a row's bits
/// never depend on the batch.
fn gemm_x16(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    n: usize,
    y: &mut [f32],
) -> KResult {
    let groups = n / qdot_x16::ROWS;
    let nb = k / 32;
    let rb = dtype.bytes_for(k).unwrap_or(usize::MAX);
    if x.len() < m * k || y.len() < m * n || w.len() < n.saturating_mul(rb) || m == 0 || groups == 0
    {
        return Ok(());
    }
    let mut xs = BLOCK_SUMS.with(|c| c.take());
    if qdot_x16::needs_sums(dtype) {
        qdot_x16::block_sums(&x[..m * k], k, &mut xs);
    }
    // The integer kernel's split rows (`int`: their stride), else the f32 rows.
    let mut split = SPLIT_X16.with(|c| c.take());
    let int = qdot_x16i::runs(dtype, k);
    if int {
        qdot_x16i::split_rows(&x[..m * k], k, dtype, &mut split);
    }
    let rb = qdot_x16i::row_bytes(k);
    let (xp, xsp) = (x.as_ptr(), pool::SendPtr(xs.as_ptr() as *mut f32));
    let xp = pool::SendPtr(xp as *mut f32);
    let sp = pool::SendPtr(split.as_ptr() as *mut u8);
    let yp = pool::SendPtr(y.as_mut_ptr());
    // Activation rows a pass over the piece's weights takes: what fits half of a 1 MB L2 (a
    // long prompt's rows, streamed again for every tile of weights, measured slower than the
    // piece's weights read again per pass).
    let row = if int { rb } else { 4 * k };
    let chunk = (X16_CHUNK_BYTES / row.max(1)).max(4 * qdot_x16::MAX_ROWS);
    let tile = (X16_TILE, X16_TILE);
    tiles(
        m,
        groups,
        tile,
        chunk,
        if int {
            qdot_x16i::MAX_ROWS
        } else {
            qdot_x16::MAX_ROWS
        },
        |i, mr, groups| {
            let (xp, xsp, yp, sp) = (&xp, &xsp, &yp, &sp);
            let y = (yp.0.wrapping_add(i * n), n);
            let xs = xsp.0.wrapping_add(i * nb) as *const f32;
            // SAFETY: the storage interleaved these weights (`qdot_x16::packs` held for them on
            // this CPU); x holds m rows of k (split into `rb` bytes each where `int`) and xs their
            // group sums where the format reads them; the groups lie inside `w`; y's columns of
            // these groups are this call's piece's alone.
            unsafe {
                if int {
                    let x = (sp.0.add(i * rb) as *const u8, rb, xs, nb);
                    qdot_x16i::rows_dots(dtype, x, mr, k, w.as_ptr(), groups, y)
                } else {
                    let x = (xp.0.add(i * k) as *const f32, k, xs);
                    qdot_x16f::rows_dots(dtype, x, mr, k, w.as_ptr(), groups, y)
                }
            }
        },
    );
    BLOCK_SUMS.with(|c| c.replace(xs));
    SPLIT_X16.with(|c| c.replace(split));
    Ok(())
}

pub(crate) fn mat_mul(i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    run(&x, &i[1], &mut o[0])
}

pub(crate) fn rms_norm_mat_mul(eps: f32, one_plus: bool, i: &[In], o: &mut [Out]) -> KResult {
    let mut x = i[0].f32()?.into_owned();
    let w = i[1].f32()?;
    norm::rms_norm_rows(&mut x, &w, eps, one_plus);
    for (w, o) in i[2..].iter().zip(o.iter_mut()) {
        run(&x, w, o)?;
    }
    Ok(())
}

pub(crate) fn glu_mat_mul(g: GluOp, i: &[In], o: &mut [Out]) -> KResult {
    let mut h = i[0].f32()?.into_owned();
    let up = i[1].f32()?;
    elementwise::glu_in_place(g, &mut h, &up);
    run(&h, &i[2], &mut o[0])?;
    match i.get(3) {
        Some(r) => add_residual(r, &mut o[0]),
        None => Ok(()),
    }
}

/// `x · wᵀ + r`: the matmul, then the residual added to each output (the same two roundings
/// as the separate ops).
pub(crate) fn mat_mul_add(i: &[In], o: &mut [Out]) -> KResult {
    let x = i[0].f32()?;
    run(&x, &i[1], &mut o[0])?;
    add_residual(&i[2], &mut o[0])
}

fn add_residual(r: &In, o: &mut Out) -> KResult {
    let r = r.f32()?;
    o.with_f32(true, |y| {
        for (y, r) in y.iter_mut().zip(r.iter()) {
            *y += r;
        }
        Ok(())
    })
}

/// The family's CPU reference (each fusion computed as its plain ops in turn).
pub(super) fn run_op(op: &MatMulOp, i: &[In], o: &mut [Out]) -> KResult {
    match op {
        MatMulOp::MatMul => mat_mul(i, o),
        MatMulOp::MatMulAdd => mat_mul_add(i, o),
        MatMulOp::RmsNormMatMul { eps, one_plus } => rms_norm_mat_mul(*eps, *one_plus, i, o),
        MatMulOp::GluMatMul(g) => glu_mat_mul(*g, i, o),
    }
}

/// Whether `op` splits its work over the backend's workers (the rest use rayon).
pub(super) fn on_workers(_op: &MatMulOp) -> bool {
    true
}
