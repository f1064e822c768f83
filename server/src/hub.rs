//! Models from the Hugging Face Hub: `kiln pull org/repo[:file-or-quant]` and
//! `--model hf:org/repo[:…]`, through the `hf-hub` crate into the standard Hugging Face cache
//! (`HF_HOME`, default `~/.cache/huggingface`), from `HF_ENDPOINT` (default the Hub) with
//! `HF_TOKEN` (or the cache's token file) for gated repositories.
//!
//! What is fetched: a `.gguf` file named after the colon, or the GGUF whose name holds the
//! quantization named (`:Q4_K_M`); without one, the repository's only GGUF or its Q4_K_M; a
//! repository without GGUFs is a Hugging Face model directory (config, tokenizer, safetensors).
//! Downloads resume where an interrupted one stopped (the `.part` file in the cache), are
//! checked against the SHA-256 the Hub gives for large files, and show a progress bar on a
//! terminal (plain lines otherwise).

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo, RepoType};
use sha2::{Digest, Sha256};

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

/// Where a pull goes: the endpoint, the repository and the token.
struct Hub {
    endpoint: String,
    repo: String,
    token: Option<String>,
}

fn api(repo: &str, opts: &PullOptions) -> Result<(Api, Hub)> {
    let cache = Cache::from_env();
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| cache.token());
    let endpoint = std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".to_string())
        .trim_end_matches('/')
        .to_string();
    let api = ApiBuilder::from_env()
        .with_endpoint(endpoint.clone())
        .with_token(token.clone())
        .with_retries(opts.retries)
        .with_progress(false)
        .build()
        .context("setting up the Hub client")?;
    Ok((
        api,
        Hub {
            endpoint,
            repo: repo.to_string(),
            token,
        },
    ))
}

/// Progress to stderr: an indicatif bar on a terminal, a line per tenth otherwise.
struct Report {
    bar: Option<indicatif::ProgressBar>,
    name: String,
    total: usize,
    done: usize,
    tenth: usize,
}

impl Report {
    fn new(bar: bool) -> Report {
        Report {
            bar: bar.then(|| {
                let b = indicatif::ProgressBar::new(0);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                b
            }),
            name: String::new(),
            total: 0,
            done: 0,
            tenth: usize::MAX,
        }
    }
}

impl Progress for Report {
    fn init(&mut self, size: usize, filename: &str) {
        self.total = size;
        self.done = 0;
        self.tenth = usize::MAX;
        self.name = filename.to_string();
        if let Some(b) = &self.bar {
            b.set_length(size as u64);
            b.set_position(0);
            b.set_message(filename.to_string());
        }
    }

    fn update(&mut self, n: usize) {
        self.done += n;
        match &self.bar {
            Some(b) => b.set_position(self.done as u64),
            None => {
                let t = (self.done * 10).checked_div(self.total).unwrap_or(10);
                if t != self.tenth {
                    self.tenth = t;
                    eprintln!(
                        "kiln: downloading {}: {}% ({:.1} of {:.1} MB)",
                        self.name,
                        t * 10,
                        self.done as f64 / 1e6,
                        self.total as f64 / 1e6
                    );
                }
            }
        }
    }

    fn finish(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The SHA-256 of a file, hex.
fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Downloads one file of `repo` (resuming a `.part` left by an interrupted run) and checks
/// it: a large file's blob is named by its SHA-256 in the cache, so the name is compared with
/// the content. A mismatch removes the file.
fn fetch_file(hub: &Hub, repo: &ApiRepo, file: &str, opts: &PullOptions) -> Result<PathBuf> {
    check_names(&hub.endpoint, &hub.repo, file, hub.token.as_deref())?;
    let bar = opts.bar.unwrap_or_else(|| std::io::stderr().is_terminal());
    // The crate panics on some malformed answers (a bad status or Location): an error here.
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        repo.download_with_progress(file, Report::new(bar))
    }));
    let path = match got {
        Ok(r) => r.with_context(|| format!("downloading {file}"))?,
        Err(_) => bail!("downloading {file}: the server's answer could not be understood"),
    };
    let blob = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    let name = blob
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        let sum = sha256_file(&blob)?;
        if !sum.eq_ignore_ascii_case(&name) {
            let _ = std::fs::remove_file(&blob);
            let _ = std::fs::remove_file(&path);
            bail!(
                "{file}: checksum mismatch (SHA-256 {sum}, the Hub says {name}); the file was removed, pull again"
            );
        }
    }
    Ok(path)
}

/// A repository path that stays inside the folder it is joined to: relative, `/`-separated
/// components, none empty, `.` or `..`, no backslash.
fn safe_name(f: &str) -> bool {
    !f.is_empty()
        && !f.starts_with('/')
        && !f.contains('\\')
        && f.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The commit and ETag the server gives for `file`, checked before the download uses them as
/// folder and file names in the cache (the crate would take them as they come): a commit is
/// hex, an ETag hex or letters, digits and `-`.
fn check_names(endpoint: &str, repo: &str, file: &str, token: Option<&str>) -> Result<()> {
    let url = format!("{endpoint}/{repo}/resolve/main/{file}");
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let mut req = agent.get(&url).set("Range", "bytes=0-0");
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => bail!("asking for {file}: {e}"),
    };
    if resp.status() >= 400 {
        bail!("asking for {file}: HTTP {}", resp.status());
    }
    let ok = |v: &str| {
        !v.is_empty() && v.len() <= 128 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let commit = resp.header("x-repo-commit").unwrap_or("");
    let etag = resp
        .header("x-linked-etag")
        .or_else(|| resp.header("etag"))
        .unwrap_or("")
        .trim_start_matches("W/")
        .replace('"', "");
    if !ok(commit) || !ok(&etag) {
        bail!("the server's commit or ETag for {file} is not a plain name ({commit:?}, {etag:?})");
    }
    Ok(())
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

/// What `spec` names, when a pull already put it in the cache (no network needed): the
/// newest snapshot holding a matching GGUF, or a model directory.
pub fn cached(spec: &HubSpec) -> Option<PathBuf> {
    let root = Cache::from_env()
        .path()
        .join(format!("models--{}", spec.repo.replace('/', "--")));
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

/// Fetches what `spec` names (see the module docs) and returns the local path: the GGUF
/// file, or the model directory (a snapshot folder of the cache).
pub fn pull(spec: &HubSpec, opts: &PullOptions) -> Result<PathBuf> {
    let (api, hub) = api(&spec.repo, opts)?;
    let repo = api.repo(Repo::new(spec.repo.clone(), RepoType::Model));
    let info = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| repo.info()))
        .map_err(|_| {
            anyhow::anyhow!(
                "the Hub's answer about {} could not be understood",
                spec.repo
            )
        })?
        .with_context(|| format!("looking up {} on the Hub", spec.repo))?;
    // The listing comes from the server: names that could leave the cache are dropped.
    let files: Vec<String> = info
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .filter(|f| safe_name(f))
        .collect();
    if let Some(f) = pick_gguf(&files, spec.select.as_deref())? {
        return fetch_file(&hub, &repo, &f, opts);
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
        let p = fetch_file(&hub, &repo, f, opts)?;
        if f == "config.json" {
            dir = p.parent().map(Path::to_path_buf);
        }
    }
    dir.context("the model directory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        assert_eq!(
            HubSpec::parse("hf:org/repo:Q4_K_M").unwrap(),
            HubSpec {
                repo: "org/repo".into(),
                select: Some("Q4_K_M".into())
            }
        );
        assert_eq!(HubSpec::parse("a-b/c.d").unwrap().select, None);
        for bad in ["repo", "a/b/c", "../x", "org/..", "o/r:../../etc", "o rg/x"] {
            assert!(HubSpec::parse(bad).is_err(), "{bad}");
        }
        for bad in [
            "../../x.gguf",
            "/tmp/x.gguf",
            "a//b.gguf",
            "a/./b",
            "a\\b.gguf",
            "",
        ] {
            assert!(!safe_name(bad), "{bad}");
        }
        assert!(safe_name("sub/dir/model-Q4_K_M.gguf"));
    }

    #[test]
    fn a_quantization_picks_its_file() {
        let files: Vec<String> = [
            "README.md",
            "model-Q4_K_M.gguf",
            "model-Q8_0.gguf",
            "model.Q4_K_S.gguf",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            pick_gguf(&files, Some("q8_0")).unwrap().as_deref(),
            Some("model-Q8_0.gguf")
        );
        assert_eq!(
            pick_gguf(&files, None).unwrap().as_deref(),
            Some("model-Q4_K_M.gguf")
        );
        assert_eq!(
            pick_gguf(&files, Some("model.Q4_K_S.gguf"))
                .unwrap()
                .as_deref(),
            Some("model.Q4_K_S.gguf")
        );
        assert!(pick_gguf(&files, Some("Q2_K")).is_err());
        assert_eq!(pick_gguf(&["config.json".to_string()], None).unwrap(), None);
    }
}
