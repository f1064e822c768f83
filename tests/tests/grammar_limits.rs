//! The grammar compiler's limits (`core/src/grammar/limits.rs`) against the shapes an
//! adversarial review used to overflow a worker's stack and abort the server: `$ref`s that
//! chain definitions hundreds deep, Lark rules chained a thousand long. At each limit the
//! grammar compiles — on a caller thread with a small stack, which shows the compile does
//! not run there — and past it, and at twice the depth, it is an error naming the limit.

use kiln_core::grammar::limits::{MAX_REF_DEPTH, MAX_RULE_DEPTH, MAX_SCHEMA_NESTING};
use kiln_core::grammar::{GrammarSpec, Grammars};
use kiln_core::tokenizer::Tokenizer;
use kiln_tests::fixtures;
use kiln_tests::grammars::{lark_chain, ref_chain};
use serde_json::{json, Map, Value};

fn grammars() -> Grammars {
    let tok = Tokenizer::from_hf_file(&fixtures().join("hf/llama/tokenizer.json"))
        .expect("the tiny Llama tokenizer");
    Grammars::new(&tok, tok.vocab_size()).expect("grammars")
}

/// Compiles `spec` on a thread with a 256 KiB stack (far less than a chain at the limits
/// needs: the compile must run elsewhere); the error text, if any.
fn compile_on_small_stack(g: &Grammars, spec: GrammarSpec) -> Option<String> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn_scoped(s, || g.compile(&spec).err().map(|e| e.to_string()))
            .expect("thread")
            .join()
            .expect("no panic")
    })
}

#[test]
fn ref_chains_compile_to_the_limit_and_are_refused_past_it() {
    let g = grammars();
    assert_eq!(
        compile_on_small_stack(&g, GrammarSpec::JsonSchema(ref_chain(MAX_REF_DEPTH))),
        None
    );
    // The review's shape (a few hundred definitions, under 20 KB) and twice the limit.
    for n in [MAX_REF_DEPTH + 1, 300, 2 * MAX_REF_DEPTH, 4 * MAX_REF_DEPTH] {
        let schema = ref_chain(n);
        let e = compile_on_small_stack(&g, GrammarSpec::JsonSchema(schema))
            .unwrap_or_else(|| panic!("a chain of {n} compiled"));
        assert!(
            e.contains("$ref") && e.contains(&format!("limit of {MAX_REF_DEPTH}")),
            "{n}: {e}"
        );
    }
    assert!(ref_chain(300).to_string().len() < 20_000);
}

/// `n` definitions, each holding a reference to the next `levels` levels of `items` down.
fn nested_chain(n: usize, levels: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let mut node = json!({"$ref": format!("#/$defs/d{}", i + 1)});
        for _ in 0..levels {
            node = json!({"items": node});
        }
        defs.insert(format!("d{i}"), node);
    }
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

#[test]
fn nesting_through_refs_compiles_to_the_limit_and_is_refused_past_it() {
    let g = grammars();
    // 48 references 20 levels apart: about 1,000 levels, just under the limit.
    let at = nested_chain(48, 20);
    assert_eq!(
        compile_on_small_stack(&g, GrammarSpec::JsonSchema(at)),
        None
    );
    for (n, levels) in [(100, 20), (120, 40)] {
        let e = compile_on_small_stack(&g, GrammarSpec::JsonSchema(nested_chain(n, levels)))
            .unwrap_or_else(|| panic!("{n} × {levels} compiled"));
        assert!(
            e.contains("nests") && e.contains(&format!("limit of {MAX_SCHEMA_NESTING}")),
            "{e}"
        );
    }
}

#[test]
fn lark_rule_chains_compile_to_the_limit_and_are_refused_past_it() {
    let g = grammars();
    // start + r0 … r(n): a chain of n + 1 references.
    assert_eq!(
        compile_on_small_stack(&g, GrammarSpec::Lark(lark_chain(MAX_RULE_DEPTH - 1))),
        None
    );
    for n in [MAX_RULE_DEPTH, 1000, 2000] {
        let e = compile_on_small_stack(&g, GrammarSpec::Lark(lark_chain(n)))
            .unwrap_or_else(|| panic!("a chain of {n} compiled"));
        assert!(
            e.contains("rule references") && e.contains(&format!("limit of {MAX_RULE_DEPTH}")),
            "{n}: {e}"
        );
    }
    assert!(lark_chain(1000).len() < 30_000);
    // A schema embedded in a Lark grammar meets the schema limits.
    let embedded = format!("start: %json {}\n", ref_chain(2 * MAX_REF_DEPTH));
    let e = compile_on_small_stack(&g, GrammarSpec::Lark(embedded)).expect("refused");
    assert!(e.contains("$ref"), "{e}");
}

#[test]
fn a_grammar_the_parser_refuses_is_a_short_error() {
    let g = grammars();
    // A long grammar with a mistake at its end: the answer is a sentence or three, not the
    // grammar or the parser's state.
    let bad = lark_chain(200).replace("r200: \"b\"", "r200: \"b\" nowhere_defined");
    let e = compile_on_small_stack(&g, GrammarSpec::Lark(bad)).expect("refused");
    assert!(e.len() <= 450, "{} chars: {e}", e.len());
    assert!(e.contains("nowhere_defined"), "{e}");
    assert!(!e.contains("r150"), "{e}");
}
