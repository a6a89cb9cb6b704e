//! Pricing contracts.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::rating::{BillingMode, Contract};
use crate::domain::tco::{Phase, Tco};

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
    /// Set on the second phase of a TCO contract: the contract it belongs to.
    pub phase_of: Option<Uuid>,
    pub tco_purchase_price_per_gpu: Option<Decimal>,
    pub tco_salvage_value_per_gpu: Option<Decimal>,
    pub tco_life_months: Option<i32>,
    pub tco_in_service_from: Option<DateTime<Utc>>,
    pub tco_power_kw_per_gpu: Option<Decimal>,
    pub tco_electricity_price_per_kwh: Option<Decimal>,
    pub tco_other_per_gpu_month: Option<Decimal>,
    pub pue: Decimal,
    /// The power part of this row's price, which measured energy replaces (0 unless TCO).
    pub power_price_per_gpu_hour: Decimal,
    /// PUE × electricity price (0 unless TCO).
    pub energy_price_per_kwh: Decimal,
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
            power_price_per_gpu_hour: self.power_price_per_gpu_hour,
            energy_price_per_kwh: self.energy_price_per_kwh,
        }
    }

    /// What the card costs, on a contract priced by its TCO.
    pub fn tco(&self) -> Option<Tco> {
        Some(Tco {
            purchase_price_per_gpu: self.tco_purchase_price_per_gpu?,
            salvage_value_per_gpu: self.tco_salvage_value_per_gpu?,
            life_months: u32::try_from(self.tco_life_months?).ok()?,
            in_service_from: self.tco_in_service_from?,
            power_kw_per_gpu: self.tco_power_kw_per_gpu?,
            electricity_price_per_kwh: self.tco_electricity_price_per_kwh?,
            pue: self.pue,
            other_per_gpu_month: self.tco_other_per_gpu_month?,
        })
    }

    /// The contract's terms, as a change starts from (of a row read by [`get`] or [`list`]).
    pub fn fields(&self) -> ContractFields {
        let tco = self.tco();
        ContractFields {
            name: self.name.clone(),
            gpu_model: self.gpu_model.clone(),
            billing_mode: self.billing_mode,
            price_per_gpu_hour: tco
                .as_ref()
                .map_or(self.price_per_gpu_hour, |tco| tco.parts().total()),
            currency: self.currency.clone(),
            valid_from: self.valid_from,
            valid_until: self.valid_until,
            project_id: self.project_id.clone(),
            provider: self.provider.clone(),
            region: self.region.clone(),
            committed_gpus: self.committed_gpus,
            tco,
        }
    }
}

/// A contract's fields, as created or after a change.
pub use crate::domain::contract::ContractTerms as ContractFields;

const COLUMNS: &str = "id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, \
                       valid_from, valid_until, project_id, provider, region, committed_gpus, \
                       created_at, updated_at, phase_of, tco_purchase_price_per_gpu, \
                       tco_salvage_value_per_gpu, tco_life_months, tco_in_service_from, \
                       tco_power_kw_per_gpu, tco_electricity_price_per_kwh, \
                       tco_other_per_gpu_month, pue, power_price_per_gpu_hour, \
                       energy_price_per_kwh";

/// Every column a [`ContractRow`] reads, qualified by `alias`.
pub fn qualified_columns(alias: &str) -> String {
    COLUMNS
        .split(',')
        .map(|column| format!("{alias}.{}", column.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The contracts as given (`c`), without their second phases, valid until their second
/// phase (`t`) ends when they have one.
const AS_GIVEN: &str = "SELECT c.id, c.name, c.gpu_model, c.billing_mode, c.price_per_gpu_hour, \
            c.currency, c.valid_from, \
            CASE WHEN t.id IS NULL THEN c.valid_until ELSE t.valid_until END AS valid_until, \
            c.project_id, c.provider, c.region, c.committed_gpus, c.created_at, c.updated_at, \
            c.phase_of, c.tco_purchase_price_per_gpu, c.tco_salvage_value_per_gpu, \
            c.tco_life_months, c.tco_in_service_from, c.tco_power_kw_per_gpu, \
            c.tco_electricity_price_per_kwh, c.tco_other_per_gpu_month, c.pue, \
            c.power_price_per_gpu_hour, c.energy_price_per_kwh \
     FROM contracts c LEFT JOIN contracts t ON t.phase_of = c.id \
     WHERE c.phase_of IS NULL";

/// The columns a phase of `fields` is stored with, besides its identity, bound in order
/// from `$2`: name, model, mode, price, currency, validity, scope, commitment, the TCO, and
/// what measured energy is charged at.
const PHASE_COLUMNS: &str = "name, gpu_model, billing_mode, price_per_gpu_hour, currency, \
     valid_from, valid_until, project_id, provider, region, committed_gpus, \
     tco_purchase_price_per_gpu, tco_salvage_value_per_gpu, tco_life_months, \
     tco_in_service_from, tco_power_kw_per_gpu, tco_electricity_price_per_kwh, \
     tco_other_per_gpu_month, pue, power_price_per_gpu_hour, energy_price_per_kwh";

/// Binds the columns of [`PHASE_COLUMNS`] for `phase` of `fields`; the TCO itself only on
/// the contract's own row (`own`).
fn bind_phase<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    fields: &'q ContractFields,
    phase: &Phase,
    own: bool,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let tco = fields.tco.as_ref().filter(|_| own);
    let whole = fields.tco.as_ref();
    query
        .bind(&fields.name)
        .bind(&fields.gpu_model)
        .bind(fields.billing_mode.as_str())
        .bind(phase.parts.total())
        .bind(&fields.currency)
        .bind(phase.from)
        .bind(phase.until)
        .bind(&fields.project_id)
        .bind(&fields.provider)
        .bind(&fields.region)
        .bind(fields.committed_gpus)
        .bind(tco.map(|t| t.purchase_price_per_gpu))
        .bind(tco.map(|t| t.salvage_value_per_gpu))
        .bind(tco.map(|t| t.life_months as i32))
        .bind(tco.map(|t| t.in_service_from))
        .bind(tco.map(|t| t.power_kw_per_gpu))
        .bind(tco.map(|t| t.electricity_price_per_kwh))
        .bind(tco.map(|t| t.other_per_gpu_month))
        .bind(whole.map_or(Decimal::ONE, |t| t.pue))
        .bind(phase.parts.power)
        .bind(whole.map_or(Decimal::ZERO, Tco::energy_price_per_kwh))
}

fn placeholders(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stores `fields` as contract `id` (a new one unless `exists`): its own row, valid over
/// its first phase, and the row of its second phase when its card's life ends inside its
/// validity. A second phase that keeps its validity keeps its row (and the GPU time rated
/// to it); one that moves is stored anew. Returns the contract as given.
pub async fn put(
    conn: &mut PgConnection,
    id: Uuid,
    fields: &ContractFields,
    exists: bool,
) -> sqlx::Result<ContractRow> {
    let phases = fields.phases();
    let (first, second) = (&phases[0], phases.get(1));
    let count = PHASE_COLUMNS.split(',').count();
    let old_second: Option<(Uuid, DateTime<Utc>, Option<DateTime<Utc>>)> =
        match exists {
            true => sqlx::query_as(
                "SELECT id, valid_from, valid_until FROM contracts WHERE phase_of = $1 FOR UPDATE",
            )
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?,
            false => None,
        };
    let kept = old_second.filter(|(_, from, until)| {
        second.is_some_and(|phase| (phase.from, phase.until) == (*from, *until))
    });
    if old_second.is_some() && kept.is_none() {
        // Moved or gone: out of the way before the first phase may take its hours.
        sqlx::query("DELETE FROM contracts WHERE phase_of = $1")
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    let own = match exists {
        true => format!(
            "UPDATE contracts SET ({PHASE_COLUMNS}, updated_at) = ({}, now()) WHERE id = $1",
            placeholders(2, count)
        ),
        false => format!(
            "INSERT INTO contracts (id, {PHASE_COLUMNS}) VALUES ($1, {})",
            placeholders(2, count)
        ),
    };
    bind_phase(sqlx::query(&own).bind(id), fields, first, true)
        .execute(&mut *conn)
        .await?;
    if let Some(phase) = second {
        let (sql, phase_id) = match kept {
            Some((phase_id, _, _)) => (
                format!(
                    "UPDATE contracts SET ({PHASE_COLUMNS}, updated_at) = ({}, now()) \
                     WHERE id = $1",
                    placeholders(2, count)
                ),
                phase_id,
            ),
            None => (
                format!(
                    "INSERT INTO contracts (id, {PHASE_COLUMNS}, phase_of) VALUES ($1, {}, ${})",
                    placeholders(2, count),
                    count + 2
                ),
                Uuid::new_v4(),
            ),
        };
        let query = bind_phase(sqlx::query(&sql).bind(phase_id), fields, phase, false);
        let query = match kept {
            Some(_) => query,
            None => query.bind(id),
        };
        query.execute(&mut *conn).await?;
    }
    get(conn, id, false).await?.ok_or(sqlx::Error::RowNotFound)
}

/// One contract as given (the one whose second phase `id` is, for such a row), locked for
/// the rest of the transaction when `for_update`.
pub async fn get(
    conn: &mut PgConnection,
    id: Uuid,
    for_update: bool,
) -> sqlx::Result<Option<ContractRow>> {
    // Rows are locked by id: the second phase's row is locked by the change that stores it.
    let lock = if for_update { "FOR UPDATE OF c" } else { "" };
    sqlx::query_as::<_, ContractRow>(&format!(
        "{AS_GIVEN} AND c.id = coalesce((SELECT phase_of FROM contracts WHERE id = $1), $1) \
         {lock}"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Contracts as given in force at `at`, for every project or only those that could price
/// `project`'s GPU time (unscoped or scoped to it), by model, mode and id.
pub async fn in_force(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
    project: Option<&str>,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "SELECT * FROM ({AS_GIVEN}) AS given \
         WHERE valid_from <= $1 AND (valid_until IS NULL OR valid_until > $1) \
           AND ($2::text IS NULL OR project_id IS NULL OR project_id = $2) \
         ORDER BY gpu_model, billing_mode, id"
    ))
    .bind(at)
    .bind(project)
    .fetch_all(conn)
    .await
}

/// Deletes a contract and its second phase.
pub async fn delete(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM contracts WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Contracts as given in id order after `after`.
pub async fn list(
    conn: &mut PgConnection,
    after: Option<Uuid>,
    limit: i64,
) -> sqlx::Result<Vec<ContractRow>> {
    sqlx::query_as::<_, ContractRow>(&format!(
        "{AS_GIVEN} AND ($1::uuid IS NULL OR c.id > $1) ORDER BY c.id LIMIT $2"
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
           AND ($8::uuid IS NULL OR (id <> $8 AND phase_of IS DISTINCT FROM $8)) \
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
