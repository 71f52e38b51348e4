//! End to end: the example server (`examples/tenant_server.rs`, included
//! here as a module, with its global allocator) on 127.0.0.1 at an
//! ephemeral port, driven by a real HTTP client. A request over its limit
//! gets 507 while requests of its own and of other tenants succeed; every
//! request group is removed, and the tenants' usage returns to what the
//! runtime itself keeps.

#![cfg(all(feature = "tokio", feature = "tower"))]

#[path = "../examples/tenant_server.rs"]
mod server;

use splitcount::group::Hierarchy;
use std::time::Duration;

#[test]
fn the_example_server_fails_a_request_over_its_limit_and_serves_the_others() {
    let memory = Hierarchy::default();
    server::ALLOC.attach(&memory).unwrap();
    let rt = splitcount::task::drain_on_park(&mut tokio::runtime::Builder::new_multi_thread())
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(server::serve(listener, memory.clone()));
        let client = reqwest::Client::new();
        let get = |tenant: &'static str, mib: u32| {
            let client = client.clone();
            async move {
                let r = client
                    .get(format!("http://{addr}/work?mib={mib}"))
                    .header("x-tenant", tenant)
                    .send()
                    .await
                    .unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
        // At once: a greedy request and ordinary ones, of both tenants.
        let (greedy, ok_a, ok_b, ok_a2) = tokio::join!(
            get("greedy", 40),
            get("acme", 4),
            get("greedy", 2),
            get("acme", 8)
        );
        assert_eq!(greedy.0, 507, "{}", greedy.1);
        assert!(
            greedy
                .1
                .contains("went over the limit of /tenants/greedy/req-"),
            "{}",
            greedy.1
        );
        assert_eq!(ok_a, (200, "built 4 MiB\n".to_owned()));
        assert_eq!(ok_b, (200, "built 2 MiB\n".to_owned()));
        assert_eq!(ok_a2, (200, "built 8 MiB\n".to_owned()));
        // The server keeps serving the greedy tenant.
        assert_eq!(get("greedy", 1).await.0, 200);
        // A request without a valid tenant name runs in the catch-all
        // group, limited like the others — not outside every limit (it
        // built 40 MiB before, charged to the root).
        let bare = client
            .get(format!("http://{addr}/work?mib=40"))
            .send()
            .await
            .unwrap();
        assert_eq!(bare.status().as_u16(), 507);
        for bad in ["a/b", "..", ""] {
            let (status, body) = get(bad, 40).await;
            assert_eq!(status, 507, "x-tenant {bad:?}: {body}");
            assert!(body.contains("/tenants-unidentified/req-"), "{body}");
        }
        // An operator removes the catch-all: the next such request makes
        // it again (it ran with no group, outside every limit, before).
        memory
            .lookup("tenants-unidentified")
            .unwrap()
            .remove()
            .unwrap();
        let (status, body) = get("", 40).await;
        assert_eq!(status, 507, "{body}");
        let page = |path: &'static str| {
            let client = client.clone();
            async move {
                let r = client.get(format!("http://{addr}{path}")).send().await;
                r.unwrap().text().await.unwrap()
            }
        };
        let usage = page("/usage").await;
        assert!(
            usage.contains("acme usage=") && usage.contains("requests=0"),
            "{usage}"
        );
        // The 507 is counted at its tenant after its request group is gone.
        let greedy = usage.lines().find(|l| l.starts_with("greedy ")).unwrap();
        assert!(greedy.contains(" over_limit=1 refused=0 "), "{usage}");
        let acme = usage.lines().find(|l| l.starts_with("acme ")).unwrap();
        assert!(acme.contains(" over_limit=0 refused=0 "), "{usage}");
        // The process's memory beside the tenants, part by part.
        let metrics = page("/metrics").await;
        // A scrape is no request of a tenant's: it runs in no request group
        // (as the catch-all's, each scrape exported a new series).
        assert!(!page("/metrics").await.contains("/req-"), "{metrics}");
        assert!(!metrics.contains("/req-"), "{metrics}");
        for family in [
            "splitcount_group_usage_bytes{group=\"/tenants/acme\"}",
            "splitcount_process_resident_bytes ",
            "splitcount_process_tracked_bytes ",
            "splitcount_process_unexplained_bytes ",
        ] {
            assert!(metrics.contains(family), "{family} in\n{metrics}");
        }
    });
    drop(rt);
    std::thread::sleep(Duration::from_millis(50));
    memory.drain_stocks();
    let tenants = memory.lookup("tenants").unwrap();
    for t in tenants.children() {
        assert!(
            t.children().is_empty(),
            "{}: request groups are removed",
            t.path()
        );
        // What hyper and tokio keep of a request (a buffer grown in a poll)
        // may outlive it; a request's megabytes may not.
        assert!(t.usage() < 64 << 10, "{}: {} bytes", t.path(), t.usage());
        assert!(t.peak() >= 1 << 20);
    }
    let greedy = memory.lookup("tenants/greedy").unwrap();
    assert_eq!(
        greedy.events().max,
        0,
        "the request's limit was passed, not the tenant's"
    );
    let e = greedy.subtree_events();
    assert_eq!((e.breaches, e.refused, e.oom), (1, 0, 0), "{e:?}");
}
