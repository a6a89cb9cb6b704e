//! Loading the demo into an empty database, through the same use cases as the API: its
//! projects, FX rates and contracts, then the job records replayed from the trace, then
//! budgets set from what the complete month spent, then tokens to look around with.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::access::Role;
use crate::domain::demo::{self, DemoProject, PROJECTS, Window};
use crate::domain::idle;
use crate::domain::validation::Violations;
use crate::domain::values::{Currency, Month};
use crate::ledger::cost::{CostOf, month_spend};
use crate::ledger::sources::{self, SourceSummary};
use crate::ledger::tokens::{self, CreatedToken, TokenRequest};
use crate::ledger::{LedgerError, LedgerResult, alerting, pricing, projects};
use crate::store;
use crate::store::contracts::ContractFields;
use crate::store::projects::{NewProject, ProjectChanges};

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
    for project in &PROJECTS {
        create_project(pool, project).await?;
    }
    let usd = currency("USD")?;
    for rate in &data.fx_rates {
        pricing::put_fx_rate(
            pool,
            (rate.month, usd, currency(rate.to)?),
            rate.rate,
            settings,
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
        };
        pricing::create_contract(pool, Some(fields), Violations::default(), None, settings).await?;
    }
    let records = sources::store(pool, data.batch, settings).await?;
    if let Some(problem) = records.problems.first() {
        return Err(LedgerError::Internal(anyhow::anyhow!(
            "the demo's records were refused ({} problems), first {}: {}",
            records.problems.len(),
            problem.location,
            problem.reason
        )));
    }
    let mut budgets = Vec::new();
    for project in &PROJECTS {
        budgets.push((
            project,
            set_budget(pool, project, window.previous, settings).await?,
        ));
    }
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

async fn create_project(pool: &PgPool, project: &DemoProject) -> LedgerResult<()> {
    let new = NewProject {
        id: project.id.to_owned(),
        name: project.name.to_owned(),
        team: Some(project.team.to_owned()),
        currency: project.currency.to_owned(),
        default_monthly_budget: None,
        alert_thresholds: THRESHOLDS.to_vec(),
        webhook_url: None,
        idle_gpu_threshold: Some(idle::DEFAULT_THRESHOLD),
        idle_gpu_min_gpu_hours: idle::DEFAULT_MIN_GPU_HOURS,
    };
    match store::projects::insert(pool, &new).await? {
        Some(_) => Ok(()),
        None => Err(LedgerError::conflict(format!(
            "project `{}` exists already: the demo loads into an empty database",
            project.id
        ))),
    }
}

/// Sets the project's monthly budget so that the complete month's spend reaches its target
/// share of it, and evaluates that month (setting the default evaluates the current one):
/// the alerts the spend crossed fire.
async fn set_budget(
    pool: &PgPool,
    project: &DemoProject,
    complete: Month,
    settings: &Settings,
) -> LedgerResult<Decimal> {
    let spend = {
        let mut conn = pool.acquire().await?;
        let of = CostOf {
            project: project.id,
            currency: project.currency,
        };
        month_spend(
            &mut conn,
            of,
            complete.first_day(),
            settings.clock.now(),
            settings.timezone,
        )
        .await?
    };
    let budget = demo::budget_for(spend, project.target_burn_pct).ok_or_else(|| {
        LedgerError::Internal(anyhow::anyhow!(
            "project `{}` spent nothing in {complete}",
            project.id
        ))
    })?;
    let changes = ProjectChanges {
        default_monthly_budget: Some(Some(budget)),
        ..ProjectChanges::default()
    };
    projects::update(pool, project.id, &changes, settings).await?;
    alerting::evaluate_all(pool, [(project.id.to_owned(), complete)], settings).await;
    Ok(budget)
}

async fn issue_tokens(pool: &PgPool) -> LedgerResult<DemoTokens> {
    let readers: Vec<String> = READER_PROJECTS.iter().map(|&p| p.to_owned()).collect();
    let issue = |role: Role, projects: Vec<String>, name: &'static str| async move {
        let request = TokenRequest::parse(role, &projects, name)?;
        tokens::issue(pool, request).await
    };
    Ok(DemoTokens {
        admin: issue(Role::Admin, Vec::new(), "demo admin").await?,
        finance: issue(Role::Finance, Vec::new(), "demo finance").await?,
        reader: issue(Role::Reader, readers, "demo reader").await?,
    })
}
