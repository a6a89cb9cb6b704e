//! How a task's attempts count it once (COST_MODEL.md §4, §7).
//!
//! A task counts as completed in the period holding the end of its first completed attempt;
//! a task none of whose attempts completed counts as failed where its last attempt ended.
//! Exactly one attempt carries the mark, so a task is never counted twice, whatever order
//! its attempts arrive in.

use chrono::{DateTime, Utc};

use super::rating::Outcome;

/// What the rule needs of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptEnd {
    pub attempt: i32,
    pub outcome: Outcome,
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

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
                    ended_at: Utc.timestamp_opt(1_790_000_000 + hour * 3600, 0).unwrap(),
                })
                .collect()
        })
        .prop_shuffle()
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
    }
}
