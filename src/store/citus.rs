//! Citus' own statements: what is distributed, and making a table a reference table or a
//! table distributed by project. They exist only on a database with the `citus` extension, so
//! the compiler (which checks against a plain PostgreSQL) cannot check them; each names the
//! table it acts on, chosen at run time, and goes through `dynamic`.

use sqlx::PgConnection;

use super::dynamic;

/// Whether the database has the `citus` extension.
pub async fn installed(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS "installed!""#
    )
    .fetch_one(conn)
    .await
}

/// The tables of the public schema.
pub async fn tables(conn: &mut PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT c.relname::text AS "name!" FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
             AND NOT c.relispartition
           ORDER BY 1"#
    )
    .fetch_all(conn)
    .await
}

/// A foreign key between two tables of the public schema.
#[derive(Debug, Clone)]
pub struct ForeignKey {
    pub table: String,
    pub references: String,
    pub name: String,
    pub definition: String,
}

/// The foreign keys of the public schema's tables (not of Citus' shards).
pub async fn foreign_keys(conn: &mut PgConnection) -> sqlx::Result<Vec<ForeignKey>> {
    sqlx::query_as!(
        ForeignKey,
        r#"SELECT t.relname::text AS "table!", r.relname::text AS "references!",
                  k.conname::text AS "name!", pg_get_constraintdef(k.oid) AS "definition!"
           FROM pg_constraint k
           JOIN pg_class t ON t.oid = k.conrelid
           JOIN pg_class r ON r.oid = k.confrelid
           WHERE k.contype = 'f' AND k.connamespace = 'public'::regnamespace
             AND t.relnamespace = 'public'::regnamespace
           ORDER BY 2, 1, 3"#
    )
    .fetch_all(conn)
    .await
}

/// How a table is placed: `h` (hash-distributed), `n` (reference), other Citus methods, or
/// `None` when Citus does not know it yet.
pub async fn placement(conn: &mut PgConnection, table: &str) -> sqlx::Result<Option<String>> {
    // Dynamic: Citus' catalogue, read for a table chosen at run time.
    let sql = format!(
        "SELECT partmethod::text FROM pg_dist_partition WHERE logicalrelid = {}::regclass",
        quote_literal(table)
    );
    dynamic::query_scalar(&sql).fetch_optional(conn).await
}

/// Lets the statements of this transaction distribute tables with triggers (the audit log's
/// append-only trigger) and run one shard at a time, as Citus needs for tables with
/// foreign keys to reference tables made in the same transaction; with `shard_count`, the
/// tables it distributes get that many shards.
pub async fn prepare_transaction(
    conn: &mut PgConnection,
    shard_count: Option<u32>,
) -> sqlx::Result<()> {
    if let Some(count) = shard_count {
        sqlx::query_scalar!(
            "SELECT set_config('citus.shard_count', $1, true)",
            count.to_string()
        )
        .fetch_one(&mut *conn)
        .await?;
    }
    sqlx::query!("SET LOCAL citus.enable_unsafe_triggers TO on")
        .execute(&mut *conn)
        .await?;
    sqlx::query!("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn drop_foreign_key(conn: &mut PgConnection, key: &ForeignKey) -> sqlx::Result<()> {
    // Dynamic: a constraint of a table chosen at run time.
    let sql = format!(
        "ALTER TABLE {} DROP CONSTRAINT {}",
        quote_ident(&key.table),
        quote_ident(&key.name)
    );
    dynamic::query(&sql).execute(conn).await?;
    Ok(())
}

pub async fn add_foreign_key(conn: &mut PgConnection, key: &ForeignKey) -> sqlx::Result<()> {
    // Dynamic: the constraint as PostgreSQL itself wrote its definition.
    let sql = format!(
        "ALTER TABLE {} ADD CONSTRAINT {} {}",
        quote_ident(&key.table),
        quote_ident(&key.name),
        key.definition
    );
    dynamic::query(&sql).execute(conn).await?;
    Ok(())
}

/// Copies `table` to every node.
pub async fn create_reference_table(conn: &mut PgConnection, table: &str) -> sqlx::Result<()> {
    // Dynamic: Citus' function, for a table chosen at run time.
    let sql = format!("SELECT create_reference_table({})", quote_literal(table));
    dynamic::query(&sql).execute(conn).await?;
    Ok(())
}

/// Shards `table` by `project_id`, co-located with `anchor` (or the first of its group when
/// `anchor` is `None`).
pub async fn distribute_by_project(
    conn: &mut PgConnection,
    table: &str,
    anchor: Option<&str>,
) -> sqlx::Result<()> {
    // Dynamic: Citus' function, for a table chosen at run time.
    let sql = format!(
        "SELECT create_distributed_table({}, 'project_id', colocate_with => {})",
        quote_literal(table),
        quote_literal(anchor.unwrap_or("none"))
    );
    dynamic::query(&sql).execute(conn).await?;
    Ok(())
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
