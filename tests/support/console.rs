//! A running application with the operator console on its ops listener, and a signed-in
//! browser's requests to it made by hand (cookies and CSRF tokens read from the answers), so
//! tests see exactly what a browser would send and get.

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use summaryd::app::Application;
use summaryd::config::roles::Roles;
use summaryd::shutdown::Shutdown;

use super::TestEnv;
use super::test_env::Services;

/// What a model answers when it refuses a text for good: the job is dead-lettered at once.
pub fn refused() -> summaryd::llm::LlmError {
    summaryd::llm::LlmError::Status {
        status: 400,
        retry_after: None,
        message: "the model refused the input".into(),
    }
}

/// Dead-letter `jobs` through a worker whose model refuses each one.
pub async fn dead_letter(services: &Services, jobs: &[summaryd::domain::Job]) {
    let mut redis = services.redis.get().await.unwrap();
    for j in jobs {
        summaryd::stream::enqueue(&mut redis, services.keys.get(0), j)
            .await
            .unwrap();
    }
    let mut consumer = summaryd::worker::Consumer::new(services.worker(), "w-dead");
    consumer.ensure_group().await.unwrap();
    let mut taken = 0;
    while taken < jobs.len() {
        taken += consumer.run_once().await.unwrap();
    }
}

/// Users every console test has: `alice` (operator, argon2 password, token `alice-token`),
/// `olga` (operator, SHA-256 password), `vera` (viewer, token `vera-token`).
pub const PASSWORD: &str = "correct horse battery staple";

pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

pub fn users_toml() -> String {
    use argon2::password_hash::PasswordHasher;
    let argon = argon2::Argon2::default()
        .hash_password(PASSWORD.as_bytes())
        .unwrap()
        .to_string();
    format!(
        "[users.alice]\npassword_argon2 = \"{argon}\"\nrole = \"operator\"\ntoken_sha256 = \"{}\"\n\n\
         [users.olga]\npassword_sha256 = \"{}\"\nrole = \"operator\"\n\n\
         [users.vera]\npassword_sha256 = \"{}\"\nrole = \"viewer\"\ntoken_sha256 = \"{}\"\n",
        sha256_hex("alice-token"),
        sha256_hex(PASSWORD),
        sha256_hex(PASSWORD),
        sha256_hex("vera-token"),
    )
}

pub struct ConsoleApp {
    /// `http://127.0.0.1:<ops port>`.
    pub ops: String,
    /// The main listener's base.
    pub main: String,
    pub http: reqwest::Client,
    pub users_file: PathBuf,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), summaryd::app::StartError>>,
    _dir: tempfile::TempDir,
}

impl ConsoleApp {
    /// The application with `roles`, an ops listener and the users above.
    pub async fn start(env: &TestEnv, roles: Roles) -> ConsoleApp {
        let dir = tempfile::tempdir().unwrap();
        let users_file = dir.path().join("console-users.toml");
        std::fs::write(&users_file, users_toml()).unwrap();
        let mut settings = env.settings.clone();
        settings.ops.listen = Some("127.0.0.1:0".parse().unwrap());
        settings.console.users_file = Some(users_file.clone());
        let app = Application::build(
            settings,
            roles,
            std::sync::Arc::new(super::FakeLlm::ok()),
            std::sync::Arc::new(super::FakeMailer::new()),
            false,
        )
        .await
        .expect("build app");
        let ops = format!("http://127.0.0.1:{}", app.ops_port().expect("ops port"));
        let main = format!("http://127.0.0.1:{}", app.port());
        let shutdown = Shutdown::new();
        let task = tokio::spawn(app.run(shutdown.clone()));
        ConsoleApp {
            ops,
            main,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            users_file,
            shutdown,
            task,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.ops)
    }

    /// Sign in through the form, as a browser does; panics unless it works.
    pub async fn sign_in(&self, user: &str) -> Session {
        let res = self.try_sign_in(user, PASSWORD).await;
        assert_eq!(res.status().as_u16(), 303, "sign-in of {user}");
        let cookie = set_cookie(&res, "summaryd_console").expect("session cookie");
        let mut session = Session {
            cookie,
            csrf: String::new(),
        };
        let home = session.get(self, "/console").await;
        assert_eq!(home.status().as_u16(), 200);
        session.csrf = csrf_in(&home.text().await.unwrap()).expect("csrf field on the page");
        session
    }

    /// One sign-in attempt: the form's own token and cookie, then the POST.
    pub async fn try_sign_in(&self, user: &str, password: &str) -> reqwest::Response {
        let form = self
            .http
            .get(self.url("/console/sign-in"))
            .send()
            .await
            .unwrap();
        let pre = set_cookie(&form, "summaryd_console_sign_in").expect("sign-in cookie");
        let token = csrf_in(&form.text().await.unwrap()).expect("sign-in token");
        self.http
            .post(self.url("/console/sign-in"))
            .header("Cookie", format!("summaryd_console_sign_in={pre}"))
            .form(&[("user", user), ("password", password), ("csrf", &token)])
            .send()
            .await
            .unwrap()
    }

    /// `/metrics` of this process, as Prometheus text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn stop(self) {
        self.shutdown.trigger();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(15), self.task).await;
    }
}

/// The value a `Set-Cookie` header of `res` gives `name`.
pub fn set_cookie(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let first = v.split(';').next()?;
            let (n, value) = first.split_once('=')?;
            (n == name).then(|| value.to_owned())
        })
}

/// The first `name="csrf" value="…"` of a page.
pub fn csrf_in(html: &str) -> Option<String> {
    field_in(html, "csrf")
}

/// The value of the first hidden or text field `name` of a page.
pub fn field_in(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let at = html.find(&marker)? + marker.len();
    let end = html[at..].find('"')?;
    Some(html[at..at + end].to_owned())
}

/// A signed-in browser: its session cookie and the CSRF token its pages carry.
pub struct Session {
    pub cookie: String,
    pub csrf: String,
}

impl Session {
    fn cookie_header(&self) -> String {
        format!("summaryd_console={}", self.cookie)
    }

    pub async fn get(&self, app: &ConsoleApp, path: &str) -> reqwest::Response {
        app.http
            .get(app.url(path))
            .header("Cookie", self.cookie_header())
            .send()
            .await
            .unwrap()
    }

    /// A form POST with this session's CSRF token added.
    pub async fn post(
        &self,
        app: &ConsoleApp,
        path: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        all.push(("csrf", &self.csrf));
        self.post_raw(app, path, &all).await
    }

    /// A form POST exactly as given (no CSRF token unless the fields have one).
    pub async fn post_raw(
        &self,
        app: &ConsoleApp,
        path: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        app.http
            .post(app.url(path))
            .header("Cookie", self.cookie_header())
            .form(fields)
            .send()
            .await
            .unwrap()
    }
}
