//! The fuzz loop of the Hub tests: a Hub that answers at random, the pull run in process
//! (`KILN_FUZZ_ITERS`, default 200; `KILN_FUZZ_FROM` continues a run). Nothing outside `HF_HOME`
//! may change and the token must never leave the endpoint's origin.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[path = "hub/common.rs"]
mod common;

use common::*;

/// splitmix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b"0123456789abcdef"[self.below(16)]))
            .collect()
    }
}

struct FuzzFile {
    name: &'static str,
    bytes: Vec<u8>,
    sha: String,
}

struct FuzzHub {
    rng: Mutex<Rng>,
    files: Vec<FuzzFile>,
    port: std::sync::OnceLock<u16>,
    outside: PathBuf,
    /// Requests to another host than the endpoint's that carried the token.
    leaks: Mutex<Vec<String>>,
    /// How often an answer strays from the honest one, in percent of the full rate: some
    /// iterations are wild, some nearly honest (so that downloads also complete, resume and
    /// link).
    wildness: std::sync::atomic::AtomicUsize,
}

impl FuzzHub {
    /// Whether to stray, `percent` of the time at full wildness.
    fn odd(&self, rng: &mut Rng, percent: usize) -> bool {
        let w = self.wildness.load(std::sync::atomic::Ordering::Relaxed);
        rng.below(100 * 100) < percent * w
    }

    fn port(&self) -> u16 {
        self.port.get().copied().unwrap_or(1)
    }

    /// A value meant to escape: paths, separators, NUL, long strings, and valid ones.
    fn wild(&self, rng: &mut Rng) -> String {
        match rng.below(21) {
            0 => "../../../../outside/x".into(),
            1 => self.outside.join("abs").display().to_string(),
            2 => "..\\..\\..\\..\\outside\\x".into(),
            3 => "a\0b".into(),
            4 => "W/\"../x\"".into(),
            5 => "\"\"".into(),
            6 => String::new(),
            7 => "x".repeat(129),
            8 => {
                let n = rng.below(20_000);
                "y".repeat(n)
            }
            9 => rng.hex(40),
            10 => rng.hex(64),
            11 => COMMIT.into(),
            12 => "..".into(),
            13 => "/".into(),
            14 => "%2e%2e/%2e%2e/outside".into(),
            15 => "C:\\outside".into(),
            16 => "\u{e9}\u{202e}".into(),
            17 => format!("{}/../../../outside", rng.hex(40)),
            18 => "x\r\nX-Repo-Commit: ../../outside".into(),
            19 => "\\\\server\\share".into(),
            _ => {
                let n = 1 + rng.below(30);
                rng.hex(n)
            }
        }
    }

    fn location(&self, rng: &mut Rng, here: &str, file: &str) -> String {
        let port = self.port();
        match rng.below(12) {
            0 => format!("/cdn/{file}"),
            1 => format!("http://127.0.0.1:{port}/cdn/{file}"),
            2 => format!("http://localhost:{port}/cdn/{file}"),
            3 => here.to_string(),
            4 => "file:///etc/passwd".into(),
            5 => "ftp://127.0.0.1/x".into(),
            6 => format!("//localhost:{port}/cdn/{file}"),
            7 => String::new(),
            8 => self.wild(rng),
            9 => "http://127.0.0.1:1/x".into(),
            10 => format!("cdn/../../../{file}"),
            _ => format!("http://localhost:{port}/cdn/{file}?sig={}", rng.hex(8)),
        }
    }

    fn answer(&self, r: &Req) -> Vec<u8> {
        if r.auth.is_some() && !r.host.starts_with("127.0.0.1") {
            self.leaks
                .lock()
                .expect("lock")
                .push(format!("{}{}", r.host, r.path));
        }
        let mut rng = self.rng.lock().expect("lock");
        if r.path.starts_with("/api/models/") {
            self.info(&mut rng, r)
        } else {
            self.file(&mut rng, r)
        }
    }

    fn info(&self, rng: &mut Rng, r: &Req) -> Vec<u8> {
        let pick = if self.odd(rng, 35) { rng.below(7) } else { 7 };
        match pick {
            0 => reply("404 Not Found", &[], b"{}"),
            1 => reply("500 Internal Server Error", &[], b""),
            2 => reply("200 OK", &[], b"not json"),
            3 => {
                let loc = self.location(rng, &r.path, "x");
                reply("302 Found", &[("Location", loc)], b"")
            }
            4 => reply("200 OK", &[], br#"{"sha": 5, "siblings": "x"}"#),
            5 if rng.chance(20) => {
                let names = vec!["a"; 100_001];
                listing(COMMIT, &names)
            }
            6 => {
                let n = rng.below(300);
                random_bytes(n, rng.next())
            }
            _ => {
                let sha = if self.odd(rng, 25) {
                    self.wild(rng)
                } else {
                    COMMIT.to_string()
                };
                let mut names: Vec<String> = Vec::new();
                for f in &self.files {
                    if !self.odd(rng, 15) {
                        names.push(f.name.to_string());
                    }
                }
                if self.odd(rng, 15) {
                    names.push(self.wild(rng));
                }
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                listing(&sha, &names)
            }
        }
    }

    fn file(&self, rng: &mut Rng, r: &Req) -> Vec<u8> {
        let path = r.path.split('?').next().unwrap_or("");
        let Some(f) = self.files.iter().find(|f| path.ends_with(f.name)) else {
            return reply("404 Not Found", &[], b"");
        };
        let len = f.bytes.len();
        let start = range_start(r, len);
        let mut h: Vec<(&str, String)> = Vec::new();
        if self.odd(rng, 20) {
            if rng.chance(50) {
                h.push(("X-Repo-Commit", self.wild(rng)));
            }
        } else {
            h.push(("X-Repo-Commit", COMMIT.into()));
        }
        let etag = if self.odd(rng, 15) {
            self.wild(rng)
        } else {
            f.sha.clone()
        };
        let etag = match rng.below(4) {
            0 => format!("W/\"{etag}\""),
            1 => etag,
            _ => format!("\"{etag}\""),
        };
        h.push((
            if rng.chance(50) {
                "X-Linked-Etag"
            } else {
                "ETag"
            },
            etag,
        ));
        if rng.chance(30) {
            let size = match if self.odd(rng, 60) { rng.below(3) } else { 3 } {
                0 => "abc".to_string(),
                1 => (len + rng.below(100)).to_string(),
                2 => rng.below(len + 1).to_string(),
                _ => len.to_string(),
            };
            h.push(("X-Linked-Size", size));
        }
        // Redirects (30), error statuses (10), garbage (5), nothing (3), or the bytes.
        let kind = if self.odd(rng, 48) {
            rng.below(48)
        } else if rng.chance(20) {
            0
        } else {
            48
        };
        if kind < 30 {
            let status = *rng.pick(&[
                "301 Moved Permanently",
                "302 Found",
                "303 See Other",
                "307 Temporary Redirect",
                "308 Permanent Redirect",
            ]);
            if !self.odd(rng, 5) {
                let loc = if self.odd(rng, 60) {
                    self.location(rng, &r.path, f.name)
                } else {
                    format!("http://localhost:{}/cdn/{}", self.port(), f.name)
                };
                h.push(("Location", loc));
            }
            return reply(status, &h, b"");
        }
        if kind < 40 {
            let status = *rng.pick(&[
                "404 Not Found",
                "403 Forbidden",
                "416 Range Not Satisfiable",
                "500 Internal Server Error",
                "503 Service Unavailable",
                "300 Multiple Choices",
                "304 Not Modified",
                "204 No Content",
                "100 Continue",
            ]);
            return reply(status, &h, b"");
        }
        if kind < 45 {
            let n = rng.below(500);
            return random_bytes(n, rng.next());
        }
        if kind < 48 {
            return Vec::new();
        }
        let mut body = f.bytes[start..].to_vec();
        match if self.odd(rng, 35) { rng.below(4) } else { 4 } {
            0 => {
                let n = rng.below(body.len() + 1);
                body.truncate(n);
            }
            1 => {
                let n = 1 + rng.below(5000);
                body.extend(random_bytes(n, rng.next()));
            }
            2 => body = random_bytes(body.len(), rng.next()),
            3 => body = f.bytes.clone(),
            _ => {}
        }
        let status = if r.range.is_some() && rng.chance(85) {
            let cr = match if self.odd(rng, 30) { rng.below(3) } else { 3 } {
                0 => self.wild(rng),
                1 => format!("bytes {}-{}/{len}", rng.below(len), len - 1),
                2 => format!("bytes {start}-{}/*", len - 1),
                _ => format!("bytes {start}-{}/{len}", len.max(start + 1) - 1),
            };
            h.push(("Content-Range", cr));
            "206 Partial Content"
        } else {
            "200 OK"
        };
        match if self.odd(rng, 30) { rng.below(3) } else { 3 } {
            0 => unsized_reply(status, &h, &body),
            1 => {
                h.push(("Content-Length", rng.below(2 * len + 1).to_string()));
                reply(status, &h, &body)
            }
            2 => {
                h.push(("Content-Length", "abc".into()));
                reply(status, &h, &body)
            }
            _ => reply(status, &h, &body),
        }
    }
}

/// `p` with `.` and `..` worked out, without asking the file system.
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Nothing appeared next to the cache or in the `outside` folder, the victim file is
/// untouched, and every link in the cache stays in it (but those the test planted).
fn check_outside(base: &Path, cache: &Path, planted: &[(PathBuf, PathBuf)], i: u64) {
    let mut names: Vec<String> = std::fs::read_dir(base)
        .expect("base")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    for n in &names {
        assert!(
            ["hf", "outside", "victim.txt"].contains(&n.as_str()),
            "iteration {i}: {n} appeared beside the cache"
        );
    }
    let outside: Vec<_> = std::fs::read_dir(base.join("outside"))
        .expect("outside")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        outside.is_empty(),
        "iteration {i}: written outside: {outside:?}"
    );
    let victim = base.join("victim.txt");
    assert!(
        std::fs::symlink_metadata(&victim)
            .expect("victim")
            .is_file(),
        "iteration {i}: the victim was replaced"
    );
    assert_eq!(
        std::fs::read(&victim).expect("victim"),
        VICTIM,
        "iteration {i}: the victim changed"
    );
    let mut todo = vec![base.join("hf")];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).expect("metadata");
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).expect("link");
                if t.is_absolute() {
                    assert!(
                        planted.contains(&(p.clone(), t.clone())),
                        "iteration {i}: {} links to {}",
                        p.display(),
                        t.display()
                    );
                } else {
                    let to = lexical(&p.parent().expect("parent").join(&t));
                    assert!(
                        to.starts_with(cache),
                        "iteration {i}: {} links out to {}",
                        p.display(),
                        t.display()
                    );
                }
            } else if m.is_dir() {
                todo.push(p);
            }
        }
    }
}

/// Plants a link inside the cache that leads out of it (to the `outside` folder or the
/// victim file) where kiln would create a folder or a file.
#[cfg(unix)]
fn plant(rng: &mut Rng, base: &Path, cache: &Path, files: &[FuzzFile]) -> (PathBuf, PathBuf) {
    let repo = cache.join("models--org--fuzz");
    let (outside, victim) = (base.join("outside"), base.join("victim.txt"));
    let f = rng.pick(files);
    let (at, to) = match rng.below(8) {
        0 => (repo.join("blobs"), outside),
        1 => (repo.join("snapshots"), outside),
        2 => (repo.join("refs"), outside),
        3 => (repo.join("refs/main"), victim),
        4 => (repo.join(format!("blobs/{}.part", f.sha)), victim),
        5 => (repo.join(format!("blobs/{}", f.sha)), victim),
        6 => (repo.join(format!("snapshots/{COMMIT}/{}", f.name)), victim),
        _ => (repo.clone(), outside),
    };
    std::fs::create_dir_all(at.parent().expect("parent")).expect("dirs");
    match std::fs::symlink_metadata(&at) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at).expect("remove"),
        Ok(_) => std::fs::remove_file(&at).expect("remove"),
        Err(_) => {}
    }
    symlink(&to, &at);
    (at, to)
}

#[test]
fn hostile_hub_responses_write_nothing_outside_the_cache() {
    use kiln_server::hub::{pull, HubConfig, HubSpec, PullOptions};
    let iters: u64 = std::env::var("KILN_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // `KILN_FUZZ_FROM` continues an earlier run: iteration i's inputs depend only on i.
    let from: u64 = std::env::var("KILN_FUZZ_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let base = std::env::temp_dir().join(format!("kiln-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("outside")).expect("outside");
    std::fs::write(base.join("victim.txt"), VICTIM).expect("victim");
    let cache = base.join("hf/hub");
    let mut sizes = Rng(99);
    let files: Vec<FuzzFile> = [
        "m-Q4_K_M.gguf",
        "m-Q8_0.gguf",
        "sub/dir/m-Q5_K_M.gguf",
        "config.json",
    ]
    .iter()
    .enumerate()
    .map(|(k, name)| {
        let bytes = random_bytes(1 + sizes.below(20_000), k as u64 + 11);
        FuzzFile {
            name,
            sha: sha256(&bytes),
            bytes,
        }
    })
    .collect();
    let plant_files: Vec<FuzzFile> = files
        .iter()
        .map(|f| FuzzFile {
            name: f.name,
            bytes: Vec::new(),
            sha: f.sha.clone(),
        })
        .collect();
    let hub = Arc::new(FuzzHub {
        rng: Mutex::new(Rng(0)),
        files,
        port: std::sync::OnceLock::new(),
        outside: base.join("outside"),
        leaks: Mutex::default(),
        wildness: 100.into(),
    });
    let h2 = hub.clone();
    let (endpoint, port) = serve_script(Arc::new(move |r: &Req| h2.answer(r)));
    let _ = hub.port.set(port);
    let cfg = HubConfig {
        endpoint,
        token: Some("hf_fuzz".into()),
        cache: cache.clone(),
        retry_wait: std::time::Duration::ZERO,
    };
    let t0 = std::time::Instant::now();
    let (mut pulled, mut refused) = (0, 0);
    let mut planted: Vec<(PathBuf, PathBuf)> = Vec::new();
    for i in from..from.saturating_add(iters) {
        let mut rng = Rng(i ^ 0x5EED_0000);
        *hub.rng.lock().expect("lock") = Rng(i.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 1);
        let wildness = *rng.pick(&[100, 100, 50, 20, 5]);
        hub.wildness
            .store(wildness, std::sync::atomic::Ordering::Relaxed);
        if i % 8 == 0 || !planted.is_empty() {
            let _ = std::fs::remove_dir_all(base.join("hf"));
            planted.clear();
        }
        #[cfg(unix)]
        if rng.chance(30) {
            planted.push(plant(&mut rng, &base, &cache, &plant_files));
        }
        let spec = *rng.pick(&[
            "org/fuzz",
            "org/fuzz:Q8_0",
            "org/fuzz:sub/dir/m-Q5_K_M.gguf",
        ]);
        let spec = HubSpec::parse(spec).expect("spec");
        let opts = PullOptions {
            retries: rng.below(3),
            bar: Some(false),
        };
        let got =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pull(&cfg, &spec, &opts)));
        match got {
            Err(_) => panic!("iteration {i}: the pull panicked"),
            Ok(Ok(p)) => {
                pulled += 1;
                assert!(p.starts_with(&cache), "iteration {i}: {}", p.display());
                let real = std::fs::canonicalize(&p).expect("pulled file");
                let real_cache = std::fs::canonicalize(&cache).expect("cache");
                assert!(
                    real.starts_with(&real_cache),
                    "iteration {i}: {} is {}",
                    p.display(),
                    real.display()
                );
            }
            Ok(Err(_)) => refused += 1,
        }
        check_outside(&base, &cache, &planted, i);
        if (i + 1 - from) % 20_000 == 0 {
            eprintln!(
                "{} iterations (to {}) in {:.0?}: {pulled} pulls succeeded, {refused} failed",
                i + 1 - from,
                i + 1,
                t0.elapsed()
            );
        }
    }
    let leaks = hub.leaks.lock().expect("lock").clone();
    assert!(leaks.is_empty(), "the token went elsewhere: {leaks:?}");
    eprintln!(
        "{iters} iterations in {:.2?}: {pulled} pulls succeeded, {refused} failed",
        t0.elapsed()
    );
    assert!(iters < 50 || pulled > 0, "no pull ever succeeded");
    let _ = std::fs::remove_dir_all(&base);
}
