//! Where a benchmark's database time goes: `pg_stat_statements` of the database under test,
//! reset before a phase and printed after it. The embedded cluster loads the module when
//! started with `statement_statistics`; without it, the profile says it is unavailable.

use sqlx::PgPool;

/// Statements printed per profile.
const SHOWN: i64 = 12;
/// Characters of each statement's text printed.
const TEXT_CHARS: usize = 110;

/// Starts counting from zero; `false` when the server cannot count.
pub async fn reset(pool: &PgPool) -> bool {
    if sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await
        .is_err()
    {
        return false;
    }
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await
        .is_ok()
}

/// Prints the statements of `pool`'s database that took the most execution time since
/// [`reset`], with their share of all of it.
pub async fn print(pool: &PgPool, phase: &str) {
    let rows = sqlx::query_as::<_, (String, i64, i64, f64, f64, f64)>(
        "WITH s AS ( \
           SELECT query, calls, rows, total_exec_time, mean_exec_time \
           FROM pg_stat_statements \
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())) \
         SELECT query, calls, rows, total_exec_time, mean_exec_time, \
                100 * total_exec_time / nullif(sum(total_exec_time) OVER (), 0) \
         FROM s ORDER BY total_exec_time DESC LIMIT $1",
    )
    .bind(SHOWN)
    .fetch_all(pool)
    .await;
    let Ok(rows) = rows else {
        println!("  statement profile of {phase}: unavailable (no pg_stat_statements)");
        return;
    };
    println!("  statement profile of {phase} (pg_stat_statements, by total execution time):");
    println!(
        "  {:>9} {:>8} {:>10} {:>9} {:>6}  statement",
        "total ms", "calls", "rows", "mean ms", "share"
    );
    for (query, calls, rows, total, mean, share) in rows {
        let text: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
        let text: String = text.chars().take(TEXT_CHARS).collect();
        println!("  {total:>9.0} {calls:>8} {rows:>10} {mean:>9.2} {share:>5.1}%  {text}");
    }
}
