//! Anthropic's Messages API and OpenAI's Responses API end to end: the official `anthropic`
//! Python client and the `openai` client's `responses` against `kiln serve`, for plain,
//! streamed and tool-calling requests (the script `python/compat_clients.py` says what each
//! checks).

#[path = "common/server.rs"]
mod common;

use std::path::Path;

use common::{start_model, tiny_with_tools};
use kiln_tests::{model_file, required, SMOLLM2};

fn python_ready() -> Option<String> {
    let pypath = std::env::var("KILN_TEST_PYTHONPATH").unwrap_or_default();
    let have = std::process::Command::new("python3")
        .args(["-c", "import anthropic, openai, jsonschema"])
        .env("PYTHONPATH", &pypath)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            !required("OPENAI"),
            "KILN_REQUIRE_OPENAI is set but python3 cannot import anthropic, openai and \
             jsonschema (PYTHONPATH={pypath:?})"
        );
        println!("skipping: python3 cannot import anthropic, openai and jsonschema");
        return None;
    }
    Some(pypath)
}

fn run_clients(pypath: &str, model: &Path, mode: &str) {
    run_clients_with(pypath, model, mode, &[]);
}

fn run_clients_with(pypath: &str, model: &Path, mode: &str, args: &[&Path]) {
    let Some(srv) = start_model(model, 2, Some("sk-kiln")) else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/compat_clients.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}", srv.addr))
        .arg(mode)
        .args(args)
        .env("PYTHONPATH", pypath)
        .output()
        .expect("python3 runs");
    println!("{mode}: {}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{mode} on {}: {}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_anthropic_client_and_openai_responses_drive_kiln_serve() {
    let Some(pypath) = python_ready() else {
        return;
    };
    if let Some(path) = model_file(SMOLLM2) {
        run_clients(&pypath, &path, "text");
    }
}

#[test]
fn tool_calls_through_the_messages_and_responses_apis() {
    let Some(pypath) = python_ready() else {
        return;
    };
    let dir = tiny_with_tools("compat");
    run_clients(&pypath, &dir, "tools");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Images through all three APIs' own clients, on the tiny Gemma 3 with its vision tower.
#[test]
fn the_clients_send_images() {
    let Some(pypath) = python_ready() else {
        return;
    };
    let dir = kiln_tests::fixtures().join("hf").join("gemma3_vision");
    run_clients_with(
        &pypath,
        &dir,
        "images",
        &[&dir.join("square.png"), &dir.join("wide.png")],
    );
}
