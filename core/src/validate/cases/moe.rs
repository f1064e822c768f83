//! The mixture-of-experts family: matmuls by expert id (shared and per-slot activations,
//! many slots an expert), routing and mixing.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    // MatMulId.
    for w in [F32, Q4_K, Q8_0, MXFP4] {
        let k = width(w);
        for (t, shared) in [(1, true), (5, false)] {
            let xs: Vec<usize> = if shared { vec![t, k] } else { vec![t, 2, k] };
            let label = format!(
                "{w} E=4 T={t} k=2 n=19 {}",
                if shared { "shared x" } else { "x per slot" }
            );
            c.push(Case::new(
                Op::Moe(MoeOp::MatMulId),
                label.clone(),
                vec![
                    n(F32, &xs),
                    n(w, &[4, 19, k]),
                    ids(&[t, 2], rand_ids(&label, t * 2, 4)),
                ],
            )?);
        }
    }
    // [T, 1, K] activations with k = 2: each token's row serves both of its slots.
    let label = "q8_0 E=3 T=40 k=2 n=70 x [T,1,K]";
    c.push(Case::new(
        Op::Moe(MoeOp::MatMulId),
        label,
        vec![
            n(F32, &[40, 1, 96]),
            n(Q8_0, &[3, 70, 96]),
            ids(&[40, 2], rand_ids(label, 80, 3)),
        ],
    )?);
    // Prefill with many slots per expert: several 64-slot tiles per expert, two column tiles.
    for (w, shared) in [(Q4_K, true), (Q5_0, false), (BF16, false), (F32, true)] {
        // Float rows of a multiple of 32 take the grouped tile too.
        let kd = if w.block_size() == 1 { 128 } else { width(w) };
        let t = 200;
        let xs: Vec<usize> = if shared { vec![t, kd] } else { vec![t, 2, kd] };
        let label = format!(
            "{w} E=3 T={t} k=2 n=70 {}",
            if shared { "shared x" } else { "x per slot" }
        );
        c.push(Case::new(
            Op::Moe(MoeOp::MatMulId),
            label.clone(),
            vec![
                n(F32, &xs),
                n(w, &[3, 70, kd]),
                ids(&[t, 2], rand_ids(&label, t * 2, 3)),
            ],
        )?);
    }
    for (t, k, nn) in [(1usize, 1usize, 64usize), (7, 4, 96), (3, 8, 2050)] {
        c.push(Case::new(
            Op::Moe(MoeOp::MoeSum),
            format!("T={t} k={k} N={nn}"),
            vec![n(F32, &[t, k, nn]), n(F32, &[t, k])],
        )?);
    }
    for (gating, normalize) in [
        (MoeGating::Softmax, true),
        (MoeGating::Softmax, false),
        (MoeGating::Sigmoid, true),
    ] {
        for (t, e, k) in [(1usize, 8usize, 2usize), (6, 64, 8)] {
            let op = Op::Moe(MoeOp::MoeRoute {
                k,
                gating,
                normalize,
            });
            c.push(Case::new(
                op,
                format!("{gating:?} norm={normalize} T={t} E={e} k={k}"),
                vec![n(F32, &[t, e])],
            )?);
        }
    }
    Ok(())
}
