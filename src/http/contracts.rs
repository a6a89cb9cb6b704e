//! Pricing contracts (finance or admin). Every change re-rates what it touches, in the same
//! transaction, before the response returns.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::app::AppState;
use crate::domain::access::Principal;
use crate::domain::rating::BillingMode;
use crate::domain::values::{self, Currency, ProjectId};
use crate::error::{ApiError, ApiResult, FieldError, Problem, Violations};
use crate::http::auth::require_finance;
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::projects::present;
use crate::store;
use crate::store::contracts::{ContractFields, ContractRow, OVERLAP_CONSTRAINT};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_contract, list_contracts))
        .routes(routes!(get_contract, update_contract, delete_contract))
}

const NAME_CHARS: usize = 200;
const SCOPE_CHARS: usize = 100;

#[derive(Debug, Serialize, ToSchema)]
pub struct ContractView {
    pub id: Uuid,
    pub name: String,
    pub gpu_model: String,
    /// `on_demand`, `spot` or `reserved`.
    pub billing_mode: String,
    pub price_per_gpu_hour: Decimal,
    /// ISO 4217 code of the price.
    pub currency: String,
    pub valid_from: DateTime<Utc>,
    /// Exclusive; null means open-ended.
    pub valid_until: Option<DateTime<Utc>>,
    /// Set: prices only this project's records.
    pub project: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    /// GPUs paid for every hour of validity, used or not (reserved contracts only).
    pub committed_gpus: Option<Decimal>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<ContractRow> for ContractView {
    fn from(row: ContractRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            gpu_model: row.gpu_model,
            billing_mode: row.billing_mode,
            price_per_gpu_hour: row.price_per_gpu_hour.normalize(),
            currency: row.currency,
            valid_from: row.valid_from,
            valid_until: row.valid_until,
            project: row.project_id,
            provider: row.provider,
            region: row.region,
            committed_gpus: row.committed_gpus.map(|gpus| gpus.normalize()),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContract {
    pub name: String,
    pub gpu_model: String,
    /// `on_demand`, `spot` or `reserved`.
    pub billing_mode: String,
    /// Price of one GPU-hour (decimal string or number, > 0), exact.
    #[schema(value_type = String, example = "2.50")]
    pub price_per_gpu_hour: Decimal,
    /// ISO 4217 code, e.g. `USD`.
    pub currency: String,
    /// RFC 3339 with an offset.
    pub valid_from: String,
    /// RFC 3339 with an offset, after `valid_from`; absent means open-ended.
    pub valid_until: Option<String>,
    /// Scope the contract to one project.
    pub project: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    /// Only on `reserved` contracts, > 0 (may be fractional).
    #[schema(value_type = Option<String>, example = "8")]
    pub committed_gpus: Option<Decimal>,
}

/// Fields to change. The model, mode and scope of a contract never change (create another
/// one instead); `null` makes `valid_until` open-ended or removes `committed_gpus`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateContract {
    pub name: Option<String>,
    #[schema(value_type = Option<String>)]
    pub price_per_gpu_hour: Option<Decimal>,
    pub currency: Option<String>,
    pub valid_from: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub valid_until: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub committed_gpus: Option<Option<Decimal>>,
}

fn scope_text(violations: &mut Violations, pointer: &str, raw: Option<&str>) -> Option<String> {
    raw.and_then(|text| violations.check(pointer, values::bounded_text(text, SCOPE_CHARS)))
}

/// The rules that bind fields to each other, checked on creation and after every change.
fn check_consistency(violations: &mut Violations, fields: &ContractFields) {
    if fields
        .valid_until
        .is_some_and(|until| until <= fields.valid_from)
    {
        violations.push("/valid_until", "must be after valid_from");
    }
    if fields.committed_gpus.is_some() && fields.billing_mode != BillingMode::Reserved {
        violations.push("/committed_gpus", "only reserved contracts commit GPUs");
    }
}

async fn overlap_conflict(
    conn: &mut sqlx::PgConnection,
    fields: &ContractFields,
    except: Option<Uuid>,
) -> ApiResult<ApiError> {
    let other = store::contracts::equally_specific_overlap(conn, fields, except).await?;
    let detail = match other {
        Some(id) => format!(
            "contract {id} has the same model, billing mode and scope and overlaps this validity"
        ),
        None => "an equally specific contract overlaps this validity".to_owned(),
    };
    Ok(ApiError::Conflict(
        detail,
        vec![FieldError::new(
            "/valid_from",
            "overlaps an equally specific contract",
        )],
    ))
}

/// Re-rates every record the contract could price over the span, old and new validity
/// together.
async fn rerate(
    conn: &mut sqlx::PgConnection,
    state: &AppState,
    fields: &ContractFields,
    span: (DateTime<Utc>, Option<DateTime<Utc>>),
) -> ApiResult<()> {
    store::rating::rerate_kind(
        conn,
        &fields.gpu_model,
        fields.billing_mode,
        fields.project_id.as_deref(),
        span,
        state.settings.timezone,
    )
    .await?;
    Ok(())
}

fn union_span(a: &ContractFields, b: &ContractFields) -> (DateTime<Utc>, Option<DateTime<Utc>>) {
    let until = a.valid_until.zip(b.valid_until).map(|(x, y)| x.max(y));
    (a.valid_from.min(b.valid_from), until)
}

fn fields_of(row: &ContractRow) -> ApiResult<ContractFields> {
    Ok(ContractFields {
        name: row.name.clone(),
        gpu_model: row.gpu_model.clone(),
        billing_mode: crate::store::contracts::billing_mode(&row.billing_mode)?,
        price_per_gpu_hour: row.price_per_gpu_hour,
        currency: row.currency.clone(),
        valid_from: row.valid_from,
        valid_until: row.valid_until,
        project_id: row.project_id.clone(),
        provider: row.provider.clone(),
        region: row.region.clone(),
        committed_gpus: row.committed_gpus,
    })
}

/// Create a contract (finance or admin); re-rates the records it prices.
#[utoipa::path(post, path = "/v1/contracts", tag = "contracts", request_body = CreateContract,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created; the records it prices are re-rated", body = ContractView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An equally specific contract (same model, mode and project/provider/region scope) overlaps it; the detail names it", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(body): ApiJson<CreateContract>,
) -> ApiResult<(StatusCode, axum::Json<ContractView>)> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let name = violations.check("/name", values::bounded_text(&body.name, NAME_CHARS));
    let gpu_model = violations.check(
        "/gpu_model",
        values::bounded_text(&body.gpu_model, SCOPE_CHARS),
    );
    let billing_mode = violations.check(
        "/billing_mode",
        BillingMode::parse(&body.billing_mode)
            .ok_or_else(|| "use on_demand, spot or reserved".to_owned()),
    );
    let price = violations.check(
        "/price_per_gpu_hour",
        values::positive(body.price_per_gpu_hour),
    );
    let currency = violations.check("/currency", Currency::parse(&body.currency));
    let valid_from = violations.check("/valid_from", values::parse_instant(&body.valid_from));
    let valid_until = body
        .valid_until
        .as_deref()
        .map(|raw| violations.check("/valid_until", values::parse_instant(raw)));
    let project = body
        .project
        .as_deref()
        .map(|raw| violations.check("/project", ProjectId::parse(raw)));
    let provider = scope_text(&mut violations, "/provider", body.provider.as_deref());
    let region = scope_text(&mut violations, "/region", body.region.as_deref());
    let committed_gpus = body
        .committed_gpus
        .map(|gpus| violations.check("/committed_gpus", values::positive(gpus)));
    if let Some(Some(project)) = &project
        && store::projects::get(&state.pool, project.as_str())
            .await?
            .is_none()
    {
        violations.push("/project", format!("project `{project}` does not exist"));
    }
    let (
        Some(name),
        Some(gpu_model),
        Some(billing_mode),
        Some(price),
        Some(currency),
        Some(valid_from),
    ) = (name, gpu_model, billing_mode, price, currency, valid_from)
    else {
        return Err(ApiError::Validation(violations.into_vec()));
    };
    let fields = ContractFields {
        name,
        gpu_model,
        billing_mode,
        price_per_gpu_hour: price,
        currency: currency.code().to_owned(),
        valid_from,
        valid_until: valid_until.flatten(),
        project_id: project.flatten().map(|p| p.as_str().to_owned()),
        provider,
        region,
        committed_gpus: committed_gpus.flatten(),
    };
    check_consistency(&mut violations, &fields);
    violations.into_result()?;

    let mut tx = state.pool.begin().await?;
    if store::contracts::equally_specific_overlap(&mut tx, &fields, None)
        .await?
        .is_some()
    {
        return Err(overlap_conflict(&mut tx, &fields, None).await?);
    }
    let row = match store::contracts::insert(&mut tx, Uuid::new_v4(), &fields).await {
        Ok(row) => row,
        Err(error) if store::is_constraint_violation(&error, OVERLAP_CONSTRAINT) => {
            // A concurrent create won the race; it is committed now, so it can be named.
            drop(tx);
            let mut conn = state.pool.acquire().await?;
            return Err(overlap_conflict(&mut conn, &fields, None).await?);
        }
        Err(error) => return Err(error.into()),
    };
    rerate(
        &mut tx,
        &state,
        &fields,
        (fields.valid_from, fields.valid_until),
    )
    .await?;
    tx.commit().await?;
    crate::alerting::evaluate_current_month(&state.pool, &state.settings).await;
    Ok((StatusCode::CREATED, axum::Json(row.into())))
}

/// Every contract (finance or admin).
#[utoipa::path(get, path = "/v1/contracts", tag = "contracts", params(PageParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of contracts in id order", body = Page<ContractView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_contracts(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<axum::Json<Page<ContractView>>> {
    require_finance(&principal)?;
    let limit = page.limit()?;
    let after: Option<Uuid> = page.cursor()?;
    let mut conn = state.pool.acquire().await?;
    let rows = store::contracts::list(&mut conn, after, limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| row.id,
        ContractView::from,
    )))
}

fn contract_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("contract `{id}` does not exist"))
}

fn contract_id(raw: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(raw).map_err(|_| contract_not_found(raw))
}

/// One contract (finance or admin).
#[utoipa::path(get, path = "/v1/contracts/{id}", tag = "contracts",
    params(("id" = String, Path, description = "Contract id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The contract", body = ContractView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contract", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<ContractView>> {
    require_finance(&principal)?;
    let uuid = contract_id(&id)?;
    let mut conn = state.pool.acquire().await?;
    let row = store::contracts::get(&mut conn, uuid, false)
        .await?
        .ok_or_else(|| contract_not_found(&id))?;
    Ok(axum::Json(row.into()))
}

/// Change a contract (finance or admin); re-rates what its old and new terms price.
#[utoipa::path(patch, path = "/v1/contracts/{id}", tag = "contracts", request_body = UpdateContract,
    params(("id" = String, Path, description = "Contract id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The changed contract; what it prices is re-rated", body = ContractView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contract", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The new validity overlaps an equally specific contract", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn update_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateContract>,
) -> ApiResult<axum::Json<ContractView>> {
    require_finance(&principal)?;
    let uuid = contract_id(&id)?;
    let mut tx = state.pool.begin().await?;
    let old = store::contracts::get(&mut tx, uuid, true)
        .await?
        .ok_or_else(|| contract_not_found(&id))?;
    let old = fields_of(&old)?;
    let mut new = old.clone();
    let mut violations = Violations::default();
    if let Some(name) = &body.name
        && let Some(name) = violations.check("/name", values::bounded_text(name, NAME_CHARS))
    {
        new.name = name;
    }
    if let Some(price) = body.price_per_gpu_hour
        && let Some(price) = violations.check("/price_per_gpu_hour", values::positive(price))
    {
        new.price_per_gpu_hour = price;
    }
    if let Some(currency) = &body.currency
        && let Some(currency) = violations.check("/currency", Currency::parse(currency))
    {
        new.currency = currency.code().to_owned();
    }
    if let Some(from) = &body.valid_from
        && let Some(from) = violations.check("/valid_from", values::parse_instant(from))
    {
        new.valid_from = from;
    }
    match &body.valid_until {
        Some(Some(until)) => {
            if let Some(until) = violations.check("/valid_until", values::parse_instant(until)) {
                new.valid_until = Some(until);
            }
        }
        Some(None) => new.valid_until = None,
        None => {}
    }
    match body.committed_gpus {
        Some(Some(gpus)) => {
            if let Some(gpus) = violations.check("/committed_gpus", values::positive(gpus)) {
                new.committed_gpus = Some(gpus);
            }
        }
        Some(None) => new.committed_gpus = None,
        None => {}
    }
    check_consistency(&mut violations, &new);
    violations.into_result()?;
    if store::contracts::equally_specific_overlap(&mut tx, &new, Some(uuid))
        .await?
        .is_some()
    {
        return Err(overlap_conflict(&mut tx, &new, Some(uuid)).await?);
    }
    let row = match store::contracts::update(&mut tx, uuid, &new).await {
        Ok(row) => row,
        Err(error) if store::is_constraint_violation(&error, OVERLAP_CONSTRAINT) => {
            drop(tx);
            let mut conn = state.pool.acquire().await?;
            return Err(overlap_conflict(&mut conn, &new, Some(uuid)).await?);
        }
        Err(error) => return Err(error.into()),
    };
    rerate(&mut tx, &state, &new, union_span(&old, &new)).await?;
    tx.commit().await?;
    crate::alerting::evaluate_current_month(&state.pool, &state.settings).await;
    Ok(axum::Json(row.into()))
}

/// Delete a contract (finance or admin); what it priced is re-rated (and may become unrated).
#[utoipa::path(delete, path = "/v1/contracts/{id}", tag = "contracts",
    params(("id" = String, Path, description = "Contract id")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Deleted; what it priced is re-rated"),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contract", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    require_finance(&principal)?;
    let uuid = contract_id(&id)?;
    let mut tx = state.pool.begin().await?;
    let old = store::contracts::get(&mut tx, uuid, true)
        .await?
        .ok_or_else(|| contract_not_found(&id))?;
    let old = fields_of(&old)?;
    store::contracts::delete(&mut tx, uuid).await?;
    rerate(&mut tx, &state, &old, (old.valid_from, old.valid_until)).await?;
    tx.commit().await?;
    crate::alerting::evaluate_current_month(&state.pool, &state.settings).await;
    Ok(StatusCode::NO_CONTENT)
}
