//! What the reconciliation explains of the resident set while the example
//! server (`tenant_server.rs`, in this process) serves its load pattern,
//! and what a trim gives back after a spike.
//!
//! 1. **Load**: rounds of concurrent `/work` requests (1–40 MiB, some over
//!    their 16 MiB limit) from six tenants, while a thread reconciles every
//!    20 ms: each sample's unexplained remainder as a share of the resident
//!    set.
//! 2. **Spike**: 24 requests of 12 MiB at once; the resident set before,
//!    at the peak, and after, without a trim policy and then with
//!    `TrimPolicy::on_remove()`.
//! 3. **Trim cost**: `Accounted::trim` timed on the heap the load left, and
//!    on a heap holding 200,000 live blocks with 100 MB freed among them.
//!
//! Run: `cargo run --release -p splitcount --example resident_parts --features tokio,tower,prometheus`

#[path = "tenant_server.rs"]
mod server;

use server::ALLOC;
use splitcount::alloc::{Reconciliation, ResidentPart, TrimPolicy};
use splitcount::group::Hierarchy;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static READ_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn mib(v: u64) -> f64 {
    v as f64 / 1048576.0
}

/// One sample's row: the resident set, each part, and the remainder.
fn row(r: &Reconciliation) -> String {
    let mut s = format!("{:>8.1}", mib(r.resident_mapped.unwrap_or(0)));
    for p in ResidentPart::ALL {
        s += &format!(" {:>8.2}", mib(r.part(p).unwrap_or(0)));
    }
    let u = r.unexplained.unwrap_or(0);
    let share = u as f64 * 100.0 / r.resident_mapped.unwrap_or(1) as f64;
    s + &format!(
        " {:>9.3} {:>+7.2}% {:>7.3}",
        u as f64 / 1048576.0,
        share,
        mib(r.reading_drift)
    )
}

fn header() -> String {
    let mut s = format!("{:>8}", "resident");
    for p in ResidentPart::ALL {
        let name = p.name();
        s += &format!(" {:>8}", &name[..name.len().min(8)]);
    }
    s + &format!(" {:>9} {:>8} {:>7}", "unexpl.", "share", "±drift")
}

fn resident() -> u64 {
    ALLOC
        .reconcile()
        .and_then(|r| r.resident_mapped)
        .unwrap_or(0)
}

fn main() {
    let memory = Hierarchy::default();
    ALLOC.attach(&memory).expect("attached once");
    let runtime = splitcount::task::drain_on_park(&mut tokio::runtime::Builder::new_multi_thread())
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let addr = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(server::serve(listener, memory.clone()));
        addr
    });
    let client = reqwest::Client::new();
    let get = |tenant: String, mib: u32| {
        let client = client.clone();
        async move {
            let r = client
                .get(format!("http://{addr}/work?mib={mib}"))
                .header("x-tenant", tenant)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let _ = r.text().await;
            status
        }
    };
    let burst = |requests: Vec<(String, u32)>| {
        runtime.block_on(async {
            let all: Vec<_> = requests
                .into_iter()
                .map(|(t, m)| tokio::spawn(get(t, m)))
                .collect();
            let mut codes = Vec::new();
            for h in all {
                codes.push(h.await.unwrap());
            }
            codes
        })
    };

    // 1. Load, sampled.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<(Duration, Reconciliation)>::new()));
    let sampler = {
        let (stop, samples) = (stop.clone(), samples.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = ALLOC.reconcile().expect("attached");
                READ_NS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                samples.lock().unwrap().push((start.elapsed(), r));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let sizes = [1, 4, 2, 8, 40, 16, 3, 12, 6, 24];
    let mut refused = 0;
    for round in 0..40u32 {
        let requests = (0..6u32)
            .map(|i| {
                let mib = sizes[((round * 7 + i * 3) % sizes.len() as u32) as usize];
                (format!("tenant-{i}"), mib)
            })
            .collect();
        refused += burst(requests).iter().filter(|&&c| c == 507).count();
    }
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let samples = samples.lock().unwrap();
    println!(
        "1. load: 40 rounds of 6 concurrent requests ({refused} answered 507), {} samples, MiB:",
        samples.len()
    );
    println!(
        "(one reconciliation took {:.3} ms on average)",
        READ_NS.load(Ordering::Relaxed) as f64 / 1e6 / samples.len() as f64
    );
    println!("{:>6} {}", "ms", header());
    let step = (samples.len() / 12).max(1);
    for (t, r) in samples.iter().step_by(step) {
        println!("{:>6} {}", t.as_millis(), row(r));
    }
    let shares: Vec<f64> = samples
        .iter()
        .map(|(_, r)| r.unexplained.unwrap() as f64 * 100.0 / r.resident_mapped.unwrap() as f64)
        .collect();
    let worst = shares.iter().fold(0f64, |m, s| m.max(s.abs()));
    // Beyond what moved while smaps was read (`reading_drift`).
    let beyond = samples
        .iter()
        .map(|(_, r)| {
            let off = r
                .unexplained
                .unwrap()
                .unsigned_abs()
                .saturating_sub(r.reading_drift);
            off as f64 * 100.0 / r.resident_mapped.unwrap() as f64
        })
        .fold(0f64, f64::max);
    let within = shares.iter().filter(|s| s.abs() <= 5.0).count();
    let mut sorted = shares.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "unexplained / resident: median {:+.2}%, min {:+.2}%, max {:+.2}%, worst |share| {:.2}% (target ≤ 5%); \
         {within} of {} samples within 5%; worst beyond the reading's drift {:.2}%",
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1],
        worst,
        shares.len(),
        beyond
    );
    if let Some((t, r)) = samples
        .iter()
        .max_by_key(|(_, r)| r.unexplained.unwrap().unsigned_abs())
    {
        println!("the sample furthest off, at {} ms:\n{r}", t.as_millis());
    }
    drop(samples);

    // 2. Spikes, without and with the trim policy.
    let spike = |label: &str| {
        std::thread::sleep(Duration::from_millis(300));
        let before = resident();
        let start = ALLOC.reconcile().unwrap();
        let requests = (0..24u32)
            .map(|i| (format!("spike-{}", i % 6), 12))
            .collect();
        let peak = Arc::new(Mutex::new(0u64));
        let watching = Arc::new(AtomicBool::new(true));
        let watcher = {
            let (peak, watching) = (peak.clone(), watching.clone());
            std::thread::spawn(move || {
                while watching.load(Ordering::Relaxed) {
                    let r = resident();
                    let mut p = peak.lock().unwrap();
                    *p = (*p).max(r);
                    drop(p);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let codes = burst(requests);
        watching.store(false, Ordering::Relaxed);
        watcher.join().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let after = ALLOC.reconcile().unwrap();
        let after_rss = after.resident_mapped.unwrap();
        let trims = after.trims - start.trims;
        println!(
            "{label}: resident {:.1} MiB before, {:.1} at the peak, {:.1} after ({:+.1}% of before; {} of 24 served; {trims} trims, {:.3} ms each)",
            mib(before),
            mib(*peak.lock().unwrap()),
            mib(after_rss),
            (after_rss as f64 / before as f64 - 1.0) * 100.0,
            codes.iter().filter(|&&c| c == 200).count(),
            (after.trim_nanos - start.trim_nanos) as f64 / 1e6 / trims.max(1) as f64,
        );
        println!("   {}\n   {}", header(), row(&after));
        after
    };
    println!("\n2. spike: 24 concurrent requests of 12 MiB");
    ALLOC.set_trim(TrimPolicy::OFF);
    ALLOC.trim();
    let kept = spike("without trim");
    println!("{kept}");
    ALLOC.trim();
    ALLOC.set_trim(TrimPolicy::on_remove());
    spike("with TrimPolicy::on_remove()");
    ALLOC.set_trim(TrimPolicy::OFF);

    // 3. The cost of a trim.
    let time = |label: &str| {
        let mut took: Vec<Duration> = (0..9).map(|_| ALLOC.trim().took).collect();
        took.sort();
        println!(
            "{label}: malloc_trim(0) median {:.3} ms (min {:.3}, max {:.3}) over 9 calls, resident {:.1} MiB",
            took[4].as_secs_f64() * 1e3,
            took[0].as_secs_f64() * 1e3,
            took[8].as_secs_f64() * 1e3,
            mib(resident())
        );
    };
    println!("\n3. trim cost");
    time("the server's heap, idle");
    let first = {
        let held: Vec<Vec<u8>> = (0..200_000).map(|i| vec![1u8; 100 + i % 900]).collect();
        let freed: Vec<Vec<u8>> = (0..100_000).map(|_| vec![2u8; 1000]).collect();
        let pin = vec![3u8; 1000];
        drop(freed);
        let t = ALLOC.trim().took;
        time("200,000 live blocks (~110 MB), 100 MB freed then trimmed once, again");
        drop((held, pin));
        t
    };
    println!(
        "   the first trim of that heap, with 100 MB freed in it: {:.3} ms",
        first.as_secs_f64() * 1e3
    );
    drop(runtime);
}
