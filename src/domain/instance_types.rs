//! What the service knows of the clouds' GPU instance types: each type's GPU model and how
//! many whole GPUs one instance has, so that a bill row of a GPU instance can be read as
//! capacity ("this instance had 8 A100 cards").
//!
//! Sources, per cloud:
//!
//! - AWS: the EC2 instance-type reference of Karpenter, repository `aws/karpenter-provider-aws`,
//!   file `website/content/en/docs/reference/instance-types.md` (`nvidia.com/gpu` and
//!   `karpenter.k8s.aws/instance-gpu-name`/`-memory` of each type), at commit `1d927085dd81`.
//!   Previous generations no longer in that file are taken from older releases of it: `p3.*`
//!   from v1.12.0 (`9e1d72fdc1ea`), `p2.*` from v1.3.1 (`b783ef891bec`), `g3.*` and
//!   `g3s.xlarge` from v1.0.0 (`5e6f896357a1`).
//! - Azure: the VM size pages of `MicrosoftDocs/azure-compute-docs`, folder
//!   `articles/virtual-machines/sizes/gpu-accelerated/` (the "Accelerators" table of
//!   `ncv3-series.md`, `ncast4v3-series.md`, `nca100v4-series.md`, `ncadsh100v5-series.md`,
//!   `nvadsa10v5-series.md`, `ndv2-series.md`, `ndasra100v4-series.md`, `ndma100v4-series.md`,
//!   `ndh100v5-series.md`, `nd-h200-v5-series.md`, `ndmi300xv5-series.md`,
//!   `nd-gb200-v6-series.md`, and the series' `includes/*-specs.md` for the card's memory).
//! - Google Cloud: SkyPilot's GCP catalogue, repository `skypilot-org/skypilot`, file
//!   `sky/catalog/gcp_catalog.py` (`_ACC_INSTANCE_TYPE_DICTS`), at commit `005261080a6b`.
//!   Only machine types that come with their GPUs are listed (A2, A3, A4, G2); N1 machines
//!   have GPUs attached separately, so their type says nothing of the cards.
//! - Oracle: SkyPilot's OCI catalogue, repository `skypilot-org/skypilot-catalog`, file
//!   `catalogs/v8/oci/vms.csv` (`AcceleratorName`, `AcceleratorCount`), at commit
//!   `058875118382`.
//!
//! Counts are of whole GPUs as the cloud and the driver count them: an AWS K80 or M60 board
//! carries two GPUs, and `p2.16xlarge` has 16 of them. Types that give an instance part of a
//! card (Azure `NV6ads_A10_v5`, `NV12ads_A10_v5` and `NV18ads_A10_v5`, AWS `g6f.*` and
//! `gr6f.*`) are not whole cards and are left out, as are types whose GPU this service does
//! not name (AWS `g4ad.*` and `g5g.*`, B300, GB300, MI355X and RTX PRO 6000 shapes).
//!
//! Names are matched case-insensitively. An Azure size is matched with or without its
//! `Standard_` prefix and with spaces for its underscores, as Azure's meters spell it
//! (`ND96asr v4` is `Standard_ND96asr_v4`).

/// The cloud an instance type belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    Aws,
    Azure,
    GoogleCloud,
    Oracle,
}

/// One instance type and its cards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstance {
    pub cloud: Cloud,
    /// The type as the cloud spells it: `p4d.24xlarge`, `Standard_ND96asr_v4`,
    /// `a2-highgpu-1g`, `BM.GPU.A100-v2.8`.
    pub name: &'static str,
    /// The GPU model as this service names models: short NVIDIA/AMD names, e.g. `A100`,
    /// `A100-80GB`, `H100`, `H100-NVL`, `H200`, `A10G`, `L4`, `T4`, `V100-32GB`, `MI300X`.
    pub gpu_model: &'static str,
    /// Whole GPUs (cards) of one instance.
    pub gpus: u32,
}

const fn aws(name: &'static str, gpu_model: &'static str, gpus: u32) -> GpuInstance {
    entry(Cloud::Aws, name, gpu_model, gpus)
}

const fn azure(name: &'static str, gpu_model: &'static str, gpus: u32) -> GpuInstance {
    entry(Cloud::Azure, name, gpu_model, gpus)
}

const fn gcp(name: &'static str, gpu_model: &'static str, gpus: u32) -> GpuInstance {
    entry(Cloud::GoogleCloud, name, gpu_model, gpus)
}

const fn oci(name: &'static str, gpu_model: &'static str, gpus: u32) -> GpuInstance {
    entry(Cloud::Oracle, name, gpu_model, gpus)
}

const fn entry(
    cloud: Cloud,
    name: &'static str,
    gpu_model: &'static str,
    gpus: u32,
) -> GpuInstance {
    GpuInstance {
        cloud,
        name,
        gpu_model,
        gpus,
    }
}

/// Every instance type of the catalogue, by cloud and family.
const CATALOGUE: &[GpuInstance] = &[
    // AWS: P2 (K80), P3 (V100), P4 (A100), P5 (H100, H200), P6 (B200).
    aws("p2.xlarge", "K80", 1),
    aws("p2.8xlarge", "K80", 8),
    aws("p2.16xlarge", "K80", 16),
    aws("p3.2xlarge", "V100", 1),
    aws("p3.8xlarge", "V100", 4),
    aws("p3.16xlarge", "V100", 8),
    aws("p3dn.24xlarge", "V100-32GB", 8),
    aws("p4d.24xlarge", "A100", 8),
    aws("p4de.24xlarge", "A100-80GB", 8),
    aws("p5.4xlarge", "H100", 1),
    aws("p5.48xlarge", "H100", 8),
    aws("p5e.48xlarge", "H200", 8),
    aws("p5en.48xlarge", "H200", 8),
    aws("p6-b200.48xlarge", "B200", 8),
    // AWS: G3 (M60), G4dn (T4), G5 (A10G), G6 and Gr6 (L4), G6e (L40S).
    aws("g3s.xlarge", "M60", 1),
    aws("g3.4xlarge", "M60", 1),
    aws("g3.8xlarge", "M60", 2),
    aws("g3.16xlarge", "M60", 4),
    aws("g4dn.xlarge", "T4", 1),
    aws("g4dn.2xlarge", "T4", 1),
    aws("g4dn.4xlarge", "T4", 1),
    aws("g4dn.8xlarge", "T4", 1),
    aws("g4dn.12xlarge", "T4", 4),
    aws("g4dn.16xlarge", "T4", 1),
    aws("g4dn.metal", "T4", 8),
    aws("g5.xlarge", "A10G", 1),
    aws("g5.2xlarge", "A10G", 1),
    aws("g5.4xlarge", "A10G", 1),
    aws("g5.8xlarge", "A10G", 1),
    aws("g5.12xlarge", "A10G", 4),
    aws("g5.16xlarge", "A10G", 1),
    aws("g5.24xlarge", "A10G", 4),
    aws("g5.48xlarge", "A10G", 8),
    aws("g6.xlarge", "L4", 1),
    aws("g6.2xlarge", "L4", 1),
    aws("g6.4xlarge", "L4", 1),
    aws("g6.8xlarge", "L4", 1),
    aws("g6.12xlarge", "L4", 4),
    aws("g6.16xlarge", "L4", 1),
    aws("g6.24xlarge", "L4", 4),
    aws("g6.48xlarge", "L4", 8),
    aws("gr6.4xlarge", "L4", 1),
    aws("gr6.8xlarge", "L4", 1),
    aws("g6e.xlarge", "L40S", 1),
    aws("g6e.2xlarge", "L40S", 1),
    aws("g6e.4xlarge", "L40S", 1),
    aws("g6e.8xlarge", "L40S", 1),
    aws("g6e.12xlarge", "L40S", 4),
    aws("g6e.16xlarge", "L40S", 1),
    aws("g6e.24xlarge", "L40S", 4),
    aws("g6e.48xlarge", "L40S", 8),
    // Azure: NC (V100, T4, A100 80GB, H100 NVL), NV (A10, whole cards only), ND.
    azure("Standard_NC6s_v3", "V100", 1),
    azure("Standard_NC12s_v3", "V100", 2),
    azure("Standard_NC24s_v3", "V100", 4),
    azure("Standard_NC24rs_v3", "V100", 4),
    azure("Standard_NC4as_T4_v3", "T4", 1),
    azure("Standard_NC8as_T4_v3", "T4", 1),
    azure("Standard_NC16as_T4_v3", "T4", 1),
    azure("Standard_NC64as_T4_v3", "T4", 4),
    azure("Standard_NC24ads_A100_v4", "A100-80GB", 1),
    azure("Standard_NC48ads_A100_v4", "A100-80GB", 2),
    azure("Standard_NC96ads_A100_v4", "A100-80GB", 4),
    azure("Standard_NC40ads_H100_v5", "H100-NVL", 1),
    azure("Standard_NC80adis_H100_v5", "H100-NVL", 2),
    azure("Standard_NV36ads_A10_v5", "A10", 1),
    azure("Standard_NV36adms_A10_v5", "A10", 1),
    azure("Standard_NV72ads_A10_v5", "A10", 2),
    azure("Standard_ND40rs_v2", "V100-32GB", 8),
    azure("Standard_ND96asr_v4", "A100", 8),
    azure("Standard_ND96amsr_A100_v4", "A100-80GB", 8),
    azure("Standard_ND96isr_H100_v5", "H100", 8),
    azure("Standard_ND96isr_H200_v5", "H200", 8),
    azure("Standard_ND96isr_MI300X_v5", "MI300X", 8),
    azure("Standard_ND128isr_NDR_GB200_v6", "GB200", 4),
    // Google Cloud: A2 (A100 40GB and 80GB), A3 (H100, H200), A4 (B200), G2 (L4).
    gcp("a2-highgpu-1g", "A100", 1),
    gcp("a2-highgpu-2g", "A100", 2),
    gcp("a2-highgpu-4g", "A100", 4),
    gcp("a2-highgpu-8g", "A100", 8),
    gcp("a2-megagpu-16g", "A100", 16),
    gcp("a2-ultragpu-1g", "A100-80GB", 1),
    gcp("a2-ultragpu-2g", "A100-80GB", 2),
    gcp("a2-ultragpu-4g", "A100-80GB", 4),
    gcp("a2-ultragpu-8g", "A100-80GB", 8),
    gcp("a3-highgpu-1g", "H100", 1),
    gcp("a3-highgpu-2g", "H100", 2),
    gcp("a3-highgpu-4g", "H100", 4),
    gcp("a3-highgpu-8g", "H100", 8),
    gcp("a3-megagpu-8g", "H100", 8),
    gcp("a3-ultragpu-8g", "H200", 8),
    gcp("a4-highgpu-8g", "B200", 8),
    gcp("g2-standard-4", "L4", 1),
    gcp("g2-standard-8", "L4", 1),
    gcp("g2-standard-12", "L4", 1),
    gcp("g2-standard-16", "L4", 1),
    gcp("g2-standard-24", "L4", 2),
    gcp("g2-standard-32", "L4", 1),
    gcp("g2-standard-48", "L4", 4),
    gcp("g2-standard-96", "L4", 8),
    // Oracle: GPU2 (P100), GPU3 (V100), GPU4 and A100-v2 (A100), A10, L40S, H100, H200,
    // B200, GB200, MI300X.
    oci("VM.GPU2.1", "P100", 1),
    oci("BM.GPU2.2", "P100", 2),
    oci("VM.GPU3.1", "V100", 1),
    oci("VM.GPU3.2", "V100", 2),
    oci("VM.GPU3.4", "V100", 4),
    oci("BM.GPU3.8", "V100", 8),
    oci("BM.GPU4.8", "A100", 8),
    oci("BM.GPU.A100-v2.8", "A100-80GB", 8),
    oci("VM.GPU.A10.1", "A10", 1),
    oci("VM.GPU.A10.2", "A10", 2),
    oci("BM.GPU.A10.4", "A10", 4),
    oci("BM.GPU.L40S.4", "L40S", 4),
    oci("BM.GPU.H100.8", "H100", 8),
    oci("BM.GPU.H200.8", "H200", 8),
    oci("BM.GPU.B200.8", "B200", 8),
    oci("BM.GPU.GB200.4", "GB200", 4),
    oci("BM.GPU.MI300X.8", "MI300X", 8),
];

/// The most tokens of free text an instance type spans: an Azure meter such as
/// `Standard ND128isr NDR GB200 v6`.
const MAX_NAME_TOKENS: usize = 5;

/// The words of an Azure size as `parts` spell it: split on underscores and spaces, without
/// a leading `Standard`.
fn azure_words<'a>(parts: impl Iterator<Item = &'a str>) -> impl Iterator<Item = &'a str> {
    let mut words = parts
        .flat_map(|part| part.split(|c: char| c == '_' || c.is_whitespace()))
        .filter(|word| !word.is_empty())
        .peekable();
    let _prefix = words.next_if(|word| word.eq_ignore_ascii_case("standard"));
    words
}

/// Whether `parts` spell this entry's name. Only Azure sizes may span several parts.
fn names<'a>(entry: &GpuInstance, mut parts: impl Iterator<Item = &'a str>) -> bool {
    if entry.cloud == Cloud::Azure {
        let mut expected = azure_words(std::iter::once(entry.name));
        let mut query = azure_words(parts);
        loop {
            match (expected.next(), query.next()) {
                (None, None) => return true,
                (Some(want), Some(got)) if want.eq_ignore_ascii_case(got) => {}
                _ => return false,
            }
        }
    }
    match (parts.next(), parts.next()) {
        (Some(part), None) => entry.name.eq_ignore_ascii_case(part),
        _ => false,
    }
}

/// The catalogue entry of an instance type, matched case-insensitively; Azure names match
/// with or without the `Standard_` prefix and with spaces for underscores (`ND96asr v4`).
pub fn lookup(instance_type: &str) -> Option<&'static GpuInstance> {
    let trimmed = instance_type.trim();
    if trimmed.is_empty() {
        return None;
    }
    CATALOGUE
        .iter()
        .find(|entry| names(entry, std::iter::once(trimmed)))
}

/// Whether a character separates the tokens of a bill row's free text.
fn is_separator(c: char) -> bool {
    c.is_whitespace() || matches!(c, ':' | ',' | ';' | '(' | ')' | '/' | '=' | '"' | '\'')
}

/// The first instance type of the catalogue named in free text of a bill row, such as AWS
/// `USE1-BoxUsage:p4d.24xlarge`, a ChargeDescription `$1.624 per On Demand Linux g5.4xlarge
/// Instance Hour`, an Azure meter `ND96asr v4` or `Standard_NC24ads_A100_v4`, a Google
/// Cloud `a2-highgpu-1g` or an OCI shape `BM.GPU.H100.8`. Tokens are split on whitespace,
/// `:`, `,`, `;`, `(`, `)`, `/`, `=` and quotes; an Azure meter may span several tokens
/// (`NC24ads A100 v4`), and the longest name starting at a token wins. `None` when the text
/// names no catalogue type (a fractional `NV6ads A10 v5` included).
pub fn find_in(text: &str) -> Option<&'static GpuInstance> {
    let tokens: Vec<&str> = text
        .split(is_separator)
        .filter(|token| !token.is_empty())
        .collect();
    (0..tokens.len()).find_map(|start| {
        let longest = MAX_NAME_TOKENS.min(tokens.len() - start);
        (1..=longest).rev().find_map(|len| {
            let window = &tokens[start..start + len];
            CATALOGUE
                .iter()
                .find(|entry| names(entry, window.iter().copied()))
        })
    })
}

/// Every entry of the catalogue (for documentation and tests).
pub fn all() -> &'static [GpuInstance] {
    CATALOGUE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cards(instance_type: &str) -> Option<(&'static str, u32)> {
        lookup(instance_type).map(|entry| (entry.gpu_model, entry.gpus))
    }

    fn found(text: &str) -> Option<&'static str> {
        find_in(text).map(|entry| entry.name)
    }

    #[test]
    fn each_clouds_types_are_looked_up() {
        assert_eq!(cards("p4d.24xlarge"), Some(("A100", 8)));
        assert_eq!(cards("P4D.24XLARGE"), Some(("A100", 8)));
        assert_eq!(cards("g5.xlarge"), Some(("A10G", 1)));
        assert_eq!(cards("g5.12xlarge"), Some(("A10G", 4)));
        assert_eq!(cards("g5.48xlarge"), Some(("A10G", 8)));
        assert_eq!(cards("p2.16xlarge"), Some(("K80", 16)));
        assert_eq!(cards("Standard_ND96asr_v4"), Some(("A100", 8)));
        assert_eq!(cards("nd96asr_v4"), Some(("A100", 8)));
        assert_eq!(cards("ND96asr v4"), Some(("A100", 8)));
        assert_eq!(cards("standard nd96asr v4"), Some(("A100", 8)));
        assert_eq!(cards("NC24ads A100 v4"), Some(("A100-80GB", 1)));
        assert_eq!(cards("Standard_NV72ads_A10_v5"), Some(("A10", 2)));
        assert_eq!(cards("a2-highgpu-1g"), Some(("A100", 1)));
        assert_eq!(cards("a2-ultragpu-8g"), Some(("A100-80GB", 8)));
        assert_eq!(cards("g2-standard-24"), Some(("L4", 2)));
        assert_eq!(cards("BM.GPU.H100.8"), Some(("H100", 8)));
        assert_eq!(cards(" bm.gpu.a100-v2.8 "), Some(("A100-80GB", 8)));
    }

    #[test]
    fn other_and_fractional_types_are_not_in_the_catalogue() {
        assert_eq!(cards("m5.large"), None);
        assert_eq!(cards(""), None);
        assert_eq!(cards("Standard_NV6ads_A10_v5"), None);
        assert_eq!(cards("NV18ads A10 v5"), None);
        assert_eq!(cards("ND96asr"), None, "half of a name is not the name");
        assert_eq!(
            cards("standard_p4d.24xlarge"),
            None,
            "only Azure has the prefix"
        );
        assert_eq!(found("ND96asr Standard v4"), None, "the prefix only leads");
        assert_eq!(cards("n1-standard-8"), None);
    }

    #[test]
    fn a_bill_rows_text_names_its_instance_type() {
        assert_eq!(found("USE1-BoxUsage:p4d.24xlarge"), Some("p4d.24xlarge"));
        assert_eq!(found("SpotUsage:g5.xlarge"), Some("g5.xlarge"));
        assert_eq!(
            found("$1.624 per On Demand Linux g5.4xlarge Instance Hour"),
            Some("g5.4xlarge")
        );
        assert_eq!(found("ND96asr v4"), Some("Standard_ND96asr_v4"));
        assert_eq!(found("ND96asr v4 Spot"), Some("Standard_ND96asr_v4"));
        assert_eq!(
            found("Standard_NC24ads_A100_v4"),
            Some("Standard_NC24ads_A100_v4")
        );
        assert_eq!(found("NC24ads A100 v4"), Some("Standard_NC24ads_A100_v4"));
        assert_eq!(
            found("Virtual Machines NDasrA100_v4 Series, ND96asr v4"),
            Some("Standard_ND96asr_v4")
        );
        assert_eq!(found("a2-highgpu-1g (us-central1)"), Some("a2-highgpu-1g"));
        assert_eq!(found("shape=BM.GPU.H100.8"), Some("BM.GPU.H100.8"));
        assert_eq!(found("\"g6e.12xlarge\""), Some("g6e.12xlarge"));
    }

    #[test]
    fn text_without_a_catalogue_type_names_none() {
        assert_eq!(found("BoxUsage:m5.large"), None);
        assert_eq!(found("USE1-DataTransfer-Out-Bytes"), None);
        assert_eq!(found("NV6ads A10 v5"), None);
        assert_eq!(found(""), None);
        assert_eq!(found(" : , ; "), None);
    }

    #[test]
    fn names_are_unique_and_every_entry_has_cards() {
        let entries = all();
        for (i, entry) in entries.iter().enumerate() {
            assert!(entry.gpus > 0, "{}", entry.name);
            assert!(!entry.gpu_model.is_empty(), "{}", entry.name);
            assert!(
                entries[i + 1..]
                    .iter()
                    .all(|other| !other.name.eq_ignore_ascii_case(entry.name)),
                "{} is listed twice",
                entry.name
            );
            assert_eq!(lookup(entry.name), Some(entry), "{}", entry.name);
        }
    }

    #[test]
    fn every_cloud_has_entries() {
        for cloud in [Cloud::Aws, Cloud::Azure, Cloud::GoogleCloud, Cloud::Oracle] {
            assert!(all().iter().any(|entry| entry.cloud == cloud), "{cloud:?}");
        }
    }
}
