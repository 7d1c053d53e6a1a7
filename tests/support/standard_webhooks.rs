//! Webhook requests a loopback receiver ([`HttpStub`](crate::shared::http_stub::HttpStub))
//! recorded, verified with the Standard Webhooks reference library (`standardwebhooks` from
//! PyPI, pinned in `scripts/verify-webhooks.sh`) rather than with summaryd's own code, so a
//! signature passes only if a real receiver would accept it.
//!
//! One `scripts/verify-webhooks.sh` process per call, all requests at once. Its first run on
//! a machine installs the library into a venv (a few seconds); later runs start in tens of
//! milliseconds.

use std::collections::BTreeMap;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use crate::shared::http_stub::Recorded;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/verify-webhooks.sh");

/// The library's verdict on one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub ok: bool,
    /// The body parsed as JSON, as `Webhook.verify` returns it (when `ok`).
    pub payload: Option<serde_json::Value>,
    /// The exception, as `"<class>: <message>"` (when not `ok`).
    pub error: Option<String>,
}

/// Verify each recorded request with the reference library, against `secret`
/// (`whsec_<base64>`): one verdict per request, in order. Header names are lower-cased and
/// a repeated header's values joined with ", " (how HTTP combines fields), and the body is
/// passed as the UTF-8 text it was sent as; a body that is not UTF-8 fails here, as it would
/// in the library. Panics only when the verifier itself cannot run.
pub async fn verify(secret: &str, requests: &[Recorded]) -> Vec<Verified> {
    let mut verdicts: Vec<Option<Verified>> = Vec::with_capacity(requests.len());
    let mut input = String::new();
    for request in requests {
        match std::str::from_utf8(&request.body) {
            Ok(body) => {
                let mut headers = BTreeMap::<String, String>::new();
                for (name, value) in &request.headers {
                    headers
                        .entry(name.to_ascii_lowercase())
                        .and_modify(|joined| {
                            joined.push_str(", ");
                            joined.push_str(value);
                        })
                        .or_insert_with(|| value.clone());
                }
                let line = serde_json::json!({"secret": secret, "headers": headers, "body": body});
                input.push_str(&line.to_string());
                input.push('\n');
                verdicts.push(None);
            }
            Err(e) => verdicts.push(Some(Verified {
                ok: false,
                payload: None,
                error: Some(format!("the body is not UTF-8: {e}")),
            })),
        }
    }
    let asked = verdicts.iter().filter(|v| v.is_none()).count();
    let mut answers = run_verifier(input, asked).await.into_iter();
    verdicts
        .into_iter()
        .map(|v| v.unwrap_or_else(|| answers.next().expect("one answer per line")))
        .collect()
}

/// Panics with the failures (and when there is no request at all: a test that expects
/// webhooks must have received some) unless every request verifies against `secret`;
/// returns the payloads, in order.
pub async fn verify_all(secret: &str, requests: &[Recorded]) -> Vec<serde_json::Value> {
    assert!(!requests.is_empty(), "no webhook request to verify");
    let verdicts = verify(secret, requests).await;
    let failures: Vec<String> = verdicts
        .iter()
        .zip(requests)
        .enumerate()
        .filter(|(_, (v, _))| !v.ok)
        .map(|(i, (v, r))| {
            format!(
                "request {i} ({} {}): {}\n  headers: {:?}\n  body: {}",
                r.method,
                r.path,
                v.error.as_deref().unwrap_or("?"),
                r.headers,
                String::from_utf8_lossy(&r.body)
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} webhook requests do not verify with standardwebhooks:\n{}",
        failures.len(),
        requests.len(),
        failures.join("\n")
    );
    verdicts
        .into_iter()
        .map(|v| v.payload.expect("a verified request has a payload"))
        .collect()
}

/// Run `scripts/verify-webhooks.sh` on `input` (`lines` JSON lines) and parse its verdicts.
async fn run_verifier(input: String, lines: usize) -> Vec<Verified> {
    if lines == 0 {
        return Vec::new();
    }
    let mut child = tokio::process::Command::new("bash")
        .arg(SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {SCRIPT}: {e}"));
    // Written while the output is read, so neither side waits on a full pipe.
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = tokio::spawn(async move {
        stdin.write_all(input.as_bytes()).await?;
        stdin.shutdown().await
    });
    let out = child
        .wait_with_output()
        .await
        .unwrap_or_else(|e| panic!("waiting for {SCRIPT}: {e}"));
    let written = writer.await.expect("stdin writer task");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && written.is_ok(),
        "{SCRIPT} failed ({}; stdin: {written:?}):\n{stderr}\n{stdout}",
        out.status
    );
    // The install message of a first run, shown with the test's output.
    eprint!("{stderr}");
    let verdicts: Vec<Verified> = stdout.lines().map(parse_verdict).collect();
    assert_eq!(
        verdicts.len(),
        lines,
        "{SCRIPT} answered {} lines for {lines}:\n{stdout}\n{stderr}",
        verdicts.len()
    );
    verdicts
}

/// One output line: `{"ok": true, "payload": ...}` or `{"ok": false, "error": "..."}`.
/// A payload of JSON `null` stays `Some(Null)`.
fn parse_verdict(line: &str) -> Verified {
    let value: serde_json::Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{SCRIPT} printed a line that is not JSON ({e}): {line}"));
    let ok = value["ok"]
        .as_bool()
        .unwrap_or_else(|| panic!("{SCRIPT} printed a line without \"ok\": {line}"));
    Verified {
        ok,
        payload: value.get("payload").cloned(),
        error: value["error"].as_str().map(str::to_owned),
    }
}
