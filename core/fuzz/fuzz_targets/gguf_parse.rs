//! Any bytes given to the GGUF parser give `Ok` or `Err`, never a panic, an abort or an
//! allocation beyond what the input can justify. When a file parses, every tensor's data and
//! every typed getter must also work without panicking.
#![no_main]

use kiln_core::load::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).map(|d| d.len()).ok(), Some(t.nbytes));
        assert_eq!(t.offset % f.alignment(), 0);
    }
    let keys: Vec<String> = f.metadata().map(|(k, _)| k.to_string()).collect();
    for k in &keys {
        let _ = (f.get_str(k), f.get_u64(k), f.get_f32(k), f.get_bool(k));
        let _ = (f.get_str_array(k), f.get_f32_array(k), f.get_i64_array(k));
        if let Some(v) = f.get(k) {
            let _ = v.to_string();
        }
    }
    let _ = (f.architecture(), f.tensor("token_embd.weight"));
});
