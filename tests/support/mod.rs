//! PostgreSQL for the integration tests and the benchmarks: an embedded cluster, migrated
//! databases on it and tokens to call the service with. Included by `tests/api` and by each
//! benchmark (`#[path = "../tests/support/mod.rs"]`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sqlx::{Connection, PgConnection, PgPool};

use taskledger::db::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use taskledger::domain::access::{Role, generate_secret, hash_secret};

/// Starts the embedded cluster kept in `data_dir`, creating the directory when missing.
pub async fn start_cluster(
    data_dir: &Path,
    options: EmbeddedOptions,
) -> Result<EmbeddedPostgres, EmbeddedError> {
    std::fs::create_dir_all(data_dir).expect("creating the cluster's data dir");
    // Under root PostgreSQL runs as an unprivileged user, who must be able to enter it.
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o711))
        .expect("opening the cluster's data dir to the cluster's user");
    EmbeddedPostgres::start(data_dir, options).await
}

/// Creates database `name` on the server whose databases `url_for` locates, replacing one an
/// earlier run left behind, migrates it and returns a pool of `pool_size` connections to it.
pub async fn create_migrated_database(
    url_for: impl Fn(&str) -> String,
    name: &str,
    pool_size: u32,
) -> PgPool {
    let mut admin = PgConnection::connect(&url_for("postgres"))
        .await
        .expect("connecting to the server's postgres database");
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|error| panic!("dropping database {name}: {error}"));
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|error| panic!("creating database {name}: {error}"));
    admin.close().await.expect("closing the admin connection");
    let pool = taskledger::db::connect(&url_for(name), pool_size)
        .await
        .unwrap_or_else(|error| panic!("connecting to database {name}: {error:#}"));
    taskledger::db::migrate(&pool)
        .await
        .unwrap_or_else(|error| panic!("migrating database {name}: {error:#}"));
    pool
}

/// Stores a token named `name` with `role` over `projects` (every project when empty) and
/// returns its secret.
pub async fn insert_token(pool: &PgPool, name: &str, role: Role, projects: &[String]) -> String {
    let secret = generate_secret();
    let mut conn = pool
        .acquire()
        .await
        .expect("a connection to insert a token with");
    taskledger::store::tokens::insert(&mut conn, name, role, projects, &hash_secret(&secret))
        .await
        .unwrap_or_else(|error| panic!("inserting token {name}: {error}"));
    secret
}
