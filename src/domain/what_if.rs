//! What-if prices (COST_MODEL §12): a cost query, task list or report may be answered as if
//! some contracts had other prices, or as if a model and billing mode were priced at one
//! price. Nothing is stored; the answer says it is hypothetical and which prices it used.
//!
//! A contract's override is in the contract's own currency (converted like its price). A
//! model-and-mode price is in the currency of the project whose figures it prices, and
//! applies to every GPU-hour of that model and mode, whichever contract priced it and also
//! where none did: as if it were the only contract for them.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::rating::BillingMode;

/// The prices a figure is read with in place of those in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WhatIf {
    pub contracts: BTreeMap<Uuid, Decimal>,
    pub kinds: BTreeMap<(String, BillingMode), Decimal>,
}

/// One override as the answer names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PriceOverride {
    /// The contract whose price is replaced; null for a model-and-mode price.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub contract: Option<Uuid>,
    pub gpu_model: Option<String>,
    #[schema(value_type = Option<String>)]
    pub billing_mode: Option<BillingMode>,
    /// Per GPU-hour: in the contract's currency, or in the project's for a model and mode.
    #[schema(value_type = String)]
    pub price_per_gpu_hour: Decimal,
}

impl WhatIf {
    pub fn is_empty(&self) -> bool {
        self.contracts.is_empty() && self.kinds.is_empty()
    }

    /// Parses one `what_if` value: `<contract id>:<price>` or `<gpu_model>/<billing_mode>:<price>`,
    /// the price a positive decimal. A second price for the same contract or kind is refused.
    pub fn add(&mut self, raw: &str) -> Result<(), String> {
        let (target, price) = raw.rsplit_once(':').ok_or_else(|| {
            format!(
                "`{raw}` is not `<contract id>:<price>` or `<gpu_model>/<billing_mode>:<price>`"
            )
        })?;
        let price: Decimal = price
            .trim()
            .parse()
            .map_err(|_| format!("`{price}` is not a decimal price"))?;
        if price <= Decimal::ZERO {
            return Err(format!("price `{price}` must be greater than zero"));
        }
        let price = price.normalize();
        let duplicate = || format!("`{target}` is given more than one price");
        if let Ok(contract) = Uuid::parse_str(target) {
            return match self.contracts.insert(contract, price) {
                None => Ok(()),
                Some(_) => Err(duplicate()),
            };
        }
        let (model, mode) = target.split_once('/').ok_or_else(|| {
            format!("`{target}` is neither a contract id nor `<gpu_model>/<billing_mode>`")
        })?;
        let mode = BillingMode::parse(mode)
            .ok_or_else(|| format!("`{mode}` is not a billing mode (on_demand, spot, reserved)"))?;
        if model.is_empty() {
            return Err("the GPU model is empty".to_owned());
        }
        match self.kinds.insert((model.to_owned(), mode), price) {
            None => Ok(()),
            Some(_) => Err(duplicate()),
        }
    }

    /// The overrides, contracts first, as an answer lists them.
    pub fn overrides(&self) -> Vec<PriceOverride> {
        let contracts = self.contracts.iter().map(|(&id, &price)| PriceOverride {
            contract: Some(id),
            gpu_model: None,
            billing_mode: None,
            price_per_gpu_hour: price,
        });
        let kinds = self
            .kinds
            .iter()
            .map(|((model, mode), &price)| PriceOverride {
                contract: None,
                gpu_model: Some(model.clone()),
                billing_mode: Some(*mode),
                price_per_gpu_hour: price,
            });
        contracts.chain(kinds).collect()
    }

    /// The price a contract of `gpu_model` and `billing_mode` is read with, if overridden:
    /// a model-and-mode price (in the project's currency) wins over the contract's own.
    pub fn contract_price(
        &self,
        id: Uuid,
        gpu_model: &str,
        billing_mode: BillingMode,
    ) -> Option<Override> {
        if let Some(&price) = self.kinds.get(&(gpu_model.to_owned(), billing_mode)) {
            return Some(Override::InProjectCurrency(price));
        }
        self.contracts
            .get(&id)
            .map(|&price| Override::InContractCurrency(price))
    }
}

/// An overriding price and the currency it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    InContractCurrency(Decimal),
    InProjectCurrency(Decimal),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_and_kind_prices_parse() {
        let mut what_if = WhatIf::default();
        what_if
            .add("6f9619ff-8b86-d011-b42d-00c04fc964ff:2.50")
            .expect("a contract price");
        what_if.add("H100/spot:1.1").expect("a kind price");
        assert_eq!(what_if.contracts.len(), 1);
        assert_eq!(
            what_if.kinds.get(&("H100".to_owned(), BillingMode::Spot)),
            Some(&Decimal::new(11, 1))
        );
        assert_eq!(what_if.overrides().len(), 2);
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for (raw, says) in [
            ("H100/spot", "is not `<contract id>"),
            ("H100/spot:abc", "not a decimal"),
            ("H100/spot:0", "greater than zero"),
            ("H100/hourly:2", "not a billing mode"),
            ("H100:2", "neither a contract id"),
            ("/spot:2", "model is empty"),
        ] {
            let error = WhatIf::default().add(raw).expect_err(raw);
            assert!(error.contains(says), "{raw}: {error}");
        }
        let mut what_if = WhatIf::default();
        what_if.add("A100/on_demand:1").expect("first");
        assert!(what_if.add("A100/on_demand:2").is_err());
    }

    #[test]
    fn a_kind_price_wins_over_a_contract_price() {
        let id = Uuid::from_u128(7);
        let mut what_if = WhatIf::default();
        what_if.add(&format!("{id}:3")).expect("contract");
        assert_eq!(
            what_if.contract_price(id, "H100", BillingMode::OnDemand),
            Some(Override::InContractCurrency(Decimal::from(3)))
        );
        what_if.add("H100/on_demand:4").expect("kind");
        assert_eq!(
            what_if.contract_price(id, "H100", BillingMode::OnDemand),
            Some(Override::InProjectCurrency(Decimal::from(4)))
        );
    }
}
