//! The layers of probe-user, bottom to top, and the check that keeps them: a module may
//! import only modules of a lower layer (docs/architecture.md). A failure names the file and
//! the import that runs back up, or the modules of one layer that import each other.
//!
//! Imports are read from the source text (`crate::` and `super::` paths, in `use` lines and
//! inline), up to the file's `#[cfg(test)]` module: tests may reach anywhere.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Bottom to top. A module sits in exactly one layer; the modules of one layer do not know
/// each other.
const LAYERS: &[&[&str]] = &[
    // Utilities: no domain knowledge.
    &["stats", "duration", "counter", "apiclient", "pathpattern"],
    // Every setting, typed and checked; each stage takes its own part.
    &["config"],
    // The host and the kernel side: questions about the host, loading and attaching programs.
    &["host"],
    &["bpf"],
    // The sources and what they read at one tick (`collect::readings`).
    &["collect"],
    // The stages, each a type whose method returns its product, and the interfaces' life.
    &["observe", "lifecycle"],
    &["features"],
    &["model", "fold"],
    // What a tick produces (readings and products), and the files it is written to.
    &["snapshot"],
    &["record"],
    &["dataset"],
    // The tick loop over the stages; the judge of models.
    &["eval", "pipeline"],
    &["train", "analyze", "top", "export"],
    // The daemon and the command line.
    &["check"],
    &["run"],
    &["cli"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir` with its module path (`features/engine.rs` -> features::engine).
fn files(dir: &Path, module: &[String], out: &mut Vec<(PathBuf, Vec<String>)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            let mut m = module.to_vec();
            m.push(name);
            files(&p, &m, out);
        } else if module.is_empty() && (name == "lib" || name == "main") {
            // The crate root and `probe`'s command line compose everything.
        } else if p.extension().is_some_and(|e| e == "rs") {
            let mut m = module.to_vec();
            if name != "mod" {
                m.push(name);
            }
            out.push((p, m));
        }
    }
}

/// The source a file's imports are read from: comments dropped, the test module cut off and
/// other `#[cfg(test)]` items skipped.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            if lines.peek().is_some_and(|n| n.contains("mod ")) {
                break;
            }
            // A test-only item elsewhere: skip it to its closing brace (or `;`).
            let mut depth = 0i32;
            for l in lines.by_ref() {
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                if depth == 0 && (l.contains('}') || l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of every item of a `{...}` group that starts `s` (nested groups
/// contribute their own first segments only when the group itself is at the root).
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                depth += 1;
                item_start = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => item_start = true,
            c if c.is_whitespace() => {}
            _ if item_start && depth == 1 => {
                heads.push(ident(&s[i..]).to_string());
                item_start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The top-level modules a file imports.
fn imports(text: &str, module: &[String]) -> BTreeSet<String> {
    let code = code(text);
    let mut out = BTreeSet::new();
    let push = |rest: &str, out: &mut BTreeSet<String>| {
        let rest = rest.trim_start();
        if rest.starts_with('{') {
            out.extend(group_heads(rest));
        } else {
            out.insert(ident(rest).to_string());
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        push(&code[i + "crate::".len()..], &mut out);
    }
    // `super::` from a module's root file (`x/mod.rs`, module path [x]) reaches the crate root;
    // deeper files stay inside their top-level module, which is no import of another one.
    if module.len() == 1 {
        for (i, _) in code.match_indices("super::") {
            let mut rest = &code[i + "super::".len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                rest = r;
            }
            push(rest, &mut out);
        }
    }
    out.retain(|m| !m.is_empty() && m != "self" && m != "super" && Some(m) != module.first());
    out
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

#[test]
fn every_import_runs_down() {
    let mut all = Vec::new();
    files(&src(), &[], &mut all);
    let mut problems = Vec::new();
    let mut tops = BTreeSet::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, module) in &all {
        let top = &module[0];
        tops.insert(top.clone());
        let text = fs::read_to_string(path).unwrap();
        let rel = path.strip_prefix(src()).unwrap().display().to_string();
        let Some(own) = layer_of(top) else {
            problems.push(format!("{rel}: module `{top}` is in no layer of LAYERS"));
            continue;
        };
        for dep in imports(&text, module) {
            graph.entry(top.clone()).or_default().insert(dep.clone());
            match layer_of(&dep) {
                None => {}
                Some(l) if l < own => {}
                Some(l) if l == own => problems.push(format!(
                    "{rel}: `{top}` imports `{dep}` of its own layer ({:?})",
                    LAYERS[own]
                )),
                Some(_) => problems.push(format!(
                    "{rel}: `{top}` imports `{dep}`, a layer above it: the import runs back up"
                )),
            }
        }
    }
    for l in LAYERS.iter().flat_map(|l| l.iter()) {
        if !tops.contains(*l) {
            problems.push(format!("LAYERS names `{l}`, which src/ no longer has"));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n(imports: {graph:#?})",
        problems.join("\n")
    );
}

/// Every path a file names, whole: `use` trees expanded (`a::{b, c::d}` -> a::b, a::c::d),
/// and inline `crate::`, `super::` and `self::` paths.
fn full_paths(text: &str) -> Vec<Vec<String>> {
    fn segs(s: &str) -> (Vec<String>, &str) {
        let mut out = Vec::new();
        let mut rest = s.trim_start();
        loop {
            let id = ident(rest);
            if id.is_empty() {
                break;
            }
            out.push(id.to_string());
            rest = &rest[id.len()..];
            match rest.trim_start().strip_prefix("::") {
                Some(r) => rest = r.trim_start(),
                None => break,
            }
        }
        (out, rest)
    }
    // One use tree at the start of `s`; returns what follows it.
    fn tree<'a>(s: &'a str, prefix: &[String], out: &mut Vec<Vec<String>>) -> &'a str {
        let (mut path, rest) = segs(s);
        let mut full = prefix.to_vec();
        full.append(&mut path);
        let mut rest = rest.trim_start();
        if let Some(mut r) = rest.strip_prefix('{') {
            loop {
                r = r.trim_start();
                if let Some(after) = r.strip_prefix('}') {
                    return after;
                }
                r = tree(r, &full, out).trim_start();
                r = r.strip_prefix(',').unwrap_or(r);
            }
        }
        if let Some(r) = rest.strip_prefix('*') {
            rest = r;
        }
        if let Some(r) = rest.trim_start().strip_prefix("as ") {
            rest = &r.trim_start()[ident(r.trim_start()).len()..];
        }
        out.push(full);
        rest
    }
    let code = code(text);
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let prev_ok = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if prev_ok && code[i..].starts_with("use ") {
            let end = code[i..].find(';').map_or(code.len(), |e| i + e);
            tree(&code[i + 4..end], &[], &mut out);
            i = end;
        } else if prev_ok
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| code[i..].starts_with(p))
        {
            let (p, rest) = segs(&code[i..]);
            out.push(p);
            i = code.len() - rest.len();
        } else {
            i += 1;
        }
        while i < code.len() && !code.is_char_boundary(i) {
            i += 1;
        }
    }
    out
}

/// The module a path ends in, from the file of `module` (`is_root`: a `mod.rs`, whose
/// children are named without `self::`).
fn target(
    path: &[String],
    module: &[String],
    is_root: bool,
    known: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => module.to_vec(),
        Some("super") => {
            // `super` of a file is its directory's module; of a mod.rs, the one above.
            let mut b = module.to_vec();
            b.pop();
            b
        }
        Some(_) if is_root => module.to_vec(),
        _ => return None,
    };
    let skip = usize::from(
        path.first()
            .is_some_and(|s| s == "crate" || s == "self" || s == "super"),
    );
    let mut rest = &path[skip..];
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    if skip == 0 && !known.contains(&[module, &rest[..1]].concat()) {
        return None; // an external crate or std, not a child module
    }
    let mut best = None;
    for seg in rest {
        base.push(seg.clone());
        if known.contains(&base) {
            best = Some(base.clone());
        }
    }
    best.or_else(|| {
        known
            .contains(&base[..base.len() - rest.len()])
            .then(|| base[..base.len() - rest.len()].to_vec())
    })
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let mut all = Vec::new();
    files(&src(), &[], &mut all);
    let known: BTreeSet<Vec<String>> = all.iter().map(|(_, m)| m.clone()).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (path, module) in &all {
        let is_root = path.file_name().is_some_and(|n| n == "mod.rs");
        let text = fs::read_to_string(path).unwrap();
        for p in full_paths(&text) {
            if let Some(t) = target(&p, module, is_root, &known) {
                if &t != module {
                    graph.entry(module.clone()).or_default().insert(t);
                }
            }
        }
    }
    // Depth-first search; a grey node met again closes a circle.
    fn visit(
        n: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        circles: &mut Vec<String>,
    ) {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                0 => visit(m, g, state, stack, circles),
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let names: Vec<_> = stack[at..].iter().map(|s| s.join("::")).collect();
                    circles.push(format!("{} -> {}", names.join(" -> "), m.join("::")));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
    }
    let mut state = BTreeMap::new();
    let mut circles = Vec::new();
    for n in graph.keys() {
        if !state.contains_key(n) {
            visit(n, &graph, &mut state, &mut Vec::new(), &mut circles);
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other in a loop:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_sees_grouped_and_inline_imports() {
    let text = "use crate::{a::X, b::{c, d}, e};\nfn f() { crate::g::h(); super::i::j(); }\n\
                // crate::comment\n#[cfg(test)]\nmod tests { use crate::t; }\n";
    let top: Vec<String> = vec!["m".into()];
    let got: Vec<_> = imports(text, &top).into_iter().collect();
    assert_eq!(got, ["a", "b", "e", "g", "i"]);
    let deep: Vec<String> = vec!["m".into(), "n".into()];
    let got: Vec<_> = imports(text, &deep).into_iter().collect();
    assert_eq!(got, ["a", "b", "e", "g"]);
}

#[test]
fn the_file_reader_resolves_use_trees_to_files() {
    let known: BTreeSet<Vec<String>> = [vec!["m"], vec!["m", "a"], vec!["m", "b"], vec!["x"]]
        .into_iter()
        .map(|v| v.into_iter().map(String::from).collect())
        .collect();
    let module: Vec<String> = vec!["m".into(), "b".into()];
    let text = "use super::{a::Thing, Other};\nuse std::fmt;\nfn f() { crate::x::g(); }\n";
    let mut got: Vec<_> = full_paths(text)
        .iter()
        .filter_map(|p| target(p, &module, false, &known))
        .map(|t| t.join("::"))
        .collect();
    got.sort();
    assert_eq!(got, ["m", "m::a", "x"]);
}
