//! A month's charges for tools outside taskledger: the FinOps FOCUS 1.2 cost-and-usage CSV.
//!
//! One row per project and contract (GPU time rated by it), per project and unrated kind of
//! GPU time (no cost, kept visible), and per reserved contract with unused commitment
//! (charged to its project, or to the `shared` sub-account when it is not project-scoped).
//! The figures are those of the cost API and the monthly report (COST_MODEL.md §1–3); FOCUS
//! only names them.

use std::collections::{BTreeMap, HashMap};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::Principal;
use crate::domain::commitment::unused_commitment;
use crate::domain::csv_cell::text_cell;
use crate::domain::ledger_time::{SECONDS_PER_HOUR, month_bounds};
use crate::domain::rating::FxRates;
use crate::domain::values::{Currency, Month};
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::ApiPath;
use crate::http::state::AppState;
use crate::store;
use crate::store::contracts::ContractRow;
use crate::store::cost::SUM_SCALE;
use crate::store::exports::{Commitment, ContractUsage};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_focus_export))
}

/// Provider, publisher and invoice issuer of a charge whose contract names no provider.
pub const DEFAULT_PROVIDER: &str = "taskledger";
/// The one billing account: this taskledger's ledger. Projects are its sub-accounts.
const BILLING_ACCOUNT: &str = "taskledger";
/// The sub-account of unused commitment of contracts not scoped to a project. Project
/// sub-accounts are `projects/<id>`, so no project id can collide with it.
const SHARED_SUB_ACCOUNT: &str = "shared";
const GPU_HOURS: &str = "GPU-Hours";

/// FOCUS columns in alphabetical order, then taskledger's own (`x_`).
const COLUMNS: [&str; 53] = [
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "x_BillingMode",
    "x_ContractId",
    "x_ContractName",
    "x_GpuModel",
    "x_GpuSeconds",
    "x_GpuSecondsBusy",
    "x_TaskCount",
    "x_UnratedGpuSeconds",
    "x_UnratedReason",
];

/// Who a charge is billed to.
#[derive(Debug, Clone)]
struct SubAccount {
    id: String,
    name: String,
    /// `Project` or `Shared`.
    kind: &'static str,
}

impl SubAccount {
    fn project(id: &str, name: &str) -> Self {
        Self {
            id: format!("projects/{id}"),
            name: name.to_owned(),
            kind: "Project",
        }
    }

    fn shared() -> Self {
        Self {
            id: SHARED_SUB_ACCOUNT.to_owned(),
            name: SHARED_SUB_ACCOUNT.to_owned(),
            kind: "Shared",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ChargeKind {
    /// GPU time of records, rated by a contract or not.
    Usage,
    /// Committed GPU-hours nobody used (COST_MODEL §3).
    UnusedCommitment,
}

/// One row of the export, before it is written.
#[derive(Debug, Clone)]
struct Charge<'a> {
    sub_account: SubAccount,
    currency: Currency,
    kind: ChargeKind,
    contract: Option<&'a ContractRow>,
    gpu_model: String,
    billing_mode: String,
    /// Why the GPU time carries no cost (`no_contract`, `no_fx_rate`); `None` when rated.
    unrated_reason: Option<String>,
    /// GPU-hours held (usage) or left unused (commitment).
    gpu_hours: Decimal,
    /// Per GPU-hour, in the billing currency; zero when unrated.
    unit_price: Decimal,
    /// In the billing currency; zero when unrated.
    cost: Decimal,
    /// The contract's currency (the billing currency when there is no contract).
    pricing_currency: Currency,
    /// The contract's own price per GPU-hour; zero when there is no contract.
    pricing_unit_price: Decimal,
    /// `cost` in the pricing currency; zero when unrated.
    pricing_cost: Decimal,
    tasks: i64,
    gpu_seconds: Decimal,
    gpu_seconds_busy: Decimal,
}

impl Charge<'_> {
    fn commitment(&self) -> Option<&ContractRow> {
        self.contract.filter(|c| c.committed_gpus.is_some())
    }

    fn provider(&self) -> &str {
        self.contract
            .and_then(|c| c.provider.as_deref())
            .unwrap_or(DEFAULT_PROVIDER)
    }

    fn pricing_category(&self) -> &'static str {
        if self.commitment().is_some() {
            "Committed"
        } else if self.billing_mode == "spot" {
            "Dynamic"
        } else {
            "Standard"
        }
    }

    fn description(&self) -> String {
        let what = match (self.kind, self.contract) {
            (ChargeKind::Usage, Some(contract)) => format!(
                "{} {} GPU time under contract {}",
                self.gpu_model, self.billing_mode, contract.name
            ),
            (ChargeKind::Usage, None) => {
                format!("{} {} GPU time", self.gpu_model, self.billing_mode)
            }
            (ChargeKind::UnusedCommitment, contract) => format!(
                "Unused commitment of contract {}: {} {} GPUs reserved",
                contract.map_or("", |c| c.name.as_str()),
                contract
                    .and_then(|c| c.committed_gpus)
                    .unwrap_or_default()
                    .normalize(),
                self.gpu_model
            ),
        };
        match self.unrated_reason.as_deref() {
            None => what,
            Some("no_contract") => format!("{what}, with no contract: not rated, no cost"),
            Some(_) => format!(
                "{what}, with no {} to {} FX rate for the month: not rated, no cost",
                self.contract.map_or("", |c| c.currency.as_str()),
                self.currency
            ),
        }
    }

    /// The row's cells, in [`COLUMNS`] order.
    fn cells(&self, month: Month, (start, end): (DateTime<Utc>, DateTime<Utc>)) -> [Cell; 53] {
        let money = |amount: Decimal| Cell::money(amount, self.currency);
        let commitment = self.commitment();
        let commitment_text = |value: &str| match commitment {
            Some(_) => Cell::text(value),
            None => Cell::Null,
        };
        let unused = self.kind == ChargeKind::UnusedCommitment;
        let rated = self.unrated_reason.is_none();
        [
            money(self.cost),
            Cell::text(BILLING_ACCOUNT),
            Cell::text(BILLING_ACCOUNT),
            Cell::text(self.currency.code()),
            Cell::instant(end),
            Cell::instant(start),
            Cell::text("Usage"),
            Cell::Null,
            Cell::text(self.description()),
            Cell::text(if unused { "Recurring" } else { "Usage-Based" }),
            Cell::instant(end),
            Cell::instant(start),
            commitment_text("Usage"),
            commitment.map_or(Cell::Null, |c| Cell::text(c.id.to_string())),
            commitment.map_or(Cell::Null, |c| Cell::text(&c.name)),
            commitment.map_or(Cell::Null, |_| Cell::quantity(self.gpu_hours)),
            commitment_text(if unused { "Unused" } else { "Used" }),
            commitment_text("Reserved GPUs"),
            commitment_text(GPU_HOURS),
            if unused {
                Cell::Null
            } else {
                Cell::quantity(self.gpu_hours)
            },
            if unused {
                Cell::Null
            } else {
                Cell::text(GPU_HOURS)
            },
            money(self.cost),
            Cell::money(self.unit_price, self.currency),
            money(self.cost),
            Cell::text(format!(
                "{month}/{}/{}",
                self.sub_account.id,
                self.currency.code()
            )),
            Cell::text(self.provider()),
            money(self.cost),
            Cell::text(self.pricing_category()),
            Cell::text(self.pricing_currency.code()),
            Cell::money(self.pricing_unit_price, self.pricing_currency),
            Cell::money(self.pricing_cost, self.pricing_currency),
            Cell::money(self.pricing_unit_price, self.pricing_currency),
            Cell::quantity(if rated { self.gpu_hours } else { Decimal::ZERO }),
            Cell::text(GPU_HOURS),
            Cell::text(self.provider()),
            Cell::text(self.provider()),
            self.region().map_or(Cell::Null, Cell::text),
            self.region().map_or(Cell::Null, Cell::text),
            Cell::text("AI and Machine Learning"),
            Cell::text("GPU compute"),
            Cell::text("Machine Learning"),
            Cell::text(&self.sub_account.id),
            Cell::text(&self.sub_account.name),
            Cell::text(self.sub_account.kind),
            Cell::text(&self.billing_mode),
            self.contract
                .map_or(Cell::Null, |c| Cell::text(c.id.to_string())),
            self.contract.map_or(Cell::Null, |c| Cell::text(&c.name)),
            Cell::text(&self.gpu_model),
            Cell::plain(self.gpu_seconds),
            Cell::plain(self.gpu_seconds_busy),
            Cell::Number(self.tasks.to_string()),
            Cell::plain(if rated {
                Decimal::ZERO
            } else if unused {
                self.gpu_hours * SECONDS_PER_HOUR
            } else {
                self.gpu_seconds
            }),
            self.unrated_reason
                .as_deref()
                .map_or(Cell::Null, Cell::text),
        ]
    }

    fn region(&self) -> Option<&str> {
        self.contract.and_then(|c| c.region.as_deref())
    }

    fn sort_key(&self) -> impl Ord + '_ {
        (
            &self.sub_account.id,
            self.kind,
            self.unrated_reason.is_some(),
            self.contract.map(|c| (&c.name, c.id)),
            &self.gpu_model,
            &self.billing_mode,
            &self.unrated_reason,
            self.currency.code(),
        )
    }
}

/// A CSV cell: text is made safe to open in a spreadsheet; numbers and times are ours and
/// written as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cell {
    Text(String),
    Number(String),
    Null,
}

impl Cell {
    fn text(value: impl Into<String>) -> Self {
        Self::Text(value.into())
    }

    fn instant(at: DateTime<Utc>) -> Self {
        Self::Number(at.to_rfc3339_opts(SecondsFormat::Secs, true))
    }

    /// Money at full precision, written with at least the currency's minor-unit digits.
    fn money(amount: Decimal, currency: Currency) -> Self {
        Self::Number(decimal_text(amount, currency.minor_unit_digits().max(1)))
    }

    /// A FOCUS quantity: at full precision, always with a decimal point.
    fn quantity(value: Decimal) -> Self {
        Self::Number(decimal_text(value, 1))
    }

    fn plain(value: Decimal) -> Self {
        Self::Number(decimal_text(value, 0))
    }

    fn write(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Text(text) => text_cell(text),
            Self::Number(number) => number.as_str().into(),
            Self::Null => "".into(),
        }
    }
}

/// A plain decimal (never an exponent) with at least `min_scale` fractional digits. FOCUS
/// decimal columns get at least one, so that a reader inferring column types from the text
/// never takes a column of whole amounts for integers.
fn decimal_text(value: Decimal, min_scale: u32) -> String {
    let mut value = value.normalize();
    if value.scale() < min_scale {
        value.rescale(min_scale);
    }
    value.to_string()
}

fn parse_currency(code: &str) -> ApiResult<Currency> {
    Currency::parse(code)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored currency is invalid: {e}")))
}

/// What one unit of `contract`'s currency is in `currency` in the month, as rating converts.
fn fx_rate(
    contract: &ContractRow,
    currency: Currency,
    month: NaiveDate,
    fx: &impl FxRates,
) -> Option<Decimal> {
    if contract.currency == currency.code() {
        Some(Decimal::ONE)
    } else {
        fx.rate(month, &contract.currency, currency.code())
    }
}

fn usage_charge<'a>(
    usage: &ContractUsage,
    contracts: &'a HashMap<Uuid, ContractRow>,
    month: NaiveDate,
    fx: &impl FxRates,
) -> ApiResult<Charge<'a>> {
    let currency = parse_currency(&usage.project_currency)?;
    let contract = usage.contract_id.and_then(|id| contracts.get(&id));
    let gpu_hours = (usage.gpu_seconds_held / SECONDS_PER_HOUR).round_dp(SUM_SCALE);
    let (unit_price, pricing_cost) = match (&usage.unrated_reason, contract) {
        (Some(_), _) => (Decimal::ZERO, Decimal::ZERO),
        (None, Some(contract)) => {
            let rate = fx_rate(contract, currency, month, fx).ok_or_else(|| {
                anyhow::anyhow!(
                    "rated segments of contract {} have no FX rate into {currency}",
                    contract.id
                )
            })?;
            let pricing_cost = if rate == Decimal::ONE {
                usage.cost
            } else {
                (gpu_hours * contract.price_per_gpu_hour).round_dp(SUM_SCALE)
            };
            (contract.price_per_gpu_hour * rate, pricing_cost)
        }
        (None, None) => {
            return Err(anyhow::anyhow!("rated segments without a contract").into());
        }
    };
    let (pricing_currency, pricing_unit_price) = match contract {
        Some(contract) => (
            parse_currency(&contract.currency)?,
            contract.price_per_gpu_hour,
        ),
        None => (currency, Decimal::ZERO),
    };
    Ok(Charge {
        sub_account: SubAccount::project(&usage.project_id, &usage.project_name),
        currency,
        kind: ChargeKind::Usage,
        contract,
        gpu_model: usage.gpu_model.clone(),
        billing_mode: usage.billing_mode.clone(),
        unrated_reason: usage.unrated_reason.clone(),
        gpu_hours,
        unit_price,
        cost: usage.cost,
        pricing_currency,
        pricing_unit_price,
        pricing_cost,
        tasks: usage.tasks,
        gpu_seconds: usage.gpu_seconds_held,
        gpu_seconds_busy: usage.gpu_seconds_busy,
    })
}

/// Unused commitment of one contract over `window`, billed to its project in the project's
/// currency, or to the shared sub-account in the contract's; `None` when all was used.
fn unused_charge<'a>(
    commitment: &'a Commitment,
    used: &BTreeMap<DateTime<Utc>, Decimal>,
    window: (DateTime<Utc>, DateTime<Utc>),
    month: NaiveDate,
    fx: &impl FxRates,
    tz: Tz,
) -> ApiResult<Option<Charge<'a>>> {
    let row = &commitment.contract;
    let contract = row.to_domain();
    let hours = unused_commitment(&contract, used, window.0, window.1, tz);
    let unused_gpu_hours: Decimal = hours
        .iter()
        .map(|h| h.unused_gpu_hours.round_dp(SUM_SCALE))
        .sum();
    if unused_gpu_hours.is_zero() {
        return Ok(None);
    }
    let (sub_account, currency) = match (&row.project_id, &commitment.project_name) {
        (Some(id), Some(name)) => (
            SubAccount::project(id, name),
            parse_currency(commitment.project_currency.as_deref().unwrap_or_default())?,
        ),
        _ => (SubAccount::shared(), parse_currency(&row.currency)?),
    };
    let (unrated_reason, unit_price, cost, pricing_cost) = match fx_rate(row, currency, month, fx) {
        Some(rate) => {
            let in_currency = |rate: Decimal| -> Decimal {
                hours
                    .iter()
                    .map(|h| (h.cost * rate).round_dp(SUM_SCALE))
                    .sum()
            };
            (
                None,
                row.price_per_gpu_hour * rate,
                in_currency(rate),
                in_currency(Decimal::ONE),
            )
        }
        None => (
            Some("no_fx_rate".to_owned()),
            Decimal::ZERO,
            Decimal::ZERO,
            Decimal::ZERO,
        ),
    };
    Ok(Some(Charge {
        sub_account,
        currency,
        kind: ChargeKind::UnusedCommitment,
        contract: Some(row),
        gpu_model: row.gpu_model.clone(),
        billing_mode: row.billing_mode.as_str().to_owned(),
        unrated_reason,
        gpu_hours: unused_gpu_hours,
        unit_price,
        cost,
        pricing_currency: parse_currency(&row.currency)?,
        pricing_unit_price: row.price_per_gpu_hour,
        pricing_cost,
        tasks: 0,
        gpu_seconds: Decimal::ZERO,
        gpu_seconds_busy: Decimal::ZERO,
    }))
}

/// What the export of a month is made of, read in one snapshot.
struct MonthData {
    usage: Vec<ContractUsage>,
    contracts: HashMap<Uuid, ContractRow>,
    commitments: Vec<Commitment>,
    commitment_usage: BTreeMap<Uuid, BTreeMap<DateTime<Utc>, Decimal>>,
    fx: store::fx_rates::RateTable,
}

async fn month_data(
    conn: &mut sqlx::PgConnection,
    period: (DateTime<Utc>, DateTime<Utc>),
    accrual: Option<(DateTime<Utc>, DateTime<Utc>)>,
    month: NaiveDate,
    tz: Tz,
) -> ApiResult<MonthData> {
    let usage = store::exports::usage_by_contract(conn, period, tz).await?;
    let mut contract_ids: Vec<Uuid> = usage.iter().filter_map(|u| u.contract_id).collect();
    contract_ids.sort_unstable();
    contract_ids.dedup();
    let contracts = store::contracts::by_ids(conn, &contract_ids)
        .await?
        .into_iter()
        .map(|c| (c.id, c))
        .collect();
    let (commitments, commitment_usage) = match accrual {
        Some(window) => {
            let commitments = store::exports::commitments(conn, window).await?;
            let ids: Vec<Uuid> = commitments.iter().map(|c| c.contract.id).collect();
            let used = store::cost::contract_usage_all_projects(conn, window, &ids).await?;
            (commitments, used)
        }
        None => (Vec::new(), BTreeMap::new()),
    };
    let mut currencies: Vec<String> = usage
        .iter()
        .map(|u| u.project_currency.clone())
        .chain(
            commitments
                .iter()
                .filter_map(|c| c.project_currency.clone()),
        )
        .collect();
    currencies.sort_unstable();
    currencies.dedup();
    let fx = store::fx_rates::table(conn, month, month, &currencies).await?;
    Ok(MonthData {
        usage,
        contracts,
        commitments,
        commitment_usage,
        fx,
    })
}

fn charges<'a>(
    data: &'a MonthData,
    period: (DateTime<Utc>, DateTime<Utc>),
    accrues_until: DateTime<Utc>,
    month: NaiveDate,
    tz: Tz,
) -> ApiResult<Vec<Charge<'a>>> {
    let mut charges = data
        .usage
        .iter()
        .map(|usage| usage_charge(usage, &data.contracts, month, &data.fx))
        .collect::<ApiResult<Vec<_>>>()?;
    let nothing_used = BTreeMap::new();
    for commitment in &data.commitments {
        let used = data
            .commitment_usage
            .get(&commitment.contract.id)
            .unwrap_or(&nothing_used);
        let window = (period.0, accrues_until);
        if let Some(charge) = unused_charge(commitment, used, window, month, &data.fx, tz)? {
            charges.push(charge);
        }
    }
    charges.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    Ok(charges)
}

fn render(
    charges: &[Charge],
    month: Month,
    period: (DateTime<Utc>, DateTime<Utc>),
) -> ApiResult<Vec<u8>> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let write_error = |e: csv::Error| ApiError::Internal(anyhow::anyhow!("writing CSV: {e}"));
    writer.write_record(COLUMNS).map_err(write_error)?;
    for charge in charges {
        let cells = charge.cells(month, period);
        writer
            .write_record(cells.iter().map(|cell| cell.write().into_owned()))
            .map_err(write_error)?;
    }
    writer
        .into_inner()
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("writing CSV: {e}")))
}

/// The month's charges as a FinOps FOCUS 1.2 cost-and-usage CSV (finance or admin).
///
/// Rows: GPU time of each project by the contract that rated it (`ChargeCategory=Usage`, in
/// the project's currency); GPU time that carries no cost (no contract, or no FX rate) as
/// zero-cost rows with `x_UnratedReason` and `x_UnratedGpuSeconds`, so no GPU time is left
/// out; and unused commitment of reserved contracts with committed GPUs
/// (`CommitmentDiscountStatus=Unused`), billed to the contract's project or, for a contract
/// not scoped to one, to the `shared` sub-account in the contract's currency. Projects are
/// the sub-accounts `projects/<id>` of one billing account, `taskledger`. Billing and charge
/// periods are the ledger month's bounds in UTC; in a month in progress, unused commitment
/// accrues up to now. Money is at full precision; quantities are GPU-hours. Per row,
/// `x_TaskCount` counts the distinct tasks with GPU time in it, `x_GpuSeconds` and
/// `x_GpuSecondsBusy` are the GPU-seconds held and measured busy. Text cells that a
/// spreadsheet would read as a formula start with `'`.
#[utoipa::path(get, path = "/v1/exports/focus/{month}", tag = "reports",
    params(("month" = String, Path, description = "YYYY-MM in the ledger time zone")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The FOCUS CSV", body = String, content_type = "text/csv",
            headers(("Content-Disposition" = String, description = "attachment; filename=\"focus-YYYY-MM.csv\""))),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month, as `path:month`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_focus_export(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(month): ApiPath<String>,
) -> ApiResult<Response> {
    require_finance(&principal)?;
    let month = Month::parse(&month).map_err(|message| ApiError::invalid("path:month", message))?;
    let tz = state.settings.timezone;
    let period = month_bounds(month.first_day(), tz);
    let accrues_until = period.1.min(state.settings.clock.now());
    let accrual = (accrues_until > period.0).then_some((period.0, accrues_until));
    let mut snapshot = store::snapshot(&state.pool).await?;
    let data = month_data(&mut snapshot, period, accrual, month.first_day(), tz).await?;
    snapshot.commit().await?;
    let charges = charges(&data, period, accrues_until, month.first_day(), tz)?;
    let body = render(&charges, month, period)?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"focus-{month}.csv\""),
            ),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_plain_with_a_minimum_scale() {
        let d = |s: &str| s.parse::<Decimal>().unwrap();
        assert_eq!(decimal_text(d("1430"), 2), "1430.00");
        assert_eq!(decimal_text(d("84.600"), 2), "84.60");
        assert_eq!(decimal_text(d("0.0000184000"), 2), "0.0000184");
        assert_eq!(decimal_text(d("16"), 1), "16.0");
        assert_eq!(decimal_text(d("57600.000"), 0), "57600");
        assert_eq!(decimal_text(d("-2.5"), 2), "-2.50");
    }

    #[test]
    fn text_cells_are_neutralised_and_numbers_are_not() {
        assert_eq!(Cell::text("=C1").write(), "'=C1");
        assert_eq!(Cell::plain(Decimal::NEGATIVE_ONE).write(), "-1");
        assert_eq!(Cell::Null.write(), "");
    }
}
