//! Changing what GPU time costs: pricing contracts and FX rates.
//!
//! Prices and FX rates are applied when a figure is read, so a change of a contract's price,
//! name, commitment or currency, or of an FX rate, writes its one row and nothing else: the
//! next read prices every record with it, whenever the record was posted. A change of which
//! contract prices which hours (creation, deletion, model, billing mode, validity, scope)
//! takes the kind's contract-set lock exclusive, stores the contract with a re-assignment job
//! in one transaction, and runs the job before it answers (see [`crate::ledger::rating`]).
//! Every change then re-evaluates the budget burn it may have moved.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::rating::{BillingMode, FxRates};
use crate::domain::validation::{FieldError, Violations};
use crate::domain::values::{Currency, Month};
use crate::ledger::{LedgerError, LedgerResult, alerting, audit, rating};
use crate::store;
use crate::store::contracts::OVERLAP_CONSTRAINT;
pub use crate::store::contracts::{ContractFields, ContractRow};
pub use crate::store::fx_rates::FxRateRow;
use crate::store::rating::{KindSpan, ReratingJob};

/// A contract as the audit log keeps it: its terms as the API shows them.
fn contract_snapshot(row: &ContractRow) -> Value {
    let terms = row.fields();
    let first = terms.phases()[0].parts.total().normalize();
    json!({
        "id": row.id,
        "name": row.name,
        "gpu_model": row.gpu_model,
        "billing_mode": row.billing_mode.as_str(),
        "price_per_gpu_hour": first,
        "tco": terms.tco.as_ref().map(|tco| json!({
            "purchase_price_per_gpu": tco.purchase_price_per_gpu.normalize(),
            "salvage_value_per_gpu": tco.salvage_value_per_gpu.normalize(),
            "life_months": tco.life_months,
            "in_service_from": tco.in_service_from,
            "power_kw_per_gpu": tco.power_kw_per_gpu.normalize(),
            "electricity_price_per_kwh": tco.electricity_price_per_kwh.normalize(),
            "pue": tco.pue.normalize(),
            "other_per_gpu_month": tco.other_per_gpu_month.normalize(),
        })),
        "depreciated_from": terms.depreciated_from(),
        "currency": row.currency,
        "valid_from": row.valid_from,
        "valid_until": row.valid_until,
        "project": row.project_id,
        "provider": row.provider,
        "region": row.region,
        "committed_gpus": row.committed_gpus.map(|gpus| gpus.normalize()),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    })
}

fn fx_rate_snapshot(row: &FxRateRow) -> Value {
    json!({
        "month": Month::from_first_day(row.month).to_string(),
        "from": row.from_currency,
        "to": row.to_currency,
        "rate": row.rate.normalize(),
        "updated_at": row.updated_at,
    })
}

/// The records a contract with these terms could price over `span`.
fn priced_by(fields: &ContractFields, span: (DateTime<Utc>, Option<DateTime<Utc>>)) -> KindSpan {
    KindSpan {
        gpu_model: fields.gpu_model.clone(),
        billing_mode: fields.billing_mode,
        project: fields.project_id.clone(),
        span,
    }
}

/// Commits the change, runs the re-assignments it owes, and re-evaluates every project's
/// current month (a price can move any project's spend).
async fn commit_and_reassign(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    pool: &PgPool,
    jobs: Vec<ReratingJob>,
    settings: &Settings,
) -> LedgerResult<()> {
    tx.commit().await?;
    for job in &jobs {
        rating::run_job(pool, job.id, settings.timezone, true).await?;
    }
    alerting::evaluate_current_month(pool, settings).await;
    Ok(())
}

/// Whether a change of a contract's terms from `old` to `new` moves which contract prices
/// which hours: its model, billing mode, validity, scope, or where a TCO contract's
/// depreciation ends inside its validity. Its price, currency, name, commitment and the rest
/// of its TCO are read with every figure and re-assign nothing.
fn reassigns(old: &ContractFields, new: &ContractFields) -> bool {
    fn assigns(f: &ContractFields) -> impl PartialEq + '_ {
        let bounds: Vec<_> = f.phases().iter().map(|p| (p.from, p.until)).collect();
        (
            f.gpu_model.as_str(),
            f.billing_mode,
            bounds,
            f.project_id.as_deref(),
            f.provider.as_deref(),
            f.region.as_deref(),
        )
    }
    assigns(old) != assigns(new)
}

/// The rules that bind a contract's fields to each other, checked on creation and after
/// every change.
pub fn check_consistency(violations: &mut Violations, fields: &ContractFields) {
    if fields
        .valid_until
        .is_some_and(|until| until <= fields.valid_from)
    {
        violations.push("/valid_until", "must be after valid_from");
    }
    if fields.committed_gpus.is_some() && fields.billing_mode != BillingMode::Reserved {
        violations.push("/committed_gpus", "only reserved contracts commit GPUs");
    }
    if fields.tco.is_some() && fields.billing_mode != BillingMode::Reserved {
        violations.push(
            "/tco",
            "only reserved contracts are priced by their TCO: an owned card is paid for whether \
             it is used or not",
        );
    }
}

async fn overlap_conflict(
    conn: &mut PgConnection,
    fields: &ContractFields,
    except: Option<Uuid>,
) -> LedgerResult<LedgerError> {
    let other = store::contracts::equally_specific_overlap(conn, fields, except).await?;
    let detail = match other {
        Some(id) => format!(
            "contract {id} has the same model, billing mode and scope and overlaps this validity"
        ),
        None => "an equally specific contract overlaps this validity".to_owned(),
    };
    Ok(LedgerError::Conflict(
        detail,
        vec![FieldError::new(
            "/valid_from",
            "overlaps an equally specific contract",
        )],
    ))
}

/// Stores a contract's terms (a new one, or `existing` changed), refusing an equally
/// specific contract that overlaps it in time.
async fn store_contract(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    pool: &PgPool,
    fields: &ContractFields,
    existing: Option<Uuid>,
) -> LedgerResult<ContractRow> {
    if store::contracts::equally_specific_overlap(tx, fields, existing)
        .await?
        .is_some()
    {
        return Err(overlap_conflict(tx, fields, existing).await?);
    }
    let stored = match existing {
        Some(id) => store::contracts::put(tx, id, fields, true).await,
        None => store::contracts::put(tx, Uuid::new_v4(), fields, false).await,
    };
    match stored {
        Ok(row) => Ok(row),
        Err(error) if store::is_constraint_violation(&error, OVERLAP_CONSTRAINT) => {
            // A concurrent change won the race; it is committed now, so it can be named.
            let mut conn = pool.acquire().await?;
            Err(overlap_conflict(&mut conn, fields, existing).await?)
        }
        Err(error) => Err(error.into()),
    }
}

fn contract_not_found(id: Uuid) -> LedgerError {
    LedgerError::NotFound(format!("contract `{id}` does not exist"))
}

/// Creates a contract from the request's terms as parsed — `fields` when every required
/// one parsed, `violations` found so far, `project` when the one it names parsed — and
/// re-rates the records it prices. Every error is reported at once, a project that does not
/// exist and rules that bind fields to each other included.
pub async fn create_contract(
    pool: &PgPool,
    fields: Option<ContractFields>,
    mut violations: Violations,
    project: Option<&str>,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<ContractRow> {
    if let Some(project) = project
        && store::projects::get(pool, project).await?.is_none()
    {
        violations.push("/project", format!("project `{project}` does not exist"));
    }
    let Some(fields) = fields else {
        return Err(violations.into());
    };
    check_consistency(&mut violations, &fields);
    violations.into_result()?;
    let mut tx = pool.begin().await?;
    rating::change_contract_sets(&mut tx, [(fields.gpu_model.clone(), fields.billing_mode)])
        .await?;
    let row = store_contract(&mut tx, pool, &fields, None).await?;
    let job = rating::owe_reassignment(
        &mut tx,
        &priced_by(&fields, (fields.valid_from, fields.valid_until)),
    )
    .await?;
    let change = Change::new(
        "contract",
        row.id.to_string(),
        "create",
        None,
        Some(contract_snapshot(&row)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    commit_and_reassign(tx, pool, vec![job], settings).await?;
    Ok(row)
}

/// Changes a contract with `change`, which gets its current terms and returns the new ones
/// with what is invalid about the request; re-rates what the old and new terms price.
pub async fn update_contract(
    pool: &PgPool,
    id: Uuid,
    change: impl FnOnce(&ContractFields) -> (ContractFields, Violations),
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<ContractRow> {
    let mut tx = pool.begin().await?;
    let before = store::contracts::get(&mut tx, id, true)
        .await?
        .ok_or_else(|| contract_not_found(id))?;
    let old = before.fields();
    let (new, mut violations) = change(&old);
    check_consistency(&mut violations, &new);
    violations.into_result()?;
    let mut jobs = Vec::new();
    if reassigns(&old, &new) {
        rating::change_contract_sets(
            &mut tx,
            [
                (old.gpu_model.clone(), old.billing_mode),
                (new.gpu_model.clone(), new.billing_mode),
            ],
        )
        .await?;
        let mut owed = vec![priced_by(&old, (old.valid_from, old.valid_until))];
        let new_span = priced_by(&new, (new.valid_from, new.valid_until));
        if !owed.contains(&new_span) {
            owed.push(new_span);
        }
        for of in &owed {
            jobs.push(rating::owe_reassignment(&mut tx, of).await?);
        }
    }
    let row = store_contract(&mut tx, pool, &new, Some(id)).await?;
    let change = Change::new(
        "contract",
        id.to_string(),
        "update",
        Some(contract_snapshot(&before)),
        Some(contract_snapshot(&row)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    commit_and_reassign(tx, pool, jobs, settings).await?;
    Ok(row)
}

/// Deletes a contract; what it priced is re-rated (and may become unrated).
pub async fn delete_contract(
    pool: &PgPool,
    id: Uuid,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<()> {
    let mut tx = pool.begin().await?;
    let before = store::contracts::get(&mut tx, id, true)
        .await?
        .ok_or_else(|| contract_not_found(id))?;
    let old = before.fields();
    rating::change_contract_sets(&mut tx, [(old.gpu_model.clone(), old.billing_mode)]).await?;
    store::contracts::delete(&mut tx, id).await?;
    let job =
        rating::owe_reassignment(&mut tx, &priced_by(&old, (old.valid_from, old.valid_until)))
            .await?;
    let change = Change::new(
        "contract",
        id.to_string(),
        "delete",
        Some(contract_snapshot(&before)),
        None,
    );
    audit::record_one(&mut tx, actor, change).await?;
    commit_and_reassign(tx, pool, vec![job], settings).await
}

/// Sets the rate of one month and currency pair. Rates apply when figures are read, so this
/// writes the rate alone.
pub async fn put_fx_rate(
    pool: &PgPool,
    (month, from, to): (Month, Currency, Currency),
    rate: Decimal,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<FxRateRow> {
    let mut tx = pool.begin().await?;
    let (day, from, to) = (month.first_day(), from.code(), to.code());
    // A new rate is inserted alone; an existing one is locked first, so `before` is the rate
    // this change replaces.
    let (before, row) = match store::fx_rates::insert_new(&mut tx, day, from, to, rate).await? {
        Some(row) => (None, row),
        None => {
            let before = store::fx_rates::get_for_update(&mut tx, day, from, to).await?;
            (
                before,
                store::fx_rates::put(&mut tx, day, from, to, rate).await?,
            )
        }
    };
    let change = Change::new(
        "fx_rate",
        format!("{month}/{from}/{to}"),
        if before.is_some() { "update" } else { "create" },
        before.as_ref().map(fx_rate_snapshot),
        Some(fx_rate_snapshot(&row)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    commit_and_reassign(tx, pool, Vec::new(), settings).await?;
    Ok(row)
}

/// Deletes the rate of one month and currency pair; what it converted reads as unrated.
pub async fn delete_fx_rate(
    pool: &PgPool,
    (month, from, to): (Month, Currency, Currency),
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<()> {
    let mut tx = pool.begin().await?;
    let Some(before) =
        store::fx_rates::delete(&mut tx, month.first_day(), from.code(), to.code()).await?
    else {
        return Err(LedgerError::NotFound(format!(
            "no FX rate {month}/{from}/{to}"
        )));
    };
    let change = Change::new(
        "fx_rate",
        format!("{month}/{from}/{to}"),
        "delete",
        Some(fx_rate_snapshot(&before)),
        None,
    );
    audit::record_one(&mut tx, actor, change).await?;
    commit_and_reassign(tx, pool, Vec::new(), settings).await
}

/// Contracts in id order after `after`.
pub async fn contracts(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: i64,
) -> LedgerResult<Vec<ContractRow>> {
    let mut conn = pool.acquire().await?;
    Ok(store::contracts::list(&mut conn, after, limit).await?)
}

pub async fn contract(pool: &PgPool, id: Uuid) -> LedgerResult<Option<ContractRow>> {
    let mut conn = pool.acquire().await?;
    Ok(store::contracts::get(&mut conn, id, false).await?)
}

/// What a GPU of each contract in force at `at` costs then: the contract as given and its
/// phase at `at` (every contract, or those that could price `project`'s GPU time), with the
/// price per GPU-hour in `currency` at the month's FX rate where one is asked for (`None`
/// where the rate is missing).
pub async fn prices_at(
    pool: &PgPool,
    at: DateTime<Utc>,
    project: Option<(&str, &str)>,
    tz: chrono_tz::Tz,
) -> LedgerResult<Vec<PriceAt>> {
    let mut conn = pool.acquire().await?;
    let rows = store::contracts::in_force(&mut conn, at, project.map(|(id, _)| id)).await?;
    let month = crate::domain::ledger_time::LedgerHour::holding(at, tz).month;
    let currencies: Vec<String> = project.map(|(_, c)| c.to_owned()).into_iter().collect();
    let rates = store::fx_rates::table(&mut conn, month, month, &currencies).await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let terms = row.fields();
            let phase = terms
                .phases()
                .into_iter()
                .find(|phase| phase.from <= at && phase.until.is_none_or(|until| at < until))?;
            let converted = project.and_then(|(_, currency)| {
                rates
                    .conversion(month, &row.currency, currency)
                    .map(|rate| phase.parts.total() * rate)
            });
            Some(PriceAt {
                row,
                phase,
                converted,
            })
        })
        .collect())
}

/// A contract's price at an instant (see [`prices_at`]).
#[derive(Debug, Clone)]
pub struct PriceAt {
    pub row: ContractRow,
    pub phase: crate::domain::tco::Phase,
    /// The price per GPU-hour in the currency asked for.
    pub converted: Option<Decimal>,
}

/// FX rates in `(month, from, to)` order after `after`.
pub async fn fx_rates(
    pool: &PgPool,
    after: Option<&(chrono::NaiveDate, String, String)>,
    limit: i64,
) -> LedgerResult<Vec<FxRateRow>> {
    let mut conn = pool.acquire().await?;
    Ok(store::fx_rates::list(&mut conn, after, limit).await?)
}
