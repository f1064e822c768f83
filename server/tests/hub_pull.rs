//! `kiln pull org/repo[:…]` and `--model hf:…` against an imitation of the Hugging Face Hub
//! on loopback (no network exists in CI): the endpoints kiln calls — repository info,
//! and `resolve` with byte ranges, commit and ETag headers. The first transfer of a file is
//! cut halfway; the next run must resume from the `.part` file (the server sees the range),
//! verify the SHA-256 and print progress lines. A file whose bytes do not match its ETag is
//! refused and removed. A Hugging Face model directory (the tiny Llama fixture) is pulled
//! and then run from the cache with `--model hf:`.
//!
//! A hostile Hub: ETags and commits that are paths, listings that leave the repository,
//! redirects to `file:` and in circles, bodies longer than announced, and links planted in the
//! cache that lead out of it. Each pull fails with a message saying what was wrong (or, for a
//! link where a file goes, succeeds without writing through it), and nothing outside
//! `HF_HOME` changes. A fuzz loop (`KILN_FUZZ_ITERS`, default 200) runs the pull in process
//! against answers mutated at random and checks the same, and that the token never leaves the
//! endpoint's origin.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

struct File {
    bytes: Vec<u8>,
    /// What the server says the SHA-256 is.
    etag: String,
}

#[derive(Default)]
struct Seen {
    /// Every `Range` of a file transfer (not the metadata probes), by file.
    ranges: HashMap<String, Vec<String>>,
    /// Files whose first transfer was cut.
    cut: Vec<String>,
}

struct Hub {
    repos: HashMap<String, HashMap<String, File>>,
    seen: Mutex<Seen>,
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn respond(
    s: &mut TcpStream,
    status: &str,
    headers: &[(String, String)],
    body: &[u8],
    send: usize,
) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(&body[..send.min(body.len())]);
    let _ = s.flush();
}

fn handle(hub: &Hub, mut s: TcpStream) {
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    // /api/models/{org}/{repo}/revision/main
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let repo = rest.split("/revision/").next().unwrap_or("");
        return match hub.repos.get(repo) {
            Some(files) => {
                let siblings: Vec<_> = files
                    .keys()
                    .map(|f| serde_json::json!({ "rfilename": f }))
                    .collect();
                let body = serde_json::json!({"id": repo, "sha": COMMIT, "siblings": siblings})
                    .to_string();
                respond(
                    &mut s,
                    "200 OK",
                    &[("Content-Type".into(), "application/json".into())],
                    body.as_bytes(),
                    usize::MAX,
                )
            }
            None => respond(
                &mut s,
                "404 Not Found",
                &[],
                b"{\"error\":\"Repository not found\"}",
                usize::MAX,
            ),
        };
    }
    // /{org}/{repo}/resolve/{revision}/{file}: the revision is the commit the listing gave.
    let Some((repo, file)) = path
        .trim_start_matches('/')
        .split_once("/resolve/")
        .and_then(|(r, rest)| {
            let (rev, f) = rest.split_once('/')?;
            (rev == COMMIT || rev == "main").then(|| (r.to_string(), f.to_string()))
        })
    else {
        return respond(&mut s, "404 Not Found", &[], b"", usize::MAX);
    };
    let Some(f) = hub.repos.get(&repo).and_then(|fs| fs.get(&file)) else {
        return respond(&mut s, "404 Not Found", &[], b"", usize::MAX);
    };
    let size = f.bytes.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|a| a.parse::<usize>().ok())
        .unwrap_or(0)
        .min(size);
    let probe = range.as_deref() == Some("bytes=0-0");
    let end = if probe { 1.min(size) } else { size };
    let headers = vec![
        ("X-Repo-Commit".to_string(), COMMIT.to_string()),
        ("X-Linked-Etag".to_string(), format!("\"{}\"", f.etag)),
        ("ETag".to_string(), format!("\"{}\"", f.etag)),
        (
            "Content-Range".to_string(),
            format!("bytes {start}-{}/{size}", end.max(start + 1) - 1),
        ),
    ];
    let mut send = usize::MAX;
    if !probe {
        let mut seen = hub.seen.lock().expect("lock");
        seen.ranges
            .entry(file.clone())
            .or_default()
            .push(range.clone().unwrap_or_default());
        // The first transfer of a big file stops halfway: the connection drops.
        if size > 1000 && !seen.cut.contains(&file) {
            seen.cut.push(file.clone());
            send = (size - start) / 2;
        }
    }
    respond(
        &mut s,
        "206 Partial Content",
        &headers,
        &f.bytes[start..end],
        send,
    );
}

fn serve(hub: Arc<Hub>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let hub = hub.clone();
            std::thread::spawn(move || handle(&hub, s));
        }
    });
    format!("http://{addr}")
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn file(bytes: Vec<u8>) -> File {
    File {
        etag: sha256(&bytes),
        bytes,
    }
}

fn kiln(endpoint: &str, home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", home)
        .env_remove("HF_TOKEN")
        .env("KILN_HOME", home.join("kiln"))
        .output()
        .expect("kiln runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn pull_downloads_resumes_verifies_and_shows_progress() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf/llama");
    let q4 = random_bytes(300_000, 1);
    let mut tiny = HashMap::new();
    tiny.insert("README.md".to_string(), file(b"# tiny\n".to_vec()));
    tiny.insert("tiny-Q4_K_M.gguf".to_string(), file(q4.clone()));
    tiny.insert("tiny-Q8_0.gguf".to_string(), file(random_bytes(5_000, 2)));
    // Bytes that do not hash to the ETag the server gives.
    let mut bad = file(random_bytes(800, 3));
    bad.etag = sha256(b"something else");
    tiny.insert("tiny-Q4_0.gguf".to_string(), bad);
    let mut llama = HashMap::new();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        llama.insert(
            f.to_string(),
            file(std::fs::read(fixtures.join(f)).expect("fixture")),
        );
    }
    // A listing that points outside the cache, and an ETag that is a path.
    let mut evil = HashMap::new();
    evil.insert(
        "../../../escaped.gguf".to_string(),
        file(random_bytes(100, 4)),
    );
    let mut path_etag = file(random_bytes(100, 5));
    path_etag.etag = "../../../../escaped-blob".into();
    let mut etag = HashMap::new();
    etag.insert("x-Q4_K_M.gguf".to_string(), path_etag);
    let hub = Arc::new(Hub {
        repos: HashMap::from([
            ("org/tiny".to_string(), tiny),
            ("org/llama".to_string(), llama),
            ("org/evil".to_string(), evil),
            ("org/etag".to_string(), etag),
        ]),
        seen: Mutex::new(Seen::default()),
    });
    let endpoint = serve(hub.clone());
    let home: PathBuf = std::env::temp_dir().join(format!("kiln-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);

    // Cut halfway, no retries: the run fails and leaves a part file.
    let (ok, _, err) = kiln(
        &endpoint,
        &home,
        &["pull", "org/tiny:Q4_K_M", "--retries", "0"],
    );
    assert!(!ok, "a cut transfer succeeded: {err}");
    let blobs = home.join("hub/models--org--tiny/blobs");
    let part: Vec<_> = std::fs::read_dir(&blobs)
        .expect("blobs")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "part"))
        .collect();
    assert_eq!(part.len(), 1, "no .part file left in {}", blobs.display());
    let have = std::fs::metadata(part[0].path()).expect("part").len();
    assert!(have > 0 && (have as usize) < q4.len(), "{have}");

    // Again: it resumes from there, verifies, and says how far it got.
    let (ok, out, err) = kiln(
        &endpoint,
        &home,
        &["pull", "org/tiny:Q4_K_M", "--retries", "0"],
    );
    assert!(ok, "{err}");
    let got = std::fs::read(&out).expect("pulled file");
    assert!(got == q4, "the pulled bytes differ");
    let ranges = hub.seen.lock().expect("lock").ranges["tiny-Q4_K_M.gguf"].clone();
    assert_eq!(
        ranges.first().map(String::as_str),
        Some("bytes=0-"),
        "{ranges:?}"
    );
    assert_eq!(ranges.last(), Some(&format!("bytes={have}-")), "{ranges:?}");
    assert!(
        err.contains("kiln: downloading tiny-Q4_K_M.gguf: 100%"),
        "{err}"
    );
    eprintln!("resumed from byte {have}: {ranges:?}\n{err}");

    // The default pick is the Q4_K_M; a named quantization or file is taken as named.
    let (ok, out2, err) = kiln(&endpoint, &home, &["pull", "org/tiny"]);
    assert!(ok, "{err}");
    assert!(out2.ends_with("tiny-Q4_K_M.gguf"), "{out2}");
    let (ok, out3, err) = kiln(&endpoint, &home, &["pull", "org/tiny:tiny-Q8_0.gguf"]);
    assert!(ok && out3.ends_with("tiny-Q8_0.gguf"), "{out3} {err}");

    // A file whose bytes do not match the Hub's SHA-256 is refused and removed.
    let (ok, out, err) = kiln(&endpoint, &home, &["pull", "org/tiny:Q4_0"]);
    assert!(!ok, "{out}");
    assert!(err.contains("checksum mismatch"), "{err}");
    // Unknown quantizations and repositories name what there is.
    let (ok, _, err) = kiln(&endpoint, &home, &["pull", "org/tiny:Q2_K"]);
    assert!(!ok && err.contains("tiny-Q8_0.gguf"), "{err}");
    let (ok, _, err) = kiln(&endpoint, &home, &["pull", "org/missing"]);
    assert!(!ok && err.contains("org/missing"), "{err}");

    // Names from the server that would leave the cache are refused; nothing is written
    // outside it.
    let (ok, _, err) = kiln(&endpoint, &home, &["pull", "org/evil"]);
    assert!(!ok, "{err}");
    let (ok, _, err) = kiln(&endpoint, &home, &["pull", "org/etag"]);
    assert!(!ok && err.contains("not an opaque tag"), "{err}");
    let outside = home.parent().expect("temp").join("escaped.gguf");
    assert!(!outside.exists() && !home.join("escaped.gguf").exists());
    assert!(!home.join("escaped-blob").exists());

    // A model directory, then run from the cache by `hf:` name.
    let (ok, dir, err) = kiln(&endpoint, &home, &["pull", "org/llama"]);
    assert!(ok, "{err}");
    assert!(Path::new(&dir).join("config.json").is_file(), "{dir}");
    // (An endpoint nobody answers: the cache alone must do.)
    let (ok, _, err) = kiln(
        "http://127.0.0.1:9",
        &home,
        &[
            "run",
            "--model",
            "hf:org/llama",
            "-n",
            "4",
            "--temp",
            "0",
            "Hello",
        ],
    );
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&home);
}

// ---------------------------------------------------------------------------------------
// A hostile Hub: scripted answers that try to make a pull write outside its cache.

/// A request as the scripted servers see it.
struct Req {
    path: String,
    range: Option<String>,
    auth: Option<String>,
    host: String,
}

type Script = dyn Fn(&Req) -> Vec<u8> + Send + Sync;

/// Reads one request (line and headers) from `s`; `None` when there is none.
fn read_request(s: &TcpStream) -> Option<Req> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let (mut range, mut auth, mut host) = (None, None, String::new());
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let v = v.trim().to_string();
            match k.to_ascii_lowercase().as_str() {
                "range" => range = Some(v),
                "authorization" => auth = Some(v),
                "host" => host = v,
                _ => {}
            }
        }
    }
    Some(Req {
        path,
        range,
        auth,
        host,
    })
}

/// A server on loopback that answers every request with `script`'s bytes, then closes.
fn serve_script(script: Arc<Script>) -> (String, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let script = script.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                if let Some(req) = read_request(&s) {
                    let _ = s.write_all(&script(&req));
                    let _ = s.flush();
                }
                let _ = s.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (format!("http://127.0.0.1:{port}"), port)
}

/// An HTTP answer: `Content-Length` is the body's unless `headers` give one.
fn reply(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let sized = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    let mut h = headers.to_vec();
    if !sized {
        h.push(("Content-Length", body.len().to_string()));
    }
    unsized_reply(status, &h, body)
}

/// An HTTP answer without a `Content-Length` of its own: the body ends with the connection.
fn unsized_reply(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// A repository listing.
fn listing(sha: &str, names: &[&str]) -> Vec<u8> {
    let siblings: Vec<_> = names
        .iter()
        .map(|f| serde_json::json!({ "rfilename": f }))
        .collect();
    let body = serde_json::json!({"id": "org/x", "sha": sha, "siblings": siblings}).to_string();
    reply(
        "200 OK",
        &[("Content-Type", "application/json".into())],
        body.as_bytes(),
    )
}

/// The one file of the scripted repository `org/x`.
const X: &str = "x-Q4_K_M.gguf";

fn x_bytes() -> Vec<u8> {
    random_bytes(4000, 7)
}

/// The honest answer: the listing, and `X` at the pinned commit (from the range asked).
fn honest(r: &Req) -> Vec<u8> {
    if r.path.starts_with("/api/models/") {
        return listing(COMMIT, &[X, "README.md"]);
    }
    if r.path != format!("/org/x/resolve/{COMMIT}/{X}") {
        return reply("404 Not Found", &[], b"");
    }
    let bytes = x_bytes();
    let start = r
        .range
        .as_deref()
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        .min(bytes.len());
    reply(
        "206 Partial Content",
        &[
            ("X-Repo-Commit", COMMIT.into()),
            ("ETag", format!("\"{}\"", sha256(&bytes))),
            (
                "Content-Range",
                format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len()),
            ),
        ],
        &bytes[start..],
    )
}

/// Every entry under `dir` but `skip`: its kind and content (a link's target, a file's
/// SHA-256), links not followed.
fn tree(dir: &Path, skip: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p == skip {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).expect("metadata");
            let what = if m.file_type().is_symlink() {
                format!("link {:?}", std::fs::read_link(&p).expect("link"))
            } else if m.is_dir() {
                todo.push(p.clone());
                "dir".to_string()
            } else {
                format!("file {}", sha256(&std::fs::read(&p).expect("read")))
            };
            out.push((p, what));
        }
    }
    out.sort();
    out
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

/// The bytes of the victim file every case starts with.
const VICTIM: &[u8] = b"the user's own file: do not touch\n";

/// Runs `kiln pull org/x` against `script` (the honest answer where it gives `None`) with
/// `HF_HOME` a fresh folder inside a parent folder that also holds a victim file and a victim
/// folder; `prepare` may plant things in `HF_HOME` first. Checks that the pull fails with a
/// message holding `expect` (or succeeds with the right bytes, for `None`) and that nothing
/// outside `HF_HOME` was created or changed.
fn hostile_case(
    name: &str,
    expect: Option<&str>,
    prepare: impl FnOnce(&Path, &Path),
    script: impl Fn(&Req, &Path) -> Option<Vec<u8>> + Send + Sync + 'static,
) {
    let parent = std::env::temp_dir().join(format!("kiln-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    let home = parent.join("hf-home");
    std::fs::create_dir_all(&home).expect("home");
    let victim = parent.join("victim.txt");
    std::fs::write(&victim, VICTIM).expect("victim");
    std::fs::create_dir_all(parent.join("victim-dir")).expect("victim dir");
    std::fs::write(parent.join("victim-dir/keep.txt"), VICTIM).expect("victim dir file");
    prepare(&home, &parent);
    let before = tree(&parent, &home);
    let p = parent.clone();
    let (endpoint, _) = serve_script(Arc::new(move |r: &Req| {
        script(r, &p).unwrap_or_else(|| honest(r))
    }));
    let (ok, out, err) = kiln(&endpoint, &home, &["pull", "org/x", "--retries", "1"]);
    match expect {
        Some(msg) => {
            assert!(!ok, "{name}: the pull succeeded ({out}): {err}");
            assert!(err.contains(msg), "{name}: expected {msg:?} in: {err}");
        }
        None => {
            assert!(ok, "{name}: {err}");
            assert!(Path::new(&out).starts_with(&home), "{name}: {out}");
            assert!(std::fs::read(&out).expect("pulled") == x_bytes(), "{name}");
        }
    }
    let after = tree(&parent, &home);
    assert_eq!(before, after, "{name}: something outside HF_HOME changed");
    assert_eq!(std::fs::read(&victim).expect("victim"), VICTIM, "{name}");
    assert!(
        std::fs::symlink_metadata(&victim)
            .expect("victim")
            .is_file(),
        "{name}"
    );
    eprintln!("{name}: {}", err.lines().last().unwrap_or(""));
    let _ = std::fs::remove_dir_all(&parent);
}

fn nothing(_: &Path, _: &Path) {}

fn is_file(r: &Req) -> bool {
    r.path.contains("/resolve/")
}

/// An honest file answer with one header replaced.
fn with_header(name: &'static str, value: String) -> Vec<u8> {
    let bytes = x_bytes();
    let mut h = vec![
        ("X-Repo-Commit", COMMIT.to_string()),
        ("ETag", format!("\"{}\"", sha256(&bytes))),
    ];
    h.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
    h.push((name, value));
    reply("200 OK", &h, &bytes)
}

#[test]
fn hostile_hub_answers_are_refused_and_write_nothing_outside_the_cache() {
    hostile_case("etag-dotdot", Some("not an opaque tag"), nothing, |r, _| {
        is_file(r).then(|| with_header("ETag", "\"../../../../x\"".into()))
    });
    hostile_case(
        "etag-absolute",
        Some("not an opaque tag"),
        nothing,
        |r, p| is_file(r).then(|| with_header("ETag", p.join("abs-etag").display().to_string())),
    );
    hostile_case(
        "linked-etag-dotdot",
        Some("not an opaque tag"),
        nothing,
        |r, _| is_file(r).then(|| with_header("X-Linked-Etag", "../../../../blob".into())),
    );
    hostile_case(
        "commit-absolute",
        Some("not a commit id"),
        nothing,
        |r, p| {
            is_file(r).then(|| with_header("X-Repo-Commit", p.join("commit").display().to_string()))
        },
    );
    hostile_case("commit-other", Some("not from"), nothing, |r, _| {
        is_file(r).then(|| {
            with_header(
                "X-Repo-Commit",
                "fedcba9876543210fedcba9876543210fedcba98".into(),
            )
        })
    });
    hostile_case("sha-not-hex", Some("not a commit id"), nothing, |r, _| {
        (!is_file(r)).then(|| listing("../../../../sha", &[X]))
    });
    hostile_case("sha-absolute", Some("not a commit id"), nothing, |r, p| {
        (!is_file(r)).then(|| listing(&p.join("sha").display().to_string(), &[X]))
    });
    hostile_case("sibling-dotdot", Some("not a relative"), nothing, |r, _| {
        (!is_file(r)).then(|| listing(COMMIT, &[X, "../../../escaped.gguf"]))
    });
    hostile_case(
        "sibling-absolute",
        Some("not a relative"),
        nothing,
        |r, p| (!is_file(r)).then(|| listing(COMMIT, &[&p.join("abs.gguf").display().to_string()])),
    );
    hostile_case(
        "sibling-control",
        Some("control characters"),
        nothing,
        |r, _| (!is_file(r)).then(|| listing(COMMIT, &[X, "a\nb.gguf"])),
    );
    hostile_case(
        "redirect-file",
        Some("not an http(s) URL"),
        nothing,
        |r, _| {
            is_file(r).then(|| {
                reply(
                    "302 Found",
                    &[("Location", "file:///etc/passwd".into())],
                    b"",
                )
            })
        },
    );
    hostile_case(
        "redirect-loop",
        Some("more than 5 redirects"),
        nothing,
        |r, _| is_file(r).then(|| reply("302 Found", &[("Location", r.path.clone())], b"")),
    );
    hostile_case(
        "info-redirect-loop",
        Some("more than 5 redirects"),
        nothing,
        |r, _| {
            (!is_file(r)).then(|| {
                reply(
                    "307 Temporary Redirect",
                    &[("Location", "./main".into())],
                    b"",
                )
            })
        },
    );
    // Longer than the size the Hub announced (X-Linked-Size), with and without a length.
    type Reply = fn(&str, &[(&str, String)], &[u8]) -> Vec<u8>;
    for (name, expect, send) in [
        (
            "body-over-linked-size",
            "more than the 100 bytes",
            reply as Reply,
        ),
        (
            "body-unsized-over-linked-size",
            "sent more than the 100 bytes",
            unsized_reply as Reply,
        ),
    ] {
        hostile_case(name, Some(expect), nothing, move |r, _| {
            is_file(r).then(|| {
                let body = random_bytes(200, 9);
                send(
                    "200 OK",
                    &[
                        ("X-Repo-Commit", COMMIT.into()),
                        ("ETag", format!("\"{}\"", sha256(&body))),
                        ("X-Linked-Size", "100".into()),
                    ],
                    &body,
                )
            })
        });
    }
    // A body longer than its Content-Length: the bytes past it are not the file, and what
    // the length holds does not match the ETag's SHA-256.
    hostile_case(
        "body-over-content-length",
        Some("checksum mismatch"),
        nothing,
        |r, _| {
            is_file(r).then(|| {
                let body = random_bytes(200, 9);
                reply(
                    "200 OK",
                    &[
                        ("X-Repo-Commit", COMMIT.into()),
                        ("ETag", format!("\"{}\"", sha256(&body))),
                        ("Content-Length", "100".into()),
                    ],
                    &body,
                )
            })
        },
    );
    // Links planted in the cache that lead out of it.
    #[cfg(unix)]
    {
        let repo = |home: &Path| home.join("hub/models--org--x");
        hostile_case(
            "blobs-link-out",
            Some("leads out of the cache"),
            |home, parent| {
                std::fs::create_dir_all(repo(home)).expect("repo");
                symlink(&parent.join("victim-dir"), &repo(home).join("blobs"));
            },
            |_, _| None,
        );
        hostile_case(
            "snapshots-link-out",
            Some("leads out of the cache"),
            |home, parent| {
                std::fs::create_dir_all(repo(home)).expect("repo");
                symlink(&parent.join("victim-dir"), &repo(home).join("snapshots"));
            },
            |_, _| None,
        );
        hostile_case(
            "repo-link-out",
            Some("leads out of the cache"),
            |home, parent| {
                std::fs::create_dir_all(home.join("hub")).expect("hub");
                symlink(&parent.join("victim-dir"), &repo(home));
            },
            |_, _| None,
        );
        // Links to the victim file where kiln writes files: replaced, never written through.
        let etag = sha256(&x_bytes());
        for (name, at) in [
            ("part-link", format!("blobs/{etag}.part")),
            ("blob-link", format!("blobs/{etag}")),
            ("snapshot-link", format!("snapshots/{COMMIT}/{X}")),
            ("ref-link", "refs/main".to_string()),
        ] {
            hostile_case(
                name,
                None,
                |home, parent| {
                    let p = repo(home).join(&at);
                    std::fs::create_dir_all(p.parent().expect("parent")).expect("dirs");
                    symlink(&parent.join("victim.txt"), &p);
                },
                |_, _| None,
            );
        }
    }
}

/// The token goes to the endpoint's origin, never with a redirect elsewhere.
#[test]
fn the_token_stays_with_the_endpoint() {
    // (host, path, authorization) of every request.
    type Requests = Vec<(String, String, Option<String>)>;
    let seen: Arc<Mutex<Requests>> = Arc::default();
    let port = Arc::new(Mutex::new(0u16));
    let (s2, p2) = (seen.clone(), port.clone());
    let (endpoint, p) = serve_script(Arc::new(move |r: &Req| {
        s2.lock()
            .expect("lock")
            .push((r.host.clone(), r.path.clone(), r.auth.clone()));
        if r.path.starts_with(&format!("/org/x/resolve/{COMMIT}/")) {
            let bytes = x_bytes();
            let port = *p2.lock().expect("lock");
            return reply(
                "302 Found",
                &[
                    ("X-Repo-Commit", COMMIT.into()),
                    ("X-Linked-Etag", format!("\"{}\"", sha256(&bytes))),
                    ("X-Linked-Size", bytes.len().to_string()),
                    ("Location", format!("http://localhost:{port}/cdn/{X}")),
                ],
                b"",
            );
        }
        if r.path.starts_with("/cdn/") {
            return reply("200 OK", &[("ETag", "\"cdn-etag\"".into())], &x_bytes());
        }
        honest(r)
    }));
    *port.lock().expect("lock") = p;
    let base = std::env::temp_dir().join(format!("kiln-hub-token-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let cfg = kiln_server::hub::HubConfig {
        endpoint,
        token: Some("hf_secret".into()),
        cache: base.join("hub"),
        retry_wait: std::time::Duration::from_millis(1),
    };
    let spec = kiln_server::hub::HubSpec::parse("org/x").expect("spec");
    let opts = kiln_server::hub::PullOptions {
        retries: 0,
        bar: Some(false),
    };
    let path = kiln_server::hub::pull(&cfg, &spec, &opts).expect("pull");
    assert!(std::fs::read(&path).expect("file") == x_bytes());
    // The blob is named by the Hub's ETag (the SHA-256), not the CDN's.
    assert!(base
        .join("hub/models--org--x/blobs")
        .join(sha256(&x_bytes()))
        .is_file());
    let seen = seen.lock().expect("lock");
    assert!(seen.len() >= 3, "{seen:?}");
    for (host, path, auth) in seen.iter() {
        if host.starts_with("localhost") {
            assert_eq!(auth, &None, "the token went to {host}{path}");
        } else {
            assert_eq!(auth.as_deref(), Some("Bearer hf_secret"), "{host}{path}");
        }
    }
    assert!(seen.iter().any(|(h, _, _)| h.starts_with("localhost")));
    let _ = std::fs::remove_dir_all(&base);
}

// ---------------------------------------------------------------------------------------
// Fuzzing: a Hub that answers at random, the pull run in process.

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
        let start = r
            .range
            .as_deref()
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            .min(len);
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
