//! `kiln pull org/repo[:…]` and `--model hf:…` against an imitation of the Hugging Face Hub
//! on loopback (no network exists in CI): the endpoints `hf-hub` calls — repository info,
//! and `resolve` with byte ranges, commit and ETag headers. The first transfer of a file is
//! cut halfway; the next run must resume from the `.part` file (the server sees the range),
//! verify the SHA-256 and print progress lines. A file whose bytes do not match its ETag is
//! refused and removed. A Hugging Face model directory (the tiny Llama fixture) is pulled
//! and then run from the cache with `--model hf:`.

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
    // /{org}/{repo}/resolve/main/{file}
    let Some((repo, file)) = path
        .trim_start_matches('/')
        .split_once("/resolve/main/")
        .map(|(r, f)| (r.to_string(), f.to_string()))
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
    assert!(!ok && err.contains("not a plain name"), "{err}");
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
