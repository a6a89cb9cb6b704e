//! Prices applied when a figure is read (COST_MODEL §1.7). What rating stores is
//! card-seconds per contract (migration 0014); a statement that reads money joins its rows,
//! summed per contract and ledger month, to the contract, the project and the month's FX
//! rate, and multiplies. Reading contracts and rates in the statement that reads the rows
//! means a figure never mixes prices from before and after a change.
//!
//! A row is unrated when no contract prices it (`no_contract`) or when its contract's
//! currency has no rate into the project's for the month (`no_fx_rate`). What-if prices
//! ([`WhatIf`]) replace a contract's price, or price a model and billing mode outright, for
//! one statement.

use crate::domain::figures::SUM_SCALE;
use crate::domain::what_if::WhatIf;
use crate::store::binder::Binder;
use crate::store::rollups::PricedSum;

/// Divides by 3600 keeping 24 decimal places, far below any digit a figure shows.
pub const PER_HOUR: &str = "3600.000000000000000000000000";

/// `round(Σ seconds × price ÷ 3600, SUM_SCALE) AS name` over rows with a `price` column
/// (null where unrated, which adds nothing): the products are summed exactly and divided
/// once, so a figure is one division however many rows it sums. Prices GPU time only, with
/// the power part of an owned card's price estimated (see [`summed_priced`] for money).
pub fn summed_money(seconds: &str, name: &str) -> String {
    format!("round(coalesce(sum({seconds} * price), 0) / {PER_HOUR}, {SUM_SCALE}) AS {name}")
}

/// A money figure over rows with the columns of [`PriceJoin::columns`] and the sums of
/// `sum`: the card-seconds at the price, with measured energy in place of the power part of
/// an owned card's price (COST_MODEL §10), summed exactly and divided once.
pub fn summed_priced(sum: &PricedSum) -> String {
    format!(
        "round(coalesce({money}, 0) / {PER_HOUR}, {SUM_SCALE}) AS {name}",
        money = sum.summed_times_3600(),
        name = sum.money,
    )
}

/// The joins that price rows aliased `row`, which have `project_id`, `contract_id`, `month`
/// (the first day of a ledger month) and, for rows no contract prices, `gpu_model` and
/// `billing_mode`; with the expressions over them.
pub struct PriceJoin {
    joins: String,
    price: String,
    /// A condition true where a what-if price replaced the contract's.
    replaced: Vec<&'static str>,
    row: String,
}

impl PriceJoin {
    /// Prices the rows `row` at the prices in force, replaced where `what_if` says.
    pub fn new(binder: &mut Binder, what_if: &WhatIf, row: &str) -> Self {
        let mut joins = format!(
            "LEFT JOIN contracts pc ON pc.id = {row}.contract_id \
             JOIN projects pp ON pp.id = {row}.project_id \
             LEFT JOIN fx_rates px ON px.month = {row}.month \
                 AND px.from_currency = pc.currency AND px.to_currency = pp.currency"
        );
        let mut replaced = Vec::new();
        let contract_price = match what_if.contracts.is_empty() {
            true => "pc.price_per_gpu_hour".to_owned(),
            false => {
                let (ids, prices): (Vec<_>, Vec<_>) = what_if.contracts.iter().unzip();
                joins.push_str(&format!(
                    " LEFT JOIN UNNEST({ids}::uuid[], {prices}::numeric[]) AS pw(id, price) \
                          ON pw.id = {row}.contract_id",
                    ids = binder.bind(ids.into_iter().copied().collect::<Vec<_>>()),
                    prices = binder.bind(prices.into_iter().copied().collect::<Vec<_>>()),
                ));
                replaced.push("pw.price IS NOT NULL");
                "coalesce(pw.price, pc.price_per_gpu_hour)".to_owned()
            }
        };
        let converted = format!(
            "CASE WHEN pc.id IS NULL THEN NULL \
                  WHEN pc.currency = pp.currency THEN {contract_price} \
                  ELSE {contract_price} * px.rate END"
        );
        let price = match what_if.kinds.is_empty() {
            true => converted,
            false => {
                let models: Vec<&str> = what_if.kinds.keys().map(|k| k.0.as_str()).collect();
                let modes: Vec<&str> = what_if.kinds.keys().map(|k| k.1.as_str()).collect();
                let prices: Vec<_> = what_if.kinds.values().copied().collect();
                joins.push_str(&format!(
                    " LEFT JOIN UNNEST({models}::text[], {modes}::text[], {prices}::numeric[]) \
                          AS pk(gpu_model, billing_mode, price) \
                          ON pk.gpu_model = coalesce(pc.gpu_model, {row}.gpu_model) \
                         AND pk.billing_mode = coalesce(pc.billing_mode, {row}.billing_mode)",
                    models = binder.bind(models),
                    modes = binder.bind(modes),
                    prices = binder.bind(prices),
                ));
                replaced.push("pk.price IS NOT NULL");
                format!("coalesce(pk.price, {converted})")
            }
        };
        Self {
            joins,
            price,
            replaced,
            row: row.to_owned(),
        }
    }

    /// One of the contract's energy prices (`power_price_per_gpu_hour` or
    /// `energy_price_per_kwh`) in the project's currency: 0 where no contract prices the row
    /// or a what-if price replaced the contract's (a flat price has no power part).
    fn energy_price(&self, column: &str) -> String {
        let replaced = match self.replaced.is_empty() {
            true => String::new(),
            false => format!("WHEN {} THEN 0 ", self.replaced.join(" OR ")),
        };
        format!(
            "CASE {replaced}WHEN pc.id IS NULL THEN 0 \
                  WHEN pc.currency = pp.currency THEN pc.{column} \
                  ELSE coalesce(pc.{column} * px.rate, 0) END"
        )
    }

    /// The joins, to follow the rows in a `FROM` clause.
    pub fn joins(&self) -> &str {
        &self.joins
    }

    /// The price per GPU-hour in the project's currency; null where the row is unrated.
    /// Select it once as `price`, for [`summed_money`].
    pub fn price(&self) -> &str {
        &self.price
    }

    /// The columns a priced row set selects from its row and the joins: `price`,
    /// `power_price` and `energy_price` (which [`summed_priced`] reads), and
    /// `priced_by_contract` and `priced_model`, which [`UNRATED_REASON`] and
    /// [`UNRATED_MODEL`] read. The prices are worked out once a row.
    pub fn columns(&self) -> String {
        format!(
            "{prices}, pc.id IS NOT NULL AS priced_by_contract, \
             coalesce(pc.gpu_model, {row}.gpu_model) AS priced_model",
            prices = self.prices(),
            row = self.row,
        )
    }

    /// `price`, `power_price` and `energy_price`, and `energy_priced`, whether either of the
    /// last two is not zero: what [`summed_priced`] reads.
    pub fn prices(&self) -> String {
        let power = self.energy_price("power_price_per_gpu_hour");
        let energy = self.energy_price("energy_price_per_kwh");
        format!(
            "{price} AS price, {power} AS power_price, {energy} AS energy_price, \
             ({power}) <> 0 OR ({energy}) <> 0 AS energy_priced",
            price = self.price,
        )
    }
}

/// Why a priced row (of [`PriceJoin::columns`]) is unrated, or null.
pub const UNRATED_REASON: &str = "CASE WHEN price IS NOT NULL THEN NULL \
     WHEN priced_by_contract THEN 'no_fx_rate' ELSE 'no_contract' END";

/// The GPU model of an unrated priced row, or null.
pub const UNRATED_MODEL: &str = "CASE WHEN price IS NULL THEN priced_model END";
