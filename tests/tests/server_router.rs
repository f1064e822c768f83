//! Router mode (`kiln serve --models-dir DIR --models-max N`) end to end on the two real
//! models: each loads on its first request and the other unloads past the limit, the answers
//! equal those of single-model servers, /v1/models and /metrics say what is loaded, and
//! concurrent requests while a model loads get answers or 503s, never a hang.

#[path = "common/server.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kiln_core::engine::RunnerConfig;
use kiln_server::load::ModelArgs;
use kiln_server::serve::multi::{models_router, Models, ModelsConfig};
use kiln_server::serve::ServeOptions;
use kiln_tests::{model_file, GEMMA3, SMOLLM2};
use serde_json::{json, Value};

const PROMPTS: [&str; 2] = ["The capital of France is", "Water boils at"];

/// The runner settings the single-model test servers use (`start_model`).
fn runner() -> RunnerConfig {
    RunnerConfig {
        max_seqs: 2,
        max_batch_tokens: 64,
        prefix_caching: true,
        ..RunnerConfig::default()
    }
}

struct MultiServer {
    addr: std::net::SocketAddr,
    _rt: tokio::runtime::Runtime,
}

fn serve_dir(dir: &std::path::Path, load_wait: Duration) -> MultiServer {
    let srv = Models::new(ModelsConfig {
        dir: dir.to_path_buf(),
        max_loaded: 1,
        load_wait,
        args: ModelArgs {
            ctx: Some(512),
            ..ModelArgs::new(None, "cpu")
        },
        cfg: runner(),
        opts: ServeOptions::new(2),
    })
    .expect("router mode lists the directory");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(listener).expect("tokio listener")
    };
    rt.spawn(kiln_server::serve::serve_connections(
        listener,
        models_router(srv),
        kiln_server::serve::ConnLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
        },
    ));
    MultiServer { addr, _rt: rt }
}

fn greedy(addr: std::net::SocketAddr, model: &str, prompt: &str) -> (u16, String) {
    let (st, body) = post(
        addr,
        "/v1/completions",
        &json!({"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}),
    );
    if st != 200 {
        return (st, body);
    }
    let v: Value = serde_json::from_str(&body).expect("JSON");
    (
        st,
        v["choices"][0]["text"].as_str().unwrap_or("").to_string(),
    )
}

fn states(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let v = get(addr, "/v1/models");
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap_or("").to_string(),
                m["status"]["value"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[cfg(unix)]
#[test]
fn two_models_take_turns_in_one_server_with_room_for_one() {
    let (Some(a), Some(b)) = (model_file(SMOLLM2), model_file(GEMMA3)) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("kiln-router-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::os::unix::fs::symlink(&a, dir.join(SMOLLM2)).expect("link");
    std::os::unix::fs::symlink(&b, dir.join(GEMMA3)).expect("link");
    let name = |f: &str| f.trim_end_matches(".gguf").to_string();
    let (na, nb) = (name(SMOLLM2), name(GEMMA3));

    // What each model answers from a server of its own.
    let mut want = Vec::new();
    for (path, n) in [(&a, &na), (&b, &nb)] {
        let srv = start_model(path, 2, None).expect("single-model server");
        for p in PROMPTS {
            let (st, text) = greedy(srv.addr, &srv.state.model, p);
            assert_eq!(st, 200, "{text}");
            want.push(((n.clone(), p), text));
        }
    }

    let srv = serve_dir(&dir, Duration::from_secs(60));
    let listed = states(srv.addr);
    assert!(
        listed.contains(&(na.clone(), "unloaded".into()))
            && listed.contains(&(nb.clone(), "unloaded".into())),
        "{listed:?}"
    );
    // Nothing named and nothing loaded: which model is meant is unclear.
    let (st, body) = post(
        srv.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(st, 400, "{body}");
    let (st, body) = greedy(srv.addr, "no-such-model", "Hi");
    assert_eq!(st, 404, "{body}");
    // Only a generating request loads a model: a GET (a page's stray image, say) does not.
    let (st, body) = http(srv.addr, "GET", &format!("/props?model={na}"), b"", None);
    assert_eq!(st, 503, "{body}");
    assert!(
        states(srv.addr).iter().all(|(_, s)| s == "unloaded"),
        "{:?}",
        states(srv.addr)
    );

    // Alternate: each request loads its model and unloads the other.
    for round in 0..2 {
        for n in [&na, &nb] {
            for p in PROMPTS {
                let (st, text) = greedy(srv.addr, n, p);
                assert_eq!(st, 200, "{n}: {text}");
                let expect = &want
                    .iter()
                    .find(|w| &w.0 .0 == n && w.0 .1 == p)
                    .expect("answer")
                    .1;
                assert_eq!(&text, expect, "round {round}, {n}, {p:?}");
            }
            let now = states(srv.addr);
            let other = if n == &na { &nb } else { &na };
            assert!(now.contains(&((*n).clone(), "loaded".into())), "{now:?}");
            assert!(now.contains(&(other.clone(), "unloaded".into())), "{now:?}");
        }
    }
    let m = metrics_text(srv.addr);
    assert_eq!(metric(&m, "kiln_model_loads_total"), 4.0, "{m}");
    assert_eq!(metric(&m, "kiln_model_unloads_total"), 3.0, "{m}");
    assert_eq!(metric(&m, "kiln_models{state=\"loaded\"}"), 1.0, "{m}");
    // The loaded model's vLLM gauges, labelled with its name.
    assert!(
        m.contains(&format!(
            "vllm:num_requests_running{{model_name=\"{nb}\"}} 0"
        )),
        "{m}"
    );
    // An alias of a listed file names that model.
    let (st, text) = greedy(srv.addr, "smollm2-135m-instruct", PROMPTS[0]);
    assert_eq!(st, 200, "{text}");
    assert_eq!(&text, &want[0].1);

    // 20 requests at once, alternating models while they load and unload: each gets its
    // answer or a 503 (with Retry-After) within the bound, none hangs.
    let t0 = Instant::now();
    let addr = srv.addr;
    let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..20)
        .map(|i| {
            let (answers, n) = (
                answers.clone(),
                if i % 2 == 0 { nb.clone() } else { na.clone() },
            );
            std::thread::spawn(move || {
                let (st, text) = greedy(addr, &n, PROMPTS[i % 2]);
                answers.lock().expect("lock").push((n, i % 2, st, text));
            })
        })
        .collect();
    for t in threads {
        t.join().expect("request thread");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "took {:?}",
        t0.elapsed()
    );
    let answers = answers.lock().expect("lock");
    let ok = answers.iter().filter(|a| a.2 == 200).count();
    for (n, p, st, text) in answers.iter() {
        assert!(*st == 200 || *st == 503, "{n}: {st} {text}");
        if *st == 200 {
            let expect = &want
                .iter()
                .find(|w| &w.0 .0 == n && w.0 .1 == PROMPTS[*p])
                .expect("answer")
                .1;
            assert_eq!(text, expect, "{n} under load");
        }
    }
    assert!(ok >= 1, "no request was answered: {answers:?}");
    println!(
        "20 concurrent requests over two models with room for one: {ok} answered, {} got 503",
        answers.len() - ok
    );
    let _ = std::fs::remove_dir_all(&dir);
}
