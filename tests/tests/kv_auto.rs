//! `--kv-type auto` on SmolLM2 (a real model: what the choice is depends on its attention),
//! over shorter runs of the calibration passage than the command uses, with K pinned to q8_0
//! so only V's types are measured (the K side is the same code): the choice keeps to its
//! budget when judged again, a budget of nothing leaves every layer at f16, and an unbounded
//! one takes every layer's smallest type.

use kiln_core::engine::RunnerConfig;
use kiln_core::kv::KvTypes;
use kiln_core::DType;
use kiln_server::kv_auto::{default_budget, judge, measure, search, Calibration};
use kiln_server::load::{load, ModelArgs};
use kiln_tests::{model_file, SMOLLM2};

#[test]
fn kv_auto_keeps_its_budget_and_its_extremes() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let mut args = ModelArgs::new(Some(path.display().to_string()), "cpu");
    args.ctx = Some(256);
    let cfg = RunnerConfig {
        max_batch_tokens: 256,
        ..RunnerConfig::default()
    };
    let mut m = load(&args, cfg).expect("SmolLM2 loads");
    let cal = Calibration::with_lengths(&m.tokenizer, 256, 128, 256).expect("calibration");
    let budget = default_budget();
    let fixed = (Some(DType::Q8_0), None);
    let costs = measure(&mut m.runner, &cal, fixed, budget, || {}).expect("measured");

    let c = search(&mut m.runner, &costs, budget, || {}).expect("searched");
    println!("chosen: {}", c.describe());
    let d = (1.0 + c.ppl_change).ln();
    assert!(c.kl <= budget && d <= budget, "{}", c.describe());
    assert!(
        c.bytes_per_token < c.f16_bytes_per_token,
        "q8_0 K alone is smaller than f16: {}",
        c.describe()
    );
    for l in 0..30 {
        assert_eq!(
            c.types.of_layer(l).0,
            DType::Q8_0,
            "K stays pinned (layer {l})"
        );
    }
    // Judged again from scratch, the choice measures the same (the runs are deterministic).
    let (kl, d2) = judge(&mut m.runner, &costs, &c.types).expect("judged");
    assert!((kl - c.kl).abs() < 1e-12 && (d2 - d).abs() < 1e-12);

    let none = search(&mut m.runner, &costs, 0.0, || {}).expect("searched");
    assert_eq!(
        none.types,
        KvTypes {
            k: DType::Q8_0,
            v: DType::F16,
            layers: Vec::new()
        },
        "with no budget every V stays f16"
    );

    let all = search(&mut m.runner, &costs, f64::INFINITY, || {}).expect("searched");
    assert_eq!(all.types, costs.smallest());
    for l in 0..30 {
        let v = all.types.of_layer(l).1;
        assert!(
            matches!(v, DType::TQ2 | DType::TQ3 | DType::TQ4),
            "layer {l}: V {v} under an unbounded budget"
        );
    }
    assert!(all.bytes_per_token < c.bytes_per_token || all.types == c.types);
}
