//! Real utilisation: what the chip did, next to the GPU-Util a dashboard shows.
//!
//! A record's telemetry is a time-average over its held time, so a group's figure is the
//! average of its records' figures weighted by the GPU-seconds each held, over the records
//! that report it; the share of the group's held GPU-seconds that reported it is its
//! coverage. Both are kept as two sums per metric (held, and held × metric), so that any
//! set of groups merges exactly into their union, as the cost figures do.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::record::Telemetry;

/// GPU-Util at or above this, with SM activity below [`LOOKS_BUSY_SM_ACTIVE`], looks busy
/// and is not.
pub const LOOKS_BUSY_GPU_UTIL: Decimal = Decimal::from_parts(8, 0, 0, false, 1);
pub const LOOKS_BUSY_SM_ACTIVE: Decimal = Decimal::from_parts(4, 0, 0, false, 1);

/// Averages are shown to this many decimal places.
pub const SHARE_SCALE: u32 = 6;

/// Busy GPU-seconds of a record: as reported, or else held × SM activity; an explicit
/// figure always wins.
pub fn busy_seconds(
    reported: Option<Decimal>,
    held: Decimal,
    sm_active: Option<Decimal>,
) -> Option<Decimal> {
    reported.or_else(|| sm_active.map(|sm| (held * sm).normalize()))
}

/// The share of the GPU's (or slice's) memory the record's peak used.
pub fn memory_used_share(telemetry: &Telemetry) -> Option<Decimal> {
    let (peak, total) = telemetry.memory_peak_gib.zip(telemetry.memory_total_gib)?;
    peak.checked_div(total).map(|share| share.min(Decimal::ONE))
}

/// The telemetry a rated segment carries: its record's averages and memory share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentTelemetry {
    pub gpu_util: Option<Decimal>,
    pub sm_active: Option<Decimal>,
    pub tensor_active: Option<Decimal>,
    pub dram_active: Option<Decimal>,
    pub memory_used_share: Option<Decimal>,
}

impl SegmentTelemetry {
    pub fn of(telemetry: &Telemetry) -> Self {
        Self {
            gpu_util: telemetry.gpu_util,
            sm_active: telemetry.sm_active,
            tensor_active: telemetry.tensor_active,
            dram_active: telemetry.dram_active,
            memory_used_share: memory_used_share(telemetry),
        }
    }
}

/// GPU-seconds held by the segments that report a metric, and Σ held × metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricSums {
    pub held: Decimal,
    pub weighted: Decimal,
}

impl MetricSums {
    fn add(&mut self, other: &MetricSums) {
        self.held += other.held;
        self.weighted += other.weighted;
    }

    /// The held-weighted average, `None` where nothing reported it.
    pub fn average(&self) -> Option<Decimal> {
        (!self.held.is_zero()).then(|| (self.weighted / self.held).round_dp(SHARE_SCALE))
    }

    /// The share of `held` that reported it.
    pub fn coverage(&self, held: Decimal) -> Option<Decimal> {
        (!held.is_zero()).then(|| (self.held / held).round_dp(SHARE_SCALE))
    }
}

/// The utilisation sums of a group; [`UtilSums::merge`] adds groups exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UtilSums {
    pub gpu_util: MetricSums,
    pub sm_active: MetricSums,
    pub tensor_active: MetricSums,
    pub dram_active: MetricSums,
    /// Weighted by memory_peak / memory_total.
    pub memory_used: MetricSums,
    pub looks_busy_cost: Decimal,
    pub unused_memory_cost: Decimal,
}

impl UtilSums {
    pub fn merge(&mut self, other: &UtilSums) {
        self.gpu_util.add(&other.gpu_util);
        self.sm_active.add(&other.sm_active);
        self.tensor_active.add(&other.tensor_active);
        self.dram_active.add(&other.dram_active);
        self.memory_used.add(&other.memory_used);
        self.looks_busy_cost += other.looks_busy_cost;
        self.unused_memory_cost += other.unused_memory_cost;
    }

    /// Whether any segment reported some telemetry.
    fn reported(&self) -> bool {
        [
            &self.gpu_util,
            &self.sm_active,
            &self.tensor_active,
            &self.dram_active,
            &self.memory_used,
        ]
        .iter()
        .any(|metric| !metric.held.is_zero())
    }

    /// GPU-seconds of memory held and not used: Σ held × (1 − peak / total); `None` where
    /// no segment reported its memory.
    pub fn unused_memory_gpu_seconds(&self) -> Option<Decimal> {
        (!self.memory_used.held.is_zero())
            .then(|| (self.memory_used.held - self.memory_used.weighted).normalize())
    }

    /// Σ cost × (1 − peak / total), `None` where no segment reported its memory.
    pub fn unused_memory_cost(&self) -> Option<Decimal> {
        (!self.memory_used.held.is_zero()).then(|| self.unused_memory_cost.normalize())
    }

    /// The cost that looks busy, `None` unless some segments reported both GPU-Util and SM
    /// activity (a segment reporting one of them only never looks busy).
    pub fn looks_busy_cost(&self) -> Option<Decimal> {
        (!self.gpu_util.held.is_zero() && !self.sm_active.held.is_zero())
            .then(|| self.looks_busy_cost.normalize())
    }

    /// The figures of a group that held `held` GPU-seconds in all; `None` where no segment
    /// reported any telemetry.
    pub fn utilisation(&self, held: Decimal) -> Option<Utilisation> {
        if !self.reported() {
            return None;
        }
        let metrics = [
            &self.gpu_util,
            &self.sm_active,
            &self.tensor_active,
            &self.dram_active,
            &self.memory_used,
        ];
        let [
            gpu_util,
            sm_active,
            tensor_active,
            dram_active,
            memory_used_share,
        ] = metrics.map(MetricSums::average);
        let [c_gpu, c_sm, c_tensor, c_dram, c_memory] = metrics.map(|m| m.coverage(held));
        Some(Utilisation {
            gpu_util,
            sm_active,
            tensor_active,
            dram_active,
            memory_used_share,
            coverage: Coverage {
                gpu_util: c_gpu,
                sm_active: c_sm,
                tensor_active: c_tensor,
                dram_active: c_dram,
                memory_used_share: c_memory,
            },
        })
    }
}

/// Held-weighted averages of a group, each `None` where no record reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Utilisation {
    pub gpu_util: Option<Decimal>,
    pub sm_active: Option<Decimal>,
    pub tensor_active: Option<Decimal>,
    pub dram_active: Option<Decimal>,
    /// Memory peak / memory total.
    pub memory_used_share: Option<Decimal>,
    /// The share of the group's held GPU-seconds that reported each figure.
    pub coverage: Coverage,
}

/// The share of the held GPU-seconds whose records reported each figure, from 0 to 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Coverage {
    pub gpu_util: Option<Decimal>,
    pub sm_active: Option<Decimal>,
    pub tensor_active: Option<Decimal>,
    pub dram_active: Option<Decimal>,
    pub memory_used_share: Option<Decimal>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dec(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    #[test]
    fn busy_comes_from_sm_activity_only_when_not_reported() {
        assert_eq!(
            busy_seconds(None, dec("7200"), Some(dec("0.38"))),
            Some(dec("2736"))
        );
        assert_eq!(
            busy_seconds(Some(dec("100")), dec("7200"), Some(dec("0.38"))),
            Some(dec("100"))
        );
        assert_eq!(busy_seconds(None, dec("7200"), None), None);
    }

    fn metric(held: &str, value: &str) -> MetricSums {
        MetricSums {
            held: dec(held),
            weighted: dec(held) * dec(value),
        }
    }

    #[test]
    fn averages_are_weighted_by_held_time_over_the_records_that_report_them() {
        // 3600 s at GPU-Util 0.9 and SM 0.3, 1800 s at GPU-Util 0.6 without SM, 1800 s bare.
        let mut sums = UtilSums {
            gpu_util: metric("3600", "0.9"),
            sm_active: metric("3600", "0.3"),
            ..UtilSums::default()
        };
        sums.merge(&UtilSums {
            gpu_util: metric("1800", "0.6"),
            ..UtilSums::default()
        });
        let u = sums.utilisation(dec("7200")).unwrap();
        assert_eq!(u.gpu_util, Some(dec("0.8")));
        assert_eq!(u.coverage.gpu_util, Some(dec("0.75")));
        assert_eq!(u.sm_active, Some(dec("0.3")));
        assert_eq!(u.coverage.sm_active, Some(dec("0.5")));
        assert_eq!(u.tensor_active, None);
        assert_eq!(u.coverage.tensor_active, Some(dec("0")));
    }

    #[test]
    fn a_whole_80_gb_card_held_for_a_20_gb_job_wastes_three_quarters_of_its_memory() {
        let t = Telemetry {
            memory_peak_gib: Some(dec("20")),
            memory_total_gib: Some(dec("80")),
            ..Telemetry::default()
        };
        let share = SegmentTelemetry::of(&t).memory_used_share.unwrap();
        let sums = UtilSums {
            memory_used: metric("3600", &share.to_string()),
            ..UtilSums::default()
        };
        assert_eq!(sums.unused_memory_gpu_seconds(), Some(dec("2700")));
        assert_eq!(UtilSums::default().utilisation(dec("3600")), None);
    }

    proptest! {
        /// Merging the sums of groups in any order gives the sums of the whole, and the
        /// unused memory stays within the memory held.
        #[test]
        fn groups_merge_exactly_into_the_whole(
            segments in prop::collection::vec(
                (1u32..100_000, 0u32..=1000, 0u32..=1000, 0usize..4), 1..40)
        ) {
            let mut whole = UtilSums::default();
            let mut groups = [UtilSums::default(); 4];
            for (held, util, used, group) in segments {
                let held = Decimal::from(held);
                let sums = UtilSums {
                    gpu_util: MetricSums { held, weighted: held * Decimal::new(util.into(), 3) },
                    memory_used: MetricSums { held, weighted: held * Decimal::new(used.into(), 3) },
                    looks_busy_cost: Decimal::new(util.into(), 2),
                    ..UtilSums::default()
                };
                whole.merge(&sums);
                groups[group].merge(&sums);
            }
            let mut merged = UtilSums::default();
            for group in groups.iter().rev() {
                merged.merge(group);
            }
            prop_assert_eq!(merged, whole);
            let unused = whole.unused_memory_gpu_seconds().unwrap();
            prop_assert!(unused >= Decimal::ZERO && unused <= whole.memory_used.held);
            let average = whole.gpu_util.average().unwrap();
            prop_assert!(average >= Decimal::ZERO && average <= Decimal::ONE);
        }
    }
}
