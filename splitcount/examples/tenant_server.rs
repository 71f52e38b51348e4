//! A multi-tenant HTTP server with memory limits per tenant and per
//! request: axum on a tokio multi-thread runtime, `Accounted` as the global
//! allocator, and [`GroupLayer`] giving every request a group.
//!
//! - `GET /work?mib=N` with a header `x-tenant: NAME`: builds N MiB of
//!   buffers, one MiB at a time with an `.await` between them (the task may
//!   move between workers), half of them in a sub-task spawned in the
//!   request's group, and answers with what it built.
//! - `GET /usage`: every tenant's usage, peak, limit and `max` events.
//! - `GET /metrics`: the tenants' groups and the process's memory part by
//!   part (what the groups track, what glibc keeps free, stacks, code…,
//!   and what none of them explains), in the Prometheus text format.
//!
//! Each tenant gets `/tenants/NAME` (64 MiB) on its first request; each
//! request `/tenants/NAME/req-ID` (16 MiB), removed when it is answered; a
//! request without a valid tenant name runs in `/tenants-unidentified`
//! (64 MiB, like one tenant), never outside the limits. A
//! request over its limit is stopped at its next `.await` and answered
//! `507 Insufficient Storage` with the numbers; other requests — of the same
//! tenant too — carry on, and the process never aborts. Idle workers return
//! their allocator reserves when they park.
//!
//! Run: `cargo run --release -p splitcount --example tenant_server --features tokio,tower,prometheus -- --port 3000`
//! (`--port 0` picks a free port); then e.g.
//! `curl -H 'x-tenant: acme' 'http://127.0.0.1:3000/work?mib=4'`.

use axum::extract::{Query, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use splitcount::alloc::Accounted;
use splitcount::export::prometheus::{render, Options};
use splitcount::group::{BreachMode, Group, Hierarchy, OverLimit};
use splitcount::task::{drain_on_park, spawn_in_current, GroupLayer};
use std::alloc::System;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The process's allocator: every allocation charged to the current group.
#[global_allocator]
pub static ALLOC: Accounted<System> = Accounted::new(System);

/// A tenant's limit.
pub const TENANT_MAX: u64 = 64 << 20;
/// A request's limit.
pub const REQUEST_MAX: u64 = 16 << 20;

/// Where a server keeps its tenants, and their limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The group under the root that holds the tenants (`/usage` lists
    /// this one's children).
    pub parent: &'static str,
    /// Each tenant's limit.
    pub tenant: u64,
    /// Each request's limit.
    pub request: u64,
}

/// This server's: `/tenants`, 64 MiB per tenant, 16 MiB per request.
pub const LIMITS: Limits = Limits {
    parent: "tenants",
    tenant: TENANT_MAX,
    request: REQUEST_MAX,
};

/// The server: routes, with a group per request.
pub fn app(memory: Hierarchy) -> Router {
    app_with(memory, LIMITS)
}

/// [`app`] with its tenants under another group, with other limits (the
/// load example runs two side by side).
pub fn app_with(memory: Hierarchy, limits: Limits) -> Router {
    let tenants = memory
        .root()
        .child_or_create(limits.parent)
        .expect("a valid name");
    // Requests without a tenant name the hierarchy accepts (no header, not
    // text, empty, with a `/`, `.`, `..`, longer than 255 bytes) run in
    // `/{parent}-unidentified`, limited as one tenant — and so do those of
    // a tenant an operator removed meanwhile: a request that `make` gives
    // no group runs outside every limit. Looked up (or made again, if an
    // operator removed it) for each such request.
    let root = memory.root();
    let unidentified = move || {
        root.child_or_create_with(&format!("{}-unidentified", limits.parent), |g| {
            g.set_breach_mode(BreachMode::Level);
            g.set_max(limits.tenant)
        })
        .ok()
    };
    let per_request = GroupLayer::new(
        move |req: &Request<axum::body::Body>| -> Option<Group> {
            // The tenant's limit is set once, when its group is made (a
            // limit an operator changes later stays); its breach lasts
            // while it is over the limit, not for ever.
            let t = req
                .headers()
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .and_then(|name| {
                    tenants
                        .child_or_create_with(name, |t| {
                            t.set_breach_mode(BreachMode::Level);
                            t.set_max(limits.tenant)
                        })
                        .ok()
                })
                .or_else(&unidentified)?;
            // Numbered across the process: two servers on one hierarchy
            // (and parent) never make the same name.
            let name = format!("req-{}", NEXT_REQUEST.fetch_add(1, Ordering::Relaxed));
            let g = t
                .child(&name)
                .ok()
                .or_else(|| unidentified()?.child(&name).ok())?;
            g.set_max(limits.request).ok()?;
            Some(g)
        },
        |over: OverLimit| -> Response {
            (StatusCode::INSUFFICIENT_STORAGE, format!("{over}\n")).into_response()
        },
    );
    // Only the tenants' work runs in request groups: the operator's pages
    // (`/usage`, `/metrics`) run outside them — a scrape is not a tenant's
    // request, and as one it put a new request group in every export.
    Router::new()
        .route("/work", get(work))
        .layer(per_request)
        .route("/usage", get(usage))
        .route("/metrics", get(metrics))
        .with_state((memory, limits.parent))
}

/// The number of the next request, across every server of the process.
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(0);

/// `GET /work?mib=N`: N MiB built a MiB at a time, half in a sub-task.
async fn work(Query(q): Query<HashMap<String, String>>) -> Response {
    let mib: usize = match q.get("mib").map(|m| m.parse()) {
        Some(Ok(m)) if m <= 1024 => m,
        _ => return (StatusCode::BAD_REQUEST, "mib=N (0..=1024)\n").into_response(),
    };
    // Half in a sub-task, charged to this request's group too.
    let helper = spawn_in_current(build(mib / 2));
    let mine = build(mib - mib / 2).await;
    let theirs = match helper.await {
        Ok(Ok(b)) => b,
        Ok(Err(over)) => {
            return (StatusCode::INSUFFICIENT_STORAGE, format!("{over}\n")).into_response()
        }
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    };
    format!("built {} MiB\n", (mine + theirs) >> 20).into_response()
}

/// `mib` buffers of 1 MiB, with an `.await` after each.
async fn build(mib: usize) -> usize {
    let mut chunks = Vec::new();
    for i in 0..mib {
        chunks.push(vec![i as u8; 1 << 20]);
        tokio::task::yield_now().await;
    }
    chunks.iter().map(Vec::len).sum()
}

/// `GET /usage`: a line per tenant.
async fn usage(State((memory, parent)): State<(Hierarchy, &'static str)>) -> String {
    let Ok(tenants) = memory.lookup(parent) else {
        return String::new();
    };
    // Bytes pre-charged in the per-CPU stocks go back to the counters
    // first, so that the usage is what the tenants' live blocks hold.
    memory.drain_stocks();
    // The tenants, then the requests that named none.
    let unidentified = memory.lookup(&format!("{parent}-unidentified")).ok();
    tenants
        .children()
        .iter()
        .chain(unidentified.iter())
        .map(|t| {
            format!(
                "{} usage={} peak={} max={} over_limit={} refused={} requests={}\n",
                t.name(),
                t.usage(),
                t.peak(),
                t.max(),
                // The request groups are gone: their counts live on in the
                // tenant's subtree totals.
                t.subtree_events().breaches,
                t.subtree_events().refused,
                t.children().len()
            )
        })
        .collect()
}

/// `GET /metrics`: tenants (not their requests: a cap on cardinality) and
/// the process's resident set explained part by part.
async fn metrics(State((memory, _)): State<(Hierarchy, &'static str)>) -> String {
    let options = Options::default()
        .max_depth(2)
        .process_memory(|| ALLOC.reconcile());
    render(&memory.root(), &options)
}

/// Serve `app(memory)` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, memory: Hierarchy) -> std::io::Result<()> {
    axum::serve(listener, app(memory)).await
}

#[allow(dead_code)] // the end-to-end test includes this file as a module
fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .skip_while(|a| a != "--port")
        .nth(1)
        .map_or(Ok(3000), |p| p.parse())
        .map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("--port: {e}"))
        })?;
    let memory = Hierarchy::default();
    ALLOC.attach(&memory).expect("attached once");
    let runtime = drain_on_park(&mut tokio::runtime::Builder::new_multi_thread())
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        println!("listening on http://{}", listener.local_addr()?);
        serve(listener, memory).await
    })
}
