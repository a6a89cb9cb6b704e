//! The per-task ledger (COST_MODEL.md §7): which tasks a project's money went to, and what
//! each finished task really cost, attempt by attempt.
//!
//! A list shows each task's figures over a period, read from the per-task rows the rating
//! path keeps, with its final cost (its lifetime total, once it completed). A task's page
//! shows its lifetime, its cost per month and every attempt with the contracts that priced
//! it. Each is read in one snapshot, so its parts agree while records are being rated.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::figures::{EmissionsView, EnergySums, EnergyView, MfuView};
use crate::domain::rating::{BillingMode, Outcome};
use crate::domain::record::duration_seconds;
use crate::domain::task::{
    SortOrder, TaskFigures, TaskFilter, TaskKeyset, TaskSort, cost_per_unit,
};
use crate::domain::utilisation::busy_seconds;
use crate::domain::values::round_money;
use crate::domain::what_if::WhatIf;
use crate::exports::csv_cell::text_cell;
use crate::ledger::cost::CostOf;
use crate::ledger::{LedgerError, LedgerResult};
use crate::store::{self, Pool};

/// A task's cost parts: what [`crate::domain::figures::Breakdown`] has, but unused
/// commitment, which belongs to no task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TaskBreakdown {
    /// Cost of completed attempts × busy/held.
    pub productive: Decimal,
    /// Cost of completed attempts × (held − busy)/held.
    pub idle: Decimal,
    /// Cost of completed attempts that reported no busy time.
    pub unmeasured: Decimal,
    /// Whole cost of failed, cancelled and preempted attempts.
    pub failed: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct QuantityView {
    pub unit: String,
    pub quantity: Decimal,
}

/// A task's figures over a period (or its lifetime). Money is in the project's currency, as
/// full-precision decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TaskFiguresView {
    /// Attempts that ended in the period, and those of them that did not complete.
    pub attempts: i64,
    pub failed_attempts: i64,
    /// Sums of the attempts' `retries` and `failures`.
    pub retries: i64,
    pub failures: i64,
    pub gpu_seconds_held: Decimal,
    /// Busy time of the attempts that measured it.
    pub gpu_seconds_busy: Decimal,
    /// `started_at − queued_at` summed over the attempts that ended in the period and
    /// reported `queued_at`; null when none did. Time, never added to cost.
    pub queue_wait_seconds: Option<Decimal>,
    /// productive + idle + unmeasured + failed, exactly.
    pub total: Decimal,
    pub breakdown: TaskBreakdown,
    /// idle + failed.
    pub waste: Decimal,
    /// GPU-seconds that carry no cost for want of a contract or an FX rate.
    pub unrated_gpu_seconds: Decimal,
    /// Output of completed attempts, booked where each ended.
    pub output: Vec<QuantityView>,
}

impl From<&TaskFigures> for TaskFiguresView {
    fn from(figures: &TaskFigures) -> Self {
        TaskFiguresView {
            attempts: figures.attempts,
            failed_attempts: figures.failed_attempts,
            retries: figures.retries,
            failures: figures.failures,
            gpu_seconds_held: figures.gpu_seconds_held.normalize(),
            gpu_seconds_busy: figures.gpu_seconds_busy.normalize(),
            queue_wait_seconds: (figures.queue_waits > 0)
                .then(|| figures.queue_wait_seconds.normalize()),
            total: figures.total().normalize(),
            breakdown: TaskBreakdown {
                productive: figures.productive.normalize(),
                idle: figures.idle.normalize(),
                unmeasured: figures.unmeasured.normalize(),
                failed: figures.failed.normalize(),
            },
            waste: figures.waste().normalize(),
            unrated_gpu_seconds: figures.unrated_gpu_seconds.normalize(),
            output: figures
                .output
                .iter()
                .map(|(unit, quantity)| QuantityView {
                    unit: unit.clone(),
                    quantity: quantity.normalize(),
                })
                .collect(),
        }
    }
}

/// What a task is, the same in a list and alone: its status, when it ran, what it cost once
/// completed, and what its GPUs used (over the list's period in a list, over its lifetime
/// alone).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskSummaryView {
    pub task_id: String,
    /// `completed` once any attempt completed; otherwise the outcome of its latest attempt.
    #[schema(value_type = String, example = "completed")]
    pub status: Outcome,
    /// The end of its first completed attempt.
    pub completed_at: Option<DateTime<Utc>>,
    /// The start of its first attempt and the end of its last, over its lifetime.
    pub first_started_at: DateTime<Utc>,
    pub last_ended_at: DateTime<Utc>,
    /// The GPU models its attempts ran on.
    pub gpu_models: Vec<String>,
    pub currency: String,
    /// A completed task's lifetime total, failed attempts included; null until it completes.
    pub final_cost: Option<Decimal>,
    /// final_cost / the quantity of its lifetime output, when that output is in one unit;
    /// null without output, or while the task is not completed.
    pub cost_per_unit: Option<Decimal>,
    /// Energy its attempts' GPUs used, where they measured it; null when none did.
    pub energy: Option<EnergyView>,
    /// Emissions of that energy where its region's grid intensity is known.
    pub emissions: Option<EmissionsView>,
    /// Model FLOPs utilisation of its attempts that reported `model_flops`.
    pub mfu: Option<MfuView>,
}

/// One task of a list: its figures over the list's period, and what it is over its lifetime.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    #[serde(flatten)]
    pub task: TaskSummaryView,
    #[serde(flatten)]
    pub figures: TaskFiguresView,
}

/// Rows keyed by task id (as their key and sums), by task id.
fn by_task<S>(rows: impl IntoIterator<Item = (Option<String>, S)>) -> HashMap<String, S> {
    rows.into_iter()
        .filter_map(|(task, sums)| Some((task?, sums)))
        .collect()
}

/// A task's energy and emissions views over its figures' GPU time and output.
fn task_energy(
    energy: Option<&EnergySums>,
    figures: &TaskFigures,
) -> (Option<EnergyView>, Option<EmissionsView>) {
    energy
        .map(|sums| sums.task_views(figures.gpu_seconds_held, &figures.output))
        .unwrap_or_default()
}

/// A page of a task list.
pub struct TaskPage {
    pub items: Vec<TaskView>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<TaskKeyset>,
}

/// What to list: a period on ledger hour boundaries, which tasks, in what order, from where.
#[derive(Debug, Clone)]
pub struct TaskListQuery {
    pub period: (DateTime<Utc>, DateTime<Utc>),
    pub filter: TaskFilter,
    pub sort: TaskSort,
    pub order: SortOrder,
    pub after: Option<TaskKeyset>,
    pub limit: i64,
    /// Prices to answer with in place of those in force; empty for the real figures.
    pub what_if: WhatIf,
}

/// Lifetime figures of each task, from its monthly figures.
fn lifetimes(monthly: &[(String, NaiveDate, TaskFigures)]) -> HashMap<&str, TaskFigures> {
    let mut lifetimes: HashMap<&str, TaskFigures> = HashMap::new();
    for (task_id, _, figures) in monthly {
        lifetimes
            .entry(task_id.as_str())
            .or_default()
            .merge(figures);
    }
    lifetimes
}

/// A completed task's final cost and cost per unit, from its lifetime figures.
fn final_cost(
    status: Outcome,
    lifetime: Option<&TaskFigures>,
) -> (Option<Decimal>, Option<Decimal>) {
    match (status, lifetime) {
        (Outcome::Completed, Some(lifetime)) => {
            let total = lifetime.total();
            (
                Some(total.normalize()),
                cost_per_unit(total, &lifetime.output).map(|c| c.normalize()),
            )
        }
        _ => (None, None),
    }
}

/// A page of a project's tasks with figures in the period.
pub async fn list_tasks(
    pool: &Pool,
    of: CostOf<'_>,
    query: &TaskListQuery,
    tz: Tz,
) -> LedgerResult<TaskPage> {
    let mut tx = store::snapshot(pool).await?;
    let mut rows = store::tasks::list(
        &mut tx,
        &store::tasks::ListQuery {
            project: of.project,
            period: query.period,
            filter: &query.filter,
            sort: query.sort,
            order: query.order,
            after: query.after.as_ref(),
            limit: query.limit + 1,
        },
        tz,
        &query.what_if,
    )
    .await
    .context("listing tasks")?;
    let has_more = rows.len() as i64 > query.limit;
    rows.truncate(query.limit as usize);
    let completed: Vec<String> = rows
        .iter()
        .filter(|row| row.status == Outcome::Completed)
        .map(|row| row.task_id.clone())
        .collect();
    let monthly =
        store::tasks::monthly_figures(&mut tx, of.project, &completed, tz, &query.what_if)
            .await
            .context("reading the lifetimes of completed tasks")?;
    let listed: Vec<String> = rows.iter().map(|row| row.task_id.clone()).collect();
    let energy = store::tasks::energy(&mut tx, of.project, &listed, Some(query.period), tz)
        .await
        .context("reading the tasks' energy")?;
    let mfu = store::tasks::mfu(&mut tx, of.project, &listed, Some(query.period))
        .await
        .context("reading the tasks' model FLOPs")?;
    tx.commit().await?;
    let energy = by_task(energy.into_iter().map(store::cost::EnergyRow::into_parts));
    let mfu = by_task(mfu.into_iter().map(store::cost::MfuRow::into_parts));
    let lifetimes = lifetimes(&monthly);
    let next = has_more
        .then(|| rows.last().map(|row| row.key.clone()))
        .flatten();
    let items = rows
        .into_iter()
        .map(|row| {
            let (final_cost, cost_per_unit) =
                final_cost(row.status, lifetimes.get(row.task_id.as_str()));
            let (energy, emissions) = task_energy(energy.get(&row.task_id), &row.figures);
            let mfu = mfu
                .get(&row.task_id)
                .and_then(|sums| sums.view(row.figures.gpu_seconds_held));
            TaskView {
                figures: TaskFiguresView::from(&row.figures),
                task: TaskSummaryView {
                    task_id: row.task_id,
                    status: row.status,
                    completed_at: row.completed_at,
                    first_started_at: row.first_started_at,
                    last_ended_at: row.last_ended_at,
                    gpu_models: row.gpu_models,
                    currency: of.currency.to_owned(),
                    final_cost,
                    cost_per_unit,
                    energy,
                    emissions,
                    mfu,
                },
            }
        })
        .collect();
    Ok(TaskPage { items, next })
}

const CSV_HEADER: [&str; 30] = [
    "task_id",
    "status",
    "completed_at",
    "first_started_at",
    "last_ended_at",
    "gpu_models",
    "attempts",
    "failed_attempts",
    "retries",
    "failures",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "queue_wait_seconds",
    "currency",
    "total",
    "productive",
    "idle",
    "unmeasured",
    "failed",
    "waste",
    "unrated_gpu_seconds",
    "output",
    "final_cost",
    "cost_per_unit",
    "energy_kwh",
    "energy_coverage",
    "kg_co2e",
    "emissions_coverage",
    "mfu",
    "mfu_coverage",
];

/// Decimal places of `cost_per_unit` in CSV: a price per token is far below a cent.
const UNIT_COST_PLACES: u32 = 10;

/// Tasks as CSV for spreadsheets: the list's columns, money rounded half-even to the
/// currency's minor unit as in the monthly report, cost per unit to
/// [`UNIT_COST_PLACES`] places, and text cells that can never be read as a formula. The
/// output column lists `unit=quantity` pairs separated by `; `.
pub fn tasks_csv(items: &[TaskView]) -> LedgerResult<String> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer
        .write_record(CSV_HEADER)
        .map_err(anyhow::Error::from)?;
    let time = |at: Option<DateTime<Utc>>| {
        at.map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
            .unwrap_or_default()
    };
    let number = |value: Decimal| value.normalize().to_string();
    for TaskView { task, figures } in items {
        let money = |amount: Decimal| round_money(amount, &task.currency).to_string();
        let output = figures
            .output
            .iter()
            .map(|o| format!("{}={}", o.unit, o.quantity))
            .collect::<Vec<_>>()
            .join("; ");
        let row = [
            text_cell(&task.task_id).into_owned(),
            task.status.as_str().to_owned(),
            time(task.completed_at),
            time(Some(task.first_started_at)),
            time(Some(task.last_ended_at)),
            text_cell(&task.gpu_models.join("; ")).into_owned(),
            figures.attempts.to_string(),
            figures.failed_attempts.to_string(),
            figures.retries.to_string(),
            figures.failures.to_string(),
            number(figures.gpu_seconds_held),
            number(figures.gpu_seconds_busy),
            figures.queue_wait_seconds.map(number).unwrap_or_default(),
            text_cell(&task.currency).into_owned(),
            money(figures.total),
            money(figures.breakdown.productive),
            money(figures.breakdown.idle),
            money(figures.breakdown.unmeasured),
            money(figures.breakdown.failed),
            money(figures.waste),
            number(figures.unrated_gpu_seconds),
            text_cell(&output).into_owned(),
            task.final_cost.map(money).unwrap_or_default(),
            task.cost_per_unit
                .map(|cost| {
                    number(cost.round_dp_with_strategy(
                        UNIT_COST_PLACES,
                        RoundingStrategy::MidpointNearestEven,
                    ))
                })
                .unwrap_or_default(),
            task.energy
                .as_ref()
                .map(|e| number(e.kwh))
                .unwrap_or_default(),
            task.energy
                .as_ref()
                .map(|e| number(e.coverage))
                .unwrap_or_default(),
            task.emissions
                .as_ref()
                .and_then(|e| e.kg_co2e)
                .map(number)
                .unwrap_or_default(),
            task.emissions
                .as_ref()
                .map(|e| number(e.coverage))
                .unwrap_or_default(),
            task.mfu.map(|m| number(m.value)).unwrap_or_default(),
            task.mfu.map(|m| number(m.coverage)).unwrap_or_default(),
        ];
        writer.write_record(&row).map_err(anyhow::Error::from)?;
    }
    let bytes = writer.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(String::from_utf8(bytes).map_err(anyhow::Error::from)?)
}

/// One ledger month of a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskMonthView {
    /// `YYYY-MM` of the ledger time zone.
    pub month: String,
    #[serde(flatten)]
    pub figures: TaskFiguresView,
}

/// What one contract priced of an attempt.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ContractUseView {
    pub contract_id: Uuid,
    pub name: String,
    /// The contract's price, in its own currency.
    pub price_per_gpu_hour: Decimal,
    pub contract_currency: String,
    pub gpu_seconds_held: Decimal,
    /// In the project's currency.
    pub cost: Decimal,
}

/// GPU-seconds of an attempt left without cost, and why.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UnratedSecondsView {
    /// `no_contract` (no contract covers the hour) or `no_fx_rate` (the contract's currency
    /// has no rate into the project's for that month).
    pub reason: String,
    pub gpu_seconds: Decimal,
}

/// One attempt (job record) of a task, with its own figures.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttemptView {
    pub attempt: i32,
    #[schema(value_type = String, example = "failed")]
    pub outcome: Outcome,
    /// Whether this attempt completes the task (its first completion), or fails it (the last
    /// attempt of a task none of whose attempts completed).
    pub completes_task: bool,
    pub fails_task: bool,
    pub gpu_model: String,
    pub gpu_count: Decimal,
    #[schema(value_type = String, example = "on_demand")]
    pub billing_mode: BillingMode,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub queued_at: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    /// started_at − queued_at; null without `queued_at`.
    pub queue_wait_seconds: Option<Decimal>,
    pub gpu_seconds_held: Decimal,
    /// As reported, else held × `sm_active`; null when the attempt measured neither.
    pub gpu_seconds_busy: Option<Decimal>,
    pub retries: i32,
    pub failures: i32,
    /// Output reported by the attempt; it counts only when the attempt completed.
    pub output: Option<QuantityView>,
    pub labels: BTreeMap<String, String>,
    /// How many times the record was posted with new content (1 for the original).
    pub version: i32,
    /// The attempt's telemetry, where it reported it (see the job record's fields).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm_active: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_active: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dram_active: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_peak_gib: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_total_gib: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// Energy its GPUs used, in joules, where it measured it.
    #[schema(value_type = Option<String>)]
    pub energy_joules: Option<Decimal>,
    /// The FLOPs its model's math needed, and the precision it ran in, where it said so.
    #[schema(value_type = Option<String>)]
    pub model_flops: Option<Decimal>,
    #[schema(value_type = Option<String>, example = "bf16")]
    pub precision: Option<String>,
    /// The dense peak FLOPS of one of its GPUs (or slices) at that precision, from the
    /// catalogue; null where the catalogue has none.
    #[schema(value_type = Option<String>)]
    pub peak_flops: Option<Decimal>,
    /// model_flops ÷ (peak_flops × GPU-seconds held).
    #[schema(value_type = Option<String>)]
    pub mfu: Option<Decimal>,
    /// The attempt's cost in the project's currency, and its parts.
    pub total: Decimal,
    pub breakdown: TaskBreakdown,
    pub unrated_gpu_seconds: Decimal,
    pub unrated: Vec<UnratedSecondsView>,
    /// The contracts that priced the attempt, in the order it first used them.
    pub contracts: Vec<ContractUseView>,
}

/// A task over its lifetime.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskDetailView {
    pub project: String,
    #[serde(flatten)]
    pub task: TaskSummaryView,
    /// Its figures over all time.
    pub lifetime: TaskFiguresView,
    /// Its figures per ledger month, in month order.
    pub months: Vec<TaskMonthView>,
    /// Every attempt, by attempt number.
    pub attempts: Vec<AttemptView>,
}

/// A task of a project over its lifetime; `NotFound` when the project has no record of it.
pub async fn task_detail(
    pool: &Pool,
    of: CostOf<'_>,
    task_id: &str,
    tz: Tz,
) -> LedgerResult<TaskDetailView> {
    let mut tx = store::snapshot(pool).await?;
    let attempts = store::tasks::attempts(&mut tx, of.project, task_id)
        .await
        .context("reading the task's attempts")?;
    let task_ids = [task_id.to_owned()];
    let monthly =
        store::tasks::monthly_figures(&mut tx, of.project, &task_ids, tz, &WhatIf::default())
            .await
            .context("reading the task's months")?;
    let pricing = store::tasks::attempt_pricing(&mut tx, of.project, task_id, tz)
        .await
        .context("reading how the task's attempts were priced")?;
    let energy = store::tasks::energy(&mut tx, of.project, &task_ids, None, tz)
        .await
        .context("reading the task's energy")?;
    let mfu = store::tasks::mfu(&mut tx, of.project, &task_ids, None)
        .await
        .context("reading the task's model FLOPs")?;
    tx.commit().await?;
    let not_found =
        || LedgerError::NotFound(format!("project {} has no task {task_id}", of.project));
    if attempts.is_empty() {
        return Err(not_found());
    }
    let lifetime = lifetimes(&monthly).remove(task_id).unwrap_or_default();
    let ends: Vec<_> = attempts
        .iter()
        .map(|a| crate::domain::task::AttemptEnd {
            attempt: a.record.attempt,
            outcome: a.record.outcome,
            started_at: a.record.started_at,
            ended_at: a.record.ended_at,
        })
        .collect();
    let status = crate::domain::task::task_status(&ends).ok_or_else(not_found)?;
    let (final_cost, cost_per_unit) = final_cost(status.status, Some(&lifetime));
    let (energy, emissions) = task_energy(
        by_task(energy.into_iter().map(store::cost::EnergyRow::into_parts)).get(task_id),
        &lifetime,
    );
    let mfu = by_task(mfu.into_iter().map(store::cost::MfuRow::into_parts))
        .get(task_id)
        .and_then(|sums| sums.view(lifetime.gpu_seconds_held));
    let mut gpu_models: Vec<String> = attempts
        .iter()
        .map(|a| a.record.gpu_model.clone())
        .collect();
    gpu_models.sort_unstable();
    gpu_models.dedup();
    Ok(TaskDetailView {
        project: of.project.to_owned(),
        task: TaskSummaryView {
            task_id: task_id.to_owned(),
            status: status.status,
            completed_at: status.completed_at,
            first_started_at: status.first_started_at,
            last_ended_at: status.last_ended_at,
            gpu_models,
            currency: of.currency.to_owned(),
            final_cost,
            cost_per_unit,
            energy,
            emissions,
            mfu,
        },
        lifetime: TaskFiguresView::from(&lifetime),
        months: monthly
            .iter()
            .map(|(_, month, figures)| TaskMonthView {
                month: month.format("%Y-%m").to_string(),
                figures: TaskFiguresView::from(figures),
            })
            .collect(),
        attempts: attempts
            .into_iter()
            .map(|attempt| attempt_view(attempt, &pricing))
            .collect(),
    })
}

fn attempt_view(
    row: store::tasks::AttemptRow,
    pricing: &[store::tasks::AttemptPricing],
) -> AttemptView {
    let priced: Vec<&store::tasks::AttemptPricing> = pricing
        .iter()
        .filter(|p| p.attempt == row.record.attempt)
        .collect();
    let sum = |part: fn(&store::tasks::AttemptPricing) -> Decimal| {
        priced.iter().map(|p| part(p)).sum::<Decimal>().normalize()
    };
    let breakdown = TaskBreakdown {
        productive: sum(|p| p.productive),
        idle: sum(|p| p.idle),
        unmeasured: sum(|p| p.unmeasured),
        failed: sum(|p| p.failed),
    };
    let mut unrated: BTreeMap<&str, Decimal> = BTreeMap::new();
    for p in &priced {
        if let Some(reason) = &p.unrated_reason {
            *unrated.entry(reason).or_default() += p.gpu_seconds_held;
        }
    }
    let (completes_task, fails_task) = (row.completes_task, row.fails_task);
    let record = row.record.to_record();
    let telemetry = record.telemetry;
    let mfu = telemetry.mfu(record.gpu_seconds_held);
    AttemptView {
        attempt: record.key.attempt,
        outcome: record.outcome,
        completes_task,
        fails_task,
        gpu_model: record.gpu_model,
        gpu_count: record.gpu_count,
        billing_mode: record.billing_mode,
        provider: record.provider,
        region: record.region,
        queued_at: record.queued_at,
        started_at: record.started_at,
        ended_at: record.ended_at,
        queue_wait_seconds: record
            .queued_at
            .map(|queued| duration_seconds(queued, record.started_at).normalize()),
        gpu_seconds_held: record.gpu_seconds_held,
        gpu_seconds_busy: busy_seconds(
            record.gpu_seconds_busy,
            record.gpu_seconds_held,
            telemetry.sm_active,
        ),
        retries: record.retries,
        failures: record.failures,
        output: record.output.map(|output| QuantityView {
            unit: output.unit,
            quantity: output.quantity,
        }),
        labels: record.labels,
        version: row.record.version,
        gpu_util: telemetry.gpu_util,
        sm_active: telemetry.sm_active,
        tensor_active: telemetry.tensor_active,
        dram_active: telemetry.dram_active,
        memory_peak_gib: telemetry.memory_peak_gib,
        memory_total_gib: telemetry.memory_total_gib,
        mig_profile: telemetry.mig_profile,
        energy_joules: telemetry.energy_joules,
        mfu,
        model_flops: telemetry.model_flops,
        precision: telemetry.precision.map(|p| p.as_str().to_owned()),
        peak_flops: telemetry.peak_flops,
        total: (breakdown.productive + breakdown.idle + breakdown.unmeasured + breakdown.failed)
            .normalize(),
        breakdown,
        unrated_gpu_seconds: unrated.values().copied().sum::<Decimal>().normalize(),
        unrated: unrated
            .into_iter()
            .map(|(reason, gpu_seconds)| UnratedSecondsView {
                reason: reason.to_owned(),
                gpu_seconds: gpu_seconds.normalize(),
            })
            .collect(),
        contracts: contract_uses(&priced),
    }
}

/// The contracts that priced an attempt, each once, in the order the attempt first used
/// them.
fn contract_uses(priced: &[&store::tasks::AttemptPricing]) -> Vec<ContractUseView> {
    let mut uses: Vec<ContractUseView> = Vec::new();
    for p in priced {
        let (Some(id), Some(name), Some(price), Some(currency)) = (
            p.contract_id,
            &p.contract_name,
            p.price_per_gpu_hour,
            &p.contract_currency,
        ) else {
            continue;
        };
        match uses.iter_mut().find(|u| u.contract_id == id) {
            Some(existing) => {
                existing.gpu_seconds_held =
                    (existing.gpu_seconds_held + p.gpu_seconds_held).normalize();
                existing.cost = (existing.cost + p.cost).normalize();
            }
            None => uses.push(ContractUseView {
                contract_id: id,
                name: name.clone(),
                price_per_gpu_hour: price.normalize(),
                contract_currency: currency.clone(),
                gpu_seconds_held: p.gpu_seconds_held.normalize(),
                cost: p.cost.normalize(),
            }),
        }
    }
    uses
}
