//! Trackable resources (TRES): `cpu=4,mem=16G,gres/gpu=2,gres/gpu:a100=2` in sacct's text,
//! `[{"type": "gres", "name": "gpu:a100", "count": 2}, …]` in its JSON. Only the GPU entries,
//! the GPU usage figures and the energy matter here; the other entries are checked for shape
//! only.

use std::collections::BTreeMap;
use std::str::FromStr;

use rust_decimal::Decimal;

/// The GPUs of one allocation as Slurm accounted them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuTres {
    /// `gres/gpu=N`: every GPU of the allocation, whatever its type.
    pub untyped: Option<u64>,
    /// `gres/gpu:<type>=N`, present for the types in `AccountingStorageTRES`.
    pub typed: BTreeMap<String, u64>,
}

impl GpuTres {
    /// `gres/gpu` counts all GPUs; typed entries repeat some of them, so they are summed only
    /// when the untyped entry is missing.
    pub fn count(&self) -> u64 {
        self.untyped
            .unwrap_or_else(|| self.typed.values().copied().sum())
    }

    /// Takes one entry. An entry named a second time is skipped, as Slurm reads a TRES list:
    /// its `slurmdb_tres_list_from_string` keeps the first count of a TRES and skips the
    /// entries repeating it unless asked to replace them (`TRES_STR_FLAG_REPLACE`, see the
    /// flags in `src/common/slurmdb_defs.h`); it never adds them up. So `gres/gpu=2,gres/gpu=4`
    /// is 2 GPUs.
    pub fn add(&mut self, name: &str, count: u64) {
        match name.strip_prefix("gpu:") {
            Some(kind) if !kind.is_empty() => {
                self.typed.entry(kind.to_owned()).or_insert(count);
            }
            _ => {
                self.untyped.get_or_insert(count);
            }
        }
    }
}

/// What a step measured (its TRESUsageInMax): the GPU usage entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// `gres/gpuutil`: NVML's sampled GPU-Util, in percent.
    pub gpu_util: Option<Decimal>,
    /// `gres/gpumem`: the most GPU memory in use, in bytes.
    pub memory_bytes: Option<Decimal>,
}

impl GpuUsage {
    /// Both figures are peaks, so a job's figure is the highest of its steps'.
    pub fn merge(&mut self, other: &GpuUsage) {
        self.gpu_util = max(self.gpu_util, other.gpu_util);
        self.memory_bytes = max(self.memory_bytes, other.memory_bytes);
    }
}

fn max(a: Option<Decimal>, b: Option<Decimal>) -> Option<Decimal> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The energy Slurm accounted to an allocation: its `energy` TRES, which sacct prints as
/// ConsumedEnergyRaw (joules) and ConsumedEnergy (the same with a unit prefix).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Energy {
    /// Nothing accounted: no figure, Slurm's "unset", or 0.
    #[default]
    Unmeasured,
    /// Joules, exactly as Slurm accounted them.
    Joules(Decimal),
    /// Only ConsumedEnergy with a unit prefix (`1.20K`), which sacct rounds to three
    /// significant digits: not exact enough to price.
    Rounded,
}

impl Energy {
    /// A count of joules as Slurm accounts it: 0 is nothing measured (no energy plugin, or
    /// no sample during the job), never a measurement of no energy.
    pub fn of_joules(joules: u64) -> Self {
        if joules == 0 {
            Energy::Unmeasured
        } else {
            Energy::Joules(Decimal::from(joules))
        }
    }
}

/// The energy of an allocation line of sacct's text: ConsumedEnergyRaw when the header has
/// it, else ConsumedEnergy; an empty field is nothing accounted.
pub fn energy_of_text(raw: Option<&str>, human: Option<&str>) -> Result<Energy, String> {
    if let Some(raw) = raw {
        return u64::from_str(raw)
            .map(Energy::of_joules)
            .map_err(|_| format!("ConsumedEnergyRaw `{raw}` is not a whole number of joules"));
    }
    let Some(human) = human else {
        return Ok(Energy::Unmeasured);
    };
    // sacct divides by 1000 for each prefix and keeps three significant digits.
    match human.char_indices().last() {
        Some((at, unit)) if "KMGTP".contains(unit) && plain_number(&human[..at]).is_some() => {
            Ok(Energy::Rounded)
        }
        _ => u64::from_str(human)
            .map(Energy::of_joules)
            .map_err(|_| format!("ConsumedEnergy `{human}` is not an amount of joules")),
    }
}

/// Splits a text TRES list into `(name, value)` pairs; an entry without a name or value is
/// an error naming it.
pub fn pairs(raw: &str) -> Result<Vec<(&str, &str)>, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    raw.split(',')
        .map(|entry| match entry.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() && !value.trim().is_empty() => {
                Ok((name.trim(), value.trim()))
            }
            _ => Err(format!("`{entry}` in TRES `{raw}` is not NAME=VALUE")),
        })
        .collect()
}

/// The GPU entries of a text TRES list (AllocTRES).
pub fn gpus_of_text(raw: &str) -> Result<GpuTres, String> {
    let mut gpus = GpuTres::default();
    for (name, value) in pairs(raw)? {
        if let Some(gres) = name.strip_prefix("gres/")
            && is_gpu(gres)
        {
            let count = u64::from_str(value)
                .map_err(|_| format!("`{name}={value}` is not a whole number of GPUs"))?;
            gpus.add(gres, count);
        }
    }
    Ok(gpus)
}

/// The GPU usage entries of a text TRES list (TRESUsageInMax).
pub fn usage_of_text(raw: &str) -> Result<GpuUsage, String> {
    let mut usage = GpuUsage::default();
    for (name, value) in pairs(raw)? {
        match name {
            "gres/gpuutil" => {
                usage.gpu_util = Some(
                    plain_number(value)
                        .ok_or_else(|| format!("`{name}={value}` is not a percentage"))?,
                );
            }
            "gres/gpumem" => usage.memory_bytes = Some(bytes(value, name)?),
            _ => {}
        }
    }
    Ok(usage)
}

/// `gpu` or `gpu:<type>`; not `gpumem`, `gpuutil` or other GRES.
pub fn is_gpu(gres: &str) -> bool {
    gres == "gpu" || gres.starts_with("gpu:")
}

/// A size as sacct prints it: bytes, or a number with the K/M/G/T/P (powers of 1024) it
/// converts to unless `--noconvert` is given.
fn bytes(value: &str, name: &str) -> Result<Decimal, String> {
    let error = || format!("`{name}={value}` is not a size");
    let (number, unit) = match value.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&value[..at], c.to_ascii_uppercase()),
        _ => (value, 'B'),
    };
    let power = match unit {
        'B' => 0,
        'K' => 1,
        'M' => 2,
        'G' => 3,
        'T' => 4,
        'P' => 5,
        _ => return Err(error()),
    };
    let number = plain_number(number).ok_or_else(error)?;
    let factor = (0..power).fold(Decimal::ONE, |f, _| f * Decimal::from(1024));
    number.checked_mul(factor).ok_or_else(error)
}

/// A non-negative decimal written with digits and at most one point.
fn plain_number(raw: &str) -> Option<Decimal> {
    let valid = !raw.is_empty()
        && raw.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && raw.bytes().filter(|&b| b == b'.').count() <= 1
        && raw.bytes().next().is_some_and(|b| b.is_ascii_digit());
    valid.then(|| Decimal::from_str(raw).ok()).flatten()
}

/// A GPU type split into the GPU it belongs to and its MIG profile: `a100_3g.20gb` is a
/// `3g.20gb` slice of an `a100`; `3g.20gb` alone names no parent; `a100` is a whole GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuType {
    pub parent: Option<String>,
    pub mig_profile: Option<String>,
}

pub fn split_gpu_type(kind: &str) -> GpuType {
    if is_mig_profile(kind) {
        return GpuType {
            parent: None,
            mig_profile: Some(kind.to_owned()),
        };
    }
    for (at, c) in kind.char_indices().rev() {
        if (c == '_' || c == '-') && is_mig_profile(&kind[at + 1..]) && at > 0 {
            return GpuType {
                parent: Some(kind[..at].to_owned()),
                mig_profile: Some(kind[at + 1..].to_owned()),
            };
        }
    }
    GpuType {
        parent: Some(kind.to_owned()),
        mig_profile: None,
    }
}

/// NVIDIA's MIG profile names: `<g>g.<mem>gb`, with a compute-instance prefix `<c>c.` and a
/// `+me`-style suffix where present (`1g.5gb`, `3g.20gb`, `1c.3g.20gb`, `1g.10gb+me`).
fn is_mig_profile(text: &str) -> bool {
    let text = text.split_once('+').map_or(text, |(profile, _)| profile);
    let mut parts: Vec<&str> = text.split('.').collect();
    if parts.len() == 3 {
        let compute = parts.remove(0);
        if !counted(compute, "c") {
            return false;
        }
    }
    matches!(parts.as_slice(), [slices, memory] if counted(slices, "g") && counted(memory, "gb"))
}

fn counted(text: &str, unit: &str) -> bool {
    text.strip_suffix(unit)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_entries_repeat_the_untyped_count() {
        let gpus = gpus_of_text("cpu=64,mem=500G,gres/gpu=16,gres/gpu:h100=16").unwrap();
        assert_eq!(gpus.count(), 16);
        assert_eq!(gpus.typed["h100"], 16);
        let typed_only = gpus_of_text("gres/gpu:a100=2,gres/gpu:v100=3").unwrap();
        assert_eq!(typed_only.count(), 5);
        assert_eq!(gpus_of_text("cpu=4,mem=16G").unwrap().count(), 0);
        assert_eq!(gpus_of_text("").unwrap().count(), 0);
    }

    #[test]
    fn an_entry_named_twice_keeps_its_first_count_as_slurm_reads_it() {
        assert_eq!(gpus_of_text("gres/gpu=2,gres/gpu=4").unwrap().count(), 2);
        let typed = gpus_of_text("cpu=8,gres/gpu:a100=1,gres/gpu:a100=3,gres/gpu:h100=2").unwrap();
        assert_eq!(typed.untyped, None);
        assert_eq!(typed.count(), 3);
        let both = gpus_of_text("gres/gpu=4,gres/gpu:a100=4,gres/gpu=8").unwrap();
        assert_eq!(both.count(), 4);
    }

    #[test]
    fn gpu_usage_entries_are_not_gpus() {
        let gpus = gpus_of_text("cpu=8,gres/gpumem=80G,gres/gpuutil=0,gres/gpu=1").unwrap();
        assert_eq!(gpus.count(), 1);
        assert!(gpus.typed.is_empty());
    }

    #[test]
    fn malformed_tres_is_an_error_naming_the_entry() {
        assert!(
            gpus_of_text("cpu=4,gres/gpu")
                .unwrap_err()
                .contains("`gres/gpu`")
        );
        assert!(
            gpus_of_text("gres/gpu=two")
                .unwrap_err()
                .contains("whole number")
        );
        assert!(
            usage_of_text("gres/gpumem=12Q")
                .unwrap_err()
                .contains("size")
        );
    }

    #[test]
    fn usage_reads_peaks_with_or_without_units() {
        let usage =
            usage_of_text("cpu=00:01:09,energy=0,gres/gpumem=1648M,gres/gpuutil=66,mem=2810884K")
                .unwrap();
        assert_eq!(usage.gpu_util, Some(Decimal::from(66)));
        assert_eq!(
            usage.memory_bytes,
            Some(Decimal::from(1648u64 * 1024 * 1024))
        );
        let raw = usage_of_text("gres/gpumem=85899345920").unwrap();
        assert_eq!(raw.memory_bytes, Some(Decimal::from(85_899_345_920u64)));
    }

    #[test]
    fn energy_prefers_the_raw_joules_and_zero_is_nothing_measured() {
        let joules = |n: u64| Ok(Energy::Joules(Decimal::from(n)));
        assert_eq!(
            energy_of_text(Some("1234567"), Some("1.23M")),
            joules(1_234_567)
        );
        assert_eq!(energy_of_text(Some("0"), None), Ok(Energy::Unmeasured));
        assert_eq!(energy_of_text(None, None), Ok(Energy::Unmeasured));
        // --noconvert prints ConsumedEnergy unrounded; otherwise it has a prefix.
        assert_eq!(energy_of_text(None, Some("950")), joules(950));
        assert_eq!(energy_of_text(None, Some("1.20K")), Ok(Energy::Rounded));
        assert_eq!(energy_of_text(None, Some("0")), Ok(Energy::Unmeasured));
        assert!(
            energy_of_text(Some("1.5"), None)
                .unwrap_err()
                .contains("ConsumedEnergyRaw `1.5`")
        );
        assert!(energy_of_text(Some("-2"), None).is_err());
        assert!(energy_of_text(None, Some("12Q")).is_err());
    }

    #[test]
    fn mig_types_name_their_parent_where_they_can() {
        let slice = split_gpu_type("a100_3g.20gb");
        assert_eq!(slice.parent.as_deref(), Some("a100"));
        assert_eq!(slice.mig_profile.as_deref(), Some("3g.20gb"));
        let nvml = split_gpu_type("nvidia_h100_80gb_hbm3_1g.10gb+me");
        assert_eq!(nvml.parent.as_deref(), Some("nvidia_h100_80gb_hbm3"));
        assert_eq!(nvml.mig_profile.as_deref(), Some("1g.10gb+me"));
        let bare = split_gpu_type("1c.3g.20gb");
        assert_eq!(bare.parent, None);
        assert_eq!(bare.mig_profile.as_deref(), Some("1c.3g.20gb"));
        let whole = split_gpu_type("a100-sxm4-80gb");
        assert_eq!(whole.parent.as_deref(), Some("a100-sxm4-80gb"));
        assert_eq!(whole.mig_profile, None);
    }
}
