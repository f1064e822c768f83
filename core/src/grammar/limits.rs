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
/// `$ref` inside …; a reference back into the chain is recursion, compiled lazily, and does
/// not count).
pub const MAX_REF_DEPTH: usize = 128;
/// Distinct `$ref` targets in one JSON schema.
pub const MAX_REF_TARGETS: usize = 4096;
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

/// The JSON schema limits: its size, its distinct `$ref` targets and its `$ref` depth.
pub fn check_schema(schema: &Value) -> Result<()> {
    let size = serde_json::to_vec(schema).map(|v| v.len()).unwrap_or(0);
    if size > MAX_BYTES {
        return Err(limit(format!(
            "the JSON schema is {size} bytes, over the limit of {MAX_BYTES}"
        )));
    }
    let depth = ref_depth(schema)?;
    if depth > MAX_REF_DEPTH {
        return Err(limit(format!(
            "the JSON schema's $ref chains are {depth} deep, over the limit of {MAX_REF_DEPTH}"
        )));
    }
    Ok(())
}

/// The `$ref` strings anywhere below `v` (an explicit stack: no recursion on the client's
/// structure).
fn refs_below(v: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("$ref", Value::String(r)) => out.push(r.as_str()),
                        _ => stack.push(x),
                    }
                }
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    out
}

/// The longest `$ref` chain of `schema`: a graph of the local targets (`#…` JSON pointers),
/// each node's edges the targets referenced anywhere inside it.
fn ref_depth(schema: &Value) -> Result<usize> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut nodes: Vec<&Value> = vec![schema];
    let mut edges: Vec<Vec<usize>> = Vec::new();
    let mut next = 0;
    while next < nodes.len() {
        let mut out = Vec::new();
        for r in refs_below(nodes[next]) {
            let id = match ids.get(r) {
                Some(&id) => id,
                None => {
                    let Some(target) = resolve(schema, r) else {
                        // Not a local pointer (a remote or `$id` reference): the compiler
                        // refuses or resolves it; nothing to follow here.
                        continue;
                    };
                    if nodes.len() > MAX_REF_TARGETS {
                        return Err(limit(format!(
                            "the JSON schema has more than {MAX_REF_TARGETS} distinct $ref targets"
                        )));
                    }
                    nodes.push(target);
                    ids.insert(r, nodes.len() - 1);
                    nodes.len() - 1
                }
            };
            out.push(id);
        }
        out.sort_unstable();
        out.dedup();
        edges.push(out);
        next += 1;
    }
    // The root itself is not reached through a `$ref`.
    Ok(longest_path(&edges, 0).saturating_sub(1))
}

/// The node a local `$ref` names: `#` or `#/json/pointer` (with `~0`, `~1` and `%xx`).
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let p = r.strip_prefix('#')?;
    if p.is_empty() {
        return Some(root);
    }
    if !p.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(p)?;
    root.pointer(&decoded)
}

fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The number of nodes on the longest path from `start` along `edges`, an edge back to a
/// node on the path (recursion) counting nothing. An explicit stack; each node is finished
/// once, so the time is linear in the edges.
fn longest_path(edges: &[Vec<usize>], start: usize) -> usize {
    const NEW: usize = usize::MAX;
    const OPEN: usize = usize::MAX - 1;
    let mut depth = vec![NEW; edges.len()];
    // (node, next edge, best child depth so far)
    let mut stack: Vec<(usize, usize, usize)> = vec![(start, 0, 0)];
    depth[start] = OPEN;
    while let Some(top) = stack.last_mut() {
        let (node, i, best) = *top;
        match edges[node].get(i) {
            Some(&child) => {
                top.1 += 1;
                match depth[child] {
                    NEW => {
                        depth[child] = OPEN;
                        stack.push((child, 0, 0));
                    }
                    OPEN => {}
                    d => top.2 = best.max(d),
                }
            }
            None => {
                depth[node] = best + 1;
                stack.pop();
                if let Some(parent) = stack.last_mut() {
                    parent.2 = parent.2.max(best + 1);
                }
            }
        }
    }
    match depth[start] {
        NEW | OPEN => 0,
        d => d,
    }
}

/// The Lark limits: size, rule count, the depth of rule references, and the JSON limits for
/// each embedded `%json {…}` schema.
pub fn check_lark(src: &str) -> Result<()> {
    if src.len() > MAX_BYTES {
        return Err(limit(format!(
            "the grammar is {} bytes, over the limit of {MAX_BYTES}",
            src.len()
        )));
    }
    let lark = scan_lark(src);
    for j in &lark.json {
        // A schema that does not parse is the compiler's to report.
        if let Ok(v) = serde_json::from_str::<Value>(j) {
            check_schema(&v)?;
        }
    }
    if lark.rules.len() > MAX_RULES {
        return Err(limit(format!(
            "the grammar has {} rules and terminals, over the limit of {MAX_RULES}",
            lark.rules.len()
        )));
    }
    let ids: HashMap<&str, usize> = lark
        .rules
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (*name, i))
        .collect();
    // Node 0 is a virtual root naming every rule, so the longest chain anywhere counts.
    let mut edges: Vec<Vec<usize>> = vec![(1..=lark.rules.len()).collect()];
    for (_, refs) in &lark.rules {
        let mut out: Vec<usize> = refs
            .iter()
            .filter_map(|r| ids.get(r).map(|&i| i + 1))
            .collect();
        out.sort_unstable();
        out.dedup();
        edges.push(out);
    }
    // Nodes on the path less the virtual root, less one: references.
    let depth = longest_path(&edges, 0).saturating_sub(2);
    if depth > MAX_RULE_DEPTH {
        return Err(limit(format!(
            "the grammar's rule references chain {depth} deep, over the limit of {MAX_RULE_DEPTH}"
        )));
    }
    Ok(())
}

/// What the limits need of a Lark grammar: each definition's name with the names its body
/// mentions, and the embedded `%json` schemas' text. Strings, regexes, comments, `<…>`
/// tokens and `{…}` blocks are skipped; this is a scan for the limits, not a parser (the
/// compiler reports syntax errors).
#[derive(Default)]
struct Lark<'a> {
    rules: Vec<(&'a str, Vec<&'a str>)>,
    json: Vec<&'a str>,
}

fn scan_lark(src: &str) -> Lark<'_> {
    let b = src.as_bytes();
    let mut out = Lark::default();
    let mut i = 0;
    let mut line_start = true;
    let ident = |i: usize| {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    // Skips a quoted span starting at `i` (the opening quote) and returns the index after it.
    let quoted = |i: usize, q: u8| {
        let mut j = i + 1;
        while j < b.len() && b[j] != q && b[j] != b'\n' {
            j += if b[j] == b'\\' { 2 } else { 1 };
        }
        (j + 1).min(b.len())
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
            b'"' | b'\'' => i = quoted(i, c),
            // A directive (`%json`, `%ignore`, `%import`): its name is not a reference.
            b'%' => i = ident(i + 1),
            b'/' => i = quoted(i, b'/'),
            b'<' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'>' && b[j] != b'\n' {
                    j += 1;
                }
                i = (j + 1).min(b.len());
            }
            b'{' => {
                // A balanced block (a `%json` schema, a `%llguidance` object, …), strings
                // inside it skipped.
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
                            j = quoted(j, b'"');
                            continue;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                let end = (j + 1).min(b.len());
                if src[..start].trim_end().ends_with("%json") {
                    out.json.push(&src[start..end]);
                }
                i = end;
            }
            c if c.is_ascii_alphabetic()
                || c == b'_'
                || (at_line_start && (c == b'?' || c == b'!')) =>
            {
                let name_start = if c == b'?' || c == b'!' { i + 1 } else { i };
                let end = ident(name_start);
                let name = &src[name_start..end];
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
                if at_line_start && !name.is_empty() && k < b.len() && b[k] == b':' {
                    out.rules.push((name, Vec::new()));
                    i = k + 1;
                } else {
                    if !name.is_empty() {
                        if let Some((_, refs)) = out.rules.last_mut() {
                            refs.push(name);
                        }
                    }
                    i = end.max(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    out
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
        assert_eq!(ref_depth(&json!({"type": "object"})).unwrap(), 0);
        for n in [1, 2, 7, 300] {
            assert_eq!(ref_depth(&chain(n, None)).unwrap(), n, "{n}");
            // A reference back to the start is recursion: the chain is no longer.
            assert_eq!(ref_depth(&chain(n, Some(0))).unwrap(), n, "{n}");
        }
        // Two references to one target: linear, and counted once on each path.
        let diamond = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "string"}},
                             "properties": {"x": {"$ref": "#/$defs/a"}, "y": {"$ref": "#/$defs/b"}}});
        assert_eq!(ref_depth(&diamond).unwrap(), 2);
        // Escaped pointers resolve; unresolvable and remote ones are left to the compiler.
        let esc = json!({"$defs": {"a/b": {"$ref": "#/$defs/c~0d"}, "c~d": {}},
                         "$ref": "#/$defs/a~1b", "items": {"$ref": "http://x/y"},
                         "not": {"$ref": "#/nowhere"}});
        assert_eq!(ref_depth(&esc).unwrap(), 2);
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
    fn exponential_ref_fanout_is_checked_in_linear_time() {
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
        let t = std::time::Instant::now();
        assert_eq!(
            ref_depth(&json!({"$defs": defs, "$ref": "#/$defs/d0"})).unwrap(),
            61
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn lark_rules_and_their_chains() {
        let g = "// a comment: naming x: y\nstart: a \"b: c\" /d:e/ <[1]>\n?a.2 : b | c\n    | d\nb: %json {\"$ref\": \"#\", \"x\": \"}\"}\nc: <|im_end|>\nD: /[0-9]+/\n";
        let l = scan_lark(g);
        let names: Vec<&str> = l.rules.iter().map(|r| r.0).collect();
        assert_eq!(names, ["start", "a", "b", "c", "D"]);
        assert_eq!(l.rules[0].1, ["a"]);
        assert_eq!(l.rules[1].1, ["b", "c", "d"]);
        assert!(l.rules[2].1.is_empty());
        assert_eq!(l.json, ["{\"$ref\": \"#\", \"x\": \"}\"}"]);
        let lark_chain = |n: usize| {
            let mut s = String::from("start: r0\n");
            for i in 0..n {
                s.push_str(&format!("r{i}: r{} \"a\"\n", i + 1));
            }
            s + &format!("r{n}: \"b\"\n")
        };
        // start, r0 … r(n): n + 2 rules, a chain n + 1 references long.
        assert!(check_lark(&lark_chain(MAX_RULE_DEPTH - 1)).is_ok());
        let e = check_lark(&lark_chain(MAX_RULE_DEPTH))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("chain") && e.contains(&MAX_RULE_DEPTH.to_string()),
            "{e}"
        );
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
