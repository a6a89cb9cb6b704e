//! Loading the demo into an empty database, through the same use cases as the API: its
//! projects with their budgets, FX rates and contracts, a pool per GPU model with the
//! trace's nodes up over the window, then the job records replayed from the trace (each
//! naming the node it was placed on), posted day by day as they ended (so alerts fire when
//! spend crossed their thresholds), then tokens to look around with.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::config::{Clock, Settings};
use crate::domain::access::{Actor, Role};
use crate::domain::capacity::{PoolSettings, ShareIdle, parse_intervals};
use crate::domain::idle;
use crate::domain::project::NewProject;
use crate::domain::validation::Violations;
use crate::domain::values::Currency;
use crate::ledger::sources::{self, SourceSummary};
use crate::ledger::tokens::{self, CreatedToken, TokenRequest};
use crate::ledger::{
    LedgerError, LedgerResult, alerting, capacity, carbon, pricing, projects, zombies,
};
use crate::sources::batch::SourceBatch;
use crate::sources::demo::{self, DemoProject, PROJECTS, Window};
use crate::store::contracts::ContractFields;

/// Who the audit log says made the demo's changes.
fn actor() -> Actor {
    Actor::system("demo")
}

/// The thresholds of every demo project, the API's default.
const THRESHOLDS: [i32; 3] = [50, 80, 100];

/// The projects the demo's reader token may read.
pub const READER_PROJECTS: [&str; 2] = ["llm", "vision"];

/// What the demo loaded.
#[derive(Debug)]
pub struct Loaded {
    pub window: Window,
    /// What became of the trace's pods.
    pub records: SourceSummary,
    /// Each project's monthly budget, in its currency, in the order of [`PROJECTS`].
    pub budgets: Vec<(&'static DemoProject, Decimal)>,
    /// GPUs the reserved contract commits.
    pub committed_gpus: Decimal,
    pub tokens: DemoTokens,
}

/// Fresh tokens, their secrets shown once.
#[derive(Debug)]
pub struct DemoTokens {
    pub admin: CreatedToken,
    pub finance: CreatedToken,
    /// A reader of [`READER_PROJECTS`].
    pub reader: CreatedToken,
}

/// Loads the demo whose data ends at `until` (at most `settings`' now): the month before
/// `until`'s complete, `until`'s month up to it. The database must hold none of the demo's
/// projects. Deterministic for a given `until` and time zone, the tokens' secrets aside.
pub async fn load(
    pool: &PgPool,
    until: DateTime<Utc>,
    settings: &Settings,
) -> LedgerResult<Loaded> {
    if until > settings.clock.now() {
        return Err(LedgerError::invalid(
            "/until",
            "the demo's data cannot end in the future",
        ));
    }
    let window = Window::ending_at(until, settings.timezone);
    let data = demo::demo(window).map_err(|error| {
        LedgerError::Internal(anyhow::anyhow!("the shipped trace cannot be read: {error}"))
    })?;
    let mut budgets = Vec::new();
    for (project, budget) in &data.budgets {
        let budget = budget.ok_or_else(|| {
            LedgerError::Internal(anyhow::anyhow!(
                "project `{}` spends nothing in {}",
                project.id,
                window.previous
            ))
        })?;
        create_project(pool, project, budget).await?;
        budgets.push((*project, budget));
    }
    let usd = currency("USD")?;
    for rate in &data.fx_rates {
        pricing::put_fx_rate(
            pool,
            (rate.month, usd, currency(rate.to)?),
            rate.rate,
            &actor(),
            settings,
        )
        .await?;
    }
    for month in [window.previous, window.current] {
        carbon::put_grid_intensity(
            pool,
            (month, demo::OWNED_REGION),
            Decimal::from(demo::OWNED_REGION_G_CO2E_PER_KWH),
            &actor(),
        )
        .await?;
    }
    let mut committed_gpus = Decimal::ZERO;
    for contract in &data.contracts {
        committed_gpus += contract.committed_gpus.unwrap_or_default();
        let fields = ContractFields {
            name: contract.name.clone(),
            gpu_model: contract.gpu_model.to_owned(),
            billing_mode: contract.billing_mode,
            price_per_gpu_hour: contract.price_per_gpu_hour,
            currency: usd.code().to_owned(),
            valid_from: contract.valid_from,
            valid_until: contract.valid_until,
            project_id: None,
            provider: None,
            region: None,
            committed_gpus: contract.committed_gpus,
            tco: contract.tco.clone(),
        };
        pricing::create_contract(
            pool,
            Some(fields),
            Violations::default(),
            None,
            &actor(),
            settings,
        )
        .await?;
    }
    for demo_pool in &data.pools {
        let rule = PoolSettings {
            name: demo_pool.name.clone(),
            owner_project: None,
            share_idle: ShareIdle::Pool,
            zombie_after_minutes: Some(demo::ZOMBIE_AFTER_MINUTES),
        };
        capacity::put_pool(pool, &demo_pool.id, &rule, &actor()).await?;
    }
    let intervals = parse_intervals(&data.capacity, settings.clock.now())?;
    capacity::post_capacity(pool, intervals, false, settings.timezone, &actor()).await?;
    let mut records = SourceSummary::of(&data.batch);
    for post in &data.posts {
        let batch = SourceBatch {
            records: data.batch.records[post.records.clone()].to_vec(),
            ..SourceBatch::default()
        };
        let then = Settings {
            clock: Clock::Fixed(post.at),
            ..*settings
        };
        let stored = sources::store(pool, batch, &then).await?;
        records.accepted += stored.accepted;
        records.duplicates += stored.duplicates;
        records.problems.extend(stored.problems);
    }
    if let Some(problem) = records.problems.first() {
        return Err(LedgerError::Internal(anyhow::anyhow!(
            "the demo's records were refused ({} problems), first {}: {}",
            records.problems.len(),
            problem.location,
            problem.reason
        )));
    }
    // Once more as of now, for what the days since the last post moved (a forecast).
    let months = PROJECTS.iter().flat_map(|project| {
        [window.previous, window.current].map(|month| (project.id.to_owned(), month))
    });
    alerting::evaluate_all(pool, months, settings).await;
    zombies::judge(pool, None, settings).await?;
    Ok(Loaded {
        window,
        records,
        budgets,
        committed_gpus,
        tokens: issue_tokens(pool).await?,
    })
}

fn currency(code: &str) -> LedgerResult<Currency> {
    Currency::parse(code).map_err(|error| LedgerError::Internal(anyhow::anyhow!(error)))
}

async fn create_project(pool: &PgPool, project: &DemoProject, budget: Decimal) -> LedgerResult<()> {
    let new = NewProject {
        id: project.id.to_owned(),
        name: project.name.to_owned(),
        team: Some(project.team.to_owned()),
        currency: project.currency.to_owned(),
        default_monthly_budget: Some(budget),
        alert_thresholds: THRESHOLDS.to_vec(),
        webhook_url: None,
        idle_gpu_threshold: Some(idle::DEFAULT_THRESHOLD),
        idle_gpu_min_gpu_hours: idle::DEFAULT_MIN_GPU_HOURS,
    };
    match projects::create(pool, &new, &actor()).await? {
        Some(_) => Ok(()),
        None => Err(LedgerError::conflict(format!(
            "project `{}` exists already: the demo loads into an empty database",
            project.id
        ))),
    }
}

async fn issue_tokens(pool: &PgPool) -> LedgerResult<DemoTokens> {
    let readers: Vec<String> = READER_PROJECTS.iter().map(|&p| p.to_owned()).collect();
    let issue = |role: Role, projects: Vec<String>, name: &'static str| async move {
        let request = TokenRequest::parse(role, &projects, name)?;
        tokens::issue(pool, request, &actor()).await
    };
    Ok(DemoTokens {
        admin: issue(Role::Admin, Vec::new(), "demo admin").await?,
        finance: issue(Role::Finance, Vec::new(), "demo finance").await?,
        reader: issue(Role::Reader, readers, "demo reader").await?,
    })
}
