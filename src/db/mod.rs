//! Connecting to PostgreSQL (a given server or the embedded cluster) and migrating it.

pub mod embedded;
pub mod supervisor;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::domain::values::redacted_url;
use embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use supervisor::{ClusterStatus, Supervisor};

pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The database of the embedded cluster.
pub const EMBEDDED_DATABASE: &str = "taskledger";

/// How long closing waits for connections still in use to come back.
const POOL_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

pub fn latest_migration_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// An open pool, and the embedded cluster behind it when this process runs one; the cluster is
/// restarted whenever it exits until the database is closed.
pub struct Database {
    pub pool: PgPool,
    embedded: Option<Supervisor>,
}

impl Database {
    /// Opens `database_url`, or else the embedded cluster in `data_dir`. When another
    /// taskledger process runs that cluster, `share_running` says whether to connect to it
    /// (one-off commands) or to refuse (a second `serve`).
    pub async fn open(
        database_url: Option<&str>,
        data_dir: &Path,
        pool_size: u32,
        share_running: bool,
    ) -> anyhow::Result<Self> {
        match database_url {
            Some(url) => Ok(Self {
                pool: connect(url, pool_size).await?,
                embedded: None,
            }),
            None => {
                let options = EmbeddedOptions {
                    durable: true,
                    max_connections: pool_size.max(20) * 2 + 10,
                    ..EmbeddedOptions::default()
                };
                let cluster = match EmbeddedPostgres::start(data_dir, options).await {
                    Ok(cluster) => cluster,
                    Err(EmbeddedError::InUse { pid, .. }) if share_running => {
                        tracing::info!(
                            ?pid,
                            "using the embedded cluster of the running taskledger"
                        );
                        let url = EmbeddedPostgres::url_of_running(data_dir, EMBEDDED_DATABASE)?;
                        return Ok(Self {
                            pool: connect(&url, pool_size).await?,
                            embedded: None,
                        });
                    }
                    Err(error) => return Err(error.into()),
                };
                create_database_if_missing(&cluster.url("postgres"), EMBEDDED_DATABASE).await?;
                let pool = connect(&cluster.url(EMBEDDED_DATABASE), pool_size).await?;
                Ok(Self {
                    pool,
                    embedded: Some(Supervisor::start(cluster)),
                })
            }
        }
    }

    /// The state of the embedded cluster this process runs; `None` for any other database.
    pub fn embedded_status(&self) -> Option<ClusterStatus> {
        self.embedded.as_ref().map(Supervisor::status)
    }

    /// Closes the pool, then stops the embedded cluster cleanly. A connection still in use
    /// after `POOL_CLOSE_TIMEOUT` is left to the cluster's shutdown, which ends its session.
    pub async fn close(self) -> anyhow::Result<()> {
        if tokio::time::timeout(POOL_CLOSE_TIMEOUT, self.pool.close())
            .await
            .is_err()
        {
            tracing::warn!(
                in_use = self.pool.size() - self.pool.num_idle() as u32,
                "database connections still in use at shutdown; closing without them"
            );
        }
        if let Some(supervisor) = self.embedded {
            supervisor.stop().await?;
        }
        Ok(())
    }
}

pub async fn connect(url: &str, pool_size: u32) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(url)
        .context("DATABASE_URL is not a valid PostgreSQL URL")?
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2));
    // One direct attempt first, so that a server that is down or refuses us is reported at
    // once with its cause, instead of as a pool timeout after the acquire timeout.
    let mut first = tokio::time::timeout(FIRST_CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "cannot connect to PostgreSQL at {}: no answer within {} s",
                redacted_url(url),
                FIRST_CONNECT_TIMEOUT.as_secs()
            )
        })?
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redacted_url(url)))?;
    let citus = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') AS "citus!""#
    )
    .fetch_one(&mut first)
    .await
    .context("reading the database's extensions")?;
    first.close().await?;
    // On Citus, a transaction that wrote to many shards (rating a batch of several projects)
    // and then reads them again must reach each worker over the connection it wrote on:
    // with several connections per worker Citus refuses the read ("cannot perform query with
    // placements that were modified over multiple connections"). One connection per worker
    // for the statements that span shards keeps every transaction able to read what it wrote.
    let options = if citus {
        options.options([("citus.multi_shard_modify_mode", "sequential")])
    } else {
        options
    };
    PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        // A connection keeps the buffers its largest message grew to: a rating call's
        // arrays of segments make messages of several MiB, which every connection of the
        // pool would otherwise hold for its whole life.
        .after_release(|connection, _| {
            Box::pin(async move {
                connection.shrink_buffers();
                Ok(true)
            })
        })
        .connect_with(options)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redacted_url(url)))
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR
        .run(pool)
        .await
        .context("applying database migrations failed")
}

pub async fn create_database_if_missing(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let mut connection = PgConnectOptions::from_str(admin_url)?.connect().await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut connection)
            .await?;
    if !exists {
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut connection)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
    }
    Ok(())
}

/// Whether PostgreSQL ended or refused the connection because the server is going down, crashed
/// or is starting up (SQLSTATE class 08, 57P01 to 57P03), as its backends do when their
/// postmaster dies: the same statement can succeed once the server is back.
pub fn is_server_unavailable(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|code| {
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
        })
}

/// How long a request waits for a connection before it answers 503: during an outage every
/// attempt fails at once, and a client is better told so than kept waiting.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the first connection of a start may take before the start fails.
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use crate::domain::values::redacted_url as redact;

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(
            redact("postgres://u:hunter2@db:5432/x"),
            "postgres://u:***@db:5432/x"
        );
        let redacted = redact("postgres://u@db/x?sslmode=require&password=hunter2");
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(redacted.contains("sslmode=require"), "{redacted}");
        assert_eq!(redact("postgres://u@db/x"), "postgres://u@db/x");
        assert!(!redact("not a url hunter2").contains("hunter2"));
    }
}
