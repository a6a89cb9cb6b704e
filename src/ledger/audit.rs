//! The audit log: every change made through the service, who made it, and the entity before
//! and after, in a hash chain (`domain::audit`).
//!
//! Each use case that changes something calls [`record`] in its own transaction, as the last
//! statement before it commits: the entry exists exactly when the change does. Appenders are
//! serialised by the row lock that `UPDATE audit_head` takes (`store::audit::take_seqs`) and
//! holds until commit, so seqs are handed out and committed in order, without gaps, and the
//! chain is extended from the hash its predecessor wrote. Taking that lock last keeps the time
//! appenders wait for each other short, and since nothing is locked after it, no appender
//! waits for another while holding a lock that one needs.
//!
//! Snapshots are the entity as the API shows it, secrets left out: a token without its secret
//! hash, a channel's target and routing key masked as finance sees them.

use chrono::Utc;
use futures::Stream;
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::domain::access::Actor;
use crate::domain::audit::{self, Verifier};
pub use crate::domain::audit::{Change, Entry, Verification};
use crate::ledger::LedgerResult;
use crate::store;
pub use crate::store::audit::Filter;

/// How many entries a verification or an export reads at a time.
const PAGE: i64 = 1000;

/// A snapshot of an entity: its JSON form.
pub fn snapshot(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("a snapshot is JSON")
}

/// Appends `changes`, made by `actor`, to the log in the caller's transaction. Call it last
/// before committing (see the module doc).
pub async fn record(
    conn: &mut PgConnection,
    actor: &Actor,
    changes: Vec<Change>,
) -> LedgerResult<()> {
    if changes.is_empty() {
        return Ok(());
    }
    let count = i64::try_from(changes.len()).expect("a batch of changes fits an i64");
    let (seq, hash) = store::audit::take_seqs(conn, count).await?;
    // Read after the head is held, so `at` grows with seq as far as the clock does.
    let at = audit::truncate_to_micros(Utc::now());
    let entries = audit::chain((seq, &hash), at, actor, changes);
    let last = entries.last().expect("at least one entry");
    store::audit::set_head_hash(conn, &last.hash).await?;
    store::audit::insert(conn, &entries).await?;
    Ok(())
}

/// Appends one change (see [`record`]).
pub async fn record_one(
    conn: &mut PgConnection,
    actor: &Actor,
    change: Change,
) -> LedgerResult<()> {
    record(conn, actor, vec![change]).await
}

/// Up to `limit` entries matching `filter` after seq `after`, in seq order.
pub async fn list(
    pool: &PgPool,
    filter: &Filter,
    after: i64,
    limit: i64,
) -> LedgerResult<Vec<Entry>> {
    let mut conn = pool.acquire().await?;
    Ok(store::audit::list(&mut conn, filter, after, limit).await?)
}

/// Checks the whole chain against its head, a page at a time, on one snapshot.
pub async fn verify(pool: &PgPool) -> LedgerResult<Verification> {
    let mut tx = store::snapshot(pool).await?;
    let (head_seq, head_hash) = store::audit::head(&mut tx).await?;
    let mut verifier = Verifier::default();
    let mut after = 0;
    loop {
        let page = store::audit::list(&mut tx, &Filter::default(), after, PAGE).await?;
        for entry in &page {
            verifier.push(entry);
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = last.seq,
            _ => break,
        }
    }
    tx.commit().await?;
    Ok(verifier.finish((head_seq, &head_hash)))
}

/// Every entry matching `filter` after seq `after`, a page at a time. Entries commit in seq
/// order, so paging by seq misses none committed while the export runs.
pub fn export(
    pool: PgPool,
    filter: Filter,
    after: i64,
) -> impl Stream<Item = LedgerResult<Vec<Entry>>> + Send + 'static {
    futures::stream::try_unfold(Some(after), move |next| {
        let pool = pool.clone();
        let filter = filter.clone();
        async move {
            let Some(after) = next else {
                return Ok(None);
            };
            let page = list(&pool, &filter, after, PAGE).await?;
            let next = match page.last() {
                Some(last) if page.len() as i64 == PAGE => Some(last.seq),
                _ => None,
            };
            Ok(if page.is_empty() {
                None
            } else {
                Some((page, next))
            })
        }
    })
}
