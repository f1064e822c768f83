//! The GGUF loader on real models, when they are present: `KILN_TEST_MODELS` (a folder), else
//! `~/.cache/kiln/models`. Without them each test prints why it skipped and passes.

use std::path::PathBuf;

use kiln_core::load::gguf::{GgufFile, Value};
use kiln_core::tensor::DType;

fn models_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("KILN_TEST_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/kiln/models"),
    };
    dir.is_dir().then_some(dir)
}

/// The model file `name`, or `None` after printing why the test skips.
fn model(name: &str) -> Option<PathBuf> {
    let Some(dir) = models_dir() else {
        eprintln!("skipping: no test models (set KILN_TEST_MODELS to a folder, or fill ~/.cache/kiln/models)");
        return None;
    };
    let p = dir.join(name);
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("skipping: {name} is not in {}", dir.display());
        None
    }
}

struct Expect {
    file: &'static str,
    arch: &'static str,
    blocks: u64,
    embd_dtype: DType,
    embd_shape: [usize; 2],
}

/// What every well-formed model file satisfies, plus the known facts of this one.
fn check_model(e: &Expect) {
    let Some(path) = model(e.file) else { return };
    let f = GgufFile::open(&path).unwrap_or_else(|err| panic!("{err}"));
    assert!(matches!(f.version(), 2 | 3));
    assert_eq!(f.path(), path.display().to_string());
    assert_eq!(f.architecture().unwrap(), e.arch);
    assert_eq!(f.arch_key("block_count"), format!("{}.block_count", e.arch));
    assert_eq!(f.get_u64(&f.arch_key("block_count")).unwrap(), e.blocks);
    let n_embd = f.get_u64(&f.arch_key("embedding_length")).unwrap() as usize;
    assert_eq!(n_embd, e.embd_shape[1]);

    let (t, data) = f.data("token_embd.weight").unwrap();
    assert_eq!(t.dtype, e.embd_dtype, "token_embd.weight dtype");
    assert_eq!(t.shape, e.embd_shape.to_vec(), "token_embd.weight shape");
    assert_eq!(data.len(), t.nbytes);
    assert_eq!(
        t.nbytes,
        e.embd_dtype
            .bytes_for(e.embd_shape[0] * e.embd_shape[1])
            .unwrap()
    );

    // The vocabulary matches the embedding rows.
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), e.embd_shape[0]);
    assert!(f.get_str("tokenizer.ggml.model").is_ok());

    // Every block has its attention norm; every tensor is aligned, in the file, and sized
    // by its dtype; metadata is all readable.
    for i in 0..e.blocks {
        f.tensor(&format!("blk.{i}.attn_norm.weight")).unwrap();
    }
    assert!(f
        .tensor(&format!("blk.{}.attn_norm.weight", e.blocks))
        .is_err());
    for t in f.tensors() {
        assert_eq!(t.offset % f.alignment(), 0, "{}", t.name);
        assert!(t.offset >= f.data_offset() && t.offset + t.nbytes <= f.file_size());
        assert_eq!(
            t.dtype.bytes_for(t.n_elements()),
            Some(t.nbytes),
            "{}",
            t.name
        );
        assert_eq!(f.tensor_data(t).map(|d| d.len()).ok(), Some(t.nbytes));
        assert!(!t.shape.is_empty() && t.shape.len() <= 4, "{}", t.name);
    }
    for (k, v) in f.metadata() {
        assert!(!k.is_empty());
        let _ = v.to_string();
    }
    assert!(matches!(
        f.get("general.architecture"),
        Some(Value::Str(s)) if s == e.arch
    ));

    // The same parser over owned bytes gives the same header.
    let g = GgufFile::from_bytes(e.file, std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(g.tensors(), f.tensors());
    assert!(g.metadata().eq(f.metadata()));
    drop(g);
    // Truncating the file (losing the last tensor's data) is an error naming the file.
    let mut bytes = std::fs::read(&path).unwrap();
    let last_end = f
        .tensors()
        .iter()
        .map(|t| t.offset + t.nbytes)
        .max()
        .unwrap();
    bytes.truncate(last_end - 1);
    let err = GgufFile::from_bytes(e.file, bytes).unwrap_err().to_string();
    assert!(
        err.starts_with(e.file) && err.contains("past the end"),
        "{err}"
    );
    eprintln!(
        "{}: GGUF v{}, {} tensors, {} metadata keys, alignment {}",
        e.file,
        f.version(),
        f.tensors().len(),
        f.metadata().count(),
        f.alignment()
    );
}

#[test]
fn smollm2_135m_header() {
    check_model(&Expect {
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        arch: "llama",
        blocks: 30,
        embd_dtype: DType::Q8_0,
        embd_shape: [49152, 576],
    });
}

#[test]
fn gemma3_270m_header() {
    check_model(&Expect {
        file: "gemma-3-270m-q4_k_m.gguf",
        arch: "gemma3",
        blocks: 18,
        embd_dtype: DType::Q8_0,
        embd_shape: [262144, 640],
    });
}

#[test]
fn missing_file_is_a_load_error_naming_it() {
    let path = std::env::temp_dir().join("kiln-no-such-model.gguf");
    let err = GgufFile::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("kiln-no-such-model.gguf") && err.contains("cannot open"),
        "{err}"
    );
}
