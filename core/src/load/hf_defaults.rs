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
//! The values were read from transformers' config classes; `tests/fixtures/hf/config_defaults.py`
//! writes, per fixture, what transformers makes of each field absent and null, and
//! `tests/tests/hf_config_defaults.rs` checks kiln's reading against it.

use serde_json::Value as Json;

/// What transformers does with a field set to `null`.
#[derive(Copy, Clone, PartialEq)]
enum Null {
    /// Takes `None` (the loader's handling of a missing value applies).
    Kept,
    /// Refuses the config.
    Refused,
    /// Takes the class default, as when absent (RoPE parameters).
    Default,
}

/// One field: its default when absent (`None`: the class default is `None`, so it stays
/// absent), and what a `null` means.
struct Field {
    key: &'static str,
    absent: Option<&'static str>,
    null: Null,
}

const fn f(key: &'static str, absent: &'static str, null_refused: bool) -> Field {
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
const fn fd(key: &'static str, absent: &'static str) -> Field {
    Field {
        key,
        absent: Some(absent),
        null: Null::Default,
    }
}

const fn none(key: &'static str) -> Field {
    Field {
        key,
        absent: None,
        null: Null::Kept,
    }
}

const LLAMA: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "2048", true),
    none("head_dim"),
    none("num_key_value_heads"),
];

const MISTRAL: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    none("head_dim"),
    f("num_key_value_heads", "8", false),
];

const QWEN3: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "32768", true),
    f("head_dim", "128", true),
    // A null count of KV heads is the count of heads (the class's own `None` handling).
    f("num_key_value_heads", "32", false),
];

const GEMMA3: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    // Null: sliding layers with no window (they still take the local RoPE).
    f("sliding_window", "4096", false),
    f("query_pre_attn_scalar", "256", true),
    f("head_dim", "256", true),
    f("num_key_value_heads", "4", true),
    none("final_logit_softcapping"),
];

const QWEN35: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "32768", true),
    f("head_dim", "256", true),
    f("num_key_value_heads", "4", true),
    f("linear_conv_kernel_dim", "4", true),
    f("linear_key_head_dim", "128", true),
    f("linear_num_key_heads", "16", true),
    f("linear_num_value_heads", "32", true),
    f("linear_value_head_dim", "128", true),
];

const QWEN35_MOE: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "32768", true),
    f("head_dim", "256", true),
    f("num_key_value_heads", "2", true),
    f("linear_conv_kernel_dim", "4", true),
    f("linear_key_head_dim", "128", true),
    f("linear_num_key_heads", "16", true),
    f("linear_num_value_heads", "32", true),
    f("linear_value_head_dim", "128", true),
    f("num_experts", "256", true),
    f("num_experts_per_tok", "8", true),
    f("moe_intermediate_size", "512", true),
    f("shared_expert_intermediate_size", "512", true),
];

/// Gemma 4's RoPE when `rope_parameters` is absent: the class default.
const GEMMA4_ROPE: &str = r#"{"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
    "rope_theta": 1000000.0}}"#;

const GEMMA4: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    f("sliding_window", "512", true),
    none("final_logit_softcapping"),
    f("attention_k_eq_v", "false", true),
    f("num_kv_shared_layers", "0", true),
    f("hidden_size_per_layer_input", "256", true),
    f("enable_moe_block", "false", true),
    fd("rope_parameters", GEMMA4_ROPE),
];

const DIFFUSION_GEMMA: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    f("sliding_window", "512", true),
    // Unlike Gemma 4's: 30. Null is no cap (transformers 5.23's forward divides by it
    // unconditionally and fails).
    f("final_logit_softcapping", "30.0", false),
    fd("rope_parameters", GEMMA4_ROPE),
];

/// The table of a text model type (`text_config`'s `model_type`, else the file's).
fn fields(model_type: &str) -> &'static [Field] {
    match model_type {
        "llama" => LLAMA,
        "mistral" => MISTRAL,
        "qwen3" => QWEN3,
        "gemma3" | "gemma3_text" => GEMMA3,
        "qwen3_5" | "qwen3_5_text" => QWEN35,
        "qwen3_5_moe" | "qwen3_5_moe_text" => QWEN35_MOE,
        // An assistant whose text config names no type of its own is a Gemma 4 text model.
        "gemma4" | "gemma4_text" | "gemma4_assistant" => GEMMA4,
        "diffusion_gemma" | "diffusion_gemma_text" => DIFFUSION_GEMMA,
        _ => &[],
    }
}

/// Fills `text` (a text config object) with the class defaults of the fields it lacks, and
/// names the first field transformers would refuse as null, if any.
pub(super) fn apply(model_type: &str, text: &mut Json) -> Result<(), String> {
    let Some(obj) = text.as_object_mut() else {
        return Ok(());
    };
    for fld in fields(model_type) {
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
