//! Server-wide values generated once and shared by every replica.

use sqlx::PgPool;

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
