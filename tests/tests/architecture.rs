//! The shape of `kiln-core`, checked on its source: no module imports another that imports
//! it back (file by file), only the engine's own files implement `Engine`, and only the
//! scheduler (and a runner used directly) allocates KV slots.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`["engine", "spec"]`) → its source, without comments and test modules.
fn modules() -> BTreeMap<Vec<String>, (PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("core/src is readable") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(&root).expect("under core/src");
            let mut m: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                m.pop();
            }
            let src = std::fs::read_to_string(&p).expect("source is UTF-8");
            out.insert(m, (p, strip(&src)));
        }
    }
    out
}

/// The source less line comments and the `#[cfg(test)]` module at its end.
fn strip(src: &str) -> String {
    let code: String = src
        .lines()
        .map(|l| match l.find("//") {
            // Not inside a string literal that holds a URL: good enough for this source.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    match code.find("#[cfg(test)]\nmod tests") {
        Some(i) => code[..i].to_string(),
        None => code,
    }
}

/// Every path a `use` tree or an expression names after `crate::` or `super::`, expanded
/// (`crate::a::{b, c::d}` gives `a::b` and `a::c::d`), with which of the two it started.
fn paths(src: &str) -> Vec<(bool, Vec<String>)> {
    let re = regex::Regex::new(r"\b(crate|super)::").expect("regex");
    let mut out = Vec::new();
    for m in re.find_iter(src) {
        let from_crate = m.as_str().starts_with("crate");
        for p in expand(&src[m.end()..]) {
            out.push((from_crate, p));
        }
    }
    out
}

/// The paths a use tree at the start of `s` names (identifiers joined by `::`, brace groups
/// expanded one level at a time).
fn expand(s: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut rest = s;
    loop {
        let n = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if n == 0 {
            if let Some(inner) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut items = Vec::new();
                let mut start = 0;
                for (i, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            items.push(&inner[start..i]);
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            items.push(&inner[start..i]);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return items
                    .into_iter()
                    .flat_map(|it| expand(it.trim_start()))
                    .map(|p| [prefix.clone(), p].concat())
                    .collect();
            }
            return vec![prefix];
        }
        prefix.push(rest[..n].to_string());
        match rest[n..].strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![prefix],
        }
    }
}

/// The import graph between files: an edge from each module to every other module it names,
/// except its own ancestors (a file inside a module reaching up to it is nesting, not a
/// dependency). A `mod.rs` naming a child by a relative path counts too.
fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules();
    let resolve = |p: &[String]| -> Option<Vec<String>> {
        (1..=p.len())
            .rev()
            .map(|i| p[..i].to_vec())
            .find(|q| mods.contains_key(q))
    };
    let child = regex::Regex::new(r"(?m)(?:^|[^:\w])([a-z_][a-z0-9_]*)::").expect("regex");
    let mut g = BTreeMap::new();
    for (m, (file, src)) in &mods {
        let dir_module = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        let parent = &m[..m.len().saturating_sub(1)];
        let mut to = BTreeSet::new();
        for (from_crate, p) in paths(src) {
            // `super::` is the parent module, from a `mod.rs` or a plain file alike.
            let base: Vec<String> = if from_crate {
                Vec::new()
            } else {
                parent.to_vec()
            };
            let full = [base, p].concat();
            if let Some(t) = resolve(&full) {
                to.insert(t);
            }
        }
        if dir_module {
            for c in child.captures_iter(src) {
                let mut full = m.clone();
                full.push(c[1].to_string());
                if mods.contains_key(&full) {
                    to.insert(full);
                }
            }
        }
        to.retain(|t| t != m && !(t.len() < m.len() && m[..t.len()] == t[..]));
        g.insert(m.clone(), to);
    }
    g
}

/// The modules on a cycle through `start`, if there is one.
fn cycle_through(
    g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    start: &Vec<String>,
) -> Option<Vec<Vec<String>>> {
    let mut stack = vec![(start.clone(), vec![start.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in g.get(&at).into_iter().flatten() {
            if next == start {
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push((next.clone(), p));
            }
        }
    }
    None
}

#[test]
fn no_module_of_core_imports_one_that_imports_it_back() {
    let g = graph();
    assert!(g.len() > 50, "only {} modules found", g.len());
    // The checker sees the edges it must: the engine's step uses the scheduler.
    let step = vec!["engine".to_string(), "step".to_string()];
    assert!(g[&step].contains(&vec!["sched".to_string()]));
    let cycles: Vec<String> = g
        .keys()
        .filter_map(|m| cycle_through(&g, m))
        .map(|c| {
            c.iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" → ")
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_finds_a_cycle_when_there_is_one() {
    // Two modules naming each other (as `engine` and `spec` once did).
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let (a, b) = (vec!["a".to_string()], vec!["b".to_string()]);
    g.insert(a.clone(), [b.clone()].into());
    g.insert(b.clone(), [a.clone()].into());
    assert!(cycle_through(&g, &a).is_some());
    g.insert(b.clone(), BTreeSet::new());
    assert!(cycle_through(&g, &a).is_none());
    assert_eq!(
        expand("sched::{kv::{A, B}, Plan}; x"),
        vec![
            vec!["sched", "kv", "A"],
            vec!["sched", "kv", "B"],
            vec!["sched", "Plan"]
        ]
        .into_iter()
        .map(|p| p.into_iter().map(String::from).collect::<Vec<_>>())
        .collect::<Vec<_>>()
    );
}

#[test]
fn only_the_engines_own_files_implement_it_and_only_the_scheduler_allocates() {
    let mods = modules();
    let own = ["batching", "step", "denoise", "handle", "images"];
    for (m, (file, src)) in &mods {
        let name = file.display();
        if src.contains("impl Engine") {
            assert!(
                m.len() == 2 && m[0] == "engine" && own.contains(&m[1].as_str()),
                "{name} implements Engine: parts the engine holds must not know it"
            );
        }
        if src.contains(".allocate_slots(") {
            assert!(
                m == &["sched"] || m == &["runner"],
                "{name} allocates KV slots; only the scheduler (and a runner used directly) may"
            );
        }
    }
}

/// A model family is one file: every Hugging Face `model_type` and GGUF architecture kiln
/// reads is written in exactly one file under `model/`, and the loader's machinery
/// (`load/hf.rs` and its helpers) names none of them.
#[test]
fn each_family_is_declared_in_its_own_file_and_the_loader_names_none() {
    let mods = modules();
    let quoted = |s: &str| format!("\"{s}\"");
    let names: Vec<&str> = kiln_core::load::hf::model_types()
        .into_iter()
        .chain(kiln_core::model::architectures().map(|(a, _)| a))
        .collect();
    assert!(names.len() >= 15, "{names:?}");
    for n in &names {
        let q = quoted(n);
        let holders: Vec<String> = mods
            .iter()
            .filter(|(_, (_, src))| src.contains(&q))
            .map(|(m, _)| m.join("::"))
            .collect();
        let in_model: Vec<&String> = holders
            .iter()
            .filter(|m| m.starts_with("model::"))
            .collect();
        assert_eq!(in_model.len(), 1, "{q} is written in {holders:?}");
        for m in &holders {
            assert!(
                !m.starts_with("load::hf"),
                "{m} names the family {q}: it belongs in the family's file"
            );
        }
    }
}

/// An op family is one stem: each module `op/<family>.rs` declares the family's ops, and the
/// same stem names its CPU reference, its conformance cases, its WebGPU launchers and its CUDA
/// launch plans. The central files (the `Op` enum and its checks, each backend's dispatch and
/// `supports_op`, the case table) match on families only and name no op of one, so a new op is
/// written in its family's files alone.
#[test]
fn each_op_family_is_one_stem_and_the_central_dispatch_names_no_op() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(ws.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let op_rs = read("core/src/op.rs");
    let stems: Vec<&str> = op_rs
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    assert!(stems.len() >= 12, "{stems:?}");
    let mut families = Vec::new();
    for stem in &stems {
        let src = read(&format!("core/src/op/{stem}.rs"));
        let ty = src
            .lines()
            .find_map(|l| {
                let name = l.strip_prefix("impl Family for ")?.strip_suffix(" {")?;
                src.contains(&format!("pub enum {name} "))
                    .then(|| name.to_string())
            })
            .unwrap_or_else(|| panic!("op/{stem}.rs declares no op family"));
        for dir in [
            "core/src/cpu",
            "core/src/validate/cases",
            "backend-wgpu/src/ops",
            "backend-cuda/src/plan",
        ] {
            let f = format!("{dir}/{stem}.rs");
            assert!(
                read(&f).contains(&ty),
                "{f} does not implement the {ty} family"
            );
        }
        families.push(ty);
    }
    // The kernels of a family are in files named after it (`attention_kv_write.cu`), but for
    // quant.cu, the K-quant formats' kernels of several families.
    for (dir, ext) in [("shaders", ".wgsl"), ("kernels", ".cu")] {
        let files = std::fs::read_dir(ws.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for f in files.filter_map(|f| f.ok()) {
            let name = f.file_name().to_string_lossy().to_string();
            let Some(stem) = name.strip_suffix(ext) else {
                continue;
            };
            assert!(
                stem == "quant"
                    || stems
                        .iter()
                        .any(|s| stem == *s || stem.starts_with(&format!("{s}_"))),
                "{dir}/{name} is named after no op family ({stems:?})"
            );
        }
    }
    for central in [
        "core/src/op.rs",
        "core/src/op/check.rs",
        "core/src/cpu/mod.rs",
        "core/src/validate/cases.rs",
        "backend-wgpu/src/ops/mod.rs",
        "backend-wgpu/src/kernels.rs",
        "backend-cuda/src/plan.rs",
    ] {
        // (A `mod tests;` declaration is not the test module at the end that `strip` cuts.)
        let src = strip(&read(central).replace("#[cfg(test)]\nmod tests;", ""));
        for ty in &families {
            assert!(
                !src.contains(&format!("{ty}::")),
                "{central} names an op of {ty}: that belongs in the family's files"
            );
        }
    }
}
