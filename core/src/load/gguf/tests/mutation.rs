//! Mutation tests of the GGUF parser: small files and real model headers, mutated thousands
//! of times; the parser must return Ok or Err and never panic.

use super::*;

// ---------------------------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------------------------

/// xorshift64*: a seeded, dependency-free generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    3,
    8,
    31,
    32,
    255,
    0xffff_ffff,
    1 << 32,
    1 << 60,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// One to three random edits: bit flips, random bytes, interesting values in the structural
/// fields (lengths, counts, types, dims, offsets), deletions, and truncation.
fn mutate(rng: &mut Rng, base: &[u8], fields: &[(usize, usize)]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        if b.is_empty() {
            break;
        }
        match rng.below(8) {
            0 => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2..=4 if !fields.is_empty() => {
                let (at, width) = fields[rng.below(fields.len())];
                let v = if rng.below(4) == 0 {
                    rng.next()
                } else {
                    let v = INTERESTING[rng.below(INTERESTING.len())];
                    // Sometimes nudge it: off by one either way.
                    match rng.below(4) {
                        0 => v.wrapping_add(1),
                        1 => v.wrapping_sub(1),
                        _ => v,
                    }
                };
                let bytes = v.to_le_bytes();
                for k in 0..width {
                    if let Some(x) = b.get_mut(at + k) {
                        *x = bytes[k];
                    }
                }
            }
            5 => {
                let i = rng.below(b.len());
                let n = 1 + rng.below(16);
                b.drain(i..(i + n).min(b.len()));
            }
            6 => {
                let i = rng.below(b.len());
                let n = 1 + rng.below(8);
                for _ in 0..n {
                    b.insert(i, rng.next() as u8);
                }
            }
            _ => {
                let n = rng.below(b.len());
                b.truncate(n);
            }
        }
    }
    b
}

/// Checks what an accepted header promises.
fn check_invariants(h: &Header, file_len: usize) {
    assert!(h.alignment.is_power_of_two());
    assert_eq!(h.data_offset % h.alignment, 0);
    assert_eq!(h.metadata.len(), h.metadata_index.len());
    assert_eq!(h.tensors.len(), h.tensor_index.len());
    for t in &h.tensors {
        assert!(t.offset >= h.data_offset);
        assert_eq!(t.offset % h.alignment, 0);
        assert!(t.offset + t.nbytes <= file_len);
        let _ = t.n_elements();
        assert_eq!(t.dtype.bytes_for(t.n_elements()), Some(t.nbytes));
    }
    for (_, v) in &h.metadata {
        let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.to_string());
    }
}

/// Parses `bytes` (claimed to be a prefix of a `file_len`-byte file), catching any panic and
/// saving the input that caused it.
fn parse_no_panic(what: &str, iter: usize, bytes: &[u8], file_len: usize) -> bool {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let r = Header::parse(bytes, file_len);
        if let Ok(h) = &r {
            check_invariants(h, file_len);
        }
        if file_len == bytes.len() {
            // The public entry point too, with the getters on every key.
            if let Ok(f) = GgufFile::from_bytes("mutant.gguf", bytes.to_vec()) {
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).map(|d| d.len()).ok(), Some(t.nbytes));
                }
                let keys: Vec<String> = f.metadata().map(|(k, _)| k.to_string()).collect();
                for k in &keys {
                    let _ = (f.get_str(k), f.get_u64(k), f.get_f32(k), f.get_bool(k));
                    let _ = (f.get_str_array(k), f.get_f32_array(k), f.get_i64_array(k));
                }
                let _ = f.arch_key("block_count");
            }
        }
        r.is_ok()
    }));
    match r {
        Ok(ok) => ok,
        Err(_) => {
            let path = std::env::temp_dir().join(format!("kiln-gguf-crash-{what}-{iter}.gguf"));
            let _ = std::fs::write(&path, bytes);
            panic!(
                "{what}: mutation {iter} panicked (file_len {file_len}); input saved to {}",
                path.display()
            );
        }
    }
}

#[test]
fn mutated_small_files_never_panic() {
    let mut kvs = all_kvs();
    kvs.push(("general.alignment", Value::U32(64)));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, w) in [
        ("small-v3", build_full(3, &all_kvs(), &all_tensors(), true)),
        ("small-v2-a64", build_full(2, &kvs, &all_tensors(), true)),
    ] {
        let mut ok = 0;
        let n = 10_000;
        for i in 0..n {
            let m = mutate(&mut rng, &w.buf, &w.fields);
            ok += parse_no_panic(name, i, &m, m.len()) as usize;
        }
        eprintln!("{name}: {ok}/{n} mutants parsed Ok, the rest were errors");
        assert!(ok > 0 && ok < n);
    }
}

// ---------------------------------------------------------------------------------------------
// Real model headers (when present)
// ---------------------------------------------------------------------------------------------

/// `KILN_TEST_MODELS`, else `~/.cache/kiln/models`, when it is a folder.
fn models_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("KILN_TEST_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/kiln/models"),
    };
    dir.is_dir().then_some(dir)
}

const REAL_MODELS: [&str; 2] = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
];

fn real_models() -> Vec<PathBuf> {
    let Some(dir) = models_dir() else {
        eprintln!(
            "skipping the real-model headers: no KILN_TEST_MODELS folder and no ~/.cache/kiln/models"
        );
        return vec![];
    };
    REAL_MODELS
        .iter()
        .filter_map(|m| {
            let p = dir.join(m);
            if p.is_file() {
                Some(p)
            } else {
                eprintln!("skipping {m}: not in {}", dir.display());
                None
            }
        })
        .collect()
}

/// A real file's header, rewritten small: the same metadata with big arrays cut to 16
/// elements, the same tensor infos, and the data section left out (its size is claimed).
fn compact_header(f: &GgufFile) -> (W, usize) {
    let kvs: Vec<(&str, Value)> = f
        .metadata()
        .map(|(k, v)| {
            let v = match v {
                Value::Array(a) if a.len() > 16 => Value::Array(a[..16].to_vec()),
                v => v.clone(),
            };
            (k, v)
        })
        .collect();
    let mut end = 0;
    let tensors: Vec<TSpec> = f
        .tensors()
        .iter()
        .map(|t| {
            let rel = t.offset - f.data_offset();
            end = end.max(rel + t.nbytes);
            TSpec {
                name: t.name.clone(),
                ggml_type: t.dtype.ggml_type(),
                ne: t.shape.iter().rev().map(|&d| d as u64).collect(),
                data: vec![],
                offset: Some(rel as u64),
            }
        })
        .collect();
    let w = build_full(f.version(), &kvs, &tensors, false);
    let claimed = w.buf.len() + end;
    (w, claimed)
}

#[test]
fn mutated_real_headers_never_panic() {
    let models = real_models();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for path in &models {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let f = GgufFile::open(path).unwrap();

        // 1. The compact header: the claimed size makes unmutated tensor ranges valid, so
        // mutants get all the way through the tensor checks.
        let (w, claimed) = compact_header(&f);
        let h = Header::parse(&w.buf, claimed).unwrap();
        assert_eq!(h.tensors.len(), f.tensors().len());
        for (a, b) in h.tensors.iter().zip(f.tensors()) {
            assert_eq!(
                (&a.name, a.dtype, &a.shape, a.nbytes),
                (&b.name, b.dtype, &b.shape, b.nbytes)
            );
            assert_eq!(a.offset - h.data_offset, b.offset - f.data_offset());
        }
        let n = 10_000;
        let mut ok = 0;
        for i in 0..n {
            let m = mutate(&mut rng, &w.buf, &w.fields);
            // Claim the file as long as it was, minus what a deletion took, plus what an
            // insertion added: unmutated ranges stay valid.
            let len = (claimed + m.len()).saturating_sub(w.buf.len());
            ok += parse_no_panic(&name, i, &m, len.max(m.len())) as usize;
        }
        eprintln!(
            "{name} (compact header, {} bytes): {ok}/{n} mutants Ok",
            w.buf.len()
        );

        // 2. The file's real first 64 KiB, mutated and parsed as a (truncated) file.
        let raw = &GgufFile::open(path).unwrap().bytes[..f.file_size().min(64 << 10)];
        let raw = raw.to_vec();
        for i in 0..2000 {
            let m = mutate(&mut rng, &raw, &[]);
            parse_no_panic(&format!("{name}-raw"), i, &m, m.len());
        }
    }
}
