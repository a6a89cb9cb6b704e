//! A cloud bill's charges as the ledger keeps them, whichever export they were read from:
//! one row per charge, grouped into statements (one provider's account in one billing
//! period), and the rules that tie a charged resource to a node.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use super::instance_types::GpuInstance;
use super::rating::BillingMode;

/// One charge of a bill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BillRow {
    /// The row's number in the file, the header being row 1.
    pub line: u64,
    pub provider: String,
    /// `BillingAccountId`; empty when the export leaves it out.
    pub billing_account: String,
    pub billing_period_start: DateTime<Utc>,
    /// `Usage`, `Purchase`, `Tax`, `Credit`, `Adjustment`.
    pub charge_category: String,
    pub charge_from: DateTime<Utc>,
    pub charge_until: DateTime<Utc>,
    pub billed_cost: Decimal,
    pub currency: String,
    pub resource_id: Option<String>,
    pub service: String,
    /// `SkuId`; empty when the row has none.
    pub sku: String,
    pub region: Option<String>,
    /// From `PricingCategory`: `Dynamic` is spot, `Committed` reserved, else on demand.
    pub billing_mode: BillingMode,
    /// The hours the resource ran in the charge period, when the row counts them
    /// (`ConsumedUnit` in hours).
    pub consumed_hours: Option<Decimal>,
    /// The GPU instance type the row names, when it names one of the catalogue.
    pub instance: Option<&'static GpuInstance>,
}

impl BillRow {
    /// The statement the row belongs to: one provider's account in one billing period. A
    /// bill posted again for a statement replaces what was stored for it.
    pub fn statement(&self) -> Statement {
        Statement {
            provider: self.provider.clone(),
            billing_account: self.billing_account.clone(),
            billing_period_start: self.billing_period_start,
        }
    }
}

/// One provider's account in one billing period.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Statement {
    pub provider: String,
    pub billing_account: String,
    pub billing_period_start: DateTime<Utc>,
}

/// A bill as read: its rows and the SHA-256 of its (uncompressed) content.
#[derive(Debug)]
pub struct Bill {
    pub rows: Vec<BillRow>,
    pub content_hash: Vec<u8>,
}

/// The keys a resource is looked up by: the whole id, lower-cased, scheme and leading
/// slashes taken off (`aws:///us-east-1a/i-0abc` → `us-east-1a/i-0abc`), and its last
/// segment (`i-0abc`) when that is not a bare number (an Azure scale set's instance `0`
/// names nothing on its own).
pub fn resource_keys(resource_id: &str) -> (String, Option<String>) {
    let lower = resource_id.trim().to_ascii_lowercase();
    let without_scheme = lower
        .split_once("://")
        .map_or(lower.as_str(), |(_, rest)| rest);
    let full = without_scheme.trim_start_matches('/').to_owned();
    let tail = full
        .rsplit('/')
        .next()
        .filter(|tail| {
            !tail.is_empty() && *tail != full && !tail.bytes().all(|b| b.is_ascii_digit())
        })
        .map(str::to_owned);
    (full, tail)
}

/// The keys a bill row may name a node by: its name; its cloud provider id (a Kubernetes
/// node's `providerID`, label `provider_id`) whole and by its last segment; and for an
/// Azure scale-set instance, the scale set, which Azure bills as one resource.
pub fn node_keys(node: &str, provider_id: Option<&str>) -> Vec<String> {
    let mut keys = vec![node.to_ascii_lowercase()];
    if let Some(id) = provider_id {
        let (full, tail) = resource_keys(id);
        const SCALE_SET: &str = "/virtualmachinescalesets/";
        if let Some(at) = full.find(SCALE_SET) {
            let name_start = at + SCALE_SET.len();
            let name_end = full[name_start..]
                .find('/')
                .map_or(full.len(), |end| name_start + end);
            keys.push(full[..name_end].to_owned());
        }
        keys.push(full);
        keys.extend(tail);
    }
    keys.sort();
    keys.dedup();
    keys
}
