//! `summaryd healthcheck` (the image's HEALTHCHECK) against a real running summaryd, a server
//! answering something other than 200, a server that never answers, and a closed port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use summaryd::config::roles::Roles;
use summaryd::ops::healthcheck::{HealthcheckError, check};
use summaryd::shutdown::Shutdown;

use crate::shared::TestEnv;
use crate::shared::http_stub::{HttpStub, Reply};

/// Runs the real binary, as a container runtime would, with no configuration of its own.
async fn healthcheck_binary(listen: &str) -> (i32, String) {
    healthcheck_with(&["--listen", listen], &[]).await
}

async fn healthcheck_with(args: &[&str], env: &[(&str, String)]) -> (i32, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_summaryd"));
    command
        .arg("healthcheck")
        .args(args)
        .args(["--timeout-ms", "1000"])
        .env_remove("SUMMARYD_CONFIG")
        .env_remove("SUMMARYD_LISTEN")
        .env_remove("SUMMARYD_OPS_LISTEN");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().await.expect("run summaryd healthcheck");
    let code = out.status.code().expect("exited, not killed by a signal");
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn healthcheck_exits_0_while_summaryd_serves_and_1_once_it_is_gone() {
    let env = TestEnv::new().await;
    let app = env.services().application(Roles::all()).await;
    let port = app.port();
    let shutdown = Shutdown::new();
    let task = tokio::spawn(app.run(shutdown.clone()));

    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let checked = tokio::task::spawn_blocking(move || check(addr, Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(checked.is_ok(), "{checked:?}");
    // 0.0.0.0 is how a container configures the listener; the check dials loopback.
    let (code, stderr) = healthcheck_binary(&format!("0.0.0.0:{port}")).await;
    assert_eq!(code, 0, "stderr: {stderr}");

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("app stops")
        .expect("no panic")
        .expect("clean exit");
    let (code, stderr) = healthcheck_binary(&format!("0.0.0.0:{port}")).await;
    assert_eq!(code, 1, "a stopped server is unhealthy");
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

#[tokio::test]
async fn healthcheck_fails_on_any_status_but_200_and_names_it() {
    let stub = HttpStub::start(Reply::text(503, "draining")).await;
    let addr = stub.addr;
    let err = tokio::task::spawn_blocking(move || check(addr, Duration::from_secs(2)))
        .await
        .unwrap()
        .expect_err("503 is unhealthy");
    assert!(matches!(err, HealthcheckError::Status { .. }), "{err:?}");
    assert!(err.to_string().contains("503"), "{err}");
    let requests = stub.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/healthz");

    let (code, stderr) = healthcheck_binary(&addr.to_string()).await;
    assert_eq!(code, 1, "{stderr}");
}

#[tokio::test]
async fn healthcheck_gives_up_on_a_server_that_never_answers() {
    let stub = HttpStub::start(Reply::Hang).await;
    let addr = stub.addr;
    let started = Instant::now();
    let err = tokio::task::spawn_blocking(move || check(addr, Duration::from_millis(300)))
        .await
        .unwrap()
        .expect_err("no answer is unhealthy");
    assert!(matches!(err, HealthcheckError::Io { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the timeout, took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn healthcheck_uses_the_ops_listener_when_one_is_configured() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.ops.listen = Some("127.0.0.1:0".parse().unwrap());
    let app = env
        .services()
        .settings(settings)
        .application(Roles::all())
        .await;
    let (port, ops_port) = (app.port(), app.ops_port().expect("ops listener"));
    let shutdown = Shutdown::new();
    let task = tokio::spawn(app.run(shutdown.clone()));

    let main = ("SUMMARYD_LISTEN", format!("0.0.0.0:{port}"));
    let ops = ("SUMMARYD_OPS_LISTEN", format!("0.0.0.0:{ops_port}"));
    let (code, stderr) = healthcheck_with(&[], &[main.clone(), ops]).await;
    assert_eq!(
        code, 0,
        "the configured ops listener answers /healthz: {stderr}"
    );
    // The same process configured without the ops listener asks the main one, which no
    // longer serves /healthz: so the success above came from the ops port.
    let (code, stderr) = healthcheck_with(&[], &[main]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("app stops")
        .expect("no panic")
        .expect("clean exit");
}
