//! What Slurm measured of a job's GPUs, as the record's telemetry fields: `gres/gpuutil` as
//! `gpu_util`, `gres/gpumem` as `memory_peak_gib`, and a MIG slice's type as `mig_profile`.
//! A figure that cannot be right (a peak above 100 % per GPU, more memory than the GPU or
//! slice has) or a profile the catalogue does not know is left out with its reason, and the
//! job is stored without it: one odd job never stops a batch.
//!
//! The job's energy is `energy_joules`: the allocation's `energy` TRES (ConsumedEnergyRaw,
//! joules). Slurm's energy plugin measures nodes, not jobs: `acct_gather_energy/ipmi` the
//! node's power from its BMC, `acct_gather_energy/rapl` its CPU packages and DRAM, and
//! `acct_gather_energy/gpu` its GPUs (only the job's own where cgroups constrain devices,
//! else all of the node's). Each step's energy is what its nodes used while it ran, and the
//! job's is the sum of its steps' (only the extern step's with `PrologFlags=Contain`). That
//! figure is taken as the record's energy, as sacct reports it: Slurm's documentation warns
//! that only for an exclusive allocation is it the job's real consumption, and on a node
//! shared with other jobs it is the node's.
//!
//! A 0 is taken for nothing measured, not a measurement: sacct prints 0 for every job where
//! no energy plugin is configured, and a plugin that samples every 30 s or so accounts 0 to
//! a job shorter than its interval. A job that ran drew energy, so a 0 would only ever
//! understate it, and is better left empty. A MIG slice's record leaves the figure out (a
//! node's or card's energy is not the slice's), counted with its reason, as is a
//! ConsumedEnergy rounded to a unit prefix.

use rust_decimal::Decimal;

use crate::domain::gpu::{self, MigProfile};
use crate::domain::record::MAX_MEMORY_GIB;
use crate::sources::batch::LeftOut;

use super::tres::{Energy, GpuUsage};

/// Why a MIG type's profile is left out.
pub const MIG_UNKNOWN_MODEL: LeftOut = LeftOut {
    field: "mig_profile",
    reason: "a slice of a GPU model the catalogue does not know",
};
pub const MIG_UNKNOWN_PROFILE: LeftOut = LeftOut {
    field: "mig_profile",
    reason: "not a MIG profile the catalogue knows for the model",
};
/// Why a GPU-Util peak is left out.
pub const UTIL_ABOVE_FULL: LeftOut = LeftOut {
    field: "gpu_util",
    reason: "above 100 % per GPU",
};
/// Why a memory peak is left out.
pub const MEMORY_ABOVE_TOTAL: LeftOut = LeftOut {
    field: "memory_peak_gib",
    reason: "above the memory of the GPU or slice",
};
pub const MEMORY_ABOVE_LIMIT: LeftOut = LeftOut {
    field: "memory_peak_gib",
    reason: "above the most a record allows per GPU",
};

/// Why a job's energy is left out.
pub const ENERGY_OF_MIG_SLICE: LeftOut = LeftOut {
    field: "energy_joules",
    reason: "a MIG slice: Slurm measures the whole card or node",
};
pub const ENERGY_ROUNDED: LeftOut = LeftOut {
    field: "energy_joules",
    reason: "ConsumedEnergy rounded to a unit prefix by sacct; ask for ConsumedEnergyRaw",
};

/// Decimal places of a figure divided by the GPU count: a hundredth of a percent, and about
/// a KiB.
const UTIL_PLACES: u32 = 4;
const MEMORY_PLACES: u32 = 6;

/// The telemetry fields of a record, each `None` where Slurm did not measure it or it was
/// left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Telemetry {
    pub gpu_util: Option<Decimal>,
    pub memory_peak_gib: Option<Decimal>,
    /// The catalogue's name of the profile (`3g.20gb`).
    pub mig_profile: Option<String>,
}

/// The telemetry of a job on `count` GPUs of `model`, or slices of it where `profile` names
/// a MIG profile, and what was left out.
pub fn telemetry(
    model: &str,
    profile: Option<&str>,
    count: u64,
    usage: &GpuUsage,
) -> (Telemetry, Vec<LeftOut>) {
    let mut left_out = Vec::new();
    let profile = match mig_profile(model, profile) {
        Ok(profile) => profile,
        Err(reason) => {
            left_out.push(reason);
            None
        }
    };
    // The memory a peak is compared with: the slice's, else the card's, else none known.
    let total = match profile {
        Some(profile) => Some(Decimal::from(profile.memory_gib)),
        None => gpu::lookup(model).map(|spec| Decimal::from(spec.memory_gib)),
    };
    let mut keep =
        |figure: Result<Decimal, LeftOut>| figure.map_err(|reason| left_out.push(reason)).ok();
    let gpu_util = usage
        .gpu_util
        .and_then(|percent| keep(gpu_util(percent, count)));
    let memory_peak_gib = usage
        .memory_bytes
        .and_then(|bytes| keep(memory_peak_gib(bytes, count, total)));
    let telemetry = Telemetry {
        gpu_util,
        memory_peak_gib,
        mig_profile: profile.map(|profile| profile.name()),
    };
    (telemetry, left_out)
}

/// The record's `energy_joules` of a job's accounted energy: `Ok(None)` where nothing was
/// measured; left out on a MIG slice (`mig`) and where only a rounded figure was given.
pub fn energy_joules(energy: Energy, mig: bool) -> Result<Option<Decimal>, LeftOut> {
    match energy {
        Energy::Unmeasured => Ok(None),
        _ if mig => Err(ENERGY_OF_MIG_SLICE),
        Energy::Rounded => Err(ENERGY_ROUNDED),
        Energy::Joules(joules) => Ok(Some(joules)),
    }
}

/// The catalogue's profile of a MIG-typed allocation; `Ok(None)` for whole GPUs.
pub fn mig_profile(model: &str, profile: Option<&str>) -> Result<Option<MigProfile>, LeftOut> {
    let Some(raw) = profile else {
        return Ok(None);
    };
    let spec = gpu::lookup(model).ok_or(MIG_UNKNOWN_MODEL)?;
    spec.profile(raw).map(Some).map_err(|_| MIG_UNKNOWN_PROFILE)
}

/// `gres/gpuutil` (percent) as a share: value / 100. Above 1 on several GPUs it is a sum over
/// them (Slurm 24.05 and later) and is divided by the count; above 1 after that it is left
/// out.
pub fn gpu_util(percent: Decimal, count: u64) -> Result<Decimal, LeftOut> {
    let mut share = percent / Decimal::ONE_HUNDRED;
    if share > Decimal::ONE && count > 1 {
        share = (share / Decimal::from(count)).round_dp(UTIL_PLACES);
    }
    if share > Decimal::ONE {
        return Err(UTIL_ABOVE_FULL);
    }
    Ok(share.normalize())
}

/// `gres/gpumem` (bytes) in GiB: bytes / 2³⁰. Above the GPU's (or slice's) memory on several
/// GPUs it is a sum over them and is divided by the count; above it after that it is left
/// out. Without a known memory it is compared with the most a record allows per GPU.
pub fn memory_peak_gib(
    bytes: Decimal,
    count: u64,
    total: Option<Decimal>,
) -> Result<Decimal, LeftOut> {
    let (limit, reason) = match total {
        Some(total) => (total, MEMORY_ABOVE_TOTAL),
        None => (Decimal::from(MAX_MEMORY_GIB), MEMORY_ABOVE_LIMIT),
    };
    let mut gib = bytes.checked_div(Decimal::from(1u64 << 30)).ok_or(reason)?;
    if gib > limit && count > 1 {
        gib = (gib / Decimal::from(count)).round_dp(MEMORY_PLACES);
    }
    if gib > limit {
        return Err(reason);
    }
    Ok(gib.normalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    #[test]
    fn gpu_util_is_a_share_divided_when_it_was_summed() {
        assert_eq!(gpu_util(dec("87"), 1), Ok(dec("0.87")));
        assert_eq!(gpu_util(dec("100"), 1), Ok(Decimal::ONE));
        assert_eq!(gpu_util(dec("0"), 4), Ok(Decimal::ZERO));
        // At most 100 on several GPUs: could be a sum or not; kept as read (a peak at most).
        assert_eq!(gpu_util(dec("80"), 4), Ok(dec("0.8")));
        // 396 on 4 GPUs (Slurm 24.05 sums over the step's GPUs): 0.99 per GPU.
        assert_eq!(gpu_util(dec("396"), 4), Ok(dec("0.99")));
        assert_eq!(gpu_util(dec("200"), 3), Ok(dec("0.6667")));
        assert_eq!(gpu_util(dec("150"), 1), Err(UTIL_ABOVE_FULL));
        assert_eq!(gpu_util(dec("450"), 4), Err(UTIL_ABOVE_FULL));
    }

    #[test]
    fn memory_is_bytes_over_two_to_the_thirty_divided_when_it_was_summed() {
        let gib = |n: u64| Decimal::from(n << 30);
        assert_eq!(memory_peak_gib(gib(4), 2, Some(dec("20"))), Ok(dec("4")));
        assert_eq!(
            memory_peak_gib(Decimal::from(1648u64 << 20), 1, Some(dec("80"))),
            Ok(dec("1.609375")),
            "exact: 1648 MiB"
        );
        assert_eq!(memory_peak_gib(gib(80), 1, Some(dec("80"))), Ok(dec("80")));
        // 4 × 70 GiB on four 80 GiB cards: 70 per card.
        assert_eq!(memory_peak_gib(gib(280), 4, Some(dec("80"))), Ok(dec("70")));
        assert_eq!(
            memory_peak_gib(gib(100), 3, Some(dec("40"))),
            Ok(dec("33.333333"))
        );
        assert_eq!(
            memory_peak_gib(gib(81), 1, Some(dec("80"))),
            Err(MEMORY_ABOVE_TOTAL)
        );
        assert_eq!(
            memory_peak_gib(gib(400), 4, Some(dec("80"))),
            Err(MEMORY_ABOVE_TOTAL)
        );
        // No known memory: kept as read up to what a record allows.
        assert_eq!(memory_peak_gib(gib(500), 8, None), Ok(dec("500")));
        assert_eq!(memory_peak_gib(gib(8192), 4, None), Ok(dec("2048")));
        assert_eq!(memory_peak_gib(gib(8192), 1, None), Err(MEMORY_ABOVE_LIMIT));
    }

    #[test]
    fn energy_is_the_jobs_joules_except_on_a_slice_or_rounded() {
        let joules = Energy::Joules(dec("5400000"));
        assert_eq!(energy_joules(joules, false), Ok(Some(dec("5400000"))));
        assert_eq!(energy_joules(joules, true), Err(ENERGY_OF_MIG_SLICE));
        assert_eq!(energy_joules(Energy::Rounded, false), Err(ENERGY_ROUNDED));
        assert_eq!(
            energy_joules(Energy::Rounded, true),
            Err(ENERGY_OF_MIG_SLICE)
        );
        // Nothing measured is nothing to leave out, slice or not.
        assert_eq!(energy_joules(Energy::Unmeasured, true), Ok(None));
        assert_eq!(energy_joules(Energy::of_joules(0), false), Ok(None));
    }

    #[test]
    fn a_mig_profile_is_kept_only_when_the_catalogue_knows_it() {
        assert_eq!(mig_profile("a100", None), Ok(None));
        assert_eq!(
            mig_profile("a100", Some("3g.20gb")).map(|p| p.map(|p| p.name())),
            Ok(Some("3g.20gb".to_owned()))
        );
        assert_eq!(
            mig_profile("nvidia_h100_80gb_hbm3", Some("1g.10gb+me")).map(|p| p.map(|p| p.name())),
            Ok(Some("1g.10gb".to_owned()))
        );
        assert_eq!(
            mig_profile("a100", Some("1c.3g.20gb")),
            Err(MIG_UNKNOWN_PROFILE),
            "a compute instance is no GPU instance profile"
        );
        assert_eq!(
            mig_profile("a100", Some("3g.40gb")),
            Err(MIG_UNKNOWN_PROFILE),
            "an A100 40GB has no 3g.40gb"
        );
        assert_eq!(
            mig_profile("unknown", Some("3g.20gb")),
            Err(MIG_UNKNOWN_MODEL)
        );
        assert_eq!(mig_profile("a30", Some("1g.6gb")), Err(MIG_UNKNOWN_MODEL));
    }

    #[test]
    fn a_slice_compares_memory_with_the_slice_and_odd_figures_are_left_out() {
        let usage = GpuUsage {
            gpu_util: Some(dec("87")),
            memory_bytes: Some(Decimal::from(30u64 << 30)),
        };
        // 30 GiB on two 3g.20gb slices: a sum (15 each).
        let (t, left_out) = telemetry("a100", Some("3g.20gb"), 2, &usage);
        assert_eq!(left_out, vec![]);
        assert_eq!(t.mig_profile.as_deref(), Some("3g.20gb"));
        assert_eq!(t.gpu_util, Some(dec("0.87")));
        assert_eq!(t.memory_peak_gib, Some(dec("15")));
        // The same on one slice cannot be; on an unknown profile the card's 40 GiB apply.
        let (t, left_out) = telemetry("a100", Some("3g.20gb"), 1, &usage);
        assert_eq!(left_out, vec![MEMORY_ABOVE_TOTAL]);
        assert_eq!(t.memory_peak_gib, None);
        assert_eq!(t.gpu_util, Some(dec("0.87")));
        let (t, left_out) = telemetry("a100", Some("1c.3g.20gb"), 1, &usage);
        assert_eq!(left_out, vec![MIG_UNKNOWN_PROFILE]);
        assert_eq!((t.mig_profile, t.memory_peak_gib), (None, Some(dec("30"))));
        // Nothing measured, nothing set or left out.
        let (t, left_out) = telemetry("v100", None, 2, &GpuUsage::default());
        assert_eq!((t, left_out), (Telemetry::default(), vec![]));
    }
}
