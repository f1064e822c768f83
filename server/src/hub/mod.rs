//! Models from the Hugging Face Hub: `kiln pull org/repo[:file-or-quant]` and
//! `--model hf:org/repo[:…]`, into the standard Hugging Face cache (`HF_HUB_CACHE`, else
//! `HF_HOME/hub`, default `~/.cache/huggingface/hub`), from `HF_ENDPOINT` (default the Hub)
//! with `HF_TOKEN` (or the token file under `HF_HOME`) for gated repositories.
//!
//! What is fetched: a `.gguf` file named after the colon, or the GGUF whose name holds the
//! quantization named (`:Q4_K_M`); without one, the repository's only GGUF or its Q4_K_M; a
//! repository without GGUFs is a Hugging Face model directory (config, tokenizer, safetensors).
//! Downloads resume where an interrupted one stopped (the `.part` file in the cache), are
//! checked against the SHA-256 the Hub gives for large files, and show a progress bar on a
//! terminal (plain lines otherwise).
//!
//! The server is not trusted with the local file system. Everything it names is checked
//! before it becomes part of a path, and refused rather than cleaned up: the commit is 40 hex
//! digits, an ETag an opaque tag (`[A-Za-z0-9-]`, at most 128), a file name a relative,
//! normalized path. The revision is pinned once (the listing's `sha`) and every file is asked
//! for at that commit; the ETag that names a blob comes from the answer that delivers (or
//! redirects to) its bytes. Redirects are followed by hand (at most 5, http and https only;
//! the token goes to the endpoint's origin alone), bodies are held to the size announced,
//! and nothing is written through a link that leads out of the cache. The layout is the one
//! `huggingface_hub` uses: `models--org--repo/{blobs/<etag>, snapshots/<commit>/<file> (a
//! relative link to the blob), refs/main}`.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use url::Url;

mod fs;
mod http;
mod progress;
use fs::*;
use http::*;
use progress::*;

/// The Hub itself.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// The largest repository listing read.
const MAX_INFO_BYTES: u64 = 16 << 20;
/// The most files a listing may name.
const MAX_SIBLINGS: usize = 100_000;
/// The longest file name taken from a listing, and the longest part of one.
const MAX_NAME_BYTES: usize = 1024;
const MAX_COMPONENT_BYTES: usize = 255;
/// The largest token file read.
const MAX_TOKEN_BYTES: u64 = 4096;
/// The longest wait between two tries.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);

/// A parsed `org/repo[:selector]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubSpec {
    pub repo: String,
    /// A file name (`….gguf`) or a quantization (`Q4_K_M`).
    pub select: Option<String>,
}

impl HubSpec {
    /// `org/repo`, `org/repo:Q4_K_M` or `org/repo:file.gguf` (an `hf:` prefix is allowed).
    pub fn parse(s: &str) -> Result<HubSpec> {
        let s = s.strip_prefix("hf:").unwrap_or(s);
        let (repo, select) = match s.split_once(':') {
            Some((r, sel)) => (r, Some(sel.to_string()).filter(|x| !x.is_empty())),
            None => (s, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if parts.len() != 2 || !parts.iter().all(|p| ok(p)) {
            bail!("{s:?} is not a Hub repository: expected org/repo[:file-or-quant]");
        }
        if let Some(sel) = &select {
            if sel.contains("..") || sel.starts_with('/') {
                bail!("{sel:?} is not a file in the repository");
            }
        }
        Ok(HubSpec {
            repo: repo.to_string(),
            select,
        })
    }

    /// The repository's folder in the cache, `models--org--repo`.
    fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

/// How a pull reports and retries.
#[derive(Clone, Debug)]
pub struct PullOptions {
    /// Retries of a failed transfer within one run (each resumes where the last stopped).
    pub retries: usize,
    /// A progress bar (on a terminal) or plain lines; `None`: decide by stderr.
    pub bar: Option<bool>,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            retries: 3,
            bar: None,
        }
    }
}

/// Where a pull comes from and goes to. [`HubConfig::from_env`] reads what the Hugging Face
/// tools read; tests build one by hand.
#[derive(Clone)]
pub struct HubConfig {
    /// The server, `https://huggingface.co` or `HF_ENDPOINT` (no trailing `/`).
    pub endpoint: String,
    /// Sent as `Authorization: Bearer …`, to the endpoint's origin only.
    pub token: Option<String>,
    /// The cache root, the folder holding `models--org--repo`.
    pub cache: PathBuf,
    /// The first wait before a retry (doubled each time, at most 10 s).
    pub retry_wait: Duration,
}

impl std::fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("cache", &self.cache)
            .field("retry_wait", &self.retry_wait)
            .finish()
    }
}

impl HubConfig {
    /// The endpoint from `HF_ENDPOINT`; the cache root from `HF_HUB_CACHE`, else
    /// `HF_HOME/hub`, else `~/.cache/huggingface/hub`; the token from `HF_TOKEN`, else the
    /// `token` file under `HF_HOME` (as `huggingface-cli login` leaves it).
    pub fn from_env() -> Result<HubConfig> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let home = var("HOME").or_else(|| var("USERPROFILE"));
        let hf_home = var("HF_HOME").or_else(|| home.map(|h| h.join(".cache").join("huggingface")));
        let cache = var("HF_HUB_CACHE")
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .context("no place for the Hugging Face cache: set HF_HOME (or HF_HUB_CACHE)")?;
        let token = std::env::var("HF_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .or_else(|| hf_home.and_then(|h| read_token(&h.join("token"))));
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        Ok(HubConfig {
            endpoint,
            token,
            cache,
            retry_wait: Duration::from_millis(300),
        })
    }
}

/// The token file's content, trimmed; nothing when it is missing, empty, not text or too
/// large to be a token.
fn read_token(path: &Path) -> Option<String> {
    let f = File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_TOKEN_BYTES + 1).read_to_end(&mut buf).ok()?;
    if buf.len() as u64 > MAX_TOKEN_BYTES {
        tracing::warn!("{} is too large to be a token; ignored", path.display());
        return None;
    }
    let t = String::from_utf8(buf).ok()?.trim().to_string();
    (!t.is_empty()).then_some(t)
}

/// A server-given string as it appears in a message: quoted, escaped, at most 100 characters.
fn shown(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{:?}…", &s[..i]),
        None => format!("{s:?}"),
    }
}

/// A repository in the cache, at the pinned commit.
struct Snapshot<'a> {
    root: &'a Path,
    /// `org/repo`.
    repo: &'a str,
    /// `models--org--repo`.
    folder: String,
    commit: String,
}

/// What the Hub's own answer about a file says (the answer that serves its bytes or
/// redirects to where they are).
struct Meta {
    etag: String,
    /// `x-linked-size`: the size of a file served from elsewhere.
    size: Option<u64>,
}

/// The Hub's answer about `file`, checked: its commit (when it gives one) is the pinned
/// one, its ETag an opaque tag.
fn hub_meta(resp: &ureq::Response, file: &str, commit: &str) -> Result<Meta, Fail> {
    if let Some(c) = resp.header("x-repo-commit") {
        let Some(c) = commit_id(c) else {
            return Err(fatal(format!(
                "the server's commit for {file} is not a commit id ({}); nothing was written",
                shown(c)
            )));
        };
        if c != commit {
            return Err(fatal(format!(
                "the server answered for {file} from commit {c}, not from {commit} that its listing gave; nothing was written"
            )));
        }
    }
    let Some(raw) = resp.header("x-linked-etag").or_else(|| resp.header("etag")) else {
        return Err(fatal(format!(
            "the server gave no ETag for {file}; nothing was written"
        )));
    };
    let Some(etag) = opaque_etag(raw) else {
        return Err(fatal(format!(
            "the server's ETag for {file} is not an opaque tag ({}); nothing was written",
            shown(raw)
        )));
    };
    let size = match resp.header("x-linked-size") {
        None => None,
        Some(s) => Some(byte_count(s).ok_or_else(|| {
            fatal(format!(
                "the server's size for {file} is not a number ({}); nothing was written",
                shown(s)
            ))
        })?),
    };
    Ok(Meta { etag, size })
}

/// How a try ended without failing.
enum Step {
    /// The blob `blobs/<etag>` is in place (new when `true`).
    Have(String, bool),
    /// Ask again, from where the `.part` file ends (learned from this answer).
    Again,
}

/// A 64-hex-digit ETag is the file's SHA-256 (a large file on the Hub).
fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The SHA-256 of the first `len` bytes of a file.
fn hash_prefix(path: &Path, len: u64) -> Result<Sha256> {
    let f = File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut h = Sha256::new();
    let mut r = f.take(len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where one file's blob goes.
struct Blob {
    etag: String,
    path: PathBuf,
    part: PathBuf,
}

impl Blob {
    fn new(snap: &Snapshot, etag: &str) -> Result<Blob> {
        let dir = ensure_dir(snap.root, &[&snap.folder, "blobs"])?;
        Ok(Blob {
            etag: etag.to_string(),
            path: child(&dir, etag)?,
            part: child(&dir, &format!("{etag}.part"))?,
        })
    }

    /// The bytes already in the `.part` file (a link there, symbolic or hard, is removed,
    /// never written through).
    fn part_len(&self) -> Result<u64> {
        match entry(&self.part)? {
            Entry::Missing => Ok(0),
            Entry::File(n) if !hard_linked(&self.part) => Ok(n),
            Entry::File(_) | Entry::Link => {
                remove_entry(&self.part)?;
                Ok(0)
            }
            Entry::Other => bail!("{} is in the way: it is not a file", self.part.display()),
        }
    }

    /// Checks a complete `.part` against a SHA-256 ETag and renames it to the blob.
    fn finish(&self, file: &str, hash: Option<Sha256>) -> Result<(), Fail> {
        if let Some(h) = hash {
            let sum = hex(&h.finalize());
            if !sum.eq_ignore_ascii_case(&self.etag) {
                let _ = remove_entry(&self.part);
                return Err(fatal(format!(
                    "{file}: checksum mismatch (SHA-256 {sum}, the Hub says {}); the file was removed, pull again",
                    self.etag
                )));
            }
        }
        remove_entry(&self.path)?;
        std::fs::rename(&self.part, &self.path).with_context(|| {
            format!(
                "renaming {} to {}",
                self.part.display(),
                self.path.display()
            )
        })?;
        Ok(())
    }
}

/// One try at `file`: ask the Hub at the pinned commit, follow redirects, and stream the
/// bytes into `blobs/<etag>.part` from where it ends.
fn try_file(
    client: &Client,
    snap: &Snapshot,
    file: &str,
    start: &Url,
    guess: &mut Option<(String, u64)>,
    report: &mut Report,
) -> Result<Step, Fail> {
    let what = format!("downloading {file}");
    let mut url = start.clone();
    // Where the bytes asked for begin: the `.part` of the ETag the last answer gave.
    let mut from = guess.as_ref().map(|g| g.1).unwrap_or(0);
    let mut blob: Option<(Blob, Option<u64>)> = None;
    for _ in 0..=MAX_REDIRECTS {
        let resp = client.get(&url, Some(from), &what)?;
        let status = resp.status();
        let next = if is_redirect(status) {
            Some(redirect_target(&url, &resp, &what)?)
        } else {
            None
        };
        if status == 416 && from > 0 {
            // The part file is not a prefix the server knows: start over.
            if let Some((etag, _)) = guess.take() {
                let b = Blob::new(snap, &etag)?;
                remove_entry(&b.part)?;
                *guess = Some((etag, 0));
            }
            return Ok(Step::Again);
        }
        if status >= 400 {
            return Err(status_failure(status, &what));
        }
        if next.is_none() && !matches!(status, 200 | 206) {
            return Err(fatal(format!(
                "{what}: the server answered HTTP {status}; nothing was written"
            )));
        }
        // The Hub's own answer: the first that is not a redirect within the endpoint's origin.
        let own_redirect = next.as_ref().is_some_and(|n| client.is_endpoint(n));
        if blob.is_none() && !own_redirect {
            if !client.is_endpoint(&url) {
                return Err(fatal(format!(
                    "{what}: the server's answer came from {}, not from the Hub; nothing was written",
                    shown(url.as_str())
                )));
            }
            let meta = hub_meta(&resp, file, &snap.commit)?;
            if let Some((etag, _)) = guess.as_ref() {
                if *etag != meta.etag {
                    return Err(fatal(format!(
                        "the server's ETag for {file} changed between requests ({} then {}); nothing more was written",
                        etag, meta.etag
                    )));
                }
            }
            let b = Blob::new(snap, &meta.etag)?;
            match entry(&b.path)? {
                Entry::File(_) => return Ok(Step::Have(meta.etag, false)),
                Entry::Link => remove_entry(&b.path)?,
                Entry::Missing => {}
                Entry::Other => {
                    return Err(fatal(format!(
                        "{} is in the way: it is not a file",
                        b.path.display()
                    )))
                }
            }
            let mut have = b.part_len()?;
            if meta.size.is_some_and(|s| have > s) {
                remove_entry(&b.part)?;
                have = 0;
            }
            *guess = Some((meta.etag.clone(), have));
            if have > 0 && meta.size == Some(have) {
                // A complete transfer that was not renamed yet.
                let hash = if is_sha256(&b.etag) {
                    Some(hash_prefix(&b.part, have)?)
                } else {
                    None
                };
                b.finish(file, hash)?;
                return Ok(Step::Have(meta.etag, true));
            }
            if have != from {
                if next.is_none() {
                    // These bytes start elsewhere than the part file ends: ask again.
                    return Ok(Step::Again);
                }
                from = have;
            }
            blob = Some((b, meta.size));
        }
        match next {
            Some(n) => url = n,
            None => {
                let Some((b, size)) = blob else {
                    return Err(fatal(format!(
                        "{what}: the server's answer could not be placed"
                    )));
                };
                return receive(resp, file, &b, size, from, report)
                    .map(|new| Step::Have(b.etag.clone(), new));
            }
        }
    }
    Err(fatal(format!(
        "{what}: more than {MAX_REDIRECTS} redirects; nothing was written"
    )))
}

/// Streams a file answer into the blob's `.part` file (asked for from byte `from`), held to
/// the size announced, then checks and renames it.
fn receive(
    resp: ureq::Response,
    file: &str,
    blob: &Blob,
    linked: Option<u64>,
    from: u64,
    report: &mut Report,
) -> Result<bool, Fail> {
    let mut start = from;
    let mut range_total = None;
    match resp.status() {
        200 => start = 0,
        _ => {
            let Some(cr) = resp.header("content-range") else {
                return Err(fatal(format!(
                    "the server's partial answer for {file} has no Content-Range; nothing more was written"
                )));
            };
            let Some((first, total)) = content_range(cr) else {
                return Err(fatal(format!(
                    "the server's Content-Range for {file} is malformed ({}); nothing more was written",
                    shown(cr)
                )));
            };
            if first != from {
                return Err(fatal(format!(
                    "the server sent {file} from byte {first}, not from byte {from} as asked; nothing more was written"
                )));
            }
            range_total = total;
        }
    }
    let length = match resp.header("content-length") {
        None => None,
        Some(v) => Some(byte_count(v).ok_or_else(|| {
            fatal(format!(
                "the server's Content-Length for {file} is not a number ({}); nothing more was written",
                shown(v)
            ))
        })?),
    };
    if let (Some(a), Some(b)) = (linked, range_total) {
        if a != b {
            return Err(fatal(format!(
                "the server gives two sizes for {file} ({a} and {b} bytes); nothing more was written"
            )));
        }
    }
    let Some(total) = linked
        .or(range_total)
        .or(length.and_then(|n| n.checked_add(start)))
    else {
        return Err(fatal(format!(
            "the server gave no size for {file}; nothing was written"
        )));
    };
    if start > total {
        return Err(fatal(format!(
            "the server sent {file} from byte {start}, past its {total} bytes; nothing more was written"
        )));
    }
    if let Some(n) = length {
        if n > total - start {
            return Err(fatal(format!(
                "the server's answer for {file} holds {n} bytes from byte {start}, more than the {total} bytes announced; nothing more was written"
            )));
        }
    }
    let mut out = if start == 0 {
        create_new(&blob.part)?
    } else {
        match entry(&blob.part)? {
            Entry::File(n) if n == start && !hard_linked(&blob.part) => OpenOptions::new()
                .append(true)
                .open(&blob.part)
                .with_context(|| format!("{}", blob.part.display()))?,
            _ => {
                return Err(Fail::Retry(anyhow!(
                    "{} changed during the download",
                    blob.part.display()
                )))
            }
        }
    };
    let mut hash = if is_sha256(&blob.etag) {
        Some(if start > 0 {
            hash_prefix(&blob.part, start)?
        } else {
            Sha256::new()
        })
    } else {
        None
    };
    report.init(total, file);
    report.update(start);
    let mut reader = resp.into_reader();
    let mut buf = vec![0u8; 256 << 10];
    let mut have = start;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                report.finish();
                return Err(Fail::Retry(anyhow!(
                    "downloading {file}: the transfer stopped at byte {have} of {total}: {e}"
                )));
            }
        };
        if have + n as u64 > total {
            report.finish();
            drop(out);
            let _ = remove_entry(&blob.part);
            return Err(fatal(format!(
                "the server sent more than the {total} bytes it announced for {file}; the partial file was removed"
            )));
        }
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", blob.part.display()))?;
        if let Some(h) = hash.as_mut() {
            h.update(&buf[..n]);
        }
        have += n as u64;
        report.update(n as u64);
    }
    report.finish();
    out.flush()
        .with_context(|| format!("writing {}", blob.part.display()))?;
    drop(out);
    if have < total {
        return Err(Fail::Retry(anyhow!(
            "downloading {file}: the transfer stopped at byte {have} of {total}"
        )));
    }
    blob.finish(file, hash)?;
    Ok(true)
}

/// `snapshots/<commit>/<file>` as a relative link to `../../blobs/<etag>` (one more `../`
/// per folder in the file's name); where links cannot be made, the blob is moved there (a
/// new one) or copied.
fn link_snapshot(snap: &Snapshot, file: &str, etag: &str, new_blob: bool) -> Result<PathBuf> {
    let parts: Vec<&str> = file.split('/').collect();
    let Some((name, folders)) = parts.split_last() else {
        bail!("{} is not a file name", shown(file));
    };
    let mut dirs = vec![snap.folder.as_str(), "snapshots", snap.commit.as_str()];
    dirs.extend_from_slice(folders);
    let dir = ensure_dir(snap.root, &dirs)?;
    let dst = child(&dir, name)?;
    let blobs = ensure_dir(snap.root, &[&snap.folder, "blobs"])?;
    let blob = child(&blobs, etag)?;
    let target: PathBuf = std::iter::repeat_n("..", folders.len() + 2)
        .chain(["blobs", etag])
        .collect();
    match entry(&dst)? {
        Entry::Link if std::fs::read_link(&dst).ok().as_deref() == Some(target.as_path()) => {
            return Ok(dst)
        }
        Entry::Other => bail!("{} is in the way: it is not a file", dst.display()),
        _ => remove_entry(&dst)?,
    }
    #[cfg(unix)]
    let linked = std::os::unix::fs::symlink(&target, &dst);
    #[cfg(windows)]
    let linked = std::os::windows::fs::symlink_file(&target, &dst);
    #[cfg(not(any(unix, windows)))]
    let linked: std::io::Result<()> = Err(std::io::Error::other("no symbolic links"));
    if linked.is_err() {
        if new_blob {
            std::fs::rename(&blob, &dst)
                .with_context(|| format!("moving {} to {}", blob.display(), dst.display()))?;
        } else {
            let mut src = File::open(&blob).with_context(|| format!("{}", blob.display()))?;
            let mut out = create_new(&dst)?;
            std::io::copy(&mut src, &mut out)
                .with_context(|| format!("copying {} to {}", blob.display(), dst.display()))?;
        }
    }
    Ok(dst)
}

/// `refs/main` holding the commit (written to a new file, then renamed over the old one).
fn write_ref(snap: &Snapshot) -> Result<()> {
    let dir = ensure_dir(snap.root, &[&snap.folder, "refs"])?;
    let path = child(&dir, "main")?;
    if let Entry::File(_) = entry(&path)? {
        if std::fs::read(&path).ok().as_deref() == Some(snap.commit.as_bytes()) {
            return Ok(());
        }
    }
    let tmp = child(&dir, &format!("main.{}.tmp", std::process::id()))?;
    let mut f = create_new(&tmp)?;
    f.write_all(snap.commit.as_bytes())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// Downloads one file of the pinned snapshot (resuming a `.part` left by an interrupted run,
/// retrying as `opts` says) and returns its path in the snapshot.
fn fetch_file(client: &Client, snap: &Snapshot, file: &str, opts: &PullOptions) -> Result<PathBuf> {
    let start = client.url(&format!(
        "{}/resolve/{}/{}",
        snap.repo,
        snap.commit,
        url_path(file)
    ))?;
    let bar = opts.bar.unwrap_or_else(|| std::io::stderr().is_terminal());
    let mut report = Report::new(bar);
    let mut guess = None;
    let (mut failures, mut agains) = (0, 0);
    let (etag, new) = loop {
        match try_file(client, snap, file, &start, &mut guess, &mut report) {
            Ok(Step::Have(etag, new)) => break (etag, new),
            Ok(Step::Again) if agains < 3 => agains += 1,
            Ok(Step::Again) => bail!(
                "downloading {file}: the server keeps answering for other bytes than asked; stopped"
            ),
            Err(Fail::Fatal(e)) => return Err(e),
            Err(Fail::Retry(e)) if failures >= opts.retries => return Err(gave_up(e, failures)),
            Err(Fail::Retry(e)) => {
                tracing::warn!("{e:#}; trying again");
                client.wait(failures);
                failures += 1;
            }
        }
    };
    let path = link_snapshot(snap, file, &etag, new)?;
    write_ref(snap)?;
    Ok(path)
}

/// The files of a Hugging Face model directory worth fetching.
fn wanted_in_dir(name: &str) -> bool {
    matches!(
        name,
        "config.json"
            | "tokenizer.json"
            | "tokenizer_config.json"
            | "generation_config.json"
            | "special_tokens_map.json"
            | "chat_template.jinja"
            | "chat_template.json"
            | "model.safetensors.index.json"
    ) || (name.ends_with(".safetensors") && !name.contains('/') && !name.contains('\\'))
}

/// Picks the GGUF `select` names among `files` (a file name, or a quantization such as
/// `Q4_K_M` matched without regard to case); without `select`, the only GGUF or the Q4_K_M.
fn pick_gguf(files: &[String], select: Option<&str>) -> Result<Option<String>> {
    let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
    let list = || {
        ggufs
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match select {
        Some(sel) if sel.ends_with(".gguf") => match files.iter().find(|f| *f == sel) {
            Some(f) => Ok(Some(f.clone())),
            None => bail!("the repository has no {sel}; its GGUF files: {}", list()),
        },
        Some(sel) => {
            let q = sel.to_ascii_lowercase();
            let hits: Vec<&&String> = ggufs
                .iter()
                .filter(|f| {
                    let l = f.to_ascii_lowercase();
                    l.contains(&format!("-{q}.gguf"))
                        || l.contains(&format!(".{q}.gguf"))
                        || l.contains(&format!("_{q}.gguf"))
                        || l.ends_with(&format!("{q}.gguf"))
                })
                .collect();
            match hits.len() {
                1 => Ok(Some(hits[0].to_string())),
                0 => bail!("no GGUF file for {sel:?}; the repository has: {}", list()),
                _ => bail!(
                    "{sel:?} matches several files ({}); name one",
                    hits.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        None if ggufs.len() == 1 => Ok(Some(ggufs[0].clone())),
        None if ggufs.is_empty() => Ok(None),
        None => match ggufs
            .iter()
            .find(|f| f.to_ascii_lowercase().contains("q4_k_m"))
        {
            Some(f) => Ok(Some(f.to_string())),
            None => bail!(
                "the repository has several GGUF files; name one after a colon: {}",
                list()
            ),
        },
    }
}

/// What `spec` names, when a pull already put it in the cache under `cfg` (no network
/// needed): the newest snapshot holding a matching GGUF, or a model directory.
pub fn cached(cfg: &HubConfig, spec: &HubSpec) -> Option<PathBuf> {
    let root = cfg.cache.join(spec.folder());
    let mut snaps: Vec<(std::time::SystemTime, PathBuf)> =
        std::fs::read_dir(root.join("snapshots"))
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| {
                (
                    e.metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH),
                    e.path(),
                )
            })
            .collect();
    snaps.sort();
    for (_, dir) in snaps.into_iter().rev() {
        let files: Vec<String> = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().exists())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        match pick_gguf(&files, spec.select.as_deref()) {
            Ok(Some(f)) => return Some(dir.join(f)),
            Ok(None) if kiln_core::load::hf::is_model_dir(&dir) => return Some(dir),
            _ => {}
        }
    }
    None
}

/// Fetches what `spec` names (see the module docs) from `cfg`'s endpoint into its cache and
/// returns the local path: the GGUF file, or the model directory (a snapshot folder).
pub fn pull(cfg: &HubConfig, spec: &HubSpec, opts: &PullOptions) -> Result<PathBuf> {
    let spec = HubSpec::parse(&spec.repo).map(|s| HubSpec {
        repo: s.repo,
        select: spec.select.clone(),
    })?;
    let client = Client::new(cfg)?;
    let (commit, files) = repo_info(&client, &spec, opts)?;
    let snap = Snapshot {
        root: &cfg.cache,
        repo: &spec.repo,
        folder: spec.folder(),
        commit,
    };
    if let Some(f) = pick_gguf(&files, spec.select.as_deref())? {
        return fetch_file(&client, &snap, &f, opts);
    }
    let want: Vec<&String> = files.iter().filter(|f| wanted_in_dir(f)).collect();
    if !want.iter().any(|f| *f == "config.json") {
        bail!(
            "{} has neither GGUF files nor a config.json; its files: {}",
            spec.repo,
            files.join(", ")
        );
    }
    let mut dir = None;
    for f in want {
        let p = fetch_file(&client, &snap, f, opts)?;
        if f == "config.json" {
            dir = p.parent().map(Path::to_path_buf);
        }
    }
    dir.context("the model directory")
}

#[cfg(test)]
mod tests;
