//! What dcgm-exporter measured of a pod's GPUs, as the record's telemetry fields.
//!
//! Averages are over the pod's life, per GPU: the time-average of each GPU, then their mean.
//! `DCGM_FI_DEV_GPU_UTIL` (percent) is not reported for MIG instances, so a slice's `gpu_util`
//! is `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio). The profiling metrics are off by default in
//! dcgm-exporter; where they were not collected their fields stay empty, and nothing else
//! stands in for them. A figure that cannot be right is left out with its reason.

use std::collections::BTreeSet;

use rust_decimal::Decimal;

use super::promql::Sample;
use crate::domain::record::MAX_MEMORY_GIB;
use crate::domain::source::LeftOut;

/// The figures of one pod, as Prometheus answered them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dcgm {
    /// Mean of `DCGM_FI_DEV_GPU_UTIL`, percent.
    pub gpu_util_percent: Option<Figure>,
    pub gr_engine_active: Option<Figure>,
    pub sm_active: Option<Figure>,
    pub tensor_active: Option<Figure>,
    pub dram_active: Option<Figure>,
    /// Highest `DCGM_FI_DEV_FB_USED`, MiB.
    pub fb_used_mib: Option<Figure>,
    /// `modelName` of the pod's devices.
    pub models: BTreeSet<String>,
    /// `GPU_I_PROFILE` of the pod's MIG devices.
    pub mig_profiles: BTreeSet<String>,
}

/// A figure, or `NotFinite` where Prometheus answered NaN or an infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    Value(Decimal),
    NotFinite,
}

impl Dcgm {
    /// Reads the answer of [`super::promql::dcgm`].
    pub fn read(samples: &[Sample]) -> Result<Self, String> {
        let mut dcgm = Self::default();
        for sample in samples {
            let figure = || match sample.decimal() {
                Some(value) => Figure::Value(value),
                None => Figure::NotFinite,
            };
            let slot = match sample.label("figure") {
                Some("gpu_util") => &mut dcgm.gpu_util_percent,
                Some("gr_engine_active") => &mut dcgm.gr_engine_active,
                Some("sm_active") => &mut dcgm.sm_active,
                Some("tensor_active") => &mut dcgm.tensor_active,
                Some("dram_active") => &mut dcgm.dram_active,
                Some("fb_used") => &mut dcgm.fb_used_mib,
                Some("device") => {
                    if let Some(model) = sample.label("modelName") {
                        dcgm.models.insert(model.trim().to_owned());
                    }
                    if let Some(profile) = sample.label("GPU_I_PROFILE") {
                        dcgm.mig_profiles.insert(profile.to_owned());
                    }
                    continue;
                }
                other => {
                    return Err(format!(
                        "a series of the DCGM answer has an unexpected figure `{}`",
                        other.unwrap_or("")
                    ));
                }
            };
            *slot = Some(figure());
        }
        Ok(dcgm)
    }
}

/// The telemetry fields of a record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Telemetry {
    pub gpu_util: Option<Decimal>,
    pub sm_active: Option<Decimal>,
    pub tensor_active: Option<Decimal>,
    pub dram_active: Option<Decimal>,
    pub memory_peak_gib: Option<Decimal>,
}

pub const NOT_FINITE: &str = "Prometheus answered NaN or an infinity";
pub const ABOVE_FULL: &str = "outside 0 to 100 %";
pub const MEMORY_ABOVE_TOTAL: &str = "above the memory of the GPU or slice";
pub const MEMORY_ABOVE_LIMIT: &str = "above the most a record allows per GPU";
/// Why a shared GPU's figures are left out.
pub const SHARED_GPU: LeftOut = LeftOut {
    field: "telemetry",
    reason: "measured for the whole shared GPU, not for the pod's share",
};

/// Shares and memory are kept to a millionth (a KiB of memory).
const PLACES: u32 = 6;

/// The record's telemetry from a pod's figures: on MIG slices `gpu_util` comes from the
/// graphics engine activity; `total_gib` is the memory of the slice or GPU where known.
pub fn telemetry(dcgm: &Dcgm, mig: bool, total_gib: Option<Decimal>) -> (Telemetry, Vec<LeftOut>) {
    let mut left_out = Vec::new();
    let mut share = |field: &'static str, figure: Option<Figure>, scale: Decimal| {
        let reason = match figure? {
            Figure::NotFinite => NOT_FINITE,
            Figure::Value(value) => {
                let share = value / scale;
                if (Decimal::ZERO..=Decimal::ONE).contains(&share) {
                    return Some(share.round_dp(PLACES).normalize());
                }
                ABOVE_FULL
            }
        };
        left_out.push(LeftOut { field, reason });
        None
    };
    let gpu_util = if mig {
        share("gpu_util", dcgm.gr_engine_active, Decimal::ONE)
    } else {
        share("gpu_util", dcgm.gpu_util_percent, Decimal::ONE_HUNDRED)
    };
    let sm_active = share("sm_active", dcgm.sm_active, Decimal::ONE);
    let tensor_active = share("tensor_active", dcgm.tensor_active, Decimal::ONE);
    let dram_active = share("dram_active", dcgm.dram_active, Decimal::ONE);
    let memory_peak_gib = dcgm.fb_used_mib.and_then(|figure| {
        let reason = match figure {
            Figure::NotFinite => NOT_FINITE,
            Figure::Value(mib) => {
                let gib = (mib / Decimal::from(1024)).round_dp(PLACES).normalize();
                let (limit, reason) = match total_gib {
                    Some(total) => (total, MEMORY_ABOVE_TOTAL),
                    None => (Decimal::from(MAX_MEMORY_GIB), MEMORY_ABOVE_LIMIT),
                };
                if gib >= Decimal::ZERO && gib <= limit {
                    return Some(gib);
                }
                reason
            }
        };
        left_out.push(LeftOut {
            field: "memory_peak_gib",
            reason,
        });
        None
    });
    let telemetry = Telemetry {
        gpu_util,
        sm_active,
        tensor_active,
        dram_active,
        memory_peak_gib,
    };
    (telemetry, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn dec(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    fn sample(labels: &[(&str, &str)], value: &str) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            value: value.to_owned(),
        }
    }

    #[test]
    fn whole_gpus_take_gpu_util_and_missing_profiling_stays_empty() {
        let dcgm = Dcgm::read(&[
            sample(&[("figure", "gpu_util")], "91.5"),
            sample(&[("figure", "fb_used")], "40960"),
            sample(
                &[("figure", "device"), ("modelName", "NVIDIA A100-SXM4-80GB")],
                "2",
            ),
        ])
        .unwrap();
        assert_eq!(dcgm.models, ["NVIDIA A100-SXM4-80GB".to_owned()].into());
        let (t, left_out) = telemetry(&dcgm, false, Some(dec("80")));
        assert_eq!(left_out, vec![]);
        assert_eq!(t.gpu_util, Some(dec("0.915")));
        assert_eq!(t.memory_peak_gib, Some(dec("40")));
        assert_eq!(
            (t.sm_active, t.tensor_active, t.dram_active),
            (None, None, None)
        );
    }

    #[test]
    fn a_slice_takes_the_graphics_engine_and_odd_figures_are_left_out() {
        let dcgm = Dcgm::read(&[
            sample(&[("figure", "gpu_util")], "40"),
            sample(&[("figure", "gr_engine_active")], "0.4123456789"),
            sample(&[("figure", "sm_active")], "1.2"),
            sample(&[("figure", "dram_active")], "NaN"),
            sample(&[("figure", "fb_used")], "30000"),
            sample(
                &[
                    ("figure", "device"),
                    ("modelName", "NVIDIA A100-SXM4-80GB"),
                    ("GPU_I_PROFILE", "1g.10gb"),
                ],
                "1",
            ),
        ])
        .unwrap();
        assert_eq!(dcgm.mig_profiles, ["1g.10gb".to_owned()].into());
        let (t, left_out) = telemetry(&dcgm, true, Some(dec("10")));
        assert_eq!(t.gpu_util, Some(dec("0.412346")));
        assert_eq!(
            (t.sm_active, t.dram_active, t.memory_peak_gib),
            (None, None, None)
        );
        assert_eq!(
            left_out,
            vec![
                LeftOut {
                    field: "sm_active",
                    reason: ABOVE_FULL
                },
                LeftOut {
                    field: "dram_active",
                    reason: NOT_FINITE
                },
                LeftOut {
                    field: "memory_peak_gib",
                    reason: MEMORY_ABOVE_TOTAL
                },
            ]
        );
        assert!(Dcgm::read(&[sample(&[("figure", "power")], "1")]).is_err());
    }
}
