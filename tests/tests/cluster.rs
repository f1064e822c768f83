//! kiln behind a real router: `scripts/cluster.sh` in a short version — three `kiln serve`
//! workers (SmolLM2) behind vllm-router's cache-aware policy: distinct requests reach all three,
//! requests sharing a long prefix land on one worker and hit its prefix cache, and a worker
//! stopped with SIGSTOP mid-run costs the clients no error and takes requests again after
//! SIGCONT. Needs vllm-router (PyPI) in `KILN_TEST_ROUTER_DIR` (CI installs it there); skips
//! without it unless `KILN_REQUIRE_ROUTER` is set.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_tests::{model_file, required, SMOLLM2};

/// The `kiln` binary cargo built beside this test (`target/<profile>/kiln`).
fn kiln_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("kiln");
    bin.is_file().then_some(bin)
}

#[test]
fn three_workers_behind_vllm_router_spread_keep_prefixes_and_survive_a_stopped_worker() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var_os("KILN_TEST_ROUTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/vllm-router"));
    let router = dir.join("bin/vllm-router");
    let Some(model) = model_file(SMOLLM2) else {
        return;
    };
    if !router.is_file() {
        assert!(
            !required("ROUTER"),
            "KILN_REQUIRE_ROUTER is set but {} is missing",
            router.display()
        );
        println!("skipping: no vllm-router in {}", dir.display());
        return;
    }
    let kiln = kiln_binary().expect("the kiln binary beside the tests (cargo builds it)");
    // A base port below the kernel's ephemeral range (32768 up), where the connections of the
    // tests running beside this one do not land, with the next three free as well; the script
    // moves a process whose port is taken all the same.
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let base = (0..64u64)
        .map(|i| 20_000 + ((seed.wrapping_mul(2_654_435_761).wrapping_add(i * 97)) % 12_000) as u16)
        .find(|&b| (b..b + 4).all(free))
        .expect("four free ports in 20000..32004");
    let out = Command::new("bash")
        .arg(root.join("scripts/cluster.sh"))
        .env("KILN", &kiln)
        .env("MODEL", &model)
        .env("ROUTER_DIR", &dir)
        .env("PORT", base.to_string())
        .env("REQUESTS", "30")
        .env("PREFIX", "10")
        .env("STOPPED", "20")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "scripts/cluster.sh failed:\n{stdout}");
    for phase in ["spread:", "affinity:", "failover:", "rejoin:"] {
        assert!(stdout.contains(phase), "no {phase} line:\n{stdout}");
    }
}
