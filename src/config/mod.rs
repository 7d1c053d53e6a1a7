//! Layered settings: built-in defaults < TOML file < `SUMMARYD_*` environment < CLI flags.
//!
//! The env name maps onto the file by its first segment: `SUMMARYD_LLM_BASE_URL` is
//! `[llm] base_url`; the few top-level keys listed in `TOP_LEVEL` stay flat.

pub mod roles;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("invalid configuration: {setting}: {reason}")]
    Setting { setting: String, reason: String },
}

/// `Debug` is written out below: the URLs may carry passwords.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub listen: SocketAddr,
    pub redis_url: String,
    pub database_url: String,
    /// Prepended to every Redis key we own, so several deployments or tests share one Redis.
    pub key_prefix: String,
    /// Deadline for one delivery of a job, model attempts and backoff sleeps included.
    pub job_budget_ms: u64,
    /// TLS material for `rediss://` URLs (`SUMMARYD_REDIS_*_FILE`).
    pub redis: RedisTlsSettings,
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
    pub log: LogSettings,
    pub shutdown: ShutdownSettings,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured so a new field cannot be added without deciding how it is shown.
        let Self {
            listen,
            redis_url,
            database_url,
            key_prefix,
            job_budget_ms,
            redis,
            database,
            ops,
            api,
            llm,
            mail,
            worker,
            relay,
            idempotency,
            retention,
            maintenance,
            auth,
            log,
            shutdown,
        } = self;
        f.debug_struct("Settings")
            .field("listen", listen)
            .field("redis_url", &crate::infra::redact::url(redis_url))
            .field("database_url", &crate::infra::redact::url(database_url))
            .field("key_prefix", key_prefix)
            .field("job_budget_ms", job_budget_ms)
            .field("redis", redis)
            .field("database", database)
            .field("ops", ops)
            .field("api", api)
            .field("llm", llm)
            .field("mail", mail)
            .field("worker", worker)
            .field("relay", relay)
            .field("idempotency", idempotency)
            .field("retention", retention)
            .field("maintenance", maintenance)
            .field("auth", auth)
            .field("log", log)
            .field("shutdown", shutdown)
            .finish()
    }
}

/// Files for TLS to Redis; only valid with a `rediss://` URL.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsSettings {
    /// PEM CA bundle the server's certificate must chain to; none = the system trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) and key, for servers that require mutual TLS.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// PEM CA for `sslmode=verify-ca|verify-full` (the URL's `sslrootcert=` wins over it).
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsSettings {
    /// Own listener for /healthz, /readyz, /metrics and /openapi.json, so the public
    /// listener serves /v1 only; none = everything on `listen`.
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Request bodies above this are refused with 413 before parsing.
    pub max_body_bytes: usize,
    /// Deadline for receiving a whole request, head and body; a client that has not sent
    /// it by then gets 408 and its connection is closed.
    pub request_timeout_ms: u64,
    /// How long an idle keep-alive connection stays open.
    pub keep_alive_ms: u64,
    /// Open connections this process accepts at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Request-body bytes all requests of this process may hold at once.
    pub body_budget_bytes: usize,
    /// How long a request waits for room in the body budget before it gets 503.
    pub body_budget_wait_ms: u64,
    /// After answering a request whose body was not read (an early error), how long the
    /// connection may drain before it is closed.
    pub disconnect_timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    Builtin,
    Openai,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSettings {
    pub provider: LlmProvider,
    pub base_url: String,
    pub model: String,
    /// Falls back to `OPENAI_API_KEY`; never logged (the `Debug` impl below redacts it).
    pub api_key: Option<String>,
    pub call_timeout_ms: u64,
    pub max_attempts: u32,
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Longest text (in characters) sent to the model. Longer input would overflow the
    /// model's context and fail the same way on every attempt, so it is refused up front
    /// (413 at the API, `InvalidInput` in the worker) instead of paying for doomed calls.
    pub max_input_chars: usize,
    /// Completion cap sent with every request (`max_tokens`), so one job's cost is bounded.
    pub max_tokens: u32,
    /// Consecutive transient failures of one provider that open its circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before its first probe; doubles while probes fail.
    pub breaker_cooldown_ms: u64,
    /// Providers tried in order after this one (`[[llm.fallback]]`; only in the file).
    #[serde(default)]
    pub fallback: Vec<FallbackSettings>,
}

/// One `[[llm.fallback]]` table: a provider tried when the ones before it are unavailable.
/// Attempts, backoff, the input cap, `max_tokens` and the breaker settings are `[llm]`'s.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackSettings {
    pub provider: LlmProvider,
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub model: String,
    /// The name of the environment variable holding this provider's API key (the key itself
    /// never sits in the file); none = requests carry no `Authorization`.
    pub api_key_env: Option<String>,
    /// Defaults to `[llm] call_timeout_ms`.
    pub call_timeout_ms: Option<u64>,
}

impl std::fmt::Debug for FallbackSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FallbackSettings")
            .field("provider", &self.provider)
            .field("base_url", &crate::infra::redact::url(&self.base_url))
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("call_timeout_ms", &self.call_timeout_ms)
            .finish()
    }
}

impl std::fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSettings")
            .field("provider", &self.provider)
            .field("base_url", &crate::infra::redact::url(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("call_timeout_ms", &self.call_timeout_ms)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_ms", &self.backoff_ms)
            .field("max_backoff_ms", &self.max_backoff_ms)
            .field("max_input_chars", &self.max_input_chars)
            .field("max_tokens", &self.max_tokens)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_cooldown_ms", &self.breaker_cooldown_ms)
            .field("fallback", &self.fallback)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MailProvider {
    Log,
    Smtp,
    Http,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailSettings {
    pub provider: MailProvider,
    pub smtp_url: Option<String>,
    pub http_url: Option<String>,
    pub from: String,
    pub timeout_ms: u64,
}

impl std::fmt::Debug for MailSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            provider,
            smtp_url,
            http_url,
            from,
            timeout_ms,
        } = self;
        f.debug_struct("MailSettings")
            .field("provider", provider)
            .field(
                "smtp_url",
                &smtp_url.as_deref().map(crate::infra::redact::url),
            )
            .field(
                "http_url",
                &http_url.as_deref().map(crate::infra::redact::url),
            )
            .field("from", from)
            .field("timeout_ms", timeout_ms)
            .finish()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    pub claim_idle_ms: u64,
    pub max_deliveries: u64,
    pub consumers: usize,
    pub consumer_gc_ms: u64,
    /// XREADGROUP BLOCK: how long an idle consumer waits for new work per call.
    pub block_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySettings {
    pub tasks: usize,
    /// No effect: transient failures never make a row stuck, only `give_up_s` does. Kept
    /// so configurations that set it stay valid.
    pub max_attempts: i32,
    /// A row failing transiently for longer than this since it was created (or retried by
    /// a person) needs a person: listed by `outbox stuck`, no longer sent by itself.
    pub give_up_s: u64,
    pub poll_ms: u64,
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Rows claimed per pass; small so one slow provider holds few rows.
    pub batch: i64,
    /// How long a claimed row is reserved for one relay; must exceed `mail.timeout_ms`.
    pub lease_ms: u64,
}

impl RelaySettings {
    pub fn give_up(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.give_up_s)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    /// No effect: POST accepts a key in one atomic step (see `api::idempotency`), so there
    /// is no in-progress marker. Kept because the contract names the variable.
    pub lock_ttl_s: u64,
    pub result_ttl_s: u64,
}

/// How long finished work is kept; 0 keeps it forever. Removed by the maintenance task.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Dead letters (and their job state) older than this are removed.
    pub dead_letters_s: u64,
    /// Sent outbox rows older than this (since they were sent) are deleted.
    pub outbox_sent_s: u64,
    /// Summaries completed longer ago than this are deleted; must exceed the idempotency
    /// result TTL (see `validate`).
    pub summaries_s: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceSettings {
    /// How often the maintenance task refreshes the cluster-wide gauges and applies retention.
    pub interval_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub tokens_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// Unset: text on a TTY, JSON otherwise.
    pub format: Option<LogFormat>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    pub grace_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            redis_url: "redis://127.0.0.1:6379".into(),
            database_url: "postgres://postgres@127.0.0.1:5432/summaryd".into(),
            key_prefix: String::new(),
            job_budget_ms: 60_000,
            redis: RedisTlsSettings::default(),
            database: DatabaseSettings::default(),
            ops: OpsSettings::default(),
            api: ApiSettings {
                max_body_bytes: 256 * 1024,
                // A 256 KiB body needs 8 s at 256 kbit/s, a slow mobile uplink; anything
                // slower is holding memory on purpose.
                request_timeout_ms: 10_000,
                keep_alive_ms: 5_000,
                // actix reads whatever a client has already sent (up to 128 KiB, in a
                // 256 KiB buffer) before any handler can refuse it, so this bounds the
                // memory of bodies in flight: 128 x ~0.3 MiB. Measured with 1,000 stalled
                // 250 KB bodies: peak RSS stays under 64 MiB (README, "Security: the HTTP front door").
                max_connections: 128,
                // 32 bodies at the size limit (24 of them large, see `api::body`), or
                // thousands of ordinary few-KiB ones.
                body_budget_bytes: 8 * 1024 * 1024,
                // Bodies in flight finish in milliseconds; a longer wait only keeps a
                // refused connection (and actix's buffer for it) alive.
                body_budget_wait_ms: 100,
                disconnect_timeout_ms: 500,
            },
            llm: LlmSettings {
                provider: LlmProvider::Builtin,
                base_url: "https://api.openai.com/v1".into(),
                model: "gpt-4.1-mini".into(),
                api_key: None,
                call_timeout_ms: 20_000,
                max_attempts: 4,
                backoff_ms: 500,
                max_backoff_ms: 8_000,
                // ~25k tokens of English: fits every current chat model's context with room
                // for the prompt and the answer.
                max_input_chars: 100_000,
                // A few paragraphs: what a summary for the account team needs.
                max_tokens: 512,
                // Five failures in a row is past what one flaky call or a short blip makes,
                // and early enough that an outage costs only the deliveries in hand.
                breaker_failures: 5,
                breaker_cooldown_ms: 30_000,
                fallback: Vec::new(),
            },
            mail: MailSettings {
                provider: MailProvider::Log,
                smtp_url: None,
                http_url: None,
                from: "summaryd@localhost".into(),
                timeout_ms: 10_000,
            },
            worker: WorkerSettings {
                claim_idle_ms: 120_000,
                max_deliveries: 5,
                consumers: 4,
                consumer_gc_ms: 600_000,
                block_ms: 2_000,
            },
            relay: RelaySettings {
                tasks: 1,
                max_attempts: 10,
                // A day: any mail outage the on-call can be expected to notice and fix.
                give_up_s: 86_400,
                poll_ms: 500,
                backoff_ms: 1_000,
                max_backoff_ms: 300_000,
                batch: 10,
                lease_ms: 60_000,
            },
            idempotency: IdempotencySettings {
                lock_ttl_s: 30,
                result_ttl_s: 86_400,
            },
            retention: RetentionSettings {
                dead_letters_s: 14 * 86_400,
                outbox_sent_s: 7 * 86_400,
                summaries_s: 0,
            },
            maintenance: MaintenanceSettings {
                interval_ms: 10_000,
            },
            auth: AuthSettings::default(),
            log: LogSettings::default(),
            shutdown: ShutdownSettings { grace_ms: 25_000 },
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
    pub fn load(config_file: Option<&Path>, flags: &FlagOverrides) -> Result<Self, ConfigError> {
        Self::load_from(config_file, flags, Env::prefixed("SUMMARYD_"))
    }

    fn load_from(
        config_file: Option<&Path>,
        flags: &FlagOverrides,
        env: Env,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
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
            figment = figment.merge(Toml::file_exact(path));
        }
        let known = known_paths();
        let env = env
            .filter(move |k| known.contains(&env_key_to_path(k.as_str())))
            .map(|k| env_key_to_path(k.as_str()).into());
        figment = figment.merge(env);
        if std::env::var_os("SUMMARYD_LLM_API_KEY").is_none()
            && let Ok(key) = std::env::var("OPENAI_API_KEY")
        {
            figment = figment.merge(Serialized::default("llm.api_key", key));
        }
        figment = figment.merge(Serialized::defaults(flags));
        let settings: Settings = figment.extract().map_err(describe_figment_error)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Log a warning for each `SUMMARYD_*` variable that names no setting; once logging is
    /// set up, which needs the settings first.
    pub fn warn_about_ignored_env_vars() {
        for name in Self::ignored_env_vars() {
            tracing::warn!(variable = %name, "environment variable names no setting; ignored");
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

    /// Cross-field and range checks serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |setting: &str, reason: &str| {
            Err(ConfigError::Setting {
                setting: setting.into(),
                reason: reason.into(),
            })
        };
        if self.api.max_body_bytes == 0 {
            return bad("SUMMARYD_API_MAX_BODY_BYTES", "must be at least 1");
        }
        if self.api.body_budget_bytes < self.api.max_body_bytes {
            return bad(
                "SUMMARYD_API_BODY_BUDGET_BYTES",
                "must be at least SUMMARYD_API_MAX_BODY_BYTES, or a body at the limit could never be read",
            );
        }
        if self.api.request_timeout_ms == 0 {
            return bad("SUMMARYD_API_REQUEST_TIMEOUT_MS", "must be positive");
        }
        if self.api.max_connections == 0 {
            return bad("SUMMARYD_API_MAX_CONNECTIONS", "must be at least 1");
        }
        if self.worker.consumers == 0 {
            return bad("SUMMARYD_WORKER_CONSUMERS", "must be at least 1");
        }
        if self.relay.tasks == 0 {
            return bad("SUMMARYD_RELAY_TASKS", "must be at least 1");
        }
        if self.worker.max_deliveries == 0 {
            return bad("SUMMARYD_WORKER_MAX_DELIVERIES", "must be at least 1");
        }
        if self.llm.max_attempts == 0 {
            return bad("SUMMARYD_LLM_MAX_ATTEMPTS", "must be at least 1");
        }
        if self.llm.call_timeout_ms == 0 {
            return bad("SUMMARYD_LLM_CALL_TIMEOUT_MS", "must be positive");
        }
        if self.llm.max_input_chars == 0 {
            return bad("SUMMARYD_LLM_MAX_INPUT_CHARS", "must be at least 1");
        }
        if self.llm.max_tokens == 0 {
            return bad("SUMMARYD_LLM_MAX_TOKENS", "must be at least 1");
        }
        if self.llm.breaker_failures == 0 {
            return bad("SUMMARYD_LLM_BREAKER_FAILURES", "must be at least 1");
        }
        if self.llm.breaker_cooldown_ms == 0 {
            return bad("SUMMARYD_LLM_BREAKER_COOLDOWN_MS", "must be positive");
        }
        if self.llm.backoff_ms > self.llm.max_backoff_ms {
            return bad(
                "SUMMARYD_LLM_BACKOFF_MS",
                "must not exceed SUMMARYD_LLM_MAX_BACKOFF_MS",
            );
        }
        if self.relay.backoff_ms > self.relay.max_backoff_ms {
            return bad(
                "SUMMARYD_RELAY_BACKOFF_MS",
                "must not exceed SUMMARYD_RELAY_MAX_BACKOFF_MS",
            );
        }
        if self.relay.give_up_s == 0 {
            return bad("SUMMARYD_RELAY_GIVE_UP_S", "must be positive");
        }
        if self.relay.batch < 1 {
            return bad("SUMMARYD_RELAY_BATCH", "must be at least 1");
        }
        if self.relay.lease_ms <= self.mail.timeout_ms {
            return bad(
                "SUMMARYD_RELAY_LEASE_MS",
                "must exceed SUMMARYD_MAIL_TIMEOUT_MS, or a slow send could be repeated by another relay",
            );
        }
        if self.idempotency.lock_ttl_s == 0 {
            return bad("SUMMARYD_IDEMPOTENCY_LOCK_TTL_S", "must be positive");
        }
        if self.idempotency.result_ttl_s == 0 {
            return bad("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S", "must be positive");
        }
        if self.retention.summaries_s != 0
            && self.retention.summaries_s <= self.idempotency.result_ttl_s
        {
            return bad(
                "SUMMARYD_RETENTION_SUMMARIES_S",
                "must exceed SUMMARYD_IDEMPOTENCY_RESULT_TTL_S (or be 0 to keep summaries): \
                 while a job's idempotency record is replayed, its summary must exist, or a \
                 replayed job would be unknown to GET and a redelivery of it would run it again",
            );
        }
        if self.maintenance.interval_ms == 0 {
            return bad("SUMMARYD_MAINTENANCE_INTERVAL_MS", "must be positive");
        }
        if self.key_prefix.chars().any(|c| c.is_whitespace()) {
            return bad("SUMMARYD_KEY_PREFIX", "must not contain whitespace");
        }
        if let Some(ops) = self.ops.listen
            && ops == self.listen
            && ops.port() != 0
        {
            return bad(
                "SUMMARYD_OPS_LISTEN",
                "must differ from SUMMARYD_LISTEN (it exists to keep ops routes off the public port)",
            );
        }
        // Reads the files, so a wrong path or a CA without rediss:// stops startup here.
        let is_tls = self.redis_url.trim_start().starts_with("rediss://");
        if let Err(e) = crate::infra::redis::tls_certificates(&self.redis, is_tls) {
            return Err(ConfigError::Invalid(e.to_string()));
        }
        // The URL's own sslmode/sslrootcert are checked where it is parsed (infra::postgres).
        if let Some(ca) = &self.database.ca_file
            && let Err(e) = crate::infra::tls::certificates("SUMMARYD_DATABASE_CA_FILE", ca)
        {
            return Err(ConfigError::Invalid(e.to_string()));
        }
        match self.mail.provider {
            MailProvider::Smtp if self.mail.smtp_url.is_none() => {
                return bad(
                    "SUMMARYD_MAIL_SMTP_URL",
                    "required when the mail provider is smtp",
                );
            }
            MailProvider::Http if self.mail.http_url.is_none() => {
                return bad(
                    "SUMMARYD_MAIL_HTTP_URL",
                    "required when the mail provider is http",
                );
            }
            _ => {}
        }
        Ok(())
    }
}

/// Every setting's path (`listen`, `llm.base_url`, …), derived from the settings type itself
/// so the env filter can never drift from the fields.
fn known_paths() -> std::collections::HashSet<String> {
    let mut paths = std::collections::HashSet::new();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_map_to_sections_and_top_level_keys() {
        assert_eq!(env_key_to_path("LLM_BASE_URL"), "llm.base_url");
        assert_eq!(env_key_to_path("REDIS_URL"), "redis_url");
        assert_eq!(env_key_to_path("JOB_BUDGET_MS"), "job_budget_ms");
        assert_eq!(
            env_key_to_path("WORKER_CLAIM_IDLE_MS"),
            "worker.claim_idle_ms"
        );
        assert_eq!(
            env_key_to_path("IDEMPOTENCY_LOCK_TTL_S"),
            "idempotency.lock_ttl_s"
        );
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
    }

    #[test]
    fn debug_output_never_shows_a_secret() {
        let mut s = Settings::default();
        s.llm.api_key = Some("sk-very-secret".into());
        s.llm.base_url = "https://proxy:llm-pass@llm.internal/v1".into();
        s.redis_url = "rediss://default:redis-pass@cache:6380".into();
        s.database_url = "postgres://app:pg-pass@db/summaryd?sslmode=verify-full".into();
        s.mail.smtp_url = Some("smtps://mailer:smtp-pass@smtp.example:465".into());
        s.mail.http_url = Some("https://api.mail.example/send?api_key=mail-key".into());
        let shown = format!("{s:?}");
        for secret in [
            "sk-very-secret",
            "llm-pass",
            "redis-pass",
            "pg-pass",
            "smtp-pass",
            "mail-key",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("<redacted>"));
        assert!(shown.contains("cache:6380"), "the rest stays: {shown}");
        // The hand-written Debug must not drop a field added later.
        let llm = format!("{:?}", s.llm);
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&s.llm) else {
            panic!("LlmSettings serialises to an object");
        };
        for name in fields.keys() {
            assert!(
                llm.contains(&format!("{name}:")),
                "{name} missing from {llm}"
            );
        }
    }

    #[test]
    fn each_ttl_error_names_its_own_setting() {
        let mut s = Settings::default();
        s.idempotency.result_ttl_s = 0;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("SUMMARYD_IDEMPOTENCY_RESULT_TTL_S"), "{err}");
        let mut s = Settings::default();
        s.idempotency.lock_ttl_s = 0;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("SUMMARYD_IDEMPOTENCY_LOCK_TTL_S"), "{err}");
    }

    #[test]
    fn summaries_retention_must_outlast_the_idempotency_records() {
        let mut s = Settings::default();
        s.retention.summaries_s = s.idempotency.result_ttl_s;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("SUMMARYD_RETENTION_SUMMARIES_S"), "{err}");
        s.retention.summaries_s = s.idempotency.result_ttl_s + 1;
        assert!(s.validate().is_ok());
        s.retention.summaries_s = 0;
        assert!(s.validate().is_ok(), "0 keeps summaries forever");
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
                ..Default::default()
            };
            let s = Settings::load(Some(Path::new("s.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!(s.worker.consumers, 7, "flag beats env");

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
            assert_eq!(s.llm.breaker_cooldown_ms, 30_000);
            assert_eq!(
                s.llm.fallback.len(),
                2,
                "the env cannot replace the file's list"
            );
            let first = &s.llm.fallback[0];
            assert_eq!(first.model, "llama");
            assert_eq!(first.api_key_env.as_deref(), Some("LOCAL_KEY"));
            assert_eq!(first.call_timeout_ms, Some(40_000));
            assert_eq!(s.llm.fallback[1].provider, LlmProvider::Builtin);
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
    fn breaker_and_token_settings_must_be_positive() {
        for (setting, adjust) in [
            (
                "SUMMARYD_LLM_MAX_TOKENS",
                (|s: &mut Settings| s.llm.max_tokens = 0) as fn(&mut Settings),
            ),
            ("SUMMARYD_LLM_BREAKER_FAILURES", |s| {
                s.llm.breaker_failures = 0
            }),
            ("SUMMARYD_LLM_BREAKER_COOLDOWN_MS", |s| {
                s.llm.breaker_cooldown_ms = 0
            }),
        ] {
            let mut s = Settings::default();
            adjust(&mut s);
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(setting), "{err}");
        }
    }
}
