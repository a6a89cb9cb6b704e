//! The command line: configuration (flags win over environment), subcommands, and the
//! one-off commands (`serve` is the server's).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{Clock, Settings};
use crate::domain::access::{Actor, Role};
use crate::domain::figures::Grouping;
use crate::domain::reservation_plan::PlanRequest;
use crate::domain::validation::FieldError;
use crate::domain::values::{Month, ProjectId};
use crate::domain::what_if::WhatIf;
use crate::ledger::import::{self, Summary};
use crate::ledger::setup::Database;
use crate::ledger::tokens::{self, CreatedToken, TokenRequest};
use crate::ledger::{LedgerError, planning, reports, sacct_import, setup, sources};
use crate::sources::batch::SourceBatch;
use crate::sources::slurm::text::TextOptions;
use crate::sources::slurm::{self, Format, Mapping};

/// The data dir when none is given.
pub const DEFAULT_DATA_DIR: &str = "./taskledger-data";

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
        default_value = DEFAULT_DATA_DIR,
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
    /// The longest a job record may last, in days; longer ones are refused.
    #[arg(
        long,
        env = "TASKLEDGER_MAX_RECORD_DAYS",
        default_value_t = 31,
        value_parser = clap::value_parser!(u32).range(1..=3660),
        global = true
    )]
    pub max_record_days: u32,
    /// Database connections per process.
    #[arg(
        long,
        env = "TASKLEDGER_DB_POOL_SIZE",
        default_value_t = 16,
        global = true
    )]
    pub db_pool_size: u32,
    /// How long SIGTERM waits for requests in flight before closing them, in seconds.
    #[arg(
        long,
        env = "TASKLEDGER_SHUTDOWN_GRACE_SECONDS",
        default_value_t = 30,
        global = true
    )]
    pub shutdown_grace_seconds: u64,
    /// How often budget burn is re-evaluated, in seconds (shared by all replicas).
    #[arg(
        long,
        env = "TASKLEDGER_BURN_TICK_SECONDS",
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub burn_tick_seconds: Option<u64>,
    /// How often rollups are compacted, in seconds.
    #[arg(
        long,
        env = "TASKLEDGER_COMPACTION_SECONDS",
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub compaction_seconds: Option<u64>,
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
    /// Import job records from JSON (an array), NDJSON or CSV files, or Slurm's accounting
    /// with --format; exits non-zero when any record was rejected.
    Import {
        /// Files named *.json, *.ndjson, *.jsonl or *.csv; with --format, any files, or `-`
        /// for standard input.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Read Slurm's output: `slurm-json` is `sacct --json`, `sacct` is
        /// `sacct --parsable`/`--parsable2` text with its header (nothing is stored when any
        /// job cannot be read); `sinfo-json` is node listings (`scontrol show nodes --json`,
        /// `sinfo --json`), one file per moment, stored as the GPU nodes' capacity; `focus`
        /// is a cloud bill (FOCUS 1.0–1.2 CSV, gzip accepted), as POST /v1/bills stores it.
        #[arg(long, value_enum)]
        format: Option<ImportFormat>,
        #[command(flatten)]
        slurm: SlurmImportArgs,
        /// The pool the GPU instances of a bill (focus) that no collector reported go to
        /// (default `billed-<provider>`, created when missing).
        #[arg(long)]
        pool: Option<String>,
    },
    /// Collect finished jobs from a scheduler for a time window and post them to a server or
    /// store them locally; run it every few minutes from a timer.
    Collect {
        #[command(subcommand)]
        source: CollectSource,
    },
    /// Print the monthly report (the same as GET /v1/reports/monthly/{month}).
    Report {
        /// `YYYY-MM` of the ledger time zone.
        #[arg(long, value_parser = Month::parse)]
        month: Month,
        #[arg(long, value_enum, default_value_t = ReportFormat::Json)]
        format: ReportFormat,
    },
    /// Plan commitments from the ledger's own hourly use.
    Plan {
        #[command(subcommand)]
        what: PlanCommand,
    },
    /// Print the secret that signs alert webhooks, for receivers to verify them.
    WebhookSecret,
    /// Work with a Citus cluster (the database of --database-url is its coordinator).
    Citus {
        #[command(subcommand)]
        command: CitusCommand,
    },
    /// Print the OpenAPI document (the committed api/openapi.json).
    Openapi,
    /// Serve a demo to look around in: a fresh data dir (a temporary one, removed on exit,
    /// unless --data-dir names an empty or earlier demo dir) loaded with five weeks of a real
    /// GPU cluster as five projects' jobs; prints the dashboard's address and tokens.
    Demo {
        /// Where the demo's data ends (RFC 3339, or YYYY-MM-DD in the ledger time zone): its
        /// month so far and the whole month before are filled. Default: now.
        #[arg(long)]
        until: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PlanCommand {
    /// How many GPUs of a model to reserve: the cost of committing each number of GPUs over
    /// the window, the cheapest, the reservations held against break-even, and spot (the
    /// same as GET /v1/planning/reservations).
    Reservations(PlanArgs),
}

/// The question of `plan reservations`; each option is the API's parameter of that name.
#[derive(Debug, Args)]
pub struct PlanArgs {
    #[arg(long)]
    pub gpu_model: String,
    /// Only records naming a node of this pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Only records of this provider.
    #[arg(long)]
    pub provider: Option<String>,
    /// `YYYY-MM` of the ledger time zone, instead of --from and --to.
    #[arg(long)]
    pub month: Option<String>,
    /// A date `YYYY-MM-DD` or an RFC 3339 time starting a ledger hour; without a window, the
    /// 30 ledger days before today.
    #[arg(long)]
    pub from: Option<String>,
    #[arg(long)]
    pub to: Option<String>,
    /// Per GPU-hour in --currency; default: the contract in force.
    #[arg(long)]
    pub reserved_price: Option<String>,
    #[arg(long)]
    pub on_demand_price: Option<String>,
    #[arg(long)]
    pub spot_price: Option<String>,
    #[arg(long)]
    pub currency: Option<String>,
    #[arg(long, value_enum, default_value_t = PlanFormat::Table)]
    pub format: PlanFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
    SlurmJson,
    Sacct,
    /// Node listings (`scontrol show nodes --json` or `sinfo --json`), one file per moment:
    /// the GPU nodes' capacity between them.
    SinfoJson,
    /// A cloud bill: a FOCUS 1.0–1.2 CSV (gzip accepted).
    Focus,
}

/// How Slurm's accounts and GPU types become projects and GPU models.
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct SlurmMappingArgs {
    /// Put every job in this project (required when the output has no Account field).
    #[arg(long, value_parser = parse_project)]
    pub project: Option<ProjectId>,
    /// ACCOUNT=PROJECT: the project of a Slurm account (repeat); other accounts are their own
    /// project, as a slug.
    #[arg(long = "project-map", value_name = "ACCOUNT=PROJECT", value_parser = parse_project_map)]
    pub project_map: Vec<(String, ProjectId)>,
    /// PARTITION=MODEL: the model of a partition's GPUs where Slurm accounted them without a
    /// type (repeat); otherwise they are `unknown`, shown as unrated.
    #[arg(long = "gpu-model", value_name = "PARTITION=MODEL", value_parser = parse_pair)]
    pub gpu_models: Vec<(String, String)>,
}

impl SlurmMappingArgs {
    pub fn mapping(&self) -> Mapping {
        Mapping {
            project: self.project.clone(),
            projects: self.project_map.iter().cloned().collect(),
            gpu_models: self.gpu_models.iter().cloned().collect(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct SlurmImportArgs {
    #[command(flatten)]
    pub mapping: SlurmMappingArgs,
    /// The --delimiter sacct was run with (text only); read off the header when not given.
    #[arg(long)]
    pub delimiter: Option<String>,
    /// IANA time zone of sacct's times that carry no offset (text only; default: this
    /// machine's).
    #[arg(long = "source-timezone")]
    pub source_timezone: Option<chrono_tz::Tz>,
    /// When a node listing was taken (sinfo-json, one file without Slurm's `last_update`):
    /// RFC 3339, or `YYYY-MM-DD` in the ledger time zone.
    #[arg(long)]
    pub taken_at: Option<String>,
    /// The billing mode of the listed nodes (sinfo-json; default on_demand).
    #[arg(long, value_parser = parse_billing_mode)]
    pub node_billing_mode: Option<crate::domain::rating::BillingMode>,
    /// Listings further apart than this do not extend a node's interval (sinfo-json;
    /// default 1h).
    #[arg(long, value_parser = parse_duration)]
    pub max_node_gap: Option<chrono::TimeDelta>,
}

#[derive(Debug, Subcommand)]
pub enum CollectSource {
    /// Run sacct for the window; jobs map as `import --format sacct` maps them.
    Slurm(Box<SlurmCollectArgs>),
    /// Ask Prometheus for the Kubernetes GPU pods that finished in the window
    /// (kube-state-metrics) and what their GPUs did (dcgm-exporter); one record per pod.
    Prometheus(Box<PrometheusCollectArgs>),
}

/// What every collector takes: where the records go and which window it reads.
#[derive(Debug, Clone, Args)]
pub struct CollectorArgs {
    /// Post to this taskledger server with the ingest token in TASKLEDGER_TOKEN; without it,
    /// store in the local database (DATABASE_URL or the embedded cluster).
    #[arg(long, env = "TASKLEDGER_SERVER")]
    pub server: Option<url::Url>,
    /// A file remembering where the last successful run stopped; the next run starts there.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Start of the window (RFC 3339, or YYYY-MM-DD in the ledger time zone); default: where
    /// --state stopped less --overlap, else 24 hours ago.
    #[arg(long)]
    pub since: Option<String>,
    /// End of the window (as --since); default: now.
    #[arg(long)]
    pub until: Option<String>,
    /// How far before where the last run stopped to read again, for jobs recorded late
    /// (`90s`, `10m`, `2h`, `1d`).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub overlap: chrono::TimeDelta,
    /// Keep running, collecting again this long (`5m`) after each run started, until SIGTERM;
    /// a failed run is reported and the next one reads its window again. Needs --state.
    #[arg(long, value_parser = parse_duration, requires = "state", conflicts_with_all = ["since", "until"])]
    pub every: Option<chrono::TimeDelta>,
}

#[derive(Debug, Clone, Args)]
pub struct SlurmCollectArgs {
    #[command(flatten)]
    pub run: CollectorArgs,
    /// The sacct to run.
    #[arg(long, default_value = "sacct")]
    pub sacct: PathBuf,
    /// Another argument for sacct (repeat), e.g. --sacct-arg=--clusters=a,b.
    #[arg(long = "sacct-arg", allow_hyphen_values = true)]
    pub sacct_args: Vec<String>,
    /// The command listing the nodes as JSON, run on each run for node capacity.
    #[arg(long, default_value = "scontrol")]
    pub nodes_command: PathBuf,
    /// Its arguments (repeat to replace the default `show nodes --json`; `--json` for sinfo).
    #[arg(long = "nodes-arg", allow_hyphen_values = true)]
    pub nodes_args: Vec<String>,
    /// Read no node capacity: only jobs become records.
    #[arg(long)]
    pub no_capacity: bool,
    /// The billing mode of the nodes (`on_demand`, `reserved` for owned or committed
    /// nodes, `spot`).
    #[arg(long, default_value = "on_demand", value_parser = parse_billing_mode)]
    pub node_billing_mode: crate::domain::rating::BillingMode,
    /// Snapshots further apart than this do not extend a node's interval across the gap:
    /// nothing is counted for the time nothing was seen.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub max_node_gap: chrono::TimeDelta,
    #[command(flatten)]
    pub mapping: SlurmMappingArgs,
}

#[derive(Debug, Clone, Args)]
pub struct PrometheusCollectArgs {
    #[command(flatten)]
    pub run: CollectorArgs,
    /// Prometheus' base URL, e.g. http://prometheus-server.monitoring.svc:9090 (a bearer
    /// token, if it needs one, in TASKLEDGER_PROMETHEUS_TOKEN).
    #[arg(long, env = "TASKLEDGER_PROMETHEUS")]
    pub prometheus: url::Url,
    /// Label matchers added to every query, e.g. `cluster="gpu-a"` where one Prometheus holds
    /// several clusters.
    #[arg(long, default_value = "")]
    pub selector: String,
    /// The scrape interval of kube-state-metrics: times are read to this resolution.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub resolution: chrono::TimeDelta,
    /// How long after a pod ended its metrics count as complete, and how long a pod no
    /// longer reported must stay unseen to count as gone; at most --overlap.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub settle: chrono::TimeDelta,
    /// How far before the window's pods the earlier pods (attempts) of their tasks are
    /// looked for.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub attempt_lookback: chrono::TimeDelta,
    /// The longest one query may take (`90s`, `2m`).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub query_timeout: chrono::TimeDelta,
    /// About how many pods are read and delivered at a time: a window of more is read in
    /// pages of this many, cut by pod UID, so memory grows with the page, not the cluster.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub page_pods: u32,
    /// Read no node capacity: only pods become records.
    #[arg(long)]
    pub no_capacity: bool,
    /// A node label naming the node's pool (repeat; the first a node has wins); default
    /// cloud.google.com/gke-nodepool, eks.amazonaws.com/nodegroup, karpenter.sh/nodepool,
    /// kubernetes.azure.com/agentpool.
    #[arg(long = "pool-label", value_name = "KEY", value_parser = parse_label_key)]
    pub pool_labels: Vec<String>,
    /// The pool of GPU nodes with none of the pool labels.
    #[arg(long, default_value = "default")]
    pub default_pool: String,
    /// The billing mode of GPU nodes whose labels do not mark them spot (`on_demand`,
    /// `reserved` for owned or committed nodes).
    #[arg(long, default_value = "on_demand", value_parser = parse_billing_mode)]
    pub node_billing_mode: crate::domain::rating::BillingMode,
    /// The pod label naming the project; default, or on pods without it: the namespace.
    #[arg(long)]
    pub project_label: Option<String>,
    /// A file of NAME=PROJECT lines: the project of a namespace (or --project-label value);
    /// others are their own project, as a slug.
    #[arg(long)]
    pub project_map: Option<PathBuf>,
    /// The pod label naming the task (e.g. `app.kubernetes.io/instance`); default, or on pods
    /// without it: the Job owning the pod, else the pod's name.
    #[arg(long)]
    pub task_label: Option<String>,
    /// A pod label to copy into the record's labels (repeat).
    #[arg(long = "label", value_name = "KEY", value_parser = parse_label_key)]
    pub labels: Vec<String>,
    /// NAME=MODEL: the GPU model of records whose GPUs DCGM (or the node's
    /// nvidia.com/gpu.product label) names NAME (repeat), as contracts name it.
    #[arg(long = "gpu-model", value_name = "NAME=MODEL", value_parser = parse_pair)]
    pub gpu_models: Vec<(String, String)>,
}

fn parse_billing_mode(raw: &str) -> Result<crate::domain::rating::BillingMode, String> {
    crate::domain::rating::BillingMode::parse(raw)
        .ok_or_else(|| format!("`{raw}` is not a billing mode: on_demand, spot or reserved"))
}

/// A Kubernetes label key that is also a record label key.
fn parse_label_key(raw: &str) -> Result<String, String> {
    let valid = !raw.is_empty()
        && raw.len() <= crate::domain::record::MAX_LABEL_KEY_CHARS
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    valid.then(|| raw.to_owned()).ok_or_else(|| {
        format!("`{raw}` is not a label key of at most 64 letters, digits, `_`, `-`, `.` or `/`")
    })
}

fn parse_project(raw: &str) -> Result<ProjectId, String> {
    ProjectId::parse(raw)
}

fn parse_pair(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.trim().is_empty() => {
            Ok((key.to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!("`{raw}` is not KEY=VALUE")),
    }
}

fn parse_project_map(raw: &str) -> Result<(String, ProjectId), String> {
    let (account, project) = parse_pair(raw)?;
    Ok((account, ProjectId::parse(&project)?))
}

/// `90s`, `10m`, `2h` or `1d`.
fn parse_duration(raw: &str) -> Result<chrono::TimeDelta, String> {
    let error = || format!("`{raw}` is not a duration such as 90s, 10m, 2h or 1d");
    let unit = raw.chars().last().ok_or_else(error)?;
    let number: i64 = raw[..raw.len() - unit.len_utf8()]
        .parse()
        .map_err(|_| error())?;
    match unit {
        's' => Ok(chrono::TimeDelta::seconds(number)),
        'm' => Ok(chrono::TimeDelta::minutes(number)),
        'h' => Ok(chrono::TimeDelta::hours(number)),
        'd' => Ok(chrono::TimeDelta::days(number)),
        _ => Err(error()),
    }
}

#[derive(Debug, Subcommand)]
pub enum CitusCommand {
    /// Apply pending migrations, then make the reference tables and distribute the others by
    /// project, co-located; on an empty or a populated database, and again after an upgrade
    /// added tables (what is placed already is left as it is).
    Distribute {
        /// Shards per distributed table (all are co-located, so they share it); Citus'
        /// `citus.shard_count` when not given (32). Fewer shards cost a statement that spans
        /// every project less; more let a rebalance spread the projects finer. Applies only
        /// when the tables are first distributed.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
        shard_count: Option<u32>,
    },
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

impl Config {
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_seconds)
    }

    /// The burn tick's interval, when configured.
    pub fn burn_tick_interval(&self) -> Option<Duration> {
        self.burn_tick_seconds.map(Duration::from_secs)
    }

    /// The compaction interval, when configured.
    pub fn compaction_interval(&self) -> Option<Duration> {
        self.compaction_seconds.map(Duration::from_secs)
    }

    pub fn settings(&self) -> Settings {
        Settings {
            timezone: self.timezone,
            clock: Clock::System,
            max_record_duration: chrono::TimeDelta::days(i64::from(self.max_record_days)),
        }
    }
}

/// Runs a one-off command (every command but `serve`).
pub async fn run(config: Config, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve | Command::Openapi | Command::Collect { .. } | Command::Demo { .. } => {
            anyhow::bail!(
                "`serve`, `openapi`, `collect` and `demo` are the server's, not one-off commands"
            )
        }
        Command::Report { month, format } => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let report = reports::report(
                &database.pool,
                month,
                Grouping::Whole,
                &WhatIf::default(),
                &config.settings(),
            )
            .await
            .and_then(|report| report.to_json())
            .and_then(|json| match format {
                ReportFormat::Json => Ok(json),
                ReportFormat::Csv => reports::to_csv(&json),
            });
            database.close().await?;
            let report = report.map_err(|error| anyhow::anyhow!("{error}"))?;
            print!("{report}");
            if format == ReportFormat::Json {
                println!();
            }
            Ok(())
        }
        Command::Plan {
            what: PlanCommand::Reservations(args),
        } => plan_reservations(&config, &args).await,
        Command::WebhookSecret => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let secret =
                setup::webhook_secret(&database.pool, webhook_secret_env().as_deref()).await;
            database.close().await?;
            println!("{}", secret?);
            Ok(())
        }
        Command::Import {
            files,
            format: Some(format),
            slurm,
            ..
        } => import_slurm(&config, &files, format, &slurm).await,
        Command::Import { files, slurm, .. } => {
            anyhow::ensure!(
                slurm == SlurmImportArgs::default(),
                "--project, --project-map, --gpu-model, --delimiter, --source-timezone, \
                 --taken-at, --node-billing-mode and --max-node-gap read Slurm's output: give \
                 --format slurm-json, sacct or sinfo-json"
            );
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let outcome = import::import_files(&database.pool, &files, &config.settings()).await;
            database.close().await?;
            let summary = outcome?;
            print_summary(&summary, 100);
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
            tracing::info!(version = setup::latest_migration(), "database migrated");
            database.close().await
        }
        Command::Citus {
            command: CitusCommand::Distribute { shard_count },
        } => {
            let database = open(&config).await?;
            prepare(&database.pool, &config).await?;
            let done = crate::ledger::citus::distribute(&database.pool, shard_count).await?;
            println!(
                "{} reference tables made, {} tables distributed by project, {} placed already",
                done.made_reference.len(),
                done.distributed.len(),
                done.already
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

/// `import --format slurm-json|sacct`: every file is read and converted first; nothing is
/// stored when any job of any of them cannot be read. sacct's text is read in runs of lines
/// (see [`sacct_import`]); `sacct --json` is one document, read whole.
async fn import_slurm(
    config: &Config,
    files: &[PathBuf],
    format: ImportFormat,
    args: &SlurmImportArgs,
) -> anyhow::Result<()> {
    let format = match format {
        ImportFormat::SlurmJson => Format::Json,
        ImportFormat::SinfoJson => anyhow::bail!("node listings are imported as capacity"),
        ImportFormat::Focus => anyhow::bail!("bills are imported as bills"),
        ImportFormat::Sacct => Format::Text(TextOptions {
            delimiter: args.delimiter.clone(),
            timezone: match args.source_timezone {
                Some(tz) => tz,
                None => machine_timezone()?,
            },
        }),
    };
    let mapping = args.mapping.mapping();
    if let Format::Text(options) = &format {
        let mut inputs = Vec::with_capacity(files.len());
        for file in files {
            inputs.push(if file.as_os_str() == "-" {
                sacct_import::Input::stdin()?
            } else {
                anyhow::ensure!(
                    file.is_file(),
                    "cannot read {}: no such file",
                    file.display()
                );
                sacct_import::Input::file(file.clone())
            });
        }
        let database = open(config).await?;
        prepare(&database.pool, config).await?;
        let outcome = sacct_import::import(
            &database.pool,
            &inputs,
            options,
            &mapping,
            &config.settings(),
        )
        .await;
        database.close().await?;
        return report_slurm(outcome?);
    }
    let mut batch = SourceBatch::default();
    for file in files {
        let (name, text) = read_input(file)?;
        batch.absorb(slurm::batch(&format, &name, &text, &mapping));
    }
    let database = open(config).await?;
    prepare(&database.pool, config).await?;
    let outcome = sources::store(&database.pool, batch, &config.settings()).await;
    database.close().await?;
    report_slurm(outcome?)
}

/// A file given to `import` whole, with the name it is shown by; `-` is standard input.
pub fn read_input(file: &std::path::Path) -> anyhow::Result<(String, String)> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read standard input")?;
        Ok(("stdin".to_owned(), text))
    } else {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        Ok((file.display().to_string(), text))
    }
}

/// Prints an import's summary; an error when anything could not be read or stored.
fn report_slurm(summary: sources::SourceSummary) -> anyhow::Result<()> {
    print!("{}", summary.render(100));
    anyhow::ensure!(
        !summary.failed(),
        "{} problems; nothing of a batch with one was stored",
        summary.problems.len()
    );
    Ok(())
}

/// This machine's IANA time zone.
pub fn machine_timezone() -> anyhow::Result<chrono_tz::Tz> {
    let name = std::env::var("TZ")
        .ok()
        .map(|tz| tz.trim_start_matches(':').to_owned())
        .filter(|tz| !tz.is_empty())
        .map_or_else(iana_time_zone::get_timezone, Ok)
        .context("cannot tell this machine's time zone; give --source-timezone")?;
    name.parse()
        .map_err(|_| anyhow::anyhow!("`{name}` is not an IANA time zone; give --source-timezone"))
}

/// Opens the database for a one-off command, next to a running `serve` if there is one.
pub async fn open(config: &Config) -> anyhow::Result<Database> {
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
) -> anyhow::Result<CreatedToken> {
    let request = TokenRequest::parse(role, projects, name)
        .map_err(|v| anyhow::anyhow!("{}", describe(v.into_vec())))?;
    tokens::issue(&database.pool, request, &Actor::system("cli"))
        .await
        .map_err(|error| match error {
            LedgerError::Invalid(errors) => anyhow::anyhow!("{}", describe(errors)),
            other => anyhow::anyhow!("{other}"),
        })
}

/// `plan reservations`: the plan, as a table or as the API's JSON.
async fn plan_reservations(config: &Config, args: &PlanArgs) -> anyhow::Result<()> {
    let settings = config.settings();
    let query = PlanRequest {
        gpu_model: Some(&args.gpu_model),
        pool: args.pool.as_deref(),
        provider: args.provider.as_deref(),
        month: args.month.as_deref(),
        from: args.from.as_deref(),
        to: args.to.as_deref(),
        reserved_price: args.reserved_price.as_deref(),
        on_demand_price: args.on_demand_price.as_deref(),
        spot_price: args.spot_price.as_deref(),
        currency: args.currency.as_deref(),
    }
    .parse(settings.timezone, chrono::Utc::now())
    .map_err(|violations| anyhow::anyhow!(describe_options(violations.into_vec())))?;
    let database = open(config).await?;
    prepare(&database.pool, config).await?;
    let plan = planning::reservations(&database.pool, &query, settings.timezone).await;
    database.close().await?;
    let plan = plan.map_err(|error| match error {
        LedgerError::Invalid(errors) => anyhow::anyhow!(describe_options(errors)),
        other => anyhow::anyhow!("{other}"),
    })?;
    match args.format {
        PlanFormat::Table => print!("{}", plan.to_table()),
        PlanFormat::Json => println!("{}", serde_json::to_string(&plan)?),
    }
    Ok(())
}

/// Field errors named by the command-line option they come from (`query:on_demand_price`
/// is `--on-demand-price`).
fn describe_options(errors: Vec<FieldError>) -> String {
    errors
        .into_iter()
        .map(|e| {
            let option = e.pointer.trim_start_matches("query:").replace('_', "-");
            format!("--{option}: {}", e.message)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn describe(errors: Vec<FieldError>) -> String {
    errors
        .into_iter()
        .map(|e| format!("{}: {}", e.pointer.trim_start_matches('/'), e.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Migrates the database and makes the daily and monthly rollups those of the configured
/// time zone.
pub async fn prepare(pool: &sqlx::PgPool, config: &Config) -> anyhow::Result<()> {
    if setup::prepare(pool, config.timezone).await? {
        tracing::info!(
            timezone = config.timezone.name(),
            "daily and monthly rollups built for the ledger time zone"
        );
    }
    Ok(())
}

/// `TASKLEDGER_WEBHOOK_SECRET`, when set.
pub fn webhook_secret_env() -> Option<String> {
    std::env::var("TASKLEDGER_WEBHOOK_SECRET")
        .ok()
        .map(|secret| secret.trim().to_owned())
        .filter(|secret| !secret.is_empty())
}

/// Prints an import's summary; at most `shown` rejections are listed.
fn print_summary(summary: &Summary, shown: usize) {
    println!(
        "accepted {}, duplicates {}, rejected {}",
        summary.accepted,
        summary.duplicates,
        summary.rejected.len()
    );
    for rejection in summary.rejected.iter().take(shown) {
        println!("  {}: {}", rejection.location, rejection.reason);
    }
    if summary.rejected.len() > shown {
        println!("  … and {} more", summary.rejected.len() - shown);
    }
}
