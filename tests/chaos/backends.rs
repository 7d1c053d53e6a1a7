//! The real binary against managed-style backends: Redis reached only over TLS (with a
//! client certificate), a TLS misconfiguration that must stop startup, and a run at
//! `RUST_LOG=trace` whose logs must not carry a single secret or piece of request data.

use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::harness::client::ApiClient;
use crate::harness::model_server::marked_text;
use crate::harness::process::{run_to_completion, run_with_deadline, stop_all};
use crate::harness::{World, WorldOptions, eventually};
use crate::run_id;
use crate::shared::certs::TestCa;
use crate::shared::servers::{RedisProc, free_port, test_dir};
use crate::shared::smtp_sink::SmtpSink;

/// A Redis with a plain port for the harness and a TLS port requiring a client
/// certificate, plus the settings that make summaryd use the TLS port.
struct TlsRedis {
    proc: RedisProc,
    tls_port: u16,
    env: Vec<(&'static str, String)>,
}

fn tls_redis(dir: &std::path::Path, ca: &TestCa, extra: &[String]) -> TlsRedis {
    let server = ca.server("redis-server", &["localhost"]);
    let client = ca.client("summaryd-client");
    let tls_port = free_port();
    let mut args = RedisProc::tls_args(tls_port, &server, Some(&ca.ca_file));
    args.extend_from_slice(extra);
    let proc = RedisProc::start(dir, &args);
    let env = vec![
        ("SUMMARYD_REDIS_CA_FILE", ca.ca_file.display().to_string()),
        (
            "SUMMARYD_REDIS_CLIENT_CERT_FILE",
            client.cert_file.display().to_string(),
        ),
        (
            "SUMMARYD_REDIS_CLIENT_KEY_FILE",
            client.key_file.display().to_string(),
        ),
    ];
    TlsRedis {
        proc,
        tls_port,
        env,
    }
}

#[tokio::test]
async fn pipeline_runs_over_rediss_with_mutual_tls_and_a_wrong_ca_stops_startup() {
    let dir = test_dir("chaos-rediss");
    let ca = TestCa::new(dir.path(), "redis");
    let redis = tls_redis(dir.path(), &ca, &[]);
    let mut env = redis.env.clone();
    env.push((
        "SUMMARYD_REDIS_URL",
        format!("rediss://localhost:{}", redis.tls_port),
    ));
    let world = World::new(
        "rediss",
        WorldOptions {
            env,
            harness_redis_url: Some(format!("redis://127.0.0.1:{}", redis.proc.port)),
            ..Default::default()
        },
    )
    .await;
    let mut api = world.spawn("api", "api", &[]).await;
    let mut worker = world.spawn("worker", "worker", &[]).await;
    let mut relay = world.spawn("relay", "relay", &[]).await;
    let client = ApiClient::new(api.base_url());
    let run = run_id();
    let mut accepted = Vec::new();
    for i in 0..5 {
        let key = format!("rediss-{run}-{i:04}");
        accepted.push(client.submit(&key, &key).await);
    }
    let report = world.assert_exactly_once(&accepted, &client).await;
    println!("[rediss] {report}");
    stop_all(
        &mut [&mut api, &mut worker, &mut relay],
        Duration::from_secs(15),
    )
    .await;

    // A CA that did not sign the server's certificate: exit 1 at startup, naming where
    // it connected and why, never the password in the URL.
    let other = TestCa::new(&dir.path().join("other"), "other");
    let password = "redis-url-password-7f3a";
    let env = world.env_with(&[
        (
            "SUMMARYD_REDIS_URL",
            format!("rediss://default:{password}@localhost:{}", redis.tls_port),
        ),
        (
            "SUMMARYD_REDIS_CA_FILE",
            other.ca_file.display().to_string(),
        ),
        ("RUST_LOG", "trace".into()),
    ]);
    let args = [
        "serve",
        "--roles",
        "api",
        "--no-migrate",
        "--listen",
        "127.0.0.1:0",
    ];
    let out = run_with_deadline(&args, &env, Duration::from_secs(30))
        .await
        .expect("a wrong CA stops startup instead of serving");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    let fatal = text
        .lines()
        .find(|l| l.contains("cannot start"))
        .unwrap_or_else(|| panic!("no startup error in: {text}"));
    assert!(
        fatal.contains(&format!("localhost:{}", redis.tls_port)) && fatal.contains("UnknownIssuer"),
        "{fatal}"
    );
    assert!(!text.contains(password), "the password leaked: {text}");
}

#[tokio::test]
async fn no_secret_or_request_data_reaches_any_log_at_trace_level() {
    let run = run_id();
    // Recognisable values in every secret-bearing setting, and in the request.
    let redis_password = format!("redis-pw-{run}");
    let pg_password = format!("pg-pw-{run}");
    let llm_key = format!("sk-llm-{run}");
    let smtp_password = format!("smtp-pw-{run}");
    let mail_api_key = format!("mail-key-{run}");
    let token = format!("tok-{run}-secret");
    let text_marker = format!("TEXTMARK{run}");
    let recipient = format!("recipient-{run}@example.com");

    let dir = test_dir("chaos-secrets");
    let ca = TestCa::new(dir.path(), "redis");
    let redis = tls_redis(
        dir.path(),
        &ca,
        &["--requirepass".into(), redis_password.clone()],
    );
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[tenants.acme]\ntoken_sha256 = \"{}\"\n",
            hex::encode(Sha256::digest(token.as_bytes()))
        ),
    )
    .unwrap();
    let smtp = SmtpSink::start().await;
    let mut env = redis.env.clone();
    env.extend([
        (
            "SUMMARYD_REDIS_URL",
            format!(
                "rediss://default:{redis_password}@localhost:{}",
                redis.tls_port
            ),
        ),
        ("SUMMARYD_LLM_API_KEY", llm_key.clone()),
        ("SUMMARYD_MAIL_PROVIDER", "smtp".into()),
        (
            "SUMMARYD_MAIL_SMTP_URL",
            format!("smtp://mailer:{smtp_password}@{}", smtp.addr),
        ),
        (
            "SUMMARYD_MAIL_HTTP_URL",
            format!("https://mail.example/send?api_key={mail_api_key}"),
        ),
        // The sink speaks plain SMTP on loopback; the password must still stay out of logs.
        ("SUMMARYD_MAIL_ALLOW_CLEARTEXT", "1".into()),
        ("SUMMARYD_AUTH_TOKENS_FILE", tokens.display().to_string()),
        ("RUST_LOG", "trace".into()),
    ]);
    let mut world = World::new(
        "secrets",
        WorldOptions {
            env,
            harness_redis_url: Some(format!(
                "redis://:{redis_password}@127.0.0.1:{}",
                redis.proc.port
            )),
            ..Default::default()
        },
    )
    .await;
    // Local Postgres trusts local connections, so the password is carried but unused.
    let database_url =
        world
            .database_url
            .replacen("postgres@", &format!("postgres:{pg_password}@"), 1);
    world.set_env("SUMMARYD_DATABASE_URL", database_url);
    let mut outputs = String::new();
    for args in [&["migrate"][..], &["dlq", "list"], &["outbox", "stuck"]] {
        let out = run_to_completion(args, &world.env_with(&[]));
        assert!(out.status.success(), "{args:?}: {out:?}");
        outputs.push_str(&String::from_utf8_lossy(&out.stdout));
        outputs.push_str(&String::from_utf8_lossy(&out.stderr));
    }

    let mut api = world.spawn("api", "api", &[]).await;
    let mut worker = world.spawn("worker", "worker", &[]).await;
    let mut relay = world.spawn("relay", "relay", &[]).await;
    let http = reqwest::Client::new();
    let body = json!({
        // The fake model answers only prompts carrying a [[marker]].
        "text": marked_text(&text_marker),
        "notify": recipient,
    });
    let accepted = http
        .post(format!("{}/v1/summaries", api.base_url()))
        .bearer_auth(&token)
        .header("Idempotency-Key", format!("secrets-{run}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status().as_u16(), 202);
    // A wrong token and a bad request, so the refusal paths log too.
    let refused = http
        .post(format!("{}/v1/summaries", api.base_url()))
        .bearer_auth(format!("{token}-wrong"))
        .header("Idempotency-Key", format!("secrets-{run}-2"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    assert!(
        eventually(Duration::from_secs(60), || async {
            !smtp.messages().is_empty()
        })
        .await,
        "the email was not sent"
    );
    assert!(smtp.logins() >= 1, "the SMTP password was used");
    let sent = &smtp.messages()[0];
    assert_eq!(sent.rcpt_to, vec![recipient.clone()]);
    stop_all(
        &mut [&mut api, &mut worker, &mut relay],
        Duration::from_secs(15),
    )
    .await;

    let mut logs = outputs;
    for entry in std::fs::read_dir(&world.dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            logs.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    // The run really logged at trace level, from every role.
    assert!(logs.contains("\"level\":\"TRACE\""), "trace logging was on");
    assert_eq!(logs.matches("summaryd started").count(), 3);
    for (what, secret) in [
        ("redis password", &redis_password),
        ("database password", &pg_password),
        ("model API key", &llm_key),
        ("SMTP password", &smtp_password),
        ("mail API key", &mail_api_key),
        ("bearer token", &token),
        ("request text", &text_marker),
        ("recipient", &recipient),
    ] {
        if let Some(at) = logs.find(secret.as_str()) {
            let line_start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
            let line_end = logs[at..].find('\n').map_or(logs.len(), |i| at + i);
            panic!("{what} in the logs: {}", &logs[line_start..line_end]);
        }
    }
}
