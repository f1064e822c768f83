//! What the vision towers share and the families name: how a prompt holds an image, and
//! helpers for reading a tower's metadata and pooling its patches. A leaf: it imports no model
//! module (the towers and families import it, and `model::vision` imports them).

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::tensor::Tensor;

/// How a family's prompt holds an image: the marker its chat template writes, the text of one
/// soft token, and what its processor wraps an image's soft tokens in.
pub struct ImageText {
    pub marker: &'static str,
    pub soft_token: &'static str,
    pub before: &'static str,
    pub after: &'static str,
}

/// An mmproj file's positive integer `key` (at most 2^20).
pub(crate) fn meta_usize(f: &GgufFile, key: &str) -> Result<usize> {
    let v = f.get_u64(key)?;
    usize::try_from(v)
        .ok()
        .filter(|&x| x > 0 && x <= 1 << 20)
        .ok_or_else(|| Error::load(f.path(), format!("{key} = {v} is out of range")))
}

/// An mmproj file's positive integer `key` as [`meta_usize`] reads it, `default` where the
/// file has none.
pub(crate) fn meta_or(f: &GgufFile, key: &str, default: usize) -> Result<usize> {
    match f.get(key) {
        Some(_) => meta_usize(f, key),
        None => Ok(default),
    }
}

/// The sizes every tower's mmproj metadata gives.
pub(crate) struct Shape {
    pub patch: usize,
    pub hidden: usize,
    pub ff: usize,
    pub layers: usize,
    pub heads: usize,
    /// The text model's width (the projection's output).
    pub text_width: usize,
}

impl Shape {
    pub(crate) fn read(f: &GgufFile) -> Result<Shape> {
        Ok(Shape {
            patch: meta_usize(f, "clip.vision.patch_size")?,
            hidden: meta_usize(f, "clip.vision.embedding_length")?,
            ff: meta_usize(f, "clip.vision.feed_forward_length")?,
            layers: meta_usize(f, "clip.vision.block_count")?,
            heads: meta_usize(f, "clip.vision.attention.head_count")?,
            text_width: meta_usize(f, "clip.vision.projection_dim")?,
        })
    }
}

/// A weight and its bias.
pub(crate) type Pair = (Tensor, Tensor);

/// `x · wᵀ + b`.
pub(crate) fn linear(ex: &Executor, x: &Tensor, (w, b): &Pair) -> Result<Tensor> {
    ex.add(&ex.matmul(x, w)?, b)
}

/// LayerNorm of `x`'s rows with weight and bias.
pub(crate) fn layer_norm(ex: &Executor, x: &Tensor, (w, b): &Pair, eps: f32) -> Result<Tensor> {
    first(ex.run(
        &crate::op::Op::Norm(crate::op::NormOp::LayerNorm { eps }),
        &[x, w, b],
    )?)
}

/// The first output of an op.
pub(crate) fn first(v: Vec<Tensor>) -> Result<Tensor> {
    v.into_iter()
        .next()
        .ok_or_else(|| Error::Model("an op produced no output".into()))
}

/// A vision config's positive integer `k` (at most 2^20; `default` where absent).
pub(crate) fn config_u32(
    v: &serde_json::Value,
    k: &str,
    default: Option<u64>,
) -> std::result::Result<u32, String> {
    v.get(k)
        .and_then(serde_json::Value::as_u64)
        .or(default)
        .filter(|&x| x > 0 && x <= 1 << 20)
        .map(|x| x as u32)
        .ok_or_else(|| format!("vision {k} is missing or out of range"))
}

/// A vision config's axial RoPE base (`rope_parameters.rope_theta`, `default` where absent):
/// an error for another RoPE type.
pub(crate) fn axial_theta(
    vc: &serde_json::Value,
    default: f64,
) -> std::result::Result<f64, String> {
    let rope = vc
        .get("rope_parameters")
        .unwrap_or(&serde_json::Value::Null);
    if let Some(t) = rope.get("rope_type").and_then(serde_json::Value::as_str) {
        if t != "axial" {
            return Err(format!("vision RoPE {t:?} is not supported (axial is)"));
        }
    }
    Ok(rope
        .get("rope_theta")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(default))
}

/// The `clip.vision.*` entries every tower's config gives: its width, MLP width, depth
/// (`layers` where absent), heads and the text model's width.
pub(crate) fn tower_meta(
    vc: &serde_json::Value,
    text: &serde_json::Value,
    layers: u64,
) -> std::result::Result<Vec<(String, crate::load::gguf::Value)>, String> {
    use crate::load::gguf::Value;
    let entry = |k: &str, from: &serde_json::Value, key: &str, d: Option<u64>| {
        config_u32(from, key, d).map(|n| (format!("clip.vision.{k}"), Value::U32(n)))
    };
    Ok(vec![
        entry("embedding_length", vc, "hidden_size", Some(768))?,
        entry("feed_forward_length", vc, "intermediate_size", Some(3072))?,
        entry("block_count", vc, "num_hidden_layers", Some(layers))?,
        entry("attention.head_count", vc, "num_attention_heads", Some(12))?,
        entry("projection_dim", text, "hidden_size", None)?,
    ])
}

/// The average of each `k × k` block of a `rows × cols` grid of vectors (`x`: `[rows·cols, E]`,
/// row-major), row-major over the blocks: the sum of k² gathers, over k².
pub(crate) fn avg_pool(
    ex: &Executor,
    x: &Tensor,
    rows: usize,
    cols: usize,
    k: usize,
) -> Result<Tensor> {
    if k == 0 || rows % k != 0 || cols % k != 0 {
        return Err(Error::Model(format!(
            "a {cols}x{rows} grid does not pool in {k}x{k} blocks"
        )));
    }
    let (th, tw) = (rows / k, cols / k);
    let mut sum: Option<Tensor> = None;
    for dy in 0..k {
        for dx in 0..k {
            let ids: Vec<i32> = (0..th * tw)
                .map(|i| (((i / tw) * k + dy) * cols + (i % tw) * k + dx) as i32)
                .collect();
            let g = ex.get_rows(x, &ex.upload_i32(&[th * tw], &ids)?)?;
            sum = Some(match sum {
                None => g,
                Some(acc) => ex.add(&acc, &g)?,
            });
        }
    }
    match sum {
        Some(s) => ex.scale(&s, 1.0 / (k * k) as f32),
        None => Err(Error::Model("a pooling factor of 0".into())),
    }
}

/// The `p × p` patches of `[3, h, w]` pixel values (channel planes; `h`, `w` whole patches),
/// row-major over the patch grid, each in a patch convolution weight's order (channel, row,
/// column), every value through `f`.
pub(crate) fn patches(
    pixels: &[f32],
    h: usize,
    w: usize,
    p: usize,
    f: impl Fn(f32) -> f32,
) -> Vec<f32> {
    let (gh, gw) = (h / p, w / p);
    let mut out = Vec::with_capacity(gh * gw * 3 * p * p);
    for py in 0..gh {
        for px in 0..gw {
            for c in 0..3 {
                for y in 0..p {
                    let row = c * h * w + (py * p + y) * w + px * p;
                    out.extend(pixels[row..row + p].iter().map(|&v| f(v)));
                }
            }
        }
    }
    out
}
