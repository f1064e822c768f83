//! The case table: every op, at decode and prefill sizes, with odd sizes that are not
//! multiples of block or workgroup sizes. Each op family's cases are in the file of its stem
//! (`cases/<family>.rs`); this file lists the families and holds their shared helpers.

use super::rng::Rng;
use super::{Case, Gen, Input};
use crate::error::Result;
use crate::op::{
    AttentionOp, AttnParams, CanvasOp, ConvOp, DeltaNetOp, ElementwiseOp, GetRowsOp, GluOp, Mask,
    MatMulOp, MoeGating, MoeOp, NormOp, Op, ReduceOp, RopeMode, RopeOp, RopeParams, SoftmaxOp,
    UnaryOp,
};
use crate::tensor::{DType, TensorDesc};

use DType::*;

mod attention;
mod canvas;
mod conv;
mod delta_net;
mod elementwise;
mod get_rows;
mod mat_mul;
mod moe;
mod norm;
mod reduce;
mod rope;
mod softmax;

/// A row width that is a whole number of blocks of `d` but not a power of two where possible.
fn width(d: DType) -> usize {
    match d.block_size() {
        1 => 100,
        32 => 96,
        64 => 192,
        _ => 512,
    }
}

fn n(d: DType, s: &[usize]) -> Input {
    Input::normal(d, s)
}

fn ids(s: &[usize], v: Vec<i32>) -> Input {
    Input::ints(s, v)
}

/// Deterministic "random" ids in `0..hi`.
fn rand_ids(seed: &str, count: usize, hi: usize) -> Vec<i32> {
    let mut r = Rng::from_label(seed);
    (0..count).map(|_| r.below(hi) as i32).collect()
}

/// Every family's cases, family by family.
pub fn cases() -> Result<Vec<Case>> {
    let mut c = Vec::new();
    let families: [fn(&mut Vec<Case>) -> Result<()>; 12] = [
        mat_mul::cases,
        get_rows::cases,
        elementwise::cases,
        norm::cases,
        rope::cases,
        softmax::cases,
        attention::cases,
        reduce::cases,
        conv::cases,
        delta_net::cases,
        moe::cases,
        canvas::cases,
    ];
    for family in families {
        family(&mut c)?;
    }
    Ok(c)
}
