//! GGUF files read through [`ReadAt`] ([`GgufFile::from_source`], what a browser's worker
//! uses): the same file as in memory, the header read in growing prefixes, each tensor read
//! alone, and short, failing or foreign sources as errors.

use super::*;

/// A file read through [`ReadAt`], remembering each read (offset, length).
struct Counting {
    bytes: Vec<u8>,
    reads: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl ReadAt for std::sync::Arc<Counting> {
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> std::result::Result<(), String> {
        let src = self
            .bytes
            .get(offset..offset + buf.len())
            .ok_or("read past the end")?;
        buf.copy_from_slice(src);
        if let Ok(mut r) = self.reads.lock() {
            r.push((offset, buf.len()));
        }
        Ok(())
    }
}

/// A file read through `ReadAt` parses as the same file held in memory, even when its header
/// is longer than the first read (a 5 MiB string value here), and its tensors are read one at
/// a time, each exactly its own bytes.
#[test]
fn a_file_read_at_offsets_equals_the_file_in_memory() {
    let mut kvs = all_kvs();
    let long: String = (0..5 << 20)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    kvs.push(("test.long", s(&long)));
    let tensors = all_tensors();
    let bytes = build(3, &kvs, &tensors);
    let src = std::sync::Arc::new(Counting {
        bytes: bytes.clone(),
        reads: Default::default(),
    });
    let f = GgufFile::from_source("test.gguf", Box::new(src.clone())).expect("parses");
    assert_eq!(f.file_size(), bytes.len());
    let header_reads = src.reads.lock().map(|r| r.len()).unwrap_or(0);
    assert!(header_reads >= 2, "the 5 MiB header needs a second read");
    check_round_trip(&f, &kvs, &tensors, 32);
    let reads = src.reads.lock().map(|r| r.clone()).unwrap_or_default();
    for &(off, len) in &reads[header_reads..] {
        let whole = f
            .tensors()
            .iter()
            .any(|t| t.offset == off && t.nbytes == len);
        assert!(whole, "a read at {off} of {len} bytes is not one tensor's");
    }
    // A short header before 12 MiB of data: the header is read alone, the tensor when asked.
    let big = vec![tspec("big", DType::F32, &[3 << 20])];
    let bytes = build(3, &all_kvs(), &big);
    let src = std::sync::Arc::new(Counting {
        bytes: bytes.clone(),
        reads: Default::default(),
    });
    let g = GgufFile::from_source("big.gguf", Box::new(src.clone())).expect("parses");
    let first: usize = src
        .reads
        .lock()
        .map(|r| r.iter().map(|x| x.1).sum())
        .unwrap_or(0);
    assert!(
        first < bytes.len() / 2,
        "the header read took {first} bytes"
    );
    check_round_trip(&g, &all_kvs(), &big, 32);
    // A tensor info of another file is an error, not a read past the end.
    let mut other = f.tensors()[0].clone();
    other.name = "not.here".into();
    other.offset = bytes.len();
    assert!(f.tensor_data(&other).is_err());
}

/// Truncated and failing sources are errors naming the file.
#[test]
fn a_source_that_is_short_or_fails_is_an_error() {
    let bytes = build(3, &all_kvs(), &all_tensors());
    let short = std::sync::Arc::new(Counting {
        bytes: bytes[..bytes.len() / 3].to_vec(),
        reads: Default::default(),
    });
    let e = load_err(
        "short.gguf",
        GgufFile::from_source("short.gguf", Box::new(short)),
    );
    assert!(e.contains("short.gguf"), "{e}");

    // Not a GGUF file at all (a 10 MiB page of something else): one read, and its error.
    let mut seed = 7u64;
    let other: Vec<u8> = (0..10 << 20)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 56) as u8
        })
        .collect();
    let src = std::sync::Arc::new(Counting {
        bytes: other,
        reads: Default::default(),
    });
    let e = load_err(
        "page.gguf",
        GgufFile::from_source("page.gguf", Box::new(src.clone())),
    );
    assert!(e.contains("not a GGUF file"), "{e}");
    assert_eq!(src.reads.lock().map(|r| r.len()).unwrap_or(0), 1);

    struct Failing;
    impl ReadAt for Failing {
        fn len(&self) -> usize {
            1000
        }
        fn read_at(&self, _: usize, _: &mut [u8]) -> std::result::Result<(), String> {
            Err("the handle was closed".into())
        }
    }
    let e = load_err(
        "gone.gguf",
        GgufFile::from_source("gone.gguf", Box::new(Failing)),
    );
    assert!(
        e.contains("gone.gguf") && e.contains("the handle was closed"),
        "{e}"
    );
}
