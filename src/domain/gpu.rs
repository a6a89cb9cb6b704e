//! What the service knows of GPU models: each model's memory, and the MIG profiles of the
//! models that can be partitioned.
//!
//! Sources: the memory sizes and MIG profiles are those of NVIDIA's *Multi-Instance GPU User
//! Guide* (<https://docs.nvidia.com/datacenter/tesla/mig-user-guide/>, sections "Supported
//! GPUs" and "Supported MIG Profiles"); memory sizes of models without MIG are those of
//! NVIDIA's (and AMD's) product data sheets. Sizes are the nominal ones the profile names
//! and data sheets use, in GiB as `nvidia-smi` reports framebuffer memory.
//!
//! A profile is named `<g>g.<memory>gb`, optionally with `+me` (media extensions): `g` of
//! the card's 7 compute slices and that much memory. Drivers spell the memory of one profile
//! differently (`3g.39gb` and `3g.40gb` are the same slice of an H100), so a record's profile
//! is parsed into its slices and memory and matched to the catalogue's profile of that many
//! slices with the nearest memory, within [`PROFILE_MEMORY_TOLERANCE_GIB`].
//!
//! Peak FLOPS are the dense (no 2:4 sparsity) tensor-core figures of each model's data sheet
//! (FP32 is the non-tensor figure), per precision; where a data sheet gives only the sparse
//! figure, half of it. A model or precision without a published figure has none: MFU is then
//! not computed rather than guessed. Each model names its data sheet in [`GpuSpec::peak_source`].

use rust_decimal::Decimal;

/// The compute slices of every card in the catalogue that supports MIG.
pub const COMPUTE_SLICES: u32 = 7;

/// How far a profile name's memory may be from the catalogue's and still name that profile.
pub const PROFILE_MEMORY_TOLERANCE_GIB: u32 = 2;

/// One MIG profile of a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfile {
    /// Compute slices, of [`COMPUTE_SLICES`].
    pub slices: u32,
    pub memory_gib: u32,
}

impl MigProfile {
    /// The canonical name, `<g>g.<memory>gb`.
    pub fn name(&self) -> String {
        format!("{}g.{}gb", self.slices, self.memory_gib)
    }

    /// The share of the card's compute, `g/7`: the share of the card's price it costs.
    pub fn compute_share(&self) -> ComputeShare {
        ComputeShare {
            slices: self.slices,
        }
    }
}

/// A share `slices/7` of a card. Kept as a fraction so that prices are multiplied by the
/// slices before dividing by seven, which keeps a 7g slice exactly at the card's price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeShare {
    pub slices: u32,
}

impl ComputeShare {
    /// `amount × slices / 7`.
    pub fn of(&self, amount: Decimal) -> Decimal {
        amount * Decimal::from(self.slices) / Decimal::from(COMPUTE_SLICES)
    }

    /// The share as a decimal (rounded to 28 significant digits for sevenths).
    pub fn as_decimal(&self) -> Decimal {
        self.of(Decimal::ONE)
    }
}

/// The number format a model's math ran in, which sets the peak a card can reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Precision {
    Fp8,
    Bf16,
    Fp16,
    Tf32,
    Fp32,
}

impl Precision {
    pub const ALL: [Precision; 5] = [
        Precision::Fp8,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Tf32,
        Precision::Fp32,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Precision::Fp8 => "fp8",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Tf32 => "tf32",
            Precision::Fp32 => "fp32",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Precision::ALL.into_iter().find(|p| p.as_str() == raw)
    }
}

/// Dense peak throughput per precision, in GFLOPS (a billion floating-point operations per
/// second); `0` where the data sheet gives none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeakGflops {
    pub fp8: u64,
    pub bf16: u64,
    pub fp16: u64,
    pub tf32: u64,
    pub fp32: u64,
}

impl PeakGflops {
    /// The peak at `precision` in FLOPS, if the data sheet gives one.
    pub fn flops(&self, precision: Precision) -> Option<Decimal> {
        let gflops = match precision {
            Precision::Fp8 => self.fp8,
            Precision::Bf16 => self.bf16,
            Precision::Fp16 => self.fp16,
            Precision::Tf32 => self.tf32,
            Precision::Fp32 => self.fp32,
        };
        (gflops > 0).then(|| Decimal::from(gflops) * Decimal::from(1_000_000_000u64))
    }
}

/// A GPU model the service knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSpec {
    /// The catalogue's name, e.g. `H100 80GB`.
    pub name: &'static str,
    pub memory_gib: u32,
    /// Its MIG profiles, smallest first; empty where the model has no MIG.
    pub mig_profiles: &'static [MigProfile],
    /// Dense peak FLOPS per precision, where published.
    pub peak: Option<PeakGflops>,
    /// The data sheet the peaks come from.
    pub peak_source: &'static str,
}

impl GpuSpec {
    /// The peak FLOPS of one GPU of this model (or of one MIG slice: `g/7` of the card) at
    /// `precision`, if the catalogue has it.
    pub fn peak_flops(&self, precision: Precision, mig: Option<MigProfile>) -> Option<Decimal> {
        let card = self.peak?.flops(precision)?;
        Some(match mig {
            Some(profile) => profile.compute_share().of(card),
            None => card,
        })
    }
}

/// The peak FLOPS one GPU (or MIG slice) of `model` reaches at `precision`, if the catalogue
/// knows the model and has a figure for that precision.
pub fn peak_flops(model: &str, precision: Precision, mig: Option<MigProfile>) -> Option<Decimal> {
    lookup(model)?.peak_flops(precision, mig)
}

const fn p(slices: u32, memory_gib: u32) -> MigProfile {
    MigProfile { slices, memory_gib }
}

const A100_40: [MigProfile; 6] = [p(1, 5), p(1, 10), p(2, 10), p(3, 20), p(4, 20), p(7, 40)];
const A100_80: [MigProfile; 6] = [p(1, 10), p(1, 20), p(2, 20), p(3, 40), p(4, 40), p(7, 80)];
const H100_94: [MigProfile; 6] = [p(1, 12), p(1, 24), p(2, 24), p(3, 47), p(4, 47), p(7, 94)];
const H100_96: [MigProfile; 6] = [p(1, 12), p(1, 24), p(2, 24), p(3, 48), p(4, 48), p(7, 96)];
const H200: [MigProfile; 6] = [p(1, 18), p(1, 35), p(2, 35), p(3, 71), p(4, 71), p(7, 141)];
const B200: [MigProfile; 6] = [p(1, 23), p(1, 45), p(2, 45), p(3, 90), p(4, 90), p(7, 180)];
const GB200: [MigProfile; 6] = [p(1, 23), p(1, 47), p(2, 47), p(3, 93), p(4, 93), p(7, 186)];

const fn peak(fp8: u64, bf16: u64, fp16: u64, tf32: u64, fp32: u64) -> Option<PeakGflops> {
    Some(PeakGflops {
        fp8,
        bf16,
        fp16,
        tf32,
        fp32,
    })
}

const H100_SXM_PEAK: Option<PeakGflops> = peak(1_979_000, 989_500, 989_500, 494_500, 67_000);
const H100_NVL_PEAK: Option<PeakGflops> = peak(1_670_500, 835_500, 835_500, 417_500, 60_000);
const A100_PEAK: Option<PeakGflops> = peak(0, 312_000, 312_000, 156_000, 19_500);

const H100_SHEET: &str = "NVIDIA H100 Tensor Core GPU data sheet (SXM column)";
const H100_NVL_SHEET: &str = "NVIDIA H100 Tensor Core GPU data sheet (H100 NVL column)";
const H200_SHEET: &str = "NVIDIA H200 Tensor Core GPU data sheet";
const A100_SHEET: &str = "NVIDIA A100 Tensor Core GPU data sheet";
const NONE: &str = "";

/// Every model, as `(base name, memory, default for its base, spec)`: a record names a base
/// (`A100`) and optionally a memory size (`A100-80GB`); without one it gets the default.
const CATALOGUE: &[(&str, GpuSpec, bool)] = &[
    (
        "A100",
        spec("A100 40GB", 40, &A100_40, A100_PEAK, A100_SHEET),
        true,
    ),
    (
        "A100",
        spec("A100 80GB", 80, &A100_80, A100_PEAK, A100_SHEET),
        false,
    ),
    (
        "H100",
        spec("H100 80GB", 80, &A100_80, H100_SXM_PEAK, H100_SHEET),
        true,
    ),
    ("H100", spec("H100 94GB", 94, &H100_94, None, NONE), false),
    (
        "H100 NVL",
        spec("H100 NVL 94GB", 94, &H100_94, H100_NVL_PEAK, H100_NVL_SHEET),
        true,
    ),
    ("H100", spec("H100 96GB", 96, &H100_96, None, NONE), false),
    (
        "GH200",
        spec(
            "GH200 96GB",
            96,
            &H100_96,
            H100_SXM_PEAK,
            "NVIDIA GH200 Grace Hopper Superchip data sheet",
        ),
        true,
    ),
    ("H20", spec("H20 96GB", 96, &H100_96, None, NONE), true),
    (
        "H200",
        spec("H200 141GB", 141, &H200, H100_SXM_PEAK, H200_SHEET),
        true,
    ),
    (
        "H200 NVL",
        spec("H200 NVL 141GB", 141, &H200, H100_NVL_PEAK, H200_SHEET),
        true,
    ),
    (
        "B200",
        spec(
            "B200 180GB",
            180,
            &B200,
            peak(4_500_000, 2_250_000, 2_250_000, 1_100_000, 75_000),
            "NVIDIA HGX B200 data sheet (per GPU)",
        ),
        true,
    ),
    (
        "GB200",
        spec(
            "GB200 186GB",
            186,
            &GB200,
            peak(5_000_000, 2_500_000, 2_500_000, 1_250_000, 80_000),
            "NVIDIA GB200 NVL72 data sheet (per GPU)",
        ),
        true,
    ),
    (
        "A10",
        spec(
            "A10 24GB",
            24,
            &[],
            peak(0, 125_000, 125_000, 62_500, 31_200),
            "NVIDIA A10 Tensor Core GPU data sheet",
        ),
        true,
    ),
    ("A10G", spec("A10G 24GB", 24, &[], None, NONE), true),
    (
        "A40",
        spec(
            "A40 48GB",
            48,
            &[],
            peak(0, 149_700, 149_700, 74_800, 37_400),
            "NVIDIA A40 data sheet",
        ),
        true,
    ),
    (
        "L4",
        spec(
            "L4 24GB",
            24,
            &[],
            peak(242_500, 121_000, 121_000, 60_000, 30_300),
            "NVIDIA L4 Tensor Core GPU data sheet",
        ),
        true,
    ),
    (
        "L40",
        spec(
            "L40 48GB",
            48,
            &[],
            peak(362_000, 181_050, 181_050, 90_500, 90_500),
            "NVIDIA L40 GPU data sheet",
        ),
        true,
    ),
    (
        "L40S",
        spec(
            "L40S 48GB",
            48,
            &[],
            peak(733_000, 362_050, 362_050, 183_000, 91_600),
            "NVIDIA L40S GPU data sheet",
        ),
        true,
    ),
    (
        "T4",
        spec(
            "T4 16GB",
            16,
            &[],
            peak(0, 0, 65_000, 0, 8_100),
            "NVIDIA T4 Tensor Core GPU data sheet",
        ),
        true,
    ),
    (
        "V100",
        spec(
            "V100 16GB",
            16,
            &[],
            peak(0, 0, 125_000, 0, 15_700),
            "NVIDIA V100 Tensor Core GPU data sheet (SXM2 column)",
        ),
        true,
    ),
    (
        "V100",
        spec(
            "V100 32GB",
            32,
            &[],
            peak(0, 0, 125_000, 0, 15_700),
            "NVIDIA V100 Tensor Core GPU data sheet (SXM2 column)",
        ),
        false,
    ),
    (
        "RTX 6000 ADA",
        spec("RTX 6000 Ada 48GB", 48, &[], None, NONE),
        true,
    ),
    (
        "MI300X",
        spec(
            "MI300X 192GB",
            192,
            &[],
            peak(2_614_900, 1_307_400, 1_307_400, 653_700, 163_400),
            "AMD Instinct MI300X accelerator data sheet",
        ),
        true,
    ),
];

const fn spec(
    name: &'static str,
    memory_gib: u32,
    mig_profiles: &'static [MigProfile],
    peak: Option<PeakGflops>,
    peak_source: &'static str,
) -> GpuSpec {
    GpuSpec {
        name,
        memory_gib,
        mig_profiles,
        peak,
        peak_source,
    }
}

/// Words of a model name that say nothing of which model it is.
const NOISE: [&str; 9] = [
    "NVIDIA", "TESLA", "SXM", "SXM4", "SXM5", "PCIE", "HBM3", "HBM3E", "GPU",
];

/// The catalogue's spec of a model name as records spell it (`H100`, `h100-94gb`,
/// `NVIDIA A100-SXM4-80GB`, `a100_80gb`), or `None` for a model it does not know.
pub fn lookup(model: &str) -> Option<&'static GpuSpec> {
    let upper = model.to_ascii_uppercase();
    let mut memory = None;
    let mut words = Vec::new();
    for word in upper
        .split(|c: char| c == '-' || c == '_' || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        if let Some(size) = word.strip_suffix("GB").and_then(|n| n.parse::<u32>().ok()) {
            memory = Some(size);
        } else if !NOISE.contains(&word) {
            words.push(word);
        }
    }
    let base = words.join(" ");
    CATALOGUE
        .iter()
        .filter(|(name, _, _)| *name == base)
        .find(|(_, spec, default)| match memory {
            Some(size) => spec.memory_gib == size,
            None => *default,
        })
        .map(|(_, spec, _)| spec)
}

/// A profile name split into its parts.
fn parse_profile_name(raw: &str) -> Option<(u32, u32)> {
    let lower = raw.trim().to_ascii_lowercase();
    let lower = lower.strip_prefix("mig-").unwrap_or(&lower);
    let lower = lower.strip_suffix("+me").unwrap_or(lower);
    let (slices, memory) = lower.split_once("g.")?;
    let memory = memory.strip_suffix("gb")?;
    let slices: u32 = slices.parse().ok()?;
    let memory: u32 = memory.parse().ok()?;
    (1..=COMPUTE_SLICES)
        .contains(&slices)
        .then_some((slices, memory))
}

impl GpuSpec {
    /// The profile a record names for this card, or why it names none.
    pub fn profile(&self, raw: &str) -> Result<MigProfile, String> {
        let known = || {
            self.mig_profiles
                .iter()
                .map(MigProfile::name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.mig_profiles.is_empty() {
            return Err(format!("the {} has no MIG profiles", self.name));
        }
        let Some((slices, memory)) = parse_profile_name(raw) else {
            return Err(format!(
                "`{raw}` is not a MIG profile name (`<g>g.<memory>gb`); the {} has {}",
                self.name,
                known()
            ));
        };
        self.mig_profiles
            .iter()
            .filter(|profile| profile.slices == slices)
            .min_by_key(|profile| profile.memory_gib.abs_diff(memory))
            .filter(|profile| profile.memory_gib.abs_diff(memory) <= PROFILE_MEMORY_TOLERANCE_GIB)
            .copied()
            .ok_or_else(|| {
                format!(
                    "`{raw}` is not a MIG profile of the {}; it has {}",
                    self.name,
                    known()
                )
            })
    }
}

/// The profile of `model` a record names, or why it names none: an unknown model, or a
/// profile the model does not have (the message lists the known ones).
pub fn mig_profile(model: &str, raw: &str) -> Result<(&'static GpuSpec, MigProfile), String> {
    let spec = lookup(model).ok_or_else(|| {
        let known: Vec<&str> = CATALOGUE
            .iter()
            .filter(|(_, spec, _)| !spec.mig_profiles.is_empty())
            .map(|(_, spec, _)| spec.name)
            .collect();
        format!(
            "MIG profiles are known for {}; `{model}` is not one of them",
            known.join(", ")
        )
    })?;
    spec.profile(raw).map(|profile| (spec, profile))
}

/// Every model of the catalogue, for listing.
pub fn catalogue() -> impl Iterator<Item = &'static GpuSpec> {
    CATALOGUE.iter().map(|(_, spec, _)| spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_read_as_records_spell_them() {
        let memory = |model: &str| lookup(model).map(|spec| spec.memory_gib);
        assert_eq!(memory("H100"), Some(80));
        assert_eq!(memory("h100"), Some(80));
        assert_eq!(memory("NVIDIA H100 80GB HBM3"), Some(80));
        assert_eq!(memory("H100-94GB"), Some(94));
        assert_eq!(memory("H100 NVL"), Some(94));
        assert_eq!(memory("A100"), Some(40));
        assert_eq!(memory("NVIDIA A100-SXM4-80GB"), Some(80));
        assert_eq!(memory("a100_80gb"), Some(80));
        assert_eq!(memory("H200"), Some(141));
        assert_eq!(memory("B200"), Some(180));
        assert_eq!(memory("L40S"), Some(48));
        assert_eq!(
            memory("Tesla V100-SXM2-32GB"),
            None,
            "SXM2 is not a known word"
        );
        assert_eq!(memory("V100-32GB"), Some(32));
        assert_eq!(memory("A100-60GB"), None, "no such card");
        assert_eq!(memory("TPU v5e"), None);
    }

    #[test]
    fn a_profile_is_matched_by_slices_and_nearest_memory() {
        let h100 = lookup("H100").unwrap();
        assert_eq!(h100.profile("3g.40gb"), Ok(p(3, 40)));
        assert_eq!(h100.profile("3g.39gb"), Ok(p(3, 40)));
        assert_eq!(h100.profile("MIG-1g.10gb+me"), Ok(p(1, 10)));
        assert_eq!(h100.profile("1g.20gb"), Ok(p(1, 20)));
        assert_eq!(h100.profile("7g.80gb"), Ok(p(7, 80)));
        let unknown = h100.profile("3g.20gb").unwrap_err();
        assert!(unknown.contains("1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"));
        assert!(h100.profile("8g.90gb").is_err());
        assert!(h100.profile("three").unwrap_err().contains("3g.40gb"));
        assert_eq!(lookup("H200").unwrap().profile("3g.71gb"), Ok(p(3, 71)));
        assert_eq!(lookup("A100").unwrap().profile("1g.5gb"), Ok(p(1, 5)));
        assert!(lookup("L40S").unwrap().profile("1g.12gb").is_err());
        assert!(
            mig_profile("TPU", "1g.10gb")
                .unwrap_err()
                .contains("H100 80GB")
        );
    }

    #[test]
    fn every_mig_card_has_profiles_from_one_slice_to_the_whole_card() {
        for spec in catalogue().filter(|spec| !spec.mig_profiles.is_empty()) {
            let whole = spec.mig_profiles.last().unwrap();
            assert_eq!(whole.slices, COMPUTE_SLICES, "{}", spec.name);
            assert_eq!(whole.memory_gib, spec.memory_gib, "{}", spec.name);
            assert_eq!(spec.mig_profiles[0].slices, 1, "{}", spec.name);
            assert!(
                spec.mig_profiles
                    .windows(2)
                    .all(|w| (w[0].slices, w[0].memory_gib) < (w[1].slices, w[1].memory_gib)),
                "{} profiles are listed smallest first",
                spec.name
            );
        }
    }

    #[test]
    fn peaks_are_dense_per_precision_and_a_slice_gets_its_share() {
        let tera = |t: i64| Decimal::from(t) * Decimal::from(1_000_000_000_000u64);
        assert_eq!(
            peak_flops("H100", Precision::Bf16, None),
            Some(tera(9895) / Decimal::TEN)
        );
        assert_eq!(peak_flops("H100", Precision::Fp8, None), Some(tera(1979)));
        assert_eq!(
            peak_flops("A100-80GB", Precision::Tf32, None),
            Some(tera(156))
        );
        assert_eq!(
            peak_flops("H100", Precision::Bf16, Some(p(7, 80))),
            peak_flops("H100", Precision::Bf16, None),
            "a 7g slice is the whole card"
        );
        assert_eq!(
            peak_flops("A100", Precision::Bf16, Some(p(1, 5))),
            Some(tera(312) / Decimal::from(7))
        );
        assert_eq!(
            peak_flops("A100", Precision::Fp8, None),
            None,
            "no FP8 on Ampere"
        );
        assert_eq!(peak_flops("T4", Precision::Bf16, None), None);
        assert_eq!(
            peak_flops("H20", Precision::Bf16, None),
            None,
            "no published peak"
        );
        assert_eq!(peak_flops("TPU v5e", Precision::Bf16, None), None);
        for precision in Precision::ALL {
            assert_eq!(Precision::parse(precision.as_str()), Some(precision));
        }
    }

    #[test]
    fn every_peak_names_its_source_and_lower_precisions_are_never_slower() {
        for spec in catalogue() {
            let Some(peak) = spec.peak else {
                assert!(spec.peak_source.is_empty(), "{}", spec.name);
                continue;
            };
            assert!(!spec.peak_source.is_empty(), "{}", spec.name);
            assert!(peak.fp32 > 0, "{}", spec.name);
            assert!(peak.fp16 >= peak.tf32, "{}", spec.name);
            assert!(peak.fp8 == 0 || peak.fp8 >= peak.bf16, "{}", spec.name);
        }
    }

    #[test]
    fn a_whole_card_slice_costs_the_card_exactly() {
        let price = Decimal::new(250, 2);
        assert_eq!(p(7, 80).compute_share().of(price), price);
        assert_eq!(
            p(3, 40).compute_share().of(Decimal::from(7)),
            Decimal::from(3)
        );
    }
}
