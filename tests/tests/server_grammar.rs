//! Structured output end to end: the official `openai` Python client asks `kiln serve` for
//! JSON following random schemas, for text following a Lark grammar and for forced tool
//! calls; the answers are checked in Python (`jsonschema`, `re`), not by kiln.

#[path = "common/server.rs"]
mod common;

use std::path::Path;

use common::{start_model, tiny_with_tools};
use kiln_tests::{model_file, required, GEMMA3, SMOLLM2};

/// Whether python3 imports the client and the validator; fails under `KILN_REQUIRE_OPENAI`.
fn python_ready() -> Option<String> {
    let pypath = std::env::var("KILN_TEST_PYTHONPATH").unwrap_or_default();
    let have = std::process::Command::new("python3")
        .args(["-c", "import openai, jsonschema"])
        .env("PYTHONPATH", &pypath)
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            !required("OPENAI"),
            "KILN_REQUIRE_OPENAI is set but python3 cannot import openai and jsonschema \
             (PYTHONPATH={pypath:?})"
        );
        println!("skipping: python3 cannot import openai and jsonschema (KILN_TEST_PYTHONPATH)");
        return None;
    }
    Some(pypath)
}

fn run_client(pypath: &str, model: &Path, count: usize, tools: bool) {
    let Some(srv) = start_model(model, 2, Some("sk-kiln")) else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/structured_output.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script)
        .arg(format!("http://{}/v1", srv.addr))
        .arg(count.to_string());
    if tools {
        cmd.arg("tools");
    }
    let out = cmd
        .env("PYTHONPATH", pypath)
        .output()
        .expect("python3 runs");
    println!(
        "{}: {}",
        model.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.status.success(),
        "{}: structured output failed: {}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn structured_output_on_the_tiny_model_with_forced_tool_calls() {
    let Some(pypath) = python_ready() else {
        return;
    };
    let dir = tiny_with_tools("grammar");
    run_client(&pypath, &dir, 20, true);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn structured_output_on_the_real_models() {
    let Some(pypath) = python_ready() else {
        return;
    };
    for name in [SMOLLM2, GEMMA3] {
        if let Some(path) = model_file(name) {
            run_client(&pypath, &path, 20, false);
        }
    }
}
