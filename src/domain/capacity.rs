//! Capacity (COST_MODEL.md §9): the GPUs that are paid for, with or without a job on them.
//!
//! A node is known over intervals, each `up` or `down`. Per ledger hour and node, in
//! GPU-seconds: `paid` is the node's GPUs × the time known in the hour, `down` the part of it
//! down, `used` the held GPU-seconds of the records that ran on the node in the hour (each
//! record's spread evenly over the nodes it names), at most the up time's GPU-seconds, and
//! `idle = paid − used − down`. What the records put beyond the up time is `overbooked`, and
//! what they put on a node in an hour no interval covers is `unmatched`: both point at
//! input that is wrong or missing, and neither is dropped.
//!
//! Everything here is GPU-seconds; prices are applied when a figure is read, by the contract
//! that prices each piece of an interval as it would price a record of the same model,
//! billing mode, provider, region and the pool owner's project.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::figures::SUM_SCALE;
use super::ledger_time::{LedgerHour, first_instant_of_day, first_of_month, seconds_between};
use super::rating::{BillingMode, Contract, Outcome, RecordToRate, contract_spans};
use super::record::{FUTURE_TOLERANCE_SECONDS, Fields, MAX_NAME_CHARS, format_time};
use super::validation::{Violations, escape_pointer_token};
use super::values::{self, ProjectId};

/// Idle time that fires a zombie alert when a pool does not say.
pub const DEFAULT_ZOMBIE_AFTER_MINUTES: i32 = 120;
/// The longest `zombie_after_minutes`: a year.
pub const MAX_ZOMBIE_AFTER_MINUTES: i64 = 525_600;
/// The most GPUs one node may have; beyond it a value is a mistake.
pub const MAX_NODE_GPUS: i64 = 1024;
/// The most intervals one request may carry.
pub const MAX_INTERVALS: usize = 10_000;
/// The longest one interval may be: a longer one is split by whoever sends it.
pub const MAX_INTERVAL_DAYS: i64 = 366;
const MAX_POOL_ID_CHARS: usize = 128;

/// Who pays for a pool's idle and down time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareIdle {
    /// All of it to the pool's owner project.
    Owner,
    /// Split over the projects by their used GPU-seconds on the pool's nodes in the month.
    ByUsage,
    /// Kept on the pool's own line.
    Pool,
}

impl ShareIdle {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareIdle::Owner => "owner",
            ShareIdle::ByUsage => "by_usage",
            ShareIdle::Pool => "pool",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "owner" => Some(ShareIdle::Owner),
            "by_usage" => Some(ShareIdle::ByUsage),
            "pool" => Some(ShareIdle::Pool),
            _ => None,
        }
    }
}

impl TryFrom<String> for ShareIdle {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        ShareIdle::parse(&raw).ok_or_else(|| format!("`{raw}` is not an idle share rule"))
    }
}

/// Whether a node could run jobs over an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Up,
    /// Drained, failed or in maintenance: paid, and unable to run a job.
    Down,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Down => "down",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "up" => Some(NodeState::Up),
            "down" => Some(NodeState::Down),
            _ => None,
        }
    }
}

impl TryFrom<String> for NodeState {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        NodeState::parse(&raw).ok_or_else(|| format!("`{raw}` is not a node state"))
    }
}

/// A pool's id: 1 to 128 lowercase letters, digits, `.`, `_` or `-`, starting and ending
/// with a letter or digit (a nodepool or partition name, lowercased).
pub fn pool_id(raw: &str) -> Result<String, String> {
    let valid = !raw.is_empty()
        && raw.len() <= MAX_POOL_ID_CHARS
        && raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && raw
            .bytes()
            .next()
            .zip(raw.bytes().last())
            .is_some_and(|(first, last)| {
                first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric()
            });
    if valid {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "a pool id is 1-{MAX_POOL_ID_CHARS} lowercase letters, digits, `.`, `_` or `-`, \
             starting and ending with a letter or digit"
        ))
    }
}

/// A pool's settings as `PUT /v1/pools/{id}` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSettings {
    pub name: String,
    pub owner_project: Option<String>,
    pub share_idle: ShareIdle,
    /// `None` turns zombie alerts off.
    pub zombie_after_minutes: Option<i32>,
}

impl PoolSettings {
    /// Parses the body of a `PUT`, reporting every bad field. `share_idle` defaults to
    /// `owner` with an owner and `pool` without; `zombie_after_minutes` to two hours when
    /// absent, and `null` turns zombie alerts off.
    pub fn parse(value: &Value) -> Result<Self, Violations> {
        let mut v = Violations::default();
        let Some(object) = value.as_object() else {
            v.push("", "the body must be a JSON object");
            return Err(v);
        };
        unknown_fields(
            object,
            "",
            &[
                "name",
                "owner_project",
                "share_idle",
                "zombie_after_minutes",
            ],
            &mut v,
        );
        let mut fields = Fields::new(object, "", &mut v);
        let name = fields.required_text("name", 200);
        let owner = fields
            .optional_text("owner_project", MAX_NAME_CHARS)
            .map(|owner| {
                owner.and_then(|raw| match ProjectId::parse(&raw) {
                    Ok(id) => Some(id.as_str().to_owned()),
                    Err(message) => {
                        fields.check::<()>("owner_project", Err(message));
                        None
                    }
                })
            });
        let share = fields.choice("share_idle", ShareIdle::parse, "owner, by_usage, pool");
        let zombie_after = match object.get("zombie_after_minutes") {
            None => Some(Some(DEFAULT_ZOMBIE_AFTER_MINUTES)),
            Some(Value::Null) => Some(None),
            Some(_) => fields
                .integer("zombie_after_minutes", 1, MAX_ZOMBIE_AFTER_MINUTES)
                .flatten()
                .map(|minutes| Some(minutes as i32)),
        };
        let share = match (share, &owner) {
            (None, Some(owner)) => Some(if owner.is_some() {
                ShareIdle::Owner
            } else {
                ShareIdle::Pool
            }),
            (Some(Some(ShareIdle::Owner)), Some(None)) => {
                v.push(
                    "/share_idle",
                    "`owner` needs an owner_project; use by_usage or pool",
                );
                None
            }
            (Some(share), _) => share,
            (None, None) => None,
        };
        if !v.is_empty() {
            return Err(v);
        }
        match (name, owner, share, zombie_after) {
            (Some(name), Some(owner_project), Some(share_idle), Some(zombie_after_minutes)) => {
                Ok(PoolSettings {
                    name,
                    owner_project,
                    share_idle,
                    zombie_after_minutes,
                })
            }
            _ => unreachable!("every field either parsed or was reported"),
        }
    }
}

fn unknown_fields(object: &Map<String, Value>, pointer: &str, known: &[&str], v: &mut Violations) {
    for name in object.keys() {
        if !known.contains(&name.as_str()) {
            v.push(
                format!("{pointer}/{}", escape_pointer_token(name)),
                format!("unknown field `{name}`"),
            );
        }
    }
}

/// One interval of one node, as `POST /v1/capacity` gives it, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityInterval {
    pub node: String,
    pub pool: String,
    pub gpu_model: String,
    pub gpus: i32,
    pub billing_mode: BillingMode,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub state: NodeState,
}

const INTERVAL_FIELDS: [&str; 11] = [
    "node",
    "pool",
    "gpu_model",
    "gpus",
    "billing_mode",
    "provider",
    "region",
    "labels",
    "from",
    "until",
    "state",
];

/// The canonical form of an interval, fields in key order, whose hash tells a re-sent
/// interval from a changed one.
#[derive(Serialize)]
struct CanonicalInterval<'a> {
    billing_mode: &'static str,
    from: String,
    gpu_model: &'a str,
    gpus: i32,
    labels: &'a BTreeMap<String, String>,
    node: &'a str,
    pool: &'a str,
    provider: Option<&'a str>,
    region: Option<&'a str>,
    state: &'static str,
    until: String,
}

impl CapacityInterval {
    /// The GPU-seconds the node's GPUs are paid for over the whole interval.
    pub fn gpu_seconds(&self) -> Decimal {
        Decimal::from(self.gpus) * seconds_between(self.from, self.until)
    }

    /// The keys a bill row may name the node by (see [`super::bill::node_keys`]).
    pub fn resource_keys(&self) -> Vec<String> {
        let mut keys = super::bill::node_keys(
            &self.node,
            self.labels.get("provider_id").map(String::as_str),
        );
        keys.retain(|key| !key.contains('\n'));
        keys
    }

    /// SHA-256 of the canonical form: equal intervals hash equal.
    pub fn content_hash(&self) -> Vec<u8> {
        let canonical = CanonicalInterval {
            billing_mode: self.billing_mode.as_str(),
            from: format_time(self.from),
            gpu_model: &self.gpu_model,
            gpus: self.gpus,
            labels: &self.labels,
            node: &self.node,
            pool: &self.pool,
            provider: self.provider.as_deref(),
            region: self.region.as_deref(),
            state: self.state.as_str(),
            until: format_time(self.until),
        };
        let mut hasher = Sha256::new();
        serde_json::to_writer(&mut hasher, &canonical).expect("hashing cannot fail");
        hasher.finalize().to_vec()
    }

    /// Parses the interval at `pointer`, reporting every bad field.
    fn parse(value: &Value, pointer: &str, now: DateTime<Utc>) -> Result<Self, Violations> {
        let mut v = Violations::default();
        let Some(object) = value.as_object() else {
            v.push(pointer, "an interval must be a JSON object");
            return Err(v);
        };
        unknown_fields(object, pointer, &INTERVAL_FIELDS, &mut v);
        let mut fields = Fields::new(object, pointer, &mut v);
        let node = fields
            .required_text("node", values::MAX_NODE_CHARS)
            .and_then(|raw| fields.check("node", values::node_name(&raw)));
        let pool = fields
            .required_text("pool", MAX_POOL_ID_CHARS)
            .and_then(|raw| fields.check("pool", pool_id(&raw)));
        let gpu_model = fields.required_text("gpu_model", MAX_NAME_CHARS);
        let gpus = fields.integer("gpus", 1, MAX_NODE_GPUS).unwrap_or_else(|| {
            fields.missing("gpus");
            None
        });
        let billing_mode = fields
            .choice(
                "billing_mode",
                BillingMode::parse,
                "on_demand, spot, reserved",
            )
            .unwrap_or_else(|| {
                fields.missing("billing_mode");
                None
            });
        let provider = fields.optional_text("provider", MAX_NAME_CHARS);
        let region = fields.optional_text("region", MAX_NAME_CHARS);
        let labels = fields.labels();
        let from = fields.required_time("from");
        let until = fields.required_time("until");
        let state = fields
            .choice("state", NodeState::parse, "up, down")
            .unwrap_or_else(|| {
                fields.missing("state");
                None
            });
        if let (Some(from), Some(until)) = (from, until) {
            if until <= from {
                v.push(format!("{pointer}/until"), "must be later than from");
            } else if until - from > chrono::TimeDelta::days(MAX_INTERVAL_DAYS) {
                v.push(
                    format!("{pointer}/until"),
                    format!("the interval lasts longer than {MAX_INTERVAL_DAYS} days; split it"),
                );
            }
        }
        if let Some(until) = until
            && until > now + chrono::TimeDelta::seconds(FUTURE_TOLERANCE_SECONDS)
        {
            v.push(
                format!("{pointer}/until"),
                "lies more than 5 minutes in the future: capacity is posted as it is known",
            );
        }
        if let Some(from) = from
            && from < DateTime::UNIX_EPOCH
        {
            v.push(
                format!("{pointer}/from"),
                "must not be before 1970-01-01T00:00:00Z",
            );
        }
        if !v.is_empty() {
            return Err(v);
        }
        match (
            node,
            pool,
            gpu_model,
            gpus,
            billing_mode,
            provider,
            region,
            labels,
            from,
            until,
            state,
        ) {
            (
                Some(node),
                Some(pool),
                Some(gpu_model),
                Some(gpus),
                Some(billing_mode),
                Some(provider),
                Some(region),
                Some(labels),
                Some(from),
                Some(until),
                Some(state),
            ) => Ok(CapacityInterval {
                node,
                pool,
                gpu_model,
                gpus: gpus as i32,
                billing_mode,
                provider,
                region,
                labels,
                from,
                until,
                state,
            }),
            _ => unreachable!("every field either parsed or was reported"),
        }
    }
}

/// Parses the body of `POST /v1/capacity`: an array of intervals. Every bad field is
/// reported; so is an interval that overlaps another of the same node in the body, with
/// the pointer of the other. An interval given twice with the same content is kept once;
/// twice with different content under one `(node, from)` is refused.
pub fn parse_intervals(
    value: &Value,
    now: DateTime<Utc>,
) -> Result<Vec<CapacityInterval>, Violations> {
    let mut v = Violations::default();
    let Some(items) = value.as_array() else {
        v.push("", "the body must be a JSON array of intervals");
        return Err(v);
    };
    if items.is_empty() || items.len() > MAX_INTERVALS {
        v.push(
            "",
            format!(
                "send 1 to {MAX_INTERVALS} intervals per request, got {}",
                items.len()
            ),
        );
        return Err(v);
    }
    let mut parsed: Vec<(usize, CapacityInterval)> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match CapacityInterval::parse(item, &format!("/{index}"), now) {
            Ok(interval) => parsed.push((index, interval)),
            Err(errors) => v.extend(errors),
        }
    }
    parsed.sort_by(|(ia, a), (ib, b)| (&a.node, a.from, ia).cmp(&(&b.node, b.from, ib)));
    let mut kept: Vec<(usize, CapacityInterval)> = Vec::with_capacity(parsed.len());
    for (index, interval) in parsed {
        if let Some((previous_index, previous)) = kept.last()
            && previous.node == interval.node
        {
            if previous.from == interval.from && *previous == interval {
                continue;
            }
            if previous.from == interval.from {
                v.push(
                    format!("/{index}"),
                    format!(
                        "node `{}` from {} is given again at /{previous_index} with other content",
                        interval.node,
                        format_time(interval.from)
                    ),
                );
                continue;
            }
            if interval.from < previous.until {
                v.push(
                    format!("/{index}/from"),
                    format!(
                        "overlaps /{previous_index} (node `{}` from {} until {})",
                        interval.node,
                        format_time(previous.from),
                        format_time(previous.until)
                    ),
                );
                continue;
            }
        }
        kept.push((index, interval));
    }
    v.into_result()?;
    Ok(kept.into_iter().map(|(_, interval)| interval).collect())
}

/// The held GPU-seconds the records put on one node in one ledger hour, for one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUse {
    pub node: String,
    /// Start of the ledger hour.
    pub hour: DateTime<Utc>,
    pub project: String,
    pub gpu_seconds: Decimal,
}

/// GPU-seconds of capacity: `paid = used + idle + down` exactly; `overbooked` is what
/// records put beyond the up time, outside `paid`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapacitySeconds {
    pub paid: Decimal,
    pub used: Decimal,
    pub idle: Decimal,
    pub down: Decimal,
    pub overbooked: Decimal,
}

impl CapacitySeconds {
    pub fn add(&mut self, other: &CapacitySeconds) {
        self.paid += other.paid;
        self.used += other.used;
        self.idle += other.idle;
        self.down += other.down;
        self.overbooked += other.overbooked;
    }
}

/// What one node's capacity came to on one ledger day under one contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDay {
    pub pool: String,
    pub node: String,
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    /// The node's GPUs in the latest interval of the day.
    pub gpus: i32,
    pub day: NaiveDate,
    /// First day of the ledger month.
    pub month: NaiveDate,
    /// The contract pricing this time; `None` when none does.
    pub contract_id: Option<Uuid>,
    pub seconds: CapacitySeconds,
}

/// The capacity figures of a window, in GPU-seconds, before prices.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CapacityFigures {
    /// By pool, node, day and contract.
    pub days: Vec<NodeDay>,
    /// GPU-seconds records put on a pool's node in hours no interval of it covers: pool →
    /// node → seconds.
    pub unmatched: BTreeMap<String, BTreeMap<String, Decimal>>,
    /// The held GPU-seconds each project put on a pool's nodes in each ledger month, in the
    /// hours the nodes' capacity is known: (pool, month) → project → seconds. `by_usage`
    /// shares are of these.
    pub usage: BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>>,
}

/// One piece of an interval: inside one ledger day (or hour) and one contract's validity.
#[derive(Debug)]
struct Piece<'a> {
    interval: &'a CapacityInterval,
    start: DateTime<Utc>,
    contract_id: Option<Uuid>,
    seconds: Decimal,
}

pub(crate) type DayKey = (String, String, NaiveDate, Option<Uuid>);

/// The capacity figures of `[from, to)`: `intervals` (of any pools, in any order) cut at
/// every ledger day and at every boundary of a contract among `contracts` that could price
/// them, each hour's `usage` set against the up time of its node in that hour. `owners`
/// gives each pool's owner project, the project scope its contracts are matched with.
///
/// Paid and down time are linear in time, so they are summed per day; only the hours with
/// usage are cut finer, to cap their used time at their up time. This is the figures worked
/// out from scratch; reads take the used time of whole days from the rollup instead (see
/// [`DayPlan`]), which comes to the same.
pub fn capacity_figures(
    intervals: &[CapacityInterval],
    usage: &[NodeUse],
    book: &PriceBook<'_>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> CapacityFigures {
    let mut uses_of: HashMap<&str, HourUses<'_>> = HashMap::new();
    for used in usage {
        if used.hour >= from && used.hour < to {
            uses_of
                .entry(used.node.as_str())
                .or_default()
                .entry(used.hour)
                .or_default()
                .push(used);
        }
    }
    let mut figures = CapacityFigures::default();
    let mut days: BTreeMap<DayKey, NodeDay> = BTreeMap::new();
    for (node, node_intervals) in by_node(intervals, (from, to)) {
        for piece in pieces_of(&node_intervals, book, (from, to), tz, Cut::Day) {
            add_paid(&mut days, &piece, tz);
        }
        let uses = uses_of.remove(node).unwrap_or_default();
        let unmatched = settle_node(
            &node_intervals,
            &uses,
            book,
            tz,
            &mut days,
            &mut figures.usage,
        );
        if !unmatched.is_zero() {
            let pool = &node_intervals.last().expect("a node has intervals").pool;
            *figures
                .unmatched
                .entry(pool.clone())
                .or_default()
                .entry(node.to_owned())
                .or_default() += unmatched;
        }
    }
    figures.days = finished(days);
    figures
}

/// One node's usage by ledger hour.
pub(crate) type HourUses<'a> = BTreeMap<DateTime<Utc>, Vec<&'a NodeUse>>;

/// `intervals` overlapping `[from, to)`, by node, each node's sorted by start.
pub(crate) fn by_node(
    intervals: &[CapacityInterval],
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> BTreeMap<&str, Vec<&CapacityInterval>> {
    let mut by_node: BTreeMap<&str, Vec<&CapacityInterval>> = BTreeMap::new();
    for interval in intervals {
        if interval.until > from && interval.from < to {
            by_node.entry(&interval.node).or_default().push(interval);
        }
    }
    for node_intervals in by_node.values_mut() {
        node_intervals.sort_by_key(|interval| interval.from);
    }
    by_node
}

/// Adds a day piece's paid (and down) time to its node-day.
fn add_paid(days: &mut BTreeMap<DayKey, NodeDay>, piece: &Piece<'_>, tz: Tz) {
    let seconds = CapacitySeconds {
        paid: piece.seconds,
        down: if piece.interval.state == NodeState::Down {
            piece.seconds
        } else {
            Decimal::ZERO
        },
        ..CapacitySeconds::default()
    };
    // Day pieces come in time order: the day keeps its latest interval's GPUs.
    let day = day_of(days, piece, tz);
    day.gpus = piece.interval.gpus;
    day.seconds.add(&seconds);
}

/// The node-days with their idle time: what is left of paid once used and down are taken.
fn finished(days: BTreeMap<DayKey, NodeDay>) -> Vec<NodeDay> {
    days.into_values()
        .map(|mut day| {
            let s = &mut day.seconds;
            s.idle = s.paid - s.used - s.down;
            day
        })
        .collect()
}

/// Sets each hour of one node's `uses` against the pieces of its intervals in that hour
/// (see [`settle_hour`]); returns the GPU-seconds of the hours no interval covers.
pub(crate) fn settle_node(
    node_intervals: &[&CapacityInterval],
    uses: &HourUses<'_>,
    book: &PriceBook<'_>,
    tz: Tz,
    days: &mut BTreeMap<DayKey, NodeDay>,
    usage: &mut BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>>,
) -> Decimal {
    let mut unmatched = Decimal::ZERO;
    for (&hour, hour_uses) in uses {
        let end = LedgerHour::holding(hour, tz).end;
        let covering: Vec<&CapacityInterval> = node_intervals
            .iter()
            .copied()
            .filter(|i| i.from < end && i.until > hour)
            .collect();
        let pieces = pieces_of(&covering, book, (hour, end), tz, Cut::None);
        if pieces.is_empty() {
            unmatched += hour_uses.iter().map(|u| u.gpu_seconds).sum::<Decimal>();
            continue;
        }
        settle_hour(&pieces, hour_uses, tz, days, usage);
    }
    unmatched
}

/// What the records put on one node on one ledger day in one pool's intervals, in
/// GPU-seconds: a row of the capacity rollup. Contracts play no part in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDayUse {
    pub node: String,
    pub day: NaiveDate,
    pub pool: String,
    /// Held time capped at each hour's up time.
    pub used: Decimal,
    /// Held time beyond each hour's up time.
    pub overbooked: Decimal,
    /// What each project put on the node in the hours its capacity is known, for the
    /// hours whose first interval is of this pool: the weights of `by_usage`.
    pub usage: BTreeMap<String, Decimal>,
}

/// What records put on one node on one ledger day in hours no interval covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnmatchedDay {
    pub node: String,
    pub day: NaiveDate,
    pub gpu_seconds: Decimal,
}

/// The capacity rollup of every node-day `usage` (hourly) falls on, from the nodes'
/// `intervals` (all of them that overlap those days): the rows of node-days with usage,
/// and what fell outside every interval. Node-days without usage have no rows.
pub fn node_day_rollup(
    intervals: &[CapacityInterval],
    usage: &[NodeUse],
    tz: Tz,
) -> (Vec<NodeDayUse>, Vec<UnmatchedDay>) {
    let mut uses_of: BTreeMap<(&str, NaiveDate), HourUses<'_>> = BTreeMap::new();
    for used in usage {
        let day = used.hour.with_timezone(&tz).date_naive();
        uses_of
            .entry((used.node.as_str(), day))
            .or_default()
            .entry(used.hour)
            .or_default()
            .push(used);
    }
    let nodes = by_node(
        intervals,
        (DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC),
    );
    let unpriced = PriceBook::default();
    let mut rows = Vec::new();
    let mut unmatched_days = Vec::new();
    for ((node, day), uses) in uses_of {
        let (start, end) = day_bounds(day, tz);
        let node_intervals: Vec<&CapacityInterval> = nodes
            .get(node)
            .map(|all| {
                all.iter()
                    .copied()
                    .filter(|i| i.from < end && i.until > start)
                    .collect()
            })
            .unwrap_or_default();
        let mut days = BTreeMap::new();
        let mut usage = BTreeMap::new();
        let unmatched = settle_node(&node_intervals, &uses, &unpriced, tz, &mut days, &mut usage);
        if !unmatched.is_zero() {
            unmatched_days.push(UnmatchedDay {
                node: node.to_owned(),
                day,
                gpu_seconds: unmatched,
            });
        }
        for node_day in days.into_values() {
            let usage = usage
                .get(&(node_day.pool.clone(), node_day.month))
                .cloned()
                .unwrap_or_default();
            let seconds = node_day.seconds;
            if seconds.used.is_zero() && seconds.overbooked.is_zero() && usage.is_empty() {
                continue;
            }
            rows.push(NodeDayUse {
                node: node_day.node,
                day: node_day.day,
                pool: node_day.pool,
                used: seconds.used,
                overbooked: seconds.overbooked,
                usage,
            });
        }
    }
    (rows, unmatched_days)
}

/// `[start, end)` of a ledger day.
pub fn day_bounds(day: NaiveDate, tz: Tz) -> (DateTime<Utc>, DateTime<Utc>) {
    let next = day.succ_opt().expect("a day before the end of time");
    (
        first_instant_of_day(day, tz),
        first_instant_of_day(next, tz),
    )
}

/// The contracts among `contracts` that price some of `intervals` within `[from, to)`.
pub fn contracts_pricing(
    intervals: &[CapacityInterval],
    book: &PriceBook<'_>,
    window: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> std::collections::HashSet<Uuid> {
    let refs: Vec<&CapacityInterval> = intervals.iter().collect();
    pieces_of(&refs, book, window, tz, Cut::None)
        .into_iter()
        .filter_map(|piece| piece.contract_id)
        .collect()
}

/// Where pieces are cut besides contract boundaries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    Day,
    None,
}

/// The pieces of `intervals` inside `[from, to)`, cut at every contract boundary and, with
/// [`Cut::Day`], at every ledger day.
fn pieces_of<'a>(
    intervals: &[&'a CapacityInterval],
    book: &PriceBook<'_>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    cut: Cut,
) -> Vec<Piece<'a>> {
    let mut pieces = Vec::new();
    for interval in intervals {
        let gpus = Decimal::from(interval.gpus);
        for (span_start, span_end, contract_id) in priced_spans(interval, book, (from, to)) {
            let mut at = span_start;
            while at < span_end {
                let until = match cut {
                    Cut::Day => {
                        let day = at.with_timezone(&tz).date_naive();
                        let next = day.succ_opt().map(|d| first_instant_of_day(d, tz));
                        next.map_or(span_end, |next| next.min(span_end))
                    }
                    Cut::None => span_end,
                };
                pieces.push(Piece {
                    interval,
                    start: at,
                    contract_id,
                    seconds: gpus * seconds_between(at, until),
                });
                at = until;
            }
        }
    }
    pieces
}

/// The stretches of `interval` within `[from, to)` each priced by one contract among
/// `contracts` (or by none), as a record of its model, billing mode, provider, region and
/// its pool owner's project would be.
pub(crate) fn priced_spans(
    interval: &CapacityInterval,
    book: &PriceBook<'_>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> Vec<(DateTime<Utc>, DateTime<Utc>, Option<Uuid>)> {
    let (start, end) = (interval.from.max(from), interval.until.min(to));
    if start >= end {
        return Vec::new();
    }
    let owner = book.owners.get(&interval.pool).cloned().flatten();
    let as_record = RecordToRate {
        project: owner.unwrap_or_default(),
        gpu_model: interval.gpu_model.clone(),
        billing_mode: interval.billing_mode,
        provider: interval.provider.clone(),
        region: interval.region.clone(),
        currency: String::new(),
        started_at: start,
        ended_at: end,
        gpu_seconds_held: Decimal::ZERO,
        gpu_seconds_busy: None,
        outcome: Outcome::Completed,
        compute_share: None,
        energy_joules: None,
    };
    let spans = contract_spans(&as_record, book.contracts);
    match book.billed.get(&interval.node) {
        Some(billed) => overlay_billed(spans, billed),
        None => spans,
    }
}

/// `spans` with the time `billed` covers priced by the bill instead: billed wins.
fn overlay_billed(
    spans: Vec<(DateTime<Utc>, DateTime<Utc>, Option<Uuid>)>,
    billed: &[BilledSpan],
) -> Vec<(DateTime<Utc>, DateTime<Utc>, Option<Uuid>)> {
    let mut out = Vec::with_capacity(spans.len());
    for (start, end, contract) in spans {
        let mut at = start;
        for bill in billed.iter().filter(|b| b.from < end && b.until > start) {
            if bill.from > at {
                out.push((at, bill.from, contract));
            }
            let (from, until) = (bill.from.max(at), bill.until.min(end));
            if from < until {
                out.push((from, until, Some(bill.price_id)));
                at = until;
            }
        }
        if at < end {
            out.push((at, end, contract));
        }
    }
    out
}

/// What prices capacity: the contracts, each matched with the project that owns the pool
/// (`owners`), and the spans of nodes a bill gives the cost of, which win over contracts.
#[derive(Debug, Clone, Copy)]
pub struct PriceBook<'a> {
    pub owners: &'a HashMap<String, Option<String>>,
    pub contracts: &'a [Contract],
    pub billed: &'a HashMap<String, Vec<BilledSpan>>,
}

impl Default for PriceBook<'_> {
    fn default() -> Self {
        static NO_OWNERS: std::sync::LazyLock<HashMap<String, Option<String>>> =
            std::sync::LazyLock::new(HashMap::new);
        static NO_BILLS: std::sync::LazyLock<HashMap<String, Vec<BilledSpan>>> =
            std::sync::LazyLock::new(HashMap::new);
        PriceBook {
            owners: &NO_OWNERS,
            contracts: &[],
            billed: &NO_BILLS,
        }
    }
}

/// A stretch of one node's time whose cost a bill gives, priced under `price_id`. A node's
/// spans are sorted and never overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BilledSpan {
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub price_id: Uuid,
}

/// The node-day a piece adds to.
fn day_of<'d>(
    days: &'d mut BTreeMap<DayKey, NodeDay>,
    piece: &Piece<'_>,
    tz: Tz,
) -> &'d mut NodeDay {
    let interval = piece.interval;
    let day = piece.start.with_timezone(&tz).date_naive();
    days.entry((
        interval.pool.clone(),
        interval.node.clone(),
        day,
        piece.contract_id,
    ))
    .or_insert_with(|| NodeDay {
        pool: interval.pool.clone(),
        node: interval.node.clone(),
        gpu_model: interval.gpu_model.clone(),
        billing_mode: interval.billing_mode,
        gpus: interval.gpus,
        day,
        month: first_of_month(day),
        contract_id: piece.contract_id,
        seconds: CapacitySeconds::default(),
    })
}

/// Sets one node-hour's usage against the pieces of the hour, adding the used and
/// overbooked time to their node-days (idle is what is left of paid once all is added).
///
/// The used time (at most the hour's up time) is shared over the up pieces by their length,
/// each share rounded to 10^-20 and the last piece taking the exact rest, so the pieces'
/// used add up to it exactly.
fn settle_hour(
    pieces: &[Piece<'_>],
    uses: &[&NodeUse],
    tz: Tz,
    days: &mut BTreeMap<DayKey, NodeDay>,
    usage: &mut BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>>,
) {
    let up: Decimal = pieces
        .iter()
        .filter(|piece| piece.interval.state == NodeState::Up)
        .map(|piece| piece.seconds)
        .sum();
    let used_raw: Decimal = uses.iter().map(|u| u.gpu_seconds).sum();
    let used = used_raw.min(up);
    let mut overbooked = used_raw - used;
    let mut used_left = used;
    let last_up = pieces
        .iter()
        .rposition(|piece| piece.interval.state == NodeState::Up);
    for (index, piece) in pieces.iter().enumerate() {
        let mut seconds = CapacitySeconds::default();
        if piece.interval.state == NodeState::Up {
            let share = if Some(index) == last_up {
                used_left
            } else {
                (used * piece.seconds / up).round_dp(SUM_SCALE)
            };
            used_left -= share;
            seconds.used = share;
        }
        // The excess goes with the hour's last up piece, or its first piece when none is up.
        if Some(index) == last_up || (last_up.is_none() && index == 0) {
            seconds.overbooked = overbooked;
            overbooked = Decimal::ZERO;
        }
        day_of(days, piece, tz).seconds.add(&seconds);
    }
    if let Some(first) = pieces.first() {
        let month = first_of_month(first.start.with_timezone(&tz).date_naive());
        let shares = usage
            .entry((first.interval.pool.clone(), month))
            .or_default();
        for used in uses {
            *shares.entry(used.project.clone()).or_default() += used.gpu_seconds;
        }
    }
}

/// Splits `amount` over `weights` in proportion, each share rounded to 10^-20 and the
/// largest weight taking the exact rest, so that the shares add up to `amount` exactly.
/// Empty when the weights add up to zero.
pub fn allocate(amount: Decimal, weights: &BTreeMap<String, Decimal>) -> Vec<(String, Decimal)> {
    let total: Decimal = weights.values().copied().sum();
    if total.is_zero() {
        return Vec::new();
    }
    let largest = weights
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(key, _)| key.clone());
    let mut rest = amount;
    let mut shares: Vec<(String, Decimal)> = weights
        .iter()
        .filter(|(key, weight)| !weight.is_zero() && Some(*key) != largest.as_ref())
        .map(|(key, weight)| {
            let share = (amount * *weight / total).round_dp(SUM_SCALE);
            rest -= share;
            (key.clone(), share)
        })
        .collect();
    if let Some(largest) = largest {
        shares.push((largest, rest));
    }
    shares.sort_by(|a, b| a.0.cmp(&b.0));
    shares
}

/// A job's time on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpan {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// A stretch of time a node was up with no job on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleStretch {
    pub since: DateTime<Utc>,
    /// How far the stretch is known: the next job's start, the node going down, or the end
    /// of what its intervals say.
    pub until: DateTime<Utc>,
    /// Whether the stretch runs to the end of the node's known up time (no job or down time
    /// ended it).
    pub open: bool,
    /// The node's GPUs at the stretch's end.
    pub gpus: i32,
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub pool: String,
}

/// The stretches of `intervals` (one node's, sorted by `from`, not overlapping) with the
/// node up and none of `jobs` running. Up intervals that touch form one up time; a gap in
/// what is known, or a down interval, ends a stretch as a job does.
pub fn idle_stretches(intervals: &[CapacityInterval], jobs: &[JobSpan]) -> Vec<IdleStretch> {
    let mut jobs: Vec<JobSpan> = jobs.iter().copied().filter(|j| j.end > j.start).collect();
    jobs.sort_by_key(|job| job.start);
    let mut stretches = Vec::new();
    let mut index = 0;
    while index < intervals.len() {
        if intervals[index].state != NodeState::Up {
            index += 1;
            continue;
        }
        // One up time: intervals that are up and touch.
        let run_start = intervals[index].from;
        let mut last = index;
        while last + 1 < intervals.len()
            && intervals[last + 1].state == NodeState::Up
            && intervals[last + 1].from == intervals[last].until
        {
            last += 1;
        }
        let run_end = intervals[last].until;
        let mut cursor = run_start;
        let mut push = |since: DateTime<Utc>, until: DateTime<Utc>, open: bool| {
            if until > since {
                // The interval that holds the stretch's last instant describes the node.
                let holding = intervals[index..=last]
                    .iter()
                    .rev()
                    .find(|interval| interval.from < until)
                    .unwrap_or(&intervals[last]);
                stretches.push(IdleStretch {
                    since,
                    until,
                    open,
                    gpus: holding.gpus,
                    gpu_model: holding.gpu_model.clone(),
                    billing_mode: holding.billing_mode,
                    provider: holding.provider.clone(),
                    region: holding.region.clone(),
                    pool: holding.pool.clone(),
                });
            }
        };
        for job in jobs
            .iter()
            .filter(|job| job.end > run_start && job.start < run_end)
        {
            if job.start > cursor {
                push(cursor, job.start, false);
            }
            cursor = cursor.max(job.end);
        }
        if cursor < run_end {
            push(cursor, run_end, true);
        }
        index = last + 1;
    }
    stretches
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn dec(text: &str) -> Decimal {
        text.parse().expect("a decimal")
    }

    fn at(hour: u32, minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 2, hour, minute, 0).unwrap()
    }

    fn interval(
        node: &str,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
        state: NodeState,
    ) -> CapacityInterval {
        CapacityInterval {
            node: node.to_owned(),
            pool: "train".to_owned(),
            gpu_model: "H100".to_owned(),
            gpus: 8,
            billing_mode: BillingMode::OnDemand,
            provider: None,
            region: None,
            labels: BTreeMap::new(),
            from,
            until,
            state,
        }
    }

    fn contract(price: Decimal) -> Contract {
        Contract {
            id: Uuid::from_u128(1),
            gpu_model: "H100".to_owned(),
            billing_mode: BillingMode::OnDemand,
            project: None,
            provider: None,
            region: None,
            valid_from: at(0, 0),
            valid_until: None,
            price_per_gpu_hour: price,
            currency: "USD".to_owned(),
            committed_gpus: None,
            power_price_per_gpu_hour: Decimal::ZERO,
            energy_price_per_kwh: Decimal::ZERO,
        }
    }

    fn used(node: &str, hour: DateTime<Utc>, project: &str, seconds: Decimal) -> NodeUse {
        NodeUse {
            node: node.to_owned(),
            hour,
            project: project.to_owned(),
            gpu_seconds: seconds,
        }
    }

    fn total(figures: &CapacityFigures) -> CapacitySeconds {
        let mut sum = CapacitySeconds::default();
        for day in &figures.days {
            sum.add(&day.seconds);
        }
        sum
    }

    #[test]
    fn paid_splits_into_used_idle_and_down_with_excess_shown_as_overbooked() {
        // Node a: up 10:00–11:30, down 11:30–12:00 (8 GPUs). Jobs put 4 GPU-hours on it at
        // 10:00 and 10 GPU-hours at 11:00, where only 8 × 1800 s were up.
        let intervals = [
            interval("a", at(10, 0), at(11, 30), NodeState::Up),
            interval("a", at(11, 30), at(12, 0), NodeState::Down),
        ];
        let usage = [
            used("a", at(10, 0), "p", dec("14400")),
            used("a", at(11, 0), "p", dec("20000")),
            used("a", at(11, 0), "q", dec("16000")),
            used("a", at(13, 0), "q", dec("100")),
        ];
        let owners = HashMap::from([("train".to_owned(), None)]);
        let contracts = [contract(dec("2"))];
        let figures = capacity_figures(
            &intervals,
            &usage,
            &PriceBook {
                owners: &owners,
                contracts: &contracts,
                ..PriceBook::default()
            },
            (at(0, 0), at(23, 0)),
            Tz::UTC,
        );
        let sums = total(&figures);
        assert_eq!(sums.paid, dec("8") * dec("7200"));
        assert_eq!(sums.down, dec("8") * dec("1800"));
        assert_eq!(sums.used, dec("14400") + dec("14400"));
        assert_eq!(sums.overbooked, dec("36000") - dec("14400"));
        assert_eq!(sums.idle, dec("28800") - dec("14400") + Decimal::ZERO);
        assert_eq!(sums.paid, sums.used + sums.idle + sums.down);
        assert_eq!(figures.unmatched["train"]["a"], dec("100"));
        let shares = &figures.usage[&(
            "train".to_owned(),
            NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(),
        )];
        assert_eq!(shares["p"], dec("34400"));
        assert_eq!(shares["q"], dec("16000"));
        assert!(
            figures
                .days
                .iter()
                .all(|d| d.contract_id == Some(Uuid::from_u128(1)))
        );
    }

    #[test]
    fn a_contract_boundary_inside_an_hour_splits_its_used_time_exactly() {
        let mut first = contract(dec("2"));
        first.valid_until = Some(at(10, 20));
        let mut second = contract(dec("3"));
        second.id = Uuid::from_u128(2);
        second.valid_from = at(10, 20);
        let intervals = [interval("a", at(10, 0), at(11, 0), NodeState::Up)];
        let usage = [used("a", at(10, 0), "p", dec("10000"))];
        let contracts = [first, second];
        let figures = capacity_figures(
            &intervals,
            &usage,
            &PriceBook {
                contracts: &contracts,
                ..PriceBook::default()
            },
            (at(0, 0), at(23, 0)),
            Tz::UTC,
        );
        assert_eq!(figures.days.len(), 2);
        let by_contract: BTreeMap<_, _> = figures
            .days
            .iter()
            .map(|d| (d.contract_id, d.seconds))
            .collect();
        let early = by_contract[&Some(Uuid::from_u128(1))];
        let late = by_contract[&Some(Uuid::from_u128(2))];
        assert_eq!(early.paid, dec("8") * dec("1200"));
        assert_eq!(late.paid, dec("8") * dec("2400"));
        assert_eq!(early.used + late.used, dec("10000"));
        assert_eq!(early.used, (dec("10000") / dec("3")).round_dp(SUM_SCALE));
        assert_eq!(total(&figures).idle, dec("28800") - dec("10000"));
    }

    #[test]
    fn shares_add_up_to_the_amount_exactly() {
        let weights = BTreeMap::from([
            ("a".to_owned(), dec("1")),
            ("b".to_owned(), dec("1")),
            ("c".to_owned(), dec("1")),
        ]);
        let shares = allocate(dec("10"), &weights);
        assert_eq!(shares.iter().map(|s| s.1).sum::<Decimal>(), dec("10"));
        assert_eq!(shares[1].1, dec("3.33333333333333333333"));
        assert!(allocate(dec("10"), &BTreeMap::new()).is_empty());
    }

    #[test]
    fn stretches_are_up_time_without_jobs() {
        let intervals = [
            interval("a", at(0, 0), at(4, 0), NodeState::Up),
            interval("a", at(4, 0), at(6, 0), NodeState::Up),
            interval("a", at(6, 0), at(7, 0), NodeState::Down),
            interval("a", at(7, 0), at(9, 0), NodeState::Up),
        ];
        let jobs = [
            JobSpan {
                start: at(1, 0),
                end: at(2, 0),
            },
            JobSpan {
                start: at(1, 30),
                end: at(2, 30),
            },
        ];
        let stretches = idle_stretches(&intervals, &jobs);
        let spans: Vec<_> = stretches
            .iter()
            .map(|s| (s.since, s.until, s.open))
            .collect();
        assert_eq!(
            spans,
            vec![
                (at(0, 0), at(1, 0), false),
                (at(2, 30), at(6, 0), true),
                (at(7, 0), at(9, 0), true),
            ]
        );
    }

    #[test]
    fn intervals_are_validated_and_overlaps_point_at_each_other() {
        let now = at(23, 0);
        let body = json!([
            {"node": "a", "pool": "train", "gpu_model": "H100", "gpus": 8, "billing_mode": "on_demand",
             "from": "2026-11-02T00:00:00Z", "until": "2026-11-02T02:00:00Z", "state": "up"},
            {"node": "a", "pool": "train", "gpu_model": "H100", "gpus": 8, "billing_mode": "on_demand",
             "from": "2026-11-02T01:00:00Z", "until": "2026-11-02T03:00:00Z", "state": "up"},
        ]);
        let errors = parse_intervals(&body, now).unwrap_err().into_vec();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].pointer, "/1/from");
        assert!(errors[0].message.contains("/0"), "{}", errors[0].message);

        let body = json!([{"node": "a b", "pool": "Train", "gpus": 0, "from": "x",
                           "until": "2026-11-02T03:00:00Z", "state": "busy", "extra": 1}]);
        let pointers: Vec<String> = parse_intervals(&body, now)
            .unwrap_err()
            .into_vec()
            .into_iter()
            .map(|e| e.pointer)
            .collect();
        for expected in [
            "/0/node",
            "/0/pool",
            "/0/gpu_model",
            "/0/gpus",
            "/0/billing_mode",
            "/0/from",
            "/0/state",
            "/0/extra",
        ] {
            assert!(
                pointers.iter().any(|p| p == expected),
                "{expected} in {pointers:?}"
            );
        }
    }

    #[test]
    fn an_owner_rule_needs_an_owner() {
        let errors = PoolSettings::parse(&json!({"name": "x", "share_idle": "owner"}))
            .unwrap_err()
            .into_vec();
        assert_eq!(errors[0].pointer, "/share_idle");
        let pool = PoolSettings::parse(&json!({"name": "x", "owner_project": "ml"})).unwrap();
        assert_eq!(pool.share_idle, ShareIdle::Owner);
        assert_eq!(
            pool.zombie_after_minutes,
            Some(DEFAULT_ZOMBIE_AFTER_MINUTES)
        );
        let pool =
            PoolSettings::parse(&json!({"name": "x", "zombie_after_minutes": null})).unwrap();
        assert_eq!(pool.share_idle, ShareIdle::Pool);
        assert_eq!(pool.zombie_after_minutes, None);
    }
}
