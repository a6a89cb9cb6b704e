//! Cloud bills: the statements posted, their rows, and the rows that name nodes.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::focus_bill::{BillRow, Statement, resource_keys};

/// Takes the advisory lock of each statement, in a fixed order, until the transaction ends:
/// whoever stores or replaces a statement holds it.
pub async fn lock_statements(conn: &mut PgConnection, keys: &[Statement]) -> sqlx::Result<()> {
    let mut names: Vec<String> = keys.iter().map(statement_lock_name).collect();
    names.sort_unstable();
    names.dedup();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('bill statement ' || n, 0)) \
         FROM (SELECT n FROM UNNEST($1::text[]) AS u(n) ORDER BY n) AS s",
    )
    .bind(&names)
    .execute(conn)
    .await?;
    Ok(())
}

fn statement_lock_name(key: &Statement) -> String {
    format!(
        "{}\u{1f}{}\u{1f}{}",
        key.provider,
        key.billing_account,
        key.billing_period_start.timestamp()
    )
}

/// A statement as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredStatement {
    pub id: Uuid,
    pub provider: String,
    pub billing_account: String,
    pub billing_period_start: DateTime<Utc>,
    pub bill_id: Uuid,
    pub rows_hash: Vec<u8>,
}

/// The stored statements among `keys`.
pub async fn statements(
    conn: &mut PgConnection,
    keys: &[Statement],
) -> sqlx::Result<Vec<StoredStatement>> {
    let providers: Vec<&str> = keys.iter().map(|k| k.provider.as_str()).collect();
    let accounts: Vec<&str> = keys.iter().map(|k| k.billing_account.as_str()).collect();
    let periods: Vec<DateTime<Utc>> = keys.iter().map(|k| k.billing_period_start).collect();
    sqlx::query_as::<_, StoredStatement>(
        "SELECT s.id, s.provider, s.billing_account, s.billing_period_start, s.bill_id, \
                s.rows_hash \
         FROM UNNEST($1::text[], $2::text[], $3::timestamptz[]) AS k(p, a, b) \
         JOIN bill_statements s \
           ON (s.provider, s.billing_account, s.billing_period_start) = (k.p, k.a, k.b)",
    )
    .bind(&providers)
    .bind(&accounts)
    .bind(&periods)
    .fetch_all(conn)
    .await
}

/// Records a posted bill.
pub async fn insert_bill(
    conn: &mut PgConnection,
    id: Uuid,
    content_hash: &[u8],
    rows: usize,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO bills (id, content_hash, rows) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(content_hash)
        .bind(i32::try_from(rows).unwrap_or(i32::MAX))
        .execute(conn)
        .await?;
    Ok(())
}

/// Stores a statement (new, or replacing the rows of the stored one under `id`).
pub async fn put_statement(
    conn: &mut PgConnection,
    id: Uuid,
    key: &Statement,
    bill_id: Uuid,
    rows_hash: &[u8],
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO bill_statements (id, provider, billing_account, billing_period_start, \
             bill_id, rows_hash) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (id) DO UPDATE SET bill_id = EXCLUDED.bill_id, \
             rows_hash = EXCLUDED.rows_hash, updated_at = now()",
    )
    .bind(id)
    .bind(&key.provider)
    .bind(&key.billing_account)
    .bind(key.billing_period_start)
    .bind(bill_id)
    .bind(rows_hash)
    .execute(conn)
    .await?;
    Ok(())
}

/// What a statement's rows come to, by service, SKU and currency.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ServiceTotal {
    pub service: String,
    pub sku: String,
    pub currency: String,
    pub cost: Decimal,
}

/// A statement's totals by service, SKU and currency.
pub async fn statement_totals(
    conn: &mut PgConnection,
    statement: Uuid,
) -> sqlx::Result<Vec<ServiceTotal>> {
    sqlx::query_as::<_, ServiceTotal>(
        "SELECT service, sku, currency::text AS currency, sum(billed_cost) AS cost \
         FROM bill_rows WHERE statement_id = $1 \
         GROUP BY service, sku, currency ORDER BY service, sku, currency",
    )
    .bind(statement)
    .fetch_all(conn)
    .await
}

/// Deletes a statement's rows.
pub async fn delete_rows(conn: &mut PgConnection, statement: Uuid) -> sqlx::Result<u64> {
    let done = sqlx::query("DELETE FROM bill_rows WHERE statement_id = $1")
        .bind(statement)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Stores a statement's rows.
pub async fn insert_rows(
    conn: &mut PgConnection,
    statement: Uuid,
    rows: &[&BillRow],
) -> sqlx::Result<()> {
    for chunk in rows.chunks(5_000) {
        let mut line = Vec::with_capacity(chunk.len());
        let mut category = Vec::with_capacity(chunk.len());
        let mut from = Vec::with_capacity(chunk.len());
        let mut until = Vec::with_capacity(chunk.len());
        let mut cost = Vec::with_capacity(chunk.len());
        let mut currency = Vec::with_capacity(chunk.len());
        let mut resource = Vec::with_capacity(chunk.len());
        let mut key = Vec::with_capacity(chunk.len());
        let mut tail = Vec::with_capacity(chunk.len());
        let mut service = Vec::with_capacity(chunk.len());
        let mut sku = Vec::with_capacity(chunk.len());
        let mut region = Vec::with_capacity(chunk.len());
        let mut mode = Vec::with_capacity(chunk.len());
        let mut hours = Vec::with_capacity(chunk.len());
        let mut instance = Vec::with_capacity(chunk.len());
        let mut model = Vec::with_capacity(chunk.len());
        let mut gpus = Vec::with_capacity(chunk.len());
        for row in chunk {
            let keys = row.resource_id.as_deref().map(resource_keys);
            line.push(row.line as i64);
            category.push(row.charge_category.as_str());
            from.push(row.charge_from);
            until.push(row.charge_until);
            cost.push(row.billed_cost);
            currency.push(row.currency.as_str());
            resource.push(row.resource_id.as_deref());
            key.push(keys.as_ref().map(|k| k.0.clone()));
            tail.push(keys.and_then(|k| k.1));
            service.push(row.service.as_str());
            sku.push(row.sku.as_str());
            region.push(row.region.as_deref());
            mode.push(row.billing_mode.as_str());
            hours.push(row.consumed_hours);
            instance.push(row.instance.map(|i| i.name));
            model.push(row.instance.map(|i| i.gpu_model));
            gpus.push(row.instance.map(|i| i.gpus as i32));
        }
        sqlx::query(
            "INSERT INTO bill_rows (statement_id, line, charge_category, charge_from, \
                 charge_until, billed_cost, currency, resource_id, resource_key, resource_tail, \
                 service, sku, region, billing_mode, consumed_hours, instance_type, gpu_model, \
                 gpus) \
             SELECT $1, * FROM UNNEST($2::bigint[], $3::text[], $4::timestamptz[], \
                 $5::timestamptz[], $6::numeric[], $7::text[], $8::text[], $9::text[], \
                 $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], \
                 $15::numeric[], $16::text[], $17::text[], $18::int[])",
        )
        .bind(statement)
        .bind(&line)
        .bind(&category)
        .bind(&from)
        .bind(&until)
        .bind(&cost)
        .bind(&currency)
        .bind(&resource)
        .bind(&key)
        .bind(&tail)
        .bind(&service)
        .bind(&sku)
        .bind(&region)
        .bind(&mode)
        .bind(&hours)
        .bind(&instance)
        .bind(&model)
        .bind(&gpus)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The intervals a statement's rows created, as `(node, from, until)`.
pub async fn statement_intervals(
    conn: &mut PgConnection,
    statement: Uuid,
) -> sqlx::Result<Vec<(String, DateTime<Utc>, DateTime<Utc>)>> {
    sqlx::query_as(
        "SELECT node, from_at, until_at FROM capacity_intervals \
         WHERE bill_statement = $1 ORDER BY node, from_at",
    )
    .bind(statement)
    .fetch_all(conn)
    .await
}

/// Deletes the intervals a statement's rows created.
pub async fn delete_statement_intervals(
    conn: &mut PgConnection,
    statement: Uuid,
) -> sqlx::Result<u64> {
    let done = sqlx::query("DELETE FROM capacity_intervals WHERE bill_statement = $1")
        .bind(statement)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Which of `keys` name a node some interval knows (created by no bill, or by a statement
/// other than `except`).
pub async fn known_keys(
    conn: &mut PgConnection,
    keys: &[String],
    except: &[Uuid],
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT DISTINCT k FROM capacity_intervals c \
         CROSS JOIN LATERAL UNNEST(c.resource_keys) AS k \
         WHERE c.resource_keys && $1::text[] AND k = ANY($1) \
           AND (c.bill_statement IS NULL OR c.bill_statement <> ALL($2))",
    )
    .bind(keys)
    .bind(except)
    .fetch_all(conn)
    .await
}

/// A stored row whose resource may name a node.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NodeRow {
    pub statement_id: Uuid,
    pub line: i64,
    pub provider: String,
    pub charge_from: DateTime<Utc>,
    pub charge_until: DateTime<Utc>,
    pub billed_cost: Decimal,
    pub currency: String,
    pub resource_key: String,
    pub resource_tail: Option<String>,
}

const NODE_ROW_COLUMNS: &str = "r.statement_id, r.line, s.provider, r.charge_from, \
    r.charge_until, r.billed_cost, r.currency::text AS currency, r.resource_key, r.resource_tail";

/// The rows naming one of `keys` whose charge period overlaps `[from, to)`.
pub async fn rows_naming(
    conn: &mut PgConnection,
    keys: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<NodeRow>> {
    sqlx::query_as::<_, NodeRow>(&format!(
        "SELECT {NODE_ROW_COLUMNS} FROM bill_rows r \
         JOIN bill_statements s ON s.id = r.statement_id \
         WHERE (r.resource_key = ANY($1) OR r.resource_tail = ANY($1)) \
           AND r.charge_from < $3 AND r.charge_until > $2 \
         ORDER BY r.charge_from, r.statement_id, r.line"
    ))
    .bind(keys)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// The rows of the statements of billing periods starting within `[from, to)` whose
/// resource names a node with an interval overlapping the row's charge period: the rows
/// that may price capacity.
pub async fn period_rows_on_nodes(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<NodeRow>> {
    sqlx::query_as::<_, NodeRow>(&format!(
        "SELECT {NODE_ROW_COLUMNS} FROM bill_rows r \
         JOIN bill_statements s ON s.id = r.statement_id \
         WHERE s.billing_period_start >= $1 AND s.billing_period_start < $2 \
           AND r.resource_key IS NOT NULL \
           AND EXISTS (SELECT 1 FROM capacity_intervals c \
                       WHERE c.resource_keys && \
                             array_remove(ARRAY[r.resource_key, r.resource_tail], NULL) \
                         AND c.from_at < r.charge_until AND c.until_at > r.charge_from) \
         ORDER BY r.charge_from, r.statement_id, r.line"
    ))
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// What rows come to, by provider, currency, service and SKU.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ChargeTotal {
    pub provider: String,
    pub currency: String,
    pub service: String,
    pub sku: String,
    pub rows: i64,
    pub cost: Decimal,
}

/// The rows of the statements of billing periods starting within `[from, to)`, summed by
/// provider, currency, service and SKU.
pub async fn period_totals(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ChargeTotal>> {
    sqlx::query_as::<_, ChargeTotal>(
        "SELECT s.provider, r.currency::text AS currency, r.service, r.sku, \
                count(*) AS rows, sum(r.billed_cost) AS cost \
         FROM bill_rows r JOIN bill_statements s ON s.id = r.statement_id \
         WHERE s.billing_period_start >= $1 AND s.billing_period_start < $2 \
         GROUP BY s.provider, r.currency, r.service, r.sku \
         ORDER BY s.provider, r.currency, r.service, r.sku",
    )
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// A row, with the statement it is of, for matching to the rows it moved.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ServiceOfRow {
    pub statement_id: Uuid,
    pub line: i64,
    pub service: String,
    pub sku: String,
}

/// Service and SKU of rows, by `(statement, line)`.
pub async fn services_of(
    conn: &mut PgConnection,
    rows: &[(Uuid, i64)],
) -> sqlx::Result<Vec<ServiceOfRow>> {
    let statements: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
    let lines: Vec<i64> = rows.iter().map(|r| r.1).collect();
    sqlx::query_as::<_, ServiceOfRow>(
        "SELECT r.statement_id, r.line, r.service, r.sku \
         FROM UNNEST($1::uuid[], $2::bigint[]) AS k(s, l) \
         JOIN bill_rows r ON (r.statement_id, r.line) = (k.s, k.l)",
    )
    .bind(&statements)
    .bind(&lines)
    .fetch_all(conn)
    .await
}

/// The held GPU-seconds records put on `nodes` by ledger hour within `[from, to)`, by the
/// contract that rated them: `(node, hour, contract, month, card-seconds)`; records
/// rated by no contract are left out.
pub async fn contract_use_on_nodes(
    conn: &mut PgConnection,
    nodes: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<(String, DateTime<Utc>, Uuid, Decimal)>> {
    sqlx::query_as(
        "SELECT n.node, s.hour, s.contract_id, \
                sum(s.card_seconds / cardinality(d.nodes)) AS card_seconds \
         FROM rated_records d \
         CROSS JOIN LATERAL UNNEST(d.nodes) AS n(node) \
         JOIN rated_segments s \
           ON (s.project_id, s.task_id, s.attempt) = (d.project_id, d.task_id, d.attempt) \
         WHERE d.nodes && $1::text[] AND n.node = ANY($1) AND s.contract_id IS NOT NULL \
           AND s.hour >= $2 AND s.hour < $3 \
         GROUP BY n.node, s.hour, s.contract_id",
    )
    .bind(nodes)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}
