//! In-process fakes for the two external providers (never for Redis or Postgres).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use summaryd::domain::{ModelSummary, TokenUsage};
use summaryd::llm::{Completion, Llm, LlmError};
use summaryd::mail::{MailError, Mailer, OutgoingEmail};

use crate::shared::script::Script;

/// One scripted model answer.
#[derive(Debug, Clone)]
pub enum Step {
    Ok(String),
    Fail(LlmError),
    /// Never answers (the caller's timeout must cut it).
    Hang,
    /// Sleep, then take the next behaviour.
    Delay(Duration, Box<Step>),
}

/// A scriptable model: plays `script` in order, then `fallback` forever. Counts calls and
/// the peak number of calls in flight at once.
pub struct FakeLlm {
    script: Script<Step>,
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    call_times: Mutex<Vec<Instant>>,
    /// What every answer reports it cost; `None`: nothing, as the built-in summariser.
    usage: Option<TokenUsage>,
}

impl FakeLlm {
    /// Always answers with a summary derived from the input.
    pub fn ok() -> Self {
        Self::with(vec![], Step::Ok(String::new()))
    }

    pub fn with(script: Vec<Step>, fallback: Step) -> Self {
        Self {
            script: Script::new(script, fallback),
            calls: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            call_times: Mutex::new(Vec::new()),
            usage: None,
        }
    }

    /// Every answer reports `prompt` and `completion` tokens, as a hosted model does.
    pub fn reporting(mut self, prompt: u32, completion: u32) -> Self {
        self.usage = Some(TokenUsage::new(prompt, completion));
        self
    }

    /// Every call fails with `err`.
    pub fn failing(err: LlmError) -> Self {
        Self::with(vec![], Step::Fail(err))
    }

    /// Every call takes `latency`, then succeeds.
    pub fn slow(latency: Duration) -> Self {
        Self::with(
            vec![],
            Step::Delay(latency, Box::new(Step::Ok(String::new()))),
        )
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Calls running now (a call whose caller gave up is no longer running).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn call_times(&self) -> Vec<Instant> {
        self.call_times.lock().unwrap().clone()
    }

    async fn play(step: Step, text: &str) -> Result<String, LlmError> {
        let mut step = step;
        loop {
            match step {
                Step::Ok(s) if s.is_empty() => {
                    return Ok(format!(
                        "summary: {}",
                        text.chars().take(40).collect::<String>()
                    ));
                }
                Step::Ok(s) => return Ok(s),
                Step::Fail(e) => return Err(e),
                Step::Hang => std::future::pending::<()>().await,
                Step::Delay(d, next) => {
                    tokio::time::sleep(d).await;
                    step = *next;
                }
            }
        }
    }
}

struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Llm for FakeLlm {
    async fn summarise(&self, text: &str) -> Result<Completion, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.call_times.lock().unwrap().push(Instant::now());
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let _guard = InFlight(&self.in_flight);
        let step = self.script.next();
        let summary = Self::play(step, text).await?;
        Ok(match self.usage {
            Some(usage) => Completion::with_usage(summary, usage),
            None => Completion::without_usage(summary),
        })
    }
}

/// What the fake mail provider does on one send.
#[derive(Debug, Clone)]
pub enum MailStep {
    Deliver,
    /// Fail with the error this makes (a function, because errors that keep their source
    /// cannot be cloned into every step).
    Fail(fn() -> MailError),
    /// Record the email as delivered, then panic: a crash after the provider accepted the
    /// message but before the relay committed `sent_at`.
    DeliverThenCrash,
    /// Record as delivered after sleeping (a slow provider).
    DelayThenDeliver(Duration),
}

/// Records every email it "delivers", with the dedupe key it was given.
pub struct FakeMailer {
    script: Script<MailStep>,
    attempts: AtomicUsize,
    sent: Mutex<Vec<(OutgoingEmail, String)>>,
}

impl FakeMailer {
    pub fn new() -> Self {
        Self::with(vec![], MailStep::Deliver)
    }

    pub fn with(script: Vec<MailStep>, fallback: MailStep) -> Self {
        Self {
            script: Script::new(script, fallback),
            attempts: AtomicUsize::new(0),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Emails delivered, with their dedupe keys, in order.
    pub fn sent(&self) -> Vec<(OutgoingEmail, String)> {
        self.sent.lock().unwrap().clone()
    }

    /// Every call to `send`, delivered or not.
    pub fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }
}

impl Default for FakeMailer {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Mailer for FakeMailer {
    async fn attempt(&self, email: &OutgoingEmail, dedupe_key: &str) -> Result<(), MailError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let step = self.script.next();
        match step {
            MailStep::Deliver => {}
            MailStep::Fail(error) => return Err(error()),
            MailStep::DeliverThenCrash => {
                self.sent
                    .lock()
                    .unwrap()
                    .push((email.clone(), dedupe_key.to_owned()));
                panic!("simulated crash after the provider accepted the email");
            }
            MailStep::DelayThenDeliver(d) => tokio::time::sleep(d).await,
        }
        self.sent
            .lock()
            .unwrap()
            .push((email.clone(), dedupe_key.to_owned()));
        Ok(())
    }
}

/// A summary as if the fake model wrote it, for tests that commit one directly.
pub fn model_summary(text: &str) -> ModelSummary {
    ModelSummary {
        text: text.to_owned(),
        model: "builtin".into(),
        usage: None,
        parts: None,
        calls: Vec::new(),
    }
}
