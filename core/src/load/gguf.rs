//! GGUF files (versions 2 and 3): metadata, tensor infos and the memory-mapped tensor data.
//!
//! Layout (little-endian throughout):
//!
//! ```text
//! magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
//! metadata_kv_count × (string key, u32 value type, value)
//! tensor_count × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml type, u64 offset)
//! padding to general.alignment (default 32)
//! tensor data; each offset above is relative to the start of this section
//! ```
//!
//! A string is a u64 byte length followed by that many bytes of UTF-8. An array value is a u32
//! element type, a u64 count and the elements. `ne[0]` is the innermost dimension; kiln shapes
//! are outermost first, so [`TensorInfo::shape`] is `ne` reversed.
//!
//! The parser treats the file as untrusted: every length and count is checked against the bytes
//! that remain before anything is allocated, all arithmetic on file values is checked, nested
//! arrays have a depth cap, and every failure is an [`Error::Load`] naming the file, the place
//! (offset, key or tensor) and the problem. Nothing here panics on file contents.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use crate::error::{Error, Result};
use crate::tensor::DType;

mod value;

#[cfg(test)]
use value::vtype;
pub use value::Value;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// The most dimensions a tensor info may have (ggml itself uses at most 4).
pub const MAX_DIMS: usize = 8;
/// The deepest nesting of array values accepted (an array of scalars has depth 1).
pub const MAX_ARRAY_DEPTH: usize = 16;

// ---------------------------------------------------------------------------------------------
// Tensor infos and the file
// ---------------------------------------------------------------------------------------------

/// Where one tensor lives in the file and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Outermost first (GGUF's `ne` reversed).
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Bytes of data (`dtype.bytes_for(n_elements)`).
    pub nbytes: usize,
}

impl TensorInfo {
    /// Number of elements (1 for a scalar).
    pub fn n_elements(&self) -> usize {
        // Checked at parse time not to overflow.
        self.shape.iter().product()
    }
}

/// The bytes of a GGUF file: memory-mapped by [`GgufFile::open`], owned by [`GgufFile::from_bytes`].
pub(crate) enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Random access to the bytes of a model file that is not held in memory: in a browser, a
/// file in the Origin Private File System or one the user picked, read synchronously from a
/// Web Worker. A model loaded through it reads one tensor at a time
/// ([`GgufFile::from_source`]).
pub trait ReadAt: Send + Sync {
    /// The file's length in bytes.
    fn len(&self) -> usize;
    /// Fills `buf` with the bytes at `offset..offset + buf.len()` (always inside the file).
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> std::result::Result<(), String>;
}

/// The most header bytes [`GgufFile::from_source`] reads before giving up (a real model's
/// header, vocabulary included, is a few MiB).
const MAX_SOURCE_HEADER: usize = 256 << 20;

/// A parsed GGUF file: metadata in file order, tensor infos, and the bytes they point into.
pub struct GgufFile {
    path: String,
    header: Header,
    bytes: Bytes,
    /// Where the tensor data is read from when `bytes` holds only the header
    /// ([`GgufFile::from_source`]).
    source: Option<Box<dyn ReadAt>>,
    /// For a model assembled from other files (a Hugging Face checkpoint): further buffers,
    /// and which one each tensor lives in (`None`: `bytes`).
    blobs: Vec<Bytes>,
    blob_of: Vec<Option<usize>>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("metadata_kvs", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .field("alignment", &self.header.alignment)
            .field("data_offset", &self.header.data_offset)
            .field("file_size", &self.file_size())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, then parses and validates its header.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|e| Error::load(&name, format!("cannot open: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::load(&name, format!("cannot stat: {e}")))?;
        if meta.is_dir() {
            return Err(Error::load(&name, "is a directory, expected a GGUF file"));
        }
        let bytes = if meta.len() == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only. As with every memory-mapped file, another process
            // truncating or rewriting the file while it is mapped is outside what we can guard
            // against; model files are not expected to change under a running engine.
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| Error::load(&name, format!("cannot memory-map: {e}")))?;
            Bytes::Mapped(map)
        };
        Self::parse_into(name, bytes)
    }

    /// Parses GGUF bytes held in memory (tests, fuzzing, files read by other means). `name` is
    /// what errors call the file.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse_into(name.to_string(), Bytes::Owned(bytes))
    }

    /// Parses the GGUF file that `source` reads, holding only its header in memory: each
    /// tensor's data is read when it is asked for ([`GgufFile::tensor_data`]), so loading a
    /// model keeps one tensor at a time on the host (what a browser's 4 GiB wasm heap needs).
    pub fn from_source(name: &str, source: Box<dyn ReadAt>) -> Result<GgufFile> {
        let len = source.len();
        let mut want = len.min(4 << 20);
        loop {
            let mut buf = vec![0u8; want];
            source
                .read_at(0, &mut buf)
                .map_err(|e| Error::load(name, format!("cannot read: {e}")))?;
            match Header::parse(&buf, len) {
                Ok(header) => {
                    let blob_of = vec![None; header.tensors.len()];
                    return Ok(GgufFile {
                        path: name.to_string(),
                        header,
                        bytes: Bytes::Owned(Vec::new()),
                        source: Some(source),
                        blobs: Vec::new(),
                        blob_of,
                    });
                }
                // The header may reach past what was read (the parser met the end of the
                // bytes it was given): read more, up to a bound. Any other error is final.
                Err(msg) if msg.contains("truncated file") && want < len && want < MAX_SOURCE_HEADER => {
                    want = want.saturating_mul(4).min(len).min(MAX_SOURCE_HEADER);
                }
                Err(msg) if msg.contains("truncated file") && want < len => {
                    return Err(Error::load(
                        name,
                        format!("{msg} (within the first {MAX_SOURCE_HEADER} bytes, the most a header may take)"),
                    ))
                }
                Err(msg) => return Err(Error::load(name, msg)),
            }
        }
    }

    fn parse_into(path: String, bytes: Bytes) -> Result<GgufFile> {
        let header = Header::parse(&bytes, bytes.len()).map_err(|msg| Error::load(&path, msg))?;
        tracing::debug!(
            path = %path,
            version = header.version,
            metadata = header.metadata.len(),
            tensors = header.tensors.len(),
            alignment = header.alignment,
            "opened GGUF file"
        );
        let blob_of = vec![None; header.tensors.len()];
        Ok(GgufFile {
            path,
            header,
            bytes,
            source: None,
            blobs: Vec::new(),
            blob_of,
        })
    }

    /// A model described as a GGUF file would be, from metadata and tensors held in other
    /// buffers: tensor `i` is `tensors[i].0` in `blobs[tensors[i].1]` (its `offset` relative to
    /// that buffer). Ranges are checked here, so `tensor_data` cannot fail later.
    pub(crate) fn from_parts(
        path: String,
        metadata: Vec<(String, Value)>,
        tensors: Vec<(TensorInfo, usize)>,
        blobs: Vec<Bytes>,
    ) -> Result<GgufFile> {
        let mut metadata_index = HashMap::new();
        for (i, (k, _)) in metadata.iter().enumerate() {
            if metadata_index.insert(k.clone(), i).is_some() {
                return Err(Error::load(&path, format!("metadata key {k} twice")));
            }
        }
        let mut tensor_index = HashMap::new();
        let mut infos = Vec::with_capacity(tensors.len());
        let mut blob_of = Vec::with_capacity(tensors.len());
        for (i, (t, b)) in tensors.into_iter().enumerate() {
            let len = blobs.get(b).map(|x| x.len());
            let end = t.offset.checked_add(t.nbytes);
            if len.is_none() || end.is_none() || end > len {
                return Err(Error::load(
                    &path,
                    format!("tensor {} lies outside its data", t.name),
                ));
            }
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(Error::load(&path, format!("tensor {} twice", t.name)));
            }
            infos.push(t);
            blob_of.push(Some(b));
        }
        Ok(GgufFile {
            path,
            header: Header {
                version: 3,
                metadata,
                metadata_index,
                tensors: infos,
                tensor_index,
                alignment: DEFAULT_ALIGNMENT,
                data_offset: 0,
            },
            bytes: Bytes::Owned(Vec::new()),
            source: None,
            blobs,
            blob_of,
        })
    }

    /// The file's name as given to [`GgufFile::open`] / [`GgufFile::from_bytes`].
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The GGUF version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The data-section alignment (`general.alignment`, 32 when absent).
    pub fn alignment(&self) -> usize {
        self.header.alignment
    }

    /// Absolute offset of the data section (tensor offsets in the file are relative to it).
    pub fn data_offset(&self) -> usize {
        self.header.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> usize {
        self.source.as_ref().map_or(self.bytes.len(), |s| s.len())
    }

    /// Every metadata key and value, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.header.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header
            .metadata_index
            .get(key)
            .map(|&i| &self.header.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| Error::load(&self.path, format!("missing metadata key {key}")))
    }

    fn wrong_type(&self, key: &str, v: &Value, expected: &str) -> Error {
        Error::load(
            &self.path,
            format!(
                "metadata key {key} is {}, expected {expected}",
                v.describe()
            ),
        )
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, v, "a string"))
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| self.wrong_type(key, v, "a non-negative integer"))
    }

    /// Any integer value that fits in an i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        let v = self.require(key)?;
        v.as_i64()
            .ok_or_else(|| self.wrong_type(key, v, "an integer"))
    }

    /// Any number (f32, f64 or an integer), converted to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong_type(key, v, "a number"))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong_type(key, v, "a bool"))
    }

    fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| self.wrong_type(key, v, "an array"))
    }

    fn array_of<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        conv: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Vec<T>> {
        let items = self.get_array(key)?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                conv(v).ok_or_else(|| {
                    Error::load(
                        &self.path,
                        format!(
                            "metadata key {key}: element {i} is {}, expected {expected}",
                            v.describe()
                        ),
                    )
                })
            })
            .collect()
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.array_of(key, "a string", Value::as_str)
    }

    /// An array of numbers (any numeric element type), converted to f32.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.array_of(key, "a number", |v| v.as_f64().map(|x| x as f32))
    }

    /// An array of integers (any integer element type that fits in an i64).
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        self.array_of(key, "an integer", Value::as_i64)
    }

    /// `general.architecture` ("llama", "gemma3", …).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// `"{architecture}.{suffix}"`, e.g. `arch_key("block_count")` → `"llama.block_count"`. When
    /// the file has no string `general.architecture`, the prefix is
    /// `"(missing general.architecture)"`, so a lookup of the key fails with a message that
    /// says why.
    pub fn arch_key(&self, suffix: &str) -> String {
        match self.architecture() {
            Ok(arch) => format!("{arch}.{suffix}"),
            Err(_) => format!("(missing general.architecture).{suffix}"),
        }
    }

    /// Tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
            .ok_or_else(|| {
                Error::load(
                    &self.path,
                    format!(
                        "missing tensor {name} (the file has {} tensors)",
                        self.header.tensors.len()
                    ),
                )
            })
    }

    /// The data of `t`: exactly `t.nbytes` bytes, borrowed from the file's memory or, for a
    /// file read through [`ReadAt`], read now.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<Cow<'_, [u8]>> {
        let foreign = || {
            Error::load(
                &self.path,
                format!(
                    "tensor {} ({} bytes at offset {}) is not a tensor of this file",
                    t.name, t.nbytes, t.offset
                ),
            )
        };
        let index = self.header.tensor_index.get(&t.name).copied();
        let blob = index
            .and_then(|i| self.blob_of.get(i).copied().flatten())
            .and_then(|b| self.blobs.get(b));
        let end = t.offset.checked_add(t.nbytes).ok_or_else(foreign)?;
        if let (None, Some(src)) = (blob, &self.source) {
            if index.is_none() || end > src.len() {
                return Err(foreign());
            }
            // Bounded by the file's length (checked above), yet maybe more than the host can
            // give (a browser's wasm heap): an error, not an abort.
            let mut buf = Vec::new();
            buf.try_reserve_exact(t.nbytes).map_err(|_| {
                Error::load(
                    &self.path,
                    format!("no memory for tensor {} ({} bytes)", t.name, t.nbytes),
                )
            })?;
            buf.resize(t.nbytes, 0);
            src.read_at(t.offset, &mut buf).map_err(|e| {
                Error::load(&self.path, format!("cannot read tensor {}: {e}", t.name))
            })?;
            return Ok(Cow::Owned(buf));
        }
        let bytes: &[u8] = blob.map_or(&self.bytes, |b| b);
        bytes
            .get(t.offset..end)
            .map(Cow::Borrowed)
            .ok_or_else(foreign)
    }

    /// The info and the data of tensor `name`.
    pub fn data(&self, name: &str) -> Result<(&TensorInfo, Cow<'_, [u8]>)> {
        let t = self.tensor(name)?;
        Ok((t, self.tensor_data(t)?))
    }

    /// A copy of this model, held in memory, with each tensor for which `pick` names a type
    /// re-encoded in it (dequantized, then quantized again: the new format's approximation of
    /// the stored values); the other tensors and the metadata are kept as they are. For
    /// checking one format's kernels on a real model's weights.
    pub fn requantized(&self, pick: impl Fn(&TensorInfo) -> Option<DType>) -> Result<GgufFile> {
        let mut blob = Vec::new();
        let mut tensors = Vec::with_capacity(self.header.tensors.len());
        for t in &self.header.tensors {
            let data = self.tensor_data(t)?;
            let (dtype, bytes) = match pick(t) {
                Some(to) if to != t.dtype => {
                    let mut f = vec![0f32; t.n_elements()];
                    crate::quant::dequantize(t.dtype, &data, &mut f)?;
                    (to, crate::quant::quantize(to, &f)?)
                }
                _ => (t.dtype, data.to_vec()),
            };
            blob.resize(blob.len().next_multiple_of(DEFAULT_ALIGNMENT), 0);
            let info = TensorInfo {
                name: t.name.clone(),
                dtype,
                shape: t.shape.clone(),
                offset: blob.len(),
                nbytes: bytes.len(),
            };
            blob.extend_from_slice(&bytes);
            tensors.push((info, 0));
        }
        GgufFile::from_parts(
            self.path.clone(),
            self.header.metadata.clone(),
            tensors,
            vec![Bytes::Owned(blob)],
        )
    }
}

// ---------------------------------------------------------------------------------------------
// The parser
// ---------------------------------------------------------------------------------------------

/// Everything a GGUF file's header says, validated.
#[derive(Debug)]
struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: usize,
    data_offset: usize,
}

/// A bounds-checked little-endian cursor. Errors are plain messages; the caller adds the file.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let rem = self.remaining();
        if n > rem {
            return Err(format!(
                "truncated file: {what} at offset {} needs {n} bytes but only {rem} remain",
                self.pos
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        self.array(what).map(u16::from_le_bytes)
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A u64 length and that many bytes of strict UTF-8.
    fn string(&mut self, what: &str) -> Result<String, String> {
        let at = self.pos;
        let len = self.u64(what)?;
        let rem = self.remaining();
        let len = match usize::try_from(len) {
            Ok(l) if l <= rem => l,
            _ => {
                return Err(format!(
                    "{what} at offset {at} has length {len} but only {rem} bytes remain (corrupt length or truncated file)"
                ))
            }
        };
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(format!(
                "{what} at offset {at} is not valid UTF-8 (invalid byte at offset {})",
                at + 8 + e.valid_up_to()
            )),
        }
    }
}

/// Names of ggml type ids that kiln does not read, for error messages.
fn ggml_type_name(t: u32) -> Option<&'static str> {
    Some(match t {
        4 => "q4_2 (removed from ggml)",
        5 => "q4_3 (removed from ggml)",
        9 => "q8_1",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        31..=33 => "q4_0_4_4/q4_0_4_8/q4_0_8_8 (removed from ggml)",
        34 => "tq1_0",
        35 => "tq2_0",
        36..=38 => "iq4_nl_4_4/iq4_nl_4_8/iq4_nl_8_8 (removed from ggml)",
        _ => return None,
    })
}

/// A tensor info as read, before the data section's position is known.
struct RawTensor {
    info: TensorInfo, // `offset` still relative to the data section
    at: usize,        // where its info starts in the file
}

impl Header {
    /// Parses the header in `buf`. `file_len` is the size of the whole file, which tensor data
    /// ranges are checked against; `buf` is normally the whole file but may be just a prefix
    /// holding the header (the header itself must lie in `buf`).
    fn parse(buf: &[u8], file_len: usize) -> Result<Header, String> {
        if buf.is_empty() {
            return Err("empty file (0 bytes), not a GGUF file".into());
        }
        let mut r = Reader { buf, pos: 0 };
        let magic = r.array::<4>("the magic")?;
        if magic != MAGIC {
            return Err(format!(
                "not a GGUF file: bad magic {:?} (bytes {:02x?}), expected \"GGUF\"",
                String::from_utf8_lossy(&magic),
                magic
            ));
        }
        let version = r.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(
                    "GGUF version 1 is not supported (kiln reads versions 2 and 3; convert the model again with a current converter)"
                        .into(),
                )
            }
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(format!(
                    "big-endian GGUF file (version {} byte-swapped), kiln reads little-endian files only",
                    v.swap_bytes()
                ))
            }
            v => {
                return Err(format!(
                    "unsupported GGUF version {v} (kiln reads versions 2 and 3)"
                ))
            }
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;

        // The fewest bytes one metadata entry / tensor info can take.
        const MIN_KV: u64 = 8 + 4 + 1;
        const MIN_TENSOR: u64 = 8 + 4 + 4 + 8;
        let rem = r.remaining() as u64;
        let needed = kv_count.checked_mul(MIN_KV).and_then(|a| {
            tensor_count
                .checked_mul(MIN_TENSOR)
                .and_then(|b| a.checked_add(b))
        });
        match needed {
            Some(n) if n <= rem => {}
            _ => {
                return Err(format!(
                    "header claims {kv_count} metadata entries and {tensor_count} tensors, more than the {rem} bytes after the header can hold (corrupt header or truncated file)"
                ))
            }
        }
        // Both fit in usize now: each is at most the buffer length.
        let kv_count = kv_count as usize;
        let tensor_count = tensor_count as usize;

        // Metadata.
        // Counts are bounded by the bytes that hold them, but one entry takes more memory than
        // its fewest bytes: grow as entries are read rather than trust the count up front.
        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(kv_count.min(1 << 12));
        let mut metadata_index: HashMap<String, usize> =
            HashMap::with_capacity(kv_count.min(1 << 12));
        for i in 0..kv_count {
            let at = r.pos;
            let key = r
                .string("metadata key")
                .map_err(|e| format!("metadata entry #{i}: {e}"))?;
            let ctx = |e: String| format!("metadata key {key} (entry #{i} at offset {at}): {e}");
            let ty = r.u32("value type").map_err(ctx)?;
            let value = r.value(ty, 0).map_err(ctx)?;
            if let Some(&first) = metadata_index.get(&key) {
                return Err(format!(
                    "duplicate metadata key {key} (entries #{first} and #{i})"
                ));
            }
            metadata_index.insert(key.clone(), i);
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let v = &metadata[i].1;
                match v.as_u64().and_then(|a| usize::try_from(a).ok()) {
                    Some(a) if a.is_power_of_two() => a,
                    Some(a) => {
                        return Err(format!(
                            "general.alignment must be a nonzero power of two, found {a}"
                        ))
                    }
                    None => {
                        return Err(format!(
                            "general.alignment must be a nonzero power of two, found {}",
                            v.describe()
                        ))
                    }
                }
            }
        };

        // Tensor infos.
        let mut raw: Vec<RawTensor> = Vec::with_capacity(tensor_count.min(1 << 12));
        let mut tensor_index: HashMap<String, usize> =
            HashMap::with_capacity(tensor_count.min(1 << 12));
        for i in 0..tensor_count {
            let at = r.pos;
            let name = r
                .string("tensor name")
                .map_err(|e| format!("tensor info #{i}: {e}"))?;
            let info = Self::tensor_info(&mut r, name.clone(), alignment)
                .map_err(|e| format!("tensor {name} (info #{i} at offset {at}): {e}"))?;
            if let Some(&first) = tensor_index.get(&name) {
                return Err(format!(
                    "duplicate tensor name {name} (infos #{first} and #{i})"
                ));
            }
            tensor_index.insert(name, i);
            raw.push(RawTensor { info, at });
        }

        // The data section, and every tensor's range in it.
        let data_offset = r
            .pos
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| format!("data section offset overflows with alignment {alignment}"))?;
        let mut tensors = Vec::with_capacity(raw.len());
        for RawTensor { mut info, at } in raw {
            let rel = info.offset;
            let range = data_offset
                .checked_add(rel)
                .and_then(|start| start.checked_add(info.nbytes).map(|end| (start, end)));
            match range {
                Some((start, end)) if end <= file_len => info.offset = start,
                _ => {
                    return Err(format!(
                        "tensor {} (info at offset {at}): data of {} bytes at offset {rel} in the data section (file offset {}) extends past the end of the file ({file_len} bytes)",
                        info.name,
                        info.nbytes,
                        data_offset as u128 + rel as u128,
                    ))
                }
            }
            tensors.push(info);
        }

        Ok(Header {
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The rest of one tensor info after its name; `offset` is left relative to the data section.
    fn tensor_info(
        r: &mut Reader<'_>,
        name: String,
        alignment: usize,
    ) -> Result<TensorInfo, String> {
        let n_dims = r.u32("n_dims")?;
        if n_dims as usize > MAX_DIMS {
            return Err(format!(
                "{n_dims} dimensions, at most {MAX_DIMS} are allowed"
            ));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            ne.push(r.u64(&format!("ne[{d}]"))?);
        }
        let type_at = r.pos;
        let ty = r.u32("ggml type")?;
        let rel_offset = r.u64("data offset")?;

        let dtype = DType::from_ggml_type(ty).ok_or_else(|| match ggml_type_name(ty) {
            Some(n) => format!("ggml type {ty} ({n}) at offset {type_at} is not supported by kiln"),
            None => format!("unknown ggml type {ty} at offset {type_at}"),
        })?;

        // The product of the nonzero dimensions must fit, so that multiplying the dimensions
        // in any order never overflows (a zero dimension makes an empty tensor).
        let mut n: u64 = 1;
        for &d in &ne {
            n = n.checked_mul(d.max(1)).ok_or_else(|| {
                format!("dimensions {ne:?} overflow: the element count does not fit in 64 bits")
            })?;
        }
        let n = match usize::try_from(n) {
            Ok(_) if ne.contains(&0) => 0,
            Ok(n) => n,
            Err(_) => {
                return Err(format!(
                    "dimensions {ne:?}: {n} elements do not fit in memory"
                ))
            }
        };
        // Each dimension is at most the product checked above, so it fits in usize.
        let shape: Vec<usize> = ne.iter().rev().map(|&d| d as usize).collect();

        let row = ne.first().copied().unwrap_or(1);
        let bs = dtype.block_size() as u64;
        if row % bs != 0 {
            return Err(format!(
                "row length ne[0] = {row} is not a multiple of the {dtype} block size {bs}"
            ));
        }
        let nbytes = dtype
            .bytes_for(n)
            .ok_or_else(|| format!("{dtype} tensor of {n} elements: the byte size overflows"))?;

        let offset = usize::try_from(rel_offset)
            .map_err(|_| format!("data offset {rel_offset} does not fit in memory"))?;
        if offset % alignment != 0 {
            return Err(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        Ok(TensorInfo {
            name,
            dtype,
            shape,
            offset,
            nbytes,
        })
    }
}

#[cfg(test)]
mod tests;
