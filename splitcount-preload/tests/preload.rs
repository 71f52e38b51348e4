//! The preload library on real programs: C test programs
//! (`tests/c/heap_test.c`, `tests/c/stale_tag_test.c`), Debian's `sqlite3` shell running a generated
//! SQL workload, and `python3` — unmodified, with
//! `LD_PRELOAD=libsplitcount_preload.so`.
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

/// The `key=value` pairs of the report's line for `group`.
fn report(stderr: &str, group: &str) -> HashMap<String, String> {
    let prefix = format!("splitcount-preload: group={group} ");
    let line = stderr
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no report line for {group} in:\n{stderr}"));
    line["splitcount-preload: ".len()..]
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
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

#[test]
fn the_c_heap_test_passes_under_the_preload() {
    let out = preloaded(&c_program("heap_test"), &[]).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(stdout.trim_end().ends_with("checks passed"), "{stdout}");
    println!("{stdout}");
}

/// Runs `tests/c/stale_tag_test.c` in `mode` (`free` or `realloc`: how
/// the preload gives back the block whose header the foreign block is laid
/// over; the program draws both layouts).
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
    let glibc: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("splitcount-preload: glibc in_use="))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .expect("the report's glibc line");
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

#[test]
fn a_bad_environment_is_named_and_ignored() {
    let out = preloaded(
        &program("true", "coreutils"),
        &[
            ("SPLITCOUNT_PRELOAD_MAX", "lots"),
            ("SPLITCOUNT_PRELOAD_ENFORCE", "sometimes"),
        ],
    )
    .output()
    .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("SPLITCOUNT_PRELOAD_MAX=lots"), "{stderr}");
    assert!(
        stderr.contains("SPLITCOUNT_PRELOAD_ENFORCE=sometimes"),
        "{stderr}"
    );
}
