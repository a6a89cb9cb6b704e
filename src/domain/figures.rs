//! The figures of a period or of one group of it (COST_MODEL.md §2–4), summed from what the
//! rollups hold.
//!
//! [`FigureSums`] only adds: every figure it derives (total, waste, cost per task, unit
//! costs) is computed from its sums at the end, never from derived figures of parts. So
//! merging the sums of any partition of a period gives exactly the sums of the whole, and
//! the whole's derived figures are those of the merged sums.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::summary::{cost_per_completed_task, unit_costs};
use super::utilisation::{SHARE_SCALE, UtilSums, Utilisation};

/// What the figures of a period are grouped by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    /// One group for the whole period.
    Whole,
    /// `YYYY-MM-DD` of the ledger time zone.
    Day,
    /// `YYYY-MM` of the ledger time zone.
    Month,
    GpuModel,
    BillingMode,
    /// `<gpu_model>/<billing_mode>`: billing modes hold no `/`, so the key splits at its last
    /// one. What a task costs on a model depends on how the model is bought.
    GpuModelAndBillingMode,
    Outcome,
    /// The value of one label; records without it have no key.
    Label(String),
}

impl Grouping {
    /// Parses `group_by`: `day`, `month`, `gpu_model`, `billing_mode`,
    /// `gpu_model,billing_mode`, `outcome` or `label:<key>`.
    pub fn parse(raw: &str) -> Result<Grouping, String> {
        Ok(match raw {
            "day" => Grouping::Day,
            "month" => Grouping::Month,
            "gpu_model" => Grouping::GpuModel,
            "billing_mode" => Grouping::BillingMode,
            "gpu_model,billing_mode" => Grouping::GpuModelAndBillingMode,
            "outcome" => Grouping::Outcome,
            other => match other.strip_prefix("label:") {
                Some(key) if !key.is_empty() && key.len() <= 200 => Grouping::Label(key.to_owned()),
                _ => {
                    return Err(
                        "use day, month, gpu_model, billing_mode, gpu_model,billing_mode, \
                         outcome or label:<key>"
                            .to_owned(),
                    );
                }
            },
        })
    }
}

/// Decimal places of every sum read from the rollups: 10^-20 of a currency unit or
/// GPU-second.
pub const SUM_SCALE: u32 = 20;

/// Sums of the rated segments of one group that a figure tells apart: those of completed
/// attempts from the others, completed ones by output unit, and unrated ones by reason and
/// model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSums {
    /// Whether these are segments of completed attempts.
    pub completed: bool,
    /// Why these segments carry no cost (`no_contract` or `no_fx_rate`) and their GPU model,
    /// when they carry none.
    pub unrated: Option<(String, String)>,
    /// The output unit of completed segments that produced output.
    pub output_unit: Option<String>,
    pub gpu_seconds_held: Decimal,
    pub gpu_seconds_busy: Decimal,
    pub cost: Decimal,
    pub productive: Decimal,
    pub idle: Decimal,
    pub unmeasured: Decimal,
    pub failed: Decimal,
    pub output_quantity: Decimal,
}

/// The measured energy of one group's segments of one output unit (or of none), and what
/// of it has a grid intensity (COST_MODEL §10).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnergySums {
    /// The output unit of completed segments that produced output.
    pub output_unit: Option<String>,
    /// GPU-seconds held of the segments whose energy was measured.
    pub metered_gpu_seconds: Decimal,
    pub joules: Decimal,
    /// GPU-seconds held of those whose region had a grid intensity that month.
    pub intensity_gpu_seconds: Decimal,
    /// Σ joules × PUE × gCO2e per kWh.
    pub gram_joules: Decimal,
}

impl EnergySums {
    /// The energy and emissions of one task over GPU-seconds `held`: kWh per unit of each
    /// unit of its `output` is all its energy (failed attempts included) over the quantity,
    /// as its cost per unit is.
    pub fn task_views(
        &self,
        held: Decimal,
        output: &BTreeMap<String, Decimal>,
    ) -> (Option<EnergyView>, Option<EmissionsView>) {
        let mut totals = EnergyTotals::default();
        totals.add(self);
        let coverage = share(self.metered_gpu_seconds, held);
        let energy = EnergyView {
            kwh: kwh(self.joules),
            coverage,
            kwh_per_unit: output
                .iter()
                .map(|(unit, quantity)| UnitEnergyView {
                    unit: unit.clone(),
                    kwh: (!quantity.is_zero()).then(|| {
                        (kwh(self.joules) / quantity)
                            .round_dp(SUM_SCALE)
                            .normalize()
                    }),
                    coverage,
                })
                .collect(),
        };
        (Some(energy), totals.emissions_view(held))
    }
}

/// FLOPs (in teraFLOPs) of one group's segments of records that reported their model's
/// FLOPs on a card the catalogue has a peak for, and what the cards could have done in that
/// time (COST_MODEL §11).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MfuSums {
    /// The records' model FLOPs ÷ 10^12, spread over their segments by GPU-seconds held.
    pub tflops: Decimal,
    /// Σ peak FLOPS × GPU-seconds held ÷ 10^12.
    pub peak_tflops: Decimal,
    /// GPU-seconds held of those segments.
    pub gpu_seconds_held: Decimal,
}

impl MfuSums {
    pub fn add(&mut self, other: &MfuSums) {
        self.tflops += other.tflops;
        self.peak_tflops += other.peak_tflops;
        self.gpu_seconds_held += other.gpu_seconds_held;
    }

    /// MFU of a group holding `held` GPU-seconds: Σ FLOPs ÷ Σ peak × held over the records
    /// that report it, with their share of the GPU-seconds; none when no record did.
    pub fn view(&self, held: Decimal) -> Option<MfuView> {
        (!self.peak_tflops.is_zero()).then(|| MfuView {
            value: share(self.tflops, self.peak_tflops),
            coverage: share(self.gpu_seconds_held, held),
        })
    }
}

/// Model FLOPs utilisation: the FLOPs the model's math needed over what the cards could have
/// done at their dense peak in the GPU time held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MfuView {
    /// 0 to 1, FLOPs-weighted over the records that reported `model_flops` on a card with a
    /// known peak.
    pub value: Decimal,
    /// Share of the GPU-seconds held by those records.
    pub coverage: Decimal,
}

/// Cost per GPU-hour held of the records' cost (productive, idle, unmeasured and failed) and
/// that over MFU: the cost of a GPU-hour spent at the card's peak.
pub fn hourly_costs(
    record_cost: Decimal,
    held: Decimal,
    mfu: Option<&MfuView>,
) -> (Option<Decimal>, Option<Decimal>) {
    let per_hour = (!held.is_zero()).then(|| {
        (record_cost * Decimal::from(3600) / held)
            .round_dp(SUM_SCALE)
            .normalize()
    });
    let effective = per_hour.zip(mfu).and_then(|(per_hour, mfu)| {
        per_hour
            .checked_div(mfu.value)
            .map(|c| c.round_dp(SUM_SCALE).normalize())
    });
    (per_hour, effective)
}

/// Joules in a kWh.
const JOULES_PER_KWH: Decimal = Decimal::from_parts(3_600_000, 0, 0, false, 0);

/// Energy of a period or group: kWh measured, with the share of GPU time measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EnergyView {
    /// kWh the GPUs of the records that measured it used (their `energy_joules` ÷ 3.6
    /// million), without the data centre's overhead.
    #[schema(value_type = String, example = "1.6")]
    pub kwh: Decimal,
    /// Share of the GPU-seconds held whose energy was measured, 0 to 1.
    #[schema(value_type = String, example = "0.75")]
    pub coverage: Decimal,
    /// Per output unit of completed records: kWh per unit, over those that measured it.
    pub kwh_per_unit: Vec<UnitEnergyView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UnitEnergyView {
    pub unit: String,
    /// kWh of the completed records with this unit ÷ their output; null without output.
    #[schema(value_type = Option<String>)]
    pub kwh: Option<Decimal>,
    /// Share of those records' GPU-seconds held whose energy was measured: below 1, `kwh`
    /// understates.
    #[schema(value_type = String)]
    pub coverage: Decimal,
}

/// Emissions of a period or group, from measured energy and the grid intensity of each
/// record's region and month; nothing is estimated where either is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EmissionsView {
    /// kg CO2e: Σ kWh × PUE × gCO2e per kWh ÷ 1000; null when no measured energy had an
    /// intensity.
    #[schema(value_type = Option<String>, example = "0.512")]
    pub kg_co2e: Option<Decimal>,
    /// Share of the GPU-seconds held with both measured energy and a grid intensity.
    #[schema(value_type = String, example = "0.5")]
    pub coverage: Decimal,
}

/// Per-record counts of one group: records that ended in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordCounts {
    pub retries: i64,
    pub failures: i64,
    pub tasks_completed: i64,
    pub tasks_failed: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Breakdown {
    /// Cost of completed records × busy/held.
    pub productive: Decimal,
    /// Cost of completed records × (held − busy)/held.
    pub idle: Decimal,
    /// Cost of completed records that reported no busy time.
    pub unmeasured: Decimal,
    /// Whole cost of failed, cancelled and preempted records.
    pub failed: Decimal,
    /// Unused commitment of reserved contracts scoped to the project.
    pub unused_commitment: Decimal,
    /// Idle time of capacity pools charged to the project: GPUs up and paid with no job.
    #[serde(default)]
    pub capacity_idle: Decimal,
    /// Down time of capacity pools charged to the project: GPUs paid and unable to run.
    #[serde(default)]
    pub capacity_down: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UnratedView {
    /// `no_contract` or `no_fx_rate`.
    pub reason: String,
    pub gpu_model: String,
    pub gpu_seconds: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutputView {
    pub unit: String,
    /// Output of completed records that ended in the period.
    pub quantity: Decimal,
    /// Cost in the period of the completed records with this unit, per unit.
    pub direct_cost_per_unit: Option<Decimal>,
    /// The direct cost per unit × total / cost of all completed records.
    pub loaded_cost_per_unit: Option<Decimal>,
}

/// The figures of a period, or of one group of it. Money is in the project's currency, as
/// full-precision decimal strings (sums are carried to 20 decimal places).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Figures {
    /// productive + idle + unmeasured + failed + unused_commitment + capacity_idle +
    /// capacity_down, exactly.
    pub total: Decimal,
    pub breakdown: Breakdown,
    /// idle + failed + unused_commitment + capacity_idle + capacity_down.
    pub waste: Decimal,
    pub gpu_seconds_held: Decimal,
    /// Busy time of the records that measured it.
    pub gpu_seconds_busy: Decimal,
    /// GPU-seconds that carry no cost for want of a contract or an FX rate (including
    /// unused committed GPU-seconds of a contract whose currency has no rate that month).
    pub unrated_gpu_seconds: Decimal,
    pub unrated: Vec<UnratedView>,
    /// Tasks whose first completed record ended in the period (each task counts once).
    pub tasks_completed: i64,
    /// Tasks none of whose attempts completed, counted in the period holding the end of
    /// their last attempt.
    pub tasks_failed: i64,
    /// Sums of the records' `retries` and `failures`, for records that ended in the period.
    pub retries: i64,
    pub failures: i64,
    /// total / tasks_completed; null when no task completed.
    pub cost_per_completed_task: Option<Decimal>,
    pub output: Vec<OutputView>,
    /// What the GPUs really did, from the telemetry of the records that reported it:
    /// averages weighted by GPU-seconds held, each with its coverage. Null when no record
    /// of the group reported any.
    #[serde(default)]
    pub utilisation: Option<Utilisation>,
    /// Cost of the records whose GPU-Util was at least 0.8 while their SMs were active less
    /// than 0.4 of the time: busy on the dashboard, idle on the chip. Part of productive and
    /// idle, never added to the total. Null when no record reported both figures.
    #[serde(default)]
    pub looks_busy_cost: Option<Decimal>,
    /// GPU-seconds of memory paid for and not used: Σ held × (1 − memory peak / memory
    /// total). Null when no record reported its memory peak.
    #[serde(default)]
    pub unused_memory_gpu_seconds: Option<Decimal>,
    /// The cost share of that memory: Σ cost × (1 − memory peak / memory total), inside the
    /// total. Null when no record reported its memory peak.
    #[serde(default)]
    pub unused_memory_cost: Option<Decimal>,
    /// Energy the GPUs used, from the records that measured it; null when none did.
    #[serde(default)]
    pub energy: Option<EnergyView>,
    /// Emissions of that energy where the grid intensity of its region and month is known;
    /// null when no record measured energy.
    #[serde(default)]
    pub emissions: Option<EmissionsView>,
    /// Model FLOPs utilisation of the records that reported `model_flops`; null when none
    /// did on a card the catalogue has a peak for.
    #[serde(default)]
    pub mfu: Option<MfuView>,
    /// (productive + idle + unmeasured + failed) ÷ GPU-hours held; null without GPU time.
    #[serde(default)]
    pub cost_per_gpu_hour: Option<Decimal>,
    /// cost_per_gpu_hour ÷ MFU: what a GPU-hour of work at the card's peak cost. Null
    /// without an MFU.
    #[serde(default)]
    pub cost_per_effective_gpu_hour: Option<Decimal>,
}

/// How long the attempts that started in a period waited to start: the queue wait of an
/// attempt is `started_at − queued_at`, counted only for attempts that reported
/// `queued_at`. It is time, shown next to cost and never added to it.
///
/// Percentiles are exact and by nearest rank, as PostgreSQL's `percentile_disc`: the p-th
/// percentile of n waits is the ⌈p × n⌉-th shortest, always one attempt's own wait. Attempts
/// and total add up over the groups of a period; percentiles do not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueWait {
    /// Attempts that started in the period and reported `queued_at`.
    pub attempts: i64,
    /// The ⌈n / 2⌉-th shortest of the n waits, in seconds.
    pub p50_seconds: Decimal,
    /// The ⌈0.95 × n⌉-th shortest of the n waits, in seconds.
    pub p95_seconds: Decimal,
    /// The sum of the waits, in seconds.
    pub total_seconds: Decimal,
}

/// Sums of one group, before the derived figures are computed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FigureSums {
    productive: Decimal,
    idle: Decimal,
    unmeasured: Decimal,
    failed: Decimal,
    unused_commitment: Decimal,
    capacity_idle: Decimal,
    capacity_down: Decimal,
    gpu_seconds_held: Decimal,
    gpu_seconds_busy: Decimal,
    /// (reason, model) → GPU-seconds.
    unrated: BTreeMap<(String, String), Decimal>,
    tasks_completed: i64,
    tasks_failed: i64,
    retries: i64,
    failures: i64,
    completed_cost: Decimal,
    /// Unit → (quantity, direct cost).
    output: BTreeMap<String, (Decimal, Decimal)>,
    /// Unit → GPU-seconds held of the completed segments with that unit.
    unit_held: BTreeMap<String, Decimal>,
    util: UtilSums,
    energy: EnergyTotals,
    mfu: MfuSums,
}

/// Energy sums of one group, and per output unit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct EnergyTotals {
    metered_gpu_seconds: Decimal,
    joules: Decimal,
    intensity_gpu_seconds: Decimal,
    gram_joules: Decimal,
    /// Unit → (metered GPU-seconds, joules).
    by_unit: BTreeMap<String, (Decimal, Decimal)>,
}

impl EnergyTotals {
    fn add(&mut self, sums: &EnergySums) {
        self.metered_gpu_seconds += sums.metered_gpu_seconds;
        self.joules += sums.joules;
        self.intensity_gpu_seconds += sums.intensity_gpu_seconds;
        self.gram_joules += sums.gram_joules;
        if let Some(unit) = &sums.output_unit {
            let (metered, joules) = self.by_unit.entry(unit.clone()).or_default();
            *metered += sums.metered_gpu_seconds;
            *joules += sums.joules;
        }
    }

    /// Emissions over GPU-seconds `held`; none when no energy was measured.
    fn emissions_view(&self, held: Decimal) -> Option<EmissionsView> {
        if self.metered_gpu_seconds.is_zero() && self.joules.is_zero() {
            return None;
        }
        Some(EmissionsView {
            kg_co2e: (!self.intensity_gpu_seconds.is_zero()).then(|| {
                (self.gram_joules / JOULES_PER_KWH / Decimal::ONE_THOUSAND)
                    .round_dp(SUM_SCALE)
                    .normalize()
            }),
            coverage: share(self.intensity_gpu_seconds, held),
        })
    }

    fn merge(&mut self, other: &EnergyTotals) {
        self.metered_gpu_seconds += other.metered_gpu_seconds;
        self.joules += other.joules;
        self.intensity_gpu_seconds += other.intensity_gpu_seconds;
        self.gram_joules += other.gram_joules;
        for (unit, (metered, joules)) in &other.by_unit {
            let (m, j) = self.by_unit.entry(unit.clone()).or_default();
            *m += metered;
            *j += joules;
        }
    }
}

/// `part ÷ whole` as a share, 0 when the whole is 0.
fn share(part: Decimal, whole: Decimal) -> Decimal {
    part.checked_div(whole)
        .unwrap_or_default()
        .round_dp(SHARE_SCALE)
        .normalize()
}

fn kwh(joules: Decimal) -> Decimal {
    (joules / JOULES_PER_KWH).round_dp(SUM_SCALE).normalize()
}

impl FigureSums {
    pub fn add_segments(&mut self, sums: &SegmentSums) {
        self.productive += sums.productive;
        self.idle += sums.idle;
        self.unmeasured += sums.unmeasured;
        self.failed += sums.failed;
        self.gpu_seconds_held += sums.gpu_seconds_held;
        self.gpu_seconds_busy += sums.gpu_seconds_busy;
        if let Some((reason, gpu_model)) = &sums.unrated {
            self.add_unrated(reason, gpu_model, sums.gpu_seconds_held);
        }
        if sums.completed {
            self.completed_cost += sums.cost;
            if let Some(unit) = &sums.output_unit {
                let (quantity, direct) = self.output.entry(unit.clone()).or_default();
                *quantity += sums.output_quantity;
                *direct += sums.cost;
                *self.unit_held.entry(unit.clone()).or_default() += sums.gpu_seconds_held;
            }
        }
    }

    /// Measured energy of the group's segments.
    pub fn add_energy(&mut self, sums: &EnergySums) {
        self.energy.add(sums);
    }

    /// Model FLOPs of the group's segments.
    pub fn add_mfu(&mut self, sums: &MfuSums) {
        self.mfu.add(sums);
    }

    pub fn add_records(&mut self, counts: &RecordCounts) {
        self.tasks_completed += counts.tasks_completed;
        self.tasks_failed += counts.tasks_failed;
        self.retries += counts.retries;
        self.failures += counts.failures;
    }

    pub fn add_util(&mut self, sums: &UtilSums) {
        self.util.merge(sums);
    }

    pub fn add_unused_commitment(&mut self, cost: Decimal) {
        self.unused_commitment += cost;
    }

    /// Idle and down cost of capacity charged to the group.
    pub fn add_capacity(&mut self, idle: Decimal, down: Decimal) {
        self.capacity_idle += idle;
        self.capacity_down += down;
    }

    /// GPU-seconds that carry no cost, by reason and model.
    pub fn add_unrated(&mut self, reason: &str, gpu_model: &str, gpu_seconds: Decimal) {
        *self
            .unrated
            .entry((reason.to_owned(), gpu_model.to_owned()))
            .or_default() += gpu_seconds;
    }

    pub fn merge(&mut self, other: &FigureSums) {
        self.productive += other.productive;
        self.idle += other.idle;
        self.unmeasured += other.unmeasured;
        self.failed += other.failed;
        self.unused_commitment += other.unused_commitment;
        self.capacity_idle += other.capacity_idle;
        self.capacity_down += other.capacity_down;
        self.gpu_seconds_held += other.gpu_seconds_held;
        self.gpu_seconds_busy += other.gpu_seconds_busy;
        for ((reason, model), seconds) in &other.unrated {
            self.add_unrated(reason, model, *seconds);
        }
        self.tasks_completed += other.tasks_completed;
        self.tasks_failed += other.tasks_failed;
        self.retries += other.retries;
        self.failures += other.failures;
        self.completed_cost += other.completed_cost;
        for (unit, (quantity, direct)) in &other.output {
            let (q, d) = self.output.entry(unit.clone()).or_default();
            *q += quantity;
            *d += direct;
        }
        for (unit, held) in &other.unit_held {
            *self.unit_held.entry(unit.clone()).or_default() += held;
        }
        self.util.merge(&other.util);
        self.energy.merge(&other.energy);
        self.mfu.add(&other.mfu);
    }

    fn energy_view(&self) -> Option<EnergyView> {
        let energy = &self.energy;
        if energy.metered_gpu_seconds.is_zero() && energy.joules.is_zero() {
            return None;
        }
        Some(EnergyView {
            kwh: kwh(energy.joules),
            coverage: share(energy.metered_gpu_seconds, self.gpu_seconds_held),
            kwh_per_unit: self
                .output
                .iter()
                .map(|(unit, (quantity, _))| {
                    let (metered, joules) = energy.by_unit.get(unit).copied().unwrap_or_default();
                    let held = self.unit_held.get(unit).copied().unwrap_or_default();
                    UnitEnergyView {
                        unit: unit.clone(),
                        kwh: (!quantity.is_zero() && !metered.is_zero())
                            .then(|| (kwh(joules) / quantity).round_dp(SUM_SCALE).normalize()),
                        coverage: share(metered, held),
                    }
                })
                .collect(),
        })
    }

    fn emissions_view(&self) -> Option<EmissionsView> {
        self.energy.emissions_view(self.gpu_seconds_held)
    }

    /// What the group spent and produced in `unit`, for the factors of its cost per unit.
    pub fn workload_totals(&self, unit: &str) -> super::efficiency::WorkloadTotals {
        super::efficiency::WorkloadTotals {
            cost: self.productive + self.idle + self.unmeasured + self.failed,
            gpu_seconds_held: self.gpu_seconds_held,
            completed_gpu_seconds: self.unit_held.get(unit).copied().unwrap_or_default(),
            quantity: self.output.get(unit).map(|(q, _)| *q).unwrap_or_default(),
        }
    }

    pub fn total(&self) -> Decimal {
        self.productive
            + self.idle
            + self.unmeasured
            + self.failed
            + self.unused_commitment
            + self.capacity_idle
            + self.capacity_down
    }

    pub fn figures(&self) -> Figures {
        let total = self.total();
        let mfu = self.mfu.view(self.gpu_seconds_held);
        let (cost_per_gpu_hour, cost_per_effective_gpu_hour) = hourly_costs(
            self.productive + self.idle + self.unmeasured + self.failed,
            self.gpu_seconds_held,
            mfu.as_ref(),
        );
        let tasks_completed = u64::try_from(self.tasks_completed).unwrap_or(0);
        Figures {
            total: total.normalize(),
            breakdown: Breakdown {
                productive: self.productive.normalize(),
                idle: self.idle.normalize(),
                unmeasured: self.unmeasured.normalize(),
                failed: self.failed.normalize(),
                unused_commitment: self.unused_commitment.normalize(),
                capacity_idle: self.capacity_idle.normalize(),
                capacity_down: self.capacity_down.normalize(),
            },
            waste: (self.idle
                + self.failed
                + self.unused_commitment
                + self.capacity_idle
                + self.capacity_down)
                .normalize(),
            gpu_seconds_held: self.gpu_seconds_held.normalize(),
            gpu_seconds_busy: self.gpu_seconds_busy.normalize(),
            unrated_gpu_seconds: self.unrated.values().copied().sum::<Decimal>().normalize(),
            unrated: self
                .unrated
                .iter()
                .map(|((reason, gpu_model), seconds)| UnratedView {
                    reason: reason.clone(),
                    gpu_model: gpu_model.clone(),
                    gpu_seconds: seconds.normalize(),
                })
                .collect(),
            tasks_completed: self.tasks_completed,
            tasks_failed: self.tasks_failed,
            retries: self.retries,
            failures: self.failures,
            cost_per_completed_task: cost_per_completed_task(total, tasks_completed)
                .map(|cost| cost.normalize()),
            output: self
                .output
                .iter()
                .map(|(unit, (quantity, direct))| {
                    let costs = unit_costs(*direct, *quantity, total, self.completed_cost);
                    OutputView {
                        unit: unit.clone(),
                        quantity: quantity.normalize(),
                        direct_cost_per_unit: costs.direct_per_unit.map(|c| c.normalize()),
                        loaded_cost_per_unit: costs.loaded_per_unit.map(|c| c.normalize()),
                    }
                })
                .collect(),
            utilisation: self.util.utilisation(self.gpu_seconds_held),
            looks_busy_cost: self.util.looks_busy_cost(),
            unused_memory_gpu_seconds: self.util.unused_memory_gpu_seconds(),
            unused_memory_cost: self.util.unused_memory_cost(),
            energy: self.energy_view(),
            emissions: self.emissions_view(),
            mfu,
            cost_per_gpu_hour,
            cost_per_effective_gpu_hour,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::domain::rating::Outcome;

    fn money() -> impl Strategy<Value = Decimal> {
        (0i64..10_000_000_000).prop_map(|cents| Decimal::new(cents, 8))
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            Just(Outcome::Completed),
            Just(Outcome::Failed),
            Just(Outcome::Cancelled),
            Just(Outcome::Preempted),
        ]
    }

    prop_compose! {
        fn segment_sums()(
            outcome in outcome(),
            gpu_model in prop_oneof![Just("H100"), Just("A100")],
            unrated in prop_oneof![Just(None), Just(Some("no_contract")), Just(Some("no_fx_rate"))],
            unit in prop_oneof![Just(None), Just(Some("tokens")), Just(Some("samples"))],
            held in money(), busy in money(), parts in prop::array::uniform4(money()),
            quantity in money(),
        ) -> SegmentSums {
            let [productive, idle, unmeasured, failed] = parts;
            let completed = outcome == Outcome::Completed;
            SegmentSums {
                completed,
                unrated: unrated.map(|reason| (reason.to_owned(), gpu_model.to_owned())),
                output_unit: unit.filter(|_| completed).map(str::to_owned),
                gpu_seconds_held: held,
                gpu_seconds_busy: busy,
                cost: productive + idle + unmeasured + failed,
                productive, idle, unmeasured, failed,
                output_quantity: quantity,
            }
        }
    }

    prop_compose! {
        fn record_counts()(counts in prop::array::uniform4(0i64..1000)) -> RecordCounts {
            let [retries, failures, tasks_completed, tasks_failed] = counts;
            RecordCounts { retries, failures, tasks_completed, tasks_failed }
        }
    }

    /// One contribution to a group: segment sums, record counts or unused commitment.
    #[derive(Debug, Clone)]
    enum Part {
        Segments(SegmentSums),
        Records(RecordCounts),
        Unused(Decimal),
        Capacity(Decimal, Decimal),
    }

    fn part() -> impl Strategy<Value = Part> {
        prop_oneof![
            segment_sums().prop_map(Part::Segments),
            record_counts().prop_map(Part::Records),
            money().prop_map(Part::Unused),
            (money(), money()).prop_map(|(idle, down)| Part::Capacity(idle, down)),
        ]
    }

    fn add(sums: &mut FigureSums, part: &Part) {
        match part {
            Part::Segments(s) => sums.add_segments(s),
            Part::Records(r) => sums.add_records(r),
            Part::Unused(cost) => sums.add_unused_commitment(*cost),
            Part::Capacity(idle, down) => sums.add_capacity(*idle, *down),
        }
    }

    proptest! {
        /// However the parts of a period are split into groups, merging the groups gives
        /// exactly the figures of the whole, and the groups' totals add up to its total.
        #[test]
        fn groups_merge_to_the_whole(
            parts in prop::collection::vec((part(), 0usize..5), 0..40),
        ) {
            let mut whole = FigureSums::default();
            let mut groups = vec![FigureSums::default(); 5];
            for (part, group) in &parts {
                add(&mut whole, part);
                add(&mut groups[*group], part);
            }
            let mut merged = FigureSums::default();
            for group in &groups {
                merged.merge(group);
            }
            prop_assert_eq!(merged.figures(), whole.figures());
            let group_totals: Decimal = groups.iter().map(FigureSums::total).sum();
            prop_assert_eq!(group_totals, whole.total());
        }

        /// The breakdown is a partition of the total, and waste is its wasted parts.
        #[test]
        fn parts_add_up_to_the_total(parts in prop::collection::vec(part(), 0..40)) {
            let mut sums = FigureSums::default();
            for part in &parts {
                add(&mut sums, part);
            }
            let f = sums.figures();
            let b = &f.breakdown;
            prop_assert_eq!(
                b.productive + b.idle + b.unmeasured + b.failed + b.unused_commitment
                    + b.capacity_idle + b.capacity_down,
                f.total
            );
            prop_assert_eq!(
                b.idle + b.failed + b.unused_commitment + b.capacity_idle + b.capacity_down,
                f.waste
            );
            let unrated: Decimal = f.unrated.iter().map(|u| u.gpu_seconds).sum();
            prop_assert_eq!(unrated, f.unrated_gpu_seconds);
        }
    }

    #[test]
    fn group_by_names_every_grouping() {
        assert_eq!(Grouping::parse("day"), Ok(Grouping::Day));
        assert_eq!(
            Grouping::parse("label:team"),
            Ok(Grouping::Label("team".to_owned()))
        );
        assert_eq!(
            Grouping::parse("gpu_model,billing_mode"),
            Ok(Grouping::GpuModelAndBillingMode)
        );
        assert!(Grouping::parse("billing_mode,gpu_model").is_err());
        assert!(Grouping::parse("label:").is_err());
        assert!(Grouping::parse("week").is_err());
    }
}
