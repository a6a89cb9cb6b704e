//! The audit log as CSV: every field an auditor needs to re-hash each entry and follow the
//! chain without the service (`docs/operations.md` shows how).
//!
//! Text cells go through [`reversible_text_cell`]: a spreadsheet opens none as a formula,
//! and removing one leading `'` from a cell that has one gives the field back exactly.
//! `before` and `after` are their canonical JSON (`null` for none), the very text the hash
//! covers; `at` is written as the hash covers it; hashes are lowercase hex.

use crate::domain::audit::{Entry, canonical_json, timestamp};
use crate::exports::csv_cell::reversible_text_cell;

/// The columns, in order.
pub const COLUMNS: [&str; 12] = [
    "seq",
    "at",
    "actor_kind",
    "actor_id",
    "actor_name",
    "action",
    "entity",
    "entity_id",
    "before",
    "after",
    "prev_hash",
    "hash",
];

/// The header line.
pub fn header() -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(COLUMNS).expect("writing to memory");
    writer.into_inner().expect("writing to memory")
}

/// The lines of `entries`, without the header.
pub fn rows(entries: &[Entry]) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for entry in entries {
        let json = |value: &Option<serde_json::Value>| {
            value
                .as_ref()
                .map_or_else(|| "null".to_owned(), canonical_json)
        };
        let (before, after) = (json(&entry.before), json(&entry.after));
        let text = [
            entry.actor.kind.as_str(),
            &entry.actor.id,
            &entry.actor.name,
            &entry.action,
            &entry.entity,
            &entry.entity_id,
            &before,
            &after,
        ]
        .map(reversible_text_cell);
        writer
            .write_record([
                entry.seq.to_string().as_str(),
                &timestamp(entry.at),
                &text[0],
                &text[1],
                &text[2],
                &text[3],
                &text[4],
                &text[5],
                &text[6],
                &text[7],
                &hex::encode(&entry.prev_hash),
                &hex::encode(&entry.hash),
            ])
            .expect("writing to memory");
    }
    writer.into_inner().expect("writing to memory")
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use serde_json::json;
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::domain::access::Actor;
    use crate::domain::audit::{Change, GENESIS, chain};
    use crate::exports::csv_cell::read_reversible_cell;

    #[test]
    fn each_line_re_hashes_to_its_hash() {
        let at = Utc.with_ymd_and_hms(2026, 11, 3, 9, 30, 0).unwrap();
        let actor = Actor::token(uuid::Uuid::nil(), "=cmd|' /C calc'!A0");
        let entries = chain(
            (0, &GENESIS),
            at,
            &actor,
            vec![
                Change::new(
                    "contract",
                    "-1",
                    "update",
                    Some(json!({"price": "2.5"})),
                    Some(json!({"price": "2.75"})),
                ),
                Change::new(
                    "token",
                    "'quoted",
                    "create",
                    None,
                    Some(json!({"name": "x,\"y\"\n"})),
                ),
            ],
        );
        let mut bytes = header();
        bytes.extend(rows(&entries));
        let mut reader = csv::Reader::from_reader(bytes.as_slice());
        let mut prev = hex::encode(GENESIS);
        for record in reader.records() {
            let record = record.unwrap();
            let cell = |i: usize| read_reversible_cell(&record[i]).to_owned();
            let string = |i: usize| serde_json::Value::String(cell(i)).to_string();
            assert!(
                !record[4].starts_with('='),
                "a formula cell: {}",
                &record[4]
            );
            let text = format!(
                r#"{{"action":{},"actor":{{"id":{},"kind":{},"name":{}}},"after":{},"at":{},"before":{},"entity":{},"entity_id":{},"seq":{}}}"#,
                string(5),
                string(3),
                string(2),
                string(4),
                cell(9),
                serde_json::Value::String(record[1].to_owned()),
                cell(8),
                string(6),
                string(7),
                &record[0],
            );
            assert_eq!(&record[10], prev);
            let mut digest = Sha256::new();
            digest.update(hex::decode(&record[10]).unwrap());
            digest.update(text.as_bytes());
            assert_eq!(hex::encode(digest.finalize()), &record[11]);
            prev = record[11].to_owned();
        }
        assert_eq!(prev, hex::encode(&entries[1].hash));
    }
}
