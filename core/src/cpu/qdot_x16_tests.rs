//! Tests of the 16-row interleaved weights (`qdot_x16.rs`): the layout against the file's,
//! the kernel against an f64 dot, a row's bits against its batch, and the CPU backend keeping
//! such matrices (upload, download, row lookups, other ops) as if they were in the file layout.

use super::*;
use crate::backend::Backend;
use crate::cpu::{qdot_x16f, qdot_x16i};
use crate::cpu::{simd, CpuBackend};
use crate::op::{ElementwiseOp, GetRowsOp, MatMulOp, Op};
use crate::quant;
use crate::rng::Rng;
use crate::tensor::TensorDesc;

/// The formats of the f32 kernel (`qdot_x16f`).
const TYPES: [DType; 8] = [
    DType::IQ4_NL,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4_XS,
    DType::Q4_K,
    DType::Q8_0,
];

/// Row lengths to try: whole blocks of the format (`big` for the 256-element ones).
fn lengths(dt: DType, small: [usize; 3], big: [usize; 3]) -> [usize; 3] {
    if dt.block_size() == 256 {
        big
    } else {
        small
    }
}

/// `n` random rows of `k` in `dtype`'s file layout, rows of different scales.
fn weights(dtype: DType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let w: Vec<f32> = (0..n * k)
        .map(|i| rng.normal() * (1.0 + (i / k) as f32 * 0.25) + 0.1)
        .collect();
    quant::quantize(dtype, &w).unwrap()
}

#[test]
fn interleaving_is_a_permutation_of_the_file_blocks() {
    let mut rng = Rng::new(31);
    for dt in TYPES.into_iter().chain([DType::Q5_K, DType::Q6_K]) {
        let ks = lengths(dt, [32, 64, 576], [256, 512, 768]);
        for (n, k) in [16, 48, 32].into_iter().zip(ks) {
            // Any bytes: the layouts move bytes and nibbles, whatever they hold.
            let file: Vec<u8> = (0..n * dt.bytes_for(k).unwrap())
                .map(|_| rng.next_u64() as u8)
                .collect();
            let mut packed = vec![0u8; file.len()];
            pack(dt, k, &file, &mut packed);
            assert_ne!(packed, file, "{dt} {n}x{k}: the layout changed nothing");
            let mut back = vec![0u8; file.len()];
            unpack(dt, k, &packed, &mut back);
            assert_eq!(back, file, "{dt} {n}x{k}");
            let rb = dt.bytes_for(k).unwrap();
            for r in 0..n {
                let mut row = vec![0u8; rb];
                unpack_row(dt, k, &packed, r, &mut row);
                assert_eq!(row, file[r * rb..(r + 1) * rb], "{dt} {n}x{k} row {r}");
            }
        }
    }
}

/// Group `g`'s 6-bit scale and minimum in the 12 bytes `q` of a Q4_K or Q5_K block.
fn k4_scale_min(q: &[u8], g: usize) -> (u8, u8) {
    if g < 4 {
        (q[g] & 63, q[g + 4] & 63)
    } else {
        (
            (q[g + 4] & 15) | ((q[g - 4] >> 6) << 4),
            (q[g + 4] >> 4) | ((q[g] >> 6) << 4),
        )
    }
}

/// Each element's effective scale `a`, offset `m` and level (the weight is `a · level + m`):
/// the formats' definitions, read from the file bytes independently of `quant`.
fn decoded(dt: DType, row: &[u8], k: usize) -> Vec<(f64, f64, f64)> {
    const IQ4: [f64; 16] = [
        -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0,
        69.0, 89.0, 113.0,
    ];
    let f16 = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64();
    let bs = dt.block_size();
    let bb = dt.bytes_for(bs).unwrap();
    (0..k)
        .map(|e| {
            let b = &row[(e / bs) * bb..(e / bs + 1) * bb];
            let (g, l) = ((e % bs) / 32, e % 32);
            // 16 bytes of codes per group of 32: element l in the low (l < 16) or high nibble.
            let nib = |qs: &[u8]| (if l < 16 { qs[l] & 15 } else { qs[l - 16] >> 4 }) as usize;
            match dt {
                DType::IQ4_NL => (f16(b, 0), 0.0, IQ4[nib(&b[2..])]),
                DType::Q8_0 => (f16(b, 0), 0.0, b[2 + l] as i8 as f64),
                DType::Q4_0 => (f16(b, 0), 0.0, nib(&b[2..]) as f64 - 8.0),
                DType::Q4_1 => (f16(b, 0), f16(b, 2), nib(&b[4..]) as f64),
                // The fifth bit of element l: bit l of the u32 after the scales.
                DType::Q5_0 => {
                    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                    let code = nib(&b[6..]) | (((qh >> l) & 1) as usize) << 4;
                    (f16(b, 0), 0.0, code as f64 - 16.0)
                }
                DType::Q5_1 => {
                    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                    let code = nib(&b[8..]) | (((qh >> l) & 1) as usize) << 4;
                    (f16(b, 0), f16(b, 2), code as f64)
                }
                DType::IQ4_XS => {
                    let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 15;
                    let hi = (u16::from_le_bytes([b[2], b[3]]) >> (2 * g)) & 3;
                    let sc = (lo as i32 | (hi as i32) << 4) - 32;
                    (f16(b, 0) * sc as f64, 0.0, IQ4[nib(&b[8 + 16 * g..])])
                }
                DType::Q5_K => {
                    // Q4_K's head and nibbles (from byte 48), the fifth bits at bit g of byte
                    // 16 + l.
                    let (sc, mn) = k4_scale_min(&b[4..16], g);
                    let lo = (b[48 + 32 * (g / 2) + l] >> (4 * (g % 2))) & 15;
                    let code = lo | ((b[16 + l] >> g) & 1) << 4;
                    (f16(b, 0) * sc as f64, -f16(b, 2) * mn as f64, code as f64)
                }
                DType::Q6_K => {
                    // ql (128 bytes: element 128n + 32s + l's nibble in byte 64n + 32 (s % 2)
                    // + l, high for s ≥ 2), qh (64: its 2 high bits at bit 2s of byte 32n +
                    // l), 16 signed scales (one per 16 elements), d; w = d · sc · (q - 32).
                    let (n, s, l) = ((e % bs) / 128, (e % 128) / 32, e % 32);
                    let lo = (b[64 * n + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                    let hi = (b[128 + 32 * n + l] >> (2 * s)) & 3;
                    let a = f16(b, 208) * (b[192 + (e % bs) / 16] as i8) as f64;
                    (a, -32.0 * a, (lo | hi << 4) as f64)
                }
                _ => {
                    // Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of codes
                    // (groups 2i and 2i + 1: the low and high nibbles of bytes 32i..32i + 32).
                    let (sc, mn) = k4_scale_min(&b[4..16], g);
                    let code = (b[16 + 32 * (g / 2) + l] >> (4 * (g % 2))) & 15;
                    (f16(b, 0) * sc as f64, -f16(b, 2) * mn as f64, code as f64)
                }
            }
        })
        .collect()
}

/// Runs `call(i, mr, groups, y)` (activation rows `i..i + mr` of `x` against the weight groups
/// into `y`) a row at a time over every group, the decode path, and holds each output to an
/// f64 dot of the file's weights within the f32 kernels' bound plus `extra(row's weights, x
/// row)`; then every batch size and any range of groups must give the same bits.
fn check_rows(
    dt: DType,
    (n, k): (usize, usize),
    file: &[u8],
    x: &[f32],
    call: &dyn Fn(usize, usize, std::ops::Range<usize>, &mut [f32]),
    extra: &dyn Fn(&[(f64, f64, f64)], &[f32]) -> f64,
) {
    let m = x.len() / k;
    let mut one = vec![f32::NAN; m * n];
    for i in 0..m {
        call(i, 1, 0..n / ROWS, &mut one);
    }
    let rb = dt.bytes_for(k).unwrap();
    for r in 0..n {
        let wr = decoded(dt, &file[r * rb..(r + 1) * rb], k);
        for i in 0..m {
            let xi = &x[i * k..(i + 1) * k];
            let want: f64 = wr
                .iter()
                .zip(xi)
                .map(|((d, mn, l), x)| (d * l + mn) * *x as f64)
                .sum();
            let mag: f64 = wr
                .iter()
                .zip(xi)
                .map(|((d, mn, l), x)| ((d * l).abs() + mn.abs()) * (*x as f64).abs())
                .sum();
            // The minimums multiply sums of 32 activations (five roundings).
            let bound = (48.0 + (k / 32) as f64) * 2f64.powi(-24) * mag + extra(&wr, xi);
            let got = one[i * n + r] as f64;
            assert!(
                (got - want).abs() <= bound,
                "{dt} {n}x{k} row {r} act {i}: {got} vs {want} (bound {bound:e})"
            );
        }
    }
    for mr in 2..=m {
        let mut y = vec![f32::NAN; m * n];
        let mut i = 0;
        while i + mr <= m {
            call(i, mr, 1..n / ROWS, &mut y);
            call(i, mr, 0..1, &mut y);
            i += mr;
        }
        for (j, (a, b)) in y[..i * n].iter().zip(&one).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{dt} {n}x{k} mr {mr}: output {j}");
        }
    }
}

#[test]
fn interleaved_rows_match_an_f64_dot_and_their_bits_do_not_depend_on_the_batch() {
    if !packs(simd::isa(), DType::IQ4_NL, &[16, 32]) {
        eprintln!("skipped: no AVX-512 here ({:?})", simd::isa());
        return;
    }
    let mut rng = Rng::new(32);
    // Q8_0 packed in lanes is the integer kernel's alone (`integer_types`).
    for dt in TYPES
        .into_iter()
        .filter(|&dt| dt != DType::Q8_0 || !q8_lanes())
    {
        let ks = lengths(dt, [576, 1536, 32], [256, 1536, 768]);
        for (n, k) in [48, 32, 80].into_iter().zip(ks) {
            let file = weights(dt, n, k, &mut rng);
            let mut packed = vec![0u8; file.len()];
            pack(dt, k, &file, &mut packed);
            let m = MAX_ROWS;
            let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
            let mut xs = Vec::new();
            block_sums(&x, k, &mut xs);
            assert_eq!(xs.len(), m * k / 32);
            let call = |i: usize, mr: usize, groups: std::ops::Range<usize>, y: &mut [f32]| unsafe {
                qdot_x16f::rows_dots(
                    dt,
                    (x.as_ptr().add(i * k), k, xs.as_ptr().add(i * (k / 32))),
                    mr,
                    k,
                    packed.as_ptr(),
                    groups,
                    (y.as_mut_ptr().add(i * n), n),
                )
            };
            // One activation row at a time over all groups: the decode path.
            check_rows(dt, (n, k), &file, &x, &call, &|_, _| 0.0);
        }
    }
}

/// The CPU backend with an interleaved matrix behaves as with the file's bytes: downloads,
/// partial uploads, row lookups, an op that reads it otherwise, and the matmul against the
/// same weights in a tensor it cannot interleave.
#[test]
fn the_backend_keeps_interleaved_matrices_invisible() {
    let isa = simd::isa();
    let cpu = CpuBackend::with_threads(2);
    let mut rng = Rng::new(33);
    for dt in TYPES.into_iter().chain([DType::Q5_K, DType::Q6_K]) {
        // Rows of 640 for blocks of 32: the integer kernel's (no multiple of 256).
        let (n, k) = (48, lengths(dt, [640; 3], [512; 3])[0]);
        let file = weights(dt, n, k, &mut rng);
        let w = cpu
            .tensor_from_bytes(&TensorDesc::new(dt, [n, k]), &file)
            .unwrap();
        let packed = cpu.storage(&w).unwrap().packed().is_some();
        assert_eq!(packed, packs(isa, dt, &[n, k]), "{dt}");
        assert_eq!(cpu.download(&w).unwrap(), file, "{dt}: download");

        // A view's upload (rows 16..19) lands where the file layout puts it.
        let rb = dt.bytes_for(k).unwrap();
        let mut file2 = file.clone();
        let fresh = weights(dt, 3, k, &mut rng);
        file2[16 * rb..19 * rb].copy_from_slice(&fresh);
        let view = w.view(16 * k, [3, k]).unwrap();
        cpu.upload(&view, &fresh).unwrap();
        assert_eq!(cpu.download(&w).unwrap(), file2, "{dt}: partial upload");
        assert_eq!(cpu.download(&view).unwrap(), fresh, "{dt}: view download");

        // The same weights flattened to one row of a 3-D tensor are never interleaved.
        let plain = cpu
            .tensor_from_bytes(&TensorDesc::new(dt, [1, n, k]), &file2)
            .unwrap();
        assert!(cpu.storage(&plain).unwrap().packed().is_none());
        let want_f32 = cpu.to_f32(&plain).unwrap();

        // Row lookups.
        let ids = cpu.tensor_i32(&[4], &[17, 0, 47, 16]).unwrap();
        let rows = cpu.alloc(&TensorDesc::new(DType::F32, [4, k])).unwrap();
        cpu.execute(&Op::GetRows(GetRowsOp::GetRows), &[&w, &ids], &[&rows])
            .unwrap();
        let got = cpu.to_f32(&rows).unwrap();
        for (j, id) in [17usize, 0, 47, 16].iter().enumerate() {
            let want = &want_f32[id * k..(id + 1) * k];
            assert_eq!(&got[j * k..(j + 1) * k], want, "{dt}: row {id}");
        }

        // An op that reads the matrix as bytes (a copy) sees the file layout.
        let copy = cpu.alloc(&TensorDesc::new(dt, [n, k])).unwrap();
        cpu.execute(&Op::Elementwise(ElementwiseOp::Copy), &[&w], &[&copy])
            .unwrap();
        assert_eq!(cpu.download(&copy).unwrap(), file2, "{dt}: copy");

        // The matmul (decode and prefill batches) against an f64 dot of the weights.
        for m in [1, 9] {
            let xv: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
            let x = cpu.tensor_f32(&[m, k], &xv).unwrap();
            let y = cpu.alloc(&TensorDesc::new(DType::F32, [m, n])).unwrap();
            cpu.execute(&Op::MatMul(MatMulOp::MatMul), &[&x, &w], &[&y])
                .unwrap();
            let got = cpu.to_f32(&y).unwrap();
            for i in 0..m {
                for r in 0..n {
                    let (xi, wr) = (&xv[i * k..(i + 1) * k], &want_f32[r * k..(r + 1) * k]);
                    let want: f64 = xi.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = xi.iter().zip(wr).map(|(a, b)| (*a * *b).abs() as f64).sum();
                    let got = got[i * n + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag,
                        "{dt} m {m} ({i}, {r}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_integer_kernels_split_puts_digits_in_the_lanes_order() {
    if !qdot_x16i::supported(DType::Q4_K) {
        eprintln!("skipped: no AVX-512 VNNI here");
        return;
    }
    // Element e of a group at byte e of each digit: the lanes pair elements 8v + 0, 2, 4, 6
    // (low nibbles) and 8v + 1, 3, 5, 7 (high nibbles).
    let k = 256;
    let x: Vec<f32> = (0..k).map(|e| (e % 32) as f32 + 1.0).collect();
    let mut out = Vec::new();
    qdot_x16i::split_rows(&x, k, DType::Q4_K, &mut out);
    assert_eq!(out.len(), qdot_x16i::row_bytes(k));
    // The block's largest |x| is 32 = 2^5: the scale is 2^(5 - 21), so x_q = x · 2^16 and
    // the top digit t2 (the first 32 bytes of a group) is x itself.
    for g in 0..k / 32 {
        let t2 = &out[96 * g..96 * g + 32];
        for v in 0..4 {
            for (p, j) in [0, 2, 4, 6, 1, 3, 5, 7].iter().enumerate() {
                assert_eq!(
                    t2[8 * v + p] as usize,
                    8 * v + j + 1,
                    "group {g} v {v} p {p}"
                );
            }
        }
        assert!(out[96 * g + 32..96 * g + 96].iter().all(|&b| b == 0));
    }
    let s = f32::from_le_bytes(out[96 * 8..96 * 8 + 4].try_into().unwrap());
    assert_eq!(s, 2f32.powi(-16));
}

/// The formats of the integer kernel (`qdot_x16i`), if this CPU runs it.
fn integer_types() -> Vec<DType> {
    let all = [
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];
    let on = |dt: DType| qdot_x16i::supported(dt) && packs(simd::isa(), dt, &[16, 256]);
    let (run, skip): (Vec<DType>, Vec<DType>) = all.into_iter().partition(|&dt| on(dt));
    if !skip.is_empty() {
        eprintln!("skipped (no AVX-512 VNNI, or no VBMI for Q5_0/Q5_1, here): {skip:?}");
    }
    run
}

/// Where a weight meets the split activations: `d · scale · q` (Q4_0's, Q5_0's and Q6_K's
/// `q` less its offset: `decoded` gives Q6_K's offset as a minimum, which the kernel takes in
/// integers), while the minimums (Q4_K, Q5_K; Q4_1's and Q5_1's with their codes centred, `d ·
/// (q − c)` and `m + c · d`) meet the f32 group sums.
fn split_part(dt: DType, (d, mn, l): (f64, f64, f64)) -> (f64, f64) {
    if dt == DType::Q6_K {
        return (d * l + mn, 0.0);
    }
    let c = match dt {
        DType::Q4_1 => 8.0,
        DType::Q5_1 => 16.0,
        _ => 0.0,
    };
    (d * (l - c), mn + c * d)
}

/// The integer kernel for its interleaved formats: every row against an f64 dot of the file's
/// weights within the split's bound, and the same bits whatever the batch and the groups
/// (rows of 640 and 192: blocks of 32 need no multiple of 256).
#[test]
fn integer_rows_match_an_f64_dot_and_their_bits_do_not_depend_on_the_batch() {
    let mut rng = Rng::new(41);
    for dt in integer_types() {
        let q_bits = qdot_x16i::split(dt).unwrap().q_bits;
        let sizes = if dt.block_size() == 256 {
            [(48, 256), (32, 1536), (80, 768)]
        } else {
            [(48, 640), (32, 1536), (80, 192)]
        };
        for (n, k) in sizes {
            let file = weights(dt, n, k, &mut rng);
            let mut packed = vec![0u8; file.len()];
            pack(dt, k, &file, &mut packed);
            let m = qdot_x16i::MAX_ROWS;
            // A few large activations: the groups' scales differ.
            let x: Vec<f32> = (0..m * k)
                .map(|j| rng.normal() * if j % 97 == 0 { 30.0 } else { 1.0 })
                .collect();
            let mut xs = Vec::new();
            block_sums(&x, k, &mut xs);
            let mut split = Vec::new();
            qdot_x16i::split_rows(&x, k, dt, &mut split);
            let rb = qdot_x16i::row_bytes(k);
            let call = |i: usize, mr: usize, groups: std::ops::Range<usize>, y: &mut [f32]| unsafe {
                let xi = (
                    split.as_ptr().add(i * rb),
                    rb,
                    xs.as_ptr().add(i * (k / 32)),
                    k / 32,
                );
                let yi = (y.as_mut_ptr().add(i * n), n);
                qdot_x16i::rows_dots(dt, xi, mr, k, packed.as_ptr(), groups, yi)
            };
            // The split: each group's largest |x| times 2^-q_bits times the group's Σ |w|
            // over the part of the weights that meets the split.
            let split = |wr: &[(f64, f64, f64)], xi: &[f32]| -> f64 {
                (0..k / 32)
                    .map(|g| {
                        let top = xi[32 * g..32 * (g + 1)]
                            .iter()
                            .fold(0f64, |t, v| t.max(v.abs() as f64));
                        let sw: f64 = wr[32 * g..32 * (g + 1)]
                            .iter()
                            .map(|w| split_part(dt, *w).0.abs())
                            .sum();
                        top * sw * 2f64.powi(-q_bits)
                    })
                    .sum()
            };
            check_rows(dt, (n, k), &file, &x, &call, &split);
        }
    }
}

/// The integer kernel computes the dot of the weights with the split activations (read back
/// from `qdot_int`'s element-ordered split, not from the lanes' order) to f32 roundings: a
/// digit or a high part paired with the wrong column would show far beyond them.
#[test]
fn integer_rows_are_the_dots_of_the_split_activations() {
    use crate::cpu::qdot_int;
    let mut rng = Rng::new(43);
    for dt in integer_types() {
        let (n, k) = (32, 1536);
        let file = weights(dt, n, k, &mut rng);
        let mut packed = vec![0u8; file.len()];
        pack(dt, k, &file, &mut packed);
        let x: Vec<f32> = (0..k)
            .map(|j| rng.normal() * if j % 97 == 0 { 300.0 } else { 1.0 })
            .collect();
        let mut xs = Vec::new();
        block_sums(&x, k, &mut xs);
        // Into a buffer of stale bytes, as the backend's reused one: the split leaves the
        // bytes no kernel reads as they were.
        let mut split = vec![0x5A; 3 * qdot_x16i::row_bytes(k)];
        qdot_x16i::split_rows(&x, k, dt, &mut split);
        let mut sp = vec![0u8; qdot_int::row_bytes(k)];
        qdot_int::split_row(&x, &mut sp, qdot_x16i::split(dt).unwrap());
        let scales = 3 * k + 4 * (k / 32) + 4 * (k / 16);
        let xq: Vec<f64> = (0..k)
            .map(|e| {
                let (g, j) = (e / 32, e % 32);
                let t = |t| sp[qdot_int::digit_at(g, t) + j] as i8 as f64;
                let s = f32::from_le_bytes(sp[scales + 4 * g..][..4].try_into().unwrap());
                s as f64 * (t(2) * 65536.0 + t(1) * 256.0 + t(0))
            })
            .collect();
        let mut y = vec![f32::NAN; n];
        let xi = (split.as_ptr(), qdot_x16i::row_bytes(k), xs.as_ptr(), k / 32);
        unsafe {
            qdot_x16i::rows_dots(
                dt,
                xi,
                1,
                k,
                packed.as_ptr(),
                0..n / ROWS,
                (y.as_mut_ptr(), n),
            )
        };
        let frb = dt.bytes_for(k).unwrap();
        for (r, got) in y.iter().enumerate() {
            let wr = decoded(dt, &file[r * frb..(r + 1) * frb], k);
            let terms: Vec<(f64, f64)> = wr
                .iter()
                .zip(&xq)
                .zip(&x)
                .map(|((w, q), x)| {
                    let (a, b) = split_part(dt, *w);
                    (a * q, b * *x as f64)
                })
                .collect();
            let want: f64 = terms.iter().map(|(a, b)| a + b).sum();
            let mag: f64 = terms.iter().map(|(a, b)| a.abs() + b.abs()).sum();
            let bound = (48.0 + (k / 32) as f64) * 2f64.powi(-24) * mag;
            let got = *got as f64;
            assert!(
                (got - want).abs() <= bound,
                "{dt} row {r}: {got} vs {want} (bound {bound:e})"
            );
        }
    }
}
