//! Layered settings: built-in defaults < TOML file < `SUMMARYD_*` environment < CLI flags.
//!
//! The env name maps onto the file by its first segment: `SUMMARYD_LLM_BASE_URL` is
//! `[llm] base_url`; the few top-level keys listed in `TOP_LEVEL` stay flat. Each section
//! has its own file with its defaults and the checks that need only its own fields; the
//! checks that relate sections are here. Settings are parsed and checked without touching
//! a file they name or a socket: `infra` reads the TLS files.
//!
//! Durations are `Duration`s whose file key and env name keep their unit (`claim_idle` is
//! `claim_idle_ms`, `SUMMARYD_WORKER_CLAIM_IDLE_MS`, in milliseconds). Passwords, keys and
//! URLs that may carry credentials are `SecretString`s, so `Debug` never shows them.

mod api;
mod auth;
mod console;
mod database;
mod idempotency;
mod llm;
mod log;
mod mail;
mod maintenance;
mod notify;
mod ops;
mod otel;
mod redis;
mod relay;
mod retention;
pub mod roles;
mod secret;
mod shutdown;
pub mod stream;
mod webhook;
mod worker;

pub use api::ApiSettings;
pub use auth::{AuthMode, AuthSettings};
pub use console::ConsoleSettings;
pub use database::DatabaseSettings;
pub use idempotency::IdempotencySettings;
pub use llm::{FallbackSettings, LlmProvider, LlmSettings};
pub use log::{LogFormat, LogSettings};
pub use mail::{MailProvider, MailSettings, SmtpSecurity, smtp_url_has_credentials};
pub use maintenance::MaintenanceSettings;
pub use notify::{DomainList, NotifySettings};
pub use ops::OpsSettings;
pub use otel::OtelSettings;
pub use redis::RedisTlsSettings;
pub use relay::RelaySettings;
pub use retention::RetentionSettings;
pub use shutdown::ShutdownSettings;
pub use stream::StreamSettings;
pub use webhook::WebhookSettings;
pub use worker::WorkerSettings;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// A `Duration` written as whole milliseconds, as every `*_ms` setting is.
type Millis = serde_with::As<serde_with::DurationMilliSeconds>;

/// Keys that live at the top of the file rather than in a section.
const TOP_LEVEL: [&str; 5] = [
    "listen",
    "redis_url",
    "database_url",
    "key_prefix",
    "job_budget_ms",
];

/// Env vars with the `SUMMARYD_` prefix that are not settings.
const NOT_SETTINGS: [&str; 1] = ["config"];

/// Settings only the file can hold: a list of tables has no sensible env spelling.
const FILE_ONLY: [&str; 1] = ["llm.fallback"];

/// Settings that do nothing, accepted so configurations that set them stay valid, and the
/// release that stops accepting them. One that is given is warned about at startup.
const WITHOUT_EFFECT: [(&str, &str); 2] = [
    ("relay.max_attempts", "0.2.0"),
    ("idempotency.lock_ttl_s", "0.2.0"),
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The loader's own messages, rewritten to name env variables. Kept as text, not as
    /// the figment error: figment quotes the offending value, which may be a URL with its
    /// password or a key, and a kept source would carry it into every error chain.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("invalid configuration: {setting}: {reason}")]
    Setting { setting: String, reason: String },
}

/// The error of a check: `setting` is the env name operators know.
fn invalid(setting: &str, reason: &str) -> ConfigError {
    ConfigError::Setting {
        setting: setting.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub listen: SocketAddr,
    #[serde(serialize_with = "secret::expose")]
    pub redis_url: SecretString,
    #[serde(serialize_with = "secret::expose")]
    pub database_url: SecretString,
    /// Prepended to every Redis key we own, so several deployments or tests share one Redis.
    pub key_prefix: String,
    /// Deadline for one delivery of a job, model attempts and backoff sleeps included.
    #[serde(rename = "job_budget_ms", with = "Millis")]
    pub job_budget: Duration,
    /// TLS material for `rediss://` URLs (`SUMMARYD_REDIS_*_FILE`).
    pub redis: RedisTlsSettings,
    /// The job stream's layout: its shards (`SUMMARYD_STREAM_SHARDS`).
    pub stream: StreamSettings,
    pub database: DatabaseSettings,
    pub ops: OpsSettings,
    pub api: ApiSettings,
    pub llm: LlmSettings,
    pub mail: MailSettings,
    pub worker: WorkerSettings,
    pub relay: RelaySettings,
    pub idempotency: IdempotencySettings,
    pub retention: RetentionSettings,
    pub maintenance: MaintenanceSettings,
    pub auth: AuthSettings,
    pub notify: NotifySettings,
    pub webhook: WebhookSettings,
    pub console: ConsoleSettings,
    pub log: LogSettings,
    /// Trace export (`SUMMARYD_OTEL_*`).
    pub otel: OtelSettings,
    pub shutdown: ShutdownSettings,
    /// Which of [`WITHOUT_EFFECT`] the file or the environment gave, remembered by `load`
    /// because the warning can only be logged once logging is set up. Not a setting.
    #[serde(skip)]
    pub given_without_effect: Vec<&'static str>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            redis_url: "redis://127.0.0.1:6379".into(),
            database_url: "postgres://postgres@127.0.0.1:5432/summaryd".into(),
            key_prefix: String::new(),
            job_budget: Duration::from_secs(60),
            redis: RedisTlsSettings::default(),
            stream: StreamSettings::default(),
            database: DatabaseSettings::default(),
            ops: OpsSettings::default(),
            api: ApiSettings::default(),
            llm: LlmSettings::default(),
            mail: MailSettings::default(),
            worker: WorkerSettings::default(),
            relay: RelaySettings::default(),
            idempotency: IdempotencySettings::default(),
            retention: RetentionSettings::default(),
            maintenance: MaintenanceSettings::default(),
            auth: AuthSettings::default(),
            notify: NotifySettings::default(),
            webhook: WebhookSettings::default(),
            console: ConsoleSettings::default(),
            log: LogSettings::default(),
            otel: OtelSettings::default(),
            shutdown: ShutdownSettings::default(),
            given_without_effect: Vec::new(),
        }
    }
}

/// Values given on the command line; `None` means "not given", so lower layers stay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlagOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerFlags>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayFlags>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerFlags {
    pub consumers: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct RelayFlags {
    pub tasks: usize,
}

/// `SUMMARYD_LLM_BASE_URL` -> `llm.base_url`; `SUMMARYD_REDIS_URL` -> `redis_url`.
fn env_key_to_path(key: &str) -> String {
    let key = key.to_ascii_lowercase();
    if TOP_LEVEL.contains(&key.as_str()) {
        return key;
    }
    match key.split_once('_') {
        Some((section, rest)) => format!("{section}.{rest}"),
        None => key,
    }
}

impl Settings {
    /// Load all layers. `config_file` is `--config`, else `SUMMARYD_CONFIG`, else none.
    /// The TLS files the settings name are not read here: see `infra::check_tls_files`.
    pub fn load(config_file: Option<&Path>, flags: &FlagOverrides) -> Result<Self, ConfigError> {
        Self::load_from(config_file, flags, Env::prefixed("SUMMARYD_"))
    }

    fn load_from(
        config_file: Option<&Path>,
        flags: &FlagOverrides,
        env: Env,
    ) -> Result<Self, ConfigError> {
        // What the operator wrote, file and environment, without the defaults below it.
        let mut given = Figment::new();
        let file = config_file
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("SUMMARYD_CONFIG").map(PathBuf::from));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::Setting {
                    setting: "--config / SUMMARYD_CONFIG".into(),
                    reason: format!("{} is not a readable file", path.display()),
                });
            }
            given = given.merge(Toml::file_exact(path));
        }
        let known = known_paths();
        let env = env
            .filter(move |k| known.contains(&env_key_to_path(k.as_str())))
            .map(|k| env_key_to_path(k.as_str()).into());
        given = given.merge(env);
        let mut figment = Figment::from(Serialized::defaults(Settings::default())).merge(&given);
        if std::env::var_os("SUMMARYD_LLM_API_KEY").is_none()
            && let Ok(key) = std::env::var("OPENAI_API_KEY")
        {
            figment = figment.merge(Serialized::default("llm.api_key", key));
        }
        figment = figment.merge(Serialized::defaults(flags));
        let mut settings: Settings = figment.extract().map_err(describe_figment_error)?;
        settings.validate()?;
        settings.given_without_effect = WITHOUT_EFFECT
            .iter()
            .map(|(path, _)| *path)
            .filter(|path| given.contains(path))
            .collect();
        Ok(settings)
    }

    /// Log a warning for each `SUMMARYD_*` variable that names no setting and for each
    /// given setting that has no effect; once logging is set up, which needs the settings
    /// first.
    pub(crate) fn warn_about_ignored(&self) {
        for name in Self::ignored_env_vars() {
            tracing::warn!(variable = %name, "environment variable names no setting; ignored");
        }
        for (path, removed_in) in WITHOUT_EFFECT {
            if self.given_without_effect.contains(&path) {
                tracing::warn!(
                    setting = %env_name(path),
                    removed_in,
                    "setting has no effect; ignored; removed in {removed_in}, so delete it \
                     from the configuration"
                );
            }
        }
    }

    /// `SUMMARYD_*` variables that name no setting, to be warned about. They are ignored
    /// rather than fatal because orchestrators inject such names: Kubernetes service links
    /// give every pod `SUMMARYD_API_PORT`, `SUMMARYD_API_SERVICE_HOST`, … for a Service
    /// named `summaryd-api`. Keys in the config file stay strict.
    pub fn ignored_env_vars() -> Vec<String> {
        let known = known_paths();
        let mut ignored: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter_map(|k| k.strip_prefix("SUMMARYD_").map(str::to_owned))
            .filter(|k| !NOT_SETTINGS.contains(&k.to_ascii_lowercase().as_str()))
            .filter(|k| !known.contains(&env_key_to_path(k)))
            .map(|k| format!("SUMMARYD_{k}"))
            .collect();
        ignored.sort();
        ignored
    }

    /// Whether Redis is a cluster: `SUMMARYD_REDIS_CLUSTER`, or a `redis+cluster://` /
    /// `rediss+cluster://` URL. On a cluster every shard's keys carry their hash tag.
    pub fn redis_is_cluster(&self) -> bool {
        let url = self.redis_url.expose_secret();
        self.redis.cluster
            || ["redis+cluster://", "rediss+cluster://"]
                .iter()
                .any(|scheme| url.starts_with(scheme))
    }

    /// Range checks serde cannot express: each section's own, then those across sections.
    /// Pure: the TLS files are checked by `infra::check_tls_files`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.redis.check()?;
        self.stream.check()?;
        self.api.check()?;
        self.llm.check()?;
        self.mail.check()?;
        self.worker.check()?;
        self.relay.check()?;
        self.idempotency.check()?;
        self.maintenance.check()?;
        self.notify.check()?;
        self.webhook.check()?;
        self.console.check()?;
        if self.key_prefix.chars().any(char::is_whitespace) {
            return Err(invalid(
                "SUMMARYD_KEY_PREFIX",
                "must not contain whitespace",
            ));
        }
        if (self.stream.shards > 1 || self.redis_is_cluster())
            && self.key_prefix.contains(['{', '}'])
        {
            // The first {...} of a key is its hash tag: braces in the prefix would put
            // every shard in the prefix's slot.
            return Err(invalid(
                "SUMMARYD_KEY_PREFIX",
                "must not contain { or } with SUMMARYD_STREAM_SHARDS > 1 or a Redis Cluster",
            ));
        }
        if self.relay.lease <= self.mail.timeout {
            return Err(invalid(
                "SUMMARYD_RELAY_LEASE_MS",
                "must exceed SUMMARYD_MAIL_TIMEOUT_MS, or a slow send could be repeated by another relay",
            ));
        }
        if self.relay.lease <= self.webhook.timeout {
            return Err(invalid(
                "SUMMARYD_RELAY_LEASE_MS",
                "must exceed SUMMARYD_WEBHOOK_TIMEOUT_MS, or a slow webhook could be sent again by another relay",
            ));
        }
        self.check_retention_outlasts_replays()?;
        if let Some(ops) = self.ops.listen
            && ops == self.listen
            && ops.port() != 0
        {
            return Err(invalid(
                "SUMMARYD_OPS_LISTEN",
                "must differ from SUMMARYD_LISTEN (it exists to keep ops routes off the public port)",
            ));
        }
        Ok(())
    }

    /// The checks that depend on which roles run here, which `--roles` decides rather than
    /// the settings; `serve` runs them with [`Self::validate`]'s before anything binds.
    pub fn validate_for(&self, roles: roles::Roles) -> Result<(), ConfigError> {
        if roles.has(roles::Role::Api) {
            self.auth.check_listener(self.listen)?;
        }
        Ok(())
    }

    /// A replay answers from the idempotency record alone, so whatever GET shows for the job
    /// it names must live at least as long as that record: a horizon that removes it sooner
    /// lets a replay say "accepted" of a job GET no longer knows. Each horizon counts from
    /// a moment after the acceptance the record's TTL counts from, so exceeding the TTL is
    /// enough. `SUMMARYD_RETENTION_OUTBOX_SENT_S` needs no such bound: nothing a replay, GET
    /// or a redelivery reads is a sent outbox row (the summary row, which outlives it, is
    /// what makes a second commit of the job a duplicate), so it may be as short as wanted.
    fn check_retention_outlasts_replays(&self) -> Result<(), ConfigError> {
        let ttl = self.idempotency.result_ttl_s;
        let horizons = [
            (
                "SUMMARYD_RETENTION_DEAD_LETTERS_S",
                self.retention.dead_letters_s,
                "dead letters",
                "a replay would answer `queued` for a dead-lettered job GET answers 404 for",
            ),
            (
                "SUMMARYD_RETENTION_SUMMARIES_S",
                self.retention.summaries_s,
                "summaries",
                "a client replaying its request would find the summary it was promised gone",
            ),
        ];
        for (setting, horizon, what, breaks) in horizons {
            if horizon != 0 && horizon <= ttl {
                return Err(ConfigError::Setting {
                    setting: setting.into(),
                    reason: format!(
                        "{horizon} s must exceed SUMMARYD_IDEMPOTENCY_RESULT_TTL_S ({ttl} s), \
                         or be 0 to keep {what}: otherwise {breaks}"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Every setting's path (`listen`, `llm.base_url`, …), derived from the settings type itself
/// so the env filter can never drift from the fields.
fn known_paths() -> HashSet<String> {
    let mut paths = HashSet::new();
    if let Ok(serde_json::Value::Object(top)) = serde_json::to_value(Settings::default()) {
        for (key, value) in top {
            match value {
                serde_json::Value::Object(section) => {
                    paths.extend(
                        section
                            .keys()
                            .map(|k| format!("{key}.{k}"))
                            .filter(|path| !FILE_ONLY.contains(&path.as_str())),
                    );
                }
                _ => {
                    paths.insert(key);
                }
            }
        }
    }
    paths
}

/// Turn `worker.consumers` in a figment error into the env name operators know.
fn describe_figment_error(err: figment::Error) -> ConfigError {
    let mut messages = Vec::new();
    for e in err {
        let path = e.path.join(".");
        let reason = e.kind.to_string();
        if path.is_empty() {
            messages.push(reason);
        } else {
            messages.push(format!("{} ({path}): {reason}", env_name(&path)));
        }
    }
    ConfigError::Invalid(messages.join("; "))
}

fn env_name(path: &str) -> String {
    // File-only settings have no env name: name the table and the entry (numbered from 1).
    if let Some(rest) = path.strip_prefix("llm.fallback.") {
        let (index, key) = rest.split_once('.').unwrap_or((rest, ""));
        let number = index
            .parse::<usize>()
            .map_or(index.to_owned(), |i| (i + 1).to_string());
        return format!("[[llm.fallback]] #{number} {key}")
            .trim_end()
            .to_owned();
    }
    format!("SUMMARYD_{}", path.replace('.', "_").to_ascii_uppercase())
}

/// Loading as `summaryd` does, for the tests of every section.
#[cfg(test)]
mod testing {
    use std::path::Path;

    use super::{FlagOverrides, Settings};

    /// `toml` as the config file and `env` set in the environment, inside a figment jail
    /// (which serialises the tests that touch the environment); errors as their message.
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    pub(super) fn load(toml: &str, env: &[(&str, &str)]) -> Result<Settings, String> {
        let mut loaded = Err(String::new());
        figment::Jail::expect_with(|jail| {
            jail.create_file("summaryd.toml", toml)?;
            for (name, value) in env {
                jail.set_env(name, value);
            }
            loaded = Settings::load(Some(Path::new("summaryd.toml")), &FlagOverrides::default())
                .map_err(|e| e.to_string());
            Ok(())
        });
        loaded
    }

    /// The message of the first check `settings` fails.
    pub(super) fn refusal(settings: &Settings) -> String {
        match settings.validate() {
            Ok(()) => String::from("accepted"),
            Err(e) => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::testing::{load, refusal};
    use super::*;

    /// A change that breaks one setting.
    type Adjust = fn(&mut Settings);

    /// Where one retention horizon lives in the settings.
    type Horizon = fn(&mut Settings) -> &mut u64;

    #[test]
    fn env_names_map_to_sections_and_top_level_keys() {
        assert_eq!(env_key_to_path("LLM_BASE_URL"), "llm.base_url");
        assert_eq!(env_key_to_path("REDIS_URL"), "redis_url");
        assert_eq!(env_key_to_path("JOB_BUDGET_MS"), "job_budget_ms");
        assert_eq!(env_key_to_path("listen"), "listen");
        assert_eq!(env_key_to_path("NOSECTION"), "nosection");
        assert_eq!(
            env_key_to_path("WORKER_CLAIM_IDLE_MS"),
            "worker.claim_idle_ms"
        );
        assert_eq!(
            env_key_to_path("IDEMPOTENCY_LOCK_TTL_S"),
            "idempotency.lock_ttl_s"
        );
        assert_eq!(
            env_name("worker.claim_idle_ms"),
            "SUMMARYD_WORKER_CLAIM_IDLE_MS"
        );
        assert_eq!(
            env_name("llm.fallback.1.model"),
            "[[llm.fallback]] #2 model"
        );
        assert_eq!(env_name("llm.fallback.0"), "[[llm.fallback]] #1");
    }

    /// The file and env names are the contract's, whatever the Rust fields are called.
    #[test]
    fn every_setting_keeps_its_file_key() {
        let known = known_paths();
        for path in [
            "listen",
            "redis_url",
            "database_url",
            "key_prefix",
            "job_budget_ms",
            "api.request_timeout_ms",
            "api.keep_alive_ms",
            "api.body_budget_wait_ms",
            "api.disconnect_timeout_ms",
            "llm.api_key",
            "llm.base_url",
            "llm.call_timeout_ms",
            "llm.backoff_ms",
            "llm.max_backoff_ms",
            "llm.breaker_cooldown_ms",
            "llm.context_tokens",
            "llm.parallel_parts",
            "llm.max_parts",
            "llm.rpm",
            "llm.tpm",
            "llm.price_per_mtok_input",
            "llm.price_per_mtok_output",
            "api.max_text_chars",
            "api.inline_text_bytes",
            "mail.smtp_url",
            "mail.http_url",
            "mail.timeout_ms",
            "mail.allow_cleartext",
            "auth.mode",
            "worker.claim_idle_ms",
            "worker.consumer_gc_ms",
            "worker.block_ms",
            "relay.max_attempts",
            "relay.poll_ms",
            "relay.backoff_ms",
            "relay.max_backoff_ms",
            "relay.lease_ms",
            "idempotency.lock_ttl_s",
            "maintenance.interval_ms",
            "shutdown.grace_ms",
            "redis.ca_file",
            "redis.cluster",
            "redis.min_replicas_ack",
            "redis.ack_timeout_ms",
            "stream.shards",
            "database.ca_file",
            "ops.listen",
            "auth.tokens_file",
            "notify.domains",
            "notify.per_hour",
            "webhook.secrets_file",
            "webhook.allow_private",
            "webhook.allow_http",
            "webhook.timeout_ms",
            "webhook.give_up_s",
            "webhook.disable_after_s",
            "console.users_file",
            "console.session_idle_s",
            "log.format",
            "otel.exporter_otlp_endpoint",
            "otel.capture_content",
        ] {
            assert!(known.contains(path), "{path} missing from {known:?}");
        }
        assert!(!known.contains("llm.fallback"), "file only");
        assert!(!known.contains("given_without_effect"), "not a setting");
        assert_eq!(known.len(), 85, "{known:?}");
    }

    /// The documented example file must stay loadable and equal to the built-in defaults.
    #[test]
    fn documented_config_file_matches_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/summaryd.toml");
        let from_file: Settings = Figment::from(Toml::file_exact(path))
            .extract()
            .expect("config/summaryd.toml parses");
        assert_eq!(
            serde_json::to_value(&from_file).unwrap(),
            serde_json::to_value(Settings::default()).unwrap()
        );
        assert_eq!(
            from_file.redis_url.expose_secret(),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn debug_output_never_shows_a_secret() {
        let mut s = Settings::default();
        s.llm.api_key = Some("sk-very-secret".into());
        s.llm.base_url = "https://proxy:llm-pass@llm.internal/v1".into();
        s.llm.fallback = vec![FallbackSettings {
            provider: LlmProvider::Openai,
            base_url: "https://proxy:fallback-pass@local/v1".into(),
            model: "llama".into(),
            api_key_env: Some("LOCAL_KEY".into()),
            call_timeout: None,
            context_tokens: None,
            rpm: None,
            tpm: None,
            price_per_mtok_input: None,
            price_per_mtok_output: None,
        }];
        s.redis_url = "rediss://default:redis-pass@cache:6380".into();
        s.database_url = "postgres://app:pg-pass@db/summaryd?sslmode=verify-full".into();
        s.mail.smtp_url = Some("smtps://mailer:smtp-pass@smtp.example:465".into());
        s.mail.http_url = Some("https://api.mail.example/send?api_key=mail-key".into());
        s.key_prefix = "tenant-a:".into();
        let shown = format!("{s:?}");
        for secret in [
            "sk-very-secret",
            "llm-pass",
            "fallback-pass",
            "redis-pass",
            "pg-pass",
            "smtp-pass",
            "mail-key",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("REDACTED"), "{shown}");
        for plain in ["tenant-a:", "llama", "LOCAL_KEY", "summaryd@localhost"] {
            assert!(shown.contains(plain), "the rest stays: {plain} in {shown}");
        }
        // Where a value is used, it is all there.
        assert_eq!(
            s.mail.smtp_url.as_ref().map(|u| u.expose_secret()),
            Some("smtps://mailer:smtp-pass@smtp.example:465")
        );
    }

    #[test]
    fn secrets_and_durations_load_from_the_environment() {
        let s = load(
            "",
            &[
                ("SUMMARYD_REDIS_URL", "rediss://default:pw@cache:6380"),
                ("SUMMARYD_DATABASE_URL", "postgres://app:pw@db/summaryd"),
                ("SUMMARYD_LLM_API_KEY", "sk-from-env"),
                ("OPENAI_API_KEY", "sk-openai"),
                ("SUMMARYD_JOB_BUDGET_MS", "90000"),
            ],
        )
        .unwrap();
        assert_eq!(
            s.redis_url.expose_secret(),
            "rediss://default:pw@cache:6380"
        );
        assert_eq!(
            s.database_url.expose_secret(),
            "postgres://app:pw@db/summaryd"
        );
        assert_eq!(
            s.llm.api_key.as_ref().map(|k| k.expose_secret()),
            Some("sk-from-env"),
            "SUMMARYD_LLM_API_KEY wins over OPENAI_API_KEY"
        );
        assert_eq!(s.job_budget, Duration::from_secs(90));

        let s = load("job_budget_ms = 1500\n", &[("OPENAI_API_KEY", "sk-openai")]).unwrap();
        assert_eq!(
            s.llm.api_key.as_ref().map(|k| k.expose_secret()),
            Some("sk-openai")
        );
        assert_eq!(s.job_budget, Duration::from_millis(1_500));
        let s = load("", &[]).unwrap();
        assert!(s.llm.api_key.is_none());
        assert_eq!(s.job_budget, Duration::from_secs(60));
    }

    /// Values serde cannot take are refused with the words they always were.
    #[test]
    fn unusable_values_are_refused_naming_the_setting() {
        for (env, expected) in [
            (
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "many"),
                "invalid configuration: SUMMARYD_WORKER_CLAIM_IDLE_MS (worker.claim_idle_ms): \
                 invalid type: found string \"many\", expected u64",
            ),
            (
                ("SUMMARYD_WORKER_CLAIM_IDLE_MS", "-1"),
                "invalid configuration: SUMMARYD_WORKER_CLAIM_IDLE_MS (worker.claim_idle_ms): \
                 invalid value signed int `-1`, expected u64",
            ),
            (
                ("SUMMARYD_JOB_BUDGET_MS", "1.5"),
                "invalid configuration: SUMMARYD_JOB_BUDGET_MS (job_budget_ms): invalid type: \
                 found float `1.5`, expected u64",
            ),
            (
                ("SUMMARYD_REDIS_URL", "5"),
                "invalid configuration: SUMMARYD_REDIS_URL (redis_url): invalid type: found \
                 unsigned int `5`, expected a string",
            ),
            (
                ("SUMMARYD_LLM_API_KEY", "true"),
                "invalid configuration: SUMMARYD_LLM_API_KEY (llm.api_key): invalid type: found \
                 bool true, expected a string",
            ),
        ] {
            assert_eq!(load("", &[env]).err().as_deref(), Some(expected));
        }
        for (toml, expected) in [
            (
                "[llm]\ncall_timeout_ms = \"20s\"\n",
                "invalid configuration: SUMMARYD_LLM_CALL_TIMEOUT_MS (llm.call_timeout_ms): \
                 invalid type: found string \"20s\", expected u64",
            ),
            (
                "[[llm.fallback]]\nprovider = \"builtin\"\ncall_timeout_ms = -5\n",
                "invalid configuration: [[llm.fallback]] #1 call_timeout_ms \
                 (llm.fallback.0.call_timeout_ms): invalid value signed int `-5`, expected u64",
            ),
            (
                "[mail]\nsmtp_url = 7\n",
                "invalid configuration: SUMMARYD_MAIL_SMTP_URL (mail.smtp_url): invalid type: \
                 found signed int `7`, expected a string",
            ),
        ] {
            assert_eq!(load(toml, &[]).err().as_deref(), Some(expected));
        }
        let syntax = load("[worker\n", &[]).unwrap_err();
        assert!(
            syntax.starts_with("invalid configuration: ") && !syntax.contains("SUMMARYD_"),
            "{syntax}"
        );
    }

    /// Each horizon a replay relies on is refused at and below the idempotency result TTL,
    /// naming itself and the TTL; above it, or 0 (kept), it is accepted.
    #[test]
    fn retention_horizons_must_outlast_the_idempotency_records() {
        let horizons: [(&str, Horizon); 2] = [
            ("SUMMARYD_RETENTION_DEAD_LETTERS_S", |s| {
                &mut s.retention.dead_letters_s
            }),
            ("SUMMARYD_RETENTION_SUMMARIES_S", |s| {
                &mut s.retention.summaries_s
            }),
        ];
        for (setting, horizon) in horizons {
            let mut s = Settings::default();
            let ttl = s.idempotency.result_ttl_s;
            for refused in [ttl, ttl - 1, 1] {
                *horizon(&mut s) = refused;
                let err = refusal(&s);
                assert!(
                    err.starts_with(&format!("invalid configuration: {setting}: "))
                        && err.contains("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S"),
                    "{refused}: {err}"
                );
            }
            for accepted in [ttl + 1, 0] {
                *horizon(&mut s) = accepted;
                assert_eq!(refusal(&s), "accepted", "{setting} = {accepted}");
            }
            // The TTL moving is checked the same way.
            *horizon(&mut s) = ttl + 1;
            s.idempotency.result_ttl_s = ttl + 1;
            assert!(refusal(&s).contains(setting));
        }
        // Sent outbox rows back nothing a replay reads: any horizon is accepted.
        let mut s = Settings::default();
        s.retention.outbox_sent_s = 1;
        assert_eq!(refusal(&s), "accepted");
        // Through the loader, as `serve` reads them.
        let err = load(
            "",
            &[
                ("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S", "7200"),
                ("SUMMARYD_RETENTION_DEAD_LETTERS_S", "3600"),
            ],
        )
        .unwrap_err();
        assert!(err.contains("SUMMARYD_RETENTION_DEAD_LETTERS_S"), "{err}");
        assert!(err.contains("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S"), "{err}");
    }

    #[test]
    fn the_relay_lease_must_outlast_a_send() {
        let mut s = Settings::default();
        s.relay.lease = s.mail.timeout;
        assert!(refusal(&s).contains("SUMMARYD_RELAY_LEASE_MS"));
        s.relay.lease = s.mail.timeout - Duration::from_millis(1);
        assert!(refusal(&s).contains("SUMMARYD_RELAY_LEASE_MS"));
        s.relay.lease = s.mail.timeout + Duration::from_millis(1);
        s.webhook.timeout = s.mail.timeout;
        assert!(s.validate().is_ok());
        // A webhook's wall-clock cap too.
        s.webhook.timeout = s.relay.lease;
        assert!(refusal(&s).contains("SUMMARYD_WEBHOOK_TIMEOUT_MS"));
        s.webhook.timeout = s.relay.lease - Duration::from_millis(1);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn the_ops_listener_must_be_its_own_port() {
        let mut s = Settings::default();
        s.ops.listen = Some(s.listen);
        assert!(refusal(&s).contains("SUMMARYD_OPS_LISTEN"));
        s.ops.listen = Some(SocketAddr::from(([127, 0, 0, 1], 9090)));
        assert!(s.validate().is_ok());
        // Port 0 picks a free port for each, so they cannot collide.
        s.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        s.ops.listen = Some(s.listen);
        assert!(s.validate().is_ok());
    }

    /// Protected mode concerns the api role's public listener only.
    #[test]
    fn only_the_api_role_needs_auth_off_loopback() {
        use roles::{Role, Roles};
        let mut s = Settings {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            ..Settings::default()
        };
        for roles in [Roles::all(), Roles::of(&[Role::Api])] {
            let err = s.validate_for(roles).unwrap_err().to_string();
            assert!(err.contains("SUMMARYD_AUTH_MODE"), "{roles}: {err}");
        }
        assert!(
            s.validate_for(Roles::of(&[Role::Worker, Role::Relay]))
                .is_ok()
        );
        // The ops listener serves no tenant data: it may face the network.
        s.listen = SocketAddr::from(([127, 0, 0, 1], 8080));
        s.ops.listen = Some(SocketAddr::from(([0, 0, 0, 0], 9090)));
        assert!(s.validate_for(Roles::all()).is_ok());
        s.listen = SocketAddr::from(([0, 0, 0, 0], 8080));
        s.auth.mode = Some(AuthMode::Header);
        assert!(s.validate_for(Roles::all()).is_ok());
    }

    #[test]
    fn the_key_prefix_has_no_whitespace() {
        let mut s = Settings {
            key_prefix: "a b:".into(),
            ..Settings::default()
        };
        assert!(refusal(&s).contains("SUMMARYD_KEY_PREFIX"));
        s.key_prefix = "a-b:".into();
        assert!(s.validate().is_ok());
    }

    /// Every section's own checks run as part of `validate`.
    #[test]
    fn validate_runs_each_sections_checks() {
        let cases: [(&str, Adjust); 7] = [
            ("SUMMARYD_API_MAX_BODY_BYTES", |s| s.api.max_body_bytes = 0),
            ("SUMMARYD_LLM_MAX_TOKENS", |s| s.llm.max_tokens = 0),
            ("SUMMARYD_MAIL_SMTP_URL", |s| {
                s.mail.provider = MailProvider::Smtp
            }),
            ("SUMMARYD_WORKER_CONSUMERS", |s| s.worker.consumers = 0),
            ("SUMMARYD_RELAY_TASKS", |s| s.relay.tasks = 0),
            ("SUMMARYD_IDEMPOTENCY_LOCK_TTL_S", |s| {
                s.idempotency.lock_ttl_s = 0
            }),
            ("SUMMARYD_MAINTENANCE_INTERVAL_MS", |s| {
                s.maintenance.interval = Duration::ZERO
            }),
        ];
        assert!(Settings::default().validate().is_ok());
        for (setting, adjust) in cases {
            let mut s = Settings::default();
            adjust(&mut s);
            let err = refusal(&s);
            assert!(
                err.starts_with(&format!("invalid configuration: {setting}: ")),
                "{err}"
            );
        }
        // A check refuses the load itself.
        let err = load("[worker]\nconsumers = 0\n", &[]).unwrap_err();
        assert!(err.contains("SUMMARYD_WORKER_CONSUMERS"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    fn layers_apply_in_order_and_errors_name_the_setting() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "s.toml",
                "key_prefix = \"file:\"\n[worker]\nconsumers = 3\nmax_deliveries = 9\n",
            )?;
            jail.set_env("SUMMARYD_WORKER_CONSUMERS", "5");
            let flags = FlagOverrides::default();
            let s = Settings::load(Some(Path::new("s.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.key_prefix, "file:");
            assert_eq!(s.worker.max_deliveries, 9);
            assert_eq!(s.worker.consumers, 5, "env beats file");
            let flags = FlagOverrides {
                worker: Some(WorkerFlags { consumers: 7 }),
                relay: Some(RelayFlags { tasks: 2 }),
                listen: Some(SocketAddr::from(([127, 0, 0, 1], 9000))),
            };
            let s = Settings::load(Some(Path::new("s.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.worker.consumers, 7, "flag beats env");
            assert_eq!(s.relay.tasks, 2);
            assert_eq!(s.listen.port(), 9000);

            // Names a Kubernetes Service called summaryd-api injects are not settings.
            jail.set_env("SUMMARYD_API_SERVICE_HOST", "10.0.0.1");
            jail.set_env("SUMMARYD_PORT", "tcp://10.0.0.2:80");
            let s = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(s.worker.consumers, 5);
            assert_eq!(
                Settings::ignored_env_vars(),
                vec![
                    "SUMMARYD_API_SERVICE_HOST".to_string(),
                    "SUMMARYD_PORT".to_string()
                ]
            );

            jail.set_env("SUMMARYD_WORKER_CONSUMERS", "many");
            let err = Settings::load(None, &FlagOverrides::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("SUMMARYD_WORKER_CONSUMERS"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    fn summaryd_config_names_the_file_and_is_no_setting() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("s.toml", "key_prefix = \"file:\"\n")?;
            jail.set_env("SUMMARYD_CONFIG", "s.toml");
            let s = Settings::load(None, &FlagOverrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(s.key_prefix, "file:");
            assert!(Settings::ignored_env_vars().is_empty());
            jail.set_env("SUMMARYD_CONFIG", "missing.toml");
            let err = Settings::load(None, &FlagOverrides::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert_eq!(
                err,
                "invalid configuration: --config / SUMMARYD_CONFIG: missing.toml is not a readable file"
            );
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    fn fallbacks_come_from_the_file_only_and_errors_name_the_table() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "s.toml",
                "[llm]\nprovider = \"openai\"\nmax_tokens = 300\n\
                 [[llm.fallback]]\nprovider = \"openai\"\nbase_url = \"http://local:8000/v1\"\n\
                 model = \"llama\"\napi_key_env = \"LOCAL_KEY\"\ncall_timeout_ms = 40000\n\
                 [[llm.fallback]]\nprovider = \"builtin\"\n",
            )?;
            jail.set_env("SUMMARYD_LLM_BREAKER_FAILURES", "7");
            jail.set_env("SUMMARYD_LLM_FALLBACK", "[]");
            let flags = FlagOverrides::default();
            let s = Settings::load(Some(Path::new("s.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.llm.max_tokens, 300);
            assert_eq!(s.llm.breaker_failures, 7);
            assert_eq!(s.llm.breaker_cooldown, Duration::from_secs(30));
            assert_eq!(
                s.llm.fallback.len(),
                2,
                "the env cannot replace the file's list"
            );
            let first = &s.llm.fallback[0];
            assert_eq!(first.model, "llama");
            assert_eq!(first.base_url.expose_secret(), "http://local:8000/v1");
            assert_eq!(first.api_key_env.as_deref(), Some("LOCAL_KEY"));
            assert_eq!(first.call_timeout, Some(Duration::from_secs(40)));
            let second = &s.llm.fallback[1];
            assert_eq!(second.provider, LlmProvider::Builtin);
            assert_eq!(second.call_timeout, None, "[llm]'s then");
            assert_eq!(second.base_url.expose_secret(), "");
            assert_eq!(
                Settings::ignored_env_vars(),
                vec!["SUMMARYD_LLM_FALLBACK".to_string()]
            );

            jail.create_file(
                "bad.toml",
                "[[llm.fallback]]\nprovider = \"builtin\"\n[[llm.fallback]]\nprovider = \"openai\"\napi_key = \"sk-in-file\"\n",
            )?;
            let err = Settings::load(Some(Path::new("bad.toml")), &flags)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("[[llm.fallback]] #2"), "{err}");
            assert!(err.contains("api_key"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn settings_without_effect_are_remembered_only_when_given() {
        let s = load("", &[]).unwrap();
        assert!(s.given_without_effect.is_empty());
        let s = load("[relay]\nmax_attempts = 3\n", &[]).unwrap();
        assert_eq!(s.given_without_effect, vec!["relay.max_attempts"]);
        assert_eq!(s.relay.max_attempts, 3, "still accepted");
        let s = load("", &[("SUMMARYD_IDEMPOTENCY_LOCK_TTL_S", "60")]).unwrap();
        assert_eq!(s.given_without_effect, vec!["idempotency.lock_ttl_s"]);
        let s = load(
            "[idempotency]\nlock_ttl_s = 30\n",
            &[("SUMMARYD_RELAY_MAX_ATTEMPTS", "10")],
        )
        .unwrap();
        assert_eq!(
            s.given_without_effect,
            vec!["relay.max_attempts", "idempotency.lock_ttl_s"]
        );
    }

    /// What `f` logs, as text.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the closure's error type
    fn each_given_setting_without_effect_is_warned_about_once_with_its_release() {
        let mut s = Settings {
            given_without_effect: vec!["relay.max_attempts"],
            ..Settings::default()
        };
        let mut log = String::new();
        figment::Jail::expect_with(|jail| {
            jail.set_env("SUMMARYD_WORKER_CONSUMER", "4");
            log = logged(|| s.warn_about_ignored());
            Ok(())
        });
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        assert!(
            lines.iter().any(|l| l.contains("WARN")
                && l.contains("setting=SUMMARYD_RELAY_MAX_ATTEMPTS")
                && l.contains("removed in 0.2.0")),
            "{log}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("variable=SUMMARYD_WORKER_CONSUMER")),
            "{log}"
        );
        assert!(!log.contains("LOCK_TTL"), "{log}");
        s.given_without_effect.clear();
        assert_eq!(logged(|| s.warn_about_ignored()), "");
    }
}
