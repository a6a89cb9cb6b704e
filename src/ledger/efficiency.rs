//! Why a workload's cost per unit moved between two periods: the three factors of
//! COST_MODEL §11 and what changed behind each.

use std::collections::BTreeMap;

use anyhow::Context;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::efficiency::{UnitCostFactors, change};
use crate::domain::figures::{FigureSums, SUM_SCALE, hourly_costs};
use crate::ledger::LedgerResult;
use crate::ledger::cost::CostOf;
use crate::store::{self, Pool};

/// Which workload, unit and periods to compare.
#[derive(Debug, Clone)]
pub struct EfficiencyQuery {
    /// The value of the `workload` label, or the task id of records without one.
    pub workload: String,
    pub unit: String,
    pub baseline: (DateTime<Utc>, DateTime<Utc>),
    pub period: (DateTime<Utc>, DateTime<Utc>),
}

/// GPU time of one GPU model and billing mode in a period.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelUseView {
    pub gpu_model: String,
    /// `on_demand`, `spot` or `reserved`.
    pub billing_mode: String,
    #[schema(value_type = String)]
    pub gpu_hours: Decimal,
    #[schema(value_type = String)]
    pub cost: Decimal,
    /// cost ÷ GPU-hours.
    #[schema(value_type = Option<String>)]
    pub price_per_gpu_hour: Option<Decimal>,
}

/// One period of the comparison: what the workload spent, produced and needed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EfficiencyPeriodView {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The cost of its attempts' GPU time in the period, failed attempts included.
    #[schema(value_type = String)]
    pub cost: Decimal,
    #[schema(value_type = String)]
    pub gpu_hours: Decimal,
    /// GPU-hours of completed attempts with output in the unit.
    #[schema(value_type = String)]
    pub completed_gpu_hours: Decimal,
    /// Output in the unit of its completed attempts.
    #[schema(value_type = String)]
    pub quantity: Decimal,
    /// cost ÷ quantity; null without output.
    #[schema(value_type = Option<String>)]
    pub cost_per_unit: Option<Decimal>,
    /// cost ÷ GPU-hours.
    #[schema(value_type = Option<String>)]
    pub price_per_gpu_hour: Option<Decimal>,
    /// completed GPU-hours ÷ quantity.
    #[schema(value_type = Option<String>)]
    pub gpu_hours_per_unit: Option<Decimal>,
    /// GPU-hours ÷ completed GPU-hours: 1 when nothing failed.
    #[schema(value_type = Option<String>)]
    pub overhead: Option<Decimal>,
    /// Attempts that ended in the period, those that did not complete, and their retries.
    pub attempts: i64,
    pub failed_attempts: i64,
    pub retries: i64,
    /// The GPU models and billing modes it ran on, most GPU-hours first.
    pub gpu_models: Vec<ModelUseView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CostPerUnitView {
    #[schema(value_type = Option<String>)]
    pub baseline: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub period: Option<Decimal>,
}

/// Period ÷ baseline of each factor; their product is the ratio of cost per unit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FactorsView {
    /// Of the price per GPU-hour: other contracts, billing modes or GPU models.
    #[schema(value_type = String)]
    pub price: Decimal,
    /// Of the GPU-hours per unit of completed work: a slower card, a less efficient run.
    #[schema(value_type = String)]
    pub throughput: Decimal,
    /// Of the GPU-hours spent on attempts that did not complete.
    #[schema(value_type = String)]
    pub overhead: Decimal,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EfficiencyView {
    pub project: String,
    pub workload: String,
    pub unit: String,
    pub currency: String,
    pub cost_per_unit: CostPerUnitView,
    /// period ÷ baseline cost per unit; null when either has no output in the unit.
    #[schema(value_type = Option<String>)]
    pub ratio: Option<Decimal>,
    pub factors: Option<FactorsView>,
    /// `price`, `throughput` or `overhead`: the factor that moved most (on a log scale).
    pub largest: Option<String>,
    pub baseline: EfficiencyPeriodView,
    pub period: EfficiencyPeriodView,
}

fn hours(seconds: Decimal) -> Decimal {
    (seconds / Decimal::from(3600))
        .round_dp(SUM_SCALE)
        .normalize()
}

fn round(value: Decimal) -> Decimal {
    value.round_dp(SUM_SCALE).normalize()
}

fn period_view(
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    sums: &FigureSums,
    models: Vec<ModelUseView>,
    attempts: store::cost::WorkloadAttempts,
    unit: &str,
) -> (EfficiencyPeriodView, Option<UnitCostFactors>) {
    let totals = sums.workload_totals(unit);
    let factors = totals.factors();
    let view = EfficiencyPeriodView {
        from,
        to,
        cost: round(totals.cost),
        gpu_hours: hours(totals.gpu_seconds_held),
        completed_gpu_hours: hours(totals.completed_gpu_seconds),
        quantity: totals.quantity.normalize(),
        cost_per_unit: factors.map(|f| round(f.cost_per_unit)),
        price_per_gpu_hour: factors.map(|f| round(f.price_per_gpu_hour)),
        gpu_hours_per_unit: factors.map(|f| round(f.gpu_hours_per_unit)),
        overhead: factors.map(|f| round(f.overhead)),
        attempts: attempts.attempts,
        failed_attempts: attempts.failed_attempts,
        retries: attempts.retries,
        gpu_models: models,
    };
    (view, factors)
}

/// The comparison of one workload's cost per unit between two periods.
pub async fn explain(
    pool: &Pool,
    of: CostOf<'_>,
    query: &EfficiencyQuery,
    tz: Tz,
) -> LedgerResult<EfficiencyView> {
    let mut tx = store::snapshot(pool).await?;
    let rows = store::cost::workload_sums(
        &mut tx,
        of.project,
        &query.workload,
        query.baseline,
        query.period,
        tz,
    )
    .await
    .context("reading the workload's cost")?;
    let baseline_attempts =
        store::cost::workload_attempts(&mut tx, of.project, &query.workload, query.baseline)
            .await
            .context("reading the workload's attempts")?;
    let period_attempts =
        store::cost::workload_attempts(&mut tx, of.project, &query.workload, query.period)
            .await
            .context("reading the workload's attempts")?;
    tx.commit().await?;

    // Side → sums, and side → (model, mode) → sums.
    let mut sides: BTreeMap<String, FigureSums> = BTreeMap::new();
    let mut models: BTreeMap<(String, String, String), FigureSums> = BTreeMap::new();
    for row in rows {
        let (key, sums) = row.into_parts();
        let key = key.unwrap_or_default();
        let mut parts = key.splitn(3, '|').map(str::to_owned);
        let (side, model, mode) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        sides.entry(side.clone()).or_default().add_segments(&sums);
        models
            .entry((side, model, mode))
            .or_default()
            .add_segments(&sums);
    }
    let model_views = |side: &str| -> Vec<ModelUseView> {
        let mut views: Vec<ModelUseView> = models
            .iter()
            .filter(|((s, _, _), _)| s == side)
            .map(|((_, model, mode), sums)| {
                let totals = sums.workload_totals("");
                ModelUseView {
                    gpu_model: model.clone(),
                    billing_mode: mode.clone(),
                    gpu_hours: hours(totals.gpu_seconds_held),
                    cost: round(totals.cost),
                    price_per_gpu_hour: hourly_costs(totals.cost, totals.gpu_seconds_held, None).0,
                }
            })
            .collect();
        views.sort_by_key(|view| std::cmp::Reverse(view.gpu_hours));
        views
    };
    let empty = FigureSums::default();
    let (baseline, baseline_factors) = period_view(
        query.baseline,
        sides.get("baseline").unwrap_or(&empty),
        model_views("baseline"),
        baseline_attempts,
        &query.unit,
    );
    let (period, period_factors) = period_view(
        query.period,
        sides.get("period").unwrap_or(&empty),
        model_views("period"),
        period_attempts,
        &query.unit,
    );
    let moved = baseline_factors
        .zip(period_factors)
        .and_then(|(b, p)| change(&b, &p));
    Ok(EfficiencyView {
        project: of.project.to_owned(),
        workload: query.workload.clone(),
        unit: query.unit.clone(),
        currency: of.currency.to_owned(),
        cost_per_unit: CostPerUnitView {
            baseline: baseline.cost_per_unit,
            period: period.cost_per_unit,
        },
        ratio: moved.map(|m| m.ratio),
        factors: moved.map(|m| FactorsView {
            price: m.price,
            throughput: m.throughput,
            overhead: m.overhead,
        }),
        largest: moved.and_then(|m| m.largest).map(|f| f.as_str().to_owned()),
        baseline,
        period,
    })
}
