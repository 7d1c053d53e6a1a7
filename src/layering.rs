//! The import rules of `docs/architecture.md`, checked against the source so they cannot
//! quietly regress.
//!
//! Data flows api → stream → worker → db → relay → mail. A stage imports the shared basics,
//! the stages downstream of it, and the one store it consumes from (the worker reads the
//! stream, the relay claims outbox rows from db), never anything else upstream. The shared
//! basics (`domain`, `config`, `shutdown`) import no stage at all. What crosses a seam is a
//! `domain` type, so no stage needs another's types.

use std::fs;
use std::path::Path;

/// In the order data flows.
const STAGES: [&str; 6] = ["api", "stream", "worker", "db", "relay", "mail"];
/// Upstream imports that are a stage reading its own input, and nothing more.
const INPUTS: [(&str, &str); 2] = [("worker", "stream"), ("relay", "db")];
const BASICS: [&str; 3] = ["domain", "config", "shutdown"];
/// Narrower rules: a module that may import a stage, but not this part of it.
const FORBIDDEN_PATHS: [(&str, &str); 1] = [
    // The relay reads the outbox; the summary-ready event it delivers is a domain type.
    ("relay", "crate::db::summaries"),
];
/// Values that only `stream/job_state.rs` may spell: Lua scripts and other modules receive
/// them from it.
const JOB_STATE_LITERALS: [&str; 4] = ["'queued'", "\"queued\"", "'failed'", "\"failed\""];

/// The source without `//` comments (doc comments included): prose may name anything.
fn code(source: &str) -> String {
    source
        .lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level modules a source refers to as `crate::name`, including `crate::{a, b::c}`.
fn crate_refs(source: &str) -> Vec<String> {
    let code = code(source);
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut refs = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            refs.push(ident(rest));
            continue;
        };
        // Items of the group at depth 1, e.g. `domain::{Job, JobId}, stream`.
        let mut depth = 1;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => item_start = true,
                c if item_start && !c.is_whitespace() => {
                    refs.push(ident(&group[i..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    refs.retain(|r| !r.is_empty());
    refs
}

fn position(module: &str) -> Option<usize> {
    STAGES.iter().position(|s| *s == module)
}

/// What `source`, a file of top-level module `module`, breaks.
fn violations(module: &str, source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for target in crate_refs(source) {
        let upstream = match (position(module), position(&target)) {
            (Some(me), Some(it)) => it < me && !INPUTS.contains(&(module, target.as_str())),
            _ => false,
        };
        let basic_on_stage = BASICS.contains(&module) && position(&target).is_some();
        if upstream || basic_on_stage {
            found.push(format!("{module} imports crate::{target}"));
        }
    }
    let code = code(source);
    for (who, path) in FORBIDDEN_PATHS {
        if module == who && code.contains(path) {
            found.push(format!("{module} names {path}"));
        }
    }
    found
}

/// `src/db/outbox.rs` → `db`, `src/config.rs` → `config`.
fn top_module(relative: &Path) -> String {
    let first = relative.components().next().map_or_else(String::new, |c| {
        c.as_os_str().to_string_lossy().into_owned()
    });
    first.trim_end_matches(".rs").to_owned()
}

fn source_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            source_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("rs" | "lua")
        ) {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_upstream_and_job_state_values_have_one_home() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    assert!(files.len() > 20, "found only {files:?} under {src:?}");
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap_or(&file).to_path_buf();
        let source = fs::read_to_string(&file).unwrap();
        if relative == Path::new("layering.rs") {
            continue;
        }
        for v in violations(&top_module(&relative), &source) {
            found.push(format!("{}: {v}", relative.display()));
        }
        if relative != Path::new("stream/job_state.rs") {
            for literal in JOB_STATE_LITERALS {
                if code(&source).contains(literal) {
                    found.push(format!("{}: spells {literal}", relative.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checker_catches_what_it_is_for() {
    assert_eq!(
        violations("db", "use crate::stream::JobMessage;"),
        vec!["db imports crate::stream"]
    );
    assert_eq!(
        violations("db", "use crate::{domain::{Job, JobId}, stream};").len(),
        1
    );
    assert_eq!(violations("mail", "let x = crate::api::thing();").len(), 1);
    assert_eq!(violations("domain", "use crate::db::DbError;").len(), 1);
    assert_eq!(violations("relay", "use crate::db::summaries::X;").len(), 1);
    // Allowed: the shared basics, downstream stages, a stage's own input, and prose.
    assert!(violations("db", "use crate::{config::Settings, domain::Job};").is_empty());
    assert!(violations("api", "use crate::{db, stream::job_state};").is_empty());
    assert!(violations("worker", "use crate::stream::job_entry;").is_empty());
    assert!(violations("relay", "use crate::db::outbox;").is_empty());
    assert!(violations("db", "/// unlike crate::stream, …\nfn f() {}").is_empty());
}
