//! What a project's GPU time cost over a period (COST_MODEL.md §2–4), read from the rated
//! rollups.

use std::collections::BTreeMap;

use axum::extract::State;
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::domain::access::Principal;
use crate::domain::commitment::unused_commitment;
use crate::domain::ledger_time::{LedgerHour, SECONDS_PER_HOUR, month_bounds};
use crate::domain::rating::{FxRates, Outcome};
use crate::domain::summary::{cost_per_completed_task, unit_costs};
use crate::domain::values::{Month, parse_day_or_instant, parse_instant};
use crate::error::{ApiResult, Problem, Violations};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::http::projects::readable_project;
use crate::store;
use crate::store::cost::{CostSums, Grouping, RecordSums, SUM_SCALE};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_cost))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CostParams {
    /// `YYYY-MM` of the ledger time zone; instead of `from` and `to`.
    pub month: Option<String>,
    /// Start (inclusive): a date `YYYY-MM-DD` (its first instant in the ledger time zone) or
    /// an RFC 3339 time that starts a ledger hour; any other time is refused (422), since
    /// rated data is kept per ledger hour.
    pub from: Option<String>,
    /// End (exclusive), in the same forms as `from`.
    pub to: Option<String>,
    /// `day`, `month`, `gpu_model`, `billing_mode`, `outcome` or `label:<key>`.
    pub group_by: Option<String>,
    /// The time up to which unused commitment accrues (RFC 3339); default now.
    pub as_of: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
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
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UnratedView {
    /// `no_contract` or `no_fx_rate`.
    pub reason: String,
    pub gpu_model: String,
    pub gpu_seconds: Decimal,
}

#[derive(Debug, Serialize, ToSchema)]
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
#[derive(Debug, Serialize, ToSchema)]
pub struct Figures {
    /// productive + idle + unmeasured + failed + unused_commitment, exactly.
    pub total: Decimal,
    pub breakdown: Breakdown,
    /// idle + failed + unused_commitment.
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
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GroupView {
    /// The day, month, model, mode, outcome or label value; null for what has none (records
    /// without the label, or unused commitment when grouping by outcome or label).
    pub key: Option<String>,
    #[serde(flatten)]
    pub figures: Figures,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CostView {
    pub project: String,
    pub currency: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Unused commitment accrued up to this time.
    pub as_of: DateTime<Utc>,
    #[serde(flatten)]
    pub figures: Figures,
    /// Present with `group_by`: the groups in key order; they add up exactly to the figures
    /// above.
    pub groups: Vec<GroupView>,
}

/// Sums of one group, before the derived figures are computed.
#[derive(Debug, Default, Clone)]
struct Accumulator {
    productive: Decimal,
    idle: Decimal,
    unmeasured: Decimal,
    failed: Decimal,
    unused_commitment: Decimal,
    gpu_seconds_held: Decimal,
    gpu_seconds_busy: Decimal,
    unrated: BTreeMap<(String, String), Decimal>,
    tasks_completed: i64,
    tasks_failed: i64,
    retries: i64,
    failures: i64,
    completed_cost: Decimal,
    /// Unit → (quantity, direct cost).
    output: BTreeMap<String, (Decimal, Decimal)>,
}

impl Accumulator {
    fn add_costs(&mut self, sums: &CostSums) {
        self.productive += sums.productive;
        self.idle += sums.idle;
        self.unmeasured += sums.unmeasured;
        self.failed += sums.failed;
        self.gpu_seconds_held += sums.gpu_seconds_held;
        self.gpu_seconds_busy += sums.gpu_seconds_busy;
        if let Some(reason) = &sums.unrated_reason {
            *self
                .unrated
                .entry((reason.clone(), sums.gpu_model.clone()))
                .or_default() += sums.gpu_seconds_held;
        }
        if sums.outcome == Outcome::Completed.as_str() {
            self.completed_cost += sums.cost;
            if let Some(unit) = &sums.output_unit {
                let (quantity, direct) = self.output.entry(unit.clone()).or_default();
                *quantity += sums.output_quantity;
                *direct += sums.cost;
            }
        }
    }

    fn add_records(&mut self, sums: &RecordSums) {
        self.tasks_completed += sums.tasks_completed;
        self.tasks_failed += sums.tasks_failed;
        self.retries += sums.retries;
        self.failures += sums.failures;
    }

    fn merge(&mut self, other: &Accumulator) {
        self.productive += other.productive;
        self.idle += other.idle;
        self.unmeasured += other.unmeasured;
        self.failed += other.failed;
        self.unused_commitment += other.unused_commitment;
        self.gpu_seconds_held += other.gpu_seconds_held;
        self.gpu_seconds_busy += other.gpu_seconds_busy;
        for (key, seconds) in &other.unrated {
            *self.unrated.entry(key.clone()).or_default() += seconds;
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
    }

    fn figures(&self) -> Figures {
        let total =
            self.productive + self.idle + self.unmeasured + self.failed + self.unused_commitment;
        let tasks_completed = u64::try_from(self.tasks_completed).unwrap_or(0);
        Figures {
            total: total.normalize(),
            breakdown: Breakdown {
                productive: self.productive.normalize(),
                idle: self.idle.normalize(),
                unmeasured: self.unmeasured.normalize(),
                failed: self.failed.normalize(),
                unused_commitment: self.unused_commitment.normalize(),
            },
            waste: (self.idle + self.failed + self.unused_commitment).normalize(),
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
        }
    }
}

/// A period bound: a date, or a time on a ledger hour boundary.
fn period_bound(raw: &str, tz: Tz) -> Result<DateTime<Utc>, String> {
    let at = parse_day_or_instant(raw, tz)?;
    let hour = LedgerHour::holding(at, tz);
    if hour.start != at {
        return Err(format!(
            "must start a ledger hour (costs are kept per hour of {}): use {} or {}",
            tz.name(),
            hour.start
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            hour.end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    Ok(at)
}

/// Parses `group_by`: `day`, `month`, `gpu_model`, `billing_mode`, `outcome` or `label:<key>`.
pub fn grouping(raw: &str) -> Result<Grouping, String> {
    Ok(match raw {
        "day" => Grouping::Day,
        "month" => Grouping::Month,
        "gpu_model" => Grouping::GpuModel,
        "billing_mode" => Grouping::BillingMode,
        "outcome" => Grouping::Outcome,
        other => match other.strip_prefix("label:") {
            Some(key) if !key.is_empty() && key.len() <= 200 => Grouping::Label(key.to_owned()),
            _ => {
                return Err(
                    "use day, month, gpu_model, billing_mode, outcome or label:<key>".to_owned(),
                );
            }
        },
    })
}

struct Request {
    period: (DateTime<Utc>, DateTime<Utc>),
    grouping: Grouping,
    as_of: DateTime<Utc>,
}

fn parse_params(params: &CostParams, tz: Tz, now: DateTime<Utc>) -> ApiResult<Request> {
    let mut violations = Violations::default();
    let period = match (&params.month, &params.from, &params.to) {
        (Some(month), None, None) => violations
            .check("query:month", Month::parse(month))
            .map(|month| month_bounds(month.first_day(), tz)),
        (None, Some(from), Some(to)) => {
            let from = violations.check("query:from", period_bound(from, tz));
            let to = violations.check("query:to", period_bound(to, tz));
            match from.zip(to) {
                Some((from, to)) if from >= to => {
                    violations.push("query:to", "must be after from");
                    None
                }
                bounds => bounds,
            }
        }
        (Some(_), _, _) => {
            violations.push("query:month", "give either month or from and to, not both");
            None
        }
        (None, None, _) => {
            violations.push("query:from", "give month, or from and to");
            None
        }
        (None, Some(_), None) => {
            violations.push("query:to", "give to with from");
            None
        }
    };
    let grouping = match &params.group_by {
        Some(raw) => violations.check("query:group_by", grouping(raw)),
        None => Some(Grouping::Whole),
    };
    let as_of = match &params.as_of {
        Some(raw) => violations.check("query:as_of", parse_instant(raw)),
        None => Some(now),
    };
    violations.into_result()?;
    let (Some(period), Some(grouping), Some(as_of)) = (period, grouping, as_of) else {
        unreachable!("every parameter parsed or was reported")
    };
    Ok(Request {
        period,
        grouping,
        as_of,
    })
}

/// The group key of a ledger hour, for figures computed per hour (unused commitment).
fn hour_key(grouping: &Grouping, hour: DateTime<Utc>, gpu_model: &str, tz: Tz) -> Option<String> {
    let local = hour.with_timezone(&tz);
    match grouping {
        Grouping::Whole | Grouping::Outcome | Grouping::Label(_) => None,
        Grouping::Day => Some(local.format("%Y-%m-%d").to_string()),
        Grouping::Month => Some(local.format("%Y-%m").to_string()),
        Grouping::GpuModel => Some(gpu_model.to_owned()),
        Grouping::BillingMode => Some("reserved".to_owned()),
    }
}

/// Unused commitment of the project's own reserved contracts, per group, up to `as_of`.
async fn add_unused_commitment(
    conn: &mut sqlx::PgConnection,
    project: &str,
    currency: &str,
    request: &Request,
    tz: Tz,
    groups: &mut BTreeMap<Option<String>, Accumulator>,
) -> ApiResult<()> {
    let (from, to) = request.period;
    let accrues_until = to.min(request.as_of);
    if accrues_until <= from {
        return Ok(());
    }
    let window = (from, accrues_until);
    let contracts =
        store::contracts::project_commitments(conn, project, from, accrues_until).await?;
    if contracts.is_empty() {
        return Ok(());
    }
    let ids: Vec<_> = contracts.iter().map(|c| c.id).collect();
    // An hour cut by `as_of` has its usage read whole: usage has no finer grain.
    let usage = store::cost::contract_usage(conn, project, window, &ids).await?;
    let fx = store::fx_rates::table(
        conn,
        LedgerHour::holding(from, tz).month,
        LedgerHour::holding(accrues_until, tz).month,
        &[currency.to_owned()],
    )
    .await?;
    let empty = BTreeMap::new();
    for row in &contracts {
        let contract = row.to_domain()?;
        let used = usage.get(&row.id).unwrap_or(&empty);
        for charge in unused_commitment(&contract, used, window.0, window.1, tz) {
            if charge.unused_gpu_hours.is_zero() {
                continue;
            }
            let month = LedgerHour::holding(charge.hour, tz).month;
            let rate = if contract.currency == currency {
                Some(Decimal::ONE)
            } else {
                fx.rate(month, &contract.currency, currency)
            };
            let group = groups
                .entry(hour_key(
                    &request.grouping,
                    charge.hour,
                    &contract.gpu_model,
                    tz,
                ))
                .or_default();
            match rate {
                Some(rate) => {
                    group.unused_commitment += (charge.cost * rate).round_dp(SUM_SCALE);
                }
                None => {
                    *group
                        .unrated
                        .entry(("no_fx_rate".to_owned(), contract.gpu_model.clone()))
                        .or_default() +=
                        (charge.unused_gpu_hours * SECONDS_PER_HOUR).round_dp(SUM_SCALE);
                }
            }
        }
    }
    Ok(())
}

/// A project's cost over a period, from its rated data.
///
/// Every figure covers the segments in `[from, to)`: a record spanning the period's edge
/// counts with the part inside it. Figures counted per record (tasks, retries, failures,
/// output) belong to the period holding the record's `ended_at`; a task counts as completed
/// where its first completed record ended, and as failed (`tasks_failed`) where the last of
/// its attempts ended when none of them completed. Unused commitment of reserved contracts
/// scoped to the project accrues hour by hour up to `as_of`; that of unscoped contracts is
/// not the project's (it goes to the monthly report's `shared` row).
#[utoipa::path(get, path = "/v1/projects/{id}/cost", tag = "cost",
    params(("id" = String, Path, description = "Project id"), CostParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The project's cost over the period", body = CostView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid query parameters, named as `query:<name>`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_cost(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<CostParams>,
) -> ApiResult<axum::Json<CostView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let request = parse_params(&params, tz, state.settings.clock.now())?;
    let mut conn = state.pool.acquire().await?;
    let view = project_cost(&mut conn, &project.id, &project.currency, &request, tz).await?;
    Ok(axum::Json(view))
}

async fn project_cost(
    conn: &mut sqlx::PgConnection,
    project: &str,
    currency: &str,
    request: &Request,
    tz: Tz,
) -> ApiResult<CostView> {
    let mut groups: BTreeMap<Option<String>, Accumulator> = BTreeMap::new();
    for sums in store::cost::cost_sums(conn, project, request.period, &request.grouping, tz).await?
    {
        groups.entry(sums.key.clone()).or_default().add_costs(&sums);
    }
    for sums in
        store::cost::record_sums(conn, project, request.period, &request.grouping, tz).await?
    {
        groups
            .entry(sums.key.clone())
            .or_default()
            .add_records(&sums);
    }
    add_unused_commitment(conn, project, currency, request, tz, &mut groups).await?;
    let mut whole = Accumulator::default();
    for group in groups.values() {
        whole.merge(group);
    }
    let groups = match request.grouping {
        Grouping::Whole => Vec::new(),
        _ => groups
            .into_iter()
            .map(|(key, group)| GroupView {
                key,
                figures: group.figures(),
            })
            .collect(),
    };
    Ok(CostView {
        project: project.to_owned(),
        currency: currency.to_owned(),
        from: request.period.0,
        to: request.period.1,
        as_of: request.as_of,
        figures: whole.figures(),
        groups,
    })
}

/// A project's cost over a whole ledger month, with unused commitment accrued up to `as_of`.
pub async fn month_cost(
    conn: &mut sqlx::PgConnection,
    project: &str,
    currency: &str,
    month: NaiveDate,
    grouping: Grouping,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> ApiResult<CostView> {
    let request = Request {
        period: month_bounds(month, tz),
        grouping,
        as_of,
    };
    project_cost(conn, project, currency, &request, tz).await
}

/// A project's spend in a month up to `as_of` (COST_MODEL §5): the cost of the month's ledger
/// hours up to the one holding `as_of`, and unused commitment accrued until `as_of`.
pub async fn month_spend(
    conn: &mut sqlx::PgConnection,
    project: &str,
    currency: &str,
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> ApiResult<Decimal> {
    let (start, end) = month_bounds(month, tz);
    let until = if as_of >= end {
        end
    } else {
        LedgerHour::holding(as_of, tz).end
    };
    if as_of <= start {
        return Ok(Decimal::ZERO);
    }
    let request = Request {
        period: (start, until),
        grouping: Grouping::Whole,
        as_of,
    };
    Ok(project_cost(conn, project, currency, &request, tz)
        .await?
        .figures
        .total)
}
