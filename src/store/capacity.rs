//! Pools, the capacity intervals of their nodes, and what records ran on those nodes.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Execute, Executor, FromRow, PgConnection, Postgres};

use crate::domain::capacity::{
    CapacityInterval, JobSpan, NodeDayUse, NodeState, NodeUse, PoolSettings, ShareIdle,
    UnmatchedDay,
};
use crate::domain::capacity_plan::{Detail, RollupSums};
use crate::domain::rating::BillingMode;
use crate::store::dynamic;
use uuid::Uuid;

/// The foreign key from a pool to its owner project.
pub const OWNER_CONSTRAINT: &str = "pools_owner_project_fkey";

#[derive(Debug, Clone)]
pub struct PoolRow {
    pub id: String,
    pub name: String,
    pub owner_project: Option<String>,
    pub share_idle: ShareIdle,
    pub zombie_after_minutes: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A pool as stored, its idle share rule not yet parsed.
struct PoolRecord {
    id: String,
    name: String,
    owner_project: Option<String>,
    share_idle: String,
    zombie_after_minutes: Option<i32>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<PoolRecord> for PoolRow {
    type Error = sqlx::Error;

    fn try_from(record: PoolRecord) -> sqlx::Result<Self> {
        Ok(PoolRow {
            id: record.id,
            name: record.name,
            owner_project: record.owner_project,
            share_idle: super::decoded("share_idle", record.share_idle)?,
            zombie_after_minutes: record.zombie_after_minutes,
            created_at: record.created_at,
            updated_at: record.updated_at,
        })
    }
}

/// `query_as!` into `$out` of `$head`, then a pool's columns, then `$tail` (literals).
macro_rules! with_pool_columns {
    ($out:path, $head:literal, $tail:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            $out,
            $head
                + "id, name, owner_project, share_idle, zombie_after_minutes, created_at, \
                   updated_at"
                + $tail
            $(, $arg)*
        )
    };
}

/// Creates or changes a pool; `true` with it when it was created.
pub async fn put_pool(
    conn: &mut PgConnection,
    id: &str,
    settings: &PoolSettings,
) -> sqlx::Result<(PoolRow, bool)> {
    struct Put {
        id: String,
        name: String,
        owner_project: Option<String>,
        share_idle: String,
        zombie_after_minutes: Option<i32>,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        created: bool,
    }
    let put = with_pool_columns!(
        Put,
        "INSERT INTO pools (id, name, owner_project, share_idle, zombie_after_minutes, \
             updated_at) \
         VALUES ($1, $2, $3, $4, $5, now()) \
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, \
             owner_project = EXCLUDED.owner_project, share_idle = EXCLUDED.share_idle, \
             zombie_after_minutes = EXCLUDED.zombie_after_minutes, \
             updated_at = EXCLUDED.updated_at \
         RETURNING ",
        // A new row's `created_at` defaults to the transaction's `now()`, which is also its
        // `updated_at`; a changed row keeps the `created_at` of an earlier transaction.
        r#", (created_at = updated_at) AS "created!""#,
        id,
        &settings.name,
        settings.owner_project.as_deref(),
        settings.share_idle.as_str(),
        settings.zombie_after_minutes,
    )
    .fetch_one(conn)
    .await?;
    let row = PoolRow::try_from(PoolRecord {
        id: put.id,
        name: put.name,
        owner_project: put.owner_project,
        share_idle: put.share_idle,
        zombie_after_minutes: put.zombie_after_minutes,
        created_at: put.created_at,
        updated_at: put.updated_at,
    })?;
    Ok((row, put.created))
}

pub async fn get_pool(conn: &mut PgConnection, id: &str) -> sqlx::Result<Option<PoolRow>> {
    with_pool_columns!(PoolRecord, "SELECT ", " FROM pools WHERE id = $1", id)
        .try_map(PoolRow::try_from)
        .fetch_optional(conn)
        .await
}

/// Every pool, by id.
pub async fn list_pools(conn: &mut PgConnection) -> sqlx::Result<Vec<PoolRow>> {
    with_pool_columns!(PoolRecord, "SELECT ", " FROM pools ORDER BY id")
        .try_map(PoolRow::try_from)
        .fetch_all(conn)
        .await
}

/// The pools of `ids` that exist.
pub async fn pools_by_ids(conn: &mut PgConnection, ids: &[String]) -> sqlx::Result<Vec<PoolRow>> {
    with_pool_columns!(
        PoolRecord,
        "SELECT ",
        " FROM pools WHERE id = ANY($1) ORDER BY id",
        ids,
    )
    .try_map(PoolRow::try_from)
    .fetch_all(conn)
    .await
}

/// The name whose hash keys the advisory lock over the whole capacity rollup: taken shared
/// before any node's lock, and exclusive by the rebuild of the rollup.
const ROLLUP_LOCK: &str = "capacity rollup";

/// Takes the advisory lock of each node, in name order, until the transaction ends (after
/// the rollup's lock, shared): whoever writes a node's intervals holds it while it checks
/// them for overlaps, and whoever rewrites a node's rollup rows while it works them out. A
/// transaction takes its node locks in one call.
pub async fn lock_nodes(conn: &mut PgConnection, nodes: &[&str]) -> sqlx::Result<()> {
    let mut sorted: Vec<&str> = nodes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sqlx::query!(
        "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))",
        ROLLUP_LOCK,
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('capacity node ' || n, 0)) \
         FROM (SELECT n FROM UNNEST($1::text[]) AS u(n) ORDER BY n) AS s",
        &sorted as &[&str],
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A compile-checked statement run unprepared: planned for its own arguments each time
/// rather than from a cached generic plan.
struct Unprepared<Q>(Q);

impl<'q, Q: Execute<'q, Postgres>> Execute<'q, Postgres> for Unprepared<Q> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&<Postgres as sqlx::Database>::Statement<'q>> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// Runs `query` unprepared (see [`Unprepared`]) and reads its rows as `T`, the row type the
/// macro that built `query` checked its columns against.
async fn fetch_unprepared<'q, T, Q>(conn: &mut PgConnection, query: Q) -> sqlx::Result<Vec<T>>
where
    T: for<'r> FromRow<'r, PgRow>,
    Q: Execute<'q, Postgres> + 'q,
{
    let rows = conn.fetch_all(Unprepared(query)).await?;
    rows.iter().map(T::from_row).collect()
}

/// A stored interval another one meets: its key, its end and its content hash.
#[derive(Debug, Clone)]
pub struct StoredInterval {
    /// The position in the batch of the interval it meets.
    pub position: i32,
    pub node: String,
    pub from_at: DateTime<Utc>,
    pub until_at: DateTime<Utc>,
    pub content_hash: Vec<u8>,
}

/// The stored intervals that share a node with one of `intervals` and either start at the
/// same instant (the same key) or overlap it.
pub async fn meeting(
    conn: &mut PgConnection,
    intervals: &[CapacityInterval],
) -> sqlx::Result<Vec<StoredInterval>> {
    let nodes: Vec<&str> = intervals.iter().map(|i| i.node.as_str()).collect();
    let froms: Vec<DateTime<Utc>> = intervals.iter().map(|i| i.from).collect();
    let untils: Vec<DateTime<Utc>> = intervals.iter().map(|i| i.until).collect();
    sqlx::query_as!(
        StoredInterval,
        "SELECT (k.i - 1)::int AS \"position!\", c.node, c.from_at, c.until_at, \
                c.content_hash \
         FROM UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[]) \
              WITH ORDINALITY AS k(n, f, u, i) \
         JOIN capacity_intervals c \
           ON c.node = k.n AND (c.from_at = k.f OR (c.from_at < k.u AND c.until_at > k.f)) \
         ORDER BY k.i, c.from_at",
        &nodes as &[&str],
        &froms,
        &untils,
    )
    .fetch_all(conn)
    .await
}

/// Stores intervals, replacing those stored under the same `(node, from)`; `bill_statement`
/// names the bill statement whose rows created them, if a bill did.
pub async fn upsert(
    conn: &mut PgConnection,
    intervals: &[CapacityInterval],
    hashes: &[Vec<u8>],
    bill_statement: Option<Uuid>,
) -> sqlx::Result<u64> {
    let mut node = Vec::with_capacity(intervals.len());
    let mut from = Vec::with_capacity(intervals.len());
    let mut until = Vec::with_capacity(intervals.len());
    let mut pool = Vec::with_capacity(intervals.len());
    let mut state = Vec::with_capacity(intervals.len());
    let mut model = Vec::with_capacity(intervals.len());
    let mut gpus = Vec::with_capacity(intervals.len());
    let mut mode = Vec::with_capacity(intervals.len());
    let mut provider = Vec::with_capacity(intervals.len());
    let mut region = Vec::with_capacity(intervals.len());
    let mut labels = Vec::with_capacity(intervals.len());
    let mut keys = Vec::with_capacity(intervals.len());
    for i in intervals {
        node.push(i.node.as_str());
        from.push(i.from);
        until.push(i.until);
        pool.push(i.pool.as_str());
        state.push(i.state.as_str());
        model.push(i.gpu_model.as_str());
        gpus.push(i.gpus);
        mode.push(i.billing_mode.as_str());
        provider.push(i.provider.as_deref());
        region.push(i.region.as_deref());
        labels.push(serde_json::to_string(&i.labels).expect("labels serialise"));
        keys.push(i.resource_keys().join("\n"));
    }
    let done = sqlx::query!(
        "INSERT INTO capacity_intervals (node, from_at, until_at, pool_id, state, gpu_model, \
             gpus, billing_mode, provider, region, labels, content_hash, resource_keys, \
             bill_statement, received_at) \
         SELECT n, f, u, p, s, m, g, b, pr, rg, l::jsonb, h, string_to_array(rk, E'\\n'), $14, \
                now() \
         FROM UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::text[], \
                     $6::text[], $7::int[], $8::text[], $9::text[], $10::text[], $11::text[], \
                     $12::bytea[], $13::text[]) AS k(n, f, u, p, s, m, g, b, pr, rg, l, h, rk) \
         ON CONFLICT (node, from_at) DO UPDATE SET until_at = EXCLUDED.until_at, \
             pool_id = EXCLUDED.pool_id, state = EXCLUDED.state, \
             gpu_model = EXCLUDED.gpu_model, gpus = EXCLUDED.gpus, \
             billing_mode = EXCLUDED.billing_mode, provider = EXCLUDED.provider, \
             region = EXCLUDED.region, labels = EXCLUDED.labels, \
             content_hash = EXCLUDED.content_hash, resource_keys = EXCLUDED.resource_keys, \
             bill_statement = EXCLUDED.bill_statement, received_at = EXCLUDED.received_at",
        &node as &[&str],
        &from,
        &until,
        &pool as &[&str],
        &state as &[&str],
        &model as &[&str],
        &gpus,
        &mode as &[&str],
        &provider as &[Option<&str>],
        &region as &[Option<&str>],
        &labels,
        hashes,
        &keys,
        bill_statement,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// An interval as stored, its billing mode and state not yet parsed.
struct IntervalRow {
    node: String,
    pool_id: String,
    gpu_model: String,
    gpus: i32,
    billing_mode: String,
    provider: Option<String>,
    region: Option<String>,
    labels: sqlx::types::Json<BTreeMap<String, String>>,
    from_at: DateTime<Utc>,
    until_at: DateTime<Utc>,
    state: String,
}

impl TryFrom<IntervalRow> for CapacityInterval {
    type Error = sqlx::Error;

    fn try_from(row: IntervalRow) -> sqlx::Result<Self> {
        Ok(CapacityInterval {
            node: row.node,
            pool: row.pool_id,
            gpu_model: row.gpu_model,
            gpus: row.gpus,
            billing_mode: super::decoded::<BillingMode>("billing_mode", row.billing_mode)?,
            provider: row.provider,
            region: row.region,
            labels: row.labels.0,
            from: row.from_at,
            until: row.until_at,
            state: super::decoded::<NodeState>("state", row.state)?,
        })
    }
}

/// `query_as!` of the intervals where `$filter` holds (a literal), by node and start, read
/// as [`CapacityInterval`]s.
macro_rules! select_intervals {
    ($filter:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            IntervalRow,
            "SELECT node, pool_id, gpu_model, gpus, billing_mode, provider, region, \
                    labels AS \"labels: sqlx::types::Json<BTreeMap<String, String>>\", \
                    from_at, until_at, state \
             FROM capacity_intervals WHERE "
                + $filter
                + " ORDER BY node, from_at"
            $(, $arg)*
        )
        .try_map(CapacityInterval::try_from)
    };
}

/// The intervals stored under these `(node, from)` keys.
pub async fn stored_under(
    conn: &mut PgConnection,
    keys: &[(String, DateTime<Utc>)],
) -> sqlx::Result<Vec<CapacityInterval>> {
    let nodes: Vec<&str> = keys.iter().map(|(node, _)| node.as_str()).collect();
    let froms: Vec<DateTime<Utc>> = keys.iter().map(|(_, from)| *from).collect();
    select_intervals!(
        "(node, from_at) IN (SELECT * FROM UNNEST($1::text[], $2::timestamptz[]))",
        &nodes as &[&str],
        &froms,
    )
    .fetch_all(conn)
    .await
}

/// A pool, its row locked until the transaction ends.
pub async fn get_pool_for_update(
    conn: &mut PgConnection,
    id: &str,
) -> sqlx::Result<Option<PoolRow>> {
    with_pool_columns!(
        PoolRecord,
        "SELECT ",
        " FROM pools WHERE id = $1 FOR UPDATE",
        id
    )
    .try_map(PoolRow::try_from)
    .fetch_optional(conn)
    .await
}

/// Which intervals to read.
#[derive(Debug, Clone, Copy)]
pub enum IntervalsOf<'a> {
    /// Of these pools, or of every pool when `None`.
    Pools(Option<&'a [String]>),
    /// Of these nodes.
    Nodes(&'a [String]),
}

/// The intervals `of` names that overlap `[from, to)`, by node and start.
pub async fn intervals(
    conn: &mut PgConnection,
    of: IntervalsOf<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<CapacityInterval>> {
    let (pools, nodes) = match of {
        IntervalsOf::Pools(pools) => (pools, None),
        IntervalsOf::Nodes(nodes) => (None, Some(nodes)),
    };
    select_intervals!(
        "($1::text[] IS NULL OR pool_id = ANY($1)) \
         AND ($2::text[] IS NULL OR node = ANY($2)) AND from_at < $4 AND until_at > $3",
        pools,
        nodes,
        from,
        to,
    )
    .fetch_all(conn)
    .await
}

/// The intervals of every node some of `keys` name (see
/// [`CapacityInterval::resource_keys`]) that overlap `[from, to)`, by node and start.
pub async fn intervals_named(
    conn: &mut PgConnection,
    keys: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<CapacityInterval>> {
    select_intervals!(
        "resource_keys && $1::text[] AND from_at < $3 AND until_at > $2",
        keys,
        from,
        to,
    )
    .fetch_all(conn)
    .await
}

/// Whether any interval overlaps `[from, to)`.
pub async fn any_in(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        "SELECT EXISTS (SELECT 1 FROM capacity_intervals WHERE from_at < $2 AND until_at > $1) \
             AS \"exists!\"",
        from,
        to,
    )
    .fetch_one(conn)
    .await
}

/// What records put on a node in an hour, by project. Read by column name when run
/// unprepared: the names carry the macros' non-null overrides.
#[derive(sqlx::FromRow)]
struct UseRow {
    #[sqlx(rename = "node!")]
    node: String,
    hour: DateTime<Utc>,
    project_id: String,
    #[sqlx(rename = "gpu_seconds!")]
    gpu_seconds: Decimal,
}

/// What the records that name one of `nodes` put on each of them in each ledger hour of
/// `[from, to)`, by project: their segments' card-seconds (a MIG slice's as its share of the
/// card), each spread evenly over the record's nodes.
pub async fn node_usage(
    conn: &mut PgConnection,
    nodes: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<NodeUse>> {
    // Planned for its own arguments each time: a generic plan cannot see how many nodes and
    // records there are, and picks nested loops that take seconds.
    let rows: Vec<UseRow> = fetch_unprepared(
        &mut *conn,
        sqlx::query_as!(
            UseRow,
            "WITH wanted AS (SELECT DISTINCT node FROM unnest($1::text[]) AS w(node)) \
             SELECT n.node AS \"node!\", s.hour, s.project_id, \
                    sum(round(s.card_seconds / cardinality(r.nodes), 20)) AS \"gpu_seconds!\" \
             FROM job_records r \
             CROSS JOIN LATERAL unnest(r.nodes) AS n(node) \
             JOIN wanted ON wanted.node = n.node \
             JOIN rated_segments s \
               ON s.project_id = r.project_id AND s.task_id = r.task_id \
                  AND s.attempt = r.attempt \
             WHERE r.nodes IS NOT NULL \
               AND r.started_at < $3 AND r.ended_at >= $2 AND s.hour >= $2 AND s.hour < $3 \
             GROUP BY n.node, s.hour, s.project_id",
            nodes,
            from,
            to,
        ),
    )
    .await?;
    Ok(rows.into_iter().map(NodeUse::from).collect())
}

impl From<UseRow> for NodeUse {
    fn from(row: UseRow) -> Self {
        NodeUse {
            node: row.node,
            hour: row.hour,
            project: row.project_id,
            gpu_seconds: row.gpu_seconds,
        }
    }
}

/// The times records say jobs ran on each of `nodes` within `[from, to)`.
pub async fn jobs_on_nodes(
    conn: &mut PgConnection,
    nodes: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<(String, JobSpan)>> {
    #[derive(sqlx::FromRow)]
    struct JobOnNode {
        #[sqlx(rename = "node!")]
        node: String,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
    }
    let rows: Vec<JobOnNode> = fetch_unprepared(
        &mut *conn,
        sqlx::query_as!(
            JobOnNode,
            "WITH wanted AS (SELECT DISTINCT node FROM unnest($1::text[]) AS w(node)) \
             SELECT n.node AS \"node!\", r.started_at, r.ended_at \
             FROM job_records r CROSS JOIN LATERAL unnest(r.nodes) AS n(node) \
             JOIN wanted ON wanted.node = n.node \
             WHERE r.nodes IS NOT NULL AND r.started_at < $3 AND r.ended_at > $2 \
             ORDER BY n.node, r.started_at",
            nodes,
            from,
            to,
        ),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let span = JobSpan {
                start: row.started_at,
                end: row.ended_at,
            };
            (row.node, span)
        })
        .collect())
}

/// The nodes of pools with zombie alerts on whose up time reaches past `since`.
pub async fn nodes_up_since(
    conn: &mut PgConnection,
    pool: Option<&str>,
    since: DateTime<Utc>,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT DISTINCT c.node FROM capacity_intervals c JOIN pools p ON p.id = c.pool_id \
         WHERE c.state = 'up' AND c.until_at > $2 AND p.zombie_after_minutes IS NOT NULL \
           AND ($1::text IS NULL OR c.pool_id = $1) \
         ORDER BY c.node",
        pool,
        since,
    )
    .fetch_all(conn)
    .await
}

/// An idle stretch that fired its alert.
#[derive(Debug, Clone)]
pub struct FiredStretch {
    pub node: String,
    pub since: DateTime<Utc>,
    pub judged_until: DateTime<Utc>,
}

/// The stretches of `nodes` that fired, by node and start.
pub async fn fired_stretches(
    conn: &mut PgConnection,
    nodes: &[String],
) -> sqlx::Result<Vec<FiredStretch>> {
    sqlx::query_as!(
        FiredStretch,
        "SELECT node, since, judged_until FROM zombie_stretches WHERE node = ANY($1) \
         ORDER BY node, since",
        nodes,
    )
    .fetch_all(conn)
    .await
}

/// A stretch to record as fired.
#[derive(Debug, Clone)]
pub struct NewStretch<'a> {
    pub node: &'a str,
    pub since: DateTime<Utc>,
    pub judged_until: DateTime<Utc>,
    pub pool: &'a str,
    pub gpu_model: &'a str,
    pub gpus: i32,
    pub currency: Option<&'a str>,
    pub cost_per_hour: Option<Decimal>,
    pub cost_so_far: Option<Decimal>,
}

/// Records a fired stretch; `false` when another writer recorded it first.
pub async fn insert_stretch(
    conn: &mut PgConnection,
    stretch: &NewStretch<'_>,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "INSERT INTO zombie_stretches (node, since, judged_until, pool_id, gpu_model, gpus, \
             currency, cost_per_hour, cost_so_far) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (node, since) DO NOTHING",
        stretch.node,
        stretch.since,
        stretch.judged_until,
        stretch.pool,
        stretch.gpu_model,
        stretch.gpus,
        stretch.currency,
        stretch.cost_per_hour,
        stretch.cost_so_far,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The currency of each of `projects` that exists.
pub async fn project_currencies(
    conn: &mut PgConnection,
    projects: &[String],
) -> sqlx::Result<BTreeMap<String, String>> {
    let rows = sqlx::query!(
        "SELECT id, currency::text AS \"currency!\" FROM projects WHERE id = ANY($1)",
        projects,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|row| (row.id, row.currency)).collect())
}

/// The pools whose idle or down time may be charged to `project`: those it owns that charge
/// their owner, and those that split it by usage.
pub async fn pools_charging(conn: &mut PgConnection, project: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT id FROM pools \
         WHERE (owner_project = $1 AND share_idle <> 'pool') OR share_idle = 'by_usage' \
         ORDER BY id",
        project,
    )
    .fetch_all(conn)
    .await
}

/// Takes the rollup's lock exclusive until the transaction ends: no node's intervals or
/// rollup rows change meanwhile.
pub async fn lock_rollup(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        ROLLUP_LOCK,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A node over `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeSpan {
    pub node: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// What the records put on each node of `spans` in each ledger hour of its span, by
/// project, from `capacity_usage_hourly` (the spans do not overlap).
pub async fn usage_hours(
    conn: &mut PgConnection,
    spans: &[NodeSpan],
) -> sqlx::Result<Vec<NodeUse>> {
    if spans.is_empty() {
        return Ok(Vec::new());
    }
    let nodes: Vec<&str> = spans.iter().map(|s| s.node.as_str()).collect();
    let froms: Vec<DateTime<Utc>> = spans.iter().map(|s| s.from).collect();
    let tos: Vec<DateTime<Utc>> = spans.iter().map(|s| s.to).collect();
    let rows: Vec<UseRow> = fetch_unprepared(
        &mut *conn,
        sqlx::query_as!(
            UseRow,
            "SELECT u.node AS \"node!\", u.hour, u.project_id, \
                    sum(u.gpu_seconds) AS \"gpu_seconds!\" \
             FROM UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(node, f, t) \
             JOIN capacity_usage_hourly u \
               ON u.node = w.node AND u.hour >= w.f AND u.hour < w.t \
             GROUP BY u.node, u.hour, u.project_id \
             HAVING sum(u.gpu_seconds) <> 0",
            &nodes as &[&str],
            &froms,
            &tos,
        ),
    )
    .await?;
    Ok(rows.into_iter().map(NodeUse::from).collect())
}

/// `query!` of `$changes` (a literal: a `WITH changes AS (…),` of the node-day rows taken
/// out, with `sign` -1, or stored, with `sign` 1), then the CTEs appending to the per pool
/// and day sums and to the `by_usage` weights what those rows change.
macro_rules! with_pool_sums {
    ($changes:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $changes
                + " tag AS (SELECT nextval('rollup_deltas') AS delta), \
                   pool_days AS ( \
                     INSERT INTO capacity_pool_days (pool_id, day, used, overbooked, delta) \
                     SELECT pool_id, day, sum(sign * used), sum(sign * overbooked), \
                            min(tag.delta) \
                     FROM changes CROSS JOIN tag \
                     GROUP BY pool_id, day \
                     HAVING (sum(sign * used), sum(sign * overbooked)) <> (0, 0)), \
                   pool_weights AS ( \
                     INSERT INTO capacity_pool_weights \
                       (pool_id, month, project_id, gpu_seconds, delta) \
                     SELECT c.pool_id, date_trunc('month', c.day)::date, u.project, \
                            sum(c.sign * u.seconds), min(tag.delta) \
                     FROM changes c \
                     CROSS JOIN LATERAL UNNEST(c.usage_projects, c.usage_seconds) \
                       AS u(project, seconds) \
                     CROSS JOIN tag \
                     GROUP BY c.pool_id, date_trunc('month', c.day)::date, u.project \
                     HAVING sum(c.sign * u.seconds) <> 0) \
                   SELECT 1 AS done"
            $(, $arg)*
        )
    };
}

/// Replaces the rollup rows of the node-days of `spans` (each node from its first ledger
/// day, included, to its last, excluded) with `rows` and `unmatched`, which lie within them.
pub async fn replace_node_days(
    conn: &mut PgConnection,
    spans: &[(String, NaiveDate, NaiveDate)],
    rows: &[NodeDayUse],
    unmatched: &[UnmatchedDay],
) -> sqlx::Result<()> {
    let nodes: Vec<&str> = spans.iter().map(|s| s.0.as_str()).collect();
    let firsts: Vec<NaiveDate> = spans.iter().map(|s| s.1).collect();
    let ends: Vec<NaiveDate> = spans.iter().map(|s| s.2).collect();
    let changes = with_pool_sums!(
        "WITH changes AS ( \
           DELETE FROM capacity_node_days d \
           USING UNNEST($1::text[], $2::date[], $3::date[]) AS w(node, f, t) \
           WHERE d.node = w.node AND d.day >= w.f AND d.day < w.t \
           RETURNING -1 AS sign, d.*),",
        &nodes as &[&str],
        &firsts,
        &ends,
    );
    conn.execute(changes).await?;
    sqlx::query!(
        "DELETE FROM capacity_unmatched_days d \
         USING UNNEST($1::text[], $2::date[], $3::date[]) AS w(node, f, t) \
         WHERE d.node = w.node AND d.day >= w.f AND d.day < w.t",
        &nodes as &[&str],
        &firsts,
        &ends,
    )
    .execute(&mut *conn)
    .await?;
    insert_node_days(conn, rows, unmatched).await
}

/// Stores rollup rows (their node-days hold none yet).
pub async fn insert_node_days(
    conn: &mut PgConnection,
    rows: &[NodeDayUse],
    unmatched: &[UnmatchedDay],
) -> sqlx::Result<()> {
    if !rows.is_empty() {
        // Each row's projects are a slice of one array: a row's `usage` starts at its offset.
        let mut offsets = Vec::with_capacity(rows.len());
        let mut counts = Vec::with_capacity(rows.len());
        let mut projects: Vec<&str> = Vec::new();
        let mut seconds: Vec<Decimal> = Vec::new();
        for row in rows {
            offsets.push(projects.len() as i32);
            counts.push(row.usage.len() as i32);
            for (project, used) in &row.usage {
                projects.push(project);
                seconds.push(*used);
            }
        }
        let changes = with_pool_sums!(
            "WITH changes AS ( \
               INSERT INTO capacity_node_days \
                 (node, day, pool_id, used, overbooked, usage_projects, usage_seconds) \
               SELECT node, day, pool, used, overbooked, \
                      ($8::text[])[o + 1 : o + c], ($9::numeric[])[o + 1 : o + c] \
               FROM UNNEST($1::text[], $2::date[], $3::text[], $4::numeric[], $5::numeric[], \
                           $6::int[], $7::int[]) AS u(node, day, pool, used, overbooked, o, c) \
               RETURNING 1 AS sign, *),",
            &rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>() as &[&str],
            &rows.iter().map(|r| r.day).collect::<Vec<_>>(),
            &rows.iter().map(|r| r.pool.as_str()).collect::<Vec<_>>() as &[&str],
            &rows.iter().map(|r| r.used).collect::<Vec<_>>(),
            &rows.iter().map(|r| r.overbooked).collect::<Vec<_>>(),
            &offsets,
            &counts,
            &projects as &[&str],
            &seconds,
        );
        conn.execute(changes).await?;
    }
    if !unmatched.is_empty() {
        sqlx::query!(
            "INSERT INTO capacity_unmatched_days (node, day, gpu_seconds) \
             SELECT * FROM UNNEST($1::text[], $2::date[], $3::numeric[])",
            &unmatched
                .iter()
                .map(|u| u.node.as_str())
                .collect::<Vec<_>>() as &[&str],
            &unmatched.iter().map(|u| u.day).collect::<Vec<_>>(),
            &unmatched.iter().map(|u| u.gpu_seconds).collect::<Vec<_>>(),
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

struct NodeDayRow {
    node: String,
    day: NaiveDate,
    pool_id: String,
    used: Decimal,
    overbooked: Decimal,
}

/// The rollup rows of `pools` (every pool when `None`) on the ledger days `[first, end)`,
/// without their usage weights.
pub async fn node_days(
    conn: &mut PgConnection,
    pools: Option<&[String]>,
    first: NaiveDate,
    end: NaiveDate,
) -> sqlx::Result<Vec<NodeDayUse>> {
    let rows = sqlx::query_as!(
        NodeDayRow,
        "SELECT node, day, pool_id, used, overbooked FROM capacity_node_days \
         WHERE day >= $2 AND day < $3 AND ($1::text[] IS NULL OR pool_id = ANY($1))",
        pools,
        first,
        end,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| NodeDayUse {
            node: row.node,
            day: row.day,
            pool: row.pool_id,
            used: row.used,
            overbooked: row.overbooked,
            usage: BTreeMap::new(),
        })
        .collect())
}

/// The rollup's used and overbooked time of `pools` on the ledger days `[first, end)`,
/// summed per pool and day (kept so), and with [`Detail::Nodes`] per pool, node and month.
pub async fn node_day_sums(
    conn: &mut PgConnection,
    pools: &[String],
    first: NaiveDate,
    end: NaiveDate,
    detail: Detail,
) -> sqlx::Result<RollupSums> {
    let by_day = sqlx::query!(
        "SELECT pool_id, day, sum(used) AS \"used!\", sum(overbooked) AS \"overbooked!\" \
         FROM capacity_pool_days \
         WHERE pool_id = ANY($1) AND day >= $2 AND day < $3 GROUP BY pool_id, day",
        pools,
        first,
        end,
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|row| (row.pool_id, row.day, row.used, row.overbooked))
    .collect();
    let by_node = match detail {
        Detail::Pools => Vec::new(),
        Detail::Nodes => sqlx::query!(
            "SELECT pool_id, node, date_trunc('month', day)::date AS \"month!\", \
                    sum(used) AS \"used!\", sum(overbooked) AS \"overbooked!\" \
             FROM capacity_node_days WHERE pool_id = ANY($1) AND day >= $2 AND day < $3 \
             GROUP BY 1, 2, 3",
            pools,
            first,
            end,
        )
        .fetch_all(conn)
        .await?
        .into_iter()
        .map(|row| (row.pool_id, row.node, row.month, row.used, row.overbooked))
        .collect(),
    };
    Ok(RollupSums { by_day, by_node })
}

/// What records put on `nodes` in hours no interval covers, by node-day, on `[first, end)`.
pub async fn unmatched_days(
    conn: &mut PgConnection,
    nodes: &[String],
    first: NaiveDate,
    end: NaiveDate,
) -> sqlx::Result<Vec<UnmatchedDay>> {
    sqlx::query_as!(
        UnmatchedDay,
        "SELECT node, day, gpu_seconds FROM capacity_unmatched_days \
         WHERE day >= $2 AND day < $3 AND node = ANY($1)",
        nodes,
        first,
        end,
    )
    .fetch_all(conn)
    .await
}

/// The `by_usage` weights of `pools` in the ledger months of `[first, end)`: what each
/// project put on their nodes in the hours their capacity is known, (pool, month) →
/// project → GPU-seconds.
pub async fn usage_weights(
    conn: &mut PgConnection,
    pools: &[String],
    first: NaiveDate,
    end: NaiveDate,
) -> sqlx::Result<BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>>> {
    let rows = sqlx::query!(
        "SELECT pool_id, month, project_id, sum(gpu_seconds) AS \"gpu_seconds!\" \
         FROM capacity_pool_weights \
         WHERE pool_id = ANY($1) AND month >= $2 AND month < $3 \
         GROUP BY pool_id, month, project_id HAVING sum(gpu_seconds) <> 0",
        pools,
        first,
        end,
    )
    .fetch_all(conn)
    .await?;
    let mut weights: BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>> = BTreeMap::new();
    for row in rows {
        weights
            .entry((row.pool_id, row.month))
            .or_default()
            .insert(row.project_id, row.gpu_seconds);
    }
    Ok(weights)
}

/// Every node with usage, and the first and last hour of it.
pub async fn nodes_with_usage(
    conn: &mut PgConnection,
) -> sqlx::Result<Vec<(String, DateTime<Utc>, DateTime<Utc>)>> {
    let rows = sqlx::query!(
        "SELECT node, min(hour) AS \"first!\", max(hour) AS \"last!\" \
         FROM capacity_usage_hourly GROUP BY node ORDER BY node",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.node, row.first, row.last))
        .collect())
}

/// Removes every rollup row, for a rebuild.
pub async fn clear_node_days(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM capacity_node_days")
        .execute(&mut *conn)
        .await?;
    sqlx::query!("DELETE FROM capacity_unmatched_days")
        .execute(&mut *conn)
        .await?;
    sqlx::query!("DELETE FROM capacity_pool_days")
        .execute(&mut *conn)
        .await?;
    sqlx::query!("DELETE FROM capacity_pool_weights")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The capacity tables rating and rollup rewrites append delta rows to: table, key and
/// summed columns.
const DELTA_TABLES: [(&str, &[&str], &[&str]); 3] = [
    (
        "capacity_usage_hourly",
        &["project_id", "node", "hour"],
        &["gpu_seconds"],
    ),
    (
        "capacity_pool_days",
        &["pool_id", "day"],
        &["used", "overbooked"],
    ),
    (
        "capacity_pool_weights",
        &["pool_id", "month", "project_id"],
        &["gpu_seconds"],
    ),
];

/// The capacity tables with delta rows.
pub fn delta_tables() -> impl Iterator<Item = &'static str> {
    DELTA_TABLES.iter().map(|(table, ..)| *table)
}

/// Folds the delta rows of the capacity tables into their rows with `delta = 0` and removes
/// those left at zero; returns how many delta rows it folded.
pub async fn compact(conn: &mut PgConnection) -> sqlx::Result<i64> {
    let mut folded = 0;
    for (table, key, sums) in DELTA_TABLES {
        let key = key.join(", ");
        let summed = sums
            .iter()
            .map(|c| format!("sum({c}) AS {c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let columns = sums.join(", ");
        let added = sums
            .iter()
            .map(|c| format!("{c} = t.{c} + EXCLUDED.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let zero = sums
            .iter()
            .map(|c| format!("{c} = 0"))
            .collect::<Vec<_>>()
            .join(" AND ");
        let object = key
            .split(", ")
            .map(|c| format!("'{c}', {c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let matched = key
            .split(", ")
            .map(|c| format!("t.{c} = z.{c}"))
            .collect::<Vec<_>>()
            .join(" AND ");
        // The rows left at zero, by key, as JSON objects read back with the table's types.
        // Dynamic: the table, its key and its summed columns are the delta table's.
        let (moved, emptied): (i64, serde_json::Value) = dynamic::query_as(&format!(
            "WITH moved AS (DELETE FROM {table} WHERE delta <> 0 RETURNING *), \
             merged AS (SELECT {key}, {summed} FROM moved GROUP BY {key}), \
             upserted AS ( \
               INSERT INTO {table} AS t ({key}, {columns}, delta) \
               SELECT {key}, {columns}, 0 FROM merged ORDER BY {key} \
               ON CONFLICT ({key}, delta) DO UPDATE SET {added} \
               RETURNING t.*) \
             SELECT (SELECT count(*) FROM moved), \
                    (SELECT coalesce(jsonb_agg(jsonb_build_object({object})), '[]') \
                     FROM upserted WHERE {zero})"
        ))
        .fetch_one(&mut *conn)
        .await?;
        if emptied.as_array().is_some_and(|rows| !rows.is_empty()) {
            // Dynamic: the table, its key and its summed columns are the delta table's.
            dynamic::query(&format!(
                "DELETE FROM {table} t USING jsonb_populate_recordset(NULL::{table}, $1) z \
                 WHERE {matched} AND t.delta = 0 AND {zero}",
                zero = sums
                    .iter()
                    .map(|c| format!("t.{c} = 0"))
                    .collect::<Vec<_>>()
                    .join(" AND "),
            ))
            .bind(&emptied)
            .execute(&mut *conn)
            .await?;
        }
        folded += moved;
    }
    Ok(folded)
}
