//! A recorder for the [`metrics`] facade whose counters are splitcount
//! [`Tree`] split counters: `metrics::counter!("requests_total", "tenant" =>
//! t).increment(1)` touches this CPU's slot instead of one shared atomic, so
//! a counter incremented on every core scales with them. Gauges are exact
//! (one atomic `f64` each: a gauge is set more than it is added to);
//! histograms keep a count (split) and a sum, and are exported with the
//! `+Inf` bucket only.
//!
//! Reading is exact: a counter's value is its [`SplitCounter::precise`]
//! sum over CPUs, so an export never lags by a batch. With the
//! `prometheus` feature, [`SplitRecorder::render`] writes the contents in
//! the Prometheus text format and the recorder is a `prometheus-client`
//! collector.
//!
//! ```
//! use splitcount::export::metrics::SplitRecorder;
//! let recorder = SplitRecorder::new();
//! metrics::with_local_recorder(&recorder, || {
//!     for _ in 0..1000 {
//!         metrics::counter!("requests_total", "tenant" => "acme").increment(1);
//!     }
//!     metrics::gauge!("queue_depth").set(7.0);
//! });
//! let counters = recorder.counters();
//! assert_eq!(counters[0].1, 1000);
//! ```
//!
//! Install it process-wide with `metrics::set_global_recorder(recorder)`
//! (keep a [`SplitRecorder::clone`] to read or export it: clones share
//! their contents).

use crate::counter::{SplitCounter, Tree};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_util::registry::{Registry, Storage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// A counter of the recorder: a split counter.
#[derive(Debug)]
pub struct SplitCounterFn(Tree);

impl SplitCounterFn {
    /// Its exact value (a sum over CPUs), modulo 2^64 as a `u64` counter's.
    ///
    /// The split counter adds `i64`s with wrapping arithmetic; every
    /// increment is a `u64` added as its bits, so the sum's bits are the
    /// `u64` total: exact up to `u64::MAX` (it was clamped: an increment
    /// above `i64::MAX` lost the rest, and a total past it read 0).
    pub fn value(&self) -> u64 {
        self.0.precise() as u64
    }
}

impl CounterFn for SplitCounterFn {
    fn increment(&self, value: u64) {
        // The bits of `value` (see `value`).
        self.0.add(value as i64);
    }

    /// Raise the counter to at least `value` (the facade's contract). Two
    /// racing calls may both add their difference: the counter then ends
    /// above the larger value by the smaller difference.
    fn absolute(&self, value: u64) {
        let now = self.value();
        if value > now {
            self.increment(value - now);
        }
    }
}

/// An exact gauge: an `f64` in an atomic.
#[derive(Debug, Default)]
pub struct ExactGauge(AtomicU64);

impl ExactGauge {
    /// Its value.
    pub fn value(&self) -> f64 {
        f64::from_bits(self.0.load(Relaxed))
    }

    fn update(&self, f: impl Fn(f64) -> f64) {
        // Relaxed: the gauge's value is all there is to it.
        let _ = self
            .0
            .fetch_update(Relaxed, Relaxed, |b| Some(f(f64::from_bits(b)).to_bits()));
    }
}

impl GaugeFn for ExactGauge {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Relaxed);
    }
}

/// A histogram reduced to its count (split) and its sum.
#[derive(Debug)]
pub struct SumCount {
    count: Tree,
    sum: ExactGauge,
}

impl SumCount {
    /// Observations recorded.
    pub fn count(&self) -> u64 {
        self.count.precise().max(0) as u64
    }

    /// Their sum.
    pub fn sum(&self) -> f64 {
        self.sum.value()
    }
}

impl HistogramFn for SumCount {
    fn record(&self, value: f64) {
        self.count.add(1);
        self.sum.increment(value);
    }

    fn record_many(&self, value: f64, count: usize) {
        self.count.add(count.min(i64::MAX as usize) as i64);
        self.sum.increment(value * count as f64);
    }
}

/// How the registry makes each kind of metric.
#[derive(Debug, Default)]
struct SplitStorage;

impl Storage<Key> for SplitStorage {
    type Counter = Arc<SplitCounterFn>;
    type Gauge = Arc<ExactGauge>;
    type Histogram = Arc<SumCount>;

    fn counter(&self, _: &Key) -> Self::Counter {
        Arc::new(SplitCounterFn(Tree::new()))
    }

    fn gauge(&self, _: &Key) -> Self::Gauge {
        Arc::new(ExactGauge::default())
    }

    fn histogram(&self, _: &Key) -> Self::Histogram {
        Arc::new(SumCount {
            count: Tree::new(),
            sum: ExactGauge::default(),
        })
    }
}

struct Inner {
    /// Tells this recorder's entries apart in the threads' handle caches.
    id: u64,
    registry: Registry<Key, SplitStorage>,
    /// What `describe_*` said about each name (units are not used: a name
    /// says its unit, e.g. `_bytes`).
    descriptions: Mutex<HashMap<String, SharedString>>,
    /// The names the exposition gave, kept so that they never change.
    #[cfg(feature = "prometheus")]
    naming: Mutex<exposition::Naming>,
}

/// The recorder (see the [module docs](self)). Cloning it shares its
/// contents.
#[derive(Clone)]
pub struct SplitRecorder {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SplitRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitRecorder").finish_non_exhaustive()
    }
}

impl Default for SplitRecorder {
    fn default() -> Self {
        SplitRecorder::new()
    }
}

/// Source of [`Inner::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A metric as a thread hands it out: its own `Arc` around the shared one.
/// `metrics::counter!(…)` registers at every call and the facade's handle
/// is an `Arc` clone: cloning one `Arc` shared by every thread would make
/// its reference count the contended line that the split counter avoids.
/// Each thread clones its own instead.
#[derive(Debug)]
struct Local<T>(Arc<T>);

impl<T: CounterFn> CounterFn for Local<T> {
    fn increment(&self, value: u64) {
        self.0.increment(value)
    }
    fn absolute(&self, value: u64) {
        self.0.absolute(value)
    }
}

impl<T: GaugeFn> GaugeFn for Local<T> {
    fn increment(&self, value: f64) {
        self.0.increment(value)
    }
    fn decrement(&self, value: f64) {
        self.0.decrement(value)
    }
    fn set(&self, value: f64) {
        self.0.set(value)
    }
}

impl<T: HistogramFn> HistogramFn for Local<T> {
    fn record(&self, value: f64) {
        self.0.record(value)
    }
    fn record_many(&self, value: f64, count: usize) {
        self.0.record_many(value, count)
    }
}

/// A thread's handle on one metric.
#[derive(Clone)]
enum Cached {
    Counter(Arc<Local<SplitCounterFn>>),
    Gauge(Arc<Local<ExactGauge>>),
    Histogram(Arc<Local<SumCount>>),
}

/// A hasher for keys that hash themselves once (a `metrics::Key` writes its
/// precomputed hash), mixed with the recorder's id and the kind.
#[derive(Default)]
struct PreHashed(u64);

impl std::hash::Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type Fast = std::hash::BuildHasherDefault<PreHashed>;
type ByKey = HashMap<Key, Cached, Fast>;

/// A thread's handles on one recorder's metrics, by kind (counter, gauge,
/// histogram), then by key; and the recorder, to tell when it is gone.
type OfRecorder = (std::sync::Weak<Inner>, [ByKey; 3]);

thread_local! {
    /// Each thread's handles, by recorder. The handles of a recorder that
    /// was dropped go when this thread first meets a new recorder: they
    /// keep its counters alive (a program that made and dropped a recorder
    /// 100,000 times on one thread held 55 MB more).
    static HANDLES: std::cell::RefCell<HashMap<u64, OfRecorder, Fast>> =
        std::cell::RefCell::new(HashMap::default());
}

/// A metric's name and labels, as registered.
pub type KeyParts = (String, Vec<(String, String)>);

fn parts(key: &Key) -> KeyParts {
    (
        key.name().to_owned(),
        key.labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect(),
    )
}

impl SplitRecorder {
    /// An empty recorder.
    pub fn new() -> SplitRecorder {
        SplitRecorder {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Relaxed),
                registry: Registry::new(SplitStorage),
                descriptions: Mutex::new(HashMap::new()),
                #[cfg(feature = "prometheus")]
                naming: Mutex::default(),
            }),
        }
    }

    /// Every counter with its exact value, sorted by name and labels.
    pub fn counters(&self) -> Vec<(KeyParts, u64)> {
        let mut out = Vec::new();
        self.inner
            .registry
            .visit_counters(|k, c| out.push((parts(k), c.value())));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every gauge with its value, sorted by name and labels.
    pub fn gauges(&self) -> Vec<(KeyParts, f64)> {
        let mut out = Vec::new();
        self.inner
            .registry
            .visit_gauges(|k, g| out.push((parts(k), g.value())));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every histogram with its (count, sum), sorted by name and labels.
    pub fn histograms(&self) -> Vec<(KeyParts, u64, f64)> {
        let mut out = Vec::new();
        self.inner
            .registry
            .visit_histograms(|k, h| out.push((parts(k), h.count(), h.sum())));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// This thread's handle on `key` of kind `kind` (0 counter, 1 gauge,
    /// 2 histogram), made by `make` the first time. Outside thread-local
    /// storage (a thread exiting), a new handle every time.
    fn local(&self, key: &Key, kind: u8, make: impl FnOnce() -> Cached) -> Cached {
        let (id, kind) = (self.inner.id, kind as usize);
        let found = HANDLES.try_with(|h| {
            h.borrow()
                .get(&id)
                .and_then(|(_, kinds)| kinds[kind].get(key))
                .cloned()
        });
        match found {
            Ok(Some(c)) => c,
            Ok(None) => {
                let c = make();
                let _ = HANDLES.try_with(|h| {
                    let mut h = h.borrow_mut();
                    if !h.contains_key(&id) {
                        // A recorder new to this thread: forget the gone.
                        h.retain(|_, (recorder, _)| recorder.strong_count() > 0);
                        h.insert(id, (Arc::downgrade(&self.inner), Default::default()));
                    }
                    if let Some((_, kinds)) = h.get_mut(&id) {
                        kinds[kind].insert(key.clone(), c.clone());
                    }
                });
                c
            }
            Err(_) => make(),
        }
    }

    fn describe(&self, key: KeyName, text: SharedString) {
        self.inner
            .descriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.as_str().to_owned(), text);
    }
}

impl Recorder for SplitRecorder {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let local = self.local(key, 0, || {
            let shared = self.inner.registry.get_or_create_counter(key, Arc::clone);
            Cached::Counter(Arc::new(Local(shared)))
        });
        match local {
            Cached::Counter(c) => Counter::from_arc(c),
            _ => unreachable!("cached by kind"),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let local = self.local(key, 1, || {
            let shared = self.inner.registry.get_or_create_gauge(key, Arc::clone);
            Cached::Gauge(Arc::new(Local(shared)))
        });
        match local {
            Cached::Gauge(g) => Gauge::from_arc(g),
            _ => unreachable!("cached by kind"),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let local = self.local(key, 2, || {
            let shared = self.inner.registry.get_or_create_histogram(key, Arc::clone);
            Cached::Histogram(Arc::new(Local(shared)))
        });
        match local {
            Cached::Histogram(h) => Histogram::from_arc(h),
            _ => unreachable!("cached by kind"),
        }
    }
}

#[cfg(feature = "prometheus")]
mod exposition {
    use super::{KeyParts, SplitRecorder};
    use crate::export::prometheus::{
        encode_families, render_families, sanitize, Family, Kind, LabelSet, Value,
    };
    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::DescriptorEncoder;
    use std::collections::{BTreeMap, BTreeSet};

    /// The names a family of `kind` named `name` writes (its HELP and
    /// TYPE lines' name and its samples').
    fn exposed(name: &str, kind: Kind) -> Vec<String> {
        let mut names = vec![name.to_owned()];
        let suffixes: &[&str] = match kind {
            Kind::Counter => &["_total", "_created"],
            Kind::Histogram => &["_bucket", "_count", "_sum", "_created"],
            _ => &[],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        names
    }

    /// The names a recorder has given, kept for its life: a series keeps
    /// the name and label names it was first exposed under, whatever is
    /// recorded later (a new series whose key sorts first does not take
    /// over a name a scraper already knows).
    #[derive(Default)]
    pub(super) struct Naming {
        /// (name as recorded, kind) → family name.
        family_of: BTreeMap<(String, u8), String>,
        /// Every name a family writes (with its suffixes): taken.
        taken: BTreeSet<String>,
        /// Per family name, its label names.
        labels: BTreeMap<String, LabelNames>,
    }

    /// A family's base name: valid (other characters become `_`), a
    /// counter's `_total` written once by the format, not reserved (`__x`
    /// becomes `_x`; a name of underscores only, or none, `unnamed`: a
    /// counter `_` would write `__total`).
    fn family_base(name: &str, kind: Kind) -> String {
        let mut base = sanitize(name, true);
        if kind == Kind::Counter {
            if let Some(stem) = base.strip_suffix("_total") {
                base = stem.to_owned();
            }
        }
        let rest = base.trim_start_matches('_');
        if rest.is_empty() {
            "unnamed".to_owned()
        } else if base.starts_with("__") {
            format!("_{rest}")
        } else {
            base
        }
    }

    /// A label key's valid name before any renaming: sanitized, not
    /// reserved (`__x` becomes `_x`), a histogram's `le` `le_`.
    fn label_base(raw: &str, kind: Kind) -> String {
        let mut key = sanitize(raw, false);
        if key.starts_with("__") {
            key = format!("_{}", key.trim_start_matches('_'));
        }
        if kind == Kind::Histogram && key == "le" {
            key.push('_');
        }
        key
    }

    /// `base`'s `n`th alternative (`n` ≥ 2): `base_n`, never starting with
    /// `__` (`_` gives `_2`).
    fn renamed(base: &str, n: usize) -> String {
        format!("{}_{n}", base.trim_end_matches('_'))
    }

    /// The label names of one family: each key of its series gets one
    /// valid name, the same in every series, and no two keys get the same —
    /// so two series whose keys differ (`x.y` in one, `x-y` in the other)
    /// stay two series, not one written twice (which Prometheus rejects or,
    /// deduplicated, loses a value of). A key given twice in one series
    /// (the facade allows it) is two keys: its first and its second.
    #[derive(Default)]
    pub(super) struct LabelNames {
        /// (key as recorded, its occurrence in the series) → label name.
        of_key: BTreeMap<(String, usize), String>,
        taken: BTreeSet<String>,
    }

    impl LabelNames {
        /// Valid, distinct label names for one series' labels.
        fn label_set(&mut self, labels: Vec<(String, String)>, kind: Kind) -> LabelSet {
            let mut seen: Vec<&str> = Vec::with_capacity(labels.len());
            let mut nths = Vec::with_capacity(labels.len());
            for (k, _) in &labels {
                nths.push(seen.iter().filter(|s| **s == k.as_str()).count());
                seen.push(k);
            }
            labels
                .into_iter()
                .zip(nths)
                .map(|((k, v), nth)| (self.name_of(k, nth, kind).into(), v))
                .collect()
        }

        /// Give the keys of `labels` that are valid names as they are (and
        /// first in their series) those names, before keys that need
        /// renaming take any.
        fn reserve_valid(&mut self, labels: &[(String, String)], kind: Kind) {
            for (i, (k, _)) in labels.iter().enumerate() {
                let first = !labels[..i].iter().any(|(o, _)| o == k);
                if first && label_base(k, kind) == *k && !self.taken.contains(k.as_str()) {
                    self.name_of(k.clone(), 0, kind);
                }
            }
        }

        fn name_of(&mut self, raw: String, nth: usize, kind: Kind) -> String {
            let id = (raw, nth);
            if let Some(name) = self.of_key.get(&id) {
                return name.clone();
            }
            let base = label_base(&id.0, kind);
            let mut key = base.clone();
            let mut n = 2;
            while self.taken.contains(&key) {
                key = renamed(&base, n);
                n += 1;
            }
            self.taken.insert(key.clone());
            self.of_key.insert(id, key.clone());
            key
        }
    }

    impl Naming {
        /// The family name of `name` recorded as `kind`: its own for good.
        fn family(&mut self, name: &str, kind: Kind) -> String {
            let id = (name.to_owned(), kind as u8);
            if let Some(f) = self.family_of.get(&id) {
                return f.clone();
            }
            let base = family_base(name, kind);
            let mut candidate = base.clone();
            let mut n = 2;
            while exposed(&candidate, kind)
                .iter()
                .any(|e| self.taken.contains(e))
            {
                candidate = renamed(&base, n);
                n += 1;
            }
            self.taken.extend(exposed(&candidate, kind));
            self.family_of.insert(id, candidate.clone());
            candidate
        }
    }

    impl SplitRecorder {
        fn families(&self) -> Vec<Family> {
            let descriptions = self
                .inner
                .descriptions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let mut recorded: Vec<(KeyParts, Kind, Value)> = Vec::new();
            for (k, v) in self.counters() {
                recorded.push((k, Kind::Counter, Value::Int(v)));
            }
            for (k, v) in self.gauges() {
                recorded.push((k, Kind::Gauge, Value::Float(v)));
            }
            for (k, count, sum) in self.histograms() {
                recorded.push((k, Kind::Histogram, Value::Histogram { sum, count }));
            }
            // Each recorded (name, kind) gets a family name of its own: two
            // names that sanitize alike (`a.b`, `a-b`), a counter `x` and
            // a counter `x_total`, or a counter `x` and a gauge
            // `x_total`, would otherwise write the same series twice or
            // two HELP lines for one name — Prometheus rejects the scrape.
            // Names valid as they are keep them; the others get `_2`,
            // `_3` … in the order below, and every name stays as first
            // given (`Naming`).
            let mut naming = self.inner.naming.lock().unwrap_or_else(|e| e.into_inner());
            for ((name, _), kind, _) in &recorded {
                if family_base(name, *kind) == *name {
                    naming.family(name, *kind);
                }
            }
            let mut by_name: BTreeMap<(String, u8), Family> = BTreeMap::new();
            let mut named = Vec::with_capacity(recorded.len());
            for ((name, labels), kind, value) in recorded {
                let fam_name = naming.family(&name, kind);
                naming
                    .labels
                    .entry(fam_name.clone())
                    .or_default()
                    .reserve_valid(&labels, kind);
                named.push((name, fam_name, labels, kind, value));
            }
            for (name, fam_name, labels, kind, value) in named {
                // Without a description, the name as recorded (a HELP line
                // with no text is what `promtool` lints).
                let help = match descriptions.get(&name) {
                    Some(d) => d.to_string(),
                    None if name.is_empty() => "(recorded without a name)".to_owned(),
                    None => name.clone(),
                };
                let labels = naming
                    .labels
                    .entry(fam_name.clone())
                    .or_default()
                    .label_set(labels, kind);
                let fam = by_name
                    .entry((fam_name.clone(), kind as u8))
                    .or_insert_with(|| Family::new(fam_name, &help, None, kind));
                fam.samples.push((labels, value));
            }
            by_name.into_values().collect()
        }

        /// Everything recorded, in the Prometheus text format 0.0.4
        /// (names made valid: other characters become `_`; a counter's
        /// `_total` suffix is written once; names that would then collide
        /// — `a.b` and `a-b`, a counter `x` and `x_total`, a counter and a
        /// gauge `x_total` — get `_2`, `_3` …, and so do label names (the
        /// same name for a key in every series of a family, so `{x.y="1"}`
        /// and `{x-y="1"}` stay two series: `x_y` and `x_y_2`; a key given
        /// twice in one series gets `k` and `k_2`); a label named `le` on a
        /// histogram becomes `le_`, a name or label starting with `__`
        /// (reserved) starts with one `_`, and a metric recorded with no
        /// name (or only underscores) is `unnamed`). Names valid as
        /// recorded are kept before others are renamed, and every name
        /// given stays for the recorder's life: a series recorded later
        /// never takes over a name a scraper has seen.
        pub fn render(&self) -> String {
            render_families(&self.families())
        }
    }

    impl Collector for SplitRecorder {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_families(&mut encoder, &self.families())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SplitRecorder, HANDLES};

    /// A thread's handles on a dropped recorder's metrics go when it meets
    /// the next recorder: a thread that makes and drops recorders keeps
    /// one recorder's handles at most, not all of them.
    #[test]
    fn a_dropped_recorders_handles_go_when_the_thread_meets_a_new_one() {
        std::thread::spawn(|| {
            for _ in 0..100 {
                let r = SplitRecorder::new();
                metrics::with_local_recorder(&r, || metrics::counter!("c").increment(1));
            }
            let kept = HANDLES.with(|h| h.borrow().len());
            assert_eq!(kept, 1, "the last recorder's, until the next one");
        })
        .join()
        .unwrap();
    }
}
