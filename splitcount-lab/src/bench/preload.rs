//! `bench preload`: what the `LD_PRELOAD` library costs a program's
//! `malloc` and `free`, over each inner allocator it can use, divided by
//! that allocator alone.
//!
//! Each case is the allocator suite's workload in a worker process on the
//! system allocator (`std::alloc::System`, i.e. whatever `malloc` the
//! process resolves), started with an environment that decides which
//! `malloc` that is:
//!
//! | case | environment | baseline |
//! |---|---|---|
//! | `{w}-glibc` | none | itself |
//! | `{w}-preload` | `LD_PRELOAD=libsplitcount_preload.so` | `{w}-glibc` |
//! | `{w}-preload-untagged` | the preload, `SPLITCOUNT_PRELOAD_TAGS=off` | `{w}-glibc` |
//! | `{w}-jemalloc` | `LD_PRELOAD=libjemalloc.so.2` | `{w}-glibc` |
//! | `{w}-preload-jemalloc` | both preloaded, `SPLITCOUNT_PRELOAD_INNER=jemalloc` | `{w}-jemalloc` |
//! | `{w}-mimalloc` | `LD_PRELOAD=libmimalloc.so.2` | `{w}-glibc` |
//! | `{w}-preload-mimalloc` | the preload, `SPLITCOUNT_PRELOAD_INNER=mimalloc` | `{w}-mimalloc` |
//!
//! `w` is `mixed` (free the oldest of 64 blocks, allocate 16 to 512
//! bytes) or `small` (17 to 24 bytes). And a server: `redis-preload`,
//! Debian's `redis-server` under the preload loaded by `redis-benchmark`,
//! ÷ `redis-glibc`, the same without it (see [`super::redis`]; at one
//! thread, when redis is installed). The workers live for the whole
//! suite, so the rounds interleave them slice by slice. Measured when the
//! preload is found beside the lab binary (`cargo build --release
//! --workspace` puts it there); jemalloc's and mimalloc's cases when the
//! system has the libraries (Debian: `libjemalloc2`, `libmimalloc2.0`).

use super::alloc::{workloads, Workload};
use super::worker::{Request, Worker};
use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::timing::{measure, Plan};
use std::cell::RefCell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The workloads measured.
pub const WORKLOADS: [Workload; 2] = [Workload::Mixed, Workload::Small];

/// The configurations, as case-name suffixes, each with its baseline's.
pub const CONFIGS: [(&str, &str); 7] = [
    ("glibc", "glibc"),
    ("preload", "glibc"),
    ("preload-untagged", "glibc"),
    ("jemalloc", "glibc"),
    ("preload-jemalloc", "jemalloc"),
    ("mimalloc", "glibc"),
    ("preload-mimalloc", "mimalloc"),
];

/// The server cases: redis without and under the preload.
pub const REDIS_CASES: [&str; 2] = ["redis-glibc", "redis-preload"];

/// Every case name.
pub fn cases() -> Vec<String> {
    WORKLOADS
        .iter()
        .flat_map(|w| CONFIGS.map(|(c, _)| format!("{}-{c}", w.name())))
        .chain(REDIS_CASES.map(String::from))
        .collect()
}

/// The baseline of a case: the same workload on the configuration's
/// baseline (see the module docs).
pub fn baseline_of(case: &str) -> Option<String> {
    let (config, base) = CONFIGS
        .iter()
        .filter(|(c, _)| case.ends_with(&format!("-{c}")))
        .max_by_key(|(c, _)| c.len())?;
    let workload = case.strip_suffix(config)?.strip_suffix('-')?;
    Some(format!("{workload}-{base}"))
}

/// The preload library's file name.
pub const PRELOAD_SO: &str = "libsplitcount_preload.so";

/// The preload library beside the lab binary `exe` (or in `deps/` there).
pub fn find_preload(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join(PRELOAD_SO), dir.join("deps").join(PRELOAD_SO)]
        .into_iter()
        .find(|p| p.exists())
}

/// The system's copy of a library (`libjemalloc.so.2`), if it has one.
pub fn system_library(name: &str) -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .map(|d| Path::new(d).join(name))
    .find(|p| p.exists())
}

/// The environment of a configuration's worker; `None` when a library it
/// needs is missing.
fn environment(config: &str, preload: &Path) -> Option<Vec<(&'static str, OsString)>> {
    let je = || system_library("libjemalloc.so.2");
    let mi = || system_library("libmimalloc.so.2");
    let pair = |a: &Path, b: &Path| {
        let mut s = a.as_os_str().to_owned();
        s.push(" ");
        s.push(b.as_os_str());
        s
    };
    Some(match config {
        "glibc" => vec![],
        "preload" => vec![("LD_PRELOAD", preload.into())],
        "preload-untagged" => vec![
            ("LD_PRELOAD", preload.into()),
            ("SPLITCOUNT_PRELOAD_TAGS", "off".into()),
        ],
        "jemalloc" => vec![("LD_PRELOAD", je()?.into())],
        // jemalloc preloaded too: its static TLS is set up at start-up, and
        // the preload finds that copy by name.
        "preload-jemalloc" => vec![
            ("LD_PRELOAD", pair(preload, &je()?)),
            ("SPLITCOUNT_PRELOAD_INNER", "jemalloc".into()),
        ],
        "mimalloc" => vec![("LD_PRELOAD", mi()?.into())],
        "preload-mimalloc" => {
            mi()?;
            vec![
                ("LD_PRELOAD", preload.into()),
                ("SPLITCOUNT_PRELOAD_INNER", "mimalloc".into()),
            ]
        }
        _ => return None,
    })
}

/// What ran: the preload's path, and the configurations left out (a
/// library missing).
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// The preload library measured (`None`: not found, nothing ran).
    pub preload: Option<PathBuf>,
    /// Configurations left out.
    pub skipped: Vec<&'static str>,
    /// Why the redis servers did not start, when they are installed and
    /// did not (their cases are then left out, not the suite).
    pub redis_failed: Option<String>,
}

impl Setup {
    /// What was left out and why, in a line (empty: nothing).
    pub fn left_out(&self) -> String {
        let mut why = Vec::new();
        if self.preload.is_none() {
            why.push(format!(
                "the preload's cases ({PRELOAD_SO} is not beside the lab binary: cargo build \
                 --release --workspace)"
            ));
        }
        let libraries: Vec<&str> = self
            .skipped
            .iter()
            .filter(|c| self.preload.is_some() || !c.starts_with("preload"))
            .copied()
            .collect();
        if !libraries.is_empty() {
            // Only what is missing: each configuration's library.
            let mut missing: Vec<&str> = Vec::new();
            for c in &libraries {
                let lib = if c.contains("jemalloc") {
                    "libjemalloc.so.2 (Debian libjemalloc2)"
                } else if c.contains("mimalloc") {
                    "libmimalloc.so.2 (Debian libmimalloc2.0)"
                } else {
                    "redis-server and redis-benchmark (Debian redis-server, redis-tools)"
                };
                if !missing.contains(&lib) {
                    missing.push(lib);
                }
            }
            why.push(format!(
                "{} (the system has no {})",
                libraries.join(", "),
                missing.join(", no ")
            ));
        }
        if let Some(e) = &self.redis_failed {
            why.push(format!("redis-glibc, redis-preload ({e})"));
        }
        if why.is_empty() {
            String::new()
        } else {
            format!("preload: left out: {}", why.join("; "))
        }
    }
}

/// Measure every workload in every configuration whose libraries are
/// there, at each of `threads`. `exe` is the lab binary; the preload is
/// looked for beside it (without it, the preload's cases are left out and
/// [`Setup::preload`] says so).
pub fn run(exe: &Path, threads: &[usize], plan: &Plan) -> Result<(Bench, Setup), String> {
    let mut setup = Setup {
        preload: find_preload(exe),
        skipped: Vec::new(),
        redis_failed: None,
    };
    let mut workers = Vec::new();
    for (config, _) in CONFIGS {
        // Without the preload, only the allocators alone (the report's
        // targets then read "not measured").
        let env = match &setup.preload {
            Some(preload) => environment(config, preload),
            None if !config.starts_with("preload") => environment(config, Path::new("")),
            None => None,
        };
        match env {
            Some(env) => {
                let env: Vec<(&str, &std::ffi::OsStr)> =
                    env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
                let worker = Worker::start_with_env(exe, Allocator::System, &env)?;
                workers.push((config, RefCell::new(worker)));
            }
            None => setup.skipped.push(config),
        }
    }
    // The redis servers: without and under the preload, each on a port of
    // this process's own.
    let servers = match &setup.preload {
        Some(preload) if threads.contains(&1) && super::redis::available() => {
            // Below Linux's ephemeral range (32768 and up by default):
            // no client connection's port can be in the way.
            let port = 20_000 + (std::process::id() % 6_000) as u16 * 2;
            let started = super::redis::Server::start(port, &[]).and_then(|alone| {
                let under =
                    super::redis::Server::start(port + 1, &[("LD_PRELOAD", preload.as_os_str())])?;
                Ok([alone, under])
            });
            match started {
                Ok(servers) => Some(servers),
                // An installed redis that does not start costs its two
                // cases, not the suite's other figures.
                Err(e) => {
                    setup.redis_failed = Some(e);
                    None
                }
            }
        }
        Some(_) if threads.contains(&1) => {
            setup.skipped.push("redis");
            None
        }
        _ => None,
    };
    let mut entries = Vec::new();
    if let Some(servers) = &servers {
        for (case, server) in REDIS_CASES.iter().zip(servers) {
            entries.push(Entry::from_fn(*case, 1, move |spec| server.run(spec)));
        }
    }
    for workload in WORKLOADS {
        for &t in threads {
            for (config, worker) in &workers {
                entries.push(Entry::from_fn(
                    format!("{}-{config}", workload.name()),
                    t,
                    move |spec| {
                        worker.borrow_mut().run(&Request::new(
                            workloads::SUITE,
                            &workload,
                            t,
                            spec,
                        )?)
                    },
                ));
            }
        }
    }
    let measured = measure("preload", plan, entries)?;
    Ok((Bench::new(measured, baseline_of), setup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_left_out_names_only_what_is_missing() {
        let setup = Setup {
            preload: Some(PathBuf::from("/x/libsplitcount_preload.so")),
            skipped: vec!["mimalloc", "preload-mimalloc"],
            redis_failed: Some("redis-server on port 1 did not answer PING".into()),
        };
        let line = setup.left_out();
        assert!(line.contains("mimalloc, preload-mimalloc (the system has no libmimalloc.so.2"));
        assert!(!line.contains("jemalloc"), "{line}");
        assert!(
            line.contains("redis-glibc, redis-preload (redis-server on port 1"),
            "{line}"
        );
    }

    #[test]
    fn each_case_is_divided_by_its_inner_allocator_alone() {
        assert_eq!(baseline_of("mixed-preload").unwrap(), "mixed-glibc");
        assert_eq!(
            baseline_of("small-preload-untagged").unwrap(),
            "small-glibc"
        );
        assert_eq!(
            baseline_of("mixed-preload-jemalloc").unwrap(),
            "mixed-jemalloc"
        );
        assert_eq!(
            baseline_of("small-preload-mimalloc").unwrap(),
            "small-mimalloc"
        );
        assert_eq!(baseline_of("small-jemalloc").unwrap(), "small-glibc");
        assert_eq!(baseline_of("small-glibc").unwrap(), "small-glibc");
        assert_eq!(baseline_of("redis-preload").unwrap(), "redis-glibc");
        assert_eq!(cases().len(), 16);
        for case in cases() {
            assert!(cases().contains(&baseline_of(&case).unwrap()), "{case}");
        }
    }
}
