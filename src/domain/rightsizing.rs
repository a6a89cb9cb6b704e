//! Right-sizing (COST_MODEL.md §8): which workloads on whole GPUs would fit a MIG slice of
//! the card or a cheaper GPU model, and what that would have saved.
//!
//! A workload's need is read from the records of a period that report telemetry: the 95th
//! percentile, by nearest rank (PostgreSQL's `percentile_disc`), of the memory peak and of
//! the SM activity, each with [`HEADROOM`] on top. The rule then prefers, in this order:
//!
//! 1. the smallest MIG profile of the card short of the whole card (fewest compute slices,
//!    then least memory) whose memory and compute share `g/7` both cover the need; it costs
//!    `g/7` of the card, so the saving is `cost × (1 − g/7)`;
//! 2. else the GPU model that would have cost least, among the models whose memory covers
//!    the need and whose contracts price all of the workload's GPU time for less than it
//!    cost; the saving is the difference, i.e. `cost × (1 − price ratio)`.
//!
//! Compute across models is not compared (SM activity of one chip says little of another),
//! and with no record reporting SM activity only memory is compared; both are said in the
//! recommendation's assumption, as is that the run time is taken to stay the same.

use chrono::NaiveDate;
use chrono_tz::Tz;
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;

use super::figures::SUM_SCALE;
use super::gpu::{COMPUTE_SLICES, GpuSpec, MigProfile};
use super::rating::{Contract, FxRates, RecordToRate, rate_record};
use super::utilisation::SHARE_SCALE;

/// What a recommendation must leave free on top of the p95 need: 20 %.
pub const HEADROOM: Decimal = Decimal::from_parts(12, 0, 0, false, 1);

/// The percentile of the memory peaks and SM activity a recommendation must cover.
pub const PERCENTILE: Decimal = Decimal::from_parts(95, 0, 0, false, 2);

/// Records reporting their memory peak that a workload needs before it is judged.
pub const MIN_MEMORY_REPORTS: usize = 3;

/// The `p`-th percentile of `values` by nearest rank: the ⌈p × n⌉-th smallest (the first
/// for a tiny `p`), always one of the values; `None` for no values.
pub fn nearest_rank(values: &[Decimal], p: Decimal) -> Option<Decimal> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let rank = (p * Decimal::from(n)).ceil().to_usize().unwrap_or(n);
    sorted.get(rank.clamp(1, n.max(1)) - 1).copied()
}

/// What one record of a workload reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub memory_peak_gib: Option<Decimal>,
    pub sm_active: Option<Decimal>,
}

/// What a workload needs: the p95 of its memory peaks and of its SM activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub memory_peak_p95_gib: Decimal,
    /// `None` when no record reported SM activity.
    pub sm_active_p95: Option<Decimal>,
}

impl Need {
    /// The need of a workload's records, or why they are too few to judge.
    pub fn of(samples: &[Sample]) -> Result<Need, Skip> {
        let peaks: Vec<Decimal> = samples.iter().filter_map(|s| s.memory_peak_gib).collect();
        if peaks.len() < MIN_MEMORY_REPORTS {
            return Err(Skip::TooLittleTelemetry {
                reported: peaks.len(),
            });
        }
        let sm: Vec<Decimal> = samples.iter().filter_map(|s| s.sm_active).collect();
        Ok(Need {
            memory_peak_p95_gib: nearest_rank(&peaks, PERCENTILE).expect("at least 3 peaks"),
            sm_active_p95: nearest_rank(&sm, PERCENTILE),
        })
    }

    /// The memory a recommendation must have: the p95 peak with headroom.
    pub fn memory_gib(&self) -> Decimal {
        self.memory_peak_p95_gib * HEADROOM
    }

    /// The share of a card's compute a slice must have: p95 SM activity with headroom.
    pub fn compute_share(&self) -> Option<Decimal> {
        self.sm_active_p95.map(|sm| sm * HEADROOM)
    }

    /// Whether a slice covers the need. Compared as `g ≥ 7 × share` so that no seventh is
    /// rounded.
    pub fn fits_profile(&self, profile: &MigProfile) -> bool {
        let memory = Decimal::from(profile.memory_gib) >= self.memory_gib();
        let compute = self.compute_share().is_none_or(|share| {
            Decimal::from(profile.slices) >= share * Decimal::from(COMPUTE_SLICES)
        });
        memory && compute
    }
}

/// Another GPU model the workload's GPU time could have run on, with what that time would
/// have cost on its contracts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternative {
    pub gpu_model: String,
    pub memory_gib: u32,
    pub cost: Decimal,
}

/// What to run the workload on instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recommendation {
    Mig(MigProfile),
    GpuModel(Alternative),
}

/// A recommendation with its price share and the estimated saving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub recommendation: Recommendation,
    /// What the recommendation costs as a share of what the workload cost (to
    /// [`SHARE_SCALE`] places): `g/7` for a slice, the price ratio for a model.
    pub share: Decimal,
    /// cost × (1 − share), computed without rounding the share.
    pub saving: Decimal,
}

impl Advice {
    /// What the estimate assumes, in words, for a workload on `gpu_model` needing `need`.
    pub fn assumption(&self, gpu_model: &str, need: &Need) -> String {
        match &self.recommendation {
            Recommendation::Mig(profile) => {
                let mut said = format!(
                    "Assumes the same run time on one {} slice per GPU as on whole {gpu_model} \
                     GPUs, the slice priced at {}/{COMPUTE_SLICES} of the card's contract.",
                    profile.name(),
                    profile.slices
                );
                if need.sm_active_p95.is_none() {
                    said.push_str(
                        " No record reported SM activity, so only memory was compared: check \
                         that the slice's compute suffices.",
                    );
                }
                said
            }
            Recommendation::GpuModel(model) => format!(
                "Assumes the same run time on the {} as on the {gpu_model}, priced by the {} \
                 contracts rating would choose for this GPU time. Only memory was compared: \
                 SM activity on one model says little of another.",
                model.gpu_model, model.gpu_model
            ),
        }
    }
}

/// Why a workload gets no recommendation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Fewer than [`MIN_MEMORY_REPORTS`] records reported their memory peak.
    TooLittleTelemetry { reported: usize },
    /// Neither a slice nor a cheaper model covers the need.
    NothingFits {
        need: Need,
        /// The catalogue's name of the card, with whether it has MIG profiles.
        card: Option<(&'static str, bool)>,
    },
}

impl Skip {
    /// The reason, in words.
    pub fn reason(&self) -> String {
        match self {
            Skip::TooLittleTelemetry { reported } => format!(
                "{reported} of its records reported memory_peak_gib; at least \
                 {MIN_MEMORY_REPORTS} are needed to judge its size"
            ),
            Skip::NothingFits { need, card } => {
                let mut wanted = format!(
                    "{} GiB of memory (p95 peak {} GiB + 20 %)",
                    need.memory_gib().normalize(),
                    need.memory_peak_p95_gib.normalize()
                );
                if let (Some(share), Some(sm)) = (need.compute_share(), need.sm_active_p95) {
                    wanted.push_str(&format!(
                        " and {} of the card's compute (p95 SM active {} + 20 %)",
                        share.normalize(),
                        sm.normalize()
                    ));
                }
                let slices = match card {
                    Some((name, true)) => {
                        format!("no MIG profile of the {name} short of the whole card has that")
                    }
                    Some((name, false)) => format!("the {name} has no MIG profiles"),
                    None => "the GPU model is not in the catalogue of MIG cards".to_owned(),
                };
                format!(
                    "needs {wanted}: {slices}, and no cheaper GPU model with a contract for \
                     this GPU time has enough memory"
                )
            }
        }
    }
}

/// The recommendation for a workload that needs `need` and cost `cost` in the period on
/// `card` (its catalogue entry, if any), given the other models its time could have run on.
pub fn recommend(
    need: &Need,
    card: Option<&GpuSpec>,
    cost: Decimal,
    alternatives: &[Alternative],
) -> Result<Advice, Skip> {
    let profile = card.and_then(|card| {
        let mut fitting: Vec<&MigProfile> = card
            .mig_profiles
            .iter()
            .filter(|profile| profile.slices < COMPUTE_SLICES && need.fits_profile(profile))
            .collect();
        fitting.sort_by_key(|profile| (profile.slices, profile.memory_gib));
        fitting.first().copied().copied()
    });
    if let Some(profile) = profile {
        let share = profile.compute_share();
        return Ok(Advice {
            recommendation: Recommendation::Mig(profile),
            share: share.as_decimal().round_dp(SHARE_SCALE),
            saving: (cost - share.of(cost)).round_dp(SUM_SCALE).normalize(),
        });
    }
    let cheapest = alternatives
        .iter()
        .filter(|model| Decimal::from(model.memory_gib) >= need.memory_gib())
        .filter(|model| model.cost >= Decimal::ZERO && model.cost < cost)
        .min_by(|a, b| {
            (a.cost, a.memory_gib, &a.gpu_model).cmp(&(b.cost, b.memory_gib, &b.gpu_model))
        });
    match cheapest {
        Some(model) => Ok(Advice {
            share: (model.cost / cost).round_dp(SHARE_SCALE),
            saving: (cost - model.cost).normalize(),
            recommendation: Recommendation::GpuModel(model.clone()),
        }),
        None => Err(Skip::NothingFits {
            need: *need,
            card: card.map(|card| (card.name, !card.mig_profiles.is_empty())),
        }),
    }
}

/// What `records` would have cost in the ledger month `month` had they run on `gpu_model`,
/// priced as rating prices them (the contract of that model and of each record's billing
/// mode that rating would choose, project scope first; FX at the month's rate). `None` when
/// some of their GPU time in the month would find no contract or FX rate.
pub fn cost_on_model(
    records: &[RecordToRate],
    gpu_model: &str,
    month: NaiveDate,
    contracts: &[Contract],
    fx: &impl FxRates,
    tz: Tz,
) -> Option<Decimal> {
    let mut total = Decimal::ZERO;
    for record in records {
        let moved = RecordToRate {
            gpu_model: gpu_model.to_owned(),
            compute_share: None,
            ..record.clone()
        };
        for segment in rate_record(&moved, contracts, fx, tz) {
            if segment.month == month {
                total += segment.cost?;
            }
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use chrono::{DateTime, Utc};
    use proptest::prelude::*;
    use uuid::Uuid;

    use super::*;
    use crate::domain::gpu::{catalogue, lookup};
    use crate::domain::rating::{BillingMode, Outcome};

    fn dec(raw: &str) -> Decimal {
        Decimal::from_str(raw).unwrap()
    }

    fn need(memory: &str, sm: Option<&str>) -> Need {
        Need {
            memory_peak_p95_gib: dec(memory),
            sm_active_p95: sm.map(dec),
        }
    }

    fn samples(peaks: &[&str], sm: &[&str]) -> Vec<Sample> {
        (0..peaks.len().max(sm.len()))
            .map(|i| Sample {
                memory_peak_gib: peaks.get(i).map(|p| dec(p)),
                sm_active: sm.get(i).map(|s| dec(s)),
            })
            .collect()
    }

    #[test]
    fn the_95th_percentile_is_the_nearest_rank() {
        let values: Vec<Decimal> = (1..=20).rev().map(Decimal::from).collect();
        // ⌈0.95 × 20⌉ = 19th smallest.
        assert_eq!(nearest_rank(&values, PERCENTILE), Some(Decimal::from(19)));
        // ⌈0.95 × 3⌉ = 3: of three values, the largest.
        let three = [dec("20"), dec("18"), dec("19")];
        assert_eq!(nearest_rank(&three, PERCENTILE), Some(dec("20")));
        assert_eq!(nearest_rank(&three, dec("0.5")), Some(dec("19")));
        assert_eq!(nearest_rank(&[], PERCENTILE), None);
    }

    #[test]
    fn a_20_gb_inference_job_at_30_percent_sm_fits_a_3g_40gb_slice_of_an_h100() {
        let h100 = lookup("H100").unwrap();
        let need = Need::of(&samples(&["18", "20", "19"], &["0.3", "0.25"])).unwrap();
        assert_eq!(need, self::need("20", Some("0.3")));
        // 20 × 1.2 = 24 GiB and 0.3 × 1.2 = 0.36 ≤ 3/7: 1g.10gb, 1g.20gb and 2g.20gb have
        // too little memory (and 1 or 2 sevenths too little compute).
        let advice = recommend(&need, Some(h100), dec("7.00"), &[]).unwrap();
        assert_eq!(
            advice.recommendation,
            Recommendation::Mig(MigProfile {
                slices: 3,
                memory_gib: 40
            })
        );
        assert_eq!(advice.share, dec("0.428571"));
        assert_eq!(advice.saving, dec("4"));
        assert_eq!(
            advice.assumption("H100", &need),
            "Assumes the same run time on one 3g.40gb slice per GPU as on whole H100 GPUs, the \
             slice priced at 3/7 of the card's contract."
        );
    }

    #[test]
    fn compute_decides_when_memory_is_small() {
        let h100 = lookup("H100").unwrap();
        // 8 GiB fits 1g.10gb, but SM 0.5 × 1.2 = 0.6 needs 5 sevenths: only 7g has them.
        let advice = recommend(&need("8", Some("0.5")), Some(h100), dec("7"), &[]);
        assert!(matches!(advice, Err(Skip::NothingFits { .. })));
        // At 0.4 × 1.2 = 0.48 (> 3/7), 4g.40gb.
        let advice = recommend(&need("8", Some("0.4")), Some(h100), dec("7"), &[]).unwrap();
        assert_eq!(
            advice.recommendation,
            Recommendation::Mig(MigProfile {
                slices: 4,
                memory_gib: 40
            })
        );
        // Without SM activity only memory counts: 1g.10gb.
        let advice = recommend(&need("8", None), Some(h100), dec("7"), &[]).unwrap();
        assert_eq!(
            advice.recommendation,
            Recommendation::Mig(MigProfile {
                slices: 1,
                memory_gib: 10
            })
        );
        assert_eq!(advice.saving, dec("6"));
    }

    #[test]
    fn a_70_gb_training_job_fits_no_slice_of_an_80_gb_card() {
        let h100 = lookup("H100").unwrap();
        let need = need("70", Some("0.9"));
        let skip = recommend(&need, Some(h100), dec("100"), &[]).unwrap_err();
        assert_eq!(
            skip.reason(),
            "needs 84 GiB of memory (p95 peak 70 GiB + 20 %) and 1.08 of the card's compute \
             (p95 SM active 0.9 + 20 %): no MIG profile of the H100 80GB short of the whole \
             card has that, and no cheaper GPU model with a contract for this GPU time has \
             enough memory"
        );
    }

    #[test]
    fn too_few_memory_reports_are_not_judged() {
        let skip = Need::of(&samples(&["20", "20"], &["0.1", "0.1", "0.1"])).unwrap_err();
        assert_eq!(skip, Skip::TooLittleTelemetry { reported: 2 });
        assert!(
            skip.reason()
                .starts_with("2 of its records reported memory_peak_gib")
        );
    }

    #[test]
    fn without_a_slice_the_cheapest_model_with_enough_memory_is_chosen() {
        let h100 = lookup("H100").unwrap();
        let need = need("30", Some("0.8"));
        let alternatives = [
            Alternative {
                gpu_model: "L4".into(),
                memory_gib: 24,
                cost: dec("20"),
            },
            Alternative {
                gpu_model: "L40S".into(),
                memory_gib: 48,
                cost: dec("55"),
            },
            Alternative {
                gpu_model: "A100-80GB".into(),
                memory_gib: 80,
                cost: dec("60"),
            },
            Alternative {
                gpu_model: "H200".into(),
                memory_gib: 141,
                cost: dec("130"),
            },
        ];
        let advice = recommend(&need, Some(h100), dec("100"), &alternatives).unwrap();
        // L4 is cheapest but 24 GiB < 36 GiB.
        assert_eq!(
            advice.recommendation,
            Recommendation::GpuModel(alternatives[1].clone())
        );
        assert_eq!(advice.share, dec("0.55"));
        assert_eq!(advice.saving, dec("45"));
        // A model that is dearer is never a saving.
        let dearer = recommend(&need, Some(h100), dec("100"), &alternatives[3..]);
        assert!(dearer.is_err());
    }

    fn utc(raw: &str) -> DateTime<Utc> {
        raw.parse().unwrap()
    }

    fn contract(id: u128, model: &str, price: &str, project: Option<&str>) -> Contract {
        Contract {
            id: Uuid::from_u128(id),
            gpu_model: model.into(),
            billing_mode: BillingMode::OnDemand,
            project: project.map(Into::into),
            provider: None,
            region: None,
            valid_from: utc("2026-01-01T00:00:00Z"),
            valid_until: None,
            price_per_gpu_hour: dec(price),
            currency: "USD".into(),
            committed_gpus: None,
            power_price_per_gpu_hour: Decimal::ZERO,
            energy_price_per_kwh: Decimal::ZERO,
        }
    }

    #[test]
    fn a_models_cost_is_priced_by_the_contract_rating_would_choose() {
        let record = RecordToRate {
            project: "vision".into(),
            gpu_model: "H100".into(),
            billing_mode: BillingMode::OnDemand,
            provider: None,
            region: None,
            currency: "USD".into(),
            // Two hours of November and one of December, on 2 GPUs.
            started_at: utc("2026-11-30T22:00:00Z"),
            ended_at: utc("2026-12-01T01:00:00Z"),
            gpu_seconds_held: dec("21600"),
            gpu_seconds_busy: None,
            outcome: Outcome::Completed,
            compute_share: None,
            energy_joules: None,
        };
        let contracts = [
            contract(1, "L40S", "1.50", None),
            contract(2, "L40S", "1.10", Some("vision")),
            contract(3, "L40S", "0.50", Some("other")),
        ];
        let november = NaiveDate::from_ymd_opt(2026, 11, 1).unwrap();
        let no_fx = |_: NaiveDate, _: &str, _: &str| None;
        // 4 GPU-hours in November at the project's 1.10.
        assert_eq!(
            cost_on_model(
                std::slice::from_ref(&record),
                "L40S",
                november,
                &contracts,
                &no_fx,
                chrono_tz::UTC
            ),
            Some(dec("4.40"))
        );
        assert_eq!(
            cost_on_model(
                &[record],
                "L4",
                november,
                &contracts,
                &no_fx,
                chrono_tz::UTC
            ),
            None,
            "no L4 contract"
        );
    }

    fn mig_cards() -> Vec<&'static GpuSpec> {
        catalogue()
            .filter(|card| !card.mig_profiles.is_empty())
            .collect()
    }

    proptest! {
        /// Whatever is recommended covers the need with headroom, is the smallest slice that
        /// does, is never the whole card, and saves no more than the cost and never less
        /// than nothing.
        #[test]
        fn a_recommendation_fits_with_headroom_and_saves_part_of_the_cost(
            card in 0usize..7,
            peak in 0u32..200_000,
            sm in prop::option::of(0u32..=1000),
            cost in 0u64..10_000_000,
            others in prop::collection::vec((1u32..200, 0u64..20_000_000), 0..4),
        ) {
            let card = mig_cards()[card % mig_cards().len()];
            let need = Need {
                memory_peak_p95_gib: Decimal::new(peak.into(), 3),
                sm_active_p95: sm.map(|sm| Decimal::new(sm.into(), 3)),
            };
            let cost = Decimal::new(cost as i64, 2);
            let alternatives: Vec<Alternative> = others
                .iter()
                .enumerate()
                .map(|(i, (memory, other))| Alternative {
                    gpu_model: format!("M{i}"),
                    memory_gib: *memory,
                    cost: Decimal::new(*other as i64, 2),
                })
                .collect();
            match recommend(&need, Some(card), cost, &alternatives) {
                Ok(advice) => {
                    prop_assert!(advice.saving >= Decimal::ZERO && advice.saving <= cost);
                    match &advice.recommendation {
                        Recommendation::Mig(profile) => {
                            prop_assert!(profile.slices < COMPUTE_SLICES);
                            prop_assert!(Decimal::from(profile.memory_gib) >= need.memory_peak_p95_gib * HEADROOM);
                            if let Some(sm) = need.sm_active_p95 {
                                prop_assert!(Decimal::from(profile.slices) / Decimal::from(7) >= sm * HEADROOM - Decimal::new(1, 20));
                            }
                            let smaller_fits = card.mig_profiles.iter().any(|other| {
                                (other.slices, other.memory_gib) < (profile.slices, profile.memory_gib)
                                    && need.fits_profile(other)
                            });
                            prop_assert!(!smaller_fits);
                            prop_assert_eq!(advice.saving, (cost * Decimal::from(7 - profile.slices) / Decimal::from(7)).round_dp(SUM_SCALE).normalize());
                        }
                        Recommendation::GpuModel(model) => {
                            prop_assert!(Decimal::from(model.memory_gib) >= need.memory_peak_p95_gib * HEADROOM);
                            prop_assert!(model.cost < cost);
                            prop_assert!(advice.saving > Decimal::ZERO);
                            prop_assert!(!card.mig_profiles.iter().any(|p| p.slices < COMPUTE_SLICES && need.fits_profile(p)));
                        }
                    }
                }
                Err(skip) => {
                    let slice_fits = card.mig_profiles.iter().any(|p| p.slices < COMPUTE_SLICES && need.fits_profile(p));
                    let model_fits = alternatives.iter().any(|m| {
                        Decimal::from(m.memory_gib) >= need.memory_gib() && m.cost < cost
                    });
                    prop_assert!(!slice_fits && !model_fits, "{skip:?}");
                }
            }
        }

        /// The nearest-rank percentile is one of the values, with at least 95 % of them at or
        /// below it and fewer than 95 % strictly below.
        #[test]
        fn the_percentile_is_a_value_with_95_percent_at_or_below_it(
            values in prop::collection::vec(0u32..1000, 1..200),
        ) {
            let values: Vec<Decimal> = values.into_iter().map(Decimal::from).collect();
            let p95 = nearest_rank(&values, PERCENTILE).unwrap();
            prop_assert!(values.contains(&p95));
            let n = Decimal::from(values.len());
            let at_or_below = values.iter().filter(|v| **v <= p95).count();
            let below = values.iter().filter(|v| **v < p95).count();
            prop_assert!(Decimal::from(at_or_below) >= PERCENTILE * n);
            prop_assert!(Decimal::from(below) < PERCENTILE * n);
        }
    }
}
