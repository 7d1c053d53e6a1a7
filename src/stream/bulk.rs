//! An operator's bulk action on dead letters: replay or purge every dead letter that
//! matches a filter, or a chosen list, as a run any process can show and finish.
//!
//! A run lives in Redis (`RedisKeys::bulk_run`, a JSON record with a TTL), not in the
//! process that started it, so every console sees its progress and a run whose process
//! died is resumed from its saved cursor by whoever steps it next. It is safe on three
//! counts:
//!
//! - **One run per confirmation.** [`start`] is idempotent by the run id the console made
//!   when it rendered the confirmation (SET NX): a second click gets the first click's run.
//! - **One worker at a time.** [`step`] holds a lease (`RedisKeys::bulk_lease`, SET NX PX
//!   with a token of its own) while it works one page, and saves the cursor only while it
//!   still holds it, so two processes never advance the same run over each other.
//! - **Repeating is harmless.** A page done again (after a crash between the work and the
//!   save) finds its entries gone from the dead-letter stream: a replay of a gone entry is
//!   `NotFound` (the replay script checks and moves in one step, so an entry is enqueued
//!   once however often or concurrently it is replayed), a purge of one removes nothing.
//!   Such entries count as skipped, never as failed.
//!
//! A run touches only dead letters up to its snapshot, the newest entry when the operator
//! confirmed: jobs dead-lettered while it runs are left for the next decision.

use std::cmp::Ordering;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};

use super::dead_letters::{
    self, DeadLetter, DeadLetterFilter, ReplayError, ReplayOutcome, now_millis,
};
use crate::infra::keys::RedisKeys;

/// How long a run's record is kept after it was started: long enough to read what was done
/// after a weekend, bounded so runs never pile up.
pub const RUN_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How long a step's lease lasts: far longer than one page takes, short enough that a run
/// whose process died is taken over soon.
pub const LEASE: Duration = Duration::from_secs(30);

/// How often [`run_to_end`] looks again while another process holds the lease.
const LEASE_POLL: Duration = Duration::from_millis(250);

/// Dead letters a console's [`run_to_end`] handles per step, unless it chooses otherwise.
pub const DEFAULT_PAGE: usize = 100;

/// What a run does to each dead letter it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// Back in the tenant's lane with the same job id (`dead_letters::replay`).
    Replay,
    /// Removed with its job state (`dead_letters::purge_entries`).
    Purge,
}

/// Which dead letters a run acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Every dead letter `filter` matches, up to and including the entry id `upto`: the
    /// snapshot the operator's count was made against (`dead_letters::newest_id`), or
    /// `None` for the newest dead letter when the run starts. Ages are measured from the
    /// start.
    Matching {
        filter: DeadLetterFilter,
        upto: Option<String>,
    },
    /// These dead-letter entry ids (the operator ticked them); stored oldest first, once each.
    Ids(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Finished,
}

/// A bulk run as stored; what a console shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkRun {
    /// The run id (a UUID) the console chose.
    pub id: String,
    pub action: BulkAction,
    pub selection: Selection,
    /// The newest dead-letter entry the run may touch (`Selection::Matching`); `None` for
    /// a list of ids, or when there was no dead letter at all.
    pub snapshot: Option<String>,
    /// When the run started, in Unix milliseconds: the filter's ages are measured from it,
    /// so every step selects the same dead letters.
    pub as_of_ms: u64,
    /// The last dead-letter entry id dealt with; the next step goes on after it.
    pub cursor: Option<String>,
    /// Dead letters selected when the run started.
    pub total: u64,
    /// Replayed or purged by this run.
    pub done: u64,
    /// Gone before the run reached them (replayed or purged by someone else, or by an
    /// earlier attempt of this run's page). Once the run is finished,
    /// `done + skipped + failed == total`.
    pub skipped: u64,
    /// Could not be acted on: a dead letter that is no job (no valid job id or payload)
    /// cannot be replayed and stays dead-lettered.
    pub failed: u64,
    pub state: RunState,
    /// Who confirmed the action (the console's user name).
    pub started_by: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The stream shard whose dead letters the run acts on (`SUMMARYD_STREAM_SHARDS`);
    /// absent in runs stored before shards, which were all of shard 0.
    #[serde(default)]
    pub shard: u16,
}

impl BulkRun {
    pub fn is_finished(&self) -> bool {
        self.state == RunState::Finished
    }

    fn finish(&mut self) {
        self.state = RunState::Finished;
        self.finished_at = Some(Utc::now());
        // A selected dead letter the scan no longer found was removed by someone else.
        self.skipped = self.total.saturating_sub(self.done + self.failed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error("bulk run id {0:?} is not a UUID")]
    InvalidRunId(String),
    #[error("{0:?} is not a dead-letter entry id")]
    InvalidEntryId(String),
    #[error("no bulk run {0} (never started, or expired)")]
    NotFound(String),
    /// Another process is working the run right now; its lease expires if it died.
    #[error("bulk run {0} is being worked by another process")]
    Leased(String),
    /// This step outlived its lease and another process took the run over; the page's work
    /// is repeated harmlessly by whoever holds the run now.
    #[error("lost the lease on bulk run {0} while working it")]
    LeaseLost(String),
    #[error("bulk run {run_id} is stored in a form this version cannot read")]
    Record {
        run_id: String,
        #[source]
        source: serde_json::Error,
    },
}

/// An entry id as its two numbers, for ordering ids as the stream does.
fn entry_key(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

fn compare_ids(a: &str, b: &str) -> Ordering {
    entry_key(a).cmp(&entry_key(b))
}

fn check_entry_id(id: &str) -> Result<(), BulkError> {
    entry_key(id)
        .map(|_| ())
        .ok_or_else(|| BulkError::InvalidEntryId(id.to_owned()))
}

fn check_run_id(run_id: &str) -> Result<(), BulkError> {
    uuid::Uuid::parse_str(run_id)
        .map(|_| ())
        .map_err(|_| BulkError::InvalidRunId(run_id.to_owned()))
}

fn record_error(run_id: &str) -> impl FnOnce(serde_json::Error) -> BulkError + '_ {
    move |source| BulkError::Record {
        run_id: run_id.to_owned(),
        source,
    }
}

/// The run `run_id`, if it exists (and has not expired).
pub async fn get<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run_id: &str,
) -> Result<Option<BulkRun>, BulkError> {
    check_run_id(run_id)?;
    let raw: Option<String> = conn.get(keys.bulk_run(run_id)).await?;
    raw.map(|raw| serde_json::from_str(&raw).map_err(record_error(run_id)))
        .transpose()
}

/// Start the run `run_id`: `action` on the dead letters `selection` names, confirmed by
/// `by`. Idempotent by run id: if the run exists, it is returned as it stands and nothing
/// else happens (whatever the other arguments say), so two clicks on one confirmation make
/// one run. The run is stored with [`RUN_TTL`]; nothing is touched until [`step`] or
/// [`run_to_end`]. A run with nothing to do is stored finished.
pub async fn start<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run_id: &str,
    action: BulkAction,
    selection: Selection,
    by: &str,
) -> Result<BulkRun, BulkError> {
    if let Some(run) = get(conn, keys, run_id).await? {
        return Ok(run);
    }
    let as_of_ms = now_millis();
    let (selection, snapshot, total) = match selection {
        Selection::Matching { filter, upto } => {
            let snapshot = match &upto {
                Some(upto) => {
                    check_entry_id(upto)?;
                    Some(upto.clone())
                }
                None => dead_letters::newest_id(conn, keys).await?,
            };
            let total = match &snapshot {
                Some(upto) => {
                    dead_letters::count_matching_at(conn, keys, &filter, upto, as_of_ms).await?
                }
                None => 0,
            };
            (Selection::Matching { filter, upto }, snapshot, total)
        }
        Selection::Ids(mut ids) => {
            ids.iter().try_for_each(|id| check_entry_id(id))?;
            ids.sort_by(|a, b| compare_ids(a, b));
            ids.dedup();
            let total = ids.len();
            (Selection::Ids(ids), None, total)
        }
    };
    let mut run = BulkRun {
        id: run_id.to_owned(),
        action,
        selection,
        snapshot,
        as_of_ms,
        cursor: None,
        total: total as u64,
        done: 0,
        skipped: 0,
        failed: 0,
        state: RunState::Running,
        started_by: by.to_owned(),
        started_at: Utc::now(),
        finished_at: None,
        shard: keys.shard(),
    };
    if total == 0 {
        run.finish();
    }
    let json = serde_json::to_string(&run).map_err(record_error(run_id))?;
    let created: Option<String> = redis::cmd("SET")
        .arg(keys.bulk_run(run_id))
        .arg(json)
        .arg("NX")
        .arg("PX")
        .arg(millis(RUN_TTL))
        .query_async(conn)
        .await?;
    if created.is_some() {
        tracing::info!(run_id, action = ?run.action, total = run.total, by, "bulk run started");
        return Ok(run);
    }
    // Another click created it between our read and our write: theirs is the run.
    get(conn, keys, run_id)
        .await?
        .ok_or_else(|| BulkError::NotFound(run_id.to_owned()))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Save the run only while `token` still holds its lease; the record keeps its TTL.
///
/// KEYS[1] lease   KEYS[2] record   ARGV[1] token   ARGV[2] the record's JSON
static SAVE: LazyLock<Script> = LazyLock::new(|| Script::new(SAVE_LUA));
const SAVE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'KEEPTTL')
return 1
";

/// Give the lease up, if `token` still holds it.
///
/// KEYS[1] lease   ARGV[1] token
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Work one page of the run `run_id`: up to `page` dead letters after its cursor (a page of
/// 0 is taken as 1), then save its cursor and counts. Returns the run as saved; a finished
/// run is returned unchanged.
///
/// Takes the run's lease for the step and gives it up after, so any process may take the
/// next step: [`BulkError::Leased`] when another process holds it now (wait and step
/// again: a lease whose process died expires after [`LEASE`]). On any error the cursor
/// stays where it was, and the next step repeats the page harmlessly.
pub async fn step<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run_id: &str,
    page: usize,
) -> Result<BulkRun, BulkError> {
    check_run_id(run_id)?;
    let token = uuid::Uuid::new_v4().to_string();
    let lease = keys.bulk_lease(run_id);
    let taken: Option<String> = redis::cmd("SET")
        .arg(&lease)
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(millis(LEASE))
        .query_async(conn)
        .await?;
    if taken.is_none() {
        return Err(BulkError::Leased(run_id.to_owned()));
    }
    let result = step_leased(conn, keys, run_id, page.max(1), &token).await;
    let released: redis::RedisResult<i64> =
        RELEASE.key(&lease).arg(&token).invoke_async(conn).await;
    if let Err(e) = released {
        // The lease expires by itself; until then the run only waits.
        tracing::warn!(run_id, error = %e, "could not release a bulk run's lease");
    }
    result
}

async fn step_leased<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run_id: &str,
    page: usize,
    token: &str,
) -> Result<BulkRun, BulkError> {
    let mut run = get(conn, keys, run_id)
        .await?
        .ok_or_else(|| BulkError::NotFound(run_id.to_owned()))?;
    if run.is_finished() {
        return Ok(run);
    }
    let at_end = match &run.selection {
        Selection::Matching { filter, .. } => {
            let filter = filter.clone();
            step_matching(conn, keys, &mut run, &filter, page).await?
        }
        Selection::Ids(ids) => {
            let ids = ids.clone();
            step_ids(conn, keys, &mut run, &ids, page).await?
        }
    };
    if at_end {
        run.finish();
    }
    let json = serde_json::to_string(&run).map_err(record_error(run_id))?;
    let saved: i64 = SAVE
        .key(keys.bulk_lease(run_id))
        .key(keys.bulk_run(run_id))
        .arg(token)
        .arg(json)
        .invoke_async(conn)
        .await?;
    if saved == 0 {
        return Err(BulkError::LeaseLost(run_id.to_owned()));
    }
    if run.is_finished() {
        tracing::info!(
            run_id,
            action = ?run.action,
            done = run.done,
            skipped = run.skipped,
            failed = run.failed,
            "bulk run finished"
        );
    }
    Ok(run)
}

/// One page of a filter's run; whether the snapshot was reached.
async fn step_matching<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run: &mut BulkRun,
    filter: &DeadLetterFilter,
    page: usize,
) -> Result<bool, BulkError> {
    let Some(upto) = run.snapshot.clone() else {
        return Ok(true);
    };
    let entries =
        dead_letters::entries_after(conn, keys, run.cursor.as_deref(), &upto, page).await?;
    let matching: Vec<_> = entries
        .iter()
        .filter(|entry| filter.matches(&DeadLetter::from_entry(entry), run.as_of_ms))
        .cloned()
        .collect();
    match run.action {
        BulkAction::Replay => {
            for entry in &matching {
                replay_one(conn, keys, run, &entry.id).await?;
            }
        }
        BulkAction::Purge => {
            let removed = dead_letters::purge_entries(conn, keys, &matching).await?;
            run.done += removed;
            run.skipped += (matching.len() as u64).saturating_sub(removed);
        }
    }
    if let Some(last) = entries.last() {
        run.cursor = Some(last.id.clone());
    }
    Ok(entries.len() < page)
}

/// One page of a run over chosen ids (sorted); whether the last id was dealt with.
async fn step_ids<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run: &mut BulkRun,
    ids: &[String],
    page: usize,
) -> Result<bool, BulkError> {
    let from = match &run.cursor {
        Some(cursor) => ids.partition_point(|id| compare_ids(id, cursor) != Ordering::Greater),
        None => 0,
    };
    let chunk = &ids[from..ids.len().min(from + page)];
    match run.action {
        BulkAction::Replay => {
            for id in chunk {
                replay_one(conn, keys, run, id).await?;
            }
        }
        BulkAction::Purge => {
            let removed = dead_letters::purge_ids(conn, keys, chunk, None).await?;
            run.done += removed;
            run.skipped += (chunk.len() as u64).saturating_sub(removed);
        }
    }
    if let Some(last) = chunk.last() {
        run.cursor = Some(last.clone());
    }
    Ok(from + chunk.len() >= ids.len())
}

async fn replay_one<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run: &mut BulkRun,
    id: &str,
) -> Result<(), BulkError> {
    match dead_letters::replay(conn, keys, id).await {
        Ok(ReplayOutcome::Replayed { .. }) => run.done += 1,
        Ok(ReplayOutcome::NotFound) => run.skipped += 1,
        Err(ReplayError::NotAJob(_)) => run.failed += 1,
        Err(ReplayError::Redis(e)) => return Err(e.into()),
    }
    Ok(())
}

/// Step the run `run_id` until it is finished, `page` dead letters per step, and return it
/// finished. While another process holds the run's lease it waits and tries again, so it
/// also finishes a run another process left behind, once that lease expires. A console
/// spawns this on a task after [`start`]; if the process stops, calling it again (from any
/// process) goes on from the saved cursor.
pub async fn run_to_end<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run_id: &str,
    page: usize,
) -> Result<BulkRun, BulkError> {
    loop {
        match step(conn, keys, run_id, page).await {
            Ok(run) if run.is_finished() => return Ok(run),
            Ok(_) => {}
            Err(BulkError::Leased(_) | BulkError::LeaseLost(_)) => {
                if let Some(run) = get(conn, keys, run_id).await?
                    && run.is_finished()
                {
                    return Ok(run);
                }
                tokio::time::sleep(LEASE_POLL).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a process is working the run `run_id` right now (holds its lease). A running
/// run that nobody works was left by a process that stopped: [`run_to_end`] resumes it.
pub async fn is_worked<C: ConnectionLike + Send + Sync>(
    conn: &mut C,
    keys: &RedisKeys,
    run_id: &str,
) -> Result<bool, BulkError> {
    check_run_id(run_id)?;
    Ok(conn.exists(keys.bulk_lease(run_id)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_order_by_their_numbers_not_their_text() {
        assert_eq!(compare_ids("9-0", "10-0"), Ordering::Less);
        assert_eq!(compare_ids("10-2", "10-10"), Ordering::Less);
        assert_eq!(compare_ids("10-1", "10-1"), Ordering::Equal);
        assert_eq!(compare_ids("11-0", "10-99"), Ordering::Greater);
        assert_eq!(entry_key("1700000000000-3"), Some((1_700_000_000_000, 3)));
        for bad in [
            "", "-", "12", "12-", "-3", "a-1", "1-b", "1-2-3", "+", "(5-0",
        ] {
            assert_eq!(entry_key(bad), None, "{bad:?}");
            assert!(matches!(
                check_entry_id(bad),
                Err(BulkError::InvalidEntryId(id)) if id == bad
            ));
        }
        assert!(check_entry_id("5-0").is_ok());
    }

    #[test]
    fn run_ids_must_be_uuids() {
        assert!(check_run_id("0b5c6a4e-1f7e-4c1e-9f57-1d2f9b8a7c3d").is_ok());
        for bad in ["", "run-1", "*", "0b5c6a4e-1f7e-4c1e-9f57"] {
            assert!(matches!(check_run_id(bad), Err(BulkError::InvalidRunId(_))));
        }
    }

    fn run(total: u64, done: u64, skipped: u64, failed: u64) -> BulkRun {
        BulkRun {
            id: "r".into(),
            action: BulkAction::Replay,
            selection: Selection::Ids(vec![]),
            snapshot: None,
            as_of_ms: 0,
            cursor: None,
            total,
            done,
            skipped,
            failed,
            state: RunState::Running,
            started_by: "alice".into(),
            started_at: Utc::now(),
            finished_at: None,
            shard: 0,
        }
    }

    #[test]
    fn a_finished_run_accounts_for_every_selected_dead_letter() {
        let mut r = run(10, 6, 1, 1);
        assert!(!r.is_finished());
        r.finish();
        assert!(r.is_finished());
        assert!(r.finished_at.is_some());
        assert_eq!((r.done, r.skipped, r.failed), (6, 3, 1));
        let mut over = run(2, 3, 0, 0);
        over.finish();
        assert_eq!(over.skipped, 0);
    }

    #[test]
    fn a_run_reads_back_what_was_stored() {
        let mut r = run(3, 1, 0, 0);
        r.selection = Selection::Matching {
            filter: DeadLetterFilter {
                tenant: Some("acme".into()),
                class: Some(crate::domain::ReasonClass::TooLong),
                older_than: Some(Duration::from_secs(60)),
                newer_than: None,
            },
            upto: Some("5-0".into()),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"too_long\""), "{json}");
        assert!(json.contains("\"running\""), "{json}");
        assert!(json.contains("\"replay\""), "{json}");
        assert_eq!(serde_json::from_str::<BulkRun>(&json).unwrap(), r);
    }
}
