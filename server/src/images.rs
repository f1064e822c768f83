//! Images into prompts, for `kiln run --image` and the server's image content parts: reading
//! a file or a `data:` URL (bounded), and placing each image's soft tokens where the prompt
//! marks it.

use std::sync::Arc;

use base64::Engine as _;
use kiln_core::engine::PromptImage;
use kiln_core::model::VisionTower;
use kiln_core::tokenizer::Tokenizer;
use kiln_core::vision::Image;

/// What a request with images hears from a model that has no vision tower.
pub const NO_TOWER: &str = "images are not supported by this model: it has no vision tower (a GGUF's is its mmproj file, `kiln serve --mmproj`)";

/// The most bytes of one encoded image (a file, or a data URL's decoded payload).
pub const MAX_IMAGE_BYTES: usize = 32 << 20;

/// An image file, decoded.
pub fn read_file(path: &std::path::Path) -> anyhow::Result<Arc<Image>> {
    use std::io::Read;
    let f = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot open the image {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot read the image {}: {e}", path.display()))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        anyhow::bail!(
            "the image {} is over {} MiB",
            path.display(),
            MAX_IMAGE_BYTES >> 20
        );
    }
    Image::decode(&bytes)
        .map(Arc::new)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The hosts whose `http(s)` image URLs the server fetches (`kiln serve --image-url-allow`);
/// none by default, when only `data:` URLs are taken.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImageUrls {
    /// Lower-case host names or addresses; `*.example.com` also allows its subdomains.
    hosts: Vec<String>,
}

/// How long a remote image may take to arrive, from the request to its last byte.
pub const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl ImageUrls {
    /// The allow-list of `--image-url-allow` entries (each a host, or `*.` and a domain;
    /// entries may hold several, comma-separated).
    pub fn new(entries: &[String]) -> anyhow::Result<ImageUrls> {
        let mut hosts = Vec::new();
        for e in entries.iter().flat_map(|e| e.split(',')) {
            let h = e.trim().to_ascii_lowercase();
            let bare = h.strip_prefix("*.").unwrap_or(&h);
            let ok = !bare.is_empty()
                && bare.len() <= 253
                && bare
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
                && !bare.starts_with('.')
                && !bare.ends_with('.');
            if !ok {
                anyhow::bail!(
                    "--image-url-allow {e:?}: give a host name or address (example.com, 10.0.0.5) or *.example.com, without a scheme, port or path"
                );
            }
            hosts.push(h);
        }
        Ok(ImageUrls { hosts })
    }

    /// Whether `host` (lower case) is on the list.
    pub fn allows(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| match h.strip_prefix("*.") {
            Some(domain) => {
                host == domain || host.strip_suffix(domain).is_some_and(|p| p.ends_with('.'))
            }
            None => host == h,
        })
    }
}

/// The bytes of an `http(s)` image URL on the allow-list: no redirects followed, at most
/// [`MAX_IMAGE_BYTES`], within [`FETCH_TIMEOUT`]. Blocking: the server prepares requests on
/// blocking threads.
fn fetch(url: &str, allowed: &ImageUrls) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let agent = ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(FETCH_TIMEOUT)
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .build();
    let req = agent.get(url);
    let at = req
        .request_url()
        .map_err(|e| format!("the image URL does not parse: {e}"))?;
    let host = at.host().to_ascii_lowercase();
    if !matches!(at.scheme(), "http" | "https") || !allowed.allows(&host) {
        return Err(format!(
            "image URLs from {host:?} are not fetched (this server fetches only from the hosts of --image-url-allow); send the image inline as a data: URL"
        ));
    }
    let resp = req.call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("the image URL answered HTTP {code}"),
        other => format!("the image URL could not be fetched: {other}"),
    })?;
    if !(200..300).contains(&resp.status()) {
        return Err(format!(
            "the image URL answered HTTP {} (redirects are not followed)",
            resp.status()
        ));
    }
    let mut bytes = Vec::new();
    resp.into_reader()
        .take(MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading the image URL: {e}"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(format!("an image is over {} MiB", MAX_IMAGE_BYTES >> 20));
    }
    Ok(bytes)
}

/// The image of a `data:` URL (`data:image/png;base64,…`), or of an `http(s)` URL whose host
/// `allowed` lists (none by default: the server fetches nothing).
pub fn from_url(url: &str, allowed: &ImageUrls) -> Result<Arc<Image>, String> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
        return Err(if matches!(scheme.as_str(), "http" | "https") {
            if allowed.hosts.is_empty() {
                "remote image URLs are not fetched; send the image inline as a data: URL (data:image/png;base64,…), or start the server with --image-url-allow HOST".into()
            } else {
                let bytes = fetch(url, allowed)?;
                return Image::decode(&bytes)
                    .map(Arc::new)
                    .map_err(|e| e.to_string());
            }
        } else {
            "an image URL must be a data: URL (data:image/png;base64,…)".into()
        });
    };
    let (head, payload) = rest
        .split_once(',')
        .ok_or_else(|| "a data: URL needs a comma before its data".to_string())?;
    if !head.ends_with(";base64") {
        return Err("an image data: URL must be base64 (data:image/…;base64,…)".into());
    }
    decode_base64(payload)
}

/// Base64 image bytes (an Anthropic `source.data`), decoded.
pub fn decode_base64(payload: &str) -> Result<Arc<Image>, String> {
    // Four characters carry three bytes: refuse before decoding what would be too big.
    if payload.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(format!("an image is over {} MiB", MAX_IMAGE_BYTES >> 20));
    }
    let clean: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(clean.as_bytes())
        .map_err(|e| format!("the image's base64 does not decode: {e}"))?;
    Image::decode(&bytes)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// `text` with its image markers expanded (each to the model's whole image sequence),
/// tokenized (as a rendered chat with `chat`, else as a raw prompt), and each image placed
/// at its soft tokens. The markers must be as many as the images.
pub fn place(
    tok: &Tokenizer,
    (tower, token): (&VisionTower, u32),
    text: &str,
    images: &[Arc<Image>],
    chat: bool,
) -> Result<(Vec<u32>, Vec<PromptImage>), String> {
    let (expanded, n) = tower.expand(text, images).map_err(|e| e.to_string())?;
    if n != images.len() {
        return Err(format!(
            "the prompt marks {n} images ({:?}) for the {} given",
            tower.marker,
            images.len()
        ));
    }
    let ids = match chat {
        true => tok.encode_chat(&expanded),
        false => tok.encode(&expanded, true),
    }
    .map_err(|e| e.to_string())?;
    let mut placed = Vec::with_capacity(images.len());
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != token {
            i += 1;
            continue;
        }
        let start = i;
        while i < ids.len() && ids[i] == token {
            i += 1;
        }
        // Two images' soft tokens never touch (the model's wrap separates them), so each run
        // is one image.
        let Some(image) = images.get(placed.len()) else {
            return Err("the prompt holds more image soft tokens than images".into());
        };
        let per = tower.tokens_for(&image.rgb).map_err(|e| e.to_string())?;
        if i - start != per {
            return Err(format!(
                "image {}: {} soft tokens in the prompt, the model takes {per}",
                placed.len(),
                i - start
            ));
        }
        placed.push(PromptImage {
            start,
            image: image.clone(),
        });
    }
    if placed.len() != images.len() {
        return Err(format!(
            "{} of {} images found their soft tokens in the tokenized prompt",
            placed.len(),
            images.len()
        ));
    }
    Ok((ids, placed))
}

/// A message's content parts as its template sees them: the text parts' text concatenated,
/// or (with images among them) the parts as `{"type": "text", "text"}` and
/// `{"type": "image"}`, each image decoded into `images`.
pub fn content_parts(
    parts: &[serde_json::Value],
    images: Option<&mut Vec<Arc<Image>>>,
    urls: &ImageUrls,
) -> Result<serde_json::Value, String> {
    let Some(images) = images else {
        if parts
            .iter()
            .any(|p| p.get("type").and_then(|t| t.as_str()) == Some("image_url"))
        {
            return Err(NO_TOWER.into());
        }
        return content_parts(parts, Some(&mut Vec::new()), urls);
    };
    use serde_json::{json, Value};
    let mut text = String::new();
    let mut listed = Vec::with_capacity(parts.len());
    let mut any_image = false;
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("image_url") => {
                let url = match p.get("image_url") {
                    Some(Value::String(u)) => u.as_str(),
                    Some(Value::Object(o)) => o.get("url").and_then(Value::as_str).unwrap_or(""),
                    _ => "",
                };
                let img =
                    from_url(url, urls).map_err(|e| format!("image {}: {e}", images.len()))?;
                images.push(img);
                listed.push(json!({"type": "image"}));
                any_image = true;
            }
            _ => {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                    listed.push(json!({"type": "text", "text": t}));
                }
            }
        }
    }
    Ok(match any_image {
        true => Value::Array(listed),
        false => Value::String(text),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_other_than_base64_data_are_refused() {
        let e = from_url("https://example.com/cat.png", &ImageUrls::default()).unwrap_err();
        assert!(e.contains("data:"), "{e}");
        assert!(from_url("data:image/png,rawbytes", &ImageUrls::default()).is_err());
        assert!(from_url("data:image/png;base64", &ImageUrls::default()).is_err());
        assert!(from_url("data:image/png;base64,!!!!", &ImageUrls::default()).is_err());
        // Decodes, but is not an image.
        let e = from_url("data:image/png;base64,AAAA", &ImageUrls::default()).unwrap_err();
        assert!(e.contains("image"), "{e}");
    }
}
