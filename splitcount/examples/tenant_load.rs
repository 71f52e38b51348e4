//! The noisy neighbour, measured on the example server: does a tenant at
//! its memory limit slow the other tenants down?
//!
//! Two copies of `tenant_server`'s app run in one process, on one runtime
//! and one accounted heap: **enforced** (tenants under `/tenants`, 64 MiB
//! each, 16 MiB per request) and **never reached** (under `/unlimited`, no
//! limits). Each round drives both in turn with the same load for the
//! same time, on 127.0.0.1:
//!
//! - a *noisy* tenant: 5 connections asking for 40 MiB each, over and over —
//!   every request passes its 16 MiB limit (each half, built in a task of
//!   its own, does: 507 when enforced) and together
//!   they hold the tenant at its 64 MiB;
//! - three *healthy* tenants: 2 connections each, asking for 2 MiB.
//!
//! It prints, per round, the healthy requests' p99 latency under both and
//! their ratio, then the median ratio and its range over the rounds (the
//! rounds interleave the two, alternating which goes first, so that a
//! drift of the machine falls on both). Healthy requests must all
//! succeed, in both; the noisy ones must get 507 when enforced and 200
//! when not; afterwards every request group must be gone and every
//! tenant's usage back under 64 KiB — the program exits non-zero otherwise
//! (CI runs one short round of it as a bounded load test).
//!
//! Run: `cargo run --release -p splitcount --example tenant_load --features tokio,tower,prometheus -- --rounds 11 --seconds 2`

#[path = "tenant_server.rs"]
#[allow(dead_code)]
mod server;

use server::Limits;
use splitcount::charge::UNLIMITED;
use splitcount::group::Hierarchy;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOISY_CONNECTIONS: usize = 5;
const NOISY_MIB: u32 = 40;
const HEALTHY_TENANTS: usize = 3;
const HEALTHY_CONNECTIONS: usize = 2;
const HEALTHY_MIB: u32 = 2;

/// What one phase (one configuration, one round) saw.
#[derive(Debug, Default)]
struct Phase {
    /// Healthy requests' latencies, sorted.
    healthy: Vec<Duration>,
    healthy_failed: usize,
    noisy: usize,
    noisy_507: usize,
    noisy_other: usize,
}

impl Phase {
    fn p99(&self) -> Duration {
        let i = (self.healthy.len() * 99).div_ceil(100).saturating_sub(1);
        self.healthy.get(i).copied().unwrap_or_default()
    }
}

fn arg(name: &str, default: f64) -> f64 {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|e| panic!("{name} {v}: {e} (a number)"))
        })
}

async fn request(client: &reqwest::Client, addr: SocketAddr, tenant: &str, mib: u32) -> u16 {
    match client
        .get(format!("http://{addr}/work?mib={mib}"))
        .header("x-tenant", tenant)
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            let body = r.bytes().await;
            if std::env::var_os("TENANT_LOAD_DEBUG").is_some() && tenant == "noisy" && status == 200
            {
                eprintln!("noisy 200: {body:?}");
            }
            status
        }
        Err(_) => 0,
    }
}

/// Drive `addr` for `time`: the noisy tenant and the healthy ones at once.
async fn phase(client: &reqwest::Client, addr: SocketAddr, time: Duration) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let mut noisy = Vec::new();
    for _ in 0..NOISY_CONNECTIONS {
        let (client, stop) = (client.clone(), stop.clone());
        noisy.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                statuses.push(request(&client, addr, "noisy", NOISY_MIB).await);
            }
            statuses
        }));
    }
    let mut healthy = Vec::new();
    for t in 0..HEALTHY_TENANTS {
        for _ in 0..HEALTHY_CONNECTIONS {
            let (client, stop) = (client.clone(), stop.clone());
            healthy.push(tokio::spawn(async move {
                let tenant = format!("healthy-{t}");
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let status = request(&client, addr, &tenant, HEALTHY_MIB).await;
                    seen.push((status, start.elapsed()));
                }
                seen
            }));
        }
    }
    tokio::time::sleep(time).await;
    stop.store(true, Ordering::Relaxed);
    let mut out = Phase::default();
    for h in healthy {
        for (status, took) in h.await.expect("a client task") {
            if status == 200 {
                out.healthy.push(took);
            } else {
                out.healthy_failed += 1;
            }
        }
    }
    for n in noisy {
        for status in n.await.expect("a client task") {
            out.noisy += 1;
            match status {
                507 => out.noisy_507 += 1,
                200 => {}
                _ => out.noisy_other += 1,
            }
        }
    }
    out.healthy.sort();
    out
}

fn main() {
    let rounds = arg("--rounds", 11.0) as usize;
    let seconds = arg("--seconds", 2.0);
    let time = Duration::from_secs_f64(seconds);
    let memory = Hierarchy::default();
    server::ALLOC.attach(&memory).expect("attached once");
    let enforced = server::LIMITS;
    let open = Limits {
        parent: "unlimited",
        tenant: UNLIMITED,
        request: UNLIMITED,
    };
    // The server as the example runs it: two workers, reserves drained at
    // park. The clients on a runtime of their own.
    let server_rt =
        splitcount::task::drain_on_park(&mut tokio::runtime::Builder::new_multi_thread())
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
    let listen = |limits: Limits| {
        let memory = memory.clone();
        server_rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let addr = listener.local_addr().expect("an address");
            tokio::spawn(
                async move { axum::serve(listener, server::app_with(memory, limits)).await },
            );
            addr
        })
    };
    let (addr_enforced, addr_open) = (listen(enforced), listen(open));
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let client = reqwest::Client::new();
    println!(
        "{rounds} rounds of {seconds} s per configuration; healthy: {HEALTHY_TENANTS} tenants × {HEALTHY_CONNECTIONS} connections × {HEALTHY_MIB} MiB; noisy: {NOISY_CONNECTIONS} connections × {NOISY_MIB} MiB"
    );
    println!(
        "{:>5} {:>14} {:>14} {:>8} {:>12} {:>12} {:>10}",
        "round", "p99 enforced", "p99 never", "ratio", "healthy/s e", "healthy/s n", "noisy 507"
    );
    let mut ratios = Vec::new();
    let mut wrong = Vec::new();
    for round in 0..rounds {
        let run = |addr| client_rt.block_on(phase(&client, addr, time));
        let (e, o) = if round % 2 == 0 {
            let e = run(addr_enforced);
            (e, run(addr_open))
        } else {
            let o = run(addr_open);
            (run(addr_enforced), o)
        };
        let ratio = e.p99().as_secs_f64() / o.p99().as_secs_f64().max(1e-9);
        ratios.push(ratio);
        println!(
            "{:>5} {:>11.1} ms {:>11.1} ms {:>8.2} {:>12.1} {:>12.1} {:>4}/{:<5}",
            round + 1,
            e.p99().as_secs_f64() * 1e3,
            o.p99().as_secs_f64() * 1e3,
            ratio,
            e.healthy.len() as f64 / seconds,
            o.healthy.len() as f64 / seconds,
            e.noisy_507,
            e.noisy
        );
        if e.healthy_failed + o.healthy_failed > 0 {
            wrong.push(format!(
                "round {}: {} healthy requests failed",
                round + 1,
                e.healthy_failed + o.healthy_failed
            ));
        }
        if e.noisy_507 + e.noisy_other != e.noisy || e.noisy_other > 0 || o.noisy_507 > 0 {
            wrong.push(format!(
                "round {}: noisy requests: enforced {} of which 507 {} and other {}; never reached {} of which 507 {}",
                round + 1,
                e.noisy,
                e.noisy_507,
                e.noisy_other,
                o.noisy,
                o.noisy_507
            ));
        }
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "healthy p99, noisy neighbour at its limit ÷ limits never reached: ×{median:.2} [{:.2}–{:.2}] (median [range] of {rounds} rounds)",
        ratios[0],
        ratios[ratios.len() - 1]
    );
    // Every request's group is gone; what the tenants keep is the
    // runtime's own (about 2 KiB per worker at most, seen: see the README).
    std::thread::sleep(Duration::from_millis(100));
    memory.drain_stocks();
    for parent in [enforced.parent, open.parent] {
        let Ok(tenants) = memory.lookup(parent) else {
            continue;
        };
        for t in tenants.children() {
            let e = t.subtree_events();
            println!(
                "{}: usage {} B, over_limit {}, refused {}, requests left {}",
                t.path(),
                t.usage(),
                e.breaches,
                e.refused,
                t.children().len()
            );
            if t.usage() >= 64 << 10 || !t.children().is_empty() {
                wrong.push(format!(
                    "{}: usage did not return to its baseline",
                    t.path()
                ));
            }
        }
    }
    if !wrong.is_empty() {
        eprintln!("{}", wrong.join("\n"));
        std::process::exit(1);
    }
}
