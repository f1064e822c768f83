//! Limits on what a request's grammar may ask of the grammar compiler.
//!
//! A JSON schema or Lark grammar comes from a client. llguidance compiles `$ref` chains and
//! rule references by recursion, so a long chain overflows the compiling thread's stack,
//! which aborts the whole process. Measured (debug build, `tests/tests/grammar_limits.rs`'s
//! chains): on a 2 MiB stack a chain of 300 `$ref`s overflowed (200 compiled) and one of 800
//! Lark rules (600 compiled); on the [`COMPILE_STACK`] of 64 MiB that every grammar now
//! compiles on, 12,800 `$ref`s and 25,600 rules overflowed (6,400 and 12,800 compiled). So a
//! grammar is first checked here, without recursion and in time linear in its size, against
//! limits 50 times below those; a grammar over a limit is an error naming the limit.

use std::collections::HashMap;

use serde_json::Value;

use crate::error::{Error, Result};

/// The largest grammar text: a JSON schema as serialized, a Lark grammar, a regex.
pub const MAX_BYTES: usize = 512 * 1024;
/// The longest chain of `$ref`s a JSON schema may hold (a `$ref` inside the target of a
/// `$ref` inside …; a reference back into the chain is recursion, compiled lazily: it
/// counts one hop, not the chain again).
pub const MAX_REF_DEPTH: usize = 128;
/// The deepest a JSON schema may nest counting through its `$ref`s: the levels of JSON
/// down to each `$ref`, plus those of its target, and so on (one level is about 2.3 KiB of
/// the compiler's stack: a chain of 300 `$ref`s at 3 levels each overflowed 2 MiB).
pub const MAX_SCHEMA_NESTING: usize = 1024;
/// Distinct `$ref` targets in one JSON schema.
pub const MAX_REF_TARGETS: usize = 4096;
/// JSON values the `$ref` analysis may visit (nested targets are walked once each).
pub const MAX_VISITS: usize = 4_000_000;
/// Rules and terminals in one Lark grammar.
pub const MAX_RULES: usize = 4096;
/// The longest chain of rule references in a Lark grammar (a rule naming a rule naming …).
pub const MAX_RULE_DEPTH: usize = 256;
/// The stack of the thread a grammar compiles on.
pub const COMPILE_STACK: usize = 64 << 20;

fn limit(what: String) -> Error {
    Error::Model(format!("grammar: {what}"))
}

/// Checks `spec` against the limits above.
pub fn check(spec: &super::GrammarSpec) -> Result<()> {
    match spec {
        super::GrammarSpec::JsonSchema(s) => check_schema(s),
        super::GrammarSpec::Lark(g) => check_lark(g),
        super::GrammarSpec::Regex(r) => {
            if r.len() > MAX_BYTES {
                return Err(limit(format!(
                    "the regex is {} bytes, over the limit of {MAX_BYTES}",
                    r.len()
                )));
            }
            Ok(())
        }
    }
}

/// The JSON schema limits: its size, its `$ref` targets, the depth of its `$ref` chains and
/// its nesting through them. Every `$ref` must name a place in the schema (`#` or `#/…`,
/// resolved as the compiler resolves them); anything else is refused here.
pub fn check_schema(schema: &Value) -> Result<()> {
    let size = serde_json::to_vec(schema).map(|v| v.len()).unwrap_or(0);
    if size > MAX_BYTES {
        return Err(limit(format!(
            "the JSON schema is {size} bytes, over the limit of {MAX_BYTES}"
        )));
    }
    let (refs, nesting) = ref_depth(schema)?;
    if refs > MAX_REF_DEPTH {
        return Err(limit(format!(
            "the JSON schema's $ref chains are {refs} deep, over the limit of {MAX_REF_DEPTH}"
        )));
    }
    if nesting > MAX_SCHEMA_NESTING {
        return Err(limit(format!(
            "the JSON schema nests {nesting} levels deep through its $refs, over the limit of {MAX_SCHEMA_NESTING}"
        )));
    }
    Ok(())
}

/// The `$ref` strings anywhere below `v` with the JSON depth they sit at, and `v`'s own
/// depth (an explicit stack: no recursion on the client's structure). `visits` counts the
/// values walked.
fn refs_below<'a>(v: &'a Value, visits: &mut usize) -> Result<(Vec<(&'a str, usize)>, usize)> {
    let mut out = Vec::new();
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        *visits += 1;
        if *visits > MAX_VISITS {
            return Err(limit(format!(
                "the JSON schema's $refs lead through more than {MAX_VISITS} values"
            )));
        }
        deepest = deepest.max(d);
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("$ref", Value::String(r)) => out.push((r.as_str(), d + 1)),
                        _ => stack.push((x, d + 1)),
                    }
                }
            }
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    Ok((out, deepest))
}

/// The longest `$ref` chain of `schema` and its deepest nesting through `$ref`s: a graph of
/// the targets (each node a distinct JSON value, however its pointer is spelled), each
/// node's edges the targets referenced inside it, weighted by the depth of the reference.
fn ref_depth(schema: &Value) -> Result<(usize, usize)> {
    let mut ids: HashMap<*const Value, usize> = HashMap::new();
    let mut nodes: Vec<&Value> = vec![schema];
    ids.insert(schema as *const Value, 0);
    let mut hops: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut levels: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut own: Vec<usize> = Vec::new();
    let mut visits = 0;
    let mut next = 0;
    while next < nodes.len() {
        let (refs, deepest) = refs_below(nodes[next], &mut visits)?;
        let mut out = Vec::with_capacity(refs.len());
        for (r, d) in refs {
            let target = resolve(schema, r).ok_or_else(|| {
                limit(format!(
                    "the JSON schema's $ref {:?} does not name a place in the schema (only \"#\" and \"#/…\" references are followed)",
                    r.chars().take(100).collect::<String>()
                ))
            })?;
            let id = match ids.get(&(target as *const Value)) {
                Some(&id) => id,
                None => {
                    if nodes.len() >= MAX_REF_TARGETS {
                        return Err(limit(format!(
                            "the JSON schema has more than {MAX_REF_TARGETS} distinct $ref targets"
                        )));
                    }
                    nodes.push(target);
                    ids.insert(target as *const Value, nodes.len() - 1);
                    nodes.len() - 1
                }
            };
            out.push((id, d));
        }
        out.sort_unstable();
        out.dedup();
        hops.push(out.iter().map(|&(id, _)| (id, 1)).collect());
        levels.push(out);
        own.push(deepest);
        next += 1;
    }
    let zero = vec![0; nodes.len()];
    Ok((
        longest_path(&hops, &zero, 0),
        longest_path(&levels, &own, 0),
    ))
}

/// The value a `$ref` names, resolved exactly as llguidance resolves it without its
/// `referencing` feature: `#`, `#/`, or `#/a/b/0` split at `/`, each segment a key or an
/// array index, taken as written.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    if r == "#" || r == "#/" {
        return Some(root);
    }
    let mut v = root;
    for seg in r.strip_prefix("#/")?.split('/') {
        v = match v {
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => v.get(seg)?,
        };
    }
    Some(v)
}

/// The heaviest path from `start` along weighted `edges`: a node's value is the larger of
/// its `own` and, over its edges, the weight plus the child's value; an edge back to a node
/// on the path (recursion) counts its weight only. An explicit stack; each node is finished
/// once, so the time is linear in the edges.
fn longest_path(edges: &[Vec<(usize, usize)>], own: &[usize], start: usize) -> usize {
    const NEW: usize = usize::MAX;
    const OPEN: usize = usize::MAX - 1;
    let mut value = vec![NEW; edges.len()];
    // (node, next edge, best so far)
    let mut stack: Vec<(usize, usize, usize)> = vec![(start, 0, own[start])];
    value[start] = OPEN;
    while let Some(top) = stack.last_mut() {
        let (node, i, best) = *top;
        match edges[node].get(i) {
            Some(&(child, w)) => {
                top.1 += 1;
                match value[child] {
                    NEW => {
                        value[child] = OPEN;
                        stack.push((child, 0, own[child]));
                    }
                    OPEN => top.2 = best.max(w),
                    v => top.2 = best.max(w.saturating_add(v)),
                }
            }
            None => {
                value[node] = best;
                stack.pop();
                if let Some(parent) = stack.last_mut() {
                    // The edge just followed is the parent's previous one.
                    let w = edges[parent.0][parent.1 - 1].1;
                    parent.2 = parent.2.max(w.saturating_add(best));
                }
            }
        }
    }
    match value[start] {
        NEW | OPEN => 0,
        v => v,
    }
}

/// The Lark limits: size, rule count, the depth of rule references, and the JSON limits for
/// each embedded `%json {…}` schema. Text the scan cannot read as llguidance would (an
/// unterminated string or regex, a `%json` block that is not JSON) is refused: the scan
/// must never see fewer rules than the compiler.
pub fn check_lark(src: &str) -> Result<()> {
    if src.len() > MAX_BYTES {
        return Err(limit(format!(
            "the grammar is {} bytes, over the limit of {MAX_BYTES}",
            src.len()
        )));
    }
    let lark = scan_lark(src)?;
    for j in &lark.json {
        let v = serde_json::from_str::<Value>(j)
            .map_err(|e| limit(format!("a %json block is not JSON: {e}")))?;
        check_schema(&v)?;
    }
    if lark.rules.len() > MAX_RULES {
        return Err(limit(format!(
            "the grammar has {} rules and terminals, over the limit of {MAX_RULES}",
            lark.rules.len()
        )));
    }
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, (name, _)) in lark.rules.iter().enumerate() {
        ids.entry(*name).or_insert(i + 1);
    }
    // Node 0 is a virtual root naming every rule (weight 0), so the longest chain anywhere
    // counts; each reference weighs 1. A name defined twice (in nested `%lark` grammars)
    // takes the union of both bodies' references.
    let mut edges: Vec<Vec<(usize, usize)>> =
        vec![(1..=lark.rules.len()).map(|i| (i, 0)).collect()];
    edges.resize(lark.rules.len() + 1, Vec::new());
    for (name, refs) in &lark.rules {
        let Some(&me) = ids.get(name) else { continue };
        for r in refs {
            if let Some(&to) = ids.get(r) {
                edges[me].push((to, 1));
            }
        }
    }
    for e in edges.iter_mut().skip(1) {
        e.sort_unstable();
        e.dedup();
    }
    let depth = longest_path(&edges, &vec![0; edges.len()], 0);
    if depth > MAX_RULE_DEPTH {
        return Err(limit(format!(
            "the grammar's rule references chain {depth} deep, over the limit of {MAX_RULE_DEPTH}"
        )));
    }
    Ok(())
}

/// What the limits need of a Lark grammar: each definition's name with the names its body
/// mentions, and the embedded `%json` schemas' text. Tokens as llguidance's Lark lexer reads
/// them: names `[!?_]*[A-Za-z][A-Za-z0-9_-]*`, JSON-style strings on one line, `/regexes/`
/// that may span lines, `<special>` tokens, `#` and `//` comments; `%json`, `%regex` and
/// `%llguidance` blocks skipped (the first kept for the schema limits), a `%lark { … }`
/// grammar scanned as part of this one. This is a scan for the limits, not a parser (the
/// compiler reports syntax errors).
#[derive(Debug, Default)]
struct Lark<'a> {
    rules: Vec<(&'a str, Vec<&'a str>)>,
    json: Vec<&'a str>,
}

fn scan_lark(src: &str) -> Result<Lark<'_>> {
    let b = src.as_bytes();
    let mut out = Lark::default();
    let mut i = 0;
    let mut line_start = true;
    let name_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let ident = |i: usize| {
        let mut j = i;
        while j < b.len() && name_char(b[j]) {
            j += 1;
        }
        j
    };
    let unterminated = |what: &str, at: usize| {
        let line = src[..at].matches('\n').count() + 1;
        limit(format!(
            "an unterminated {what} on line {line} of the grammar"
        ))
    };
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if c == b' ' || c == b'\t' || c == b'\r' {
            i += 1;
            continue;
        }
        let at_line_start = std::mem::replace(&mut line_start, false);
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'\'' => {
                // A string: on one line.
                let mut j = i + 1;
                while j < b.len() && b[j] != c {
                    if b[j] == b'\n' {
                        return Err(unterminated("string", i));
                    }
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                if j >= b.len() {
                    return Err(unterminated("string", i));
                }
                i = j + 1;
            }
            b'/' => {
                // A regex: may span lines.
                let mut j = i + 1;
                while j < b.len() && b[j] != b'/' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                if j >= b.len() {
                    return Err(unterminated("regex", i));
                }
                i = j + 1;
            }
            b'<' => {
                // A special token `<[^<>\s]+>`; a lone `<` is one character.
                let mut j = i + 1;
                while j < b.len() && !b"<>\n\r\t ".contains(&b[j]) {
                    j += 1;
                }
                i = if j < b.len() && b[j] == b'>' {
                    j + 1
                } else {
                    i + 1
                };
            }
            b'%' => {
                let end = ident(i + 1);
                let directive = &src[i + 1..end];
                i = end;
                if directive == "lark" {
                    // A nested grammar: its `{` opens rules scanned with the rest.
                    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                        i += 1;
                    }
                    if i < b.len() && b[i] == b'{' {
                        i += 1;
                        line_start = true;
                    }
                }
            }
            b'{' => {
                // A balanced block (a `%json` schema, a `%regex` or `%llguidance` object, a
                // repetition count), strings inside it skipped.
                let start = i;
                let mut level = 0usize;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'{' => level += 1,
                        b'}' => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        b'"' => {
                            j += 1;
                            while j < b.len() && b[j] != b'"' {
                                j += if b[j] == b'\\' { 2 } else { 1 };
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                if j >= b.len() {
                    return Err(unterminated("{ block", start));
                }
                let end = j + 1;
                if src[..start].trim_end().ends_with("%json") {
                    out.json.push(&src[start..end]);
                }
                i = end;
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'!' || c == b'?' => {
                let mut name_start = i;
                while name_start < b.len() && (b[name_start] == b'!' || b[name_start] == b'?') {
                    name_start += 1;
                }
                let end = ident(name_start);
                let name = src[name_start..end].trim_start_matches('_');
                // `name:`, `name.2:` at the start of a line defines; elsewhere it references.
                let mut k = end;
                if k < b.len() && b[k] == b'.' {
                    k += 1;
                    if k < b.len() && b[k] == b'-' {
                        k += 1;
                    }
                    while k < b.len() && b[k].is_ascii_digit() {
                        k += 1;
                    }
                }
                while k < b.len() && (b[k] == b' ' || b[k] == b'\t') {
                    k += 1;
                }
                let defines = at_line_start
                    && !name.is_empty()
                    && k < b.len()
                    && b[k] == b':'
                    && b.get(k + 1) != Some(&b':');
                if defines {
                    out.rules.push((&src[name_start..end], Vec::new()));
                    i = k + 1;
                } else {
                    if end > name_start {
                        if let Some((_, refs)) = out.rules.last_mut() {
                            refs.push(&src[name_start..end]);
                        }
                    }
                    i = end.max(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chain(n: usize, back_to: Option<usize>) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = match (i + 1 < n, back_to) {
                (true, _) => {
                    json!({"type": "array", "items": {"$ref": format!("#/$defs/d{}", i + 1)}})
                }
                (false, Some(b)) => {
                    json!({"anyOf": [{"type": "null"}, {"$ref": format!("#/$defs/d{b}")}]})
                }
                (false, None) => json!({"type": "integer"}),
            };
            defs.insert(format!("d{i}"), next);
        }
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn ref_depth_counts_the_longest_chain_and_not_recursion() {
        assert_eq!(ref_depth(&json!({"type": "object"})).unwrap().0, 0);
        for n in [1, 2, 7, 300] {
            assert_eq!(ref_depth(&chain(n, None)).unwrap().0, n, "{n}");
            // A reference back to the start is recursion: one hop more, not the chain again.
            assert_eq!(ref_depth(&chain(n, Some(0))).unwrap().0, n + 1, "{n}");
        }
        // Two references to one target: linear, and counted once on each path.
        let diamond = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "string"}},
                             "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"$ref": "#/$defs/b"}}});
        assert_eq!(ref_depth(&diamond).unwrap().0, 2);
        // Pointers are taken as written (as the compiler takes them), array indices too.
        let raw = json!({"$defs": {"a~1b": {"$ref": "#/$defs/l/1"}, "l": [{}, {}]},
                         "$ref": "#/$defs/a~1b"});
        assert_eq!(ref_depth(&raw).unwrap().0, 2);
        // What the compiler would not resolve the same way is refused.
        for r in [
            "http://x/y",
            "#/nowhere",
            "#anchor",
            "urn:x",
            "#/$defs/a%7E1b",
        ] {
            let e = ref_depth(&json!({"$defs": {"a~1b": {}}, "$ref": r}))
                .unwrap_err()
                .to_string();
            assert!(e.contains("does not name a place"), "{r}: {e}");
        }
    }

    #[test]
    fn nesting_counts_through_refs() {
        // Each definition holds the next 20 levels down: 60 refs, 1,200+ levels.
        let mut defs = serde_json::Map::new();
        for i in 0..60 {
            let mut node = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            for _ in 0..20 {
                node = json!({"items": node});
            }
            defs.insert(format!("d{i}"), node);
        }
        defs.insert("d60".into(), json!({}));
        let s = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        let (refs, nesting) = ref_depth(&s).unwrap();
        assert_eq!(refs, 61);
        assert!(nesting > 60 * 20, "{nesting}");
        let e = check_schema(&s).unwrap_err().to_string();
        assert!(
            e.contains("nests") && e.contains(&MAX_SCHEMA_NESTING.to_string()),
            "{e}"
        );
    }

    #[test]
    fn a_deep_ref_chain_is_refused_naming_the_limit() {
        assert!(check_schema(&chain(MAX_REF_DEPTH, None)).is_ok());
        let e = check_schema(&chain(MAX_REF_DEPTH + 1, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("$ref") && e.contains(&MAX_REF_DEPTH.to_string()),
            "{e}"
        );
    }

    #[test]
    fn exponential_fanout_and_aliases_are_checked_in_linear_time() {
        // d_i refers to d_{i+1} twice: 2^60 paths, 60 targets.
        let mut defs = serde_json::Map::new();
        for i in 0..60 {
            let r = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": r}, {"items": {"$ref": r}}]}),
            );
        }
        defs.insert("d60".into(), json!({}));
        let t = crate::time::Instant::now();
        assert_eq!(
            ref_depth(&json!({"$defs": defs, "$ref": "#/$defs/d0"}))
                .unwrap()
                .0,
            61
        );
        // Many spellings of one big target: one node, walked once.
        let big: Vec<Value> = (0..50_000).map(|i| json!([i])).collect();
        let aliases: Vec<Value> = (0..4000)
            .map(
                |i| json!({"$ref": format!("#/{}", "$defs/".repeat(0) + &format!("big{}", i % 1))}),
            )
            .collect();
        assert_eq!(
            ref_depth(&json!({"big0": big, "anyOf": aliases}))
                .unwrap()
                .0,
            1
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn lark_rules_and_their_chains() {
        let g = "// a comment: naming x: y\nstart: a \"b: c\" /d:\ne/ <[1]>\n?a.2 : b | c\n    | d\nb: %json {\"$ref\": \"#\", \"x\": \"}\"}\nc: <|im_end|>\n!?D-x: /[0-9]+/\n%lark {\ninner: start\n}\n";
        let l = scan_lark(g).unwrap();
        let names: Vec<&str> = l.rules.iter().map(|r| r.0).collect();
        assert_eq!(names, ["start", "a", "b", "c", "D-x", "inner"]);
        assert_eq!(l.rules[0].1, ["a"]);
        assert_eq!(l.rules[1].1, ["b", "c", "d"]);
        assert!(l.rules[2].1.is_empty());
        assert_eq!(l.rules[5].1, ["start"]);
        assert_eq!(l.json, ["{\"$ref\": \"#\", \"x\": \"}\"}"]);
        for bad in [
            "start: \"open\n",
            "start: /open\n",
            "start: %json {\"a\": 1\n",
        ] {
            assert!(
                scan_lark(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("unterminated"),
                "{bad}"
            );
        }
        assert!(check_lark("start: %json {\"a\": }\n")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
        let lark_chain = |n: usize, name: &dyn Fn(usize) -> String| {
            let mut s = format!("start: {}\n", name(0));
            for i in 0..n {
                s.push_str(&format!("{}: {} \"a\"\n", name(i), name(i + 1)));
            }
            s + &format!("{}: \"b\"\n", name(n))
        };
        // start, r0 … r(n): n + 2 rules, a chain n + 1 references long; in every spelling
        // llguidance takes (hyphens, `!?` prefixes), and inside a nested grammar.
        let plain = |i: usize| format!("r{i}");
        let hyphen = |i: usize| format!("r-{i}");
        let prefixed = |i: usize| format!("!?r{i}");
        for name in [&plain as &dyn Fn(usize) -> String, &hyphen, &prefixed] {
            assert!(check_lark(&lark_chain(MAX_RULE_DEPTH - 1, name)).is_ok());
            let e = check_lark(&lark_chain(MAX_RULE_DEPTH, name))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("chain") && e.contains(&MAX_RULE_DEPTH.to_string()),
                "{e}"
            );
        }
        let nested = format!(
            "start: @sub\n%lark {{\n{}}}\n",
            lark_chain(2 * MAX_RULE_DEPTH, &plain)
        );
        assert!(check_lark(&nested)
            .unwrap_err()
            .to_string()
            .contains("chain"));
        // A regex spanning lines hides no rules.
        let hidden = lark_chain(2 * MAX_RULE_DEPTH, &plain).replacen("\"a\"", "/a\n/", 1);
        assert!(check_lark(&hidden)
            .unwrap_err()
            .to_string()
            .contains("chain"));
        // Many rules side by side: the count limit.
        let wide: String = (0..=MAX_RULES).map(|i| format!("w{i}: \"x\"\n")).collect();
        let e = check_lark(&wide).unwrap_err().to_string();
        assert!(
            e.contains("rules") && e.contains(&MAX_RULES.to_string()),
            "{e}"
        );
        // A schema embedded in a grammar meets the JSON limits.
        let deep = format!("start: %json {}\n", chain(MAX_REF_DEPTH + 1, None));
        assert!(check_lark(&deep).unwrap_err().to_string().contains("$ref"));
    }

    #[test]
    fn oversized_grammars_are_refused_naming_the_limit() {
        let big = "x".repeat(MAX_BYTES + 1);
        for spec in [
            super::super::GrammarSpec::Regex(big.clone()),
            super::super::GrammarSpec::Lark(format!("start: \"{big}\"")),
            super::super::GrammarSpec::JsonSchema(json!({"const": big})),
        ] {
            let e = check(&spec).unwrap_err().to_string();
            assert!(
                e.contains("bytes") && e.contains(&MAX_BYTES.to_string()),
                "{e}"
            );
        }
    }
}
