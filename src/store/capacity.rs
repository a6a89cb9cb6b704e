//! Pools, the capacity intervals of their nodes, and what records ran on those nodes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::domain::capacity::{
    CapacityInterval, JobSpan, NodeState, NodeUse, PoolSettings, ShareIdle,
};
use crate::domain::rating::BillingMode;

/// The foreign key from a pool to its owner project.
pub const OWNER_CONSTRAINT: &str = "pools_owner_project_fkey";

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PoolRow {
    pub id: String,
    pub name: String,
    pub owner_project: Option<String>,
    #[sqlx(try_from = "String")]
    pub share_idle: ShareIdle,
    pub zombie_after_minutes: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const POOL_COLUMNS: &str =
    "id, name, owner_project, share_idle, zombie_after_minutes, created_at, updated_at";

/// Creates or changes a pool; `true` with it when it was created.
pub async fn put_pool(
    conn: &mut PgConnection,
    id: &str,
    settings: &PoolSettings,
) -> sqlx::Result<(PoolRow, bool)> {
    #[derive(sqlx::FromRow)]
    struct Put {
        #[sqlx(flatten)]
        row: PoolRow,
        created: bool,
    }
    let put = sqlx::query_as::<_, Put>(&format!(
        "INSERT INTO pools (id, name, owner_project, share_idle, zombie_after_minutes) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, \
             owner_project = EXCLUDED.owner_project, share_idle = EXCLUDED.share_idle, \
             zombie_after_minutes = EXCLUDED.zombie_after_minutes, updated_at = now() \
         RETURNING {POOL_COLUMNS}, (xmax = 0) AS created"
    ))
    .bind(id)
    .bind(&settings.name)
    .bind(&settings.owner_project)
    .bind(settings.share_idle.as_str())
    .bind(settings.zombie_after_minutes)
    .fetch_one(conn)
    .await?;
    Ok((put.row, put.created))
}

pub async fn get_pool(conn: &mut PgConnection, id: &str) -> sqlx::Result<Option<PoolRow>> {
    sqlx::query_as::<_, PoolRow>(&format!("SELECT {POOL_COLUMNS} FROM pools WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// Every pool, by id.
pub async fn list_pools(conn: &mut PgConnection) -> sqlx::Result<Vec<PoolRow>> {
    sqlx::query_as::<_, PoolRow>(&format!("SELECT {POOL_COLUMNS} FROM pools ORDER BY id"))
        .fetch_all(conn)
        .await
}

/// The pools of `ids` that exist.
pub async fn pools_by_ids(conn: &mut PgConnection, ids: &[String]) -> sqlx::Result<Vec<PoolRow>> {
    sqlx::query_as::<_, PoolRow>(&format!(
        "SELECT {POOL_COLUMNS} FROM pools WHERE id = ANY($1) ORDER BY id"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await
}

/// Takes the advisory lock of each node, in name order, until the transaction ends: whoever
/// writes a node's intervals holds it while it checks them for overlaps.
pub async fn lock_nodes(conn: &mut PgConnection, nodes: &[&str]) -> sqlx::Result<()> {
    let mut sorted: Vec<&str> = nodes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('capacity node ' || n, 0)) \
         FROM (SELECT n FROM UNNEST($1::text[]) AS u(n) ORDER BY n) AS s",
    )
    .bind(&sorted)
    .execute(conn)
    .await?;
    Ok(())
}

/// A stored interval another one meets: its key, its end and its content hash.
#[derive(Debug, Clone, sqlx::FromRow)]
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
    sqlx::query_as::<_, StoredInterval>(
        "SELECT (k.i - 1)::int AS position, c.node, c.from_at, c.until_at, c.content_hash \
         FROM UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[]) \
              WITH ORDINALITY AS k(n, f, u, i) \
         JOIN capacity_intervals c \
           ON c.node = k.n AND (c.from_at = k.f OR (c.from_at < k.u AND c.until_at > k.f)) \
         ORDER BY k.i, c.from_at",
    )
    .bind(&nodes)
    .bind(&froms)
    .bind(&untils)
    .fetch_all(conn)
    .await
}

/// Stores intervals, replacing those stored under the same `(node, from)`.
pub async fn upsert(
    conn: &mut PgConnection,
    intervals: &[CapacityInterval],
    hashes: &[Vec<u8>],
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
    }
    let done = sqlx::query(
        "INSERT INTO capacity_intervals (node, from_at, until_at, pool_id, state, gpu_model, \
             gpus, billing_mode, provider, region, labels, content_hash) \
         SELECT n, f, u, p, s, m, g, b, pr, rg, l::jsonb, h \
         FROM UNNEST($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::text[], \
                     $6::text[], $7::int[], $8::text[], $9::text[], $10::text[], $11::text[], \
                     $12::bytea[]) AS k(n, f, u, p, s, m, g, b, pr, rg, l, h) \
         ON CONFLICT (node, from_at) DO UPDATE SET until_at = EXCLUDED.until_at, \
             pool_id = EXCLUDED.pool_id, state = EXCLUDED.state, \
             gpu_model = EXCLUDED.gpu_model, gpus = EXCLUDED.gpus, \
             billing_mode = EXCLUDED.billing_mode, provider = EXCLUDED.provider, \
             region = EXCLUDED.region, labels = EXCLUDED.labels, \
             content_hash = EXCLUDED.content_hash, received_at = now()",
    )
    .bind(&node)
    .bind(&from)
    .bind(&until)
    .bind(&pool)
    .bind(&state)
    .bind(&model)
    .bind(&gpus)
    .bind(&mode)
    .bind(&provider)
    .bind(&region)
    .bind(&labels)
    .bind(hashes)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

#[derive(sqlx::FromRow)]
struct IntervalRow {
    node: String,
    pool_id: String,
    gpu_model: String,
    gpus: i32,
    #[sqlx(try_from = "String")]
    billing_mode: BillingMode,
    provider: Option<String>,
    region: Option<String>,
    labels: sqlx::types::Json<BTreeMap<String, String>>,
    from_at: DateTime<Utc>,
    until_at: DateTime<Utc>,
    #[sqlx(try_from = "String")]
    state: NodeState,
}

impl From<IntervalRow> for CapacityInterval {
    fn from(row: IntervalRow) -> Self {
        CapacityInterval {
            node: row.node,
            pool: row.pool_id,
            gpu_model: row.gpu_model,
            gpus: row.gpus,
            billing_mode: row.billing_mode,
            provider: row.provider,
            region: row.region,
            labels: row.labels.0,
            from: row.from_at,
            until: row.until_at,
            state: row.state,
        }
    }
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
    let rows = sqlx::query_as::<_, IntervalRow>(
        "SELECT node, pool_id, gpu_model, gpus, billing_mode, provider, region, labels, \
                from_at, until_at, state \
         FROM capacity_intervals \
         WHERE ($1::text[] IS NULL OR pool_id = ANY($1)) \
           AND ($2::text[] IS NULL OR node = ANY($2)) AND from_at < $4 AND until_at > $3 \
         ORDER BY node, from_at",
    )
    .bind(pools)
    .bind(nodes)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(CapacityInterval::from).collect())
}

/// Whether any interval overlaps `[from, to)`.
pub async fn any_in(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM capacity_intervals WHERE from_at < $2 AND until_at > $1)",
    )
    .bind(from)
    .bind(to)
    .fetch_one(conn)
    .await
}

#[derive(sqlx::FromRow)]
struct UseRow {
    node: String,
    hour: DateTime<Utc>,
    project_id: String,
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
    let rows = sqlx::query_as::<_, UseRow>(
        "WITH wanted AS (SELECT DISTINCT node FROM unnest($1::text[]) AS w(node)) \
         SELECT n.node, s.hour, s.project_id, \
                sum(round(s.card_seconds / cardinality(r.nodes), 20)) AS gpu_seconds \
         FROM job_records r \
         CROSS JOIN LATERAL unnest(r.nodes) AS n(node) \
         JOIN wanted ON wanted.node = n.node \
         JOIN rated_segments s \
           ON s.project_id = r.project_id AND s.task_id = r.task_id AND s.attempt = r.attempt \
         WHERE r.nodes IS NOT NULL \
           AND r.started_at < $3 AND r.ended_at >= $2 AND s.hour >= $2 AND s.hour < $3 \
         GROUP BY n.node, s.hour, s.project_id",
    )
    // Planned for its own arguments each time: a generic plan cannot see how many nodes and
    // records there are, and picks nested loops that take seconds.
    .persistent(false)
    .bind(nodes)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| NodeUse {
            node: row.node,
            hour: row.hour,
            project: row.project_id,
            gpu_seconds: row.gpu_seconds,
        })
        .collect())
}

/// The times records say jobs ran on each of `nodes` within `[from, to)`.
pub async fn jobs_on_nodes(
    conn: &mut PgConnection,
    nodes: &[String],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<(String, JobSpan)>> {
    let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "WITH wanted AS (SELECT DISTINCT node FROM unnest($1::text[]) AS w(node)) \
         SELECT n.node, r.started_at, r.ended_at \
         FROM job_records r CROSS JOIN LATERAL unnest(r.nodes) AS n(node) \
         JOIN wanted ON wanted.node = n.node \
         WHERE r.nodes IS NOT NULL AND r.started_at < $3 AND r.ended_at > $2 \
         ORDER BY n.node, r.started_at",
    )
    .persistent(false)
    .bind(nodes)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(node, start, end)| (node, JobSpan { start, end }))
        .collect())
}

/// The nodes of pools with zombie alerts on whose up time reaches past `since`.
pub async fn nodes_up_since(
    conn: &mut PgConnection,
    pool: Option<&str>,
    since: DateTime<Utc>,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT DISTINCT c.node FROM capacity_intervals c JOIN pools p ON p.id = c.pool_id \
         WHERE c.state = 'up' AND c.until_at > $2 AND p.zombie_after_minutes IS NOT NULL \
           AND ($1::text IS NULL OR c.pool_id = $1) \
         ORDER BY c.node",
    )
    .bind(pool)
    .bind(since)
    .fetch_all(conn)
    .await
}

/// An idle stretch that fired its alert.
#[derive(Debug, Clone, sqlx::FromRow)]
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
    sqlx::query_as::<_, FiredStretch>(
        "SELECT node, since, judged_until FROM zombie_stretches WHERE node = ANY($1) \
         ORDER BY node, since",
    )
    .bind(nodes)
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
    let done = sqlx::query(
        "INSERT INTO zombie_stretches (node, since, judged_until, pool_id, gpu_model, gpus, \
             currency, cost_per_hour, cost_so_far) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (node, since) DO NOTHING",
    )
    .bind(stretch.node)
    .bind(stretch.since)
    .bind(stretch.judged_until)
    .bind(stretch.pool)
    .bind(stretch.gpu_model)
    .bind(stretch.gpus)
    .bind(stretch.currency)
    .bind(stretch.cost_per_hour)
    .bind(stretch.cost_so_far)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The currency of each of `projects` that exists.
pub async fn project_currencies(
    conn: &mut PgConnection,
    projects: &[String],
) -> sqlx::Result<BTreeMap<String, String>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT id, currency::text FROM projects WHERE id = ANY($1)")
            .bind(projects)
            .fetch_all(conn)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The pools whose idle or down time may be charged to `project`: those it owns that charge
/// their owner, and those that split it by usage.
pub async fn pools_charging(conn: &mut PgConnection, project: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT id FROM pools \
         WHERE (owner_project = $1 AND share_idle <> 'pool') OR share_idle = 'by_usage' \
         ORDER BY id",
    )
    .bind(project)
    .fetch_all(conn)
    .await
}
