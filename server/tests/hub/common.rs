//! What the Hub tests share: an imitation Hub on loopback (honest or scripted), the
//! `kiln` binary run against it, and the files and trees they compare.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub struct File {
    pub bytes: Vec<u8>,
    /// What the server says the SHA-256 is.
    pub etag: String,
}

#[derive(Default)]
pub struct Seen {
    /// Every `Range` of a file transfer (not the metadata probes), by file.
    pub ranges: HashMap<String, Vec<String>>,
    /// Files whose first transfer was cut.
    pub cut: Vec<String>,
}

pub struct Hub {
    pub repos: HashMap<String, HashMap<String, File>>,
    pub seen: Mutex<Seen>,
}

pub fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

pub fn respond(
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

pub fn handle(hub: &Hub, mut s: TcpStream) {
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

pub fn serve(hub: Arc<Hub>) -> String {
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

pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
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

pub fn file(bytes: Vec<u8>) -> File {
    File {
        etag: sha256(&bytes),
        bytes,
    }
}

pub fn kiln(endpoint: &str, home: &Path, args: &[&str]) -> (bool, String, String) {
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

// ---------------------------------------------------------------------------------------
// A hostile Hub: scripted answers that try to make a pull write outside its cache.

/// A request as the scripted servers see it.
pub struct Req {
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
    pub host: String,
}

pub type Script = dyn Fn(&Req) -> Vec<u8> + Send + Sync;

/// Reads one request (line and headers) from `s`; `None` when there is none.
pub fn read_request(s: &TcpStream) -> Option<Req> {
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
pub fn serve_script(script: Arc<Script>) -> (String, u16) {
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
pub fn reply(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
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
pub fn unsized_reply(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
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
pub fn listing(sha: &str, names: &[&str]) -> Vec<u8> {
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
pub const X: &str = "x-Q4_K_M.gguf";

pub fn x_bytes() -> Vec<u8> {
    random_bytes(4000, 7)
}

/// The honest answer: the listing, and `X` at the pinned commit (from the range asked).
pub fn honest(r: &Req) -> Vec<u8> {
    if r.path.starts_with("/api/models/") {
        return listing(COMMIT, &[X, "README.md"]);
    }
    if r.path != format!("/org/x/resolve/{COMMIT}/{X}") {
        return reply("404 Not Found", &[], b"");
    }
    let bytes = x_bytes();
    let start = range_start(r, bytes.len());
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
pub fn tree(dir: &Path, skip: &Path) -> Vec<(PathBuf, String)> {
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
pub fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

/// The bytes of the victim file every case starts with.
pub const VICTIM: &[u8] = b"the user's own file: do not touch\n";

/// Runs `kiln pull org/x` against `script` (the honest answer where it gives `None`) with
/// `HF_HOME` a fresh folder inside a parent folder that also holds a victim file and a victim
/// folder; `prepare` may plant things in `HF_HOME` first. Checks that the pull fails with a
/// message holding `expect` (or succeeds with the right bytes, for `None`) and that nothing
/// outside `HF_HOME` was created or changed.
pub fn hostile_case(
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

pub fn nothing(_: &Path, _: &Path) {}

pub fn is_file(r: &Req) -> bool {
    r.path.contains("/resolve/")
}

/// An honest file answer with one header replaced.
pub fn with_header(name: &'static str, value: String) -> Vec<u8> {
    let bytes = x_bytes();
    let mut h = vec![
        ("X-Repo-Commit", COMMIT.to_string()),
        ("ETag", format!("\"{}\"", sha256(&bytes))),
    ];
    h.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
    h.push((name, value));
    reply("200 OK", &h, &bytes)
}

// ---------------------------------------------------------------------------------------
// Fuzzing: a Hub that answers at random, the pull run in process.

/// Where a request's `Range: bytes=N-` starts (0 without one), at most `len`.
pub fn range_start(r: &Req, len: usize) -> usize {
    r.range
        .as_deref()
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        .min(len)
}
