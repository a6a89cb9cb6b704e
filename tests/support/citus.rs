//! Databases on a running Citus cluster (`.ci/citus-cluster start DIR`) for the integration
//! tests and the `cost_query` benchmark. Included by `tests/api` and by the benchmark
//! (`#[path = "../tests/support/citus.rs"]`).

use std::path::Path;

use sqlx::PgPool;

/// Adds database `name` to the running Citus cluster in `cluster` (`.ci/citus-cluster start`
/// makes it on every node, with the extension and the nodes) and returns its URL and a
/// migrated pool of `pool_size` connections. The databases of one process are added one at a
/// time: adding two at once fails on the workers ("tuple concurrently updated").
pub async fn create_migrated_citus_database(
    cluster: &Path,
    name: &str,
    pool_size: u32,
) -> (String, PgPool) {
    static ADDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _adding = ADDING.lock().await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/citus-cluster");
    let output = tokio::process::Command::new(script)
        .arg("start")
        .arg(cluster)
        .arg(name)
        .output()
        .await
        .expect("running .ci/citus-cluster");
    assert!(
        output.status.success(),
        "adding database {name} to the Citus cluster in {}: {}",
        cluster.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let url = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .expect("the cluster script prints the database's URL")
        .to_owned();
    let pool = taskledger::db::connect(&url, pool_size)
        .await
        .unwrap_or_else(|error| panic!("connecting to {name} on Citus: {error:#}"));
    taskledger::db::migrate(&pool)
        .await
        .unwrap_or_else(|error| panic!("migrating {name} on Citus: {error:#}"));
    (url, pool)
}

/// The `postgres` database of each node of the Citus cluster in `cluster`: the coordinator on
/// the base port the cluster script recorded, the workers on the two after it. Citus does
/// not carry `DROP DATABASE` to the workers, so a database is dropped on each of them.
pub fn citus_node_urls(cluster: &Path) -> Vec<String> {
    let base: u16 = std::fs::read_to_string(cluster.join("ports"))
        .expect("the Citus cluster's ports file")
        .trim()
        .parse()
        .expect("the Citus cluster's base port");
    (0..3)
        .map(|i| format!("postgres://postgres@127.0.0.1:{}/postgres", base + i))
        .collect()
}
