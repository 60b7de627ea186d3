//! Keeps the module docs true (after TigerBeetle's `tidy`): every module whose doc has a
//! "May touch:" line uses, in its code, only the crate's top-level modules that line names (or
//! its own). A module that starts using another must say so in its doc, where a reviewer sees
//! the dependency.

use std::collections::BTreeSet;
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

/// The names in backticks of the "May touch:" paragraph, by their first path segment.
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

/// The top-level modules the code (not the comments) of `text` reaches through `crate::`.
fn used(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn may_touch_lines_name_every_module_the_code_uses() {
    // This binary belongs to `weir-cli`, one folder below the engine.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let modules = top_modules(&src);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let Some(allowed) = may_touch(&text) else { continue };
        checked += 1;
        let own = f.strip_prefix(&src).unwrap().components().next().unwrap().as_os_str().to_string_lossy();
        let own = own.trim_end_matches(".rs").to_string();
        let missing: Vec<String> =
            used(&text).into_iter().filter(|m| modules.contains(m) && *m != own && !allowed.contains(m)).collect();
        if !missing.is_empty() {
            wrong.push(format!("{}: uses {missing:?}, its doc's May touch names {allowed:?}", f.display()));
        }
    }
    assert!(checked >= 30, "only {checked} module docs have a May touch line");
    assert!(wrong.is_empty(), "module docs out of date:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_a_missing_name() {
    let text = "//! A module.\n//!\n//! May touch: `error`,\n//! `snapshot::Barrier`.\n\nuse crate::record::Word;\n// crate::state in a comment\nuse crate::error::Result;\n";
    assert_eq!(may_touch(text).unwrap(), ["error", "snapshot"].map(String::from).into());
    assert_eq!(used(text), ["error", "record"].map(String::from).into());
}
