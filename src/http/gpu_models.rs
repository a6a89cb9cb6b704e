//! The GPU catalogue: each model's memory, MIG profiles and dense peak FLOPS per precision,
//! with the data sheet the peaks come from. MFU is measured against these peaks.

use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::gpu::{self, GpuSpec, MigProfile, Precision};
use crate::domain::utilisation::SHARE_SCALE;
use crate::http::error::ApiResult;
use crate::http::problems::AuthProblems;
use crate::http::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_gpu_models))
}

/// Dense peak TFLOPS of one GPU per precision; null where the data sheet gives none.
#[derive(Debug, Serialize, ToSchema)]
pub struct PeakTflopsView {
    #[schema(value_type = Option<String>, example = "1979")]
    pub fp8: Option<Decimal>,
    #[schema(value_type = Option<String>, example = "989.5")]
    pub bf16: Option<Decimal>,
    #[schema(value_type = Option<String>, example = "989.5")]
    pub fp16: Option<Decimal>,
    #[schema(value_type = Option<String>, example = "494.5")]
    pub tf32: Option<Decimal>,
    #[schema(value_type = Option<String>, example = "67")]
    pub fp32: Option<Decimal>,
}

/// A MIG profile: `slices` of the card's 7, priced and peaking at that share of the card.
#[derive(Debug, Serialize, ToSchema)]
pub struct MigProfileView {
    #[schema(example = "3g.40gb")]
    pub name: String,
    pub slices: u32,
    pub memory_gib: u32,
    /// slices ÷ 7, to 6 places.
    #[schema(value_type = String, example = "0.428571")]
    pub compute_share: Decimal,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GpuModelView {
    #[schema(example = "H100 80GB")]
    pub name: String,
    pub memory_gib: u32,
    pub mig_profiles: Vec<MigProfileView>,
    /// Null where no data sheet gives the model's peaks: its records' MFU is not computed.
    pub peak_tflops: Option<PeakTflopsView>,
    /// The data sheet the peaks come from.
    pub peak_source: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GpuModelsView {
    pub items: Vec<GpuModelView>,
}

fn tflops(spec: &GpuSpec, precision: Precision) -> Option<Decimal> {
    spec.peak_flops(precision, None)
        .map(|flops| (flops / Decimal::from(1_000_000_000_000u64)).normalize())
}

fn profile_view(profile: &MigProfile) -> MigProfileView {
    MigProfileView {
        name: profile.name(),
        slices: profile.slices,
        memory_gib: profile.memory_gib,
        compute_share: profile
            .compute_share()
            .as_decimal()
            .round_dp(SHARE_SCALE)
            .normalize(),
    }
}

fn model_view(spec: &GpuSpec) -> GpuModelView {
    GpuModelView {
        name: spec.name.to_owned(),
        memory_gib: spec.memory_gib,
        mig_profiles: spec.mig_profiles.iter().map(profile_view).collect(),
        peak_tflops: spec.peak.map(|_| PeakTflopsView {
            fp8: tflops(spec, Precision::Fp8),
            bf16: tflops(spec, Precision::Bf16),
            fp16: tflops(spec, Precision::Fp16),
            tf32: tflops(spec, Precision::Tf32),
            fp32: tflops(spec, Precision::Fp32),
        }),
        peak_source: spec.peak.map(|_| spec.peak_source.to_owned()),
    }
}

/// Every GPU model the service knows, with its peaks (any role).
#[utoipa::path(get, path = "/v1/gpu-models", tag = "efficiency",
    security(("bearer" = [])),
    responses(
        AuthProblems,
        (status = 200, description = "The GPU catalogue", body = GpuModelsView),
    ))]
pub async fn list_gpu_models(_principal: Principal) -> ApiResult<axum::Json<GpuModelsView>> {
    Ok(axum::Json(GpuModelsView {
        items: gpu::catalogue().map(model_view).collect(),
    }))
}
