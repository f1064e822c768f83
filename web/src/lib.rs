//! kiln in the browser: kiln-core and the WebGPU backend compiled for `wasm32-unknown-unknown`
//! and exposed to JavaScript through wasm-bindgen. Everything here is asynchronous: in a
//! browser, adapters, devices and buffer reads arrive through the event loop, so nothing may
//! block (see `Backend::download_async`).
//!
//! JavaScript sees (`scripts/web-build.sh` builds it; `web/worker.js` drives it):
//! - `Model.load(read, size, name, options)`: a GGUF model read through `read(offset, length)
//!   => Uint8Array` (synchronous: in a Web Worker, an Origin Private File System handle or a
//!   `FileReaderSync` over a picked file), one tensor at a time straight into GPU buffers;
//! - `model.chat(messages, params, onText)`: the reply through the model's chat template,
//!   streamed piece by piece to `onText`, which returns `false` to stop it;
//! - `conformance(filter)`: the conformance suite on the browser's WebGPU adapter against
//!   kiln's CPU reference compiled to wasm (`web/tests/browser.rs` runs it in headless
//!   Chromium through `scripts/web-test.sh`).
//!
//! The natively built crate holds the same code ([`session`]) so the workspace's tests cover it.

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::validate::{cases, run_case_async, Status};

pub mod session;

/// What a conformance run found on one adapter.
#[derive(Debug, Default)]
pub struct Report {
    /// The adapter, as the backend describes it.
    pub device: String,
    pub passed: usize,
    /// Each failed case: op, case and why.
    pub failures: Vec<String>,
    /// Cases the adapter does not claim (they would run on the CPU reference).
    pub not_supported: usize,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "device": self.device,
            "passed": self.passed,
            "failed": self.failures.len(),
            "failures": self.failures,
            "not_supported": self.not_supported,
        })
        .to_string()
    }
}

/// Runs every conformance case whose op or label contains `filter` on `candidate` against the
/// CPU reference, reading results back with `download_async`.
pub async fn conformance_on(
    candidate: &dyn Backend,
    filter: Option<&str>,
) -> Result<Report, String> {
    let reference = CpuBackend::with_threads(1);
    let mut report = Report {
        device: candidate.capabilities().device.clone(),
        ..Report::default()
    };
    for case in cases().map_err(|e| e.to_string())? {
        if let Some(f) = filter {
            if !case.op.name().contains(f) && !case.label.contains(f) {
                continue;
            }
        }
        let r = run_case_async(&case, &reference, candidate).await;
        match r.status {
            Status::Pass => report.passed += 1,
            Status::NotSupported => report.not_supported += 1,
            Status::Fail(why) => report.failures.push(format!("{} {}: {why}", r.op, r.case)),
        }
    }
    Ok(report)
}

/// `n` greedy tokens after `prompt` from the model of `file` on `ex`, each step's logits read
/// with `download_async` (the browser's tests and their native twin run this).
pub async fn greedy_tokens(
    ex: kiln_core::exec::Executor,
    file: &kiln_core::load::gguf::GgufFile,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>, String> {
    use kiln_core::runner::{Logits, Runner, RunnerConfig};
    let model = kiln_core::model::build_from_gguf(file, &ex).map_err(|e| e.to_string())?;
    let cfg = RunnerConfig {
        ctx: prompt.len() + n + 1,
        max_seqs: 1,
        ..RunnerConfig::default()
    };
    let mut r = Runner::new(ex, model, cfg).map_err(|e| e.to_string())?;
    let mut rows = r
        .step_async(&[(0, prompt, Logits::Last)])
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let logits = rows.first().and_then(|r| r.last()).ok_or("no logits")?;
        let t = kiln_core::sample::argmax(logits);
        out.push(t);
        if out.len() < n {
            rows = r
                .step_async(&[(0, &[t], Logits::Last)])
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(out)
}

/// The tiny fixtures the browser's greedy test runs (`tests/fixtures/hf/gguf/NAME.gguf`), with
/// the prompt of each one's `reference.json` and native kiln's greedy tokens after it, in
/// `tests/fixtures/hf/gguf/greedy.json` (written and checked natively by this crate's test
/// `the_browser_fixtures_greedy_tokens_are_native_kilns_and_transformers`).
pub const GREEDY_FIXTURES: &[&str] = &["llama", "qwen3_5", "gemma4"];

/// One fixture's entry in `greedy.json`: name, prompt, greedy tokens.
pub type Expected = (String, Vec<u32>, Vec<u32>);

/// The entries of `greedy.json`'s text, in [`GREEDY_FIXTURES`] order.
pub fn greedy_expected(json: &str) -> Result<Vec<Expected>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let ids = |x: &serde_json::Value| -> Result<Vec<u32>, String> {
        x.as_array()
            .ok_or("not an array")?
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or("not ids".to_string())
            })
            .collect()
    };
    GREEDY_FIXTURES
        .iter()
        .map(|name| {
            let f = &v[*name];
            Ok((name.to_string(), ids(&f["prompt"])?, ids(&f["tokens"])?))
        })
        .collect()
}

/// The conformance suite on this browser's WebGPU adapter.
pub async fn conformance_report(filter: Option<&str>) -> Result<Report, String> {
    let gpu = kiln_backend_wgpu::WgpuBackend::open_async()
        .await
        .map_err(|e| e.to_string())?;
    conformance_on(&gpu, filter).await
}

#[cfg(target_arch = "wasm32")]
mod js {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::Arc;

    use js_sys::{Function, Promise, Uint8Array};
    use kiln_core::chat::Message;
    use kiln_core::cpu::CpuBackend;
    use kiln_core::exec::Executor;
    use kiln_core::load::gguf::{GgufFile, ReadAt};
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;

    use crate::session::{GenParams, Session};

    // `JsFile` below is `Send + Sync` because a wasm32 build without atomics has one thread.
    #[cfg(target_feature = "atomics")]
    compile_error!("kiln-web assumes one thread: JsFile's Send/Sync is unsound with atomics");

    #[wasm_bindgen]
    extern "C" {
        #[wasm_bindgen(js_namespace = console, js_name = error)]
        fn console_error(s: &str);
        #[wasm_bindgen(js_namespace = globalThis, js_name = kilnPanicked)]
        fn report_panic(s: &str);
        #[wasm_bindgen(js_namespace = globalThis, js_name = setTimeout)]
        fn set_timeout(f: &Function, ms: i32) -> JsValue;
    }

    /// Resolves in a later task of the event loop (after the messages waiting for it).
    async fn next_task() {
        let p = Promise::new(&mut |resolve, _| {
            let _ = set_timeout(&resolve, 0);
        });
        let _ = wasm_bindgen_futures::JsFuture::from(p).await;
    }

    /// A panic (which aborts the module) is written to the console and handed to the page's
    /// `globalThis.kilnPanicked(message)`, so the page can say what happened instead of
    /// "unreachable executed".
    #[wasm_bindgen(start)]
    pub fn start() {
        std::panic::set_hook(Box::new(|info| {
            let msg = info.to_string();
            console_error(&msg);
            report_panic(&msg);
        }));
    }

    fn js_err(e: JsValue) -> String {
        e.as_string()
            .or_else(|| {
                e.dyn_ref::<js_sys::Error>()
                    .map(|e| String::from(e.message()))
            })
            .unwrap_or_else(|| format!("{e:?}"))
    }

    /// A model file read through a synchronous JavaScript function `(offset, length) =>
    /// Uint8Array`.
    struct JsFile {
        read: Function,
        len: usize,
    }

    // SAFETY: kiln-web is built for wasm32 without the atomics feature (checked above by
    // `compile_error!`): there is one thread, so the JavaScript function is never touched
    // from another thread.
    unsafe impl Send for JsFile {}
    // SAFETY: as for `Send`.
    unsafe impl Sync for JsFile {}

    impl ReadAt for JsFile {
        fn len(&self) -> usize {
            self.len
        }
        fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<(), String> {
            let v = self
                .read
                .call2(
                    &JsValue::NULL,
                    &JsValue::from_f64(offset as f64),
                    &JsValue::from_f64(buf.len() as f64),
                )
                .map_err(js_err)?;
            let a: Uint8Array = v
                .dyn_into()
                .map_err(|_| "the reader did not return a Uint8Array".to_string())?;
            if a.length() as usize != buf.len() {
                return Err(format!(
                    "the reader returned {} bytes at offset {offset}, {} were asked for",
                    a.length(),
                    buf.len()
                ));
            }
            a.copy_to(buf);
            Ok(())
        }
    }

    /// Options of `Model.load` (JSON, every field optional).
    #[derive(serde::Deserialize, Default)]
    #[serde(default, deny_unknown_fields)]
    struct LoadOptions {
        /// `webgpu` (default; a model with an op the adapter lacks fails to load with a
        /// message that begins with `session::UNSUPPORTED`) or `cpu`.
        backend: Option<String>,
        /// Context length in tokens (default: the model's, at most 2048).
        ctx: Option<usize>,
    }

    /// A model loaded in this page (or worker).
    #[wasm_bindgen]
    pub struct Model {
        inner: Rc<RefCell<Session>>,
        /// On the CPU a step never waits on the event loop: the reply yields after each
        /// token so the page's stop gets in.
        yields: bool,
    }

    #[wasm_bindgen]
    impl Model {
        /// Loads the GGUF model that `read(offset, length)` reads (`size` bytes; `name` for
        /// messages), with `options` as JSON (`backend`, `ctx`).
        pub async fn load(
            read: Function,
            size: f64,
            name: String,
            options: String,
        ) -> Result<Model, JsValue> {
            let fail = |e: String| JsValue::from_str(&e);
            let opts: LoadOptions = if options.trim().is_empty() {
                LoadOptions::default()
            } else {
                serde_json::from_str(&options).map_err(|e| fail(format!("options: {e}")))?
            };
            if !(size.is_finite() && size >= 0.0 && size <= usize::MAX as f64) {
                return Err(fail(format!(
                    "a file of {size} bytes cannot be loaded here"
                )));
            }
            let file = GgufFile::from_source(
                &name,
                Box::new(JsFile {
                    read,
                    len: size as usize,
                }),
            )
            .map_err(|e| fail(e.to_string()))?;
            let cpu = Arc::new(CpuBackend::with_threads(1));
            let backend = opts.backend.as_deref().unwrap_or("webgpu");
            let ex = match backend {
                "cpu" => Executor::with_cpu(cpu.clone(), cpu),
                "webgpu" => {
                    let gpu = kiln_backend_wgpu::WgpuBackend::open_async()
                        .await
                        .map_err(|e| {
                            fail(format!(
                                "no WebGPU here ({e}); try the CPU backend (slower)"
                            ))
                        })?;
                    // Strict: falling back to the CPU in the middle of a step would need a
                    // blocking read of a GPU buffer, which a browser cannot do.
                    Executor::with_cpu(Arc::new(gpu), cpu).strict(true)
                }
                other => return Err(fail(format!("unknown backend {other:?}: webgpu or cpu"))),
            };
            let mut session = Session::load(&file, ex, opts.ctx).map_err(fail)?;
            if backend == "webgpu" {
                session.warm_up().await.map_err(fail)?;
            }
            Ok(Model {
                inner: Rc::new(RefCell::new(session)),
                yields: backend == "cpu",
            })
        }

        /// What was loaded, as JSON: architecture, parameters, context, device, load time.
        pub fn info(&self) -> String {
            self.inner
                .try_borrow()
                .map(|s| s.info().to_string())
                .unwrap_or_else(|_| "{}".into())
        }

        /// The reply to `messages` (JSON `[{role, content}]`) with `params` (JSON: max_tokens,
        /// temperature, top_p, top_k, seed, stop), calling `onText(piece)` with each piece of
        /// text; `onText` returning `false` stops the reply. Resolves to the reply's statistics
        /// (JSON: tokens, prompt_tps, decode_tps, finish_reason, ...).
        pub fn chat(&self, messages: String, params: String, on_text: Function) -> Promise {
            let inner = self.inner.clone();
            let yields = self.yields;
            wasm_bindgen_futures::future_to_promise(async move {
                let fail = |e: String| JsValue::from_str(&e);
                let raw: Vec<serde_json::Value> =
                    serde_json::from_str(&messages).map_err(|e| fail(format!("messages: {e}")))?;
                let mut msgs = Vec::with_capacity(raw.len());
                for m in &raw {
                    let field = |k: &str| m.get(k).and_then(|v| v.as_str());
                    match (field("role"), field("content")) {
                        (Some(r), Some(c)) => msgs.push(Message::new(r, c)),
                        _ => return Err(fail("each message needs a role and a content".into())),
                    }
                }
                let p: GenParams = if params.trim().is_empty() {
                    GenParams::default()
                } else {
                    serde_json::from_str(&params).map_err(|e| fail(format!("params: {e}")))?
                };
                let mut session = inner
                    .try_borrow_mut()
                    .map_err(|_| fail("a reply is already being written".into()))?;
                // A throwing onText ends the reply with its error (not as a stop).
                let thrown = RefCell::new(None::<String>);
                let stats = session
                    .chat(
                        &msgs,
                        &p,
                        |piece| match on_text.call1(&JsValue::NULL, &JsValue::from_str(piece)) {
                            Ok(v) => v.as_bool() != Some(false),
                            Err(e) => {
                                *thrown.borrow_mut() = Some(js_err(e));
                                false
                            }
                        },
                        || async move {
                            if yields {
                                next_task().await;
                            }
                        },
                    )
                    .await
                    .map_err(fail)?;
                if let Some(e) = thrown.into_inner() {
                    return Err(fail(format!("onText threw: {e}")));
                }
                Ok(JsValue::from_str(&stats.to_json()))
            })
        }
    }

    /// `kiln.conformance(filter?)`: the conformance suite on this browser's WebGPU adapter,
    /// as JSON (`device`, `passed`, `failed`, `failures`, `not_supported`).
    #[wasm_bindgen]
    pub async fn conformance(filter: Option<String>) -> Result<String, JsValue> {
        super::conformance_report(filter.as_deref())
            .await
            .map(|r| r.to_json())
            .map_err(|e| JsValue::from_str(&e))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    /// The asynchronous harness agrees with itself natively: the CPU reference against itself
    /// passes every case it runs.
    #[test]
    fn the_async_harness_passes_the_cpu_against_itself() {
        let cpu = CpuBackend::with_threads(1);
        let fut = conformance_on(&cpu, Some("rms_norm"));
        let report = block_on(fut).expect("cases");
        assert!(report.passed > 0);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
    }

    /// `Runner::step_async` (what the browser steps with) gives the tokens `Runner::step`
    /// gives, natively on the CPU, over the tiny Qwen3.5 fixture.
    #[test]
    fn the_async_step_gives_the_tokens_of_the_blocking_step() {
        use kiln_core::exec::Executor;
        use kiln_core::load::gguf::GgufFile;
        use kiln_core::runner::{Logits, Runner, RunnerConfig};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/hf/gguf/qwen3_5.gguf");
        let run = |blocking: bool| -> Vec<u32> {
            let cpu = std::sync::Arc::new(CpuBackend::with_threads(1));
            let ex = Executor::with_cpu(cpu.clone(), cpu);
            let file = GgufFile::open(&path).expect("the fixture opens");
            let model = kiln_core::model::build_from_gguf(&file, &ex).expect("builds");
            let cfg = RunnerConfig {
                ctx: 64,
                max_seqs: 1,
                ..RunnerConfig::default()
            };
            let mut r = Runner::new(ex, model, cfg).expect("runner");
            let mut step = |toks: &[u32]| -> Vec<f32> {
                let items = [(0u64, toks, Logits::Last)];
                let rows = if blocking {
                    r.step(&items)
                } else {
                    block_on(r.step_async(&items))
                };
                rows.expect("step").remove(0).remove(0)
            };
            let argmax =
                |v: &[f32]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32;
            let mut logits = step(&[11, 48, 85, 122, 159, 196, 233]);
            let mut out = Vec::new();
            for _ in 0..8 {
                let t = argmax(&logits);
                out.push(t);
                logits = step(&[t]);
            }
            out
        };
        assert_eq!(run(false), run(true));
    }

    fn fixture_session(ctx: usize) -> (session::Session, kiln_core::load::gguf::GgufFile) {
        use kiln_core::exec::Executor;
        use kiln_core::load::gguf::GgufFile;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/hf/gguf/qwen3_5.gguf");
        let file = GgufFile::open(&path).expect("the fixture opens");
        let cpu = std::sync::Arc::new(CpuBackend::with_threads(1));
        let ex = Executor::with_cpu(cpu.clone(), cpu);
        (
            session::Session::load(&file, ex, Some(ctx)).expect("loads"),
            file,
        )
    }

    /// The page's chat loop gives the tokens kiln's engine gives for the same prompt, greedy
    /// (the engine being what `kiln run` and `kiln serve` run), and stops where asked.
    #[test]
    fn the_page_chat_loop_gives_the_engines_greedy_tokens_and_stops_when_told() {
        use kiln_core::chat::Message;
        use kiln_core::engine::{Engine, Event, GenRequest};
        use kiln_core::exec::Executor;
        use kiln_core::runner::{Runner, RunnerConfig};
        use kiln_core::sample::SamplingParams;
        let (mut s, file) = fixture_session(1024);
        // A prompt longer than one batch of the runner, so the prefill runs in chunks.
        let text: String = (0..250).map(|i| ["the ", "cat ", "sat "][i % 3]).collect();
        let messages = vec![Message::new("user", text)];
        let prompt = s.prompt(&messages).expect("prompt");
        assert!(
            prompt.len() > RunnerConfig::default().max_batch_tokens,
            "{}",
            prompt.len()
        );
        let greedy = session::GenParams {
            max_tokens: 12,
            temperature: 0.0,
            ..Default::default()
        };
        let mut shown = String::new();
        let got = block_on(s.chat(
            &messages,
            &greedy,
            |p| {
                shown.push_str(p);
                true
            },
            ready,
        ))
        .expect("chat");

        let cpu = std::sync::Arc::new(CpuBackend::with_threads(1));
        let ex = Executor::with_cpu(cpu.clone(), cpu);
        let model = kiln_core::model::build_from_gguf(&file, &ex).expect("builds");
        let cfg = RunnerConfig {
            ctx: 1024,
            max_seqs: 1,
            ..RunnerConfig::default()
        };
        let mut engine = Engine::new(Runner::new(ex, model, cfg).expect("runner"), 1);
        let tok = s.tokenizer();
        let req = GenRequest {
            prompt: prompt.clone(),
            params: SamplingParams::greedy(),
            max_tokens: 12,
            stop_ids: tok.eog_ids().to_vec(),
            logprobs: None,
            drafts: false,
            init_canvas: None,
            autoregressive: false,
            constraint: None,
            images: Vec::new(),
        };
        let mut want = Vec::new();
        engine
            .run_one(req, |ev| {
                if let Event::Token(t, _) = ev {
                    want.push(t);
                }
                Ok(true)
            })
            .expect("engine");
        assert!(want.len() >= 4, "{want:?}");
        assert_eq!(got.tokens, want, "the page's loop vs the engine");
        assert_eq!(got.prompt_tokens, prompt.len());
        assert_eq!(shown, tok.decode(&want));

        // Told to stop after the third visible piece: cancelled there, a prefix of the reply.
        let (mut n, mut part) = (0, String::new());
        let stopped = block_on(s.chat(
            &messages,
            &greedy,
            |p| {
                part.push_str(p);
                n += usize::from(!p.is_empty());
                n < 3
            },
            ready,
        ))
        .expect("chat");
        assert_eq!(stopped.finish, "cancelled");
        assert!(stopped.tokens.len() >= 3 && stopped.tokens.len() < want.len());
        assert_eq!(stopped.tokens, want[..stopped.tokens.len()]);
        assert!(shown.starts_with(&part) && !part.is_empty());
        // The next reply starts over from an empty cache and gives the same tokens.
        let again = block_on(s.chat(&messages, &greedy, |_| true, ready)).expect("chat");
        assert_eq!(again.tokens, want);
    }

    /// The load-time step finds an op the device lacks when the executor may not fall back
    /// (as in a browser), with the message the page's worker recognises; on a device with
    /// every op it passes and leaves no sequence behind.
    #[test]
    fn the_warm_up_step_names_an_op_the_device_lacks() {
        use kiln_core::exec::Executor;
        use kiln_core::load::gguf::GgufFile;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/hf/gguf/llama.gguf");
        let file = GgufFile::open(&path).expect("the fixture opens");
        let cpu = std::sync::Arc::new(CpuBackend::with_threads(1));
        let lacks =
            kiln_tests::FakeDevice::new("no-attention", |d| !d.op.name().contains("attention"));
        let ex = Executor::with_cpu(std::sync::Arc::new(lacks), cpu.clone()).strict(true);
        let mut s = session::Session::load(&file, ex, Some(64)).expect("loads");
        let e = block_on(s.warm_up()).expect_err("attention is missing");
        assert!(
            e.starts_with(session::UNSUPPORTED) && e.contains("attention"),
            "{e}"
        );

        let ex = Executor::with_cpu(cpu.clone(), cpu).strict(true);
        let mut s = session::Session::load(&file, ex, Some(64)).expect("loads");
        block_on(s.warm_up()).expect("every op is there");
        let greedy = session::GenParams {
            max_tokens: 4,
            temperature: 0.0,
            ..Default::default()
        };
        let msgs = [kiln_core::chat::Message::new("user", "hi")];
        let got = block_on(s.chat(&msgs, &greedy, |_| true, ready)).expect("chat after warm-up");
        assert!(!got.tokens.is_empty() || got.finish == "stop");
    }

    /// A conversation that fills the context is an error that says so, not a panic.
    #[test]
    fn a_conversation_past_the_context_is_a_clear_error() {
        use kiln_core::chat::Message;
        let (mut s, _) = fixture_session(256);
        let text: String = (0..2000).map(|_| "the ").collect();
        let e = block_on(s.chat(
            &[Message::new("user", text)],
            &Default::default(),
            |_| true,
            ready,
        ))
        .expect_err("too long");
        assert!(e.contains("fills the context of 256"), "{e}");
    }

    /// `greedy.json` holds native kiln's greedy tokens on each fixture the browser's test
    /// runs (`KILN_BLESS=1` writes it again), and they are transformers' (`reference.json`)
    /// wherever transformers' token is in the GGUF's vocabulary (llama.cpp's Gemma 4
    /// conversion keeps only the tokenizer's 315 of the model's 320 rows).
    #[test]
    fn the_browser_fixtures_greedy_tokens_are_native_kilns_and_transformers() {
        use kiln_core::exec::Executor;
        use kiln_core::load::gguf::GgufFile;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf");
        let mut made = serde_json::Map::new();
        for name in GREEDY_FIXTURES {
            let json = std::fs::read_to_string(root.join(name).join("reference.json"))
                .expect("reference.json");
            let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
            let ids = |k: &str| -> Vec<u32> {
                v[k].as_array()
                    .expect(k)
                    .iter()
                    .map(|x| x.as_u64().expect("an id") as u32)
                    .collect()
            };
            let (prompt, hf) = (ids("greedy_prompt"), ids("greedy"));
            let file = GgufFile::open(root.join("gguf").join(format!("{name}.gguf")))
                .expect("the fixture opens");
            let vocab = file
                .tensor("output.weight")
                .or_else(|_| file.tensor("token_embd.weight"))
                .map(|t| t.shape[0])
                .expect("an output matrix");
            let got =
                block_on(greedy_tokens(Executor::cpu(), &file, &prompt, hf.len())).expect("greedy");
            let agree = hf.iter().take_while(|&&t| (t as usize) < vocab).count();
            assert!(agree >= 4, "{name}: {hf:?}");
            assert_eq!(
                got[..agree],
                hf[..agree],
                "{name}: native kiln vs transformers"
            );
            made.insert(
                name.to_string(),
                serde_json::json!({"prompt": prompt, "tokens": got}),
            );
        }
        let path = root.join("gguf/greedy.json");
        let text = serde_json::to_string_pretty(&made).expect("JSON") + "\n";
        if std::env::var_os("KILN_BLESS").is_some() {
            std::fs::write(&path, &text).expect("writes greedy.json");
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            greedy_expected(&stored).expect("greedy.json parses"),
            greedy_expected(&text).expect("made"),
            "{} is not native kiln's greedy tokens (KILN_BLESS=1 rewrites it)",
            path.display()
        );
    }

    fn ready() -> std::future::Ready<()> {
        std::future::ready(())
    }

    /// Polls a future that is ready without waiting on anything (the CPU's download is).
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }
}
