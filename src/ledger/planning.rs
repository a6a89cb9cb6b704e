//! Commitment planning (COST_MODEL.md §12): how many GPUs of a model to reserve, read from
//! the ledger's own hourly use, with the reservations already held judged against break-even
//! and what the on-demand work would have cost on spot.
//!
//! Everything is read in one snapshot. Prices are per GPU-hour in one currency, the plan's:
//! given ones are taken in it, contract prices are converted into it at the FX rate of the
//! month of the window's last hour (a reservation's unused commitment at each day's month).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::commitment::LedgerWindow;
use crate::domain::ledger_time::SECONDS_PER_HOUR;
use crate::domain::rating::{BillingMode, FxRates};
use crate::domain::reservation_plan::{PlanQuery, commitment_cost, reservation_curve};
use crate::domain::values::round_money;
use crate::domain::what_if::WhatIf;
use crate::ledger::commitments::Commitments;
use crate::ledger::{LedgerError, LedgerResult};
use crate::store;
use crate::store::contracts::ContractRow;
use crate::store::fx_rates::RateTable;
use crate::store::planning::UseFilter;

/// A price the plan used: given, or a contract's (converted into the plan's currency).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PlanPrice {
    /// Per GPU-hour, in the plan's currency.
    #[schema(value_type = String)]
    pub price_per_gpu_hour: Decimal,
    /// The contract it comes from; null when it was given.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub contract: Option<Uuid>,
    pub contract_name: Option<String>,
    /// The contract's own price and currency, when converted.
    #[schema(value_type = Option<String>)]
    pub contract_price: Option<Decimal>,
    pub contract_currency: Option<String>,
}

/// The reserved and on-demand prices the curve uses.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PlanPrices {
    pub reserved: PlanPrice,
    pub on_demand: PlanPrice,
}

/// The cost of committing `gpus` GPUs over the window.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CurvePointView {
    pub gpus: u32,
    #[schema(value_type = String)]
    pub cost: Decimal,
}

/// The GPU-hours used in one ledger hour by the records a reservation could cover.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HourlyUse {
    pub hour: DateTime<Utc>,
    #[schema(value_type = String)]
    pub gpu_hours: Decimal,
}

/// A reservation held over the window, against break-even.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReservedContractView {
    #[schema(value_type = String, format = Uuid)]
    pub contract: Uuid,
    pub name: String,
    pub project: Option<String>,
    #[schema(value_type = String)]
    pub committed_gpus: Decimal,
    /// Committed GPU-hours within the window.
    #[schema(value_type = String)]
    pub committed_gpu_hours: Decimal,
    #[schema(value_type = String)]
    pub used_gpu_hours: Decimal,
    /// `used ÷ committed` GPU-hours over the window.
    #[schema(value_type = String)]
    pub utilisation: Decimal,
    /// Its price ÷ the on-demand price: below it, the reservation cost more than on-demand
    /// would have for the hours it was used.
    #[schema(value_type = String)]
    pub break_even_utilisation: Decimal,
    pub over_reserved: bool,
    /// Its unused commitment over the window, in the plan's currency.
    #[schema(value_type = String)]
    pub wasted: Decimal,
    /// Its price per GPU-hour, in the plan's currency.
    #[schema(value_type = String)]
    pub price_per_gpu_hour: Decimal,
}

/// What was preempted on spot for the model in the window: observed, not promised.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ObservedSpot {
    /// Attempts on spot with GPU time in the window.
    pub attempts: i64,
    pub preempted_attempts: i64,
    /// `preempted_attempts ÷ attempts`; null without attempts.
    #[schema(value_type = Option<String>)]
    pub preemption_rate: Option<Decimal>,
    #[schema(value_type = String)]
    pub spot_gpu_hours: Decimal,
    /// GPU-hours of preempted attempts on spot: paid for, and run again.
    #[schema(value_type = String)]
    pub preempted_gpu_hours: Decimal,
}

/// The on-demand work of the window at the spot price.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SpotComparison {
    pub price: PlanPrice,
    /// GPU-hours run on-demand in the window.
    #[schema(value_type = String)]
    pub on_demand_gpu_hours: Decimal,
    #[schema(value_type = String)]
    pub cost_on_demand: Decimal,
    #[schema(value_type = String)]
    pub cost_at_spot: Decimal,
    #[schema(value_type = String)]
    pub saving: Decimal,
    pub observed: ObservedSpot,
}

/// `GET /v1/planning/reservations`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReservationPlanView {
    pub gpu_model: String,
    pub pool: Option<String>,
    pub provider: Option<String>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The window's ledger hours, `H`.
    pub hours: usize,
    pub currency: String,
    pub prices: PlanPrices,
    /// Reserved ÷ on-demand price.
    #[schema(value_type = String)]
    pub break_even_utilisation: Decimal,
    /// GPU-hours used over the window by on-demand and reserved records.
    #[schema(value_type = String)]
    pub used_gpu_hours: Decimal,
    /// GPU-hours used in the busiest hour.
    #[schema(value_type = String)]
    pub peak_gpus: Decimal,
    /// The cheapest commitment (the fewest GPUs where several cost the same).
    pub recommended_gpus: u32,
    #[schema(value_type = String)]
    pub cost_at_recommended: Decimal,
    #[schema(value_type = String)]
    pub utilisation_at_recommended: Decimal,
    /// Hours whose use went beyond the recommendation (paid on-demand).
    pub hours_above_recommended: usize,
    /// GPUs committed by the reservations of the model in force in the window's last hour.
    #[schema(value_type = String)]
    pub committed_gpus_today: Decimal,
    /// What the window would have cost committing `committed_gpus_today`, at these prices.
    #[schema(value_type = String)]
    pub cost_today: Decimal,
    /// `cost_today − cost_at_recommended`.
    #[schema(value_type = String)]
    pub saving: Decimal,
    pub curve: Vec<CurvePointView>,
    pub hourly: Vec<HourlyUse>,
    /// Reservations of the model over the window, least used first.
    pub contracts: Vec<ReservedContractView>,
    /// Absent when no spot price is in force or given.
    pub spot: Option<SpotComparison>,
}

/// The plan for `query`, read in one snapshot.
pub async fn reservations(
    pool: &PgPool,
    query: &PlanQuery,
    tz: Tz,
) -> LedgerResult<ReservationPlanView> {
    let mut tx = store::snapshot(pool).await?;
    store::planning::plan_for_each_call(&mut tx).await?;
    let plan = plan(&mut tx, query, tz).await;
    tx.commit().await?;
    plan
}

async fn plan(
    conn: &mut PgConnection,
    query: &PlanQuery,
    tz: Tz,
) -> LedgerResult<ReservationPlanView> {
    let (from, to) = query.window;
    let window = LedgerWindow::new(from, to, tz);
    let Some(last_hour) = window.hours.last().copied() else {
        return Err(LedgerError::invalid("query:to", "must be after from"));
    };
    let nodes = match &query.pool {
        Some(pool) => {
            if store::capacity::get_pool(conn, pool).await?.is_none() {
                return Err(LedgerError::invalid(
                    "query:pool",
                    format!("there is no pool `{pool}`"),
                ));
            }
            Some(store::planning::pool_nodes(conn, pool, from, to).await?)
        }
        None => None,
    };
    let filter = UseFilter {
        gpu_model: &query.gpu_model,
        provider: query.provider.as_deref(),
        nodes: nodes.as_deref(),
    };
    let model = query.gpu_model.clone();
    let kinds = [
        BillingMode::Reserved,
        BillingMode::OnDemand,
        BillingMode::Spot,
    ];
    let contracts = store::contracts::for_kinds(
        conn,
        &kinds.map(|_| model.clone()),
        &kinds.map(|mode| mode.as_str().to_owned()),
    )
    .await?;
    let in_force = |mode: BillingMode| {
        pick_contract(&contracts, mode, last_hour.start, query.provider.as_deref())
    };
    let (reserved_contract, on_demand_contract, spot_contract) = (
        in_force(BillingMode::Reserved),
        in_force(BillingMode::OnDemand),
        in_force(BillingMode::Spot),
    );
    let currency = query
        .currency
        .clone()
        .or_else(|| reserved_contract.map(|c| c.currency.clone()))
        .or_else(|| on_demand_contract.map(|c| c.currency.clone()))
        .unwrap_or_else(|| "USD".to_owned());
    let months = (
        window.hours.first().map_or(last_hour.month, |h| h.month),
        last_hour.month,
    );
    let fx =
        store::fx_rates::table(conn, months.0, months.1, std::slice::from_ref(&currency)).await?;
    let converter = Converter {
        fx: &fx,
        currency: &currency,
        month: last_hour.month,
    };
    let price = |given: Option<Decimal>,
                 contract: Option<&ContractRow>,
                 field: &str,
                 mode: BillingMode|
     -> LedgerResult<Option<PlanPrice>> {
        match (given, contract) {
            (Some(price), _) => Ok(Some(PlanPrice {
                price_per_gpu_hour: price,
                contract: None,
                contract_name: None,
                contract_price: None,
                contract_currency: None,
            })),
            (None, Some(contract)) => Ok(Some(PlanPrice {
                price_per_gpu_hour: converter
                    .convert(contract.price_per_gpu_hour, &contract.currency)?,
                contract: Some(contract.id),
                contract_name: Some(contract.name.clone()),
                contract_price: (contract.currency != currency)
                    .then_some(contract.price_per_gpu_hour),
                contract_currency: (contract.currency != currency)
                    .then(|| contract.currency.clone()),
            })),
            (None, None) if mode == BillingMode::Spot => Ok(None),
            (None, None) => Err(LedgerError::invalid(
                format!("query:{field}"),
                format!(
                    "no {} contract for {model} is in force at {}: give the price",
                    mode.as_str(),
                    last_hour
                        .start
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            )),
        }
    };
    let reserved = price(
        query.reserved_price,
        reserved_contract,
        "reserved_price",
        BillingMode::Reserved,
    )?
    .expect("a reserved price or an error");
    let on_demand = price(
        query.on_demand_price,
        on_demand_contract,
        "on_demand_price",
        BillingMode::OnDemand,
    )?
    .expect("an on-demand price or an error");
    let spot_price = price(
        query.spot_price,
        spot_contract,
        "spot_price",
        BillingMode::Spot,
    )?;

    let used = store::planning::model_use(conn, filter, from, to).await?;
    let rows = &used.hours;
    let mut covered: HashMap<DateTime<Utc>, Decimal> = HashMap::new();
    let mut seconds: BTreeMap<(String, bool), Decimal> = BTreeMap::new();
    for row in rows {
        if row.billing_mode != BillingMode::Spot.as_str() {
            *covered.entry(row.hour).or_default() += row.card_seconds;
        }
        *seconds
            .entry((row.billing_mode.clone(), row.preempted))
            .or_default() += row.card_seconds;
    }
    let hourly: Vec<HourlyUse> = window
        .hours
        .iter()
        .map(|hour| HourlyUse {
            hour: hour.start,
            gpu_hours: covered
                .get(&hour.start)
                .map_or(Decimal::ZERO, |s| (*s / SECONDS_PER_HOUR).normalize()),
        })
        .collect();
    let use_by_hour: Vec<Decimal> = hourly.iter().map(|h| h.gpu_hours).collect();
    let curve = reservation_curve(
        &use_by_hour,
        reserved.price_per_gpu_hour,
        on_demand.price_per_gpu_hour,
    );

    let commitments = Commitments::all(conn, (from, to), tz, &WhatIf::default()).await?;
    let mut held = Vec::new();
    let mut committed_today = Decimal::ZERO;
    for accrued in commitments.accrued {
        let row = &accrued.row;
        if row.gpu_model != model || !provider_admits(row, query.provider.as_deref()) {
            continue;
        }
        let committed = row.committed_gpus.unwrap_or_default();
        if accrued.contract.is_valid_at(last_hour.start) {
            committed_today += committed;
        }
        let mut wasted = Decimal::ZERO;
        for day in &accrued.unused_days {
            wasted += Converter {
                month: day.month,
                ..converter
            }
            .convert(day.cost, &row.currency)?;
        }
        let price = converter.convert(row.price_per_gpu_hour, &row.currency)?;
        let used = accrued.committed_gpu_hours - accrued.unused_gpu_hours;
        let utilisation = if accrued.committed_gpu_hours.is_zero() {
            Decimal::ZERO
        } else {
            used / accrued.committed_gpu_hours
        };
        let break_even = price / on_demand.price_per_gpu_hour;
        held.push(ReservedContractView {
            contract: row.id,
            name: row.name.clone(),
            project: row.project_id.clone(),
            committed_gpus: committed.normalize(),
            committed_gpu_hours: accrued.committed_gpu_hours.normalize(),
            used_gpu_hours: used.normalize(),
            utilisation: utilisation.normalize(),
            break_even_utilisation: break_even.normalize(),
            over_reserved: utilisation < break_even,
            wasted: wasted.normalize(),
            price_per_gpu_hour: price.normalize(),
        });
    }
    held.sort_by(|a, b| a.utilisation.cmp(&b.utilisation).then(a.name.cmp(&b.name)));
    let cost_today = commitment_cost(
        &use_by_hour,
        committed_today,
        reserved.price_per_gpu_hour,
        on_demand.price_per_gpu_hour,
    );

    let spot = match spot_price {
        Some(spot_price) => {
            let (attempts, preempted_attempts) = (used.spot_attempts, used.spot_preempted);
            let hours_of = |mode: BillingMode, preempted: Option<bool>| -> Decimal {
                seconds
                    .iter()
                    .filter(|((m, p), _)| m == mode.as_str() && preempted.is_none_or(|x| x == *p))
                    .map(|(_, s)| *s)
                    .sum::<Decimal>()
                    / SECONDS_PER_HOUR
            };
            let on_demand_hours = hours_of(BillingMode::OnDemand, None);
            let cost_on_demand = on_demand_hours * on_demand.price_per_gpu_hour;
            let cost_at_spot = on_demand_hours * spot_price.price_per_gpu_hour;
            Some(SpotComparison {
                on_demand_gpu_hours: on_demand_hours.normalize(),
                cost_on_demand: cost_on_demand.normalize(),
                cost_at_spot: cost_at_spot.normalize(),
                saving: (cost_on_demand - cost_at_spot).normalize(),
                price: spot_price,
                observed: ObservedSpot {
                    attempts,
                    preempted_attempts,
                    preemption_rate: (attempts > 0).then(|| {
                        (Decimal::from(preempted_attempts) / Decimal::from(attempts)).normalize()
                    }),
                    spot_gpu_hours: hours_of(BillingMode::Spot, None).normalize(),
                    preempted_gpu_hours: hours_of(BillingMode::Spot, Some(true)).normalize(),
                },
            })
        }
        None => None,
    };

    Ok(ReservationPlanView {
        gpu_model: model,
        pool: query.pool.clone(),
        provider: query.provider.clone(),
        from,
        to,
        hours: curve.hours,
        currency,
        break_even_utilisation: curve.break_even_utilisation.normalize(),
        used_gpu_hours: curve.used_gpu_hours.normalize(),
        peak_gpus: curve.peak.normalize(),
        recommended_gpus: curve.recommended_gpus,
        cost_at_recommended: curve.cost_at_recommended.normalize(),
        utilisation_at_recommended: curve.utilisation_at_recommended.normalize(),
        hours_above_recommended: curve.hours_above_recommended,
        committed_gpus_today: committed_today.normalize(),
        saving: (cost_today - curve.cost_at_recommended).normalize(),
        cost_today: cost_today.normalize(),
        curve: curve
            .curve
            .into_iter()
            .map(|p| CurvePointView {
                gpus: p.gpus,
                cost: p.cost.normalize(),
            })
            .collect(),
        hourly,
        contracts: held,
        spot,
        prices: PlanPrices {
            reserved,
            on_demand,
        },
    })
}

/// Converts contract money into the plan's currency at one month's rate.
#[derive(Clone, Copy)]
struct Converter<'a> {
    fx: &'a RateTable,
    currency: &'a str,
    month: chrono::NaiveDate,
}

impl Converter<'_> {
    fn convert(&self, amount: Decimal, from: &str) -> LedgerResult<Decimal> {
        let rate = self
            .fx
            .conversion(self.month, from, self.currency)
            .ok_or_else(|| {
                LedgerError::invalid(
                    "query:currency",
                    format!(
                        "no FX rate from {from} into {} for {}: add one, or give the prices \
                         in {from} with currency={from}",
                        self.currency,
                        self.month.format("%Y-%m")
                    ),
                )
            })?;
        Ok(amount * rate)
    }
}

/// Whether a contract scoped to a provider (or none) may price the provider asked for.
fn provider_admits(contract: &ContractRow, provider: Option<&str>) -> bool {
    match (contract.provider.as_deref(), provider) {
        (Some(scope), Some(asked)) => scope == asked,
        _ => true,
    }
}

/// The contract of `mode` in force at `at` that prices the model for everyone: no project
/// scope first, then the provider asked for (or none), then no region, then the cheapest.
fn pick_contract<'a>(
    contracts: &'a [ContractRow],
    mode: BillingMode,
    at: DateTime<Utc>,
    provider: Option<&str>,
) -> Option<&'a ContractRow> {
    contracts
        .iter()
        .filter(|c| c.billing_mode == mode && provider_admits(c, provider))
        .filter(|c| c.to_domain().is_valid_at(at))
        .min_by(|a, b| {
            let rank = |c: &ContractRow| {
                (
                    c.project_id.is_some(),
                    c.provider.is_some() != provider.is_some(),
                    c.region.is_some(),
                )
            };
            rank(a)
                .cmp(&rank(b))
                .then(a.price_per_gpu_hour.cmp(&b.price_per_gpu_hour))
                .then(a.id.cmp(&b.id))
        })
}

impl ReservationPlanView {
    /// The plan as a text table: money rounded half-even to the currency's minor unit,
    /// shares as percentages to two decimals.
    pub fn to_table(&self) -> String {
        use std::fmt::Write as _;
        let money = |amount: Decimal| round_money(amount, &self.currency).to_string();
        let percent =
            |share: Decimal| format!("{:.2} %", (share * Decimal::ONE_HUNDRED).round_dp(2));
        let price = |price: &PlanPrice| match &price.contract_name {
            Some(name) => format!(
                "{} a GPU-hour (contract \"{name}\")",
                price.price_per_gpu_hour
            ),
            None => format!("{} a GPU-hour (given)", price.price_per_gpu_hour),
        };
        let at = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut out = String::new();
        let scope: String = [
            self.pool.as_ref().map(|p| format!(" · pool {p}")),
            self.provider.as_ref().map(|p| format!(" · provider {p}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let _ = writeln!(
            out,
            "{}{scope} · {} – {} · {} hours · {}",
            self.gpu_model,
            at(self.from),
            at(self.to),
            self.hours,
            self.currency
        );
        let _ = writeln!(
            out,
            "reserved     {}\non-demand    {}\nbreak-even   {} utilisation",
            price(&self.prices.reserved),
            price(&self.prices.on_demand),
            percent(self.break_even_utilisation)
        );
        let _ = writeln!(
            out,
            "used         {} GPU-hours, {} GPUs in the busiest hour",
            self.used_gpu_hours.round_dp(2),
            self.peak_gpus.round_dp(2)
        );
        let _ = writeln!(
            out,
            "recommended  {} GPUs: {} ({} of them in use; {} hours above)",
            self.recommended_gpus,
            money(self.cost_at_recommended),
            percent(self.utilisation_at_recommended),
            self.hours_above_recommended
        );
        let _ = writeln!(
            out,
            "today        {} GPUs committed: {}; saving {}",
            self.committed_gpus_today,
            money(self.cost_today),
            money(self.saving)
        );
        let _ = writeln!(out, "\n{:>6}  {:>16}", "GPUs", "cost");
        for point in &self.curve {
            let mark = if point.gpus == self.recommended_gpus {
                "  ← recommended"
            } else {
                ""
            };
            let _ = writeln!(out, "{:>6}  {:>16}{mark}", point.gpus, money(point.cost));
        }
        if !self.contracts.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<32} {:>10} {:>12} {:>11} {:>14}",
                "reservation", "committed", "utilisation", "break-even", "wasted"
            );
            for held in &self.contracts {
                let _ = writeln!(
                    out,
                    "{:<32} {:>10} {:>12} {:>11} {:>14}{}",
                    held.name,
                    held.committed_gpus,
                    percent(held.utilisation),
                    percent(held.break_even_utilisation),
                    money(held.wasted),
                    if held.over_reserved {
                        "  over-reserved"
                    } else {
                        ""
                    }
                );
            }
        }
        if let Some(spot) = &self.spot {
            let _ = writeln!(
                out,
                "\nspot         {}: the {} on-demand GPU-hours would have cost {} \
                 instead of {} (saving {})",
                price(&spot.price),
                spot.on_demand_gpu_hours.round_dp(2),
                money(spot.cost_at_spot),
                money(spot.cost_on_demand),
                money(spot.saving)
            );
            let observed = &spot.observed;
            let _ = writeln!(
                out,
                "observed     {} of {} spot attempts preempted{}, {} of {} spot GPU-hours \
                 (seen in the window, not a promise)",
                observed.preempted_attempts,
                observed.attempts,
                observed
                    .preemption_rate
                    .map(|rate| format!(" ({})", percent(rate)))
                    .unwrap_or_default(),
                observed.preempted_gpu_hours.round_dp(2),
                observed.spot_gpu_hours.round_dp(2)
            );
        }
        out
    }
}
