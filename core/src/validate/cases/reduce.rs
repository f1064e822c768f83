//! The reduction family: argmax and top-k, ties included.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    c.push(Case::new(
        Op::Reduce(ReduceOp::Argmax),
        "[1,49152]",
        vec![n(F32, &[1, 49152])],
    )?);
    c.push(Case::new(
        Op::Reduce(ReduceOp::Argmax),
        "[7,1001]",
        vec![n(F32, &[7, 1001])],
    )?);
    c.push(Case::new(
        Op::Reduce(ReduceOp::TopK(1)),
        "k=1 [3,100]",
        vec![n(F32, &[3, 100])],
    )?);
    c.push(Case::new(
        Op::Reduce(ReduceOp::TopK(40)),
        "k=40 [2,32000]",
        vec![n(F32, &[2, 32000])],
    )?);
    // Rows of small integers: many ties, which go to the lower index.
    for (op, label) in [
        (Op::Reduce(ReduceOp::Argmax), "ties [3,300]"),
        (Op::Reduce(ReduceOp::TopK(9)), "k=9 ties [3,300]"),
    ] {
        c.push(Case::new(
            op,
            label,
            vec![Input {
                desc: TensorDesc::new(F32, [3, 300]),
                gen: Gen::Ints(rand_ids(label, 900, 6)),
            }],
        )?);
    }
    c.push(Case::new(
        Op::Reduce(ReduceOp::TopK(5)),
        "k=5 f16 [4,77]",
        vec![n(F16, &[4, 77])],
    )?);
    Ok(())
}
