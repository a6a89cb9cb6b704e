//! Integration tests for the embedded PostgreSQL cluster. They run real clusters from the
//! machine's PostgreSQL server binaries (`apt-get install postgresql`), as root or not.
//!
//! Some tests need a second owner process that can be SIGKILLed: they re-run this test binary
//! with only `hold_cluster_until_killed` selected (see `Holder`). Others run `taskledger serve`
//! itself (see `Service`).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid};
use sqlx::{Connection, PgConnection};
use taskledger::db::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use tempfile::TempDir;

const TEST_OPTIONS: EmbeddedOptions = EmbeddedOptions {
    durable: false,
    max_connections: 20,
    statement_statistics: false,
};
const HOLD_DATA_DIR_ENV: &str = "EMBEDDED_PG_TEST_HOLD_DATA_DIR";
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

fn init_tracing() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
}

/// A data dir the unprivileged user that runs PostgreSQL under root can enter (0711).
fn data_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("embedded-pg-")
        .permissions(fs::Permissions::from_mode(0o711))
        .tempdir()
        .expect("create temp dir")
}

async fn connect(pg: &EmbeddedPostgres) -> PgConnection {
    PgConnection::connect(&pg.url("postgres"))
        .await
        .expect("connect through url()")
}

async fn query_i64(pg: &EmbeddedPostgres, sql: &str) -> i64 {
    let mut conn = connect(pg).await;
    let value = sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .expect(sql);
    conn.close().await.expect("close connection");
    value
}

async fn execute(pg: &EmbeddedPostgres, sql: &str) {
    let mut conn = connect(pg).await;
    sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
    conn.close().await.expect("close connection");
}

/// Live postgres processes whose working directory is under `dir` (a postmaster and its
/// children run in their data directory).
fn cluster_processes(dir: &Path) -> Vec<i32> {
    let dir = fs::canonicalize(dir).expect("canonical dir");
    fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let live = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'));
            live && stat.contains("(postgres)")
                && fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(&dir))
        })
        .collect()
}

fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn assert_no_cluster_processes(dir: &Path) {
    assert!(
        wait_until(EXIT_TIMEOUT, || cluster_processes(dir).is_empty()),
        "postgres processes left in {}: {:?}",
        dir.display(),
        cluster_processes(dir)
    );
}

fn is_alive(pid: i32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
}

/// Not a real test: the owner process that `Holder` runs. It starts a cluster in the data dir
/// named by its environment, reports the postmaster pid and waits to be killed.
#[tokio::test]
#[ignore = "helper process, started by other tests"]
async fn hold_cluster_until_killed() {
    let Some(dir) = std::env::var_os(HOLD_DATA_DIR_ENV) else {
        return;
    };
    let pg = EmbeddedPostgres::start(Path::new(&dir), TEST_OPTIONS)
        .await
        .expect("holder starts the cluster");
    execute(
        &pg,
        "CREATE TABLE IF NOT EXISTS held (n int); INSERT INTO held VALUES (7)",
    )
    .await;
    println!("POSTMASTER {}", pg.pid());
    std::future::pending::<()>().await;
}

/// Another process owning a cluster, killed (SIGKILL, so without any cleanup of its own) when
/// dropped; its watchdog then stops its postgres.
struct Holder {
    process: Child,
    postmaster: i32,
    data_dir: PathBuf,
}

impl Holder {
    fn spawn(data_dir: &Path) -> Self {
        let mut process = Command::new(std::env::current_exe().expect("test binary path"))
            .args([
                "hold_cluster_until_killed",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(HOLD_DATA_DIR_ENV, data_dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn holder");
        let stdout = BufReader::new(process.stdout.take().expect("holder stdout"));
        // libtest may print "test name ... " on the same line before our output.
        let postmaster = stdout
            .lines()
            .map(|line| line.expect("read holder output"))
            .find_map(|line| line.split("POSTMASTER ").nth(1)?.trim().parse().ok())
            .expect("holder exited before reporting its postmaster");
        Self {
            process,
            postmaster,
            data_dir: data_dir.to_path_buf(),
        }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.process.id()).expect("pid fits i32")
    }

    /// The holder's watchdog: its child running `sh`.
    fn watchdog(&self) -> i32 {
        fs::read_dir("/proc")
            .expect("read /proc")
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let parent = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
                let cmdline =
                    fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                parent == Some(self.pid()) && cmdline.contains("taskledger-pg-watchdog")
            })
            .expect("holder has a watchdog")
    }

    fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.kill();
        assert_no_cluster_processes(&self.data_dir);
    }
}

#[tokio::test]
async fn starts_and_serves_sqlx_connections_over_its_socket() {
    init_tracing();
    let root = data_dir();
    // The URL and the socket setting must survive characters that need escaping.
    let dir = root.path().join("data dir, \"quoted\"");
    let pg = EmbeddedPostgres::start(&dir, TEST_OPTIONS)
        .await
        .expect("start");

    let url = pg.url("postgres");
    assert!(url.contains("host=/"), "{url}");
    let socket_dir = fs::canonicalize(&dir).unwrap().join("pg");
    assert!(socket_dir.join(".s.PGSQL.5432").exists());
    assert_eq!(query_i64(&pg, "SELECT 1::int8").await, 1);
    let mut conn = connect(&pg).await;
    for (setting, expected) in [
        ("listen_addresses", ""),
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("max_connections", "20"),
    ] {
        let value: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, expected, "{setting}");
    }
    conn.close().await.unwrap();
    assert!(socket_dir.join("log/postgres.log").is_file());
    let mode = fs::metadata(&socket_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);

    pg.stop().await.expect("stop");
    assert_no_cluster_processes(&dir);
}

#[tokio::test]
async fn restart_reuses_the_cluster() {
    init_tracing();
    let dir = data_dir();
    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("first start");
    execute(
        &pg,
        "CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)",
    )
    .await;
    pg.stop().await.expect("stop");

    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("second start");
    assert_eq!(query_i64(&pg, "SELECT sum(n)::int8 FROM kept").await, 42);
    pg.stop().await.expect("stop again");
    assert_no_cluster_processes(dir.path());
}

#[tokio::test]
async fn second_start_in_the_same_process_fails_while_the_first_runs() {
    init_tracing();
    let dir = data_dir();
    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("first start");

    let error = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect_err("second start must fail");
    assert!(
        matches!(error, EmbeddedError::InUse { pid: Some(pid), .. } if pid == std::process::id()),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("is in use by another taskledger process (pid"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
    // The first cluster is untouched.
    assert_eq!(query_i64(&pg, "SELECT 1::int8").await, 1);

    pg.stop().await.expect("stop");
    assert_no_cluster_processes(dir.path());
}

#[tokio::test]
async fn start_fails_while_another_process_owns_the_data_dir() {
    init_tracing();
    let dir = data_dir();
    let holder = Holder::spawn(dir.path());

    let error = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect_err("start must fail while the holder runs");
    assert!(
        matches!(error, EmbeddedError::InUse { pid: Some(pid), .. } if pid == holder.process.id()),
        "{error:?}"
    );
    assert!(
        is_alive(holder.postmaster),
        "the holder's postgres was disturbed"
    );
}

#[tokio::test]
async fn start_works_after_postmaster_was_killed_and_owner_dropped_without_stop() {
    init_tracing();
    let dir = data_dir();
    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("first start");
    // With synchronous_commit=off a commit survives a postgres crash only once the WAL writer
    // has flushed it (within ~200 ms); this one must survive, so it commits synchronously.
    execute(
        &pg,
        "SET synchronous_commit = on; CREATE TABLE kept (n int); INSERT INTO kept VALUES (5)",
    )
    .await;
    let pid = i32::try_from(pg.pid()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 the postmaster");
    drop(pg);
    assert!(
        dir.path().join("pg/postmaster.pid").exists(),
        "a killed postmaster leaves its pid file"
    );

    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("start after kill -9");
    assert_eq!(query_i64(&pg, "SELECT sum(n)::int8 FROM kept").await, 5);
    pg.stop().await.expect("stop");
    assert_no_cluster_processes(dir.path());
}

/// Replaces the pid on the first line of a postgres lock file, as if the dead postmaster's pid
/// had been reused by `pid`.
fn point_lock_file_at(path: &Path, pid: u32) {
    let contents = fs::read_to_string(path).expect("lock file");
    let rest = contents.split_once('\n').map_or("", |(_, rest)| rest);
    fs::write(path, format!("{pid}\n{rest}")).expect("rewrite lock file");
}

#[tokio::test]
async fn restart_after_kill_9_reaps_the_postmaster_and_clears_lock_files_of_a_reused_pid() {
    init_tracing();
    let dir = data_dir();
    let mut pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("start");
    execute(
        &pg,
        "SET synchronous_commit = on; CREATE TABLE kept (n int); INSERT INTO kept VALUES (5)",
    )
    .await;
    let killed = i32::try_from(pg.pid()).unwrap();
    kill(Pid::from_raw(killed), Signal::SIGKILL).expect("kill -9 the postmaster");
    let status = loop {
        if let Some(status) = pg.exit_status().expect("wait for the postmaster") {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.to_string(), "signal: 9 (SIGKILL)");
    assert_ne!(process_state(killed), Some('Z'), "not reaped");
    let mut unrelated = Command::new("sleep");
    unrelated.arg("60");
    if geteuid().is_root() {
        // postgres takes a pid it may not signal for a dead one: the process reusing the pid
        // must be one of the user postgres runs as.
        let user = ["postgres", "nobody"]
            .into_iter()
            .find_map(|name| nix::unistd::User::from_name(name).ok().flatten())
            .expect("the user PostgreSQL runs as");
        unrelated.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    let mut unrelated = unrelated.spawn().expect("spawn sleep");
    let pg_dir = dir.path().join("pg");
    for lock_file in ["postmaster.pid", ".s.PGSQL.5432.lock"] {
        point_lock_file_at(&pg_dir.join(lock_file), unrelated.id());
    }

    let (pg, restarted) = pg.restart().await;
    restarted.expect("restart after kill -9");
    assert_ne!(i32::try_from(pg.pid()).unwrap(), killed);
    assert_eq!(query_i64(&pg, "SELECT sum(n)::int8 FROM kept").await, 5);
    assert!(is_alive(i32::try_from(unrelated.id()).unwrap()));
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
    pg.stop().await.expect("stop");
    assert_no_cluster_processes(dir.path());
}

#[tokio::test]
async fn start_stops_postgres_orphaned_by_a_killed_owner() {
    init_tracing();
    let dir = data_dir();
    let mut holder = Holder::spawn(dir.path());
    // Owner and watchdog both SIGKILLed: nothing stops the postmaster but the next start.
    kill(Pid::from_raw(holder.watchdog()), Signal::SIGKILL).expect("kill the watchdog");
    holder.kill();
    assert!(
        is_alive(holder.postmaster),
        "postgres should outlive its killed owner"
    );

    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("start over an orphaned postgres");
    assert!(!is_alive(holder.postmaster), "the orphan was not stopped");
    assert_ne!(i32::try_from(pg.pid()).unwrap(), holder.postmaster);
    assert_eq!(query_i64(&pg, "SELECT sum(n)::int8 FROM held").await, 7);
    pg.stop().await.expect("stop");
    assert_no_cluster_processes(dir.path());
}

#[tokio::test]
async fn watchdog_stops_postgres_when_its_owner_is_killed() {
    init_tracing();
    let dir = data_dir();
    let mut holder = Holder::spawn(dir.path());
    holder.kill();
    assert!(
        wait_until(EXIT_TIMEOUT, || !is_alive(holder.postmaster)),
        "postgres outlived its killed owner"
    );

    // A clean shutdown: the next start needs no recovery, and works.
    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("start after the owner was killed");
    assert_eq!(query_i64(&pg, "SELECT sum(n)::int8 FROM held").await, 7);
    pg.stop().await.expect("stop");
}

#[tokio::test]
async fn too_long_socket_path_is_a_clear_error() {
    init_tracing();
    let dir = data_dir();
    let deep = dir.path().join("d".repeat(100));

    let error = EmbeddedPostgres::start(&deep, TEST_OPTIONS)
        .await
        .expect_err("a socket path over 107 bytes must be refused");
    assert!(
        matches!(error, EmbeddedError::SocketPathTooLong { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&"d".repeat(100)),
        "names the path: {message}"
    );
    assert!(message.contains(".s.PGSQL.5432"), "{message}");
    assert!(!message.contains('\n'), "{message}");
}

#[tokio::test]
async fn root_needs_a_data_dir_the_postgres_user_can_enter() {
    if !geteuid().is_root() {
        eprintln!("skipped: only applies when running as root");
        return;
    }
    init_tracing();
    let private = tempfile::Builder::new()
        .prefix("embedded-pg-private-")
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir()
        .unwrap();

    let error = EmbeddedPostgres::start(&private.path().join("data"), TEST_OPTIONS)
        .await
        .expect_err("an unreachable data dir must be refused");
    assert!(
        matches!(&error, EmbeddedError::DirNotReachable { dir, .. } if dir == private.path()),
        "{error:?}"
    );
    assert!(error.to_string().contains("chmod o+x"), "{error}");
}

const ADMIN_SECRET: &str = "tl_embedded_pg_test_admin_secret";
/// The pool's acquire timeout (3 s), with room for a loaded machine.
const OUTAGE_ANSWER_TIME: Duration = Duration::from_secs(5);
/// Crash recovery of a durable cluster, which fsyncs its data dir first, with room to spare.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(45);

/// `taskledger serve` in embedded mode, as an operator runs it: the real binary with its own
/// cluster in a data dir, on a port it chose. Killed when dropped.
struct Service {
    process: Child,
    base_url: String,
    data_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    http: reqwest::Client,
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
    took: Duration,
}

impl Service {
    fn spawn(data_dir: &Path) -> Self {
        Self::spawn_with(data_dir, &[])
    }

    /// With `env` added to its environment: a `DATABASE_URL` there makes it a replica on
    /// that server instead of the owner of an embedded cluster.
    fn spawn_with(data_dir: &Path, env: &[(&str, &str)]) -> Self {
        let mut process = Command::new(env!("CARGO_BIN_EXE_taskledger"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "serve"])
            .env_remove("DATABASE_URL")
            .env("TASKLEDGER_BOOTSTRAP_TOKEN", ADMIN_SECRET)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn taskledger serve");
        let stderr = BufReader::new(process.stderr.take().expect("service stderr"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (address_tx, address_rx) = mpsc::channel();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if line.contains("taskledger is ready")
                    && let Some((_, address)) = line.split_once("address=")
                {
                    let _ = address_tx.send(address.trim().to_owned());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let address = address_rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("serve did not get ready: {:#?}", log.lock().unwrap()));
        Self {
            process,
            base_url: format!("http://{address}"),
            data_dir: data_dir.to_path_buf(),
            log,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&str>) -> Answer {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base_url))
            .bearer_auth(ADMIN_SECRET);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let started = Instant::now();
        let response = request.send().await.expect("the service answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.expect("a whole body");
        Answer {
            status,
            headers,
            body,
            took: started.elapsed(),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// The running postmaster, read from postmaster.pid, checked to be the service's child.
    fn postmaster(&self) -> i32 {
        self.live_postmaster()
            .unwrap_or_else(|| panic!("no postmaster runs: {}", self.log()))
    }

    /// The pid in postmaster.pid, if it names a live child of the service.
    fn live_postmaster(&self) -> Option<i32> {
        let pid: i32 = fs::read_to_string(self.data_dir.join("pg/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()?;
        (parent_of(pid) == Some(self.pid()) && is_alive(pid)).then_some(pid)
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.process.id()).expect("pid fits i32")
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, as an operator stops it; it must exit cleanly and stop its cluster.
    fn stop(self) {
        self.terminate();
        self.expect_clean_exit();
    }

    fn terminate(&self) {
        kill(Pid::from_raw(self.pid()), Signal::SIGTERM).expect("SIGTERM the service");
    }

    fn has_exited(&mut self) -> bool {
        self.process.try_wait().unwrap().is_some()
    }

    /// Waits for the service to exit, which it must do with status 0 within `EXIT_TIMEOUT`
    /// and with its cluster stopped; returns how long it took.
    fn expect_clean_exit(mut self) -> Duration {
        let started = Instant::now();
        let deadline = started + EXIT_TIMEOUT;
        let status = loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not stop: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = started.elapsed();
        assert!(
            status.success(),
            "serve exited with {status}: {}",
            self.log()
        );
        assert_no_cluster_processes(&self.data_dir);
        took
    }

    /// Waits until a line of the log contains `text`.
    fn wait_for_log(&self, text: &str) {
        assert!(
            wait_until(EXIT_TIMEOUT, || self.log().contains(text)),
            "the log never said `{text}`: {}",
            self.log()
        );
    }

    /// The value of a counter of `/metrics` with the given labels; 0 before it was counted.
    async fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let metrics = self.get("/metrics").await;
        assert_eq!(metrics.status, 200, "{}", metrics.body);
        metrics
            .body
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .filter(|line| {
                labels
                    .iter()
                    .all(|(label, value)| line.contains(&format!("{label}=\"{value}\"")))
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .map(|value| value as u64)
            .sum()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The state letter of a process (`Z` for a zombie), `None` once it is gone.
fn process_state(pid: i32) -> Option<char> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("State:"))?
        .trim()
        .chars()
        .next()
}

fn assert_outage_problem(answer: &Answer, service: &Service) {
    assert_eq!(answer.status, 503, "{}\n{}", answer.body, service.log());
    assert_eq!(
        answer.headers["content-type"], "application/problem+json",
        "{}",
        answer.body
    );
    assert!(
        answer.headers.contains_key("retry-after"),
        "{:?}",
        answer.headers
    );
    assert!(
        answer.took < OUTAGE_ANSWER_TIME,
        "an outage answer took {:?}",
        answer.took
    );
}

/// Polls `path` until it answers 200 from a postmaster other than `killed`, asserting that every
/// answer before is a 200 (from a backend that has not yet noticed its postmaster died) or a
/// quick 503 problem; returns the body and how long it took from `since`.
async fn wait_for_recovery(
    service: &Service,
    path: &str,
    killed: i32,
    since: Instant,
) -> (String, Duration) {
    loop {
        let answer = service.get(path).await;
        if answer.status != 200 {
            assert_outage_problem(&answer, service);
        } else if service
            .live_postmaster()
            .is_some_and(|postmaster| postmaster != killed)
        {
            return (answer.body, since.elapsed());
        }
        assert!(
            since.elapsed() < RECOVERY_TIMEOUT,
            "no recovery within {RECOVERY_TIMEOUT:?}: {}",
            service.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `path` until it answers 503, which must come quickly and be a problem with
/// Retry-After; before, backends that have not noticed their postmaster died may still answer.
async fn wait_for_outage(service: &Service, path: &str, since: Instant) -> Answer {
    loop {
        let answer = service.get(path).await;
        if answer.status != 200 {
            assert_outage_problem(&answer, service);
            return answer;
        }
        assert!(
            since.elapsed() < OUTAGE_ANSWER_TIME,
            "still answering 200 {:?} after the database went away",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn healthz_json(answer: &Answer) -> serde_json::Value {
    serde_json::from_str(&answer.body).expect("healthz answers JSON")
}

const RECORD_PATH: &str = "/v1/projects/vision/job-records/train-1/1";

/// A service with a project and one job record stored; returns the record as it reads back.
async fn service_with_a_record(data_dir: &Path) -> (Service, String) {
    let service = Service::spawn(data_dir);
    post_a_project_and_a_record(&service, &service).await;
    let stored = service.get(RECORD_PATH).await;
    assert_eq!(stored.status, 200, "{}", stored.body);
    (service, stored.body)
}

/// Creates project `vision` through one service and posts a record of it through another (or
/// the same).
async fn post_a_project_and_a_record(project_via: &Service, record_via: &Service) {
    let created = project_via
        .call(
            reqwest::Method::POST,
            "/v1/projects",
            Some(r#"{"id": "vision", "name": "Vision", "currency": "USD"}"#),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let ingested = record_via
        .call(
            reqwest::Method::POST,
            "/v1/job-records",
            Some(
                r#"[{"project": "vision", "task_id": "train-1", "gpu_model": "H100", "gpu_count": 8,
                    "started_at": "2026-11-20T10:00:00Z", "ended_at": "2026-11-20T11:00:00Z",
                    "outcome": "completed"}]"#,
            ),
        )
        .await;
    assert_eq!(ingested.status, 200, "{}", ingested.body);
}

/// `/healthz` once it says the embedded database runs, or after 5 s: queries may be
/// answered by a restarted postmaster a moment before the supervisor, still checking it,
/// says it runs (until then, after failed restarts, `/healthz` may still answer 503).
async fn health_once_running(service: &Service) -> serde_json::Value {
    let mut last = None;
    for _ in 0..100 {
        let healthz = service.get("/healthz").await;
        let health = healthz_json(&healthz);
        if healthz.status == 200 && health["embedded_database"]["state"] == "running" {
            return health;
        }
        last = Some((healthz.status, health));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, health) = last.expect("asked at least once");
    assert_eq!(status, 200, "{health}");
    health
}

#[tokio::test]
async fn serve_restarts_its_embedded_database_after_kill_9() {
    let dir = data_dir();
    let (service, stored) = service_with_a_record(dir.path()).await;

    let postmaster = service.postmaster();
    let killed = Instant::now();
    kill(Pid::from_raw(postmaster), Signal::SIGKILL).expect("kill -9 the postmaster");
    let (body, recovered_after) =
        wait_for_recovery(&service, RECORD_PATH, postmaster, killed).await;
    eprintln!("after kill -9: the API answered 200 again after {recovered_after:?}");
    assert_eq!(body, stored);
    assert_ne!(
        process_state(postmaster),
        Some('Z'),
        "the killed postmaster is left a zombie"
    );
    let health = health_once_running(&service).await;
    assert_eq!(health["embedded_database"]["state"], "running", "{health}");
    assert_eq!(health["embedded_database"]["restarts"], 1, "{health}");
    assert_eq!(service.get("/readyz").await.status, 200);
    assert!(
        service.log().contains("status=signal: 9 (SIGKILL)"),
        "the log says how postgres ended: {}",
        service.log()
    );
    service.stop();
}

/// The cluster cannot be started while its directory is gone: requests are refused at once,
/// the supervisor keeps trying and says why, liveness fails after several failed attempts, and
/// the cluster comes back once its directory does.
#[tokio::test]
async fn serve_keeps_restarting_a_cluster_that_cannot_start() {
    let dir = data_dir();
    let (service, stored) = service_with_a_record(dir.path()).await;

    let postmaster = service.postmaster();
    let pg_dir = dir.path().join("pg");
    let away = dir.path().join("pg.away");
    fs::rename(&pg_dir, &away).expect("move the cluster away");
    let killed = Instant::now();
    kill(Pid::from_raw(postmaster), Signal::SIGKILL).expect("kill -9 the postmaster");
    let refused = wait_for_outage(&service, RECORD_PATH, killed).await;
    eprintln!(
        "cluster gone: the API answered 503 in {:?}, {:?} after kill -9",
        refused.took,
        killed.elapsed()
    );
    let readyz = service.get("/readyz").await;
    assert_outage_problem(&readyz, &service);
    let restarting = loop {
        let healthz = service.get("/healthz").await;
        assert_eq!(healthz.status, 200, "{}", healthz.body);
        let health = healthz_json(&healthz);
        if health["embedded_database"]["failed_restarts"].as_u64() >= Some(1) {
            break health;
        }
        assert!(killed.elapsed() < EXIT_TIMEOUT, "{}", service.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        restarting["embedded_database"]["state"], "restarting",
        "{restarting}"
    );
    assert!(
        restarting["embedded_database"]["down_since"].is_string(),
        "{restarting}"
    );
    let failing = loop {
        let healthz = service.get("/healthz").await;
        if healthz.status != 200 {
            break healthz;
        }
        assert!(killed.elapsed() < EXIT_TIMEOUT, "{}", service.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_outage_problem(&failing, &service);
    eprintln!("cluster gone: /healthz failed after {:?}", killed.elapsed());
    assert!(
        service.log().contains("is gone (no PG_VERSION)"),
        "the log says why restarting fails: {}",
        service.log()
    );
    assert_no_cluster_processes(dir.path());

    fs::rename(&away, &pg_dir).expect("move the cluster back");
    let restored = Instant::now();
    let (body, recovered_after) =
        wait_for_recovery(&service, RECORD_PATH, postmaster, restored).await;
    eprintln!("cluster restored: the API answered 200 again after {recovered_after:?}");
    assert_eq!(body, stored);
    let health = health_once_running(&service).await;
    assert_eq!(health["embedded_database"]["state"], "running", "{health}");
    assert_eq!(health["embedded_database"]["restarts"], 1, "{health}");
    assert_ne!(process_state(postmaster), Some('Z'));
    service.stop();
}

/// The body of the request left in flight by `start_a_request`.
const IN_FLIGHT_BODY: &[u8] = br#"{"id": "late", "name": "Late", "currency": "USD"}"#;

/// Sends the head of a `POST /v1/projects` and the first bytes of its body, so that the
/// service is handling the request when this returns: it waits for the rest of the body.
async fn start_a_request(service: &Service) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let address = service.base_url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to the service");
    let head = format!(
        "POST /v1/projects HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {ADMIN_SECRET}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        IN_FLIGHT_BODY.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&IN_FLIGHT_BODY[..8]).await.unwrap();
    // The trace layer logs a request once its handler has it.
    service.wait_for_log("started processing request");
    stream
}

/// The service with its request log on, as `start_a_request` needs.
fn service_logging_requests(data_dir: &Path, grace_seconds: &str) -> Service {
    Service::spawn_with(
        data_dir,
        &[
            ("RUST_LOG", "info,tower_http=debug"),
            ("TASKLEDGER_SHUTDOWN_GRACE_SECONDS", grace_seconds),
        ],
    )
}

#[tokio::test]
async fn sigterm_lets_the_request_in_flight_finish_then_stops_postgres() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = data_dir();
    let mut service = service_logging_requests(dir.path(), "30");
    let mut stream = start_a_request(&service).await;

    service.terminate();
    service.wait_for_log("SIGTERM received");
    let address = service.base_url.trim_start_matches("http://").to_owned();
    assert!(
        wait_until(EXIT_TIMEOUT, || std::net::TcpStream::connect(&address)
            .is_err()),
        "still accepting connections after SIGTERM"
    );
    assert!(
        !service.has_exited(),
        "exited with a request in flight: {}",
        service.log()
    );
    assert!(!cluster_processes(dir.path()).is_empty());

    stream.write_all(&IN_FLIGHT_BODY[8..]).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(EXIT_TIMEOUT, stream.read_to_string(&mut response))
        .await
        .expect("the answer comes")
        .expect("the answer reads");
    assert!(
        response.starts_with("HTTP/1.1 201"),
        "{response}\n{}",
        service.log()
    );
    assert!(response.contains(r#""id":"late""#), "{response}");
    let log = {
        let log = Arc::clone(&service.log);
        move || log.lock().unwrap().join("\n")
    };
    let took = service.expect_clean_exit();
    eprintln!("after the request in flight was answered, serve exited in {took:?}");
    assert!(log().contains("stopped embedded PostgreSQL"), "{}", log());
}

#[tokio::test]
async fn sigterm_cuts_off_a_stalled_request_after_the_shutdown_grace() {
    let dir = data_dir();
    let service = service_logging_requests(dir.path(), "1");
    let _stalled = start_a_request(&service).await;

    let signalled = Instant::now();
    service.terminate();
    let log = {
        let log = Arc::clone(&service.log);
        move || log.lock().unwrap().join("\n")
    };
    service.expect_clean_exit();
    let took = signalled.elapsed();
    eprintln!("with a stalled request and a 1 s grace, serve exited in {took:?}");
    assert!(took >= Duration::from_secs(1), "did not wait for the grace");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(
        log().contains("requests still in flight at the end of the shutdown grace were cut off"),
        "{}",
        log()
    );
}

/// A webhook receiver recording the alert ids it gets. It holds each request until two are in
/// flight at once (or `PAIR_WAIT` has passed): a replica sends one alert at a time, so only
/// two replicas delivering side by side make a pair.
#[derive(Clone)]
struct PairingReceiver {
    ids: Arc<Mutex<Vec<String>>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    paired: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Below the service's webhook request timeout (10 s), so a lone request is still answered.
const PAIR_WAIT: Duration = Duration::from_secs(6);

impl PairingReceiver {
    async fn start() -> (Self, String) {
        use std::sync::atomic::Ordering;
        let receiver = Self {
            ids: Arc::default(),
            in_flight: Arc::default(),
            paired: Arc::new(tokio::sync::watch::channel(false).0),
        };
        let state = receiver.clone();
        let router = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let state = state.clone();
                async move {
                    let id = headers["x-taskledger-alert-id"]
                        .to_str()
                        .unwrap()
                        .to_owned();
                    state.ids.lock().unwrap().push(id);
                    if state.in_flight.fetch_add(1, Ordering::SeqCst) + 1 >= 2 {
                        state.paired.send_replace(true);
                    }
                    let mut paired = state.paired.subscribe();
                    let _ =
                        tokio::time::timeout(PAIR_WAIT, paired.wait_for(|paired| *paired)).await;
                    state.in_flight.fetch_sub(1, Ordering::SeqCst);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        (receiver, url)
    }

    fn ids(&self) -> Vec<String> {
        self.ids.lock().unwrap().clone()
    }
}

/// Starts the replicas side by side, as a deployment does: migrations, the bootstrap token and
/// the webhook secret are safe to race.
fn spawn_replicas(database_url: &str, dirs: [&Path; 2]) -> [Service; 2] {
    let env = [
        ("DATABASE_URL", database_url),
        ("TASKLEDGER_BURN_TICK_SECONDS", "1"),
        ("TASKLEDGER_COMPACTION_SECONDS", "1"),
    ];
    std::thread::scope(|scope| {
        let started = dirs.map(|dir| scope.spawn(move || Service::spawn_with(dir, &env)));
        started.map(|replica| replica.join().expect("a replica starts"))
    })
}

const BACKGROUND_RUNS: &str = "taskledger_background_runs_total";

/// The turns of `job` with `outcome` that each replica counted.
async fn runs(replicas: &[Service; 2], job: &str, outcome: &str) -> [u64; 2] {
    let labels = [("job", job), ("outcome", outcome)];
    [
        replicas[0].counter(BACKGROUND_RUNS, &labels).await,
        replicas[1].counter(BACKGROUND_RUNS, &labels).await,
    ]
}

/// Each replica's turns of `job`, whatever they came to.
async fn turns(replicas: &[Service; 2], job: &str) -> [u64; 2] {
    let mut turns = [0; 2];
    for outcome in ["ran", "locked", "not_due"] {
        let counted = runs(replicas, job, outcome).await;
        turns[0] += counted[0];
        turns[1] += counted[1];
    }
    turns
}

async fn pending_rollup_deltas(pg: &EmbeddedPostgres) -> i64 {
    query_i64_in(
        pg,
        "replicas",
        "SELECT count(*) FROM records_daily WHERE delta <> 0",
    )
    .await
}

async fn query_i64_in(pg: &EmbeddedPostgres, database: &str, sql: &str) -> i64 {
    let mut conn = PgConnection::connect(&pg.url(database)).await.unwrap();
    let value = sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .expect(sql);
    conn.close().await.unwrap();
    value
}

/// Two `serve` processes on one database, as two replicas behind a load balancer: while the
/// test itself holds the locks of compaction and of the burn tick, both replicas keep trying
/// and neither runs either job, so no replica can run one while the other does; each alert of
/// the outbox reaches the receiver once, with both replicas delivering.
#[tokio::test]
async fn two_replicas_on_one_database_share_the_background_work() {
    use taskledger::store::jobs::{BURN_TICK, COMPACTION};
    init_tracing();
    let dir = data_dir();
    let pg = EmbeddedPostgres::start(dir.path(), TEST_OPTIONS)
        .await
        .expect("start cluster");
    execute(&pg, "CREATE DATABASE replicas").await;
    let database_url = pg.url("replicas");
    let replica_dirs = [data_dir(), data_dir()];
    let replicas = spawn_replicas(
        &database_url,
        [replica_dirs[0].path(), replica_dirs[1].path()],
    );

    // The jobs' locks, held by the test as a replica running them would.
    let mut holder = PgConnection::connect(&database_url).await.unwrap();
    for key in [COMPACTION, BURN_TICK] {
        sqlx::query("SELECT pg_advisory_lock($1, $2)")
            .bind(key.0)
            .bind(key.1)
            .execute(&mut holder)
            .await
            .unwrap();
    }
    post_a_project_and_a_record(&replicas[0], &replicas[1]).await;
    assert!(pending_rollup_deltas(&pg).await > 0);

    let ran_before = [
        runs(&replicas, "compaction", "ran").await,
        runs(&replicas, "burn_tick", "ran").await,
    ];
    let turns_before = [
        turns(&replicas, "compaction").await,
        turns(&replicas, "burn_tick").await,
    ];
    // Two more turns of each job on each replica: the second began after the first ended,
    // so after the snapshot above.
    let waiting = Instant::now();
    loop {
        let turns = [
            turns(&replicas, "compaction").await,
            turns(&replicas, "burn_tick").await,
        ];
        if (0..2)
            .all(|job| (0..2).all(|replica| turns[job][replica] >= turns_before[job][replica] + 2))
        {
            break;
        }
        assert!(
            waiting.elapsed() < EXIT_TIMEOUT,
            "the replicas stopped running the jobs: {turns:?} after {turns_before:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        [
            runs(&replicas, "compaction", "ran").await,
            runs(&replicas, "burn_tick", "ran").await,
        ],
        ran_before,
        "a job ran while another session held its lock"
    );
    assert!(
        pending_rollup_deltas(&pg).await > 0,
        "compacted while another session held the lock"
    );

    holder.close().await.unwrap();
    let released = Instant::now();
    while pending_rollup_deltas(&pg).await > 0 {
        assert!(
            released.elapsed() < EXIT_TIMEOUT,
            "compaction never ran again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    loop {
        let ticks = runs(&replicas, "burn_tick", "ran").await;
        if ticks[0] + ticks[1] > ran_before[1][0] + ran_before[1][1] {
            break;
        }
        assert!(
            released.elapsed() < EXIT_TIMEOUT,
            "the burn tick never ran again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The outbox: ten projects with a webhook, three alerts each.
    let (receiver, url) = PairingReceiver::start().await;
    let pool = taskledger::db::connect(&database_url, 2).await.unwrap();
    let month = taskledger::domain::values::Month::parse("2026-11").unwrap();
    let as_of = chrono::TimeZone::with_ymd_and_hms(&chrono::Utc, 2026, 11, 2, 0, 0, 0).unwrap();
    let mut fired = 0;
    for n in 0..10 {
        let body = serde_json::json!({"id": format!("team-{n}"), "name": "Team", "currency": "USD",
                                      "default_monthly_budget": "1000", "webhook_url": url});
        let created = replicas[n % 2]
            .call(
                reqwest::Method::POST,
                "/v1/projects",
                Some(&body.to_string()),
            )
            .await;
        assert_eq!(created.status, 201, "{}", created.body);
        let project = taskledger::store::projects::get(&pool, &format!("team-{n}"))
            .await
            .unwrap()
            .unwrap();
        let burn = taskledger::domain::burn::burn(
            1000.into(),
            Some(1000.into()),
            month.first_day(),
            as_of,
            chrono_tz::UTC,
        );
        let reached = taskledger::domain::burn::alerts_reached(&burn, &project.alert_thresholds);
        fired += taskledger::ledger::alerting::fire_reached(
            &pool, &project, month, &burn, &reached, as_of,
        )
        .await
        .unwrap()
        .len();
    }
    assert_eq!(fired, 30);
    let fired_at = Instant::now();
    while query_i64_in(
        &pg,
        "replicas",
        "SELECT count(*) FROM alert_deliveries WHERE state <> 'delivered'",
    )
    .await
        > 0
    {
        assert!(
            fired_at.elapsed() < Duration::from_secs(60),
            "alerts left undelivered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids = receiver.ids();
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), 30, "{ids:?}");
    assert_eq!(unique.len(), 30, "an alert was delivered twice: {ids:?}");
    assert_eq!(
        query_i64_in(
            &pg,
            "replicas",
            "SELECT count(*) FROM alert_delivery_attempts"
        )
        .await,
        30
    );
    assert!(
        *receiver.paired.borrow(),
        "the two replicas never delivered side by side"
    );
    let delivered = [("result", "delivered")];
    let by_replica = [
        replicas[0]
            .counter("taskledger_alert_deliveries_total", &delivered)
            .await,
        replicas[1]
            .counter("taskledger_alert_deliveries_total", &delivered)
            .await,
    ];
    eprintln!("alerts delivered by each replica: {by_replica:?}");
    assert_eq!(by_replica[0] + by_replica[1], 30);

    pool.close().await;
    let [first, second] = replicas;
    first.stop();
    second.stop();
    pg.stop().await.expect("stop cluster");
}

/// The most kibibytes of a process's `status` line `field` (`VmRSS`, `VmHWM`).
fn status_kib(pid: i32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("the process status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the status"))
}

/// A 16 MiB body of numbers where records belong, as a POST (one array of them, or NDJSON
/// lines of them) or as a correction's labels, and a batch of 10,000 records with 55 bad
/// fields each: every one is refused, and the service's peak memory grows by less than four
/// bodies. Parsing such a body into a tree took 0.5–0.8 GiB.
#[tokio::test]
async fn a_hostile_body_is_refused_without_holding_a_tree_of_it() {
    let dir = data_dir();
    let (service, _) = service_with_a_record(dir.path()).await;
    let before = status_kib(service.pid(), "VmRSS");
    let zeros = |n: usize| vec!["0"; n].join(",");
    let limit = 16 * 1024 * 1024;
    let count = (limit - 16) / 2;

    let posted = service
        .call(
            reqwest::Method::POST,
            "/v1/job-records",
            Some(&format!("[[{}]]", zeros(count))),
        )
        .await;
    assert_eq!(
        posted.status,
        422,
        "{}",
        &posted.body[..200.min(posted.body.len())]
    );
    assert!(posted.body.contains("a job record must be a JSON object"));

    let huge_record = service
        .call(
            reqwest::Method::POST,
            "/v1/job-records",
            Some(&format!(r#"[{{"labels": [{}]}}]"#, zeros(count - 8))),
        )
        .await;
    assert_eq!(huge_record.status, 422);
    assert!(huge_record.body.contains("holds at most 10000 JSON values"));

    let corrected = service
        .call(
            reqwest::Method::PUT,
            RECORD_PATH,
            Some(&format!(r#"{{"labels": [{}]}}"#, zeros(count - 8))),
        )
        .await;
    assert_eq!(
        corrected.status,
        422,
        "{}",
        &corrected.body[..200.min(corrected.body.len())]
    );
    assert!(corrected.body.contains("holds at most 10000 JSON values"));

    // 10,000 records, each with 55 fields it does not know: the problem lists 1,000.
    let unknown: Vec<String> = (0..55).map(|f| format!(r#""f{f}": 0"#)).collect();
    let record = format!(
        r#"{{"project": "vision", "task_id": "t", "gpu_model": "H100", "gpu_count": 1,
            "started_at": "2026-11-20T10:00:00Z", "ended_at": "2026-11-20T11:00:00Z",
            "outcome": "completed", {}}}"#,
        unknown.join(", ")
    );
    let many = service
        .call(
            reqwest::Method::POST,
            "/v1/job-records",
            Some(&format!("[{}]", vec![record; 10_000].join(","))),
        )
        .await;
    assert_eq!(many.status, 422);
    let problem: serde_json::Value = serde_json::from_str(&many.body).unwrap();
    assert_eq!(problem["errors"].as_array().unwrap().len(), 1_000);
    assert_eq!(
        problem["detail"],
        "550000 fields are invalid; the first 1000 are listed"
    );

    let peak = status_kib(service.pid(), "VmHWM");
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 4 * 16 * 1024,
        "peak memory grew by {grown} KiB from {before} KiB"
    );
    eprintln!("peak memory grew by {grown} KiB from {before} KiB");
}
