//! A real headless Chromium for browser tests: Debian's `chromium` driven over WebDriver
//! (`chromedriver`, through the `fantoccini` client), with the accessibility checks of
//! axe-core (vendored in `tests/browser/vendor/axe-core/`) run inside the same page.
//!
//! `Browser::start()` installs the two packages on first use (`scripts/browser-deps.sh`,
//! once per test binary), starts a chromedriver of its own on a free port and opens one
//! browser session with a fresh profile. Dropping it ends the session (chromedriver then
//! quits the browser), kills that chromedriver and removes the profile, also when the test
//! panics. A chromedriver per browser rather than one per binary: it is up in ~0.1 s against
//! ~1.5 s for the browser itself, and a process that lives as long as its owner cannot be
//! left behind by a test binary that exits without running statics' destructors.
//!
//! The helpers panic with what they were looking for rather than return errors: they are
//! test steps, and the panic message is the test's failure report.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::elements::Element;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::shared::http_stub::free_port;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// axe-core's browser bundle, injected into the page under test by [`Browser::axe_check`].
const AXE_JS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/browser/vendor/axe-core/axe.min.js"
));

const DEPS_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/browser-deps.sh");

/// How long [`Browser::find`] and the helpers built on it wait for an element to appear:
/// long enough for a server-rendered page after a click, short enough that a wrong selector
/// fails the test promptly.
pub const FIND_WITHIN: Duration = Duration::from_secs(5);

/// Chromium's switches: headless, no sandbox (tests often run as root in a container, where
/// the sandbox cannot start), and none of the background traffic (updates, sync, QUIC
/// probes) a fresh profile would otherwise start, so a test talks only to its own server.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
];

/// Run `scripts/browser-deps.sh` once per test binary: instant when chromium and
/// chromedriver are installed, an apt install (minutes) the first time on a fresh machine.
/// The script locks against concurrent binaries; the `OnceLock` makes the tests of this one
/// wait for a single run.
fn ensure_installed() {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let outcome = INSTALLED.get_or_init(|| {
        // stderr is inherited so an install's progress shows on the terminal.
        let status = Command::new("bash")
            .arg(DEPS_SCRIPT)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {DEPS_SCRIPT}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{DEPS_SCRIPT} failed ({status})"))
        }
    });
    if let Err(why) = outcome {
        panic!("browser tests need chromium and chromedriver: {why}");
    }
}

/// A chromedriver process listening on `port`; killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Driver {
        // A free port can be taken between looking and chromedriver's bind; try a few.
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}"));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Driver { child, port };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    last_error = format!("chromedriver on port {port} exited: {status}");
                    break;
                }
                if Instant::now() >= until {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_error = format!("chromedriver did not listen on port {port} within 10 s");
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("{last_error}");
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// End a session with a blocking `DELETE /session/{id}`: usable from `Drop`, where the
    /// async client cannot be awaited. chromedriver answers once the browser has quit.
    fn delete_session(&self, session: &str) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            return;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(15)));
        let request = format!(
            "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
             Connection: close\r\nContent-Length: 0\r\n\r\n",
            self.port
        );
        if conn.write_all(request.as_bytes()).is_err() {
            return;
        }
        // The reply's head is enough: it comes once the browser has quit. chromedriver keeps
        // the connection open despite `Connection: close`, so reading to the end would hang.
        let mut reply = Vec::new();
        let mut chunk = [0u8; 1024];
        while !reply.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => reply.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The element that had focus after a Tab press, as the keyboard-navigation checks see it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Focused {
    /// Lower-case tag name (`a`, `button`, `input`, …); `body` when nothing has focus.
    pub tag: String,
    pub id: Option<String>,
    pub name: Option<String>,
    pub href: Option<String>,
    /// What a user would read it as: `aria-label`, else its text, else its value.
    pub label: String,
    /// A CSS path that tells it apart from its siblings, for failure messages and equality.
    pub path: String,
}

impl std::fmt::Display for Focused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}", self.path, self.label)
    }
}

/// One failed axe-core rule on a page.
#[derive(Debug, Clone, Deserialize)]
pub struct Violation {
    /// The rule, e.g. `image-alt`, `button-name`, `color-contrast`.
    pub id: String,
    /// `minor`, `moderate`, `serious` or `critical`.
    pub impact: Option<String>,
    pub help: String,
    #[serde(rename = "helpUrl")]
    pub help_url: String,
    pub nodes: Vec<ViolationNode>,
}

impl Violation {
    /// The impacts the console's pages must not have.
    pub fn is_serious(&self) -> bool {
        matches!(self.impact.as_deref(), Some("serious" | "critical"))
    }
}

/// One element a rule failed on.
#[derive(Debug, Clone, Deserialize)]
pub struct ViolationNode {
    /// axe's selector for the element (one entry per frame or shadow root on the way).
    pub target: Vec<Value>,
    pub html: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let targets: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match n.target.as_slice() {
                [Value::String(one)] => one.clone(),
                many => Value::Array(many.to_vec()).to_string(),
            })
            .collect();
        write!(
            f,
            "{} ({}): {} [{}] {}",
            self.id,
            self.impact.as_deref().unwrap_or("no impact"),
            self.help,
            targets.join(", "),
            self.help_url
        )
    }
}

/// A headless Chromium session; see the module documentation.
pub struct Browser {
    client: Client,
    session: String,
    // Dropped in this order after `Drop::drop` has ended the session: chromedriver, then
    // the profile directory the browser no longer writes to.
    driver: Driver,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Install chromium and chromedriver if needed, start a chromedriver and open a browser
    /// with a fresh profile.
    pub async fn start() -> Browser {
        ensure_installed();
        let driver = Driver::start();
        let profile = tempfile::Builder::new()
            .prefix("summaryd-chromium-")
            .tempdir()
            .expect("temporary profile directory");
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("a JSON object literal")
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&driver.url())
            .await
            .unwrap_or_else(|e| panic!("chromedriver could not start {CHROMIUM}: {e}"));
        let session = client
            .session_id()
            .await
            .expect("session id")
            .expect("a new session has an id");
        Browser {
            client,
            session,
            driver,
            _profile: profile,
        }
    }

    /// The WebDriver client, for what the helpers below do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Load `url` and wait for the page's load event.
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("navigating to {url}: {e}"));
    }

    /// The URL the browser shows now (after redirects and form submissions).
    pub async fn current_url(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("current URL")
            .to_string()
    }

    /// The page's `<title>`.
    pub async fn title(&self) -> String {
        self.client.title().await.expect("page title")
    }

    /// The first element matching `css`, waiting up to [`FIND_WITHIN`] for it to appear.
    pub async fn find(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(FIND_WITHIN)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element matches {css:?} within {FIND_WITHIN:?}: {e}"))
    }

    /// Every element matching `css` now (possibly none; no waiting).
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("finding {css:?}: {e}"))
    }

    /// Whether anything matches `css` now: for asserting that something is absent.
    pub async fn exists(&self, css: &str) -> bool {
        !self.find_all(css).await.is_empty()
    }

    /// Replace the content of the text field (input or textarea) matching `css` with `value`,
    /// typed key by key as a user would.
    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        field
            .clear()
            .await
            .unwrap_or_else(|e| panic!("clearing {css:?}: {e}"));
        field
            .send_keys(value)
            .await
            .unwrap_or_else(|e| panic!("typing into {css:?}: {e}"));
    }

    /// Choose the option with `value` in the `<select>` matching `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.find(css)
            .await
            .select_by_value(value)
            .await
            .unwrap_or_else(|e| panic!("selecting {value:?} in {css:?}: {e}"));
    }

    /// Click the element matching `css`; a click that submits a form or follows a link
    /// returns once the new page has loaded.
    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("clicking {css:?}: {e}"));
    }

    /// The rendered text of the element matching `css` (as a user sees it: hidden parts left
    /// out, whitespace collapsed).
    pub async fn text(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .unwrap_or_else(|e| panic!("reading the text of {css:?}: {e}"))
    }

    /// Run `script` in the page (a function body: `return …` gives the result).
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("running a script in the page: {e}"))
    }

    /// Save a PNG of the viewport (1280×900) to `path`, creating its directory.
    pub async fn screenshot_png(&self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        let png = self.client.screenshot().await.expect("screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The element that has focus now.
    pub async fn focused(&self) -> Focused {
        let value = self.execute(DESCRIBE_ACTIVE_ELEMENT, vec![]).await;
        serde_json::from_value(value).expect("the focused element's description")
    }

    /// Press Tab once, as a keyboard user does, and say what has focus then.
    pub async fn press_tab(&self) -> Focused {
        let tab: char = Key::Tab.into();
        let press = KeyActions::new("keyboard".to_string())
            .then(KeyAction::Down { value: tab })
            .then(KeyAction::Up { value: tab });
        self.client
            .perform_actions(press)
            .await
            .expect("pressing Tab");
        self.focused().await
    }

    /// Press Tab until `wanted` holds for the focused element, at most `max_presses` times;
    /// the element it held for, or `None` (focus never got there by keyboard).
    pub async fn press_tab_until(
        &self,
        max_presses: usize,
        wanted: impl Fn(&Focused) -> bool,
    ) -> Option<Focused> {
        for _ in 0..max_presses {
            let now = self.press_tab().await;
            if wanted(&now) {
                return Some(now);
            }
        }
        None
    }

    /// Put keyboard focus before the first element of the page, as on a fresh load, so the
    /// next Tab goes to the first focusable element.
    pub async fn focus_page_start(&self) {
        // Tab moves on from where focus last was, even after a blur; so focus a throwaway
        // element placed before everything else, which Tab itself skips (tabindex -1) and
        // which removes itself when Tab leaves it.
        self.execute(START_AT_TOP, vec![]).await;
    }

    /// Every element Tab reaches on the current page, in order: focus starts from the top
    /// of the document and Tab is pressed until focus comes back round to the first element
    /// or leaves the page, at most `max_presses` times.
    pub async fn tab_order(&self, max_presses: usize) -> Vec<Focused> {
        self.focus_page_start().await;
        let mut order: Vec<Focused> = Vec::new();
        for _ in 0..max_presses {
            let now = self.press_tab().await;
            if now.tag == "body" || order.first() == Some(&now) {
                break;
            }
            order.push(now);
        }
        order
    }

    /// Run every axe-core rule on the current page; the rules it fails.
    pub async fn axe_check(&self) -> Vec<Violation> {
        // Navigation drops the injected library, so a page is given it on its first check.
        let loaded = self
            .execute("return typeof window.axe === 'object';", vec![])
            .await;
        if loaded != Value::Bool(true) {
            self.execute(AXE_JS, vec![]).await;
        }
        let outcome = self
            .client
            .execute_async(RUN_AXE, vec![])
            .await
            .unwrap_or_else(|e| panic!("running axe-core: {e}"));
        if let Some(error) = outcome.get("error") {
            panic!("axe-core failed on {}: {error}", self.current_url().await);
        }
        serde_json::from_value(outcome["violations"].clone()).expect("axe-core's violations")
    }

    /// Fail the test, listing them, if axe-core finds serious or critical violations on the
    /// current page (`page_name` says which in the message).
    pub async fn assert_no_serious_violations(&self, page_name: &str) {
        let serious: Vec<String> = self
            .axe_check()
            .await
            .iter()
            .filter(|v| v.is_serious())
            .map(|v| format!("  - {v}"))
            .collect();
        assert!(
            serious.is_empty(),
            "axe-core finds {} serious or critical accessibility violation(s) on {page_name} ({}):\n{}",
            serious.len(),
            self.current_url().await,
            serious.join("\n")
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.driver.delete_session(&self.session);
    }
}

/// Describes `document.activeElement` as a [`Focused`].
const DESCRIBE_ACTIVE_ELEMENT: &str = r#"
const e = document.activeElement || document.body;
const attr = (n) => e.getAttribute(n);
let path = e.tagName.toLowerCase();
if (e.id) {
    path += '#' + e.id;
} else if (e.parentElement) {
    const same = Array.from(e.parentElement.children).filter((c) => c.tagName === e.tagName);
    if (same.length > 1) path += ':nth-of-type(' + (same.indexOf(e) + 1) + ')';
    const p = e.parentElement;
    path = (p.id ? p.tagName.toLowerCase() + '#' + p.id : p.tagName.toLowerCase()) + ' > ' + path;
}
const label = (attr('aria-label') || e.innerText || e.value || '').trim().replace(/\s+/g, ' ');
return {
    tag: e.tagName.toLowerCase(),
    id: e.id || null,
    name: attr('name'),
    href: attr('href'),
    label: e === document.body ? '' : label,
    path,
};
"#;

const START_AT_TOP: &str = r#"
const start = document.createElement('span');
start.id = '__summaryd_tab_start';
start.tabIndex = -1;
start.addEventListener('blur', () => start.remove(), { once: true });
document.body.prepend(start);
start.focus();
"#;

/// Runs axe-core on the whole document; passes `{violations}` or `{error}` to WebDriver's
/// callback (the last argument of an async script).
const RUN_AXE: &str = r#"
const done = arguments[arguments.length - 1];
axe.run(document, { resultTypes: ['violations'] })
    .then((r) => done({
        violations: r.violations.map((v) => ({
            id: v.id,
            impact: v.impact,
            help: v.help,
            helpUrl: v.helpUrl,
            nodes: v.nodes.map((n) => ({ target: n.target, html: n.html })),
        })),
    }))
    .catch((e) => done({ error: String(e) }));
"#;
