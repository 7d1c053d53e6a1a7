//! A tenant's token budget, as pure decisions: which period an instant falls in, when that
//! period resets, whether a reservation fits, and what settling a reservation does to the
//! period's counters. The Redis side (`stream/budget.rs`, `stream/enqueue_once.lua`) carries
//! these out; the arithmetic is the same there, and tested here.

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};

/// How long a budget lasts before it starts over, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetPeriod {
    Day,
    Month,
}

impl BudgetPeriod {
    /// From the tokens file's `budget_period`.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "day" => Some(Self::Day),
            "month" => Some(Self::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Month => "month",
        }
    }

    /// The period `now` falls in, as it names the period's Redis hash: `2026-12-02` for a
    /// day, `2026-12` for a month. Sorts as the periods do.
    pub fn id(self, now: DateTime<Utc>) -> String {
        match self {
            Self::Day => now.format("%Y-%m-%d").to_string(),
            Self::Month => now.format("%Y-%m").to_string(),
        }
    }

    /// Which kind of period `id` (from [`Self::id`]) names: a day's has the day, a month's
    /// does not.
    pub fn of_id(id: &str) -> Option<Self> {
        match id.len() {
            10 => Some(Self::Day),
            7 => Some(Self::Month),
            _ => None,
        }
    }

    /// When the period `now` falls in ends (the next one starts): the next UTC midnight, or
    /// the first of the next month at UTC midnight.
    pub fn resets_at(self, now: DateTime<Utc>) -> DateTime<Utc> {
        let today = now.date_naive();
        let next = match self {
            Self::Day => today.succ_opt(),
            Self::Month => {
                let (year, month) = if today.month() == 12 {
                    (today.year() + 1, 1)
                } else {
                    (today.year(), today.month() + 1)
                };
                NaiveDate::from_ymd_opt(year, month, 1)
            }
        };
        // Only the last representable day has no successor; its end is as far as time goes.
        next.and_then(|d| d.and_hms_opt(0, 0, 0))
            .map_or(DateTime::<Utc>::MAX_UTC, |t| Utc.from_utc_datetime(&t))
    }

    /// How long the period's hash is kept: the longest such period and a day more, so a job
    /// that finishes just after its period ended still finds the hash to settle against,
    /// and a hash nobody touches again goes away on its own.
    pub fn keep_ms(self) -> u64 {
        const DAY_MS: u64 = 86_400_000;
        match self {
            Self::Day => 2 * DAY_MS,
            Self::Month => 32 * DAY_MS,
        }
    }
}

/// A tenant's budget from the tokens file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Tokens (prompt and completion) the tenant may spend per period.
    pub tokens: u64,
    pub period: BudgetPeriod,
    /// The share of `tokens` spent at which operators are warned (the alert); in (0, 1].
    pub soft_ratio: f64,
}

/// The soft ratio when the tokens file gives none.
pub const DEFAULT_SOFT_RATIO: f64 = 0.8;

/// One period's counters: tokens held by jobs not yet finished, and tokens finished jobs
/// were charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetUse {
    pub reserved: u64,
    pub used: u64,
}

impl Budget {
    /// Whether a job that may cost `cost` tokens fits beside what is already taken. The
    /// check `enqueue_once.lua` makes, atomically with the accept.
    pub fn fits(&self, taken: BudgetUse, cost: u64) -> bool {
        taken
            .reserved
            .saturating_add(taken.used)
            .saturating_add(cost)
            <= self.tokens
    }

    /// Tokens still free in the period (0 when a settle charged more than was reserved).
    pub fn left(&self, taken: BudgetUse) -> u64 {
        self.tokens
            .saturating_sub(taken.reserved.saturating_add(taken.used))
    }

    /// What the gauge `summaryd_tenant_budget_used_ratio` reports: reserved and used over
    /// the budget. Reserved counts, because it cannot be admitted again: the ratio says how
    /// close admission is to refusing, which is what the soft-ratio alert is for.
    pub fn used_ratio(&self, taken: BudgetUse) -> f64 {
        if self.tokens == 0 {
            return 1.0;
        }
        taken.reserved.saturating_add(taken.used) as f64 / self.tokens as f64
    }
}

impl BudgetUse {
    /// The counters after a job's reservation of `reserved` tokens is settled at `spent`
    /// tokens: the reservation is given back and what was spent is charged. `spent` may
    /// exceed `reserved` (a provider that counts more than the estimate); it is charged
    /// all the same, so `used` is what the provider reported.
    pub fn settle(self, reserved: u64, spent: u64) -> BudgetUse {
        BudgetUse {
            reserved: self.reserved.saturating_sub(reserved),
            used: self.used.saturating_add(spent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn periods_are_named_and_reset_in_utc() {
        let rows = [
            // (period, now, id, resets at)
            (
                BudgetPeriod::Day,
                "2026-12-02T19:44:10Z",
                "2026-12-02",
                "2026-12-03T00:00:00Z",
            ),
            (
                BudgetPeriod::Day,
                "2026-12-02T00:00:00Z",
                "2026-12-02",
                "2026-12-03T00:00:00Z",
            ),
            (
                BudgetPeriod::Day,
                "2026-12-02T23:59:59.999Z",
                "2026-12-02",
                "2026-12-03T00:00:00Z",
            ),
            (
                BudgetPeriod::Day,
                "2026-12-31T12:00:00Z",
                "2026-12-31",
                "2027-01-01T00:00:00Z",
            ),
            (
                BudgetPeriod::Day,
                "2028-02-28T12:00:00Z",
                "2028-02-28",
                "2028-02-29T00:00:00Z",
            ),
            // A local time zone never decides: 23:30 at UTC-5 is already tomorrow.
            (
                BudgetPeriod::Day,
                "2026-12-02T23:30:00-05:00",
                "2026-12-03",
                "2026-12-04T00:00:00Z",
            ),
            (
                BudgetPeriod::Month,
                "2026-12-02T19:44:10Z",
                "2026-12",
                "2027-01-01T00:00:00Z",
            ),
            (
                BudgetPeriod::Month,
                "2026-01-31T23:59:59Z",
                "2026-01",
                "2026-02-01T00:00:00Z",
            ),
            (
                BudgetPeriod::Month,
                "2026-02-01T00:00:00Z",
                "2026-02",
                "2026-03-01T00:00:00Z",
            ),
        ];
        for (period, now, id, resets) in rows {
            let now = at(now);
            assert_eq!(period.id(now), id, "{period:?} {now}");
            assert_eq!(period.resets_at(now), at(resets), "{period:?} {now}");
            // The next period has another id, and the instant before the reset this one.
            let reset = period.resets_at(now);
            assert_ne!(period.id(reset), id);
            assert_eq!(period.id(reset - chrono::Duration::milliseconds(1)), id);
            assert_eq!(BudgetPeriod::of_id(id), Some(period));
            assert!(period.keep_ms() > u64::try_from((reset - now).num_milliseconds()).unwrap());
        }
    }

    #[test]
    fn periods_parse_from_the_tokens_file_words_only() {
        assert_eq!(BudgetPeriod::parse("day"), Some(BudgetPeriod::Day));
        assert_eq!(BudgetPeriod::parse("month"), Some(BudgetPeriod::Month));
        for bad in ["", "Day", "week", "daily", " day"] {
            assert_eq!(BudgetPeriod::parse(bad), None, "{bad:?}");
        }
        for bad in ["", "none", "2026", "2026-12-02T00"] {
            assert_eq!(BudgetPeriod::of_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_job_fits_when_reserved_used_and_its_cost_stay_within_the_budget() {
        let budget = Budget {
            tokens: 1_000,
            period: BudgetPeriod::Day,
            soft_ratio: DEFAULT_SOFT_RATIO,
        };
        let taken = |reserved, used| BudgetUse { reserved, used };
        let rows = [
            // (reserved, used, cost, fits, left after)
            (0, 0, 1_000, true, 1_000),
            (0, 0, 1_001, false, 1_000),
            (900, 0, 100, true, 100),
            (900, 0, 101, false, 100),
            (400, 500, 100, true, 100),
            (400, 500, 101, false, 100),
            // A settle that charged more than was reserved: nothing left, nothing fits.
            (0, 1_200, 1, false, 0),
            (0, 1_200, 0, false, 0),
            (u64::MAX, 0, 1, false, 0),
        ];
        for (reserved, used, cost, fits, left) in rows {
            assert_eq!(
                budget.fits(taken(reserved, used), cost),
                fits,
                "{reserved} {used} {cost}"
            );
            assert_eq!(budget.left(taken(reserved, used)), left);
        }
        assert_eq!(budget.used_ratio(taken(300, 500)), 0.8);
        assert_eq!(budget.used_ratio(taken(0, 0)), 0.0);
    }

    #[test]
    fn settling_gives_back_the_reservation_and_charges_what_was_spent() {
        let rows = [
            // (reserved, used, job's reservation, spent, after)
            ((500, 100), 300, 120, (200, 220)),
            ((300, 0), 300, 300, (0, 300)),
            // The provider counted more than the worst case: charged as reported.
            ((300, 0), 300, 350, (0, 350)),
            // A dead letter with nothing reported: only the release.
            ((300, 50), 300, 0, (0, 50)),
            // Never below zero, whatever a hand-edited hash says.
            ((100, 0), 300, 10, (0, 10)),
        ];
        for ((reserved, used), job, spent, (r, u)) in rows {
            let after = BudgetUse { reserved, used }.settle(job, spent);
            assert_eq!(
                after,
                BudgetUse {
                    reserved: r,
                    used: u
                }
            );
        }
        // The 10 jobs of a budget that fits exactly 10 leave room for more once settled.
        let budget = Budget {
            tokens: 10 * 300,
            period: BudgetPeriod::Month,
            soft_ratio: 0.5,
        };
        let full = BudgetUse {
            reserved: 10 * 300,
            used: 0,
        };
        assert!(!budget.fits(full, 300));
        assert!(budget.fits(full.settle(300, 100), 200));
    }
}
