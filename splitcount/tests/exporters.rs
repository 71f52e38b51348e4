//! The Prometheus exposition and the `metrics` recorder: golden text, the
//! real `promtool`, and the exposition parsed back against the groups.

#![cfg(not(loom))]

use prometheus_client::registry::Registry;
use splitcount::export::metrics::SplitRecorder;
use splitcount::export::prometheus::{render, HierarchyCollector, Options};
use splitcount::group::{Hierarchy, HierarchyConfig};
use splitcount::stat::StatItem;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

/// `promtool check metrics` on `text`: `Some(report)` when it complains,
/// `None` when it accepts. Without promtool the test fails under CI (which
/// installs it) and is skipped with a message elsewhere.
fn promtool(text: &str) -> Option<String> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is missing under CI: {e}"
            );
            eprintln!("promtool not found ({e}): skipping its check");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (!out.status.success()).then(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Samples of a text exposition: (name, labels) → value.
fn parse(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap(),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').unwrap();
                let mut labels = BTreeMap::new();
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").unwrap();
                    labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
                }
                (n.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        out.insert((name, labels), value);
    }
    out
}

fn demo() -> Hierarchy {
    let h = Hierarchy::new(
        HierarchyConfig::default().stats(vec![StatItem::gauge("rows"), StatItem::event("queries")]),
    )
    .unwrap();
    let (rows, queries) = (h.stat_id("rows").unwrap(), h.stat_id("queries").unwrap());
    let t = h.root().child("tenant").unwrap();
    t.set_max(1000).unwrap();
    t.set_high(100);
    let q = t.child("q").unwrap();
    q.force_charge(300).unwrap();
    q.mod_stat(rows, 12).unwrap();
    q.mod_stat(queries, 2).unwrap();
    h
}

#[test]
fn the_exposition_reads_as_expected() {
    let h = demo();
    let text = render(&h.root(), &Options::default().max_depth(1));
    let expected = "\
# HELP splitcount_group_usage Usage of the group's subtree, units pre-charged in the per-CPU stocks included.
# TYPE splitcount_group_usage gauge
splitcount_group_usage{group=\"/\"} 300
splitcount_group_usage{group=\"/tenant\"} 300
# HELP splitcount_group_usage_slack Units of the usage pre-charged in the per-CPU stocks and not in use: the error bound of usage (an allocator's per-thread reserves aside).
# TYPE splitcount_group_usage_slack gauge
splitcount_group_usage_slack{group=\"/\"} 0
splitcount_group_usage_slack{group=\"/tenant\"} 0
# HELP splitcount_group_max Hard limit (+Inf: none).
# TYPE splitcount_group_max gauge
splitcount_group_max{group=\"/\"} +Inf
splitcount_group_max{group=\"/tenant\"} 1000
# HELP splitcount_group_high Soft limit (+Inf: none).
# TYPE splitcount_group_high gauge
splitcount_group_high{group=\"/\"} +Inf
splitcount_group_high{group=\"/tenant\"} 100
# HELP splitcount_group_peak Peak usage of the group's subtree.
# TYPE splitcount_group_peak gauge
splitcount_group_peak{group=\"/\"} 300
splitcount_group_peak{group=\"/tenant\"} 300
# HELP splitcount_group_events_total Events of the group's subtree, removed groups included: max (charges that hit a limit, refused or over-charged), high (crossings of high), oom (charges refused after reclaim failed), underflow (over-uncharges), breaches (crossings of a cooperative limit: one per episode over it), refused (charges refused: nulls from the allocator, errors from charge).
# TYPE splitcount_group_events_total counter
splitcount_group_events_total{group=\"/\",event=\"max\"} 0
splitcount_group_events_total{group=\"/\",event=\"high\"} 1
splitcount_group_events_total{group=\"/\",event=\"oom\"} 0
splitcount_group_events_total{group=\"/\",event=\"underflow\"} 0
splitcount_group_events_total{group=\"/\",event=\"breaches\"} 0
splitcount_group_events_total{group=\"/\",event=\"refused\"} 0
splitcount_group_events_total{group=\"/tenant\",event=\"max\"} 0
splitcount_group_events_total{group=\"/tenant\",event=\"high\"} 1
splitcount_group_events_total{group=\"/tenant\",event=\"oom\"} 0
splitcount_group_events_total{group=\"/tenant\",event=\"underflow\"} 0
splitcount_group_events_total{group=\"/tenant\",event=\"breaches\"} 0
splitcount_group_events_total{group=\"/tenant\",event=\"refused\"} 0
# HELP splitcount_group_stall_seconds_total Time charges to the group's subtree spent stalled after a refusal (reclaim hooks, drains, retries, OOM hooks).
# TYPE splitcount_group_stall_seconds_total counter
splitcount_group_stall_seconds_total{group=\"/\"} 0.0
splitcount_group_stall_seconds_total{group=\"/tenant\"} 0.0
# HELP splitcount_group_stat Gauge statistics of the group's subtree, by item.
# TYPE splitcount_group_stat gauge
splitcount_group_stat{group=\"/\",item=\"rows\"} 12
splitcount_group_stat{group=\"/tenant\",item=\"rows\"} 12
# HELP splitcount_group_stat_events_total Event statistics of the group's subtree, by item.
# TYPE splitcount_group_stat_events_total counter
splitcount_group_stat_events_total{group=\"/\",item=\"queries\"} 2
splitcount_group_stat_events_total{group=\"/tenant\",item=\"queries\"} 2
";
    assert_eq!(text, expected);
    assert_eq!(promtool(&text), None);
}

/// A busier hierarchy, the whole of it, parsed back: every group's figures
/// are its snapshot's; and `promtool` accepts it, odd names included.
#[test]
fn the_exposition_parses_back_to_the_groups_and_promtool_accepts_it() {
    let h = demo();
    let t = h.lookup("tenant").unwrap();
    for i in 0..5 {
        let g = t.child(&format!("req \"{i}\"\\n")).unwrap();
        g.force_charge(10 * i).unwrap();
        let _ = g.charge(10_000); // refused by the tenant
    }
    let text = render(&h.root(), &Options::default().bytes(true));
    assert_eq!(promtool(&text), None);
    let samples = parse(&text);
    let snap = h.root().snapshot();
    assert_eq!(snap.groups.len(), 8);
    for g in &snap.groups {
        let label = g.path.replace('\\', "\\\\").replace('"', "\\\"");
        let get = |name: &str| {
            let key = (
                name.to_owned(),
                BTreeMap::from([("group".to_owned(), label.clone())]),
            );
            *samples
                .get(&key)
                .unwrap_or_else(|| panic!("{name} of {}", g.path))
        };
        assert_eq!(get("splitcount_group_usage_bytes"), g.usage as f64);
        assert_eq!(get("splitcount_group_peak_bytes"), g.peak as f64);
        assert_eq!(
            get("splitcount_group_max_bytes"),
            g.max.map_or(f64::INFINITY, |m| m as f64)
        );
        let events = |e: &str| {
            let key = (
                "splitcount_group_events_total".to_owned(),
                BTreeMap::from([
                    ("event".to_owned(), e.to_owned()),
                    ("group".to_owned(), label.clone()),
                ]),
            );
            samples[&key]
        };
        assert_eq!(events("max"), g.subtree_events.max as f64);
        assert_eq!(events("oom"), g.subtree_events.oom as f64);
    }
}

/// Caps on depth and on groups bound the cardinality; a removed group
/// disappears from the next scrape.
#[test]
fn the_export_is_capped_and_forgets_removed_groups() {
    let h = Hierarchy::default();
    for t in 0..3 {
        let tenant = h.root().child(&format!("t{t}")).unwrap();
        for r in 0..10 {
            tenant.child(&format!("r{r}")).unwrap();
        }
    }
    let groups_in = |text: &str| {
        parse(text)
            .keys()
            .filter(|(n, _)| n == "splitcount_group_usage")
            .count()
    };
    assert_eq!(groups_in(&render(&h.root(), &Options::default())), 34);
    assert_eq!(
        groups_in(&render(&h.root(), &Options::default().max_depth(1))),
        4
    );
    let capped = render(&h.root(), &Options::default().max_groups(6));
    assert_eq!(groups_in(&capped), 6);
    assert!(capped.contains("group=\"/t2\""), "whole levels first");
    h.lookup("t1/r3").unwrap().remove().unwrap();
    let after = render(&h.root(), &Options::default());
    assert_eq!(groups_in(&after), 33);
    assert!(!after.contains("/t1/r3"));
}

/// Through a prometheus-client registry: OpenMetrics text.
#[test]
fn the_collector_writes_openmetrics_through_a_registry() {
    let h = demo();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(HierarchyCollector::new(&h, Options::default())));
    let recorder = SplitRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("requests_total", "tenant" => "acme").increment(3);
    });
    registry.register_collector(Box::new(recorder));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE splitcount_group_events counter\n"));
    assert!(text.contains("splitcount_group_usage{group=\"/tenant/q\"} 300\n"));
    assert!(text.contains("splitcount_group_max{group=\"/\"} inf\n") || text.contains("+Inf"));
    assert!(
        text.contains("requests_total{tenant=\"acme\"} 3\n"),
        "{text}"
    );
}

/// What a user writes that is not valid exposition text is made valid: a
/// prefix with `-` and `.` (it was written as given: "invalid metric
/// name"), and a description with a newline and a backslash through the
/// collector (escaped by `render` already; written raw through a
/// registry, it split the HELP line in two). Found by a helper, with
/// promtool.
#[test]
fn a_prefix_and_a_description_that_are_not_valid_text_are_made_valid() {
    let h = demo();
    let text = render(&h.root(), &Options::default().prefix("my-app.v2"));
    assert!(
        text.contains("# TYPE my_app_v2_group_usage gauge\n"),
        "{text}"
    );
    assert_eq!(promtool(&text), None, "{text}");
    let recorder = SplitRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_counter!("jobs", "Jobs \"run\".\nCounted per worker \\ shard.");
        metrics::counter!("jobs").increment(1);
    });
    let mut registry = Registry::default();
    registry.register_collector(Box::new(recorder));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("# HELP jobs Jobs \\\"run\\\".\\nCounted per worker \\\\ shard.\n"),
        "{text}"
    );
    // Every line is a comment or a sample (promtool's lints about the
    // OpenMetrics counter's `_total` suffix aside, which prometheus-client
    // writes for every counter).
    for line in text.lines() {
        assert!(
            line.starts_with('#') || line.starts_with("jobs_total"),
            "{line}"
        );
    }
}

/// The recorder's counters are exact after concurrent increments, its
/// gauges and histograms keep what they are told, and its exposition
/// (names made valid) passes promtool.
#[test]
fn the_recorder_counts_exactly_and_exports_valid_text() {
    let recorder = SplitRecorder::new();
    std::thread::scope(|s| {
        for t in 0..4 {
            let r = &recorder;
            s.spawn(move || {
                metrics::with_local_recorder(r, || {
                    let tenant = if t % 2 == 0 { "a" } else { "b" };
                    let c = metrics::counter!("requests_total", "tenant" => tenant);
                    for _ in 0..50_000 {
                        c.increment(1);
                    }
                    for _ in 0..1_000 {
                        metrics::counter!("macro.calls").increment(2);
                    }
                    metrics::histogram!("latency_seconds").record(0.5);
                });
            });
        }
    });
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_counter!("requests_total", "Requests served.");
        let g = metrics::gauge!("queue-depth");
        g.set(10.0);
        g.increment(2.5);
        g.decrement(0.5);
        metrics::counter!("requests_total", "tenant" => "a").absolute(10);
    });
    let counters: BTreeMap<String, u64> = recorder
        .counters()
        .into_iter()
        .map(|((name, labels), v)| (format!("{name}{labels:?}"), v))
        .collect();
    assert_eq!(counters["requests_total[(\"tenant\", \"a\")]"], 100_000);
    assert_eq!(counters["requests_total[(\"tenant\", \"b\")]"], 100_000);
    assert_eq!(counters["macro.calls[]"], 8_000);
    assert_eq!(recorder.gauges()[0].1, 12.0);
    assert_eq!(recorder.histograms()[0].1, 4);
    assert_eq!(recorder.histograms()[0].2, 2.0);
    let text = recorder.render();
    assert_eq!(promtool(&text), None, "{text}");
    assert!(text.contains("# HELP requests_total Requests served.\n"));
    assert!(text.contains("requests_total{tenant=\"a\"} 100000\n"));
    assert!(text.contains("macro_calls_total 8000\n"));
    assert!(text.contains("queue_depth 12.0\n"));
    assert!(text.contains("latency_seconds_count 4\n"));
}

/// No series (a name and its labels) appears twice in an exposition.
fn assert_no_series_twice(text: &str) {
    let mut series: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect();
    let all = series.len();
    series.sort_unstable();
    series.dedup();
    assert_eq!(series.len(), all, "a series written twice:\n{text}");
}

/// Names that collide once made valid, or with the suffixes the format
/// adds, get families of their own; label names that collide or that the
/// format reserves are renamed: promtool accepts the text and no series is
/// written twice. Each case below made promtool refuse it, or wrote a
/// series twice (which a Prometheus scrape refuses; found by a helper).
#[test]
fn colliding_names_still_render_a_valid_exposition() {
    let recorder = SplitRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("req").increment(1);
        metrics::counter!("req_total").increment(2);
        metrics::gauge!("q.len").set(1.0);
        metrics::gauge!("q-len").set(2.0);
        metrics::counter!("x").increment(1);
        metrics::gauge!("x_total").set(3.0);
        metrics::histogram!("h").record(1.0);
        metrics::counter!("h_count").increment(4);
        metrics::counter!("c", "a.b" => "1", "a-b" => "2").increment(1);
        metrics::histogram!("h2", "le" => "x").record(2.0);
        metrics::counter!("r", "__name__" => "n").increment(1);
        // Keys alike in two series of one family (not in one series):
        // `x_y` and `x_y_2` in both, not `d_total{x_y="1"}` twice.
        metrics::counter!("d", "x.y" => "1").increment(1);
        metrics::counter!("d", "x-y" => "1").increment(5);
        // No name: not `__total` (reserved) with an empty HELP line.
        metrics::counter!("").increment(6);
    });
    let text = recorder.render();
    assert_eq!(promtool(&text), None, "{text}");
    assert_no_series_twice(&text);
    assert!(
        text.contains("req_total 1\n") && text.contains("req_2_total 2\n"),
        "{text}"
    );
    assert!(text.contains("r_total{_name__=\"n\"} 1\n"), "{text}");
    assert!(
        // `x-y` sorts before `x.y`, and is met first.
        text.contains("d_total{x_y=\"1\"} 5\n") && text.contains("d_total{x_y_2=\"1\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("# HELP unnamed_total (recorded without a name)\n"),
        "{text}"
    );
    assert!(text.contains("\nunnamed_total 6\n"), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("__")),
        "a reserved name:\n{text}"
    );
    assert!(
        !text.contains("{__") && !text.contains(",__"),
        "a reserved label:\n{text}"
    );
}

/// Names that only a renaming makes valid never take a reserved one, nor a
/// name already given: a key twice in one series is two labels; names and
/// keys of underscores only, or none, do not start with `__`; a name valid
/// as recorded keeps it; and a series keeps its names when others are
/// recorded later (found by a review: `{k="1",k="2"}` made promtool refuse
/// the scrape, `_` wrote `__total`, and `x-y` took `x_y` from `x.y` once
/// it appeared).
#[test]
fn renamed_names_are_valid_distinct_and_stable() {
    let recorder = SplitRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("dup", "k" => "1", "k" => "2").increment(1);
        metrics::counter!("_", "" => "a", "." => "b").increment(2);
        metrics::gauge!(".").set(3.0);
        metrics::histogram!("-").record(1.0);
        metrics::counter!("s", "x.y" => "1").increment(5);
        metrics::counter!("unnamed").increment(7);
        metrics::counter!("").increment(8);
    });
    let first = recorder.render();
    assert_eq!(promtool(&first), None, "{first}");
    assert!(
        first.contains("dup_total{k=\"1\",k_2=\"2\"} 1\n"),
        "{first}"
    );
    assert!(first.contains("s_total{x_y=\"1\"} 5\n"), "{first}");
    assert!(
        first.contains("\nunnamed_total 7\n"),
        "valid as recorded:\n{first}"
    );
    for line in first.lines() {
        let name = line
            .trim_start_matches("# HELP ")
            .trim_start_matches("# TYPE ");
        assert!(!name.starts_with("__"), "a reserved name: {line}");
        assert!(
            !line.contains("{__") && !line.contains(",__"),
            "a reserved label: {line}"
        );
    }
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("s", "x-y" => "2").increment(1);
        metrics::counter!("s", "x_y" => "3").increment(1);
    });
    let second = recorder.render();
    assert_eq!(promtool(&second), None, "{second}");
    assert!(
        second.contains("s_total{x_y=\"1\"} 5\n"),
        "kept its name:\n{second}"
    );
    assert_no_series_twice(&second);
    assert_eq!(recorder.render(), second, "the same text twice");
}

/// A counter is a `u64` counter: exact up to `u64::MAX`, an increment above
/// `i64::MAX` kept whole (it was cut to `i64::MAX`, and a total past it
/// read 0 — a counter going down; found by a helper).
#[test]
fn recorder_counters_count_as_u64s() {
    let recorder = SplitRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("big").increment(u64::MAX - 5);
        metrics::counter!("big").increment(3);
        let past = metrics::counter!("past_i64");
        past.increment(1 << 62);
        past.increment((1 << 62) - 1);
        past.increment(1);
        past.increment(7);
    });
    let counters: BTreeMap<String, u64> = recorder
        .counters()
        .into_iter()
        .map(|((name, _), v)| (name, v))
        .collect();
    assert_eq!(counters["big"], u64::MAX - 2);
    assert_eq!(counters["past_i64"], (1 << 63) + 7);
    let text = recorder.render();
    assert!(
        text.contains(&format!("big_total {}\n", u64::MAX - 2)),
        "{text}"
    );
}

/// With `process_memory`, the exposition carries the process's resident
/// set, every part and the unexplained remainder, in both formats; the
/// remainder's sample is the resident set less the parts (the subtracted
/// one subtracted), and promtool accepts the text.
#[test]
fn the_process_memory_is_exported_part_by_part() {
    use splitcount::alloc::{Accounted, ResidentPart};
    // Not this binary's global allocator: the process-wide figures
    // (glibc's, smaps) are read all the same.
    static ALLOC: Accounted<std::alloc::System> = Accounted::new(std::alloc::System);
    let heap = Hierarchy::default();
    ALLOC.attach(&heap).unwrap();
    let options = Options::default().process_memory(|| ALLOC.reconcile());
    let text = render(&heap.root(), &options);
    assert_eq!(promtool(&text), None, "{text}");
    let samples = parse(&text);
    let value = |name: &str| {
        samples
            .get(&(name.to_owned(), BTreeMap::new()))
            .copied()
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    let mut parts = 0.0;
    for part in ResidentPart::ALL {
        let v = value(&format!("splitcount_process_{}_bytes", part.name()));
        parts += if part.subtracted() { -v } else { v };
    }
    let resident = value("splitcount_process_resident_bytes");
    assert!(resident > 0.0 && value("splitcount_process_files_bytes") > 0.0);
    assert_eq!(
        value("splitcount_process_unexplained_bytes"),
        resident - parts
    );
    assert!(text.contains("# TYPE splitcount_process_trims_total counter\n"));
    assert!(text.contains("# HELP splitcount_process_unexplained_bytes "));

    let mut registry = Registry::default();
    registry.register_collector(Box::new(HierarchyCollector::new(&heap, options)));
    let mut open = String::new();
    prometheus_client::encoding::text::encode(&mut open, &registry).unwrap();
    assert!(
        open.contains("# TYPE splitcount_process_unexplained_bytes gauge\n"),
        "{open}"
    );
    assert!(
        open.contains("# UNIT splitcount_process_unexplained_bytes bytes\n"),
        "{open}"
    );
}

/// A source that has nothing to say (no allocator attached yet) leaves the
/// process's families out.
#[test]
fn an_empty_memory_source_exports_no_process_families() {
    let h = demo();
    let text = render(&h.root(), &Options::default().process_memory(|| None));
    assert!(!text.contains("splitcount_process_"), "{text}");
}
