//! The conv1d family: batches of sequences with carried state, and the decode step on a
//! state pool.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    // Conv1d: two sequences of 5 and 1 tokens, K=4, C=67.
    for silu in [false, true] {
        c.push(Case::new(
            Op::Conv(ConvOp::Conv1d { silu }),
            format!("silu={silu} seqs 5+1 K=4 C=67"),
            vec![
                n(F32, &[6, 67]),
                n(F32, &[67, 4]),
                n(F32, &[2, 3, 67]),
                ids(&[3], vec![0, 5, 6]),
            ],
        )?);
    }
    c.push(Case::new(
        Op::Conv(ConvOp::Conv1d { silu: true }),
        "prefill 1 seq 33 K=4 C=128",
        vec![
            n(F32, &[33, 128]),
            n(F32, &[128, 4]),
            n(F32, &[1, 3, 128]),
            ids(&[2], vec![0, 33]),
        ],
    )?);

    for silu in [false, true] {
        c.push(Case::in_place(
            Op::Conv(ConvOp::Conv1dDecode { silu }),
            format!("silu={silu} S=3 pool=4 K=4 C=67"),
            vec![n(F32, &[3, 67]), n(F32, &[67, 4]), ids(&[3], vec![3, 1, 0])],
            vec![
                (TensorDesc::new(F32, [3, 67]), Gen::Normal(1.0)),
                (TensorDesc::new(F32, [4, 3, 67]), Gen::Normal(1.0)),
            ],
        ));
    }
    Ok(())
}
