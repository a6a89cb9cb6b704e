//! The report as CSV for spreadsheets: a row per project and per group of it, per shared
//! line, per pool keeping idle or down cost on its own line, per adjustment and per
//! currency total, under one header.

use rust_decimal::{Decimal, RoundingStrategy};

use super::model::{AdjustmentLine, MonthlyReport, ProjectLine, SharedLine, TotalLine};
use crate::domain::figures::Figures;
use crate::domain::values::round_money;
use crate::exports::csv_cell::text_cell;
use crate::ledger::LedgerResult;
use crate::ledger::capacity::PoolUtilisation;

const CSV_HEADER: [&str; 33] = [
    "row_type",
    "month",
    "belongs_to",
    "project",
    "name",
    "team",
    "group",
    "currency",
    "total",
    "productive",
    "idle",
    "unmeasured",
    "failed",
    "unused_commitment",
    "capacity_idle",
    "capacity_down",
    "waste",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "unrated_gpu_seconds",
    "tasks_completed",
    "tasks_failed",
    "cost_per_completed_task",
    "budget",
    "burn_pct",
    "gpu_util",
    "sm_active",
    "unused_memory_share",
    "looks_busy_cost",
    "energy_kwh",
    "energy_coverage",
    "kg_co2e",
    "emissions_coverage",
];

/// The report as CSV, from its JSON form (so a frozen report renders the same bytes every
/// time). Money is rounded half-even to the currency's minor unit; totals are rounded from
/// their unrounded sums; text cells are neutralised.
pub fn to_csv(report_json: &str) -> LedgerResult<String> {
    let report: MonthlyReport = serde_json::from_str(report_json).map_err(anyhow::Error::from)?;
    let mut writer = ::csv::Writer::from_writer(Vec::new());
    writer
        .write_record(CSV_HEADER)
        .map_err(anyhow::Error::from)?;
    for row in rows(&report) {
        writer.write_record(&row).map_err(anyhow::Error::from)?;
    }
    let bytes = writer.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(String::from_utf8(bytes).map_err(anyhow::Error::from)?)
}

/// The rows under the header, each as wide as the header.
fn rows(report: &MonthlyReport) -> Vec<Vec<String>> {
    let month = report.month.to_string();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for line in &report.projects {
        rows.extend(project_rows(&month, line));
    }
    rows.extend(report.shared.iter().map(|line| shared_row(&month, line)));
    rows.extend(
        report
            .pools
            .iter()
            .filter_map(|line| pool_row(&month, line)),
    );
    rows.extend(
        report
            .adjustments
            .iter()
            .map(|line| adjustment_row(&month, line)),
    );
    rows.extend(report.totals.iter().map(|line| total_row(&month, line)));
    for row in &mut rows {
        row.resize(CSV_HEADER.len(), String::new());
    }
    rows
}

/// A project's row, with its budget and burn, then a row per group of it.
fn project_rows(month: &str, line: &ProjectLine) -> Vec<Vec<String>> {
    let currency = &line.currency;
    let labels = |row_type: &str, group: Option<&str>| {
        vec![
            row_type.to_owned(),
            month.to_owned(),
            String::new(),
            cell(&line.project),
            cell(&line.name),
            optional_cell(line.team.as_deref()),
            optional_cell(group),
            cell(currency),
        ]
    };
    let mut project = labels("project", None);
    project.extend(figure_cells(&line.figures, currency));
    project.push(
        line.budget
            .map(|budget| money(budget, currency))
            .unwrap_or_default(),
    );
    project.push(
        line.burn_pct
            .map(|burn| rounded(burn, 2))
            .unwrap_or_default(),
    );
    project.extend(utilisation_cells(&line.figures, currency));
    project.extend(energy_cells(&line.figures));
    let groups = line.groups.iter().map(|group| {
        let mut row = labels("group", group.key.as_deref());
        row.extend(figure_cells(&group.figures, currency));
        row.extend([String::new(), String::new()]);
        row.extend(utilisation_cells(&group.figures, currency));
        row.extend(energy_cells(&group.figures));
        row
    });
    std::iter::once(project).chain(groups).collect()
}

/// The cells from `total` to `cost_per_completed_task`.
fn figure_cells(figures: &Figures, currency: &str) -> Vec<String> {
    let breakdown = &figures.breakdown;
    let mut cells: Vec<String> = [
        figures.total,
        breakdown.productive,
        breakdown.idle,
        breakdown.unmeasured,
        breakdown.failed,
        breakdown.unused_commitment,
        breakdown.capacity_idle,
        breakdown.capacity_down,
        figures.waste,
    ]
    .into_iter()
    .map(|amount| money(amount, currency))
    .collect();
    cells.extend(
        [
            figures.gpu_seconds_held,
            figures.gpu_seconds_busy,
            figures.unrated_gpu_seconds,
        ]
        .map(|seconds| rounded(seconds, 3)),
    );
    cells.push(figures.tasks_completed.to_string());
    cells.push(figures.tasks_failed.to_string());
    cells.push(
        figures
            .cost_per_completed_task
            .map(|cost| money(cost, currency))
            .unwrap_or_default(),
    );
    cells
}

/// The headline of what the GPUs really did: held-weighted GPU-Util against SM activity,
/// the share of the reported memory nobody used, and the cost that looks busy. Empty where
/// no record reported the figure.
fn utilisation_cells(figures: &Figures, currency: &str) -> [String; 4] {
    let utilisation = figures.utilisation.as_ref();
    let share = |value: Option<Decimal>| value.map(|v| rounded(v, 4)).unwrap_or_default();
    [
        share(utilisation.and_then(|u| u.gpu_util)),
        share(utilisation.and_then(|u| u.sm_active)),
        share(utilisation.and_then(|u| u.memory_used_share.map(|used| Decimal::ONE - used))),
        figures
            .looks_busy_cost
            .map(|cost| money(cost, currency))
            .unwrap_or_default(),
    ]
}

/// Energy in kWh (to the Wh) and emissions in kg CO2e (to the gram), each with its coverage;
/// empty where no record measured energy, and emissions empty where no intensity applied.
fn energy_cells(figures: &Figures) -> [String; 4] {
    let energy = figures.energy.as_ref();
    let emissions = figures.emissions.as_ref();
    [
        energy.map(|e| rounded(e.kwh, 3)).unwrap_or_default(),
        energy.map(|e| rounded(e.coverage, 4)).unwrap_or_default(),
        emissions
            .and_then(|e| e.kg_co2e)
            .map(|kg| rounded(kg, 3))
            .unwrap_or_default(),
        emissions
            .map(|e| rounded(e.coverage, 4))
            .unwrap_or_default(),
    ]
}

/// The shared unused commitment: all of the line's total, and all of it waste.
fn shared_row(month: &str, line: &SharedLine) -> Vec<String> {
    let unused = money(line.unused_commitment, &line.currency);
    vec![
        "shared".to_owned(),
        month.to_owned(),
        String::new(),
        String::new(),
        "shared".to_owned(),
        String::new(),
        String::new(),
        cell(&line.currency),
        unused.clone(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        unused.clone(),
        String::new(),
        String::new(),
        unused,
    ]
}

/// The idle and down cost a pool keeps on its own line (charged to no project): all of
/// the line's total, and all of it waste. A pool whose time no contract prices has none.
fn pool_row(month: &str, line: &PoolUtilisation) -> Option<Vec<String>> {
    let currency = line.currency.as_deref()?;
    let kept = &line.kept_on_pool;
    let total = kept.capacity_idle + kept.capacity_down;
    Some(vec![
        "pool".to_owned(),
        month.to_owned(),
        String::new(),
        String::new(),
        cell(&line.pool),
        String::new(),
        String::new(),
        cell(currency),
        money(total, currency),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        money(kept.capacity_idle, currency),
        money(kept.capacity_down, currency),
        money(total, currency),
    ])
}

fn adjustment_row(month: &str, line: &AdjustmentLine) -> Vec<String> {
    let mut row = vec![
        "adjustment".to_owned(),
        month.to_owned(),
        line.belongs_to.to_string(),
        optional_cell(line.project.as_deref()),
        if line.project.is_none() {
            "shared".to_owned()
        } else {
            String::new()
        },
        String::new(),
        String::new(),
        cell(&line.currency),
    ];
    row.extend(
        line.amounts
            .values()
            .map(|amount| money(amount, &line.currency)),
    );
    row
}

fn total_row(month: &str, line: &TotalLine) -> Vec<String> {
    vec![
        "total".to_owned(),
        month.to_owned(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        cell(&line.currency),
        money(line.total, &line.currency),
    ]
}

fn money(amount: Decimal, currency: &str) -> String {
    round_money(amount, currency).to_string()
}

fn rounded(value: Decimal, digits: u32) -> String {
    value
        .round_dp_with_strategy(digits, RoundingStrategy::MidpointNearestEven)
        .normalize()
        .to_string()
}

fn cell(text: &str) -> String {
    text_cell(text).into_owned()
}

fn optional_cell(text: Option<&str>) -> String {
    text.map(cell).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_rounds_half_even_to_the_minor_unit() {
        let d = |s: &str| s.parse::<Decimal>().unwrap();
        assert_eq!(round_money(d("0.125"), "USD"), d("0.12"));
        assert_eq!(round_money(d("0.135"), "USD"), d("0.14"));
        assert_eq!(round_money(d("0.1250001"), "USD"), d("0.13"));
        assert_eq!(round_money(d("2.5"), "JPY"), d("2"));
        assert_eq!(round_money(d("1.0005"), "BHD"), d("1.000"));
        assert_eq!(round_money(d("84.6"), "USD").to_string(), "84.60");
        assert_eq!(round_money(d("-5"), "USD").to_string(), "-5.00");
    }
}
