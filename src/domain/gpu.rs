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

/// A GPU model the service knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSpec {
    /// The catalogue's name, e.g. `H100 80GB`.
    pub name: &'static str,
    pub memory_gib: u32,
    /// Its MIG profiles, smallest first; empty where the model has no MIG.
    pub mig_profiles: &'static [MigProfile],
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

/// Every model, as `(base name, memory, default for its base, spec)`: a record names a base
/// (`A100`) and optionally a memory size (`A100-80GB`); without one it gets the default.
const CATALOGUE: &[(&str, GpuSpec, bool)] = &[
    ("A100", spec("A100 40GB", 40, &A100_40), true),
    ("A100", spec("A100 80GB", 80, &A100_80), false),
    ("H100", spec("H100 80GB", 80, &A100_80), true),
    ("H100", spec("H100 94GB", 94, &H100_94), false),
    ("H100 NVL", spec("H100 NVL 94GB", 94, &H100_94), true),
    ("H100", spec("H100 96GB", 96, &H100_96), false),
    ("GH200", spec("GH200 96GB", 96, &H100_96), true),
    ("H20", spec("H20 96GB", 96, &H100_96), true),
    ("H200", spec("H200 141GB", 141, &H200), true),
    ("H200 NVL", spec("H200 NVL 141GB", 141, &H200), true),
    ("B200", spec("B200 180GB", 180, &B200), true),
    ("GB200", spec("GB200 186GB", 186, &GB200), true),
    ("A10", spec("A10 24GB", 24, &[]), true),
    ("A10G", spec("A10G 24GB", 24, &[]), true),
    ("A40", spec("A40 48GB", 48, &[]), true),
    ("L4", spec("L4 24GB", 24, &[]), true),
    ("L40", spec("L40 48GB", 48, &[]), true),
    ("L40S", spec("L40S 48GB", 48, &[]), true),
    ("T4", spec("T4 16GB", 16, &[]), true),
    ("V100", spec("V100 16GB", 16, &[]), true),
    ("V100", spec("V100 32GB", 32, &[]), false),
    ("RTX 6000 ADA", spec("RTX 6000 Ada 48GB", 48, &[]), true),
    ("MI300X", spec("MI300X 192GB", 192, &[]), true),
];

const fn spec(name: &'static str, memory_gib: u32, mig_profiles: &'static [MigProfile]) -> GpuSpec {
    GpuSpec {
        name,
        memory_gib,
        mig_profiles,
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
    fn a_whole_card_slice_costs_the_card_exactly() {
        let price = Decimal::new(250, 2);
        assert_eq!(p(7, 80).compute_share().of(price), price);
        assert_eq!(
            p(3, 40).compute_share().of(Decimal::from(7)),
            Decimal::from(3)
        );
    }
}
