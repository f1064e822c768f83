//! Gemma 4's images against transformers (tests/fixtures/hf/gemma4_vision, written by
//! `make_vision_fixtures.py`): the processor's aspect-preserving resize and its patches, the
//! tower's soft tokens (2-D axial RoPE, pooling, standardization, projection), and the logits
//! of prompts holding images of two sizes (the sliding layers' bidirectional image blocks,
//! the per-layer inputs of image rows), on every backend.

use std::path::PathBuf;
use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::exec::Executor;
use kiln_core::model::VisionTower;
use kiln_core::vision::{Image, Processor};
use kiln_tests::fixtures;
use serde_json::Value;

fn dir() -> PathBuf {
    fixtures().join("hf").join("gemma4_vision")
}

fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(name)).expect(name)).expect("JSON")
}

fn f32s(name: &str) -> Vec<f32> {
    kiln_tests::read_f32s(&dir().join(name))
}

fn image(name: &str) -> Image {
    Image::decode(&std::fs::read(dir().join(name)).expect(name)).expect("decodes")
}

fn names(c: &Value) -> Vec<String> {
    c["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// kiln's pixel values of each image (`[3, h, w]`) in the processor's patch order (row-major
/// patches, each row, column, channel), with the image's size.
fn patches(p: &Processor, img: &Image, patch: usize) -> (usize, usize, Vec<f32>, Vec<f32>) {
    let (h, w, px) = p.pixels(&img.rgb).unwrap();
    let mut out = Vec::with_capacity(px.len());
    for py in 0..h / patch {
        for qx in 0..w / patch {
            for y in 0..patch {
                for x in 0..patch {
                    for c in 0..3 {
                        out.push(px[c * h * w + (py * patch + y) * w + qx * patch + x]);
                    }
                }
            }
        }
    }
    (h, w, px, out)
}

/// The processor resizes each image to the largest size of its aspect ratio within 70 soft
/// tokens (both fixture images are resized, to 64x64 and 80x48) with Pillow's bicubic filter,
/// and its patches equal transformers' exactly; the soft tokens it counts are the processor's.
#[test]
fn gemma4_pixel_values_match_the_image_processor() {
    let p = Processor::from_hf(&json("preprocessor_config.json")).unwrap();
    let r = json("reference.json");
    let tower = VisionTower::open(&dir(), None, &Executor::new(cpu()))
        .unwrap()
        .unwrap();
    for (case, c) in r["cases"].as_object().unwrap() {
        let want = f32s(&format!("pixels_{case}.f32"));
        let mut at = 0;
        for (i, name) in names(c).iter().enumerate() {
            let img = image(name);
            let (h, w, _, got) = patches(&p, &img, 4);
            assert!(
                (h, w) != (img.rgb.height, img.rgb.width),
                "{name} is resized"
            );
            let e = worst(&got, &want[at..at + got.len()]);
            assert!(e == 0.0, "{case} image {i}: pixel values differ by {e}");
            at += got.len();
            let soft = c["soft_tokens"][i].as_u64().unwrap() as usize;
            assert_eq!(
                tower.tokens_for(&img.rgb).unwrap(),
                soft,
                "{case} image {i}"
            );
        }
        assert_eq!(at, want.len());
    }
}

fn cpu() -> Arc<dyn Backend> {
    Arc::new(kiln_core::cpu::CpuBackend::new())
}

/// The tower's soft tokens equal transformers' `get_image_features` for both images.
#[test]
fn gemma4_image_features_match_transformers() {
    let ex = Executor::new(cpu());
    let tower = VisionTower::open(&dir(), None, &ex).unwrap().unwrap();
    let r = json("reference.json");
    for (case, c) in r["cases"].as_object().unwrap() {
        let want = f32s(&format!("features_{case}.f32"));
        let width = want.len() / r["cases"][case]["features_shape"][0].as_u64().unwrap() as usize;
        let mut at = 0;
        for (i, name) in names(c).iter().enumerate() {
            let got = ex
                .download_f32(&tower.encode(&ex, &image(name).rgb).unwrap())
                .unwrap();
            let n = c["soft_tokens"][i].as_u64().unwrap() as usize;
            assert_eq!(got.len(), n * width, "{case} image {i}");
            let e = worst(&got, &want[at..at + got.len()]);
            println!("{case} image {i}: features max |Δ| {e:.2e}");
            assert!(e <= 1e-4, "{case} image {i}: features differ by {e}");
            at += got.len();
        }
    }
}

/// Logits at every position of prompts holding one image and two of different sizes equal
/// transformers' (image tokens see each other both ways on the sliding layers only), fed
/// whole and cut at the images' edges.
#[test]
fn gemma4_image_prompts_match_transformers_logits() {
    image_logits(&cpu(), false, "cpu");
}

/// The same on WebGPU, strict: the tower and the text model in WGSL kernels.
#[test]
fn gemma4_image_prompts_match_transformers_logits_on_wgpu() {
    let Some(gpu) = kiln_tests::optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    image_logits(&gpu, true, "wgpu");
}

/// The same on the emulated CUDA kernels, strict (the images' key reach in them too), whole
/// prompts (from llama.cpp's conversion, the one-image prompt).
#[test]
fn gemma4_image_prompts_match_transformers_logits_on_emulated_cuda() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    image_logits(&emu, true, "cuda-emu");
}

/// The tower of the Hugging Face directory (`None`), or of llama.cpp's conversion of it: the
/// text GGUF and its mmproj (whose processor takes Gemma 4's default budget of 280 soft
/// tokens: set to the fixture's 70, as `--image-max-tokens 70` does).
fn tower(mmproj: bool, ex: &Executor) -> VisionTower {
    match mmproj {
        false => VisionTower::open(&dir(), None, ex).unwrap().unwrap(),
        true => {
            let gguf = fixtures().join("hf").join("gguf");
            let mut t = VisionTower::open(
                &gguf.join("gemma4_vision.gguf"),
                Some(&gguf.join("mmproj-gemma4_vision.gguf")),
                ex,
            )
            .unwrap()
            .unwrap();
            t.set_max_soft_tokens(70).unwrap();
            t
        }
    }
}

fn image_logits(backend: &Arc<dyn Backend>, strict: bool, label: &str) {
    for mmproj in [false, true] {
        image_logits_from(backend, strict, label, mmproj);
    }
}

fn image_logits_from(backend: &Arc<dyn Backend>, strict: bool, label: &str, mmproj: bool) {
    let model_path = match mmproj {
        false => dir(),
        true => fixtures()
            .join("hf")
            .join("gguf")
            .join("gemma4_vision.gguf"),
    };
    let label = format!(
        "{label} {}",
        model_path.file_name().unwrap().to_string_lossy()
    );
    let emu = label.starts_with("cuda-emu");
    let r = json("reference.json");
    let cases: Vec<kiln_tests::ImageCase> = (r["cases"].as_object().unwrap().iter())
        // The emulator (slow) takes the GGUF pair's one-image case only: it runs the same
        // kernels as the directory's.
        .filter(|(case, _)| !(mmproj && emu && *case != "one"))
        .map(|(case, c)| kiln_tests::ImageCase {
            name: case.clone(),
            tokens: (c["tokens"].as_array().unwrap().iter())
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
            images: names(c).iter().map(|n| image(n)).collect(),
            grids: Vec::new(),
            logits: f32s(&format!("logits_{case}.f32")),
        })
        .collect();
    kiln_tests::check_image_logits(
        &|| Executor::new(backend.clone()).strict(strict),
        &|ex| (tower(mmproj, ex), model_path.clone()),
        &cases,
        r["image_token"].as_u64().unwrap() as u32,
        emu,
        &label,
    );
}

#[path = "common/server.rs"]
mod common;

/// Chat completions with Gemma 4: two images of different sizes in one message are answered;
/// the same request again takes the images' blocks from the prefix cache and gives the same
/// log-probabilities; the images in the other order are another prompt.
#[test]
fn gemma4_chat_images_are_answered_and_cached() {
    let srv = common::start_model(&dir(), 2, None).expect("server");
    // 60 + 64 soft tokens, their wraps and the text.
    common::check_image_caching(srv.addr, &dir(), 124, 112);
}
