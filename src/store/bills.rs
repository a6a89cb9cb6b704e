//! Cloud bills: the statements posted, their rows, and the rows that name nodes.

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::bill::{BillRow, Statement};
use crate::domain::billed::{ChargedRun, Run, RunPart};

/// Takes the advisory lock of each statement, in a fixed order, until the transaction ends:
/// whoever stores or replaces a statement holds it.
pub async fn lock_statements(conn: &mut PgConnection, keys: &[Statement]) -> sqlx::Result<()> {
    let mut names: Vec<String> = keys.iter().map(statement_lock_name).collect();
    names.sort_unstable();
    names.dedup();
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('bill statement ' || n, 0)) \
         FROM (SELECT n FROM UNNEST($1::text[]) AS u(n) ORDER BY n) AS s",
        &names,
    )
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
#[derive(Debug, Clone)]
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
    sqlx::query_as!(
        StoredStatement,
        "SELECT s.id, s.provider, s.billing_account, s.billing_period_start, s.bill_id, \
                s.rows_hash \
         FROM UNNEST($1::text[], $2::text[], $3::timestamptz[]) AS k(p, a, b) \
         JOIN bill_statements s \
           ON (s.provider, s.billing_account, s.billing_period_start) = (k.p, k.a, k.b)",
        &providers as &[&str],
        &accounts as &[&str],
        &periods,
    )
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
    sqlx::query!(
        "INSERT INTO bills (id, content_hash, rows) VALUES ($1, $2, $3)",
        id,
        content_hash,
        i32::try_from(rows).unwrap_or(i32::MAX),
    )
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
    sqlx::query!(
        "INSERT INTO bill_statements (id, provider, billing_account, billing_period_start, \
             bill_id, rows_hash, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, now()) \
         ON CONFLICT (id) DO UPDATE SET bill_id = EXCLUDED.bill_id, \
             rows_hash = EXCLUDED.rows_hash, updated_at = EXCLUDED.updated_at",
        id,
        &key.provider,
        &key.billing_account,
        key.billing_period_start,
        bill_id,
        rows_hash,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// What a statement's rows come to, by service, SKU and currency.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    sqlx::query_as!(
        ServiceTotal,
        "SELECT service, sku, currency::text AS \"currency!\", sum(billed_cost) AS \"cost!\" \
         FROM bill_rows WHERE statement_id = $1 \
         GROUP BY service, sku, currency ORDER BY service, sku, currency",
        statement,
    )
    .fetch_all(conn)
    .await
}

/// Deletes a statement's rows.
pub async fn delete_rows(conn: &mut PgConnection, statement: Uuid) -> sqlx::Result<u64> {
    let done = sqlx::query!("DELETE FROM bill_rows WHERE statement_id = $1", statement)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Stores a statement's rows, each with its `(run, period)`.
pub async fn insert_rows(
    conn: &mut PgConnection,
    statement: Uuid,
    rows: &[&BillRow],
    placed: &[Option<(i32, i32)>],
) -> sqlx::Result<()> {
    for (chunk, places) in rows.chunks(5_000).zip(placed.chunks(5_000)) {
        let mut line = Vec::with_capacity(chunk.len());
        let mut category = Vec::with_capacity(chunk.len());
        let mut from = Vec::with_capacity(chunk.len());
        let mut until = Vec::with_capacity(chunk.len());
        let mut cost = Vec::with_capacity(chunk.len());
        let mut currency = Vec::with_capacity(chunk.len());
        let mut resource = Vec::with_capacity(chunk.len());
        let mut run = Vec::with_capacity(chunk.len());
        let mut period = Vec::with_capacity(chunk.len());
        let mut service = Vec::with_capacity(chunk.len());
        let mut sku = Vec::with_capacity(chunk.len());
        let mut region = Vec::with_capacity(chunk.len());
        let mut mode = Vec::with_capacity(chunk.len());
        let mut hours = Vec::with_capacity(chunk.len());
        let mut instance = Vec::with_capacity(chunk.len());
        let mut model = Vec::with_capacity(chunk.len());
        let mut gpus = Vec::with_capacity(chunk.len());
        for (row, place) in chunk.iter().zip(places) {
            line.push(row.line as i64);
            category.push(row.charge_category.as_str());
            from.push(row.charge_from);
            until.push(row.charge_until);
            cost.push(row.billed_cost);
            currency.push(row.currency.as_str());
            resource.push(row.resource_id.as_deref());
            run.push(place.map(|p| p.0));
            period.push(place.map(|p| p.1));
            service.push(row.service.as_str());
            sku.push(row.sku.as_str());
            region.push(row.region.as_deref());
            mode.push(row.billing_mode.as_str());
            hours.push(row.consumed_hours);
            instance.push(row.instance.map(|i| i.name));
            model.push(row.instance.map(|i| i.gpu_model));
            gpus.push(row.instance.map(|i| i.gpus as i32));
        }
        sqlx::query!(
            "INSERT INTO bill_rows (statement_id, line, charge_category, charge_from, \
                 charge_until, billed_cost, currency, resource_id, run, period, \
                 service, sku, region, billing_mode, consumed_hours, instance_type, gpu_model, \
                 gpus) \
             SELECT $1, * FROM UNNEST($2::bigint[], $3::text[], $4::timestamptz[], \
                 $5::timestamptz[], $6::numeric[], $7::text[], $8::text[], $9::int[], \
                 $10::int[], $11::text[], $12::text[], $13::text[], $14::text[], \
                 $15::numeric[], $16::text[], $17::text[], $18::int[])",
            statement,
            &line,
            &category as &[&str],
            &from,
            &until,
            &cost,
            &currency as &[&str],
            &resource as &[Option<&str>],
            &run as &[Option<i32>],
            &period as &[Option<i32>],
            &service as &[&str],
            &sku as &[&str],
            &region as &[Option<&str>],
            &mode as &[&str],
            &hours as &[Option<Decimal>],
            &instance as &[Option<&str>],
            &model as &[Option<&str>],
            &gpus as &[Option<i32>],
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Stores a statement's runs.
pub async fn insert_runs(
    conn: &mut PgConnection,
    statement: Uuid,
    runs: &[Run],
) -> sqlx::Result<()> {
    for chunk in runs.chunks(5_000) {
        let run: Vec<i32> = chunk.iter().map(|r| r.run).collect();
        let key: Vec<&str> = chunk.iter().map(|r| r.keys.0.as_str()).collect();
        let tail: Vec<Option<&str>> = chunk.iter().map(|r| r.keys.1.as_deref()).collect();
        let currency: Vec<&str> = chunk.iter().map(|r| r.currency.as_str()).collect();
        let from: Vec<DateTime<Utc>> = chunk.iter().map(|r| r.from).collect();
        let period: Vec<i64> = chunk
            .iter()
            .map(|r| r.period.num_microseconds().unwrap_or(i64::MAX))
            .collect();
        let periods: Vec<i32> = chunk.iter().map(|r| r.periods).collect();
        let cost: Vec<Decimal> = chunk.iter().map(|r| r.cost_per_period).collect();
        let until: Vec<DateTime<Utc>> = chunk.iter().map(Run::until).collect();
        sqlx::query!(
            "INSERT INTO bill_runs (statement_id, run, resource_key, resource_tail, currency, \
                 charge_from, period_us, periods, cost_per_period, charge_until) \
             SELECT $1, * FROM UNNEST($2::int[], $3::text[], $4::text[], $5::text[], \
                 $6::timestamptz[], $7::bigint[], $8::int[], $9::numeric[], $10::timestamptz[])",
            statement,
            &run,
            &key as &[&str],
            &tail as &[Option<&str>],
            &currency as &[&str],
            &from,
            &period,
            &periods,
            &cost,
            &until,
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Deletes a statement's runs.
pub async fn delete_runs(conn: &mut PgConnection, statement: Uuid) -> sqlx::Result<u64> {
    let done = sqlx::query!("DELETE FROM bill_runs WHERE statement_id = $1", statement)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// The intervals a statement's rows created, as `(node, from, until)`.
pub async fn statement_intervals(
    conn: &mut PgConnection,
    statement: Uuid,
) -> sqlx::Result<Vec<(String, DateTime<Utc>, DateTime<Utc>)>> {
    let rows = sqlx::query!(
        "SELECT node, from_at, until_at FROM capacity_intervals \
         WHERE bill_statement = $1 ORDER BY node, from_at",
        statement,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.node, row.from_at, row.until_at))
        .collect())
}

/// Deletes the intervals a statement's rows created.
pub async fn delete_statement_intervals(
    conn: &mut PgConnection,
    statement: Uuid,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "DELETE FROM capacity_intervals WHERE bill_statement = $1",
        statement,
    )
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
    sqlx::query_scalar!(
        "SELECT DISTINCT k AS \"k!\" FROM capacity_intervals c \
         CROSS JOIN LATERAL UNNEST(c.resource_keys) AS k \
         WHERE c.resource_keys && $1::text[] AND k = ANY($1) \
           AND (c.bill_statement IS NULL OR c.bill_statement <> ALL($2))",
        keys,
        except,
    )
    .fetch_all(conn)
    .await
}

/// A stored run whose resource may name a node.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub statement_id: Uuid,
    pub run: i32,
    pub provider: String,
    pub resource_key: String,
    pub resource_tail: Option<String>,
    pub currency: String,
    pub charge_from: DateTime<Utc>,
    pub period_us: i64,
    pub periods: i32,
    pub cost_per_period: Decimal,
    pub charge_until: DateTime<Utc>,
}

impl RunRow {
    pub fn into_charged(self) -> ChargedRun {
        ChargedRun {
            id: (self.statement_id, self.run),
            provider: self.provider,
            run: Run {
                run: self.run,
                keys: (self.resource_key, self.resource_tail),
                currency: self.currency,
                from: self.charge_from,
                period: TimeDelta::microseconds(self.period_us),
                periods: self.periods,
                cost_per_period: self.cost_per_period,
            },
        }
    }
}

/// `query_as!` of the runs, with their statements' providers, where `$filter` holds (a
/// literal), by statement and run.
macro_rules! select_runs {
    ($filter:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            RunRow,
            "SELECT r.statement_id, r.run, s.provider, r.resource_key, r.resource_tail, \
                    r.currency::text AS \"currency!\", r.charge_from, r.period_us, r.periods, \
                    r.cost_per_period, r.charge_until \
             FROM bill_runs r \
             JOIN bill_statements s ON s.id = r.statement_id \
             WHERE "
                + $filter
                + " ORDER BY r.statement_id, r.run"
            $(, $arg)*
        )
    };
}

/// The runs naming one of `keys` whose periods overlap `[from, to)`.
pub async fn runs_naming(
    conn: &mut PgConnection,
    keys: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<RunRow>> {
    select_runs!(
        "(r.resource_key = ANY($1) OR r.resource_tail = ANY($1)) \
         AND r.charge_from < $3 AND r.charge_until > $2",
        keys,
        from,
        to,
    )
    .fetch_all(conn)
    .await
}

/// The runs of the statements of billing periods starting within `[from, to)` whose
/// resource names a node with an interval overlapping the run: the runs that may price
/// capacity.
pub async fn period_runs_on_nodes(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<RunRow>> {
    select_runs!(
        "s.billing_period_start >= $1 AND s.billing_period_start < $2 \
         AND EXISTS (SELECT 1 FROM capacity_intervals c \
                     WHERE c.resource_keys && \
                           array_remove(ARRAY[r.resource_key, r.resource_tail], NULL) \
                       AND c.from_at < r.charge_until AND c.until_at > r.charge_from)",
        from,
        to,
    )
    .fetch_all(conn)
    .await
}

/// What rows come to, by provider, currency, service and SKU.
#[derive(Debug, Clone)]
pub struct ChargeTotal {
    pub provider: String,
    pub currency: String,
    pub service: String,
    pub sku: String,
    pub rows: i64,
    pub cost: Decimal,
}

/// `query_as!` of [`ChargeTotal`]s from `$from` (a literal naming the bill rows `r` and their
/// statements `s`), then `$rest` (a literal).
macro_rules! select_charge_totals {
    ($from:literal, $rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ChargeTotal,
            "SELECT s.provider, r.currency::text AS \"currency!\", r.service, r.sku, \
                    count(*) AS \"rows!\", sum(r.billed_cost) AS \"cost!\" "
                + $from
                + " GROUP BY s.provider, r.currency, r.service, r.sku"
                + $rest
            $(, $arg)*
        )
    };
}

/// The rows of the statements of billing periods starting within `[from, to)`, summed by
/// provider, currency, service and SKU.
pub async fn period_totals(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ChargeTotal>> {
    select_charge_totals!(
        "FROM bill_rows r JOIN bill_statements s ON s.id = r.statement_id \
         WHERE s.billing_period_start >= $1 AND s.billing_period_start < $2",
        " ORDER BY s.provider, r.currency, r.service, r.sku",
        from,
        to,
    )
    .fetch_all(conn)
    .await
}

/// What the rows of run periods `parts` come to, by provider, currency, service and SKU.
pub async fn part_totals(
    conn: &mut PgConnection,
    parts: &[RunPart],
) -> sqlx::Result<Vec<ChargeTotal>> {
    let statements: Vec<Uuid> = parts.iter().map(|p| p.0.0).collect();
    let runs: Vec<i32> = parts.iter().map(|p| p.0.1).collect();
    let firsts: Vec<i32> = parts.iter().map(|p| p.1).collect();
    let lasts: Vec<i32> = parts.iter().map(|p| p.2).collect();
    select_charge_totals!(
        "FROM UNNEST($1::uuid[], $2::int[], $3::int[], $4::int[]) AS k(st, run, a, b) \
         JOIN bill_rows r \
           ON r.statement_id = k.st AND r.run = k.run AND r.period BETWEEN k.a AND k.b \
         JOIN bill_statements s ON s.id = r.statement_id",
        "",
        &statements,
        &runs,
        &firsts,
        &lasts,
    )
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
    let rows = sqlx::query!(
        "SELECT n.node AS \"node!\", s.hour, s.contract_id AS \"contract_id!\", \
                sum(s.card_seconds / cardinality(d.nodes)) AS \"card_seconds!\" \
         FROM rated_records d \
         CROSS JOIN LATERAL UNNEST(d.nodes) AS n(node) \
         JOIN rated_segments s \
           ON (s.project_id, s.task_id, s.attempt) = (d.project_id, d.task_id, d.attempt) \
         WHERE d.nodes && $1::text[] AND n.node = ANY($1) AND s.contract_id IS NOT NULL \
           AND s.hour >= $2 AND s.hour < $3 \
         GROUP BY n.node, s.hour, s.contract_id",
        nodes,
        from,
        to,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.node, row.hour, row.contract_id, row.card_seconds))
        .collect())
}
