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

/// `query!` of `$head`, the columns a [`ContractRow`] reads from `contracts c` (its
/// `valid_until` being `$valid_until`), then `$from` and `$rest` (all literals);
/// [`contract_row`] makes each row a [`ContractRow`].
macro_rules! select_contracts {
    ($head:literal, $valid_until:literal, $from:literal, $rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $head
                + "c.id, c.name, c.gpu_model, c.billing_mode, c.price_per_gpu_hour, c.currency, \
                   c.valid_from, "
                + $valid_until
                + " AS valid_until, c.project_id, c.provider, c.region, c.committed_gpus, \
                   c.created_at, c.updated_at, c.phase_of, c.tco_purchase_price_per_gpu, \
                   c.tco_salvage_value_per_gpu, c.tco_life_months, c.tco_in_service_from, \
                   c.tco_power_kw_per_gpu, c.tco_electricity_price_per_kwh, \
                   c.tco_other_per_gpu_month, c.pue, c.power_price_per_gpu_hour, \
                   c.energy_price_per_kwh"
                + $from
                + $rest
            $(, $arg)*
        )
    };
}
pub(crate) use select_contracts;

/// [`select_contracts`] of the contracts as given (`c`), without their second phases, valid
/// until their second phase (`t`) ends when they have one; `$rest` follows the `WHERE`
/// clause.
macro_rules! select_given {
    ($head:literal, $rest:literal $(, $arg:expr)* $(,)?) => {
        select_contracts!(
            $head,
            "CASE WHEN t.id IS NULL THEN c.valid_until ELSE t.valid_until END",
            " FROM contracts c LEFT JOIN contracts t ON t.phase_of = c.id \
             WHERE c.phase_of IS NULL",
            $rest
            $(, $arg)*
        )
    };
}

/// The [`ContractRow`] of a row `$r` read by [`select_contracts`], inside a `try_map`.
macro_rules! contract_row {
    ($r:ident) => {
        $crate::store::contracts::ContractRow {
            id: $r.id,
            name: $r.name,
            gpu_model: $r.gpu_model,
            billing_mode: $crate::store::decoded("billing_mode", $r.billing_mode)?,
            price_per_gpu_hour: $r.price_per_gpu_hour,
            currency: $r.currency,
            valid_from: $r.valid_from,
            valid_until: $r.valid_until,
            project_id: $r.project_id,
            provider: $r.provider,
            region: $r.region,
            committed_gpus: $r.committed_gpus,
            created_at: $r.created_at,
            updated_at: $r.updated_at,
            phase_of: $r.phase_of,
            tco_purchase_price_per_gpu: $r.tco_purchase_price_per_gpu,
            tco_salvage_value_per_gpu: $r.tco_salvage_value_per_gpu,
            tco_life_months: $r.tco_life_months,
            tco_in_service_from: $r.tco_in_service_from,
            tco_power_kw_per_gpu: $r.tco_power_kw_per_gpu,
            tco_electricity_price_per_kwh: $r.tco_electricity_price_per_kwh,
            tco_other_per_gpu_month: $r.tco_other_per_gpu_month,
            pue: $r.pue,
            power_price_per_gpu_hour: $r.power_price_per_gpu_hour,
            energy_price_per_kwh: $r.energy_price_per_kwh,
        }
    };
}
pub(crate) use contract_row;

/// What one phase of a contract's fields is stored with, besides its identity: name, model,
/// mode, price, currency, validity, scope, commitment, the TCO (only on the contract's own
/// row), and what measured energy is charged at.
struct PhaseValues<'a> {
    name: &'a str,
    gpu_model: &'a str,
    billing_mode: &'static str,
    price_per_gpu_hour: Decimal,
    currency: &'a str,
    valid_from: DateTime<Utc>,
    valid_until: Option<DateTime<Utc>>,
    project_id: Option<&'a str>,
    provider: Option<&'a str>,
    region: Option<&'a str>,
    committed_gpus: Option<Decimal>,
    purchase_price_per_gpu: Option<Decimal>,
    salvage_value_per_gpu: Option<Decimal>,
    life_months: Option<i32>,
    in_service_from: Option<DateTime<Utc>>,
    power_kw_per_gpu: Option<Decimal>,
    electricity_price_per_kwh: Option<Decimal>,
    other_per_gpu_month: Option<Decimal>,
    pue: Decimal,
    power_price_per_gpu_hour: Decimal,
    energy_price_per_kwh: Decimal,
}

impl<'a> PhaseValues<'a> {
    /// The values of `phase` of `fields`; the TCO itself only on the contract's own row
    /// (`own`).
    fn of(fields: &'a ContractFields, phase: &Phase, own: bool) -> Self {
        let tco = fields.tco.as_ref().filter(|_| own);
        let whole = fields.tco.as_ref();
        PhaseValues {
            name: &fields.name,
            gpu_model: &fields.gpu_model,
            billing_mode: fields.billing_mode.as_str(),
            price_per_gpu_hour: phase.parts.total(),
            currency: &fields.currency,
            valid_from: phase.from,
            valid_until: phase.until,
            project_id: fields.project_id.as_deref(),
            provider: fields.provider.as_deref(),
            region: fields.region.as_deref(),
            committed_gpus: fields.committed_gpus,
            purchase_price_per_gpu: tco.map(|t| t.purchase_price_per_gpu),
            salvage_value_per_gpu: tco.map(|t| t.salvage_value_per_gpu),
            life_months: tco.map(|t| t.life_months as i32),
            in_service_from: tco.map(|t| t.in_service_from),
            power_kw_per_gpu: tco.map(|t| t.power_kw_per_gpu),
            electricity_price_per_kwh: tco.map(|t| t.electricity_price_per_kwh),
            other_per_gpu_month: tco.map(|t| t.other_per_gpu_month),
            pue: whole.map_or(Decimal::ONE, |t| t.pue),
            power_price_per_gpu_hour: phase.parts.power,
            energy_price_per_kwh: whole.map_or(Decimal::ZERO, Tco::energy_price_per_kwh),
        }
    }
}

/// `query!` of `$head`, the columns a phase is stored with, `$middle`, their placeholders
/// (`$2` to `$22`), then `$tail` (all literals), binding contract or phase `$id` as `$1`, the
/// [`PhaseValues`] `$values`, then `$extra` (`$23`).
macro_rules! store_phase {
    ($head:literal, $middle:literal, $tail:literal, $id:expr, $values:expr $(, $extra:expr)?) => {
        sqlx::query!(
            $head
                + "name, gpu_model, billing_mode, price_per_gpu_hour, currency, valid_from, \
                   valid_until, project_id, provider, region, committed_gpus, \
                   tco_purchase_price_per_gpu, tco_salvage_value_per_gpu, tco_life_months, \
                   tco_in_service_from, tco_power_kw_per_gpu, tco_electricity_price_per_kwh, \
                   tco_other_per_gpu_month, pue, power_price_per_gpu_hour, energy_price_per_kwh"
                + $middle
                + "$2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
                   $19, $20, $21, $22"
                + $tail,
            $id,
            $values.name,
            $values.gpu_model,
            $values.billing_mode,
            $values.price_per_gpu_hour,
            $values.currency,
            $values.valid_from,
            $values.valid_until,
            $values.project_id,
            $values.provider,
            $values.region,
            $values.committed_gpus,
            $values.purchase_price_per_gpu,
            $values.salvage_value_per_gpu,
            $values.life_months,
            $values.in_service_from,
            $values.power_kw_per_gpu,
            $values.electricity_price_per_kwh,
            $values.other_per_gpu_month,
            $values.pue,
            $values.power_price_per_gpu_hour,
            $values.energy_price_per_kwh
            $(, $extra)?
        )
    };
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
    let old_second: Option<(Uuid, DateTime<Utc>, Option<DateTime<Utc>>)> =
        match exists {
            true => sqlx::query!(
                "SELECT id, valid_from, valid_until FROM contracts WHERE phase_of = $1 FOR UPDATE",
                id,
            )
            .map(|row| (row.id, row.valid_from, row.valid_until))
            .fetch_optional(&mut *conn)
            .await?,
            false => None,
        };
    let kept = old_second.filter(|(_, from, until)| {
        second.is_some_and(|phase| (phase.from, phase.until) == (*from, *until))
    });
    if old_second.is_some() && kept.is_none() {
        // Moved or gone: out of the way before the first phase may take its hours.
        sqlx::query!("DELETE FROM contracts WHERE phase_of = $1", id)
            .execute(&mut *conn)
            .await?;
    }
    let own = PhaseValues::of(fields, first, true);
    match exists {
        true => store_phase!(
            "UPDATE contracts SET (",
            ", updated_at) = (",
            ", now()) WHERE id = $1",
            id,
            own
        ),
        false => store_phase!(
            "INSERT INTO contracts (id, ",
            ") VALUES ($1, ",
            ")",
            id,
            own
        ),
    }
    .execute(&mut *conn)
    .await?;
    if let Some(phase) = second {
        let values = PhaseValues::of(fields, phase, false);
        match kept {
            Some((phase_id, _, _)) => store_phase!(
                "UPDATE contracts SET (",
                ", updated_at) = (",
                ", now()) WHERE id = $1",
                phase_id,
                values
            ),
            None => store_phase!(
                "INSERT INTO contracts (id, ",
                ", phase_of) VALUES ($1, ",
                ", $23)",
                Uuid::new_v4(),
                values,
                id
            ),
        }
        .execute(&mut *conn)
        .await?;
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
    match for_update {
        true => {
            select_given!(
                "SELECT ",
                " AND c.id = coalesce((SELECT phase_of FROM contracts WHERE id = $1), $1) \
             FOR UPDATE OF c",
                id,
            )
            .try_map(|r| Ok(contract_row!(r)))
            .fetch_optional(conn)
            .await
        }
        false => {
            select_given!(
                "SELECT ",
                " AND c.id = coalesce((SELECT phase_of FROM contracts WHERE id = $1), $1)",
                id,
            )
            .try_map(|r| Ok(contract_row!(r)))
            .fetch_optional(conn)
            .await
        }
    }
}

/// Contracts as given in force at `at`, for every project or only those that could price
/// `project`'s GPU time (unscoped or scoped to it), by model, mode and id.
pub async fn in_force(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
    project: Option<&str>,
) -> sqlx::Result<Vec<ContractRow>> {
    select_given!(
        "SELECT * FROM (SELECT ",
        ") AS given \
         WHERE valid_from <= $1 AND (valid_until IS NULL OR valid_until > $1) \
           AND ($2::text IS NULL OR project_id IS NULL OR project_id = $2) \
         ORDER BY gpu_model, billing_mode, id",
        at,
        project,
    )
    .try_map(|r| Ok(contract_row!(r)))
    .fetch_all(conn)
    .await
}

/// Deletes a contract and its second phase.
pub async fn delete(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM contracts WHERE id = $1", id)
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
    select_given!(
        "SELECT ",
        " AND ($1::uuid IS NULL OR c.id > $1) ORDER BY c.id LIMIT $2",
        after,
        limit,
    )
    .try_map(|r| Ok(contract_row!(r)))
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
    sqlx::query_scalar!(
        "SELECT id FROM contracts \
         WHERE gpu_model = $1 AND billing_mode = $2 \
           AND project_id IS NOT DISTINCT FROM $3 AND provider IS NOT DISTINCT FROM $4 \
           AND region IS NOT DISTINCT FROM $5 \
           AND tstzrange(valid_from, valid_until) && tstzrange($6, $7) \
           AND ($8::uuid IS NULL OR (id <> $8 AND phase_of IS DISTINCT FROM $8)) \
         ORDER BY valid_from LIMIT 1",
        fields.gpu_model,
        fields.billing_mode.as_str(),
        fields.project_id,
        fields.provider,
        fields.region,
        fields.valid_from,
        fields.valid_until,
        except,
    )
    .fetch_optional(conn)
    .await
}

/// Every contract that prices one of the `(gpu_model, billing_mode)` kinds.
pub async fn for_kinds(
    conn: &mut PgConnection,
    models: &[String],
    modes: &[String],
) -> sqlx::Result<Vec<ContractRow>> {
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        " FROM contracts c",
        " WHERE (gpu_model, billing_mode) IN (SELECT * FROM UNNEST($1::text[], $2::text[]))",
        models,
        modes,
    )
    .try_map(|r| Ok(contract_row!(r)))
    .fetch_all(conn)
    .await
}

/// Ids of the contracts priced in `currency`.
pub async fn ids_in_currency(conn: &mut PgConnection, currency: &str) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!("SELECT id FROM contracts WHERE currency = $1", currency)
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
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        " FROM contracts c",
        " WHERE project_id = coalesce($1, project_id) AND billing_mode = 'reserved' \
           AND committed_gpus IS NOT NULL \
           AND valid_from < $3 AND (valid_until IS NULL OR valid_until > $2) \
         ORDER BY id",
        project,
        from,
        to,
    )
    .try_map(|r| Ok(contract_row!(r)))
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
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        " FROM contracts c",
        " WHERE (project_id IS NULL OR project_id = $1) \
           AND valid_from < $3 AND (valid_until IS NULL OR valid_until > $2) \
         ORDER BY id",
        project,
        from,
        to,
    )
    .try_map(|r| Ok(contract_row!(r)))
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
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        " FROM contracts c",
        " WHERE project_id IS NULL AND billing_mode = 'reserved' \
           AND committed_gpus IS NOT NULL \
           AND valid_from < $2 AND (valid_until IS NULL OR valid_until > $1) \
         ORDER BY id",
        from,
        to,
    )
    .try_map(|r| Ok(contract_row!(r)))
    .fetch_all(conn)
    .await
}

/// Reserved contracts with a commitment, scoped to a project or not, valid in `[from, to)`.
pub async fn commitments(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<ContractRow>> {
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        " FROM contracts c",
        " WHERE billing_mode = 'reserved' AND committed_gpus IS NOT NULL \
           AND valid_from < $2 AND (valid_until IS NULL OR valid_until > $1) \
         ORDER BY project_id NULLS FIRST, name, id",
        from,
        to,
    )
    .try_map(|r| Ok(contract_row!(r)))
    .fetch_all(conn)
    .await
}

/// The contracts of `ids` that exist.
pub async fn by_ids(conn: &mut PgConnection, ids: &[Uuid]) -> sqlx::Result<Vec<ContractRow>> {
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        " FROM contracts c",
        " WHERE id = ANY($1) ORDER BY id",
        ids,
    )
    .try_map(|r| Ok(contract_row!(r)))
    .fetch_all(conn)
    .await
}
