//! Job records: what CI posts, corrections, and reading them back.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::{Principal, Role};
use crate::domain::rating::Outcome;
use crate::domain::record::{JobRecord, RecordKey};
use crate::domain::validation::{FieldError, Violations, json_values, repeated_key};
use crate::domain::values::parse_day_or_instant;
use crate::http::auth::project_not_found;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{
    ApiPath, ApiQuery, body_rejection, classify_json_error, content_type_essence, parse_json,
    require_json_content_type,
};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::ingest::{self, Submitted};
use crate::ledger::instruments;
use crate::ledger::records::{self, RecordHistory};
use crate::ledger::records::{RecordFilter, RecordRow, VersionRow};

/// The most records one request may carry.
pub const MAX_RECORDS_PER_REQUEST: usize = 10_000;
/// The most hourly segments one request may cut its records into. Rating takes time in
/// proportion to them: 1,340 records of 31 days (996,960 segments) were stored in 15 s by a
/// release build on a 2-core machine, well inside the request timeout, so a batch that is
/// allowed can also succeed.
pub const MAX_SEGMENTS_PER_REQUEST: i64 = 1_000_000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(post_job_records))
        .routes(routes!(list_job_records))
        .routes(routes!(get_job_record, put_job_record))
}

/// One job record as CI posts it (API.md "Job records").
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRecordInput {
    /// Project id (lowercase slug).
    #[schema(example = "vision")]
    pub project: String,
    /// At most 256 characters.
    pub task_id: String,
    /// Default 1.
    #[schema(minimum = 1)]
    pub attempt: Option<i32>,
    #[schema(example = "H100")]
    pub gpu_model: String,
    /// May be fractional: a MIG slice or shared GPU holds 0.5 or 1/7 of a card.
    #[schema(value_type = String, example = "8")]
    pub gpu_count: Decimal,
    /// `on_demand` (default), `spot` or `reserved`.
    pub billing_mode: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub queued_at: Option<DateTime<Utc>>,
    /// RFC 3339 with an offset; not before 1970.
    pub started_at: DateTime<Utc>,
    /// RFC 3339 with an offset; not before `started_at`, at most 5 minutes in the future,
    /// and at most 31 days (the server's `--max-record-days`) after `started_at`.
    pub ended_at: DateTime<Utc>,
    /// Default `gpu_count × duration`; never more. A number or decimal string.
    #[schema(value_type = Option<String>)]
    pub gpu_seconds_held: Option<Decimal>,
    /// Measured busy GPU-seconds, at most `gpu_seconds_held`; absent means unmeasured.
    #[schema(value_type = Option<String>)]
    pub gpu_seconds_busy: Option<Decimal>,
    /// `completed`, `failed`, `cancelled` or `preempted`.
    pub outcome: String,
    pub retries: Option<i32>,
    pub failures: Option<i32>,
    pub output: Option<OutputView>,
    /// At most 32 labels; keys of letters, digits, `_-./`.
    pub labels: Option<BTreeMap<String, String>>,
    /// GPU-Util from 0 to 1 (`DCGM_FI_DEV_GPU_UTIL` / 100), averaged over the held time.
    #[schema(value_type = Option<String>, example = "0.91")]
    pub gpu_util: Option<Decimal>,
    /// SM activity from 0 to 1 (`DCGM_FI_PROF_SM_ACTIVE`). Without `gpu_seconds_busy`,
    /// busy = held × `sm_active`.
    #[schema(value_type = Option<String>, example = "0.38")]
    pub sm_active: Option<Decimal>,
    /// Tensor-core activity from 0 to 1 (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`).
    #[schema(value_type = Option<String>, example = "0.12")]
    pub tensor_active: Option<Decimal>,
    /// Memory-bandwidth activity from 0 to 1 (`DCGM_FI_PROF_DRAM_ACTIVE`).
    #[schema(value_type = Option<String>, example = "0.25")]
    pub dram_active: Option<Decimal>,
    /// Peak framebuffer memory used per GPU (or slice), GiB; at most `memory_total_gib`.
    #[schema(value_type = Option<String>, example = "20")]
    pub memory_peak_gib: Option<Decimal>,
    /// Memory per GPU (or slice), GiB, greater than 0; with a peak and without this, the
    /// memory of the MIG profile or of the GPU model when the model is known.
    #[schema(value_type = Option<String>, example = "80")]
    pub memory_total_gib: Option<Decimal>,
    /// A MIG profile of `gpu_model` (`<g>g.<memory>gb`, e.g. `3g.40gb`): `gpu_count` then
    /// counts slices, each priced at g/7 of the card's contract price.
    #[schema(example = "3g.40gb")]
    pub mig_profile: Option<String>,
    /// Energy the attempt's GPUs used, in joules (≥ 0; at most 10 kW per GPU over the held
    /// time): the difference of DCGM's `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (millijoules)
    /// over the attempt ÷ 1000, or Slurm's `ConsumedEnergyRaw`. On an owned card priced by
    /// its TCO it replaces the power estimate in the price.
    #[schema(value_type = Option<String>, example = "5760000")]
    pub energy_joules: Option<Decimal>,
    /// The floating-point operations the model's math needed for the attempt's work (e.g.
    /// 6 × parameters × tokens for training, 2 × parameters × tokens for inference), > 0;
    /// needs `precision`. Refused when it exceeds what the GPUs could do at their dense peak
    /// in the held time (MFU above 1).
    #[schema(value_type = Option<String>, example = "4.2e18")]
    pub model_flops: Option<Decimal>,
    /// The precision the math ran in: `fp8`, `bf16`, `fp16`, `tf32` or `fp32`.
    #[schema(example = "bf16")]
    pub precision: Option<String>,
    /// The nodes the attempt ran on (a pod's node, Slurm's NodeList expanded), 1 to 256
    /// distinct names: its held GPU-seconds are spread evenly over them, and they count as
    /// used time of those nodes' capacity. A record stored without nodes and sent again with
    /// them is a duplicate, kept as stored.
    #[schema(example = json!(["gpu-node-07"]))]
    pub nodes: Option<Vec<String>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutputView {
    /// Non-negative, a number or decimal string.
    #[schema(value_type = String, example = "1000000")]
    pub quantity: Decimal,
    #[schema(example = "tokens")]
    pub unit: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct IngestResult {
    /// Records stored by this request.
    pub accepted: usize,
    /// Records already stored identically (or repeated in the batch), not written again.
    pub duplicates: usize,
}

/// A stored record.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecordView {
    pub project: String,
    pub task_id: String,
    pub attempt: i32,
    pub gpu_model: String,
    #[schema(value_type = String)]
    pub gpu_count: Decimal,
    pub billing_mode: String,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub queued_at: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    #[schema(value_type = String)]
    pub gpu_seconds_held: Decimal,
    #[schema(value_type = Option<String>)]
    pub gpu_seconds_busy: Option<Decimal>,
    pub outcome: String,
    pub retries: i32,
    pub failures: i32,
    pub output: Option<OutputView>,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub gpu_util: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub sm_active: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub tensor_active: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub dram_active: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub memory_peak_gib: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub memory_total_gib: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub energy_joules: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub model_flops: Option<Decimal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// The dense peak FLOPS of one of its GPUs (or slices) at its precision, from the GPU
    /// catalogue when it was stored; absent where the catalogue has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub peak_flops: Option<Decimal>,
    /// model_flops ÷ (peak_flops × gpu_seconds_held).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub mfu: Option<Decimal>,
    /// The nodes it ran on, sorted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
    /// 1 when first stored; each correction adds one.
    pub version: i32,
    pub ingested_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<RecordRow> for RecordView {
    fn from(row: RecordRow) -> Self {
        let telemetry = row.telemetry.to_telemetry();
        let mfu = telemetry.mfu(row.gpu_seconds_held);
        Self {
            output: match (row.output_quantity, row.output_unit) {
                (Some(quantity), Some(unit)) => Some(OutputView {
                    quantity: quantity.normalize(),
                    unit,
                }),
                _ => None,
            },
            project: row.project_id,
            task_id: row.task_id,
            attempt: row.attempt,
            gpu_model: row.gpu_model,
            gpu_count: row.gpu_count.normalize(),
            billing_mode: row.billing_mode.as_str().to_owned(),
            provider: row.provider,
            region: row.region,
            queued_at: row.queued_at,
            started_at: row.started_at,
            ended_at: row.ended_at,
            gpu_seconds_held: row.gpu_seconds_held.normalize(),
            gpu_seconds_busy: row.gpu_seconds_busy.map(|b| b.normalize()),
            outcome: row.outcome.as_str().to_owned(),
            retries: row.retries,
            failures: row.failures,
            labels: row.labels.0,
            gpu_util: telemetry.gpu_util,
            sm_active: telemetry.sm_active,
            tensor_active: telemetry.tensor_active,
            dram_active: telemetry.dram_active,
            memory_peak_gib: telemetry.memory_peak_gib,
            memory_total_gib: telemetry.memory_total_gib,
            mig_profile: telemetry.mig_profile,
            energy_joules: telemetry.energy_joules,
            model_flops: telemetry.model_flops,
            precision: telemetry.precision.map(|p| p.as_str().to_owned()),
            peak_flops: telemetry.peak_flops,
            mfu,
            nodes: row.nodes,
            version: row.version,
            ingested_at: row.ingested_at,
            updated_at: row.updated_at,
        }
    }
}

/// An earlier version, replaced by a correction.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionView {
    pub version: i32,
    /// The record as it was (canonical form).
    #[schema(value_type = Object)]
    pub record: Value,
    /// When this version was stored.
    pub recorded_at: DateTime<Utc>,
    /// The token that replaced it.
    pub replaced_by: Option<Uuid>,
    pub replaced_at: DateTime<Utc>,
}

impl From<VersionRow> for VersionView {
    fn from(row: VersionRow) -> Self {
        Self {
            version: row.version,
            record: row.record,
            recorded_at: row.recorded_at,
            replaced_by: row.replaced_by,
            replaced_at: row.replaced_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RecordWithHistory {
    pub record: RecordView,
    /// Earlier versions, oldest first.
    pub history: Vec<VersionView>,
}

impl From<RecordHistory> for RecordWithHistory {
    fn from(found: RecordHistory) -> Self {
        Self {
            record: found.record.into(),
            history: found.history.into_iter().map(VersionView::from).collect(),
        }
    }
}

/// The most JSON values one record may hold (its labels included): a larger element is
/// refused without being read into memory.
pub const MAX_VALUES_PER_RECORD: usize = 10_000;
/// The most invalid fields a 422 lists; its detail says how many there were.
pub const MAX_LISTED_ERRORS: usize = 1_000;

/// The records of a request body: a JSON array, or NDJSON with one record per line. They
/// are read one at a time (see [`RecordBatch::each`]), so that what a request holds in
/// memory is its body and the records it made, not a tree of the whole body.
pub struct RecordBatch {
    body: Bytes,
    ndjson: bool,
}

/// One element of a batch, as read.
enum Element {
    Object(Value),
    /// Holds more than [`MAX_VALUES_PER_RECORD`] values.
    TooLarge,
    /// Valid JSON, not an object.
    NotObject,
}

impl<S: Send + Sync> FromRequest<S> for RecordBatch {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = content_type_essence(req.headers());
        let ndjson = matches!(
            content_type.as_str(),
            "application/x-ndjson" | "application/ndjson" | "application/jsonl"
        );
        if !ndjson {
            require_json_content_type(req.headers()).map_err(|_| {
                ApiError::UnsupportedMediaType(
                    "send a JSON array (application/json) or one record per line \
                     (application/x-ndjson)"
                        .to_owned(),
                )
            })?;
        }
        let body = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        Ok(RecordBatch { body, ndjson })
    }
}

impl RecordBatch {
    /// Hands each element to `each`, in order; an error when the body is not a JSON array
    /// (or NDJSON) of at most [`MAX_RECORDS_PER_REQUEST`] elements.
    fn each(&self, each: impl FnMut(Element)) -> Result<(), ApiError> {
        if self.ndjson {
            each_line(&self.body, each)
        } else {
            each_element(&self.body, each)
        }
    }
}

/// Reads one element from its JSON text, unless it is too large or no object.
fn element(json: &[u8]) -> Result<Element, serde_json::Error> {
    let object = json.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if !object || json_values(json) > MAX_VALUES_PER_RECORD {
        // Checked for syntax without being kept.
        serde_json::from_slice::<serde::de::IgnoredAny>(json)?;
        return Ok(if object {
            Element::TooLarge
        } else {
            Element::NotObject
        });
    }
    serde_json::from_slice(json).map(Element::Object)
}

/// A JSON array of records, read element by element: one element past the limit ends the
/// read, so memory stays proportional to the limit, not to the body.
fn each_element(body: &[u8], each: impl FnMut(Element)) -> Result<(), ApiError> {
    use serde::de::{Deserializer as _, Error as _, SeqAccess, Visitor};
    use serde_json::value::RawValue;

    struct Records<F>(F);

    impl<'de, F: FnMut(Element)> Visitor<'de> for Records<F> {
        type Value = bool;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of job records")
        }

        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<bool, A::Error> {
            let mut read = 0;
            while let Some(raw) = seq.next_element::<&RawValue>()? {
                if read == MAX_RECORDS_PER_REQUEST {
                    // The rest is only skipped, so that a syntax error still tells.
                    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                    return Ok(false);
                }
                read += 1;
                (self.0)(element(raw.get().as_bytes()).map_err(A::Error::custom)?);
            }
            Ok(true)
        }
    }

    let mut deserializer = serde_json::Deserializer::from_slice(body);
    match deserializer.deserialize_seq(Records(each)) {
        Ok(false) => Err(too_many_records()),
        Ok(true) if let Some(pointer) = repeated_key(body) => Err(ApiError::invalid(
            pointer,
            "this key appears more than once",
        )),
        Ok(true) => deserializer
            .end()
            .map_err(|error| classify_json_error(String::new(), &error)),
        Err(error) if error.is_data() => Err(ApiError::invalid(
            "",
            "the body must be a JSON array of job records",
        )),
        Err(error) => Err(classify_json_error(String::new(), &error)),
    }
}

fn too_many_records() -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "more than {MAX_RECORDS_PER_REQUEST} records in one request; split the batch"
    ))
}

fn each_line(body: &[u8], mut each: impl FnMut(Element)) -> Result<(), ApiError> {
    let mut read = 0;
    for (number, line) in body.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if read == MAX_RECORDS_PER_REQUEST {
            return Err(too_many_records());
        }
        let value = element(line).map_err(|error| {
            ApiError::BadRequest(format!("line {} is not valid JSON: {error}", number + 1))
        })?;
        if let Some(pointer) = repeated_key(line) {
            return Err(ApiError::invalid(
                format!("/{read}{pointer}"),
                "this key appears more than once",
            ));
        }
        each(value);
        read += 1;
    }
    Ok(())
}

/// Post job records (all or nothing).
///
/// A batch is validated whole: one invalid record answers 422 naming every bad field by
/// pointer (`/3/ended_at`; for NDJSON the index counts non-blank lines from 0) and nothing is
/// written. Records are idempotent by `(project, task_id, attempt)`: an identical re-post is
/// counted in `duplicates`; different content under a stored key is a 409 naming the
/// records, and nothing is written. Admin tokens may post to every project, ingest tokens to
/// their own.
#[utoipa::path(post, path = "/v1/job-records", tag = "job-records",
    request_body(content(
        (Vec<JobRecordInput> = "application/json"),
        (JobRecordInput = "application/x-ndjson"),
    ), description = "Up to 10,000 records, 16 MiB, and 1,000,000 ledger hours in all (a record of 31 days spans 746)"),
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 200, description = "Stored", body = IngestResult),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A record names a project this token may not post to", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A key is stored (or repeated) with different content", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "More than 10,000 records, 16 MiB or 1,000,000 ledger hours: the detail says how many records fit", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is neither `application/json` nor `application/x-ndjson`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid records", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn post_job_records(
    State(state): State<AppState>,
    principal: Principal,
    records: RecordBatch,
) -> ApiResult<axum::Json<IngestResult>> {
    if !principal.is_admin() && principal.role != Role::Ingest {
        return Err(ApiError::Forbidden(
            "posting job records needs an ingest or admin token".to_owned(),
        ));
    }
    let rules = state.settings.record_rules();
    let mut batch = Vec::new();
    let mut errors: Vec<FieldError> = Vec::new();
    let (mut invalid_fields, mut invalid_records, mut position) = (0, 0, 0);
    records.each(|element| {
        let pointer = format!("/{position}");
        let found = match element {
            Element::Object(value) => match JobRecord::parse(&value, &pointer, rules) {
                Ok(record) => {
                    batch.push(Submitted { position, record });
                    Vec::new()
                }
                Err(violations) => violations.into_vec(),
            },
            Element::NotObject => vec![FieldError::new(
                pointer,
                "a job record must be a JSON object",
            )],
            Element::TooLarge => vec![FieldError::new(
                pointer,
                format!(
                    "a job record holds at most {MAX_VALUES_PER_RECORD} JSON values; this one \
                     holds more"
                ),
            )],
        };
        if !found.is_empty() {
            invalid_records += 1;
            invalid_fields += found.len();
            let room = MAX_LISTED_ERRORS.saturating_sub(errors.len());
            errors.extend(found.into_iter().take(room));
        }
        position += 1;
    })?;
    if invalid_records > 0 {
        instruments::job_records_rejected(invalid_records);
        return Err(if invalid_fields > errors.len() {
            ApiError::ValidationOf(errors, invalid_fields)
        } else {
            ApiError::Validation(errors)
        });
    }
    check_scope(&principal, &batch)?;
    check_work(&batch)?;
    let stored = ingest::ingest(&state.pool, batch, &state.settings).await?;
    Ok(axum::Json(IngestResult {
        accepted: stored.accepted,
        duplicates: stored.duplicates,
    }))
}

/// A batch is rated in one transaction: one that would be cut into more hourly segments
/// than [`MAX_SEGMENTS_PER_REQUEST`] is refused whole, saying how many records of its
/// length fit in a request.
fn check_work(batch: &[Submitted]) -> ApiResult<()> {
    let segments: i64 = batch.iter().map(|s| s.record.segment_bound()).sum();
    if segments <= MAX_SEGMENTS_PER_REQUEST {
        return Ok(());
    }
    let per_record = (segments / batch.len().max(1) as i64).max(1);
    let fit = (MAX_SEGMENTS_PER_REQUEST / per_record).max(1);
    Err(ApiError::PayloadTooLarge(format!(
        "these {} records span up to {segments} ledger hours in all, more than the \
         {MAX_SEGMENTS_PER_REQUEST} one request may rate; nothing was written. Send at most \
         {fit} records of this length per request",
        batch.len()
    )))
}

/// Every record must name a project the token may post to.
fn check_scope(principal: &Principal, batch: &[Submitted]) -> ApiResult<()> {
    let forbidden: Vec<FieldError> = batch
        .iter()
        .filter(|s| !principal.can_ingest(&s.record.key.project))
        .map(|s| {
            FieldError::new(
                format!("/{}/project", s.position),
                format!(
                    "this token may not post to project `{}`",
                    s.record.key.project
                ),
            )
        })
        .collect();
    if forbidden.is_empty() {
        Ok(())
    } else {
        instruments::job_records_rejected(forbidden.len());
        Err(ApiError::ForbiddenFields(
            format!(
                "{} records name projects this token may not post to; nothing was written",
                forbidden.len()
            ),
            forbidden,
        ))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RecordQuery {
    /// Records that started at or after this time (RFC 3339, or a date: midnight in the ledger time zone).
    pub from: Option<String>,
    /// Records that started before this time (exclusive).
    pub to: Option<String>,
    /// Only this outcome.
    pub outcome: Option<String>,
    /// Only the attempts of this task.
    pub task_id: Option<String>,
    /// Items per page, 1 to 1000 (default 100).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// List a project's job records by start time.
#[utoipa::path(get, path = "/v1/projects/{id}/job-records", tag = "job-records",
    params(("id" = String, Path, description = "Project id"), RecordQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "A page of records in start order", body = Page<RecordView>),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid filter", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_job_records(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<RecordQuery>,
) -> ApiResult<axum::Json<Page<RecordView>>> {
    readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let page = PageParams {
        limit: query.limit,
        cursor: query.cursor.clone(),
    };
    let limit = page.limit()?;
    let mut violations = Violations::default();
    let after: Option<(DateTime<Utc>, String, i32)> = page.cursor()?;
    let from = query
        .from
        .as_deref()
        .and_then(|raw| violations.check("query:from", parse_day_or_instant(raw, tz)));
    let to = query
        .to
        .as_deref()
        .and_then(|raw| violations.check("query:to", parse_day_or_instant(raw, tz)));
    let outcome = query.outcome.as_deref().and_then(|raw| {
        violations.check(
            "query:outcome",
            Outcome::parse(raw)
                .ok_or_else(|| "must be one of completed, failed, cancelled, preempted".to_owned()),
        )
    });
    violations.into_result()?;
    let filter = RecordFilter {
        from,
        to,
        outcome,
        task_id: query.task_id,
        after,
    };
    let rows = crate::ledger::records::list(&state.pool, &id, &filter, limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| (row.started_at, row.task_id.clone(), row.attempt),
        RecordView::from,
    )))
}

/// One record with every earlier version.
#[utoipa::path(get, path = "/v1/projects/{id}/job-records/{task_id}/{attempt}", tag = "job-records",
    params(("id" = String, Path, description = "Project id"), ("task_id" = String, Path, description = "Task id (percent-encoded)"), ("attempt" = i32, Path, description = "Attempt")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The record and its history", body = RecordWithHistory),
        (status = 404, description = "No such record", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_job_record(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, task_id, attempt)): ApiPath<(String, String, i32)>,
) -> ApiResult<axum::Json<RecordWithHistory>> {
    readable_project(&state, &principal, &id).await?;
    let key = RecordKey {
        project: id,
        task_id,
        attempt,
    };
    let found = records::record_with_history(&state.pool, &key).await?;
    Ok(axum::Json(found.into()))
}

/// Correct a stored record (admin, or an ingest token of the project).
///
/// The body is the whole corrected record; `project`, `task_id` and `attempt` may be left
/// out and must match the path when given. The version it replaces is kept in the history
/// with who replaced it and when. An identical body changes nothing.
#[utoipa::path(put, path = "/v1/projects/{id}/job-records/{task_id}/{attempt}", tag = "job-records",
    params(("id" = String, Path, description = "Project id"), ("task_id" = String, Path, description = "Task id (percent-encoded)"), ("attempt" = i32, Path, description = "Attempt")),
    request_body = JobRecordInput,
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The corrected record and its history", body = RecordWithHistory),
        (status = 403, description = "This token may not correct records of the project", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such record", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid record", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_job_record(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, task_id, attempt)): ApiPath<(String, String, i32)>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult<axum::Json<RecordWithHistory>> {
    require_json_content_type(&headers)?;
    if json_values(&body) > MAX_VALUES_PER_RECORD {
        // Checked for syntax, never held as a tree.
        serde_json::from_slice::<serde::de::IgnoredAny>(&body)
            .map_err(|error| classify_json_error(String::new(), &error))?;
        return Err(ApiError::invalid(
            "",
            format!("a job record holds at most {MAX_VALUES_PER_RECORD} JSON values"),
        ));
    }
    let mut body: Value = parse_json(&body)?;
    if !principal.can_ingest(&id) {
        return Err(if principal.can_read(&id) {
            ApiError::Forbidden(format!(
                "correcting records of `{id}` needs an admin token or an ingest token of the project"
            ))
        } else {
            project_not_found(&id)
        });
    }
    let Some(object) = body.as_object_mut() else {
        return Err(ApiError::invalid(
            "",
            "the body must be one job record object",
        ));
    };
    let mut violations = Violations::default();
    for (field, expected) in [
        ("project", Value::from(id.clone())),
        ("task_id", Value::from(task_id.clone())),
        ("attempt", Value::from(attempt)),
    ] {
        match object.get(field) {
            None | Some(Value::Null) => {
                object.insert(field.to_owned(), expected);
            }
            Some(given) if *given == expected => {}
            Some(_) => violations.push(format!("/{field}"), "must match the path"),
        }
    }
    violations.into_result()?;
    let record = JobRecord::parse(&body, "", state.settings.record_rules())?;
    let corrected =
        records::correct(&state.pool, record, &principal.actor, &state.settings).await?;
    Ok(axum::Json(corrected.into()))
}
