//! Embedded PostgreSQL cluster, run from the machine's PostgreSQL server binaries.
//!
//! `taskledger serve` uses it when no `DATABASE_URL` is given (cluster in `<data-dir>/pg`), and
//! the integration tests use one per test process with non-durable settings. The cluster:
//!
//! - listens only on a Unix socket inside its own directory, so it never clashes with a system
//!   server on port 5432;
//! - runs `postgres` as a direct child in its own process group, logging to
//!   `<data-dir>/pg/log/postgres.log`;
//! - runs as an unprivileged user (`postgres`, else `nobody`) when taskledger runs as root,
//!   because PostgreSQL refuses to run as root;
//! - belongs to one owner at a time, through an exclusive `flock` on `<data-dir>/taskledger.lock`;
//! - is stopped by a small watchdog process if its owner dies without stopping it, and whatever
//!   an owner killed together with its watchdog left running is stopped by the next `start`;
//! - can be started again in place after its postmaster died ([`EmbeddedPostgres::restart`]),
//!   which `db::supervisor` does for `taskledger serve`.
//!
//! Needs PostgreSQL 10 or later (readiness is read from postmaster.pid's status line).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt, lchown};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use std::{env, thread};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Gid, Pid, Uid, User, geteuid};

/// Only names the socket file (`.s.PGSQL.<port>`): the cluster never listens on TCP.
const PORT: u16 = 5432;
const SUPERUSER: &str = "postgres";
const CLUSTER_DIR: &str = "pg";
const STAGING_DIR: &str = "pg.initdb";
const LOCK_FILE: &str = "taskledger.lock";
const LOG_DIR: &str = "log";
const LOG_FILE: &str = "postgres.log";
/// Past this size the log is moved to `postgres.log.1` at the next start.
const LOG_ROTATE_BYTES: u64 = 16 << 20;
const LOG_TAIL_LINES: usize = 5;
const VERSIONED_BIN_ROOT: &str = "/usr/lib/postgresql";
/// `sun_path` holds 108 bytes including the terminating NUL.
const SOCKET_PATH_MAX: usize = 107;
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// Fast shutdown (SIGINT) first; immediate shutdown (SIGQUIT, crash recovery at the next start)
/// only if that hangs.
const SHUTDOWN_STEPS: [(Signal, Duration); 2] = [
    (Signal::SIGINT, Duration::from_secs(30)),
    (Signal::SIGQUIT, Duration::from_secs(10)),
];
/// How long the children of a dead postmaster get to exit by themselves, and then after SIGQUIT.
const ORPHAN_GRACE: Duration = Duration::from_secs(2);
const ORPHAN_QUIT_TIMEOUT: Duration = Duration::from_secs(10);
const NON_DURABLE_SETTINGS: [&str; 3] = [
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
];

/// Whether the installation of the server binaries in `bin_dir` has `pg_stat_statements`
/// (Debian's and PostgreSQL's own packages keep it in `../lib`).
fn has_statement_statistics(bin_dir: &Path) -> bool {
    bin_dir
        .parent()
        .is_some_and(|root| root.join("lib").join("pg_stat_statements.so").is_file())
}

/// How the embedded cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// `false` turns off fsync, synchronous_commit and full_page_writes (and initdb's final
    /// sync): fast, but an OS crash can lose or corrupt data. For tests only.
    pub durable: bool,
    /// PostgreSQL's `max_connections`; must exceed `superuser_reserved_connections` (3).
    pub max_connections: u32,
    /// Loads `pg_stat_statements` at start, where the server's installation has it, so a
    /// database that creates the extension can see where its time goes. For benchmarks.
    pub statement_statistics: bool,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        Self {
            durable: true,
            max_connections: 100,
            statement_statistics: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "PostgreSQL server binaries not found (initdb on PATH or {VERSIONED_BIN_ROOT}/*/bin); install them, e.g. `apt-get install postgresql`"
    )]
    BinariesNotFound,
    #[error("data dir path {} is not valid UTF-8; choose another data dir", .0.display())]
    NonUtf8Path(PathBuf),
    #[error(
        "Unix socket path {} is {len} bytes, over the {SOCKET_PATH_MAX}-byte limit; choose a data dir with a shorter path",
        .path.display()
    )]
    SocketPathTooLong { path: PathBuf, len: usize },
    #[error(
        "data dir {} is in use by another taskledger process ({})",
        .data_dir.display(),
        describe_pid(*.pid)
    )]
    InUse { data_dir: PathBuf, pid: Option<u32> },
    #[error(
        "running as root, but neither a `postgres` nor a `nobody` user exists to run PostgreSQL as; create a `postgres` system user or run taskledger as a non-root user"
    )]
    NoUnprivilegedUser,
    #[error(
        "user `{user}` runs PostgreSQL (taskledger runs as root) but cannot enter {}; make it traversable (e.g. `chmod o+x {}`) or choose a data dir elsewhere",
        .dir.display(),
        .dir.display()
    )]
    DirNotReachable { user: String, dir: PathBuf },
    #[error(
        "{} exists but holds no PostgreSQL cluster (no PG_VERSION); move it away or choose another data dir",
        .0.display()
    )]
    NotACluster(PathBuf),
    #[error(
        "cluster in {} was created by PostgreSQL {cluster}, but the binaries in {} are PostgreSQL {binaries}; install the PostgreSQL {cluster} server binaries or migrate the cluster",
        .dir.display(),
        .bin_dir.display()
    )]
    VersionMismatch {
        dir: PathBuf,
        cluster: String,
        binaries: String,
        bin_dir: PathBuf,
    },
    #[error("initdb failed ({status}): {output}")]
    Initdb { status: ExitStatus, output: String },
    #[error("postgres exited during startup ({status}); log {}: {tail}", .log.display())]
    ExitedDuringStartup {
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "postgres did not accept connections within {}s (last attempt: {last_attempt}); log {}: {tail}",
        READY_TIMEOUT.as_secs(),
        .log.display()
    )]
    StartTimeout {
        last_attempt: String,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "postgres processes {pids:?} left from an earlier run still use {} and did not stop; stop them and retry",
        .dir.display()
    )]
    LeftoverProcesses { dir: PathBuf, pids: Vec<i32> },
    #[error(
        "the cluster in {} is gone (no PG_VERSION); restore it: taskledger creates no empty cluster in its place while it runs",
        .0.display()
    )]
    ClusterGone(PathBuf),
    #[error("postgres (pid {pid}) did not shut down after SIGINT and SIGQUIT")]
    ShutdownTimeout { pid: u32 },
    #[error("could not {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn describe_pid(pid: Option<u32>) -> String {
    pid.map_or_else(|| "pid unknown".to_owned(), |pid| format!("pid {pid}"))
}

fn io_err(
    action: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(io::Error) -> EmbeddedError {
    let path = path.into();
    move |source| EmbeddedError::Io {
        action,
        path,
        source,
    }
}

/// A running embedded cluster. Dropping it stops the cluster too (blocking, bounded); prefer
/// [`EmbeddedPostgres::stop`] in async code.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    postmaster: Child,
    /// `None` only while a postmaster is being set up, and once it has exited.
    watchdog: Option<Child>,
    /// Cleared once the postmaster exited or a shutdown was attempted, so that neither `stop`
    /// nor `Drop` acts on it again.
    running: bool,
    /// Where this postmaster's output starts in the log.
    log_offset: u64,
    cluster: Cluster,
}

/// What stays the same across postmasters of one owner: where the cluster is, how postgres is
/// run, and the data dir lock.
#[derive(Debug)]
struct Cluster {
    /// The cluster directory, which is also the socket directory.
    pg_dir: String,
    log_path: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<RunAs>,
    options: EmbeddedOptions,
    /// Released by drop, after the cluster is down.
    _lock: Flock<File>,
}

impl EmbeddedPostgres {
    /// Creates (initdb, first run) or reuses the cluster in `<data_dir>/pg`, starts it, waits
    /// until it accepts connections.
    pub async fn start(data_dir: &Path, options: EmbeddedOptions) -> Result<Self, EmbeddedError> {
        let data_dir = data_dir.to_path_buf();
        // Blocking work (initdb, waits) runs off the async workers. If the caller stops awaiting,
        // the task still finishes and the returned value's drop stops the cluster again.
        match tokio::task::spawn_blocking(move || Self::start_blocking(&data_dir, options)).await {
            Ok(result) => result,
            Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
        }
    }

    /// A sqlx URL for `database` on this cluster, over its Unix socket.
    pub fn url(&self, database: &str) -> String {
        socket_url(&self.cluster.pg_dir, database)
    }

    /// The URL of the cluster in `data_dir` while another process runs it, so that a command
    /// such as `taskledger token create` works next to a running `taskledger serve`.
    pub fn url_of_running(data_dir: &Path, database: &str) -> Result<String, EmbeddedError> {
        let data_dir = fs::canonicalize(data_dir).map_err(io_err("resolve", data_dir))?;
        let pg_dir = checked_socket_dir(&data_dir.join(CLUSTER_DIR))?;
        Ok(socket_url(&pg_dir, database))
    }

    /// Fails with [`EmbeddedError::InUse`] while a taskledger process runs the cluster in
    /// `data_dir`, so that its files are not removed under it.
    pub fn ensure_unused(data_dir: &Path) -> Result<(), EmbeddedError> {
        lock_data_dir(data_dir).map(drop)
    }

    /// Process id of the postmaster (of the last one, once it has exited).
    pub fn pid(&self) -> u32 {
        self.postmaster.id()
    }

    /// The server log, for pointing users at it.
    pub fn log_path(&self) -> &Path {
        &self.cluster.log_path
    }

    /// The last lines the current postmaster wrote to the log, on one line: after it exited,
    /// usually why.
    pub fn log_tail(&self) -> String {
        log_tail(&self.cluster.log_path, self.log_offset)
    }

    /// Reaps the postmaster if it has exited, so that it leaves no zombie behind, and returns
    /// how it ended; `None` while it runs. Never blocks.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>, EmbeddedError> {
        let exited = self
            .postmaster
            .try_wait()
            .map_err(io_err("wait for postgres of", &self.cluster.pg_dir))?;
        if exited.is_some() && self.running {
            self.running = false;
            self.stop_watchdog();
        }
        Ok(exited)
    }

    /// Starts postgres again on the same cluster, socket and settings, typically after its
    /// postmaster exited (see [`EmbeddedPostgres::exit_status`]; one still running is stopped
    /// first): waits for the processes of the old one to go, clears the lock files they leave,
    /// then starts and waits as `start` does. Never creates a new cluster: one that vanished is
    /// an error, not an empty database. The cluster is handed back either way, to be restarted
    /// again or stopped.
    pub async fn restart(mut self) -> (Self, Result<(), EmbeddedError>) {
        match tokio::task::spawn_blocking(move || {
            let result = self.restart_blocking();
            (self, result)
        })
        .await
        {
            Ok(outcome) => outcome,
            Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
        }
    }

    /// Fast shutdown (SIGINT to the postmaster), waits for exit, releases the lock.
    pub async fn stop(mut self) -> Result<(), EmbeddedError> {
        if !self.running {
            return Ok(());
        }
        let started = Instant::now();
        let pid = self.pid();
        let result = match tokio::task::spawn_blocking(move || self.shut_down()).await {
            Ok(result) => result,
            Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
        };
        if result.is_ok() {
            tracing::info!(
                pid,
                elapsed_ms = started.elapsed().as_millis(),
                "stopped embedded PostgreSQL"
            );
        }
        result
    }

    fn start_blocking(data_dir: &Path, options: EmbeddedOptions) -> Result<Self, EmbeddedError> {
        fs::create_dir_all(data_dir).map_err(io_err("create", data_dir))?;
        let data_dir = fs::canonicalize(data_dir).map_err(io_err("resolve", data_dir))?;
        let pg_dir_path = data_dir.join(CLUSTER_DIR);
        let pg_dir = checked_socket_dir(&pg_dir_path)?;
        let lock = lock_data_dir(&data_dir)?;
        let bin_dir = find_server_bin_dir(
            env::var_os("PATH").as_deref(),
            Path::new(VERSIONED_BIN_ROOT),
        )
        .ok_or(EmbeddedError::BinariesNotFound)?;
        let run_as = unprivileged_user()?;
        if let Some(user) = &run_as {
            check_traversable(&data_dir, user)?;
        }
        stop_leftover_processes(&pg_dir_path)?;
        remove_stale_lock_files(&pg_dir_path)?;
        ensure_cluster(
            &data_dir,
            &pg_dir_path,
            &bin_dir,
            run_as.as_ref(),
            options.durable,
        )?;
        let cluster = Cluster {
            log_path: pg_dir_path.join(LOG_DIR).join(LOG_FILE),
            pg_dir,
            bin_dir,
            run_as,
            options,
            _lock: lock,
        };

        let started = Instant::now();
        let (postmaster, log_offset) = cluster.spawn_postmaster()?;
        let mut pg = Self {
            postmaster,
            watchdog: None,
            running: true,
            log_offset,
            cluster,
        };
        pg.watchdog = Some(spawn_watchdog(pg.pid())?);
        pg.wait_until_ready()?;
        pg.log_ready(started, "embedded PostgreSQL is ready");
        Ok(pg)
    }

    fn restart_blocking(&mut self) -> Result<(), EmbeddedError> {
        if self.exit_status()?.is_none() {
            self.shut_down()?;
        }
        let started = Instant::now();
        let pg_dir = PathBuf::from(&self.cluster.pg_dir);
        stop_leftover_processes(&pg_dir)?;
        remove_stale_lock_files(&pg_dir)?;
        if !pg_dir.join("PG_VERSION").is_file() {
            return Err(EmbeddedError::ClusterGone(pg_dir));
        }
        check_cluster_version(&pg_dir, &self.cluster.bin_dir)?;
        let (postmaster, log_offset) = self.cluster.spawn_postmaster()?;
        self.postmaster = postmaster;
        self.log_offset = log_offset;
        self.running = true;
        let ready = spawn_watchdog(self.pid()).and_then(|watchdog| {
            self.watchdog = Some(watchdog);
            self.wait_until_ready()
        });
        if let Err(error) = ready {
            if self.running
                && let Err(shutdown_error) = self.shut_down()
            {
                tracing::warn!(%shutdown_error, "could not stop the postgres that failed to start");
            }
            return Err(error);
        }
        self.log_ready(started, "embedded PostgreSQL is ready again");
        Ok(())
    }

    fn log_ready(&self, started: Instant, message: &'static str) {
        tracing::info!(
            pid = self.pid(),
            socket_dir = %self.cluster.pg_dir,
            user = self.cluster.run_as.as_ref().map(|user| user.name.as_str()),
            elapsed_ms = started.elapsed().as_millis(),
            "{message}"
        );
    }

    fn wait_until_ready(&mut self) -> Result<(), EmbeddedError> {
        let pg_dir = PathBuf::from(&self.cluster.pg_dir);
        let socket = socket_path(&pg_dir);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.exit_status()? {
                return Err(EmbeddedError::ExitedDuringStartup {
                    status,
                    log: self.cluster.log_path.clone(),
                    tail: self.log_tail(),
                });
            }
            let last_attempt = if pid_file_says_ready(&pg_dir, self.pid()) {
                match probe(&socket) {
                    Ok(()) => return Ok(()),
                    Err(reason) => reason,
                }
            } else {
                "postmaster.pid does not say ready yet".to_owned()
            };
            if Instant::now() >= deadline {
                return Err(EmbeddedError::StartTimeout {
                    last_attempt,
                    log: self.cluster.log_path.clone(),
                    tail: self.log_tail(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// The watchdog acts only when this process dies, but once the postmaster is reaped its pid
    /// can be reused, so from then on a live watchdog could signal an unrelated process.
    fn stop_watchdog(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            // Errors mean it is gone already, which is the goal.
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }

    fn shut_down(&mut self) -> Result<(), EmbeddedError> {
        self.running = false;
        self.stop_watchdog();
        let pid = self.pid();
        let already_exited = self
            .postmaster
            .try_wait()
            .map_err(io_err("wait for postgres of", &self.cluster.pg_dir))?;
        if let Some(status) = already_exited {
            tracing::warn!(pid, %status, log = %self.cluster.log_path.display(), "embedded PostgreSQL had exited on its own");
            return Ok(());
        }
        for (signal, timeout) in SHUTDOWN_STEPS {
            // Not reaped yet, so the pid is still this postmaster's; an error means it just died.
            let _ = kill(as_pid(pid), signal);
            match poll_until(timeout, || self.postmaster.try_wait().transpose()) {
                Some(Ok(_)) => return Ok(()),
                Some(Err(error)) => {
                    return Err(io_err("wait for postgres of", &self.cluster.pg_dir)(error));
                }
                None => {
                    tracing::warn!(pid, %signal, ?timeout, "embedded PostgreSQL did not stop in time")
                }
            }
        }
        Err(EmbeddedError::ShutdownTimeout { pid })
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        if self.running
            && let Err(error) = self.shut_down()
        {
            tracing::warn!(%error, "could not stop embedded PostgreSQL");
        }
    }
}

/// Returns the cluster dir as a string (it goes into the URL and the server's settings) after
/// checking that the socket inside it fits in `sun_path`.
fn checked_socket_dir(pg_dir: &Path) -> Result<String, EmbeddedError> {
    let dir = pg_dir
        .to_str()
        .ok_or_else(|| EmbeddedError::NonUtf8Path(pg_dir.to_path_buf()))?;
    let socket = socket_path(pg_dir);
    let len = socket.as_os_str().len();
    if len > SOCKET_PATH_MAX {
        return Err(EmbeddedError::SocketPathTooLong { path: socket, len });
    }
    Ok(dir.to_owned())
}

fn socket_url(pg_dir: &str, database: &str) -> String {
    // sslmode=disable: there is no TLS on the socket, whatever PGSSLMODE says.
    format!(
        "postgres://{SUPERUSER}@localhost/{}?host={}&port={PORT}&sslmode=disable",
        percent_encode(database),
        percent_encode(pg_dir)
    )
}

fn socket_path(socket_dir: &Path) -> PathBuf {
    socket_dir.join(format!(".s.PGSQL.{PORT}"))
}

fn lock_data_dir(data_dir: &Path) -> Result<Flock<File>, EmbeddedError> {
    let path = data_dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err("open", &path))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0)
                .and_then(|()| writeln!(lock, "{}", std::process::id()))
                .map_err(io_err("write", &path))?;
            Ok(lock)
        }
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut contents = String::new();
            let pid = file
                .read_to_string(&mut contents)
                .ok()
                .and_then(|_| contents.trim().parse().ok());
            Err(EmbeddedError::InUse {
                data_dir: data_dir.to_path_buf(),
                pid,
            })
        }
        Err((_, errno)) => Err(io_err("lock", &path)(errno.into())),
    }
}

/// The bin dir of the first `initdb` on `path_var` that has a `postgres` beside it, else the
/// highest-versioned `<versioned_root>/<version>/bin`.
fn find_server_bin_dir(path_var: Option<&OsStr>, versioned_root: &Path) -> Option<PathBuf> {
    path_var
        .into_iter()
        .flat_map(env::split_paths)
        .find_map(|dir| server_bin_dir_of(&dir.join("initdb")))
        .or_else(|| highest_versioned_bin_dir(versioned_root))
}

fn server_bin_dir_of(initdb: &Path) -> Option<PathBuf> {
    // Resolving symlinks takes `postgres` from the same installation as `initdb` (e.g.
    // /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb) and skips wrappers such as
    // Debian's pg_wrapper, whose directory holds no server.
    let initdb = fs::canonicalize(initdb).ok()?;
    let dir = initdb.parent()?;
    (is_executable(&initdb) && is_executable(&dir.join("postgres"))).then(|| dir.to_path_buf())
}

fn highest_versioned_bin_dir(versioned_root: &Path) -> Option<PathBuf> {
    fs::read_dir(versioned_root)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = parse_version(entry.file_name().to_str()?)?;
            let bin_dir = server_bin_dir_of(&entry.path().join("bin").join("initdb"))?;
            Some((version, bin_dir))
        })
        .max_by(|(a, _), (b, _)| a.cmp(b))
        .map(|(_, bin_dir)| bin_dir)
}

/// "9.6" -> [9, 6], "15" -> [15]; numeric so that 10 sorts above 9.6.
fn parse_version(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.mode() & 0o111 != 0)
}

/// The user PostgreSQL runs as when taskledger runs as root.
#[derive(Debug)]
struct RunAs {
    name: String,
    uid: Uid,
    gid: Gid,
}

impl RunAs {
    fn apply(&self, command: &mut Command) {
        // std also drops root's supplementary groups when it switches uid.
        command.uid(self.uid.as_raw()).gid(self.gid.as_raw());
    }
}

fn unprivileged_user() -> Result<Option<RunAs>, EmbeddedError> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    ["postgres", "nobody"]
        .into_iter()
        .find_map(|name| User::from_name(name).ok().flatten())
        .map(|user| {
            Some(RunAs {
                name: user.name,
                uid: user.uid,
                gid: user.gid,
            })
        })
        .ok_or(EmbeddedError::NoUnprivilegedUser)
}

/// Root passes every permission check, so whether `user` can reach `dir` is worked out from the
/// mode bits of `dir` and its ancestors (the user runs without supplementary groups).
fn check_traversable(dir: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    for ancestor in dir.ancestors() {
        let meta = fs::metadata(ancestor).map_err(io_err("inspect", ancestor))?;
        let search_bit = if meta.uid() == user.uid.as_raw() {
            0o100
        } else if meta.gid() == user.gid.as_raw() {
            0o010
        } else {
            0o001
        };
        if meta.mode() & search_bit == 0 {
            return Err(EmbeddedError::DirNotReachable {
                user: user.name.clone(),
                dir: ancestor.to_path_buf(),
            });
        }
    }
    Ok(())
}

fn chown_tree(path: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
    // symlink_metadata and lchown: links (pg_wal, tablespaces) are not followed out of the tree.
    let meta = fs::symlink_metadata(path).map_err(io_err("inspect", path))?;
    if meta.uid() != uid || meta.gid() != gid {
        lchown(path, Some(uid), Some(gid)).map_err(io_err("change owner of", path))?;
    }
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(io_err("list", path))? {
            chown_tree(&entry.map_err(io_err("list", path))?.path(), user)?;
        }
    }
    Ok(())
}

/// Live `postgres` processes whose working directory is `pg_dir`. A postmaster always changes
/// into its data directory and its children inherit it, so this finds a cluster's processes
/// without trusting a possibly stale postmaster.pid.
fn cluster_processes(pg_dir: &Path) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&pid| {
            is_live_postgres(pid)
                && fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == pg_dir)
        })
        .collect()
}

fn is_live_postgres(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "<pid> (<comm>) <state> ...", where comm may itself contain ") ".
    let Some((head, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let comm = head.split_once('(').map_or("", |(_, comm)| comm);
    let state = rest.trim_start().chars().next();
    comm == "postgres" && !matches!(state, Some('Z' | 'X'))
}

/// The pid on the first line of a lock file of postgres (postmaster.pid or a socket's).
fn read_lock_file_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
        .filter(|&pid| pid > 0)
}

/// Stops a postmaster orphaned by a killed owner (it still runs, the lock is free), and the
/// children of a postmaster that died, which would otherwise still hold its shared memory and
/// could still write.
fn stop_leftover_processes(pg_dir: &Path) -> Result<(), EmbeddedError> {
    let leftovers = cluster_processes(pg_dir);
    if leftovers.is_empty() {
        return Ok(());
    }
    let postmaster =
        read_lock_file_pid(&pg_dir.join("postmaster.pid")).filter(|pid| leftovers.contains(pid));
    let Some(postmaster) = postmaster else {
        tracing::warn!(pids = ?leftovers, dir = %pg_dir.display(), "waiting for the processes of an exited PostgreSQL to exit");
        return stop_orphaned_children(pg_dir);
    };
    tracing::warn!(pid = postmaster, dir = %pg_dir.display(), "stopping PostgreSQL left running by an earlier taskledger process");
    for (signal, timeout) in SHUTDOWN_STEPS {
        // An error means it exited meanwhile.
        let _ = kill(Pid::from_raw(postmaster), signal);
        if poll_until(timeout, || {
            cluster_processes(pg_dir).is_empty().then_some(())
        })
        .is_some()
        {
            return Ok(());
        }
    }
    Err(EmbeddedError::LeftoverProcesses {
        dir: pg_dir.to_path_buf(),
        pids: cluster_processes(pg_dir),
    })
}

/// Children of a dead postmaster exit by themselves once they notice, except a backend busy
/// with a long statement; after a grace period they get SIGQUIT, as a postmaster sends its
/// children when one of them crashed.
fn stop_orphaned_children(pg_dir: &Path) -> Result<(), EmbeddedError> {
    let gone = || cluster_processes(pg_dir).is_empty().then_some(());
    if poll_until(ORPHAN_GRACE, gone).is_some() {
        return Ok(());
    }
    for pid in cluster_processes(pg_dir) {
        // An error means it exited meanwhile.
        let _ = kill(Pid::from_raw(pid), Signal::SIGQUIT);
    }
    if poll_until(ORPHAN_QUIT_TIMEOUT, gone).is_some() {
        return Ok(());
    }
    Err(EmbeddedError::LeftoverProcesses {
        dir: pg_dir.to_path_buf(),
        pids: cluster_processes(pg_dir),
    })
}

/// A crashed postmaster leaves its lock files, postmaster.pid and the socket's
/// `.s.PGSQL.<port>.lock`, each naming its pid. postgres replaces them when that pid is dead,
/// but refuses to start while it is alive. With none of the cluster's processes left, a live
/// pid there was reused by another process (or is an unreaped zombie), so the file is stale and
/// removing it is safe. One naming a dead pid stays: postgres also reads postmaster.pid to check
/// that no process of the old server still uses its shared memory.
fn remove_stale_lock_files(pg_dir: &Path) -> Result<(), EmbeddedError> {
    let socket_lock = PathBuf::from(format!("{}.lock", socket_path(pg_dir).display()));
    for path in [pg_dir.join("postmaster.pid"), socket_lock] {
        let Some(pid) = read_lock_file_pid(&path) else {
            continue;
        };
        if kill(Pid::from_raw(pid), None).is_err() {
            continue;
        }
        tracing::warn!(pid, file = %path.display(), "removing a stale lock file naming an unrelated process");
        fs::remove_file(&path).map_err(io_err("remove", path))?;
    }
    Ok(())
}

fn ensure_cluster(
    data_dir: &Path,
    pg_dir: &Path,
    bin_dir: &Path,
    run_as: Option<&RunAs>,
    durable: bool,
) -> Result<(), EmbeddedError> {
    if pg_dir.join("PG_VERSION").is_file() {
        return check_cluster_version(pg_dir, bin_dir);
    }
    if fs::read_dir(pg_dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(EmbeddedError::NotACluster(pg_dir.to_path_buf()));
    }
    // initdb works in a staging dir that is renamed into place when complete, so an interrupted
    // initdb never leaves a half-made cluster that a later start would take for a real one.
    let staging = data_dir.join(STAGING_DIR);
    if staging.exists() {
        // Left by an interrupted initdb; the data dir lock rules out a concurrent one.
        fs::remove_dir_all(&staging).map_err(io_err("remove", &staging))?;
    }
    DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(io_err("create", &staging))?;
    if let Some(user) = run_as {
        chown_tree(&staging, user)?;
    }

    let started = Instant::now();
    let initdb = bin_dir.join("initdb");
    let mut command = Command::new(&initdb);
    command.arg("-D").arg(&staging).args([
        "-U",
        SUPERUSER,
        "--auth=trust",
        "-E",
        "UTF8",
        "--locale=C",
    ]);
    if !durable {
        command.arg("--no-sync");
    }
    // The working directory must be one the unprivileged user can enter.
    command.current_dir(&staging).stdin(Stdio::null());
    if let Some(user) = run_as {
        user.apply(&mut command);
    }
    let output = command.output().map_err(io_err("run", &initdb))?;
    if !output.status.success() {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        return Err(EmbeddedError::Initdb {
            status: output.status,
            output: last_lines(&text),
        });
    }
    fs::rename(&staging, pg_dir).map_err(io_err("move initdb output to", pg_dir))?;
    tracing::info!(
        dir = %pg_dir.display(),
        elapsed_ms = started.elapsed().as_millis(),
        "initialized embedded PostgreSQL cluster"
    );
    Ok(())
}

/// Turns a cluster/binaries major version mismatch into a one-line error instead of a FATAL in
/// the server log.
fn check_cluster_version(pg_dir: &Path, bin_dir: &Path) -> Result<(), EmbeddedError> {
    let version_file = pg_dir.join("PG_VERSION");
    let cluster = fs::read_to_string(&version_file)
        .map_err(io_err("read", &version_file))?
        .trim()
        .to_owned();
    let postgres = bin_dir.join("postgres");
    let output = Command::new(&postgres)
        .arg("--version")
        .output()
        .map_err(io_err("run", &postgres))?;
    match major_version(&String::from_utf8_lossy(&output.stdout)) {
        Some(binaries) if binaries != cluster => Err(EmbeddedError::VersionMismatch {
            dir: pg_dir.to_path_buf(),
            cluster,
            binaries,
            bin_dir: bin_dir.to_path_buf(),
        }),
        // Unparsable output: postgres itself reports a real mismatch in its log.
        _ => Ok(()),
    }
}

/// "postgres (PostgreSQL) 15.13 (Debian ...)" -> "15"; "... 9.6.24" -> "9.6" (before 10 the
/// major version had two parts).
fn major_version(version_output: &str) -> Option<String> {
    let version = version_output
        .split_whitespace()
        .skip_while(|word| *word != "(PostgreSQL)")
        .nth(1)?;
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .take_while(|part| !part.is_empty());
    let major: u32 = parts.next()?.parse().ok()?;
    if major >= 10 {
        return Some(major.to_string());
    }
    Some(format!("{major}.{}", parts.next()?))
}

/// Opens the server log for appending; returns it and its current length (where this run's
/// output starts).
fn open_log(path: &Path) -> Result<(File, u64), EmbeddedError> {
    let dir = path
        .parent()
        .expect("the log lives in the cluster's log dir");
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    if fs::metadata(path).is_ok_and(|meta| meta.len() > LOG_ROTATE_BYTES) {
        let rotated = dir.join(format!("{LOG_FILE}.1"));
        fs::rename(path, &rotated).map_err(io_err("rotate", path))?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err("open", path))?;
    let offset = file.metadata().map_err(io_err("inspect", path))?.len();
    Ok((file, offset))
}

impl Cluster {
    /// Runs postgres on the cluster, its output appended to the log; returns it and where its
    /// output starts in the log.
    fn spawn_postmaster(&self) -> Result<(Child, u64), EmbeddedError> {
        let pg_dir_path = Path::new(&self.pg_dir);
        // postgres refuses a cluster directory that others can read.
        fs::set_permissions(pg_dir_path, fs::Permissions::from_mode(0o700))
            .map_err(io_err("set permissions of", pg_dir_path))?;
        let (log, log_offset) = open_log(&self.log_path)?;
        if let Some(user) = &self.run_as {
            // Also fixes clusters left by a run as another user, and the log just opened.
            chown_tree(pg_dir_path, user)?;
        }
        let postmaster = spawn_postgres(
            &self.bin_dir,
            &self.pg_dir,
            self.options,
            self.run_as.as_ref(),
            log,
        )?;
        Ok((postmaster, log_offset))
    }
}

fn spawn_postgres(
    bin_dir: &Path,
    pg_dir: &str,
    options: EmbeddedOptions,
    run_as: Option<&RunAs>,
    log: File,
) -> Result<Child, EmbeddedError> {
    let postgres = bin_dir.join("postgres");
    let mut command = Command::new(&postgres);
    command
        .arg("-D")
        .arg(pg_dir)
        .arg("-c")
        .arg("listen_addresses=")
        .arg("-c")
        .arg(format!(
            "unix_socket_directories={}",
            quote_list_item(pg_dir)
        ))
        // PGPORT in the environment would otherwise rename the socket behind url()'s back.
        .arg("-c")
        .arg(format!("port={PORT}"))
        .arg("-c")
        .arg(format!("max_connections={}", options.max_connections));
    if !options.durable {
        for setting in NON_DURABLE_SETTINGS {
            command.arg("-c").arg(setting);
        }
    }
    if options.statement_statistics && has_statement_statistics(bin_dir) {
        command
            .arg("-c")
            .arg("shared_preload_libraries=pg_stat_statements");
    }
    let log_for_stdout = log.try_clone().map_err(io_err("duplicate", pg_dir))?;
    command
        .current_dir(pg_dir)
        .stdin(Stdio::null())
        .stdout(log_for_stdout)
        .stderr(log)
        // Its own process group: a terminal's Ctrl-C reaches only the service, which then
        // stops postgres in order, instead of postgres dying under it first.
        .process_group(0);
    if let Some(user) = run_as {
        user.apply(&mut command);
    }
    command.spawn().map_err(io_err("run", &postgres))
}

/// unix_socket_directories is a list: a path with spaces or commas must be double-quoted, and
/// a double quote inside is doubled.
fn quote_list_item(item: &str) -> String {
    format!("\"{}\"", item.replace('"', "\"\""))
}

/// Stops the postmaster if this process dies without stopping it (SIGKILL, abort, a test binary
/// exiting with the cluster in a static): `sh` blocks reading a pipe whose only write end this
/// process holds, and the kernel closes that end when the process dies.
fn spawn_watchdog(postmaster_pid: u32) -> Result<Child, EmbeddedError> {
    let sh = Path::new("/bin/sh");
    Command::new(sh)
        .args([
            "-c",
            r#"read -r _; kill -INT "$1""#,
            "taskledger-pg-watchdog",
            &postmaster_pid.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Same reason as the postmaster: a terminal Ctrl-C must not end it early.
        .process_group(0)
        .spawn()
        .map_err(io_err("run", sh))
}

/// postgres (10 and later) marks its postmaster.pid "ready" once it accepts connections.
/// Probing only then keeps "FATAL: the database system is starting up" out of the log, while
/// the probe stays the real test. A stale file from an earlier run names another pid.
fn pid_file_says_ready(pg_dir: &Path, postmaster_pid: u32) -> bool {
    let Ok(contents) = fs::read_to_string(pg_dir.join("postmaster.pid")) else {
        return false;
    };
    let mut lines = contents.lines().map(str::trim);
    let names_ours = lines.next() == Some(postmaster_pid.to_string().as_str());
    // The status is the 8th line, written after the socket exists.
    names_ours && lines.nth(6) == Some("ready")
}

/// One connection attempt, as pg_isready does: Ok once the server answers a startup message
/// with an authentication request, Err with the reason otherwise (e.g. "the database system is
/// starting up").
fn probe(socket: &Path) -> Result<(), String> {
    let mut stream = UnixStream::connect(socket).map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(PROBE_TIMEOUT)))
        .and_then(|()| stream.write_all(&startup_message()))
        .map_err(|error| error.to_string())?;
    let mut header = [0u8; 5];
    stream
        .read_exact(&mut header)
        .map_err(|error| error.to_string())?;
    match header[0] {
        b'R' => {
            // Terminate, so the server does not wait for a query. Failure is harmless.
            let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
            Ok(())
        }
        b'E' => {
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            let mut body = vec![0; len.saturating_sub(4).min(8192)];
            stream
                .read_exact(&mut body)
                .map_err(|error| error.to_string())?;
            Err(error_response_text(&body))
        }
        other => Err(format!("unexpected reply 0x{other:02x}")),
    }
}

fn startup_message() -> Vec<u8> {
    const PROTOCOL_3_0: u32 = 3 << 16;
    let params = format!("user\0{SUPERUSER}\0database\0postgres\0\0");
    let len = u32::try_from(8 + params.len()).expect("startup message is a few bytes");
    [
        &len.to_be_bytes()[..],
        &PROTOCOL_3_0.to_be_bytes(),
        params.as_bytes(),
    ]
    .concat()
}

/// "message (SQLSTATE)" from an ErrorResponse body: fields of a type byte and a NUL-terminated
/// string.
fn error_response_text(body: &[u8]) -> String {
    let mut message = "";
    let mut code = "";
    for field in body.split(|&byte| byte == 0) {
        let Some((&kind, value)) = field.split_first() else {
            continue;
        };
        let value = std::str::from_utf8(value).unwrap_or("");
        match kind {
            b'M' => message = value,
            b'C' => code = value,
            _ => {}
        }
    }
    format!("{message} ({code})")
}

/// Calls `check` every POLL_INTERVAL until it returns Some or `timeout` passes.
fn poll_until<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

fn as_pid(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).expect("Linux pids fit in i32"))
}

/// The last lines that this run wrote to the log, on one line.
fn log_tail(path: &Path, since: u64) -> String {
    let mut text = Vec::new();
    let read = File::open(path).and_then(|mut file| {
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(since.max(len.saturating_sub(8192))))?;
        file.read_to_end(&mut text)
    });
    match read {
        Ok(_) => last_lines(&String::from_utf8_lossy(&text)),
        Err(error) => format!("(log unreadable: {error})"),
    }
}

/// The last LOG_TAIL_LINES non-empty lines of `text`, joined with " | " to stay on one line.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    if lines.is_empty() {
        return "(no output)".to_owned();
    }
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" | ")
}

/// Percent-encodes all but unreserved characters and '/', which stays readable in socket paths.
fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct ScratchDir(PathBuf);

    impl ScratchDir {
        fn new(name: &str) -> Self {
            let dir = env::temp_dir().join(format!("embedded-pg-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn executable(&self, relative: &str) -> PathBuf {
            let path = self.0.join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            path
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn binaries_on_path_resolve_symlinks_to_the_server_dir() {
        let scratch = ScratchDir::new("symlink");
        let initdb = scratch.executable("lib/15/bin/initdb");
        scratch.executable("lib/15/bin/postgres");
        let path_dir = scratch.0.join("local-bin");
        fs::create_dir_all(&path_dir).unwrap();
        std::os::unix::fs::symlink(&initdb, path_dir.join("initdb")).unwrap();

        let found = find_server_bin_dir(Some(path_dir.as_os_str()), Path::new("/nonexistent"));
        assert_eq!(found, Some(scratch.0.join("lib/15/bin")));
    }

    #[test]
    fn initdb_without_postgres_beside_it_is_skipped() {
        let scratch = ScratchDir::new("wrapper");
        scratch.executable("wrapper/initdb");
        scratch.executable("lib/16/bin/initdb");
        scratch.executable("lib/16/bin/postgres");
        let path_var = env::join_paths([scratch.0.join("wrapper")]).unwrap();

        let found = find_server_bin_dir(Some(&path_var), &scratch.0.join("lib"));
        assert_eq!(found, Some(scratch.0.join("lib/16/bin")));
    }

    #[test]
    fn highest_numeric_version_wins() {
        let scratch = ScratchDir::new("versions");
        for version in ["9.6", "10", "15", "not-a-version"] {
            scratch.executable(&format!("{version}/bin/initdb"));
            scratch.executable(&format!("{version}/bin/postgres"));
        }
        // A newer version without a server does not count.
        scratch.executable("16/bin/initdb");

        let found = find_server_bin_dir(None, &scratch.0);
        assert_eq!(found, Some(scratch.0.join("15/bin")));
    }

    #[test]
    fn no_binaries_found() {
        let scratch = ScratchDir::new("empty");
        let path_var = env::join_paths([&scratch.0]).unwrap();
        assert_eq!(find_server_bin_dir(Some(&path_var), &scratch.0), None);
        let message = EmbeddedError::BinariesNotFound.to_string();
        assert!(message.contains("apt-get install postgresql"), "{message}");
    }

    #[test]
    fn major_versions() {
        let v15 = "postgres (PostgreSQL) 15.13 (Debian 15.13-0+deb12u1)\n";
        assert_eq!(major_version(v15).as_deref(), Some("15"));
        assert_eq!(
            major_version("postgres (PostgreSQL) 16beta1").as_deref(),
            Some("16")
        );
        assert_eq!(
            major_version("postgres (PostgreSQL) 9.6.24").as_deref(),
            Some("9.6")
        );
        assert_eq!(major_version("something else"), None);
    }

    #[test]
    fn socket_dir_limit_is_checked_on_the_full_socket_path() {
        // "/" + 92 + "/.s.PGSQL.5432" (14) = 107 bytes, the most that fits.
        let fits = PathBuf::from(format!("/{}", "a".repeat(92)));
        assert_eq!(socket_path(&fits).as_os_str().len(), SOCKET_PATH_MAX);
        assert!(checked_socket_dir(&fits).is_ok());

        let too_long = PathBuf::from(format!("/{}", "a".repeat(93)));
        let error = checked_socket_dir(&too_long).unwrap_err();
        assert!(
            matches!(error, EmbeddedError::SocketPathTooLong { len: 108, .. }),
            "{error}"
        );
    }

    #[test]
    fn url_parts_are_percent_encoded() {
        assert_eq!(percent_encode("/tmp/a b/pg"), "/tmp/a%20b/pg");
        assert_eq!(percent_encode("db&x=1#"), "db%26x%3D1%23");
        assert_eq!(quote_list_item(r#"/a "b",c"#), r#""/a ""b"",c""#);
    }

    #[test]
    fn error_responses_and_log_tails_fit_on_one_line() {
        let body = b"SFATAL\0C57P03\0Mthe database system is starting up\0\0";
        assert_eq!(
            error_response_text(body),
            "the database system is starting up (57P03)"
        );
        assert_eq!(last_lines("a\n\nb\nc\nd\ne\nf\n"), "b | c | d | e | f");
        assert_eq!(last_lines("\n"), "(no output)");
    }
}
