//! The preload library on real programs: C test programs
//! (`tests/c/heap_test.c`, `tests/c/stale_tag_test.c`,
//! `tests/c/strict_limit_test.c`, `tests/c/aligned_alloc_test.c`), Debian's
//! `sqlite3` shell running a generated SQL workload, `python3`, `bash` and
//! `/bin/true` — unmodified, with `LD_PRELOAD=libsplitcount_preload.so`.
//!
//! The library is the one cargo built for this test run, beside this
//! test's binary (`target/<profile>/deps/libsplitcount_preload.so`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn preload_so() -> PathBuf {
    let so = deps_dir().join("libsplitcount_preload.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

/// A program from the system, or a panic that says how to get it.
fn program(name: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is missing: apt-get install {package} (.ci/run installs it)");
}

fn preloaded(exe: &Path, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(exe);
    c.env("LD_PRELOAD", preload_so());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// The `key=value` pairs of a report line (`splitcount-preload: pid=…
/// program=… key=value…`); a bare word (`glibc`) is kept as `word=""`.
fn pairs(line: &str) -> HashMap<String, String> {
    line.strip_prefix("splitcount-preload: ")
        .unwrap_or_else(|| panic!("not a report line: {line}"))
        .split(' ')
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The report's lines: every one has the reporting process's id and name.
fn report_lines(report: &str) -> Vec<HashMap<String, String>> {
    report
        .lines()
        .filter(|l| l.starts_with("splitcount-preload: pid="))
        .map(pairs)
        .inspect(|r| assert!(r.contains_key("program"), "{r:?}"))
        .collect()
}

/// The `key=value` pairs of the report's line for `group`.
fn report(stderr: &str, group: &str) -> HashMap<String, String> {
    report_lines(stderr)
        .into_iter()
        .find(|r| r.get("group").map(String::as_str) == Some(group))
        .unwrap_or_else(|| panic!("no report line for {group} in:\n{stderr}"))
}

/// The report's line for glibc's own figures.
fn glibc_report(stderr: &str) -> HashMap<String, String> {
    report_lines(stderr)
        .into_iter()
        .find(|r| r.contains_key("glibc"))
        .unwrap_or_else(|| panic!("no glibc line in:\n{stderr}"))
}

fn number(r: &HashMap<String, String>, key: &str) -> u64 {
    r[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key}={} is not a number", r[key]))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn exited_normally(out: &Output) -> bool {
    out.status.code().is_some()
}

/// Compiles `tests/c/<name>.c` alone, linked with nothing of ours: a
/// program that can run with and without the preload.
fn plain_c_program(name: &str) -> PathBuf {
    let exe = deps_dir().join(format!("splitcount_preload_{name}"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let status = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .expect("cc runs (install gcc)");
    assert!(status.success(), "tests/c/{name}.c does not compile");
    exe
}

/// What a program prints on the host's glibc alone, then under the preload
/// (each run must succeed).
fn without_and_with_the_preload(exe: &Path) -> (String, String) {
    let run = |preload: bool| {
        let mut c = Command::new(exe);
        if preload {
            c.env("LD_PRELOAD", preload_so());
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            out.status,
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    (run(false), run(true))
}

/// Compiles `tests/c/<name>.c` against the C API's header and this
/// library (so that it calls the C API directly); the executable's path.
fn c_program(name: &str) -> PathBuf {
    let deps = deps_dir();
    let exe = deps.join(format!("splitcount_preload_{name}"));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(dir.join(format!("tests/c/{name}.c")))
        .arg(format!(
            "-I{}",
            dir.join("../splitcount-ffi/include").display()
        ))
        .arg(format!(
            "-I{}",
            dir.join("../splitcount-ffi/tests/c").display()
        ))
        .arg(format!("-L{}", deps.display()))
        .arg("-lsplitcount_preload")
        .arg(format!("-Wl,-rpath,{}", deps.display()))
        .arg("-lpthread")
        .status()
        .expect("cc runs (install gcc)");
    assert!(status.success(), "tests/c/{name}.c does not compile");
    exe
}

/// The library is known by its own SONAME, not the C ABI's it links in:
/// a program that links it and runs with it preloaded gets one copy (a
/// dependency's cdylib link arguments reach this cdylib too, so a SONAME
/// set that way in splitcount-ffi would win here).
#[test]
fn the_library_has_its_own_soname() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(preload_so())
        .output()
        .expect("readelf runs (apt-get install binutils)");
    let dynamic = text(&out.stdout);
    assert!(
        dynamic.contains("Library soname: [libsplitcount_preload.so]"),
        "{dynamic}"
    );
}

#[test]
fn the_c_heap_test_passes_under_the_preload() {
    heap_test(&[]);
}

/// The environment that makes `inner` the preload's inner allocator.
/// jemalloc's library keeps its thread state in static TLS, which a library
/// loaded after start-up can only get from glibc's small surplus: the
/// tunable makes room (preloading `libjemalloc.so.2` after the preload is
/// the other way, see `jemalloc_is_loaded_by_name_when_preloaded_too`).
fn inner_env(inner: &'static str) -> Vec<(&'static str, &'static str)> {
    let mut env = vec![("SPLITCOUNT_PRELOAD_INNER", inner)];
    if inner == "jemalloc" {
        env.push(("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=65536"));
    }
    env
}

fn heap_test(env: &[(&str, &str)]) {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    checks_pass(EXE.get_or_init(|| c_program("heap_test")), env);
}

/// Runs a C test program under the preload with `env`: it must exit 0
/// after "N checks passed".
fn checks_pass(exe: &Path, env: &[(&str, &str)]) {
    let out = preloaded(exe, env).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{env:?}: {}\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(stdout.trim_end().ends_with("checks passed"), "{stdout}");
    println!("{env:?}: {stdout}");
}

/// `SPLITCOUNT_PRELOAD_CHARGE=footprint`: a group's usage follows glibc's
/// own count of bytes in use (`mallinfo2`) within 0.5% over 20,000 blocks
/// (small, mapped, over-aligned, grown), and returns to 0 when they are
/// freed; with usable sizes (the default) the same blocks are charged about
/// 1% less (`the_c_heap_test_passes_under_the_preload` checks that usage
/// equals the sum of `malloc_usable_size` exactly).
#[test]
fn footprints_follow_glibcs_count_of_bytes_in_use() {
    checks_pass(
        &c_program("footprint_test"),
        &[("SPLITCOUNT_PRELOAD_CHARGE", "footprint")],
    );
}

/// The heap test with the program's blocks from the system's jemalloc and
/// mimalloc (`SPLITCOUNT_PRELOAD_INNER`): every check but glibc's own
/// count of bytes in use (which no longer holds the blocks) holds as with
/// glibc — exact usage, limits, refusals, realloc, aligned blocks (glibc's
/// still), foreign blocks, threads, fork.
#[test]
fn the_c_heap_test_passes_with_jemalloc_and_mimalloc_inside() {
    system_jemalloc();
    system_mimalloc();
    heap_test(&inner_env("jemalloc"));
    heap_test(&inner_env("mimalloc"));
}

/// `SPLITCOUNT_PRELOAD_TAGS=off`: blocks carry nothing of ours, and
/// every one is charged to `/preload`. The C test checks, on glibc,
/// jemalloc and mimalloc inside: usage equal to the usable bytes held
/// (20,000 mixed blocks; blocks from before `main`; realloc; aligned
/// blocks), back to where it was when they are freed (four threads freeing
/// each other's blocks too), a limit that refuses, `splitcount_enter`
/// refused with the reason, and on glibc, 100,000 blocks of 24 bytes that
/// take 32 bytes of glibc's heap each, as without the preload (48 with
/// tags).
#[test]
fn without_tags_blocks_cost_no_memory_and_usage_is_exact() {
    system_jemalloc();
    system_mimalloc();
    let exe = c_program("untagged_test");
    for inner in ["glibc", "jemalloc", "mimalloc"] {
        let mut env = inner_env(inner);
        env.push(("SPLITCOUNT_PRELOAD_TAGS", "off"));
        checks_pass(&exe, &env);
    }
}

/// Without tags, the blocks made while the accounting was being set up
/// (charged nothing; on glibc's heap even where the inner allocator is
/// another) are remembered, and each one the program frees later goes back
/// to the heap that made it, uncharging nothing. Every process frees some
/// of them — one of them only once the fast path is on — and the exit
/// report counts them: `setup_returned` of `setup_blocks`. If the
/// remembered blocks were not found, these frees would go to the wrong
/// heap (a glibc block handed to jemalloc, silently) and uncharge bytes
/// never charged, and `setup_returned` would read 0.
#[test]
fn the_set_ups_own_blocks_go_back_to_their_heap() {
    system_jemalloc();
    system_mimalloc();
    let truth = program("true", "coreutils");
    for inner in ["glibc", "jemalloc", "mimalloc"] {
        let mut env = inner_env(inner);
        env.extend([
            ("SPLITCOUNT_PRELOAD_TAGS", "off"),
            ("SPLITCOUNT_PRELOAD_REPORT", "1"),
        ]);
        let out = preloaded(&truth, &env).output().unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{inner}: {}\n{stderr}", out.status);
        let r = report(&stderr, "/preload");
        let (made, returned) = (number(&r, "setup_blocks"), number(&r, "setup_returned"));
        println!("{inner}: {returned} of the set-up's {made} blocks returned");
        assert!(returned >= 1 && returned <= made, "{inner}: {stderr}");
        assert_eq!(r["events.underflow"], "0", "{inner}: {stderr}");
    }
    // With tags every block says whose it is: no such count.
    let out = preloaded(&truth, &[("SPLITCOUNT_PRELOAD_REPORT", "1")])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(
        !report(&stderr, "/preload").contains_key("setup_blocks"),
        "{stderr}"
    );
}

/// The set-up's code does not stay resident: once the accounting is
/// ready the library lets go of its code pages and cuts its code into
/// one-page mappings (`code_pages.rs`), so that what comes back is the
/// pages the program runs, not the 64 KiB around each of them
/// (fault-around). At the start of `main` — after the program's first
/// allocations — less than a third of the code is resident (148 of 732
/// KiB at the time of writing; 472 with one mapping, 732 without the
/// release). A kernel without huge page support refuses the flag that
/// cuts the mapping: there the bound is three quarters, which the
/// release alone meets (the library is aligned to 64 KiB, `build.rs`, so
/// fault-around's windows fall in the same places in every run).
#[test]
fn the_set_ups_code_does_not_stay_resident() {
    let exe = plain_c_program("code_pages_test");
    let splits = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    for tags in ["on", "off"] {
        let out = preloaded(&exe, &[("SPLITCOUNT_PRELOAD_TAGS", tags)])
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}\n{stdout}", out.status);
        let value = |key: &str| -> u64 {
            stdout
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {stdout}"))
        };
        let (size, rss, mappings) = (value("size"), value("rss"), value("mappings"));
        println!(
            "tags {tags}: the library's code: {rss} of {size} KiB resident, {mappings} mappings"
        );
        assert!(size > 100, "{stdout}");
        if splits {
            // A mapping for every page or two (4 KiB pages).
            assert!(mappings * 2 >= size / 4, "cut into pages: {stdout}");
            assert!(rss * 3 < size, "{stdout}");
        } else {
            assert!(rss * 4 < size * 3, "{stdout}");
        }
    }
}

/// Under a tracer (a debugger that may have set breakpoints in the
/// library's code as it loaded), the code is neither dropped nor cut: a
/// dropped page comes back from the file without the debugger's
/// breakpoint, which then never fires (gdb with a breakpoint on the
/// preload's `malloc` saw the set-up's calls and none of `main`'s).
#[test]
fn a_traced_program_keeps_the_librarys_code_as_loaded() {
    use std::os::unix::process::CommandExt;
    let exe = plain_c_program("code_pages_test");
    let mut cmd = preloaded(&exe, &[]);
    cmd.stdout(std::process::Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Reaped by the `waitpid` loop below: a tracer waits for its tracee
    // itself (`Child::wait` would not let it resume the stops).
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    // The tracer's part: let every stop go on (the exec's SIGTRAP
    // swallowed, any other signal passed on), until the program ends.
    let status = loop {
        let mut st = 0;
        // SAFETY: our own child; `st` is written by the call.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            break st;
        }
        let sig = libc::WSTOPSIG(st);
        let pass = if sig == libc::SIGTRAP { 0 } else { sig };
        // SAFETY: a stopped tracee of this process.
        unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, pass) };
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{stdout}"
    );
    let mappings: u64 = stdout
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("mappings="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no mappings in {stdout}"));
    assert_eq!(mappings, 1, "the code segment as loaded: {stdout}");
}

/// Programs run without tags as with them: python3 and sqlite3 finish,
/// and the exit report says `tags=off` with the usage of what they still
/// hold.
#[test]
fn programs_run_without_tags() {
    let python = program("python3", "python3");
    let out = preloaded(
        &python,
        &[
            ("SPLITCOUNT_PRELOAD_TAGS", "off"),
            ("SPLITCOUNT_PRELOAD_REPORT", "1"),
        ],
    )
    .args([
        "-c",
        "import json; x=[str(i)*10 for i in range(100000)]; print(len(json.dumps(x)))",
    ])
    .output()
    .unwrap();
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "{}
{stderr}",
        out.status
    );
    assert_eq!(text(&out.stdout).trim(), "5288900");
    let r = report(&stderr, "/preload");
    assert_eq!(r["tags"], "off", "{stderr}");
    assert!(number(&r, "peak") > 5_000_000, "{stderr}");
    let out = sqlite(&[("SPLITCOUNT_PRELOAD_TAGS", "off")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// An inner allocator asked for by name and not there stops the program
/// with the package to install (exit status 78), never runs it on another
/// heap; so does one the name of which is not known.
#[test]
fn an_inner_allocator_that_cannot_be_loaded_stops_the_program() {
    // Without the tunable, glibc cannot give jemalloc's static TLS to a
    // library loaded after start-up: the message says what to do.
    let out = preloaded(
        &program("true", "coreutils"),
        &[("SPLITCOUNT_PRELOAD_INNER", "jemalloc")],
    )
    .output()
    .unwrap();
    let stderr = text(&out.stderr);
    if out.status.success() {
        // A glibc with room to spare: nothing to check.
        return;
    }
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("libjemalloc.so.2"), "{stderr}");
    assert!(stderr.contains("optional_static_tls"), "{stderr}");
    let out = preloaded(
        &program("true", "coreutils"),
        &[("SPLITCOUNT_PRELOAD_INNER", "tcmalloc")],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
}

/// With `libjemalloc.so.2` preloaded after this library, jemalloc is
/// loaded at start-up (its static TLS with it), and the preload finds that
/// copy by name: one heap, the program's `malloc` still the preload's.
#[test]
fn jemalloc_is_loaded_by_name_when_preloaded_too() {
    let both = format!("{} {}", preload_so().display(), system_jemalloc().display());
    let out = Command::new(program("sqlite3", "sqlite3"))
        .env("LD_PRELOAD", &both)
        .env("SPLITCOUNT_PRELOAD_INNER", "jemalloc")
        .env("SPLITCOUNT_PRELOAD_REPORT", "1")
        .args([
            ":memory:",
            "SELECT count(*) FROM (SELECT randomblob(1000) FROM generate_series(1, 20000));",
        ])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout).trim(), "20000");
    let lines = report_lines(&stderr);
    assert!(lines.iter().any(|l| l.contains_key("jemalloc")), "{stderr}");
    assert!(number(&report(&stderr, "/preload"), "peak") > 0, "{stderr}");
}

/// An allocator preloaded after this library without being its inner
/// allocator: mimalloc exports `__libc_malloc` and its kin, and the
/// dynamic linker bound the preload's calls of "glibc's heap" to those —
/// every `malloc` crashed (or, with the blocks sized by glibc's function,
/// failed). glibc's entry points are looked up in libc.so.6 itself: the
/// program runs on glibc's heap, counted, under its limit.
#[test]
fn an_allocator_preloaded_after_the_preload_does_not_take_glibcs_place() {
    let both = format!("{} {}", preload_so().display(), system_mimalloc().display());
    let sqlite = |max: &str| {
        Command::new(program("sqlite3", "sqlite3"))
            .env("LD_PRELOAD", &both)
            .env("SPLITCOUNT_PRELOAD_REPORT", "1")
            .env("SPLITCOUNT_PRELOAD_MAX", max)
            .args([
                ":memory:",
                "SELECT count(*) FROM (SELECT randomblob(1000) FROM generate_series(1, 20000));",
            ])
            .output()
            .unwrap()
    };
    let out = sqlite("max");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert_eq!(text(&out.stdout).trim(), "20000");
    let preload = report(&stderr, "/preload");
    assert!(number(&preload, "peak") > 0, "{stderr}");
    assert!(number(&glibc_report(&stderr), "in_use") > 0, "{stderr}");
    // A limit holds: allocations past it are refused.
    let out = sqlite("16K");
    let stderr = text(&out.stderr);
    let preload = report(&stderr, "/preload");
    assert!(number(&preload, "peak") <= 16 << 10, "{stderr}");
    assert!(number(&preload, "events.refused") > 0, "{stderr}");
}

/// An allocator ahead of the preload in `LD_PRELOAD` takes every `malloc`
/// of the process: nothing would be counted. With a limit asked for, the
/// program is stopped at load (status 78) rather than run unlimited;
/// without one it runs, and the preload says why its figures are empty. A
/// wrapper that forwards to the next `malloc` is not stopped: the check
/// calls the process's `malloc` and sees whether the call arrives (the
/// first version compared symbols, and stopped it).
#[test]
fn an_allocator_ahead_of_the_preload_stops_a_limited_program() {
    let reversed = format!("{} {}", system_jemalloc().display(), preload_so().display());
    let run = |max: Option<&str>| {
        let mut c = Command::new(program("true", "coreutils"));
        c.env("LD_PRELOAD", &reversed);
        if let Some(max) = max {
            c.env("SPLITCOUNT_PRELOAD_MAX", max);
        }
        c.output().unwrap()
    };
    let out = run(Some("1M"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("libjemalloc.so.2's, found before the preload's"),
        "{stderr}"
    );
    assert!(
        stderr.contains("SPLITCOUNT_PRELOAD_MAX would not hold"),
        "{stderr}"
    );
    let out = run(None);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("nothing would be counted"), "{stderr}");
    // A wrapper that forwards to the next malloc is ahead of the preload
    // too, but its calls reach the preload: the program runs, counted.
    let shim = deps_dir().join("splitcount_preload_forwarding_shim.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/forwarding_shim.c");
    let built = Command::new("cc")
        .args([
            "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(&shim)
        .arg(src)
        .arg("-ldl")
        .status()
        .expect("cc runs (install gcc)");
    assert!(
        built.success(),
        "tests/c/forwarding_shim.c does not compile"
    );
    let out = Command::new(program("sqlite3", "sqlite3"))
        .env(
            "LD_PRELOAD",
            format!("{} {}", shim.display(), preload_so().display()),
        )
        .env("SPLITCOUNT_PRELOAD_MAX", "64M")
        .env("SPLITCOUNT_PRELOAD_REPORT", "1")
        .args([":memory:", "SELECT count(*) FROM generate_series(1, 1000);"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(!stderr.contains("nothing would be counted"), "{stderr}");
    assert!(number(&report(&stderr, "/preload"), "peak") > 0, "{stderr}");
}

/// Runs `tests/c/stale_tag_test.c` in `mode` (`free` or `realloc`: how
/// the preload gives back the block whose header the foreign block is laid
/// over; `trailer`: an over-aligned block's trailer; the program draws the
/// layouts).
///
/// The overlap is arranged, not hoped for, and checked: glibc carves the
/// blocks from its top chunk in order and merges what is freed, so the
/// foreign block's user pointer is the old block's and the word before it
/// is the old block's tag word. The tunables keep glibc's caches out of
/// it: without tcache and fastbins every freed chunk merges at once, and
/// no cached small chunk is consolidated into the top chunk between the
/// steps; the mmap threshold keeps the blocks in the heap. If glibc does
/// not produce the layout, the program exits 2 and the test fails — a test
/// that checked nothing must not pass.
fn stale_tag_test(mode: &str) {
    // Both modes' tests run at once: one compiles, the other waits for it
    // (two `cc` writing one executable could run a half-written one).
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| c_program("stale_tag_test"));
    let tunables = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0:\
                    glibc.malloc.mmap_threshold=16777216";
    let out = preloaded(exe, &[("GLIBC_TUNABLES", tunables)])
        .arg(mode)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.code() != Some(2),
        "the layout the test needs was not produced (GLIBC_TUNABLES={tunables}):\n{stderr}"
    );
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.trim_end().ends_with("checks passed"), "{stdout}");
    println!("{stdout}");
}

/// A freed block's tag never makes a foreign block look like ours: when
/// glibc lays a block it made without us (`__libc_malloc`) over the header
/// of a block the preload freed, at the same user pointer, the preload's
/// `malloc_usable_size`, `realloc` and `free` treat it as glibc's and the
/// group the freed block was charged to stays exact (`Block::free` clears
/// the tag; without that, this test fails: the stale tag is taken for
/// ours, and `malloc_usable_size` reads a size word that is not there).
#[test]
fn a_foreign_block_laid_over_a_freed_blocks_header_is_not_taken_for_ours() {
    stale_tag_test("free");
}

/// The same for a block that `realloc` moved: glibc frees the old chunk
/// itself, merged with a free chunk before it, and a foreign block is laid
/// at the old user pointer (`Block::realloc` clears the tag before glibc
/// may move the block; without that, this test fails as the one above).
#[test]
fn a_foreign_block_laid_over_a_moved_blocks_old_header_is_not_taken_for_ours() {
    stale_tag_test("realloc");
}

/// The same for an over-aligned block's trailer: glibc's own
/// `__libc_memalign` of the same size gets the freed block's chunk back,
/// and the preload does not take it for ours (`Block::free` clears the
/// trailer's tag; without that, this test fails: `malloc_usable_size`
/// says 16 bytes less than glibc, and `free` uncharges a block never
/// charged).
#[test]
fn a_foreign_block_laid_over_a_freed_blocks_trailer_is_not_taken_for_ours() {
    stale_tag_test("trailer");
}

/// Creates a table of 200,000 rows of 64 hex characters in an in-memory
/// database, indexes it, sorts it; `.stats on` makes the shell print its
/// own memory statistics after each statement.
const WORKLOAD: &str = "\
.stats on
CREATE TABLE t(a INTEGER, b TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
  INSERT INTO t SELECT x, hex(randomblob(32)) FROM c;
CREATE INDEX t_b ON t(b);
SELECT count(*), length(max(b)) FROM (SELECT b FROM t ORDER BY b);
";

fn sqlite(env: &[(&str, &str)]) -> Output {
    use std::io::Write;
    let mut child = preloaded(&program("sqlite3", "sqlite3"), env)
        .arg(":memory:")
        .env("SPLITCOUNT_PRELOAD_REPORT", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sqlite3 starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(WORKLOAD.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The largest `max` of the shell's `.stats` line `label: cur (max M)`.
fn sqlite_max(stdout: &str, label: &str) -> u64 {
    stdout
        .lines()
        .filter(|l| l.starts_with(label))
        .filter_map(|l| {
            l.split("(max ")
                .nth(1)?
                .split(')')
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no {label:?} in sqlite's output:\n{stdout}"))
}

#[test]
fn sqlite_runs_unmodified_and_its_heap_is_tracked() {
    let out = sqlite(&[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("200000|64"), "{stdout}");
    let ours = report(&stderr, "/preload");
    let peak = number(&ours, "peak");
    // What sqlite says it held at most (sqlite3_memory_used's high-water
    // mark: its requests rounded to 8) and in how many blocks.
    let held = sqlite_max(&stdout, "Memory Used:");
    let blocks = sqlite_max(&stdout, "Number of Outstanding Allocations:");
    // Tracked: every block's usable size. A sqlite block of n bytes is
    // malloc(n + 8) (its size prefix), whose usable size adds at most 23
    // bytes of glibc's rounding: ≤ 32 bytes a block. Beside sqlite's, the
    // shell's own blocks (stdio, its line buffer) and the accounting's
    // slack: a thread's reserve (32 KiB) and the per-CPU byte stocks (7 ×
    // 64 KiB per CPU).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let slack = (32 << 10) + cpus * 7 * (64 << 10);
    let shell = 256 << 10;
    println!(
        "sqlite3: tracked peak {peak} B; sqlite's own high-water mark {held} B in at most \
         {blocks} blocks; tracked − sqlite = {} B (bound {} B)",
        peak as i64 - held as i64,
        blocks * 32 + slack + shell
    );
    assert!(peak >= held, "tracked {peak} < sqlite's {held}");
    assert!(
        peak <= held + blocks * 32 + slack + shell,
        "tracked {peak} is more than sqlite's {held} + {blocks} × 32 + {slack} + {shell}"
    );
    // At exit, after the stocks are drained, what is still charged is what
    // glibc still holds for the program (its chunks are larger: headers).
    let glibc = number(&glibc_report(&stderr), "in_use");
    let usage = number(&ours, "usage");
    println!("sqlite3 at exit: tracked {usage} B, glibc in use {glibc} B (with the library's own)");
    assert!(usage <= glibc);
    assert_eq!(number(&ours, "events.underflow"), 0);
}

#[test]
fn sqlite_is_told_out_of_memory_at_the_limit_and_exits_cleanly() {
    let out = sqlite(&[("SPLITCOUNT_PRELOAD_MAX", "8M")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(exited_normally(&out), "killed by a signal: {}", out.status);
    assert!(!out.status.success());
    assert!(stderr.contains("out of memory"), "{stdout}\n{stderr}");
    let ours = report(&stderr, "/preload");
    assert_eq!(ours["max"], (8u64 << 20).to_string());
    assert_eq!(ours["enforcement"], "refuse");
    assert!(number(&ours, "events.max") >= 1);
    assert!(number(&ours, "events.refused") >= 1, "sqlite was refused");
    assert!(
        number(&ours, "peak") <= 8 << 20,
        "a refusing limit is never passed"
    );
}

#[test]
fn a_cooperative_limit_lets_sqlite_finish_and_counts_the_over_charges() {
    let out = sqlite(&[
        ("SPLITCOUNT_PRELOAD_MAX", "8M"),
        ("SPLITCOUNT_PRELOAD_ENFORCE", "cooperative"),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    assert!(stdout.contains("200000|64"));
    let ours = report(&stderr, "/preload");
    assert_eq!(ours["enforcement"], "cooperative");
    assert!(number(&ours, "events.max") >= 1);
    assert_eq!(number(&ours, "events.breaches"), 1, "one crossing");
    assert_eq!(number(&ours, "events.refused"), 0, "nothing refused");
    assert_eq!(number(&ours, "events.oom"), 0, "an over-charge is no OOM");
    assert!(number(&ours, "peak") > 8 << 20);
}

#[test]
fn python_gets_a_memory_error_at_the_limit() {
    let script = "\
try:
    x = [bytes(1000) for _ in range(10**6)]
    print('not told')
except MemoryError:
    x = None
    print('told')
";
    let out = preloaded(
        &program("python3", "python3"),
        &[
            ("SPLITCOUNT_PRELOAD_MAX", "100M"),
            ("SPLITCOUNT_PRELOAD_REPORT", "1"),
        ],
    )
    .args(["-c", script])
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert_eq!(stdout.trim(), "told", "{stderr}");
    let ours = report(&stderr, "/preload");
    assert!(number(&ours, "events.max") >= 1);
    assert!(number(&ours, "peak") <= 100 << 20);
}

/// A value the preload cannot read stops the program at load, before
/// `main`, with exit status 78 (`EX_CONFIG`) and a message naming the
/// variable and the value: a mistyped limit never runs a program
/// unlimited. (Before, each was named on stderr and ignored: `/bin/true`
/// ran, unlimited, and exited 0.)
#[test]
fn a_bad_configuration_stops_the_program_at_load() {
    for (name, value) in [
        ("SPLITCOUNT_PRELOAD_MAX", "1.5G"),
        ("SPLITCOUNT_PRELOAD_MAX", "10MX"),
        ("SPLITCOUNT_PRELOAD_MAX", "lots"),
        ("SPLITCOUNT_PRELOAD_MAX", ""),
        ("SPLITCOUNT_PRELOAD_MAX", "512 M"),
        ("SPLITCOUNT_PRELOAD_ENFORCE", "sometimes"),
        ("SPLITCOUNT_PRELOAD_REPORT", "yes"),
        ("SPLITCOUNT_PRELOAD_TAGS", "no"),
        ("SPLITCOUNT_PRELOAD_TAGS", " off"),
        ("SPLITCOUNT_PRELOAD_CHARGE", "requested"),
    ] {
        let out = preloaded(&program("true", "coreutils"), &[(name, value)])
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{name}={value:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{name}={value:?}")),
            "{name}={value:?}: {stderr}"
        );
        assert!(stderr.contains("not running true (pid "), "{stderr}");
        assert!(stderr.contains("exit status 78"), "{stderr}");
    }
    let out = preloaded(
        &program("true", "coreutils"),
        &[("SPLITCOUNT_PRELOAD_MAX", "1.5G")],
    )
    .output()
    .unwrap();
    println!("{}", text(&out.stderr));
}

/// The spellings of a limit an operator may write all work, each unit a
/// power of 1024 (`KB`, `MB`, `GB` too), case-insensitive; `max` and
/// `unlimited` mean none.
#[test]
fn limits_take_the_usual_units() {
    for (value, max) in [
        ("512m", (512u64 << 20).to_string()),
        ("512MiB", (512u64 << 20).to_string()),
        ("10MB", (10u64 << 20).to_string()),
        ("2gb", (2u64 << 30).to_string()),
        ("64K", (64u64 << 10).to_string()),
        ("1048576", (1u64 << 20).to_string()),
        ("max", "none".to_owned()),
        ("unlimited", "none".to_owned()),
    ] {
        let out = preloaded(
            &program("true", "coreutils"),
            &[
                ("SPLITCOUNT_PRELOAD_MAX", value),
                ("SPLITCOUNT_PRELOAD_REPORT", "1"),
            ],
        )
        .output()
        .unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{value}: {stderr}");
        assert_eq!(report(&stderr, "/preload")["max"], max, "{value}");
    }
}

/// Every report line names the process (its id, its program's name), so
/// that the reports of a shell script's processes can be told apart.
#[test]
fn report_lines_name_the_process() {
    let child = preloaded(
        &program("true", "coreutils"),
        &[("SPLITCOUNT_PRELOAD_REPORT", "1")],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id().to_string();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    let lines = report_lines(&stderr);
    assert_eq!(lines.len(), 3, "/preload, /, glibc:\n{stderr}");
    for l in &lines {
        assert_eq!(
            (l["pid"].as_str(), l["program"].as_str()),
            (pid.as_str(), "true")
        );
    }
    println!("{stderr}");
}

/// `SPLITCOUNT_PRELOAD_REPORT=<path>` writes each process's report to
/// `<path>.<pid>`, and nothing to stderr: a shell and the program it
/// forks and runs report to a file each. (bash: it leaves with `exit`, so
/// each file holds one exit report.)
#[test]
fn a_report_path_gets_a_file_per_process() {
    let dir = deps_dir().join(format!("report-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("sc");
    let out = preloaded(
        &program("bash", "bash"),
        &[("SPLITCOUNT_PRELOAD_REPORT", base.to_str().unwrap())],
    )
    .args(["-c", "/bin/true & wait; echo done"])
    .output()
    .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout).trim(), "done");
    assert!(!stderr.contains("splitcount-preload"), "{stderr}");
    let mut programs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let pid = name.strip_prefix("sc.").expect("sc.<pid>");
        let report = std::fs::read_to_string(&path).unwrap();
        let lines = report_lines(&report);
        assert_eq!(lines.len(), 3, "{name}:\n{report}");
        assert!(lines.iter().all(|l| l["pid"] == pid), "{name}:\n{report}");
        programs.push(lines[0]["program"].clone());
    }
    programs.sort();
    assert_eq!(programs, ["bash", "true"], "one report per process");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `tests/c/report_moments_test.c` in `mode` under the preload with
/// the report on stderr (and `env`); its exit status and report lines.
fn report_moments(mode: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| plain_c_program("report_moments_test"));
    let mut c = preloaded(exe, &[("SPLITCOUNT_PRELOAD_REPORT", "1")]);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.arg(mode).output().unwrap();
    (out.status, text(&out.stderr) + &text(&out.stdout))
}

/// The bytes a `report_moments_test` holds: 1,024 blocks of 1,000 bytes,
/// each charged its usable size, at least the 1,000 asked for.
const MOMENTS_HELD: u64 = 1024 * 1000;

/// A report line's usage is at least what the program holds, and runs
/// ahead of it by no more than the slack the line states (stocks and one
/// thread's reserve; the program has one thread).
fn holds_within_the_stated_slack(line: &HashMap<String, String>, held: u64) {
    let (usage, slack) = (
        number(line, "usage"),
        number(line, "slack.stocks") + number(line, "slack.per_thread"),
    );
    assert!(usage >= held, "{line:?}: usage below the {held} bytes held");
    // The program's own blocks before `hold` (stdio's buffer, at most a
    // few KiB) come on top.
    assert!(
        usage <= held + slack + (64 << 10),
        "{line:?}: usage beyond held + the stated slack"
    );
}

/// `SPLITCOUNT_PRELOAD_SIGNAL=USR2`: the signal writes a live snapshot
/// (`at=live`, the stocks not drained, the slack stated beside the usage)
/// and the program goes on; its exit report follows.
#[test]
fn a_signal_writes_a_live_snapshot_and_the_program_goes_on() {
    let (status, out) = report_moments("snapshot", &[("SPLITCOUNT_PRELOAD_SIGNAL", "USR2")]);
    assert!(status.success(), "{status}\n{out}");
    assert!(out.contains("after snapshot"), "{out}");
    let lines = report_lines(&out);
    let at: Vec<&str> = lines.iter().map(|l| l["at"].as_str()).collect();
    assert_eq!(at, ["live", "live", "exit", "exit", "exit"], "{out}");
    holds_within_the_stated_slack(&lines[0], MOMENTS_HELD);
    // Without the variable, SIGUSR2 keeps its default action.
    let (status, out) = report_moments("snapshot", &[]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGUSR2), "{out}");
}

/// A main thread that ends with `pthread_exit` returns its reserve: glibc
/// runs no thread-local destructor for it there (the pthread key's
/// destructor does it). It stayed charged before: 16,680 bytes at exit for
/// a program holding 296.
#[test]
fn a_main_thread_that_ends_with_pthread_exit_returns_its_reserve() {
    let exe = plain_c_program("pthread_exit_test");
    let out = preloaded(&exe, &[("SPLITCOUNT_PRELOAD_REPORT", "1")])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", out.status);
    let line = report(&err, "/preload");
    assert_eq!(line["at"], "exit", "{err}");
    // The program holds no block of its own at exit; glibc's and the
    // process's few come to well under one reserve (16 KiB).
    assert!(number(&line, "usage") < 4096, "{err}");
}

/// `_exit` reports (it runs no `atexit` handler: before the preload
/// interposed it, such a program reported nothing), and the status is the
/// program's.
#[test]
fn a_program_that_leaves_with_underscore_exit_reports() {
    let (status, out) = report_moments("_exit", &[]);
    assert_eq!(status.code(), Some(5), "{out}");
    let lines = report_lines(&out);
    assert_eq!(lines.len(), 2, "/preload and /:\n{out}");
    assert!(lines.iter().all(|l| l["at"] == "_exit"), "{out}");
    holds_within_the_stated_slack(&lines[0], MOMENTS_HELD);
}

/// A fatal signal writes the report before the signal's own action, which
/// still ends the program (killed by the signal, as without the preload).
#[test]
fn a_fatal_signal_reports_and_still_ends_the_program() {
    use std::os::unix::process::ExitStatusExt;
    for (mode, sig, name) in [
        ("segv", libc::SIGSEGV, "SIGSEGV"),
        // The main thread's stack overflowed: the handler runs on the
        // alternate stack the preload gave that thread.
        ("overflow", libc::SIGSEGV, "SIGSEGV"),
        ("abort", libc::SIGABRT, "SIGABRT"),
    ] {
        let (status, out) = report_moments(mode, &[]);
        assert_eq!(status.signal(), Some(sig), "{mode}: {status}\n{out}");
        let lines = report_lines(&out);
        assert_eq!(lines.len(), 2, "{mode}: /preload and /:\n{out}");
        assert!(lines.iter().all(|l| l["at"] == name), "{mode}: {out}");
        holds_within_the_stated_slack(&lines[0], MOMENTS_HELD);
    }
}

/// A `fork` child that does not `exec` reports as itself, and says whose
/// copy its figures started as (`forked_from=`): the parent's report has
/// no such key.
#[test]
fn a_fork_child_says_it_was_forked() {
    let (status, out) = report_moments("fork", &[]);
    assert!(status.success(), "{status}\n{out}");
    let lines = report_lines(&out);
    assert_eq!(lines.len(), 6, "child and parent, 3 lines each:\n{out}");
    let (child, parent) = lines.split_at(3);
    let parent_pid = &parent[0]["pid"];
    assert!(
        child.iter().all(|l| &l["forked_from"] == parent_pid),
        "{out}"
    );
    assert!(child.iter().all(|l| &l["pid"] != parent_pid), "{out}");
    assert!(
        parent.iter().all(|l| !l.contains_key("forked_from")),
        "{out}"
    );
    // The child held the parent's blocks (inherited) and its own.
    holds_within_the_stated_slack(&child[0], 2 * MOMENTS_HELD);
}

/// A grandchild's reports name its own parent (the child), not the
/// process that loaded the preload.
#[test]
fn a_fork_childs_child_names_its_own_parent() {
    let (status, out) = report_moments("grandchild", &[]);
    assert!(status.success(), "{status}\n{out}");
    let lines = report_lines(&out);
    // Each process reports when it exits: the grandchild first.
    assert_eq!(lines.len(), 9, "three processes, 3 lines each:\n{out}");
    let (grandchild, child, parent) = (&lines[0], &lines[3], &lines[6]);
    assert_eq!(grandchild["forked_from"], child["pid"], "{out}");
    assert_eq!(child["forked_from"], parent["pid"], "{out}");
    assert!(!parent.contains_key("forked_from"), "{out}");
}

/// A daemon (a `fork` child that starts a session and points 0, 1 and 2
/// at `/dev/null`) keeps no copy of its caller's stderr: a reader of that
/// pipe gets its end when the program returns, not when the daemon ends.
#[test]
fn a_daemon_does_not_keep_its_callers_stderr_open() {
    use std::io::{BufRead, BufReader};
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| plain_c_program("report_moments_test"));
    let mut c = preloaded(exe, &[("SPLITCOUNT_PRELOAD_REPORT", "1")]);
    let mut program = c
        .arg("daemon")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(program.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(program.wait().unwrap().success());
    let daemon: u32 = line
        .trim()
        .strip_prefix("daemon ")
        .unwrap()
        .parse()
        .unwrap();
    // The copy is let go in the child before it prints: by now the daemon
    // holds no descriptor at or above the copy's minimum (1000).
    let high: Vec<String> = std::fs::read_dir(format!("/proc/{daemon}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|fd| fd.parse::<u32>().is_ok_and(|fd| fd >= 1000))
        .collect();
    assert!(high.is_empty(), "the daemon keeps descriptors {high:?}");
    // SAFETY: a signal to the daemon this test started.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
}

/// The figures line of `tests/c/strict_limit_test.c`, as numbers.
fn strict_limit_test(max: &str, count: u64) -> HashMap<String, u64> {
    strict_limit_test_tags(max, count, "on")
}

/// [`strict_limit_test`] with `SPLITCOUNT_PRELOAD_TAGS` set to `tags`.
fn strict_limit_test_tags(max: &str, count: u64, tags: &str) -> HashMap<String, u64> {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| c_program("strict_limit_test"));
    let out = preloaded(
        exe,
        &[
            ("SPLITCOUNT_PRELOAD_MAX", max),
            ("SPLITCOUNT_PRELOAD_TAGS", tags),
        ],
    )
    .arg(count.to_string())
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "MAX={max}: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.trim_end().ends_with("checks passed"), "{stdout}");
    println!("MAX={max} TAGS={tags}: {}", stdout.trim_end());
    stdout
        .lines()
        .find(|l| l.contains(" handed="))
        .unwrap_or_else(|| panic!("no figures in:\n{stdout}"))
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().expect("a number")))
        .collect()
}

/// Strict limits: a program that ignores NULL and keeps asking for 1 KiB
/// blocks (100,000 of them) under `SPLITCOUNT_PRELOAD_MAX=1M` holds no
/// more than the limit. The program checks that every refusal is NULL
/// with `errno = ENOMEM`, that nothing is handed out after the first
/// refusal (malloc, calloc, realloc's growth, the aligned ones), that
/// /preload's usage is exactly the usable bytes handed out (no block
/// escaped the accounting), and that allocations succeed again once some
/// blocks are freed.
///
/// The slack of the accounting (a thread's reserve, up to 32 KiB; the
/// per-CPU byte stocks, 64 KiB batches) is charged *inside* the limit: it
/// can make a refusal come early, never let a block through late. A
/// refusal drains the stocks and the thread's reserve before it refuses,
/// so with one thread it comes only when the next block does not fit:
/// the bytes held are within one block of the limit, never above it.
/// (Before strict limits, the reporting grace let 99,902 of the 100,000
/// through: 99,902 KiB held under a 1 MiB limit.) The same with tags off.
#[test]
fn a_program_that_ignores_null_holds_no_more_than_the_limit() {
    for tags in ["on", "off"] {
        ignoring_null_holds_no_more_than_the_limit(tags);
    }
}

fn ignoring_null_holds_no_more_than_the_limit(tags: &str) {
    let f = strict_limit_test_tags("1M", 100_000, tags);
    let max = 1 << 20;
    let block_usable = f["held"] / f["handed"].max(1);
    println!(
        "under MAX=1M: {} of {} handed out, {} bytes usable held (+{} before), the first \
         refused at #{}",
        f["handed"], f["attempts"], f["held"], f["usage_before"], f["first_refusal"]
    );
    assert_eq!(f["max"], max);
    assert!(f["refused"] > 0, "nothing refused");
    assert_eq!(f["handed"] + f["refused"], f["attempts"]);
    assert_eq!(
        f["handed"], f["first_refusal"],
        "handed out after a refusal"
    );
    assert!(
        f["usage_after"] <= max,
        "usage {} above the limit",
        f["usage_after"]
    );
    assert!(
        f["usage_after"] + block_usable > max,
        "refused with room for another block: usage {} of {max}",
        f["usage_after"]
    );
    assert!(f["again"] > 0, "nothing handed out after blocks were freed");
}

/// A smaller limit never lets more through: the same program under
/// `MAX=1` (nothing at all), `4K`, `64K` and `1M` holds at most the limit,
/// and no more under a smaller one.
#[test]
fn a_smaller_limit_never_lets_more_through() {
    let mut last = 0;
    for (max, bytes) in [
        ("1", 1u64),
        ("4K", 4 << 10),
        ("64K", 64 << 10),
        ("1M", 1 << 20),
    ] {
        let f = strict_limit_test(max, 2_000);
        assert_eq!(f["max"], bytes);
        assert!(f["refused"] > 0, "MAX={max}: nothing refused");
        assert!(f["usage_after"] <= bytes, "MAX={max}: {f:?}");
        assert!(
            f["held"] >= last,
            "MAX={max} held less than a smaller limit"
        );
        last = f["held"];
    }
}

/// `aligned_alloc`, `memalign` and `posix_memalign` answer as the host's
/// glibc does, on a table of alignments (0, 1, not powers of two, huge)
/// and sizes (0, not a multiple of the alignment, huge): the same block or
/// NULL, the same errno, a block aligned as glibc aligns it. glibc up to
/// 2.37 (Debian 12 has 2.36) takes `aligned_alloc(0, 16)` and
/// `aligned_alloc(24, 48)` as `memalign`, which rounds the alignment up;
/// 2.38 answers `EINVAL` to both. (The preload said `EINVAL` on 2.36.)
#[test]
fn aligned_allocations_answer_as_the_hosts_glibc() {
    let (host, ours) = without_and_with_the_preload(&plain_c_program("aligned_alloc_test"));
    assert!(!host.contains("MISALIGNED"), "{host}");
    assert!(host.contains("aligned_alloc(24, 48): "), "{host}");
    for (h, o) in host.lines().zip(ours.lines()) {
        assert_eq!(o, h, "under the preload, against the host's glibc");
    }
    assert_eq!(host.lines().count(), ours.lines().count());
    println!("{ours}");
}

/// Over-aligned blocks cost about what they cost without the preload:
/// the tag and account go in a 16-byte trailer, not in a header of a whole
/// alignment unit in front. With the header, 20,000 blocks from
/// `posix_memalign(4096, 100)` took 160 MB of RSS against glibc's 80 MB,
/// and `(4096, 4096)` 240 MB against 80. Page-aligned blocks stay within
/// 5% (+256 KiB); small cache-line-aligned ones pay for the trailer where
/// it moves the chunk up (`(64, 48)`: 1.57× of glibc's 2.2 MB here), never
/// 1.75× or more.
#[test]
fn over_aligned_blocks_do_not_double_the_resident_memory() {
    let (host, ours) = without_and_with_the_preload(&plain_c_program("aligned_rss_test"));
    println!("{host}{ours}");
    let kib = |line: &str| -> f64 { line.rsplit_once("rss_kib=").unwrap().1.parse().unwrap() };
    assert_eq!(host.lines().count(), 4, "{host}");
    for (h, o) in host.lines().zip(ours.lines()) {
        assert_eq!(h.split(':').next(), o.split(':').next());
        let (h, o_kib) = (kib(h), kib(o));
        let bound = if o.starts_with("posix_memalign(4096,") {
            h * 1.05 + 256.0
        } else {
            h * 1.75
        };
        assert!(
            o_kib <= bound,
            "{o}: glibc alone {h} KiB, the bound {bound}"
        );
    }
}

/// glibc's thresholds are the program's: a 1 MiB block is mmapped and its
/// memory goes back at `free`, with and without the preload (which learns
/// how to read glibc's usable sizes from the program's own blocks, never
/// from a probe of its own that would move the dynamic thresholds).
#[test]
fn glibc_thresholds_are_left_as_the_program_would_have_them() {
    let (host, ours) = without_and_with_the_preload(&plain_c_program("thresholds_test"));
    assert_eq!(
        host,
        "1 MiB block mmapped: yes\nfreed 1 MiB back to the kernel: yes\n"
    );
    assert_eq!(ours, host, "under the preload");
}

/// `RTLD_DEEPBIND`: a library loaded with it binds `malloc` and `free` to
/// glibc's own. Its blocks are glibc's — the preload does not charge them,
/// and hands them back to glibc when the program frees them. A block the
/// program got from the preload and the library frees is not a chunk
/// start for glibc (the header is in front): glibc aborts. This test pins
/// that documented behaviour down: the first way works, the second ends
/// in SIGABRT from glibc, not in a crash inside the preload.
#[test]
fn rtld_deepbind_libraries_free_only_their_own_blocks() {
    use std::os::unix::process::ExitStatusExt;
    let plugin = deps_dir().join("splitcount_preload_deepbind_lib.so");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&plugin)
        .arg(dir.join("tests/c/deepbind_lib.c"))
        .status()
        .expect("cc runs");
    assert!(status.success());
    let exe = plain_c_program("deepbind_test");
    let run = |mode: &str| {
        preloaded(&exe, &[])
            .arg(&plugin)
            .arg(mode)
            .output()
            .unwrap()
    };
    let out = run("plugin-to-program");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ok\n");
    let out = run("program-to-plugin");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("free(): invalid pointer") || stderr.contains("double free or corruption"),
        "{stderr}"
    );
}

/// The system's jemalloc, wherever a multiarch or plain libdir has it.
fn system_jemalloc() -> PathBuf {
    system_library("libjemalloc.so.2", "libjemalloc2")
}

/// The system's mimalloc.
fn system_mimalloc() -> PathBuf {
    system_library("libmimalloc.so.2", "libmimalloc2.0")
}

/// A library of the system's, wherever a multiarch or plain libdir has it.
fn system_library(name: &str, package: &str) -> PathBuf {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is missing: apt-get install {package} (.ci/run installs it)");
}

/// A program that links another allocator runs under the preload: the
/// preload finds glibc's `malloc_usable_size` in libc.so.6 itself, never
/// through `RTLD_NEXT` (which found jemalloc's, and called it on glibc's
/// blocks: `/bin/true` and Debian's `redis-server` died with SIGSEGV at
/// start-up).
#[test]
fn programs_that_link_jemalloc_run_under_the_preload() {
    let both = format!("{} {}", preload_so().display(), system_jemalloc().display());
    let out = Command::new(program("true", "coreutils"))
        .env("LD_PRELOAD", &both)
        .output()
        .unwrap();
    assert!(out.status.success(), "{} {}", out.status, text(&out.stderr));

    // redis-server (linked with libjemalloc.so.2), under a limit: it
    // serves, stores, and shuts down cleanly.
    let server = program("redis-server", "redis-server");
    let cli = program("redis-cli", "redis-tools");
    let port = loopback_port(0).to_string();
    let mut redis = preloaded(&server, &[("SPLITCOUNT_PRELOAD_MAX", "256M")])
        .args([
            "--port",
            &port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ask = |args: &[&str]| {
        Command::new(&cli)
            .args(["-p", &port])
            .args(args)
            .output()
            .map(|o| text(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let mut up = false;
    for _ in 0..100 {
        if ask(&["ping"]) == "PONG" {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if !up {
        let _ = redis.kill();
        let out = redis.wait_with_output().unwrap();
        panic!("redis-server did not come up: {}", text(&out.stderr));
    }
    for i in 0..200 {
        let key = format!("key{i}");
        let value = "v".repeat(100 + i);
        assert_eq!(ask(&["set", &key, &value]), "OK");
    }
    assert_eq!(ask(&["dbsize"]), "200");
    assert_eq!(ask(&["get", "key7"]), "v".repeat(107));
    let _ = ask(&["shutdown", "nosave"]);
    let status = redis.wait().unwrap();
    assert!(status.success(), "redis-server exited with {status}");
}

/// Port `i` (0 to 9) of this test process's own ten on the loopback
/// interface: below Linux's ephemeral range (32768 and up by default), so
/// that no client connection of this or an earlier test — `redis-cli`,
/// `redis-benchmark`, each on an ephemeral port — holds it (a port drawn
/// from 21,000–41,005 once collided with one: "bind: Address already in
/// use").
fn loopback_port(i: u32) -> u32 {
    assert!(i < 10);
    10_000 + std::process::id() % 2_000 * 10 + i
}

/// Debian's `redis-server` under the preload on a loopback port, its log
/// in a file.
struct Redis {
    child: std::process::Child,
    port: String,
    cli: PathBuf,
    log: PathBuf,
}

impl Redis {
    /// Start it with `env` and wait until it answers (a panic, with its
    /// log, if it does not within 5 s).
    fn start(env: &[(&str, &str)], log: PathBuf, port: u32) -> Redis {
        let port = port.to_string();
        let child = preloaded(&program("redis-server", "redis-server"), env)
            .args(["--port", &port, "--save", "", "--appendonly", "no"])
            .args(["--bind", "127.0.0.1"])
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut redis = Redis {
            child,
            port,
            cli: program("redis-cli", "redis-tools"),
            log,
        };
        for _ in 0..100 {
            if redis.ask(&["ping"]) == "PONG" {
                return redis;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = redis.child.kill();
        panic!("redis-server did not come up:\n{}", redis.log());
    }

    fn ask(&self, args: &[&str]) -> String {
        Command::new(&self.cli)
            .args(["-p", &self.port])
            .args(args)
            .output()
            .map(|o| text(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    /// `used_memory` of `INFO memory`: redis's own sum of
    /// `malloc_usable_size` over the blocks it allocated.
    fn used_memory(&self) -> u64 {
        let info = self.ask(&["info", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap_or_else(|| panic!("no used_memory in {info}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// `redis-benchmark` of `requests` SETs of 200-byte values over
    /// `keys` keys; whether it finished.
    fn load(&self, requests: u32, keys: u32) -> bool {
        Command::new(program("redis-benchmark", "redis-tools"))
            .args(["-p", &self.port, "-q", "-t", "set", "-d", "200"])
            .args(["-n", &requests.to_string(), "-r", &keys.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `SHUTDOWN NOSAVE`: it must exit 0; the reports it wrote in `dir`,
    /// as text and as lines.
    fn shut_down(mut self, dir: &Path) -> (String, Vec<HashMap<String, String>>) {
        let _ = self.ask(&["shutdown", "nosave"]);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}\n{}", self.log());
        let report = report_files(dir);
        let lines = report_lines(&report);
        (report, lines)
    }
}

/// `value` is within `fraction` of `reference` (either side).
fn assert_within(value: u64, reference: u64, fraction: f64, what: &str) {
    let off = (value as f64 - reference as f64).abs() / reference as f64;
    assert!(
        off <= fraction,
        "{value} is {:.2}% from {reference} (at most {:.1}%): {what}",
        off * 100.0,
        fraction * 100.0
    );
}

/// The exit report's line whose `key` is `value`.
fn exit_line<'a>(
    lines: &'a [HashMap<String, String>],
    key: &str,
    value: &str,
) -> &'a HashMap<String, String> {
    lines
        .iter()
        .find(|l| l["at"] == "exit" && l.get(key).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no exit line with {key}={value:?} in {lines:?}"))
}

/// Lines of the report files `<base>.<pid>` in `dir`.
fn report_files(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("report.")
        {
            all += &std::fs::read_to_string(&path).unwrap();
        }
    }
    all
}

/// One redis run under the preload with `inner` inside, its reports in
/// `dir`: a live snapshot and the exit report against `used_memory`.
fn redis_agrees_with_its_own_count(inner: &str, tags: &str, dir: &Path, port: u32) {
    std::fs::create_dir_all(dir).unwrap();
    let base = dir.join("report");
    let redis = Redis::start(
        &[
            ("SPLITCOUNT_PRELOAD_SIGNAL", "USR2"),
            ("SPLITCOUNT_PRELOAD_REPORT", base.to_str().unwrap()),
            ("SPLITCOUNT_PRELOAD_MAX", "1G"),
            ("SPLITCOUNT_PRELOAD_INNER", inner),
            ("SPLITCOUNT_PRELOAD_TAGS", tags),
        ],
        dir.join("redis.log"),
        port,
    );
    assert!(redis.load(150_000, 80_000), "{inner}: {}", redis.log());
    let ours = redis.used_memory();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(redis.child.id() as i32, libc::SIGUSR2) };
    let mut live = None;
    for _ in 0..100 {
        let lines = report_lines(&report_files(dir));
        live = lines
            .into_iter()
            .find(|l| l["at"] == "live" && l["group"] == "/preload");
        if live.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let live = live.expect("a live snapshot after SIGUSR2");
    let slack = number(&live, "slack.stocks") + 8 * number(&live, "slack.per_thread");
    let usage = number(&live, "usage");
    println!("{inner}: redis used_memory {ours}, the preload's live usage {usage} (slack {slack})");
    assert!(usage as f64 >= ours as f64 * 0.98, "{inner}: {live:?}");
    assert!(
        usage as f64 <= ours as f64 * 1.02 + slack as f64,
        "{inner}: {live:?}"
    );
    let ours = redis.used_memory();
    let (report, lines) = redis.shut_down(dir);
    let exit = exit_line(&lines, "group", "/preload");
    let usage = number(exit, "usage");
    assert_eq!(exit["tags"], tags, "{exit:?}");
    println!("{inner}, tags {tags}: redis used_memory {ours}, the preload's usage at exit {usage}");
    assert_within(
        usage,
        ours,
        0.02,
        &format!("{inner}: {exit:?}, against used_memory"),
    );
    if inner != "glibc" {
        assert!(
            lines.iter().any(|l| l.contains_key(inner)),
            "the report names the inner allocator: {report}"
        );
    }
}

/// The same load with `SPLITCOUNT_PRELOAD_CHARGE=footprint`: at exit the
/// preload's usage is within 5% of glibc's own count of bytes in use (the
/// heap's figure, which also holds the preload's own memory).
fn redis_footprints_agree_with_glibc(dir: &Path, port: u32) {
    std::fs::create_dir_all(dir).unwrap();
    let base = dir.join("report");
    let redis = Redis::start(
        &[
            ("SPLITCOUNT_PRELOAD_REPORT", base.to_str().unwrap()),
            ("SPLITCOUNT_PRELOAD_CHARGE", "footprint"),
        ],
        dir.join("redis.log"),
        port,
    );
    assert!(redis.load(150_000, 80_000), "{}", redis.log());
    let (report, lines) = redis.shut_down(dir);
    let exit = exit_line(&lines, "group", "/preload");
    assert_eq!(exit["charged"], "footprint");
    let glibc = exit_line(&lines, "glibc", "");
    let (usage, heap) = (number(exit, "usage"), number(glibc, "in_use"));
    println!("footprint: the preload's usage at exit {usage}, glibc's in use {heap}");
    assert_within(
        usage,
        heap,
        0.05,
        &format!("against glibc's in use: {report}"),
    );
}

/// Debian's `redis-server` (jemalloc-linked) under the preload, loaded by
/// `redis-benchmark`, with glibc, jemalloc and mimalloc inside in turn
/// (and jemalloc without tags):
/// the preload's count agrees with redis's own
/// `used_memory` (the sum of `malloc_usable_size` over its blocks, which
/// the preload answers) within 2% — in a live snapshot (`SIGUSR2`, the
/// stocks' slack allowed for) and at exit (drained); what the preload
/// counts beyond redis is the memory redis does not count (libc's, the
/// event loop's). Under a limit below its working set, redis is told by
/// NULL and stops in its own out-of-memory handler ("OUT OF MEMORY").
///
/// What follows is redis's own doing: its panic report allocates (to log
/// `INFO`), is refused again, panics again, and so on until its stack
/// overflows (SIGSEGV, about 60,000 frames deep in `serverLog`, seen in
/// gdb): a strict limit gives every allocation after the first refusal
/// NULL too, by design.
#[test]
fn redis_under_the_preload_agrees_with_its_own_count_and_stops_at_the_limit() {
    use std::os::unix::process::ExitStatusExt;
    let dir = deps_dir().join(format!("redis-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = loopback_port(1);
    // Redis links jemalloc itself, so `jemalloc` needs no tunable here: the
    // preload finds the copy redis loaded.
    for (i, inner) in ["glibc", "jemalloc", "mimalloc"].into_iter().enumerate() {
        redis_agrees_with_its_own_count(inner, "on", &dir.join(inner), port + i as u32);
    }
    // Without tags, on redis's own jemalloc: the same agreement.
    redis_agrees_with_its_own_count("jemalloc", "off", &dir.join("untagged"), port + 5);
    redis_footprints_agree_with_glibc(&dir.join("footprint"), port + 4);

    // A limit below the working set.
    let mut redis = Redis::start(
        &[("SPLITCOUNT_PRELOAD_MAX", "4M")],
        dir.join("redis-oom.log"),
        port + 3,
    );
    assert!(!redis.load(100_000, 100_000), "4M held 100,000 keys");
    let status = redis.child.wait().unwrap();
    let log = redis.log();
    assert!(
        log.contains("OUT OF MEMORY"),
        "{status}: {}",
        &log[..log.len().min(4000)]
    );
    assert!(status.signal().is_some(), "{status}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// sqlite3 under a tiny limit stops at once with "out of memory", and a
/// smaller limit lets no more through: `MAX=1` holds nothing, `4K` at
/// most 4 KiB. (With the reporting grace, sqlite3 under `MAX=1` ran on
/// with usage 0, while `4K` failed at open.)
#[test]
fn sqlite_under_a_tiny_limit_stops_with_out_of_memory() {
    use std::io::Write;
    for (max, bytes) in [("1", 1u64), ("4K", 4 << 10)] {
        let mut child = preloaded(
            &program("sqlite3", "sqlite3"),
            &[
                ("SPLITCOUNT_PRELOAD_MAX", max),
                ("SPLITCOUNT_PRELOAD_REPORT", "1"),
            ],
        )
        .arg(":memory:")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let sql = "CREATE TABLE t(a); INSERT INTO t VALUES (1); SELECT 'ran on', a FROM t;\n";
        let _ = child.stdin.take().unwrap().write_all(sql.as_bytes());
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "MAX={max}: {stdout}\n{stderr}");
        assert!(stderr.contains("out of memory"), "MAX={max}: {stderr}");
        assert!(!stdout.contains("ran on"), "MAX={max}: {stdout}");
        let ours = report(&stderr, "/preload");
        assert!(number(&ours, "peak") <= bytes, "MAX={max}: {ours:?}");
        assert!(number(&ours, "events.refused") >= 1);
    }
}

/// Compiles `tests/c/<name>.cpp` (C++17) alone, linked with nothing of
/// ours.
fn plain_cxx_program(name: &str) -> PathBuf {
    let exe = deps_dir().join(format!("splitcount_preload_{name}"));
    compile_cxx(name, &exe, &[]);
    exe
}

/// Compiles `tests/c/<name>.cpp` (C++17, warnings as errors) into `out`,
/// with `extra` flags.
fn compile_cxx(name: &str, out: &Path, extra: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.cpp"));
    let status = Command::new("c++")
        .args(["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .expect("c++ runs (install g++)");
    assert!(status.success(), "tests/c/{name}.cpp does not compile");
}

/// C++'s `new` and `delete` are the preload's whatever else the process
/// loaded: with jemalloc or mimalloc preloaded too (both export the C++
/// operators, and came first in the lookup), `new` took the allocator's
/// own path — never charged, the limit never refused — and the first
/// `delete` handed the preload's `free` a block it had not made: glibc
/// aborted (`free(): invalid pointer`). With mimalloc preloaded, a block
/// libstdc++'s constructor made before the preload's came from mimalloc's
/// `__libc_malloc` and went to glibc's `free`: the same abort, before
/// `main`. Now, with each inner allocator, preloaded too or not, tags on
/// and off: `tests/c/cxx_new_test.cpp` (every form of `new` and `delete`,
/// then 16 MiB of strings) is charged all it holds, and under a 4 MiB
/// limit gets the new-handler, then `std::bad_alloc`, and the nothrow
/// forms' null.
#[test]
fn cxx_new_and_delete_are_charged_and_refused_with_every_inner_allocator() {
    let exe = plain_cxx_program("cxx_new_test");
    let preload = preload_so().display().to_string();
    let jemalloc = format!("{preload} {}", system_jemalloc().display());
    let mimalloc = format!("{preload} {}", system_mimalloc().display());
    for (inner, preloads, tags) in [
        ("glibc", &preload, "on"),
        ("glibc", &preload, "off"),
        ("glibc", &mimalloc, "on"),
        ("jemalloc", &jemalloc, "on"),
        ("jemalloc", &jemalloc, "off"),
        ("mimalloc", &preload, "on"),
        ("mimalloc", &mimalloc, "on"),
        ("mimalloc", &mimalloc, "off"),
    ] {
        let run = |max: &str| {
            let (stdout, stderr, case) = succeeds_with(&exe, preloads, inner, tags, max);
            assert!(stdout.contains("nothrow_null=1"), "{case}: {stdout}");
            (stdout, report(&stderr, "/preload"), case)
        };
        let (stdout, preload_group, case) = run("max");
        assert!(
            stdout.contains("strings=131072 caught=0"),
            "{case}: {stdout}"
        );
        // 131,072 strings of 100 bytes and their vector: all charged.
        let peak = number(&preload_group, "peak");
        assert!(peak > 13_000_000, "{case}: peak {peak}");
        let (stdout, preload_group, case) = run("4M");
        assert!(
            stdout.contains("caught=1 handler_calls=1"),
            "{case}: {stdout}"
        );
        assert!(number(&preload_group, "events.refused") > 0, "{case}");
        let peak = number(&preload_group, "peak");
        assert!(peak <= 4 << 20, "{case}: peak {peak}");
    }
}

/// A program that takes its stderr away before it ends
/// (`tests/c/stderr_closed_test.c`): closed in an `atexit` handler, as
/// coreutils' `close_stdout` does (`ls` and `cat` never reported: the
/// report's `write` failed with `EBADF`), or closed and reopened as the
/// program's own data file (which the report was written into). The report
/// reaches the stderr the program started with, once, and the file holds
/// only the program's data.
#[test]
fn the_report_reaches_the_stderr_the_program_started_with() {
    let exe = plain_c_program("stderr_closed_test");
    let data = deps_dir().join(format!("stderr_closed_test.{}.txt", std::process::id()));
    let data_arg = data.display().to_string();
    for args in [vec!["close"], vec!["reuse", data_arg.as_str()]] {
        let out = preloaded(&exe, &[("SPLITCOUNT_PRELOAD_REPORT", "1")])
            .args(&args)
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {}\n{stderr}", out.status);
        assert_eq!(text(&out.stdout), "running\n", "{args:?}");
        let lines = report_lines(&stderr);
        let preload_lines = lines
            .iter()
            .filter(|l| l.get("group").map(String::as_str) == Some("/preload"))
            .count();
        assert_eq!(preload_lines, 1, "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "data\n");
    let _ = std::fs::remove_file(&data);
}

/// A C program's plugin written in C++, `dlopen`ed with `RTLD_LOCAL`
/// (`tests/c/cxx_plugin.cpp`, loaded by `tests/c/cxx_plugin_host.c`): its
/// C++ runtime is out of the global scope, where the preload's `new` looked
/// for the runtime's new-handler and `__throw_bad_alloc` — the program
/// aborted ("no C++ runtime throws std::bad_alloc") instead of the plugin
/// catching `std::bad_alloc`. It finds the runtime by its name now: the
/// plugin's handler runs once, then its `catch`, at a limit and for a size
/// no allocator gives.
#[test]
fn a_cxx_plugin_loaded_out_of_the_global_scope_catches_bad_alloc() {
    let plugin = deps_dir().join("libsplitcount_preload_cxx_plugin.so");
    compile_cxx("cxx_plugin", &plugin, &["-shared", "-fPIC"]);
    let host = plain_c_program("cxx_plugin_host");
    for (max, size) in [("1M", "2000000"), ("max", "0x7fffffffffffffff")] {
        let out = preloaded(&host, &[("SPLITCOUNT_PRELOAD_MAX", max)])
            .arg(&plugin)
            .arg(size)
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "max {max}: {}\n{stdout}\n{stderr}",
            out.status
        );
        assert_eq!(
            stdout.trim(),
            "caught bad_alloc handler_calls=1",
            "max {max}: {stderr}"
        );
    }
    let out = preloaded(&host, &[("SPLITCOUNT_PRELOAD_MAX", "1M")])
        .arg(&plugin)
        .arg("1000")
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "allocated 1000");
}

/// A thread that first touches a `thread_local` with a destructor while
/// the process is at its limit (`tests/c/cxx_thread_local_test.cpp`):
/// glibc's registration of the destructor allocates, and a refusal there
/// ended the process ("Fatal glibc error: failed to register TLS
/// destructor") — without tags on jemalloc and mimalloc, every time. The
/// registration runs with accounting off: the program goes on, with every
/// inner allocator, tags on and off.
#[test]
fn a_thread_local_first_touched_at_the_limit_does_not_end_the_program() {
    let exe = plain_cxx_program("cxx_thread_local_test");
    let preload = preload_so().display().to_string();
    let jemalloc = format!("{preload} {}", system_jemalloc().display());
    for (inner, preloads) in [
        ("glibc", &preload),
        ("jemalloc", &jemalloc),
        ("mimalloc", &preload),
    ] {
        for tags in ["on", "off"] {
            let (stdout, _, case) = succeeds_with(&exe, preloads, inner, tags, "2M");
            assert!(stdout.contains("survived full=1"), "{case}: {stdout}");
        }
    }
}

/// Runs `exe` with `LD_PRELOAD=preloads`, the inner allocator, tags and
/// limit given, and a report: it must succeed. Its stdout, its stderr, and
/// the case's name for messages.
fn succeeds_with(
    exe: &Path,
    preloads: &str,
    inner: &str,
    tags: &str,
    max: &str,
) -> (String, String, String) {
    let out = Command::new(exe)
        .env("LD_PRELOAD", preloads)
        .env("SPLITCOUNT_PRELOAD_INNER", inner)
        .env("SPLITCOUNT_PRELOAD_TAGS", tags)
        .env("SPLITCOUNT_PRELOAD_MAX", max)
        .env("SPLITCOUNT_PRELOAD_REPORT", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let case = format!("{inner}, tags {tags}, LD_PRELOAD={preloads}, max {max}");
    assert!(
        out.status.success(),
        "{case}: {}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr, case)
}
