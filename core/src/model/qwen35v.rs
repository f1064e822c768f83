//! Qwen3.5's vision tower (Qwen3-VL's, without the deepstack taps), read from the mmproj view
//! (llama.cpp's `clip` architecture, projector type `qwen3vl_merger`; a Hugging Face
//! checkpoint's tower is read through the same view, [`crate::load::hf::vision`]).
//!
//! Per image of `H × W` pixel values (`[3, H, W]`, normalized by the processor; each side a
//! whole number of `p·m` tiles, `m` the merge size): the `p × p` patches in merge-block order
//! (the `m × m` patches of each block consecutive, the blocks row-major), embedded by the
//! patch convolution with its bias (the model's is a 3-D one over two copies of the image in
//! time: its two temporal slices add up to one 2-D kernel), plus the learned position table
//! (a square grid) resampled bilinearly, corners aligned, to the image's patch grid. `L`
//! pre-norm layers (LayerNorm with bias; attention over all the image's patches both ways,
//! a fused QKV projection with biases, 2-D RoPE over each whole head: NeoX halves whose
//! first half of frequencies turns by the patch's row and second by its column, base `θ`
//! over half the head; a GELU-tanh MLP with biases). The merger: LayerNorm, each block's
//! `m²` patches side by side as one row, a GELU (erf) MLP into the text model's width.

use super::weights::Weights;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
use crate::op::{AttentionOp, AttnParams, Mask, Op, RopeMode, RopeParams, UnaryOp};
use crate::tensor::Tensor;

/// The projector type llama.cpp's mmproj files name this tower by.
pub const PROJECTOR: &str = "qwen3vl_merger";

/// Qwen3.5's image text: its chat template writes `<|vision_start|><|image_pad|><|vision_end|>`
/// for an image, its processor repeats `<|image_pad|>` once per soft token.
pub const IMAGE_TEXT: super::tower::ImageText = super::tower::ImageText {
    marker: "<|image_pad|>",
    soft_token: "<|image_pad|>",
    before: "",
    after: "",
};

struct Layer {
    ln1: Pair,
    q: Pair,
    k: Pair,
    v: Pair,
    out: Pair,
    ln2: Pair,
    up: Pair,
    down: Pair,
}

/// Qwen3.5's vision encoder and its merger into the text model.
pub struct Qwen35Vision {
    pub patch: usize,
    pub merge: usize,
    hidden: usize,
    heads: usize,
    pub text_width: usize,
    eps: f32,
    theta: f32,
    /// `[hidden, 3·p·p]` (channel, row, column): the two temporal slices summed.
    patch_w: Tensor,
    patch_b: Tensor,
    /// The position table, `[side², hidden]`, on the host (resampled per image there).
    pos: Vec<f32>,
    side: usize,
    layers: Vec<Layer>,
    post_ln: Pair,
    fc1: Pair,
    fc2: Pair,
}

use super::tower::{first, linear, meta_or, Pair, Shape};

impl Qwen35Vision {
    /// Builds the tower from an mmproj view, its weights uploaded to `ex`'s backend.
    pub fn load(f: &GgufFile, ex: &Executor) -> Result<Qwen35Vision> {
        let Shape {
            patch,
            hidden,
            ff,
            layers: n_layer,
            heads,
            text_width,
        } = Shape::read(f)?;
        let merge = meta_or(f, "clip.vision.spatial_merge_size", 2)?;
        if let Some(Value::Array(taps)) = f.get("clip.vision.is_deepstack_layers") {
            if taps.iter().any(|t| matches!(t, Value::Bool(true))) {
                return Err(Error::load(
                    f.path(),
                    "a tower with deepstack taps (Qwen3-VL's) is not supported yet",
                ));
            }
        }
        // The model's LayerNorms are torch's default, 1e-6 (llama.cpp writes the text
        // model's RMS epsilon here, the same in the released checkpoints).
        let eps = f
            .get_f32("clip.vision.attention.layer_norm_epsilon")
            .unwrap_or(1e-6);
        let theta = f.get_f32("clip.vision.rope.freq_base").unwrap_or(10_000.0);
        let hd = hidden / heads.max(1);
        if hidden % heads != 0 || hd % 4 != 0 || merge > 16 || !(theta > 1.0 && theta.is_finite()) {
            return Err(Error::load(
                f.path(),
                format!("{hidden} wide in {heads} heads, merge {merge}, RoPE base {theta}: not a tower kiln can run"),
            ));
        }
        let mut w = Weights::new(f, ex);
        let vecf = |w: &mut Weights, name: &str, n: usize| -> Result<Tensor> {
            let v = w.host_f32(name, n)?;
            ex.upload_f32(&[n], &v)
        };
        let pair = |w: &mut Weights, stem: &str, shape: &[usize]| -> Result<Pair> {
            let weight = match shape.len() {
                1 => vecf(w, &format!("{stem}.weight"), shape[0])?,
                _ => w.get(&format!("{stem}.weight"), shape)?,
            };
            Ok((weight, vecf(w, &format!("{stem}.bias"), shape[0])?))
        };
        let pp = 3 * patch * patch;
        let mut k2 = w.host_f32("v.patch_embd.weight", hidden * pp)?;
        let k1 = w.host_f32("v.patch_embd.weight.1", hidden * pp)?;
        for (a, b) in k2.iter_mut().zip(&k1) {
            *a += b;
        }
        let patch_w = ex.upload_f32(&[hidden, pp], &k2)?;
        let patch_b = vecf(&mut w, "v.patch_embd.bias", hidden)?;
        let rows = f.tensor("v.position_embd.weight")?.n_elements() / hidden;
        let side = (rows as f64).sqrt().round() as usize;
        if side < 2 || side * side != rows {
            return Err(Error::load(
                f.path(),
                format!("v.position_embd.weight holds {rows} rows, not a square grid"),
            ));
        }
        let pos = w.host_f32("v.position_embd.weight", rows * hidden)?;
        let mut layers = Vec::with_capacity(n_layer);
        for l in 0..n_layer {
            let s = |x: &str| format!("v.blk.{l}.{x}");
            // The fused QKV projection, split by rows (its bias too).
            let qkv = s("attn_qkv.weight");
            let bias = w.host_f32(&s("attn_qkv.bias"), 3 * hidden)?;
            let mut part = |i: usize| -> Result<Pair> {
                Ok((
                    w.get_rows(&qkv, &[3 * hidden, hidden], &[i * hidden..(i + 1) * hidden])?,
                    ex.upload_f32(&[hidden], &bias[i * hidden..(i + 1) * hidden])?,
                ))
            };
            let (q, k, v) = (part(0)?, part(1)?, part(2)?);
            layers.push(Layer {
                ln1: pair(&mut w, &s("ln1"), &[hidden])?,
                q,
                k,
                v,
                out: pair(&mut w, &s("attn_out"), &[hidden, hidden])?,
                ln2: pair(&mut w, &s("ln2"), &[hidden])?,
                up: pair(&mut w, &s("ffn_up"), &[ff, hidden])?,
                down: pair(&mut w, &s("ffn_down"), &[hidden, ff])?,
            });
        }
        let wide = hidden * merge * merge;
        Ok(Qwen35Vision {
            patch,
            merge,
            hidden,
            heads,
            text_width,
            eps,
            theta,
            patch_w,
            patch_b,
            pos,
            side,
            layers,
            post_ln: pair(&mut w, "v.post_ln", &[hidden])?,
            fc1: pair(&mut w, "mm.0", &[wide, wide])?,
            fc2: pair(&mut w, "mm.2", &[text_width, wide])?,
        })
    }

    /// The soft-token grid (rows, columns) of an image of `h × w` pixel values.
    pub fn grid(&self, h: usize, w: usize) -> (usize, usize) {
        let unit = self.patch * self.merge;
        (h / unit, w / unit)
    }

    fn layer_norm(&self, ex: &Executor, x: &Tensor, p: &Pair) -> Result<Tensor> {
        super::tower::layer_norm(ex, x, p, self.eps)
    }

    /// The position table resampled to a `gh × gw` patch grid (bilinear, corners aligned, in
    /// f32 as transformers computes it), in `order`'s patch order: `[n, hidden]`.
    fn positions(&self, gh: usize, gw: usize, order: &[(usize, usize)]) -> Vec<f32> {
        let (side, d) = (self.side, self.hidden);
        let taps = |i: usize, size: usize| -> [(usize, f32); 2] {
            let src = i as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
            let fl = src.floor();
            let at = |o: usize| {
                let tap = (fl as usize + o).min(side - 1);
                (tap, (1.0 - (src - fl - o as f32).abs()).max(0.0))
            };
            [at(0), at(1)]
        };
        let mut out = vec![0f32; order.len() * d];
        for (o, &(r, c)) in out.chunks_exact_mut(d).zip(order) {
            let (th, tw) = (taps(r, gh), taps(c, gw));
            for (hi, hw) in th {
                for (wi, ww) in tw {
                    let wt = hw * ww;
                    let row = &self.pos[(hi * side + wi) * d..(hi * side + wi + 1) * d];
                    for (x, &p) in o.iter_mut().zip(row) {
                        *x += p * wt;
                    }
                }
            }
        }
        out
    }

    /// The soft tokens of one image's pixel values (`[3, h, w]`, channel planes, normalized):
    /// `[tokens, text_width]` f32 on `ex`'s backend, row-major over the soft-token grid.
    pub fn encode(&self, ex: &Executor, pixels: &[f32], h: usize, w: usize) -> Result<Tensor> {
        let (p, m, d) = (self.patch, self.merge, self.hidden);
        if pixels.len() != 3 * h * w || h % (p * m) != 0 || w % (p * m) != 0 || h == 0 || w == 0 {
            return Err(Error::Model(format!(
                "{} pixel values for a {w}x{h} image in {p}-pixel patches merged {m}x{m}",
                pixels.len()
            )));
        }
        let (gh, gw) = (h / p, w / p);
        let n = gh * gw;
        // Merge-block order: block row, block column, then row and column inside the block.
        let bw = gw / m;
        let order: Vec<(usize, usize)> = (0..n)
            .map(|i| {
                let (blk, inner) = (i / (m * m), i % (m * m));
                ((blk / bw) * m + inner / m, (blk % bw) * m + inner % m)
            })
            .collect();
        let raster = super::tower::patches(pixels, h, w, p, |v| v);
        let pp = 3 * p * p;
        let mut patches = Vec::with_capacity(n * pp);
        for &(r, c) in &order {
            let at = (r * gw + c) * pp;
            patches.extend_from_slice(&raster[at..at + pp]);
        }
        let x = ex.upload_f32(&[n, pp], &patches)?;
        let x = ex.add(&ex.matmul(&x, &self.patch_w)?, &self.patch_b)?;
        let pos = ex.upload_f32(&[n, d], &self.positions(gh, gw, &order))?;
        let mut x = ex.add(&x, &pos)?;
        // 2-D RoPE as two turns of the whole head: NeoX pair j turns by base'^(-2j/hd) / f_j
        // with base' = θ², which is θ^(-2j/(hd/2)) for the first hd/4 pairs (by the row, f = 1)
        // and, with f = 1/θ, θ^(-2(j - hd/4)/(hd/2)) for the rest (by the column); an infinite
        // f leaves a pair as it is in the other turn.
        let (nh, hd) = (self.heads, d / self.heads);
        let quarter = hd / 4;
        let mask = |by_row: bool| -> Result<Tensor> {
            let f: Vec<f32> = (0..hd / 2)
                .map(|j| match (j < quarter, by_row) {
                    (true, true) => 1.0,
                    (false, false) => 1.0 / self.theta,
                    _ => f32::INFINITY,
                })
                .collect();
            ex.upload_f32(&[hd / 2], &f)
        };
        let (f_row, f_col) = (mask(true)?, mask(false)?);
        let rows: Vec<i32> = order.iter().map(|&(r, _)| r as i32).collect();
        let cols: Vec<i32> = order.iter().map(|&(_, c)| c as i32).collect();
        let (rows, cols) = (ex.upload_i32(&[n], &rows)?, ex.upload_i32(&[n], &cols)?);
        let rope = RopeParams::new(RopeMode::Neox, hd, self.theta * self.theta);
        let rotate = |t: &Tensor| -> Result<Tensor> {
            let t = ex.rope(t, &rows, rope, Some(&f_row))?;
            ex.rope(&t, &cols, rope, Some(&f_col))
        };
        let attn = AttnParams {
            scale: 1.0 / (hd as f32).sqrt(),
            soft_cap: None,
            mask: Mask::Bidirectional,
        };
        for l in &self.layers {
            let hs = self.layer_norm(ex, &x, &l.ln1)?;
            let q = rotate(&linear(ex, &hs, &l.q)?.reshape([n, nh, hd])?)?;
            let k = rotate(&linear(ex, &hs, &l.k)?.reshape([n, nh, hd])?)?;
            let v = linear(ex, &hs, &l.v)?.reshape([n, nh, hd])?;
            let a = first(ex.run(&Op::Attention(AttentionOp::Attention(attn)), &[&q, &k, &v])?)?
                .reshape([n, d])?;
            x = ex.add(&x, &linear(ex, &a, &l.out)?)?;
            let hs = self.layer_norm(ex, &x, &l.ln2)?;
            let hs = ex.unary(UnaryOp::GeluTanh, &linear(ex, &hs, &l.up)?)?;
            x = ex.add(&x, &linear(ex, &hs, &l.down)?)?;
        }
        // The merger: each block's m² patches (consecutive rows) side by side.
        let x = self
            .layer_norm(ex, &x, &self.post_ln)?
            .reshape([n / (m * m), d * m * m])?;
        let x = ex.unary(UnaryOp::GeluErf, &linear(ex, &x, &self.fc1)?)?;
        linear(ex, &x, &self.fc2)
    }
}

/// What a Qwen3.5 `config.json` says of its vision tower, as an mmproj file's `clip.*`
/// metadata (llama.cpp's keys; the RoPE base, which llama.cpp fixes at 10000, under
/// `clip.vision.rope.freq_base`).
pub(super) fn hf_vision(
    c: &serde_json::Value,
) -> std::result::Result<Vec<(String, Value)>, String> {
    use serde_json::Value as Json;
    let vc = c.get("vision_config").unwrap_or(&Json::Null);
    let vision_type = vc.get("model_type").and_then(Json::as_str).unwrap_or("");
    if !matches!(vision_type, "qwen3_5_vision" | "qwen3_5_moe_vision") {
        return Err(format!(
            "a {vision_type:?} vision tower is not supported (Qwen3.5's is)"
        ));
    }
    if vc
        .get("deepstack_visual_indexes")
        .and_then(Json::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err("a vision tower with deepstack taps is not supported yet".into());
    }
    let u = super::tower::config_u32;
    if u(vc, "temporal_patch_size", Some(2))? != 2 {
        return Err("a temporal patch size other than 2 is not supported".into());
    }
    let act = vc
        .get("hidden_act")
        .and_then(Json::as_str)
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(format!("vision activation {act:?} is not supported"));
    }
    let theta = super::tower::axial_theta(vc, 10_000.0)?;
    let heads = u(vc, "num_heads", Some(16))?;
    let kv = |k: &str, v: Value| (format!("clip.{k}"), v);
    let meta = vec![
        kv("projector_type", Value::Str(PROJECTOR.into())),
        kv(
            "vision.patch_size",
            Value::U32(u(vc, "patch_size", Some(16))?),
        ),
        kv(
            "vision.spatial_merge_size",
            Value::U32(u(vc, "spatial_merge_size", Some(2))?),
        ),
        kv("vision.attention.head_count", Value::U32(heads)),
        kv("vision.rope.freq_base", Value::F32(theta as f32)),
        kv("vision.attention.layer_norm_epsilon", Value::F32(1e-6)),
        kv(
            "vision.projection_dim",
            Value::U32(u(vc, "out_hidden_size", None)?),
        ),
        kv(
            "vision.embedding_length",
            Value::U32(u(vc, "hidden_size", Some(1152))?),
        ),
        kv(
            "vision.feed_forward_length",
            Value::U32(u(vc, "intermediate_size", Some(4304))?),
        ),
        kv("vision.block_count", Value::U32(u(vc, "depth", Some(27))?)),
    ];
    Ok(meta)
}
