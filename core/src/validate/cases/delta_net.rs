//! The Gated DeltaNet family: the recurrence in both algorithms, and the decode step on a
//! state pool.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    // DeltaNet: log decays g < 0, β in (0, 1), q/k of unit scale as after the L2 norm.
    let dn = |t: usize, seqs: Vec<i32>, hk: usize, hv: usize, dk: usize, dv: usize| {
        let s = seqs.len() - 1;
        vec![
            Input::uniform(F32, &[t, hk, dk], -0.3, 0.3),
            Input::uniform(F32, &[t, hk, dk], -0.3, 0.3),
            n(F32, &[t, hv, dv]),
            Input::uniform(F32, &[t, hv], -1.0, -0.01),
            Input::uniform(F32, &[t, hv], 0.05, 0.95),
            Input::uniform(F32, &[s, hv, dk, dv], -0.5, 0.5),
            ids(&[s + 1], seqs),
        ]
    };
    for chunk in [None, Some(4), Some(64)] {
        let op = Op::DeltaNet(DeltaNetOp::DeltaNet { scale: 0.25, chunk });
        let tag = chunk.map_or("recurrent".to_string(), |c| format!("chunk {c}"));
        c.push(Case::new(
            op.clone(),
            format!("{tag} decode 3 seqs Hk=2 Hv=4 Dk=16 Dv=24"),
            dn(3, vec![0, 1, 2, 3], 2, 4, 16, 24),
        )?);
        c.push(Case::new(
            op,
            format!("{tag} prefill seqs 11+6 Hk=1 Hv=2 Dk=32 Dv=32"),
            dn(17, vec![0, 11, 17], 1, 2, 32, 32),
        )?);
    }
    for l2 in [None, Some(1e-6)] {
        let (s, hk, hv, dk, dv, pool) = (3usize, 2usize, 4usize, 16usize, 24usize, 5usize);
        c.push(Case::in_place(
            Op::DeltaNet(DeltaNetOp::DeltaNetDecode {
                scale: 0.25,
                qk_l2norm: l2,
            }),
            format!("l2norm={} S={s} pool={pool} Hk={hk} Hv={hv}", l2.is_some()),
            vec![
                Input::uniform(F32, &[s, hk, dk], -0.3, 0.3),
                Input::uniform(F32, &[s, hk, dk], -0.3, 0.3),
                n(F32, &[s, hv, dv]),
                Input::uniform(F32, &[s, hv], -1.0, -0.01),
                Input::uniform(F32, &[s, hv], 0.05, 0.95),
                ids(&[s], vec![4, 0, 2]),
            ],
            vec![
                (TensorDesc::new(F32, [s, hv, dv]), Gen::Normal(1.0)),
                (
                    TensorDesc::new(F32, [pool, hv, dk, dv]),
                    Gen::Uniform(-0.5, 0.5),
                ),
            ],
        ));
    }
    Ok(())
}
