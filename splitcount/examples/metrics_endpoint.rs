//! A `/metrics` endpoint over a small demo hierarchy: tenants with limits,
//! requests charged and refused, stat items — in the Prometheus text format
//! that `splitcount::export::prometheus::render` writes — and the process's
//! own memory, part by part (`splitcount_process_*`), from the accounting
//! allocator's reconciliation.
//!
//! `cargo run --release -p splitcount --example metrics_endpoint --features prometheus -- --once`
//! prints one exposition to stdout and exits; without `--once` it serves
//! `http://127.0.0.1:9464/metrics` (`--port N` to change) until killed.

use splitcount::alloc::Accounted;
use splitcount::export::prometheus::{render, Options};
use splitcount::group::{Hierarchy, HierarchyConfig};
use splitcount::stat::StatItem;
use std::alloc::System;
use std::io::{BufRead, BufReader, Write};

/// The process's heap, accounted (into a hierarchy of its own here: the
/// demo's groups are charged made-up units).
#[global_allocator]
static ALLOC: Accounted<System> = Accounted::new(System);

/// Tenants, requests and stat items with a little history.
fn demo() -> Hierarchy {
    let memory = Hierarchy::new(
        HierarchyConfig::default().stats(vec![StatItem::gauge("rows"), StatItem::event("queries")]),
    )
    .expect("a valid configuration");
    let (rows, queries) = (
        memory.stat_id("rows").expect("defined above"),
        memory.stat_id("queries").expect("defined above"),
    );
    let tenants = memory.root().child("tenants").expect("a fresh hierarchy");
    for (name, max, used) in [("acme", 64 << 20, 40 << 20), ("globex", 16 << 20, 15 << 20)] {
        let t = tenants.child(name).expect("distinct names");
        t.set_max(max).expect("nothing charged yet");
        t.set_high(max / 4 * 3);
        let req = t.child("req-1").expect("a fresh tenant");
        req.charge(used).expect("within the limit");
        let _ = req.charge(max); // refused: a `max` event
        req.mod_stat(rows, 1_000).expect("a gauge");
        req.mod_stat(queries, 3).expect("an event count");
    }
    memory
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let once = args.iter().any(|a| a == "--once");
    let port: u16 = match args.iter().position(|a| a == "--port") {
        Some(i) => args
            .get(i + 1)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "--port N"))?,
        None => 9464,
    };
    let heap = Hierarchy::default();
    ALLOC.attach(&heap).expect("attached once");
    let memory = demo();
    // Tenants and their requests, not deeper: a cap on cardinality; and
    // the process's resident set, part by part.
    let options = Options::default()
        .max_depth(3)
        .process_memory(|| ALLOC.reconcile());
    if once {
        print!("{}", render(&memory.root(), &options));
        return Ok(());
    }
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
    eprintln!("serving http://{}/metrics", listener.local_addr()?);
    for stream in listener.incoming() {
        let mut stream = stream?;
        let mut request_line = String::new();
        BufReader::new(&stream).read_line(&mut request_line)?;
        let (status, body) = if request_line.starts_with("GET /metrics ") {
            ("200 OK", render(&memory.root(), &options))
        } else {
            ("404 Not Found", "try /metrics\n".to_owned())
        };
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
    }
    Ok(())
}
