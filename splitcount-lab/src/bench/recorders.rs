//! `bench metrics`: splitcount's recorder for the `metrics` facade
//! ([`SplitRecorder`], counters that are split counters) against
//! `metrics-exporter-prometheus`'s own recorder (the baseline, one atomic
//! per counter), both incrementing one counter shared by every thread —
//! the `requests_total` of a server:
//!
//! - `*-handle`: a `Counter` handle kept by each thread, `increment(1)` per
//!   operation (what code that caches its handles pays);
//! - `*-register`: `register_counter` then `increment(1)` per operation,
//!   what `metrics::counter!(…).increment(1)` does at each call (a
//!   registry lookup and a handle clone and drop, then the add).
//!
//! Each `splitcount-*` case is divided by its `prometheus-*` twin.

use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use metrics::{Key, Level, Metadata, Recorder};
use metrics_exporter_prometheus::PrometheusBuilder;
use splitcount::export::metrics::SplitRecorder;

/// The cases, in table order.
pub const CASES: [&str; 4] = [
    "splitcount-handle",
    "prometheus-handle",
    "splitcount-register",
    "prometheus-register",
];

/// The baseline of a case: the same way of counting on the Prometheus
/// exporter's recorder.
pub fn baseline_of(case: &str) -> Option<String> {
    Some(case.replacen("splitcount", "prometheus", 1))
}

static KEY: Key = Key::from_static_name("requests_total");
static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

fn entries<'a>(name: &str, recorder: &'a (dyn Recorder + Sync), t: usize) -> [Entry<'a>; 2] {
    [
        Entry::new(format!("{name}-handle"), t, move |_| {
            let counter = recorder.register_counter(&KEY, &METADATA);
            move || counter.increment(std::hint::black_box(1))
        }),
        Entry::new(format!("{name}-register"), t, move |_| {
            move || {
                recorder
                    .register_counter(&KEY, &METADATA)
                    .increment(std::hint::black_box(1))
            }
        }),
    ]
}

/// Measure every case at each thread count.
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let split = SplitRecorder::new();
    let prometheus = PrometheusBuilder::new().build_recorder();
    let mut all = Vec::new();
    for &t in threads {
        let [sh, sr] = entries("splitcount", &split, t);
        let [ph, pr] = entries("prometheus", &prometheus, t);
        all.extend([sh, ph, sr, pr]);
    }
    let measured = measure("metrics", plan, all)?;
    Ok(Bench::new(measured, baseline_of))
}
