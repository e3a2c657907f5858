//! The dependency direction is one way: every `crate::` path in the engine's source names a
//! module of an inner layer (`frostline::LAYERS`), or of the same layer without forming a
//! cycle, and never crosses a separated pair (`frostline::LAYER_SEPARATED`). A failure lists
//! each offending import with its file and line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `crate::NAME` on a line that is not a comment, with its line number.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `use crate::{a, b}` names several modules at once.
            if name.is_empty() && after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for item in group.split(',') {
                    let item: String =
                        item.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !item.is_empty() {
                        found.push((n + 1, item));
                    }
                }
            } else if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn every_import_points_inward_and_no_layer_has_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layer_of: BTreeMap<&str, usize> =
        frostline::LAYERS.iter().enumerate().flat_map(|(i, layer)| layer.iter().map(move |m| (*m, i))).collect();
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut violations = Vec::new();
    let mut same_layer: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut modules_seen = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        if matches!(module.as_str(), "lib" | "main") {
            continue; // the crate root and the binary sit above every layer
        }
        let Some((&from, &from_layer)) = layer_of.get_key_value(module.as_str()) else {
            violations.push(format!("{}: module `{module}` is in no layer of frostline::LAYERS", relative.display()));
            continue;
        };
        modules_seen.insert(from);
        let text = std::fs::read_to_string(file).unwrap();
        for (line, name) in crate_paths(&text) {
            let Some((&to, &to_layer)) = layer_of.get_key_value(name.as_str()) else {
                // Re-exports at the crate root (`crate::Error`, `crate::Result`) are the core's.
                assert!(
                    matches!(name.as_str(), "Error" | "ErrorKind" | "Result" | "LAYERS" | "LAYER_SEPARATED"),
                    "{}:{line}: `crate::{name}` is neither a module of a layer nor a root re-export",
                    relative.display()
                );
                continue;
            };
            if to == from {
                continue;
            }
            if to_layer > from_layer {
                violations.push(format!(
                    "{}:{line}: `{from}` (layer {}) imports `{to}` (layer {}), an outer layer",
                    relative.display(),
                    from_layer + 1,
                    to_layer + 1
                ));
            } else if to_layer == from_layer {
                if frostline::LAYER_SEPARATED.iter().any(|&(a, b)| (a, b) == (from, to) || (b, a) == (from, to)) {
                    violations.push(format!(
                        "{}:{line}: `{from}` imports `{to}`; the two must not import each other",
                        relative.display()
                    ));
                }
                same_layer.entry(from).or_default().insert(to);
            }
        }
    }
    // Within a layer, imports must form no cycle.
    fn reaches<'a>(
        graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        from: &'a str,
        target: &str,
        seen: &mut BTreeSet<&'a str>,
    ) -> bool {
        graph.get(from).is_some_and(|next| {
            next.iter().any(|n| *n == target || (seen.insert(n) && reaches(graph, n, target, seen)))
        })
    }
    for (from, tos) in &same_layer {
        for to in tos {
            if reaches(&same_layer, to, from, &mut BTreeSet::new()) {
                violations.push(format!("`{from}` and `{to}` import each other (a cycle within one layer)"));
            }
        }
    }
    assert!(violations.is_empty(), "imports against the layering of lib.rs:\n{}", violations.join("\n"));
    // Every declared module exists, so the table cannot drift from the code unnoticed.
    for module in layer_of.keys() {
        assert!(modules_seen.contains(module), "frostline::LAYERS names `{module}`, which has no source file");
    }
}

/// What the ways in (`api`, `cli`) may import from the engine: its operations, its errors and
/// its vocabulary. Everything else they reach through `ops`, so an operation has one
/// implementation whichever way it is asked for. The CLI also hands `frostline run` to the
/// daemon, which is a way in itself (it serves the API), not a part of the engine.
const WAYS_IN: &[(&str, &[&str])] =
    &[("api", &["ops", "error", "model"]), ("cli", &["ops", "error", "model", "daemon"])];

#[test]
fn the_ways_in_reach_the_engine_only_through_ops() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    for (way_in, allowed) in WAYS_IN {
        let mut files = Vec::new();
        sources(&root.join(way_in), &mut files);
        assert!(!files.is_empty(), "no sources under src/{way_in}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, name) in crate_paths(&text) {
                let root_export = matches!(name.as_str(), "Error" | "ErrorKind" | "Result");
                if name != *way_in && !root_export && !allowed.contains(&name.as_str()) {
                    violations.push(format!(
                        "{}:{line}: `{way_in}` imports `crate::{name}`; call an operation of `ops` instead",
                        file.strip_prefix(&root).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "the ways in reach past `ops`:\n{}", violations.join("\n"));
}

/// The check finds what it must: an outward import, a separated pair, a grouped import.
#[test]
fn the_layer_check_reads_every_form_of_import() {
    let text = "use crate::api::Routes;\n// crate::cli::x in a comment\nlet x = crate::cli::run();\nuse crate::{engine::Engine, ops};\n";
    let names: Vec<String> = crate_paths(text).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, vec!["api", "cli", "engine", "ops"]);
}
