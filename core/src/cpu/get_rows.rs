//! Embedding lookup from a table in any dtype.

use rayon::prelude::*;

use super::{index, In, KResult, Out};
use crate::quant;

pub(crate) fn get_rows(i: &[In], o: &mut [Out]) -> KResult {
    let (table, ids) = (&i[0], i[1].i32()?);
    let (v, d) = (table.dims()[0], table.dims()[1]);
    let rb = table.row_bytes();
    let rows = ids
        .iter()
        .map(|&id| index(id, v, "row id"))
        .collect::<KResult<Vec<_>>>()?;
    o[0].with_f32(false, |y| {
        y.par_chunks_mut(d.max(1))
            .zip(rows.par_iter())
            .try_for_each(|(dst, &r)| -> KResult {
                quant::dequantize(table.desc.dtype, &table.bytes[r * rb..(r + 1) * rb], dst)?;
                Ok(())
            })
    })
}
