//! The safetensors format: an 8-byte little-endian header length, a JSON header naming each
//! tensor's dtype, shape and byte range, then the data. Files are memory-mapped; every field
//! of the header is checked before it is used.

use std::fs::File;
use std::path::Path;

use serde_json::Value;

use super::gguf::Bytes;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// The largest JSON header accepted (safetensors itself caps it at 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub dtype: DType,
    /// Outermost first.
    pub shape: Vec<usize>,
    /// Absolute byte offset in the file.
    pub offset: usize,
    pub nbytes: usize,
    /// Stored as I64 (`dtype` is then I32): the loader narrows it, checking every value fits.
    pub wide: bool,
}

/// A memory-mapped safetensors file.
pub struct SafetensorsFile {
    pub(crate) bytes: Bytes,
    pub entries: Vec<Entry>,
}

fn dtype(s: &str) -> Option<DType> {
    match s {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        "I32" => Some(DType::I32),
        _ => None,
    }
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|e| Error::load(&name, format!("cannot open: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| Error::load(&name, format!("cannot stat: {e}")))?
            .len();
        if len < 8 {
            return Err(Error::load(&name, "too short for a safetensors file"));
        }
        // SAFETY: read-only map; the file is not expected to change while the model runs (as
        // for GGUF files).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::load(&name, format!("cannot memory-map: {e}")))?;
        Self::parse(&name, Bytes::Mapped(map))
    }

    pub(crate) fn parse(name: &str, bytes: Bytes) -> Result<SafetensorsFile> {
        let bad = |msg: String| Error::load(name, msg);
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(bytes.get(..8).ok_or_else(|| bad("no header".into()))?);
        let hlen = u64::from_le_bytes(len8);
        if hlen > MAX_HEADER || hlen + 8 > bytes.len() as u64 {
            return Err(bad(format!(
                "header of {hlen} bytes does not fit the file of {}",
                bytes.len()
            )));
        }
        let data_start = 8 + hlen as usize;
        let header: Value = serde_json::from_slice(&bytes[8..data_start])
            .map_err(|e| bad(format!("header is not JSON: {e}")))?;
        let obj = header
            .as_object()
            .ok_or_else(|| bad("header is not a JSON object".into()))?;
        let data_len = bytes.len() - data_start;
        let mut entries = Vec::with_capacity(obj.len());
        for (tname, v) in obj {
            if tname == "__metadata__" {
                continue;
            }
            let field = |k: &str| {
                v.get(k)
                    .ok_or_else(|| bad(format!("tensor {tname}: no {k}")))
            };
            let ds = field("dtype")?
                .as_str()
                .ok_or_else(|| bad(format!("tensor {tname}: dtype is not a string")))?;
            let wide = ds == "I64";
            let dt = if wide { Some(DType::I32) } else { dtype(ds) }.ok_or_else(|| {
                bad(format!(
                    "tensor {tname}: dtype {ds} is not supported (F32, F16, BF16, I32, I64)"
                ))
            })?;
            let shape = field("shape")?
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                        .collect::<Option<Vec<usize>>>()
                })
                .ok_or_else(|| bad(format!("tensor {tname}: bad shape")))?;
            let range = field("data_offsets")?
                .as_array()
                .and_then(|a| match a.as_slice() {
                    [b, e] => Some((b.as_u64()? as usize, e.as_u64()? as usize)),
                    _ => None,
                })
                .ok_or_else(|| bad(format!("tensor {tname}: bad data_offsets")))?;
            let n = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("tensor {tname}: shape overflows")))?;
            let nbytes = dt
                .bytes_for(n)
                .and_then(|b| b.checked_mul(if wide { 2 } else { 1 }))
                .ok_or_else(|| bad(format!("tensor {tname}: size overflows")))?;
            if range.0 > range.1 || range.1 > data_len || range.1 - range.0 != nbytes {
                return Err(bad(format!(
                    "tensor {tname}: bytes {}..{} do not hold {shape:?} {ds} in {data_len} bytes of data",
                    range.0, range.1
                )));
            }
            entries.push(Entry {
                name: tname.clone(),
                dtype: dt,
                shape,
                offset: data_start + range.0,
                nbytes,
                wide,
            });
        }
        entries.sort_by_key(|e| e.offset);
        Ok(SafetensorsFile { bytes, entries })
    }

    pub fn data(&self, e: &Entry) -> &[u8] {
        &self.bytes[e.offset..e.offset + e.nbytes]
    }
}

/// An I64 tensor's values as I32 bytes; `None` when one does not fit.
pub fn narrow_i64(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for c in bytes.chunks_exact(8) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        let v = i32::try_from(i64::from_le_bytes(b)).ok()?;
        out.extend_from_slice(&v.to_le_bytes());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn parses_tensors_and_rejects_bad_headers() {
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let data: Vec<u8> = (0..12).collect();
        let f = SafetensorsFile::parse("t", Bytes::Owned(file(h, &data))).unwrap();
        assert_eq!(f.entries.len(), 2);
        assert_eq!(f.entries[0].name, "a");
        assert_eq!(f.data(&f.entries[0]), &data[..8]);
        assert_eq!(f.entries[1].dtype, DType::BF16);
        assert_eq!(f.data(&f.entries[1]), &data[8..]);
        for (what, h, data) in [
            (
                "range past the end",
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                8,
            ),
            (
                "size mismatch",
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
            ),
            (
                "unknown dtype",
                r#"{"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}}"#,
                8,
            ),
            ("not JSON", "{", 0),
            ("no dtype", r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#, 8),
            (
                "negative dim",
                r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
                8,
            ),
        ] {
            let r = SafetensorsFile::parse("t", Bytes::Owned(file(h, &vec![0; data])));
            assert!(r.is_err(), "{what} was accepted");
        }
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(SafetensorsFile::parse("t", Bytes::Owned(huge)).is_err());
        assert!(SafetensorsFile::parse("t", Bytes::Owned(vec![1, 2])).is_err());
    }
}
