//! GGUF parser tests: a small writer of our own builds files, the parser reads them back;
//! malformed files give errors that name the file and the problem; seeded mutations of small
//! files and of real model headers never panic.

use super::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

// ---------------------------------------------------------------------------------------------
// A GGUF writer (test-only)
// ---------------------------------------------------------------------------------------------

/// A tensor to write. `ne` is in GGUF order (innermost first). `offset` overrides the offset
/// written (relative to the data section); otherwise tensors are laid out in order, aligned.
#[derive(Clone)]
struct TSpec {
    name: String,
    ggml_type: u32,
    ne: Vec<u64>,
    data: Vec<u8>,
    offset: Option<u64>,
}

fn tspec(name: &str, dtype: DType, ne: &[u64]) -> TSpec {
    let n: u64 = ne.iter().product();
    let nbytes = dtype.bytes_for(n as usize).expect("whole blocks");
    // Distinct, recognisable bytes per tensor.
    let seed = name
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    let data = (0..nbytes).map(|i| seed.wrapping_add(i as u8)).collect();
    TSpec {
        name: name.into(),
        ggml_type: dtype.ggml_type(),
        ne: ne.to_vec(),
        data,
        offset: None,
    }
}

/// Byte writer that remembers where every length, count, type, dimension and offset field went,
/// so mutation tests can aim at them.
#[derive(Default)]
struct W {
    buf: Vec<u8>,
    /// (offset, width in bytes) of each structural integer field.
    fields: Vec<(usize, usize)>,
}

impl W {
    fn u32(&mut self, v: u32) {
        self.fields.push((self.buf.len(), 4));
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.fields.push((self.buf.len(), 8));
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }
    fn value(&mut self, v: &Value) {
        match v {
            Value::U8(x) => self.buf.push(*x),
            Value::I8(x) => self.buf.push(*x as u8),
            Value::U16(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::U64(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => self.buf.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => self.buf.push(*x as u8),
            Value::Str(s) => self.str(s),
            Value::Array(items) => {
                let et = items.first().map_or(vtype::U8, Value::type_id);
                self.u32(et);
                self.u64(items.len() as u64);
                for it in items {
                    assert_eq!(it.type_id(), et, "the writer needs arrays of one type");
                    self.value(it);
                }
            }
        }
    }
    fn kv(&mut self, key: &str, v: &Value) {
        self.str(key);
        self.u32(v.type_id());
        self.value(v);
    }
    fn pad_to(&mut self, alignment: usize) {
        while self.buf.len() % alignment != 0 {
            self.buf.push(0);
        }
    }
}

/// Writes a GGUF file. With `with_data`, the data section follows (padding between tensors,
/// none after the last); without, the bytes end at the padded start of the data section.
fn build_full(version: u32, kvs: &[(&str, Value)], tensors: &[TSpec], with_data: bool) -> W {
    let alignment = kvs
        .iter()
        .find(|(k, _)| *k == "general.alignment")
        .and_then(|(_, v)| v.as_u64())
        .filter(|a| a.is_power_of_two())
        .map_or(DEFAULT_ALIGNMENT, |a| a as usize);
    let mut w = W::default();
    w.buf.extend_from_slice(b"GGUF");
    w.u32(version);
    w.u64(tensors.len() as u64);
    w.u64(kvs.len() as u64);
    for (k, v) in kvs {
        w.kv(k, v);
    }
    // Default layout: in order, each tensor aligned.
    let mut offsets = Vec::new();
    let mut cur = 0usize;
    for t in tensors {
        let off = cur.next_multiple_of(alignment);
        offsets.push(off);
        cur = off + t.data.len();
    }
    for (t, &off) in tensors.iter().zip(&offsets) {
        w.str(&t.name);
        w.u32(t.ne.len() as u32);
        for &d in &t.ne {
            w.u64(d);
        }
        w.u32(t.ggml_type);
        w.u64(t.offset.unwrap_or(off as u64));
    }
    w.pad_to(alignment);
    if with_data {
        let start = w.buf.len();
        for (t, &off) in tensors.iter().zip(&offsets) {
            w.buf.resize(start + off, 0);
            w.buf.extend_from_slice(&t.data);
        }
    }
    w
}

fn build(version: u32, kvs: &[(&str, Value)], tensors: &[TSpec]) -> Vec<u8> {
    build_full(version, kvs, tensors, true).buf
}

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

/// Every value type, nested arrays, an empty array, non-ASCII text.
fn all_kvs() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", s("llama")),
        ("general.name", s("tiny – ünïcödé 模型")),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.f64", Value::F64(-2.25)),
        ("t.true", Value::Bool(true)),
        ("t.false", Value::Bool(false)),
        ("t.empty_str", s("")),
        ("llama.block_count", Value::U32(2)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        (
            "tokenizer.ggml.tokens",
            Value::Array(vec![s("<s>"), s("</s>"), s("▁hello"), s("")]),
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array(vec![Value::F32(0.0), Value::F32(-1.0), Value::F32(-2.5)]),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(3), Value::I32(1), Value::I32(-1)]),
        ),
        ("t.u8s", Value::Array(vec![Value::U8(1), Value::U8(2)])),
        ("t.u64s", Value::Array(vec![Value::U64(1 << 40)])),
        (
            "t.f64s",
            Value::Array(vec![Value::F64(0.5), Value::F64(1e300)]),
        ),
        (
            "t.bools",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        ("t.empty", Value::Array(vec![])),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![Value::I16(1), Value::I16(-2)]),
                Value::Array(vec![]),
                Value::Array(vec![Value::I16(3)]),
            ]),
        ),
        (
            "t.nested3",
            Value::Array(vec![Value::Array(vec![Value::Array(vec![s("deep")])])]),
        ),
    ]
}

fn all_tensors() -> Vec<TSpec> {
    vec![
        tspec("token_embd.weight", DType::Q8_0, &[64, 5]),
        tspec("blk.0.attn_norm.weight", DType::F32, &[7]),
        tspec("blk.0.ffn_up.weight", DType::Q4_K, &[256, 2]),
        tspec("blk.0.attn_q.weight", DType::F16, &[3, 2, 2]),
        tspec("blk.0.x.bf16", DType::BF16, &[5, 1, 1, 3]),
        tspec("blk.0.q4_0", DType::Q4_0, &[32, 3]),
        tspec("blk.0.q6_k", DType::Q6_K, &[512]),
        tspec("scalar", DType::F32, &[]),
        tspec("empty", DType::F32, &[0, 4]),
        tspec("output.weight", DType::I32, &[2, 2]),
    ]
}

fn small_file() -> Vec<u8> {
    build(3, &all_kvs(), &all_tensors())
}

/// The message of a load error for file `name`, checking it names the file.
#[track_caller]
fn load_err<T: fmt::Debug>(name: &str, r: Result<T>) -> String {
    match r {
        Err(e @ Error::Load { .. }) => {
            let msg = e.to_string();
            if let Error::Load { path, .. } = &e {
                assert_eq!(path, name, "{msg}");
            }
            assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
            msg
        }
        Err(e) => panic!("expected a load error, got {e}"),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile> {
    GgufFile::from_bytes("test.gguf", bytes)
}

#[track_caller]
fn parse_err(bytes: Vec<u8>) -> String {
    load_err("test.gguf", parse(bytes))
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

fn check_round_trip(f: &GgufFile, kvs: &[(&str, Value)], tensors: &[TSpec], alignment: usize) {
    assert_eq!(f.alignment(), alignment);
    assert_eq!(f.data_offset() % alignment, 0);
    // Metadata: all of it, in order.
    let got: Vec<(&str, &Value)> = f.metadata().collect();
    assert_eq!(got.len(), kvs.len());
    for ((gk, gv), (k, v)) in got.iter().zip(kvs) {
        assert_eq!(gk, k);
        assert_eq!(*gv, v, "{k}");
        assert_eq!(f.get(k), Some(v));
    }
    // Tensors: shapes reversed, offsets absolute and aligned, data exact.
    assert_eq!(f.tensors().len(), tensors.len());
    for (t, spec) in f.tensors().iter().zip(tensors) {
        assert_eq!(t.name, spec.name);
        assert_eq!(t.dtype.ggml_type(), spec.ggml_type);
        let rev: Vec<usize> = spec.ne.iter().rev().map(|&d| d as usize).collect();
        assert_eq!(t.shape, rev, "{}", t.name);
        assert_eq!(t.nbytes, spec.data.len(), "{}", t.name);
        assert_eq!(t.offset % alignment, 0, "{}", t.name);
        assert!(t.offset >= f.data_offset());
        assert_eq!(
            &*f.tensor_data(t).expect("reads"),
            &spec.data[..],
            "{}",
            t.name
        );
        let (t2, d2) = f.data(&spec.name).unwrap();
        assert_eq!(t2, t);
        assert_eq!(d2, &spec.data[..]);
        assert_eq!(f.tensor(&spec.name).unwrap(), t);
    }
}

#[test]
fn round_trip_every_value_type_and_several_dtypes_v3() {
    let kvs = all_kvs();
    let tensors = all_tensors();
    let f = parse(build(3, &kvs, &tensors)).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.path(), "test.gguf");
    check_round_trip(&f, &kvs, &tensors, 32);

    let q8 = f.tensor("token_embd.weight").unwrap();
    assert_eq!(q8.dtype, DType::Q8_0);
    assert_eq!(q8.shape, vec![5, 64]);
    assert_eq!(q8.nbytes, 5 * 2 * 34);
    assert_eq!(q8.n_elements(), 320);
    let bf = f.tensor("blk.0.x.bf16").unwrap();
    assert_eq!(bf.shape, vec![3, 1, 1, 5]);
    let sc = f.tensor("scalar").unwrap();
    assert_eq!((sc.shape.len(), sc.nbytes, sc.n_elements()), (0, 4, 1));
    let e = f.tensor("empty").unwrap();
    assert_eq!(
        (e.shape.clone(), e.nbytes, e.n_elements()),
        (vec![4, 0], 0, 0)
    );
    assert!(f.tensor_data(e).expect("reads").is_empty());
}

#[test]
fn round_trip_v2_with_alignment_64() {
    let mut kvs = all_kvs();
    kvs.insert(1, ("general.alignment", Value::U32(64)));
    let tensors = all_tensors();
    let f = parse(build(2, &kvs, &tensors)).unwrap();
    assert_eq!(f.version(), 2);
    check_round_trip(&f, &kvs, &tensors, 64);
    // Tensor data really is laid out on 64-byte boundaries (not just 32).
    assert!(
        f.tensors()
            .iter()
            .any(|t| t.offset % 64 == 0 && t.offset % 128 != 0)
            || f.tensors().iter().all(|t| t.offset % 64 == 0)
    );
}

#[test]
fn alignment_of_any_power_of_two_and_any_integer_type() {
    for (a, v) in [
        (1, Value::U32(1)),
        (8, Value::U64(8)),
        (256, Value::U32(256)),
        (16, Value::I32(16)),
    ] {
        let kvs = vec![("general.alignment", v)];
        let tensors = vec![
            tspec("a", DType::F32, &[3]),
            tspec("b", DType::Q8_0, &[32]),
            tspec("c", DType::F16, &[1]),
        ];
        let f = parse(build(3, &kvs, &tensors)).unwrap();
        check_round_trip(&f, &kvs, &tensors, a);
    }
}

#[test]
fn typed_getters() {
    let f = parse(small_file()).unwrap();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.arch_key("block_count"), "llama.block_count");
    assert_eq!(f.get_u64(&f.arch_key("block_count")).unwrap(), 2);
    assert_eq!(f.get_str("general.name").unwrap(), "tiny – ünïcödé 模型");
    assert_eq!(f.get_u64("t.u8").unwrap(), 200);
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_i64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_f32("t.f32").unwrap(), 1.5e-5);
    assert_eq!(f.get_f32("t.f64").unwrap(), -2.25);
    assert_eq!(f.get_f32("t.i16").unwrap(), -30000.0);
    assert!(f.get_bool("t.true").unwrap());
    assert!(!f.get_bool("t.false").unwrap());
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap(),
        vec!["<s>", "</s>", "▁hello", ""]
    );
    assert_eq!(
        f.get_f32_array("tokenizer.ggml.scores").unwrap(),
        vec![0.0, -1.0, -2.5]
    );
    assert_eq!(
        f.get_i64_array("tokenizer.ggml.token_type").unwrap(),
        vec![3, 1, -1]
    );
    assert_eq!(f.get_f32_array("t.u8s").unwrap(), vec![1.0, 2.0]);
    assert!(f.get_str_array("t.empty").unwrap().is_empty());

    // Value conversions.
    assert_eq!(Value::I32(-1).as_u64(), None);
    assert_eq!(Value::I32(7).as_u64(), Some(7));
    assert_eq!(Value::U64(u64::MAX).as_i64(), None);
    assert_eq!(Value::Bool(true).as_f64(), None);
    assert_eq!(Value::Str("x".into()).as_u64(), None);
    assert_eq!(Value::U16(3).as_f64(), Some(3.0));
    assert_eq!(Value::Array(vec![]).type_name(), "array");
    assert_eq!(Value::Str(String::new()).type_name(), "string");
    let long = Value::Array((0..100).map(Value::U32).collect());
    assert_eq!(long.to_string(), "[0, 1, 2, 3, 4, 5, 6, 7, … (100 total)]");
}

#[test]
fn getter_errors_name_the_file_and_the_key() {
    let f = parse(small_file()).unwrap();
    let m = load_err("test.gguf", f.get_str("nope.key"));
    assert!(m.contains("missing metadata key nope.key"), "{m}");
    let m = load_err("test.gguf", f.get_u64("general.name"));
    assert!(
        m.contains("metadata key general.name is a string")
            && m.contains("expected a non-negative integer"),
        "{m}"
    );
    let m = load_err("test.gguf", f.get_u64("t.i8"));
    assert!(m.contains("t.i8 is i8 -100"), "{m}");
    let m = load_err("test.gguf", f.get_str("t.u32"));
    assert!(
        m.contains("t.u32 is u32 4000000000, expected a string"),
        "{m}"
    );
    let m = load_err("test.gguf", f.get_f32("t.true"));
    assert!(m.contains("t.true is bool true, expected a number"), "{m}");
    let m = load_err("test.gguf", f.get_bool("t.u8"));
    assert!(m.contains("t.u8 is u8 200, expected a bool"), "{m}");
    let m = load_err("test.gguf", f.get_str_array("t.u8"));
    assert!(m.contains("expected an array"), "{m}");
    let m = load_err("test.gguf", f.get_str_array("tokenizer.ggml.scores"));
    assert!(
        m.contains("tokenizer.ggml.scores: element 0 is f32 0, expected a string"),
        "{m}"
    );
    let m = load_err("test.gguf", f.get_i64_array("t.f64s"));
    assert!(
        m.contains("element 0 is f64 0.5, expected an integer"),
        "{m}"
    );
    let m = load_err("test.gguf", f.get_f32_array("tokenizer.ggml.tokens"));
    assert!(m.contains("element 0 is a string \"<s>\""), "{m}");
    let m = load_err(
        "test.gguf",
        f.get_i64_array("t.u64s").and(f.get_u64("t.nested")),
    );
    assert!(m.contains("t.nested is an array of 3"), "{m}");
}

#[test]
fn missing_tensor_names_the_file_and_the_tensor() {
    let f = parse(small_file()).unwrap();
    let m = load_err("test.gguf", f.tensor("blk.9.attn_k.weight"));
    assert!(m.contains("missing tensor blk.9.attn_k.weight"), "{m}");
    let m = load_err("test.gguf", f.data("nope"));
    assert!(m.contains("missing tensor nope"), "{m}");
}

#[test]
fn missing_architecture() {
    let f = parse(build(3, &[("general.name", s("x"))], &[])).unwrap();
    let m = load_err("test.gguf", f.architecture());
    assert!(
        m.contains("missing metadata key general.architecture"),
        "{m}"
    );
    let key = f.arch_key("block_count");
    let m = load_err("test.gguf", f.get_u64(&key));
    assert!(m.contains("missing general.architecture"), "{m}");
}

#[test]
fn no_tensors_no_metadata() {
    let f = parse(build(3, &[], &[])).unwrap();
    assert_eq!(f.tensors().len(), 0);
    assert_eq!(f.metadata().count(), 0);
    // Ends right after the header, without padding: still fine.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(parse(b).unwrap().version(), 2);
}

#[test]
fn open_memory_maps_a_file() {
    let bytes = small_file();
    let dir = std::env::temp_dir();
    let path = dir.join(format!("kiln-gguf-test-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path);
    let f = f.unwrap();
    assert_eq!(f.path(), path.display().to_string());
    check_round_trip(&f, &all_kvs(), &all_tensors(), 32);
    assert_eq!(f.file_size(), bytes.len());

    let missing = dir.join("kiln-gguf-test-does-not-exist.gguf");
    let name = missing.display().to_string();
    let m = load_err(&name, GgufFile::open(&missing));
    assert!(m.contains("cannot open"), "{m}");
    let m = load_err(&dir.display().to_string(), GgufFile::open(&dir));
    assert!(m.contains("directory"), "{m}");

    let empty = dir.join(format!("kiln-gguf-test-empty-{}.gguf", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let r = GgufFile::open(&empty);
    let _ = std::fs::remove_file(&empty);
    let m = load_err(&empty.display().to_string(), r);
    assert!(m.contains("empty file"), "{m}");
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&tensors.to_le_bytes());
    b.extend_from_slice(&kvs.to_le_bytes());
    b
}

#[test]
fn bad_magic() {
    let mut b = small_file();
    b[..4].copy_from_slice(b"GGML");
    let m = parse_err(b);
    assert!(m.contains("not a GGUF file") && m.contains("GGML"), "{m}");
    let m = parse_err(b"PK\x03\x04 this is a zip".to_vec());
    assert!(m.contains("not a GGUF file"), "{m}");
}

#[test]
fn unsupported_versions() {
    for (v, want) in [
        (1, "GGUF version 1 is not supported"),
        (4, "unsupported GGUF version 4"),
        (0, "unsupported GGUF version 0"),
        (0x0300_0000, "big-endian"),
    ] {
        let mut b = small_file();
        b[4..8].copy_from_slice(&(v as u32).to_le_bytes());
        let m = parse_err(b);
        assert!(m.contains(want), "version {v}: {m}");
    }
}

#[test]
fn every_truncation_is_an_error() {
    let full = small_file();
    assert!(parse(full.clone()).is_ok());
    for len in 0..full.len() {
        let r = catch_unwind(|| parse(full[..len].to_vec()));
        let r = r.unwrap_or_else(|_| panic!("panicked on the first {len} bytes"));
        let m = load_err("test.gguf", r);
        assert!(
            m.contains("truncated")
                || m.contains("past the end")
                || m.contains("more than the")
                || m.contains("empty file")
                || m.contains("only"),
            "{len}: {m}"
        );
    }
    // Also with 64-byte alignment, v2.
    let mut kvs = all_kvs();
    kvs.push(("general.alignment", Value::U32(64)));
    let full = build(2, &kvs, &all_tensors());
    for len in 0..full.len() {
        load_err("test.gguf", parse(full[..len].to_vec()));
    }
}

#[test]
fn tensor_data_past_the_end() {
    let mut t = tspec("w", DType::F32, &[4]);
    t.offset = Some(1 << 20);
    let m = parse_err(build(3, &[], &[t.clone(), tspec("x", DType::F32, &[4])]));
    assert!(
        m.contains("tensor w") && m.contains("extends past the end of the file"),
        "{m}"
    );
    // Offsets near u64::MAX must not wrap around.
    t.offset = Some(u64::MAX - 31);
    let m = parse_err(build(3, &[], &[t.clone()]));
    assert!(m.contains("tensor w"), "{m}");
    // A tensor that fits but one byte short of the file end.
    let b = build(3, &[], &[tspec("a", DType::F32, &[8])]);
    let m = parse_err(b[..b.len() - 1].to_vec());
    assert!(m.contains("tensor a") && m.contains("past the end"), "{m}");
}

#[test]
fn misaligned_offset() {
    let mut t = tspec("w", DType::F32, &[4]);
    t.offset = Some(4);
    let m = parse_err(build(3, &[], &[tspec("a", DType::F32, &[1]), t]));
    assert!(
        m.contains("tensor w") && m.contains("offset 4 is not a multiple of the alignment 32"),
        "{m}"
    );
}

#[test]
fn overlapping_tensors_are_allowed_duplicate_names_are_not() {
    let mut a = tspec("a", DType::F32, &[8]);
    let mut b = tspec("b", DType::F16, &[16]);
    a.offset = Some(0);
    b.offset = Some(0);
    let f = parse(build(3, &[], &[a.clone(), b])).unwrap();
    assert_eq!(f.tensor("a").unwrap().offset, f.tensor("b").unwrap().offset);

    let m = parse_err(build(3, &[], &[a.clone(), tspec("c", DType::F32, &[1]), a]));
    assert!(m.contains("duplicate tensor name a"), "{m}");
}

#[test]
fn duplicate_metadata_key() {
    let m = parse_err(build(
        3,
        &[
            ("k.one", Value::U8(1)),
            ("k.two", Value::U8(2)),
            ("k.one", s("x")),
        ],
        &[],
    ));
    assert!(m.contains("duplicate metadata key k.one"), "{m}");
}

#[test]
fn unknown_and_unsupported_dtype_ids() {
    let mut t = tspec("blk.0.weird", DType::F32, &[32]);
    t.ggml_type = 99;
    let m = parse_err(build(3, &[], &[t.clone()]));
    assert!(
        m.contains("tensor blk.0.weird") && m.contains("unknown ggml type 99"),
        "{m}"
    );
    t.ggml_type = 9;
    let m = parse_err(build(3, &[], &[t.clone()]));
    assert!(
        m.contains("tensor blk.0.weird") && m.contains("ggml type 9 (q8_1)"),
        "{m}"
    );
    t.ggml_type = u32::MAX; // kiln's private u32 id is not a GGUF type
    let m = parse_err(build(3, &[], &[t]));
    assert!(m.contains("unknown ggml type 4294967295"), "{m}");
}

#[test]
fn row_not_a_whole_number_of_blocks() {
    let mut t = tspec("q", DType::Q4_K, &[256, 2]);
    t.ne = vec![128, 4];
    let m = parse_err(build(3, &[], &[t]));
    assert!(
        m.contains("tensor q")
            && m.contains("ne[0] = 128 is not a multiple of the q4_K block size 256"),
        "{m}"
    );
    // A quantized scalar has a row of 1.
    let mut t = tspec("q", DType::Q8_0, &[32]);
    t.ne = vec![];
    let m = parse_err(build(3, &[], &[t]));
    assert!(m.contains("ne[0] = 1"), "{m}");
}

#[test]
fn dimension_overflow_and_too_many_dims() {
    let mut t = tspec("big", DType::F32, &[1]);
    t.ne = vec![1 << 32, 1 << 32, 1 << 32];
    let m = parse_err(build(3, &[], &[t.clone()]));
    assert!(m.contains("tensor big") && m.contains("overflow"), "{m}");
    // A zero dimension does not hide an overflow of the others.
    t.ne = vec![0, 1 << 40, 1 << 40];
    let m = parse_err(build(3, &[], &[t.clone()]));
    assert!(m.contains("overflow"), "{m}");
    // Fits in u64 elements, but the byte size of f32 does not.
    t.ne = vec![1 << 62, 2];
    let m = parse_err(build(3, &[], &[t.clone()]));
    assert!(m.contains("tensor big"), "{m}");
    t.ne = vec![1; 9];
    let m = parse_err(build(3, &[], &[t]));
    assert!(
        m.contains("tensor big") && m.contains("9 dimensions"),
        "{m}"
    );
}

#[test]
fn huge_lengths_do_not_allocate() {
    // Key length 2^60.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    b.extend_from_slice(b"general.name");
    let m = parse_err(b);
    assert!(
        m.contains("metadata entry #0") && m.contains("length 1152921504606846976"),
        "{m}"
    );
    // String value of length u64::MAX.
    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.str("general.name");
    w.u32(vtype::STRING);
    w.u64(u64::MAX);
    w.buf.extend_from_slice(b"abc");
    let m = parse_err(w.buf);
    assert!(
        m.contains("metadata key general.name") && m.contains("length 18446744073709551615"),
        "{m}"
    );
    // Array of 2^60 u32s, and of 2^60 arrays.
    for et in [vtype::U32, vtype::ARRAY, vtype::STRING, vtype::U8] {
        let mut w = W::default();
        w.buf = header(3, 0, 1);
        w.str("tokenizer.ggml.tokens");
        w.u32(vtype::ARRAY);
        w.u32(et);
        w.u64(1 << 60);
        w.buf.extend_from_slice(&[0; 64]);
        let m = parse_err(w.buf);
        assert!(
            m.contains("tokenizer.ggml.tokens") && m.contains("claims 1152921504606846976"),
            "{m}"
        );
    }
    // Counts in the header.
    let m = parse_err(header(3, 1 << 60, 0));
    assert!(m.contains("1152921504606846976 tensors"), "{m}");
    let m = parse_err(header(3, 0, u64::MAX));
    assert!(m.contains("18446744073709551615 metadata entries"), "{m}");
    let m = parse_err(header(3, u64::MAX, u64::MAX));
    assert!(m.contains("more than the"), "{m}");
    // Tensor name length.
    let mut b = header(3, 1, 0);
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    b.extend_from_slice(&[b'x'; 40]);
    let m = parse_err(b);
    assert!(
        m.contains("tensor info #0") && m.contains("tensor name"),
        "{m}"
    );
}

#[test]
fn invalid_utf8_is_an_error() {
    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.u64(3);
    w.buf.extend_from_slice(&[b'a', 0xff, b'b']);
    w.u32(vtype::U8);
    w.buf.push(0);
    let m = parse_err(w.buf);
    assert!(
        m.contains("metadata key") && m.contains("not valid UTF-8"),
        "{m}"
    );

    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.str("tokenizer.ggml.tokens");
    w.u32(vtype::ARRAY);
    w.u32(vtype::STRING);
    w.u64(2);
    w.str("ok");
    w.u64(2);
    w.buf.extend_from_slice(&[0xc3, 0x28]);
    let m = parse_err(w.buf);
    assert!(
        m.contains("tokenizer.ggml.tokens") && m.contains("array element 1") && m.contains("UTF-8"),
        "{m}"
    );
}

#[test]
fn bad_value_types_and_bools() {
    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.str("k");
    w.u32(13);
    w.buf.extend_from_slice(&[0; 16]);
    let m = parse_err(w.buf);
    assert!(
        m.contains("metadata key k") && m.contains("unknown value type 13"),
        "{m}"
    );

    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.str("k");
    w.u32(vtype::ARRAY);
    w.u32(77);
    w.u64(1);
    w.buf.extend_from_slice(&[0; 16]);
    let m = parse_err(w.buf);
    assert!(m.contains("unknown element type 77"), "{m}");

    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.str("k");
    w.u32(vtype::BOOL);
    w.buf.push(2);
    let m = parse_err(w.buf);
    assert!(
        m.contains("metadata key k") && m.contains("invalid bool byte 2"),
        "{m}"
    );
}

#[test]
fn nested_arrays_have_a_depth_cap() {
    let mut v = Value::U8(1);
    for _ in 0..MAX_ARRAY_DEPTH {
        v = Value::Array(vec![v]);
    }
    let f = parse(build(3, &[("deep", v.clone())], &[])).unwrap();
    assert_eq!(f.get("deep"), Some(&v));
    let v = Value::Array(vec![v]);
    let m = parse_err(build(3, &[("deep", v)], &[]));
    assert!(
        m.contains("metadata key deep") && m.contains("nested more than 16"),
        "{m}"
    );

    // A deeply nested empty chain written by hand: 100k levels of one-element arrays.
    let mut w = W::default();
    w.buf = header(3, 0, 1);
    w.str("k");
    w.u32(vtype::ARRAY);
    for _ in 0..100_000 {
        w.u32(vtype::ARRAY);
        w.u64(1);
    }
    let m = parse_err(w.buf);
    assert!(m.contains("nested more than"), "{m}");
}

#[test]
fn bad_alignment() {
    for (v, want) in [
        (Value::U32(0), "found 0"),
        (Value::U32(48), "found 48"),
        (Value::I32(-32), "found i32 -32"),
        (s("32"), "found a string"),
    ] {
        let m = parse_err(build(3, &[("general.alignment", v)], &[]));
        assert!(
            m.contains("general.alignment must be a nonzero power of two") && m.contains(want),
            "{m}"
        );
    }
}

mod mutation;
mod source;
