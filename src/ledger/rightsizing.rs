//! Right-sizing recommendations of a project's month (COST_MODEL.md §8): for each workload
//! on whole GPUs with enough telemetry, the MIG slice or cheaper GPU model that fits it, and
//! what it would have saved.

use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::gpu;
use crate::domain::ledger_time::month_bounds;
use crate::domain::rating::{Contract, FxRates, RecordToRate};
use crate::domain::rightsizing::{
    Advice, Alternative, Need, Recommendation, Sample, cost_on_model, recommend,
};
use crate::domain::utilisation::busy_seconds;
use crate::domain::values::Month;
use crate::ledger::LedgerResult;
use crate::ledger::cost::CostOf;
use crate::store;
use crate::store::rightsizing::WorkloadRecord;

/// A project's right-sizing recommendations for a month.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecommendationsView {
    pub project: String,
    /// `YYYY-MM` of the ledger time zone.
    pub month: String,
    pub currency: String,
    /// Workloads that fit something smaller, the largest estimated saving first.
    pub items: Vec<RecommendationItem>,
    /// Workloads with telemetry that get no recommendation, with the reason, by workload.
    pub skipped: Vec<SkippedWorkload>,
    /// Workloads (per GPU model) of the month on whole GPUs none of whose records reported
    /// a memory peak or SM activity; they are not listed.
    pub workloads_without_telemetry: i64,
}

/// A workload on one GPU model and what would fit it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecommendationItem {
    /// Its records' `workload` label, or else the task id.
    pub workload: String,
    /// The model its records name.
    pub gpu_model: String,
    /// Its records on whole GPUs of this model with GPU time in the month.
    pub records: i64,
    /// The most GPUs one of those records held.
    pub gpus: Decimal,
    /// The 95th percentile (nearest rank) of the memory peaks its records reported, per GPU.
    pub memory_peak_p95_gib: Decimal,
    /// The 95th percentile (nearest rank) of its records' SM activity; null when none
    /// reported it, and then only memory was compared.
    pub sm_active_p95: Option<Decimal>,
    pub recommendation: RecommendationKind,
    /// The cost of its GPU time in the month.
    pub period_cost: Decimal,
    /// period_cost × (1 − share).
    pub estimated_saving: Decimal,
    pub currency: String,
    /// What the estimate assumes (the same run time), in words.
    pub assumption: String,
}

/// What to run the workload on instead.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecommendationKind {
    /// A MIG slice of the same card, one per GPU; `share` is its compute share g/7, the
    /// share of the card's price it costs.
    Mig {
        /// The profile, `<g>g.<memory>gb`.
        profile: String,
        memory_gib: u32,
        share: Decimal,
    },
    /// Another GPU model; `share` is what the workload's GPU time would have cost on its
    /// contracts divided by what it cost.
    GpuModel {
        gpu_model: String,
        memory_gib: u32,
        share: Decimal,
    },
}

/// A workload with telemetry that gets no recommendation.
#[derive(Debug, Serialize, ToSchema)]
pub struct SkippedWorkload {
    pub workload: String,
    pub gpu_model: String,
    pub records: i64,
    /// The cost of its GPU time in the month.
    pub period_cost: Decimal,
    /// Too little telemetry, or nothing smaller fits.
    pub reason: String,
}

/// The recommendations of `of`'s project for `month`: every workload (its `workload` label,
/// else its task id) on whole GPUs of one model with GPU time in the month is judged by the
/// telemetry of those records, and priced by their cost in the month.
pub async fn recommendations(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    month: Month,
    tz: Tz,
) -> LedgerResult<RecommendationsView> {
    let period = month_bounds(month.first_day(), tz);
    let records = store::rightsizing::whole_gpu_records(conn, of.project, period, tz).await?;
    let contracts: Vec<Contract> =
        store::contracts::for_project(conn, of.project, period.0, period.1)
            .await?
            .iter()
            .map(store::contracts::ContractRow::to_domain)
            .collect();
    let fx = store::fx_rates::table(
        conn,
        month.first_day(),
        month.first_day(),
        &[of.currency.to_owned()],
    )
    .await?;
    let mut models: Vec<&str> = contracts.iter().map(|c| c.gpu_model.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    let pricing = Pricing {
        of,
        month,
        contracts: &contracts,
        models: &models,
        fx: &fx,
        tz,
    };

    let mut view = RecommendationsView {
        project: of.project.to_owned(),
        month: month.first_day().format("%Y-%m").to_string(),
        currency: of.currency.to_owned(),
        items: Vec::new(),
        skipped: Vec::new(),
        workloads_without_telemetry: 0,
    };
    for workload in
        records.chunk_by(|a, b| (&a.workload, &a.gpu_model) == (&b.workload, &b.gpu_model))
    {
        judge(workload, &pricing, &mut view);
    }
    view.items.sort_by(|a, b| {
        b.estimated_saving
            .cmp(&a.estimated_saving)
            .then_with(|| (&a.workload, &a.gpu_model).cmp(&(&b.workload, &b.gpu_model)))
    });
    Ok(view)
}

/// What the workloads' GPU time is priced against.
struct Pricing<'a, F> {
    of: CostOf<'a>,
    month: Month,
    contracts: &'a [Contract],
    /// The models of those contracts.
    models: &'a [&'a str],
    fx: &'a F,
    tz: Tz,
}

impl<F: FxRates> Pricing<'_, F> {
    /// The models other than `gpu_model` with `need`'s memory whose contracts price all of
    /// `records`' GPU time in the month, with what it would have cost on them.
    fn alternatives(
        &self,
        gpu_model: &str,
        need: &Need,
        records: &[WorkloadRecord],
    ) -> Vec<Alternative> {
        let card = gpu::lookup(gpu_model).map(|card| card.name);
        let to_rate: Vec<RecordToRate> = records.iter().map(|r| self.to_rate(r)).collect();
        self.models
            .iter()
            .filter(|&&model| model != gpu_model)
            .filter_map(|&model| {
                let spec = gpu::lookup(model)?;
                let other_card = Some(spec.name) != card;
                let enough = Decimal::from(spec.memory_gib) >= need.memory_gib();
                let cost = (other_card && enough)
                    .then(|| {
                        cost_on_model(
                            &to_rate,
                            model,
                            self.month.first_day(),
                            self.contracts,
                            self.fx,
                            self.tz,
                        )
                    })
                    .flatten()?;
                Some(Alternative {
                    gpu_model: model.to_owned(),
                    memory_gib: spec.memory_gib,
                    cost,
                })
            })
            .collect()
    }

    fn to_rate(&self, record: &WorkloadRecord) -> RecordToRate {
        RecordToRate {
            project: self.of.project.to_owned(),
            gpu_model: record.gpu_model.clone(),
            billing_mode: record.billing_mode,
            provider: record.provider.clone(),
            region: record.region.clone(),
            currency: self.of.currency.to_owned(),
            started_at: record.started_at,
            ended_at: record.ended_at,
            gpu_seconds_held: record.gpu_seconds_held,
            gpu_seconds_busy: busy_seconds(
                record.gpu_seconds_busy,
                record.gpu_seconds_held,
                record.sm_active,
            ),
            outcome: record.outcome,
            compute_share: None,
            energy_joules: None,
        }
    }
}

/// Adds one workload on one model to the view: as an item, skipped, or counted as without
/// telemetry.
fn judge<F: FxRates>(
    records: &[WorkloadRecord],
    pricing: &Pricing<'_, F>,
    view: &mut RecommendationsView,
) {
    let first = &records[0];
    let samples: Vec<Sample> = records
        .iter()
        .map(|r| Sample {
            memory_peak_gib: r.memory_peak_gib,
            sm_active: r.sm_active,
        })
        .collect();
    if samples.iter().all(|s| *s == Sample::default()) {
        view.workloads_without_telemetry += 1;
        return;
    }
    let count = i64::try_from(records.len()).unwrap_or(i64::MAX);
    let cost: Decimal = records.iter().map(|r| r.cost).sum::<Decimal>().normalize();
    let skip = |reason: String, view: &mut RecommendationsView| {
        view.skipped.push(SkippedWorkload {
            workload: first.workload.clone(),
            gpu_model: first.gpu_model.clone(),
            records: count,
            period_cost: cost,
            reason,
        });
    };
    let need = match Need::of(&samples) {
        Ok(need) => need,
        Err(too_little) => return skip(too_little.reason(), view),
    };
    // A cost with unrated time in it is no base for a price ratio.
    let fully_rated = records.iter().all(|r| r.unrated_segments == 0);
    let alternatives = if fully_rated && cost > Decimal::ZERO {
        pricing.alternatives(&first.gpu_model, &need, records)
    } else {
        Vec::new()
    };
    match recommend(&need, gpu::lookup(&first.gpu_model), cost, &alternatives) {
        Ok(advice) => view
            .items
            .push(item(records, &need, cost, &advice, pricing.of)),
        Err(nothing) => skip(nothing.reason(), view),
    }
}

fn item(
    records: &[WorkloadRecord],
    need: &Need,
    cost: Decimal,
    advice: &Advice,
    of: CostOf<'_>,
) -> RecommendationItem {
    let first = &records[0];
    let recommendation = match &advice.recommendation {
        Recommendation::Mig(profile) => RecommendationKind::Mig {
            profile: profile.name(),
            memory_gib: profile.memory_gib,
            share: advice.share,
        },
        Recommendation::GpuModel(model) => RecommendationKind::GpuModel {
            gpu_model: model.gpu_model.clone(),
            memory_gib: model.memory_gib,
            share: advice.share,
        },
    };
    RecommendationItem {
        workload: first.workload.clone(),
        gpu_model: first.gpu_model.clone(),
        records: i64::try_from(records.len()).unwrap_or(i64::MAX),
        gpus: records
            .iter()
            .map(|r| r.gpu_count)
            .max()
            .unwrap_or_default()
            .normalize(),
        memory_peak_p95_gib: need.memory_peak_p95_gib.normalize(),
        sm_active_p95: need.sm_active_p95.map(|sm| sm.normalize()),
        recommendation,
        period_cost: cost,
        estimated_saving: advice.saving,
        currency: of.currency.to_owned(),
        assumption: advice.assumption(&first.gpu_model, need),
    }
}
