//! The import rules of `docs/architecture.md`, checked against the source so they cannot
//! quietly regress.
//!
//! Every entry directly under `src/` has a layer in [`LAYERS`]; a module imports only from
//! layers below its own, so adapters never import each other and roles never import each
//! other. Data flows api → stream → worker → db → relay → mail through the adapters: a role
//! reads its input from one adapter and hands its output to another, and what crosses is a
//! `domain` type. Inside a folder, files may use their parent's items, but two files never
//! import each other in a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every entry under `src/`, bottom layer first. A new top-level file or folder fails
/// `cargo test` until it is placed here.
const LAYERS: [(&str, &[&str]); 10] = [
    // The values that cross seams, the vocabulary of waiting and failing, the stop signal.
    ("base", &["domain", "resilience", "shutdown"]),
    // Settings: parsed and checked without touching a file or a socket.
    ("settings", &["config"]),
    // Connections, TLS, key names, redaction, telemetry, metrics.
    ("infrastructure", &["infra"]),
    // One module per outside system.
    ("adapters", &["stream", "db", "llm", "mail", "webhook"]),
    // One module per `--roles` entry, and the housekeeping every role runs.
    ("roles", &["api", "worker", "relay", "maintenance"]),
    // The operator console: it shows every role, so it stands above them all.
    ("console", &["console"]),
    // What a process builds once and supervises.
    ("process", &["app"]),
    // The operator's commands.
    ("operations", &["ops"]),
    // Parsing the command line.
    ("command line", &["cli"]),
    // The binary, the crate root and this check.
    ("entry", &["main", "lib", "layering"]),
];

/// Narrower rules: a module that may import an adapter, but not this part of it.
const FORBIDDEN_PATHS: [(&str, &str); 1] = [
    // The relay reads the outbox; the summary-ready event it delivers is a domain type.
    ("relay", "crate::db::summaries"),
];

/// Values that only `stream/job_state.rs` may spell: Lua scripts and other modules receive
/// them from it.
const JOB_STATE_LITERALS: [&str; 4] = ["'queued'", "\"queued\"", "'failed'", "\"failed\""];

/// Files whose references are not imports: the crate root declares the modules, and this
/// file names them in its tables and tests.
const NOT_CHECKED: [&str; 2] = ["lib.rs", "layering.rs"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The source without `//` comments (doc comments included): prose may name anything.
fn code(source: &str) -> String {
    source
        .lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The `::`-separated identifiers at the start of `text`: `a::b::{c}` → `[a, b]`.
fn path_segments(text: &str) -> Vec<String> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let ident: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        segments.push(ident);
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    segments
}

/// The paths a source names after `root::` (`crate` or `summaryd`), with each item of a
/// group spelled out: `crate::{a, b::{c, d}}` → `[a]`, `[b, c]`, `[b, d]`.
fn paths_after(source: &str, root: &str) -> Vec<Vec<String>> {
    let code = code(source);
    let needle = format!("{root}::");
    let mut paths = Vec::new();
    for (at, _) in code.match_indices(&needle) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        expand(&code[at + needle.len()..], Vec::new(), &mut paths);
    }
    paths.retain(|p| !p.is_empty());
    paths
}

/// One path or `{group}` starting at `text`, appended to `prefix`.
fn expand(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let text = text.trim_start();
    let segments = path_segments(text);
    let consumed: usize =
        segments.iter().map(String::len).sum::<usize>() + 2 * segments.len().saturating_sub(1);
    let mut path = prefix;
    path.extend(segments.iter().cloned());
    let rest = &text[consumed..];
    let group = if segments.is_empty() {
        rest.strip_prefix('{')
    } else {
        rest.strip_prefix("::{")
    };
    let Some(group) = group else {
        out.push(path);
        return;
    };
    let mut depth = 0;
    let mut item_start = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                expand(&group[item_start..i], path.clone(), out);
                return;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&group[item_start..i], path.clone(), out);
                item_start = i + 1;
            }
            _ => {}
        }
    }
}

/// `src/db/outbox.rs` → `[db, outbox]`, `src/db/mod.rs` → `[db]`, `src/cli.rs` → `[cli]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.rsplit_once('.').map_or(last.as_str(), |(s, _)| s);
        if stem != "mod" {
            parts.push(stem.to_owned());
        }
    }
    parts
}

/// What `source`, a file of top-level module `module`, breaks.
fn violations(module: &str, source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Some(mine) = layer_of(module) else {
        return vec![format!("{module} has no layer in LAYERS")];
    };
    let mut targets: BTreeSet<String> = BTreeSet::new();
    for root in ["crate", "summaryd"] {
        for path in paths_after(source, root) {
            targets.insert(path[0].clone());
        }
    }
    for target in targets {
        if target == module {
            continue;
        }
        match layer_of(&target) {
            Some(theirs) if theirs < mine => {}
            Some(theirs) => found.push(format!(
                "{module} ({}) imports crate::{target} ({})",
                LAYERS[mine].0, LAYERS[theirs].0
            )),
            None => found.push(format!(
                "{module} imports crate::{target}, which has no layer"
            )),
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

/// The modules one file imports, resolved to the longest known module path, leaving out
/// the file's own ancestors and descendants (a folder's `mod.rs` and its files share items
/// both ways by design).
fn file_imports(
    me: &[String],
    source: &str,
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let mut named = paths_after(source, "crate");
    let parent = &me[..me.len().saturating_sub(1)];
    for path in paths_after(source, "super") {
        named.push(parent.iter().cloned().chain(path).collect());
    }
    let mut imports = BTreeSet::new();
    for path in named {
        let Some(found) = (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| modules.contains(p))
        else {
            continue;
        };
        let related = found.starts_with(me) || me.starts_with(&found);
        if !related {
            imports.insert(found);
        }
    }
    imports
}

/// Every circle of imports between files, each as its path of modules.
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
        found: &mut Vec<String>,
    ) {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let circle: Vec<String> = stack[at..]
                .iter()
                .chain(std::iter::once(node))
                .map(|n| n.join("::"))
                .collect();
            found.push(circle.join(" → "));
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, stack, done, found);
        }
        stack.pop();
        done.insert(node.clone());
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, graph, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

struct Tree {
    files: Vec<(PathBuf, String)>,
}

impl Tree {
    fn read() -> Self {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = Vec::new();
        source_files(&src, &mut paths);
        assert!(paths.len() > 20, "found only {paths:?} under {src:?}");
        let files = paths
            .into_iter()
            .map(|path| {
                let source = fs::read_to_string(&path).unwrap();
                (path.strip_prefix(&src).unwrap().to_path_buf(), source)
            })
            .collect();
        Self { files }
    }

    fn checked(&self) -> impl Iterator<Item = (&Path, &str)> {
        self.files
            .iter()
            .filter(|(p, _)| !NOT_CHECKED.iter().any(|n| p == Path::new(n)))
            .map(|(p, s)| (p.as_path(), s.as_str()))
    }
}

#[test]
fn every_entry_under_src_has_a_layer_and_every_layer_entry_exists() {
    let tree = Tree::read();
    let tops: BTreeSet<String> = tree
        .files
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "rs"))
        .map(|(p, _)| module_path(p)[0].clone())
        .collect();
    let placed: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|(_, modules)| modules.iter().map(|m| (*m).to_owned()))
        .collect();
    let unplaced: Vec<_> = tops.difference(&placed).collect();
    let stale: Vec<_> = placed.difference(&tops).collect();
    assert!(
        unplaced.is_empty(),
        "give these a layer in LAYERS: {unplaced:?}"
    );
    assert!(
        stale.is_empty(),
        "LAYERS names what is not under src/: {stale:?}"
    );
}

#[test]
fn imports_only_go_down_and_job_state_values_have_one_home() {
    let tree = Tree::read();
    let mut found = Vec::new();
    for (relative, source) in tree.checked() {
        let top = module_path(relative)[0].clone();
        for v in violations(&top, source) {
            found.push(format!("{}: {v}", relative.display()));
        }
        if relative != Path::new("stream/job_state.rs") {
            for literal in JOB_STATE_LITERALS {
                if code(source).contains(literal) {
                    found.push(format!("{}: spells {literal}", relative.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_two_files_import_each_other_in_a_circle() {
    let tree = Tree::read();
    let rust: Vec<_> = tree
        .checked()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "rs"))
        .map(|(p, s)| (module_path(p), s))
        .collect();
    let modules: BTreeSet<Vec<String>> = rust.iter().map(|(m, _)| m.clone()).collect();
    let graph: BTreeMap<_, _> = rust
        .iter()
        .map(|(m, s)| (m.clone(), file_imports(m, s, &modules)))
        .collect();
    let circles = cycles(&graph);
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn the_checker_catches_what_it_is_for() {
    assert_eq!(
        violations("db", "use crate::stream::JobMessage;"),
        vec!["db (adapters) imports crate::stream (adapters)"]
    );
    assert_eq!(
        violations("db", "use crate::{domain::{Job, JobId}, stream};").len(),
        1
    );
    assert_eq!(violations("mail", "let x = crate::api::thing();").len(), 1);
    assert_eq!(violations("domain", "use crate::db::DbError;").len(), 1);
    assert_eq!(violations("config", "use crate::infra::tls;").len(), 1);
    assert_eq!(violations("api", "use crate::maintenance::X;").len(), 1);
    assert_eq!(violations("relay", "use crate::db::summaries::X;").len(), 1);
    assert_eq!(violations("worker", "use crate::nowhere::X;").len(), 1);
    assert_eq!(violations("newcomer", "").len(), 1);
    // Allowed: lower layers, the module itself, and prose.
    assert!(violations("db", "use crate::{config::Settings, domain::Job, db::x};").is_empty());
    assert!(violations("api", "use crate::{db, stream::job_state};").is_empty());
    assert!(violations("worker", "use crate::stream::job_entry;").is_empty());
    assert!(violations("relay", "use crate::db::outbox;").is_empty());
    assert!(violations("main", "use summaryd::ops::AdminCommand;").is_empty());
    assert!(violations("db", "/// unlike crate::stream, …\nfn f() {}").is_empty());
    assert!(violations("db", "let s = \"not_crate::stream\";").is_empty());

    let m = |p: &str| p.split("::").map(str::to_owned).collect::<Vec<_>>();
    let modules: BTreeSet<_> = ["llm", "llm::chain", "llm::retry", "db"]
        .into_iter()
        .map(m)
        .collect();
    assert_eq!(
        file_imports(
            &m("llm::retry"),
            "use super::{LlmError, chain::Chain};",
            &modules
        ),
        BTreeSet::from([m("llm::chain")])
    );
    let graph = BTreeMap::from([
        (m("llm::chain"), BTreeSet::from([m("llm::retry")])),
        (m("llm::retry"), BTreeSet::from([m("llm::chain")])),
        (m("db"), BTreeSet::new()),
    ]);
    assert_eq!(cycles(&graph), vec!["llm::chain → llm::retry → llm::chain"]);
    assert!(cycles(&BTreeMap::from([(m("db"), BTreeSet::from([m("llm")]))])).is_empty());
}
