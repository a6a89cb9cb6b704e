//! The audit log as a hash chain: what an entry is, the exact bytes its hash covers, and how a
//! chain is checked.
//!
//! Entry `seq` has `hash = SHA-256(prev_hash ‖ canonical JSON of {seq, at, actor: {kind, id,
//! name}, action, entity, entity_id, before, after})` and `prev_hash` = the hash of entry
//! `seq - 1`, 32 zero bytes for entry 1. Changing any field of an entry changes its hash;
//! recomputing that hash breaks the next entry's `prev_hash`; removing an entry leaves a gap
//! in `seq`. So [`Verifier`] finds the first entry that is not what was appended, and anyone
//! holding a dump can do the same without the service.
//!
//! The canonical JSON is the one a stored entry reads back as, whatever the database did to
//! it: keys sorted by their UTF-8 bytes at every level, no whitespace, strings escaped as
//! `serde_json` escapes them (only `"`, `\` and control characters, which Python's
//! `json.dumps(..., ensure_ascii=False)` escapes the same way), numbers as their text. `at` is
//! RFC 3339 in UTC with exactly six fractional digits, the precision of `timestamptz`.
//! Snapshots carry money as decimal strings and counts as integers, never floats, so their
//! canonical form survives a round trip through `jsonb` unchanged.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::access::Actor;

/// The length of a hash, and of the genesis `prev_hash` (all zeros).
pub const HASH_LEN: usize = 32;

/// The `prev_hash` of the first entry.
pub const GENESIS: [u8; HASH_LEN] = [0; HASH_LEN];

/// One change as the use case that made it describes it: what was done to which entity, the
/// entity as the API showed it before (`None` when it was created) and after (`None` when it
/// was deleted).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub action: String,
    pub entity: String,
    pub entity_id: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl Change {
    pub fn new(
        entity: &str,
        entity_id: impl Into<String>,
        action: &str,
        before: Option<Value>,
        after: Option<Value>,
    ) -> Self {
        Self {
            action: action.to_owned(),
            entity: entity.to_owned(),
            entity_id: entity_id.into(),
            before,
            after,
        }
    }
}

/// An entry of the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub actor: Actor,
    pub action: String,
    pub entity: String,
    pub entity_id: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
}

/// `at` as the hash covers it: UTC, six fractional digits, `Z`.
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// `now` to the microsecond, the precision PostgreSQL keeps, so that the instant hashed is
/// the instant stored.
pub fn truncate_to_micros(now: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(now.timestamp_micros()).expect("a micro-second of `now`")
}

/// The canonical JSON text of `value` (see the module doc).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::String(text) => write_string(text, out),
        // `null`, booleans and numbers as serde_json writes them: a number as its text.
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_string(text: &str, out: &mut String) {
    out.push_str(&Value::String(text.to_owned()).to_string());
}

/// What the hash of an entry covers, besides the previous hash.
#[derive(Serialize)]
struct Hashed<'a> {
    seq: i64,
    at: String,
    actor: &'a Actor,
    action: &'a str,
    entity: &'a str,
    entity_id: &'a str,
    before: &'a Option<Value>,
    after: &'a Option<Value>,
}

/// The canonical JSON of an entry's fields: the bytes its hash covers after `prev_hash`.
pub fn entry_json(seq: i64, at: DateTime<Utc>, actor: &Actor, change: &Change) -> String {
    let hashed = Hashed {
        seq,
        at: timestamp(at),
        actor,
        action: &change.action,
        entity: &change.entity,
        entity_id: &change.entity_id,
        before: &change.before,
        after: &change.after,
    };
    canonical_json(&serde_json::to_value(hashed).expect("an entry is JSON"))
}

/// The hash of an entry with these fields following `prev_hash`.
pub fn entry_hash(
    prev_hash: &[u8],
    seq: i64,
    at: DateTime<Utc>,
    actor: &Actor,
    change: &Change,
) -> Vec<u8> {
    let mut digest = Sha256::new();
    digest.update(prev_hash);
    digest.update(entry_json(seq, at, actor, change).as_bytes());
    digest.finalize().to_vec()
}

/// Appends `changes` after the entry `head` (its seq and hash): the entries to store, numbered
/// from `head.0 + 1`, each chained to the one before.
pub fn chain(
    head: (i64, &[u8]),
    at: DateTime<Utc>,
    actor: &Actor,
    changes: Vec<Change>,
) -> Vec<Entry> {
    let (mut seq, prev) = head;
    let mut prev_hash = prev.to_vec();
    changes
        .into_iter()
        .map(|change| {
            seq += 1;
            let hash = entry_hash(&prev_hash, seq, at, actor, &change);
            Entry {
                seq,
                at,
                actor: actor.clone(),
                action: change.action,
                entity: change.entity,
                entity_id: change.entity_id,
                before: change.before,
                after: change.after,
                prev_hash: std::mem::replace(&mut prev_hash, hash.clone()),
                hash,
            }
        })
        .collect()
}

impl Entry {
    fn change(&self) -> Change {
        Change {
            action: self.action.clone(),
            entity: self.entity.clone(),
            entity_id: self.entity_id.clone(),
            before: self.before.clone(),
            after: self.after.clone(),
        }
    }

    /// The hash this entry's fields give after its stored `prev_hash`.
    pub fn recomputed_hash(&self) -> Vec<u8> {
        entry_hash(
            &self.prev_hash,
            self.seq,
            self.at,
            &self.actor,
            &self.change(),
        )
    }
}

/// The outcome of checking a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// How many entries were read.
    pub entries: u64,
    /// The first seq at which the chain does not hold: an entry whose hash is not that of its
    /// fields, whose `prev_hash` is not the previous entry's hash, or a seq that is missing.
    pub first_broken_seq: Option<i64>,
}

impl Verification {
    pub fn valid(&self) -> bool {
        self.first_broken_seq.is_none()
    }
}

/// Checks a chain entry by entry in seq order, holding only the last hash, so a log of any
/// length is checked in bounded memory.
#[derive(Debug, Clone)]
pub struct Verifier {
    expected_seq: i64,
    prev_hash: Vec<u8>,
    entries: u64,
    first_broken_seq: Option<i64>,
}

impl Default for Verifier {
    fn default() -> Self {
        Self {
            expected_seq: 1,
            prev_hash: GENESIS.to_vec(),
            entries: 0,
            first_broken_seq: None,
        }
    }
}

impl Verifier {
    /// Takes the next entry, in seq order.
    pub fn push(&mut self, entry: &Entry) {
        self.entries += 1;
        if self.first_broken_seq.is_some() {
            return;
        }
        if entry.seq != self.expected_seq {
            // A missing entry names its own seq; one out of order or repeated, the one found.
            self.first_broken_seq = Some(self.expected_seq.min(entry.seq));
        } else if entry.prev_hash != self.prev_hash || entry.recomputed_hash() != entry.hash {
            self.first_broken_seq = Some(entry.seq);
        }
        self.expected_seq = entry.seq + 1;
        self.prev_hash = entry.hash.clone();
    }

    /// The result, given the head the log says it has reached (its last seq and hash): entries
    /// removed from the end are missing against it.
    pub fn finish(self, head: (i64, &[u8])) -> Verification {
        let (head_seq, head_hash) = head;
        let first_broken_seq = self.first_broken_seq.or_else(|| {
            let last = self.expected_seq - 1;
            if last < head_seq {
                Some(last + 1)
            } else if last > head_seq || self.prev_hash != head_hash {
                Some(head_seq.max(1))
            } else {
                None
            }
        });
        Verification {
            entries: self.entries,
            first_broken_seq,
        }
    }
}

/// Checks a whole chain held in memory against its head.
pub fn verify<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    head: (i64, &[u8]),
) -> Verification {
    let mut verifier = Verifier::default();
    for entry in entries {
        verifier.push(entry);
    }
    verifier.finish(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use serde_json::json;

    fn actor() -> Actor {
        Actor::token(uuid::Uuid::nil(), "finance bot")
    }

    fn at() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 3, 9, 30, 0).unwrap() + chrono::Duration::microseconds(42)
    }

    fn changes(n: usize) -> Vec<Change> {
        (0..n)
            .map(|i| {
                Change::new(
                    "contract",
                    format!("c{i}"),
                    "update",
                    Some(json!({"price_per_gpu_hour": "2.50", "name": format!("n{i}")})),
                    Some(json!({"price_per_gpu_hour": "2.75", "name": format!("n{i}")})),
                )
            })
            .collect()
    }

    fn log(n: usize) -> Vec<Entry> {
        chain((0, &GENESIS), at(), &actor(), changes(n))
    }

    fn head(entries: &[Entry]) -> (i64, Vec<u8>) {
        entries
            .last()
            .map_or((0, GENESIS.to_vec()), |e| (e.seq, e.hash.clone()))
    }

    /// The top-level keys of `value` in the order `canonical` writes them.
    fn keys_in_text_order(canonical: &str, value: &Value) -> Vec<String> {
        let mut keys: Vec<(usize, String)> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| {
                let pattern = format!("{}:[", Value::String(k.clone()));
                (canonical.find(&pattern).unwrap(), k.clone())
            })
            .collect();
        keys.sort();
        keys.into_iter().map(|(_, k)| k).collect()
    }

    fn check(entries: &[Entry], head: &(i64, Vec<u8>)) -> Verification {
        verify(entries, (head.0, &head.1))
    }

    #[test]
    fn keys_are_sorted_at_every_level_without_whitespace() {
        let value = json!({"b": [{"z": 1, "a": null}], "a": {"y": "x", "b": true}, "B": "é\n"});
        assert_eq!(
            canonical_json(&value),
            r#"{"B":"é\n","a":{"b":true,"y":"x"},"b":[{"a":null,"z":1}]}"#
        );
    }

    #[test]
    fn numbers_are_written_as_their_text() {
        let value: Value =
            serde_json::from_str(r#"{"n": 1.50, "big": 123456789012345678901234567890}"#).unwrap();
        assert_eq!(
            canonical_json(&value),
            r#"{"big":123456789012345678901234567890,"n":1.50}"#
        );
    }

    #[test]
    fn decimals_are_strings() {
        let value = serde_json::to_value(rust_decimal::Decimal::new(8460, 2)).unwrap();
        assert_eq!(canonical_json(&value), r#""84.60""#);
    }

    #[test]
    fn the_hashed_bytes_are_the_entry_in_canonical_form() {
        let change = Change::new(
            "fx_rate",
            "2026-11/USD/EUR",
            "put",
            None,
            Some(json!({"rate": "0.9"})),
        );
        assert_eq!(
            entry_json(7, at(), &actor(), &change),
            r#"{"action":"put","actor":{"id":"00000000-0000-0000-0000-000000000000","kind":"token","name":"finance bot"},"after":{"rate":"0.9"},"at":"2026-11-03T09:30:00.000042Z","before":null,"entity":"fx_rate","entity_id":"2026-11/USD/EUR","seq":7}"#
        );
        let mut digest = Sha256::new();
        digest.update([1u8; 32]);
        digest.update(entry_json(7, at(), &actor(), &change).as_bytes());
        assert_eq!(
            entry_hash(&[1u8; 32], 7, at(), &actor(), &change),
            digest.finalize().to_vec()
        );
    }

    #[test]
    fn time_is_kept_to_the_microsecond() {
        let now = at() + chrono::Duration::nanoseconds(999);
        assert_eq!(
            timestamp(truncate_to_micros(now)),
            "2026-11-03T09:30:00.000042Z"
        );
    }

    #[test]
    fn a_chain_starts_from_zeros_and_links_each_entry_to_the_last() {
        let entries = log(3);
        assert_eq!(entries[0].prev_hash, GENESIS.to_vec());
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        for pair in entries.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
        }
        let verification = check(&entries, &head(&entries));
        assert!(verification.valid());
        assert_eq!(verification.entries, 3);
        assert!(check(&[], &(0, GENESIS.to_vec())).valid());
    }

    #[test]
    fn appending_in_two_steps_gives_the_same_chain_as_in_one() {
        let whole = log(4);
        let mut parts = chain((0, &GENESIS), at(), &actor(), changes(4)[..2].to_vec());
        let (seq, hash) = head(&parts);
        parts.extend(chain(
            (seq, &hash),
            at(),
            &actor(),
            changes(4)[2..].to_vec(),
        ));
        assert_eq!(parts, whole);
    }

    #[test]
    fn an_edited_entry_is_named() {
        let mut entries = log(5);
        let head = head(&entries);
        entries[2].after = Some(json!({"price_per_gpu_hour": "0.01"}));
        assert_eq!(check(&entries, &head).first_broken_seq, Some(3));
    }

    #[test]
    fn an_edited_entry_with_its_hash_recomputed_breaks_the_next() {
        let mut entries = log(5);
        let head = head(&entries);
        entries[2].actor.name = "someone else".to_owned();
        entries[2].hash = entries[2].recomputed_hash();
        assert_eq!(check(&entries, &head).first_broken_seq, Some(4));
    }

    #[test]
    fn a_removed_entry_names_its_seq() {
        let mut entries = log(5);
        let head = head(&entries);
        entries.remove(1);
        assert_eq!(check(&entries, &head).first_broken_seq, Some(2));
        let mut first_gone = log(3);
        first_gone.remove(0);
        assert_eq!(check(&first_gone, &head).first_broken_seq, Some(1));
    }

    #[test]
    fn entries_removed_from_the_end_are_missing_against_the_head() {
        let mut entries = log(5);
        let head = head(&entries);
        entries.truncate(3);
        assert_eq!(check(&entries, &head).first_broken_seq, Some(4));
        assert_eq!(check(&[], &head).first_broken_seq, Some(1));
    }

    #[test]
    fn a_head_that_does_not_match_the_last_entry_is_named() {
        let entries = log(2);
        assert_eq!(check(&entries, &(2, vec![7; 32])).first_broken_seq, Some(2));
        assert_eq!(
            check(&entries, &(1, entries[0].hash.clone())).first_broken_seq,
            Some(1)
        );
    }

    proptest! {
        /// Any change to any one entry's content is found, at that entry.
        #[test]
        fn every_edit_is_found_where_it_was_made(n in 1usize..8, pick in 0usize..8, field in 0u8..6, text in "\\PC{0,12}") {
            let mut entries = log(n);
            let head = head(&entries);
            let index = pick % n;
            let entry = &mut entries[index];
            let original = entry.clone();
            match field {
                0 => entry.actor.name.push_str(&format!("{text}!")),
                1 => entry.action.push_str(&format!("{text}!")),
                2 => entry.entity_id.push_str(&format!("{text}!")),
                3 => entry.before = Some(json!({"note": format!("{text}!")})),
                4 => entry.after = None,
                _ => entry.at += chrono::Duration::microseconds(1),
            }
            prop_assert_ne!(&*entry, &original);
            prop_assert_eq!(check(&entries, &head).first_broken_seq, Some(index as i64 + 1));
        }

        /// The canonical form reads back to the same value and is its own canonical form, with
        /// keys in byte order whatever their characters.
        #[test]
        fn canonical_form_is_a_fixed_point(keys in proptest::collection::vec("\\PC{0,6}", 0..6), text in "\\PC{0,12}") {
            let value = Value::Object(
                keys.iter().map(|k| (k.clone(), json!([text.clone(), {"k": k}]))).collect(),
            );
            let canonical = canonical_json(&value);
            let read_back: Value = serde_json::from_str(&canonical).unwrap();
            prop_assert_eq!(&read_back, &value);
            prop_assert_eq!(canonical_json(&read_back), canonical.clone());
            let mut sorted: Vec<&String> = value.as_object().unwrap().keys().collect();
            sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            let expected_order: Vec<String> = sorted.iter().map(|k| k.to_string()).collect();
            let found: Vec<String> = keys_in_text_order(&canonical, &value);
            prop_assert_eq!(found, expected_order);
        }
    }
}
