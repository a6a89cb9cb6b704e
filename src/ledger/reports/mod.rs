//! The monthly report for finance (COST_MODEL.md §1.7, §2, §6): a row per project, the
//! `shared` unused commitment of unscoped contracts, prior-period adjustments and grand totals
//! per currency. A closed month's report is frozen as the JSON it had at close; what changes
//! a closed month afterwards is booked into the first open month after it as an adjustment.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::commitment::unused_commitment;
use crate::domain::csv_cell::text_cell;
use crate::domain::figures::{Figures, Grouping};
use crate::domain::ledger_time::month_bounds;
use crate::domain::values::{Currency, Month};
use crate::ledger::cost::{CostOf, GroupView, month_cost};
use crate::ledger::{LedgerError as ApiError, LedgerResult as ApiResult};
use crate::store;

#[derive(Debug, Serialize, ToSchema)]
pub struct MonthlyReport {
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// A closed month's report never changes.
    pub closed: bool,
    pub closed_at: Option<DateTime<Utc>>,
    /// Unused commitment is accrued up to this instant: now, or the month's end once it ended.
    pub as_of: DateTime<Utc>,
    pub projects: Vec<ProjectLine>,
    /// Unused commitment of reserved contracts scoped to no project, per currency.
    pub shared: Vec<SharedLine>,
    /// Changes to closed months booked here, each with the month it belongs to.
    pub adjustments: Vec<AdjustmentLine>,
    pub totals: Vec<TotalLine>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectLine {
    pub project: String,
    pub name: String,
    pub team: Option<String>,
    pub currency: String,
    #[serde(flatten)]
    pub figures: Figures,
    /// The month's budget (its own, else the project's default).
    #[schema(value_type = Option<String>)]
    pub budget: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub burn_pct: Option<Decimal>,
    /// With `group_by`: the project's figures per group.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SharedLine {
    pub currency: String,
    #[schema(value_type = String)]
    pub unused_commitment: Decimal,
    #[schema(value_type = String)]
    pub unused_gpu_hours: Decimal,
    pub contracts: Vec<SharedContract>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SharedContract {
    pub id: Uuid,
    pub name: String,
    pub gpu_model: String,
    #[schema(value_type = String)]
    pub unused_gpu_hours: Decimal,
    #[schema(value_type = String)]
    pub unused_commitment: Decimal,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AdjustmentLine {
    /// The project; null for the shared unused commitment.
    pub project: Option<String>,
    /// The closed month the change belongs to.
    #[schema(value_type = String, example = "2026-10")]
    pub belongs_to: Month,
    pub currency: String,
    #[serde(flatten)]
    pub amounts: Amounts,
}

/// The money figures of a line; adjustments carry their differences.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Amounts {
    #[schema(value_type = String)]
    pub total: Decimal,
    #[schema(value_type = String)]
    pub productive: Decimal,
    #[schema(value_type = String)]
    pub idle: Decimal,
    #[schema(value_type = String)]
    pub unmeasured: Decimal,
    #[schema(value_type = String)]
    pub failed: Decimal,
    #[schema(value_type = String)]
    pub unused_commitment: Decimal,
}

impl Amounts {
    const FIELDS: [&'static str; 6] = [
        "total",
        "productive",
        "idle",
        "unmeasured",
        "failed",
        "unused_commitment",
    ];

    fn values(&self) -> [Decimal; 6] {
        [
            self.total,
            self.productive,
            self.idle,
            self.unmeasured,
            self.failed,
            self.unused_commitment,
        ]
    }

    fn from_values(values: [Decimal; 6]) -> Self {
        let [
            total,
            productive,
            idle,
            unmeasured,
            failed,
            unused_commitment,
        ] = values;
        Self {
            total,
            productive,
            idle,
            unmeasured,
            failed,
            unused_commitment,
        }
    }

    fn combine(&self, other: &Amounts, sign: Decimal) -> Amounts {
        let (a, b) = (self.values(), other.values());
        Amounts::from_values(std::array::from_fn(|i| a[i] + sign * b[i]))
    }

    fn is_zero(&self) -> bool {
        self.values().iter().all(Decimal::is_zero)
    }

    fn normalized(self) -> Amounts {
        Amounts::from_values(self.values().map(|v| v.normalize()))
    }

    /// Reads the amounts of a project line (`total` and `breakdown`), a shared line
    /// (`unused_commitment`) or an adjustment line of a frozen report.
    fn from_frozen(line: &Value) -> ApiResult<Amounts> {
        let read = |value: &Value| -> ApiResult<Decimal> {
            value
                .as_str()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("a frozen report holds a malformed amount").into())
        };
        if let Some(breakdown) = line.get("breakdown") {
            let part = |name: &str| read(&breakdown[name]);
            Ok(Amounts {
                total: read(&line["total"])?,
                productive: part("productive")?,
                idle: part("idle")?,
                unmeasured: part("unmeasured")?,
                failed: part("failed")?,
                unused_commitment: part("unused_commitment")?,
            })
        } else if line.get("belongs_to").is_some() {
            let mut values = [Decimal::ZERO; 6];
            for (slot, name) in values.iter_mut().zip(Amounts::FIELDS) {
                *slot = read(&line[name])?;
            }
            Ok(Amounts::from_values(values))
        } else {
            let unused = read(&line["unused_commitment"])?;
            Ok(Amounts {
                total: unused,
                unused_commitment: unused,
                ..Amounts::default()
            })
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TotalLine {
    pub currency: String,
    /// The projects' totals.
    #[schema(value_type = String)]
    pub projects: Decimal,
    #[schema(value_type = String)]
    pub shared: Decimal,
    #[schema(value_type = String)]
    pub adjustments: Decimal,
    /// projects + shared + adjustments.
    #[schema(value_type = String)]
    pub total: Decimal,
}

/// Who owns a line: a project, or the shared commitment (`None`), in a currency.
type LineKey = (Option<String>, String);

/// The report of a month: the frozen JSON of a closed month, or the live figures of an open
/// one (`group_by` adds per-group figures to open months only).
pub enum Report {
    Frozen(String),
    Live(MonthlyReport),
}

impl Report {
    pub fn to_json(&self) -> ApiResult<String> {
        match self {
            Report::Frozen(json) => Ok(json.clone()),
            Report::Live(report) => Ok(serde_json::to_string(report).map_err(anyhow::Error::from)?),
        }
    }
}

pub async fn report(
    pool: &PgPool,
    month: Month,
    grouping: Grouping,
    settings: &Settings,
) -> ApiResult<Report> {
    let closes = store::closes::all(pool).await?;
    if let Some(close) = closes.iter().find(|c| c.month == month.first_day()) {
        if grouping != Grouping::Whole {
            return Err(ApiError::conflict(format!(
                "{month} is closed: its report is frozen without groups"
            )));
        }
        return Ok(Report::Frozen(close.report_json.clone()));
    }
    Ok(Report::Live(
        live_report(pool, month, grouping, settings, &closes).await?,
    ))
}

/// Closes a month: computes its report as of the month's end and freezes it.
pub async fn close(
    pool: &PgPool,
    month: Month,
    closed_by: Uuid,
    settings: &Settings,
) -> ApiResult<String> {
    let now = settings.clock.now();
    let (_, end) = month_bounds(month.first_day(), settings.timezone);
    if now < end {
        return Err(ApiError::conflict(format!(
            "{month} has not ended yet (it ends at {end}); only past months can be closed"
        )));
    }
    let closes = store::closes::all(pool).await?;
    if closes.iter().any(|c| c.month == month.first_day()) {
        return Err(ApiError::conflict(format!("{month} is already closed")));
    }
    let mut report = live_report(pool, month, Grouping::Whole, settings, &closes).await?;
    report.closed = true;
    report.closed_at = Some(now);
    let json = serde_json::to_string(&report).map_err(anyhow::Error::from)?;
    if !store::closes::close(pool, month.first_day(), now, closed_by, &json).await? {
        return Err(ApiError::conflict(format!("{month} is already closed")));
    }
    tracing::info!(month = %month, "month closed");
    Ok(json)
}

async fn live_report(
    pool: &PgPool,
    month: Month,
    grouping: Grouping,
    settings: &Settings,
    closes: &[store::closes::CloseRow],
) -> ApiResult<MonthlyReport> {
    let tz = settings.timezone;
    let (_, end) = month_bounds(month.first_day(), tz);
    let as_of = settings.clock.now().min(end);
    let (projects, shared) = month_lines(pool, month, grouping, as_of, settings).await?;
    let adjustments = adjustments(pool, month, closes, settings).await?;
    let totals = totals(&projects, &shared, &adjustments);
    Ok(MonthlyReport {
        month,
        closed: false,
        closed_at: None,
        as_of,
        projects,
        shared,
        adjustments,
        totals,
    })
}

async fn month_lines(
    pool: &PgPool,
    month: Month,
    grouping: Grouping,
    as_of: DateTime<Utc>,
    settings: &Settings,
) -> ApiResult<(Vec<ProjectLine>, Vec<SharedLine>)> {
    let tz = settings.timezone;
    let mut conn = pool.acquire().await?;
    let mut projects = Vec::new();
    for project in store::projects::all(pool).await? {
        let of = CostOf {
            project: &project.id,
            currency: &project.currency,
        };
        let cost = month_cost(
            &mut conn,
            of,
            month.first_day(),
            grouping.clone(),
            as_of,
            tz,
        )
        .await?;
        let budget = store::projects::budget_for(pool, &project, month.first_day()).await?;
        let burn_pct = budget.and_then(|b| {
            crate::domain::summary::burn_pct(cost.figures.total, b).map(|p| p.normalize())
        });
        projects.push(ProjectLine {
            project: project.id,
            name: project.name,
            team: project.team,
            currency: project.currency,
            figures: cost.figures,
            budget: budget.map(|b| b.normalize()),
            burn_pct,
            groups: cost.groups,
        });
    }
    let shared = shared_lines(&mut conn, month, as_of, settings).await?;
    Ok((projects, shared))
}

/// Unused commitment of unscoped reserved contracts up to `as_of`, in each contract's
/// currency: it belongs to no project, so no project's currency applies.
async fn shared_lines(
    conn: &mut sqlx::PgConnection,
    month: Month,
    as_of: DateTime<Utc>,
    settings: &Settings,
) -> ApiResult<Vec<SharedLine>> {
    let tz = settings.timezone;
    let (start, _) = month_bounds(month.first_day(), tz);
    if as_of <= start {
        return Ok(Vec::new());
    }
    let contracts = store::contracts::shared_commitments(conn, start, as_of).await?;
    if contracts.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = contracts.iter().map(|c| c.id).collect();
    let usage = store::cost::contract_usage_all_projects(conn, (start, as_of), &ids).await?;
    let empty = BTreeMap::new();
    let mut by_currency: BTreeMap<String, SharedLine> = BTreeMap::new();
    for row in &contracts {
        let contract = row.to_domain();
        let charges = unused_commitment(
            &contract,
            usage.get(&row.id).unwrap_or(&empty),
            start,
            as_of,
            tz,
        );
        let hours: Decimal = charges.iter().map(|c| c.unused_gpu_hours).sum();
        let cost: Decimal = charges.iter().map(|c| c.cost).sum();
        let line = by_currency
            .entry(contract.currency.clone())
            .or_insert_with(|| SharedLine {
                currency: contract.currency.clone(),
                unused_commitment: Decimal::ZERO,
                unused_gpu_hours: Decimal::ZERO,
                contracts: Vec::new(),
            });
        line.unused_commitment += cost;
        line.unused_gpu_hours += hours;
        line.contracts.push(SharedContract {
            id: row.id,
            name: row.name.clone(),
            gpu_model: contract.gpu_model.clone(),
            unused_gpu_hours: hours.normalize(),
            unused_commitment: cost.normalize(),
        });
    }
    Ok(by_currency
        .into_values()
        .map(|mut line| {
            line.unused_commitment = line.unused_commitment.normalize();
            line.unused_gpu_hours = line.unused_gpu_hours.normalize();
            line
        })
        .collect())
}

/// The amounts of every line of a month as the rated data says now.
async fn current_amounts(
    pool: &PgPool,
    month: Month,
    settings: &Settings,
) -> ApiResult<BTreeMap<LineKey, Amounts>> {
    let (_, end) = month_bounds(month.first_day(), settings.timezone);
    let (projects, shared) = month_lines(pool, month, Grouping::Whole, end, settings).await?;
    let mut amounts = BTreeMap::new();
    for line in projects {
        let b = &line.figures.breakdown;
        amounts.insert(
            (Some(line.project), line.currency),
            Amounts {
                total: line.figures.total,
                productive: b.productive,
                idle: b.idle,
                unmeasured: b.unmeasured,
                failed: b.failed,
                unused_commitment: b.unused_commitment,
            },
        );
    }
    for line in shared {
        amounts.insert(
            (None, line.currency),
            Amounts {
                total: line.unused_commitment,
                unused_commitment: line.unused_commitment,
                ..Amounts::default()
            },
        );
    }
    Ok(amounts)
}

/// The amounts a frozen report shows for each line.
fn frozen_amounts(report: &Value) -> ApiResult<BTreeMap<LineKey, Amounts>> {
    let mut amounts = BTreeMap::new();
    for line in report["projects"].as_array().into_iter().flatten() {
        let key = (
            line["project"].as_str().map(str::to_owned),
            line["currency"].as_str().unwrap_or_default().to_owned(),
        );
        amounts.insert(key, Amounts::from_frozen(line)?);
    }
    for line in report["shared"].as_array().into_iter().flatten() {
        let key = (
            None,
            line["currency"].as_str().unwrap_or_default().to_owned(),
        );
        amounts.insert(key, Amounts::from_frozen(line)?);
    }
    Ok(amounts)
}

/// Adjustments booked into `month`: for each closed month whose first open successor is
/// `month`, what its lines are now, less what its frozen report showed, less what later
/// closed months already booked for it.
async fn adjustments(
    pool: &PgPool,
    month: Month,
    closes: &[store::closes::CloseRow],
    settings: &Settings,
) -> ApiResult<Vec<AdjustmentLine>> {
    let closed: BTreeSet<Month> = closes
        .iter()
        .map(|c| Month::from_first_day(c.month))
        .collect();
    let frozen: BTreeMap<Month, Value> = closes
        .iter()
        .map(|c| {
            serde_json::from_str(&c.report_json)
                .map(|json| (Month::from_first_day(c.month), json))
                .map_err(|e| ApiError::from(anyhow::Error::from(e)))
        })
        .collect::<ApiResult<_>>()?;
    let mut lines = Vec::new();
    for (&closed_month, report) in frozen.iter().filter(|(m, _)| **m < month) {
        let mut booking = closed_month.next();
        while closed.contains(&booking) {
            booking = booking.next();
        }
        if booking != month {
            continue;
        }
        let now = current_amounts(pool, closed_month, settings).await?;
        let then = frozen_amounts(report)?;
        let mut already_booked: BTreeMap<LineKey, Amounts> = BTreeMap::new();
        for later in frozen.range(closed_month.next()..month).map(|(_, r)| r) {
            for line in later["adjustments"].as_array().into_iter().flatten() {
                if line["belongs_to"].as_str() != Some(closed_month.to_string().as_str()) {
                    continue;
                }
                let key = (
                    line["project"].as_str().map(str::to_owned),
                    line["currency"].as_str().unwrap_or_default().to_owned(),
                );
                let booked = already_booked.entry(key).or_default();
                *booked = booked.combine(&Amounts::from_frozen(line)?, Decimal::ONE);
            }
        }
        let keys: BTreeSet<&LineKey> = now.keys().chain(then.keys()).collect();
        for key in keys {
            let zero = Amounts::default();
            let delta = now
                .get(key)
                .unwrap_or(&zero)
                .combine(then.get(key).unwrap_or(&zero), -Decimal::ONE)
                .combine(already_booked.get(key).unwrap_or(&zero), -Decimal::ONE);
            if !delta.is_zero() {
                lines.push(AdjustmentLine {
                    project: key.0.clone(),
                    belongs_to: closed_month,
                    currency: key.1.clone(),
                    amounts: delta.normalized(),
                });
            }
        }
    }
    Ok(lines)
}

fn totals(
    projects: &[ProjectLine],
    shared: &[SharedLine],
    adjustments: &[AdjustmentLine],
) -> Vec<TotalLine> {
    fn entry<'a>(totals: &'a mut BTreeMap<String, TotalLine>, currency: &str) -> &'a mut TotalLine {
        totals
            .entry(currency.to_owned())
            .or_insert_with(|| TotalLine {
                currency: currency.to_owned(),
                projects: Decimal::ZERO,
                shared: Decimal::ZERO,
                adjustments: Decimal::ZERO,
                total: Decimal::ZERO,
            })
    }
    let mut totals: BTreeMap<String, TotalLine> = BTreeMap::new();
    for line in projects {
        entry(&mut totals, &line.currency).projects += line.figures.total;
    }
    for line in shared {
        entry(&mut totals, &line.currency).shared += line.unused_commitment;
    }
    for line in adjustments {
        entry(&mut totals, &line.currency).adjustments += line.amounts.total;
    }
    totals
        .into_values()
        .map(|mut line| {
            line.total = (line.projects + line.shared + line.adjustments).normalize();
            line.projects = line.projects.normalize();
            line.shared = line.shared.normalize();
            line.adjustments = line.adjustments.normalize();
            line
        })
        .collect()
}

/// Money rounded half-even to the currency's minor unit (2 for USD, 0 for JPY), with every
/// minor digit shown (`84.60`).
pub fn round_money(amount: Decimal, currency: &str) -> Decimal {
    let digits = Currency::parse(currency)
        .map(|c| c.minor_unit_digits())
        .unwrap_or(2);
    let mut rounded = amount.round_dp_with_strategy(digits, RoundingStrategy::MidpointNearestEven);
    rounded.rescale(digits);
    rounded
}

const CSV_HEADER: [&str; 23] = [
    "row_type",
    "month",
    "belongs_to",
    "project",
    "name",
    "team",
    "group",
    "currency",
    "total",
    "productive",
    "idle",
    "unmeasured",
    "failed",
    "unused_commitment",
    "waste",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "unrated_gpu_seconds",
    "tasks_completed",
    "tasks_failed",
    "cost_per_completed_task",
    "budget",
    "burn_pct",
];

/// The report as CSV, from its JSON form (so a frozen report renders the same bytes every
/// time). Money is rounded half-even to the currency's minor unit; totals are rounded from
/// their unrounded sums; text cells are neutralised.
pub fn to_csv(report_json: &str) -> ApiResult<String> {
    let report: Value = serde_json::from_str(report_json).map_err(anyhow::Error::from)?;
    let month = report["month"].as_str().unwrap_or_default();
    let mut writer = csv::Writer::from_writer(Vec::new());
    let write = |writer: &mut csv::Writer<Vec<u8>>, row: Vec<String>| -> ApiResult<()> {
        writer.write_record(&row).map_err(anyhow::Error::from)?;
        Ok(())
    };
    write(
        &mut writer,
        CSV_HEADER.iter().map(|h| h.to_string()).collect(),
    )?;
    for line in report["projects"].as_array().into_iter().flatten() {
        let group_base = [
            "project".to_owned(),
            month.to_owned(),
            String::new(),
            text(&line["project"]),
            text(&line["name"]),
            text(&line["team"]),
            String::new(),
        ];
        write(
            &mut writer,
            figure_row(group_base.to_vec(), line, Some(line)),
        )?;
        for group in line["groups"].as_array().into_iter().flatten() {
            let mut base = group_base.to_vec();
            base[0] = "group".to_owned();
            base[6] = text(&group["key"]);
            base.push(text(&line["currency"]));
            write(&mut writer, figure_row(base, group, None))?;
        }
    }
    for line in report["shared"].as_array().into_iter().flatten() {
        let currency = text(&line["currency"]);
        let unused = money(&line["unused_commitment"], &currency);
        let mut row = vec![
            "shared".to_owned(),
            month.to_owned(),
            String::new(),
            String::new(),
            "shared".to_owned(),
            String::new(),
            String::new(),
            currency.clone(),
            unused.clone(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            unused.clone(),
            unused,
        ];
        row.resize(CSV_HEADER.len(), String::new());
        write(&mut writer, row)?;
    }
    for line in report["adjustments"].as_array().into_iter().flatten() {
        let currency = text(&line["currency"]);
        let mut row = vec![
            "adjustment".to_owned(),
            month.to_owned(),
            text(&line["belongs_to"]),
            text(&line["project"]),
            if line["project"].is_null() {
                "shared".to_owned()
            } else {
                String::new()
            },
            String::new(),
            String::new(),
            currency.clone(),
        ];
        for field in Amounts::FIELDS {
            row.push(money(&line[field], &currency));
        }
        row.resize(CSV_HEADER.len(), String::new());
        write(&mut writer, row)?;
    }
    for line in report["totals"].as_array().into_iter().flatten() {
        let currency = text(&line["currency"]);
        let mut row = vec![
            "total".to_owned(),
            month.to_owned(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            currency.clone(),
            money(&line["total"], &currency),
        ];
        row.resize(CSV_HEADER.len(), String::new());
        write(&mut writer, row)?;
    }
    let bytes = writer.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(String::from_utf8(bytes).map_err(anyhow::Error::from)?)
}

/// The figure columns of a project row (with its budget and burn) or of a group row (whose
/// currency is already in `row`).
fn figure_row(mut row: Vec<String>, figures: &Value, project: Option<&Value>) -> Vec<String> {
    if let Some(project) = project {
        row.push(text(&project["currency"]));
    }
    let currency = row.last().cloned().unwrap_or_default();
    let breakdown = &figures["breakdown"];
    row.push(money(&figures["total"], &currency));
    for part in [
        "productive",
        "idle",
        "unmeasured",
        "failed",
        "unused_commitment",
    ] {
        row.push(money(&breakdown[part], &currency));
    }
    row.push(money(&figures["waste"], &currency));
    for seconds in [
        "gpu_seconds_held",
        "gpu_seconds_busy",
        "unrated_gpu_seconds",
    ] {
        row.push(rounded(&figures[seconds], 3));
    }
    row.push(text(&figures["tasks_completed"]));
    row.push(text(&figures["tasks_failed"]));
    row.push(money(&figures["cost_per_completed_task"], &currency));
    match project {
        Some(project) => {
            row.push(money(&project["budget"], &currency));
            row.push(rounded(&project["burn_pct"], 2));
        }
        None => row.extend([String::new(), String::new()]),
    }
    row
}

fn decimal(value: &Value) -> Option<Decimal> {
    value.as_str().and_then(|text| text.parse().ok())
}

fn money(value: &Value, currency: &str) -> String {
    decimal(value)
        .map(|amount| round_money(amount, currency).to_string())
        .unwrap_or_default()
}

fn rounded(value: &Value, digits: u32) -> String {
    decimal(value)
        .map(|v| {
            v.round_dp_with_strategy(digits, RoundingStrategy::MidpointNearestEven)
                .normalize()
                .to_string()
        })
        .unwrap_or_default()
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text_cell(text).into_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_rounds_half_even_to_the_minor_unit() {
        let d = |s: &str| s.parse::<Decimal>().unwrap();
        assert_eq!(round_money(d("0.125"), "USD"), d("0.12"));
        assert_eq!(round_money(d("0.135"), "USD"), d("0.14"));
        assert_eq!(round_money(d("0.1250001"), "USD"), d("0.13"));
        assert_eq!(round_money(d("2.5"), "JPY"), d("2"));
        assert_eq!(round_money(d("1.0005"), "BHD"), d("1.000"));
        assert_eq!(round_money(d("84.6"), "USD").to_string(), "84.60");
        assert_eq!(round_money(d("-5"), "USD").to_string(), "-5.00");
    }
}
