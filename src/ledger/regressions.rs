//! Efficiency regressions (COST_MODEL §11): each workload's daily direct cost per unit judged
//! by its project's rule, one `efficiency_regression` alert per level shift, and the rule and
//! states the API shows.
//!
//! Judged on the burn tick (at most hourly), on committed data read in one snapshot. Firing
//! is a state transition: `store::regressions::mark_regressed` changes a workload's row only
//! when it was not regressed, in the transaction that stores the alert and its outbox row, so
//! two judges racing fire one alert; the alert's unique key on (project, workload, unit,
//! window start) holds even if the state were lost.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use chrono::{DateTime, Days, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::figures::FigureSums;
use crate::domain::ledger_time::{first_instant_of_day, first_of_month};
use crate::domain::regression::{self, DEFAULT_RULE, DayCost, RegressionRule, Verdict};
use crate::ledger::alerting::{self, AlertRow, RegressionAlert};
use crate::ledger::efficiency::FactorsView;
use crate::ledger::instruments;
use crate::ledger::{LedgerResult, audit};
use crate::store;
use crate::store::projects::ProjectRow;
use crate::store::regressions::{Judged, NewRegressionAlert, RuleRow, TargetRow};

/// The burn tick's job name for judging regressions, and how often it runs: the judgement
/// moves when a ledger day completes or late records arrive, not by the minute.
pub const JOB: &str = "efficiency_regressions";
pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A project's rule as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RegressionRuleView {
    /// False turns the project's regression alerts off.
    pub enabled: bool,
    /// The share by which the window's level must exceed the baseline's.
    #[schema(value_type = String, example = "0.25")]
    pub threshold: Decimal,
    /// The least extra cost per day worth an alert, in the project's currency.
    #[schema(value_type = String, example = "10")]
    pub min_extra_cost: Decimal,
    pub window_days: u32,
    pub baseline_days: u32,
    /// Completed records with output in the unit that must have ended in the window.
    pub min_records: u32,
    /// False while the project has no rule of its own and is judged by the defaults.
    pub customised: bool,
    pub updated_at: Option<DateTime<Utc>>,
}

/// Whether a workload in a unit is regressed now, and the levels last judged.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RegressionStateView {
    pub workload: String,
    pub unit: String,
    pub regressed: bool,
    /// The first day of the window whose level shift fired.
    pub since: NaiveDate,
    /// The ledger day after the window that last changed the state.
    pub judged_on: NaiveDate,
    pub recovered_on: Option<NaiveDate>,
    #[schema(value_type = String)]
    pub baseline_cost_per_unit: Decimal,
    #[schema(value_type = String)]
    pub window_cost_per_unit: Decimal,
}

/// A project's regression rule and the workloads that have regressed (now or before).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RegressionsView {
    pub project: String,
    pub currency: String,
    pub rule: RegressionRuleView,
    pub workloads: Vec<RegressionStateView>,
}

fn u32_of(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn i32_of(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// The rule stored, or the defaults; and whether it is on.
fn rule_of(stored: Option<&RuleRow>) -> (bool, RegressionRule) {
    match stored {
        None => (true, DEFAULT_RULE),
        Some(row) => (
            row.enabled,
            RegressionRule {
                threshold: row.threshold,
                min_extra_cost: row.min_extra_cost,
                window_days: u32_of(row.window_days),
                baseline_days: u32_of(row.baseline_days),
                min_records: u32_of(row.min_records),
            },
        ),
    }
}

fn target_rule(target: &TargetRow) -> RegressionRule {
    RegressionRule {
        threshold: target.threshold.unwrap_or(DEFAULT_RULE.threshold),
        min_extra_cost: target.min_extra_cost.unwrap_or(DEFAULT_RULE.min_extra_cost),
        window_days: target.window_days.map_or(DEFAULT_RULE.window_days, u32_of),
        baseline_days: target
            .baseline_days
            .map_or(DEFAULT_RULE.baseline_days, u32_of),
        min_records: target.min_records.map_or(DEFAULT_RULE.min_records, u32_of),
    }
}

/// A project's rule and its workloads' states.
pub async fn status(pool: &PgPool, project: &ProjectRow) -> LedgerResult<RegressionsView> {
    let stored = store::regressions::rule(&mut *pool.acquire().await?, &project.id).await?;
    let (enabled, rule) = rule_of(stored.as_ref());
    let states = store::regressions::states(pool, &project.id).await?;
    Ok(RegressionsView {
        project: project.id.clone(),
        currency: project.currency.clone(),
        rule: RegressionRuleView {
            enabled,
            threshold: rule.threshold.normalize(),
            min_extra_cost: rule.min_extra_cost.normalize(),
            window_days: rule.window_days,
            baseline_days: rule.baseline_days,
            min_records: rule.min_records,
            customised: stored.is_some(),
            updated_at: stored.map(|row| row.updated_at),
        },
        workloads: states
            .into_iter()
            .map(|row| RegressionStateView {
                workload: row.workload,
                unit: row.output_unit,
                regressed: row.regressed,
                since: row.since,
                judged_on: row.judged_on,
                recovered_on: row.recovered_on,
                baseline_cost_per_unit: row.baseline_cost_per_unit.normalize(),
                window_cost_per_unit: row.window_cost_per_unit.normalize(),
            })
            .collect(),
    })
}

/// A project's rule as the audit log keeps it: as the API shows it.
fn rule_snapshot(row: &RuleRow) -> serde_json::Value {
    serde_json::json!({
        "project": row.project_id,
        "enabled": row.enabled,
        "threshold": row.threshold.normalize(),
        "min_extra_cost": row.min_extra_cost.normalize(),
        "window_days": row.window_days,
        "baseline_days": row.baseline_days,
        "min_records": row.min_records,
        "updated_at": row.updated_at,
    })
}

/// Sets a project's rule and judges its workloads under it at once. Changes of a project's
/// rule are ordered by the project's row lock, so `before` is the rule this one replaces
/// (none while the defaults applied).
pub async fn put_rule(
    pool: &PgPool,
    project: &ProjectRow,
    enabled: bool,
    rule: RegressionRule,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<RegressionsView> {
    let mut tx = pool.begin().await?;
    store::projects::get_for_change(&mut tx, &project.id).await?;
    let before = store::regressions::rule(&mut tx, &project.id).await?;
    let after = store::regressions::put_rule(
        &mut tx,
        &RuleRow {
            project_id: project.id.clone(),
            enabled,
            threshold: rule.threshold,
            min_extra_cost: rule.min_extra_cost,
            window_days: i32_of(rule.window_days),
            baseline_days: i32_of(rule.baseline_days),
            min_records: i32_of(rule.min_records),
            updated_at: settings.clock.now(),
        },
    )
    .await?;
    let change = Change::new(
        "efficiency_regression_rule",
        &project.id,
        if before.is_some() { "update" } else { "create" },
        before.as_ref().map(rule_snapshot),
        Some(rule_snapshot(&after)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    if let Err(error) = judge(pool, Some(&project.id), settings).await {
        tracing::error!(project = %project.id, error = ?error, "judging efficiency regressions failed");
    }
    status(pool, project).await
}

/// What one judgement did.
#[derive(Debug, Default)]
pub struct Judgement {
    /// Workloads (in a unit) with enough completed records in the window.
    pub eligible: usize,
    /// Of those, the ones with enough days with output to be judged.
    pub judged: usize,
    /// Those found regressed, whether or not they fired now.
    pub regressed: usize,
    pub recovered: usize,
    /// The alerts fired: regressions that were not regressed before.
    pub fired: Vec<AlertRow>,
}

impl Judgement {
    fn add(&mut self, other: Judgement) {
        self.eligible += other.eligible;
        self.judged += other.judged;
        self.regressed += other.regressed;
        self.recovered += other.recovered;
        self.fired.extend(other.fired);
    }
}

/// Judges the workloads of one project, or of every project whose rule is on, with the
/// ledger day holding the settings' clock as the day after the window. A project that fails
/// is logged and the others are still judged.
pub async fn judge(
    pool: &PgPool,
    project: Option<&str>,
    settings: &Settings,
) -> anyhow::Result<Judgement> {
    let today = settings
        .clock
        .now()
        .with_timezone(&settings.timezone)
        .date_naive();
    let mut judgement = Judgement::default();
    for target in store::regressions::targets(pool, project).await? {
        match judge_project(pool, &target, today, settings).await {
            Ok(done) => judgement.add(done),
            Err(error) => {
                tracing::error!(project = %target.id, error = ?error, "judging efficiency regressions failed")
            }
        }
    }
    Ok(judgement)
}

async fn judge_project(
    pool: &PgPool,
    target: &TargetRow,
    today: NaiveDate,
    settings: &Settings,
) -> anyhow::Result<Judgement> {
    let tz = settings.timezone;
    let rule = target_rule(target);
    let (baseline_first, window_first, end) = rule.spans(today);
    let at = |day: NaiveDate| first_instant_of_day(day, tz);
    let (read_from, window_start, window_end) = (at(baseline_first), at(window_first), at(end));
    let mut snapshot = store::snapshot(pool).await?;
    let outputs = store::regressions::completed_outputs(
        &mut snapshot,
        &target.id,
        (window_start, window_end),
        i64::from(rule.min_records),
    )
    .await
    .context("reading the workloads' completed output")?;
    let names: Vec<String> = outputs
        .iter()
        .map(|o| o.workload.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let rows = if names.is_empty() {
        Vec::new()
    } else {
        store::cost::daily_workload_sums(
            &mut snapshot,
            &target.id,
            &names,
            (read_from, window_end),
            tz,
        )
        .await
        .context("reading the workloads' daily cost")?
    };
    snapshot.commit().await?;

    let mut daily: BTreeMap<(String, NaiveDate), FigureSums> = BTreeMap::new();
    for row in rows {
        let (key, sums) = row.into_parts();
        let key = key.unwrap_or_default();
        let Some((day, workload)) = key.split_once('|') else {
            continue;
        };
        let day = NaiveDate::parse_from_str(day, "%Y-%m-%d")
            .with_context(|| format!("a daily key `{key}` holds no day"))?;
        daily
            .entry((workload.to_owned(), day))
            .or_default()
            .add_segments(&sums);
    }

    let mut judgement = Judgement {
        eligible: outputs.len(),
        ..Judgement::default()
    };
    for output in outputs {
        let days: Vec<DayCost> = daily
            .range(
                (output.workload.clone(), NaiveDate::MIN)
                    ..=(output.workload.clone(), NaiveDate::MAX),
            )
            .map(|((_, day), sums)| DayCost {
                day: *day,
                totals: sums.workload_totals(&output.output_unit),
            })
            .collect();
        let records = u64::try_from(output.records).unwrap_or(0);
        let Ok(verdict) = regression::judge(&rule, &days, records, today) else {
            continue;
        };
        judgement.judged += 1;
        let judged = Judged {
            project_id: &target.id,
            workload: &output.workload,
            output_unit: &output.output_unit,
            window_first,
            today,
            baseline_cost_per_unit: verdict.baseline_cost_per_unit,
            window_cost_per_unit: verdict.window_cost_per_unit,
        };
        if verdict.regressed {
            judgement.regressed += 1;
            let fire = Firing {
                target,
                rule: &rule,
                judged: &judged,
                verdict: &verdict,
                since: window_start,
                baseline_first,
            };
            if let Some(row) = fire_regression(pool, fire, settings).await? {
                judgement.fired.push(row);
            }
        } else if store::regressions::mark_recovered(pool, &judged).await? {
            judgement.recovered += 1;
            tracing::info!(project = %target.id, workload = %output.workload, unit = %output.output_unit, "efficiency regression recovered");
        }
    }
    Ok(judgement)
}

/// What one regression alert is made of.
#[derive(Clone, Copy)]
struct Firing<'a> {
    target: &'a TargetRow,
    rule: &'a RegressionRule,
    judged: &'a Judged<'a>,
    verdict: &'a Verdict,
    /// The first instant of the window.
    since: DateTime<Utc>,
    baseline_first: NaiveDate,
}

/// Marks the workload regressed and, when that changed it, fires its alert and its outbox
/// row, in one transaction.
async fn fire_regression(
    pool: &PgPool,
    fire: Firing<'_>,
    settings: &Settings,
) -> anyhow::Result<Option<AlertRow>> {
    let Firing {
        target,
        rule,
        judged,
        verdict,
        since,
        baseline_first,
    } = fire;
    let mut tx = pool.begin().await?;
    if !store::regressions::mark_regressed(&mut tx, judged).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    let last_day = judged.today - Days::new(1);
    let findings = RegressionAlert {
        workload: judged.workload.to_owned(),
        unit: judged.output_unit.to_owned(),
        window_from: judged.window_first,
        window_to: last_day,
        baseline_from: baseline_first,
        baseline_cost_per_unit: verdict.baseline_cost_per_unit,
        baseline_noise: verdict.baseline_noise,
        window_cost_per_unit: verdict.window_cost_per_unit,
        change: verdict.change,
        extra_cost_per_day: verdict.extra_cost_per_day,
        records: verdict.records,
        threshold: rule.threshold.normalize(),
        min_extra_cost: rule.min_extra_cost.normalize(),
        factors: verdict.factors.map(|f| FactorsView {
            price: f.price,
            throughput: f.throughput,
            overhead: f.overhead,
        }),
        largest: verdict
            .factors
            .and_then(|f| f.largest)
            .map(|f| f.as_str().to_owned()),
    };
    let alert = NewRegressionAlert {
        project_id: &target.id,
        month: first_of_month(last_day),
        currency: &target.currency,
        workload: judged.workload,
        output_unit: judged.output_unit,
        since,
        regression: serde_json::to_value(&findings)?,
        fired_at: settings.clock.now(),
    };
    let Some(row) = store::regressions::fire(&mut tx, &alert).await? else {
        tx.commit().await?;
        return Ok(None);
    };
    alerting::queue_deliveries(&mut tx, &[(&row, target.webhook_url.as_deref())]).await?;
    tx.commit().await?;
    tracing::info!(project = %row.project_id, workload = %judged.workload, unit = %judged.output_unit, change = ?verdict.change, "efficiency regression alert fired");
    metrics::counter!(instruments::ALERTS_FIRED, "kind" => row.kind.clone()).increment(1);
    Ok(Some(row))
}
