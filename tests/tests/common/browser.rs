//! What the browser tests share: Node, playwright-core (`KILN_TEST_PLAYWRIGHT`, else
//! `target/playwright/node_modules/playwright-core`; CI installs it from npm) and Chromium
//! (`KILN_TEST_CHROMIUM`, else `/usr/bin/chromium`). Without them a test skips, unless
//! `KILN_REQUIRE_BROWSER` is set.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_tests::required;

/// (node, playwright-core, chromium), or `None` with the reason printed.
pub fn browser_tools() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let playwright = std::env::var_os("KILN_TEST_PLAYWRIGHT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/playwright/node_modules/playwright-core"));
    let chromium = std::env::var_os("KILN_TEST_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let node = PathBuf::from("node");
    let node_ok = Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = [
        (!node_ok).then(|| "node".to_string()),
        (!playwright.join("package.json").is_file())
            .then(|| format!("playwright-core in {}", playwright.display())),
        (!chromium.is_file()).then(|| format!("chromium at {}", chromium.display())),
    ];
    let missing: Vec<String> = missing.into_iter().flatten().collect();
    if !missing.is_empty() {
        assert!(
            !required("BROWSER"),
            "KILN_REQUIRE_BROWSER is set but there is no {}",
            missing.join(", no ")
        );
        println!("skipping the browser test: no {}", missing.join(", no "));
        return None;
    }
    Some((node, playwright, chromium))
}

/// Runs the page script `tests/web/<script>` under Node with `tools` (from [`browser_tools`])
/// and `env` (plus `SCREENSHOT` from `KILN_TEST_SCREENSHOT`), and returns the last JSON line
/// it printed; a failing script fails the test with its output.
pub fn run_page_script(
    tools: &(PathBuf, PathBuf, PathBuf),
    script: &str,
    env: &[(&str, std::ffi::OsString)],
) -> serde_json::Value {
    let (node, playwright, chromium) = tools;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cmd = Command::new(node);
    cmd.arg(root.join("tests/web").join(script))
        .env("PLAYWRIGHT", playwright)
        .env("CHROMIUM", chromium);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(shot) = std::env::var_os("KILN_TEST_SCREENSHOT") {
        cmd.env("SCREENSHOT", shot);
    }
    let out = cmd.output().expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the page script failed:\n{stdout}\n{stderr}"
    );
    let seen: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON from the page script:\n{stdout}\n{stderr}"));
    println!("{seen:#}");
    seen
}
