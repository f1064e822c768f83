//! The embedding family: lookups in every table dtype, and soft embeddings.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    for t in [F32, F16, BF16, Q8_0, Q4_K, Q6_K, Q5_0] {
        let d = width(t);
        let label = format!("{t} V=37 D={d} n=6");
        c.push(Case::new(
            Op::GetRows(GetRowsOp::GetRows),
            label.clone(),
            vec![n(t, &[37, d]), ids(&[6], rand_ids(&label, 6, 37))],
        )?);
    }
    // DiffusionGemma's self-conditioning: a canvas of 8 positions over a small vocabulary,
    // and over Gemma's 262,144 (where `--perf` shows what the top-k form saves).
    for (k, v, e, dt) in [
        (0usize, 320usize, 64usize, F32),
        (64, 320, 64, F32),
        (16, 2048, 64, Q8_0),
        (0, 262_144, 64, F32),
        (256, 262_144, 64, F32),
    ] {
        let form = match k {
            0 => "dense".to_string(),
            k => format!("top-{k}"),
        };
        c.push(Case::new(
            Op::GetRows(GetRowsOp::SoftEmbedding { top_k: k }),
            format!("{form} T=8 V={v} E={e} {dt:?} table"),
            vec![n(F32, &[8, v]), n(dt, &[v, e])],
        )?);
    }
    Ok(())
}
