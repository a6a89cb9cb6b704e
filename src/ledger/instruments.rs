//! The Prometheus metrics the service records: every name with its unit and meaning in one
//! place (`docs/operations.md` lists them, and a test checks that it lists all of them), and
//! the few helpers the use cases, the workers and the HTTP layer record them with.
//!
//! Names follow the Prometheus conventions: a `taskledger_` prefix, base units in the name
//! (`_seconds`), `_total` on counters. Histograms are all in seconds and share one set of
//! buckets (see `http::state`). Gauges about the database (backlogs, the pool) are sampled
//! when `/metrics` is scraped, by [`sample`].

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};
use sqlx::PgPool;

use crate::store;

pub const HTTP_REQUESTS: &str = "taskledger_http_requests_total";
pub const HTTP_REQUEST_DURATION: &str = "taskledger_http_request_duration_seconds";
pub const JOB_RECORDS: &str = "taskledger_job_records_total";
pub const JOB_RECORD_BATCH_DURATION: &str = "taskledger_job_record_batch_duration_seconds";
pub const RATING_DURATION: &str = "taskledger_rating_duration_seconds";
pub const RATED_RECORDS: &str = "taskledger_rated_records_total";
pub const COMPACTION_BACKLOG: &str = "taskledger_rollup_compaction_backlog_rows";
pub const COMPACTION_AGE: &str = "taskledger_rollup_compaction_age_seconds";
pub const COMPACTION_DURATION: &str = "taskledger_rollup_compaction_duration_seconds";
pub const COMPACTED_ROWS: &str = "taskledger_rollup_compacted_rows_total";
pub const OUTBOX_PENDING: &str = "taskledger_alert_outbox_pending";
pub const OUTBOX_OLDEST_AGE: &str = "taskledger_alert_outbox_oldest_pending_age_seconds";
pub const ALERT_DELIVERIES: &str = "taskledger_alert_deliveries_total";
pub const ALERT_DELIVERY_FAILURES: &str = "taskledger_alert_delivery_failures_total";
pub const ALERTS_FIRED: &str = "taskledger_alerts_fired_total";
pub const DB_POOL_CONNECTIONS: &str = "taskledger_db_pool_connections";
pub const DB_POOL_MAX: &str = "taskledger_db_pool_max_connections";
pub const DB_POOL_TIMEOUTS: &str = "taskledger_db_pool_acquire_timeouts_total";
pub const BACKGROUND_RUNS: &str = "taskledger_background_runs_total";
pub const SIGN_INS: &str = "taskledger_sign_ins_total";

/// Every metric: name, unit, kind and help text.
pub const ALL: [Metric; 20] = [
    Metric::counter(
        HTTP_REQUESTS,
        "HTTP requests answered, by route template, method and status",
    ),
    Metric::histogram(
        HTTP_REQUEST_DURATION,
        "Time to answer an HTTP request, by route template, method and status",
    ),
    Metric::counter(
        JOB_RECORDS,
        "Job records received, by result: accepted (stored), duplicate (already stored or \
         repeated), rejected (invalid, of an unknown or forbidden project, or conflicting)",
    ),
    Metric::histogram(
        JOB_RECORD_BATCH_DURATION,
        "Time to store and rate one batch of job records, in its transaction",
    ),
    Metric::histogram(
        RATING_DURATION,
        "Time to (re-)rate records, by cause: ingest, correction, contract, fx",
    ),
    Metric::counter(
        RATED_RECORDS,
        "Job records (re-)rated, by cause: ingest, correction, contract, fx",
    ),
    Metric::gauge(
        COMPACTION_BACKLOG,
        "Rollup delta rows waiting to be compacted, in the whole database",
    ),
    Metric::gauge(
        COMPACTION_AGE,
        "Seconds since this process last saw a compaction pass complete (its own or another \
         replica's)",
    ),
    Metric::histogram(COMPACTION_DURATION, "Time of one rollup compaction pass"),
    Metric::counter(COMPACTED_ROWS, "Rollup delta rows folded by compaction"),
    Metric::gauge(
        OUTBOX_PENDING,
        "Alerts waiting in the outbox to be delivered, in the whole database",
    ),
    Metric::gauge(
        OUTBOX_OLDEST_AGE,
        "Age of the oldest alert waiting in the outbox; 0 when none waits",
    ),
    Metric::counter(
        ALERT_DELIVERIES,
        "Alert delivery attempts, by result: delivered, retry, gave_up",
    ),
    Metric::counter(
        ALERT_DELIVERY_FAILURES,
        "Alert delivery attempts that failed (to be retried or given up)",
    ),
    Metric::counter(
        ALERTS_FIRED,
        "Alerts fired, by kind: actual, forecast (budget), idle_gpu",
    ),
    Metric::gauge(
        DB_POOL_CONNECTIONS,
        "Connections of this process's database pool, by state: in_use, idle",
    ),
    Metric::gauge(
        DB_POOL_MAX,
        "The most connections this process's database pool opens",
    ),
    Metric::counter(
        DB_POOL_TIMEOUTS,
        "Database calls that waited the full acquire timeout for a pool connection and \
         failed (answered 503)",
    ),
    Metric::counter(
        BACKGROUND_RUNS,
        "Turns of this process at a periodic job (compaction, burn_tick), by outcome: ran, \
         locked (another replica was running it), not_due (another replica ran it lately)",
    ),
    Metric::counter(
        SIGN_INS,
        "Sign-ins through the identity provider that came back, by outcome: signed_in, \
         refused (a check failed or no role is mapped), provider_unreachable",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Metric {
    const fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Counter,
            help,
        }
    }

    const fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Gauge,
            help,
        }
    }

    const fn histogram(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Histogram,
            help,
        }
    }

    fn unit(&self) -> Unit {
        if self.name.ends_with("_seconds") {
            Unit::Seconds
        } else {
            Unit::Count
        }
    }
}

/// Gives the installed recorder the help text and unit of every metric.
pub fn describe() {
    for metric in ALL {
        match metric.kind {
            Kind::Counter => describe_counter!(metric.name, metric.unit(), metric.help),
            Kind::Gauge => describe_gauge!(metric.name, metric.unit(), metric.help),
            Kind::Histogram => describe_histogram!(metric.name, metric.unit(), metric.help),
        }
    }
}

/// Counts job records refused for themselves (the rest of a refused batch is neither
/// accepted nor rejected).
pub fn job_records_rejected(records: usize) {
    counter!(JOB_RECORDS, "result" => "rejected").increment(records as u64);
}

/// Times a batch of job records from its creation until it is dropped, however the batch
/// ends.
pub struct BatchTimer(Instant);

impl BatchTimer {
    pub fn start() -> Self {
        Self(Instant::now())
    }
}

impl Drop for BatchTimer {
    fn drop(&mut self) {
        metrics::histogram!(JOB_RECORD_BATCH_DURATION).record(self.0.elapsed());
    }
}

/// Why records are (re-)rated.
#[derive(Debug, Clone, Copy)]
pub enum RatingCause {
    /// Stored for the first time.
    Ingest,
    /// A stored record was corrected.
    Correction,
    /// A contract change moved which contract prices which hours: a page of its
    /// re-assignment.
    Contract,
}

impl RatingCause {
    fn as_str(self) -> &'static str {
        match self {
            RatingCause::Ingest => "ingest",
            RatingCause::Correction => "correction",
            RatingCause::Contract => "contract",
        }
    }
}

/// Times one rating run; [`Rating::finished`] records it with the number of records it
/// rated. A run that fails records nothing.
pub struct Rating {
    cause: RatingCause,
    started: Instant,
}

impl Rating {
    pub fn start(cause: RatingCause) -> Self {
        Self {
            cause,
            started: Instant::now(),
        }
    }

    pub fn finished(self, records: usize) {
        let cause = self.cause.as_str();
        metrics::histogram!(RATING_DURATION, "cause" => cause).record(self.started.elapsed());
        counter!(RATED_RECORDS, "cause" => cause).increment(records as u64);
    }
}

/// When a compaction pass last completed, as seen by this process (Unix milliseconds; the
/// process start until the first pass).
static LAST_COMPACTION_MS: AtomicI64 = AtomicI64::new(0);

fn unix_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Records a compaction pass of this process that folded `rows` delta rows in `took`.
pub fn compaction_done(rows: i64, took: Duration) {
    LAST_COMPACTION_MS.store(unix_ms(), Ordering::Relaxed);
    metrics::histogram!(COMPACTION_DURATION).record(took);
    counter!(COMPACTED_ROWS).increment(u64::try_from(rows).unwrap_or(0));
}

/// Records that another replica held the compaction lock: compaction is being done.
pub fn compaction_done_elsewhere() {
    LAST_COMPACTION_MS.store(unix_ms(), Ordering::Relaxed);
}

/// Records a turn of this process at the periodic `job` and what it came to.
pub fn background_run(job: &'static str, outcome: &'static str) {
    counter!(BACKGROUND_RUNS, "job" => job, "outcome" => outcome).increment(1);
}

/// Starts the compaction age at the process start.
pub fn process_started() {
    let _ = LAST_COMPACTION_MS.compare_exchange(0, unix_ms(), Ordering::Relaxed, Ordering::Relaxed);
}

/// How long a scrape waits for the database's backlogs before it answers without them.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Samples the gauges about the database: the pool of this process, the compaction backlog
/// and the alert outbox of the whole database. When the database does not answer in time,
/// the backlog gauges keep their last values (and the scrape still succeeds).
pub async fn sample(pool: &PgPool) {
    let in_use = pool.size().saturating_sub(pool.num_idle() as u32);
    gauge!(DB_POOL_CONNECTIONS, "state" => "in_use").set(f64::from(in_use));
    gauge!(DB_POOL_CONNECTIONS, "state" => "idle").set(pool.num_idle() as f64);
    gauge!(DB_POOL_MAX).set(f64::from(pool.options().get_max_connections()));
    let last = LAST_COMPACTION_MS.load(Ordering::Relaxed);
    if last > 0 {
        gauge!(COMPACTION_AGE).set((unix_ms() - last).max(0) as f64 / 1000.0);
    }
    let backlogs = async {
        let deltas = store::rollups::delta_rows(pool).await?;
        let outbox = store::alerts::outbox_backlog(pool).await?;
        anyhow::Ok((deltas, outbox))
    };
    match tokio::time::timeout(SAMPLE_TIMEOUT, backlogs).await {
        Ok(Ok((deltas, outbox))) => {
            gauge!(COMPACTION_BACKLOG).set(deltas as f64);
            gauge!(OUTBOX_PENDING).set(outbox.pending as f64);
            gauge!(OUTBOX_OLDEST_AGE).set(outbox.oldest_age_seconds);
        }
        Ok(Err(error)) => tracing::debug!(
            error = format!("{error:#}"),
            "metrics: the database backlogs could not be read"
        ),
        Err(_) => tracing::debug!("metrics: the database backlogs took too long to read"),
    }
}
