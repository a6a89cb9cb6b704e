//! The SQL layer: one file per aggregate. The use cases in `ledger` call these functions;
//! nothing else speaks SQL.

pub mod alerts;
pub mod audit;
pub mod bills;
pub mod binder;
pub mod capacity;
pub mod channels;
pub mod citus;
pub mod closes;
pub mod contracts;
pub mod cost;
pub mod dynamic;
pub mod exports;
pub mod fx_rates;
pub mod grid_intensity;
pub mod jobs;
pub mod numeric;
pub mod planning;
pub mod prices;
pub mod projects;
pub mod rating;
pub mod records;
pub mod regressions;
pub mod rightsizing;
pub mod rollups;
pub mod routes;
pub mod settings;
pub mod signin;
pub mod tasks;
pub mod tokens;

use sqlx::{PgPool, Postgres, Transaction};

pub type Pool = PgPool;

/// A read-only transaction on one snapshot, so that the parts of an export or a report agree
/// with each other even while records are being rated.
pub async fn snapshot(pool: &PgPool) -> sqlx::Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Whether `conn` is in a transaction whose statements all read one snapshot (a
/// [`snapshot`], or any `REPEATABLE READ` or `SERIALIZABLE` one), so that what two of its
/// statements read agrees whatever commits between them.
pub async fn in_snapshot(conn: &mut sqlx::PgConnection) -> sqlx::Result<bool> {
    let isolation =
        sqlx::query_scalar!(r#"SELECT current_setting('transaction_isolation') AS "isolation!""#)
            .fetch_one(conn)
            .await?;
    Ok(isolation != "read committed" && isolation != "read uncommitted")
}

/// How long [`snapshot_aside`] waits for a connection when none is idle.
const ASIDE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// When the pool has a connection to spare, a second read-only transaction on the snapshot
/// of `snapshot` (a [`snapshot`]; `pg_export_snapshot`), so that two statements of one report
/// can run at the same time and still see the same data. When no connection comes within
/// [`ASIDE_WAIT`], `None`: the caller runs on its snapshot alone.
///
/// On Citus the snapshot is the coordinator's: on the aside, what the coordinator reads
/// itself (the reference tables) is read as on `snapshot`, but the workers would be read on
/// snapshots of their own. There the aside is for statements of reference tables alone.
pub async fn snapshot_aside(
    pool: &PgPool,
    snapshot: &mut Transaction<'static, Postgres>,
) -> sqlx::Result<Option<Transaction<'static, Postgres>>> {
    let id = sqlx::query_scalar!(r#"SELECT pg_export_snapshot() AS "id!""#)
        .fetch_one(&mut **snapshot)
        .await?;
    let spare = match pool.try_acquire() {
        Some(idle) => idle,
        None => match tokio::time::timeout(ASIDE_WAIT, pool.acquire()).await {
            Ok(acquired) => acquired?,
            Err(_) => return Ok(None),
        },
    };
    // SET TRANSACTION SNAPSHOT takes no parameter; the identifier is the server's own, made of
    // hex digits and dashes.
    if !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(sqlx::Error::Protocol(format!(
            "unexpected snapshot identifier {id:?}"
        )));
    }
    let begin = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
    let mut aside = Transaction::begin(spare, Some(begin.into())).await?;
    // Dynamic: PostgreSQL takes no parameter for the snapshot identifier.
    dynamic::query(&format!("SET TRANSACTION SNAPSHOT '{id}'"))
        .execute(&mut *aside)
        .await?;
    Ok(Some(aside))
}

/// A text column read as the domain value it names (a billing mode, an outcome, a role),
/// failing as a row's `try_from` column does.
pub fn decoded<T>(column: &str, raw: String) -> sqlx::Result<T>
where
    T: TryFrom<String, Error = String>,
{
    T::try_from(raw).map_err(|error| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: error.into(),
    })
}

/// Whether a database error is a violation of the named constraint. On Citus the error comes
/// from a worker's shard, whose constraints carry the shard's id (`pools_owner_project_fkey`
/// is `pools_owner_project_fkey_102026` there), and the coordinator passes on the worker's
/// message without the constraint field, so the name is then read from the message
/// (`… violates foreign key constraint "…"`).
pub fn is_constraint_violation(error: &sqlx::Error, constraint: &str) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    let quoted;
    let named = match db.constraint() {
        Some(named) => named,
        None if db.code().is_some_and(|code| code.starts_with("23")) => {
            let Some(rest) = db.message().split(" constraint \"").nth(1) else {
                return false;
            };
            quoted = rest.split('"').next().unwrap_or_default().to_owned();
            &quoted
        }
        None => return false,
    };
    named == constraint
        || named
            .strip_prefix(constraint)
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|shard| !shard.is_empty() && shard.bytes().all(|b| b.is_ascii_digit()))
}

/// The newest migration applied successfully, if any.
pub async fn applied_migration(pool: &PgPool) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
}

/// Whether a database error means the database cannot be reached (down, restarting, or
/// every connection busy) rather than that a statement failed: worth retrying later.
pub fn is_outage(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)
    )
}
