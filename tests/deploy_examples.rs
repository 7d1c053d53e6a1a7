//! The deployment files name only what summaryd accepts: every `SUMMARYD_*` variable set (or
//! suggested in a comment) in secret.example.yaml, the Kubernetes manifests, compose.yaml and
//! the Dockerfile is a setting, and their values load through the real `Settings::load`; the
//! tokens-file example, its commented optional keys included, loads through the real parser.
//!
//! Its own test binary because it sets process environment variables (inside figment's Jail),
//! which must not leak into the tests of tests/it running at the same time.

use std::path::{Path, PathBuf};

use figment::Jail;
use serde::Deserialize;
use serde_yaml_ng::Value;
use summaryd::api::auth::TokenStore;
use summaryd::config::{FlagOverrides, Settings};

/// Not a setting: the config file's path (`--config`), which the test does not read.
const CONFIG_PATH_VAR: &str = "SUMMARYD_CONFIG";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `SUMMARYD_*` variables with their values, wherever the YAML sets one: a container's
/// `env: [{name, value}]`, a Secret's `stringData` or a compose `environment` map.
fn env_pairs(value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Mapping(map) => {
            let name = map.get("name").and_then(Value::as_str);
            if let (Some(name), Some(v)) = (name, map.get("value").and_then(scalar))
                && name.starts_with("SUMMARYD_")
            {
                out.push((name.to_owned(), v));
            }
            for (k, v) in map {
                if let (Some(k), Some(v)) = (k.as_str(), scalar(v))
                    && k.starts_with("SUMMARYD_")
                {
                    out.push((k.to_owned(), v));
                }
                env_pairs(v, out);
            }
        }
        Value::Sequence(items) => items.iter().for_each(|item| env_pairs(item, out)),
        _ => {}
    }
}

/// Variables a comment suggests setting: `# SUMMARYD_X: "value"` lines.
fn commented_env_pairs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("# SUMMARYD_") {
            let yaml = format!("SUMMARYD_{rest}");
            if let Ok(doc) = serde_yaml_ng::from_str::<Value>(&yaml) {
                env_pairs(&doc, &mut out);
            }
        }
    }
    out
}

/// The `tokens.toml` of the summaryd-tenants Secret in secret.example.yaml.
fn tokens_example() -> String {
    let docs = documents(&read(&repo("deploy/kubernetes/secret.example.yaml")));
    docs.iter()
        .find(|d| d["metadata"]["name"].as_str() == Some("summaryd-tenants"))
        .and_then(|d| d["stringData"]["tokens.toml"].as_str())
        .expect("secret.example.yaml has summaryd-tenants with stringData tokens.toml")
        .to_owned()
}

/// Loads `pairs` as the process environment through the real settings loader; returns the
/// names it ignored (not settings) or the error it refused them with.
#[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
fn load_as_env(pairs: &[(String, String)]) -> Result<Vec<String>, String> {
    let tokens = tokens_example();
    let mut outcome = Ok(Vec::new());
    Jail::expect_with(|jail| {
        let tokens_path = jail.directory().join("tokens.toml");
        std::fs::write(&tokens_path, &tokens).expect("write tokens file");
        for (name, value) in pairs {
            match name.as_str() {
                CONFIG_PATH_VAR => {}
                // Mounted from the summaryd-tenants Secret in the manifests: use its example.
                "SUMMARYD_AUTH_TOKENS_FILE" => jail.set_env(name, tokens_path.display()),
                _ => jail.set_env(name, value),
            }
        }
        let ignored = Settings::ignored_env_vars();
        outcome = Settings::load(None, &FlagOverrides::default())
            .map(|_| ignored)
            .map_err(|e| e.to_string());
        Ok(())
    });
    outcome
}

fn deployment_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read deploy dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = vec![repo("compose.yaml")];
    walk(&repo("deploy/kubernetes"), &mut files);
    files.sort();
    files
}

#[test]
fn every_summaryd_variable_in_the_deployment_files_is_a_setting_with_a_valid_value() {
    let files = deployment_files();
    assert!(files.len() >= 8, "found only {files:?}");
    let mut checked = 0;
    for file in files {
        let text = read(&file);
        let mut pairs = Vec::new();
        documents(&text)
            .iter()
            .for_each(|doc| env_pairs(doc, &mut pairs));
        pairs.extend(commented_env_pairs(&text));
        if pairs.is_empty() {
            continue;
        }
        checked += pairs.len();
        let ignored = load_as_env(&pairs)
            .unwrap_or_else(|e| panic!("{}: summaryd refuses its settings: {e}", file.display()));
        assert!(
            ignored.is_empty(),
            "{} names variables summaryd ignores: {ignored:?}",
            file.display()
        );
    }
    assert!(
        checked >= 20,
        "only {checked} variables found: the walk is broken"
    );
}

#[test]
fn the_dockerfile_sets_only_settings() {
    let text = read(&repo("Dockerfile"));
    let pairs: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| line.strip_prefix("ENV "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    assert!(!pairs.is_empty(), "the Dockerfile sets SUMMARYD_LISTEN");
    assert_eq!(load_as_env(&pairs), Ok(Vec::new()));
}

#[test]
fn the_tokens_file_example_loads_with_and_without_its_optional_keys() {
    let example = tokens_example();
    TokenStore::parse(&example).unwrap_or_else(|e| panic!("as shipped: {e}"));

    // The commented `key = value` lines are suggestions; every one must be accepted, or a
    // deployment following them would stop at start with exit 2.
    let mut suggested = 0;
    let uncommented: String = example
        .lines()
        .map(|line| match line.trim_start().strip_prefix("# ") {
            Some(rest)
                if rest.split_once(" = ").is_some_and(|(key, _)| {
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                }) =>
            {
                suggested += 1;
                format!("{rest}\n")
            }
            _ => format!("{line}\n"),
        })
        .collect();
    assert!(
        suggested >= 3,
        "the example suggests rate_per_s, burst and max_in_flight"
    );
    TokenStore::parse(&uncommented).unwrap_or_else(|e| panic!("with {suggested} suggestions: {e}"));

    // A key the parser refuses is caught by exactly this check.
    assert!(TokenStore::parse(&format!("{uncommented}max_jobs = 1000\n")).is_err());
}

/// Every URL the deployment files give summaryd protects its credentials the way
/// docs/security.md asks, judged by the same functions summaryd warns and refuses with:
/// a checked certificate for Postgres, `rediss://` for a Redis with a password, TLS for SMTP
/// credentials. compose.yaml's local network is the documented exception for Postgres.
#[test]
fn no_example_sends_credentials_in_cleartext() {
    use summaryd::config::{SmtpSecurity, smtp_url_has_credentials};
    use summaryd::infra::cleartext::{postgres_warning, redis_warning};
    let mut seen = [0; 3];
    for file in deployment_files() {
        let text = read(&file);
        let mut pairs = Vec::new();
        documents(&text)
            .iter()
            .for_each(|doc| env_pairs(doc, &mut pairs));
        pairs.extend(commented_env_pairs(&text));
        let local_only = file.ends_with("compose.yaml");
        for (name, value) in pairs {
            let shown = format!("{}: {name}", file.display());
            match name.as_str() {
                "SUMMARYD_DATABASE_URL" => {
                    seen[0] += 1;
                    if !local_only {
                        assert_eq!(postgres_warning(&value, None), None, "{shown}");
                        assert!(value.contains("sslmode=verify-full"), "{shown}");
                    }
                }
                "SUMMARYD_REDIS_URL" => {
                    seen[1] += 1;
                    assert_eq!(redis_warning(&value), None, "{shown}");
                }
                "SUMMARYD_MAIL_SMTP_URL" => {
                    seen[2] += 1;
                    let url = reqwest::Url::parse(&value).expect(&shown);
                    let security = SmtpSecurity::of(&url).expect(&shown);
                    assert!(
                        !smtp_url_has_credentials(&url) || security.protects_credentials(),
                        "{shown}: {security:?}"
                    );
                }
                "SUMMARYD_MAIL_ALLOW_CLEARTEXT" => panic!("{shown}: an example must not allow it"),
                _ => {}
            }
        }
    }
    assert!(seen.iter().all(|n| *n >= 1), "URLs found: {seen:?}");
    // The checks above can fail: the shapes the examples used before are caught.
    assert!(postgres_warning("postgres://u:p@postgres.example.internal:5432/x", None).is_some());
    assert!(redis_warning("redis://:p@redis.example.internal:6379").is_some());
    let plain = reqwest::Url::parse("smtp://user:p@smtp.example.com:587").unwrap();
    assert!(!SmtpSecurity::of(&plain).unwrap().protects_credentials());
}

/// Base images are pinned by digest: a tag can be moved to other bytes, a digest cannot.
#[test]
fn images_are_pinned_by_digest() {
    let is_pinned = |image: &str| {
        image.rsplit_once("@sha256:").is_some_and(|(_, hex)| {
            hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    };
    let dockerfile = read(&repo("Dockerfile"));
    let from: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(from.len(), 2, "builder and runtime stages: {from:?}");
    for image in from {
        assert!(is_pinned(image), "Dockerfile: FROM {image}");
    }
    let compose = documents(&read(&repo("compose.yaml")));
    let services = compose[0]["services"].as_mapping().expect("services");
    let mut pulled = 0;
    for (name, service) in services {
        // Services built from this repository have no registry digest.
        if service.get("build").is_some() || service.get("<<").is_some() {
            continue;
        }
        let image = service["image"].as_str().expect("image");
        assert!(is_pinned(image), "compose.yaml: {name:?} uses {image}");
        pulled += 1;
    }
    assert_eq!(pulled, 3, "redis, postgres and jaeger");
    assert!(!is_pinned("redis:7.2-bookworm") && !is_pinned("x@sha256:abc"));
}
