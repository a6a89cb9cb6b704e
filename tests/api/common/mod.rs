//! The integration-test harness: every test gets its own freshly migrated database on a real
//! PostgreSQL — the server of `DATABASE_URL` when set, else an embedded cluster started once
//! for the whole test process — and drives the real router.

pub mod issuer;
pub mod oidc_provider;
pub mod smtp;

use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use rust_decimal::Decimal;
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tower::ServiceExt;

use taskledger::config::Settings;
use taskledger::db::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};
use taskledger::domain::access::{Role, hash_secret};
use taskledger::http::state::AppState;

use crate::support::{create_migrated_database, insert_token, start_cluster};
use crate::support_citus::{citus_node_urls, create_migrated_citus_database};

pub mod receivers;

/// The PostgreSQL server of this test process.
struct Server {
    /// Connects to a database given its name.
    url_for: Box<dyn Fn(&str) -> String + Send + Sync>,
    template: String,
}

static SERVER: OnceLock<Server> = OnceLock::new();

fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        // The server outlives every test's runtime, so it is set up on a thread of its own.
        std::thread::spawn(start_server)
            .join()
            .expect("the test database server could not be started")
    })
}

fn start_server() -> Server {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let url_for: Box<dyn Fn(&str) -> String + Send + Sync> =
            match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
                Some(base) => Box::new(move |database| with_database(&base, database)),
                None => {
                    let cluster = start_embedded_cluster().await;
                    let cluster: &'static EmbeddedPostgres = Box::leak(Box::new(cluster));
                    Box::new(move |database| cluster.url(database))
                }
            };
        let template = prepare_template(&url_for).await;
        Server { url_for, template }
    })
}

/// The embedded cluster for this test process. It lives in one directory per user that is
/// reused across runs (initdb once); a second test process running at the same time gets a
/// fresh directory of its own. The module's watchdog stops the cluster when the process exits.
async fn start_embedded_cluster() -> EmbeddedPostgres {
    let options = || EmbeddedOptions {
        durable: false,
        max_connections: 300,
        ..EmbeddedOptions::default()
    };
    let shared = std::env::temp_dir().join(format!(
        "taskledger-test-cluster-{}",
        nix::unistd::geteuid()
    ));
    match start_cluster(&shared, options()).await {
        Ok(cluster) => cluster,
        Err(EmbeddedError::InUse { .. }) => {
            let own = std::env::temp_dir().join(format!(
                "taskledger-test-cluster-{}",
                uuid::Uuid::new_v4().simple()
            ));
            start_cluster(&own, options())
                .await
                .expect("starting the embedded PostgreSQL for tests")
        }
        Err(error) => panic!("starting the embedded PostgreSQL for tests: {error}"),
    }
}

fn with_database(base: &str, database: &str) -> String {
    let mut url = reqwest::Url::parse(base).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// One migrated template database per set of migrations; each test copies it, which is much
/// faster than migrating every test database.
async fn prepare_template(url_for: &(dyn Fn(&str) -> String + Send + Sync)) -> String {
    let fingerprint: String = taskledger::db::MIGRATOR
        .iter()
        .map(|m| format!("{}:{}", m.version, hex::encode(&m.checksum)))
        .collect::<Vec<_>>()
        .join(",");
    let digest = hex::encode(&hash_secret(&fingerprint)[..8]);
    let template = format!("taskledger_template_{digest}");
    let mut admin = admin_connection(url_for).await;
    sqlx::query("SELECT pg_advisory_lock(hashtext('taskledger.test_template'))")
        .execute(&mut admin)
        .await
        .unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&template)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    if !exists {
        let building = format!("{template}_building");
        create_migrated_database(url_for, &building, 1)
            .await
            .close()
            .await;
        sqlx::query(&format!("ALTER DATABASE {building} RENAME TO {template}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    sqlx::query("SELECT pg_advisory_unlock(hashtext('taskledger.test_template'))")
        .execute(&mut admin)
        .await
        .unwrap();
    template
}

async fn admin_connection(url_for: &(dyn Fn(&str) -> String + Send + Sync)) -> PgConnection {
    PgConnectOptions::from_str(&url_for("postgres"))
        .unwrap()
        .log_statements(tracing::log::LevelFilter::Debug)
        .connect()
        .await
        .expect("connecting to the test server's postgres database")
}

/// With the directory of a running Citus cluster (`.ci/citus-cluster start DIR`), each test
/// gets its database on that cluster, migrated and distributed by project as
/// `taskledger citus distribute` does, instead of a copy of the template on the embedded server.
/// `.ci/citus-api-tests` runs the money scenarios of this suite so.
pub const CITUS_ENV: &str = "TASKLEDGER_TEST_CITUS_CLUSTER";

/// Whether this process's test databases are on Citus (see [`CITUS_ENV`]).
pub fn on_citus() -> bool {
    std::env::var(CITUS_ENV).is_ok_and(|dir| !dir.is_empty())
}

/// A new database `name` on the Citus cluster in `cluster`, migrated and distributed.
async fn citus_database(cluster: &Path, name: &str) -> (String, PgPool) {
    let (url, pool) = create_migrated_citus_database(cluster, name, 8).await;
    taskledger::ledger::citus::distribute(&pool, None)
        .await
        .unwrap_or_else(|error| panic!("distributing {name} on Citus: {error}"));
    (url, pool)
}

/// One test's application: its own database, the real router and an admin token.
pub struct TestApp {
    pub pool: PgPool,
    pub router: Router,
    pub admin: String,
    pub database: String,
    /// Where the test database is, for running the `taskledger` binary against it.
    pub database_url: String,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Settings::default()).await
    }

    pub async fn spawn_with(settings: Settings) -> Self {
        let database = format!("taskledger_test_{}", uuid::Uuid::new_v4().simple());
        let (database_url, pool) = if on_citus() {
            let cluster = std::env::var(CITUS_ENV).unwrap();
            citus_database(Path::new(&cluster), &database).await
        } else {
            let server = server();
            let mut admin = admin_connection(&*server.url_for).await;
            sqlx::query(&format!(
                "CREATE DATABASE {database} TEMPLATE {}",
                server.template
            ))
            .execute(&mut admin)
            .await
            .expect("creating the test database");
            admin.close().await.unwrap();
            let database_url = (server.url_for)(&database);
            let pool = taskledger::db::connect(&database_url, 8).await.unwrap();
            (database_url, pool)
        };
        let admin_secret = insert_token(&pool, "test admin", Role::Admin, &[]).await;
        let state = AppState::new(pool.clone(), settings);
        Self {
            router: taskledger::http::app(state),
            pool,
            admin: admin_secret,
            database,
            database_url,
        }
    }

    pub fn state(&self, settings: Settings) -> AppState {
        AppState::new(self.pool.clone(), settings)
    }

    /// Sends one request through the router.
    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        TestResponse {
            status,
            headers,
            body: bytes.to_vec(),
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> TestResponse {
        let mut builder = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match body {
            Some(json) => builder
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&json).unwrap())),
            None => builder.body(Body::empty()),
        };
        self.send(request.unwrap()).await
    }

    pub async fn get(&self, path: &str, token: &str) -> TestResponse {
        self.call(Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> TestResponse {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    pub async fn put(&self, path: &str, token: &str, body: Value) -> TestResponse {
        self.call(Method::PUT, path, Some(token), Some(body)).await
    }

    pub async fn patch(&self, path: &str, token: &str, body: Value) -> TestResponse {
        self.call(Method::PATCH, path, Some(token), Some(body))
            .await
    }

    pub async fn delete(&self, path: &str, token: &str) -> TestResponse {
        self.call(Method::DELETE, path, Some(token), None).await
    }

    /// Creates a project with the admin token.
    pub async fn create_project(&self, id: &str, currency: &str) -> Value {
        let response = self
            .post(
                "/v1/projects",
                &self.admin,
                serde_json::json!({"id": id, "name": id, "currency": currency}),
            )
            .await;
        assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
        response.json()
    }

    /// Creates a token and returns its secret.
    pub async fn token(&self, role: &str, projects: &[&str]) -> String {
        let mut body = serde_json::json!({"role": role, "name": format!("{role} token")});
        if !projects.is_empty() {
            body["projects"] = serde_json::json!(projects);
        }
        let response = self.post("/v1/tokens", &self.admin, body).await;
        assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
        response.json()["token"].as_str().unwrap().to_owned()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let database = self.database.clone();
        // The test's runtime is blocked while this runs, so the database is dropped from a
        // thread with a runtime of its own; FORCE ends the pool's connections.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let drop = format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)");
                match std::env::var(CITUS_ENV).ok().filter(|d| !d.is_empty()) {
                    Some(cluster) => {
                        for url in citus_node_urls(Path::new(&cluster)) {
                            if let Ok(mut admin) = PgConnection::connect(&url).await {
                                let _ = sqlx::query(&drop).execute(&mut admin).await;
                            }
                        }
                    }
                    None => {
                        let mut admin = admin_connection(&*server().url_for).await;
                        let _ = sqlx::query(&drop).execute(&mut admin).await;
                    }
                }
            });
        })
        .join();
    }
}

pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl TestResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("not JSON: {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Asserts a problem document with this status and returns it.
    pub fn problem(&self, status: StatusCode) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.content_type(), "application/problem+json");
        let problem = self.json();
        assert_eq!(problem["status"], status.as_u16());
        assert!(problem["title"].is_string() && problem["detail"].is_string());
        problem
    }

    /// The pointers of a problem's field errors.
    pub fn pointers(&self) -> Vec<String> {
        self.json()["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| e["pointer"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A decimal the API sends as a JSON string.
pub fn dec(value: &Value) -> Decimal {
    Decimal::from_str(
        value
            .as_str()
            .unwrap_or_else(|| panic!("not a decimal string: {value}")),
    )
    .unwrap()
}

/// Compares amounts as numbers, so that "84.6" is "84.60".
pub fn assert_money(value: &Value, expected: &str) {
    assert_eq!(
        dec(value),
        Decimal::from_str(expected).unwrap(),
        "{value} is not {expected}"
    );
}

/// The cost view at `path`, read as admin.
pub async fn cost(app: &TestApp, path: &str) -> Value {
    let response = app.get(path, &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

/// Requests a receiver saw: headers and body.
pub type Received = std::sync::Arc<std::sync::Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// A webhook receiver started by a test: it records every request and answers 500 to the
/// first `failures` of them, 200 afterwards.
pub struct Receiver {
    pub url: String,
    pub received: Received,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    pub async fn start(failures: usize) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), failures).await
    }

    pub async fn start_on(address: std::net::SocketAddr, failures: usize) -> Self {
        use axum::routing::post;
        let received: Received = Default::default();
        let seen = received.clone();
        let remaining_failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(failures));
        let router = axum::Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                let remaining_failures = remaining_failures.clone();
                async move {
                    seen.lock().unwrap().push((headers, body.to_vec()));
                    let fail = remaining_failures
                        .fetch_update(
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                            |n| n.checked_sub(1),
                        )
                        .is_ok();
                    if fail {
                        StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        StatusCode::OK
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            url: format!("http://{address}/hook"),
            received,
            stop: Some(stop),
        }
    }

    pub fn bodies(&self) -> Vec<(HeaderMap, Value)> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|(headers, body)| (headers.clone(), serde_json::from_slice(body).unwrap()))
            .collect()
    }

    pub fn raw(&self) -> Vec<(HeaderMap, Vec<u8>)> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl TestApp {
    /// Posts job records (a JSON array, or [`crate::fixtures::Record`]s) through
    /// `POST /v1/job-records` as admin; they are rated on the way in.
    pub async fn ingest(&self, records: impl serde::Serialize) {
        let records = serde_json::to_value(records).unwrap();
        let response = self.post("/v1/job-records", &self.admin, records).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    }
}

/// The test's application served on a real port of 127.0.0.1.
pub struct Served {
    pub address: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Served {
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Shuts the server down gracefully and checks that it stopped cleanly.
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        self.serving.await.unwrap().unwrap();
    }
}

impl TestApp {
    pub async fn serve(&self) -> Served {
        self.serve_with(Default::default()).await
    }

    /// Serves the app with `settings`, such as the fixed clock its data was made for.
    pub async fn serve_with(&self, settings: Settings) -> Served {
        self.serve_state(self.state(settings), "127.0.0.1:0".parse().unwrap())
            .await
    }

    /// Serves `state` (this app's pool, and whatever it is configured with) at `address`.
    pub async fn serve_state(&self, state: AppState, address: std::net::SocketAddr) -> Served {
        let server = taskledger::server::Application::bind(state, address)
            .await
            .unwrap();
        let address = server.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve_until(async {
            let _ = stopped.await;
        }));
        Served {
            address,
            stop,
            serving,
        }
    }
}
