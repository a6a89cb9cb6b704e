//! Background work: alert delivery, the periodic re-evaluation of budget burn, rollup
//! compaction and the re-assignments contract changes still owe. Every replica on a database
//! runs all four; they share the work through the database (row locks on the outbox, an
//! advisory lock per periodic job and per re-assignment). `mail` is the SMTP client that
//! email is sent through.

pub mod burn_tick;
pub mod channels;
pub mod compaction;
pub mod reassignment;
pub mod webhooks;

/// What one turn of a periodic job did on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Ran,
    /// Another replica holds the job's lock: it is running the job now.
    Locked,
    /// Another replica ran it within the interval.
    NotDue,
}

/// Counts the turn in `taskledger_background_runs_total`, by job and outcome.
fn record_run(job: &'static str, outcome: RunOutcome) {
    let outcome = match outcome {
        RunOutcome::Ran => "ran",
        RunOutcome::Locked => "locked",
        RunOutcome::NotDue => "not_due",
    };
    crate::ledger::instruments::background_run(job, outcome);
}
