//! `bench preload`'s server case: Debian's `redis-server` loaded by
//! `redis-benchmark`, without and under the preload (`redis-glibc`,
//! `redis-preload`). Each slice runs one `redis-benchmark` of SETs and
//! GETs of 200-byte values over 10,000 keys from 8 connections, sized to
//! last about the slice; the case's time per request is what
//! redis-benchmark measured (its requests per second), so `redis-preload ÷ redis-glibc` is the
//! inverse of the throughput ratio (≤ ×1.053 ⇔ ≥ 0.95 of the throughput).
//! Both servers live for the whole suite; the client competes with the
//! server for this machine's CPUs alike in both.

use crate::timing::slice::{SliceRun, SliceSpec, ThreadRun};
use std::cell::Cell;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the lab's, on a loopback port, killed when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    port: u16,
    /// Requests per second seen so far (sizes the next run).
    rate: Cell<f64>,
}

/// A program on `PATH`, if there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Whether `redis-server` and `redis-benchmark` are installed.
pub fn available() -> bool {
    on_path("redis-server").is_some() && on_path("redis-benchmark").is_some()
}

impl Server {
    /// Start `redis-server` on `port` with `env`, and wait until it answers
    /// `PING` (5 s at most).
    pub fn start(port: u16, env: &[(&str, &OsStr)]) -> Result<Server, String> {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the child between `fork` and
            // `exec` and only makes a system call (async-signal-safe).
            unsafe {
                command.pre_exec(|| {
                    // The lab killed by a signal runs no `Drop`: the server
                    // is stopped with it (the signal comes when the thread
                    // that started it ends; the suite's own thread starts
                    // and stops the servers).
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let server = Server {
            child,
            port,
            rate: Cell::new(0.0),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if server.ping() {
                super::preloaded::check(server.child.id(), env)?;
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("redis-server on port {port} did not answer PING"))
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut reply = [0u8; 7];
        s.set_read_timeout(Some(Duration::from_millis(200))).is_ok()
            && s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    /// One slice: a `redis-benchmark` run of about `spec.length` (at least
    /// 5,000 SETs and as many GETs). Its time is what redis-benchmark
    /// measured (`--csv`: requests per second of each test), not the
    /// process's start and its connections.
    pub fn run(&self, spec: SliceSpec) -> Result<SliceRun, String> {
        let rate = self.rate.get();
        let n = if rate > 0.0 {
            ((rate * spec.length.as_secs_f64()) as u64 / 2).max(5_000)
        } else {
            5_000
        };
        let out = Command::new("redis-benchmark")
            .args(["-p", &self.port.to_string(), "--csv", "-t", "set,get"])
            .args(["-d", "200", "-r", "10000", "-c", "8", "-n", &n.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-benchmark failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let csv = String::from_utf8_lossy(&out.stdout);
        let seconds = busy_seconds(&csv, n)
            .ok_or_else(|| format!("redis-benchmark said {csv:?}: no SET and GET rates"))?;
        let requests = 2 * n;
        self.rate.set(requests as f64 / seconds);
        Ok(SliceRun {
            threads: vec![ThreadRun {
                ops: requests,
                start_ns: 0,
                stop_ns: (seconds * 1e9) as u64,
                cpu_ns: None,
                timed_ns: None,
            }],
            pinned: None,
        })
    }
}

/// The seconds `n` SETs and `n` GETs took, from redis-benchmark's `--csv`
/// lines (`"SET","75471.70",…`).
fn busy_seconds(csv: &str, n: u64) -> Option<f64> {
    let rate = |test: &str| -> Option<f64> {
        csv.lines()
            .find(|l| l.starts_with(&format!("\"{test}\",")))?
            .split(',')
            .nth(1)?
            .trim_matches('"')
            .parse::<f64>()
            .ok()
            .filter(|r| *r > 0.0)
    };
    Some(n as f64 / rate("SET")? + n as f64 / rate("GET")?)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_is_redis_benchmarks_own() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"50000.00\",\"0.1\"\n\
                   \"GET\",\"100000.00\",\"0.1\"\n";
        let s = busy_seconds(csv, 10_000).unwrap();
        assert!((s - 0.3).abs() < 1e-9, "{s}");
        assert_eq!(busy_seconds("\"SET\",\"1\"\n", 1), None, "no GET");
    }
}
