//! What every handler gets: the pool, the settings and the metrics recorder.

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;

use crate::config::Settings;
use crate::db::supervisor::ClusterStatus;

/// Everything in it is either immutable, in the database, or about this process's own embedded
/// cluster, so any number of replicas can serve the same database.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub metrics: PrometheusHandle,
    /// The embedded cluster this process runs, if it runs one.
    pub embedded_database: Option<ClusterStatus>,
}

impl AppState {
    pub fn new(pool: PgPool, settings: Settings) -> Self {
        Self {
            pool,
            settings: Arc::new(settings),
            metrics: metrics_handle(),
            embedded_database: None,
        }
    }

    /// Health and readiness report on the embedded cluster behind the pool.
    pub fn with_embedded_database(mut self, status: Option<ClusterStatus>) -> Self {
        self.embedded_database = status;
        self
    }
}

/// The process-wide Prometheus recorder, installed on first use.
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. by an embedding program); the
            // handle then renders only what this one records, which is still correct.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}
