//! The layout is the architecture: dependencies between the modules of `src/` point one way.
//!
//! `domain` ← `sources`, `exports`, `store`, `db` ← `config` ← `ledger` ← `http`, `workers`,
//! `cli`, `collectors` ← `server`
//!
//! A module may use modules of its own top-level module and of layers to its left, never one
//! to its right, and never a sibling of its own layer (the server wires those together).
//! The domain is pure: no database, web framework or runtime, and no reader or writer of a
//! foreign format (those are the adapters of `sources` and `exports`, pure too). Only the
//! ledger reaches `store` and `db`. Every statement in `store` is checked by the compiler,
//! except those assembled at run time, which go through `store::dynamic`. And no two modules
//! import each other, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module of `src/` and its layer; a lower layer is further left.
const LAYERS: [(&str, u8); 12] = [
    ("domain", 0),
    ("sources", 1),
    ("exports", 1),
    ("store", 1),
    ("db", 1),
    ("config", 2),
    ("ledger", 3),
    ("http", 4),
    ("workers", 4),
    ("cli", 4),
    ("collectors", 4),
    ("server", 5),
];

/// Crates the pure domain must not touch.
const IMPURE_CRATES: [&str; 8] = [
    "sqlx",
    "axum",
    "tokio",
    "tower",
    "tower_http",
    "reqwest",
    "hyper",
    "lettre",
];

/// Crates that read or write a file format: an adapter's, not the domain's.
const FORMAT_CRATES: [&str; 2] = ["csv", "flate2"];

/// Systems and formats outside taskledger: a domain module named after one is an adapter.
const FOREIGN: [&str; 7] = [
    "slurm",
    "sacct",
    "kubernetes",
    "prometheus",
    "focus",
    "demo",
    "trace",
];

/// Top-level modules as pure as the domain.
const PURE: [&str; 3] = ["domain", "sources", "exports"];

/// Whether `code` names the crate `name` as a path (`name::…`), not as the tail of another.
fn uses_crate(code: &str, name: &str) -> bool {
    code.match_indices(&format!("{name}::")).any(|(index, _)| {
        index == 0
            || !code[..index]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

fn layer_of(module: &str) -> Option<u8> {
    let top = module.split("::").next()?;
    LAYERS
        .iter()
        .find(|(name, _)| *name == top)
        .map(|(_, l)| *l)
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// `src/ledger/reports/mod.rs` → `ledger::reports`; `lib.rs` and `main.rs` are the root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    match parts.as_slice() {
        [only] if only == "lib" || only == "main" => None,
        _ => Some(parts.join("::")),
    }
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The code of a file without comments, so that prose naming a path is not a dependency,
/// and without its unit tests (the module at its end), whose `super` is the file itself.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(index) => &text[..index],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(index) => &line[..index],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths of a use tree starting at `text` (just after `crate::`), e.g.
/// `{ledger::cost, store::{self, rollups}}` → `ledger::cost`, `store`, `store::rollups`.
fn use_tree_paths(text: &str) -> Vec<String> {
    fn parse(chars: &[char], at: &mut usize, prefix: &str, out: &mut Vec<String>) {
        let mut path = prefix.to_owned();
        loop {
            while *at < chars.len() && chars[*at].is_whitespace() {
                *at += 1;
            }
            if *at < chars.len() && chars[*at] == '{' {
                *at += 1;
                loop {
                    parse(chars, at, &path, out);
                    while *at < chars.len() && chars[*at].is_whitespace() {
                        *at += 1;
                    }
                    match chars.get(*at) {
                        Some(',') => *at += 1,
                        Some('}') => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *at < chars.len() && chars[*at].is_whitespace() {
                        *at += 1;
                    }
                    if chars.get(*at) == Some(&'}') {
                        *at += 1;
                        return;
                    }
                }
            }
            let start = *at;
            while *at < chars.len() && (chars[*at].is_alphanumeric() || chars[*at] == '_') {
                *at += 1;
            }
            let segment: String = chars[start..*at].iter().collect();
            if segment.is_empty() {
                break;
            }
            if segment != "self" {
                path = if path.is_empty() {
                    segment
                } else {
                    format!("{path}::{segment}")
                };
            }
            if chars.get(*at) == Some(&':') && chars.get(*at + 1) == Some(&':') {
                *at += 2;
            } else {
                break;
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    parse(&chars, &mut 0, "", &mut out);
    out
}

/// The child modules a file declares (`mod lines;`), which it may name by a bare path.
fn declared_children(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line.strip_prefix("pub ").unwrap_or(line);
            let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_owned())
        })
        .collect()
}

/// The modules a file refers to through `crate::`, `super::`, `self::` and child-module
/// paths, resolved to the longest known module.
fn references(code: &str, module: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
    let children: Vec<(String, String)> = declared_children(code)
        .into_iter()
        .map(|child| (format!("{child}::"), format!("{module}::{child}")))
        .collect();
    let mut markers: Vec<(&str, &str)> =
        vec![("crate::", ""), ("super::", parent), ("self::", module)];
    markers.extend(
        children
            .iter()
            .map(|(marker, base)| (marker.as_str(), base.as_str())),
    );
    let mut found = BTreeSet::new();
    for (marker, base) in markers {
        let mut rest = code;
        while let Some(index) = rest.find(marker) {
            let preceded_by_path = index > 0
                && rest[..index]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[index + marker.len()..];
            if preceded_by_path {
                continue;
            }
            let paths = use_tree_paths(rest);
            // A child's bare path names at least the child itself.
            let paths = if marker.ends_with("::")
                && !["crate::", "super::", "self::"].contains(&marker)
                && paths.is_empty()
            {
                vec![String::new()]
            } else {
                paths
            };
            for path in paths {
                let full = match (base.is_empty(), path.is_empty()) {
                    (true, _) => path,
                    (false, true) => base.to_owned(),
                    (false, false) => format!("{base}::{path}"),
                };
                let mut candidate = full.as_str();
                loop {
                    if known.contains(candidate) {
                        found.insert(candidate.to_owned());
                        break;
                    }
                    match candidate.rsplit_once("::") {
                        Some((shorter, _)) => candidate = shorter,
                        None => break,
                    }
                }
            }
        }
    }
    found.remove(module);
    found
}

struct Graph {
    /// Module → (file, the modules it refers to).
    edges: BTreeMap<String, (PathBuf, BTreeSet<String>)>,
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .filter_map(|file| module_of(&src, file).map(|module| (module, file.clone())))
        .collect();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let edges = modules
        .into_iter()
        .map(|(module, file)| {
            let code = code_of(&fs::read_to_string(&file).expect("a readable source file"));
            let refs = references(&code, &module, &known);
            (module, (file, refs))
        })
        .collect();
    Graph { edges }
}

#[test]
fn every_top_level_module_has_a_layer() {
    let graph = graph();
    let unplaced: BTreeSet<&str> = graph
        .edges
        .keys()
        .map(|m| top(m))
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "give these modules a layer in tests/architecture.rs: {unplaced:?}"
    );
}

#[test]
fn dependencies_point_one_way() {
    let graph = graph();
    let mut broken = Vec::new();
    for (module, (file, refs)) in &graph.edges {
        let Some(own) = layer_of(module) else {
            continue;
        };
        for target in refs {
            if top(target) == top(module) {
                continue;
            }
            let Some(theirs) = layer_of(target) else {
                continue;
            };
            if theirs >= own {
                broken.push(format!(
                    "{} ({module}, layer {own}) uses {target} (layer {theirs})",
                    file.display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "dependencies must point to lower layers only:\n{}",
        broken.join("\n")
    );
}

/// Modules that reach data only through `ledger`: neither `store` nor `db` directly (the
/// server, which wires the process together, opens the database itself).
const THROUGH_LEDGER: [&str; 4] = ["http", "workers", "cli", "collectors"];

#[test]
fn handlers_reach_data_only_through_the_ledger() {
    let graph = graph();
    let mut skipping = Vec::new();
    for (module, (file, refs)) in &graph.edges {
        if !THROUGH_LEDGER.contains(&top(module)) {
            continue;
        }
        for target in refs {
            if matches!(top(target), "store" | "db") {
                skipping.push(format!("{} ({module}) uses {target}", file.display()));
            }
        }
    }
    assert!(
        skipping.is_empty(),
        "reach data through a ledger function, not past it:\n{}",
        skipping.join("\n")
    );
}

#[test]
fn the_domain_and_its_adapters_are_pure() {
    let graph = graph();
    let mut impure = Vec::new();
    for (module, (file, _)) in graph.edges.iter().filter(|(m, _)| PURE.contains(&top(m))) {
        let code = code_of(&fs::read_to_string(file).expect("a readable source file"));
        for name in IMPURE_CRATES {
            if uses_crate(&code, name) {
                impure.push(format!("{} ({module}) uses {name}", file.display()));
            }
        }
    }
    assert!(
        impure.is_empty(),
        "the domain, sources and exports are free of I/O:\n{}",
        impure.join("\n")
    );
}

#[test]
fn the_domain_holds_no_format_adapter() {
    let graph = graph();
    let mut adapters = Vec::new();
    for (module, (file, _)) in graph.edges.iter().filter(|(m, _)| top(m) == "domain") {
        if let Some(name) = module
            .split("::")
            .find(|segment| FOREIGN.iter().any(|foreign| segment.contains(foreign)))
        {
            adapters.push(format!(
                "{} ({module}) is named after {name}",
                file.display()
            ));
        }
        let code = code_of(&fs::read_to_string(file).expect("a readable source file"));
        for name in FORMAT_CRATES {
            if uses_crate(&code, name) {
                adapters.push(format!("{} ({module}) uses {name}", file.display()));
            }
        }
    }
    assert!(
        adapters.is_empty(),
        "reading or writing a file format is an adapter's work: move it to src/sources/ or \
         src/exports/:\n{}",
        adapters.join("\n")
    );
}

#[test]
fn no_module_depends_on_itself_through_others() {
    let graph = graph();
    let mut cycles = BTreeSet::new();
    for start in graph.edges.keys() {
        // Depth-first search for a path back to `start`.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((module, path)) = stack.pop() {
            let Some((_, refs)) = graph.edges.get(&module) else {
                continue;
            };
            for next in refs {
                if next == start {
                    let mut cycle = path.clone();
                    cycle.push(start.clone());
                    let smallest = cycle[..cycle.len() - 1]
                        .iter()
                        .min()
                        .expect("a cycle has members")
                        .clone();
                    if smallest == *start {
                        cycles.insert(cycle.join(" → "));
                    }
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles between modules:\n{}",
        cycles.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    assert_eq!(
        use_tree_paths("{ledger::cost, store::{self, rollups}};"),
        vec!["ledger::cost", "store", "store::rollups"]
    );
    let known: BTreeSet<String> = ["http::cost", "ledger::cost", "store", "store::rollups"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let code = "use crate::ledger::cost::{CostOf, month_cost};\nlet x = crate::store::rollups::compact(pool);";
    assert_eq!(
        references(code, "http::cost", &known),
        ["ledger::cost", "store::rollups"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
    let known: BTreeSet<String> = ["ledger::reports", "ledger::reports::lines"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let parent = "mod lines;\nlet x = lines::month_lines(conn);";
    assert_eq!(
        references(parent, "ledger::reports", &known),
        BTreeSet::from(["ledger::reports::lines".to_owned()])
    );
    let child = "use super::{MonthlyReport};";
    assert_eq!(
        references(child, "ledger::reports::lines", &known),
        BTreeSet::from(["ledger::reports".to_owned()])
    );
    let graph = graph();
    let (_, refs) = &graph.edges["http::cost"];
    assert!(refs.contains("ledger::cost"), "{refs:?}");
}

/// The calls that run a statement sqlx checks only when it runs.
const RUN_TIME_CHECKED: [&str; 6] = [
    "sqlx::query(",
    "sqlx::query_as(",
    "sqlx::query_as::<",
    "sqlx::query_scalar(",
    "sqlx::query_with(",
    "sqlx::query_as_with(",
];

/// The statements of `store`: compile-checked macros, and those assembled at run time (which
/// go through `store::dynamic`), by file.
struct Statements {
    checked: usize,
    dynamic: Vec<String>,
    unchecked: Vec<String>,
    fixed_text_in_dynamic: Vec<String>,
}

fn store_statements() -> Statements {
    let graph = graph();
    let mut statements = Statements {
        checked: 0,
        dynamic: Vec::new(),
        unchecked: Vec::new(),
        fixed_text_in_dynamic: Vec::new(),
    };
    for (module, (file, _)) in graph.edges.iter().filter(|(m, _)| top(m) == "store") {
        let code = code_of(&fs::read_to_string(file).expect("a readable source file"));
        let at = |index: usize| {
            format!(
                "{}:{}",
                file.display(),
                code[..index].matches('\n').count() + 1
            )
        };
        for name in ["query!(", "query_as!(", "query_scalar!("] {
            statements.checked += code.matches(&format!("sqlx::{name}")).count();
        }
        if module == "store::dynamic" {
            continue;
        }
        for call in RUN_TIME_CHECKED {
            for (index, _) in code.match_indices(call) {
                statements.unchecked.push(at(index));
            }
        }
        for (index, _) in code.match_indices("Binder::new()") {
            statements.dynamic.push(at(index));
        }
        for (index, matched) in code.match_indices("dynamic::query") {
            statements.dynamic.push(at(index));
            let rest = code[index + matched.len()..].trim_start_matches(|c: char| {
                c.is_alphanumeric() || c == '_' || c == ':' || c == '<' || c == '>' || c == ','
            });
            let argument = rest.trim_start_matches('(').trim_start();
            if argument.starts_with('"') || argument.starts_with("r#\"") {
                statements.fixed_text_in_dynamic.push(at(index));
            }
        }
    }
    statements
}

#[test]
fn the_compiler_checks_every_fixed_statement_of_the_store() {
    let statements = store_statements();
    assert!(
        statements.unchecked.is_empty(),
        "a fixed statement is a sqlx::query!/query_as!/query_scalar! macro; one assembled at \
         run time goes through store::dynamic:\n{}",
        statements.unchecked.join("\n")
    );
    assert!(
        statements.fixed_text_in_dynamic.is_empty(),
        "a fixed text passed to store::dynamic is a macro instead:\n{}",
        statements.fixed_text_in_dynamic.join("\n")
    );
    println!(
        "{} compile-checked statements, {} assembled at run time",
        statements.checked,
        statements.dynamic.len()
    );
}
