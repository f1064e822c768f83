//! Gemma 4's vision tower, read from the mmproj view (llama.cpp's `clip` architecture,
//! projector type `gemma4v`; a Hugging Face checkpoint's tower is read through the same view,
//! [`crate::load::hf::vision`]).
//!
//! Per image of `H × W` pixel values (`[3, H, W]`, in 0..1: the model itself maps them to
//! `2x − 1`): the `p × p` patches (row-major over the `H/p × W/p` grid) projected by the patch
//! matmul (no bias), plus a learned embedding of the patch's column and one of its row (a
//! `[2, P, hidden]` table); `L` layers of RMS-normed attention and MLP, each sandwiched
//! (norm before and after, then the residual add): multi-head attention over all the image's
//! patches both ways, its queries and keys RMS-normed per head and rotated by 2-D axial RoPE
//! (the first half of each head by the patch's column, the second by its row, NeoX halves,
//! base `θ`), its values RMS-normed without a weight, no query scaling; a GELU-tanh gated
//! MLP. Then `k × k` average pooling of the patch grid into the soft tokens (row-major),
//! `× √hidden`, optionally standardized (`(x − bias) · scale`), RMS-normalized without a
//! weight and projected into the text model's width.

use super::weights::Weights;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
use crate::op::{AttentionOp, AttnParams, GluOp, Mask, Op, RopeMode, RopeParams};
use crate::tensor::Tensor;

/// The projector type llama.cpp's mmproj files name this tower by.
pub const PROJECTOR: &str = "gemma4v";

/// Gemma 4's image text: its chat template writes `<|image|>` for an image, its processor
/// makes that `<|image>`, the soft tokens (`<|image|>` each), `<image|>`.
pub const IMAGE_TEXT: super::tower::ImageText = super::tower::ImageText {
    marker: "<|image|>",
    soft_token: "<|image|>",
    before: "<|image>",
    after: "<image|>",
};

struct Layer {
    ln1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    out: Tensor,
    attn_post_norm: Tensor,
    ln2: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    ffn_post_norm: Tensor,
}

/// Gemma 4's vision encoder and its projection into the text model.
pub struct Gemma4Vision {
    pub patch: usize,
    pub pool: usize,
    hidden: usize,
    heads: usize,
    heads_kv: usize,
    head_dim: usize,
    /// Positions the table holds per axis.
    positions: usize,
    pub text_width: usize,
    eps: f32,
    theta: f32,
    /// `[hidden, 3·p·p]` (channel, row, column).
    patch_w: Tensor,
    /// The column and the row tables, `[P, hidden]` each.
    pos: (Tensor, Tensor),
    layers: Vec<Layer>,
    /// `(bias, scale)` of the standardization, where the tower has one.
    standardize: Option<(Tensor, Tensor)>,
    ones_head: Tensor,
    ones_hidden: Tensor,
    /// `[text_width, hidden]`.
    proj: Tensor,
}

use super::tower::{first, meta_or, Shape};

impl Gemma4Vision {
    /// Builds the tower from an mmproj view, its weights uploaded to `ex`'s backend.
    pub fn load(f: &GgufFile, ex: &Executor) -> Result<Gemma4Vision> {
        let Shape {
            patch,
            hidden,
            ff,
            layers: n_layer,
            heads,
            text_width,
        } = Shape::read(f)?;
        let heads_kv = meta_or(f, "clip.vision.attention.head_count_kv", heads)?;
        let head_dim = meta_or(f, "clip.vision.attention.head_dim", hidden / heads)?;
        // llama.cpp's defaults for this projector where the file names none.
        let pool = meta_or(f, "clip.vision.projector.scale_factor", 3)?;
        let theta = f.get_f32("clip.vision.rope.freq_base").unwrap_or(100.0);
        let eps = f
            .get_f32("clip.vision.attention.layer_norm_epsilon")
            .unwrap_or(1e-6);
        if heads % heads_kv != 0 || head_dim % 4 != 0 || !(theta > 0.0 && theta.is_finite()) {
            return Err(Error::load(
                f.path(),
                format!("{heads} heads over {heads_kv} key/value heads of {head_dim}, RoPE base {theta}: not a tower kiln can run"),
            ));
        }
        let mut w = Weights::new(f, ex);
        let vecf = |w: &mut Weights, name: &str, n: usize| -> Result<Tensor> {
            let v = w.host_f32(name, n)?;
            ex.upload_f32(&[n], &v)
        };
        let pp = 3 * patch * patch;
        let patch_w = w
            .get("v.patch_embd.weight", &[hidden, 3, patch, patch])?
            .reshape([hidden, pp])?;
        let table = f.tensor("v.position_embd.weight")?;
        let positions = table.n_elements() / (2 * hidden).max(1);
        if positions == 0 || positions * 2 * hidden != table.n_elements() {
            return Err(Error::load(
                f.path(),
                format!(
                    "v.position_embd.weight holds {} values, not 2 tables of {hidden}-wide rows",
                    table.n_elements()
                ),
            ));
        }
        let t = w.host_f32("v.position_embd.weight", 2 * positions * hidden)?;
        let half = positions * hidden;
        let pos = (
            ex.upload_f32(&[positions, hidden], &t[..half])?,
            ex.upload_f32(&[positions, hidden], &t[half..])?,
        );
        let (qd, kvd) = (heads * head_dim, heads_kv * head_dim);
        let mut layers = Vec::with_capacity(n_layer);
        for l in 0..n_layer {
            let s = |x: &str| format!("v.blk.{l}.{x}.weight");
            layers.push(Layer {
                ln1: vecf(&mut w, &s("ln1"), hidden)?,
                q: w.get(&s("attn_q"), &[qd, hidden])?,
                k: w.get(&s("attn_k"), &[kvd, hidden])?,
                v: w.get(&s("attn_v"), &[kvd, hidden])?,
                q_norm: vecf(&mut w, &s("attn_q_norm"), head_dim)?,
                k_norm: vecf(&mut w, &s("attn_k_norm"), head_dim)?,
                out: w.get(&s("attn_out"), &[hidden, qd])?,
                attn_post_norm: vecf(&mut w, &s("attn_post_norm"), hidden)?,
                ln2: vecf(&mut w, &s("ln2"), hidden)?,
                gate: w.get(&s("ffn_gate"), &[ff, hidden])?,
                up: w.get(&s("ffn_up"), &[ff, hidden])?,
                down: w.get(&s("ffn_down"), &[hidden, ff])?,
                ffn_post_norm: vecf(&mut w, &s("ffn_post_norm"), hidden)?,
            });
        }
        let standardize = match (f.tensor("v.std_bias"), f.tensor("v.std_scale")) {
            (Ok(_), Ok(_)) => Some((
                vecf(&mut w, "v.std_bias", hidden)?,
                vecf(&mut w, "v.std_scale", hidden)?,
            )),
            _ => None,
        };
        let proj = w.get("mm.input_projection.weight", &[text_width, hidden])?;
        Ok(Gemma4Vision {
            patch,
            pool,
            hidden,
            heads,
            heads_kv,
            head_dim,
            positions,
            text_width,
            eps,
            theta,
            patch_w,
            pos,
            layers,
            standardize,
            ones_head: ex.upload_f32(&[head_dim], &vec![1.0; head_dim])?,
            ones_hidden: ex.upload_f32(&[hidden], &vec![1.0; hidden])?,
            proj,
        })
    }

    /// Soft tokens of an image of `h × w` pixel values (each side a whole number of pooled
    /// patches: what the processor makes).
    pub fn tokens(&self, h: usize, w: usize) -> usize {
        let unit = self.patch * self.pool;
        (h / unit) * (w / unit)
    }

    fn norm(&self, ex: &Executor, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        ex.rms_norm(x, w, self.eps, false)
    }

    /// The soft tokens of one image's pixel values (`[3, h, w]`, channel planes, in 0..1):
    /// `[tokens, text_width]` f32 on `ex`'s backend.
    pub fn encode(&self, ex: &Executor, pixels: &[f32], h: usize, w: usize) -> Result<Tensor> {
        let (p, d, k) = (self.patch, self.hidden, self.pool);
        if pixels.len() != 3 * h * w || h % (p * k) != 0 || w % (p * k) != 0 || h == 0 || w == 0 {
            return Err(Error::Model(format!(
                "{} pixel values for a {w}x{h} image in {p}-pixel patches pooled {k}x{k}",
                pixels.len()
            )));
        }
        let (gh, gw) = (h / p, w / p);
        if gh > self.positions || gw > self.positions {
            return Err(Error::Model(format!(
                "a {gw}x{gh} patch grid exceeds the tower's {} positions a side",
                self.positions
            )));
        }
        let n = gh * gw;
        // Mapped to 2x − 1, as the model's patch embedder does.
        let patches = super::tower::patches(pixels, h, w, p, |v| 2.0 * (v - 0.5));
        let x = ex.upload_f32(&[n, 3 * p * p], &patches)?;
        let x = ex.matmul(&x, &self.patch_w)?;
        let cols: Vec<i32> = (0..n).map(|i| (i % gw) as i32).collect();
        let rows: Vec<i32> = (0..n).map(|i| (i / gw) as i32).collect();
        let (cols, rows) = (ex.upload_i32(&[n], &cols)?, ex.upload_i32(&[n], &rows)?);
        let x = ex.add(&x, &ex.get_rows(&self.pos.0, &cols)?)?;
        let mut x = ex.add(&x, &ex.get_rows(&self.pos.1, &rows)?)?;
        // Axial RoPE as one rotation over half-heads: head h of patch i becomes rows
        // (i, h, 0) and (i, h, 1) of half the width, at the patch's column and row.
        let (hd, nh, nkv) = (self.head_dim, self.heads, self.heads_kv);
        let axial = |heads: usize| -> Result<Tensor> {
            let pos: Vec<i32> = (0..n * heads * 2)
                .map(|r| {
                    let (i, axis) = (r / (2 * heads), r % 2);
                    if axis == 0 {
                        (i % gw) as i32
                    } else {
                        (i / gw) as i32
                    }
                })
                .collect();
            ex.upload_i32(&[pos.len()], &pos)
        };
        let (pos_q, pos_kv) = (axial(nh)?, axial(nkv)?);
        let rope = RopeParams {
            mode: RopeMode::Neox,
            n_rot: hd / 2,
            base: self.theta,
            freq_scale: 1.0,
            attn_factor: 1.0,
        };
        let rotate = |t: &Tensor, heads: usize, pos: &Tensor| -> Result<Tensor> {
            let halves = t.reshape([n * heads * 2, 1, hd / 2])?;
            ex.rope(&halves, pos, rope, None)?.reshape([n, heads, hd])
        };
        let attn = AttnParams {
            scale: 1.0,
            soft_cap: None,
            mask: Mask::Bidirectional,
        };
        for l in &self.layers {
            let hs = self.norm(ex, &x, &l.ln1)?;
            let q = ex.matmul(&hs, &l.q)?.reshape([n, nh, hd])?;
            let kk = ex.matmul(&hs, &l.k)?.reshape([n, nkv, hd])?;
            let v = ex.matmul(&hs, &l.v)?.reshape([n, nkv, hd])?;
            let q = rotate(&self.norm(ex, &q, &l.q_norm)?, nh, &pos_q)?;
            let kk = rotate(&self.norm(ex, &kk, &l.k_norm)?, nkv, &pos_kv)?;
            let v = self.norm(ex, &v, &self.ones_head)?;
            let a = first(ex.run(&Op::Attention(AttentionOp::Attention(attn)), &[&q, &kk, &v])?)?
                .reshape([n, nh * hd])?;
            let o = ex.matmul(&a, &l.out)?;
            x = ex.add(&x, &self.norm(ex, &o, &l.attn_post_norm)?)?;
            let hs = self.norm(ex, &x, &l.ln2)?;
            let g = ex.glu(
                GluOp::GeGlu,
                &ex.matmul(&hs, &l.gate)?,
                &ex.matmul(&hs, &l.up)?,
            )?;
            let y = ex.matmul(&g, &l.down)?;
            x = ex.add(&x, &self.norm(ex, &y, &l.ffn_post_norm)?)?;
        }
        // k x k average pooling, then × √hidden.
        let pooled = ex.scale(
            &super::tower::avg_pool(ex, &x, gh, gw, k)?,
            (d as f32).sqrt(),
        )?;
        let pooled = match &self.standardize {
            Some((bias, scale)) => ex.mul(&ex.add(&pooled, &ex.scale(bias, -1.0)?)?, scale)?,
            None => pooled,
        };
        let normed = self.norm(ex, &pooled, &self.ones_hidden)?;
        ex.matmul(&normed, &self.proj)
    }
}

/// What a Gemma 4 `config.json` says of its vision tower, as an mmproj file's `clip.*`
/// metadata (llama.cpp's keys; the RoPE base, which llama.cpp fixes at 100, under
/// `clip.vision.rope.freq_base`).
pub(super) fn hf_vision(
    c: &serde_json::Value,
) -> std::result::Result<Vec<(String, Value)>, String> {
    use serde_json::Value as Json;
    let vc = c.get("vision_config").unwrap_or(&Json::Null);
    let vision_type = vc.get("model_type").and_then(Json::as_str).unwrap_or("");
    if vision_type != "gemma4_vision" {
        return Err(format!(
            "a {vision_type:?} vision tower is not supported (Gemma 4's is)"
        ));
    }
    if vc.get("use_clipped_linears").and_then(Json::as_bool) == Some(true) {
        return Err("a vision tower with clipped linears is not supported yet".into());
    }
    let u = super::tower::config_u32;
    let theta = super::tower::axial_theta(vc, 100.0)?;
    let heads = u(vc, "num_attention_heads", Some(12))?;
    let text = c.get("text_config").unwrap_or(&Json::Null);
    let eps = vc
        .get("rms_norm_eps")
        .and_then(Json::as_f64)
        .unwrap_or(1e-6);
    let kv = |k: &str, v: Value| (format!("clip.{k}"), v);
    let mut meta = vec![
        kv("projector_type", Value::Str(PROJECTOR.into())),
        kv("vision.image_size", Value::U32(224)),
        kv(
            "vision.patch_size",
            Value::U32(u(vc, "patch_size", Some(16))?),
        ),
        kv(
            "vision.attention.head_count_kv",
            Value::U32(u(vc, "num_key_value_heads", Some(u64::from(heads)))?),
        ),
        kv(
            "vision.attention.head_dim",
            Value::U32(u(vc, "head_dim", Some(64))?),
        ),
        kv(
            "vision.projector.scale_factor",
            Value::U32(u(vc, "pooling_kernel_size", Some(3))?),
        ),
        kv("vision.rope.freq_base", Value::F32(theta as f32)),
        kv(
            "vision.attention.layer_norm_epsilon",
            Value::F32(eps as f32),
        ),
    ];
    meta.extend(super::tower::tower_meta(vc, text, 16)?);
    Ok(meta)
}
