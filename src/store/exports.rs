//! What the month's exports read: every project's GPU time by contract, and the reserved
//! contracts whose commitment accrues in the month.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::figures::SUM_SCALE;
use crate::domain::what_if::WhatIf;
use crate::store::binder::Binder;
use crate::store::contracts::{ContractRow, contract_row, select_contracts};
use crate::store::prices::{PriceJoin, UNRATED_REASON, summed_priced};
use crate::store::rollups::PRICED_SUMS;
use crate::store::rollups::PeriodSplit;

/// GPU time of one project under one contract in a period: rated (no `unrated_reason`), or
/// unrated for want of a contract or of an FX rate.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ContractUsage {
    pub project_id: String,
    pub project_name: String,
    pub project_currency: String,
    pub gpu_model: String,
    pub billing_mode: String,
    pub contract_id: Option<Uuid>,
    pub unrated_reason: Option<String>,
    pub gpu_seconds_held: Decimal,
    /// Busy time of the segments that measured it.
    pub gpu_seconds_busy: Decimal,
    /// In the project's currency; zero when unrated.
    pub cost: Decimal,
    /// Distinct tasks with GPU time in this group and period.
    pub tasks: i64,
}

/// Every project's GPU time in `[from, to)` (ledger hour boundaries), by project, contract,
/// model, mode and unrated reason: sums from the rollups, task counts from the segments.
pub async fn usage_by_contract(
    conn: &mut PgConnection,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<ContractUsage>> {
    // `ARRAY(SELECT id FROM projects)` is evaluated once, so the tables are read through
    // their project-leading keys rather than scanned whole.
    let every_project = "= ANY(ARRAY(SELECT id FROM projects))";
    let split = PeriodSplit::new(period, tz, true);
    let mut binder = Binder::new();
    let zone = binder.bind(tz.name().to_owned());
    let rows = split.rows_sql(
        &mut binder,
        "cost",
        "project_id, {month} AS month, gpu_model, billing_mode, contract_id, segments, \
         gpu_seconds_held, gpu_seconds_busy, card_seconds, metered_card_seconds, energy_joules",
        ("", "", ""),
        every_project,
        &zone,
    );
    let (from, to) = (binder.bind(period.0), binder.bind(period.1));
    let price = PriceJoin::new(&mut binder, &WhatIf::default(), "g");
    // A contract has one currency and the period one month, so its rows are rated or unrated
    // together, and its tasks are counted by contract.
    let sql = format!(
        "WITH usage AS ( \
             SELECT project_id, gpu_model, billing_mode, contract_id, unrated_reason, \
                    round(sum(gpu_seconds_held), {SUM_SCALE}) AS gpu_seconds_held, \
                    round(sum(gpu_seconds_busy), {SUM_SCALE}) AS gpu_seconds_busy, {cost} \
             FROM ( \
               SELECT project_id, gpu_model, billing_mode, contract_id, \
                      {UNRATED_REASON} AS unrated_reason, gpu_seconds_held, gpu_seconds_busy, \
                      card_seconds, metered_card_seconds, energy_joules, price, power_price, \
                      energy_price, energy_priced \
               FROM (SELECT g.*, {columns} FROM ( \
                 SELECT project_id, month, gpu_model, billing_mode, contract_id, \
                        sum(segments) AS segments, sum(gpu_seconds_held) AS gpu_seconds_held, \
                        sum(gpu_seconds_busy) AS gpu_seconds_busy, \
                        sum(card_seconds) AS card_seconds, \
                        sum(metered_card_seconds) AS metered_card_seconds, \
                        sum(energy_joules) AS energy_joules \
                 FROM ({rows}) AS rows \
                 GROUP BY 1, 2, 3, 4, 5 HAVING sum(segments) > 0) AS g \
               {joins}) AS with_prices) AS priced \
             GROUP BY 1, 2, 3, 4, 5 \
         ), tasks AS ( \
             SELECT project_id, gpu_model, billing_mode, contract_id, \
                    count(DISTINCT task_id) AS tasks \
             FROM rated_segments \
             WHERE project_id {every_project} AND hour >= {from} AND hour < {to} \
             GROUP BY 1, 2, 3, 4 \
         ) \
         SELECT u.project_id, p.name AS project_name, p.currency::text AS project_currency, \
                u.gpu_model, u.billing_mode, u.contract_id, u.unrated_reason, \
                u.gpu_seconds_held, u.gpu_seconds_busy, u.cost, coalesce(t.tasks, 0) AS tasks \
         FROM usage u \
         JOIN projects p ON p.id = u.project_id \
         LEFT JOIN tasks t ON t.project_id = u.project_id AND t.gpu_model = u.gpu_model \
              AND t.billing_mode = u.billing_mode \
              AND t.contract_id IS NOT DISTINCT FROM u.contract_id \
         ORDER BY u.project_id, u.contract_id, u.unrated_reason, u.gpu_model, u.billing_mode",
        cost = summed_priced(&PRICED_SUMS[0]),
        columns = price.columns(),
        joins = price.joins(),
    );
    // Dynamic: the rollup levels are the period's, and the prices joined through the binder.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// A reserved contract that commits GPUs, with the project it is scoped to, if any.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Commitment {
    #[sqlx(flatten)]
    pub contract: ContractRow,
    pub project_name: Option<String>,
    pub project_currency: Option<String>,
}

/// Reserved contracts, scoped or not, that commit GPUs over some of `[from, to)`.
pub async fn commitments(
    conn: &mut PgConnection,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> sqlx::Result<Vec<Commitment>> {
    select_contracts!(
        "SELECT ",
        "c.valid_until",
        ", p.name AS \"project_name?\", p.currency::text AS project_currency \
         FROM contracts c LEFT JOIN projects p ON p.id = c.project_id",
        " WHERE c.billing_mode = 'reserved' AND c.committed_gpus IS NOT NULL \
           AND c.valid_from < $2 AND (c.valid_until IS NULL OR c.valid_until > $1) \
         ORDER BY c.project_id NULLS LAST, c.name, c.id",
        from,
        to,
    )
    .try_map(|r| {
        Ok(Commitment {
            project_name: r.project_name,
            project_currency: r.project_currency,
            contract: contract_row!(r),
        })
    })
    .fetch_all(conn)
    .await
}
