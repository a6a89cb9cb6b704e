//! A contract's terms as a client gives them: parsed whole when a contract is created, and
//! changed field by field, each bad field reported at its pointer.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use crate::domain::rating::BillingMode;
use crate::domain::tco::{NewTco, Phase, PriceParts, Tco};
use crate::domain::validation::Violations;
use crate::domain::values::{self, Currency, ProjectId};

/// The longest contract name.
pub const NAME_CHARS: usize = 200;
/// The longest GPU model, provider or region a contract names.
pub const SCOPE_CHARS: usize = 100;

/// A contract's terms, as created or after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractTerms {
    pub name: String,
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    pub price_per_gpu_hour: Decimal,
    pub currency: String,
    pub valid_from: DateTime<Utc>,
    pub valid_until: Option<DateTime<Utc>>,
    pub project_id: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub committed_gpus: Option<Decimal>,
    /// Set: an owned card's contract, whose price follows from what the card costs (its
    /// price while the card depreciates is `price_per_gpu_hour`).
    pub tco: Option<Tco>,
}

impl ContractTerms {
    /// The contract's prices in time order: one, or two for a TCO contract whose card's
    /// life ends inside its validity.
    pub fn phases(&self) -> Vec<Phase> {
        match &self.tco {
            Some(tco) => tco.phases(self.valid_from, self.valid_until),
            None => vec![Phase {
                from: self.valid_from,
                until: self.valid_until,
                parts: PriceParts {
                    depreciation: Decimal::ZERO,
                    other: self.price_per_gpu_hour,
                    power: Decimal::ZERO,
                },
            }],
        }
    }

    /// When the depreciation part of a TCO contract's price ends.
    pub fn depreciated_from(&self) -> Option<DateTime<Utc>> {
        self.tco.as_ref().map(Tco::depreciated_from)
    }
}

/// A new contract as given, before it is read.
#[derive(Debug, Clone, Default)]
pub struct NewContract<'a> {
    pub name: &'a str,
    pub gpu_model: &'a str,
    pub billing_mode: &'a str,
    pub price_per_gpu_hour: Option<Decimal>,
    pub tco: Option<NewTco<'a>>,
    pub currency: &'a str,
    pub valid_from: &'a str,
    pub valid_until: Option<&'a str>,
    pub project: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub region: Option<&'a str>,
    pub committed_gpus: Option<Decimal>,
}

impl NewContract<'_> {
    /// The terms, when every field reads, and what is wrong (`/name`, `/currency`, …); the
    /// project it is scoped to is given apart, for the ledger to check it exists.
    pub fn parse(&self) -> (Option<ContractTerms>, Option<ProjectId>, Violations) {
        let mut v = Violations::default();
        let name = v.check("/name", values::bounded_text(self.name, NAME_CHARS));
        let gpu_model = v.check(
            "/gpu_model",
            values::bounded_text(self.gpu_model, SCOPE_CHARS),
        );
        let billing_mode = v.check(
            "/billing_mode",
            BillingMode::parse(self.billing_mode)
                .ok_or_else(|| "use on_demand, spot or reserved".to_owned()),
        );
        let priced = match (self.price_per_gpu_hour, &self.tco) {
            (Some(price), None) => v
                .check("/price_per_gpu_hour", values::positive(price))
                .map(|price| (price, None)),
            (None, Some(tco)) => tco
                .parse("/tco", None, &mut v)
                .map(|tco| (tco.parts().total(), Some(tco))),
            (Some(_), Some(_)) => {
                v.push(
                    "/tco",
                    "give either price_per_gpu_hour or tco: a TCO contract's price follows from it",
                );
                None
            }
            (None, None) => {
                v.push(
                    "/price_per_gpu_hour",
                    "required, unless the contract is priced by its tco",
                );
                None
            }
        };
        let currency = v.check("/currency", Currency::parse(self.currency));
        let valid_from = v.check("/valid_from", values::parse_instant(self.valid_from));
        let valid_until = self
            .valid_until
            .map(|raw| v.check("/valid_until", values::parse_instant(raw)));
        let project = self
            .project
            .and_then(|raw| v.check("/project", ProjectId::parse(raw)));
        let provider = scope_text(&mut v, "/provider", self.provider);
        let region = scope_text(&mut v, "/region", self.region);
        let committed_gpus = self
            .committed_gpus
            .map(|gpus| v.check("/committed_gpus", values::positive(gpus)));
        let terms = match (name, gpu_model, billing_mode, priced, currency, valid_from) {
            (
                Some(name),
                Some(gpu_model),
                Some(billing_mode),
                Some((price, tco)),
                Some(currency),
                Some(valid_from),
            ) => Some(ContractTerms {
                name,
                gpu_model,
                billing_mode,
                price_per_gpu_hour: price,
                currency: currency.code().to_owned(),
                valid_from,
                valid_until: valid_until.flatten(),
                project_id: project.as_ref().map(|p| p.as_str().to_owned()),
                provider,
                region,
                committed_gpus: committed_gpus.flatten(),
                tco,
            }),
            _ => None,
        };
        (terms, project, v)
    }
}

/// Fields to change; the model, mode and scope of a contract never change. `Some(None)` makes
/// `valid_until` open-ended, removes `committed_gpus`, or turns a TCO contract into one with
/// a price (which must then be given).
#[derive(Debug, Clone, Default)]
pub struct ContractChange<'a> {
    pub name: Option<&'a str>,
    pub price_per_gpu_hour: Option<Decimal>,
    /// The TCO fields to change (over the contract's own; all required when it has none).
    pub tco: Option<Option<NewTco<'a>>>,
    pub currency: Option<&'a str>,
    pub valid_from: Option<&'a str>,
    pub valid_until: Option<Option<&'a str>>,
    pub committed_gpus: Option<Option<Decimal>>,
}

impl ContractChange<'_> {
    /// The terms with the valid fields of this change applied, and what is invalid in it.
    pub fn apply(&self, old: &ContractTerms) -> (ContractTerms, Violations) {
        let mut new = old.clone();
        let mut v = Violations::default();
        if let Some(name) = self.name
            && let Some(name) = v.check("/name", values::bounded_text(name, NAME_CHARS))
        {
            new.name = name;
        }
        match (&self.tco, self.price_per_gpu_hour) {
            (Some(Some(_)), Some(_)) => v.push(
                "/tco",
                "give either price_per_gpu_hour or tco: a TCO contract's price follows from it",
            ),
            (Some(Some(tco)), None) => {
                if let Some(tco) = tco.parse("/tco", old.tco.as_ref(), &mut v) {
                    new.price_per_gpu_hour = tco.parts().total();
                    new.tco = Some(tco);
                }
            }
            (Some(None), None) if old.tco.is_some() => v.push(
                "/price_per_gpu_hour",
                "required when the contract stops being priced by its tco",
            ),
            (None, Some(_)) if old.tco.is_some() => v.push(
                "/price_per_gpu_hour",
                "this contract is priced by its tco: change the tco, or set it to null with a price",
            ),
            (Some(None) | None, price) => {
                if let Some(price) = price
                    && let Some(price) = v.check("/price_per_gpu_hour", values::positive(price))
                {
                    new.price_per_gpu_hour = price;
                    new.tco = None;
                }
            }
        }
        if let Some(currency) = self.currency
            && let Some(currency) = v.check("/currency", Currency::parse(currency))
        {
            new.currency = currency.code().to_owned();
        }
        if let Some(from) = self.valid_from
            && let Some(from) = v.check("/valid_from", values::parse_instant(from))
        {
            new.valid_from = from;
        }
        match self.valid_until {
            Some(Some(until)) => {
                if let Some(until) = v.check("/valid_until", values::parse_instant(until)) {
                    new.valid_until = Some(until);
                }
            }
            Some(None) => new.valid_until = None,
            None => {}
        }
        match self.committed_gpus {
            Some(Some(gpus)) => {
                if let Some(gpus) = v.check("/committed_gpus", values::positive(gpus)) {
                    new.committed_gpus = Some(gpus);
                }
            }
            Some(None) => new.committed_gpus = None,
            None => {}
        }
        (new, v)
    }
}

fn scope_text(v: &mut Violations, pointer: &str, raw: Option<&str>) -> Option<String> {
    raw.and_then(|text| v.check(pointer, values::bounded_text(text, SCOPE_CHARS)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given() -> NewContract<'static> {
        NewContract {
            name: "H100 on demand",
            gpu_model: "H100",
            billing_mode: "on_demand",
            price_per_gpu_hour: Some(Decimal::new(250, 2)),
            currency: "USD",
            valid_from: "2026-11-01T00:00:00Z",
            ..NewContract::default()
        }
    }

    #[test]
    fn a_new_contract_reads_whole_or_names_each_bad_field() {
        let (terms, project, v) = given().parse();
        assert!(v.is_empty());
        assert_eq!(project, None);
        let terms = terms.unwrap();
        assert_eq!(terms.currency, "USD");
        assert_eq!(terms.billing_mode, BillingMode::OnDemand);
        let bad = NewContract {
            billing_mode: "monthly",
            price_per_gpu_hour: Some(Decimal::ZERO),
            valid_until: Some("tomorrow"),
            ..given()
        };
        let (terms, _, v) = bad.parse();
        assert!(terms.is_none());
        let pointers: Vec<String> = v.into_vec().into_iter().map(|e| e.pointer).collect();
        assert_eq!(
            pointers,
            ["/billing_mode", "/price_per_gpu_hour", "/valid_until"]
        );
    }

    #[test]
    fn a_change_applies_its_valid_fields_and_clears_what_it_sets_to_null() {
        let (old, _, _) = NewContract {
            valid_until: Some("2026-12-01T00:00:00Z"),
            committed_gpus: Some(Decimal::from(8)),
            ..given()
        }
        .parse();
        let old = old.unwrap();
        let change = ContractChange {
            price_per_gpu_hour: Some(Decimal::new(199, 2)),
            currency: Some("euro"),
            valid_until: Some(None),
            committed_gpus: Some(None),
            ..ContractChange::default()
        };
        let (new, v) = change.apply(&old);
        assert_eq!(new.price_per_gpu_hour, Decimal::new(199, 2));
        assert_eq!(
            new.currency, "USD",
            "an invalid currency leaves the old one"
        );
        assert_eq!(new.valid_until, None);
        assert_eq!(new.committed_gpus, None);
        let pointers: Vec<String> = v.into_vec().into_iter().map(|e| e.pointer).collect();
        assert_eq!(pointers, ["/currency"]);
    }
}
