//! HTTP to the Hub: the client (redirects followed by hand, the token kept to the endpoint's
//! origin), the headers a server may send as checked values, and the repository listing.

use super::*;

/// A commit id: 40 hex digits, lowercased.
pub(super) fn commit_id(v: &str) -> Option<String> {
    (v.len() == 40 && v.bytes().all(|b| b.is_ascii_hexdigit())).then(|| v.to_ascii_lowercase())
}

/// An ETag as a blob name: without `W/` and the quotes, `[A-Za-z0-9-]{1,128}`.
pub(super) fn opaque_etag(v: &str) -> Option<String> {
    let v = v.trim();
    let v = v.strip_prefix("W/").unwrap_or(v);
    let v = v.strip_prefix('"').unwrap_or(v);
    let v = v.strip_suffix('"').unwrap_or(v);
    (!v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .then(|| v.to_string())
}

/// A byte count from a header: decimal digits only.
pub(super) fn byte_count(v: &str) -> Option<u64> {
    let v = v.trim();
    (!v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()))
        .then(|| v.parse().ok())
        .flatten()
}

/// `bytes first-last/total` (total may be `*`): the first byte and the total.
pub(super) fn content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (span, total) = v.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last) = (byte_count(first)?, byte_count(last)?);
    if last < first {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => {
            let t = byte_count(t)?;
            if t <= last {
                return None;
            }
            Some(t)
        }
    };
    Some((first, total))
}

/// What a try at one file came to.
pub(super) enum Fail {
    /// Refused: the server's answer is wrong; trying again will not help.
    Fatal(anyhow::Error),
    /// Interrupted or refused for now (a dropped connection, a 5xx): try again, resuming.
    Retry(anyhow::Error),
}

impl From<anyhow::Error> for Fail {
    fn from(e: anyhow::Error) -> Fail {
        Fail::Fatal(e)
    }
}

pub(super) fn fatal(msg: String) -> Fail {
    Fail::Fatal(anyhow!(msg))
}

/// HTTP to the Hub: one agent that never follows redirects itself.
pub(super) struct Client {
    agent: ureq::Agent,
    endpoint: Url,
    token: Option<String>,
    retry_wait: Duration,
}

impl Client {
    pub(super) fn new(cfg: &HubConfig) -> Result<Client> {
        let endpoint = Url::parse(cfg.endpoint.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .with_context(|| {
                format!("the Hub endpoint {:?} is not an http(s) URL", cfg.endpoint)
            })?;
        if let Some(t) = &cfg.token {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                bail!("the Hugging Face token (HF_TOKEN or the token file) holds characters an HTTP header cannot carry");
            }
        }
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .try_proxy_from_env(true)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Client {
            agent,
            endpoint,
            token: cfg.token.clone(),
            retry_wait: cfg.retry_wait,
        })
    }

    /// The endpoint's own origin (scheme, host and port): where the token may go.
    pub(super) fn is_endpoint(&self, url: &Url) -> bool {
        url.origin() == self.endpoint.origin()
    }

    /// `{endpoint}/{rest}`, `rest` built from checked names.
    pub(super) fn url(&self, rest: &str) -> Result<Url> {
        let base = self.endpoint.as_str().trim_end_matches('/');
        Url::parse(&format!("{base}/{rest}")).with_context(|| format!("the URL {base}/{rest}"))
    }

    /// One GET, answered with whatever status the server gives (a transport error is worth
    /// another try; `what` names it).
    pub(super) fn get(
        &self,
        url: &Url,
        from: Option<u64>,
        what: &str,
    ) -> Result<ureq::Response, Fail> {
        let mut req = self.agent.request_url("GET", url);
        if let Some(n) = from {
            req = req.set("Range", &format!("bytes={n}-"));
        }
        if let Some(t) = self.token.as_deref().filter(|_| self.is_endpoint(url)) {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        match req.call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => Ok(r),
            Err(e) => {
                let mut msg = e.to_string();
                if let Some((i, _)) = msg.char_indices().nth(300) {
                    msg.truncate(i);
                    msg.push('…');
                }
                Err(Fail::Retry(anyhow!("{what}: {msg}")))
            }
        }
    }

    /// The wait before retry `n` (from 0).
    pub(super) fn wait(&self, n: usize) {
        let w = self
            .retry_wait
            .saturating_mul(1u32 << n.min(16))
            .min(MAX_RETRY_WAIT);
        std::thread::sleep(w);
    }
}

/// The last failure of a transfer tried `failures + 1` times.
pub(super) fn gave_up(e: anyhow::Error, failures: usize) -> anyhow::Error {
    match failures {
        0 => e,
        n => anyhow!("{e:#} (tried {} times)", n + 1),
    }
}

pub(super) fn is_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Where a redirect leads: its `Location` resolved against `url`, http or https only.
pub(super) fn redirect_target(url: &Url, resp: &ureq::Response, what: &str) -> Result<Url, Fail> {
    let status = resp.status();
    let Some(loc) = resp.header("location") else {
        return Err(fatal(format!(
            "{what}: the server redirected (HTTP {status}) without saying where; nothing was written"
        )));
    };
    let next = url.join(loc).map_err(|_| {
        fatal(format!(
            "{what}: the server redirected to {}, which is not a URL; nothing was written",
            shown(loc)
        ))
    })?;
    if !matches!(next.scheme(), "http" | "https") || next.host_str().is_none() {
        return Err(fatal(format!(
            "{what}: the server redirected to {}, which is not an http(s) URL; nothing was written",
            shown(loc)
        )));
    }
    if url.scheme() == "https" && next.scheme() == "http" {
        return Err(fatal(format!(
            "{what}: the server redirected from https to plain http ({}); nothing was written",
            shown(loc)
        )));
    }
    // A public server may not send kiln to this machine's or its network's own services
    // (a cloud metadata address, say) and have the answer stored as a model file.
    if !is_local(url) && is_local(&next) {
        return Err(fatal(format!(
            "{what}: the server redirected to a local or private address ({}); nothing was written",
            shown(loc)
        )));
    }
    Ok(next)
}

/// Whether `u` names a loopback, private, link-local or unspecified address (a literal IP,
/// or `localhost`).
pub(super) fn is_local(u: &Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(a)) => {
            a.is_loopback() || a.is_private() || a.is_link_local() || a.is_unspecified()
        }
        Some(url::Host::Ipv6(a)) => {
            a.is_loopback()
                || a.is_unspecified()
                // fc00::/7 unique local, fe80::/10 link-local
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped().is_some_and(|v| {
                    v.is_loopback() || v.is_private() || v.is_link_local() || v.is_unspecified()
                })
        }
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        None => false,
    }
}

/// An error status as a failure: 5xx, 408 and 429 are worth another try.
pub(super) fn status_failure(status: u16, what: &str) -> Fail {
    let msg = match status {
        401 | 403 => format!(
            "{what}: access denied (HTTP {status}); a gated or private repository needs a token (HF_TOKEN or `huggingface-cli login`) that has been granted access"
        ),
        404 => format!("{what}: not found (HTTP 404)"),
        _ => format!("{what}: the server answered HTTP {status}"),
    };
    if status >= 500 || status == 408 || status == 429 {
        Fail::Retry(anyhow!(msg))
    } else {
        Fail::Fatal(anyhow!(msg))
    }
}

/// `{file}` as a URL path: each part percent-encoded but for unreserved characters.
pub(super) fn url_path(file: &str) -> String {
    let mut s = String::with_capacity(file.len());
    for b in file.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// The repository's commit (the listing's `sha`, pinned for every file) and its file names,
/// every one checked.
pub(super) fn repo_info(
    client: &Client,
    spec: &HubSpec,
    opts: &PullOptions,
) -> Result<(String, Vec<String>)> {
    let what = format!("looking up {} on the Hub", spec.repo);
    let start = client.url(&format!("api/models/{}/revision/main", spec.repo))?;
    let mut failures = 0;
    let body = loop {
        match info_body(client, &start, &what) {
            Ok(b) => break b,
            Err(Fail::Fatal(e)) => return Err(e),
            Err(Fail::Retry(e)) if failures >= opts.retries => {
                return Err(gave_up(e, failures));
            }
            Err(Fail::Retry(_)) => {
                client.wait(failures);
                failures += 1;
            }
        }
    };
    let v: serde_json::Value =
        serde_json::from_slice(&body).with_context(|| format!("{what}: the answer is not JSON"))?;
    let sha = v
        .get("sha")
        .and_then(|s| s.as_str())
        .with_context(|| format!("{what}: the answer names no commit (\"sha\")"))?;
    let commit = commit_id(sha).with_context(|| {
        format!(
            "{what}: the repository's commit {} is not a commit id (40 hex digits); nothing was written",
            shown(sha)
        )
    })?;
    let siblings = v
        .get("siblings")
        .and_then(|s| s.as_array())
        .with_context(|| format!("{what}: the answer lists no files (\"siblings\")"))?;
    if siblings.len() > MAX_SIBLINGS {
        bail!(
            "{what}: the listing names {} files, more than the {MAX_SIBLINGS} taken; nothing was written",
            siblings.len()
        );
    }
    let mut files = Vec::with_capacity(siblings.len());
    for s in siblings {
        let name = s
            .get("rfilename")
            .and_then(|n| n.as_str())
            .with_context(|| {
                format!("{what}: a file in the listing has no name (\"rfilename\")")
            })?;
        if let Some(why) = bad_name(name) {
            bail!(
                "{what}: the listing names a file {} that {why}; nothing was written",
                shown(name)
            );
        }
        files.push(name.to_string());
    }
    Ok((commit, files))
}

/// The listing's bytes (at most 16 MiB), following redirects.
pub(super) fn info_body(client: &Client, start: &Url, what: &str) -> Result<Vec<u8>, Fail> {
    let mut url = start.clone();
    for _ in 0..=MAX_REDIRECTS {
        let resp = client.get(&url, None, what)?;
        let status = resp.status();
        if is_redirect(status) {
            url = redirect_target(&url, &resp, what)?;
            continue;
        }
        if status != 200 {
            return Err(status_failure(status, what));
        }
        let mut body = Vec::new();
        resp.into_reader()
            .take(MAX_INFO_BYTES + 1)
            .read_to_end(&mut body)
            .map_err(|e| Fail::Retry(anyhow!("{what}: reading the answer: {e}")))?;
        if body.len() as u64 > MAX_INFO_BYTES {
            return Err(fatal(format!(
                "{what}: the answer is larger than {} MiB; nothing was written",
                MAX_INFO_BYTES >> 20
            )));
        }
        return Ok(body);
    }
    Err(fatal(format!(
        "{what}: more than {MAX_REDIRECTS} redirects; nothing was written"
    )))
}
