//! What every handler gets: the pool, the settings and the metrics recorder.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;

use crate::config::Settings;
use crate::ledger::instruments;
use crate::ledger::notify::Notifier;
use crate::ledger::setup::ClusterStatus;
use crate::ledger::signin::SignIn;

/// Everything in it is either immutable, in the database, or about this process's own embedded
/// cluster, so any number of replicas can serve the same database.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub metrics: PrometheusHandle,
    /// The embedded cluster this process runs, if it runs one.
    pub embedded_database: Option<ClusterStatus>,
    /// How a channel's test message leaves.
    pub notifier: Arc<Notifier>,
    /// Sign-in through the organisation's identity provider, when it is configured.
    pub signin: Option<Arc<SignIn>>,
}

impl AppState {
    pub fn new(pool: PgPool, settings: Settings) -> Self {
        Self {
            pool,
            settings: Arc::new(settings),
            metrics: metrics_handle(),
            embedded_database: None,
            notifier: Arc::new(Notifier::unconfigured()),
            signin: None,
        }
    }

    /// Channels' test messages leave through `notifier` (its mail server and public URL).
    pub fn with_notifier(mut self, notifier: Arc<Notifier>) -> Self {
        self.notifier = notifier;
        self
    }

    /// People sign in through `signin` as well as with tokens.
    pub fn with_signin(mut self, signin: Option<Arc<SignIn>>) -> Self {
        self.signin = signin;
        self
    }

    /// Health and readiness report on the embedded cluster behind the pool.
    pub fn with_embedded_database(mut self, status: Option<ClusterStatus>) -> Self {
        self.embedded_database = status;
        self
    }
}

/// The buckets of every histogram, all in seconds: from a fast request to a large re-rating.
const BUCKETS_SECONDS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// How often histogram samples are folded into their buckets between scrapes, so that they
/// never pile up in memory when nothing scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The process-wide Prometheus recorder, installed on first use.
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&BUCKETS_SECONDS)
                .expect("the bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. by an embedding program); the
            // handle then renders only what this one records, which is still correct.
            if metrics::set_global_recorder(recorder).is_ok() {
                instruments::describe();
            }
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".to_owned())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_INTERVAL);
                        upkeep.run_upkeep();
                    }
                })
                .expect("starting the metrics upkeep thread");
            handle
        })
        .clone()
}
