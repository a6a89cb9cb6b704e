//! The command line: configuration (flags win over environment) and subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::app::{self, AppState, Application, Settings};
use crate::db::Database;
use crate::domain::access::{Role, generate_secret, hash_secret};
use crate::store;

#[derive(Debug, Parser)]
#[command(
    name = "taskledger",
    version,
    about = "What each finished GPU task really cost"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// PostgreSQL to use; unset: an embedded cluster kept in the data dir.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Where the embedded cluster keeps its files.
    #[arg(
        long,
        env = "TASKLEDGER_DATA_DIR",
        default_value = "./taskledger-data",
        global = true
    )]
    pub data_dir: PathBuf,
    /// Address the HTTP server listens on.
    #[arg(
        long,
        env = "TASKLEDGER_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub listen: SocketAddr,
    /// IANA time zone where days and months begin.
    #[arg(
        long,
        env = "TASKLEDGER_TIMEZONE",
        default_value = "UTC",
        global = true
    )]
    pub timezone: chrono_tz::Tz,
    /// Database connections per process.
    #[arg(
        long,
        env = "TASKLEDGER_DB_POOL_SIZE",
        default_value_t = 16,
        global = true
    )]
    pub db_pool_size: u32,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending migrations, then serve the API and the dashboard.
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Manage API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Import job records from JSON (an array), NDJSON or CSV files; exits non-zero when
    /// any record was rejected.
    Import {
        /// Files named *.json, *.ndjson, *.jsonl or *.csv.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the monthly report (the same as GET /v1/reports/monthly/{month}).
    Report {
        /// `YYYY-MM` of the ledger time zone.
        #[arg(long, value_parser = crate::domain::values::Month::parse)]
        month: crate::domain::values::Month,
        #[arg(long, value_enum, default_value_t = ReportFormat::Json)]
        format: ReportFormat,
    },
    /// Print the secret that signs alert webhooks, for receivers to verify them.
    WebhookSecret,
    /// Print the OpenAPI document (the committed api/openapi.json).
    Openapi,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print its secret once.
    Create {
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// A project the token acts on (reader and ingest tokens; repeat for several).
        #[arg(long = "project")]
        projects: Vec<String>,
        /// What the token is for.
        #[arg(long, default_value = "cli")]
        name: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Json,
    Csv,
}

fn parse_role(raw: &str) -> Result<Role, String> {
    Role::parse(raw).ok_or_else(|| "use one of admin, finance, reader, ingest".to_owned())
}

/// Runs the command line and turns any failure into a one-line message and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,sqlx=warn,tower_http=info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = cli.config;
    match cli.command {
        Command::Openapi => {
            println!("{}", crate::http::openapi().to_pretty_json()?);
            Ok(())
        }
        Command::Serve => serve(config).await,
        Command::Report { month, format } => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let report = crate::reports::report(
                &database.pool,
                month,
                crate::store::cost::Grouping::Whole,
                &settings(&config),
            )
            .await
            .and_then(|report| report.to_json())
            .and_then(|json| match format {
                ReportFormat::Json => Ok(json),
                ReportFormat::Csv => crate::reports::to_csv(&json),
            });
            database.close().await?;
            let report = report.map_err(|error| anyhow::anyhow!("{error}"))?;
            print!("{report}");
            if format == ReportFormat::Json {
                println!();
            }
            Ok(())
        }
        Command::WebhookSecret => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let secret = webhook_secret(&database.pool).await;
            database.close().await?;
            println!("{}", secret?);
            Ok(())
        }
        Command::Import { files } => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let outcome =
                crate::import::import_files(&database.pool, &files, &settings(&config)).await;
            database.close().await?;
            let summary = outcome?;
            crate::import::print_summary(&summary, 100);
            anyhow::ensure!(
                summary.rejected.is_empty(),
                "{} records were rejected",
                summary.rejected.len()
            );
            Ok(())
        }
        Command::Migrate => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            tracing::info!(
                version = crate::db::latest_migration_version(),
                "database migrated"
            );
            database.close().await
        }
        Command::Token {
            command:
                TokenCommand::Create {
                    role,
                    projects,
                    name,
                },
        } => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let outcome = create_token(&database, role, &projects, &name).await;
            database.close().await?;
            let created = outcome?;
            println!("{}", created.token);
            eprintln!(
                "created {} token {} ({}); the secret above is shown only once",
                created.role.as_str(),
                created.id,
                created.name
            );
            Ok(())
        }
    }
}

fn settings(config: &Config) -> Settings {
    Settings {
        timezone: config.timezone,
        clock: crate::app::Clock::System,
    }
}

/// Opens the database for a one-off command, next to a running `serve` if there is one.
async fn open(config: &Config) -> anyhow::Result<Database> {
    Database::open(
        config.database_url.as_deref(),
        &config.data_dir,
        config.db_pool_size,
        true,
    )
    .await
}

async fn create_token(
    database: &Database,
    role: Role,
    projects: &[String],
    name: &str,
) -> anyhow::Result<crate::http::tokens::CreatedToken> {
    let request = crate::http::tokens::TokenRequest::parse(role, projects, name)
        .map_err(|v| anyhow::anyhow!("{}", describe(v.into_vec())))?;
    crate::http::tokens::issue(&database.pool, request)
        .await
        .map_err(|error| match error {
            crate::error::ApiError::Validation(errors) => anyhow::anyhow!("{}", describe(errors)),
            other => anyhow::anyhow!("{other}"),
        })
}

fn describe(errors: Vec<crate::error::FieldError>) -> String {
    errors
        .into_iter()
        .map(|e| format!("{}: {}", e.pointer.trim_start_matches('/'), e.message))
        .collect::<Vec<_>>()
        .join("; ")
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let database = Database::open(
        config.database_url.as_deref(),
        &config.data_dir,
        config.db_pool_size,
        false,
    )
    .await?;
    let outcome = serve_on(&database, &config).await;
    let closed = database.close().await;
    outcome.and(closed)
}

async fn serve_on(database: &Database, config: &Config) -> anyhow::Result<()> {
    prepare(&database.pool, config).await?;
    bootstrap_admin(&database.pool).await?;
    let state = AppState::new(database.pool.clone(), settings(config));
    let webhooks = crate::workers::webhooks::Webhooks::new(
        database.pool.clone(),
        webhook_secret(&database.pool).await?,
        Default::default(),
    )?;
    let application = Application::bind(state, config.listen).await?;
    tracing::info!(address = %application.local_addr(), "taskledger is ready");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopping = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.changed().await;
        }
    };
    let delivery = tokio::spawn(webhooks.run(stopping()));
    let compaction = tokio::spawn(crate::workers::compaction::run(
        database.pool.clone(),
        crate::workers::compaction::DEFAULT_INTERVAL,
        stopping(),
    ));
    let ticker = tokio::spawn(crate::workers::burn_tick::run(
        database.pool.clone(),
        settings(config),
        crate::workers::burn_tick::DEFAULT_INTERVAL,
        stopping(),
    ));
    let served = application
        .serve_until(async move {
            app::shutdown_signal().await;
            let _ = stop.send(true);
        })
        .await;
    delivery.await?;
    ticker.await?;
    compaction.await?;
    served
}

/// Migrates the database and makes the daily and monthly rollups those of the configured
/// time zone.
async fn prepare(pool: &sqlx::PgPool, config: &Config) -> anyhow::Result<()> {
    crate::db::migrate(pool).await?;
    if crate::store::rollups::align_to_time_zone(pool, config.timezone).await? {
        tracing::info!(
            timezone = config.timezone.name(),
            "daily and monthly rollups built for the ledger time zone"
        );
    }
    Ok(())
}

/// `TASKLEDGER_WEBHOOK_SECRET`, or else a secret generated once and kept in the database so
/// that every replica signs alike.
async fn webhook_secret(pool: &sqlx::PgPool) -> anyhow::Result<String> {
    match std::env::var("TASKLEDGER_WEBHOOK_SECRET") {
        Ok(secret) if !secret.trim().is_empty() => Ok(secret.trim().to_owned()),
        _ => Ok(store::settings::get_or_create(pool, "webhook_secret", generate_secret).await?),
    }
}

/// Makes sure someone can log in: the bootstrap token from the environment, or else a
/// first-start admin token printed once when the database has no token at all.
async fn bootstrap_admin(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    match std::env::var("TASKLEDGER_BOOTSTRAP_TOKEN") {
        Ok(secret) if !secret.trim().is_empty() => {
            store::tokens::ensure_admin(pool, "bootstrap", &hash_secret(secret.trim())).await?;
            tracing::info!("bootstrap admin token from TASKLEDGER_BOOTSTRAP_TOKEN is active");
        }
        _ => {
            let secret = generate_secret();
            if let Some(token) =
                store::tokens::create_first_admin(pool, &hash_secret(&secret)).await?
            {
                println!(
                    "first start: created admin token {} — it is shown only this once:",
                    token.id
                );
                println!("{secret}");
            }
        }
    }
    Ok(())
}
