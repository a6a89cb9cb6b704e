//! A job record as CI posts it: parsed field by field from JSON so that every bad field of
//! every record is reported at once, then normalised into the canonical form whose hash
//! decides whether a re-post is a duplicate or a conflicting change.

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::gpu;
use super::rating::{BillingMode, Outcome};
use super::validation::{Violations, escape_pointer_token};
use super::values::{self, ProjectId};

pub const MAX_TASK_ID_CHARS: usize = 256;
pub const MAX_NAME_CHARS: usize = 64;
pub const MAX_UNIT_CHARS: usize = 32;
pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_KEY_CHARS: usize = 64;
pub const MAX_LABEL_VALUE_CHARS: usize = 256;
/// The largest GPU count one record may hold; beyond it a value is a unit mistake.
pub const MAX_GPU_COUNT: u32 = 1_000_000;
/// How far in the future `ended_at` may lie (clock skew between CI and the server).
pub const FUTURE_TOLERANCE_SECONDS: i64 = 300;

/// A label value taken from another system, as a record may carry it: control characters
/// dropped, cut to [`MAX_LABEL_VALUE_CHARS`]; `None` when nothing but white space is left.
pub fn label_value(raw: &str) -> Option<String> {
    let value: String = raw
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_LABEL_VALUE_CHARS)
        .collect();
    (!value.trim().is_empty()).then_some(value)
}

/// A label key as a record may carry it: 1 to [`MAX_LABEL_KEY_CHARS`] ASCII letters, digits,
/// `_`, `-`, `.` or `/`.
pub fn label_key(key: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key.chars().count() <= MAX_LABEL_KEY_CHARS
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    match valid {
        true => Ok(key.to_owned()),
        false => Err(format!(
            "label keys are 1-{MAX_LABEL_KEY_CHARS} letters, digits, `_`, `-`, `.` or `/`"
        )),
    }
}

/// A label value as a record may carry it when given as a string: not blank, at most
/// [`MAX_LABEL_VALUE_CHARS`] characters, no control characters.
pub fn label_text(value: &str) -> Result<String, String> {
    text_within(value, MAX_LABEL_VALUE_CHARS)
}

/// The most nodes one record may name.
pub const MAX_NODES: usize = 256;

const FIELDS: [&str; 29] = [
    "project",
    "task_id",
    "attempt",
    "gpu_model",
    "gpu_count",
    "billing_mode",
    "provider",
    "region",
    "queued_at",
    "started_at",
    "ended_at",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "outcome",
    "retries",
    "failures",
    "output",
    "labels",
    "gpu_util",
    "sm_active",
    "tensor_active",
    "dram_active",
    "memory_peak_gib",
    "memory_total_gib",
    "mig_profile",
    "energy_joules",
    "model_flops",
    "precision",
    "nodes",
];

/// The most FLOPs one record may claim: far beyond any training run, so that a larger value
/// is a unit mistake.
pub const MAX_MODEL_FLOPS: u128 = 1_000_000_000_000_000_000_000_000_000;

/// Decimal places of a record's MFU, as of every share the figures show.
pub const MFU_SCALE: u32 = 6;

/// The most power one GPU may be reported to have drawn on average, in watts: energy above
/// it is a unit mistake (millijoules for joules), not a GPU.
pub const MAX_WATTS_PER_GPU: u32 = 10_000;

/// The largest memory one GPU or slice may report, in GiB; beyond it a value is a unit
/// mistake (bytes or MiB for GiB).
pub const MAX_MEMORY_GIB: u32 = 4096;

impl BillingMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            BillingMode::OnDemand => "on_demand",
            BillingMode::Spot => "spot",
            BillingMode::Reserved => "reserved",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "on_demand" => Some(BillingMode::OnDemand),
            "spot" => Some(BillingMode::Spot),
            "reserved" => Some(BillingMode::Reserved),
            _ => None,
        }
    }
}

impl TryFrom<String> for BillingMode {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        BillingMode::parse(&raw).ok_or_else(|| format!("`{raw}` is not a billing mode"))
    }
}

impl TryFrom<String> for Outcome {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Outcome::parse(&raw).ok_or_else(|| format!("`{raw}` is not an outcome"))
    }
}

impl Outcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Preempted => "preempted",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "completed" => Some(Outcome::Completed),
            "failed" => Some(Outcome::Failed),
            "cancelled" => Some(Outcome::Cancelled),
            "preempted" => Some(Outcome::Preempted),
            _ => None,
        }
    }
}

/// The identity of a record: posting the same key again is a duplicate or a conflict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey {
    pub project: String,
    pub task_id: String,
    pub attempt: i32,
}

impl std::fmt::Display for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.project, self.task_id, self.attempt)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub quantity: Decimal,
    pub unit: String,
}

/// What a record's times are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRules {
    /// Bounds `ended_at` (at most five minutes ahead).
    pub now: DateTime<Utc>,
    /// The longest a record may last: a longer one is a mistake (a start time of 1900, a
    /// clock reset), and rating it would cut it into that many hourly segments.
    pub max_duration: chrono::TimeDelta,
}

impl RecordRules {
    pub const DEFAULT_MAX_DURATION: chrono::TimeDelta = chrono::TimeDelta::days(31);
}

/// No record starts before this: GPU time is not older than the Unix epoch, and earlier
/// times come from unset clocks.
const EARLIEST_START: DateTime<Utc> = DateTime::UNIX_EPOCH;

/// A validated job record with its defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub key: RecordKey,
    pub gpu_model: String,
    pub gpu_count: Decimal,
    pub billing_mode: BillingMode,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub queued_at: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    pub gpu_seconds_held: Decimal,
    pub gpu_seconds_busy: Option<Decimal>,
    pub outcome: Outcome,
    pub retries: i32,
    pub failures: i32,
    pub output: Option<Output>,
    pub labels: BTreeMap<String, String>,
    pub telemetry: Telemetry,
    /// The nodes the attempt ran on, sorted, each once; empty when it named none. Its held
    /// time is spread evenly over them (COST_MODEL §9).
    pub nodes: Vec<String>,
}

/// What DCGM measured of a record, each optional: time-averages over the held time, per
/// GPU, from 0 to 1, the peak memory used per GPU and the memory of the GPU (or slice), and
/// the MIG profile the record ran on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Telemetry {
    /// Any kernel running (`DCGM_FI_DEV_GPU_UTIL` / 100): GPU-Util as `nvidia-smi` shows it.
    pub gpu_util: Option<Decimal>,
    /// Share of time the SMs had work (`DCGM_FI_PROF_SM_ACTIVE`).
    pub sm_active: Option<Decimal>,
    /// Share of cycles the tensor cores worked (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`).
    pub tensor_active: Option<Decimal>,
    /// Share of cycles the memory bandwidth was in use (`DCGM_FI_PROF_DRAM_ACTIVE`).
    pub dram_active: Option<Decimal>,
    pub memory_peak_gib: Option<Decimal>,
    /// Given with a peak: as posted, or else the memory of the slice or GPU model.
    pub memory_total_gib: Option<Decimal>,
    /// The canonical name (`3g.40gb`) of the MIG profile; `gpu_count` then counts slices.
    pub mig_profile: Option<String>,
    /// The energy the record's GPUs used over the attempt, in joules
    /// (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` or Slurm's `ConsumedEnergyRaw`).
    pub energy_joules: Option<Decimal>,
    /// The floating-point operations the model's math needed for the record's output (e.g.
    /// 6 × parameters × tokens for training), with the precision it ran in.
    pub model_flops: Option<Decimal>,
    pub precision: Option<gpu::Precision>,
    /// The dense peak FLOPS of one of the record's GPUs (or slices) at that precision, from
    /// the catalogue when the record was stored; `None` where the catalogue has no figure.
    pub peak_flops: Option<Decimal>,
}

impl Telemetry {
    /// Model FLOPs utilisation over `held` GPU-seconds: the model's FLOPs over what the
    /// GPUs could have done at their peak in that time, to [`MFU_SCALE`] places.
    pub fn mfu(&self, held: Decimal) -> Option<Decimal> {
        let capacity = self.peak_flops? * held;
        let flops = self.model_flops?;
        (capacity > Decimal::ZERO).then(|| (flops / capacity).round_dp(MFU_SCALE).normalize())
    }

    /// The MIG profile the record ran on, from its stored canonical name.
    pub fn mig(&self, gpu_model: &str) -> Option<gpu::MigProfile> {
        let name = self.mig_profile.as_deref()?;
        gpu::mig_profile(gpu_model, name)
            .ok()
            .map(|(_, profile)| profile)
    }
}

impl JobRecord {
    /// An upper bound of the hourly segments rating this record makes: one per hour it
    /// touches, plus a spare for a month or contract boundary inside an hour.
    pub fn segment_bound(&self) -> i64 {
        let seconds = (self.ended_at - self.started_at).num_seconds();
        (seconds + 3599) / 3600 + 2
    }

    /// Parses one record found at `pointer` (e.g. `/3`), reporting every bad field.
    pub fn parse(value: &Value, pointer: &str, rules: RecordRules) -> Result<Self, Violations> {
        let now = rules.now;
        let mut v = Violations::default();
        let Some(object) = value.as_object() else {
            v.push(pointer, "a job record must be a JSON object");
            return Err(v);
        };
        for name in object.keys() {
            if !FIELDS.contains(&name.as_str()) {
                v.push(
                    format!("{pointer}/{}", escape_pointer_token(name)),
                    format!("unknown field `{name}`"),
                );
            }
        }
        let mut fields = Fields {
            object,
            pointer,
            v: &mut v,
        };

        let project = fields
            .required_text("project", MAX_NAME_CHARS)
            .and_then(|raw| {
                let parsed = ProjectId::parse(&raw).map(|id| id.as_str().to_owned());
                fields.v.check(&format!("{pointer}/project"), parsed)
            });
        let task_id = fields.required_text("task_id", MAX_TASK_ID_CHARS);
        let attempt = fields
            .integer("attempt", 1, i32::MAX as i64)
            .unwrap_or(Some(1));
        let gpu_model = fields.required_text("gpu_model", MAX_NAME_CHARS);
        let gpu_count = fields.required_decimal("gpu_count").and_then(|count| {
            fields.check(
                "gpu_count",
                bounded_positive(count, Decimal::from(MAX_GPU_COUNT)),
            )
        });
        let billing_mode = fields
            .choice(
                "billing_mode",
                BillingMode::parse,
                "on_demand, spot, reserved",
            )
            .unwrap_or(Some(BillingMode::OnDemand));
        let provider = fields.optional_text("provider", MAX_NAME_CHARS);
        let region = fields.optional_text("region", MAX_NAME_CHARS);
        let queued_at = fields.optional_time("queued_at");
        let started_at = fields.required_time("started_at");
        let ended_at = fields.required_time("ended_at");
        let held = fields.optional_decimal("gpu_seconds_held");
        let busy = fields.optional_decimal("gpu_seconds_busy");
        let outcome = fields
            .choice(
                "outcome",
                Outcome::parse,
                "completed, failed, cancelled, preempted",
            )
            .unwrap_or_else(|| {
                fields.missing("outcome");
                None
            });
        let retries = fields
            .integer("retries", 0, i32::MAX as i64)
            .unwrap_or(Some(0));
        let failures = fields
            .integer("failures", 0, i32::MAX as i64)
            .unwrap_or(Some(0));
        let output = fields.output();
        let labels = fields.labels();
        let telemetry = fields.telemetry(gpu_model.as_deref());
        let nodes = fields.nodes();

        let at = |name: &str| format!("{pointer}/{name}");
        if let (Some(started), Some(ended)) = (started_at, ended_at)
            && ended < started
        {
            v.push(at("ended_at"), "must not be earlier than started_at");
        }
        if let Some(ended) = ended_at
            && ended > now + chrono::Duration::seconds(FUTURE_TOLERANCE_SECONDS)
        {
            v.push(at("ended_at"), "lies more than 5 minutes in the future");
        }
        if let Some(started) = started_at
            && started < EARLIEST_START
        {
            v.push(at("started_at"), "must not be before 1970-01-01T00:00:00Z");
        }
        if let (Some(started), Some(ended)) = (started_at, ended_at)
            && ended - started > rules.max_duration
        {
            v.push(
                at("ended_at"),
                format!(
                    "the record lasts longer than the limit of {} days; split it into \
                     records of at most that long",
                    rules.max_duration.num_days()
                ),
            );
        }
        if let (Some(queued), Some(started)) = (queued_at.flatten(), started_at)
            && queued > started
        {
            v.push(at("queued_at"), "must not be later than started_at");
        }
        let capacity = match (gpu_count, started_at, ended_at) {
            (Some(count), Some(started), Some(ended)) if ended >= started => {
                Some(count * duration_seconds(started, ended))
            }
            _ => None,
        };
        let held = match (held, capacity) {
            (Some(Some(held)), Some(capacity)) => {
                if held < Decimal::ZERO {
                    v.push(at("gpu_seconds_held"), "must not be negative");
                } else if held > capacity {
                    v.push(
                        at("gpu_seconds_held"),
                        format!(
                            "must not exceed gpu_count × duration = {}",
                            capacity.normalize()
                        ),
                    );
                }
                Some(held)
            }
            (Some(None), _) | (_, None) => None,
            (None, Some(capacity)) => Some(capacity),
        };
        if let (Some(telemetry), Some(held)) = (&telemetry, held)
            && let Some(joules) = telemetry.energy_joules
            && joules > held * Decimal::from(MAX_WATTS_PER_GPU)
        {
            v.push(
                at("energy_joules"),
                format!(
                    "is more than {MAX_WATTS_PER_GPU} W per GPU over gpu_seconds_held; \
                     energy_joules is in joules (DCGM counts millijoules)"
                ),
            );
        }
        if let (Some(telemetry), Some(held)) = (&telemetry, held)
            && let Some(flops) = telemetry.model_flops
            && let Some(peak) = telemetry.peak_flops
            && flops > peak * held
        {
            v.push(
                at("model_flops"),
                format!(
                    "is more than {} GPU-seconds at the peak of {} TFLOPS could do \
                     (MFU above 1); model_flops counts floating-point operations, not FLOPS",
                    held.normalize(),
                    (peak / Decimal::from(1_000_000_000_000u64)).normalize()
                ),
            );
        }
        let busy = busy.flatten();
        if let Some(busy) = busy {
            if busy < Decimal::ZERO {
                v.push(at("gpu_seconds_busy"), "must not be negative");
            } else if let Some(held) = held
                && busy > held
            {
                v.push(at("gpu_seconds_busy"), "must not exceed gpu_seconds_held");
            }
        }

        if !v.is_empty() {
            return Err(v);
        }
        match (
            project,
            task_id,
            attempt,
            gpu_model,
            gpu_count,
            billing_mode,
            provider,
            region,
            queued_at,
            started_at,
            ended_at,
            held,
            outcome,
            retries,
            failures,
            output,
            labels,
            telemetry,
            nodes,
        ) {
            (
                Some(project),
                Some(task_id),
                Some(attempt),
                Some(gpu_model),
                Some(gpu_count),
                Some(billing_mode),
                Some(provider),
                Some(region),
                Some(queued_at),
                Some(started_at),
                Some(ended_at),
                Some(held),
                Some(outcome),
                Some(retries),
                Some(failures),
                Some(output),
                Some(labels),
                Some(telemetry),
                Some(nodes),
            ) => Ok(JobRecord {
                key: RecordKey {
                    project,
                    task_id,
                    attempt: attempt as i32,
                },
                gpu_model,
                gpu_count: gpu_count.normalize(),
                billing_mode,
                provider,
                region,
                queued_at,
                started_at,
                ended_at,
                gpu_seconds_held: held.normalize(),
                gpu_seconds_busy: busy.map(|b| b.normalize()),
                outcome,
                retries: retries as i32,
                failures: failures as i32,
                output,
                labels,
                telemetry,
                nodes,
            }),
            _ => unreachable!("every field either parsed or was reported"),
        }
    }

    /// The record as JSON with every default applied, keys sorted, decimals normalised and
    /// times in UTC: equal records have equal canonical forms.
    pub fn canonical_json(&self) -> Value {
        serde_json::to_value(self.canonical()).expect("the canonical form is JSON")
    }

    /// SHA-256 of the canonical JSON, serialised straight into the hasher.
    pub fn content_hash(&self) -> Vec<u8> {
        hash_of(&self.canonical())
    }

    /// The hash of the same record naming no nodes: a record stored without its nodes and
    /// sent again with them is the same record (a collector that learnt to read nodes sends
    /// what an older one stored); a correction adds them.
    pub fn content_hash_without_nodes(&self) -> Vec<u8> {
        hash_of(&Canonical {
            nodes: None,
            ..self.canonical()
        })
    }

    fn canonical(&self) -> Canonical<'_> {
        Canonical {
            attempt: self.key.attempt,
            billing_mode: self.billing_mode.as_str(),
            dram_active: canonical_decimal(self.telemetry.dram_active),
            ended_at: format_time(self.ended_at),
            energy_joules: canonical_decimal(self.telemetry.energy_joules),
            failures: self.failures,
            gpu_count: self.gpu_count.normalize().to_string(),
            gpu_model: &self.gpu_model,
            gpu_seconds_busy: self.gpu_seconds_busy.map(|b| b.normalize().to_string()),
            gpu_seconds_held: self.gpu_seconds_held.normalize().to_string(),
            gpu_util: canonical_decimal(self.telemetry.gpu_util),
            labels: &self.labels,
            memory_peak_gib: canonical_decimal(self.telemetry.memory_peak_gib),
            memory_total_gib: canonical_decimal(self.telemetry.memory_total_gib),
            mig_profile: self.telemetry.mig_profile.as_deref(),
            model_flops: canonical_decimal(self.telemetry.model_flops),
            nodes: (!self.nodes.is_empty()).then_some(&self.nodes),
            outcome: self.outcome.as_str(),
            output: self.output.as_ref().map(|o| CanonicalOutput {
                quantity: o.quantity.normalize().to_string(),
                unit: &o.unit,
            }),
            precision: self.telemetry.precision.map(|p| p.as_str()),
            project: &self.key.project,
            provider: self.provider.as_deref(),
            queued_at: self.queued_at.map(format_time),
            region: self.region.as_deref(),
            retries: self.retries,
            sm_active: canonical_decimal(self.telemetry.sm_active),
            started_at: format_time(self.started_at),
            task_id: &self.key.task_id,
            tensor_active: canonical_decimal(self.telemetry.tensor_active),
        }
    }
}

fn hash_of(canonical: &Canonical<'_>) -> Vec<u8> {
    let mut hasher = Sha256::new();
    serde_json::to_writer(&mut hasher, canonical).expect("hashing cannot fail");
    hasher.finalize().to_vec()
}

fn canonical_decimal(value: Option<Decimal>) -> Option<String> {
    value.map(|v| v.normalize().to_string())
}

/// The canonical form of a record. Its fields are declared in key order, so serialising it
/// writes the same bytes as the key-sorted JSON object that [`JobRecord::content_hash`] has
/// always hashed: stored hashes stay valid. The telemetry fields are left out where absent,
/// so that a record without telemetry hashes as it always has.
#[derive(Serialize)]
struct Canonical<'a> {
    attempt: i32,
    billing_mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dram_active: Option<String>,
    ended_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    energy_joules: Option<String>,
    failures: i32,
    gpu_count: String,
    gpu_model: &'a str,
    gpu_seconds_busy: Option<String>,
    gpu_seconds_held: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_util: Option<String>,
    labels: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_peak_gib: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_total_gib: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mig_profile: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_flops: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes: Option<&'a Vec<String>>,
    outcome: &'static str,
    output: Option<CanonicalOutput<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    precision: Option<&'static str>,
    project: &'a str,
    provider: Option<&'a str>,
    queued_at: Option<String>,
    region: Option<&'a str>,
    retries: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    sm_active: Option<String>,
    started_at: String,
    task_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensor_active: Option<String>,
}

#[derive(Serialize)]
struct CanonicalOutput<'a> {
    quantity: String,
    unit: &'a str,
}

pub fn format_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Exact seconds between two instants (nanosecond precision).
pub fn duration_seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> Decimal {
    let nanos = (to - from)
        .num_nanoseconds()
        .map(i128::from)
        .unwrap_or_else(|| i128::from((to - from).num_seconds()) * 1_000_000_000);
    Decimal::from_i128_with_scale(nanos, 9).normalize()
}

fn bounded_positive(value: Decimal, max: Decimal) -> Result<Decimal, String> {
    if value <= Decimal::ZERO {
        Err(format!("must be greater than 0, got {value}"))
    } else if value > max {
        Err(format!("must be at most {max}, got {value}"))
    } else {
        Ok(value)
    }
}

/// Reads the fields of one JSON object, recording each problem under its pointer.
pub(crate) struct Fields<'a> {
    object: &'a Map<String, Value>,
    pointer: &'a str,
    v: &'a mut Violations,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(
        object: &'a Map<String, Value>,
        pointer: &'a str,
        v: &'a mut Violations,
    ) -> Self {
        Self { object, pointer, v }
    }

    fn at(&self, name: &str) -> String {
        format!("{}/{name}", self.pointer)
    }

    pub(crate) fn check<T>(&mut self, name: &str, parsed: Result<T, String>) -> Option<T> {
        let pointer = self.at(name);
        self.v.check(&pointer, parsed)
    }

    pub(crate) fn missing(&mut self, name: &str) {
        let pointer = self.at(name);
        self.v.push(pointer, "is required");
    }

    /// `None` when absent or null; `Some(None)` when present but invalid.
    pub(crate) fn present(&self, name: &str) -> Option<&'a Value> {
        self.object.get(name).filter(|value| !value.is_null())
    }

    pub(crate) fn text(&mut self, name: &str, max: usize) -> Option<Option<String>> {
        let value = self.present(name)?;
        let parsed = match value.as_str() {
            Some(text) => text_within(text, max),
            None => Err("must be a string".to_owned()),
        };
        Some(self.check(name, parsed))
    }

    pub(crate) fn required_text(&mut self, name: &str, max: usize) -> Option<String> {
        self.text(name, max).unwrap_or_else(|| {
            self.missing(name);
            None
        })
    }

    /// `Some(None)` (absent) is a valid empty value; `None` means invalid.
    pub(crate) fn optional_text(&mut self, name: &str, max: usize) -> Option<Option<String>> {
        match self.text(name, max) {
            None => Some(None),
            Some(Some(text)) => Some(Some(text)),
            Some(None) => None,
        }
    }

    fn decimal(&mut self, name: &str) -> Option<Option<Decimal>> {
        let value = self.present(name)?;
        Some(self.check(name, parse_decimal(value)))
    }

    fn required_decimal(&mut self, name: &str) -> Option<Decimal> {
        self.decimal(name).unwrap_or_else(|| {
            self.missing(name);
            None
        })
    }

    /// `None`: absent; `Some(None)`: present but invalid; `Some(Some(_))`: a value.
    fn optional_decimal(&mut self, name: &str) -> Option<Option<Decimal>> {
        self.decimal(name)
    }

    /// `None` when absent (the caller applies the default).
    pub(crate) fn integer(&mut self, name: &str, min: i64, max: i64) -> Option<Option<i64>> {
        let value = self.present(name)?;
        let parsed = parse_integer(value).and_then(|n| {
            if (min..=max).contains(&n) {
                Ok(n)
            } else {
                Err(format!("must be from {min} to {max}, got {n}"))
            }
        });
        Some(self.check(name, parsed))
    }

    pub(crate) fn choice<T>(
        &mut self,
        name: &str,
        parse: impl Fn(&str) -> Option<T>,
        allowed: &str,
    ) -> Option<Option<T>> {
        let value = self.present(name)?;
        let parsed = value
            .as_str()
            .and_then(&parse)
            .ok_or_else(|| format!("must be one of {allowed}"));
        Some(self.check(name, parsed))
    }

    fn time(&mut self, name: &str) -> Option<Option<DateTime<Utc>>> {
        let value = self.present(name)?;
        Some(self.check(name, parse_time(value)))
    }

    pub(crate) fn required_time(&mut self, name: &str) -> Option<DateTime<Utc>> {
        self.time(name).unwrap_or_else(|| {
            self.missing(name);
            None
        })
    }

    pub(crate) fn optional_time(&mut self, name: &str) -> Option<Option<DateTime<Utc>>> {
        match self.time(name) {
            None => Some(None),
            Some(Some(time)) => Some(Some(time)),
            Some(None) => None,
        }
    }

    fn output(&mut self) -> Option<Option<Output>> {
        let Some(value) = self.present("output") else {
            return Some(None);
        };
        let Some(object) = value.as_object() else {
            self.check::<()>(
                "output",
                Err("must be an object {quantity, unit}".to_owned()),
            );
            return None;
        };
        let mut valid = true;
        for name in object.keys() {
            if name != "quantity" && name != "unit" {
                let pointer = format!("{}/output/{}", self.pointer, escape_pointer_token(name));
                self.v.push(pointer, format!("unknown field `{name}`"));
                valid = false;
            }
        }
        let quantity_pointer = format!("{}/output/quantity", self.pointer);
        let quantity = match object.get("quantity").filter(|q| !q.is_null()) {
            None => {
                self.v.push(quantity_pointer, "is required");
                None
            }
            Some(raw) => parse_decimal(raw)
                .and_then(|q| {
                    if q < Decimal::ZERO {
                        Err("must not be negative".to_owned())
                    } else {
                        Ok(q.normalize())
                    }
                })
                .map_err(|message| self.v.push(quantity_pointer, message))
                .ok(),
        };
        let unit_pointer = format!("{}/output/unit", self.pointer);
        let unit = match object.get("unit").and_then(Value::as_str) {
            None => {
                self.v
                    .push(unit_pointer, "is required (a string such as `tokens`)");
                None
            }
            Some(unit) => text_within(unit, MAX_UNIT_CHARS)
                .map_err(|message| self.v.push(unit_pointer, message))
                .ok(),
        };
        match (valid, quantity, unit) {
            (true, Some(quantity), Some(unit)) => Some(Some(Output { quantity, unit })),
            _ => None,
        }
    }

    /// A share from 0 to 1.
    fn fraction(&mut self, name: &str) -> Option<Option<Decimal>> {
        let Some(value) = self.decimal(name) else {
            return Some(None);
        };
        let parsed = value.map(|fraction| {
            if (Decimal::ZERO..=Decimal::ONE).contains(&fraction) {
                Ok(fraction.normalize())
            } else {
                Err(format!(
                    "must be from 0 to 1 (a share, not a percentage), got {fraction}"
                ))
            }
        })?;
        Some(self.check(name, parsed))
    }

    /// A memory size in GiB; `positive` refuses 0.
    fn memory(&mut self, name: &str, positive: bool) -> Option<Option<Decimal>> {
        let Some(value) = self.decimal(name) else {
            return Some(None);
        };
        let parsed = value.map(|gib| {
            let max = Decimal::from(MAX_MEMORY_GIB);
            if gib < Decimal::ZERO || (positive && gib.is_zero()) {
                Err(format!(
                    "must be {} 0 GiB, got {gib}",
                    if positive { "greater than" } else { "at least" }
                ))
            } else if gib > max {
                Err(format!("must be at most {max} GiB per GPU, got {gib}"))
            } else {
                Ok(gib.normalize())
            }
        })?;
        Some(self.check(name, parsed))
    }

    /// The telemetry fields, with the memory total defaulted from the slice or the model
    /// where a peak is given.
    fn telemetry(&mut self, gpu_model: Option<&str>) -> Option<Telemetry> {
        let gpu_util = self.fraction("gpu_util");
        let sm_active = self.fraction("sm_active");
        let tensor_active = self.fraction("tensor_active");
        let dram_active = self.fraction("dram_active");
        let peak = self.memory("memory_peak_gib", false);
        let total = self.memory("memory_total_gib", true);
        let energy = match self.decimal("energy_joules") {
            None => Some(None),
            Some(None) => None,
            Some(Some(joules)) if joules < Decimal::ZERO => {
                self.check::<()>(
                    "energy_joules",
                    Err(format!("must not be negative, got {joules}")),
                );
                None
            }
            Some(Some(joules)) => Some(Some(joules.normalize())),
        };
        let profile = match self.text("mig_profile", MAX_NAME_CHARS) {
            None => Some(None),
            Some(None) => None,
            Some(Some(raw)) => {
                let parsed = gpu_model
                    .map(|model| gpu::mig_profile(model, &raw).map(|(_, profile)| profile));
                match parsed {
                    // The model is missing or invalid, which is reported on its own.
                    None => None,
                    Some(parsed) => self.check("mig_profile", parsed).map(Some),
                }
            }
        };
        let flops = match self.decimal("model_flops") {
            None => Some(None),
            Some(None) => None,
            Some(Some(flops)) => self
                .check(
                    "model_flops",
                    bounded_positive(
                        flops,
                        Decimal::from_i128_with_scale(MAX_MODEL_FLOPS as i128, 0),
                    ),
                )
                .map(|flops| Some(flops.normalize())),
        };
        let precision = match self.choice(
            "precision",
            gpu::Precision::parse,
            "fp8, bf16, fp16, tf32, fp32",
        ) {
            None => Some(None),
            Some(None) => None,
            Some(Some(precision)) => Some(Some(precision)),
        };
        if let (Some(Some(_)), Some(None)) = (flops, precision)
            && self.present("precision").is_none()
        {
            self.check::<()>(
                "precision",
                Err(
                    "is required with model_flops: the peak a card reaches depends on it"
                        .to_owned(),
                ),
            );
            return None;
        }
        let (peak, total, profile, energy) = (peak?, total?, profile?, energy?);
        let (flops, precision) = (flops?, precision?);
        let peak_flops = match (flops, precision, gpu_model) {
            (Some(_), Some(precision), Some(model)) => gpu::peak_flops(model, precision, profile),
            _ => None,
        };
        let known_total = profile
            .map(|profile| Decimal::from(profile.memory_gib))
            .or_else(|| {
                gpu_model
                    .and_then(gpu::lookup)
                    .map(|spec| Decimal::from(spec.memory_gib))
            });
        let total = match (peak, total) {
            (Some(_), None) => known_total,
            (_, total) => total,
        };
        if let (Some(peak), Some(total)) = (peak, total)
            && peak > total
        {
            let what = match self
                .object
                .get("memory_total_gib")
                .is_some_and(|t| !t.is_null())
            {
                true => format!("memory_total_gib ({total})"),
                false => format!("the {total} GiB of this GPU model or slice"),
            };
            self.check::<()>("memory_peak_gib", Err(format!("must not exceed {what}")));
            return None;
        }
        Some(Telemetry {
            gpu_util: gpu_util?,
            sm_active: sm_active?,
            tensor_active: tensor_active?,
            dram_active: dram_active?,
            memory_peak_gib: peak,
            memory_total_gib: total,
            mig_profile: profile.map(|profile| profile.name()),
            energy_joules: energy,
            model_flops: flops,
            precision,
            peak_flops,
        })
    }

    /// `nodes`: the names of the nodes a record ran on, sorted; empty when absent.
    fn nodes(&mut self) -> Option<Vec<String>> {
        let Some(value) = self.present("nodes") else {
            return Some(Vec::new());
        };
        let Some(items) = value.as_array() else {
            self.check::<()>("nodes", Err("must be an array of node names".to_owned()));
            return None;
        };
        if items.is_empty() || items.len() > MAX_NODES {
            self.check::<()>(
                "nodes",
                Err(format!("must name 1 to {MAX_NODES} nodes, or be left out")),
            );
            return None;
        }
        let mut nodes = Vec::with_capacity(items.len());
        let mut valid = true;
        for (index, item) in items.iter().enumerate() {
            let pointer = format!("{}/nodes/{index}", self.pointer);
            let parsed = match item.as_str() {
                Some(name) => values::node_name(name),
                None => Err("must be a string".to_owned()),
            };
            match parsed {
                Ok(name) if nodes.contains(&name) => {
                    self.v
                        .push(pointer, format!("names `{name}` a second time"));
                    valid = false;
                }
                Ok(name) => nodes.push(name),
                Err(message) => {
                    self.v.push(pointer, message);
                    valid = false;
                }
            }
        }
        nodes.sort_unstable();
        valid.then_some(nodes)
    }

    pub(crate) fn labels(&mut self) -> Option<BTreeMap<String, String>> {
        let Some(value) = self.present("labels") else {
            return Some(BTreeMap::new());
        };
        let Some(object) = value.as_object() else {
            self.check::<()>(
                "labels",
                Err("must be an object of string values".to_owned()),
            );
            return None;
        };
        if object.len() > MAX_LABELS {
            self.check::<()>("labels", Err(format!("at most {MAX_LABELS} labels")));
            return None;
        }
        let mut labels = BTreeMap::new();
        let mut valid = true;
        for (key, value) in object {
            let pointer = format!("{}/labels/{}", self.pointer, escape_pointer_token(key));
            if let Err(message) = label_key(key) {
                self.v.push(pointer, message);
                valid = false;
                continue;
            }
            let text = match value {
                Value::String(text) => label_text(text),
                Value::Number(number) => Ok(number.to_string()),
                Value::Bool(flag) => Ok(flag.to_string()),
                _ => Err("label values are strings".to_owned()),
            };
            match text {
                Ok(text) => {
                    labels.insert(key.clone(), text);
                }
                Err(message) => {
                    self.v.push(pointer, message);
                    valid = false;
                }
            }
        }
        valid.then_some(labels)
    }
}

fn text_within(text: &str, max: usize) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("must not be empty".to_owned())
    } else if text.chars().count() > max {
        Err(format!("must be at most {max} characters"))
    } else if text.chars().any(char::is_control) {
        Err("must not contain control characters".to_owned())
    } else {
        Ok(text.to_owned())
    }
}

/// A number or a decimal string, exact (never through a float); overflow, NaN and infinities
/// are refused.
/// `-?digits(.digits)?((e|E)(+|-)?digits)?`: what JSON writes a number as. Looser spellings
/// that `Decimal` would also read (`1_000`, `+1`, `.5`, `5.`) are refused, so that a value
/// means the same to every reader of the record.
fn is_plain_decimal(raw: &str) -> bool {
    fn digits(text: &str) -> usize {
        text.bytes().take_while(u8::is_ascii_digit).count()
    }
    let rest = raw.strip_prefix('-').unwrap_or(raw);
    let whole = digits(rest);
    if whole == 0 {
        return false;
    }
    let mut rest = &rest[whole..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let count = digits(fraction);
        if count == 0 {
            return false;
        }
        rest = &fraction[count..];
    }
    if let Some(exponent) = rest.strip_prefix(['e', 'E']) {
        let exponent = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
        let count = digits(exponent);
        return count > 0 && count == exponent.len();
    }
    rest.is_empty()
}

pub fn parse_decimal(value: &Value) -> Result<Decimal, String> {
    let raw = match value {
        Value::Number(number) => number.to_string(),
        Value::String(text) => text.trim().to_owned(),
        _ => return Err("must be a number or a decimal string".to_owned()),
    };
    let lowered = raw.to_ascii_lowercase();
    if lowered.contains("nan") || lowered.contains("inf") {
        return Err(format!("`{raw}` is not a finite number"));
    }
    if !is_plain_decimal(&raw) {
        return Err(format!(
            "`{}` is not a decimal number (digits, an optional leading `-`, `.` and exponent)",
            truncate(&raw)
        ));
    }
    let parsed = if lowered.contains('e') {
        Decimal::from_scientific(&raw)
    } else {
        Decimal::from_str(&raw)
    };
    parsed.map_err(|_| {
        if raw
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
        {
            format!("`{}` is out of range", truncate(&raw))
        } else {
            format!("`{}` is not a decimal number", truncate(&raw))
        }
    })
}

fn parse_integer(value: &Value) -> Result<i64, String> {
    let invalid = || "must be a whole number".to_owned();
    match value {
        Value::Number(number) => number
            .as_i64()
            .or_else(|| {
                let text = number.to_string();
                Decimal::from_str(&text)
                    .ok()
                    .filter(|d| d.fract().is_zero())
                    .and_then(|d| i64::try_from(d).ok())
            })
            .ok_or_else(invalid),
        Value::String(text) => text.trim().parse::<i64>().map_err(|_| invalid()),
        _ => Err(invalid()),
    }
}

/// RFC 3339 with an explicit offset; a time without one is ambiguous and refused.
pub fn parse_time(value: &Value) -> Result<DateTime<Utc>, String> {
    let text = value
        .as_str()
        .ok_or_else(|| "must be an RFC 3339 time string".to_owned())?;
    super::values::parse_instant(text)
}

fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> RecordRules {
        RecordRules {
            now: now(),
            max_duration: RecordRules::DEFAULT_MAX_DURATION,
        }
    }

    fn now() -> DateTime<Utc> {
        "2026-11-30T00:00:00Z".parse().unwrap()
    }

    fn minimal() -> Value {
        json!({
            "project": "vision", "task_id": "t1", "gpu_model": "H100", "gpu_count": 8,
            "started_at": "2026-11-20T10:00:00Z", "ended_at": "2026-11-20T11:30:00Z",
            "outcome": "completed"
        })
    }

    fn pointers(value: Value) -> Vec<String> {
        match JobRecord::parse(&value, "/0", rules()) {
            Ok(_) => vec![],
            Err(v) => {
                let mut p: Vec<String> = v.into_vec().into_iter().map(|e| e.pointer).collect();
                p.sort();
                p
            }
        }
    }

    #[test]
    fn defaults_are_applied() {
        let record = JobRecord::parse(&minimal(), "/0", rules()).unwrap();
        assert_eq!(record.key.attempt, 1);
        assert_eq!(record.billing_mode, BillingMode::OnDemand);
        assert_eq!(record.gpu_seconds_held, Decimal::from(8 * 5400));
        assert_eq!(record.gpu_seconds_busy, None, "absent busy is unmeasured");
        assert_eq!((record.retries, record.failures), (0, 0));
    }

    #[test]
    fn fractional_gpu_counts_are_valid() {
        let mut value = minimal();
        value["gpu_count"] = json!("0.142857");
        let record = JobRecord::parse(&value, "/0", rules()).unwrap();
        assert_eq!(
            record.gpu_seconds_held,
            Decimal::from_str("771.4278").unwrap()
        );
    }

    #[test]
    fn every_bad_field_is_reported() {
        let value = json!({
            "project": "Vision", "task_id": "", "attempt": 0, "gpu_model": "H100",
            "gpu_count": 0, "billing_mode": "lease", "started_at": "2026-11-20T10:00:00",
            "ended_at": "2026-11-20T09:00:00Z", "outcome": "done", "retries": -1,
            "output": {"quantity": "-1", "unit": ""}, "colour": "red"
        });
        assert_eq!(
            pointers(value),
            vec![
                "/0/attempt",
                "/0/billing_mode",
                "/0/colour",
                "/0/gpu_count",
                "/0/outcome",
                "/0/output/quantity",
                "/0/output/unit",
                "/0/project",
                "/0/retries",
                "/0/started_at",
                "/0/task_id",
            ]
        );
    }

    #[test]
    fn required_fields_are_named() {
        assert_eq!(
            pointers(json!({})),
            vec![
                "/0/ended_at",
                "/0/gpu_count",
                "/0/gpu_model",
                "/0/outcome",
                "/0/project",
                "/0/started_at",
                "/0/task_id"
            ]
        );
    }

    #[test]
    fn times_are_ordered_and_not_in_the_future() {
        let mut value = minimal();
        value["ended_at"] = json!("2026-11-20T09:00:00Z");
        assert_eq!(pointers(value), vec!["/0/ended_at"]);
        let mut value = minimal();
        value["ended_at"] = json!("2026-11-30T00:06:00Z");
        assert_eq!(pointers(value), vec!["/0/ended_at"]);
        let mut value = minimal();
        value["ended_at"] = json!("2026-11-30T00:04:00+00:00");
        assert_eq!(pointers(value), Vec::<String>::new());
    }

    #[test]
    fn a_record_is_not_queued_after_it_started() {
        let mut value = minimal();
        value["queued_at"] = json!("2026-11-20T10:00:01Z");
        assert_eq!(pointers(value), vec!["/0/queued_at"]);
        let mut value = minimal();
        value["queued_at"] = json!("2026-11-20T10:00:00Z");
        assert_eq!(pointers(value), Vec::<String>::new());
    }

    #[test]
    fn held_and_busy_are_bounded() {
        let mut value = minimal();
        value["gpu_seconds_held"] = json!(43201);
        assert_eq!(pointers(value), vec!["/0/gpu_seconds_held"]);
        let mut value = minimal();
        value["gpu_seconds_held"] = json!("43200");
        value["gpu_seconds_busy"] = json!(43200.5);
        assert_eq!(pointers(value), vec!["/0/gpu_seconds_busy"]);
        let mut value = minimal();
        value["gpu_seconds_busy"] = json!(-1);
        assert_eq!(pointers(value), vec!["/0/gpu_seconds_busy"]);
    }

    #[test]
    fn overflow_nan_and_garbage_numbers_are_refused() {
        for bad in [
            json!("NaN"),
            json!("1e40"),
            json!("99999999999999999999999999999999"),
            json!("abc"),
            json!(true),
        ] {
            let mut value = minimal();
            value["gpu_seconds_busy"] = bad.clone();
            assert_eq!(pointers(value), vec!["/0/gpu_seconds_busy"], "{bad}");
        }
    }

    #[test]
    fn labels_are_bounded() {
        let mut value = minimal();
        let many: Map<String, Value> = (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
        value["labels"] = Value::Object(many);
        assert_eq!(pointers(value), vec!["/0/labels"]);
        let mut value = minimal();
        value["labels"] = json!({"ok": "x", "bad key": "y", "nested": {"a": 1}});
        assert_eq!(
            pointers(value),
            vec!["/0/labels/bad key", "/0/labels/nested"]
        );
    }

    #[test]
    fn equal_records_hash_equally_whatever_their_spelling() {
        let a = JobRecord::parse(&minimal(), "/0", rules()).unwrap();
        let mut spelled = minimal();
        spelled["gpu_count"] = json!("8.00");
        spelled["attempt"] = json!(1);
        spelled["billing_mode"] = json!("on_demand");
        spelled["started_at"] = json!("2026-11-20T11:00:00+01:00");
        let b = JobRecord::parse(&spelled, "/0", rules()).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        let mut changed = minimal();
        changed["outcome"] = json!("failed");
        let c = JobRecord::parse(&changed, "/0", rules()).unwrap();
        assert_ne!(a.content_hash(), c.content_hash());
    }

    #[test]
    fn content_hashes_are_those_already_stored() {
        // Hashes computed before the canonical form was streamed into the hasher; a change
        // here would turn every re-post of a stored record into a conflict.
        let full = json!({
            "project": "vision", "task_id": "train \"résumé\" \\ nightly/7", "attempt": 3,
            "gpu_model": "A100", "gpu_count": "0.142857", "billing_mode": "spot",
            "provider": "aws", "region": "us-east-1", "queued_at": "2026-11-20T09:52:00.5+01:00",
            "started_at": "2026-11-20T10:00:00.123456Z", "ended_at": "2026-11-20T11:30:00Z",
            "gpu_seconds_busy": "300.10", "outcome": "preempted", "retries": 2, "failures": 1,
            "output": {"quantity": "1e6", "unit": "tokens"},
            "labels": {"team": "perception", "ci.run/id": 4711, "zz": true,
                       "key_ok": "ü\"x\u{e9}</script>"}
        });
        for (value, hash) in [
            (
                minimal(),
                "4d8be0ad5362db2298e6a3d3db5cde95b676e49df7dabca16f37b1d59259c199",
            ),
            (
                full,
                "01534c9911682ea1393f2d797de4b94b54fc0b7ed6d63cb7556b865910d14fa1",
            ),
        ] {
            let record = JobRecord::parse(&value, "/0", rules()).unwrap();
            assert_eq!(hex::encode(record.content_hash()), hash, "{value}");
            let canonical = serde_json::to_vec(&record.canonical_json()).unwrap();
            assert_eq!(hex::encode(Sha256::digest(canonical)), hash, "{value}");
        }
    }

    #[test]
    fn decimals_are_spelled_as_json_numbers() {
        for good in ["0", "8", "-2.5", "0.142857", "1e3", "1.5E-2", "12e+1"] {
            assert!(parse_decimal(&Value::from(good)).is_ok(), "{good}");
        }
        for bad in [
            "1_000", "+1", ".5", "5.", "1e", "e5", "1.2.3", "--1", "0x10", "",
        ] {
            assert!(parse_decimal(&Value::from(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_start_after_1970_and_last_at_most_the_limit() {
        let mut value = minimal();
        value["started_at"] = Value::from("1969-12-31T23:00:00Z");
        value["ended_at"] = Value::from("1970-01-01T01:00:00Z");
        let errors = JobRecord::parse(&value, "/0", rules()).unwrap_err();
        let pointers: Vec<String> = errors.into_vec().into_iter().map(|e| e.pointer).collect();
        assert_eq!(pointers, ["/0/started_at"]);

        let rules = RecordRules {
            now: now(),
            max_duration: chrono::TimeDelta::hours(2),
        };
        value["started_at"] = Value::from("2026-11-20T10:00:00Z");
        value["ended_at"] = Value::from("2026-11-20T12:00:00Z");
        assert!(JobRecord::parse(&value, "/0", rules).is_ok());
        value["ended_at"] = Value::from("2026-11-20T12:00:01Z");
        let errors = JobRecord::parse(&value, "/0", rules).unwrap_err();
        assert_eq!(errors.into_vec()[0].pointer, "/0/ended_at");
    }
}
