//! Checks of the codebase itself (like rust-analyzer's tidy): the dependency direction
//! ARCHITECTURE.md documents is the one Cargo builds, and no source file grows past what a
//! newcomer can read (1,000 lines of non-test code; the files already past it may only shrink).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

type Edges = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

/// The table under "Dependency direction": crate → (dependencies, dev-only dependencies).
fn documented() -> Edges {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = text.split("## Dependency direction").nth(1).expect("the section is there");
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|c| c.trim().trim_matches('`').to_owned())
            .filter(|c| c != "—")
            .collect()
    };
    section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `flock-"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').collect();
            assert_eq!(cells.len(), 3, "a row has three cells: {l}");
            (cells[0].trim().trim_matches('`').to_owned(), (names(cells[1]), names(cells[2])))
        })
        .collect()
}

/// What Cargo builds: the same shape, from `cargo metadata`.
fn actual() -> Edges {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours: BTreeSet<&str> = packages.iter().map(|p| p["name"].as_str().unwrap()).collect();
    packages
        .iter()
        .map(|p| {
            let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
            for d in p["dependencies"].as_array().unwrap() {
                let name = d["name"].as_str().unwrap();
                if !ours.contains(name) {
                    continue;
                }
                match d["kind"].as_str() {
                    Some("dev") => dev.insert(name.to_owned()),
                    _ => normal.insert(name.to_owned()),
                };
            }
            (p["name"].as_str().unwrap().to_owned(), (normal, dev))
        })
        .collect()
}

#[test]
fn the_documented_dependency_direction_is_the_built_one() {
    let (doc, built) = (documented(), actual());
    assert!(!doc.is_empty(), "ARCHITECTURE.md has no dependency table");
    for (krate, edges) in &built {
        let Some(documented) = doc.get(krate) else {
            panic!("ARCHITECTURE.md's dependency table has no row for {krate} (it has {edges:?})")
        };
        assert_eq!(
            documented, edges,
            "{krate}: ARCHITECTURE.md says (deps, dev-deps) = {documented:?}, Cargo.toml says \
             {edges:?}; update the table (and the prose above it) with the change"
        );
    }
    let gone: Vec<&String> = doc.keys().filter(|k| !built.contains_key(*k)).collect();
    assert!(gone.is_empty(), "ARCHITECTURE.md lists {gone:?}, not crates of the workspace");
}

/// The most lines of non-test code a source file may have: past it, split the file by job.
const LIMIT: usize = 1000;

/// Lines of `path` before its `#[cfg(test)] mod tests`.
fn code_lines(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].starts_with("mod tests"))
        .unwrap_or(lines.len())
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | "tests" | "fuzz" | ".git" | "vendor") {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_grows_past_a_thousand_lines() {
    let root = root();
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
    let mut problems = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        let n = code_lines(&file);
        if n > LIMIT {
            problems.push(format!(
                "{rel}: {n} lines of non-test code (at most {LIMIT}); split it by job"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
