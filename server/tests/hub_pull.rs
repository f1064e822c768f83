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
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[path = "hub/common.rs"]
mod common;

use common::*;

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
