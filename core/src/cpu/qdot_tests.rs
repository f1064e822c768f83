//! Tests of the fused kernels (`qdot.rs`): decoders against the scalar dequantization, rows
//! against an f64 dot, the tile path against the row path.

use super::*;
use crate::cpu::simd;
use crate::quant;
use crate::rng::Rng;

/// Every fused decoder gives the scalar dequantizer's bits (`quant::dequantize`), value
/// for value: the fused kernels multiply exactly the weights the rest of kiln sees.
#[test]
fn fused_decoders_equal_the_scalar_dequantization() {
    let isa = simd::isa();
    let mut rng = Rng::new(12);
    let mut checked = 0;
    for dt in DType::QUANTIZED {
        if !supported(isa, dt) {
            continue;
        }
        let k = 768;
        let w = if quant::quantize_supported(dt) {
            let x: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            quant::quantize(dt, &x).unwrap()
        } else {
            quant::random_blocks(dt, k / dt.block_size(), &mut rng)
        };
        let mut want = vec![0f32; k];
        quant::dequantize(dt, &w, &mut want).unwrap();
        let mut want_pass = vec![0f32; k];
        to_pass_order(&want, &mut want_pass);
        let mut got = vec![f32::NAN; k];
        unsafe { decode_row(dt, w.as_ptr(), k, got.as_mut_ptr()) };
        for (i, (a, b)) in got.iter().zip(&want_pass).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{dt}: value {i} (pass order): {a} vs {b}"
            );
        }
        checked += 1;
    }
    if checked == 0 {
        eprintln!("skipped: no fused kernels on this CPU ({isa:?})");
    }
}

#[test]
fn fused_rows_match_an_f64_dot_over_the_dequantized_weights() {
    let isa = simd::isa();
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::IQ2_XXS,
        DType::IQ3_S,
    ];
    if !types.iter().any(|&t| supported(isa, t)) {
        eprintln!("skipped: no fused kernels on this CPU ({isa:?})");
        return;
    }
    let mut rng = Rng::new(11);
    for &dt in &types {
        // 288: an odd number of 32-element groups (the even passes are longer).
        let ks: &[usize] = if dt.block_size() == 32 {
            &[256, 288, 768]
        } else {
            &[256, 768]
        };
        for &k in ks {
            let wf: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            // Weights of `wf` scaled by s, or random valid blocks for the formats kiln
            // cannot quantize into (the i-quants).
            let encode = |s: f32, rng: &mut Rng| {
                if quant::quantize_supported(dt) {
                    quant::quantize(dt, &wf.iter().map(|v| v * s).collect::<Vec<_>>()).unwrap()
                } else {
                    quant::random_blocks(dt, k / dt.block_size(), rng)
                }
            };
            let wq = encode(1.0, &mut rng);
            let mut wd = vec![0f32; k];
            quant::dequantize(dt, &wq, &mut wd).unwrap();
            // The prefill path (decode once into pass order, then the tile kernel) gives
            // the same bits as the fused kernel.
            {
                let ldx = k + 3;
                let x: Vec<f32> = (0..TILE_ROWS * ldx).map(|_| rng.normal()).collect();
                let mut xp = vec![0f32; TILE_ROWS * ldx];
                for i in 0..TILE_ROWS {
                    to_pass_order(&x[i * ldx..i * ldx + k], &mut xp[i * ldx..i * ldx + k]);
                }
                let rows: Vec<Vec<u8>> = (0..TILE_COLS)
                    .map(|j| encode([1.0, -0.5, 2.0, 0.25][j], &mut rng))
                    .collect();
                let mut wt = vec![0f32; TILE_COLS * k];
                for (j, r) in rows.iter().enumerate() {
                    unsafe { decode_row(dt, r.as_ptr(), k, wt.as_mut_ptr().add(j * k)) };
                }
                let w = std::array::from_fn(|j| wt[j * k..].as_ptr());
                for mr in 1..=TILE_ROWS {
                    let mut t = [[f32::NAN; TILE_COLS]; TILE_ROWS];
                    unsafe {
                        tile_dots(xp.as_ptr(), ldx, mr, w, k, t.as_mut_ptr().cast(), TILE_COLS)
                    };
                    for (j, wrow) in rows.iter().enumerate() {
                        let mut r = [f32::NAN; MAX_ROWS];
                        unsafe { row_dots(dt, x.as_ptr(), ldx, mr, k, wrow.as_ptr(), &mut r) };
                        for i in 0..mr {
                            assert_eq!(
                                t[i][j].to_bits(),
                                r[i].to_bits(),
                                "{dt:?} k={k} mr={mr} ({i},{j})"
                            );
                        }
                    }
                }
            }
            for mr in 1..=MAX_ROWS {
                let ldx = k + 5;
                let x: Vec<f32> = (0..mr * ldx).map(|_| rng.normal()).collect();
                let mut out = [f32::NAN; MAX_ROWS];
                unsafe { row_dots(dt, x.as_ptr(), ldx, mr, k, wq.as_ptr(), &mut out) };
                for i in 0..mr {
                    let want: f64 = (0..k).map(|j| x[i * ldx + j] as f64 * wd[j] as f64).sum();
                    let got = out[i] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{dt:?} k={k} mr={mr} row {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
