//! What an absent or null `config.json` field means: for every fixture family and every field
//! kiln reads whose meaning does not follow from the weights, kiln's reading of the config with
//! that field removed (or null) against what transformers makes of the same config
//! (`tests/fixtures/hf/config_defaults.json`, written by `config_defaults.py` with transformers
//! 5.23: the model type's class default, or an error where transformers refuses the config).

use kiln_core::load::gguf::Value;
use kiln_core::load::hf::config_metadata;
use kiln_tests::fixtures;
use serde_json::Value as Json;

fn meta_get<'m>(meta: &'m [(String, Value)], arch: &str, key: &str) -> Option<&'m Value> {
    let full = format!("{arch}.{key}");
    meta.iter().find(|(k, _)| *k == full).map(|(_, v)| v)
}

fn num(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        other => other.as_u64().map(|x| x as f64),
    }
}

fn flags(v: Option<&Value>) -> Option<Vec<bool>> {
    match v? {
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Bool(b) => Some(*b),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-30)
}

/// Checks kiln's metadata for one field against transformers' value; `None` where kiln does
/// not read the field for this family (nothing to compare).
fn agrees(
    fixture: &str,
    key: &str,
    want: &Json,
    meta: &[(String, Value)],
    arch: &str,
) -> Option<Result<(), String>> {
    let m = |k: &str| meta_get(meta, arch, k);
    let fail = |what: String| Some(Err(what));
    let ok = Some(Ok(()));
    match key {
        "rms_norm_eps" => {
            let got = num(m("attention.layer_norm_rms_epsilon"));
            match got.zip(want.as_f64()) {
                Some((g, w)) if close(g, w) => ok,
                _ => fail(format!("eps {got:?}")),
            }
        }
        "max_position_embeddings" => {
            let got = num(m("context_length"));
            (got == want.as_f64())
                .then_some(Ok(()))
                .or_else(|| fail(format!("context {got:?}")))
        }
        "sliding_window" => {
            let got = num(m("attention.sliding_window"));
            match (got, want.as_f64()) {
                (None, _) => None,
                (Some(g), Some(w)) if g == w => ok,
                // None: no window — kiln's window is the whole context.
                (Some(g), None) if Some(g) == num(m("context_length")) => ok,
                _ => fail(format!("window {got:?}")),
            }
        }
        "final_logit_softcapping" => {
            let got = num(m("final_logit_softcapping"));
            match (got, want.as_f64()) {
                (None, None) => ok,
                (Some(g), Some(w)) if close(g, w) => ok,
                _ => fail(format!("soft-cap {got:?}")),
            }
        }
        "query_pre_attn_scalar" => {
            let got = num(m("attention.scale"));
            match (got, want.as_f64()) {
                (Some(g), Some(w)) if close(g, 1.0 / w.sqrt()) => ok,
                _ => fail(format!("attention scale {got:?}")),
            }
        }
        "num_key_value_heads" if !arch.contains("gemma4") && arch != "diffusion-gemma" => {
            let got = num(m("attention.head_count_kv"));
            (got == want.as_f64())
                .then_some(Ok(()))
                .or_else(|| fail(format!("kv heads {got:?}")))
        }
        "head_dim" if !arch.contains("gemma4") && arch != "diffusion-gemma" => {
            let got = num(m("attention.key_length"));
            (got == want.as_f64())
                .then_some(Ok(()))
                .or_else(|| fail(format!("head size {got:?}")))
        }
        "rope_parameters" => {
            let theta = |p: &Json| p.get("rope_theta").and_then(Json::as_f64);
            let (full, local) = match want.get("full_attention") {
                Some(f) => (f, want.get("sliding_attention")),
                None => (want, None),
            };
            if let Some(t) = theta(full) {
                let got = num(m("rope.freq_base"));
                if got.is_none_or(|g| !close(g, t)) {
                    return fail(format!("RoPE base {got:?}"));
                }
            }
            if let Some(t) = local.and_then(theta) {
                let got = num(m("rope.local_freq_base"));
                if got.is_some_and(|g| !close(g, t)) {
                    return fail(format!("local RoPE base {got:?}"));
                }
            }
            if let Some(p) = full.get("partial_rotary_factor").and_then(Json::as_f64) {
                if let Some(g) = num(m("rope.full_partial")) {
                    if !close(g, p) {
                        return fail(format!("full-layer rotary share {g}"));
                    }
                } else if let (Some(dims), Some(hd)) = (
                    num(m("rope.dimension_count")),
                    num(m("attention.key_length")),
                ) {
                    if dims != (hd * p).floor() {
                        return fail(format!("rotated dims {dims} of {hd}"));
                    }
                }
            }
            ok
        }
        "attention_k_eq_v" => match (m("attention.k_eq_v"), want.as_bool()) {
            (Some(Value::Bool(g)), Some(w)) if *g == w => ok,
            (got, _) => fail(format!("k_eq_v {got:?}")),
        },
        "num_kv_shared_layers" => {
            let got = num(m("attention.shared_kv_layers"));
            (got == want.as_f64())
                .then_some(Ok(()))
                .or_else(|| fail(format!("shared KV layers {got:?}")))
        }
        "layer_types" => {
            let types: Vec<&str> = want.as_array()?.iter().filter_map(Json::as_str).collect();
            if let Some(s) = flags(m("attention.sliding_layers")) {
                let w: Vec<bool> = types.iter().map(|t| *t == "sliding_attention").collect();
                return (s == w)
                    .then_some(Ok(()))
                    .or_else(|| fail(format!("sliding layers {s:?}")));
            }
            if let Some(r) = flags(m("attention.recurrent_layers")) {
                let w: Vec<bool> = types.iter().map(|t| *t != "full_attention").collect();
                return (r == w)
                    .then_some(Ok(()))
                    .or_else(|| fail(format!("recurrent layers {r:?}")));
            }
            // Qwen3 lists only full layers, which is all kiln builds.
            (fixture == "qwen3" && types.iter().all(|t| *t == "full_attention")).then_some(Ok(()))
        }
        "enable_moe_block" => {
            let experts = m("expert_count").is_some();
            (Some(experts) == want.as_bool())
                .then_some(Ok(()))
                .or_else(|| fail(format!("experts {experts}")))
        }
        "hidden_size_per_layer_input" => {
            let got = num(m("embedding_length_per_layer_input"));
            (got == want.as_f64().or(Some(0.0)))
                .then_some(Ok(()))
                .or_else(|| fail(format!("per-layer input width {got:?}")))
        }
        "num_experts_per_tok" => {
            let got = num(m("expert_used_count"));
            (got == want.as_f64())
                .then_some(Ok(()))
                .or_else(|| fail(format!("experts a token {got:?}")))
        }
        _ => None,
    }
}

#[test]
fn absent_and_null_config_fields_mean_what_transformers_means() {
    let hf = fixtures().join("hf");
    let table: Json = serde_json::from_slice(
        &std::fs::read(hf.join("config_defaults.json")).expect("config_defaults.json"),
    )
    .expect("table parses");
    let cases = table["cases"].as_array().expect("cases");
    let (mut checked, mut failures) = (0, Vec::new());
    for case in cases {
        let (fixture, key, variant) = (
            case["fixture"].as_str().expect("fixture"),
            case["key"].as_str().expect("key"),
            case["variant"].as_str().expect("variant"),
        );
        let want = &case["transformers"];
        let mut root: Json = serde_json::from_slice(
            &std::fs::read(hf.join(fixture).join("config.json")).expect("config"),
        )
        .expect("config parses");
        {
            let text = match root.get_mut("text_config") {
                Some(t) => t,
                None => &mut root,
            };
            let obj = text.as_object_mut().expect("an object");
            match variant {
                "absent" => {
                    obj.remove(key);
                }
                _ => {
                    obj.insert(key.to_string(), Json::Null);
                }
            }
        }
        let label = format!("{fixture} {key} {variant} (transformers: {want})");
        let got = config_metadata(fixture, root);
        if want.as_str().is_some_and(|s| s.starts_with("error")) {
            // transformers refuses the config. Where kiln reads the field, so does kiln;
            // fields kiln derives per layer instead (Gemma 4's head sizes) are not compared.
            let per_layer = matches!(key, "head_dim" | "num_key_value_heads")
                && (fixture.starts_with("gemma4") || fixture == "diffusion_gemma");
            if !per_layer {
                checked += 1;
                if got.is_ok() {
                    failures.push(format!("{label}: kiln accepted it"));
                }
            }
            continue;
        }
        let meta = match got {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{label}: kiln refused it: {e}"));
                continue;
            }
        };
        let arch = match meta.iter().find(|(k, _)| k == "general.architecture") {
            Some((_, Value::Str(a))) => a.clone(),
            _ => panic!("{label}: no architecture"),
        };
        match agrees(fixture, key, want, &meta, &arch) {
            Some(Ok(())) => checked += 1,
            Some(Err(what)) => failures.push(format!("{label}: kiln has {what}")),
            None => {}
        }
    }
    println!("{checked} of {} cases compared", cases.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert!(
        checked >= 100,
        "only {checked} cases compared: the table or the mapping lost its cases"
    );
}

/// Gemma 4's per-layer sizes without a `per_layer_config`: full layers take
/// `global_head_dim` (512 when absent) and, only where `attention_k_eq_v` holds,
/// `num_global_key_value_heads`. The expected sizes are what transformers 5.23 gives for the
/// gemma4 fixture's config so edited (its `per_layer_config` view, layer by layer).
#[test]
fn gemma4_full_layers_take_the_global_sizes_as_transformers_does() {
    let raw: Json = serde_json::from_slice(
        &std::fs::read(fixtures().join("hf/gemma4/config.json")).expect("config"),
    )
    .expect("JSON");
    let cases: [(Option<(u64, u64, bool)>, [(u64, u64); 6]); 3] = [
        (
            None,
            [(16, 2), (16, 2), (512, 2), (16, 2), (16, 2), (512, 2)],
        ),
        (
            Some((64, 1, false)),
            [(16, 2), (16, 2), (64, 2), (16, 2), (16, 2), (64, 2)],
        ),
        (
            Some((64, 1, true)),
            [(16, 2), (16, 2), (64, 1), (16, 2), (16, 2), (64, 1)],
        ),
    ];
    for (edit, want) in cases {
        let mut root = raw.clone();
        let text = match root.get_mut("text_config") {
            Some(t) => t,
            None => &mut root,
        };
        let obj = text.as_object_mut().expect("object");
        obj.remove("per_layer_config");
        if let Some((hd, kv, k_eq_v)) = edit {
            obj.insert("global_head_dim".into(), hd.into());
            obj.insert("num_global_key_value_heads".into(), kv.into());
            obj.insert("attention_k_eq_v".into(), k_eq_v.into());
        }
        let meta = config_metadata("gemma4", root).expect("reads");
        let list = |k: &str| -> Vec<u64> {
            match meta_get(&meta, "gemma4", k) {
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).collect(),
                other => panic!("{k}: {other:?}"),
            }
        };
        let got: Vec<(u64, u64)> = list("attention.layer_key_length")
            .into_iter()
            .zip(list("attention.layer_head_count_kv"))
            .collect();
        assert_eq!(got, want, "{edit:?}");
    }
}
