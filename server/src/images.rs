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

/// The image of a `data:` URL (`data:image/png;base64,…`); a remote URL is refused (the
/// server fetches nothing).
pub fn from_url(url: &str) -> Result<Arc<Image>, String> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split(':').next().unwrap_or("");
        return Err(if matches!(scheme, "http" | "https") {
            "remote image URLs are not fetched; send the image inline as a data: URL (data:image/png;base64,…)".into()
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
) -> Result<serde_json::Value, String> {
    let Some(images) = images else {
        if parts
            .iter()
            .any(|p| p.get("type").and_then(|t| t.as_str()) == Some("image_url"))
        {
            return Err(NO_TOWER.into());
        }
        return content_parts(parts, Some(&mut Vec::new()));
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
                let img = from_url(url).map_err(|e| format!("image {}: {e}", images.len()))?;
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
        let e = from_url("https://example.com/cat.png").unwrap_err();
        assert!(e.contains("data:"), "{e}");
        assert!(from_url("data:image/png,rawbytes").is_err());
        assert!(from_url("data:image/png;base64").is_err());
        assert!(from_url("data:image/png;base64,!!!!").is_err());
        // Decodes, but is not an image.
        let e = from_url("data:image/png;base64,AAAA").unwrap_err();
        assert!(e.contains("image"), "{e}");
    }
}
