//! The tensor conversions of the Hugging Face loader: routed experts stacked into llama.cpp's
//! `[E, rows, cols]` tensors, Gemma's and Qwen3.5's `1 + w` norms, Qwen3.5's `-exp(A_log)`,
//! and Llama's q/k rows moved from the rotate-half RoPE layout to the interleaved one.

use super::config::Config;
use crate::error::Result;
use crate::load::gguf::TensorInfo;
use crate::tensor::DType;

/// One expert's tensor (or, with index `None`, all experts fused in one 3-D tensor).
pub(super) type Expert = (Option<usize>, DType, Vec<usize>, Vec<u8>);

/// `layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight` (one expert) or
/// `layers.{l}.mlp.experts.{gate_up,down}_proj` (all, fused): the layer, the part, the expert.
pub(super) fn expert_part(name: &str) -> Option<(usize, &'static str, Option<usize>)> {
    let rest = name.strip_prefix("layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let l: usize = l.parse().ok()?;
    let rest = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("experts."))?;
    let part = |p: &str| -> Option<&'static str> {
        match p {
            "gate_proj" => Some("gate"),
            "up_proj" => Some("up"),
            "down_proj" => Some("down"),
            "gate_up_proj" => Some("gate_up"),
            _ => None,
        }
    };
    match rest.split_once('.') {
        Some((e, p)) if e.bytes().all(|b| b.is_ascii_digit()) => {
            let p = p.strip_suffix(".weight")?;
            Some((l, part(p)?, Some(e.parse().ok()?)))
        }
        _ => Some((l, part(rest)?, None)),
    }
}

/// The experts of one layer's part as llama.cpp's `ffn_{gate,up,down}_exps` `[E, rows, cols]`
/// (a fused gate_up tensor `[E, 2F, H]` is split into gate and up).
pub(super) fn stack_experts(
    c: &Config,
    l: usize,
    part: &str,
    mut list: Vec<Expert>,
) -> Result<Vec<(TensorInfo, Vec<u8>)>> {
    let info = |name: String, dtype: DType, shape: Vec<usize>, bytes: &[u8]| TensorInfo {
        name,
        dtype,
        shape,
        offset: 0,
        nbytes: bytes.len(),
    };
    if list.len() == 1 && list[0].0.is_none() {
        let (_, dtype, shape, data) = list.remove(0);
        if shape.len() != 3 {
            return Err(c.err(format!("layer {l}: fused experts of shape {shape:?}")));
        }
        if part != "gate_up" {
            let name = format!("blk.{l}.ffn_{part}_exps.weight");
            return Ok(vec![(info(name, dtype, shape, &data), data)]);
        }
        let (e, rows, cols) = (shape[0], shape[1], shape[2]);
        if rows % 2 != 0 {
            return Err(c.err(format!("layer {l}: gate_up of {rows} rows")));
        }
        if e == 0 || data.len() % (2 * e) != 0 {
            return Err(c.err(format!(
                "layer {l}: fused gate_up experts of shape {shape:?} in {} bytes",
                data.len()
            )));
        }
        let half = data.len() / e / 2;
        let (mut gate, mut up) = (Vec::new(), Vec::new());
        for x in 0..e {
            gate.extend_from_slice(&data[2 * x * half..(2 * x + 1) * half]);
            up.extend_from_slice(&data[(2 * x + 1) * half..(2 * x + 2) * half]);
        }
        let s = vec![e, rows / 2, cols];
        return Ok(vec![
            (
                info(
                    format!("blk.{l}.ffn_gate_exps.weight"),
                    dtype,
                    s.clone(),
                    &gate,
                ),
                gate,
            ),
            (
                info(format!("blk.{l}.ffn_up_exps.weight"), dtype, s, &up),
                up,
            ),
        ]);
    }
    list.sort_by_key(|x| x.0);
    let Some((dtype, shape)) = list.first().map(|x| (x.1, x.2.clone())) else {
        return Err(c.err(format!("layer {l}: no {part} experts")));
    };
    let mut data = Vec::new();
    for (i, (e, dt, sh, d)) in list.iter().enumerate() {
        if *e != Some(i) || *dt != dtype || *sh != shape {
            return Err(c.err(format!(
                "layer {l}: the {part} experts are not numbered 0..{} with one shape and dtype",
                list.len()
            )));
        }
        data.extend_from_slice(d);
    }
    let mut s = vec![list.len()];
    s.extend(shape);
    let name = format!("blk.{l}.ffn_{part}_exps.weight");
    Ok(vec![(info(name, dtype, s, &data), data)])
}

/// `1 + w` in f32 (Gemma's and Qwen3.5's RMSNorm weights).
pub(super) fn one_plus(
    c: &Config,
    info: &TensorInfo,
    bytes: &[u8],
) -> Result<(TensorInfo, Vec<u8>)> {
    map_f32(c, info, bytes, |x| x + 1.0)
}

/// `-exp(a)` in f32.
pub(super) fn neg_exp(
    c: &Config,
    info: &TensorInfo,
    bytes: &[u8],
) -> Result<(TensorInfo, Vec<u8>)> {
    map_f32(c, info, bytes, |x| -x.exp())
}

fn map_f32(
    c: &Config,
    info: &TensorInfo,
    bytes: &[u8],
    f: impl Fn(f32) -> f32,
) -> Result<(TensorInfo, Vec<u8>)> {
    let n = info.n_elements();
    let mut v = vec![0f32; n];
    crate::quant::dequantize(info.dtype, bytes, &mut v)
        .map_err(|e| c.err(format!("tensor {}: {e}", info.name)))?;
    let out: Vec<u8> = v.iter().flat_map(|&x| f(x).to_le_bytes()).collect();
    let info = TensorInfo {
        dtype: DType::F32,
        nbytes: out.len(),
        ..info.clone()
    };
    Ok((info, out))
}

/// Reorders the rows of a q/k projection from the rotate-half RoPE layout (each head's first
/// half of rows, then its second half) to the interleaved one (pairs side by side).
pub(super) fn unrotate_half(
    c: &Config,
    info: &TensorInfo,
    bytes: &[u8],
    heads: usize,
) -> Result<Vec<u8>> {
    let rows = info.shape.first().copied().unwrap_or(0);
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) || rows == 0 {
        return Err(c.err(format!(
            "tensor {}: {rows} rows do not split into {heads} heads of even size",
            info.name
        )));
    }
    let row = bytes.len() / rows;
    let hd = rows / heads;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * (hd / 2) + i;
                out[dst * row..(dst + 1) * row].copy_from_slice(&bytes[src * row..(src + 1) * row]);
            }
        }
    }
    Ok(out)
}
