//! Matmuls (every weight dtype), lookups, elementwise ops, norms, rope, softmax, selection,
//! routing, cast and copy, and the fused norm/GLU matmuls.

use kiln_core::op::{
    ElementwiseOp, GetRowsOp, GluOp, MatMulOp, MoeGating, MoeOp, NormOp, Op, ReduceOp, RopeMode,
    RopeOp, RopeParams, SoftmaxOp, UnaryOp,
};
use kiln_core::quant::quantize;
use kiln_core::validate::rng::Rng;
use kiln_core::DType::{self, *};

use super::harness::*;
use super::naive;

/// A row width that is a whole number of `dt` blocks, and not a power of two where possible.
fn width(dt: DType) -> usize {
    match dt.block_size() {
        1 => 37,
        32 => 96,
        64 => 192,
        _ => 512,
    }
}

/// MatMul error bound: any f32 summation order of `k` products errs by at most about
/// `k·u·Σ|x w|` (the classical γ_k bound; +8 for the products' own rounding and the
/// accumulator combine), plus the rounding of the stored output.
fn matmul_bound(k: usize, mag: f64, want: f64, out: DType) -> f64 {
    (k + 8) as f64 * U_F32 * mag + unit(out) * want.abs() + tiny(out)
}

fn check_matmul(rng: &mut Rng, xdt: DType, wdt: DType, lead: &[usize], n: usize) {
    let kx = kiln();
    let k = width(wdt);
    let m: usize = lead.iter().product();
    let mut xs = lead.to_vec();
    xs.push(k);
    let (x, xv) = kx.tensor(xdt, &xs, &normal(rng, m * k, 1.0));
    let (w, wv) = kx.tensor(wdt, &[n, k], &normal(rng, n * k, 0.5));
    let y = kx.run(&Op::MatMul(MatMulOp::MatMul), &[&x, &w]);
    assert_eq!(y[0].dtype(), xdt);
    let mut ys = lead.to_vec();
    ys.push(n);
    assert_eq!(y[0].shape().dims(), &ys[..]);
    let want = naive::matmul(&xv, &wv, m, n, k);
    let mag = naive::matmul_abs(&xv, &wv, m, n, k);
    assert_within(
        &format!("matmul {xdt} x {wdt}, x {xs:?}, n {n}"),
        &kx.f32(&y[0]),
        &want,
        |i| matmul_bound(k, mag[i], want[i], xdt),
    );
}

#[test]
fn matmul_on_every_weight_dtype_equals_f64_on_dequantized_weights() {
    let mut rng = Rng::new(1);
    let weights = [F32, F16, BF16].into_iter().chain(DType::QUANTIZED);
    for wdt in weights {
        // Decode (one row), prefill (odd row count) and a rank-3 activation; n = 37 spans
        // several 16-row weight tiles and a ragged last one.
        for lead in [&[1][..], &[7], &[2, 3]] {
            check_matmul(&mut rng, F32, wdt, lead, 37);
        }
    }
    // Half-precision activations (the output is in the activation's dtype).
    for (xdt, wdt) in [
        (F16, F16),
        (BF16, BF16),
        (F16, Q8_0),
        (BF16, Q4_K),
        (F16, F32),
    ] {
        check_matmul(&mut rng, xdt, wdt, &[5], 19);
    }
}

#[test]
fn mat_mul_id_every_activation_layout() {
    let kx = kiln();
    let mut rng = Rng::new(2);
    let (e, n, t, kk) = (5, 19, 6, 3);
    for wdt in [F16, Q4_0, Q6_K] {
        let k = width(wdt);
        let (w, wv) = kx.tensor(wdt, &[e, n, k], &normal(&mut rng, e * n * k, 0.5));
        let idv: Vec<i32> = (0..t * kk).map(|_| rng.below(e) as i32).collect();
        let ids = kx.ints(&[t, kk], &idv);
        // x shared by the k slots ([T, K] and [T, 1, K]) or one row per slot ([T, k, K]).
        for (xshape, per_slot) in [
            (vec![t, k], false),
            (vec![t, 1, k], false),
            (vec![t, kk, k], true),
        ] {
            let rows = if per_slot { t * kk } else { t };
            let (x, xv) = kx.tensor(F32, &xshape, &normal(&mut rng, rows * k, 1.0));
            let y = kx.run(&Op::Moe(MoeOp::MatMulId), &[&x, &w, &ids]);
            assert_eq!(y[0].shape().dims(), &[t, kk, n]);
            let (mut want, mut bound) = (Vec::new(), Vec::new());
            for r in 0..t * kk {
                let src = if per_slot { r } else { r / kk };
                let xr = &xv[src * k..(src + 1) * k];
                let ex = idv[r] as usize;
                let we = &wv[ex * n * k..(ex + 1) * n * k];
                let yr = naive::matmul(xr, we, 1, n, k);
                let mag = naive::matmul_abs(xr, we, 1, n, k);
                for j in 0..n {
                    bound.push(matmul_bound(k, mag[j], yr[j], F32));
                }
                want.extend(yr);
            }
            assert_within(
                &format!("mat_mul_id {wdt}, x {xshape:?}"),
                &kx.f32(&y[0]),
                &want,
                |i| bound[i],
            );
        }
    }
}

#[test]
fn get_rows_every_table_dtype() {
    let kx = kiln();
    let mut rng = Rng::new(3);
    let v = 11;
    for dt in [F32, F16, BF16, Q8_0, Q4_1, Q4_K, MXFP4, NVFP4] {
        let d = if dt.block_size() == 1 { 13 } else { width(dt) };
        let data = normal(&mut rng, v * d, 1.0);
        let (table, tv) = kx.tensor(dt, &[v, d], &data);
        // The f16/bf16 tables hold exactly the naive rounding of the data.
        match dt {
            F16 => assert_exact(
                "f16 table",
                &tv.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                &data
                    .iter()
                    .map(|&x| naive::round_f16(x as f64))
                    .collect::<Vec<_>>(),
            ),
            BF16 => assert_exact(
                "bf16 table",
                &tv.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                &data
                    .iter()
                    .map(|&x| naive::round_bf16(x as f64))
                    .collect::<Vec<_>>(),
            ),
            _ => {}
        }
        let idv = [3, 0, 10, 3, 7, 7, 1, 10, 5];
        let ids = kx.ints(&[idv.len()], &idv);
        let y = kx.run(&Op::GetRows(GetRowsOp::GetRows), &[&table, &ids]);
        assert_eq!(y[0].dtype(), F32);
        let mut want = Vec::new();
        for &id in &idv {
            want.extend_from_slice(&tv[id as usize * d..(id as usize + 1) * d]);
        }
        assert_exact(&format!("get_rows {dt}"), &kx.f32(&y[0]), &want);
    }
}

#[test]
fn add_and_mul_with_broadcasting() {
    let kx = kiln();
    let mut rng = Rng::new(4);
    let ashape = [6, 2, 11];
    let na = 6 * 2 * 11;
    // b: a's shape, [D], [R', D] with R' = 3 and 2 dividing the 12 rows, and rank 3 [2, 2, D].
    let bshapes: [&[usize]; 5] = [&[6, 2, 11], &[11], &[3, 11], &[2, 11], &[2, 2, 11]];
    for (adt, bdt) in [
        (F32, F32),
        (F16, F32),
        (F32, BF16),
        (BF16, BF16),
        (F16, F16),
    ] {
        for bs in bshapes {
            let nb: usize = bs.iter().product();
            let (a, av) = kx.tensor(adt, &ashape, &normal(&mut rng, na, 2.0));
            let (b, bv) = kx.tensor(bdt, bs, &normal(&mut rng, nb, 2.0));
            for mul in [false, true] {
                let op = if mul {
                    Op::Elementwise(ElementwiseOp::Mul)
                } else {
                    Op::Elementwise(ElementwiseOp::Add)
                };
                let y = kx.run(&op, &[&a, &b]);
                assert_eq!(y[0].dtype(), adt);
                let want = naive::binary(&av, &bv, mul);
                // One f32 rounding of the exact result, then the output's.
                assert_close(
                    &format!("{op} {adt}{ashape:?} {bdt}{bs:?}"),
                    &kx.f32(&y[0]),
                    &want,
                    adt,
                    0.0,
                    U_F32,
                );
            }
        }
    }
}

#[test]
fn scale_every_unary_and_every_glu() {
    let kx = kiln();
    let mut rng = Rng::new(5);
    let shape = [7, 13];
    let mut data = normal(&mut rng, 7 * 13, 4.0);
    // Softplus' linear threshold at 20, and the tails of every activation.
    data[..8].copy_from_slice(&[-25.0, -20.5, -19.5, -8.0, 8.0, 19.5, 20.5, 25.0]);
    for dt in [F32, F16, BF16] {
        let (x, xv) = kx.tensor(dt, &shape, &data);
        let y = kx.run(&Op::Elementwise(ElementwiseOp::Scale(-0.37)), &[&x]);
        let want: Vec<f64> = xv.iter().map(|v| v * (-0.37f32) as f64).collect();
        assert_close(
            &format!("scale {dt}"),
            &kx.f32(&y[0]),
            &want,
            dt,
            0.0,
            U_F32,
        );
        for u in UnaryOp::ALL {
            let y = kx.run(&Op::Elementwise(ElementwiseOp::Unary(u)), &[&x]);
            let want: Vec<f64> = xv.iter().map(|&v| naive::unary(u, v)).collect();
            // A few f32 ulps of libm error; the absolute term covers the cancellation in
            // `1 + tanh(z)` of gelu_tanh for negative inputs (≈ |x|·ulp(1)).
            assert_close(
                &format!("{} {dt}", u.name()),
                &kx.f32(&y[0]),
                &want,
                dt,
                2e-6,
                2e-6,
            );
        }
    }
    for g in [GluOp::SwiGlu, GluOp::GeGlu] {
        for (gdt, udt) in [(F32, F32), (F16, F32), (BF16, F16)] {
            let (gate, gv) = kx.tensor(gdt, &[5, 19], &normal(&mut rng, 95, 3.0));
            let (up, uv) = kx.tensor(udt, &[5, 19], &normal(&mut rng, 95, 1.0));
            let y = kx.run(&Op::Elementwise(ElementwiseOp::Glu(g)), &[&gate, &up]);
            let want: Vec<f64> = (0..95).map(|i| naive::glu(g, gv[i], uv[i])).collect();
            assert_close(
                &format!("{} {gdt} {udt}", g.name()),
                &kx.f32(&y[0]),
                &want,
                gdt,
                2e-6,
                2e-6,
            );
        }
    }
}

#[test]
fn rms_norm_and_l2_norm() {
    let kx = kiln();
    let mut rng = Rng::new(6);
    let d = 37;
    for (xdt, wdt) in [(F32, F32), (F16, F32), (BF16, BF16)] {
        for eps in [1e-6f32, 0.5] {
            for one_plus in [false, true] {
                let (x, xv) = kx.tensor(xdt, &[4, 3, d], &normal(&mut rng, 12 * d, 1.5));
                let (w, wv) = kx.tensor(wdt, &[d], &normal(&mut rng, d, 1.0));
                let y = kx.run(&Op::Norm(NormOp::RmsNorm { eps, one_plus }), &[&x, &w]);
                let want = naive::rms_norm(&xv, &wv, d, eps as f64, one_plus);
                assert_close(
                    &format!("rms_norm {xdt} {wdt} eps {eps} one_plus {one_plus}"),
                    &kx.f32(&y[0]),
                    &want,
                    xdt,
                    1e-6,
                    1e-5,
                );
            }
            let (x, xv) = kx.tensor(xdt, &[5, d], &normal(&mut rng, 5 * d, 1.5));
            let y = kx.run(&Op::Norm(NormOp::L2Norm { eps }), &[&x]);
            let want = naive::l2_norm(&xv, d, eps as f64);
            assert_close(
                &format!("l2_norm {xdt} eps {eps}"),
                &kx.f32(&y[0]),
                &want,
                xdt,
                1e-6,
                1e-5,
            );
        }
    }
}

/// Rope's error bound: the angle is computed in f32 (position × scale × base^(-2i/n) / f), a
/// few roundings plus pow's error amplified by ln(base), about 20 ulps of the angle in all; we
/// allow 32, times the size of the pair, on top of a few ulps of the result.
fn check_rope(rng: &mut Rng, p: RopeParams, with_factors: bool, max_pos: usize) {
    let kx = kiln();
    let (t, h, d) = (5, 3, 20);
    let half = p.n_rot / 2;
    let (x, xv) = kx.tensor(F32, &[t, h, d], &normal(rng, t * h * d, 1.0));
    let posv: Vec<i32> = (0..t).map(|_| rng.below(max_pos) as i32).collect();
    let pos = kx.ints(&[t], &posv);
    // Llama-3 style factors; an infinite one leaves its pair unrotated.
    let mut fdata = uniform(rng, half, 1.0, 8.0);
    fdata[1] = f32::INFINITY;
    let (ft, fv) = kx.tensor(F32, &[half], &fdata);
    let (y, factors) = if with_factors {
        (
            kx.run(&Op::Rope(RopeOp::Rope(p)), &[&x, &pos, &ft]),
            Some(&fv[..]),
        )
    } else {
        (kx.run(&Op::Rope(RopeOp::Rope(p)), &[&x, &pos]), None)
    };
    let want = naive::rope(&xv, t, h, d, &posv, &p, factors);
    let slack = |e: usize| -> f64 {
        let (ti, dim, head) = (e / (h * d), e % d, e - e % d);
        let (i, a, b) = match p.mode {
            _ if dim >= p.n_rot => return 0.0,
            RopeMode::Normal => (dim / 2, dim & !1, dim | 1),
            RopeMode::Neox => (dim % half, dim % half, dim % half + half),
        };
        let angle = naive::rope_angle(&p, posv[ti], i, factors).abs();
        let pair = xv[head + a].abs() + xv[head + b].abs();
        32.0 * U_F32 * angle * pair * p.attn_factor as f64
    };
    assert_within(
        &format!("rope {p:?} factors {with_factors} positions < {max_pos}"),
        &kx.f32(&y[0]),
        &want,
        |e| 1e-6 + 1e-5 * want[e].abs() + slack(e),
    );
}

#[test]
fn rope_normal_and_neox_partial_scaled_with_factors() {
    let mut rng = Rng::new(7);
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        // Full and partial rotary (n_rot < D = 20).
        for n_rot in [20, 12] {
            // Plain, and YaRN-like frequency and magnitude scaling.
            for (base, freq_scale, attn_factor) in [(1e4, 1.0, 1.0), (1e6, 0.25, 1.3)] {
                let p = RopeParams {
                    mode,
                    n_rot,
                    base,
                    freq_scale,
                    attn_factor,
                };
                for with_factors in [false, true] {
                    for max_pos in [64, 3000] {
                        check_rope(&mut rng, p, with_factors, max_pos);
                    }
                }
            }
        }
    }
}

#[test]
fn softmax_scale_cap_and_broadcast_mask() {
    let kx = kiln();
    let mut rng = Rng::new(8);
    let (rows, n) = (12, 17);
    for dt in [F32, F16] {
        for cap in [None, Some(3.0f32)] {
            // No mask, one row for all, 4 rows repeating, one row each.
            for mrows in [0, 1, 4, 12] {
                let (x, xv) = kx.tensor(dt, &[3, 4, n], &normal(&mut rng, rows * n, 3.0));
                let mut mdata = normal(&mut rng, mrows * n, 1.0);
                for r in 0..mrows {
                    for j in 0..n {
                        // About a third masked out, never a whole row.
                        if j != r % n && rng.below(3) == 0 {
                            mdata[r * n + j] = f32::NEG_INFINITY;
                        }
                    }
                }
                let (m, mv) = kx.tensor(F32, &[mrows, n], &mdata);
                let op = Op::Softmax(SoftmaxOp::Softmax {
                    scale: 0.7,
                    soft_cap: cap,
                });
                let y = if mrows == 0 {
                    kx.run(&op, &[&x])
                } else {
                    kx.run(&op, &[&x, &m])
                };
                let want =
                    naive::softmax_rows(&xv, n, 0.7f32 as f64, cap, (mrows > 0).then_some(&mv[..]));
                // exp of arguments up to ~20 in size, each carrying a few f32 ulps.
                assert_close(
                    &format!("softmax {dt} cap {cap:?} mask rows {mrows}"),
                    &kx.f32(&y[0]),
                    &want,
                    dt,
                    1e-7,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn argmax_and_top_k_with_ties() {
    let kx = kiln();
    let mut rng = Rng::new(9);
    let n = 29;
    for dt in [F32, F16] {
        // Small integers: many ties, which must go to the lower index.
        let mut data: Vec<f32> = (0..12 * n).map(|_| rng.below(7) as f32 - 3.0).collect();
        data[..n].copy_from_slice(&normal(&mut rng, n, 1.0));
        let (x, xv) = kx.tensor(dt, &[4, 3, n], &data);
        let y = kx.run(&Op::Reduce(ReduceOp::Argmax), &[&x]);
        assert_eq!(y[0].shape().dims(), &[4, 3]);
        let want: Vec<i32> = xv.chunks(n).map(|r| naive::top_k(r, 1)[0] as i32).collect();
        assert_eq!(kx.i32(&y[0]), want, "argmax {dt}");
        for k in [1, 5, n] {
            let y = kx.run(&Op::Reduce(ReduceOp::TopK(k)), &[&x]);
            let (mut wv, mut wi) = (Vec::new(), Vec::new());
            for r in xv.chunks(n) {
                for j in naive::top_k(r, k) {
                    wv.push(r[j]);
                    wi.push(j as i32);
                }
            }
            assert_eq!(y[0].dtype(), F32);
            assert_exact(&format!("top_k {k} {dt} values"), &kx.f32(&y[0]), &wv);
            assert_eq!(kx.i32(&y[1]), wi, "top_k {k} {dt} indices");
        }
    }
}

#[test]
fn moe_route_softmax_and_sigmoid_normalized_or_not() {
    let kx = kiln();
    let mut rng = Rng::new(10);
    let (t, e, k) = (9, 16, 4);
    for dt in [F32, BF16] {
        let (x, xv) = kx.tensor(dt, &[t, e], &normal(&mut rng, t * e, 2.0));
        for gating in [MoeGating::Softmax, MoeGating::Sigmoid] {
            for normalize in [false, true] {
                let y = kx.run(
                    &Op::Moe(MoeOp::MoeRoute {
                        k,
                        gating,
                        normalize,
                    }),
                    &[&x],
                );
                let (mut ww, mut wi) = (Vec::new(), Vec::new());
                for r in xv.chunks(e) {
                    let (w, ids) = naive::moe_route(r, k, gating, normalize);
                    ww.extend(w);
                    wi.extend(ids.into_iter().map(|j| j as i32));
                }
                let what = format!("moe_route {dt} {gating:?} normalize {normalize}");
                assert_eq!(kx.i32(&y[1]), wi, "{what} ids");
                assert_close(&what, &kx.f32(&y[0]), &ww, F32, 1e-7, 1e-5);
            }
        }
    }
}

#[test]
fn moe_sum_weights_each_slot() {
    let kx = kiln();
    let mut rng = Rng::new(12);
    for (t, k, n) in [(5, 3, 37), (1, 1, 8), (4, 8, 130)] {
        let (y, yv) = kx.tensor(F32, &[t, k, n], &normal(&mut rng, t * k * n, 1.0));
        let (w, wv) = kx.tensor(F32, &[t, k], &uniform(&mut rng, t * k, 0.05, 1.0));
        let got = kx.run(&Op::Moe(MoeOp::MoeSum), &[&y, &w]);
        assert_eq!(got[0].shape().dims(), &[t, n]);
        let mut want = vec![0f64; t * n];
        for r in 0..t {
            for i in 0..k {
                for j in 0..n {
                    want[r * n + j] += wv[r * k + i] * yv[(r * k + i) * n + j];
                }
            }
        }
        let what = format!("moe_sum T={t} k={k} N={n}");
        assert_close(&what, &kx.f32(&got[0]), &want, F32, 1e-6, 1e-5);
    }
}

#[test]
fn cast_rounds_to_nearest_even_and_copy_keeps_bytes() {
    let kx = kiln();
    let mut rng = Rng::new(11);
    let mut data = normal(&mut rng, 64, 50.0);
    // f16 subnormals and overflow, bf16 subnormals, exact ties of both formats.
    data[..8].copy_from_slice(&[
        1e-6,
        -3e-7,
        7e4,
        -65520.0,
        1e-40,
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        1.0 + 2f32.powi(-8),
    ]);
    for (from, to) in [
        (F32, F16),
        (F32, BF16),
        (F16, F32),
        (BF16, F32),
        (F16, BF16),
        (BF16, F16),
        (F32, F32),
        (F16, F16),
    ] {
        let (x, xv) = kx.tensor(from, &[4, 16], &data);
        let y = kx.alloc(to, &[4, 16]);
        kx.exec(&Op::Elementwise(ElementwiseOp::Cast), &[&x], &[&y])
            .unwrap();
        let want: Vec<f64> = xv
            .iter()
            .map(|&v| match to {
                F16 => naive::round_f16(v),
                BF16 => naive::round_bf16(v),
                _ => v,
            })
            .collect();
        assert_exact(&format!("cast {from} -> {to}"), &kx.f32(&y), &want);
    }
    for (dt, shape) in [
        (F32, [6, 5]),
        (F16, [3, 7]),
        (Q4_K, [2, 256]),
        (Q8_0, [3, 64]),
    ] {
        let nel = shape[0] * shape[1];
        let (x, _) = kx.tensor(dt, &shape, &normal(&mut rng, nel, 1.0));
        let y = kx.run(&Op::Elementwise(ElementwiseOp::Copy), &[&x]);
        assert_eq!(y[0].dtype(), dt);
        assert_eq!(kx.bytes(&y[0]), kx.bytes(&x), "copy {dt}");
    }
}

#[test]
fn fused_rms_norm_mat_mul_and_glu_mat_mul() {
    let kx = kiln();
    let mut rng = Rng::new(12);
    for (xdt, wdt) in [(F32, F32), (F32, Q4_K), (F16, F16), (F32, Q8_0)] {
        let k = width(wdt);
        let (m, n) = (5, 23);
        for (eps, one_plus) in [(1e-6f32, false), (1e-2, true)] {
            let (x, xv) = kx.tensor(xdt, &[m, k], &normal(&mut rng, m * k, 2.0));
            let (nw, nwv) = kx.tensor(F32, &[k], &normal(&mut rng, k, 0.5));
            let (w, wv) = kx.tensor(wdt, &[n, k], &normal(&mut rng, n * k, 0.5));
            let y = kx.run(
                &Op::MatMul(MatMulOp::RmsNormMatMul { eps, one_plus }),
                &[&x, &nw, &w],
            );
            let h = naive::rms_norm(&xv, &nwv, k, eps as f64, one_plus);
            let want = naive::matmul(&h, &wv, m, n, k);
            let mag = naive::matmul_abs(&h, &wv, m, n, k);
            // The normalised row carries a few more ulps than a plain input: 16 extra.
            assert_within(
                &format!("rms_norm_mat_mul {xdt} {wdt} one_plus {one_plus}"),
                &kx.f32(&y[0]),
                &want,
                |i| matmul_bound(k + 16, mag[i], want[i], xdt),
            );
            // The same norm shared by three weights in one op: each output as if alone.
            let rows = [n, 7, 9];
            let mut ws = Vec::new();
            for &r in &rows {
                ws.push(kx.tensor(wdt, &[r, k], &normal(&mut rng, r * k, 0.5)));
            }
            let mut ins = vec![&x, &nw];
            ins.extend(ws.iter().map(|(t, _)| t));
            let ys = kx.run(&Op::MatMul(MatMulOp::RmsNormMatMul { eps, one_plus }), &ins);
            assert_eq!(ys.len(), 3);
            for ((y, (_, wv)), &r) in ys.iter().zip(&ws).zip(&rows) {
                let want = naive::matmul(&h, wv, m, r, k);
                let mag = naive::matmul_abs(&h, wv, m, r, k);
                assert_within(
                    &format!("rms_norm_mat_mul x3 (n={r}) {xdt} {wdt} one_plus {one_plus}"),
                    &kx.f32(y),
                    &want,
                    |i| matmul_bound(k + 16, mag[i], want[i], xdt),
                );
            }
        }
        // The residual as the matmul's epilogue: the matmul's bound, plus the add's rounding.
        {
            let (m, n) = (4, 19);
            let (x, xv) = kx.tensor(xdt, &[m, k], &normal(&mut rng, m * k, 1.0));
            let (w, wv) = kx.tensor(wdt, &[n, k], &normal(&mut rng, n * k, 0.5));
            let (r, rv) = kx.tensor(xdt, &[m, n], &normal(&mut rng, m * n, 3.0));
            let y = kx.run(&Op::MatMul(MatMulOp::MatMulAdd), &[&x, &w, &r]);
            let mm = naive::matmul(&xv, &wv, m, n, k);
            let mag = naive::matmul_abs(&xv, &wv, m, n, k);
            let want: Vec<f64> = mm.iter().zip(&rv).map(|(a, b)| a + b).collect();
            assert_within(
                &format!("mat_mul_add {xdt} {wdt}"),
                &kx.f32(&y[0]),
                &want,
                |i| matmul_bound(k, mag[i], mm[i], xdt) + unit(xdt) * want[i].abs() + tiny(xdt),
            );
        }
        for g in [GluOp::SwiGlu, GluOp::GeGlu] {
            let (m, n) = (3, 29);
            let (gate, gv) = kx.tensor(xdt, &[m, k], &normal(&mut rng, m * k, 2.0));
            let (up, uv) = kx.tensor(xdt, &[m, k], &normal(&mut rng, m * k, 1.0));
            let (w, wv) = kx.tensor(wdt, &[n, k], &normal(&mut rng, n * k, 0.5));
            let y = kx.run(&Op::MatMul(MatMulOp::GluMatMul(g)), &[&gate, &up, &w]);
            let h: Vec<f64> = (0..m * k).map(|i| naive::glu(g, gv[i], uv[i])).collect();
            let want = naive::matmul(&h, &wv, m, n, k);
            // The activation's own error (a few ulps, and gelu's absolute cancellation term)
            // enters through Σ|w|: covered by 16 extra ulps and 2e-6·Σ|w|.
            let wabs: Vec<f64> = (0..n)
                .map(|j| wv[j * k..(j + 1) * k].iter().map(|v| v.abs()).sum())
                .collect();
            let mag = naive::matmul_abs(&h, &wv, m, n, k);
            assert_within(
                &format!("glu_mat_mul {} {xdt} {wdt}", g.name()),
                &kx.f32(&y[0]),
                &want,
                |i| matmul_bound(k + 16, mag[i], want[i], xdt) + 2e-6 * wabs[i % n],
            );
            // With the residual added in the epilogue.
            let (r, rv) = kx.tensor(xdt, &[m, n], &normal(&mut rng, m * n, 3.0));
            let y = kx.run(&Op::MatMul(MatMulOp::GluMatMul(g)), &[&gate, &up, &w, &r]);
            let with_r: Vec<f64> = want.iter().zip(&rv).map(|(a, b)| a + b).collect();
            assert_within(
                &format!("glu_mat_mul {} {xdt} {wdt} + residual", g.name()),
                &kx.f32(&y[0]),
                &with_r,
                |i| {
                    matmul_bound(k + 16, mag[i], want[i], xdt)
                        + 2e-6 * wabs[i % n]
                        + unit(xdt) * with_r[i].abs()
                        + tiny(xdt)
                },
            );
        }
    }
}

/// Blocks written through `quantize` are what the oracle reads back: a q8_0 block's values
/// decode as `d · q` with `d` an f16 scale, which this checks independently of `dequantize`.
#[test]
fn q8_0_blocks_decode_as_scale_times_int8() {
    let mut rng = Rng::new(13);
    let data = normal(&mut rng, 96, 3.0);
    let bytes = quantize(Q8_0, &data).unwrap();
    let held = held(Q8_0, &bytes, 96);
    for (b, blk) in bytes.chunks(34).enumerate() {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f64();
        for i in 0..32 {
            let q = blk[2 + i] as i8 as f64;
            assert_eq!(held[b * 32 + i], d * q, "block {b} element {i}");
            // Round to nearest with scale max|x|/127: within half a step (and the f16 scale).
            assert!(
                (held[b * 32 + i] - data[b * 32 + i] as f64).abs() <= d * 0.5 + 1e-3 * d * 127.0
            );
        }
    }
}
