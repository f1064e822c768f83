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
    std::fs::read(dir().join(name))
        .expect(name)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
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
