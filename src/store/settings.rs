//! Server-wide values generated once and shared by every replica.

use sqlx::{PgConnection, PgPool};

/// The stored value of `key`, if any.
pub async fn get(conn: &mut PgConnection, key: &str) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT value FROM settings WHERE key = $1", key)
        .fetch_optional(conn)
        .await
}

/// Stores `value` under `key`, replacing what was there.
pub async fn put(conn: &mut PgConnection, key: &str, value: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO settings (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        key,
        value,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The stored value of `key`, created from `generate` on first use. Replicas racing to
/// create it all end up with the one that was stored first.
pub async fn get_or_create(
    pool: &PgPool,
    key: &str,
    generate: impl FnOnce() -> String,
) -> sqlx::Result<String> {
    sqlx::query!(
        "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        key,
        generate(),
    )
    .execute(pool)
    .await?;
    sqlx::query_scalar!("SELECT value FROM settings WHERE key = $1", key)
        .fetch_one(pool)
        .await
}
