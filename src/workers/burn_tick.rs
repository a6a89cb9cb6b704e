//! Re-evaluates budget burn periodically: spend grows with accrued unused commitment even
//! when no record arrives, and a forecast crosses the budget as the month goes by.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::Settings;

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

pub async fn run(
    pool: PgPool,
    settings: Settings,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        crate::ledger::alerting::evaluate_current_month(&pool, &settings).await;
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
