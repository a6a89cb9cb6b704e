//! A month's charges for tools outside taskledger: the FinOps FOCUS 1.2 cost-and-usage CSV.
//!
//! One row per project and contract (GPU time rated by it), per project and unrated kind of
//! GPU time (no cost, kept visible), per reserved contract with unused commitment
//! (charged to its project, or to the `shared` sub-account when it is not project-scoped),
//! and per capacity pool, contract and project charged with the idle or down time of the
//! pool's nodes (or the pool's own `pools/<id>` sub-account when it keeps that time).
//! The figures are those of the cost API and the monthly report (COST_MODEL.md §1–3); FOCUS
//! only names them.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::csv_cell::text_cell;
use crate::domain::commitment::{HourlyUsage, unused_commitment};
use crate::domain::figures::SUM_SCALE;
use crate::domain::ledger_time::{SECONDS_PER_HOUR, month_bounds};
use crate::domain::rating::{BillingMode, Contract, FxRates};
use crate::domain::values::{Currency, Month};

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

/// The month exported and how far into it unused commitment has accrued.
#[derive(Debug, Clone, Copy)]
pub struct BillingPeriod {
    pub month: Month,
    /// The ledger month's bounds, `[start, end)`: every row's billing and charge period.
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The month's end, or now in a month in progress.
    pub accrues_until: DateTime<Utc>,
    /// The ledger time zone, in whose hours commitment is counted.
    pub tz: Tz,
}

impl BillingPeriod {
    pub fn new(month: Month, now: DateTime<Utc>, tz: Tz) -> Self {
        let (start, end) = month_bounds(month.first_day(), tz);
        Self {
            month,
            start,
            end,
            accrues_until: end.min(now),
            tz,
        }
    }

    /// The part of the month in which commitment has accrued; `None` before it begins.
    pub fn accrual(&self) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        (self.accrues_until > self.start).then_some((self.start, self.accrues_until))
    }
}

/// A project as the sub-account its charges are billed to, in its currency.
#[derive(Debug, Clone)]
pub struct ProjectAccount {
    pub id: String,
    pub name: String,
    pub currency: Currency,
}

/// A contract as the export names and prices it.
#[derive(Debug, Clone)]
pub struct ContractTerms {
    pub id: Uuid,
    pub name: String,
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    pub price_per_gpu_hour: Decimal,
    pub currency: Currency,
    pub valid_from: DateTime<Utc>,
    /// `None` means open-ended.
    pub valid_until: Option<DateTime<Utc>>,
    pub project: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    /// GPUs paid for every hour of validity, used or not (reserved contracts only).
    pub committed_gpus: Option<Decimal>,
}

impl ContractTerms {
    /// The contract as the cost model sees it, so that unused commitment is that of the
    /// cost API.
    fn to_rating(&self) -> Contract {
        Contract {
            id: self.id,
            gpu_model: self.gpu_model.clone(),
            billing_mode: self.billing_mode,
            project: self.project.clone(),
            provider: self.provider.clone(),
            region: self.region.clone(),
            valid_from: self.valid_from,
            valid_until: self.valid_until,
            price_per_gpu_hour: self.price_per_gpu_hour,
            currency: self.currency.code().to_owned(),
            committed_gpus: self.committed_gpus,
            power_price_per_gpu_hour: Decimal::ZERO,
            energy_price_per_kwh: Decimal::ZERO,
        }
    }
}

/// GPU time of one project in the month under one contract, or unrated for want of a
/// contract or of an FX rate, as the rollups sum it.
#[derive(Debug, Clone)]
pub struct UsageLine {
    pub project: ProjectAccount,
    pub gpu_model: String,
    pub billing_mode: String,
    /// Kept when only the FX rate is missing, since the GPUs still used that contract.
    pub contract_id: Option<Uuid>,
    /// `no_contract` or `no_fx_rate`; `None` when rated.
    pub unrated_reason: Option<String>,
    pub gpu_seconds_held: Decimal,
    /// Busy time of the segments that measured it.
    pub gpu_seconds_busy: Decimal,
    /// In the project's currency; zero when unrated.
    pub cost: Decimal,
    /// Distinct tasks with GPU time in this line.
    pub tasks: i64,
}

/// A reserved contract that commits GPUs, with the project it is scoped to, if any.
#[derive(Debug, Clone)]
pub struct CommittedContract {
    pub contract: ContractTerms,
    pub project: Option<ProjectAccount>,
}

/// Idle or down time of a pool's nodes, charged to a project or kept on the pool's line,
/// priced by one contract (or by none).
#[derive(Debug, Clone)]
pub struct CapacityLine {
    /// The project charged; `None` when the pool keeps the time on its own line.
    pub project: Option<ProjectAccount>,
    pub pool: String,
    /// `true` for down time, `false` for idle time.
    pub down: bool,
    pub gpu_model: String,
    pub billing_mode: String,
    pub contract_id: Option<Uuid>,
    /// `no_contract` or `no_fx_rate`; `None` when priced.
    pub unrated_reason: Option<String>,
    pub gpu_seconds: Decimal,
    /// In `currency`; zero when unrated.
    pub cost: Decimal,
    /// The project's currency, or the contract's for time kept on the pool's line.
    pub currency: Currency,
}

/// What the export of a month is made of, read in one snapshot.
#[derive(Debug, Clone, Default)]
pub struct MonthData {
    pub usage: Vec<UsageLine>,
    /// The contracts that `usage` names, by id.
    pub contracts: HashMap<Uuid, ContractTerms>,
    /// The reserved contracts whose commitment accrues in the month.
    pub commitments: Vec<CommittedContract>,
    /// GPU-seconds rated by each committed contract, by the start of their ledger hour.
    pub commitment_usage: BTreeMap<Uuid, Vec<(DateTime<Utc>, Decimal)>>,
    /// Idle and down time of capacity pools, as charged.
    pub capacity: Vec<CapacityLine>,
}

/// Why a month's data cannot be exported: it contradicts itself, or the CSV failed.
#[derive(Debug, thiserror::Error)]
pub enum FocusError {
    #[error("rated segments of contract {contract} have no FX rate into {currency}")]
    RatedWithoutFxRate { contract: Uuid, currency: Currency },
    #[error("rated segments without a contract")]
    RatedWithoutContract,
    #[error("writing CSV: {0}")]
    Csv(#[from] csv::Error),
}

/// The month's charges as FOCUS CSV: the header, then one row per charge, sorted by
/// sub-account.
pub fn month_csv(
    period: &BillingPeriod,
    data: &MonthData,
    fx: &impl FxRates,
) -> Result<Vec<u8>, FocusError> {
    let charges = charges(period, data, fx)?;
    render(period, &charges)
}

/// Who a charge is billed to.
#[derive(Debug, Clone)]
struct SubAccount {
    id: String,
    name: String,
    /// `Project` or `Shared`.
    kind: &'static str,
}

impl SubAccount {
    fn project(project: &ProjectAccount) -> Self {
        Self {
            id: format!("projects/{}", project.id),
            name: project.name.clone(),
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

    fn pool(pool: &str) -> Self {
        Self {
            id: format!("pools/{pool}"),
            name: pool.to_owned(),
            kind: "Pool",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ChargeKind {
    /// GPU time of records, rated by a contract or not.
    Usage,
    /// Committed GPU-hours nobody used (COST_MODEL §3).
    UnusedCommitment,
    /// GPU-hours a pool's nodes were up with no job on them (COST_MODEL §9).
    CapacityIdle,
    /// GPU-hours a pool's nodes were paid and down.
    CapacityDown,
}

/// One row of the export, before it is written.
#[derive(Debug, Clone)]
struct Charge<'a> {
    sub_account: SubAccount,
    currency: Currency,
    kind: ChargeKind,
    contract: Option<&'a ContractTerms>,
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
    /// The pool of a capacity charge.
    pool: Option<&'a str>,
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
    fn commitment(&self) -> Option<&ContractTerms> {
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
            (ChargeKind::CapacityIdle | ChargeKind::CapacityDown, contract) => format!(
                "{} time of {} {} nodes of pool {}{}",
                if self.kind == ChargeKind::CapacityIdle {
                    "Idle"
                } else {
                    "Down"
                },
                self.gpu_model,
                self.billing_mode,
                self.pool.unwrap_or_default(),
                contract.map_or(String::new(), |c| format!(" under contract {}", c.name))
            ),
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
                self.contract.map_or("", |c| c.currency.code()),
                self.currency
            ),
        }
    }

    /// The row's cells, in [`COLUMNS`] order.
    fn cells(&self, period: &BillingPeriod) -> [Cell; 53] {
        let money = |amount: Decimal| Cell::money(amount, self.currency);
        let commitment = self.commitment();
        let commitment_text = |value: &str| match commitment {
            Some(_) => Cell::text(value),
            None => Cell::Null,
        };
        // Unused commitment and idle or down capacity are paid time nobody consumed.
        let unused = self.kind != ChargeKind::Usage;
        let rated = self.unrated_reason.is_none();
        [
            money(self.cost),
            Cell::text(BILLING_ACCOUNT),
            Cell::text(BILLING_ACCOUNT),
            Cell::text(self.currency.code()),
            Cell::instant(period.end),
            Cell::instant(period.start),
            Cell::text("Usage"),
            Cell::Null,
            Cell::text(self.description()),
            Cell::text(if unused { "Recurring" } else { "Usage-Based" }),
            Cell::instant(period.end),
            Cell::instant(period.start),
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
                "{}/{}/{}",
                period.month,
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
            self.pool,
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

    fn write(&self) -> Cow<'_, str> {
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

fn usage_charge<'a>(
    usage: &UsageLine,
    contracts: &'a HashMap<Uuid, ContractTerms>,
    period: &BillingPeriod,
    fx: &impl FxRates,
) -> Result<Charge<'a>, FocusError> {
    let currency = usage.project.currency;
    let contract = usage.contract_id.and_then(|id| contracts.get(&id));
    let gpu_hours = (usage.gpu_seconds_held / SECONDS_PER_HOUR).round_dp(SUM_SCALE);
    let (unit_price, pricing_cost) = match (&usage.unrated_reason, contract) {
        (Some(_), _) => (Decimal::ZERO, Decimal::ZERO),
        (None, Some(contract)) => {
            let rate = fx
                .conversion(
                    period.month.first_day(),
                    contract.currency.code(),
                    currency.code(),
                )
                .ok_or(FocusError::RatedWithoutFxRate {
                    contract: contract.id,
                    currency,
                })?;
            let pricing_cost = if rate == Decimal::ONE {
                usage.cost
            } else {
                (gpu_hours * contract.price_per_gpu_hour).round_dp(SUM_SCALE)
            };
            (contract.price_per_gpu_hour * rate, pricing_cost)
        }
        (None, None) => return Err(FocusError::RatedWithoutContract),
    };
    let (pricing_currency, pricing_unit_price) = match contract {
        Some(contract) => (contract.currency, contract.price_per_gpu_hour),
        None => (currency, Decimal::ZERO),
    };
    Ok(Charge {
        sub_account: SubAccount::project(&usage.project),
        currency,
        kind: ChargeKind::Usage,
        contract,
        gpu_model: usage.gpu_model.clone(),
        billing_mode: usage.billing_mode.clone(),
        unrated_reason: usage.unrated_reason.clone(),
        gpu_hours,
        unit_price,
        cost: usage.cost,
        pool: None,
        pricing_currency,
        pricing_unit_price,
        pricing_cost,
        tasks: usage.tasks,
        gpu_seconds: usage.gpu_seconds_held,
        gpu_seconds_busy: usage.gpu_seconds_busy,
    })
}

/// Unused commitment of one contract up to `accrues_until`, billed to its project in the
/// project's currency, or to the shared sub-account in the contract's; `None` when all was
/// used.
fn unused_charge<'a>(
    commitment: &'a CommittedContract,
    used: &HourlyUsage,
    period: &BillingPeriod,
    fx: &impl FxRates,
) -> Option<Charge<'a>> {
    let contract = &commitment.contract;
    let hours = unused_commitment(
        &contract.to_rating(),
        used,
        period.start,
        period.accrues_until,
        period.tz,
    );
    let unused_gpu_hours: Decimal = hours
        .iter()
        .map(|h| h.unused_gpu_hours.round_dp(SUM_SCALE))
        .sum();
    if unused_gpu_hours.is_zero() {
        return None;
    }
    let (sub_account, currency) = match &commitment.project {
        Some(project) => (SubAccount::project(project), project.currency),
        None => (SubAccount::shared(), contract.currency),
    };
    let rate = fx.conversion(
        period.month.first_day(),
        contract.currency.code(),
        currency.code(),
    );
    let (unrated_reason, unit_price, cost, pricing_cost) = match rate {
        Some(rate) => {
            let in_currency = |rate: Decimal| -> Decimal {
                hours
                    .iter()
                    .map(|h| (h.cost * rate).round_dp(SUM_SCALE))
                    .sum()
            };
            (
                None,
                contract.price_per_gpu_hour * rate,
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
    Some(Charge {
        sub_account,
        currency,
        kind: ChargeKind::UnusedCommitment,
        contract: Some(contract),
        gpu_model: contract.gpu_model.clone(),
        billing_mode: contract.billing_mode.as_str().to_owned(),
        unrated_reason,
        gpu_hours: unused_gpu_hours,
        unit_price,
        cost,
        pool: None,
        pricing_currency: contract.currency,
        pricing_unit_price: contract.price_per_gpu_hour,
        pricing_cost,
        tasks: 0,
        gpu_seconds: Decimal::ZERO,
        gpu_seconds_busy: Decimal::ZERO,
    })
}

fn charges<'a>(
    period: &BillingPeriod,
    data: &'a MonthData,
    fx: &impl FxRates,
) -> Result<Vec<Charge<'a>>, FocusError> {
    let mut charges = data
        .usage
        .iter()
        .map(|usage| usage_charge(usage, &data.contracts, period, fx))
        .collect::<Result<Vec<_>, _>>()?;
    charges.extend(data.commitments.iter().filter_map(|commitment| {
        let used = data
            .commitment_usage
            .get(&commitment.contract.id)
            .map_or(&[][..], Vec::as_slice);
        unused_charge(commitment, used, period, fx)
    }));
    charges.extend(
        data.capacity
            .iter()
            .map(|line| capacity_charge(line, &data.contracts)),
    );
    charges.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    Ok(charges)
}

/// Idle or down time of a pool's nodes, billed to the project charged with it or to the
/// pool's own sub-account.
fn capacity_charge<'a>(
    line: &'a CapacityLine,
    contracts: &'a HashMap<Uuid, ContractTerms>,
) -> Charge<'a> {
    let contract = line.contract_id.and_then(|id| contracts.get(&id));
    let gpu_hours = (line.gpu_seconds / SECONDS_PER_HOUR).round_dp(SUM_SCALE);
    let rated = line.unrated_reason.is_none();
    let (pricing_currency, pricing_unit_price) = match contract {
        Some(c) => (c.currency, c.price_per_gpu_hour),
        None => (line.currency, Decimal::ZERO),
    };
    let unit_price = if rated && !gpu_hours.is_zero() {
        line.cost / gpu_hours
    } else {
        Decimal::ZERO
    };
    Charge {
        sub_account: match &line.project {
            Some(project) => SubAccount::project(project),
            None => SubAccount::pool(&line.pool),
        },
        currency: line.currency,
        kind: if line.down {
            ChargeKind::CapacityDown
        } else {
            ChargeKind::CapacityIdle
        },
        contract,
        gpu_model: line.gpu_model.clone(),
        billing_mode: line.billing_mode.clone(),
        unrated_reason: line.unrated_reason.clone(),
        gpu_hours,
        unit_price: unit_price.round_dp(SUM_SCALE),
        cost: line.cost,
        pool: Some(&line.pool),
        pricing_currency,
        pricing_unit_price,
        pricing_cost: if rated {
            (line.gpu_seconds * pricing_unit_price / SECONDS_PER_HOUR).round_dp(SUM_SCALE)
        } else {
            Decimal::ZERO
        },
        tasks: 0,
        gpu_seconds: line.gpu_seconds,
        gpu_seconds_busy: Decimal::ZERO,
    }
}

fn render(period: &BillingPeriod, charges: &[Charge]) -> Result<Vec<u8>, FocusError> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(COLUMNS)?;
    for charge in charges {
        let cells = charge.cells(period);
        writer.write_record(cells.iter().map(|cell| cell.write().into_owned()))?;
    }
    writer
        .into_inner()
        .map_err(|e| FocusError::Csv(e.into_error().into()))
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, NaiveDate};
    use chrono_tz::UTC;

    use super::*;

    type Row = HashMap<String, String>;

    fn d(text: &str) -> Decimal {
        text.parse().expect("test decimals are valid")
    }

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().expect("test instants are valid RFC 3339")
    }

    fn currency(code: &str) -> Currency {
        Currency::parse(code).expect("test currencies are valid")
    }

    /// November 2026, exported once it has ended.
    fn november() -> BillingPeriod {
        BillingPeriod::new(
            Month::parse("2026-11").expect("a month"),
            utc("2027-01-01T00:00:00Z"),
            UTC,
        )
    }

    fn no_rates(_: NaiveDate, _: &str, _: &str) -> Option<Decimal> {
        None
    }

    fn usd_to_eur_in_november(month: NaiveDate, from: &str, to: &str) -> Option<Decimal> {
        let november = NaiveDate::from_ymd_opt(2026, 11, 1).expect("a day");
        (month == november && from == "USD" && to == "EUR").then(|| d("0.9"))
    }

    fn project(id: &str, code: &str) -> ProjectAccount {
        ProjectAccount {
            id: id.to_owned(),
            name: id.to_owned(),
            currency: currency(code),
        }
    }

    /// An on-demand H100 contract valid all of 2026, scoped to nothing.
    fn contract(name: &str, price: &str, code: &str) -> ContractTerms {
        ContractTerms {
            id: Uuid::new_v4(),
            name: name.to_owned(),
            gpu_model: "H100".to_owned(),
            billing_mode: BillingMode::OnDemand,
            price_per_gpu_hour: d(price),
            currency: currency(code),
            valid_from: utc("2026-01-01T00:00:00Z"),
            valid_until: None,
            project: None,
            provider: None,
            region: None,
            committed_gpus: None,
        }
    }

    /// A reserved A100 contract committing `gpus` over `[from, until)`.
    fn reserved(name: &str, price: &str, gpus: &str, from: &str, until: &str) -> ContractTerms {
        ContractTerms {
            gpu_model: "A100".to_owned(),
            billing_mode: BillingMode::Reserved,
            valid_from: utc(from),
            valid_until: Some(utc(until)),
            committed_gpus: Some(d(gpus)),
            ..contract(name, price, "USD")
        }
    }

    /// `hours` GPU-hours of on-demand H100 time of one task, rated by `contract`.
    fn usage(
        project: &ProjectAccount,
        contract: Option<&ContractTerms>,
        hours: &str,
        cost: &str,
    ) -> UsageLine {
        UsageLine {
            project: project.clone(),
            gpu_model: "H100".to_owned(),
            billing_mode: "on_demand".to_owned(),
            contract_id: contract.map(|c| c.id),
            unrated_reason: None,
            gpu_seconds_held: d(hours) * SECONDS_PER_HOUR,
            gpu_seconds_busy: Decimal::ZERO,
            cost: d(cost),
            tasks: 1,
        }
    }

    fn unrated(line: UsageLine, reason: &str) -> UsageLine {
        UsageLine {
            unrated_reason: Some(reason.to_owned()),
            cost: Decimal::ZERO,
            ..line
        }
    }

    fn month_of_usage(contracts: &[&ContractTerms], usage: Vec<UsageLine>) -> MonthData {
        MonthData {
            usage,
            contracts: contracts.iter().map(|c| (c.id, (*c).clone())).collect(),
            ..MonthData::default()
        }
    }

    /// One GPU busy for each of `hours` ledger hours from `from`.
    fn one_gpu_for(from: &str, hours: i64) -> Vec<(DateTime<Utc>, Decimal)> {
        (0..hours)
            .map(|hour| (utc(from) + Duration::hours(hour), SECONDS_PER_HOUR))
            .collect()
    }

    fn month_of_commitment(
        contract: ContractTerms,
        project: Option<ProjectAccount>,
        used: Vec<(DateTime<Utc>, Decimal)>,
    ) -> MonthData {
        MonthData {
            commitment_usage: BTreeMap::from([(contract.id, used)]),
            commitments: vec![CommittedContract { contract, project }],
            ..MonthData::default()
        }
    }

    /// The exported rows, each by column name, after checking the header.
    fn rows(period: &BillingPeriod, data: &MonthData, fx: &impl FxRates) -> Vec<Row> {
        let body = month_csv(period, data, fx).expect("the month exports");
        let mut reader = csv::Reader::from_reader(body.as_slice());
        let header = reader.headers().expect("a header").clone();
        assert_eq!(header.iter().collect::<Vec<_>>(), COLUMNS);
        reader
            .records()
            .map(|record| {
                let record = record.expect("a CSV record");
                header
                    .iter()
                    .zip(record.iter())
                    .map(|(column, cell)| (column.to_owned(), cell.to_owned()))
                    .collect()
            })
            .collect()
    }

    fn only_row(period: &BillingPeriod, data: &MonthData, fx: &impl FxRates) -> Row {
        let mut rows = rows(period, data, fx);
        assert_eq!(rows.len(), 1, "{rows:#?}");
        rows.remove(0)
    }

    fn assert_cells(row: &Row, expected: &[(&str, &str)]) {
        for (column, value) in expected {
            assert_eq!(row[*column], *value, "{column} of {row:#?}");
        }
    }

    #[test]
    fn decimals_are_plain_with_a_minimum_scale() {
        assert_eq!(decimal_text(d("1430"), 2), "1430.00");
        assert_eq!(decimal_text(d("84.600"), 2), "84.60");
        assert_eq!(decimal_text(d("0.0000184000"), 2), "0.0000184");
        assert_eq!(decimal_text(d("16"), 1), "16.0");
        assert_eq!(decimal_text(d("57600.000"), 0), "57600");
        assert_eq!(decimal_text(d("-2.5"), 2), "-2.50");
    }

    #[test]
    fn money_has_at_least_its_currencys_minor_unit_digits() {
        assert_eq!(Cell::money(d("1430"), currency("USD")).write(), "1430.00");
        assert_eq!(Cell::money(d("1.5"), currency("BHD")).write(), "1.500");
        assert_eq!(
            Cell::money(d("1430"), currency("JPY")).write(),
            "1430.0",
            "never an integer"
        );
        assert_eq!(
            Cell::money(d("0.123456"), currency("USD")).write(),
            "0.123456"
        );
    }

    #[test]
    fn text_cells_are_neutralised_and_numbers_are_not() {
        assert_eq!(Cell::text("=C1").write(), "'=C1");
        assert_eq!(Cell::plain(Decimal::NEGATIVE_ONE).write(), "-1");
        assert_eq!(Cell::Null.write(), "");
    }

    #[test]
    fn the_header_is_focus_columns_in_order_then_taskledgers_own() {
        let body = month_csv(&november(), &MonthData::default(), &no_rates).unwrap();
        assert_eq!(String::from_utf8(body).unwrap(), COLUMNS.join(",") + "\n");
        let first_own = COLUMNS.iter().position(|c| c.starts_with("x_")).unwrap();
        assert!(COLUMNS[..first_own].is_sorted());
        assert!(COLUMNS[first_own..].iter().all(|c| c.starts_with("x_")));
    }

    #[test]
    fn rated_usage_is_priced_by_its_contract() {
        let vision = project("vision", "USD");
        let c1 = ContractTerms {
            provider: Some("lambda".to_owned()),
            region: Some("us-east-1".to_owned()),
            ..contract("C1", "2.50", "USD")
        };
        let line = UsageLine {
            gpu_seconds_busy: d("21600"),
            tasks: 2,
            ..usage(&vision, Some(&c1), "10", "25")
        };
        let row = only_row(&november(), &month_of_usage(&[&c1], vec![line]), &no_rates);
        let c1_id = c1.id.to_string();
        assert_cells(
            &row,
            &[
                ("BilledCost", "25.00"),
                ("EffectiveCost", "25.00"),
                ("ListCost", "25.00"),
                ("ContractedCost", "25.00"),
                ("ContractedUnitPrice", "2.50"),
                ("BillingAccountId", "taskledger"),
                ("BillingCurrency", "USD"),
                ("BillingPeriodStart", "2026-11-01T00:00:00Z"),
                ("BillingPeriodEnd", "2026-12-01T00:00:00Z"),
                ("ChargePeriodStart", "2026-11-01T00:00:00Z"),
                ("ChargePeriodEnd", "2026-12-01T00:00:00Z"),
                ("ChargeCategory", "Usage"),
                ("ChargeClass", ""),
                (
                    "ChargeDescription",
                    "H100 on_demand GPU time under contract C1",
                ),
                ("ChargeFrequency", "Usage-Based"),
                ("CommitmentDiscountId", ""),
                ("CommitmentDiscountStatus", ""),
                ("ConsumedQuantity", "10.0"),
                ("ConsumedUnit", "GPU-Hours"),
                ("PricingQuantity", "10.0"),
                ("PricingUnit", "GPU-Hours"),
                ("PricingCategory", "Standard"),
                ("PricingCurrency", "USD"),
                ("PricingCurrencyContractedUnitPrice", "2.50"),
                ("PricingCurrencyEffectiveCost", "25.00"),
                ("InvoiceId", "2026-11/projects/vision/USD"),
                ("InvoiceIssuerName", "lambda"),
                ("ProviderName", "lambda"),
                ("PublisherName", "lambda"),
                ("RegionId", "us-east-1"),
                ("RegionName", "us-east-1"),
                ("SubAccountId", "projects/vision"),
                ("SubAccountName", "vision"),
                ("SubAccountType", "Project"),
                ("x_BillingMode", "on_demand"),
                ("x_ContractId", &c1_id),
                ("x_ContractName", "C1"),
                ("x_GpuModel", "H100"),
                ("x_GpuSeconds", "36000"),
                ("x_GpuSecondsBusy", "21600"),
                ("x_TaskCount", "2"),
                ("x_UnratedGpuSeconds", "0"),
                ("x_UnratedReason", ""),
            ],
        );
    }

    #[test]
    fn spot_and_committed_usage_have_their_pricing_categories() {
        let vision = project("vision", "USD");
        let spot = contract("Spot", "1.20", "USD");
        let c4 = reserved(
            "C4",
            "1.00",
            "2",
            "2026-11-01T00:00:00Z",
            "2026-12-01T00:00:00Z",
        );
        let spot_line = UsageLine {
            billing_mode: "spot".to_owned(),
            ..usage(&vision, Some(&spot), "1", "1.2")
        };
        let committed_line = UsageLine {
            gpu_model: "A100".to_owned(),
            billing_mode: "reserved".to_owned(),
            ..usage(&vision, Some(&c4), "10", "10")
        };
        let data = month_of_usage(&[&spot, &c4], vec![spot_line, committed_line]);
        let rows = rows(&november(), &data, &no_rates);
        let c4_id = c4.id.to_string();
        assert_cells(
            &rows[0],
            &[
                ("x_ContractName", "C4"),
                ("PricingCategory", "Committed"),
                ("CommitmentDiscountCategory", "Usage"),
                ("CommitmentDiscountId", &c4_id),
                ("CommitmentDiscountName", "C4"),
                ("CommitmentDiscountQuantity", "10.0"),
                ("CommitmentDiscountStatus", "Used"),
                ("CommitmentDiscountType", "Reserved GPUs"),
                ("CommitmentDiscountUnit", "GPU-Hours"),
                ("ChargeFrequency", "Usage-Based"),
            ],
        );
        assert_cells(
            &rows[1],
            &[
                ("x_ContractName", "Spot"),
                ("PricingCategory", "Dynamic"),
                ("CommitmentDiscountStatus", ""),
            ],
        );
    }

    #[test]
    fn usage_without_a_contract_is_kept_at_no_cost() {
        let vision = project("vision", "USD");
        let line = UsageLine {
            gpu_model: "B200".to_owned(),
            ..unrated(usage(&vision, None, "1", "0"), "no_contract")
        };
        let row = only_row(&november(), &month_of_usage(&[], vec![line]), &no_rates);
        assert_cells(
            &row,
            &[
                ("BilledCost", "0.00"),
                ("ContractedUnitPrice", "0.00"),
                (
                    "ChargeDescription",
                    "B200 on_demand GPU time, with no contract: not rated, no cost",
                ),
                ("ConsumedQuantity", "1.0"),
                ("PricingQuantity", "0.0"),
                ("PricingCurrency", "USD"),
                ("PricingCurrencyContractedUnitPrice", "0.00"),
                ("PricingCurrencyEffectiveCost", "0.00"),
                ("ProviderName", DEFAULT_PROVIDER),
                ("RegionId", ""),
                ("x_ContractId", ""),
                ("x_ContractName", ""),
                ("x_GpuSeconds", "3600"),
                ("x_UnratedGpuSeconds", "3600"),
                ("x_UnratedReason", "no_contract"),
            ],
        );
    }

    #[test]
    fn usage_without_an_fx_rate_names_the_rate_it_lacks() {
        let vision = project("vision", "USD");
        let euro = contract("Euro", "3.00", "EUR");
        let line = unrated(usage(&vision, Some(&euro), "2", "0"), "no_fx_rate");
        let row = only_row(
            &november(),
            &month_of_usage(&[&euro], vec![line]),
            &no_rates,
        );
        assert_cells(
            &row,
            &[
                ("BilledCost", "0.00"),
                ("BillingCurrency", "USD"),
                ("ContractedUnitPrice", "0.00"),
                (
                    "ChargeDescription",
                    "H100 on_demand GPU time under contract Euro, with no EUR to USD FX rate \
                     for the month: not rated, no cost",
                ),
                ("PricingCurrency", "EUR"),
                ("PricingCurrencyContractedUnitPrice", "3.00"),
                ("PricingCurrencyEffectiveCost", "0.00"),
                ("PricingQuantity", "0.0"),
                ("x_ContractName", "Euro"),
                ("x_UnratedGpuSeconds", "7200"),
                ("x_UnratedReason", "no_fx_rate"),
            ],
        );
    }

    #[test]
    fn usage_priced_in_another_currency_is_billed_in_the_projects() {
        let search = project("search", "EUR");
        let owned = contract("Owned", "2.00", "USD");
        let line = usage(&search, Some(&owned), "4", "7.20");
        let data = month_of_usage(&[&owned], vec![line]);
        let row = only_row(&november(), &data, &usd_to_eur_in_november);
        assert_cells(
            &row,
            &[
                ("BillingCurrency", "EUR"),
                ("BilledCost", "7.20"),
                ("ContractedUnitPrice", "1.80"),
                ("PricingCurrency", "USD"),
                ("PricingCurrencyContractedUnitPrice", "2.00"),
                ("PricingCurrencyEffectiveCost", "8.00"),
                ("InvoiceId", "2026-11/projects/search/EUR"),
            ],
        );
    }

    #[test]
    fn rated_usage_needs_its_contract_and_its_fx_rate() {
        let search = project("search", "EUR");
        let owned = contract("Owned", "2.00", "USD");
        let line = usage(&search, Some(&owned), "4", "7.20");

        let unknown = month_of_usage(&[], vec![line.clone()]);
        assert!(matches!(
            month_csv(&november(), &unknown, &usd_to_eur_in_november),
            Err(FocusError::RatedWithoutContract)
        ));

        let without_rate = month_of_usage(&[&owned], vec![line]);
        let error = month_csv(&november(), &without_rate, &no_rates).unwrap_err();
        assert!(
            matches!(error, FocusError::RatedWithoutFxRate { contract, currency }
                if contract == owned.id && currency.code() == "EUR"),
            "{error}"
        );
    }

    #[test]
    fn unused_commitment_of_a_scoped_contract_is_billed_to_its_project_in_its_currency() {
        let owned = ContractTerms {
            project: Some("search".to_owned()),
            provider: Some("on-prem".to_owned()),
            ..reserved(
                "Owned",
                "2.00",
                "1",
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
            )
        };
        let owned_id = owned.id.to_string();
        let data = month_of_commitment(
            owned,
            Some(project("search", "EUR")),
            one_gpu_for("2026-11-01T00:00:00Z", 4),
        );
        let row = only_row(&november(), &data, &usd_to_eur_in_november);
        assert_cells(
            &row,
            &[
                ("SubAccountId", "projects/search"),
                ("SubAccountType", "Project"),
                ("BillingCurrency", "EUR"),
                ("BilledCost", "36.00"),
                ("ContractedUnitPrice", "1.80"),
                ("PricingCurrency", "USD"),
                ("PricingCurrencyContractedUnitPrice", "2.00"),
                ("PricingCurrencyEffectiveCost", "40.00"),
                ("PricingQuantity", "20.0"),
                ("PricingCategory", "Committed"),
                (
                    "ChargeDescription",
                    "Unused commitment of contract Owned: 1 A100 GPUs reserved",
                ),
                ("ChargeFrequency", "Recurring"),
                ("CommitmentDiscountId", &owned_id),
                ("CommitmentDiscountQuantity", "20.0"),
                ("CommitmentDiscountStatus", "Unused"),
                ("ConsumedQuantity", ""),
                ("ConsumedUnit", ""),
                ("InvoiceId", "2026-11/projects/search/EUR"),
                ("ProviderName", "on-prem"),
                ("x_BillingMode", "reserved"),
                ("x_GpuModel", "A100"),
                ("x_GpuSeconds", "0"),
                ("x_TaskCount", "0"),
                ("x_UnratedGpuSeconds", "0"),
            ],
        );
    }

    #[test]
    fn unused_commitment_of_an_unscoped_contract_is_shared_in_the_contracts_currency() {
        let c4 = reserved(
            "C4",
            "1.00",
            "2",
            "2026-11-01T00:00:00Z",
            "2026-12-01T00:00:00Z",
        );
        let data = month_of_commitment(c4, None, one_gpu_for("2026-11-01T00:00:00Z", 10));
        let row = only_row(&november(), &data, &no_rates);
        assert_cells(
            &row,
            &[
                ("SubAccountId", "shared"),
                ("SubAccountName", "shared"),
                ("SubAccountType", "Shared"),
                ("BillingCurrency", "USD"),
                ("InvoiceId", "2026-11/shared/USD"),
                ("BilledCost", "1430.00"),
                ("PricingQuantity", "1430.0"),
                (
                    "ChargeDescription",
                    "Unused commitment of contract C4: 2 A100 GPUs reserved",
                ),
            ],
        );
    }

    #[test]
    fn unused_commitment_without_an_fx_rate_is_kept_at_no_cost() {
        let owned = ContractTerms {
            project: Some("search".to_owned()),
            ..reserved(
                "Owned",
                "2.00",
                "1",
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
            )
        };
        let data = month_of_commitment(owned, Some(project("search", "EUR")), Vec::new());
        let row = only_row(&november(), &data, &no_rates);
        assert_cells(
            &row,
            &[
                ("BilledCost", "0.00"),
                ("ContractedUnitPrice", "0.00"),
                ("PricingCurrencyEffectiveCost", "0.00"),
                ("PricingQuantity", "0.0"),
                ("CommitmentDiscountQuantity", "24.0"),
                (
                    "ChargeDescription",
                    "Unused commitment of contract Owned: 1 A100 GPUs reserved, with no USD \
                     to EUR FX rate for the month: not rated, no cost",
                ),
                ("x_UnratedGpuSeconds", "86400"),
                ("x_UnratedReason", "no_fx_rate"),
            ],
        );
    }

    #[test]
    fn a_fully_used_commitment_has_no_row() {
        let owned = reserved(
            "Owned",
            "2.00",
            "1",
            "2026-11-01T00:00:00Z",
            "2026-11-02T00:00:00Z",
        );
        let data = month_of_commitment(owned, None, one_gpu_for("2026-11-01T00:00:00Z", 24));
        assert!(rows(&november(), &data, &no_rates).is_empty());
    }

    #[test]
    fn commitment_accrues_up_to_now_in_a_month_in_progress() {
        let november = Month::parse("2026-11").unwrap();
        let now = utc("2026-11-01T06:00:00Z");
        let in_progress = BillingPeriod::new(november, now, UTC);
        assert_eq!(
            in_progress.accrual(),
            Some((utc("2026-11-01T00:00:00Z"), now))
        );
        let ahead = BillingPeriod::new(november.next(), now, UTC);
        assert_eq!(ahead.accrual(), None);

        let c4 = reserved(
            "C4",
            "1.00",
            "1",
            "2026-11-01T00:00:00Z",
            "2026-12-01T00:00:00Z",
        );
        let data = month_of_commitment(c4, None, Vec::new());
        let row = only_row(&in_progress, &data, &no_rates);
        assert_cells(
            &row,
            &[
                ("BilledCost", "6.00"),
                ("PricingQuantity", "6.0"),
                ("BillingPeriodEnd", "2026-12-01T00:00:00Z"),
            ],
        );
    }

    #[test]
    fn rows_are_ordered_by_sub_account_then_usage_rated_first_then_contract() {
        let alpha = project("alpha", "USD");
        let beta = project("beta", "USD");
        let a = contract("A", "1.00", "USD");
        let z = contract("Z", "1.00", "USD");
        let beta_reserved = ContractTerms {
            project: Some("beta".to_owned()),
            ..reserved(
                "M",
                "1.00",
                "1",
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
            )
        };
        let unscoped = reserved(
            "B",
            "1.00",
            "1",
            "2026-11-01T00:00:00Z",
            "2026-11-02T00:00:00Z",
        );
        let data = MonthData {
            commitments: vec![
                CommittedContract {
                    contract: unscoped,
                    project: None,
                },
                CommittedContract {
                    contract: beta_reserved,
                    project: Some(beta.clone()),
                },
            ],
            ..month_of_usage(
                &[&a, &z],
                vec![
                    unrated(usage(&beta, None, "1", "0"), "no_contract"),
                    usage(&beta, Some(&z), "1", "1"),
                    usage(&alpha, Some(&z), "1", "1"),
                    usage(&beta, Some(&a), "1", "1"),
                ],
            )
        };
        let order: Vec<(String, String, String)> = rows(&november(), &data, &no_rates)
            .into_iter()
            .map(|row| {
                (
                    row["SubAccountId"].clone(),
                    row["x_ContractName"].clone(),
                    row["CommitmentDiscountStatus"].clone() + &row["x_UnratedReason"],
                )
            })
            .collect();
        let expected = [
            ("projects/alpha", "Z", ""),
            ("projects/beta", "A", ""),
            ("projects/beta", "Z", ""),
            ("projects/beta", "", "no_contract"),
            ("projects/beta", "M", "Unused"),
            ("shared", "B", "Unused"),
        ]
        .map(|(sub_account, contract, status)| {
            (
                sub_account.to_owned(),
                contract.to_owned(),
                status.to_owned(),
            )
        });
        assert_eq!(order, expected);
    }

    #[test]
    fn names_cannot_become_formulas() {
        let evil = ProjectAccount {
            name: "=HYPERLINK(\"http://x\")".to_owned(),
            ..project("evil", "USD")
        };
        let sum = ContractTerms {
            provider: Some("@provider".to_owned()),
            region: Some("-1".to_owned()),
            ..contract("+SUM(1)", "2.00", "USD")
        };
        let line = usage(&evil, Some(&sum), "1", "2");
        let row = only_row(&november(), &month_of_usage(&[&sum], vec![line]), &no_rates);
        assert_cells(
            &row,
            &[
                ("SubAccountName", "'=HYPERLINK(\"http://x\")"),
                ("x_ContractName", "'+SUM(1)"),
                ("ProviderName", "'@provider"),
                ("RegionId", "'-1"),
                (
                    "ChargeDescription",
                    "H100 on_demand GPU time under contract +SUM(1)",
                ),
                ("BilledCost", "2.00"),
            ],
        );
    }
}
