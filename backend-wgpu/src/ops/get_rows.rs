//! `get_rows`: embedding lookup from a table in any format, decoded in the kernel. Tables
//! larger than one storage binding are looked up in row ranges; each launch writes only the
//! ids that fall in its range.

use kiln_core::op::{GetRowsOp, Op, OpDesc};
use kiln_core::tensor::{DType, Tensor};
use kiln_core::Result;

use super::{bind, err, launch_1d, u};
use crate::device::Device;
use crate::kernels;

pub(super) fn supports(dev: &Device, d: &OpDesc) -> bool {
    let (w, y) = (&d.inputs[0], &d.outputs[0]);
    let row_bytes = w.dtype.bytes_for(w.shape.last()).unwrap_or(usize::MAX);
    y.dtype == DType::F32
        && kernels::get_rows(w.dtype).is_some()
        && w.shape.rank() == 2
        && (w.dtype.block_size() == 1 || w.shape.last() % 32 == 0)
        && dev.fits_binding(y.nbytes().unwrap_or(usize::MAX))
        && dev.fits_binding(row_bytes)
}

pub(super) fn get_rows(dev: &Device, w: &Tensor, ids: &Tensor, y: &Tensor) -> Result<()> {
    let kernel = kernels::get_rows(w.dtype())
        .ok_or_else(|| err(format!("get_rows: no kernel for a {} table", w.dtype())))?;
    let (v, d) = (w.shape().dims()[0], w.shape().last());
    let row_bytes = w.nbytes() / v.max(1);
    let per = dev.rows_per_binding(v, row_bytes);
    let n_ids = ids.numel();
    let chunks = d.div_ceil(32);
    let mut r0 = 0;
    while r0 < v {
        let rows = per.min(v - r0);
        let part = if rows == v {
            w.clone()
        } else {
            w.view(r0 * d, [rows, d])?
        };
        let (bound, offs) = bind(dev, &[(&part, 1), (ids, 4), (y, 4)])?;
        let params = vec![
            u(n_ids)?,
            u(d)?,
            offs[1],
            offs[0],
            u(row_bytes)?,
            offs[2],
            u(r0)?,
            u(rows)?,
        ];
        launch_1d(dev, kernel, &bound, params, (n_ids * chunks).div_ceil(64))?;
        r0 += rows;
    }
    Ok(())
}

/// Which of the family's ops this backend runs.
pub(super) fn supports_op(dev: &Device, op: &GetRowsOp, d: &OpDesc) -> bool {
    match op {
        GetRowsOp::GetRows => supports(dev, d),
        GetRowsOp::SoftEmbedding { .. } => false,
    }
}

/// Records one of the family's ops.
pub(super) fn run_op(dev: &Device, op: &GetRowsOp, i: &[&Tensor], o: &[&Tensor]) -> Result<()> {
    match op {
        GetRowsOp::GetRows => get_rows(dev, i[0], i[1], o[0]),
        other => Err(super::no_kernel(&Op::GetRows(other.clone()))),
    }
}
