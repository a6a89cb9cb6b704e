//! Cloud bills in FinOps FOCUS (1.0 to 1.2): the CSV a provider's cost export writes, read
//! into rows of billed cost, and the rules that tie a row's resource to a node.
//!
//! Exports differ in small ways this reader takes as they come: AWS and Microsoft write
//! `NULL` for an empty cell, Oracle an empty string; times are `2024-09-01 00:00:00` (UTC,
//! as FOCUS requires) or RFC 3339; `Tags` is a JSON object; one file may hold several
//! providers and currencies; a file may be gzip-compressed. The provider is `ProviderName`
//! (FOCUS 1.0 to 1.2), or `ServiceProviderName` where a newer export renamed it.
//!
//! A row is one charge: a resource (or none) over `[ChargePeriodStart, ChargePeriodEnd)` at a
//! `BilledCost` in `BillingCurrency`. A row of a GPU instance names its instance type
//! somewhere: AWS in `x_UsageType`, `SkuMeter` or the description (`… per On Demand Linux
//! g5.4xlarge Instance Hour`), Azure in its meter (`ND96asr v4`), Oracle in its shape; the
//! type is looked up in [`instance_types`] to learn the instance's cards. What a row is, and
//! how it names a node, is [`crate::domain::bill`].

use std::collections::BTreeMap;
use std::io::Read;

use chrono::{DateTime, NaiveDateTime, Utc};
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};

use crate::domain::bill::{Bill, BillRow};
use crate::domain::instance_types;
use crate::domain::rating::BillingMode;
use crate::domain::validation::Violations;

/// The most errors reported for one file: enough to fix a broken export, few enough to read.
pub const MAX_REPORTED_ERRORS: usize = 50;

/// The columns a bill must have.
const REQUIRED: [&str; 7] = [
    "BilledCost",
    "BillingCurrency",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ServiceName",
    "BillingPeriodStart",
];

/// The text of a bill from the bytes posted: gzip is recognised by its magic number and
/// inflated, to at most `max_bytes`.
pub fn bill_text(bytes: &[u8], max_bytes: u64) -> Result<String, String> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut inflated = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut inflated)
            .map_err(|e| format!("the gzip stream is broken: {e}"))?;
        if inflated.len() as u64 > max_bytes {
            return Err(format!(
                "the bill inflates to more than {max_bytes} bytes; split it by month or account"
            ));
        }
        inflated
    } else {
        bytes.to_vec()
    };
    let text = String::from_utf8(raw).map_err(|e| {
        format!(
            "not UTF-8 text (byte {}): a FOCUS export is a UTF-8 CSV",
            e.utf8_error().valid_up_to()
        )
    })?;
    Ok(text.strip_prefix('\u{feff}').unwrap_or(&text).to_owned())
}

/// Reads a FOCUS CSV. Every bad cell is reported (up to [`MAX_REPORTED_ERRORS`]) as
/// `/rows/<line>/<Column>`; a missing column as `/columns/<Column>`.
pub fn parse_bill(text: &str) -> Result<Bill, Violations> {
    let mut v = Violations::default();
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(text.as_bytes());
    let headers = match reader.headers() {
        Ok(headers) => headers.clone(),
        Err(e) => {
            v.push("/columns", format!("the header row cannot be read: {e}"));
            return Err(v);
        }
    };
    let columns: BTreeMap<&str, usize> = headers
        .iter()
        .enumerate()
        .map(|(i, name)| (name.trim(), i))
        .collect();
    for name in REQUIRED {
        if !columns.contains_key(name) {
            v.push(
                format!("/columns/{name}"),
                "a FOCUS bill must have this column",
            );
        }
    }
    let provider_column = ["ProviderName", "ServiceProviderName"]
        .iter()
        .find_map(|name| columns.get(name).copied());
    if provider_column.is_none() {
        v.push(
            "/columns/ProviderName",
            "a FOCUS bill must have this column (or ServiceProviderName)",
        );
    }
    if !v.is_empty() {
        return Err(v);
    }
    let column = |name: &str| columns.get(name).copied();
    let mut rows = Vec::new();
    let mut errors = 0usize;
    for (index, record) in reader.records().enumerate() {
        let line = index as u64 + 2;
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                v.push(format!("/rows/{line}"), format!("not a CSV row: {e}"));
                errors += 1;
                if errors >= MAX_REPORTED_ERRORS {
                    break;
                }
                continue;
            }
        };
        let cell = |name: &str| -> Option<&str> {
            let value = record.get(column(name)?)?.trim();
            (!value.is_empty() && value != "NULL").then_some(value)
        };
        let mut row_v = Violations::default();
        let pointer = |name: &str| format!("/rows/{line}/{name}");
        let required = |name: &str, row_v: &mut Violations| -> Option<String> {
            let value = cell(name).map(str::to_owned);
            if value.is_none() {
                row_v.push(pointer(name), "must not be empty");
            }
            value
        };
        let provider = provider_column
            .and_then(|i| record.get(i))
            .map(str::trim)
            .filter(|value| !value.is_empty() && *value != "NULL")
            .map(str::to_owned);
        if provider.is_none() {
            row_v.push(pointer("ProviderName"), "must not be empty");
        }
        let billed_cost = required("BilledCost", &mut row_v)
            .and_then(|raw| row_v.check(&pointer("BilledCost"), decimal(&raw)));
        let currency = required("BillingCurrency", &mut row_v)
            .and_then(|raw| row_v.check(&pointer("BillingCurrency"), currency(&raw)));
        let charge_from = required("ChargePeriodStart", &mut row_v)
            .and_then(|raw| row_v.check(&pointer("ChargePeriodStart"), time(&raw)));
        let charge_until = required("ChargePeriodEnd", &mut row_v)
            .and_then(|raw| row_v.check(&pointer("ChargePeriodEnd"), time(&raw)));
        let billing_period_start = required("BillingPeriodStart", &mut row_v)
            .and_then(|raw| row_v.check(&pointer("BillingPeriodStart"), time(&raw)));
        let charge_category = required("ChargeCategory", &mut row_v);
        let service = required("ServiceName", &mut row_v);
        if let (Some(from), Some(until)) = (charge_from, charge_until)
            && until < from
        {
            row_v.push(
                pointer("ChargePeriodEnd"),
                "must not be before ChargePeriodStart",
            );
        }
        let consumed_hours = match (cell("ConsumedQuantity"), cell("ConsumedUnit")) {
            (Some(quantity), Some(unit)) if is_hours(unit) => {
                row_v.check(&pointer("ConsumedQuantity"), decimal(quantity))
            }
            _ => None,
        };
        if !row_v.is_empty() {
            errors += row_v.len();
            v.extend(row_v);
            if errors >= MAX_REPORTED_ERRORS {
                break;
            }
            continue;
        }
        let (
            Some(provider),
            Some(billed_cost),
            Some(currency),
            Some(charge_from),
            Some(charge_until),
            Some(billing_period_start),
            Some(charge_category),
            Some(service),
        ) = (
            provider,
            billed_cost,
            currency,
            charge_from,
            charge_until,
            billing_period_start,
            charge_category,
            service,
        )
        else {
            unreachable!("every required cell either parsed or was reported");
        };
        let instance = [
            "x_UsageType",
            "SkuMeter",
            "x_SkuDetails",
            "ChargeDescription",
        ]
        .iter()
        .filter_map(|name| cell(name))
        .find_map(instance_types::find_in);
        rows.push(BillRow {
            line,
            provider,
            billing_account: cell("BillingAccountId").unwrap_or_default().to_owned(),
            billing_period_start,
            charge_category,
            charge_from,
            charge_until,
            billed_cost,
            currency,
            resource_id: cell("ResourceId").map(str::to_owned),
            service,
            sku: cell("SkuId").unwrap_or_default().to_owned(),
            region: cell("RegionId").or(cell("RegionName")).map(str::to_owned),
            billing_mode: match cell("PricingCategory") {
                Some(category) if category.eq_ignore_ascii_case("Dynamic") => BillingMode::Spot,
                Some(category) if category.eq_ignore_ascii_case("Committed") => {
                    BillingMode::Reserved
                }
                _ => BillingMode::OnDemand,
            },
            consumed_hours,
            instance,
        });
    }
    v.into_result()?;
    let mut hasher = Sha256::new();
    hasher.update(text.as_bytes());
    Ok(Bill {
        rows,
        content_hash: hasher.finalize().to_vec(),
    })
}

fn is_hours(unit: &str) -> bool {
    matches!(
        unit.to_ascii_lowercase().as_str(),
        "hours" | "hour" | "hrs" | "hr" | "h"
    )
}

/// A decimal as exports write them: `1.624`, `-2.6137`, `1.2E-7`.
fn decimal(raw: &str) -> Result<Decimal, String> {
    let parsed = if raw.contains(['e', 'E']) {
        Decimal::from_scientific(raw)
    } else {
        raw.parse::<Decimal>()
    };
    parsed.map_err(|_| format!("`{raw}` is not a decimal number"))
}

fn currency(raw: &str) -> Result<String, String> {
    let code = raw.to_ascii_uppercase();
    if iso_currency::Currency::from_code(&code).is_some() {
        Ok(code)
    } else {
        Err(format!("`{raw}` is not an ISO 4217 currency code"))
    }
}

/// A FOCUS time: `2024-09-01 00:00:00` (UTC), `2024-09-01T00:00:00Z` or with an offset.
fn time(raw: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(raw, format) {
            return Ok(at.and_utc());
        }
    }
    if let Ok(at) = DateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f%:z") {
        return Ok(at.with_timezone(&Utc));
    }
    Err(format!(
        "`{raw}` is not a time (2024-09-01 00:00:00 or 2024-09-01T00:00:00Z)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::bill::{node_keys, resource_keys};

    /// Whether a row with these keys names a node with `node_keys`: its whole id or its last
    /// segment is one of them.
    fn names_node(resource: &(String, Option<String>), node_keys: &[String]) -> bool {
        node_keys
            .iter()
            .any(|key| *key == resource.0 || resource.1.as_ref().is_some_and(|tail| tail == key))
    }

    const HEADER: &str = "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,\
ChargeCategory,ChargeDescription,ChargePeriodEnd,ChargePeriodStart,ConsumedQuantity,\
ConsumedUnit,PricingCategory,ProviderName,ResourceId,ServiceName,SkuId,Tags";

    fn bill(rows: &[&str]) -> String {
        let mut text = HEADER.to_owned();
        for row in rows {
            text.push('\n');
            text.push_str(row);
        }
        text
    }

    #[test]
    fn rows_are_read_as_exports_write_them() {
        let text = bill(&[
            r#"1.62400000000,"123","USD","2024-09-01 00:00:00","Usage","$1.624 per On Demand Linux g5.4xlarge Instance Hour","2024-09-27 16:00:00","2024-09-27 15:00:00",1.000000000000000,"Hours","Standard","AWS","i-006f","Amazon Elastic Compute Cloud","4GQW","{""team"": ""ml""}""#,
            r#"-2.6137,"123","usd","2024-09-01T00:00:00Z","Credit",NULL,"2024-09-24T04:00:00Z","2024-09-24T03:00:00Z",NULL,NULL,"Other","AWS",NULL,"Amazon Elastic Compute Cloud",NULL,NULL"#,
            r#"1.2E-7,"9",EUR,"2024-09-01 00:00:00",Usage,"",2024-09-05 00:00:00,2024-09-04 00:00:00,,,Dynamic,Microsoft,/subscriptions/x/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm1,Virtual Machines,,"#,
        ]);
        let parsed = parse_bill(&text).expect("a valid bill");
        assert_eq!(parsed.rows.len(), 3);
        let gpu = &parsed.rows[0];
        assert_eq!(gpu.line, 2);
        assert_eq!(gpu.billed_cost, Decimal::new(1_624, 3));
        assert_eq!(gpu.consumed_hours, Some(Decimal::ONE));
        assert_eq!(
            gpu.instance.map(|i| (i.gpu_model, i.gpus)),
            Some(("A10G", 1))
        );
        assert_eq!(
            gpu.charge_until - gpu.charge_from,
            chrono::TimeDelta::hours(1)
        );
        let credit = &parsed.rows[1];
        assert_eq!(credit.currency, "USD");
        assert_eq!(credit.resource_id, None);
        assert_eq!(credit.sku, "");
        let azure = &parsed.rows[2];
        assert_eq!(azure.billed_cost, Decimal::new(12, 8));
        assert_eq!(azure.billing_mode, BillingMode::Spot);
        assert_eq!(azure.currency, "EUR");
    }

    #[test]
    fn every_bad_cell_is_named_by_row_and_column() {
        let text = bill(&[
            r#"abc,"1","USD","2024-09-01 00:00:00","Usage",,"2024-09-27 16:00:00","2024-09-27 15:00:00",,,,"AWS",,"EC2",,"#,
            r#"1,"1","XYZ","2024-09-01 00:00:00","Usage",,"2024-09-27 14:00:00","2024-09-27 15:00:00",,,,NULL,,"EC2",,"#,
        ]);
        let errors = parse_bill(&text).unwrap_err().into_vec();
        let pointers: Vec<&str> = errors.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(
            pointers,
            [
                "/rows/2/BilledCost",
                "/rows/3/ProviderName",
                "/rows/3/BillingCurrency",
                "/rows/3/ChargePeriodEnd"
            ]
        );
    }

    #[test]
    fn a_missing_column_is_named() {
        let errors = parse_bill("BilledCost,ProviderName\n1,AWS")
            .unwrap_err()
            .into_vec();
        assert!(
            errors
                .iter()
                .any(|e| e.pointer == "/columns/ChargePeriodStart")
        );
    }

    #[test]
    fn gzip_is_inflated_and_bounded() {
        use flate2::{Compression, write::GzEncoder};
        use std::io::Write;
        let text = bill(&[]);
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(text.as_bytes()).unwrap();
        let gz = encoder.finish().unwrap();
        assert_eq!(bill_text(&gz, 1 << 20).unwrap(), text);
        assert!(bill_text(&gz, 10).unwrap_err().contains("inflates"));
        assert!(bill_text(&gz[..gz.len() / 2], 1 << 20).is_err());
    }

    #[test]
    fn resources_name_nodes_by_provider_id() {
        let aws = node_keys(
            "ip-10-0-1-2.ec2.internal",
            Some("aws:///us-east-1a/i-0abc123"),
        );
        assert!(names_node(&resource_keys("i-0abc123"), &aws));
        assert!(!names_node(&resource_keys("i-0abc124"), &aws));
        let scale_set = node_keys(
            "aks-gpu-0",
            Some(
                "azure:///subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/aks-gpu/virtualMachines/0",
            ),
        );
        assert!(names_node(
            &resource_keys(
                "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/aks-gpu"
            ),
            &scale_set
        ));
        assert!(!names_node(&resource_keys("0"), &scale_set));
        let gke = node_keys("gke-a-1", Some("gce://proj/us-central1-a/gke-a-1"));
        assert!(names_node(
            &resource_keys(
                "//compute.googleapis.com/projects/proj/zones/us-central1-a/instances/gke-a-1"
            ),
            &gke
        ));
        let plain = node_keys("gpu-07", None);
        assert!(names_node(&resource_keys("GPU-07"), &plain));
    }
}
