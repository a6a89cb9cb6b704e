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
        let mut process = Command::new(env!("CARGO_BIN_EXE_taskledger"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "serve"])
            .env_remove("DATABASE_URL")
            .env("TASKLEDGER_BOOTSTRAP_TOKEN", ADMIN_SECRET)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
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
    fn stop(mut self) {
        kill(Pid::from_raw(self.pid()), Signal::SIGTERM).expect("SIGTERM the service");
        let deadline = Instant::now() + EXIT_TIMEOUT;
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
        assert!(
            status.success(),
            "serve exited with {status}: {}",
            self.log()
        );
        assert_no_cluster_processes(&self.data_dir);
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
    let created = service
        .call(
            reqwest::Method::POST,
            "/v1/projects",
            Some(r#"{"id": "vision", "name": "Vision", "currency": "USD"}"#),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let ingested = service
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
    let stored = service.get(RECORD_PATH).await;
    assert_eq!(stored.status, 200, "{}", stored.body);
    (service, stored.body)
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
    let healthz = service.get("/healthz").await;
    assert_eq!(healthz.status, 200, "{}", healthz.body);
    let health = healthz_json(&healthz);
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
    let health = healthz_json(&service.get("/healthz").await);
    assert_eq!(health["embedded_database"]["state"], "running", "{health}");
    assert_eq!(health["embedded_database"]["restarts"], 1, "{health}");
    assert_ne!(process_state(postmaster), Some('Z'));
    service.stop();
}
