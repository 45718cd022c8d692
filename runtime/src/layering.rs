//! A test that the crate's modules import one another without cycles (ARCHITECTURE.md,
//! "Layers"): among the top-level modules of `src/`, and among the children of every
//! module that is a directory. An edge is any `crate::`, `super::` or `self::` path in a
//! module's source (tests included, comments not) that names a sibling module; `#[path]`
//! includes count as the module that includes them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path below the crate root (`["device", "cuda"]`).
type ModPath = Vec<String>;

/// Every source file under `src` with the module path it compiles as.
fn modules(src: &Path) -> BTreeMap<PathBuf, ModPath> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source directory") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).expect("below src").with_extension("");
                let mut module: ModPath =
                    relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
                if module.last().is_some_and(|last| last == "mod" || last == "lib") {
                    module.pop();
                }
                files.insert(path, module);
            }
        }
    }
    // `#[path = "file.rs"] mod name;` makes `file.rs` the module `name` of the includer.
    let includes: Vec<(PathBuf, ModPath)> = files
        .iter()
        .flat_map(|(path, module)| {
            let text = std::fs::read_to_string(path).expect("readable source file");
            path_includes(&without_comments(&text))
                .into_iter()
                .map(|(target, name)| {
                    let file = path.parent().expect("in a directory").join(target);
                    let file = file.canonicalize().expect("an included file exists");
                    let mut included = module.clone();
                    included.push(name);
                    (file, included)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for (included, module) in includes {
        let key = files.keys().find(|path| path.canonicalize().ok().as_ref() == Some(&included));
        let key = key.expect("an included file is under src").clone();
        files.insert(key, module);
    }
    files
}

/// `(file, module name)` of every `#[path = "file"] mod name;` in `text`.
fn path_includes(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("#[path = \"") {
        rest = &rest[start + "#[path = \"".len()..];
        let Some(end) = rest.find('"') else { break };
        let target = rest[..end].to_string();
        let after = &rest[end..];
        if let Some(at) = after.find("mod ") {
            let name: String =
                after[at + 4..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            found.push((target, name));
        }
    }
    found
}

/// `text` without `//` comments (line and doc comments).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path starting with `crate`, `super` or `self` in `code`, braces expanded
/// (`crate::{a, b::{c, d}}` gives `crate::a`, `crate::b::c`, `crate::b::d`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = ["crate", "super", "self"].iter().any(|word| {
            let word: Vec<char> = word.chars().collect();
            chars[i..].starts_with(&word)
                && (i == 0 || !is_ident(chars[i - 1]))
                && chars.get(i + word.len()) == Some(&':')
        });
        if starts {
            let (expanded, end) = expand(&chars, i);
            found.extend(expanded);
            i = end;
        } else {
            i += 1;
        }
    }
    found
}

/// The paths of the use-tree starting at `chars[start]`, and where it ends.
fn expand(chars: &[char], start: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut i = start;
    loop {
        let begin = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        if i > begin {
            prefix.push(chars[begin..i].iter().collect::<String>());
        }
        if chars[i..].starts_with(&[':', ':']) {
            i += 2;
            if chars.get(i) == Some(&'{') {
                let mut found = Vec::new();
                i += 1;
                loop {
                    while chars.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                        i += 1;
                    }
                    if chars.get(i).is_none_or(|c| *c == '}') {
                        return (found, i + 1);
                    }
                    let (inner, end) = expand(chars, i);
                    found.extend(inner.into_iter().map(|tail| [prefix.clone(), tail].concat()));
                    i = end.max(i + 1);
                    while chars.get(i).is_some_and(|c| *c != ',' && *c != '}') {
                        i += 1;
                    }
                }
            }
        } else {
            return (vec![prefix], i);
        }
    }
}

/// `path`, as written in module `from`, resolved to a path from the crate root.
fn resolve(from: &ModPath, path: &[String]) -> ModPath {
    match path.first().map(String::as_str) {
        Some("crate") => path[1..].to_vec(),
        _ => {
            let mut module = from.clone();
            let mut rest = path;
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => drop(module.pop()),
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            [module, rest.to_vec()].concat()
        }
    }
}

/// For every module with children: the edges between its children.
fn graphs(src: &Path) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let files = modules(src);
    let known: BTreeSet<ModPath> = files.values().cloned().collect();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (path, module) in &files {
        let text = std::fs::read_to_string(path).expect("readable source file");
        for written in paths(&without_comments(&text)) {
            let target = resolve(module, &written);
            for depth in 0..module.len() {
                let parent = &module[..depth];
                let (Some(from), Some(to)) = (module.get(depth), target.get(depth)) else {
                    continue;
                };
                if target.starts_with(parent) && from != to && known.contains(&target[..=depth]) {
                    let graph = graphs.entry(parent.to_vec()).or_default();
                    graph.entry(from.clone()).or_default().insert(to.clone());
                }
            }
        }
    }
    graphs
}

/// The cycles of `graph`: its strongly connected components of more than one node.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|node| (node, reaches(node))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (node, reached) in &reach {
        let component: BTreeSet<String> = reached
            .iter()
            .filter(|other| reach.get(other).is_some_and(|back| back.contains(*node)))
            .cloned()
            .collect();
        if component.len() > 1 && !found.contains(&component) {
            found.push(component);
        }
    }
    found
}

#[test]
fn modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graphs = graphs(&src);
    assert!(graphs.get(&Vec::new()).is_some_and(|top| top.len() > 10), "the scan finds edges");
    let found: Vec<String> = graphs
        .iter()
        .flat_map(|(parent, graph)| {
            cycles(graph).into_iter().map(move |cycle| {
                let names: Vec<&str> = cycle.iter().map(String::as_str).collect();
                let module = ["crate".to_string(), parent.join("::")].join("::");
                format!("in {}: {}", module.trim_end_matches(':'), names.join(" <-> "))
            })
        })
        .collect();
    assert!(found.is_empty(), "module import cycles: {found:#?}");
}

#[test]
fn the_scan_sees_grouped_and_relative_paths() {
    let code = "use crate::{a::{b, c}, d};\nuse super::e::f; let x = self::g::h();";
    let found: Vec<String> = paths(code).iter().map(|path| path.join("::")).collect();
    assert_eq!(found, ["crate::a::b", "crate::a::c", "crate::d", "super::e::f", "self::g::h"]);
    let from = vec!["engine".to_string(), "executor".to_string()];
    let super_path: Vec<String> = ["super", "queue"].map(String::from).to_vec();
    assert_eq!(resolve(&from, &super_path), ["engine", "queue"]);
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["a".to_string(), "c".to_string()]));
    assert_eq!(cycles(&graph), [BTreeSet::from(["a".to_string(), "b".to_string()])]);
}
