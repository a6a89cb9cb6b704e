//! The application: shared state, the listening server and its graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;
use tokio::net::TcpListener;

/// Server settings every handler may read.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Where days and months begin.
    pub timezone: chrono_tz::Tz,
    /// What "now" is: the system clock, or a fixed instant for reproducible runs.
    pub clock: Clock,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timezone: chrono_tz::UTC,
            clock: Clock::System,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    System,
    Fixed(chrono::DateTime<chrono::Utc>),
}

impl Clock {
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        match self {
            Clock::System => chrono::Utc::now(),
            Clock::Fixed(at) => *at,
        }
    }
}

/// What every handler gets. Everything in it is either immutable or in the database, so any
/// number of replicas can serve the same database.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub metrics: PrometheusHandle,
}

impl AppState {
    pub fn new(pool: PgPool, settings: Settings) -> Self {
        Self {
            pool,
            settings: Arc::new(settings),
            metrics: metrics_handle(),
        }
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

/// A bound, not yet serving, HTTP server. Binding first lets tests use port 0 and read the
/// port back.
pub struct Application {
    listener: TcpListener,
    state: AppState,
}

impl Application {
    pub async fn bind(state: AppState, address: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|error| anyhow::anyhow!("cannot listen on {address}: {error}"))?;
        Ok(Self { listener, state })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish.
    pub async fn serve_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let router = crate::http::app(self.state);
        axum::serve(self.listener, router)
            .with_graceful_shutdown(shutdown)
            .await?;
        Ok(())
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
}
