//! The real binary refuses or flags transports that expose credentials: SMTP credentials
//! without TLS stop every role (exit 2) unless `SUMMARYD_MAIL_ALLOW_CLEARTEXT=1`; an api
//! listening off loopback without a tokens file stops unless `SUMMARYD_AUTH_MODE=header`;
//! cleartext Postgres and Redis to other hosts are warned about before any connection.

use std::time::Duration;

use crate::harness::client::ApiClient;
use crate::harness::process::{Proc, output_text as text, serve_expecting_exit as serve, stop_all};
use crate::harness::{World, WorldOptions};
use crate::run_id;
use crate::shared::servers::free_port;

#[tokio::test]
async fn smtp_credentials_without_tls_stop_every_role_unless_cleartext_is_allowed() {
    let world = World::new("cleartext-smtp", WorldOptions::default()).await;
    let smtp = |url: &str| {
        vec![
            ("SUMMARYD_MAIL_PROVIDER", "smtp".to_owned()),
            ("SUMMARYD_MAIL_SMTP_URL", url.to_owned()),
        ]
    };
    for url in [
        "smtp://user:secret@127.0.0.1:2525",
        "smtp://user:secret@127.0.0.1:2525?tls=opportunistic",
    ] {
        let env = world.env_with(&smtp(url));
        // Every role, not only the relay that sends: the settings are refused as a whole.
        for roles in ["relay", "worker", "api", "api,worker,relay"] {
            let out = serve(roles, "127.0.0.1:0", &env).await;
            let shown = text(&out);
            assert_eq!(out.status.code(), Some(2), "{roles} {url}: {shown}");
            assert!(
                shown.contains("SUMMARYD_MAIL_SMTP_URL")
                    && shown.contains("SUMMARYD_MAIL_ALLOW_CLEARTEXT=1")
                    && shown.contains("tls=required"),
                "{roles} {url}: {shown}"
            );
            assert!(!shown.contains("secret"), "the password leaked: {shown}");
            assert!(!shown.contains("summaryd started"), "{shown}");
        }
    }
    // TLS-protected forms and a URL without a password pass the check (the relay connects
    // only when it sends, so nothing needs to listen there).
    for url in [
        "smtps://user:secret@127.0.0.1:2525",
        "smtp://user:secret@127.0.0.1:2525?tls=required",
        "smtp://127.0.0.1:2525",
    ] {
        let env = world.env_with(&smtp(url));
        let mut relay =
            Proc::start("relay-tls", "relay", "127.0.0.1:0", &[], &env, &world.dir).await;
        assert!(!relay.output().contains("secret"), "{}", relay.output());
        stop_all(&mut [&mut relay], Duration::from_secs(15)).await;
    }
    // The way out: the relay starts, and says at startup what it was allowed to do.
    let mut env = smtp("smtp://user:secret@127.0.0.1:2525");
    env.push(("SUMMARYD_MAIL_ALLOW_CLEARTEXT", "1".into()));
    let env = world.env_with(&env);
    let mut relay = Proc::start("relay-clear", "relay", "127.0.0.1:0", &[], &env, &world.dir).await;
    let log = relay.output();
    let warning = log
        .lines()
        .find(|l| l.contains("\"WARN\"") && l.contains("SUMMARYD_MAIL_SMTP_URL"))
        .unwrap_or_else(|| panic!("no cleartext warning in: {log}"));
    assert!(
        warning.contains("SUMMARYD_MAIL_ALLOW_CLEARTEXT=1"),
        "{warning}"
    );
    assert!(!log.contains("secret"), "the password leaked: {log}");
    stop_all(&mut [&mut relay], Duration::from_secs(15)).await;
}

#[tokio::test]
async fn header_mode_off_loopback_needs_summaryd_auth_mode() {
    let world = World::new("cleartext-auth", WorldOptions::default()).await;
    let port = free_port();
    let public = format!("0.0.0.0:{port}");
    let out = serve("api", &public, &world.env_with(&[])).await;
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    let refusal = shown
        .lines()
        .find(|l| l.contains("cannot start"))
        .unwrap_or_else(|| panic!("no startup error in: {shown}"));
    assert!(
        refusal.contains("SUMMARYD_AUTH_MODE")
            && refusal.contains(&public)
            && refusal.contains("SUMMARYD_AUTH_TOKENS_FILE"),
        "{refusal}"
    );
    // A value other than header is a configuration error naming the setting.
    let env = world.env_with(&[("SUMMARYD_AUTH_MODE", "open".into())]);
    let out = serve("api", &public, &env).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("SUMMARYD_AUTH_MODE"), "{}", text(&out));

    // Said to be meant: it serves /v1 to a client on another address than loopback's name.
    let env = world.env_with(&[("SUMMARYD_AUTH_MODE", "header".into())]);
    let mut api = Proc::start("api-header", "api", &public, &[], &env, &world.dir).await;
    assert_eq!(api.port, port);
    let client = ApiClient::new(format!("http://127.0.0.1:{port}"));
    let key = format!("auth-mode-{}", run_id());
    let (status, _, body) = client
        .post_once(&key, &ApiClient::body(&key))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    // Roles without the api bind 0.0.0.0 freely (probes, metrics), and loopback needs nothing.
    let mut worker = Proc::start(
        "worker-public",
        "worker",
        &format!("0.0.0.0:{}", free_port()),
        &[],
        &world.env_with(&[]),
        &world.dir,
    )
    .await;
    let mut local = world.spawn("api-local", "api", &[]).await;
    let client = ApiClient::new(local.base_url());
    let key = format!("auth-local-{}", run_id());
    let (status, _, body) = client
        .post_once(&key, &ApiClient::body(&key))
        .await
        .unwrap();
    assert_eq!(status, 202, "{body}");
    stop_all(
        &mut [&mut api, &mut worker, &mut local],
        Duration::from_secs(15),
    )
    .await;
}

#[tokio::test]
async fn cleartext_redis_and_postgres_to_other_hosts_are_warned_about_before_connecting() {
    let world = World::new("cleartext-warn", WorldOptions::default()).await;
    // TEST-NET-1 (RFC 5737): routed nowhere, so the connection attempts fail after the
    // warnings; --no-migrate and Redis being optional at startup let the api start anyway.
    let redis_password = format!("redis-pw-{}", run_id());
    let pg_password = format!("pg-pw-{}", run_id());
    let env = world.env_with(&[
        (
            "SUMMARYD_REDIS_URL",
            format!("redis://:{redis_password}@192.0.2.1:6379"),
        ),
        (
            "SUMMARYD_DATABASE_URL",
            format!("postgres://app:{pg_password}@192.0.2.1:5432/x?sslmode=require"),
        ),
    ]);
    let mut api = Proc::start("api-warn", "api", "127.0.0.1:0", &[], &env, &world.dir).await;
    let log = api.output();
    let lines: Vec<&str> = log.lines().collect();
    let position = |needle: &[&str]| {
        lines
            .iter()
            .position(|l| needle.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no line with {needle:?} in: {log}"))
    };
    let redis = position(&[
        "\"WARN\"",
        "\"setting\":\"SUMMARYD_REDIS_URL\"",
        "rediss://",
    ]);
    let postgres = position(&[
        "\"WARN\"",
        "\"setting\":\"SUMMARYD_DATABASE_URL\"",
        "sslmode=require",
        "verify-full",
    ]);
    assert!(lines[redis].contains("192.0.2.1"), "{}", lines[redis]);
    // Logged before the attempt whose failure it explains.
    let unreachable = position(&["Redis is not reachable at startup"]);
    assert!(redis < unreachable && postgres < unreachable, "{log}");
    assert!(
        !log.contains(&redis_password) && !log.contains(&pg_password),
        "a password leaked: {log}"
    );
    stop_all(&mut [&mut api], Duration::from_secs(15)).await;

    // The world's own loopback URLs (the development default) draw no such warning.
    let mut quiet = world.spawn("api-local", "api", &[]).await;
    let log = quiet.output();
    assert!(
        !log.contains("SUMMARYD_REDIS_URL") && !log.contains("SUMMARYD_DATABASE_URL"),
        "{log}"
    );
    stop_all(&mut [&mut quiet], Duration::from_secs(15)).await;
}
