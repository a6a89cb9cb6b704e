//! Keeps the embedded cluster running for as long as the service runs.
//!
//! When its postmaster exits on its own (a crash, the OOM killer, `kill -9`), the supervisor
//! reaps it, logs how it ended with the last lines of the PostgreSQL log, and starts the cluster
//! again on the same data dir and socket: at once the first time, then with back-off, for as
//! long as it takes. The pool needs nothing: sqlx drops connections that fail their ping and
//! opens new ones once the server answers again, and until then requests fail as an outage.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::db::embedded::{EmbeddedError, EmbeddedPostgres};

/// How often the postmaster is checked for having exited.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The wait before the second restart attempt; it doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A postmaster that ran this long before it exited starts the back-off afresh; one that exits
/// sooner after a restart continues it, so a crash loop slows down.
const STABLE_RUN: Duration = Duration::from_secs(60);
/// After this many failed restarts in a row the cluster counts as failing: it is unlikely to
/// come back without someone's help.
const FAILING_AFTER_ATTEMPTS: u32 = 5;

/// What the supervisor knows about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterState {
    /// When the postmaster was last found exited, while it is not back.
    pub down_since: Option<DateTime<Utc>>,
    /// Restart attempts that failed since it went down.
    pub failed_restarts: u32,
    /// Successful restarts since the service started.
    pub restarts: u64,
}

impl ClusterState {
    pub fn is_running(&self) -> bool {
        self.down_since.is_none()
    }

    /// Restarting has failed so often in a row that the cluster is unlikely to come back by
    /// itself (the supervisor keeps trying all the same).
    pub fn is_failing(&self) -> bool {
        self.failed_restarts >= FAILING_AFTER_ATTEMPTS
    }
}

/// The cluster's state as the supervisor last saw it; cheap to clone and to read.
#[derive(Debug, Clone)]
pub struct ClusterStatus(watch::Receiver<ClusterState>);

impl ClusterStatus {
    pub fn current(&self) -> ClusterState {
        self.0.borrow().clone()
    }
}

/// Owns the cluster while it runs; [`Supervisor::stop`] stops both.
pub struct Supervisor {
    status: ClusterStatus,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), EmbeddedError>>,
}

impl Supervisor {
    /// Starts watching a running cluster. Needs a tokio runtime.
    pub fn start(cluster: EmbeddedPostgres) -> Self {
        let (state, status) = watch::channel(ClusterState {
            down_since: None,
            failed_restarts: 0,
            restarts: 0,
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(supervise(cluster, state, stopped));
        Self {
            status: ClusterStatus(status),
            stop,
            task,
        }
    }

    pub fn status(&self) -> ClusterStatus {
        self.status.clone()
    }

    /// Stops supervising and stops the cluster. A restart attempt under way is finished
    /// first, so that no postgres it started is left behind.
    pub async fn stop(self) -> Result<(), EmbeddedError> {
        // An error means the task has already ended.
        let _ = self.stop.send(());
        match self.task.await {
            Ok(result) => result,
            Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
        }
    }
}

/// Runs until `stop` fires or its sender is dropped, then stops the cluster.
async fn supervise(
    mut cluster: EmbeddedPostgres,
    state: watch::Sender<ClusterState>,
    mut stop: oneshot::Receiver<()>,
) -> Result<(), EmbeddedError> {
    let mut backoff = Backoff::default();
    let mut up_since = Instant::now();
    loop {
        let exited = tokio::select! {
            _ = &mut stop => None,
            exited = wait_for_exit(&mut cluster) => Some(exited),
        };
        let Some(exited) = exited else {
            return cluster.stop().await;
        };
        let down_since = Utc::now();
        let postgres_log = cluster.log_tail();
        match exited {
            Ok(status) => tracing::error!(
                pid = cluster.pid(),
                %status,
                log = %cluster.log_path().display(),
                %postgres_log,
                "embedded PostgreSQL exited unexpectedly; restarting it"
            ),
            Err(error) => tracing::error!(
                pid = cluster.pid(),
                %error,
                %postgres_log,
                "cannot tell whether embedded PostgreSQL still runs; restarting it"
            ),
        }
        if up_since.elapsed() >= STABLE_RUN {
            backoff = Backoff::default();
        }
        state.send_modify(|state| {
            state.down_since = Some(down_since);
            state.failed_restarts = 0;
        });
        loop {
            let delay = backoff.next_delay();
            if !delay.is_zero() {
                tokio::select! {
                    _ = &mut stop => return cluster.stop().await,
                    () = tokio::time::sleep(delay) => {}
                }
            }
            let (returned, restarted) = cluster.restart().await;
            cluster = returned;
            match restarted {
                Ok(()) => {
                    up_since = Instant::now();
                    let down_for = Utc::now() - down_since;
                    state.send_modify(|state| {
                        state.down_since = None;
                        state.failed_restarts = 0;
                        state.restarts += 1;
                    });
                    tracing::info!(
                        pid = cluster.pid(),
                        down_ms = down_for.num_milliseconds(),
                        restarts = state.borrow().restarts,
                        "embedded PostgreSQL restarted"
                    );
                    break;
                }
                Err(error) => {
                    state.send_modify(|state| state.failed_restarts += 1);
                    let failed_restarts = state.borrow().failed_restarts;
                    tracing::error!(
                        %error,
                        failed_restarts,
                        retry_in_ms = backoff.peek_delay().as_millis(),
                        "could not restart embedded PostgreSQL; will retry"
                    );
                }
            }
        }
    }
}

/// Completes once the postmaster has exited (and is reaped), or once it can no longer be told.
async fn wait_for_exit(cluster: &mut EmbeddedPostgres) -> Result<ExitStatus, EmbeddedError> {
    loop {
        if let Some(status) = cluster.exit_status()? {
            return Ok(status);
        }
        tokio::time::sleep(EXIT_POLL_INTERVAL).await;
    }
}

/// No wait before the first restart, then `FIRST_BACKOFF` doubling up to `MAX_BACKOFF`.
#[derive(Debug, Default)]
struct Backoff {
    attempts: u32,
}

impl Backoff {
    fn peek_delay(&self) -> Duration {
        match self.attempts {
            0 => Duration::ZERO,
            n => FIRST_BACKOFF
                .saturating_mul(1 << (n - 1).min(16))
                .min(MAX_BACKOFF),
        }
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.peek_delay();
        self.attempts = self.attempts.saturating_add(1);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_restarts_at_once_then_doubles_up_to_its_cap() {
        let mut backoff = Backoff::default();
        let delays: Vec<u128> = (0..9).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(
            delays,
            [0, 500, 1000, 2000, 4000, 8000, 10_000, 10_000, 10_000]
        );
        backoff.attempts = u32::MAX;
        assert_eq!(backoff.next_delay(), MAX_BACKOFF);
    }

    #[test]
    fn failing_after_enough_failed_restarts_in_a_row() {
        let mut state = ClusterState {
            down_since: Some(Utc::now()),
            failed_restarts: FAILING_AFTER_ATTEMPTS - 1,
            restarts: 3,
        };
        assert!(!state.is_running());
        assert!(!state.is_failing());
        state.failed_restarts += 1;
        assert!(state.is_failing());
    }
}
