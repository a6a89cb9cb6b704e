//! The audit log and its head (see `migrations/0026_audit.sql`).
//!
//! An append is three statements in the transaction of the change it records: [`take_seqs`]
//! moves the head's seq on and returns the previous head, which holds the head row's lock
//! until the transaction ends; the caller chains its entries to that head; [`set_head_hash`]
//! and [`insert`] store them. No `SELECT … FOR UPDATE`, no `ctid` and no volatile function,
//! so the same statements run on Citus with both tables as reference tables.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

use crate::domain::access::{Actor, ActorKind};
use crate::domain::audit::{Entry, canonical_json};

/// Which entries a list holds; every part is optional.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// From this instant on (inclusive).
    pub from: Option<DateTime<Utc>>,
    /// Before this instant.
    pub to: Option<DateTime<Utc>>,
    /// The actor's id: a token's id, a user's subject, or what part of the service acted.
    pub actor: Option<String>,
    pub entity: Option<String>,
    pub entity_id: Option<String>,
    pub action: Option<String>,
}

/// Hands out `count` seqs: moves the head on by `count` and returns the head before, its seq
/// and hash. The head row stays locked by this transaction until it ends.
pub async fn take_seqs(conn: &mut PgConnection, count: i64) -> sqlx::Result<(i64, Vec<u8>)> {
    let row = sqlx::query!(
        "UPDATE audit_head SET seq = seq + $1 WHERE id RETURNING seq - $1 AS \"seq!\", hash",
        count,
    )
    .fetch_one(conn)
    .await?;
    Ok((row.seq, row.hash))
}

/// Records the hash of the last entry appended.
pub async fn set_head_hash(conn: &mut PgConnection, hash: &[u8]) -> sqlx::Result<()> {
    sqlx::query!("UPDATE audit_head SET hash = $1 WHERE id", hash)
        .execute(conn)
        .await?;
    Ok(())
}

/// The seq and hash of the last entry appended (0 and zeros before the first).
pub async fn head(conn: &mut PgConnection) -> sqlx::Result<(i64, Vec<u8>)> {
    let row = sqlx::query!("SELECT seq, hash FROM audit_head WHERE id")
        .fetch_one(conn)
        .await?;
    Ok((row.seq, row.hash))
}

fn json_text(value: &Option<Value>) -> Option<String> {
    value.as_ref().map(canonical_json)
}

/// Stores entries chained by the caller, in one statement.
pub async fn insert(conn: &mut PgConnection, entries: &[Entry]) -> sqlx::Result<()> {
    let column = |f: fn(&Entry) -> String| entries.iter().map(f).collect::<Vec<_>>();
    let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
    let ats: Vec<DateTime<Utc>> = entries.iter().map(|e| e.at).collect();
    let befores: Vec<Option<String>> = entries.iter().map(|e| json_text(&e.before)).collect();
    let afters: Vec<Option<String>> = entries.iter().map(|e| json_text(&e.after)).collect();
    let prev_hashes: Vec<Vec<u8>> = entries.iter().map(|e| e.prev_hash.clone()).collect();
    let hashes: Vec<Vec<u8>> = entries.iter().map(|e| e.hash.clone()).collect();
    sqlx::query!(
        "INSERT INTO audit_log (seq, at, actor_kind, actor_id, actor_name, action, entity, \
                                entity_id, before, after, prev_hash, hash) \
         SELECT seq, at, actor_kind, actor_id, actor_name, action, entity, entity_id, \
                before::jsonb, after::jsonb, prev_hash, hash \
         FROM UNNEST($1::bigint[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], \
                     $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bytea[], \
                     $12::bytea[]) \
              AS e (seq, at, actor_kind, actor_id, actor_name, action, entity, entity_id, \
                    before, after, prev_hash, hash)",
        &seqs,
        &ats,
        &column(|e| e.actor.kind.as_str().to_owned()),
        &column(|e| e.actor.id.clone()),
        &column(|e| e.actor.name.clone()),
        &column(|e| e.action.clone()),
        &column(|e| e.entity.clone()),
        &column(|e| e.entity_id.clone()),
        &befores as &[Option<String>],
        &afters as &[Option<String>],
        &prev_hashes,
        &hashes,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Up to `limit` entries matching `filter` after seq `after`, in seq order.
pub async fn list(
    conn: &mut PgConnection,
    filter: &Filter,
    after: i64,
    limit: i64,
) -> sqlx::Result<Vec<Entry>> {
    sqlx::query!(
        "SELECT seq, at, actor_kind, actor_id, actor_name, action, entity, entity_id, before, \
                after, prev_hash, hash \
         FROM audit_log \
         WHERE seq > $1 \
           AND ($2::timestamptz IS NULL OR at >= $2) \
           AND ($3::timestamptz IS NULL OR at < $3) \
           AND ($4::text IS NULL OR actor_id = $4) \
           AND ($5::text IS NULL OR entity = $5) \
           AND ($6::text IS NULL OR entity_id = $6) \
           AND ($7::text IS NULL OR action = $7) \
         ORDER BY seq \
         LIMIT $8",
        after,
        filter.from,
        filter.to,
        filter.actor.as_deref(),
        filter.entity.as_deref(),
        filter.entity_id.as_deref(),
        filter.action.as_deref(),
        limit,
    )
    .try_map(|row| {
        Ok(Entry {
            seq: row.seq,
            at: row.at,
            actor: Actor {
                kind: super::decoded::<ActorKind>("actor_kind", row.actor_kind)?,
                id: row.actor_id,
                name: row.actor_name,
            },
            action: row.action,
            entity: row.entity,
            entity_id: row.entity_id,
            before: row.before,
            after: row.after,
            prev_hash: row.prev_hash,
            hash: row.hash,
        })
    })
    .fetch_all(conn)
    .await
}
