//! The lab's commands as a user runs them.

use std::io::Write;
use std::process::{Command, Stdio};

fn lab(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Run `bench <suite> --json <args>`, which must succeed, and parse its lines.
fn bench_json(suite: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let argv: Vec<&str> = ["bench", suite, "--json"]
        .iter()
        .chain(args)
        .copied()
        .collect();
    let (ok, out, err) = lab(&argv, "");
    assert!(ok, "bench {suite}: {err}");
    json_lines(&out)
}

/// The line of `case` at `threads`, which must be there.
fn line<'a>(lines: &'a [serde_json::Value], case: &str, threads: usize) -> &'a serde_json::Value {
    lines
        .iter()
        .find(|l| l["case"] == case && l["threads"] == threads)
        .unwrap_or_else(|| panic!("{case} at {threads} threads missing"))
}

fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The library ignores a switch it does not know; the lab, which measures
/// with them, refuses it.
#[test]
fn a_mistyped_environment_switch_is_refused() {
    for (var, value) in [
        ("SPLITCOUNT_PERCPU_ADD", "bogus"),
        ("SPLITCOUNT_CPU_ID_SOURCE", "rseq"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
            .arg("machine")
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success());
        assert!(
            err.contains(&format!("{var}=\"{value}\" is not valid")),
            "{err}"
        );
    }
}

#[test]
fn machine_json_has_the_promised_fields() {
    let (ok, out, _) = lab(&["machine", "--json"], "");
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for key in [
        "possible_cpus",
        "online_cpus",
        "numa_nodes",
        "cpu_id_source",
        "mm_cid_available",
        "rseq_registered_by",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {out}");
    }
    assert!(v["possible_cpus"].as_u64().unwrap() >= 1);
    // The CPU, its host and the performance counters, in words.
    for key in [
        "cpu_vendor",
        "cpu_model",
        "virtualization",
        "perf_counters",
        "two_threads",
    ] {
        assert!(
            v[key].as_str().is_some_and(|s| !s.is_empty()),
            "{key} in {out}"
        );
    }
}

#[test]
fn bench_cpu_id_json_lines_carry_a_ratio_to_the_raw_syscall() {
    let lines = bench_json("cpu-id", &["--threads", "1", "--seconds", "0.02"]);
    assert!(!lines.is_empty());
    for l in &lines {
        for key in [
            "suite",
            "case",
            "threads",
            "ns_per_op",
            "ops_per_sec",
            "ratio",
            "baseline",
            "low",
            "high",
            "rounds",
            "stable",
        ] {
            assert!(l.get(key).is_some(), "missing {key}");
        }
        assert_eq!(l["suite"], "cpu-id");
        assert_eq!(
            l["rounds"], 9,
            "the default rounds, none left out on one thread"
        );
        assert!(l["low"].as_f64().unwrap() <= l["ratio"].as_f64().unwrap());
        assert!(l["ratio"].as_f64().unwrap() <= l["high"].as_f64().unwrap());
    }
    if let Some(base) = lines.iter().find(|l| l["case"] == "getcpu-syscall") {
        assert_eq!(base["ratio"], 1.0);
        assert!(lines.iter().all(|l| l["baseline"] == "getcpu-syscall"));
    }
}

#[test]
fn bench_counters_covers_every_design_the_floor_the_shared_atomic_and_the_peers() {
    let lines = bench_json(
        "counters",
        &["--threads", "1,2", "--seconds", "0.02", "--rounds", "2"],
    );
    for case in [
        "thread-local",
        "shared-atomic",
        "atomic",
        "batched",
        "pernode",
        "tree",
        "striped",
        "fast-counter",
    ] {
        for t in [1, 2] {
            let l = line(&lines, case, t);
            assert!(l["ops_per_sec"].as_f64().unwrap() > 0.0);
            assert!(l["ns_per_op"].as_f64().unwrap() > 0.0);
            assert_eq!(l["baseline"], "shared-atomic");
        }
    }
}

#[test]
fn accuracy_json_reports_bound_worst_case_and_random_walks() {
    let (ok, out, err) = lab(
        &[
            "accuracy",
            "--design",
            "batched,tree",
            "--cpus",
            "8,4096",
            "--json",
            "--steps",
            "2000",
        ],
        "",
    );
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 4);
    for l in &lines {
        for key in [
            "design",
            "cpus",
            "batch",
            "under",
            "over",
            "worst_under",
            "worst_over",
            "random_worst",
        ] {
            assert!(l.get(key).is_some(), "missing {key}");
        }
        assert_eq!(
            l["under"], l["worst_under"],
            "the schedule reaches the bound"
        );
        assert_eq!(l["over"], l["worst_over"]);
    }
    let tree8 = lines
        .iter()
        .find(|l| l["design"] == "tree" && l["cpus"] == 8)
        .unwrap();
    assert_eq!(tree8["under"], 504);
}

#[test]
fn accuracy_max_error_reports_the_chosen_shape_or_the_refusal() {
    let args = [
        "accuracy",
        "--max-error",
        "1000",
        "--cpus",
        "8,256,4096",
        "--steps",
        "2000",
    ];
    let (ok, out, err) = lab(&[&args[..], &["--json"]].concat(), "");
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 4 * 3, "one line per design and CPU count");
    for l in &lines {
        assert_eq!(l["max_error"], 1000);
        if l["refused"].is_null() {
            assert!(l["under"].as_u64().unwrap() <= 1000, "{l}");
            assert!(l["over"].as_u64().unwrap() <= 1000, "{l}");
            assert_eq!(
                l["under"], l["worst_under"],
                "the schedule reaches the bound"
            );
            assert_eq!(l["over"], l["worst_over"]);
            assert!(l["chosen"].is_string() && l["batch"].is_u64(), "{l}");
        } else {
            assert!(l["chosen"].is_null() && l["batch"].is_null(), "{l}");
        }
    }
    let find = |design: &str, cpus: u64| {
        lines
            .iter()
            .find(|l| l["design"] == design && l["cpus"] == cpus)
            .unwrap()
    };
    let tree256 = find("tree", 256);
    assert_eq!(
        tree256["chosen"],
        "tree batch 2, fan-outs 2^2·2^6, bound 640 under"
    );
    assert_eq!(tree256["fanouts"], serde_json::json!([4, 64]));
    assert_eq!(find("batched", 8)["batch"], 126, "8·125 = 1000");
    let refusal = find("tree", 4096)["refused"].as_str().unwrap();
    assert!(
        refusal.contains("within 1,000 units")
            && refusal.contains("smallest the configuration allows is 4,096"),
        "{refusal}"
    );

    let (ok, out, err) = lab(&args, "");
    assert!(ok, "{err}");
    assert!(out.contains("max error 1000 units"), "{out}");
    assert!(
        out.contains("refused: no tree shape on 4,096 CPUs"),
        "{out}"
    );
    assert!(out.contains("atomic, bound 0"), "{out}");

    // A configured batch is kept and checked against the budget.
    let (ok, out, err) = lab(
        &[
            "accuracy",
            "--design",
            "batched",
            "--cpus",
            "8",
            "--batch",
            "64",
            "--max-error",
            "503",
            "--json",
        ],
        "",
    );
    assert!(ok, "{err}");
    assert!(
        json_lines(&out)[0]["refused"]
            .as_str()
            .unwrap()
            .contains("is 504 (batched batch 64, bound 504 each side)"),
        "{out}"
    );
}

#[test]
fn bad_flags_are_refused_with_the_valid_values() {
    let refused = |args: &[&str], needles: &[&str]| {
        let (ok, _, err) = lab(args, "");
        assert!(!ok, "{args:?} was accepted");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in {err:?}");
        }
        assert!(!err.contains("panicked"), "{err}");
    };
    refused(
        &["accuracy", "--design", "foo"],
        &["\"foo\"", "atomic, batched, pernode, tree, or all"],
    );
    refused(&["accuracy", "--cpus", "0"], &["CPU count", "valid: 1 to"]);
    refused(
        &["accuracy", "--max-error", "lots"],
        &["--max-error", "invalid"],
    );
    refused(&["accuracy", "--max-error=-1"], &["--max-error", "invalid"]);
    refused(
        &[
            "accuracy", "--design", "tree", "--cpus", "8", "--arity", "foo",
        ],
        &["auto, binary"],
    );
    refused(&["bench", "counters", "--seconds", "0"], &["must be > 0"]);
    refused(&["bench", "counters", "--seconds=-1"], &["must be > 0"]);
    refused(
        &["bench", "counters", "--seconds", "1e-9"],
        &["shorter than 1 ms", "at least 0.009 seconds"],
    );
    refused(
        &["accuracy", "--steps", "0"],
        &["--steps", "1 to 100000000"],
    );
    refused(
        &["accuracy", "--steps", "18446744073709551615"],
        &["--steps", "1 to 100000000"],
    );
    refused(
        &["bench", "counters", "--rounds", "0"],
        &["--rounds", "1 to 1000"],
    );
    refused(&["bench", "counters", "--threads", "0"], &["1 to 1024"]);
    refused(
        &["bench", "stats", "--groups", "0"],
        &["--groups", "1 to 1000000"],
    );
    refused(
        &[
            "accuracy", "--design", "tree", "--cpus", "8", "--nodes", "0",
        ],
        &["--nodes", "1 to 8"],
    );
    refused(
        &["bench", "nope"],
        &[
            "\"nope\"",
            "cpu-id, percpu, counters, charge, fault, stats, alloc, async, groups, metrics, layout, \
             ffi, preload, noisy",
        ],
    );
    refused(
        &["replay", "--design", "foo", "--cpus", "2"],
        &["atomic, batched, pernode, tree"],
    );
}

#[test]
fn report_help_lists_every_suite_and_agrees_with_the_readme_on_quick() {
    let (ok, out, _) = lab(&["report", "--help"], "");
    assert!(ok);
    for s in splitcount_lab::report::suites::SUITES {
        assert!(
            out.contains(s.name),
            "{} not in report --help:\n{out}",
            s.name
        );
    }
    // "--quick  Fewer, shorter rounds, for smoke tests (about 10 s on 2 cores, …"
    let start = out.find("smoke tests (").expect("--quick says how long") + 13;
    let duration = &out[start..start + out[start..].find(" on 2 cores").unwrap()];
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let promise = format!("for smoke tests ({duration} on 2 cores");
    assert!(
        readme.contains(&promise),
        "README does not say {promise:?} about --quick"
    );
}

#[test]
fn accuracy_rejects_bad_arguments_with_a_message() {
    let (ok, _, err) = lab(
        &[
            "accuracy", "--design", "tree", "--cpus", "8", "--batch", "3",
        ],
        "",
    );
    assert!(!ok);
    assert!(err.contains("power of two"), "{err}");
    let (ok, _, err) = lab(&["accuracy", "--cpus", "0"], "");
    assert!(!ok);
    assert!(err.contains("CPU count"), "{err}");
    let (ok, _, err) = lab(
        &[
            "accuracy", "--design", "tree", "--cpus", "8", "--arity", "8,8",
        ],
        "",
    );
    assert!(!ok);
    assert!(err.contains("fan-outs"), "{err}");
}

#[test]
fn replay_prints_the_state_after_each_line_and_names_a_bad_line() {
    let input = "{\"cpu\":0,\"delta\":31}\n{\"cpu\":0,\"delta\":1}\n{\"cpu\":1,\"delta\":-5}\n";
    let (ok, out, _) = lab(
        &["replay", "--design", "tree", "--cpus", "2", "--batch", "32"],
        input,
    );
    assert!(ok);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["approximate"], 32);
    assert_eq!(lines[2]["precise"], 27);
    assert_eq!(lines[2]["step"], 2);

    let (ok, _, err) = lab(
        &["replay", "--design", "tree", "--cpus", "2"],
        "{\"cpu\":0,\"delta\":1}\n{\"cpu\":\"x\"}\n",
    );
    assert!(!ok);
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn bench_charge_has_every_case_at_every_thread_count_with_ratios_to_no_accounting() {
    let lines = bench_json(
        "charge",
        &["--threads", "1,2", "--seconds", "0.03", "--rounds", "3"],
    );
    let rseq = splitcount_lab::bench::bare_rseq::BareRseq::new().is_some();
    for case in splitcount_lab::bench::charge::CASES {
        if case == splitcount_lab::bench::charge::BARE_RSEQ && !rseq {
            continue;
        }
        for t in [1, 2] {
            let l = line(&lines, case, t);
            assert!(l["ops_per_sec"].as_f64().unwrap() > 0.0);
            assert_eq!(l["baseline"], "no-accounting");
        }
    }
}

/// `bench fault` prints every case at every thread count, per fault, with
/// faults per second as a share of no accounting's.
#[test]
fn bench_fault_reports_every_case_per_fault_as_a_share_of_no_accounting() {
    let lines = bench_json(
        "fault",
        &["--threads", "1,2", "--seconds", "0.03", "--rounds", "3"],
    );
    for case in splitcount_lab::bench::fault::CASES {
        for t in [1, 2] {
            let l = line(&lines, case, t);
            assert_eq!(l["suite"], "fault");
            assert_eq!(l["baseline"], "no-accounting");
            for key in ["ns_per_op", "ops_per_sec", "ratio", "low", "high"] {
                assert!(l[key].as_f64().unwrap() > 0.0, "{case}: {key} in {l}");
            }
        }
    }
    assert_eq!(line(&lines, "no-accounting", 1)["ratio"], 1.0);
}

#[test]
fn bench_stats_reports_flush_and_update_costs_with_ratios() {
    let lines = bench_json(
        "stats",
        &["--groups", "500", "--seconds", "0.05", "--rounds", "3"],
    );
    for (case, baseline) in [
        ("flush-updated", "full-walk"),
        ("full-walk", "full-walk"),
        ("flush-idle", "full-walk"),
        ("mod-stat", "percpu-add"),
        ("percpu-add", "percpu-add"),
    ] {
        let l = lines
            .iter()
            .find(|l| l["case"] == case)
            .unwrap_or_else(|| panic!("{case} missing"));
        assert_eq!(l["suite"], "stats");
        assert!(l["ns_per_op"].as_f64().unwrap() > 0.0);
        assert_eq!(l["baseline"], baseline);
    }
}

#[test]
fn bench_alloc_compares_the_wrapper_with_system_and_footprints_with_requested_sizes() {
    let lines = bench_json(
        "alloc",
        &["--threads", "1,2", "--seconds", "0.06", "--rounds", "2"],
    );
    for (workload, threads) in [
        ("mixed", 1),
        ("mixed", 2),
        ("small", 1),
        ("small", 2),
        ("cross-thread", 2),
        ("json", 1),
    ] {
        for (allocator, baseline) in [
            ("system", "system"),
            ("accounted", "system"),
            ("footprint", "accounted"),
        ] {
            let case = format!("{workload}-{allocator}");
            let l = line(&lines, &case, threads);
            assert_eq!(l["baseline"], format!("{workload}-{baseline}"));
            assert!(l["ratio"].as_f64().unwrap() > 0.0);
        }
    }
}

/// `THP_enabled` of process `pid` (`/proc/<pid>/status`, Linux 5.0 and
/// later; `None` without it).
fn thp_enabled(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim().to_owned())
}

/// `bench alloc` measures the resident bytes per block in workers without
/// transparent huge pages, where a block's bytes are not rounded to 2 MiB
/// pages; a worker started as the allocators ask has the lab's own
/// setting.
#[test]
fn a_worker_started_without_huge_pages_has_none() {
    use splitcount_lab::alloc_switch::Allocator;
    use splitcount_lab::bench::worker::{HugePages, Worker};
    let Some(own) = thp_enabled(std::process::id()) else {
        eprintln!("no THP_enabled in /proc/self/status: nothing to check");
        return;
    };
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_splitcount-lab"));
    let off = Worker::start_with(exe, Allocator::System, &[], HugePages::Off).unwrap();
    assert_eq!(thp_enabled(off.pid()).as_deref(), Some("0"));
    let asked = Worker::start_with(exe, Allocator::System, &[], HugePages::AsAsked).unwrap();
    assert_eq!(thp_enabled(asked.pid()), Some(own));
}

#[test]
fn bench_layout_reports_each_role_against_the_padded_layout() {
    let lines = bench_json("layout", &["--seconds", "0.03", "--rounds", "3"]);
    let cases: Vec<&str> = lines.iter().map(|l| l["case"].as_str().unwrap()).collect();
    assert_eq!(
        cases,
        [
            "padded-reader",
            "packed-reader",
            "padded-writer",
            "packed-writer"
        ]
    );
    for l in &lines {
        assert_eq!(l["threads"], 2);
        let role = l["case"].as_str().unwrap().rsplit('-').next().unwrap();
        assert_eq!(l["baseline"], format!("padded-{role}"));
    }
}

/// `bench noisy` prints a line per case (per role at two threads) with its
/// baseline and the fields of every bench.
#[test]
fn bench_noisy_compares_breached_groups_with_healthy_ones_and_their_neighbours() {
    let lines = bench_json("noisy", &["--seconds", "0.03", "--rounds", "3"]);
    let cases: Vec<&str> = lines.iter().map(|l| l["case"].as_str().unwrap()).collect();
    assert_eq!(cases, splitcount_lab::bench::noisy::record_cases());
    for (case, threads, baseline) in [
        ("under-limit", 1, "under-limit"),
        ("breached-cooperative", 1, "under-limit"),
        ("breached-refuse", 1, "under-limit"),
        ("beside-unlimited-noisy", 2, "beside-unlimited-noisy"),
        ("beside-cooperative-noisy", 2, "beside-unlimited-noisy"),
        ("beside-cooperative-healthy", 2, "beside-unlimited-healthy"),
        ("beside-refuse-healthy", 2, "beside-unlimited-healthy"),
    ] {
        let l = line(&lines, case, threads);
        assert_eq!(l["suite"], "noisy");
        assert_eq!(l["baseline"], baseline, "{case}");
        for key in ["ns_per_op", "ops_per_sec", "ratio", "low", "high"] {
            assert!(l[key].as_f64().unwrap() > 0.0, "{case}: {key} in {l}");
        }
        for key in [
            "rounds",
            "left_out",
            "poor_overlap",
            "stable",
            "overlap",
            "pinned",
        ] {
            assert!(l.get(key).is_some(), "{case}: no {key} in {l}");
        }
    }
}

/// Output cut short by the reader (`| head -c1`) ends the lab quietly, as
/// it does other Unix tools: no panic message, killed by SIGPIPE.
#[test]
fn a_closed_pipe_ends_the_lab_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    for args in [
        &["machine"][..],
        &["accuracy", "--json", "--cpus", "2,4,8,16,32,64"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 1];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        drop(child.stdout.take()); // the reader goes away
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?}",
            out.status
        );
    }
}

/// `replay` takes only the documented object form: `[3,5]` is refused.
#[test]
fn replay_refuses_lines_that_are_not_objects() {
    let (ok, _, err) = lab(&["replay", "--design", "tree", "--cpus", "4"], "[3,5]\n");
    assert!(!ok);
    assert!(
        err.contains("line 1") && err.contains("expected {\"cpu\":N,\"delta\":N}"),
        "{err}"
    );
}

/// A field given twice is refused, not silently the last one.
#[test]
fn replay_refuses_a_line_with_a_field_given_twice() {
    let (ok, _, err) = lab(
        &["replay", "--design", "tree", "--cpus", "4"],
        "{\"cpu\":1,\"delta\":5,\"delta\":7}\n",
    );
    assert!(!ok);
    assert!(
        err.contains("line 1") && err.contains("duplicate field"),
        "{err}"
    );
}

/// `bench groups` prints a line per case and thread count with the fields
/// the issue names: case, threads, ns_per_op and retained_bytes_per_group.
#[test]
fn bench_groups_reports_time_per_cycle_and_memory_retained() {
    let lines = bench_json("groups", &["--threads", "1,2"]);
    for case in ["request-cycle", "request-cycle-no-alloc"] {
        for threads in [1, 2] {
            let l = line(&lines, case, threads);
            assert!(l["ns_per_op"].as_f64().unwrap() > 0.0);
            let retained = l["retained_bytes_per_group"].as_f64().unwrap();
            assert!((0.0..64.0).contains(&retained), "{retained} B per group");
        }
    }
}

#[test]
fn footprint_json_gives_bytes_per_counter_and_per_cpu_for_every_design() {
    let (ok, out, err) = lab(&["footprint", "--cpus", "256,4096", "--json"], "");
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2 * 5, "{out}");
    for l in &lines {
        let cpus = l["cpus"].as_u64().unwrap() as f64;
        let total = l["bytes_per_counter"].as_u64().unwrap() as f64;
        assert_eq!(l["bytes_per_cpu"].as_f64().unwrap(), total / cpus, "{l}");
        if l["design"] == "tree" {
            assert!(total / cpus <= 12.0, "{l}");
        }
    }
    let designs: Vec<&str> = lines
        .iter()
        .map(|l| l["design"].as_str().unwrap())
        .collect();
    assert_eq!(
        &designs[..5],
        ["atomic", "batched", "pernode", "tree", "tree-padded"]
    );
    let (ok, _, err) = lab(&["footprint", "--cpus", "0"], "");
    assert!(!ok && err.contains("CPU count"), "{err}");
}

/// A lab whose `splitcount` has the preload's `static-tls` (cargo unifies
/// features in a workspace build, as this test's own build may) says so
/// before it times anything; one built alone says nothing.
#[test]
fn a_lab_built_with_static_tls_says_its_allocator_figures_read_slower() {
    let (ok, _, err) = lab(
        &[
            "bench",
            "cpu-id",
            "--threads",
            "1",
            "--seconds",
            "0.01",
            "--rounds",
            "1",
        ],
        "",
    );
    assert!(ok, "{err}");
    assert_eq!(
        err.contains("has the feature `static-tls`"),
        splitcount::alloc::STATIC_TLS_CHECK,
        "{err}"
    );
}

/// A failed write to stdout (a full disk) is an error that says so, not a
/// panic with a backtrace; a report still writes its files (it died before
/// writing any).
#[test]
fn a_full_stdout_is_an_error_not_a_panic_and_the_report_still_writes_its_files() {
    let full = || {
        std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let out = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
        .arg("machine")
        .stdout(full())
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot write output: No space left"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let dir = std::env::temp_dir().join(format!("splitcount-lab-full-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
        .args(["report", "--suites", "footprint", "--out"])
        .arg(&dir)
        .stdout(full())
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && err.contains("cannot write output"),
        "{err}"
    );
    assert!(dir.join("report.json").exists() && dir.join("index.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A report whose files cannot be written fails before it measures
/// anything (an `index.html` that is a directory failed after the whole
/// run).
#[test]
fn a_report_that_cannot_write_its_files_fails_before_measuring() {
    let dir = std::env::temp_dir().join(format!("splitcount-lab-dir-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("index.html")).unwrap();
    let (ok, _, err) = lab(
        &[
            "report",
            "--suites",
            "counters",
            "--quick",
            "--out",
            dir.to_str().unwrap(),
        ],
        "",
    );
    assert!(
        !ok && err.contains("index.html") && err.contains("is a directory"),
        "{err}"
    );
    assert!(
        !err.contains("measured counters"),
        "it measured first:\n{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The library reads `SPLITCOUNT_PERCPU_ADD` trimmed, as the lab checks it:
/// a padded `" atomic"` passed the lab's check and ran the rseq path.
#[test]
fn a_padded_add_path_is_the_one_the_lab_accepted() {
    let out = Command::new(env!("CARGO_BIN_EXE_splitcount-lab"))
        .args(["machine", "--json"])
        .env("SPLITCOUNT_PERCPU_ADD", " atomic")
        .output()
        .unwrap();
    assert!(out.status.success());
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["percpu_add"], "atomic", "{info}");
}
