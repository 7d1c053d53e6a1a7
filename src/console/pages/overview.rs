//! The overview: the queue, the outbox, the model providers and throughput at a glance.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Duration as ChronoDuration, DurationRound, Utc};
use maud::{Markup, html};
use serde::Serialize;

use super::signed_in;
use crate::console::error::ConsoleError;
use crate::console::{Console, paths};
use crate::domain::Pause;

/// Minutes the throughput chart covers.
pub(crate) const CHART_MINUTES: i32 = 60;

#[derive(Debug, Serialize)]
pub(crate) struct Overview {
    /// The gauges as this process last measured them (`/metrics` serves the same values);
    /// `None` when it has not measured them yet.
    pub(crate) stream_lag: Option<i64>,
    pub(crate) stream_pending: Option<i64>,
    pub(crate) oldest_queued_age_s: Option<f64>,
    pub(crate) dead_letters: Option<i64>,
    pub(crate) outbox_unsent: Vec<TopicCount>,
    /// This process's view of each model provider's breaker (empty without the worker role).
    pub(crate) breakers: Vec<Breaker>,
    pub(crate) paused: Option<Pause>,
    /// Jobs finished (summaries committed) per minute over the last hour, every minute
    /// present, oldest first.
    pub(crate) finished_per_minute: Vec<Minute>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TopicCount {
    pub(crate) topic: String,
    pub(crate) unsent: i64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Breaker {
    pub(crate) provider: String,
    pub(crate) open: bool,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Minute {
    pub(crate) minute: DateTime<Utc>,
    pub(crate) jobs: i64,
}

/// Every minute of the window, with 0 where no job finished.
pub(crate) fn fill_minutes(now: DateTime<Utc>, counted: &[(DateTime<Utc>, i64)]) -> Vec<Minute> {
    let last = now
        .duration_trunc(ChronoDuration::minutes(1))
        .unwrap_or(now);
    (0..CHART_MINUTES)
        .rev()
        .map(|back| {
            let minute = last - ChronoDuration::minutes(i64::from(back));
            let jobs = counted
                .iter()
                .find(|(m, _)| *m == minute)
                .map_or(0, |(_, n)| *n);
            Minute { minute, jobs }
        })
        .collect()
}

pub(crate) async fn load(console: &Console) -> Result<Overview, ConsoleError> {
    let m = &console.metrics;
    let counted = crate::db::summaries::finished_per_minute(&console.pg, CHART_MINUTES).await?;
    let mut outbox_unsent: Vec<TopicCount> = m
        .outbox_unsent_by_topic
        .by_label()
        .into_iter()
        .map(|(topic, n)| TopicCount {
            topic,
            unsent: n as i64,
        })
        .collect();
    outbox_unsent.sort_by(|a, b| a.topic.cmp(&b.topic));
    Ok(Overview {
        stream_lag: m.stream_lag.get().map(|v| v as i64),
        stream_pending: m.stream_pending.get().map(|v| v as i64),
        oldest_queued_age_s: m.oldest_queued_age.get(),
        dead_letters: m.dead_letters.get().map(|v| v as i64),
        outbox_unsent,
        breakers: m
            .breakers()
            .into_iter()
            .map(|(provider, open)| Breaker { provider, open })
            .collect(),
        paused: super::paused(console).await?,
        finished_per_minute: fill_minutes(Utc::now(), &counted),
    })
}

fn shown<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "not measured yet".into(), |v| v.to_string())
}

/// The throughput chart as SVG drawn here: no script needed, and nothing inline for the
/// Content-Security-Policy to refuse (presentation attributes only, classes from the
/// stylesheet).
pub(crate) fn chart(minutes: &[Minute]) -> Markup {
    const W: f64 = 720.0;
    const H: f64 = 180.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 20.0;
    let max = minutes.iter().map(|m| m.jobs).max().unwrap_or(0).max(1);
    let slot = (W - LEFT) / minutes.len().max(1) as f64;
    let total: i64 = minutes.iter().map(|m| m.jobs).sum();
    let first = minutes
        .first()
        .map(|m| m.minute.format("%H:%M").to_string());
    let last = minutes.last().map(|m| m.minute.format("%H:%M").to_string());
    html! {
        figure.chart {
            svg #throughput viewBox={ "0 0 " (W) " " (H) } role="img" aria-labelledby="chart-title chart-desc" {
                title #chart-title { "Jobs finished per minute, last hour" }
                desc #chart-desc { (total) " jobs in the last " (minutes.len()) " minutes; at most " (max) " in one minute." }
                line.axis x1=(LEFT) y1=(H - BOTTOM) x2=(W) y2=(H - BOTTOM) {}
                line.axis x1=(LEFT) y1="0" x2=(LEFT) y2=(H - BOTTOM) {}
                text x="2" y="12" { (max) }
                text x="2" y=(H - BOTTOM) { "0" }
                @if let Some(first) = &first { text x=(LEFT) y=(H - 4.0) { (first) } }
                @if let Some(last) = &last { text x=(W - 34.0) y=(H - 4.0) { (last) } }
                @for (i, m) in minutes.iter().enumerate() {
                    @let height = (H - BOTTOM - 4.0) * m.jobs as f64 / max as f64;
                    rect.bar x=(format!("{:.1}", LEFT + i as f64 * slot + 1.0)) y=(format!("{:.1}", H - BOTTOM - height))
                        width=(format!("{:.1}", (slot - 2.0).max(1.0))) height=(format!("{:.1}", height)) {
                        title { (m.minute.format("%H:%M")) ": " (m.jobs) " jobs" }
                    }
                }
            }
            figcaption { "Jobs finished per minute over the last hour (" (total) " in all)." }
        }
    }
}

pub(crate) fn render(o: &Overview) -> Markup {
    html! {
        h2 { "Queue" }
        dl.cards {
            div { dt { "Stream lag (not yet delivered)" } dd { (shown(o.stream_lag)) } }
            div { dt { "Pending (delivered, not acknowledged)" } dd { (shown(o.stream_pending)) } }
            div { dt { "Oldest queued job" } dd { (shown(o.oldest_queued_age_s.map(|s| format!("{s:.0} s")))) } }
            div { dt { "Dead letters" } dd { a href=(paths::DEAD_LETTERS) { (shown(o.dead_letters)) } } }
            div { dt { "Consumption" } dd { @if o.paused.is_some() { a href=(paths::PAUSE) { "paused" } } @else { "running" } } }
        }
        h2 { "Outbox backlog" }
        @if o.outbox_unsent.is_empty() {
            p.muted { "Not measured yet." }
        } @else {
            table {
                thead { tr { th scope="col" { "Topic" } th.num scope="col" { "Unsent rows" } } }
                tbody {
                    @for t in &o.outbox_unsent {
                        tr { td { a href={ (paths::OUTBOX) "?topic=" (t.topic) } { code { (t.topic) } } } td.num { (t.unsent) } }
                    }
                }
            }
        }
        h2 { "Model providers" }
        @if o.breakers.is_empty() {
            p.muted { "This process runs no worker, so it calls no model: breaker states are on the worker processes' consoles and in summaryd_llm_breaker_open." }
        } @else {
            table {
                thead { tr { th scope="col" { "Provider" } th scope="col" { "Circuit breaker" } } }
                tbody {
                    @for b in &o.breakers {
                        tr { td { (b.provider) } td { @if b.open { strong.status-failed { "open (calls refused)" } } @else { "closed" } } }
                    }
                }
            }
        }
        h2 { "Throughput" }
        (chart(&o.finished_per_minute))
    }
}

pub(crate) async fn page(
    req: HttpRequest,
    console: web::Data<Console>,
) -> Result<HttpResponse, ConsoleError> {
    let signed = signed_in(&req, &console).await?;
    let overview = load(&console).await?;
    Ok(signed.page("Overview", paths::HOME, render(&overview)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn every_minute_of_the_hour_is_present() {
        let now = Utc.with_ymd_and_hms(2026, 12, 2, 15, 30, 42).unwrap();
        let busy = Utc.with_ymd_and_hms(2026, 12, 2, 15, 29, 0).unwrap();
        let first = Utc.with_ymd_and_hms(2026, 12, 2, 14, 31, 0).unwrap();
        let minutes = fill_minutes(now, &[(busy, 7), (first, 2)]);
        assert_eq!(minutes.len(), 60);
        assert_eq!(
            minutes[0],
            Minute {
                minute: first,
                jobs: 2
            }
        );
        assert_eq!(
            minutes[58],
            Minute {
                minute: busy,
                jobs: 7
            }
        );
        assert_eq!(
            minutes[59].minute,
            Utc.with_ymd_and_hms(2026, 12, 2, 15, 30, 0).unwrap()
        );
        assert_eq!(minutes.iter().map(|m| m.jobs).sum::<i64>(), 9);
    }

    #[test]
    fn the_chart_draws_a_bar_per_minute_scaled_to_the_busiest() {
        let now = Utc.with_ymd_and_hms(2026, 12, 2, 15, 30, 0).unwrap();
        let minutes = fill_minutes(now, &[(now, 4)]);
        let svg = chart(&minutes).into_string();
        assert_eq!(svg.matches("<rect").count(), 60);
        assert!(svg.contains("4 jobs in the last 60 minutes"), "{svg}");
        assert!(svg.contains("15:30: 4 jobs"), "{svg}");
        assert!(
            svg.contains("height=\"156.0\""),
            "the busiest minute is full height: {svg}"
        );
    }
}
