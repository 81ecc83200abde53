use std::time::Duration;

use bulkhead_engine::Node;
use bulkhead_engine::driver::{DriverError, StartError};
use bulkhead_engine::testing::base_template;

use super::fake_node::FakeNode;
use super::{Config, measure};

fn is_refusal(r: &Result<bulkhead_engine::driver::DriverHandle, DriverError>) -> bool {
    matches!(
        r,
        Err(DriverError::Start(StartError::NoFreeSlot { max: 3 }))
    )
}

#[tokio::test]
async fn a_fake_node_admits_three_starts_at_once_and_times_its_calls() {
    let node = FakeNode::new(Duration::from_millis(300), 3);
    let spec = base_template().spec();
    let starts: Vec<_> = (0..3)
        .map(|i| {
            let (node, spec) = (node.clone(), spec.clone());
            tokio::spawn(bulkhead_common::request_id::scope(
                format!("r{i}"),
                async move { node.start(&spec, false).await },
            ))
        })
        .collect();
    // The three are asleep in their start: a fourth is refused at once, for capacity.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = std::time::Instant::now();
    assert!(is_refusal(&node.start(&spec, false).await));
    assert!(t0.elapsed() < Duration::from_millis(100), "refused at once");
    for s in starts {
        s.await.unwrap().expect("the first three start");
    }
    assert_eq!(node.started.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(node.refused.load(std::sync::atomic::Ordering::SeqCst), 1);
    let spent = node.take_spent("r0");
    assert!(
        spent >= Duration::from_millis(300) && spent < Duration::from_secs(2),
        "{spent:?}"
    );
    assert_eq!(node.take_spent("r0"), Duration::ZERO, "forgotten once read");

    // Slots come back when starts end; a full node refuses every start.
    node.start(&spec, false).await.expect("room again");
    node.set_full(true);
    assert!(is_refusal(&node.start(&spec, false).await));
    node.set_full(false);
}

/// The whole benchmark at a small scale (slower starts, 2 at once per node, 1.5 s per cluster
/// size): 3 nodes must take well over twice what 1 takes, placement must spread and avoid
/// draining and full nodes. The thresholds on the rate and the overhead are looser than the
/// benchmark's own targets: this runs in a debug build beside other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_benchmark_scales_and_places_at_a_small_scale() {
    let cfg = Config {
        nodes: 3,
        start: Duration::from_millis(100),
        max_starting: 2,
        rate: 120.0,
        duration: Duration::from_millis(1500),
        spread: 60,
        probes: 15,
        database_url: None,
    };
    let report = measure(&cfg).await.expect("the benchmark runs");
    for t in [&report.one, &report.many] {
        println!(
            "{} node(s): offered {}, created {} ({:.1}/s), refused {}, failed {} {:?}",
            t.nodes,
            t.offered,
            t.created(),
            t.rate(),
            t.refused,
            t.failed,
            t.first_error
        );
        println!("{}", t.overhead.row(None));
    }
    let checks = report.checks(cfg.nodes);
    for c in &checks {
        println!("{} {}", if c.pass { "PASS" } else { "FAIL" }, c.what);
    }
    assert!(report.ratio() >= 2.0, "×{:.2}", report.ratio());
    // A node takes at most 2 starts of 100 ms at once: 20/s.
    assert!(report.one.rate() <= 25.0, "{:.1}/s", report.one.rate());
    let p99 = report.many.overhead.pct(99.0);
    assert!(p99 <= 50.0, "API overhead p99 {p99:.2} ms");
    // Failures, spread, draining and full: the benchmark's own targets.
    for c in &checks[2..] {
        assert!(c.pass, "{}", c.what);
    }
}
