//! The front door under hostile input: ambiguous headers, addresses the mail provider
//! cannot send to, bodies that do not fit the process's budget, and bodies that never
//! finish. Every refusal is asserted by its effect too: nothing enqueued, nothing stored.

use std::time::Duration;

use actix_web::test::{self, TestRequest};
use serde_json::Value;
use summaryd::api;
use summaryd::api::auth::token_sha256;
use summaryd::config::roles::Roles;
use summaryd::shutdown::Shutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::shared::TestEnv;
use crate::shared::http_request::read_response;

const BODY: &str = r#"{"text":"Renewal agreed.","notify":"am@example.com"}"#;

/// Jobs queued, on the job stream or in a tenant's lane.
async fn stream_len(env: &TestEnv) -> u64 {
    crate::shared::api_requests::stream_len(env).await as u64
}

/// Idempotency records under this test's prefix (none may exist for a refused request).
async fn idempotency_records(env: &TestEnv) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}idem:*", env.settings.key_prefix))
        .query_async(&mut env.redis().await)
        .await
        .unwrap();
    keys.len()
}

fn post() -> TestRequest {
    TestRequest::post()
        .uri("/v1/summaries")
        .insert_header(("Content-Type", "application/json"))
        .set_payload(BODY)
}

async fn problem<B: actix_web::body::MessageBody>(
    res: actix_web::dev::ServiceResponse<B>,
) -> Value {
    assert_eq!(
        res.headers().get("content-type").unwrap(),
        "application/problem+json"
    );
    test::read_body_json(res).await
}

#[actix_web::test]
async fn a_repeated_idempotency_key_or_tenant_header_is_400_naming_it_and_enqueues_nothing() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

    // A proxy that appends its own value after the client's must not let either win.
    let repeated_key = post()
        .insert_header(("X-Tenant-Id", "acme"))
        .append_header(("Idempotency-Key", "client-chosen-key-0001"))
        .append_header(("Idempotency-Key", "proxy-chosen-key-00001"));
    let repeated_tenant = post()
        .insert_header(("Idempotency-Key", "repeated-tenant-key-001"))
        .append_header(("X-Tenant-Id", "globex"))
        .append_header(("X-Tenant-Id", "acme"));
    for (req, header) in [
        (repeated_key, "Idempotency-Key"),
        (repeated_tenant, "X-Tenant-Id"),
    ] {
        let res = test::call_service(&app, req.to_request()).await;
        assert_eq!(res.status(), 400, "{header}");
        let p = problem(res).await;
        assert_eq!(p["header"], header, "{p}");
        assert!(
            p["detail"].as_str().unwrap().contains("more than once"),
            "{p}"
        );
    }
    // A GET is refused the same way: reading another tenant's job is as bad as writing.
    let res = test::call_service(
        &app,
        TestRequest::get()
            .uri("/v1/summaries/6a0c1f8e-5b7d-4c2a-9e31-7d44b2f0a915")
            .append_header(("X-Tenant-Id", "globex"))
            .append_header(("X-Tenant-Id", "acme"))
            .to_request(),
    )
    .await;
    assert_eq!(res.status(), 400);
    assert_eq!(problem(res).await["header"], "X-Tenant-Id");

    assert_eq!(stream_len(&env).await, 0, "nothing enqueued");
    assert_eq!(idempotency_records(&env).await, 0, "no key stored");
    // The same request with one of each is accepted: the refusal was about the repetition.
    let ok = post()
        .insert_header(("X-Tenant-Id", "acme"))
        .insert_header(("Idempotency-Key", "client-chosen-key-0001"));
    assert_eq!(
        test::call_service(&app, ok.to_request()).await.status(),
        202
    );
    assert_eq!(stream_len(&env).await, 1);
}

#[actix_web::test]
async fn a_repeated_authorization_header_is_400_in_token_mode_and_enqueues_nothing() {
    let env = TestEnv::new().await;
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let text = format!(
        "[tenants.acme]\ntoken_sha256 = \"{}\"\n[tenants.globex]\ntoken_sha256 = \"{}\"\n",
        token_sha256("acme-secret-token"),
        token_sha256("globex-secret-token"),
    );
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    let mut settings = env.settings.clone();
    settings.auth.tokens_file = Some(file.path().to_path_buf());
    let services = env.services().settings(settings).build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;

    // Both tokens are valid: taking either would act for a tenant the other did not mean.
    let req = post()
        .insert_header(("Idempotency-Key", "repeated-auth-key-0001"))
        .append_header(("Authorization", "Bearer globex-secret-token"))
        .append_header(("Authorization", "Bearer acme-secret-token"));
    let res = test::call_service(&app, req.to_request()).await;
    assert_eq!(res.status(), 400);
    assert_eq!(problem(res).await["header"], "Authorization");
    assert_eq!(stream_len(&env).await, 0, "nothing enqueued");
    assert_eq!(idempotency_records(&env).await, 0, "no key stored");
}

#[actix_web::test]
async fn an_address_the_smtp_provider_cannot_send_to_is_422_naming_notify() {
    let env = TestEnv::new().await;
    let services = env.services().build();
    let app = test::init_service(api::app(services.api(), Roles::all(), Shutdown::new())).await;
    // Each of these passed the hand-written check this service used before, and each is
    // refused by lettre, which the SMTP provider parses `to` with: a 202 would have cost a
    // model call and ended as an email that can never be sent.
    for (n, notify) in ["a(b)@example.com", "a..b@example.com", "\"a\"b@example.com"]
        .iter()
        .enumerate()
    {
        assert!(
            notify.parse::<lettre::message::Mailbox>().is_err(),
            "{notify}"
        );
        let body = serde_json::json!({"text": "Renewal agreed.", "notify": notify});
        let req = TestRequest::post()
            .uri("/v1/summaries")
            .insert_header(("X-Tenant-Id", "acme"))
            .insert_header(("Idempotency-Key", format!("bad-notify-key-{n:05}")))
            .set_json(&body);
        let res = test::call_service(&app, req.to_request()).await;
        assert_eq!(res.status(), 422, "{notify}");
        assert_eq!(problem(res).await["field"], "notify", "{notify}");
    }
    assert_eq!(stream_len(&env).await, 0, "nothing enqueued");
    assert_eq!(idempotency_records(&env).await, 0, "no key stored");
}

/// Send a request head announcing `length` body bytes, then `sent` of them.
async fn start_post(port: u16, key: &str, length: usize, sent: &[u8]) -> TcpStream {
    start_post_as(port, "acme", key, length, sent).await
}

/// `start_post` for `tenant`.
async fn start_post_as(
    port: u16,
    tenant: &str,
    key: &str,
    length: usize,
    sent: &[u8],
) -> TcpStream {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "POST /v1/summaries HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         X-Tenant-Id: {tenant}\r\nIdempotency-Key: {key}\r\nContent-Length: {length}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(sent).await.unwrap();
    conn
}

/// Everything the server sends until it closes the connection (or `within` passes).
async fn read_until_closed(conn: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// Jobs accepted so far: one idempotency record each.
async fn accepted_jobs(env: &TestEnv) -> usize {
    let mut r = env.redis().await;
    let records: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}idem:*", env.settings.key_prefix))
        .query_async(&mut r)
        .await
        .unwrap();
    records.len()
}

/// A valid body of exactly `len` bytes.
/// A whole application serving on a port of its own, with `settings`.
struct Served {
    port: u16,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), summaryd::app::StartError>>,
}

impl Served {
    async fn start(env: &TestEnv, settings: summaryd::config::Settings) -> Self {
        let app = env
            .services()
            .settings(settings)
            .application(Roles::all())
            .await;
        let port = app.port();
        let shutdown = Shutdown::new();
        let task = tokio::spawn(app.run(shutdown.clone()));
        Self {
            port,
            shutdown,
            task,
        }
    }

    async fn stop(self) {
        self.shutdown.trigger();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

fn body_of_len(len: usize) -> Vec<u8> {
    let frame = r#"{"text":"","notify":"am@example.com"}"#.len();
    let text = "a".repeat(len - frame);
    format!(r#"{{"text":"{text}","notify":"am@example.com"}}"#).into_bytes()
}

#[tokio::test]
async fn bodies_beyond_the_budget_get_503_unread_and_stalled_bodies_408_at_the_deadline() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.api.max_body_bytes = 64 * 1024;
    settings.api.body_budget_bytes = 64 * 1024;
    settings.api.body_budget_wait = Duration::from_millis(100);
    settings.api.request_timeout = Duration::from_millis(1_500);
    let served = Served::start(&env, settings).await;
    let port = served.port;

    // A large body that stalls after 1 KB holds 40 KB of the 64 KB budget.
    let started = tokio::time::Instant::now();
    let mut stalled = start_post(port, "stalled-body-key-00001", 40_000, &[b'{'; 1000]).await;
    // A real wait: the stalled request must hold its room before the next one asks, and
    // nothing outside the process shows when it does (the budget is an in-process
    // semaphore; no metric, log line or reply marks the reservation).
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A second large body does not fit: 503 + Retry-After at once, its body never read.
    let mut refused = start_post(port, "refused-body-key-00001", 40_000, b"").await;
    let (answer, closed) = read_until_closed(&mut refused, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(closed, "the refused connection is closed");

    // An ordinary request still fits in the quarter kept for small bodies.
    let client = reqwest::Client::new();
    let res = client
        .post(format!("http://127.0.0.1:{port}/v1/summaries"))
        .header("X-Tenant-Id", "acme")
        .header("Idempotency-Key", "ordinary-body-key-0001")
        .header("Content-Type", "application/json")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);

    // The stalled body is cut at the deadline: 408 problem+json, connection closed.
    let (answer, closed) = read_until_closed(&mut stalled, Duration::from_secs(5)).await;
    let waited = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(closed, "the stalled connection is closed");
    assert!(
        waited >= Duration::from_millis(1_400) && waited < Duration::from_secs(4),
        "cut at the 1.5 s deadline, not before or much later: {waited:?}"
    );

    // Its room is back: the refused request, sent again in full, is accepted.
    let mut retry = start_post(port, "refused-body-key-00001", 40_000, &body_of_len(40_000)).await;
    let mut head = [0u8; 12];
    retry.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 202");

    // Counted by idempotency records: the workers of this app may already have finished
    // the jobs, and a finished job's stream entry is deleted.
    assert_eq!(
        accepted_jobs(&env).await,
        2,
        "the ordinary and the retried job only"
    );
    assert_eq!(idempotency_records(&env).await, 2);
    served.stop().await;
}

/// One tenant's slow large bodies hold at most its share (half) of the room for large
/// bodies: its next one is refused, and another tenant's large body still gets in.
#[tokio::test]
async fn a_tenant_holding_its_share_of_large_bodies_does_not_refuse_another_tenants() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    // 128 KB: 96 KB for large bodies, 48 KB of it for one tenant.
    settings.api.max_body_bytes = 48 * 1024;
    settings.api.body_budget_bytes = 128 * 1024;
    settings.api.body_budget_wait = Duration::from_millis(100);
    settings.api.request_timeout = Duration::from_secs(5);
    let served = Served::start(&env, settings).await;
    let port = served.port;

    // Tenant a stalls a 40 KB body after 1 KB: it holds 40 KB of its 48 KB share.
    let _stalled = start_post_as(port, "a", "stalled-body-key-a0001", 40_000, &[b'{'; 1000]).await;
    // A real wait, as in the test above: nothing outside the process marks the reservation.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // a's next large body would pass its share: 503 + Retry-After at once, saying why.
    let mut over = start_post_as(port, "a", "over-share-key-a00001", 20_000, b"").await;
    let (answer, closed) = read_until_closed(&mut over, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("this tenant"), "{answer}");
    assert!(closed, "the refused connection is closed");

    // Tenant b's large body, sent in full, is accepted beside a's.
    let mut b = start_post_as(
        port,
        "b",
        "large-body-key-b00001",
        40_000,
        &body_of_len(40_000),
    )
    .await;
    let mut head = [0u8; 12];
    b.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 202");

    // Only b's job was accepted: a's refused body stored nothing.
    let records: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}idem:*", env.settings.key_prefix))
        .query_async(&mut env.redis().await)
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].contains(":b:"), "{records:?}");
    served.stop().await;
}

/// The answers the HTTP layer gives by itself, before any handler runs, are problem
/// details like every other error: a malformed Content-Length, a head too large, a first
/// head not received in time.
#[tokio::test]
async fn protocol_errors_the_http_layer_answers_itself_are_problem_json() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    settings.api.request_timeout = Duration::from_millis(500);
    let served = Served::start(&env, settings).await;
    let port = served.port;

    let huge_header = format!("X-Filler: {}\r\n", "a".repeat(140 * 1024));
    let cases: [(&str, String, bool); 3] = [
        (
            "400",
            "POST /v1/summaries HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n".into(),
            true,
        ),
        (
            "431",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{huge_header}\r\n"),
            true,
        ),
        // Half a head, then nothing: cut at the 500 ms deadline.
        ("408", "GET /healthz HTTP/1.1\r\nHost: x\r\n".into(), false),
    ];
    for (status, request, complete) in cases {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // The server may answer and close before it has read everything we send.
        let _ = conn.write_all(request.as_bytes()).await;
        let (answer, closed) = read_until_closed(&mut conn, Duration::from_secs(5)).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{status} (complete head: {complete}): {answer:.300}"
        );
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains("content-type: application/problem+json"),
            "{head}"
        );
        let p: Value = serde_json::from_str(body).unwrap();
        assert_eq!(p["status"].to_string(), status, "{p}");
        assert!(!p["detail"].as_str().unwrap().is_empty());
        assert!(closed, "{status}: connection closed after the answer");
    }
    assert_eq!(stream_len(&env).await, 0);
    served.stop().await;
}

/// actix times only a connection's first head; every later one must arrive within the
/// request deadline of the previous response too, however it trickles in, or the client
/// gets a 408 problem and the connection is closed. A connection whose requests each come
/// in time lives longer than the deadline.
#[tokio::test]
async fn every_head_on_a_connection_is_due_within_the_deadline_of_the_previous_response() {
    let env = TestEnv::new().await;
    let mut settings = env.settings.clone();
    let deadline = Duration::from_millis(800);
    settings.api.request_timeout = deadline;
    let served = Served::start(&env, settings).await;
    let port = served.port;

    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // Four requests, each head 500 ms after the previous answer: 2 s on one connection.
    for i in 0..4 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = read_response(&mut conn).await.expect("a whole response");
        assert!(answer.starts_with("HTTP/1.1 200 "), "request {i}: {answer}");
    }
    // A POST, then the next head a byte every 100 ms: no gap is long, the head never ends.
    let post = format!(
        "POST /v1/summaries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         X-Tenant-Id: acme\r\nIdempotency-Key: slow-second-head-0001\r\n\
         Content-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    conn.write_all(post.as_bytes()).await.unwrap();
    let answer = read_response(&mut conn).await.expect("a whole response");
    assert!(answer.starts_with("HTTP/1.1 202 "), "{answer}");
    let answered = std::time::Instant::now();
    let (mut rd, mut wr) = conn.into_split();
    let trickle = tokio::spawn(async move {
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if wr.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got))
        .await
        .is_ok();
    let held = answered.elapsed();
    trickle.abort();
    let answer = String::from_utf8_lossy(&got);
    assert!(closed, "the connection is closed");
    // The server's clock starts when it writes the answer, a few milliseconds before
    // this side has read it, so "not before the deadline" is measured with that slack.
    assert!(
        held + Duration::from_millis(50) >= deadline
            && held < deadline + Duration::from_millis(500),
        "closed {held:?} after the answer, deadline {deadline:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    let p: Value = serde_json::from_str(body).unwrap();
    assert_eq!(p["status"], 408, "{p}");
    // The request before the slow head was served in full: its job was accepted.
    assert_eq!(accepted_jobs(&env).await, 1);
    served.stop().await;
}
