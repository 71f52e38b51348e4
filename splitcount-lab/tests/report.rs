//! `splitcount-lab report` as a user runs it: the files it writes, and that
//! its accuracy numbers are the `accuracy` command's.

use serde_json::Value;
use splitcount_lab::report::suites::SUITES;
use splitcount_lab::report::targets::TARGETS;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn lab(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn report_json(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("report.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn suite<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["suites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("suite {name} missing"))
}

#[test]
fn a_quick_report_writes_every_suite_to_json_and_html() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested/report");
    let start = Instant::now();
    let (ok, stdout, stderr) = lab(&["report", "--quick", "--out", out.to_str().unwrap()]);
    let took = start.elapsed();
    assert!(ok, "{stderr}");
    // Not a benchmark: a guard against a `--quick` that stopped being
    // quick (the full report's rounds take ~15 minutes). About 35 s on 2
    // quiet cores; the bound leaves room for a loaded machine (60 s failed
    // once with other builds running). CI runs the tests in release mode.
    if !cfg!(debug_assertions) {
        assert!(
            took < Duration::from_secs(240),
            "report --quick took {took:?}"
        );
    }

    let report = report_json(&out);
    for key in [
        "possible_cpus",
        "online_cpus",
        "cpu_id_source",
        "rseq_registered_by",
    ] {
        assert!(
            report["machine"].get(key).is_some(),
            "machine.{key} missing"
        );
    }
    let names: Vec<&str> = report["suites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let known: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
    assert_eq!(names, known, "every suite, in report order");
    for s in report["suites"].as_array().unwrap() {
        let records = s["records"].as_array().unwrap();
        assert!(!records.is_empty(), "{} has no records", s["name"]);
        for r in records {
            assert!(
                r["case"].is_string(),
                "{}: a record without case",
                s["name"]
            );
        }
        for p in s["published"].as_array().unwrap() {
            assert_eq!(p["measured_elsewhere"], true);
        }
        assert!(
            stdout.contains(s["title"].as_str().unwrap()),
            "{} not printed",
            s["name"]
        );
    }

    // Timings are ratios to a baseline of the same run, named in the record.
    let counters = suite(&report, "counters")["records"].as_array().unwrap();
    for case in ["tree", "thread-local", "striped", "fast-counter"] {
        for threads in [1, 2, 4, 8] {
            let r = counters
                .iter()
                .find(|r| r["case"] == case && r["threads"] == threads)
                .unwrap_or_else(|| panic!("counters: {case} at {threads} threads missing"));
            assert_eq!(r["baseline"], "shared-atomic");
            assert!(r["ratio"].as_f64().unwrap() > 0.0);
            assert!(r["ns_per_op"].as_f64().unwrap() > 0.0);
        }
    }
    for r in counters {
        for key in ["low", "high", "rounds", "stable", "overlap", "pinned"] {
            assert!(r.get(key).is_some(), "counters record without {key}: {r}");
        }
    }
    let settings = &suite(&report, "counters")["settings"];
    assert_eq!(settings["rounds"], 3, "--quick runs three rounds");

    // The verdicts: one per target, with the statuses the README promises.
    let verdicts = report["verdicts"].as_array().unwrap();
    assert_eq!(verdicts.len(), TARGETS.len());
    for (v, t) in verdicts.iter().zip(TARGETS) {
        assert_eq!(v["name"], t.name);
        assert_eq!(v["target"], t.goal().as_str());
        let status = v["status"].as_str().unwrap();
        assert!(
            ["met", "not met", "unstable", "not measured"].contains(&status),
            "{status}"
        );
        if status != "not measured" {
            let (lo, m, hi) = (
                v["low"].as_f64().unwrap(),
                v["median"].as_f64().unwrap(),
                v["high"].as_f64().unwrap(),
            );
            assert!(lo <= m && m <= hi, "{v}");
        }
    }
    assert!(stdout.contains("Summary: the targets, measured here"));

    let layout = suite(&report, "layout")["records"].as_array().unwrap();
    let packed = layout
        .iter()
        .find(|r| r["case"] == "packed-reader")
        .unwrap();
    assert_eq!(packed["baseline"], "padded-reader");
    let watchdog = suite(&report, "watchdog")["records"].as_array().unwrap();
    assert_eq!(watchdog.len(), 4);
    assert!(watchdog
        .iter()
        .all(|r| !r["samples"].as_array().unwrap().is_empty()));

    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("<svg"));
    for name in known {
        assert!(
            html.contains(&format!("<section id=\"{name}\">")),
            "{name} not on the page"
        );
    }
    assert!(html.contains("published (measured elsewhere)"));
    assert!(
        html.find("id=\"summary\"").unwrap() < html.find("id=\"machine\"").unwrap(),
        "the verdicts come first on the page"
    );
    assert!(
        !html.contains("DESIGN.md"),
        "the page cites nothing outside the repository"
    );
    assert!(html.contains("IMPLEMENTATION.md"));
}

#[test]
fn the_readme_lists_every_suite_and_cites_nothing_outside_the_repository() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    for s in SUITES {
        let row = format!("| `{}` |", s.name);
        assert!(
            readme.contains(&row),
            "README's suite table lacks {}",
            s.name
        );
    }
    for doc in ["README.md", "IMPLEMENTATION.md"] {
        let text = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
        assert!(!text.contains("DESIGN.md"), "{doc} cites DESIGN.md");
    }
}

#[test]
fn the_accuracy_suite_reports_what_the_accuracy_command_prints() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (ok, _, stderr) = lab(&["report", "--quick", "--suites", "accuracy", "--out", out]);
    assert!(ok, "{stderr}");
    let report = report_json(dir.path());
    assert_eq!(report["suites"].as_array().unwrap().len(), 1);
    let acc = suite(&report, "accuracy");
    let settings = &acc["settings"];
    let cpus: Vec<String> = settings["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let (steps, seed) = (settings["steps"].to_string(), settings["seed"].to_string());
    let (ok, stdout, stderr) = lab(&[
        "accuracy",
        "--cpus",
        &cpus.join(","),
        "--steps",
        &steps,
        "--seed",
        &seed,
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let printed: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let records = acc["records"].as_array().unwrap();
    assert_eq!(printed.len(), records.len());
    assert_eq!(printed.len(), 4 * cpus.len(), "every design at every size");
    for (line, record) in printed.iter().zip(records) {
        for (key, value) in line.as_object().unwrap() {
            assert_eq!(&record[key], value, "{key} of {line}");
        }
        assert_eq!(record["case"], line["design"]);
    }
}

#[test]
fn unknown_suites_are_refused_with_the_known_ones_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    let (ok, _, stderr) = lab(&[
        "report",
        "--suites",
        "counters,nope",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("unknown suite \"nope\""), "{stderr}");
    assert!(
        stderr.contains("known: counters, accuracy, watchdog"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written for a refused command");
}
