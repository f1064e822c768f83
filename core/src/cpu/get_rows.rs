//! Embedding lookup from a table in any dtype.

use super::{index, pool, In, KResult, Out};
use crate::quant;

pub(crate) fn get_rows(i: &[In], o: &mut [Out]) -> KResult {
    let (table, ids) = (&i[0], i[1].i32()?);
    let (v, d) = (table.dims()[0], table.dims()[1]);
    let rb = table.row_bytes();
    let rows = ids
        .iter()
        .map(|&id| index(id, v, "row id"))
        .collect::<KResult<Vec<_>>>()?;
    let d = d.max(1);
    o[0].with_f32(false, |y| {
        pool::par_rows(y, d, 1 << 15, |r0, dst| {
            for (dst, &r) in dst.chunks_mut(d).zip(&rows[r0..]) {
                quant::dequantize_row(table.desc.dtype, &table.bytes[r * rb..(r + 1) * rb], dst);
            }
        });
        Ok(())
    })
}
