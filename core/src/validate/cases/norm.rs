//! The normalisation family.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    for one_plus in [false, true] {
        let op = Op::Norm(NormOp::RmsNorm {
            eps: 1e-6,
            one_plus,
        });
        let tag = if one_plus { "(1+w)" } else { "w" };
        c.push(Case::new(
            op.clone(),
            format!("{tag} decode [1,576]"),
            vec![n(F32, &[1, 576]), n(F32, &[576])],
        )?);
        c.push(Case::new(
            op.clone(),
            format!("{tag} prefill [9,640]"),
            vec![n(F32, &[9, 640]), n(F32, &[640])],
        )?);
        c.push(Case::new(
            op.clone(),
            format!("{tag} per head [5,4,64]"),
            vec![n(F32, &[5, 4, 64]), n(F32, &[64])],
        )?);
        c.push(Case::new(
            op,
            format!("{tag} f16 [3,100]"),
            vec![n(F16, &[3, 100]), n(F32, &[100])],
        )?);
    }
    c.push(Case::new(
        Op::Norm(NormOp::L2Norm { eps: 1e-6 }),
        "decode [1,4,128]",
        vec![n(F32, &[1, 4, 128])],
    )?);
    c.push(Case::new(
        Op::Norm(NormOp::L2Norm { eps: 1e-6 }),
        "prefill [9,3,37]",
        vec![n(F32, &[9, 3, 37])],
    )?);

    Ok(())
}
