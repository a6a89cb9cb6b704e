//! The wiring: parses the command line, opens the database, and for `serve` starts the
//! background workers next to the listening server until SIGINT or SIGTERM.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::SubsecRound;
use clap::Parser;
use tokio::net::TcpListener;

use crate::cli::{
    self, Cli, CollectSource, CollectorArgs, Command, Config, ImportFormat, PrometheusCollectArgs,
    SlurmImportArgs,
};
use crate::collectors::prometheus::PrometheusCollector;
use crate::collectors::slurm::{SlurmCollector, SlurmNodes};
use crate::collectors::{self, CapacitySummary, Destination, StateFile, Window, WindowRequest};
use crate::db::Database;
use crate::db::embedded::EmbeddedPostgres;
use crate::domain::capacity::pool_id;
use crate::domain::values::parse_day_or_instant;
use crate::http::state::AppState;
use crate::ledger::mail::Mailer;
use crate::ledger::notify::Notifier;
use crate::ledger::signin::{OidcConfig, SignIn};
use crate::ledger::sources::SourceSummary;
use crate::ledger::{demo, setup, tokens};
use crate::sources::batch::SourceBatch;
use crate::sources::kubernetes;
use crate::sources::kubernetes::nodes::NodeMapping;
use crate::sources::slurm::nodes::NodeMapping as SlurmNodeMapping;
use crate::workers;

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
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Serve => serve(cli.config).await,
            Command::Openapi => {
                println!("{}", crate::http::openapi().to_pretty_json()?);
                Ok(())
            }
            Command::Collect { source } => collect(cli.config, source).await,
            Command::Demo { until } => demo(cli.config, until).await,
            Command::Import {
                files,
                format: Some(ImportFormat::SinfoJson),
                slurm,
                ..
            } => import_nodes(&cli.config, &files, &slurm).await,
            Command::Import {
                files,
                format: Some(ImportFormat::Focus),
                pool,
                ..
            } => import_bills(&cli.config, &files, pool.as_deref()).await,
            command => cli::run(cli.config, command).await,
        }
    });
    match outcome {
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
    // Colours only on a terminal: a log file or `kubectl logs` would carry the escape codes.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// A source of job records.
#[derive(Debug, Clone)]
enum Collector {
    Slurm(SlurmCollector),
    Prometheus(Box<PrometheusCollector>),
}

impl Collector {
    /// Its name, as state files record it.
    fn name(&self) -> &'static str {
        match self {
            Collector::Slurm(_) => "slurm",
            Collector::Prometheus(_) => "prometheus",
        }
    }

    /// What it reads, as its summary counts them.
    fn reads(&self) -> &'static str {
        match self {
            Collector::Slurm(_) => "jobs read",
            Collector::Prometheus(_) => "pods seen",
        }
    }

    /// Reads a window, handing on each part as it is read (the Prometheus collector's pages,
    /// Slurm's window whole); `now` is when the run began. Answers how many parts there were.
    async fn read_pages(
        &self,
        window: Window,
        now: chrono::DateTime<chrono::Utc>,
        mut hand_on: impl AsyncFnMut(SourceBatch) -> anyhow::Result<()>,
    ) -> anyhow::Result<usize> {
        match self {
            Collector::Slurm(collector) => {
                hand_on(collector.read(window).await?).await?;
                Ok(1)
            }
            Collector::Prometheus(collector) => collector.read_pages(window, now, hand_on).await,
        }
    }

    /// Reads the node capacity and delivers it: Prometheus' hours of the window, Slurm's
    /// nodes as they are now, carrying on the intervals the state file keeps open. `false`
    /// when the collector reads none.
    async fn read_capacity(
        &self,
        window: Window,
        now: chrono::DateTime<chrono::Utc>,
        state: Option<&StateFile>,
        destination: &Destination,
        summary: &mut CapacitySummary,
    ) -> anyhow::Result<bool> {
        match self {
            Collector::Prometheus(collector) if collector.capacity.is_some() => {
                let hours = collector
                    .read_capacity(window, now, async |intervals| {
                        collectors::deliver_capacity(destination, intervals, false, summary).await
                    })
                    .await?;
                summary.hours = Some(hours);
                Ok(true)
            }
            Collector::Slurm(collector) => {
                let Some(nodes) = &collector.nodes else {
                    return Ok(false);
                };
                let open = state
                    .map(StateFile::open_nodes)
                    .transpose()?
                    .unwrap_or_default();
                let read = collector
                    .read_nodes(nodes, &open, now.trunc_subsecs(0))
                    .await?;
                summary.nodes.extend(read.nodes);
                if !read.store.is_empty() {
                    collectors::deliver_capacity(destination, read.store, true, summary).await?;
                }
                // What is open moves on only once what it extends is stored.
                if summary.problems.is_empty()
                    && let Some(state) = state
                {
                    state.keep_nodes(read.open)?;
                }
                Ok(true)
            }
            Collector::Prometheus(_) => Ok(false),
        }
    }
}

/// `import --format focus`: each file a bill, stored as `POST /v1/bills` stores it; prints
/// each bill's receipt.
async fn import_bills(
    config: &Config,
    files: &[PathBuf],
    pool: Option<&str>,
) -> anyhow::Result<()> {
    use crate::sources::focus::{bill_text, parse_bill};
    let pool = pool
        .map(crate::domain::capacity::pool_id)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--pool: {error}"))?;
    let mut bills = Vec::with_capacity(files.len());
    for file in files {
        let (name, bytes) = if file.as_os_str() == "-" {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)?;
            ("stdin".to_owned(), bytes)
        } else {
            let bytes = std::fs::read(file)
                .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", file.display()))?;
            (file.display().to_string(), bytes)
        };
        let text =
            bill_text(&bytes, u64::MAX).map_err(|error| anyhow::anyhow!("{name}: {error}"))?;
        let bill = parse_bill(&text).map_err(|errors| {
            let lines: Vec<String> = errors
                .into_vec()
                .into_iter()
                .map(|e| format!("  {}: {}", e.pointer, e.message))
                .collect();
            anyhow::anyhow!("{name}: the bill cannot be read:\n{}", lines.join("\n"))
        })?;
        bills.push((name, bill));
    }
    let database = cli::open(config).await?;
    cli::prepare(&database.pool, config).await?;
    let settings = config.settings();
    let mut outcome = Ok(());
    for (name, bill) in bills {
        match crate::ledger::bills::post_bill(
            &database.pool,
            bill,
            pool.as_deref(),
            config.timezone,
            &crate::domain::access::Actor::system("cli"),
        )
        .await
        {
            Ok((receipt, nodes)) => {
                println!("{name}: {}", serde_json::to_string(&receipt)?);
                if !nodes.is_empty() {
                    crate::ledger::zombies::judge(&database.pool, Some(nodes), &settings).await?;
                }
            }
            Err(error) => {
                outcome = Err(anyhow::anyhow!("{name}: {error}"));
                break;
            }
        }
    }
    database.close().await?;
    outcome
}

/// `import --format sinfo-json`: every listing is read first, each at Slurm's `last_update`
/// (or `--taken-at`), and the capacity between them stored, all or nothing per 5,000
/// intervals; a listing imported again counts as duplicates.
async fn import_nodes(
    config: &Config,
    files: &[PathBuf],
    args: &SlurmImportArgs,
) -> anyhow::Result<()> {
    let taken_at = args
        .taken_at
        .as_deref()
        .map(|raw| parse_day_or_instant(raw, config.timezone))
        .transpose()
        .map_err(|error| anyhow::anyhow!("--taken-at: {error}"))?;
    anyhow::ensure!(
        taken_at.is_none() || files.len() == 1,
        "--taken-at names the time of one listing: give one file, or listings that carry \
         Slurm's last_update"
    );
    let mut snapshots = Vec::with_capacity(files.len());
    for file in files {
        let (name, text) = cli::read_input(file)?;
        let snapshot = crate::sources::slurm::nodes::read_snapshot(&text)
            .map_err(|error| anyhow::anyhow!("{name}: {error}"))?;
        let at = snapshot.taken_at.or(taken_at).ok_or_else(|| {
            anyhow::anyhow!(
                "{name}: the listing does not say when it was taken (Slurm before 24.05 prints \
                 no last_update); give --taken-at with one file"
            )
        })?;
        snapshots.push((at, snapshot.nodes));
    }
    let nodes = crate::sources::slurm::nodes::NodeMapping {
        billing_mode: args
            .node_billing_mode
            .unwrap_or(crate::domain::rating::BillingMode::OnDemand),
        max_gap: args.max_node_gap.unwrap_or(chrono::TimeDelta::hours(1)),
    };
    let intervals =
        crate::sources::slurm::nodes::intervals_of(snapshots, &args.mapping.mapping(), &nodes);
    let mut summary = collectors::CapacitySummary::default();
    if !intervals.is_empty() {
        let database = cli::open(config).await?;
        cli::prepare(&database.pool, config).await?;
        let destination = collectors::Destination::Local {
            pool: database.pool.clone(),
            settings: config.settings(),
        };
        let stored =
            collectors::deliver_capacity(&destination, intervals, false, &mut summary).await;
        drop(destination);
        database.close().await?;
        stored?;
    }
    print!("{}", summary.render());
    for problem in summary.problems.iter().take(100) {
        println!("  {}: {}", problem.location, problem.reason);
    }
    anyhow::ensure!(
        summary.problems.is_empty(),
        "{} problems; nothing of a request with one was stored",
        summary.problems.len()
    );
    Ok(())
}

/// `collect <source>`: once, or with `--every` until SIGTERM, each run as [`collect_once`].
async fn collect(config: Config, source: CollectSource) -> anyhow::Result<()> {
    let (run, collector) = match source {
        CollectSource::Slurm(args) => {
            let args = *args;
            (
                args.run,
                Collector::Slurm(SlurmCollector {
                    sacct: args.sacct,
                    extra_arguments: args.sacct_args,
                    mapping: args.mapping.mapping(),
                    nodes: (!args.no_capacity).then(|| SlurmNodes {
                        command: args.nodes_command,
                        arguments: if args.nodes_args.is_empty() {
                            ["show", "nodes", "--json"].map(str::to_owned).to_vec()
                        } else {
                            args.nodes_args
                        },
                        mapping: SlurmNodeMapping {
                            billing_mode: args.node_billing_mode,
                            max_gap: args.max_node_gap,
                        },
                    }),
                }),
            )
        }
        CollectSource::Prometheus(args) => {
            let collector = prometheus_collector(&args)?;
            (args.run, Collector::Prometheus(Box::new(collector)))
        }
    };
    let state = run.state.clone().map(|path| StateFile {
        path,
        collector: collector.name(),
    });
    let request = window_request(&run, &config)?;
    let Some(every) = run.every else {
        return collect_once(&config, &run, &collector, &request, state.as_ref()).await;
    };
    let every = every
        .to_std()
        .ok()
        .filter(|every| !every.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--every must be longer than nothing"))?;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let next = tokio::time::Instant::now() + every;
        tokio::select! {
            outcome = collect_once(&config, &run, &collector, &request, state.as_ref()) => {
                if let Err(error) = outcome {
                    eprintln!("error: {error:#}");
                }
            }
            () = &mut shutdown => return Ok(()),
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = &mut shutdown => return Ok(()),
        }
    }
}

/// The Prometheus collector the flags describe, its project map file read.
fn prometheus_collector(args: &PrometheusCollectArgs) -> anyhow::Result<PrometheusCollector> {
    anyhow::ensure!(
        args.settle <= args.run.overlap,
        "--settle ({}) must be at most --overlap ({}): pods decided late would fall between windows",
        args.settle,
        args.run.overlap
    );
    anyhow::ensure!(
        args.resolution > chrono::TimeDelta::zero()
            && args.resolution.subsec_nanos() == 0
            && 3600 % args.resolution.num_seconds() == 0,
        "--resolution must be whole seconds that divide an hour (15s, 30s, 1m)"
    );
    let projects = match &args.project_map {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            kubernetes::parse_project_map(&text)
                .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?
        }
        None => Default::default(),
    };
    Ok(PrometheusCollector {
        url: args.prometheus.clone(),
        token: std::env::var("TASKLEDGER_PROMETHEUS_TOKEN")
            .ok()
            .map(|token| token.trim().to_owned())
            .filter(|token| !token.is_empty()),
        selector: args.selector.trim().to_owned(),
        resolution: args.resolution,
        settle: args.settle,
        attempt_lookback: args.attempt_lookback,
        query_timeout: args
            .query_timeout
            .to_std()
            .ok()
            .filter(|timeout| !timeout.is_zero())
            .ok_or_else(|| anyhow::anyhow!("--query-timeout must be longer than nothing"))?,
        page_pods: args.page_pods as usize,
        capacity: (!args.no_capacity)
            .then(|| -> anyhow::Result<NodeMapping> {
                let mut nodes = NodeMapping {
                    default_pool: pool_id(&args.default_pool)
                        .map_err(|error| anyhow::anyhow!("--default-pool: {error}"))?,
                    billing_mode: args.node_billing_mode,
                    ..NodeMapping::default()
                };
                if !args.pool_labels.is_empty() {
                    nodes.pool_labels = args.pool_labels.clone();
                }
                Ok(nodes)
            })
            .transpose()?,
        mapping: kubernetes::Mapping {
            project_label: args.project_label.clone(),
            projects,
            task_label: args.task_label.clone(),
            labels: args.labels.clone(),
            gpu_models: args.gpu_models.iter().cloned().collect(),
        },
    })
}

/// Reads the window, delivers it to the server or the local database, prints the summary,
/// and moves the state on when nothing failed.
async fn collect_once(
    config: &Config,
    run: &CollectorArgs,
    collector: &Collector,
    request: &WindowRequest,
    state: Option<&StateFile>,
) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    let window = collectors::window(request, state, now)?;
    let (destination, database) = match &run.server {
        Some(url) => {
            let token = std::env::var("TASKLEDGER_TOKEN")
                .ok()
                .map(|token| token.trim().to_owned())
                .filter(|token| !token.is_empty())
                .ok_or_else(|| {
                    anyhow::anyhow!("--server needs an ingest token in TASKLEDGER_TOKEN")
                })?;
            let client = reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(300))
                .build()?;
            let destination = Destination::Server {
                url: url.clone(),
                token,
                client,
            };
            (destination, None)
        }
        None => {
            let database = cli::open(config).await?;
            cli::prepare(&database.pool, config).await?;
            let destination = Destination::Local {
                pool: database.pool.clone(),
                settings: config.settings(),
            };
            (destination, Some(database))
        }
    };
    let mut summary = SourceSummary::default();
    let read = collector
        .read_pages(window, now, async |batch| {
            summary.absorb(collectors::deliver(&destination, batch).await?);
            Ok(())
        })
        .await;
    let mut capacity = CapacitySummary::default();
    let read = match read {
        Ok(pages) => collector
            .read_capacity(window, now, state, &destination, &mut capacity)
            .await
            .map(|read| (pages, read)),
        Err(error) => Err(error),
    };
    drop(destination);
    if let Some(database) = database {
        database.close().await?;
    }
    let (pages, capacity_read) = match read {
        Ok(read) => read,
        Err(error) if summary.records == 0 && capacity.intervals == 0 => return Err(error),
        Err(error) => anyhow::bail!(
            "{error:#}; the {} records and {} capacity intervals read before it were delivered \
             ({} and {} stored, {} and {} duplicates), and the state stays where it was, so \
             the next run reads this window again and counts them as duplicates",
            summary.records,
            capacity.intervals,
            summary.accepted,
            capacity.inserted,
            summary.duplicates,
            capacity.duplicates
        ),
    };
    println!(
        "{} {} .. {}",
        collector.name(),
        window.since.to_rfc3339(),
        window.until.to_rfc3339()
    );
    // Capacity that could not be stored fails the run as records do.
    summary.problems.append(&mut capacity.problems);
    print!("{}", summary.render_counting(collector.reads(), 100));
    if pages > 1 {
        println!("read and delivered in {pages} pages");
    }
    if capacity_read {
        print!("{}", capacity.render());
    }
    collectors::remember(state, window, &summary)?;
    anyhow::ensure!(
        !summary.failed(),
        "{} problems; the state stays where it was, so the next run reads this window again",
        summary.problems.len()
    );
    Ok(())
}

fn window_request(args: &CollectorArgs, config: &Config) -> anyhow::Result<WindowRequest> {
    let bound = |raw: &Option<String>, flag: &str| {
        raw.as_deref()
            .map(|raw| parse_day_or_instant(raw, config.timezone))
            .transpose()
            .map_err(|error| anyhow::anyhow!("{flag}: {error}"))
    };
    Ok(WindowRequest {
        since: bound(&args.since, "--since")?,
        until: bound(&args.until, "--until")?,
        overlap: args.overlap,
    })
}

/// A bound, not yet serving, HTTP server. Binding first lets tests use port 0 and read the
/// port back.
pub struct Application {
    listener: TcpListener,
    state: AppState,
    shutdown_grace: Duration,
}

/// How long a shutdown waits for requests in flight, unless configured otherwise.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How long a shutdown waits for the background workers to finish what they are doing (an
/// alert delivery under way is bounded by its request timeout) before it cuts them off.
const WORKER_STOP_TIMEOUT: Duration = Duration::from_secs(15);

impl Application {
    pub async fn bind(state: AppState, address: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|error| anyhow::anyhow!("cannot listen on {address}: {error}"))?;
        Ok(Self {
            listener,
            state,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        })
    }

    /// How long, once told to shut down, to wait for requests in flight before closing them.
    pub fn with_shutdown_grace(self, shutdown_grace: Duration) -> Self {
        Self {
            shutdown_grace,
            ..self
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` completes, then stops accepting connections and lets requests
    /// in flight finish, for at most the shutdown grace.
    pub async fn serve_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let router = crate::http::app(self.state);
        let (signalled, grace_starts) = tokio::sync::oneshot::channel::<()>();
        let served = axum::serve(self.listener, router).with_graceful_shutdown(async move {
            shutdown.await;
            let _ = signalled.send(());
        });
        let grace = self.shutdown_grace;
        let grace_over = async move {
            match grace_starts.await {
                Ok(()) => tokio::time::sleep(grace).await,
                // The server ended on its own.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            served = served.into_future() => served?,
            () = grace_over => tracing::warn!(
                grace_seconds = grace.as_secs_f64(),
                "requests still in flight at the end of the shutdown grace were cut off"
            ),
        }
        Ok(())
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
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
    cli::prepare(&database.pool, config).await?;
    bootstrap_admin(&database.pool).await?;
    run_service(database, config, |_| ()).await
}

/// How notification channels' messages leave, from the environment: the mail server
/// (`TASKLEDGER_SMTP_URL`, `TASKLEDGER_SMTP_FROM`, and `TASKLEDGER_SMTP_CA_FILE` for a CA the
/// system does not trust), the dashboard's public URL links point under
/// (`TASKLEDGER_PUBLIC_URL`), and the secret webhook channels are signed with.
fn notifier_from_env(webhook_secret: &str) -> anyhow::Result<Notifier> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let mailer = match var("TASKLEDGER_SMTP_URL") {
        None => None,
        Some(url) => {
            let from = var("TASKLEDGER_SMTP_FROM").ok_or_else(|| {
                anyhow::anyhow!(
                    "TASKLEDGER_SMTP_URL is set but TASKLEDGER_SMTP_FROM is not: name the \
                     sender, e.g. taskledger <alerts@example.com>"
                )
            })?;
            let ca = match var("TASKLEDGER_SMTP_CA_FILE") {
                Some(path) => Some(
                    std::fs::read(&path)
                        .with_context(|| format!("reading TASKLEDGER_SMTP_CA_FILE ({path})"))?,
                ),
                None => None,
            };
            let mailer = Mailer::new(&url, &from, ca.as_deref())
                .map_err(|error| anyhow::anyhow!("TASKLEDGER_SMTP_URL: {error}"))?;
            tracing::info!(mailer = ?mailer, "email channels send through this mail server");
            Some(mailer)
        }
    };
    let public_url = match var("TASKLEDGER_PUBLIC_URL") {
        Some(url) => Some(
            crate::domain::values::webhook_url(&url)
                .map_err(|why| anyhow::anyhow!("TASKLEDGER_PUBLIC_URL {why}"))?,
        ),
        None => None,
    };
    Notifier::new(
        mailer,
        public_url,
        Some(webhook_secret.to_owned()),
        std::time::Duration::from_secs(10),
    )
}

/// Sign-in through the identity provider of `TASKLEDGER_OIDC_*`, when it is configured.
fn signin_from_env() -> anyhow::Result<Option<Arc<SignIn>>> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match OidcConfig::from_env(var)? {
        None => Ok(None),
        Some(config) => {
            tracing::info!(
                issuer = %config.issuer.as_str(),
                client_id = %config.client_id,
                role_claim = %config.role_claim,
                "people sign in through this identity provider"
            );
            Ok(Some(Arc::new(SignIn::new(config)?)))
        }
    }
}

/// Serves the API next to the background workers until SIGINT or SIGTERM; `ready` gets the
/// address once it listens.
async fn run_service(
    database: &Database,
    config: &Config,
    ready: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let settings = config.settings();
    let secret =
        setup::webhook_secret(&database.pool, cli::webhook_secret_env().as_deref()).await?;
    let notifier = Arc::new(notifier_from_env(&secret)?);
    let state = AppState::new(database.pool.clone(), settings)
        .with_embedded_database(database.embedded_status())
        .with_notifier(notifier.clone())
        .with_signin(signin_from_env()?);
    let webhooks =
        workers::webhooks::Webhooks::new(database.pool.clone(), secret, Default::default())?;
    let channel_deliveries = workers::channels::ChannelDeliveries::new(
        database.pool.clone(),
        notifier,
        Default::default(),
    );
    let application = Application::bind(state, config.listen)
        .await?
        .with_shutdown_grace(config.shutdown_grace());
    tracing::info!(address = %application.local_addr(), "taskledger is ready");
    ready(application.local_addr());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopping = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.changed().await;
        }
    };
    let workers = [
        tokio::spawn(webhooks.run(stopping())),
        tokio::spawn(channel_deliveries.run(stopping())),
        tokio::spawn(workers::compaction::run(
            database.pool.clone(),
            config
                .compaction_interval()
                .unwrap_or(workers::compaction::DEFAULT_INTERVAL),
            stopping(),
        )),
        tokio::spawn(workers::reassignment::run(
            database.pool.clone(),
            settings.timezone,
            workers::reassignment::DEFAULT_INTERVAL,
            stopping(),
        )),
        tokio::spawn(workers::burn_tick::run(
            database.pool.clone(),
            settings,
            config
                .burn_tick_interval()
                .unwrap_or(workers::burn_tick::DEFAULT_INTERVAL),
            stopping(),
        )),
    ];
    let served = application
        .serve_until(async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        })
        .await;
    stop_workers(workers).await;
    tracing::info!("stopped serving");
    served
}

/// Waits for the workers, told to stop, to finish their turn; cuts off those that take longer
/// than `WORKER_STOP_TIMEOUT` (their transactions roll back, so nothing is half done).
async fn stop_workers(workers: [tokio::task::JoinHandle<()>; 5]) {
    let aborts: Vec<_> = workers.iter().map(|worker| worker.abort_handle()).collect();
    let all = async {
        for worker in workers {
            if let Err(error) = worker.await
                && error.is_panic()
            {
                tracing::error!(%error, "a background worker panicked");
            }
        }
    };
    if tokio::time::timeout(WORKER_STOP_TIMEOUT, all)
        .await
        .is_err()
    {
        tracing::warn!(
            timeout_seconds = WORKER_STOP_TIMEOUT.as_secs(),
            "background workers did not stop in time and were cut off"
        );
        for abort in aborts {
            abort.abort();
        }
    }
}

/// Makes sure someone can log in: the bootstrap token from the environment, or else a
/// first-start admin token printed once when the database has no token at all.
async fn bootstrap_admin(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let configured = std::env::var("TASKLEDGER_BOOTSTRAP_TOKEN")
        .ok()
        .map(|secret| secret.trim().to_owned())
        .filter(|secret| !secret.is_empty());
    match tokens::bootstrap_admin(pool, configured.as_deref()).await? {
        tokens::Bootstrap::Configured => {
            tracing::info!("bootstrap admin token from TASKLEDGER_BOOTSTRAP_TOKEN is active");
        }
        tokens::Bootstrap::ConfiguredButRevoked => {
            tracing::warn!(
                "the token of TASKLEDGER_BOOTSTRAP_TOKEN was revoked and stays revoked; \
                 set a new secret to get a bootstrap admin token"
            );
        }
        tokens::Bootstrap::FirstAdmin { id, secret } => {
            println!("first start: created admin token {id} — it is shown only this once:");
            println!("{secret}");
        }
        tokens::Bootstrap::Existing => {}
    }
    Ok(())
}

/// `demo`: the demo loaded into a fresh data dir, served until SIGINT or SIGTERM.
async fn demo(config: Config, until: Option<String>) -> anyhow::Result<()> {
    let started = Instant::now();
    if config.database_url.is_some() {
        tracing::warn!("the demo runs its own embedded PostgreSQL; DATABASE_URL is not used");
    }
    let until = match until {
        Some(raw) => parse_day_or_instant(&raw, config.timezone)
            .map_err(|error| anyhow::anyhow!("--until: {error}"))?,
        None => chrono::Utc::now().trunc_subsecs(0),
    };
    anyhow::ensure!(
        until <= chrono::Utc::now(),
        "--until lies in the future: the demo's data ends at the latest now"
    );
    let dir = DemoDir::prepare(&config.data_dir)?;
    let outcome = match Database::open(None, &dir.path, config.db_pool_size, false).await {
        Ok(database) => {
            let outcome = demo_on(&database, &config, until, &dir, started).await;
            outcome.and(database.close().await)
        }
        Err(error) => Err(error),
    };
    outcome.and(dir.finish())
}

async fn demo_on(
    database: &Database,
    config: &Config,
    until: chrono::DateTime<chrono::Utc>,
    dir: &DemoDir,
    started: Instant,
) -> anyhow::Result<()> {
    cli::prepare(&database.pool, config).await?;
    let loaded = demo::load(&database.pool, until, &config.settings())
        .await
        .map_err(|error| anyhow::anyhow!("loading the demo failed: {error:#}"))?;
    run_service(database, config, |address| {
        announce_demo(&loaded, address, dir, started.elapsed());
    })
    .await
}

/// Prints where to look: the dashboard's finance page of the complete month with the finance
/// token, and every token.
fn announce_demo(loaded: &demo::Loaded, address: SocketAddr, dir: &DemoDir, took: Duration) {
    let shown = if address.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], address.port()))
    } else {
        address
    };
    let base = format!("http://{shown}");
    let tokens = &loaded.tokens;
    println!(
        "taskledger demo: {} job records from Alibaba's GPU cluster trace, {} and {} up to {}, \
         ready in {:.1} s",
        loaded.records.accepted,
        loaded.window.previous,
        loaded.window.current,
        loaded.window.until.format("%Y-%m-%d %H:%M UTC"),
        took.as_secs_f64()
    );
    println!();
    // The complete month is the one with every figure: closable, its budgets crossed.
    println!(
        "  Dashboard:     {base}/#token={}&page=finance&month={}",
        tokens.finance.token, loaded.window.previous
    );
    println!("  API docs:      {base}/docs");
    println!("  Admin token:   {}", tokens.admin.token);
    println!("  Finance token: {}", tokens.finance.token);
    println!(
        "  Reader token:  {} (projects {})",
        tokens.reader.token,
        tokens.reader.projects.join(", ")
    );
    println!();
    println!(
        "Data in {}{}. Ctrl-C stops the demo.",
        dir.path.display(),
        if dir.temporary {
            ", removed when the demo stops"
        } else {
            ""
        }
    );
}

/// Where a demo keeps its data: a fresh temporary dir, removed when the demo stops, or the
/// data dir given, kept, which must be empty or hold an earlier demo (replaced).
struct DemoDir {
    path: PathBuf,
    temporary: bool,
}

/// The file that marks a data dir as a demo's, which a later demo may replace.
const DEMO_MARKER: &str = "taskledger-demo";

impl DemoDir {
    fn prepare(data_dir: &Path) -> anyhow::Result<Self> {
        if data_dir == Path::new(cli::DEFAULT_DATA_DIR) {
            let path = std::env::temp_dir()
                .join(format!("taskledger-demo-{}", uuid::Uuid::new_v4().simple()));
            return Self::create(path, true);
        }
        let mut entries = match std::fs::read_dir(data_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Self::create(data_dir.to_path_buf(), false);
            }
            Err(error) => anyhow::bail!("cannot read {}: {error}", data_dir.display()),
        };
        if entries.next().is_some() {
            anyhow::ensure!(
                data_dir.join(DEMO_MARKER).is_file(),
                "{} is not empty and holds no earlier demo; give the demo a new or empty \
                 --data-dir",
                data_dir.display()
            );
            EmbeddedPostgres::ensure_unused(data_dir)?;
            std::fs::remove_dir_all(data_dir).with_context(|| {
                format!("cannot remove the earlier demo in {}", data_dir.display())
            })?;
        }
        Self::create(data_dir.to_path_buf(), false)
    }

    /// Creates the dir (traversable, so that PostgreSQL can run as another user under root)
    /// with its marker.
    fn create(path: PathBuf, temporary: bool) -> anyhow::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        std::fs::write(
            path.join(DEMO_MARKER),
            "A taskledger demo: `taskledger demo --data-dir` with this dir replaces it.\n",
        )
        .with_context(|| format!("cannot write to {}", path.display()))?;
        Ok(Self { path, temporary })
    }

    /// Removes a temporary dir once the demo has stopped.
    fn finish(&self) -> anyhow::Result<()> {
        if self.temporary {
            std::fs::remove_dir_all(&self.path)
                .with_context(|| format!("cannot remove {}", self.path.display()))?;
        }
        Ok(())
    }
}
