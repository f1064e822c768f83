//! What an absent or null `config.json` field means, for each model type kiln reads from
//! Hugging Face directories: what transformers (5.23) means by it for that exact model type.
//!
//! - **Absent**: the field takes the class default of the model type's config class, which
//!   differs between families (DiffusionGemma soft-caps its logits at 30 by default, Gemma 4
//!   does not; Qwen3's default head is 128 wide, Llama's is `hidden / heads`). Where the class
//!   default is `None`, the field stays absent and the loader's own handling of `None` applies
//!   (the same derivation transformers makes: `num_key_value_heads` = heads, and so on).
//! - **Null**: `None`. For some fields transformers refuses a `None` (its strict config
//!   validation): kiln refuses such a config too, rather than guessing.
//!
//! This file is the machinery; each family's file declares the table of its model types. The
//! values were read from transformers' config classes; `tests/fixtures/hf/config_defaults.py`
//! writes, per fixture, what transformers makes of each field absent and null, and
//! `tests/tests/hf_config_defaults.rs` checks kiln's reading against it.

use serde_json::Value as Json;

/// What transformers does with a field set to `null`.
#[derive(Copy, Clone, PartialEq)]
pub(crate) enum Null {
    /// Takes `None` (the loader's handling of a missing value applies).
    Kept,
    /// Refuses the config.
    Refused,
    /// Takes the class default, as when absent (RoPE parameters).
    Default,
}

/// One field: its default when absent (`None`: the class default is `None`, so it stays
/// absent), and what a `null` means.
pub(crate) struct Field {
    key: &'static str,
    absent: Option<&'static str>,
    null: Null,
}

pub(crate) const fn f(key: &'static str, absent: &'static str, null_refused: bool) -> Field {
    Field {
        key,
        absent: Some(absent),
        null: if null_refused {
            Null::Refused
        } else {
            Null::Kept
        },
    }
}

/// A field whose `null` also takes the class default.
pub(crate) const fn fd(key: &'static str, absent: &'static str) -> Field {
    Field {
        key,
        absent: Some(absent),
        null: Null::Default,
    }
}

pub(crate) const fn none(key: &'static str) -> Field {
    Field {
        key,
        absent: None,
        null: Null::Kept,
    }
}

/// Fills `text` (a text config object of `model_type`) with the class defaults `fields` gives
/// for the fields it lacks (the family of that type declares them), and names the first
/// field transformers would refuse as null, if any.
pub(crate) fn apply(model_type: &str, fields: &[Field], text: &mut Json) -> Result<(), String> {
    let Some(obj) = text.as_object_mut() else {
        return Ok(());
    };
    for fld in fields {
        let null = obj.get(fld.key).is_some_and(Json::is_null);
        match obj.get(fld.key) {
            Some(Json::Null) if fld.null == Null::Refused => {
                return Err(format!(
                    "config.json: {} is null, which transformers refuses for {model_type}",
                    fld.key
                ));
            }
            Some(_) if !(null && fld.null == Null::Default) => {}
            _ => {
                if let Some(v) = fld.absent {
                    let v: Json = serde_json::from_str(v)
                        .map_err(|e| format!("class default of {}: {e}", fld.key))?;
                    obj.insert(fld.key.to_string(), v);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(t: &str) -> &'static [Field] {
        crate::load::hf::class_defaults(t)
    }

    fn apply(t: &str, text: &mut Json) -> Result<(), String> {
        super::apply(t, fields(t), text)
    }

    #[test]
    fn every_default_parses_and_keys_are_listed_once() {
        for t in [
            "llama",
            "mistral",
            "qwen3",
            "gemma3_text",
            "qwen3_5_text",
            "qwen3_5_moe_text",
            "gemma4_text",
            "diffusion_gemma_text",
        ] {
            let mut seen = std::collections::HashSet::new();
            for fld in fields(t) {
                assert!(seen.insert(fld.key), "{t}: {} twice", fld.key);
                if let Some(v) = fld.absent {
                    serde_json::from_str::<Json>(v).expect(fld.key);
                }
            }
            let mut empty = serde_json::json!({});
            apply(t, &mut empty).expect("applies");
        }
    }

    #[test]
    fn absent_takes_the_model_types_default_and_refused_nulls_are_errors() {
        let mut d = serde_json::json!({"hidden_size": 64});
        apply("diffusion_gemma_text", &mut d).expect("applies");
        assert_eq!(d["final_logit_softcapping"], serde_json::json!(30.0));
        let mut g = serde_json::json!({});
        apply("gemma4_text", &mut g).expect("applies");
        assert!(g.get("final_logit_softcapping").is_none());
        // Null stays null where transformers takes None.
        let mut n = serde_json::json!({"final_logit_softcapping": null});
        apply("diffusion_gemma_text", &mut n).expect("applies");
        assert!(n["final_logit_softcapping"].is_null());
        let mut bad = serde_json::json!({"rms_norm_eps": null});
        let e = apply("llama", &mut bad).expect_err("refused");
        assert!(e.contains("rms_norm_eps"), "{e}");
    }
}
