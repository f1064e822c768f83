//! Images in, against the libraries the references come from: Pillow's resizes
//! (tests/fixtures/hf/gemma3_vision/resize.*), transformers' pixel values and image features,
//! and the image-conditioned logits of a tiny Gemma 3 (`make_vision_fixtures.py`).

use std::path::PathBuf;

use kiln_core::vision::resize::{resize_rgb, Filter};
use kiln_core::vision::{over_white, Image, Processor};
use kiln_tests::fixtures;
use serde_json::Value;

fn dir() -> PathBuf {
    fixtures().join("hf").join("gemma3_vision")
}

fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(name)).expect(name)).expect("JSON")
}

fn f32s(name: &str) -> Vec<f32> {
    kiln_tests::read_f32s(&dir().join(name))
}

fn pair(v: &Value) -> (usize, usize) {
    (
        v[0].as_u64().unwrap() as usize,
        v[1].as_u64().unwrap() as usize,
    )
}

/// kiln's resampler gives Pillow's bytes exactly, for every filter, up and down, one axis or
/// both; an RGBA image is flattened over white as transformers does it.
#[test]
fn resizes_match_pillow_byte_for_byte() {
    let cases = json("resize.json");
    let blob = std::fs::read(dir().join("resize.bin")).expect("resize.bin");
    let mut at = 0;
    for c in cases["cases"].as_array().unwrap() {
        let ((w, h), (ow, oh)) = (pair(&c["in"]), pair(&c["out"]));
        let filter = c["filter"].as_str().unwrap();
        if filter == "rgba_over_white" {
            let rgba = &blob[at..at + w * h * 4];
            at += w * h * 4;
            let want = &blob[at..at + w * h * 3];
            at += w * h * 3;
            assert_eq!(over_white(rgba), want, "alpha over white");
            continue;
        }
        let input = &blob[at..at + w * h * 3];
        at += w * h * 3;
        let want = &blob[at..at + ow * oh * 3];
        at += ow * oh * 3;
        let f = match filter {
            "bilinear" => Filter::Bilinear,
            "bicubic" => Filter::Bicubic,
            "lanczos" => Filter::Lanczos,
            "box" => Filter::Box,
            "hamming" => Filter::Hamming,
            other => panic!("filter {other}"),
        };
        let got = resize_rgb(input, (w, h), (ow, oh), f).unwrap();
        let off = got.iter().zip(want).filter(|(a, b)| a != b).count();
        assert_eq!(off, 0, "{filter} {w}x{h} -> {ow}x{oh}: {off} bytes differ");
    }
    assert_eq!(at, blob.len());
}

/// The pixel values kiln makes of the fixture's PNGs (one at the model's size, one resized)
/// equal the processor's.
#[test]
fn pixel_values_match_the_image_processor() {
    let cfg = json("preprocessor_config.json");
    let p = Processor::from_hf(&cfg).unwrap();
    let r = json("reference.json");
    for (case, c) in r["cases"].as_object().unwrap() {
        let want = f32s(&format!("pixels_{case}.f32"));
        let per = want.len() / c["images"].as_array().unwrap().len();
        for (i, name) in c["images"].as_array().unwrap().iter().enumerate() {
            let bytes = std::fs::read(dir().join(name.as_str().unwrap())).unwrap();
            let img = Image::decode(&bytes).unwrap();
            let (h, w, px) = p.pixels(&img.rgb).unwrap();
            assert_eq!((h, w), (32, 32));
            let want = &want[i * per..(i + 1) * per];
            let worst = px
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst == 0.0,
                "{case} image {i}: pixel values differ by {worst}"
            );
        }
    }
}

fn cpu() -> kiln_core::exec::Executor {
    kiln_core::exec::Executor::new(std::sync::Arc::new(kiln_core::cpu::CpuBackend::new()))
}

fn shape(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The vision tower's soft tokens for each fixture image equal transformers'
/// `get_image_features`, from the processor's pixel values and from the PNG files.
#[test]
fn image_features_match_transformers() {
    let ex = cpu();
    let tower = kiln_core::model::VisionTower::open(&dir(), None, &ex)
        .unwrap()
        .expect("the checkpoint has a vision tower");
    let one = Image::decode(&std::fs::read(dir().join("square.png")).unwrap()).unwrap();
    assert_eq!(tower.tokens_for(&one.rgb).unwrap(), 4);
    let r = json("reference.json");
    for (case, c) in r["cases"].as_object().unwrap() {
        let want = f32s(&format!("features_{case}.f32"));
        let pixels = f32s(&format!("pixels_{case}.f32"));
        let images = c["images"].as_array().unwrap();
        let (per_px, per_ft) = (pixels.len() / images.len(), want.len() / images.len());
        for (i, name) in images.iter().enumerate() {
            let got = tower
                .encode_pixels(&ex, &pixels[i * per_px..(i + 1) * per_px], 32, 32)
                .unwrap();
            let got = ex.download_f32(&got).unwrap();
            let e = worst(&got, &want[i * per_ft..(i + 1) * per_ft]);
            println!("{case} image {i}: features max |Δ| {e:.2e}");
            assert!(e <= 1e-4, "{case} image {i}: features differ by {e}");
            let bytes = std::fs::read(dir().join(name.as_str().unwrap())).unwrap();
            let img = Image::decode(&bytes).unwrap();
            let again = ex
                .download_f32(&tower.encode(&ex, &img.rgb).unwrap())
                .unwrap();
            assert_eq!(again, got, "{case} image {i}: from the PNG");
        }
    }
}

/// Logits at every position of a prompt with images in it equal transformers' (image tokens
/// see each other both ways), fed whole and in chunks cut at the images' edges: from the
/// Hugging Face directory, and from llama.cpp's conversion (text GGUF + mmproj GGUF).
#[test]
fn image_prompts_match_transformers_logits() {
    let cpu: std::sync::Arc<dyn kiln_core::backend::Backend> =
        std::sync::Arc::new(kiln_core::cpu::CpuBackend::new());
    image_sources(&cpu, false, "cpu");
}

/// The same on WebGPU, strict: the tower, the text model and the images' key reach all run
/// in WGSL kernels.
#[test]
fn image_prompts_match_transformers_logits_on_wgpu() {
    let Some(gpu) = kiln_tests::optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    image_sources(&gpu, true, "wgpu");
}

/// The same on the CUDA kernels, emulated, strict: the tower, the text model and the images'
/// key reach all run in them.
#[test]
fn image_prompts_match_transformers_logits_on_emulated_cuda() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    image_sources(&emu, true, "cuda-emu");
}

fn image_sources(
    backend: &std::sync::Arc<dyn kiln_core::backend::Backend>,
    strict: bool,
    label: &str,
) {
    let gguf = fixtures().join("hf").join("gguf");
    for (model, mmproj, suffix) in [
        (dir(), None, ""),
        // The mmproj holds the projection in f16: its reference has it rounded so.
        (
            gguf.join("gemma3_vision.gguf"),
            Some(gguf.join("mmproj-gemma3_vision.gguf")),
            "_mmproj",
        ),
    ] {
        let ex = || kiln_core::exec::Executor::new(backend.clone()).strict(strict);
        image_logits(&model, mmproj.as_deref(), suffix, ex, label);
    }
}

fn image_logits(
    model_path: &std::path::Path,
    mmproj: Option<&std::path::Path>,
    suffix: &str,
    new_ex: impl Fn() -> kiln_core::exec::Executor,
    backend: &str,
) {
    use kiln_core::engine::{Runner, RunnerConfig};
    let label = format!(
        "{backend} {}",
        model_path.file_name().unwrap().to_string_lossy()
    );
    let r = json("reference.json");
    let image_token = r["image_token"].as_u64().unwrap() as u32;
    for (case, c) in r["cases"].as_object().unwrap() {
        let tokens: Vec<u32> = c["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let want = f32s(&format!("logits_{case}{suffix}.f32"));
        let vocab = shape(&c["logits_shape"])[1];
        let pixels = f32s(&format!("pixels_{case}.f32"));
        let runs = kiln_tests::image_runs(&tokens, image_token);
        let per_px = pixels.len() / runs.len();
        // Whole, then cut just before each image and just after it.
        let mut cuts = vec![vec![tokens.len()]];
        let mut edges: Vec<usize> = runs.iter().flat_map(|&(s, n)| [s, s + n]).collect();
        edges.push(tokens.len());
        cuts.push(edges);
        for cut in cuts {
            let ex = new_ex();
            let tower = kiln_core::model::VisionTower::open(model_path, mmproj, &ex)
                .unwrap()
                .unwrap();
            let file = kiln_core::load::open_model(model_path).unwrap();
            let model = kiln_core::model::build_from_gguf(&file, &ex).unwrap();
            let cfg = RunnerConfig {
                max_batch_tokens: 64,
                block_size: 4,
                ..RunnerConfig::default()
            };
            let mut runner = Runner::new(new_ex(), model, cfg).unwrap();
            let feats: Vec<_> = (0..runs.len())
                .map(|i| {
                    tower
                        .encode_pixels(&ex, &pixels[i * per_px..(i + 1) * per_px], 32, 32)
                        .unwrap()
                })
                .collect();
            let got = kiln_tests::image_prompt_logits(&mut runner, &tokens, &runs, &feats, &cut);
            assert_eq!(got.len(), tokens.len());
            let e = kiln_tests::worst_logits(&got, &want, vocab);
            println!("{label} {case} cut at {cut:?}: logits max |Δ| {e:.2e}");
            assert!(
                e <= 1e-3,
                "{label} {case} cut at {cut:?}: logits differ by {e}"
            );
        }
    }
}

#[path = "common/server.rs"]
mod common;

fn data_url(name: &str) -> String {
    use base64::Engine as _;
    let bytes = std::fs::read(dir().join(name)).unwrap();
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Chat completions with an `image_url` part: the answer, then the same request again (its
/// image's blocks come from the prefix cache and the log-probabilities are the same), then
/// another image after the same text (nothing of it is cached; the answer's
/// log-probabilities differ). A model without a vision tower refuses images.
#[test]
fn chat_images_are_answered_and_cached_by_content() {
    use serde_json::json;
    let srv = common::start_model(&dir(), 2, None).expect("server");
    let ask = |img: &str| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(img)}},
            {"type": "text", "text": "Water boils at"}]}],
            "max_tokens": 4, "temperature": 0, "logprobs": true, "top_logprobs": 3})
    };
    let run = |img: &str| -> Value {
        let (st, body) = common::post(srv.addr, "/v1/chat/completions", &ask(img));
        assert_eq!(st, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let first = run("square.png");
    let again = run("square.png");
    let other = run("wide.png");
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let lps = |v: &Value| v["choices"][0]["logprobs"]["content"].clone();
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    println!(
        "prompt {prompt} tokens; cached: {:?} {:?} {:?}",
        cached(&first),
        cached(&again),
        cached(&other)
    );
    assert_eq!(cached(&first), Some(0), "{first}");
    // The first block of 16 holds the image's soft tokens.
    assert!(cached(&again).unwrap() >= 16, "{again}");
    assert_eq!(lps(&again), lps(&first));
    assert_eq!(cached(&other), Some(0), "{other}");
    assert_ne!(lps(&other), lps(&first));

    // No vision tower: a 400 that says so.
    let text_only = common::start_model(&fixtures().join("hf").join("gemma3"), 1, None).unwrap();
    let (st, body) = common::post(text_only.addr, "/v1/chat/completions", &ask("square.png"));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("vision tower"), "{body}");
    // A broken image: a 400 naming it.
    let bad = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}}]}]});
    let (st, body) = common::post(srv.addr, "/v1/chat/completions", &bad);
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("image"), "{body}");
}

/// A one-file HTTP server on a loopback port: `/square.png` is the fixture's image, `/moved`
/// a redirect to it, anything else 404. Serves `n` requests, then stops.
fn image_host(n: usize) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let png = std::fs::read(dir().join("square.png")).unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().take(n) {
            let Ok(mut s) = s else { continue };
            let mut req = [0u8; 2048];
            let got = s.read(&mut req).unwrap_or(0);
            let line = String::from_utf8_lossy(&req[..got]).to_string();
            let head = |status: &str, extra: &str, len: usize| {
                format!("HTTP/1.1 {status}\r\n{extra}Content-Length: {len}\r\nConnection: close\r\n\r\n")
            };
            let _ = if line.starts_with("GET /square.png ") {
                s.write_all(head("200 OK", "Content-Type: image/png\r\n", png.len()).as_bytes())
                    .and_then(|_| s.write_all(&png))
            } else if line.starts_with("GET /moved ") {
                s.write_all(
                    head(
                        "302 Found",
                        &format!("Location: http://127.0.0.1:{port}/square.png\r\n"),
                        0,
                    )
                    .as_bytes(),
                )
            } else {
                s.write_all(head("404 Not Found", "", 0).as_bytes())
            };
        }
    });
    port
}

/// `--image-url-allow`: an image URL on a listed host is fetched and answered as the same
/// image sent inline is; a redirect is not followed, an unlisted host (even the same
/// machine by another name) and a missing file are 400s that say why.
#[test]
fn allowed_image_urls_are_fetched_and_others_refused() {
    use kiln_server::serve::{state_with, ServeOptions};
    use serde_json::json;
    let port = image_host(3);
    let m = common::load_model(
        &dir(),
        512,
        kiln_core::engine::RunnerConfig {
            prefix_caching: true,
            ..Default::default()
        },
    );
    let opts = ServeOptions {
        image_urls: kiln_server::images::ImageUrls::new(&["127.0.0.1".into()]).unwrap(),
        ..ServeOptions::new(1)
    };
    let srv = common::serve(state_with(m, opts).unwrap());
    let ask = |url: &str| {
        let req = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "Water boils at"}]}],
            "max_tokens": 3, "temperature": 0, "logprobs": true});
        common::post(srv.addr, "/v1/chat/completions", &req)
    };
    let lps = |body: &str| -> Value {
        serde_json::from_str::<Value>(body).unwrap()["choices"][0]["logprobs"].clone()
    };
    let (st, fetched) = ask(&format!("http://127.0.0.1:{port}/square.png"));
    assert_eq!(st, 200, "{fetched}");
    let (st, inline) = ask(&data_url("square.png"));
    assert_eq!(st, 200, "{inline}");
    assert_eq!(lps(&fetched), lps(&inline));
    let (st, body) = ask(&format!("http://127.0.0.1:{port}/moved"));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("redirects are not followed"), "{body}");
    let (st, body) = ask(&format!("http://127.0.0.1:{port}/none.png"));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("404"), "{body}");
    let (st, body) = ask(&format!("http://localhost:{port}/square.png"));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("not fetched"), "{body}");
    // Entries are host names: a scheme or a path is refused.
    assert!(kiln_server::images::ImageUrls::new(&["https://example.com".into()]).is_err());
    let list = kiln_server::images::ImageUrls::new(&["*.example.com,10.0.0.5".into()]).unwrap();
    assert!(
        list.allows("cdn.example.com") && list.allows("example.com") && list.allows("10.0.0.5")
    );
    assert!(!list.allows("badexample.com") && !list.allows("10.0.0.50"));
}
