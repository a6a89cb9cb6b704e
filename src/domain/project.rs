//! A project as given to the API, parsed into the fields the ledger stores: every field is
//! checked and every bad one named, the same way for a new project and for a change.

use rust_decimal::Decimal;

use super::idle;
use super::validation::Violations;
use super::values::{self, Currency, ProjectId};

/// The budget thresholds a project alerts at unless it names its own, in percent.
pub const DEFAULT_THRESHOLDS: [i32; 3] = [50, 80, 100];

/// The longest name or team, in characters.
const MAX_TEXT: usize = 200;

/// A project to create, as given.
#[derive(Debug, Clone, Copy)]
pub struct ProjectFields<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub team: Option<&'a str>,
    pub currency: &'a str,
    pub default_monthly_budget: Option<Decimal>,
    pub alert_thresholds: Option<&'a [i64]>,
    pub webhook_url: Option<&'a str>,
    /// Left out takes the default; `Some(None)` turns idle-GPU alerts off.
    pub idle_gpu_threshold: Option<Option<Decimal>>,
    pub idle_gpu_min_gpu_hours: Option<Decimal>,
}

/// A project ready to store.
#[derive(Debug, Clone)]
pub struct NewProject {
    pub id: String,
    pub name: String,
    pub team: Option<String>,
    pub currency: String,
    pub default_monthly_budget: Option<Decimal>,
    pub alert_thresholds: Vec<i32>,
    pub webhook_url: Option<String>,
    pub idle_gpu_threshold: Option<Decimal>,
    pub idle_gpu_min_gpu_hours: Decimal,
}

/// Changes to a project, as given: `None` leaves a field alone, `Some(None)` clears a
/// nullable one. The id and currency never change: a project's costs are kept in that
/// currency.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProjectEdit<'a> {
    pub name: Option<&'a str>,
    pub team: Option<Option<&'a str>>,
    pub default_monthly_budget: Option<Option<Decimal>>,
    pub alert_thresholds: Option<&'a [i64]>,
    pub webhook_url: Option<Option<&'a str>>,
    pub idle_gpu_threshold: Option<Option<Decimal>>,
    pub idle_gpu_min_gpu_hours: Option<Decimal>,
}

/// A change to a project ready to store: `None` leaves a field alone, `Some(None)` clears a
/// nullable one.
#[derive(Debug, Clone, Default)]
pub struct ProjectChanges {
    pub name: Option<String>,
    pub team: Option<Option<String>>,
    pub default_monthly_budget: Option<Option<Decimal>>,
    pub alert_thresholds: Option<Vec<i32>>,
    pub webhook_url: Option<Option<String>>,
    pub idle_gpu_threshold: Option<Option<Decimal>>,
    pub idle_gpu_min_gpu_hours: Option<Decimal>,
}

/// The checks both a new project and a change make, each naming its field's pointer.
struct Checks<'v> {
    violations: &'v mut Violations,
}

impl Checks<'_> {
    fn text(&mut self, pointer: &str, raw: &str) -> Option<String> {
        self.violations
            .check(pointer, values::bounded_text(raw, MAX_TEXT))
    }

    fn budget(&mut self, budget: Decimal) -> Option<Decimal> {
        self.violations
            .check("/default_monthly_budget", values::positive(budget))
    }

    fn thresholds(&mut self, list: &[i64]) -> Option<Vec<i32>> {
        self.violations
            .check("/alert_thresholds", values::alert_thresholds(list))
    }

    fn webhook_url(&mut self, url: &str) -> Option<String> {
        self.violations
            .check("/webhook_url", values::webhook_url(url))
    }

    /// An idle-GPU threshold as given: a share, or `None` for off.
    fn idle_threshold(&mut self, given: Option<Decimal>) -> Option<Decimal> {
        given.and_then(|t| {
            self.violations
                .check("/idle_gpu_threshold", idle::threshold(t))
        })
    }

    fn min_gpu_hours(&mut self, hours: Decimal) -> Option<Decimal> {
        self.violations
            .check("/idle_gpu_min_gpu_hours", values::positive(hours))
    }
}

impl ProjectFields<'_> {
    /// The project to store, or every field that is wrong.
    pub fn parse(&self) -> Result<NewProject, Violations> {
        let mut violations = Violations::default();
        let mut checks = Checks {
            violations: &mut violations,
        };
        let id = checks.violations.check("/id", ProjectId::parse(self.id));
        let name = checks.text("/name", self.name);
        let team = self.team.and_then(|team| checks.text("/team", team));
        let currency = checks
            .violations
            .check("/currency", Currency::parse(self.currency));
        let default_monthly_budget = self
            .default_monthly_budget
            .and_then(|budget| checks.budget(budget));
        let alert_thresholds = match self.alert_thresholds {
            Some(list) => checks.thresholds(list),
            None => Some(DEFAULT_THRESHOLDS.to_vec()),
        };
        let webhook_url = self.webhook_url.and_then(|url| checks.webhook_url(url));
        let idle_gpu_threshold = match self.idle_gpu_threshold {
            None => Some(idle::DEFAULT_THRESHOLD),
            Some(threshold) => checks.idle_threshold(threshold),
        };
        let idle_gpu_min_gpu_hours = self
            .idle_gpu_min_gpu_hours
            .and_then(|hours| checks.min_gpu_hours(hours))
            .unwrap_or(idle::DEFAULT_MIN_GPU_HOURS);
        violations.into_result()?;
        let (Some(id), Some(name), Some(currency), Some(alert_thresholds)) =
            (id, name, currency, alert_thresholds)
        else {
            unreachable!("every required field either parsed or was reported")
        };
        Ok(NewProject {
            id: id.as_str().to_owned(),
            name,
            team,
            currency: currency.code().to_owned(),
            default_monthly_budget,
            alert_thresholds,
            webhook_url,
            idle_gpu_threshold,
            idle_gpu_min_gpu_hours,
        })
    }
}

impl ProjectEdit<'_> {
    /// The change to store, or every field that is wrong.
    pub fn parse(&self) -> Result<ProjectChanges, Violations> {
        let mut violations = Violations::default();
        let mut checks = Checks {
            violations: &mut violations,
        };
        let changes = ProjectChanges {
            name: self.name.and_then(|name| checks.text("/name", name)),
            team: self
                .team
                .map(|team| team.and_then(|team| checks.text("/team", team))),
            default_monthly_budget: self
                .default_monthly_budget
                .map(|budget| budget.and_then(|b| checks.budget(b))),
            alert_thresholds: self
                .alert_thresholds
                .and_then(|list| checks.thresholds(list)),
            webhook_url: self
                .webhook_url
                .map(|url| url.and_then(|url| checks.webhook_url(url))),
            idle_gpu_threshold: self
                .idle_gpu_threshold
                .map(|threshold| checks.idle_threshold(threshold)),
            idle_gpu_min_gpu_hours: self
                .idle_gpu_min_gpu_hours
                .and_then(|hours| checks.min_gpu_hours(hours)),
        };
        violations.into_result()?;
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> ProjectFields<'static> {
        ProjectFields {
            id: "vision",
            name: "Vision",
            team: None,
            currency: "EUR",
            default_monthly_budget: None,
            alert_thresholds: None,
            webhook_url: None,
            idle_gpu_threshold: None,
            idle_gpu_min_gpu_hours: None,
        }
    }

    #[test]
    fn a_new_project_takes_the_defaults_it_leaves_out() {
        let project = fields().parse().unwrap();
        assert_eq!(project.currency, "EUR");
        assert_eq!(project.alert_thresholds, DEFAULT_THRESHOLDS);
        assert_eq!(project.idle_gpu_threshold, Some(idle::DEFAULT_THRESHOLD));
        assert_eq!(project.idle_gpu_min_gpu_hours, idle::DEFAULT_MIN_GPU_HOURS);
        let off = ProjectFields {
            idle_gpu_threshold: Some(None),
            ..fields()
        };
        assert_eq!(off.parse().unwrap().idle_gpu_threshold, None);
    }

    #[test]
    fn every_bad_field_is_named() {
        let bad = ProjectFields {
            id: "Vision!",
            currency: "EURO",
            default_monthly_budget: Some(Decimal::ZERO),
            alert_thresholds: Some(&[80, 50]),
            webhook_url: Some("ftp://example.com"),
            idle_gpu_threshold: Some(Some(Decimal::TWO)),
            idle_gpu_min_gpu_hours: Some(Decimal::NEGATIVE_ONE),
            ..fields()
        };
        let pointers: Vec<String> = bad
            .parse()
            .unwrap_err()
            .into_vec()
            .into_iter()
            .map(|violation| violation.pointer)
            .collect();
        assert_eq!(
            pointers,
            [
                "/id",
                "/currency",
                "/default_monthly_budget",
                "/alert_thresholds",
                "/webhook_url",
                "/idle_gpu_threshold",
                "/idle_gpu_min_gpu_hours"
            ]
        );
    }

    #[test]
    fn a_change_names_its_bad_fields_and_clears_what_is_null() {
        let edit = ProjectEdit {
            team: Some(None),
            webhook_url: Some(None),
            ..ProjectEdit::default()
        };
        let changes = edit.parse().unwrap();
        assert_eq!(changes.team, Some(None));
        assert_eq!(changes.webhook_url, Some(None));
        assert_eq!(changes.name, None);
        let bad = ProjectEdit {
            name: Some(""),
            default_monthly_budget: Some(Some(Decimal::NEGATIVE_ONE)),
            ..ProjectEdit::default()
        };
        assert_eq!(bad.parse().unwrap_err().len(), 2);
    }
}
