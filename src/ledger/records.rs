//! Reading stored job records (one with its history, or a project's page of them), and
//! correcting one.

use std::collections::BTreeSet;

use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::record::{JobRecord, RecordKey};
use crate::domain::values::Month;
use crate::domain::values::months_between;
use crate::ledger::alerting;
use crate::ledger::instruments::{Rating, RatingCause};
use crate::ledger::{LedgerError, LedgerResult, audit, capacity_rollup, rating};
use crate::store;
pub use crate::store::records::{RecordFilter, RecordRow, VersionRow};

/// A stored record and its earlier versions, oldest first.
pub struct RecordHistory {
    pub record: RecordRow,
    pub history: Vec<VersionRow>,
}

fn no_record(key: &RecordKey) -> LedgerError {
    LedgerError::NotFound(format!("no job record {key}"))
}

/// A stored record with every earlier version.
pub async fn record_with_history(pool: &PgPool, key: &RecordKey) -> LedgerResult<RecordHistory> {
    let record = store::records::get(pool, key)
        .await?
        .ok_or_else(|| no_record(key))?;
    let history = store::records::history(pool, key).await?;
    Ok(RecordHistory { record, history })
}

/// Replaces a stored record with its corrected version, keeping the one it replaces in the
/// history (with who replaced it), re-rates the record's task and judges the record for idle
/// GPUs in the same transaction (a correction that makes it idle fires the task's alert if
/// none fired yet), and re-evaluates the budget burn of every month the old or new record
/// touches. An identical record changes nothing. The audit log keeps the record's content
/// before and after, as its canonical form.
pub async fn correct(
    pool: &PgPool,
    record: JobRecord,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<RecordHistory> {
    let key = record.key.clone();
    let tz = settings.timezone;
    let mut tx = pool.begin().await?;
    rating::hold_contract_sets(&mut tx, [(record.gpu_model.clone(), record.billing_mode)]).await?;
    let previous = store::records::lock(&mut tx, &key)
        .await?
        .ok_or_else(|| no_record(&key))?;
    let changed = previous.to_record().content_hash() != record.content_hash();
    if changed {
        store::records::replace(&mut tx, &previous, &record, actor.token_id()).await?;
        let rating = Rating::start(RatingCause::Correction);
        let touched = rating::rate_records(&mut tx, std::slice::from_ref(&key), tz, false).await?;
        capacity_rollup::refresh_rated(&mut tx, touched, tz).await?;
        rating.finished(1);
        alerting::fire_idle_gpu(&mut tx, &[&record], settings.clock.now(), tz).await?;
        let change = Change::new(
            "job_record",
            key.to_string(),
            "correct",
            Some(previous.to_record().canonical_json()),
            Some(record.canonical_json()),
        );
        audit::record_one(&mut tx, actor, change).await?;
    }
    tx.commit().await?;
    if changed {
        let months: BTreeSet<Month> = months_between(previous.started_at, previous.ended_at, tz)
            .into_iter()
            .chain(months_between(record.started_at, record.ended_at, tz))
            .collect();
        alerting::evaluate_all(
            pool,
            months.into_iter().map(|month| (key.project.clone(), month)),
            settings,
        )
        .await;
    }
    record_with_history(pool, &key).await
}

/// Records of a project by `started_at` in the filter's window, in start order.
pub async fn list(
    pool: &PgPool,
    project: &str,
    filter: &RecordFilter,
    limit: i64,
) -> LedgerResult<Vec<RecordRow>> {
    Ok(store::records::list(pool, project, filter, limit).await?)
}
