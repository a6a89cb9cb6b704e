//! The GPUs a pod asked for, from the extended resources of its containers: whole GPUs
//! (`nvidia.com/gpu`), MIG slices (`nvidia.com/mig-3g.40gb`, mixed strategy) and HAMi's shares
//! of a GPU (`nvidia.com/gpucores`, `nvidia.com/gpumem`, `nvidia.com/gpumem-percentage`, per
//! `nvidia.com/gpu` it asked for).

use std::collections::BTreeMap;

use rust_decimal::Decimal;

use crate::domain::gpu::GpuSpec;

/// What a pod's containers requested, summed over them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuRequest {
    /// `nvidia.com/gpu`: whole GPUs, or HAMi's virtual GPUs when a share is given.
    pub gpus: Decimal,
    /// MIG slices by profile as the resource names it (`3g.40gb`).
    pub slices: BTreeMap<String, Decimal>,
    /// HAMi: percent of a GPU's cores per virtual GPU.
    pub cores_percent: Option<Decimal>,
    /// HAMi: MiB of a GPU's memory per virtual GPU.
    pub memory_mib: Option<Decimal>,
    /// HAMi: percent of a GPU's memory per virtual GPU.
    pub memory_percent: Option<Decimal>,
}

/// Decimal places of a shared GPU's count.
const SHARE_PLACES: u32 = 6;

impl GpuRequest {
    /// Adds one resource's amount; resources that are not GPUs are ignored.
    pub fn add(&mut self, resource: &str, amount: Decimal) {
        let name: String = resource
            .chars()
            .map(|c| match c {
                '.' | '/' | '-' | '+' => '_',
                c => c.to_ascii_lowercase(),
            })
            .collect();
        let Some(name) = name.strip_prefix("nvidia_com_") else {
            return;
        };
        let positive = (amount > Decimal::ZERO).then_some(amount);
        match name {
            "gpu" => self.gpus += amount,
            "gpucores" => self.cores_percent = positive,
            "gpumem" => self.memory_mib = positive,
            "gpumem_percentage" => self.memory_percent = positive,
            other => {
                if let Some(profile) = other.strip_prefix("mig_").and_then(mig_profile_name) {
                    *self.slices.entry(profile).or_default() += amount;
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_zero() && self.slices.values().all(Decimal::is_zero)
    }

    /// Whether HAMi shares the GPUs: the pod holds a part of each.
    pub fn is_share(&self) -> bool {
        !self.gpus.is_zero()
            && (self.cores_percent.is_some()
                || self.memory_mib.is_some()
                || self.memory_percent.is_some())
    }

    /// The share of a GPU each virtual GPU holds: the larger of its share of the cores and of
    /// the memory (the part of the card nobody else can use), at most the whole card. `None`
    /// when only a memory size is given and the card's memory is not known.
    pub fn share(&self, spec: Option<&GpuSpec>) -> Option<Decimal> {
        let percent = |p: Decimal| p / Decimal::ONE_HUNDRED;
        let of_memory = self.memory_mib.and_then(|mib| {
            spec.map(|spec| mib / (Decimal::from(spec.memory_gib) * Decimal::from(1024)))
        });
        [
            self.cores_percent.map(percent),
            self.memory_percent.map(percent),
            of_memory,
        ]
        .into_iter()
        .flatten()
        .max()
        .map(|share| share.min(Decimal::ONE).round_dp(SHARE_PLACES).normalize())
    }
}

/// `3g_40gb` (also `3g_40gb_me`) as the profile `3g.40gb`.
fn mig_profile_name(raw: &str) -> Option<String> {
    let raw = raw.strip_suffix("_me").unwrap_or(raw);
    let (slices, memory) = raw.split_once("g_")?;
    let memory = memory.strip_suffix("gb")?;
    (slices.parse::<u32>().is_ok() && memory.parse::<u32>().is_ok())
        .then(|| format!("{slices}g.{memory}gb"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::gpu;

    fn dec(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    #[test]
    fn both_spellings_of_a_resource_are_read() {
        let mut request = GpuRequest::default();
        request.add("nvidia_com_gpu", dec("2"));
        request.add("nvidia.com/gpu", dec("1"));
        request.add("nvidia_com_mig_1g_10gb", dec("1"));
        request.add("nvidia.com/mig-1g.10gb", dec("1"));
        request.add("nvidia_com_mig_3g_40gb_me", dec("1"));
        request.add("cpu", dec("8"));
        request.add("nvidia_com_mig_weird", dec("1"));
        assert_eq!(request.gpus, dec("3"));
        assert_eq!(
            request.slices,
            [
                ("1g.10gb".to_owned(), dec("2")),
                ("3g.40gb".to_owned(), dec("1"))
            ]
            .into()
        );
        assert!(!request.is_share());
        assert!(GpuRequest::default().is_empty());
    }

    #[test]
    fn a_hami_share_is_the_larger_of_its_cores_and_its_memory() {
        let a100 = gpu::lookup("A100-80GB");
        let mut request = GpuRequest::default();
        request.add("nvidia_com_gpu", dec("1"));
        request.add("nvidia_com_gpucores", dec("30"));
        assert!(request.is_share());
        assert_eq!(request.share(a100), Some(dec("0.3")));
        request.add("nvidia_com_gpumem", dec("40960"));
        assert_eq!(request.share(a100), Some(dec("0.5")), "40 of 80 GiB");
        assert_eq!(request.share(None), Some(dec("0.3")));
        let mut memory_only = GpuRequest::default();
        memory_only.add("nvidia_com_gpu", dec("1"));
        memory_only.add("nvidia_com_gpumem", dec("10000"));
        assert_eq!(memory_only.share(None), None);
        assert_eq!(memory_only.share(a100), Some(dec("0.12207")));
        memory_only.add("nvidia_com_gpumem_percentage", dec("250"));
        assert_eq!(memory_only.share(a100), Some(Decimal::ONE));
        // HAMi's default of 0 cores means no limit, not no share.
        let mut unlimited = GpuRequest::default();
        unlimited.add("nvidia_com_gpu", dec("1"));
        unlimited.add("nvidia_com_gpucores", dec("0"));
        assert!(!unlimited.is_share());
    }
}
