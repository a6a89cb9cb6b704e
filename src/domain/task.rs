//! How a task's attempts count it once, what state it is in, and what it cost in a period
//! (COST_MODEL.md §4, §7).
//!
//! A task counts as completed in the period holding the end of its first completed attempt;
//! a task none of whose attempts completed counts as failed where its last attempt ended.
//! Exactly one attempt carries the mark, so a task is never counted twice, whatever order
//! its attempts arrive in.
//!
//! A task's figures of a period ([`TaskFigures`]) are sums over the rated segments and
//! attempts of that task inside the period; like [`super::figures::FigureSums`] they only
//! add, so the figures of a task over any partition of a period merge into those of the
//! whole, and the tasks of a project add up to the project's figures less its unused
//! commitment, which belongs to no task.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::rating::Outcome;

/// What the rules need of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptEnd {
    pub attempt: i32,
    pub outcome: Outcome,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
}

/// The attempt that completes the task, or else the one that fails it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskMarks {
    pub completes: Option<i32>,
    pub fails: Option<i32>,
}

/// The marks of a task with these attempts; ties in `ended_at` go to the lower attempt
/// number for completion and to the higher for failure, so the result never depends on the
/// order of `attempts`.
pub fn task_marks(attempts: &[AttemptEnd]) -> TaskMarks {
    let completes = attempts
        .iter()
        .filter(|a| a.outcome == Outcome::Completed)
        .min_by_key(|a| (a.ended_at, a.attempt))
        .map(|a| a.attempt);
    let fails = match completes {
        Some(_) => None,
        None => attempts
            .iter()
            .max_by_key(|a| (a.ended_at, a.attempt))
            .map(|a| a.attempt),
    };
    TaskMarks { completes, fails }
}

/// Where a task stands after the attempts it has so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStatus {
    /// `Completed` once any attempt completed; otherwise the outcome of the latest attempt
    /// by `started_at` (the higher attempt number on a tie).
    pub status: Outcome,
    /// The end of the attempt that completes the task (see [`task_marks`]).
    pub completed_at: Option<DateTime<Utc>>,
    pub first_started_at: DateTime<Utc>,
    pub last_ended_at: DateTime<Utc>,
}

/// The status of a task with these attempts; `None` when it has none. Like [`task_marks`],
/// it never depends on the order of `attempts`.
pub fn task_status(attempts: &[AttemptEnd]) -> Option<TaskStatus> {
    let latest = attempts.iter().max_by_key(|a| (a.started_at, a.attempt))?;
    let completes = task_marks(attempts).completes;
    let completed_at = attempts
        .iter()
        .find(|a| Some(a.attempt) == completes)
        .map(|a| a.ended_at);
    Some(TaskStatus {
        status: match completed_at {
            Some(_) => Outcome::Completed,
            None => latest.outcome,
        },
        completed_at,
        first_started_at: attempts.iter().map(|a| a.started_at).min()?,
        last_ended_at: attempts.iter().map(|a| a.ended_at).max()?,
    })
}

/// A task's sums over a period: its segments inside it, and its attempts that ended in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFigures {
    /// Cost of the task's completed records × busy/held.
    pub productive: Decimal,
    pub idle: Decimal,
    pub unmeasured: Decimal,
    /// Whole cost of its failed, cancelled and preempted records.
    pub failed: Decimal,
    pub gpu_seconds_held: Decimal,
    /// Busy time of the records that measured it.
    pub gpu_seconds_busy: Decimal,
    /// GPU-seconds that carry no cost for want of a contract or an FX rate.
    pub unrated_gpu_seconds: Decimal,
    /// Output of its completed records, unit → quantity, booked where each record ends.
    pub output: BTreeMap<String, Decimal>,
    /// Attempts that ended in the period, and those of them that did not complete.
    pub attempts: i64,
    pub failed_attempts: i64,
    pub retries: i64,
    pub failures: i64,
    /// `started_at − queued_at` summed over the `queue_waits` attempts, of those that ended
    /// in the period, that reported `queued_at`.
    pub queue_wait_seconds: Decimal,
    pub queue_waits: i64,
}

impl TaskFigures {
    /// productive + idle + unmeasured + failed: a task carries no unused commitment.
    pub fn total(&self) -> Decimal {
        self.productive + self.idle + self.unmeasured + self.failed
    }

    /// idle + failed: what the task paid for that did no useful work.
    pub fn waste(&self) -> Decimal {
        self.idle + self.failed
    }

    /// Adds the figures of another part of the period.
    pub fn merge(&mut self, other: &TaskFigures) {
        self.productive += other.productive;
        self.idle += other.idle;
        self.unmeasured += other.unmeasured;
        self.failed += other.failed;
        self.gpu_seconds_held += other.gpu_seconds_held;
        self.gpu_seconds_busy += other.gpu_seconds_busy;
        self.unrated_gpu_seconds += other.unrated_gpu_seconds;
        for (unit, quantity) in &other.output {
            *self.output.entry(unit.clone()).or_default() += quantity;
        }
        self.output.retain(|_, quantity| !quantity.is_zero());
        self.attempts += other.attempts;
        self.failed_attempts += other.failed_attempts;
        self.retries += other.retries;
        self.failures += other.failures;
        self.queue_wait_seconds += other.queue_wait_seconds;
        self.queue_waits += other.queue_waits;
    }
}

/// What a task costs per unit of its output: `final_cost / quantity` when the task produced
/// a positive quantity of exactly one unit; `None` otherwise, since a cost spread over two
/// units has no single price per unit.
pub fn cost_per_unit(final_cost: Decimal, output: &BTreeMap<String, Decimal>) -> Option<Decimal> {
    match output.values().collect::<Vec<_>>().as_slice() {
        [quantity] if quantity.is_sign_positive() => final_cost.checked_div(**quantity),
        _ => None,
    }
}

/// What a list of tasks is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskSort {
    /// The period's total.
    Cost,
    /// The period's idle + failed.
    Waste,
    /// The period's GPU-seconds held.
    GpuHours,
    /// The period's queue wait.
    QueueWait,
    /// When the task's first attempt started.
    StartedAt,
}

impl TaskSort {
    pub const ALL: [TaskSort; 5] = [
        TaskSort::Cost,
        TaskSort::Waste,
        TaskSort::GpuHours,
        TaskSort::QueueWait,
        TaskSort::StartedAt,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            TaskSort::Cost => "cost",
            TaskSort::Waste => "waste",
            TaskSort::GpuHours => "gpu_hours",
            TaskSort::QueueWait => "queue_wait",
            TaskSort::StartedAt => "started_at",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        TaskSort::ALL
            .into_iter()
            .find(|sort| sort.as_str() == raw)
            .ok_or_else(|| {
                let names: Vec<&str> = TaskSort::ALL.iter().map(TaskSort::as_str).collect();
                format!("`{raw}` is not a sort: use one of {}", names.join(", "))
            })
    }
}

/// The direction of a sorted list. Ties are broken by task id, ascending in a descending
/// list, so that an ascending list is exactly the descending one reversed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    Desc,
    Asc,
}

impl SortOrder {
    pub fn as_str(&self) -> &'static str {
        match self {
            SortOrder::Desc => "desc",
            SortOrder::Asc => "asc",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "desc" => Ok(SortOrder::Desc),
            "asc" => Ok(SortOrder::Asc),
            other => Err(format!("`{other}` is not an order: use desc or asc")),
        }
    }
}

/// Which tasks a list shows. A task matches `labels` when one of its attempts carries every
/// one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub status: Option<Outcome>,
    pub gpu_model: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// Where a task stands in a sorted list: the exact value sorted by, as text, and its id for
/// ties. A page continues after the keyset of the previous page's last task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskKeyset {
    pub value: String,
    pub task_id: String,
}

/// The longest sort value a keyset may carry: far more digits than any figure has.
const KEYSET_VALUE_MAX_LEN: usize = 200;

impl TaskKeyset {
    /// Whether `value` is what a list writes: a finite decimal number in plain notation
    /// (`-12.5`, `0`, `3600.000001`), never `NaN`, an infinity, an exponent, a hexadecimal
    /// number or digits with separators, which a cursor altered by hand could carry.
    pub fn value_is_a_number(&self) -> bool {
        let digits = self.value.strip_prefix('-').unwrap_or(&self.value);
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, "0"));
        let all_digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        self.value.len() <= KEYSET_VALUE_MAX_LEN && all_digits(whole) && all_digits(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    #[test]
    fn a_keyset_carries_a_plain_finite_decimal() {
        let keyset = |value: &str| TaskKeyset {
            value: value.to_owned(),
            task_id: "t1".to_owned(),
        };
        for good in [
            "0",
            "-12.5",
            "3600.000001",
            "1774915200",
            "0.33333333333333333333",
        ] {
            assert!(keyset(good).value_is_a_number(), "{good}");
        }
        let too_long = "9".repeat(KEYSET_VALUE_MAX_LEN + 1);
        for bad in [
            "abc",
            "",
            "0x10",
            "1_000",
            "NaN",
            "inf",
            "-Infinity",
            "1e400",
            "1.",
            ".5",
            "-",
            "+1",
            " 1",
            "1 ",
            "１",
            &too_long,
        ] {
            assert!(!keyset(bad).value_is_a_number(), "{bad:?}");
        }
    }

    fn attempts() -> impl Strategy<Value = Vec<AttemptEnd>> {
        prop::collection::vec(
            (
                prop_oneof![
                    Just(Outcome::Completed),
                    Just(Outcome::Failed),
                    Just(Outcome::Cancelled),
                    Just(Outcome::Preempted),
                ],
                0i64..50,
            ),
            0..8,
        )
        .prop_map(|ends| {
            ends.into_iter()
                .enumerate()
                .map(|(i, (outcome, hour))| AttemptEnd {
                    attempt: i as i32 + 1,
                    outcome,
                    started_at: Utc.timestamp_opt(1_789_990_000 + hour * 3600, 0).unwrap(),
                    ended_at: Utc.timestamp_opt(1_790_000_000 + hour * 3600, 0).unwrap(),
                })
                .collect()
        })
        .prop_shuffle()
    }

    fn task_figures() -> impl Strategy<Value = TaskFigures> {
        let amount =
            || (-10_000_000i64..10_000_000, 0u32..20).prop_map(|(m, s)| Decimal::new(m, s));
        (
            (
                amount(),
                amount(),
                amount(),
                amount(),
                amount(),
                amount(),
                amount(),
            ),
            prop::collection::btree_map(
                prop_oneof![Just("tokens"), Just("samples")],
                amount(),
                0..2,
            ),
            (0i64..5, 0i64..5, 0i64..5, 0i64..5, amount(), 0i64..5),
        )
            .prop_map(|(money, output, counts)| TaskFigures {
                productive: money.0,
                idle: money.1,
                unmeasured: money.2,
                failed: money.3,
                gpu_seconds_held: money.4,
                gpu_seconds_busy: money.5,
                unrated_gpu_seconds: money.6,
                output: output
                    .into_iter()
                    .filter(|(_, quantity)| !quantity.is_zero())
                    .map(|(unit, quantity)| (unit.to_owned(), quantity))
                    .collect(),
                attempts: counts.0,
                failed_attempts: counts.1,
                retries: counts.2,
                failures: counts.3,
                queue_wait_seconds: counts.4,
                queue_waits: counts.5,
            })
    }

    fn dec(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    #[test]
    fn cost_per_unit_needs_one_unit_with_output() {
        let output = |pairs: &[(&str, &str)]| -> BTreeMap<String, Decimal> {
            pairs.iter().map(|(u, q)| (u.to_string(), dec(q))).collect()
        };
        assert_eq!(
            cost_per_unit(dec("33.60"), &output(&[("tokens", "1000000")])),
            Some(dec("0.0000336"))
        );
        assert_eq!(cost_per_unit(dec("33.60"), &output(&[])), None);
        assert_eq!(
            cost_per_unit(dec("33.60"), &output(&[("tokens", "0")])),
            None
        );
        assert_eq!(
            cost_per_unit(dec("10"), &output(&[("tokens", "5"), ("samples", "2")])),
            None
        );
    }

    #[test]
    fn sorts_and_orders_parse_back_from_their_names() {
        for sort in TaskSort::ALL {
            assert_eq!(TaskSort::parse(sort.as_str()), Ok(sort));
        }
        for order in [SortOrder::Desc, SortOrder::Asc] {
            assert_eq!(SortOrder::parse(order.as_str()), Ok(order));
        }
        assert!(TaskSort::parse("price").unwrap_err().contains("queue_wait"));
        assert!(SortOrder::parse("up").is_err());
    }

    proptest! {
        /// A task with attempts is counted exactly once: completed if any attempt completed,
        /// failed otherwise.
        #[test]
        fn a_task_counts_once(attempts in attempts()) {
            let marks = task_marks(&attempts);
            let any_completed = attempts.iter().any(|a| a.outcome == Outcome::Completed);
            prop_assert_eq!(marks.completes.is_some(), any_completed);
            prop_assert_eq!(marks.fails.is_some(), !any_completed && !attempts.is_empty());
        }

        /// The completing attempt completed, and no completed attempt ended before it; the
        /// failing one ended last.
        #[test]
        fn the_mark_goes_to_the_first_completion_or_the_last_end(attempts in attempts()) {
            let marks = task_marks(&attempts);
            let find = |n: i32| attempts.iter().find(|a| a.attempt == n).copied();
            if let Some(n) = marks.completes {
                let marked = find(n).expect("the mark names one of the attempts");
                prop_assert_eq!(marked.outcome, Outcome::Completed);
                prop_assert!(attempts.iter().all(|a| a.outcome != Outcome::Completed
                    || a.ended_at >= marked.ended_at));
            }
            if let Some(n) = marks.fails {
                let marked = find(n).expect("the mark names one of the attempts");
                prop_assert!(attempts.iter().all(|a| a.ended_at <= marked.ended_at));
            }
        }

        /// The order in which attempts arrive never changes the marks.
        #[test]
        fn order_does_not_matter(attempts in attempts()) {
            let mut reversed = attempts.clone();
            reversed.reverse();
            prop_assert_eq!(task_marks(&attempts), task_marks(&reversed));
        }

        /// A task is completed exactly when one of its attempts completed, at the end of the
        /// attempt that completes it; otherwise it has the outcome of its latest start.
        #[test]
        fn status_follows_the_first_completion_or_the_latest_start(attempts in attempts()) {
            let status = task_status(&attempts);
            prop_assert_eq!(status.is_none(), attempts.is_empty());
            let Some(status) = status else { return Ok(()) };
            let marks = task_marks(&attempts);
            let completing = attempts.iter().find(|a| Some(a.attempt) == marks.completes);
            prop_assert_eq!(status.completed_at, completing.map(|a| a.ended_at));
            prop_assert_eq!(status.status == Outcome::Completed, completing.is_some());
            if completing.is_none() {
                let latest = attempts.iter().map(|a| a.started_at).max();
                prop_assert!(attempts.iter().any(|a| Some(a.started_at) == latest
                    && a.outcome == status.status));
            }
            prop_assert!(attempts.iter().all(|a| status.first_started_at <= a.started_at
                && a.ended_at <= status.last_ended_at));
            let mut reversed = attempts.clone();
            reversed.reverse();
            prop_assert_eq!(task_status(&reversed), Some(status));
        }

        /// Merging the figures of the parts of a period, in any order, gives the same
        /// figures, and the total of the merge is the sum of the parts' totals.
        #[test]
        fn parts_of_a_period_merge_exactly(parts in prop::collection::vec(task_figures(), 0..6)) {
            let mut forward = TaskFigures::default();
            parts.iter().for_each(|part| forward.merge(part));
            let mut backward = TaskFigures::default();
            parts.iter().rev().for_each(|part| backward.merge(part));
            prop_assert_eq!(&forward, &backward);
            prop_assert_eq!(forward.total(), parts.iter().map(TaskFigures::total).sum::<Decimal>());
            prop_assert_eq!(forward.total(),
                forward.productive + forward.idle + forward.unmeasured + forward.failed);
            prop_assert!(forward.output.values().all(|quantity| !quantity.is_zero()));
        }
    }
}
