//! Keeps the crate docs and the module docs of every crate of the workspace true (after
//! TigerBeetle's `tidy`):
//!
//! - every file under a crate's `src/` has a "May touch:" line, or inherits its folder's (the line of the
//!   nearest `mod.rs` above it), and its code uses only the crate's top-level modules that line
//!   names, or its own;
//! - a folder's line covers what every file under it uses;
//! - a path through one of the crate root's re-exports (`crate::Error`, `crate::Job`) is a use
//!   of the module it comes from;
//! - no module uses one listed after it in the crate doc's "lowest layer first" list, and the
//!   modules of a line that says they never use each other do not (every crate of more than
//!   one module has the list).
//!
//! A module that starts using another must say so in its doc, where a reviewer sees the
//! dependency; one that reaches up the layers must be moved or the order argued again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate's top-level modules: `src/x.rs` and `src/x/mod.rs`.
fn top_modules(src: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if (p.is_dir() && p.join("mod.rs").exists()) || p.extension().is_some_and(|x| x == "rs") {
            names.insert(name);
        }
    }
    for not_a_module in ["lib", "main", "faults_absent"] {
        names.remove(not_a_module);
    }
    names
}

/// The top-level module a file under `src/` belongs to (`faults_absent.rs` stands in for
/// `faults`).
fn owner(src: &Path, file: &Path) -> String {
    let first = file.strip_prefix(src).unwrap().components().next().unwrap().as_os_str().to_string_lossy().to_string();
    let name = first.trim_end_matches(".rs").to_string();
    if name == "faults_absent" {
        "faults".into()
    } else {
        name
    }
}

/// The names in backticks of the "May touch:" paragraph, by their first path segment
/// (`nothing` names none).
fn may_touch(text: &str) -> Option<BTreeSet<String>> {
    let start = text.find("//! May touch:")?;
    let paragraph: String =
        text[start..].lines().take_while(|l| l.starts_with("//!") && l.trim() != "//!").collect::<Vec<_>>().join(" ");
    Some(
        paragraph
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|name| name.split("::").next().unwrap_or(name).to_string())
            .collect(),
    )
}

/// The crate root's re-exports: each name `pub use m::...` brings in, with its module `m`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for stmt in lib.split("pub use ").skip(1) {
        let path = &stmt[..stmt.find(';').unwrap()];
        let module = path.split("::").next().unwrap().trim();
        // The derive macro is the trait's other half.
        let module = if module == "weir_derive" { "persist" } else { module };
        let leaves = match (path.find('{'), path.rfind('}')) {
            (Some(open), Some(close)) => &path[open + 1..close],
            _ => path,
        };
        for leaf in leaves.split(',').map(|l| l.rsplit("::").next().unwrap().trim()).filter(|l| !l.is_empty()) {
            names.insert(leaf.to_string(), module.to_string());
        }
    }
    names
}

/// The top-level modules the code (not the comments) of `text` reaches through `crate::`,
/// directly or through a re-export of the crate root.
fn used(text: &str, modules: &BTreeSet<String>, reexported: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("crate::") {
            // `$crate::` in macros is the same path.
            let rest = &line[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if modules.contains(&name) {
                names.insert(name);
            } else if let Some(m) = reexported.get(&name) {
                names.insert(m.clone());
            }
        }
    }
    names
}

/// The crate doc's module list, lowest layer first: each line's modules, in order, and
/// whether the line says its modules never use each other.
fn layers(lib: &str, modules: &BTreeSet<String>) -> Vec<(Vec<String>, bool)> {
    let start = lib.find("## Modules, lowest layer first").expect("the crate doc lists the modules by layer");
    let section = &lib[start..];
    let section = &section[..section[3..].find("//! ##").map_or(section.len(), |e| e + 3)];
    let mut out: Vec<(Vec<String>, bool)> = Vec::new();
    let mut bullet = String::new();
    let mut flush = |bullet: &mut String| {
        if bullet.is_empty() {
            return;
        }
        let names: Vec<String> =
            bullet.split('`').skip(1).step_by(2).filter(|n| modules.contains(*n)).map(String::from).fold(
                Vec::new(),
                |mut v, n| {
                    if !v.contains(&n) {
                        v.push(n);
                    }
                    v
                },
            );
        let words = bullet.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push((names, words.contains("never use each other")));
        bullet.clear();
    };
    for line in section.lines().map(|l| l.trim_start_matches("//!")) {
        if line.starts_with(" - ") {
            flush(&mut bullet);
            bullet.push_str(line);
        } else if line.starts_with("   ") {
            bullet.push_str(line);
        } else {
            flush(&mut bullet);
        }
    }
    flush(&mut bullet);
    out
}

/// The workspace's crates, by folder (the engine is the root).
const CRATES: [&str; 7] = [".", "weir-derive", "weir-jobs", "weir-kafka", "weir-object-store", "weir-ops", "weir-cli"];

struct Crate {
    src: PathBuf,
    modules: BTreeSet<String>,
    lib: String,
    reexported: BTreeMap<String, String>,
    files: Vec<(PathBuf, String)>,
}

impl Crate {
    /// The crate in folder `dir` of the workspace.
    fn read(dir: &str) -> Crate {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join("src");
        let modules = top_modules(&src);
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        paths.sort();
        let files = paths.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect();
        let reexported = reexports(&lib);
        Crate { src, modules, lib, reexported, files }
    }

    /// Every crate of the workspace.
    fn all() -> Vec<Crate> {
        CRATES.iter().map(|d| Crate::read(d)).collect()
    }

    fn uses(&self, text: &str) -> BTreeSet<String> {
        used(text, &self.modules, &self.reexported)
    }

    /// A crate root (`lib.rs`, the binary's `main.rs`), which the crate doc covers.
    fn is_root(&self, file: &Path) -> bool {
        file.parent() == Some(&self.src) && file.file_name().is_some_and(|n| n == "lib.rs" || n == "main.rs")
    }
}

#[test]
fn every_file_uses_only_what_its_may_touch_line_names() {
    let mut wrong = Vec::new();
    for c in Crate::all() {
        let lines: BTreeMap<&Path, BTreeSet<String>> =
            c.files.iter().filter_map(|(p, t)| Some((p.as_path(), may_touch(t)?))).collect();
        for (f, text) in c.files.iter().filter(|(f, _)| !c.is_root(f)) {
            let own = owner(&c.src, f);
            // Its own line, or the nearest folder's above it.
            let mut at = Some(f.as_path());
            let mut allowed = lines.get(f.as_path());
            while allowed.is_none() {
                at = at.and_then(Path::parent).filter(|d| d.starts_with(&c.src) && *d != c.src);
                let Some(dir) = at else { break };
                allowed = lines.get(dir.join("mod.rs").as_path()).filter(|_| dir.join("mod.rs") != *f);
            }
            let Some(allowed) = allowed else {
                wrong.push(format!("{}: no May touch line, and no folder's to inherit", f.display()));
                continue;
            };
            let missing: Vec<String> = c.uses(text).into_iter().filter(|m| *m != own && !allowed.contains(m)).collect();
            if !missing.is_empty() {
                wrong.push(format!("{}: uses {missing:?}, its May touch line names {allowed:?}", f.display()));
            }
        }
        assert!(
            lines.len() >= c.modules.len(),
            "{}: only {} files have a May touch line",
            c.src.display(),
            lines.len()
        );
    }
    assert!(wrong.is_empty(), "module docs out of date:\n{}", wrong.join("\n"));
}

#[test]
fn a_folders_line_covers_every_file_under_it() {
    let mut wrong = Vec::new();
    for c in Crate::all() {
        for (folder_mod, text) in c.files.iter().filter(|(p, _)| p.file_name().is_some_and(|n| n == "mod.rs")) {
            let dir = folder_mod.parent().unwrap();
            let Some(allowed) = may_touch(text) else {
                wrong.push(format!("{}: a folder's mod.rs without a May touch line", folder_mod.display()));
                continue;
            };
            let own = owner(&c.src, folder_mod);
            let mut all = BTreeSet::new();
            for (_, t) in c.files.iter().filter(|(p, _)| p.starts_with(dir)) {
                all.extend(c.uses(t));
            }
            let missing: Vec<String> = all.into_iter().filter(|m| *m != own && !allowed.contains(m)).collect();
            if !missing.is_empty() {
                wrong.push(format!(
                    "{}: its files use {missing:?}, the folder's line names {allowed:?}",
                    folder_mod.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "folder docs out of date:\n{}", wrong.join("\n"));
}

#[test]
fn no_module_uses_a_higher_layer() {
    let mut wrong = Vec::new();
    for c in Crate::all().into_iter().filter(|c| c.modules.len() > 1) {
        let layers = layers(&c.lib, &c.modules);
        let order: Vec<&String> = layers.iter().flat_map(|(names, _)| names).collect();
        let unlisted: Vec<&String> = c.modules.iter().filter(|m| !order.contains(m)).collect();
        assert!(
            unlisted.is_empty(),
            "{}: modules missing from the crate doc's layer list: {unlisted:?}",
            c.src.display()
        );
        let position = |m: &str| order.iter().position(|o| *o == m).unwrap();
        for module in &c.modules {
            let mut uses = BTreeSet::new();
            for (_, t) in c.files.iter().filter(|(p, _)| !c.is_root(p) && owner(&c.src, p) == *module) {
                uses.extend(c.uses(t));
            }
            for u in uses.iter().filter(|u| *u != module) {
                if position(u) > position(module) {
                    wrong.push(format!("{}: {module} uses {u}, a higher layer", c.src.display()));
                }
                if layers.iter().any(|(names, apart)| *apart && names.contains(module) && names.contains(u)) {
                    wrong.push(format!(
                        "{}: {module} uses {u}, though the crate doc says they never use each other",
                        c.src.display()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "the layer order a crate doc states is broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_what_it_must() {
    let modules: BTreeSet<String> = ["error", "record", "state", "snapshot", "pipeline"].map(String::from).into();
    let lib = "pub use error::{Error, Result};\npub use pipeline::{\n    Job, Stream,\n};\npub use record::{for_each_word, Word};\n";
    let reexported = reexports(lib);
    assert_eq!(reexported.get("Error").map(String::as_str), Some("error"));
    assert_eq!(reexported.get("Stream").map(String::as_str), Some("pipeline"));
    assert_eq!(reexported.get("for_each_word").map(String::as_str), Some("record"));
    let text = "//! A module.\n//!\n//! May touch: `error`,\n//! `snapshot::Barrier`.\n\nuse crate::record::Word;\n// crate::state in a comment\nfn f() -> crate::Result<crate::Job> { todo() }\n";
    assert_eq!(may_touch(text).unwrap(), ["error", "snapshot"].map(String::from).into());
    assert_eq!(used(text, &modules, &reexported), ["error", "pipeline", "record"].map(String::from).into());
    let doc = "//! ## Modules, lowest layer first (a module uses only modules above it)\n//!\n//! - [`error`], `record`: vocabulary.\n//! - [`state`], [`snapshot`]: they never use each\n//!   other.\n//! - [`pipeline`].\n//!\n//! ## Example\n";
    assert_eq!(
        layers(doc, &modules),
        vec![
            (vec!["error".to_string(), "record".to_string()], false),
            (vec!["state".to_string(), "snapshot".to_string()], true),
            (vec!["pipeline".to_string()], false),
        ]
    );
}

/// One name per setting: every key a running job's configuration takes (the flag without its
/// dashes, the file's key, the control endpoint's) is the builder's method of the same name,
/// its unit suffix (`-ms`, `-bytes`) dropped. The builder said `retain`, `tolerable_failures`,
/// `timeout` and `alignment_timeout` where the flags said `retained`,
/// `tolerable-failed-checkpoints`, `checkpoint-timeout-ms` and `aligned-checkpoint-timeout-ms`.
#[test]
fn every_live_setting_has_one_name() {
    const MODE_KEYS: [&str; 5] =
        ["checkpoint", "mode", "unaligned", "aligned-checkpoint-timeout-ms", "inflight-budget-bytes"];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let flags = std::fs::read_to_string(root.join("weir-ops/src/settings.rs")).unwrap();
    let builder = std::fs::read_to_string(root.join("src/checkpoint/config.rs")).unwrap();
    let resolver = std::fs::read_to_string(root.join("src/snapshot/mode.rs")).unwrap();
    let list = flags.split("pub const LIVE_KEYS").nth(1).expect("LIVE_KEYS in settings.rs");
    let list = &list[list.find('[').unwrap()..];
    let list = &list[list.find('=').unwrap()..list.find("];").unwrap()];
    let keys: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
    assert!(keys.len() >= 10 && keys.contains(&"retained"), "LIVE_KEYS read as {keys:?}");
    let mut differ = Vec::new();
    for key in keys {
        // The mode's keys (in one word, or Flink's flat keys) parse into the builder's one
        // `mode(CheckpointMode)` (`CheckpointMode::from_flat`), and the restart strategy is
        // `restart(RestartStrategy)` with its `restart-*` keys: none is a value of its own.
        if MODE_KEYS.contains(&key) || key == "restart-strategy" {
            assert!(builder.contains("pub fn mode(mut self") && resolver.contains("pub fn from_flat("));
            continue;
        }
        let name = key.trim_end_matches("-ms").trim_end_matches("-bytes").replace('-', "_");
        if !builder.contains(&format!("pub fn {name}(mut self")) {
            differ.push(format!("{key}: no CheckpointConfig::{name}"));
        }
    }
    assert!(differ.is_empty(), "settings named two ways: {differ:?}");
}

/// The longest a function may be, in lines from its signature to its closing brace, in any
/// crate's `src/` and in perf/, and the function that holds the record. Exact, as TigerBeetle's tidy is: the
/// test below fails unless the longest function is exactly this long and is the one named, so
/// the limit comes down with every split of the longest (name its successor then), and is
/// never raised. Round 4 began with 17 functions over 100 lines (simulate 306); round 5 brought
/// the limit from 99 to 80 (26 functions split, perf/ among them).
const LONGEST_FUNCTION: (usize, &str) = (80, "src/runtime/attempt.rs: start_attempt");

/// Each function of `text` (a method, a nested or a test function too): its name, its first
/// line and its length in lines. Bodies are found by indentation, as rustfmt lays them out: a
/// function ends at the first `}` alone at its own indentation.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let mut rest = trimmed;
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let Some(signature) = rest.strip_prefix("fn ") else { continue };
        let name: String = signature.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let Some(open) = lines[i..].iter().position(|l| l.contains('{') || l.trim_end().ends_with(';')) else {
            continue;
        };
        let opening = lines[i + open].trim_end();
        if !opening.contains('{') {
            continue; // a declaration in a trait
        }
        if opening.ends_with('}') {
            out.push((name, i + 1, open + 1));
            continue;
        }
        let closing = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[i + open..].iter().position(|l| *l == closing) {
            out.push((name, i + 1, open + end + 1));
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_the_recorded_limit_and_the_limit_follows_them_down() {
    let (limit, holder) = LONGEST_FUNCTION;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut longest = (0, Vec::new());
    let mut over = Vec::new();
    // Every crate's `src/`, and the benchmark harness in perf/.
    let mut perf = Vec::new();
    rust_files(&root.join("perf"), &mut perf);
    let perf: Vec<(PathBuf, String)> =
        perf.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect();
    assert!(perf.len() >= 10, "perf/ read as {} files", perf.len());
    let files = Crate::all().into_iter().flat_map(|c| c.files).chain(perf);
    {
        for (path, text) in &files.collect::<Vec<_>>() {
            let shown = path.strip_prefix(root).unwrap_or(path).display().to_string();
            let shown = shown.trim_start_matches("./").to_string();
            for (name, line, length) in functions(text) {
                let at = format!("{shown}: {name}");
                match length.cmp(&longest.0) {
                    std::cmp::Ordering::Greater => longest = (length, vec![at]),
                    std::cmp::Ordering::Equal => longest.1.push(at),
                    std::cmp::Ordering::Less => {}
                }
                if length > limit {
                    over.push(format!("{shown}:{line}: {name} is {length} lines"));
                }
            }
        }
    }
    assert!(over.is_empty(), "longer than {limit} lines (split them):\n{}", over.join("\n"));
    assert!(
        longest.0 == limit && longest.1.iter().any(|h| h == holder),
        "the longest function is {} lines ({}): set LONGEST_FUNCTION to ({}, \"{}\") so the limit only tightens",
        longest.0,
        longest.1.join(", "),
        longest.0,
        longest.1[0]
    );
}

#[test]
fn the_function_finder_sees_what_it_must() {
    let text = "fn a() {}\n\npub(crate) fn b(\n    x: u8,\n) -> u8 {\n    x\n}\n\nimpl T {\n    fn c(&self) {\n        if true {\n        }\n    }\n}\n";
    let found = functions(text);
    assert_eq!(found, vec![("a".to_string(), 1, 1), ("b".to_string(), 3, 5), ("c".to_string(), 10, 4)], "{found:?}");
}

/// Operators hold the user's logic; unsafe code lives below them (the collector's block
/// moves, the channels, the state's pages), where its invariants are stated once.
#[test]
fn operators_hold_no_unsafe_code() {
    let c = Crate::read(".");
    let operators = c.src.join("operator");
    let unsafe_lines: Vec<String> = c
        .files
        .iter()
        .filter(|(p, _)| p.starts_with(&operators))
        .flat_map(|(p, t)| {
            t.lines()
                .enumerate()
                .filter(|(_, l)| !l.trim_start().starts_with("//") && l.contains("unsafe "))
                .map(move |(i, l)| format!("{}:{}: {}", p.display(), i + 1, l.trim()))
        })
        .collect();
    assert!(unsafe_lines.is_empty(), "unsafe code in operators:\n{}", unsafe_lines.join("\n"));
}

/// The coordinator's parts each own their state and never use each other (moving the core's
/// methods into files alone had tied them in circles: pending ↔ trigger ↔ shared files); the
/// core in `mod.rs` composes them, and they share only its vocabulary (`super::{..}`).
#[test]
fn the_coordinators_parts_never_use_each_other() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/checkpoint/coordinator");
    let parts = ["pending", "requests", "shared_files", "trigger"];
    let mut wrong = Vec::new();
    for part in parts {
        let text = std::fs::read_to_string(dir.join(format!("{part}.rs"))).unwrap();
        assert!(text.contains("#[test]"), "{part}.rs: a part has tests of its own");
        for other in parts.iter().filter(|o| **o != part) {
            if text.contains(&format!("super::{other}")) || text.contains(&format!("coordinator::{other}")) {
                wrong.push(format!("{part}.rs uses {other}"));
            }
        }
    }
    let core = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    assert!(parts.iter().all(|p| core.contains(&format!("mod {p};"))), "mod.rs composes every part");
    assert!(wrong.is_empty(), "the coordinator's parts use each other: {wrong:?}");
}

/// The engine's rules that `clippy.toml` keeps (DESIGN and STYLE: time through the task's
/// context and the job's clock, threads only the runtime's). The lint fails a wall-clock read
/// or a thread started anywhere else in the engine; this test keeps the way around it narrow:
/// the root's `clippy.toml` names the four methods, every other crate has its own file (so the
/// rule is the engine's alone), and `#[allow(clippy::disallowed_methods)]` stands only at the
/// clock's home, the runtime's `spawn_named`, the host signal's wait, and on test modules,
/// examples, benches and integration tests.
#[test]
fn wall_clock_reads_and_threads_stay_where_the_lint_allows_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join("clippy.toml")).unwrap();
    for method in
        ["std::time::Instant::now", "std::time::SystemTime::now", "std::thread::spawn", "std::thread::Builder::spawn"]
    {
        assert!(config.contains(&format!("path = \"{method}\", reason = \"")), "clippy.toml forbids {method}");
    }
    for member in [
        "weir-derive",
        "weir-jobs",
        "weir-kafka",
        "weir-object-store",
        "weir-ops",
        "weir-cli",
        "weir-testkit",
        "perf",
        "fuzz",
    ] {
        let own = std::fs::read_to_string(root.join(member).join("clippy.toml"))
            .unwrap_or_else(|_| panic!("{member}/clippy.toml keeps the engine's rule from reaching {member}"));
        assert!(!own.contains("disallowed-methods"), "{member}: the rule is the engine's");
    }
    let allowed_files = ["context.rs", "runtime/mod.rs", "wake.rs"];
    let mut stray = Vec::new();
    let engine = Crate::read(".");
    for (path, text) in &engine.files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.contains("allow(clippy::disallowed_methods)") {
                continue;
            }
            let on_tests = i > 0 && lines[i - 1].trim() == "#[cfg(test)]";
            let home = allowed_files.iter().any(|f| path.ends_with(f));
            if !(on_tests || home) {
                stray.push(format!("{}:{}", path.display(), i + 1));
            }
        }
    }
    assert!(stray.is_empty(), "wall-clock reads or threads allowed outside their homes: {stray:?}");
}
