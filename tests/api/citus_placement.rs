//! What `taskledger citus distribute` relies on, checked on plain PostgreSQL: every table the
//! migrations make has a place on Citus, and a database without Citus is refused, untouched.

use taskledger::ledger::LedgerError;
use taskledger::ledger::citus::{self, Placement};

use crate::common::TestApp;

#[tokio::test]
async fn every_table_of_the_schema_has_a_place_on_citus() {
    let app = TestApp::spawn().await;
    let mut conn = app.pool.acquire().await.unwrap();
    let tables = taskledger::store::citus::tables(&mut conn).await.unwrap();
    let unplaced: Vec<&String> = tables
        .iter()
        .filter(|table| citus::placement_of(table).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "name these tables in ledger::citus: {unplaced:?}"
    );
    for table in citus::DISTRIBUTED.iter().chain(citus::REFERENCE.iter()) {
        assert!(
            tables.iter().any(|t| t == table),
            "ledger::citus names `{table}`, which the schema does not have"
        );
    }
    // Every distributed table has the column it is sharded by.
    for table in citus::DISTRIBUTED {
        let has: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
             WHERE table_name = $1 AND column_name = 'project_id' AND is_nullable = 'NO')",
        )
        .bind(table)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        assert!(has, "{table} has no NOT NULL project_id");
    }
    assert_eq!(
        citus::placement_of("_sqlx_migrations"),
        Some(Placement::CoordinatorOnly)
    );
}

#[tokio::test]
async fn a_database_without_citus_is_refused() {
    if crate::common::on_citus() {
        return;
    }
    let app = TestApp::spawn().await;
    let error = citus::distribute(&app.pool, None).await.unwrap_err();
    assert!(
        matches!(&error, LedgerError::Conflict(message, _) if message.contains("no citus extension")),
        "{error:?}"
    );
}
