//! What a project's GPU time cost over a period (COST_MODEL.md §2–4), read from the rated
//! rollups, with the unused commitment of its own reserved contracts; and, next to it, how
//! long its attempts waited to start (§7), read from the job records.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::figures::{FigureSums, Figures, Grouping, QueueWait, RecordCounts, SUM_SCALE};
use crate::domain::ledger_time::{LedgerHour, SECONDS_PER_HOUR, month_bounds};
use crate::domain::rating::FxRates;
use crate::domain::what_if::{PriceOverride, WhatIf};
use crate::ledger::LedgerResult;
use crate::ledger::capacity::{self, CapacityWindow};
use crate::ledger::commitments::{Commitments, ToNet};
use crate::store;
use crate::store::cost::Scope;

/// The money figures of one group of a period.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GroupView {
    /// The day, month, model, mode, `model/mode`, outcome or label value; null for what has
    /// none (records without the label, or unused commitment when grouping by outcome or
    /// label).
    pub key: Option<String>,
    #[serde(flatten)]
    pub figures: Figures,
}

/// One group of a project's cost: its money figures, and the queue wait of the attempts that
/// started in it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CostGroupView {
    /// The day, month, model, mode, `model/mode`, outcome or label value; null for what has
    /// none (records without the label, or unused commitment when grouping by outcome or
    /// label).
    pub key: Option<String>,
    #[serde(flatten)]
    pub figures: Figures,
    /// Queue wait of the group's attempts that started in the period; null when none
    /// reported `queued_at`.
    pub queue_wait: Option<QueueWait>,
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
    /// Queue wait of the attempts that started in the period, next to their cost and never
    /// part of it; null when none reported `queued_at`.
    pub queue_wait: Option<QueueWait>,
    /// Present with `group_by`: the groups in key order; their money figures add up exactly
    /// to the figures above, and so do their queue wait's `attempts` and `total_seconds`.
    pub groups: Vec<CostGroupView>,
    /// Present and true when asked with `what_if` prices: the figures are what the period
    /// would have cost at them, and nothing was stored.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hypothetical: bool,
    /// The prices the figures were read with in place of those in force.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<PriceOverride>,
}

/// The money figures of a period: the whole, and its groups in key order with a grouping.
#[derive(Debug)]
pub struct PeriodFigures {
    pub figures: Figures,
    pub groups: Vec<GroupView>,
}

/// What to compute: a period on ledger hour boundaries, how to group it, and the instant up
/// to which unused commitment accrues.
#[derive(Debug, Clone)]
pub struct CostQuery {
    pub period: (DateTime<Utc>, DateTime<Utc>),
    pub grouping: Grouping,
    pub as_of: DateTime<Utc>,
    /// Prices to answer with in place of those in force; empty for the real figures.
    pub what_if: WhatIf,
}

/// The project a cost is computed for.
#[derive(Debug, Clone, Copy)]
pub struct CostOf<'a> {
    pub project: &'a str,
    pub currency: &'a str,
}

/// A project's cost over a period, from its rated data, with the queue wait of the
/// attempts that started in it.
///
/// Every figure covers the segments in `[from, to)`: a record spanning the period's edge
/// counts with the part inside it. Figures counted per record (tasks, retries, failures,
/// output) belong to the period holding the record's `ended_at`; queue wait belongs to the
/// period holding its `started_at`. Unused commitment of reserved contracts scoped to the
/// project accrues hour by hour up to `as_of`.
pub async fn project_cost(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    query: &CostQuery,
    tz: Tz,
) -> LedgerResult<CostView> {
    let mut groups = group_sums(conn, of, query, tz).await?;
    let mut waits = BTreeMap::new();
    let mut whole_wait = None;
    for row in store::cost::queue_waits(conn, of.project, query.period, &query.grouping, tz).await?
    {
        let whole = row.whole;
        let (key, wait) = row.into_parts();
        if whole {
            whole_wait = Some(normalized(wait));
        } else {
            waits.insert(key, normalized(wait));
        }
    }
    // A group with queue wait always has rated time or records too (an attempt's first hour
    // lies in the group holding its start); should it have none, it still shows, at zero cost.
    for key in waits.keys() {
        groups.entry(key.clone()).or_default();
    }
    let whole = merged(&groups);
    let groups = match query.grouping {
        Grouping::Whole => Vec::new(),
        _ => groups
            .into_iter()
            .map(|(key, group)| CostGroupView {
                queue_wait: waits.remove(&key),
                key,
                figures: group.figures(),
            })
            .collect(),
    };
    Ok(CostView {
        project: of.project.to_owned(),
        currency: of.currency.to_owned(),
        from: query.period.0,
        to: query.period.1,
        as_of: query.as_of,
        figures: whole.figures(),
        queue_wait: whole_wait,
        groups,
        hypothetical: !query.what_if.is_empty(),
        overrides: query.what_if.overrides(),
    })
}

/// The money figures of a project over a period, as [`project_cost`] has them.
async fn period_figures(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    query: &CostQuery,
    tz: Tz,
) -> LedgerResult<PeriodFigures> {
    let groups = group_sums(conn, of, query, tz).await?;
    let whole = merged(&groups);
    let groups = match query.grouping {
        Grouping::Whole => Vec::new(),
        _ => groups
            .into_iter()
            .map(|(key, group)| GroupView {
                key,
                figures: group.figures(),
            })
            .collect(),
    };
    Ok(PeriodFigures {
        figures: whole.figures(),
        groups,
    })
}

/// The sums of each group of the period (one group, keyed null, without a grouping).
async fn group_sums(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    query: &CostQuery,
    tz: Tz,
) -> LedgerResult<BTreeMap<Option<String>, FigureSums>> {
    let scope = Scope::Project(of.project, &query.grouping);
    let mut groups = rollup_sums(conn, scope, query.period, tz, &query.what_if).await?;
    let currencies = BTreeMap::from([(of.project.to_owned(), of.currency.to_owned())]);
    let group_of = |_: &str, hour, gpu_model: &str| hour_key(&query.grouping, hour, gpu_model, tz);
    let commitments = Commitments::of_project(
        conn,
        of.project,
        accrual_window(query.period, query.as_of),
        tz,
        &query.what_if,
    )
    .await?;
    add_unused_commitment(conn, &commitments, &currencies, tz, group_of, &mut groups).await?;
    let capacity = CapacityWindow::charging(
        conn,
        of.project,
        // Capacity accrues up to `as_of`, as commitment does.
        accrual_window(query.period, query.as_of),
        tz,
        &query.what_if,
    )
    .await?;
    capacity.add_charges(
        &currencies,
        |_, charge| capacity::charge_key(&query.grouping, charge),
        &mut groups,
    );
    Ok(groups)
}

/// The sums the rollups hold for each group of the scope over the period.
async fn rollup_sums(
    conn: &mut sqlx::PgConnection,
    scope: Scope<'_>,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    what_if: &WhatIf,
) -> LedgerResult<BTreeMap<Option<String>, FigureSums>> {
    let mut groups = priced_sums(conn, scope, period, tz, what_if).await?;
    record_counts(conn, scope, period, tz)
        .await?
        .add_to(&mut groups);
    Ok(groups)
}

/// The sums of a period that prices apply to: segments and utilisation.
async fn priced_sums(
    conn: &mut sqlx::PgConnection,
    scope: Scope<'_>,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    what_if: &WhatIf,
) -> LedgerResult<BTreeMap<Option<String>, FigureSums>> {
    let mut groups: BTreeMap<Option<String>, FigureSums> = BTreeMap::new();
    for row in store::cost::cost_sums(conn, scope, period, tz, what_if).await? {
        let (key, sums) = row.into_parts();
        groups.entry(key).or_default().add_segments(&sums);
    }
    for row in store::cost::util_sums(conn, scope, period, tz, what_if).await? {
        let (key, sums) = row.into_parts();
        groups.entry(key).or_default().add_util(&sums);
    }
    for row in store::cost::energy_sums(conn, scope, period, tz).await? {
        let (key, sums) = row.into_parts();
        groups.entry(key).or_default().add_energy(&sums);
    }
    for row in store::cost::mfu_sums(conn, scope, period, tz).await? {
        let (key, sums) = row.into_parts();
        groups.entry(key).or_default().add_mfu(&sums);
    }
    Ok(groups)
}

/// The record counts of a period, by group.
async fn record_counts(
    conn: &mut sqlx::PgConnection,
    scope: Scope<'_>,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> LedgerResult<RecordCountsOf> {
    Ok(RecordCountsOf(
        store::cost::record_sums(conn, scope, period, tz)
            .await?
            .into_iter()
            .map(|row| row.into_parts())
            .collect(),
    ))
}

/// Record counts by group, read apart from the priced sums they are added to.
struct RecordCountsOf(Vec<(Option<String>, RecordCounts)>);

impl RecordCountsOf {
    fn add_to(self, groups: &mut BTreeMap<Option<String>, FigureSums>) {
        for (key, counts) in self.0 {
            groups.entry(key).or_default().add_records(&counts);
        }
    }
}

fn merged(groups: &BTreeMap<Option<String>, FigureSums>) -> FigureSums {
    let mut whole = FigureSums::default();
    for group in groups.values() {
        whole.merge(group);
    }
    whole
}

fn normalized(wait: QueueWait) -> QueueWait {
    QueueWait {
        p50_seconds: wait.p50_seconds.normalize(),
        p95_seconds: wait.p95_seconds.normalize(),
        total_seconds: wait.total_seconds.normalize(),
        ..wait
    }
}

/// A project's money figures over a whole ledger month, with unused commitment accrued up to
/// `as_of`.
pub async fn month_cost(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    month: NaiveDate,
    grouping: Grouping,
    as_of: DateTime<Utc>,
    tz: Tz,
    what_if: &WhatIf,
) -> LedgerResult<PeriodFigures> {
    let query = CostQuery {
        period: month_bounds(month, tz),
        grouping,
        as_of,
        what_if: what_if.clone(),
    };
    period_figures(conn, of, &query, tz).await
}

/// Every project's sums over a whole ledger month, by project, before unused commitment is
/// added ([`figures_of_projects`]): read for all of them in a fixed number of statements.
/// `projects` are the ids of every project there is.
pub async fn month_sums_of_projects(
    conn: &mut sqlx::PgConnection,
    projects: &[String],
    month: NaiveDate,
    tz: Tz,
    what_if: &WhatIf,
) -> LedgerResult<ProjectSums> {
    let groups = rollup_sums(
        conn,
        Scope::EveryProject(projects),
        month_bounds(month, tz),
        tz,
        what_if,
    )
    .await?;
    Ok(ProjectSums(groups))
}

/// Every project's sums of a period, keyed by project, as [`month_sums_of_projects`] reads
/// them.
pub struct ProjectSums(BTreeMap<Option<String>, FigureSums>);

/// Every project's money figures over a whole ledger month: for each of `projects` (every
/// project there is), in their order, what [`month_cost`] gives it without a grouping, from
/// its `sums` and the unused commitment of `commitments` (every contract's, accrued up to
/// `as_of`, as [`month_commitments`] reads them).
pub async fn figures_of_projects(
    conn: &mut sqlx::PgConnection,
    projects: &[CostOf<'_>],
    ProjectSums(mut groups): ProjectSums,
    commitments: &Commitments,
    capacity: &CapacityWindow,
    tz: Tz,
) -> LedgerResult<Vec<Figures>> {
    let currencies: BTreeMap<String, String> = projects
        .iter()
        .map(|of| (of.project.to_owned(), of.currency.to_owned()))
        .collect();
    let group_of = |project: &str, _, _: &str| Some(project.to_owned());
    add_unused_commitment(conn, commitments, &currencies, tz, group_of, &mut groups).await?;
    capacity.add_charges(
        &currencies,
        |project, _| Some(project.to_owned()),
        &mut groups,
    );
    Ok(projects
        .iter()
        .map(|of| {
            groups
                .remove(&Some(of.project.to_owned()))
                .unwrap_or_default()
                .figures()
        })
        .collect())
}

/// [`month_commitments`] up to netting their usage ([`ToNet::net`]).
pub async fn month_commitments_to_net(
    conn: &mut sqlx::PgConnection,
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
    what_if: &WhatIf,
) -> LedgerResult<ToNet> {
    Commitments::to_net(
        conn,
        accrual_window(month_bounds(month, tz), as_of),
        tz,
        what_if,
    )
    .await
}

/// Every reserved contract's commitment over a ledger month, accrued up to `as_of`.
pub async fn month_commitments(
    conn: &mut sqlx::PgConnection,
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
    what_if: &WhatIf,
) -> LedgerResult<Commitments> {
    month_commitments_to_net(&mut *conn, month, as_of, tz, what_if)
        .await?
        .net(conn)
        .await
}

/// The part of a month whose cost counts as spend up to `as_of` (COST_MODEL §5): its ledger
/// hours up to the one holding `as_of`; `None` before the month began.
pub fn spend_period(
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (start, end) = month_bounds(month, tz);
    if as_of <= start {
        return None;
    }
    let until = if as_of >= end {
        end
    } else {
        LedgerHour::holding(as_of, tz).end
    };
    Some((start, until))
}

/// A project's spend in a month up to `as_of` (COST_MODEL §5): the cost of the month's ledger
/// hours up to the one holding `as_of`, and unused commitment accrued until `as_of`.
pub async fn month_spend(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> LedgerResult<Decimal> {
    let Some(period) = spend_period(month, as_of, tz) else {
        return Ok(Decimal::ZERO);
    };
    let query = CostQuery {
        period,
        grouping: Grouping::Whole,
        as_of,
        what_if: WhatIf::default(),
    };
    Ok(period_figures(conn, of, &query, tz).await?.figures.total)
}

/// A route's spend in a month up to `as_of`: the cost of the month's ledger hours up to the
/// one holding `as_of` of the project's records carrying the label `key` = `value`. Unused
/// commitment and idle capacity are the project's, never a route's.
pub async fn route_month_spend(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    (key, value): (&str, &str),
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> LedgerResult<Decimal> {
    let Some(period) = spend_period(month, as_of, tz) else {
        return Ok(Decimal::ZERO);
    };
    let query = CostQuery {
        period,
        grouping: Grouping::Label(key.to_owned()),
        as_of,
        what_if: WhatIf::default(),
    };
    Ok(period_figures(conn, of, &query, tz)
        .await?
        .groups
        .into_iter()
        .find(|group| group.key.as_deref() == Some(value))
        .map(|group| group.figures.total)
        .unwrap_or_default())
}

/// The spend of a month as it grew: for every ledger day from the month's first to the one
/// holding `as_of`, the spend up to that day's end (or `as_of`). Its last entry is
/// [`month_spend`], exactly: each day's cost is added unrounded to the days before it.
pub async fn month_spend_by_day(
    conn: &mut sqlx::PgConnection,
    of: CostOf<'_>,
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> LedgerResult<Vec<(NaiveDate, Decimal)>> {
    let Some(period) = spend_period(month, as_of, tz) else {
        return Ok(Vec::new());
    };
    let query = CostQuery {
        period,
        grouping: Grouping::Day,
        as_of,
        what_if: WhatIf::default(),
    };
    let days = group_sums(conn, of, &query, tz).await?;
    let last = LedgerHour::holding(period.1 - chrono::Duration::seconds(1), tz)
        .start
        .with_timezone(&tz)
        .date_naive();
    let mut spend = Decimal::ZERO;
    let mut series = Vec::new();
    for day in month.iter_days().take_while(|day| *day <= last) {
        if let Some(sums) = days.get(&Some(day.format("%Y-%m-%d").to_string())) {
            spend += sums.total();
        }
        series.push((day, spend.normalize()));
    }
    Ok(series)
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
        Grouping::GpuModelAndBillingMode => Some(format!("{gpu_model}/reserved")),
    }
}

/// The part of `period` up to `as_of`: where unused commitment accrues.
fn accrual_window(
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    as_of: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    (from, to.min(as_of))
}

/// Unused commitment of the project-scoped contracts among `commitments` whose project
/// `currencies` keeps (in the currency it gives), added to the group
/// `group_of(project, hour, gpu_model)` names.
async fn add_unused_commitment(
    conn: &mut sqlx::PgConnection,
    commitments: &Commitments,
    currencies: &BTreeMap<String, String>,
    tz: Tz,
    group_of: impl Fn(&str, DateTime<Utc>, &str) -> Option<String>,
    groups: &mut BTreeMap<Option<String>, FigureSums>,
) -> LedgerResult<()> {
    if commitments.accrued.is_empty() {
        return Ok(());
    }
    let (from, until) = commitments.window;
    let mut to_currencies: Vec<String> = currencies.values().cloned().collect();
    to_currencies.sort_unstable();
    to_currencies.dedup();
    let fx = store::fx_rates::table(
        conn,
        LedgerHour::holding(from, tz).month,
        LedgerHour::holding(until, tz).month,
        &to_currencies,
    )
    .await?;
    for accrued in &commitments.accrued {
        let Some((project, currency)) = accrued
            .row
            .project_id
            .as_ref()
            .and_then(|project| currencies.get_key_value(project))
        else {
            continue;
        };
        let contract = &accrued.contract;
        for charge in &accrued.unused_days {
            let group = groups
                .entry(group_of(project, charge.hour, &contract.gpu_model))
                .or_default();
            match fx.conversion(charge.month, &contract.currency, currency) {
                Some(rate) => {
                    group.add_unused_commitment((charge.cost * rate).round_dp(SUM_SCALE));
                }
                None => group.add_unrated(
                    "no_fx_rate",
                    &contract.gpu_model,
                    (charge.unused_gpu_hours * SECONDS_PER_HOUR).round_dp(SUM_SCALE),
                ),
            }
        }
    }
    Ok(())
}
