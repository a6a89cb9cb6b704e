//! Pricing contracts.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::rating::{BillingMode, Contract};

/// The exclusion constraint that keeps equally specific contracts from overlapping in time.
pub const OVERLAP_CONSTRAINT: &str = "contracts_equally_specific_overlap";

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ContractRow {
    pub id: Uuid,
    pub name: String,
    pub gpu_model: String,
    #[sqlx(try_from = "String")]
    pub billing_mode: BillingMode,
    pub price_per_gpu_hour: Decimal,
    pub currency: String,
    pub valid_from: DateTime<Utc>,
    pub valid_until: Option<DateTime<Utc>>,
    pub project_id: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub committed_gpus: Option<Decimal>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl ContractRow {
    /// The contract as the cost model sees it.
    pub fn to_domain(&self) -> Contract {
        Contract {
            id: self.id,
            gpu_model: self.gpu_model.clone(),
            billing_mode: self.billing_mode,
            project: self.project_id.clone(),
            provider: self.provider.clone(),
            region: self.region.clone(),
            valid_from: self.valid_from,
            valid_until: self.valid_until,
            price_per_gpu_hour: self.price_per_gpu_hour,
            currency: self.currency.clone(),
            committed_gpus: self.committed_gpus,
        }
    }

    /// The contract's terms, as a change starts from.
    pub fn fields(&self) -> ContractFields {
        ContractFields {
            name: self.name.clone(),
            gpu_model: self.gpu_model.clone(),
            billing_mode: self.billing_mode,
            price_per_gpu_hour: self.price_per_gpu_hour,
            currency: self.currency.clone(),
            valid_from: self.valid_from,
            valid_until: self.valid_until,
            project_id: self.project_id.clone(),
            provider: self.provider.clone(),
            region: self.region.clone(),
            committed_gpus: self.committed_gpus,
        }
    }
}

/// A contract's fields, as created or after a change.
pub use crate::domain::contract::ContractTerms as ContractFields;

const COLUMNS: &str = "id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, \
                       valid_from, valid_until, project_id, provider, region, committed_gpus, \
                       created_at, updated_at";

pub async fn insert(
    conn: &mut PgConnection,
    id: Uuid,
    fields: &ContractFields,
) -> sqlx::Result<ContractRow> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, \
                                valid_from, valid_until, project_id, provider, region, committed_gpus) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(&fields.name)
    .bind(&fields.gpu_model)
    .bind(fields.billing_mode.as_str())
    .bind(fields.price_per_gpu_hour)
    .bind(&fields.currency)
    .bind(fields.valid_from)
    .bind(fields.valid_until)
    .bind(&fields.project_id)
    .bind(&fields.provider)
    .bind(&fields.region)
    .bind(fields.committed_gpus)
    .fetch_one(conn)
    .await
}

/// Replaces the changeable fields of a contract (its model, mode and scope never change).
pub async fn update(
    conn: &mut PgConnection,
    id: Uuid,
    fields: &ContractFields,
) -> sqlx::Result<ContractRow> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "UPDATE contracts SET name = $2, price_per_gpu_hour = $3, currency = $4, valid_from = $5, \
                valid_until = $6, committed_gpus = $7, updated_at = now() \
         WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(&fields.name)
    .bind(fields.price_per_gpu_hour)
    .bind(&fields.currency)
    .bind(fields.valid_from)
    .bind(fields.valid_until)
    .bind(fields.committed_gpus)
    .fetch_one(conn)
    .await
}

/// One contract, locked for the rest of the transaction when `for_update`.
pub async fn get(
    conn: &mut PgConnection,
    id: Uuid,
    for_update: bool,
) -> sqlx::Result<Option<ContractRow>> {
    let lock = if for_update { "FOR UPDATE" } else { "" };
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts WHERE id = $1 {lock}"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await
}

pub async fn delete(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM contracts WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Contracts in id order after `after`.
pub async fn list(
    conn: &mut PgConnection,
    after: Option<Uuid>,
    limit: i64,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts WHERE ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2"
    ))
    .bind(after)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// An equally specific contract (same model, mode and scope) whose validity overlaps
/// `fields`', other than `except`.
pub async fn equally_specific_overlap(
    conn: &mut PgConnection,
    fields: &ContractFields,
    except: Option<Uuid>,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "SELECT id FROM contracts \
         WHERE gpu_model = $1 AND billing_mode = $2 \
           AND project_id IS NOT DISTINCT FROM $3 AND provider IS NOT DISTINCT FROM $4 \
           AND region IS NOT DISTINCT FROM $5 \
           AND tstzrange(valid_from, valid_until) && tstzrange($6, $7) \
           AND ($8::uuid IS NULL OR id <> $8) \
         ORDER BY valid_from LIMIT 1",
    )
    .bind(&fields.gpu_model)
    .bind(fields.billing_mode.as_str())
    .bind(&fields.project_id)
    .bind(&fields.provider)
    .bind(&fields.region)
    .bind(fields.valid_from)
    .bind(fields.valid_until)
    .bind(except)
    .fetch_optional(conn)
    .await
}

/// Every contract that prices one of the `(gpu_model, billing_mode)` kinds.
pub async fn for_kinds(
    conn: &mut PgConnection,
    models: &[String],
    modes: &[String],
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts \
         WHERE (gpu_model, billing_mode) IN (SELECT * FROM UNNEST($1::text[], $2::text[]))"
    ))
    .bind(models)
    .bind(modes)
    .fetch_all(conn)
    .await
}

/// Ids of the contracts priced in `currency`.
pub async fn ids_in_currency(conn: &mut PgConnection, currency: &str) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar("SELECT id FROM contracts WHERE currency = $1")
        .bind(currency)
        .fetch_all(conn)
        .await
}

/// Reserved contracts scoped to `project` (to any project without one) that commit GPUs over
/// some of `[from, to)`.
pub async fn project_commitments(
    conn: &mut PgConnection,
    project: Option<&str>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts \
         WHERE project_id = coalesce($1, project_id) AND billing_mode = 'reserved' \
           AND committed_gpus IS NOT NULL \
           AND valid_from < $3 AND (valid_until IS NULL OR valid_until > $2) \
         ORDER BY id"
    ))
    .bind(project)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// Contracts for every project or for `project`, valid at some time in `[from, to)`: those
/// that could price the project's GPU time in the period, on any model.
pub async fn for_project(
    conn: &mut PgConnection,
    project: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts \
         WHERE (project_id IS NULL OR project_id = $1) \
           AND valid_from < $3 AND (valid_until IS NULL OR valid_until > $2) \
         ORDER BY id"
    ))
    .bind(project)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// Reserved contracts with a commitment and no project scope, valid in `[from, to)`: their
/// unused commitment belongs to no project (the report's `shared` row).
pub async fn shared_commitments(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts \
         WHERE project_id IS NULL AND billing_mode = 'reserved' AND committed_gpus IS NOT NULL \
           AND valid_from < $2 AND (valid_until IS NULL OR valid_until > $1) \
         ORDER BY id"
    ))
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// Reserved contracts with a commitment, scoped to a project or not, valid in `[from, to)`.
pub async fn commitments(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts \
         WHERE billing_mode = 'reserved' AND committed_gpus IS NOT NULL \
           AND valid_from < $2 AND (valid_until IS NULL OR valid_until > $1) \
         ORDER BY project_id NULLS FIRST, name, id"
    ))
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}

/// The contracts of `ids` that exist.
pub async fn by_ids(conn: &mut PgConnection, ids: &[Uuid]) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT {COLUMNS} FROM contracts WHERE id = ANY($1) ORDER BY id"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await
}
