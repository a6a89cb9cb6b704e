//! Integration tests for the embedded PostgreSQL cluster. They run real clusters from the
//! machine's PostgreSQL server binaries (`apt-get install postgresql`), as root or not.
//!
//! Some tests need a second owner process that can be SIGKILLed: they re-run this test binary
//! with only `hold_cluster_until_killed` selected (see `Holder`).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
