//! The element types of the paged K and V caches: one for K and one for V, with per-layer
//! overrides (`--kv-type-k`, `--kv-type-v`, `--kv-type-layers`).
//!
//! f32 is exact; f16 and bf16 halve it; q8_0 and q4_0 are ggml's 32-element blocks; `tq4`,
//! `tq3` and `tq2` are the TurboQuant-style rotated blocks of `quant/turbo.rs`. Every type's
//! rows are written by `KvWrite` (which quantizes on the device) and read in place by
//! `PagedAttention`; the CPU reference dequantizes a row at a time and computes in f32.

use std::fmt;

use crate::error::{Error, Result};
use crate::tensor::DType;

/// Layers that share one paged KV pool: the same head shapes and the same attention window.
/// Sliding-window groups release blocks that fall out of the window.
#[derive(Clone, Debug, PartialEq)]
pub struct KvGroup {
    pub layers: Vec<usize>,
    pub window: Option<usize>,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

/// The cache types of one model: K and V everywhere, unless a layer range says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvTypes {
    pub k: DType,
    pub v: DType,
    /// Later entries win where ranges overlap.
    pub layers: Vec<LayerTypes>,
}

/// Layers `first..=last` (model layer indices) with their own K and V types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerTypes {
    pub first: usize,
    pub last: usize,
    pub k: DType,
    pub v: DType,
}

impl KvTypes {
    /// The same type for K and V in every layer.
    pub fn uniform(t: DType) -> KvTypes {
        KvTypes {
            k: t,
            v: t,
            layers: Vec::new(),
        }
    }

    /// (K type, V type) of model layer `l`.
    pub fn of_layer(&self, l: usize) -> (DType, DType) {
        self.layers
            .iter()
            .rev()
            .find(|r| (r.first..=r.last).contains(&l))
            .map_or((self.k, self.v), |r| (r.k, r.v))
    }

    /// Parses a cache type name (`f16`, `q8_0`, `tq3`, ...).
    pub fn parse_type(s: &str) -> Result<DType> {
        DType::from_name(s.trim())
            .filter(|d| DType::KV_CACHE.contains(d))
            .ok_or_else(|| {
                Error::Model(format!(
                    "{s:?} is not a KV cache type: use one of {}",
                    names(&DType::KV_CACHE)
                ))
            })
    }

    /// Parses `--kv-type-layers`: comma-separated `A-B:TYPE` or `A-B:KTYPE/VTYPE` (or a single
    /// layer `A:...`), e.g. `0-3:q8_0,20-23:f16/tq3`.
    pub fn parse_layers(s: &str) -> Result<Vec<LayerTypes>> {
        let bad = |why: &str| {
            Error::Model(format!(
                "--kv-type-layers {s:?}: {why} (expected e.g. 0-3:q8_0 or 0-3:q8_0/tq3, comma-separated)"
            ))
        };
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (range, types) = part
                .split_once(':')
                .ok_or_else(|| bad(&format!("{part:?} has no ':'")))?;
            let num = |x: &str| {
                x.trim()
                    .parse::<usize>()
                    .map_err(|_| bad(&format!("{x:?} is not a layer number")))
            };
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(range)?, num(range)?),
            };
            if last < first {
                return Err(bad(&format!("the range {range:?} runs backwards")));
            }
            let (k, v) = match types.split_once('/') {
                Some((k, v)) => (Self::parse_type(k)?, Self::parse_type(v)?),
                None => {
                    let t = Self::parse_type(types)?;
                    (t, t)
                }
            };
            out.push(LayerTypes { first, last, k, v });
        }
        Ok(out)
    }

    /// Whether every layer's types can hold `groups`' heads: block types need head dims that
    /// are whole blocks, the TurboQuant types a power-of-two head dim of at least 32. The
    /// error names the layer and what is wrong.
    pub fn check(&self, groups: &[KvGroup]) -> Result<()> {
        for g in groups {
            for &l in &g.layers {
                let (k, v) = self.of_layer(l);
                for (t, d, what) in [(k, g.head_dim, "K"), (v, g.v_head_dim, "V")] {
                    if !Self::fits(t, d) {
                        return Err(Error::Model(format!(
                            "layer {l}: a {t} {what} cache cannot hold heads of {d} (needs {})",
                            if t.is_turbo() {
                                "a power of two of at least 32".to_string()
                            } else {
                                format!("a multiple of {}", t.block_size())
                            }
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether a cache of type `t` can hold heads of `d` values: block types need whole
    /// blocks, the TurboQuant types a power of two of at least 32.
    pub fn fits(t: DType, d: usize) -> bool {
        if t.is_turbo() {
            crate::quant::turbo::rotatable(d)
        } else {
            d.is_multiple_of(t.block_size())
        }
    }

    /// Bytes one token takes across `groups`' layers (K and V of every layer that holds it).
    pub fn bytes_per_token(&self, groups: &[KvGroup]) -> usize {
        let mut n = 0;
        for g in groups {
            for &l in &g.layers {
                let (k, v) = self.of_layer(l);
                n += k.bytes_for(g.n_kv_heads * g.head_dim).unwrap_or(0);
                n += v.bytes_for(g.n_kv_heads * g.v_head_dim).unwrap_or(0);
            }
        }
        n
    }
}

impl fmt::Display for KvTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)?;
        } else {
            write!(f, "K {}, V {}", self.k, self.v)?;
        }
        for r in &self.layers {
            let t = if r.k == r.v {
                r.k.to_string()
            } else {
                format!("{}/{}", r.k, r.v)
            };
            write!(f, "; layers {}-{} {t}", r.first, r.last)?;
        }
        Ok(())
    }
}

fn names(ts: &[DType]) -> String {
    ts.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(layers: Vec<usize>, d: usize) -> KvGroup {
        KvGroup {
            layers,
            window: None,
            n_kv_heads: 2,
            head_dim: d,
            v_head_dim: d,
        }
    }

    #[test]
    fn layer_overrides_parse_and_apply() {
        let mut t = KvTypes::uniform(DType::TQ3);
        t.k = DType::Q8_0;
        t.layers = KvTypes::parse_layers("0-3:q8_0, 2:f16/tq4,7:bf16").unwrap();
        assert_eq!(t.of_layer(0), (DType::Q8_0, DType::Q8_0));
        assert_eq!(t.of_layer(2), (DType::F16, DType::TQ4));
        assert_eq!(t.of_layer(3), (DType::Q8_0, DType::Q8_0));
        assert_eq!(t.of_layer(5), (DType::Q8_0, DType::TQ3));
        assert_eq!(t.of_layer(7), (DType::BF16, DType::BF16));
        for bad in ["0-3", "3-1:f16", "x:f16", "0:q4_K", "0:f16/", "0-2:i32"] {
            assert!(KvTypes::parse_layers(bad).is_err(), "{bad}");
        }
        assert!(KvTypes::parse_type("q5_0").is_err());
        assert_eq!(KvTypes::parse_type("TQ2").unwrap(), DType::TQ2);
    }

    #[test]
    fn bytes_per_token_and_head_checks() {
        // Two layers, 2 heads of 64: f16 K (256 B) + tq3 V (4 blocks of 14 = 56 B) each.
        let mut t = KvTypes::uniform(DType::F16);
        t.v = DType::TQ3;
        let g = [group(vec![0, 1], 64)];
        assert_eq!(t.bytes_per_token(&g), 2 * (256 + 56));
        assert!(t.check(&g).is_ok());
        assert!(t.check(&[group(vec![0], 96)]).is_err());
        assert!(KvTypes::uniform(DType::Q8_0)
            .check(&[group(vec![0], 96)])
            .is_ok());
        assert!(KvTypes::uniform(DType::Q4_0)
            .check(&[group(vec![0], 80)])
            .is_err());
    }
}
