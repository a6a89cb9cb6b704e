//! Changing what GPU time costs: pricing contracts and FX rates. Every change follows one
//! path — in one transaction, store it (refusing an equally specific overlap), re-rate what
//! it touches, commit — and then re-evaluates the budget burn it may have moved.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::ledger_time::month_bounds;
use crate::domain::rating::BillingMode;
use crate::domain::validation::{FieldError, Violations};
use crate::domain::values::{Currency, Month};
use crate::ledger::instruments::{Rating, RatingCause};
use crate::ledger::{LedgerError, LedgerResult, alerting};
use crate::store;
use crate::store::contracts::{ContractFields, ContractRow, OVERLAP_CONSTRAINT};
use crate::store::fx_rates::FxRateRow;
use crate::store::rating::Rerating;

/// What a price change must re-rate.
enum Rerate<'a> {
    /// Every record a contract with these terms could price over the span.
    Contract {
        fields: &'a ContractFields,
        span: (DateTime<Utc>, Option<DateTime<Utc>>),
        how: Rerating,
    },
    /// What the month's rate from one currency into another converts.
    Fx {
        month: Month,
        from: Currency,
        to: Currency,
        how: Rerating,
    },
    /// Nothing: no term rating reads changed (a contract's name or commitment, which
    /// figures read as they are).
    Nothing,
}

/// Re-rates in the change's transaction, commits, and re-evaluates every project's current
/// month (a price can move any project's spend).
async fn rerate_and_commit(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    pool: &PgPool,
    rerate: Rerate<'_>,
    settings: &Settings,
) -> LedgerResult<()> {
    let tz = settings.timezone;
    let run = match rerate {
        Rerate::Contract { fields, span, how } => {
            let rating = Rating::start(RatingCause::Contract);
            let rerated = store::rating::rerate_kind(
                &mut tx,
                &fields.gpu_model,
                fields.billing_mode,
                fields.project_id.as_deref(),
                span,
                tz,
                how,
            )
            .await?;
            Some((rating, rerated))
        }
        Rerate::Fx {
            month,
            from,
            to,
            how,
        } => {
            let rating = Rating::start(RatingCause::Fx);
            let rerated = store::rating::rerate_fx(
                &mut tx,
                month_bounds(month.first_day(), tz),
                (from.code(), to.code()),
                tz,
                how,
            )
            .await?;
            Some((rating, rerated))
        }
        Rerate::Nothing => None,
    };
    if let Some((rating, rerated)) = run {
        rating.finished(rerated);
    }
    tx.commit().await?;
    alerting::evaluate_current_month(pool, settings).await;
    Ok(())
}

/// What a change of a contract's terms from `old` to `new` moves in what is rated: its
/// model, billing mode, currency, validity or scope decide which contract prices which
/// hours; its price alone, only what those hours cost; its name and commitment, nothing.
fn rerating_of(old: &ContractFields, new: &ContractFields) -> Option<Rerating> {
    fn assigns(f: &ContractFields) -> impl PartialEq + '_ {
        (
            f.gpu_model.as_str(),
            f.billing_mode,
            f.currency.as_str(),
            f.valid_from,
            f.valid_until,
            f.project_id.as_deref(),
            f.provider.as_deref(),
            f.region.as_deref(),
        )
    }
    if assigns(old) != assigns(new) {
        Some(Rerating::Whole)
    } else if old.price_per_gpu_hour != new.price_per_gpu_hour {
        Some(Rerating::Prices)
    } else {
        None
    }
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
        Some(id) => store::contracts::update(tx, id, fields).await,
        None => store::contracts::insert(tx, Uuid::new_v4(), fields).await,
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
    let row = store_contract(&mut tx, pool, &fields, None).await?;
    let span = (fields.valid_from, fields.valid_until);
    rerate_and_commit(
        tx,
        pool,
        Rerate::Contract {
            fields: &fields,
            span,
            how: Rerating::Whole,
        },
        settings,
    )
    .await?;
    Ok(row)
}

/// Changes a contract with `change`, which gets its current terms and returns the new ones
/// with what is invalid about the request; re-rates what the old and new terms price.
pub async fn update_contract(
    pool: &PgPool,
    id: Uuid,
    change: impl FnOnce(&ContractFields) -> (ContractFields, Violations),
    settings: &Settings,
) -> LedgerResult<ContractRow> {
    let mut tx = pool.begin().await?;
    let old = store::contracts::get(&mut tx, id, true)
        .await?
        .ok_or_else(|| contract_not_found(id))?
        .fields();
    let (new, mut violations) = change(&old);
    check_consistency(&mut violations, &new);
    violations.into_result()?;
    let row = store_contract(&mut tx, pool, &new, Some(id)).await?;
    let until = old.valid_until.zip(new.valid_until).map(|(a, b)| a.max(b));
    let span = (old.valid_from.min(new.valid_from), until);
    let rerate = match rerating_of(&old, &new) {
        Some(how) => Rerate::Contract {
            fields: &new,
            span,
            how,
        },
        None => Rerate::Nothing,
    };
    rerate_and_commit(tx, pool, rerate, settings).await?;
    Ok(row)
}

/// Deletes a contract; what it priced is re-rated (and may become unrated).
pub async fn delete_contract(pool: &PgPool, id: Uuid, settings: &Settings) -> LedgerResult<()> {
    let mut tx = pool.begin().await?;
    let old = store::contracts::get(&mut tx, id, true)
        .await?
        .ok_or_else(|| contract_not_found(id))?
        .fields();
    store::contracts::delete(&mut tx, id).await?;
    let span = (old.valid_from, old.valid_until);
    let rerate = Rerate::Contract {
        fields: &old,
        span,
        how: Rerating::Whole,
    };
    rerate_and_commit(tx, pool, rerate, settings).await
}

/// Sets the rate of one month and currency pair; re-rates what it converts. A rate that
/// replaces another only moves the cost of what it already converted.
pub async fn put_fx_rate(
    pool: &PgPool,
    (month, from, to): (Month, Currency, Currency),
    rate: Decimal,
    settings: &Settings,
) -> LedgerResult<FxRateRow> {
    let mut tx = pool.begin().await?;
    let (first, from_code, to_code) = (month.first_day(), from.code(), to.code());
    let how = match store::fx_rates::exists(&mut tx, first, from_code, to_code).await? {
        true => Rerating::Prices,
        false => Rerating::Whole,
    };
    let row = store::fx_rates::put(&mut tx, first, from_code, to_code, rate).await?;
    let rerate = Rerate::Fx {
        month,
        from,
        to,
        how,
    };
    rerate_and_commit(tx, pool, rerate, settings).await?;
    Ok(row)
}

/// Deletes the rate of one month and currency pair; what it converted becomes unrated.
pub async fn delete_fx_rate(
    pool: &PgPool,
    (month, from, to): (Month, Currency, Currency),
    settings: &Settings,
) -> LedgerResult<()> {
    let mut tx = pool.begin().await?;
    if !store::fx_rates::delete(&mut tx, month.first_day(), from.code(), to.code()).await? {
        return Err(LedgerError::NotFound(format!(
            "no FX rate {month}/{from}/{to}"
        )));
    }
    let rerate = Rerate::Fx {
        month,
        from,
        to,
        how: Rerating::Whole,
    };
    rerate_and_commit(tx, pool, rerate, settings).await
}
