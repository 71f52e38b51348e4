//! A group hierarchy in Prometheus' formats: every scrape takes a snapshot
//! (flushing the statistics) and encodes one sample per group of each
//! family below, labelled `group="/tenants/acme"` — as a
//! [`prometheus_client`] collector ([`HierarchyCollector`], OpenMetrics
//! text through a `Registry`), or directly as the Prometheus text format
//! 0.0.4 ([`render`], which `promtool check metrics` accepts and every
//! Prometheus server scrapes).
//!
//! | family | type | value |
//! |---|---|---|
//! | `splitcount_group_usage` | gauge | usage of the group's subtree, stocked units included |
//! | `splitcount_group_usage_slack` | gauge | units of that usage pre-charged in the per-CPU stocks and not in use: the error bound of `usage` (what is in use lies in `[usage − slack, usage]`) — for a group an allocator charges (`_bytes`), besides the threads' reserves: up to [`MAX_THREAD_RESERVE`](crate::alloc::MAX_THREAD_RESERVE) more per thread that allocated in the subtree and has not drained |
//! | `splitcount_group_max`, `splitcount_group_high` | gauge | the limits, `+Inf` when unlimited |
//! | `splitcount_group_peak` | gauge | the peak usage |
//! | `splitcount_group_events_total{event="max\|high\|oom\|underflow\|breaches\|refused"}` | counter | events of the subtree (`memory.events`; see [`crate::charge::Events`]): `refused` is the count of refused requests, `breaches` of crossings of a cooperative limit — also of request groups removed since |
//! | `splitcount_group_stall_seconds_total` | counter | time charges spent stalled after a refusal |
//! | `splitcount_group_stat{item=…}` | gauge | each gauge stat item (subtree value) |
//! | `splitcount_group_stat_events_total{item=…}` | counter | each event stat item (subtree value) |
//!
//! With an allocator attached the usage families count bytes and are named
//! with the unit (`splitcount_group_usage_bytes`, …). Every value is the
//! group's **subtree's**, as in the cgroup files: a capped export (see
//! [`Options`]) still shows each exported group's total; do not sum across
//! levels. Removed groups disappear from the next scrape.
//!
//! **The process's memory**, with [`Options::process_memory`] (for example
//! `|| ALLOC.reconcile()`): the resident set and the parts that explain it
//! ([`Reconciliation`], each part measured on its own), so that a dashboard
//! can stack the parts up to the resident set, and what they leave
//! (`unexplained`) shows as its own series.
//!
//! | family | type | value |
//! |---|---|---|
//! | `splitcount_process_resident_bytes` | gauge | the resident set (Σ `Rss` of `/proc/self/smaps`) |
//! | `splitcount_process_tracked_bytes` | gauge | live bytes the groups track |
//! | `splitcount_process_headers_bytes` | gauge | the accounting allocator's headers |
//! | `splitcount_process_malloc_chunk_overhead_bytes` | gauge | glibc's per-block overhead (an estimate) |
//! | `splitcount_process_malloc_free_resident_bytes` | gauge | free memory glibc keeps, resident |
//! | `splitcount_process_stacks_bytes`, `…_files_bytes`, `…_other_mappings_bytes` | gauge | the other mappings, from smaps |
//! | `splitcount_process_untouched_bytes` | gauge | memory in use and never written: counted in `tracked`, not resident (**subtracted**) |
//! | `splitcount_process_unexplained_bytes` | gauge | the resident set less the parts above (may be negative) |
//! | `splitcount_process_malloc_free_bytes`, `…_malloc_mappings_bytes` | gauge | beside the parts: all of glibc's free bytes, resident or not; its mappings' resident bytes |
//! | `splitcount_process_trims_total`, `…_trim_seconds_total` | counter | trims ([`crate::alloc::Accounted::trim`], the trim policy's) and their time |
//!
//! A part whose source cannot be read (glibc's figures elsewhere than
//! glibc, smaps without `/proc`) is left out, and so is `unexplained` then.
//!
//! ```
//! use prometheus_client::registry::Registry;
//! use splitcount::export::prometheus::{HierarchyCollector, Options};
//! use splitcount::group::Hierarchy;
//!
//! let memory = Hierarchy::default();
//! memory.root().child("tenants").unwrap().child("acme").unwrap().force_charge(4096).unwrap();
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(HierarchyCollector::new(&memory, Options::default())));
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! assert!(text.contains("splitcount_group_usage{group=\"/tenants/acme\"} 4096"));
//! ```

use crate::alloc::{Reconciliation, ResidentPart};
use crate::charge::Events;
use crate::group::{Group, GroupSnapshot, Hierarchy, SnapshotOptions};
use crate::stat::StatKind;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::fmt::Write;
use std::sync::Arc;

/// Where [`Options::process_memory`] reads the process's memory from: a
/// function called at every scrape.
#[derive(Clone)]
pub struct MemorySource(Arc<dyn Fn() -> Option<Reconciliation> + Send + Sync>);

impl MemorySource {
    /// `f` is called at every scrape; `None` leaves the process's families
    /// out (an allocator not attached yet).
    pub fn new(f: impl Fn() -> Option<Reconciliation> + Send + Sync + 'static) -> MemorySource {
        MemorySource(Arc::new(f))
    }

    /// A reconciliation now.
    pub fn read(&self) -> Option<Reconciliation> {
        (self.0)()
    }
}

impl std::fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemorySource(..)")
    }
}

impl PartialEq for MemorySource {
    /// The same function (clones of one source).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for MemorySource {}

/// What a [`HierarchyCollector`] or [`render`] exports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// The families' prefix (`splitcount`).
    pub prefix: String,
    /// Which groups: by default all; a cap on depth or on the number of
    /// groups bounds the cardinality (the levels nearest the exported group
    /// first: `max_depth(1)` exports the tenants under the root, not their
    /// requests).
    pub groups: SnapshotOptions,
    /// Name the usage families with `_bytes`: `None` (the default) decides
    /// by whether an allocator is attached to the hierarchy.
    pub bytes: Option<bool>,
    /// Export the process's resident set part by part (see the
    /// [module docs](self)); `None` (the default): the groups only.
    pub process_memory: Option<MemorySource>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            prefix: "splitcount".to_owned(),
            groups: SnapshotOptions::default(),
            bytes: None,
            process_memory: None,
        }
    }
}

impl Options {
    /// Families named `{prefix}_group_…`. A prefix that is not a valid
    /// metric name is made one: characters outside `[a-zA-Z0-9_:]` become
    /// `_`, and a leading digit gets a `_` before it (an empty prefix
    /// names the families `_group_…`) —
    /// `my-app.v2` exports `my_app_v2_group_usage` (written as given, it
    /// made a scrape that Prometheus rejects).
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = if prefix.is_empty() {
            String::new() // `_group_…`: valid already
        } else {
            sanitize(prefix, true)
        };
        self
    }

    /// At most `depth` levels below the exported group.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.groups = self.groups.max_depth(depth);
        self
    }

    /// At most `groups` groups.
    pub fn max_groups(mut self, groups: usize) -> Self {
        self.groups = self.groups.max_groups(groups);
        self
    }

    /// Whether the usage families carry the `bytes` unit.
    pub fn bytes(mut self, bytes: bool) -> Self {
        self.bytes = Some(bytes);
        self
    }

    /// Export the process's memory too, reconciled by `f` at every scrape —
    /// typically the global allocator's [`Accounted::reconcile`]:
    ///
    /// ```no_run
    /// use splitcount::alloc::Accounted;
    /// use splitcount::export::prometheus::{render, Options};
    /// use splitcount::group::Hierarchy;
    /// use std::alloc::System;
    ///
    /// #[global_allocator]
    /// static ALLOC: Accounted<System> = Accounted::new(System);
    ///
    /// let memory = Hierarchy::default();
    /// ALLOC.attach(&memory).unwrap();
    /// let options = Options::default().max_depth(2).process_memory(|| ALLOC.reconcile());
    /// let text = render(&memory.root(), &options);
    /// assert!(text.contains("# TYPE splitcount_process_unexplained_bytes gauge"));
    /// ```
    ///
    /// [`Accounted::reconcile`]: crate::alloc::Accounted::reconcile
    pub fn process_memory(
        mut self,
        f: impl Fn() -> Option<Reconciliation> + Send + Sync + 'static,
    ) -> Self {
        self.process_memory = Some(MemorySource::new(f));
        self
    }
}

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value {
    Int(u64),
    Float(f64),
    /// A histogram with the `+Inf` bucket only.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    Histogram {
        sum: f64,
        count: u64,
    },
}

/// What a family holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gauge,
    Counter,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    Histogram,
}

/// Labels of a sample.
pub(crate) type LabelSet = Vec<(std::borrow::Cow<'static, str>, String)>;

/// One metric family, independent of the format it is written in.
#[derive(Debug, Clone)]
pub(crate) struct Family {
    /// The name without the unit or `_total`.
    pub(crate) name: String,
    pub(crate) help: String,
    pub(crate) unit: Option<Unit>,
    pub(crate) kind: Kind,
    pub(crate) samples: Vec<(LabelSet, Value)>,
}

impl Family {
    pub(crate) fn new(name: String, help: &str, unit: Option<Unit>, kind: Kind) -> Family {
        Family {
            name,
            help: help.to_owned(),
            unit,
            kind,
            samples: Vec::new(),
        }
    }
}

/// `+Inf` for no limit.
fn limit(v: Option<u64>) -> Value {
    v.map_or(Value::Float(f64::INFINITY), Value::Int)
}

fn group_label(g: &GroupSnapshot) -> LabelSet {
    vec![("group".into(), g.path.clone())]
}

/// The families of `group`'s subtree (see the module docs).
fn families(group: &Group, o: &Options) -> Vec<Family> {
    let snap = group.snapshot_with(&o.groups);
    let gs = &snap.groups;
    let unit = o
        .bytes
        .unwrap_or_else(|| group.counts_bytes())
        .then_some(Unit::Bytes);
    let p = &o.prefix;
    let per_group =
        |name: &str, help, unit: Option<Unit>, kind, f: &dyn Fn(&GroupSnapshot) -> Value| {
            let mut fam = Family::new(format!("{p}_group_{name}"), help, unit, kind);
            fam.samples = gs.iter().map(|g| (group_label(g), f(g))).collect();
            fam
        };
    let mut out = vec![
        per_group(
            "usage",
            "Usage of the group's subtree, units pre-charged in the per-CPU stocks included.",
            unit.clone(),
            Kind::Gauge,
            &|g| Value::Int(g.usage),
        ),
        per_group(
            "usage_slack",
            "Units of the usage pre-charged in the per-CPU stocks and not in use: the error bound of usage (an allocator's per-thread reserves aside).",
            unit.clone(),
            Kind::Gauge,
            &|g| Value::Int(g.stocked),
        ),
        per_group("max", "Hard limit (+Inf: none).", unit.clone(), Kind::Gauge, &|g| {
            limit(g.max)
        }),
        per_group("high", "Soft limit (+Inf: none).", unit.clone(), Kind::Gauge, &|g| {
            limit(g.high)
        }),
        per_group(
            "peak",
            "Peak usage of the group's subtree.",
            unit,
            Kind::Gauge,
            &|g| Value::Int(g.peak),
        ),
    ];
    let mut events = Family::new(
        format!("{p}_group_events"),
        "Events of the group's subtree, removed groups included: max (charges that hit a limit, refused or over-charged), high (crossings of high), oom (charges refused after reclaim failed), underflow (over-uncharges), breaches (crossings of a cooperative limit: one per episode over it), refused (charges refused: nulls from the allocator, errors from charge).",
        None,
        Kind::Counter,
    );
    for g in gs {
        let e: &Events = &g.subtree_events;
        for (event, n) in [
            ("max", e.max),
            ("high", e.high),
            ("oom", e.oom),
            ("underflow", e.underflow),
            ("breaches", e.breaches),
            ("refused", e.refused),
        ] {
            events.samples.push((
                vec![
                    ("group".into(), g.path.clone()),
                    ("event".into(), event.to_owned()),
                ],
                Value::Int(n),
            ));
        }
    }
    out.push(events);
    out.push(per_group(
        "stall",
        "Time charges to the group's subtree spent stalled after a refusal (reclaim hooks, drains, retries, OOM hooks).",
        Some(Unit::Seconds),
        Kind::Counter,
        &|g| Value::Float(g.stall_ns as f64 / 1e9),
    ));
    for (kind, name, help) in [
        (
            StatKind::Gauge,
            "stat",
            "Gauge statistics of the group's subtree, by item.",
        ),
        (
            StatKind::Event,
            "stat_events",
            "Event statistics of the group's subtree, by item.",
        ),
    ] {
        let mut fam = Family::new(
            format!("{p}_group_{name}"),
            help,
            None,
            if kind == StatKind::Gauge {
                Kind::Gauge
            } else {
                Kind::Counter
            },
        );
        for it in group.stat_items().iter().filter(|it| it.kind == kind) {
            for g in gs {
                let v = g.stats.get(&it.name).copied().unwrap_or(0);
                let v = match kind {
                    StatKind::Gauge if v < 0 => Value::Float(v as f64),
                    _ => Value::Int(v.max(0) as u64),
                };
                fam.samples.push((
                    vec![
                        ("group".into(), g.path.clone()),
                        ("item".into(), it.name.clone()),
                    ],
                    v,
                ));
            }
        }
        if !fam.samples.is_empty() {
            out.push(fam);
        }
    }
    if let Some(r) = o.process_memory.as_ref().and_then(MemorySource::read) {
        out.extend(process_families(&r, p));
    }
    out
}

/// The process's families (see the module docs): one unlabelled sample
/// each; a figure that could not be read leaves its family out.
fn process_families(r: &Reconciliation, p: &str) -> Vec<Family> {
    let mut out = Vec::new();
    let mut gauge = |name: &str, help: &str, v: Option<i64>| {
        if let Some(v) = v {
            let mut fam = Family::new(
                format!("{p}_process_{name}"),
                help,
                Some(Unit::Bytes),
                Kind::Gauge,
            );
            let value = if v < 0 {
                Value::Float(v as f64)
            } else {
                Value::Int(v as u64)
            };
            fam.samples.push((Vec::new(), value));
            out.push(fam);
        }
    };
    let signed = |v: Option<u64>| v.map(|v| v as i64);
    gauge(
        "resident",
        "The process's resident set (sum of Rss in /proc/self/smaps), which the process parts explain.",
        signed(r.resident_mapped),
    );
    for part in ResidentPart::ALL {
        gauge(part.name(), part.help(), signed(r.part(part)));
    }
    gauge(
        "unexplained",
        "The resident set less the sum of the process parts: what none of them explains (negative when they claim more).",
        r.unexplained,
    );
    gauge(
        "malloc_free",
        "Every free byte glibc keeps (mallinfo2 fordblks), resident or not; not a part.",
        signed(r.malloc_free),
    );
    gauge(
        "malloc_mappings",
        "Resident bytes of glibc's own mappings (its heaps and the blocks it mapped alone); not a part.",
        signed(r.malloc_mappings),
    );
    let mut trims = Family::new(
        format!("{p}_process_trims"),
        "Times the allocator gave freed memory back to the system (malloc_trim), asked for or by its trim policy.",
        None,
        Kind::Counter,
    );
    trims.samples.push((Vec::new(), Value::Int(r.trims)));
    out.push(trims);
    let mut took = Family::new(
        format!("{p}_process_trim"),
        "Time the trims took.",
        Some(Unit::Seconds),
        Kind::Counter,
    );
    took.samples
        .push((Vec::new(), Value::Float(r.trim_nanos as f64 / 1e9)));
    out.push(took);
    out
}

/// `group`'s subtree in the Prometheus text exposition format 0.0.4 (serve
/// it with `Content-Type: text/plain; version=0.0.4`).
///
/// ```
/// use splitcount::export::prometheus::{render, Options};
/// use splitcount::group::Hierarchy;
/// let memory = Hierarchy::default();
/// memory.root().child("acme").unwrap().force_charge(10).unwrap();
/// let text = render(&memory.root(), &Options::default());
/// assert!(text.contains("# TYPE splitcount_group_events_total counter\n"));
/// assert!(text.contains("splitcount_group_usage{group=\"/acme\"} 10\n"));
/// assert!(text.contains("splitcount_group_max{group=\"/acme\"} +Inf\n"));
/// ```
pub fn render(group: &Group, options: &Options) -> String {
    render_families(&families(group, options))
}

/// `families` in the Prometheus text format 0.0.4.
pub(crate) fn render_families(families: &[Family]) -> String {
    let mut out = String::new();
    for fam in families {
        let mut name = fam.name.clone();
        if let Some(u) = &fam.unit {
            name = format!("{name}_{}", u.as_str());
        }
        if fam.kind == Kind::Counter {
            name.push_str("_total");
        }
        let kind = match fam.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        };
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {name} {}", escape_help(&fam.help));
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in &fam.samples {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let braced = |extra: Option<&str>| {
                let all: Vec<&str> = labels.iter().map(String::as_str).chain(extra).collect();
                if all.is_empty() {
                    String::new()
                } else {
                    format!("{{{}}}", all.join(","))
                }
            };
            match *value {
                Value::Histogram { sum, count } => {
                    let bucket = braced(Some("le=\"+Inf\""));
                    let _ = writeln!(out, "{name}_bucket{bucket} {count}");
                    let _ = writeln!(out, "{name}_sum{} {}", braced(None), float(sum));
                    let _ = writeln!(out, "{name}_count{} {count}", braced(None));
                }
                Value::Int(v) => {
                    let _ = writeln!(out, "{name}{} {v}", braced(None));
                }
                Value::Float(v) => {
                    let _ = writeln!(out, "{name}{} {}", braced(None), float(v));
                }
            }
        }
    }
    out
}

/// A float as the text format writes it (`+Inf`, `-Inf`, `NaN`).
fn float(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else if v.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{v:?}")
    }
}

/// A label value with `\`, `"` and newlines escaped.
pub(crate) fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A Prometheus metric or label name from any string: characters
/// outside `[a-zA-Z0-9_]` become `_` (and `:` in metric names is
/// kept), and a leading digit gets a `_` before it.
pub(crate) fn sanitize(name: &str, colons: bool) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A help text with `\` and newlines escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Encodes a group's subtree on every scrape (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct HierarchyCollector {
    group: Group,
    options: Options,
}

impl HierarchyCollector {
    /// A collector over the whole of `hierarchy`.
    pub fn new(hierarchy: &Hierarchy, options: Options) -> HierarchyCollector {
        HierarchyCollector::for_group(&hierarchy.root(), options)
    }

    /// A collector over `group`'s subtree.
    pub fn for_group(group: &Group, options: Options) -> HierarchyCollector {
        HierarchyCollector {
            group: group.clone(),
            options,
        }
    }
}

/// Encode `families` through a prometheus-client descriptor encoder.
pub(crate) fn encode_families(
    encoder: &mut DescriptorEncoder,
    families: &[Family],
) -> Result<(), std::fmt::Error> {
    for fam in families {
        let metric_type = match fam.kind {
            Kind::Gauge => MetricType::Gauge,
            Kind::Counter => MetricType::Counter,
            Kind::Histogram => MetricType::Histogram,
        };
        // Escaped: prometheus-client writes the text as given, and a
        // newline in a description (a user's, through the `metrics`
        // recorder) broke the exposition. OpenMetrics (what it writes)
        // escapes `"` in HELP too, where the 0.0.4 text of `render` must
        // not.
        let help = escape_help(&fam.help).replace('"', "\\\"");
        let mut family =
            encoder.encode_descriptor(&fam.name, &help, fam.unit.as_ref(), metric_type)?;
        for (labels, value) in &fam.samples {
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_ref(), v.as_str()))
                .collect();
            let mut sample = family.encode_family(&labels)?;
            match (fam.kind, *value) {
                (Kind::Counter, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
                (Kind::Counter, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
                (_, Value::Int(v)) => ConstGauge::new(v).encode(sample)?,
                (_, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
                (_, Value::Histogram { sum, count }) => sample.encode_histogram::<NoLabelSet>(
                    sum,
                    count,
                    &[(f64::INFINITY, count)],
                    None,
                )?,
            }
        }
    }
    Ok(())
}

impl Collector for HierarchyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_families(&mut encoder, &families(&self.group, &self.options))
    }
}
