//! What dcgm-exporter measured of a pod's GPUs, as the record's telemetry fields.
//!
//! Averages are over the pod's life, per GPU: the time-average of each GPU, then their mean.
//! `DCGM_FI_DEV_GPU_UTIL` (percent) is not reported for MIG instances, so a slice's `gpu_util`
//! is `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio). The profiling metrics are off by default in
//! dcgm-exporter; where they were not collected their fields stay empty, and nothing else
//! stands in for them. A figure that cannot be right is left out with its reason.
//!
//! The pod's energy is `energy_joules`, from `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`: each GPU's
//! counter of millijoules since its driver was loaded. A GPU's energy over the pod's life is
//! its last reading less its first, both taken every `--resolution` from the series that carry
//! the pod's labels, and only from samples taken in the pod's life, after its start: a reading
//! from before it (an earlier pod of the same name on the GPU, which Prometheus' lookback hands
//! the first steps) is never counted. So the readings lie between the first and the last scrape
//! that saw the pod: up to a scrape interval and a step at each end are not counted, and the
//! figure can only understate. The pod's is the sum over its GPUs, / 1000, exactly. Nothing is
//! extrapolated to the pod's start and end, and no counter reset is bridged, as PromQL's
//! `increase()` would do: a price must not rest on a guess. The readings are the lowest and
//! highest of the counter over the pod's life, and how often it went down (`resets()`): while
//! it never went down, its lowest reading is its first and its highest its last.
//!
//! The counter is the whole card's, so energy is left out, with its reason, where the card is
//! not the pod's alone: a MIG instance, a GPU time-sliced between pods (dcgm-exporter's `vgpu`
//! label, or a node whose `nvidia.com/gpu.product` ends `-SHARED`) or a HAMi share. It is
//! left out too where a counter went down during the pod's life (a driver reload or GPU
//! reset), and where a GPU of the pod has no two readings of it.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;

use super::promql::Sample;
use crate::domain::record::MAX_MEMORY_GIB;
use crate::sources::batch::LeftOut;

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
    /// The energy counter of each of the pod's GPUs, by its UUID, GPU instance and virtual
    /// GPU.
    pub energy: BTreeMap<String, EnergyCounter>,
}

/// `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` of one GPU over a pod's life, in millijoules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnergyCounter {
    /// Its lowest reading: the first, while it never went down.
    pub least: Option<Figure>,
    /// Its highest reading: the last, while it never went down.
    pub most: Option<Figure>,
    /// How often it went down from one reading to the next.
    pub resets: Option<Figure>,
    /// Whether its series is a MIG instance's (`GPU_I_ID` or `GPU_I_PROFILE`).
    pub mig: bool,
    /// Whether dcgm-exporter reports the GPU as shared between pods (its `vgpu` label).
    pub shared: bool,
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
            let figure = || figure_of(sample);
            let slot = match sample.label("figure") {
                Some("gpu_util") => &mut dcgm.gpu_util_percent,
                Some("gr_engine_active") => &mut dcgm.gr_engine_active,
                Some("sm_active") => &mut dcgm.sm_active,
                Some("tensor_active") => &mut dcgm.tensor_active,
                Some("dram_active") => &mut dcgm.dram_active,
                Some("fb_used") => &mut dcgm.fb_used_mib,
                Some(figure @ ("energy_least" | "energy_most" | "energy_resets")) => {
                    let gpu =
                        ["UUID", "GPU_I_ID", "vgpu"].map(|name| sample.label(name).unwrap_or(""));
                    let counter = dcgm.energy.entry(gpu.join("/")).or_default();
                    counter.mig |= sample.label("GPU_I_ID").is_some()
                        || sample.label("GPU_I_PROFILE").is_some();
                    counter.shared |= sample.label("vgpu").is_some();
                    let slot = match figure {
                        "energy_least" => &mut counter.least,
                        "energy_most" => &mut counter.most,
                        _ => &mut counter.resets,
                    };
                    *slot = Some(figure_of(sample));
                    continue;
                }
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

fn figure_of(sample: &Sample) -> Figure {
    match sample.decimal() {
        Some(value) => Figure::Value(value),
        None => Figure::NotFinite,
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

/// Why a pod's energy is left out.
pub const ENERGY_OF_MIG_INSTANCE: LeftOut = LeftOut {
    field: "energy_joules",
    reason: "a MIG instance: DCGM counts the whole card's energy",
};
pub const ENERGY_OF_SHARED_GPU: LeftOut = LeftOut {
    field: "energy_joules",
    reason: "a GPU shared with other pods (time-slicing or HAMi): DCGM counts the whole card's energy",
};
pub const ENERGY_RESET: LeftOut = LeftOut {
    field: "energy_joules",
    reason: "a GPU's counter went down during the pod's life (driver reload or GPU reset)",
};
pub const ENERGY_INCOMPLETE: LeftOut = LeftOut {
    field: "energy_joules",
    reason: "the counter was not read twice on each of the pod's GPUs",
};
const ENERGY_NOT_FINITE: LeftOut = LeftOut {
    field: "energy_joules",
    reason: NOT_FINITE,
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

/// The record's `energy_joules` of a pod on `gpus` whole GPUs: the sum over its GPUs of each
/// counter's last reading less its first, / 1000. `Ok(None)` where no counter was read; left
/// out on a MIG instance (`mig`, or a counter's series of one), on a GPU not the pod's alone
/// (`shared`, or a counter dcgm-exporter reports shared), where a counter went down, and
/// where the counters are not two readings on each of the `gpus` GPUs.
pub fn energy_joules(
    dcgm: &Dcgm,
    gpus: Decimal,
    mig: bool,
    shared: bool,
) -> Result<Option<Decimal>, LeftOut> {
    let counters = &dcgm.energy;
    if counters.is_empty() {
        return Ok(None);
    }
    if mig || counters.values().any(|counter| counter.mig) {
        return Err(ENERGY_OF_MIG_INSTANCE);
    }
    if shared || counters.values().any(|counter| counter.shared) {
        return Err(ENERGY_OF_SHARED_GPU);
    }
    let value = |figure: Option<Figure>| match figure {
        Some(Figure::Value(value)) => Ok(value),
        Some(Figure::NotFinite) => Err(ENERGY_NOT_FINITE),
        None => Err(ENERGY_INCOMPLETE),
    };
    let mut millijoules = Decimal::ZERO;
    for counter in counters.values() {
        let (least, most, resets) = (
            value(counter.least)?,
            value(counter.most)?,
            value(counter.resets)?,
        );
        if resets > Decimal::ZERO {
            return Err(ENERGY_RESET);
        }
        // One reading only (a pod shorter than a scrape interval) moves nothing.
        if most <= least {
            return Err(ENERGY_INCOMPLETE);
        }
        millijoules += most - least;
    }
    if Decimal::from(counters.len()) != gpus {
        return Err(ENERGY_INCOMPLETE);
    }
    Ok(Some((millijoules / Decimal::from(1000)).normalize()))
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

    /// The three energy figures of one GPU's counter (mJ), with its series' labels.
    fn counter(labels: &[(&str, &str)], least: &str, most: &str, resets: &str) -> Vec<Sample> {
        [
            ("energy_least", least),
            ("energy_most", most),
            ("energy_resets", resets),
        ]
        .into_iter()
        .map(|(figure, value)| {
            let mut all = vec![("figure", figure)];
            all.extend_from_slice(labels);
            sample(&all, value)
        })
        .collect()
    }

    #[test]
    fn energy_is_each_gpus_last_less_first_reading_in_joules() {
        // An H100 from 1,000,000,000 to 1,540,000,000 mJ, another from 2,000,000,500 to
        // 2,600,000,750: 540,000 J and 600,000.25 J.
        let answer = [
            counter(
                &[("UUID", "GPU-a"), ("gpu", "0")],
                "1000000000",
                "1540000000",
                "0",
            ),
            counter(
                &[("UUID", "GPU-b"), ("gpu", "1")],
                "2000000500",
                "2600000750",
                "0",
            ),
        ]
        .concat();
        let dcgm = Dcgm::read(&answer).unwrap();
        assert_eq!(dcgm.energy.len(), 2);
        let two = Decimal::from(2);
        assert_eq!(
            energy_joules(&dcgm, two, false, false),
            Ok(Some(dec("1140000.25")))
        );
        // One of the pod's two GPUs never reported the counter: the sum would understate.
        let one = Dcgm::read(&answer[..3]).unwrap();
        assert_eq!(
            energy_joules(&one, two, false, false),
            Err(ENERGY_INCOMPLETE)
        );
        assert_eq!(
            energy_joules(&one, Decimal::ONE, false, false),
            Ok(Some(dec("540000")))
        );
        // Nothing read is nothing to leave out.
        assert_eq!(energy_joules(&Dcgm::default(), two, true, true), Ok(None));
    }

    #[test]
    fn energy_is_left_out_after_a_reset_on_a_slice_or_a_shared_gpu() {
        // Read 5,000,000 then 9,000,000 mJ, the driver reloaded, then 1,000 to 2,000,000:
        // 5,999 J used, where the highest less the lowest reading would say 8,999.
        let reset = Dcgm::read(&counter(&[("UUID", "GPU-a")], "1000", "9000000", "1")).unwrap();
        assert_eq!(
            energy_joules(&reset, Decimal::ONE, false, false),
            Err(ENERGY_RESET)
        );
        // A MIG instance's series, or a pod known to hold slices: the card's counter.
        let instance = Dcgm::read(&counter(
            &[
                ("UUID", "GPU-a"),
                ("GPU_I_ID", "2"),
                ("GPU_I_PROFILE", "3g.40gb"),
            ],
            "1000000",
            "4600000",
            "0",
        ))
        .unwrap();
        assert!(instance.energy.values().all(|c| c.mig));
        assert_eq!(
            energy_joules(&instance, Decimal::ONE, false, false),
            Err(ENERGY_OF_MIG_INSTANCE)
        );
        let whole = Dcgm::read(&counter(&[("UUID", "GPU-a")], "1000000", "4600000", "0")).unwrap();
        assert_eq!(
            energy_joules(&whole, Decimal::ONE, false, false),
            Ok(Some(dec("3600")))
        );
        assert_eq!(
            energy_joules(&whole, Decimal::ONE, true, false),
            Err(ENERGY_OF_MIG_INSTANCE)
        );
        // Time-slicing: dcgm-exporter's virtual GPU label, or the caller knows it.
        let replica = Dcgm::read(&counter(
            &[("UUID", "GPU-a"), ("vgpu", "3")],
            "1000000",
            "4600000",
            "0",
        ))
        .unwrap();
        assert_eq!(
            energy_joules(&replica, Decimal::ONE, false, false),
            Err(ENERGY_OF_SHARED_GPU)
        );
        assert_eq!(
            energy_joules(&whole, Decimal::ONE, false, true),
            Err(ENERGY_OF_SHARED_GPU)
        );
        // A single reading (a pod shorter than a scrape), or NaN.
        let once = Dcgm::read(&counter(&[("UUID", "GPU-a")], "1000000", "1000000", "0")).unwrap();
        assert_eq!(
            energy_joules(&once, Decimal::ONE, false, false),
            Err(ENERGY_INCOMPLETE)
        );
        let nan = Dcgm::read(&counter(&[("UUID", "GPU-a")], "NaN", "1000000", "0")).unwrap();
        assert_eq!(
            energy_joules(&nan, Decimal::ONE, false, false)
                .unwrap_err()
                .reason,
            NOT_FINITE
        );
    }
}
