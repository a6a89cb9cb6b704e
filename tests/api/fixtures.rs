//! The data the tests are written against: COST_MODEL.md's worked example, and builders of
//! contracts and job records whose defaults are the common case, so that a test spells out
//! only what it is about.

use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};

use crate::common::TestApp;

/// The cost of the worked example's November, read when all of it has happened.
pub const NOVEMBER: &str = "/v1/projects/vision/cost?month=2026-11&as_of=2027-01-01T00:00:00Z";

/// COST_MODEL.md's worked example: project `vision` in USD, contracts C1–C4
/// ([`worked_example_contracts`]) and records R1–R6 ([`worked_example_records`]). Returns the
/// ids of C1, C2, C3 and C4.
pub async fn worked_example(app: &TestApp) -> [String; 4] {
    app.create_project("vision", "USD").await;
    let [c1, c2, c3, c4] = worked_example_contracts();
    let ids = [
        c1.create(app).await,
        c2.create(app).await,
        c3.create(app).await,
        c4.create(app).await,
    ];
    app.ingest(worked_example_records()).await;
    ids
}

/// C1–C4 of the worked example, in that order:
/// - C1: H100 on demand at 2.50 for every project;
/// - C2: H100 on demand at 2.00 for `vision` from 15 November, preferred to C1 there;
/// - C3: H100 spot at 1.20;
/// - C4: a reservation of 2 A100s at 1.00 for November.
pub fn worked_example_contracts() -> [Contract; 4] {
    [
        contract("H100", "on_demand", "2.50").named("C1"),
        contract("H100", "on_demand", "2.00")
            .named("C2")
            .valid_from("2026-11-15T00:00:00Z")
            .project("vision"),
        // Prices are taken as JSON numbers as well as strings.
        contract("H100", "spot", 1.20).named("C3"),
        contract("A100", "reserved", "1.00")
            .named("C4")
            .valid_from("2026-11-01T00:00:00Z")
            .valid_until("2026-12-01T00:00:00Z")
            .committed_gpus(2),
    ]
}

/// R1–R6 of the worked example, in that order:
/// - R1: t1 on 4 H100s across midnight into the 15th, when C2 takes over from C1;
/// - R2 and R3: t2 preempted on 8 spot H100s, then completed on its retry;
/// - R4: t3 on a reserved A100;
/// - R5: t4, failed on a B200 that no contract prices;
/// - R6: t5, from the last hour of October into November.
pub fn worked_example_records() -> [Record; 6] {
    [
        record("t1", "2026-11-14T22:00:00Z", "2026-11-15T02:00:00Z")
            .gpu_count(4)
            .gpu_seconds_busy(43200)
            .output("2000000", "tokens")
            .label("team", "perception"),
        record("t2", "2026-11-20T10:00:00Z", "2026-11-20T11:30:00Z")
            .gpu_count(8)
            .billing_mode("spot")
            .outcome("preempted")
            .failures(1)
            .label("team", "perception"),
        record("t2", "2026-11-20T12:00:00Z", "2026-11-20T14:00:00Z")
            .attempt(2)
            .gpu_count(8)
            .billing_mode("spot")
            .retries(1)
            .output("1000000", "tokens")
            .label("team", "perception"),
        record("t3", "2026-11-10T00:00:00Z", "2026-11-10T10:00:00Z")
            .gpu_model("A100")
            .billing_mode("reserved")
            .gpu_seconds_busy(36000)
            .output("500", "samples")
            .label("team", "search"),
        record("t4", "2026-11-21T00:00:00Z", "2026-11-21T01:00:00Z")
            .gpu_model("B200")
            .outcome("failed"),
        record("t5", "2026-10-31T23:00:00Z", "2026-11-01T01:00:00Z").gpu_count(2),
    ]
}

/// A contract as `POST /v1/contracts` takes it.
#[derive(Clone)]
pub struct Contract(Value);

/// A contract for every project pricing `gpu_model` GPU-hours in `billing_mode` at `price`
/// USD (a string, or a JSON number), valid from 1 January 2026 on, named after what it prices.
pub fn contract(gpu_model: &str, billing_mode: &str, price: impl Into<Value>) -> Contract {
    Contract(json!({
        "name": format!("{gpu_model} {billing_mode}"), "gpu_model": gpu_model,
        "billing_mode": billing_mode, "price_per_gpu_hour": price.into(), "currency": "USD",
        "valid_from": "2026-01-01T00:00:00Z"
    }))
}

impl Contract {
    pub fn named(self, name: &str) -> Self {
        self.with("name", name)
    }

    pub fn currency(self, currency: &str) -> Self {
        self.with("currency", currency)
    }

    pub fn valid_from(self, at: &str) -> Self {
        self.with("valid_from", at)
    }

    pub fn valid_until(self, at: &str) -> Self {
        self.with("valid_until", at)
    }

    /// Only for this project's records.
    pub fn project(self, project: &str) -> Self {
        self.with("project", project)
    }

    pub fn provider(self, provider: &str) -> Self {
        self.with("provider", provider)
    }

    pub fn region(self, region: &str) -> Self {
        self.with("region", region)
    }

    /// A reservation: this many GPUs are paid for all the time, used or not.
    pub fn committed_gpus(self, gpus: u32) -> Self {
        self.with("committed_gpus", gpus)
    }

    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.0[field] = value.into();
        self
    }

    /// Creates the contract as admin and returns its id.
    pub async fn create(self, app: &TestApp) -> String {
        let response = app.post("/v1/contracts", &app.admin, self.into()).await;
        assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
        response.json()["id"].as_str().unwrap().to_owned()
    }
}

impl From<Contract> for Value {
    fn from(contract: Contract) -> Self {
        contract.0
    }
}

/// A job record as `POST /v1/job-records` takes it; serialises as that JSON, so that an
/// array of records is a batch.
#[derive(Clone, Serialize)]
#[serde(transparent)]
pub struct Record(Value);

/// The first attempt of task `task_id` of project `vision`, completed on one on-demand H100
/// over `[started_at, ended_at)`, without busy time, output or labels.
pub fn record(task_id: &str, started_at: &str, ended_at: &str) -> Record {
    Record(json!({
        "project": "vision", "task_id": task_id, "gpu_model": "H100", "gpu_count": 1,
        "started_at": started_at, "ended_at": ended_at, "outcome": "completed"
    }))
}

impl Record {
    pub fn project(self, project: &str) -> Self {
        self.with("project", project)
    }

    pub fn attempt(self, attempt: u32) -> Self {
        self.with("attempt", attempt)
    }

    pub fn gpu_model(self, gpu_model: &str) -> Self {
        self.with("gpu_model", gpu_model)
    }

    /// A whole number, or a decimal string for a share of a GPU.
    pub fn gpu_count(self, gpus: impl Into<Value>) -> Self {
        self.with("gpu_count", gpus)
    }

    pub fn billing_mode(self, billing_mode: &str) -> Self {
        self.with("billing_mode", billing_mode)
    }

    pub fn provider(self, provider: &str) -> Self {
        self.with("provider", provider)
    }

    pub fn region(self, region: &str) -> Self {
        self.with("region", region)
    }

    pub fn gpu_seconds_busy(self, seconds: impl Into<Value>) -> Self {
        self.with("gpu_seconds_busy", seconds)
    }

    pub fn queued_at(self, at: &str) -> Self {
        self.with("queued_at", at)
    }

    pub fn outcome(self, outcome: &str) -> Self {
        self.with("outcome", outcome)
    }

    pub fn retries(self, retries: u32) -> Self {
        self.with("retries", retries)
    }

    pub fn failures(self, failures: u32) -> Self {
        self.with("failures", failures)
    }

    pub fn output(self, quantity: impl Into<Value>, unit: &str) -> Self {
        self.with("output", json!({"quantity": quantity.into(), "unit": unit}))
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0["labels"][key] = value.into();
        self
    }

    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.0[field] = value.into();
        self
    }

    /// The record as the body of `PUT /v1/projects/{project}/job-records/{task}/{attempt}`,
    /// which takes its key from the path.
    pub fn correction(self) -> Value {
        let mut body = self.0;
        let fields = body.as_object_mut().unwrap();
        for key in ["project", "task_id", "attempt"] {
            fields.remove(key);
        }
        body
    }
}

impl From<Record> for Value {
    fn from(record: Record) -> Self {
        record.0
    }
}
