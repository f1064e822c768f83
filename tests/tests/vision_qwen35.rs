//! Qwen3.5's images against transformers (tests/fixtures/hf/qwen3_5_vision, written by
//! `make_vision_fixtures.py`): the processor's dynamic resize and its merge-ordered patches,
//! the tower's soft tokens (interpolated position table, 2-D RoPE, the merger), the text
//! model's M-RoPE positions, and the logits of prompts holding images of two sizes on every
//! backend.

use std::path::PathBuf;
use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::exec::Executor;
use kiln_core::model::{ImageGrid, VisionTower};
use kiln_core::vision::{Image, Processor};
use kiln_tests::fixtures;
use serde_json::Value;

fn dir() -> PathBuf {
    fixtures().join("hf").join("qwen3_5_vision")
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

fn usizes(v: &Value) -> Vec<usize> {
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

fn cpu() -> Arc<dyn Backend> {
    Arc::new(kiln_core::cpu::CpuBackend::new())
}

/// transformers' `smart_resize` over sizes that round halves, hit the pixel floor and
/// ceiling, and are long and thin: kiln's sizes are the same.
#[test]
fn qwen35_resized_sizes_match_smart_resize() {
    let p = Processor::from_hf(&json("preprocessor_config.json")).unwrap();
    let area = p.area.expect("a pixel range");
    assert_eq!(area.unit, 8);
    for case in json("reference.json")["smart_resize"].as_array().unwrap() {
        let v = usizes(case);
        assert_eq!(
            area.size(v[0], v[1]).unwrap(),
            (v[2], v[3]),
            "{}x{}",
            v[1],
            v[0]
        );
    }
    assert!(area.size(1, 201).is_err(), "aspect ratio over 200");
}

/// The processor's pixel values equal transformers' exactly: each image resized (the wide one)
/// with Pillow's bicubic filter and normalized, its patches in merge-block order (each patch
/// twice in time); the soft tokens and grids the tower counts are the processor's.
#[test]
fn qwen35_pixel_values_match_the_image_processor() {
    let p = Processor::from_hf(&json("preprocessor_config.json")).unwrap();
    let tower = VisionTower::open(&dir(), None, &Executor::new(cpu()))
        .unwrap()
        .unwrap();
    let r = json("reference.json");
    for (case, c) in r["cases"].as_object().unwrap() {
        let want = f32s(&format!("pixels_{case}.f32"));
        let mut at = 0;
        for (i, name) in names(c).iter().enumerate() {
            let img = image(name);
            let (h, w, px) = p.pixels(&img.rgb).unwrap();
            let g = usizes(&c["grids"][i]);
            assert_eq!((h / 4, w / 4), (g[1], g[2]), "{case} image {i}");
            let (gh, gw) = (h / 4, w / 4);
            let mut got = Vec::new();
            for br in 0..gh / 2 {
                for bc in 0..gw / 2 {
                    for ir in 0..2 {
                        for ic in 0..2 {
                            let (r, col) = (br * 2 + ir, bc * 2 + ic);
                            for ch in 0..3 {
                                for _t in 0..2 {
                                    for y in 0..4 {
                                        for x in 0..4 {
                                            got.push(
                                                px[ch * h * w + (r * 4 + y) * w + col * 4 + x],
                                            );
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let e = worst(&got, &want[at..at + got.len()]);
            assert!(e == 0.0, "{case} image {i}: pixel values differ by {e}");
            at += got.len();
            let soft = c["soft_tokens"][i].as_u64().unwrap() as usize;
            assert_eq!(
                tower.tokens_for(&img.rgb).unwrap(),
                soft,
                "{case} image {i}"
            );
            assert_eq!(
                tower.grid(&img.rgb).unwrap(),
                Some((g[1] / 2, g[2] / 2)),
                "{case} image {i}"
            );
        }
        assert_eq!(at, want.len());
    }
}

/// The tower's soft tokens equal transformers' `get_image_features` for both images.
#[test]
fn qwen35_image_features_match_transformers() {
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

/// The image runs of a case and their grids (rows, columns of soft tokens).
fn runs_and_grids(
    c: &Value,
    image_token: u32,
) -> (Vec<u32>, Vec<(usize, usize)>, Vec<(usize, usize)>) {
    let tokens: Vec<u32> = usizes(&c["tokens"]).iter().map(|&t| t as u32).collect();
    let runs = kiln_tests::image_runs(&tokens, image_token);
    let grids = c["grids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let g = usizes(g);
            (g[1] / 2, g[2] / 2)
        })
        .collect();
    (tokens, runs, grids)
}

/// Every token's (time, height, width) position is transformers' `get_rope_index`: text after
/// an image continues from its start plus its longer side.
#[test]
fn qwen35_mrope_positions_match_get_rope_index() {
    let r = json("reference.json");
    let img = r["image_token"].as_u64().unwrap() as u32;
    for (case, c) in r["cases"].as_object().unwrap() {
        let (tokens, runs, grids) = runs_and_grids(c, img);
        let images: Vec<ImageGrid> = runs
            .iter()
            .zip(&grids)
            .map(|(&(s, _), &(rows, cols))| ImageGrid {
                start: s,
                rows,
                cols,
            })
            .collect();
        let want = c["rope_positions"].as_array().unwrap();
        for i in 0..tokens.len() {
            let got = kiln_core::model::qwen35::mrope_position(i, &images);
            for axis in 0..3 {
                assert_eq!(
                    got[axis],
                    want[axis][i].as_i64().unwrap(),
                    "{case} token {i} axis {axis}"
                );
            }
        }
    }
}

/// Logits at every position of prompts holding one image and two of different sizes equal
/// transformers' (M-RoPE on the full-attention layers, the linear-attention layers over the
/// image rows), fed whole and cut at the images' edges.
#[test]
fn qwen35_image_prompts_match_transformers_logits() {
    image_logits(&cpu(), false, "cpu");
}

/// The same on WebGPU, strict: the tower (its erf GELU, the masked RoPE turns) and the text
/// model in WGSL kernels.
#[test]
fn qwen35_image_prompts_match_transformers_logits_on_wgpu() {
    let Some(gpu) = kiln_tests::optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    image_logits(&gpu, true, "wgpu");
}

/// The same on the emulated CUDA kernels, strict, whole prompts (both sources).
#[test]
fn qwen35_image_prompts_match_transformers_logits_on_emulated_cuda() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    image_logits(&emu, true, "cuda-emu");
}

/// The tower of the Hugging Face directory (`false`), or of llama.cpp's conversion of it (the
/// text GGUF and its mmproj), with the model's path.
fn source(mmproj: bool, ex: &Executor) -> (VisionTower, PathBuf) {
    let gguf = fixtures().join("hf").join("gguf");
    match mmproj {
        false => (VisionTower::open(&dir(), None, ex).unwrap().unwrap(), dir()),
        true => {
            let model = gguf.join("qwen3_5_vision.gguf");
            let t = VisionTower::open(&model, Some(&gguf.join("mmproj-qwen3_5_vision.gguf")), ex)
                .unwrap()
                .unwrap();
            (t, model)
        }
    }
}

/// llama.cpp's mmproj of the fixture makes the same soft tokens (its processor's pixel range
/// is llama.cpp's, which holds both images at the sizes the fixture's processor makes).
#[test]
fn qwen35_mmproj_features_match_transformers() {
    let ex = Executor::new(cpu());
    let (tower, _) = source(true, &ex);
    let r = json("reference.json");
    for (case, c) in r["cases"].as_object().unwrap() {
        let want = f32s(&format!("features_{case}.f32"));
        let got: Vec<f32> = names(c)
            .iter()
            .flat_map(|n| {
                ex.download_f32(&tower.encode(&ex, &image(n).rgb).unwrap())
                    .unwrap()
            })
            .collect();
        let e = worst(&got, &want);
        println!("{case}: mmproj features max |Δ| {e:.2e}");
        assert!(e <= 1e-4, "{case}: features differ by {e}");
    }
}

fn image_logits(backend: &Arc<dyn Backend>, strict: bool, label: &str) {
    for mmproj in [false, true] {
        image_logits_from(backend, strict, label, mmproj);
    }
}

fn image_logits_from(backend: &Arc<dyn Backend>, strict: bool, label: &str, mmproj: bool) {
    let emu = label.starts_with("cuda-emu");
    let label = format!("{label}{}", if mmproj { " gguf+mmproj" } else { "" });
    let r = json("reference.json");
    let img = r["image_token"].as_u64().unwrap() as u32;
    let cases: Vec<kiln_tests::ImageCase> = (r["cases"].as_object().unwrap().iter())
        .map(|(case, c)| {
            let (tokens, _, grids) = runs_and_grids(c, img);
            kiln_tests::ImageCase {
                name: case.clone(),
                tokens,
                images: names(c).iter().map(|n| image(n)).collect(),
                grids,
                logits: f32s(&format!("logits_{case}.f32")),
            }
        })
        .collect();
    kiln_tests::check_image_logits(
        &|| Executor::new(backend.clone()).strict(strict),
        &|ex| source(mmproj, ex),
        &cases,
        img,
        emu,
        &label,
    );
}

#[path = "common/server.rs"]
mod common;

/// Chat completions with Qwen3.5: two images of different sizes in one message are answered;
/// the same request again takes the images' blocks from the prefix cache and gives the same
/// log-probabilities (the text after the images at their M-RoPE positions both times); the
/// images in the other order are another prompt.
#[test]
fn qwen35_chat_images_are_answered_and_cached() {
    let srv = common::start_model(&dir(), 2, None).expect("server");
    // 24 + 16 soft tokens, their wraps and the text.
    let first = common::check_image_caching(srv.addr, &dir(), 40, 40);
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();

    // The engine's first token log-probabilities are those of the prompt's logits as the
    // Runner computes them (the path checked against transformers above): the image rows
    // and the text after them at the same M-RoPE positions.
    let ex = Executor::new(cpu());
    let tower = VisionTower::open(&dir(), None, &ex).unwrap().unwrap();
    let tok = kiln_core::tokenizer::Tokenizer::from_hf_file(&dir().join("tokenizer.json")).unwrap();
    let (wide, square) = (image("wide.png"), image("square.png"));
    let pad = |img: &Image| "<|image_pad|>".repeat(tower.tokens_for(&img.rgb).unwrap());
    let text = format!(
        "<|im_start|>user\n<|vision_start|>{}<|vision_end|>Once upon<|vision_start|>{}<|vision_end|><|im_end|>\n<|im_start|>assistant\n",
        pad(&wide),
        pad(&square)
    );
    let tokens = tok.encode_chat(&text).unwrap();
    assert_eq!(tokens.len() as u64, prompt);
    let img = tok.token_to_id("<|image_pad|>").unwrap();
    let runs = kiln_tests::image_runs(&tokens, img);
    let grids: Vec<_> = [&wide, &square]
        .iter()
        .map(|i| tower.grid(&i.rgb).unwrap().unwrap())
        .collect();
    let feats: Vec<_> = [&wide, &square]
        .iter()
        .map(|i| tower.encode(&ex, &i.rgb).unwrap())
        .collect();
    let file = kiln_core::load::open_model(&dir()).unwrap();
    let model = kiln_core::model::build_from_gguf(&file, &ex).unwrap();
    let mut runner =
        kiln_core::engine::Runner::new(ex, model, kiln_core::engine::RunnerConfig::default())
            .unwrap();
    let rows = kiln_tests::image_prompt_logits_in_grids(
        &mut runner,
        &tokens,
        &runs,
        &feats,
        &[tokens.len()],
        &grids,
    );
    let last = rows.last().unwrap();
    let top = last.iter().cloned().fold(f32::MIN, f32::max) as f64;
    let lse = top
        + last
            .iter()
            .map(|&x| (x as f64 - top).exp())
            .sum::<f64>()
            .ln();
    // The top three, by value (the entries name tokens by their text).
    let mut want: Vec<f64> = last.iter().map(|&x| x as f64 - lse).collect();
    want.sort_by(|a, b| b.total_cmp(a));
    let first_top = first["choices"][0]["logprobs"]["content"][0]["top_logprobs"].clone();
    for (i, e) in first_top.as_array().unwrap().iter().enumerate() {
        let got = e["logprob"].as_f64().unwrap();
        assert!(
            (got - want[i]).abs() < 1e-3,
            "top {i}: engine {got}, runner {}",
            want[i]
        );
    }
}

/// A drafter that proposes what a plain run generated, with every third proposal's last
/// token wrong: drafts are accepted and rejected in turn.
struct Script {
    runs: Vec<(Vec<u32>, Vec<u32>)>,
    calls: usize,
}

impl kiln_core::spec::Drafter for Script {
    fn name(&self) -> &'static str {
        "script"
    }
    fn propose(
        &mut self,
        reqs: &[kiln_core::spec::DraftReq<'_>],
        _target: &kiln_core::runner::Target<'_>,
    ) -> kiln_core::error::Result<Vec<kiln_core::spec::Draft>> {
        Ok(reqs
            .iter()
            .map(|r| {
                self.calls += 1;
                let Some((prompt, out)) = self.runs.iter().find(|(p, _)| r.tokens.starts_with(p))
                else {
                    return kiln_core::spec::Draft::default();
                };
                let at = r.tokens.len() - prompt.len();
                let mut tokens: Vec<u32> = out.iter().skip(at).take(r.k).copied().collect();
                if self.calls % 3 == 0 {
                    if let Some(t) = tokens.last_mut() {
                        *t = (*t + 1) % 300;
                    }
                }
                kiln_core::spec::Draft {
                    tokens,
                    ..Default::default()
                }
            })
            .collect())
    }
}

/// Speculative decoding verified over image prompts' M-RoPE positions is lossless: with a
/// drafter whose drafts are partly right, the same greedy tokens as without it, for both
/// cases at once (two sequences of different image layouts in the same passes).
#[test]
fn qwen35_speculative_decoding_with_images_is_lossless() {
    use kiln_core::engine::{spawn, Engine, Event, GenRequest, PromptImage, Runner, RunnerConfig};
    use kiln_core::sample::SamplingParams;
    let r = json("reference.json");
    let img = r["image_token"].as_u64().unwrap() as u32;
    let reqs: Vec<GenRequest> = r["cases"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| {
            let (tokens, runs, _) = runs_and_grids(c, img);
            let mut g = GenRequest::new(tokens, SamplingParams::greedy(), 24);
            g.images = runs
                .iter()
                .zip(names(c))
                .map(|(&(s, _), n)| PromptImage {
                    start: s,
                    image: Arc::new(image(&n)),
                })
                .collect();
            g
        })
        .collect();
    let run = |spec: Option<Vec<Vec<u32>>>| {
        let ex = Executor::new(cpu());
        let tower = Arc::new(VisionTower::open(&dir(), None, &ex).unwrap().unwrap());
        let file = kiln_core::load::open_model(&dir()).unwrap();
        let model = kiln_core::model::build_from_gguf(&file, &ex).unwrap();
        let cfg = RunnerConfig {
            max_seqs: 2,
            max_batch_tokens: 64,
            max_rollback: 4,
            prefix_caching: true,
            ..RunnerConfig::default()
        };
        let mut e = Engine::new(Runner::new(ex, model, cfg).unwrap(), 2);
        e.set_vision(tower, img);
        if let Some(outs) = spec {
            let runs = reqs.iter().map(|q| q.prompt.clone()).zip(outs).collect();
            e = e.with_spec(Box::new(Script { runs, calls: 0 }), 4).unwrap();
        }
        let h = spawn(e);
        let streams: Vec<_> = reqs.iter().map(|q| h.submit(q.clone())).collect();
        let outs: Vec<Vec<u32>> = streams
            .iter()
            .map(|s| {
                let mut out = Vec::new();
                loop {
                    match s.recv().unwrap() {
                        Event::Token(t, _) => out.push(t),
                        Event::Done { .. } => return out,
                        Event::Error(e) => panic!("{e}"),
                        _ => {}
                    }
                }
            })
            .collect();
        (outs, h.shutdown().unwrap())
    };
    let (plain, _) = run(None);
    let (spec, st) = run(Some(plain.clone()));
    println!(
        "drafted {}, accepted {}; {:?}",
        st.spec.drafted, st.spec.accepted, plain
    );
    assert_eq!(spec, plain);
    assert!(plain.iter().all(|o| o.len() == 24));
    assert!(st.spec.accepted > 0, "no draft was accepted");
    assert!(st.spec.accepted < st.spec.drafted, "no draft was rejected");
}
