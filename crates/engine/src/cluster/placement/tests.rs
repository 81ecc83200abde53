use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;

fn node(id: &str) -> NodeLoad {
    NodeLoad {
        id: id.to_string(),
        status: NodeStatus::Ready,
        cpus: 16.0,
        memory_mib: 32 * 1024,
        cpu_allocated: 0.0,
        memory_allocated_mib: 0,
        cpu_in_flight: 0.0,
        memory_in_flight_mib: 0,
        cpu_used: 0.0,
        warm: BTreeMap::new(),
        cached: BTreeSet::new(),
        checkpoint_key: Some("k1".into()),
    }
}

fn req() -> Request {
    Request {
        template: "base".into(),
        cpus: 2.0,
        memory_mib: 512,
        checkpoint_key: None,
        preferred: None,
    }
}

/// Places `n` requests one after another, counting each on its node as the caller would until
/// the next report; returns placements per node.
fn place_many(nodes: &mut [NodeLoad], n: usize, seed: u64) -> BTreeMap<String, usize> {
    let cfg = PlacementConfig::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts = BTreeMap::new();
    let r = req();
    for _ in 0..n {
        let id = Placer::new(&cfg, nodes, &r)
            .next(&mut rng)
            .expect("room")
            .id
            .clone();
        nodes.iter_mut().find(|x| x.id == id).unwrap().reserve(&r);
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

#[test]
fn equal_nodes_share_the_load_evenly() {
    for seed in 0..20 {
        let mut nodes = vec![node("a"), node("b"), node("c")];
        let counts = place_many(&mut nodes, 90, seed);
        let (max, min) = (
            *counts.values().max().unwrap(),
            *counts.values().min().unwrap(),
        );
        assert_eq!(counts.values().sum::<usize>(), 90);
        // The bar for 300 creates on 3 nodes is max/min <= 1.25.
        assert!(max as f64 / min as f64 <= 1.25, "seed {seed}: {counts:?}");
    }
}

#[test]
fn only_ready_nodes_take_sandboxes() {
    let mut nodes = vec![node("a"), node("b"), node("c"), node("d")];
    nodes[1].status = NodeStatus::Draining;
    nodes[2].status = NodeStatus::Suspect;
    nodes[3].status = NodeStatus::Dead;
    let counts = place_many(&mut nodes, 20, 7);
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn a_warm_or_cached_template_pulls_placements_while_it_lasts() {
    let cfg = PlacementConfig::default();
    let r = req();
    let mut warm = node("warm");
    warm.cpu_allocated = 8.0; // busier than the others, still preferred while warm
    warm.warm.insert("base".into(), 1);
    let nodes = [node("a"), warm.clone(), node("c")];
    assert!(
        nodes[1].score(&r, &cfg).unwrap() < nodes[0].score(&r, &cfg).unwrap(),
        "the warm node scores better"
    );
    // With K covering every node, the warm one is chosen.
    let all = PlacementConfig {
        k: 3,
        ..cfg.clone()
    };
    let mut rng = StdRng::seed_from_u64(1);
    assert_eq!(
        Placer::new(&all, &nodes, &r).next(&mut rng).unwrap().id,
        "warm"
    );
    // Once its stock is counted out, load decides again.
    let mut taken = warm;
    taken.reserve(&r);
    let nodes = [node("a"), taken, node("c")];
    assert_ne!(
        Placer::new(&all, &nodes, &r).next(&mut rng).unwrap().id,
        "warm"
    );
    // A cached tree is a smaller bonus than a warm member.
    let mut cached = node("cached");
    cached.cached.insert("base".into());
    let mut warm = node("warm");
    warm.warm.insert("base".into(), 3);
    assert!(warm.score(&r, &cfg).unwrap() < cached.score(&r, &cfg).unwrap());
    assert!(cached.score(&r, &cfg).unwrap() < node("cold").score(&r, &cfg).unwrap());
}

#[test]
fn a_node_without_room_is_never_sampled() {
    let cfg = PlacementConfig::default();
    let r = req();
    let mut full = node("full");
    full.cpu_allocated = full.cpus * cfg.cpu_overcommit - 1.0; // 1 vCPU left, 2 asked
    let mut low_mem = node("low-mem");
    low_mem.memory_allocated_mib = (low_mem.memory_mib as f64 * cfg.memory_overcommit) as u64;
    assert_eq!(full.score(&r, &cfg), None);
    assert_eq!(low_mem.score(&r, &cfg), None);
    let nodes = [full, low_mem, node("ok")];
    for seed in 0..10 {
        let mut rng = StdRng::seed_from_u64(seed);
        assert_eq!(
            Placer::new(&cfg, &nodes, &r).next(&mut rng).unwrap().id,
            "ok"
        );
    }
    let nodes = &nodes[..2];
    let mut rng = StdRng::seed_from_u64(0);
    assert_eq!(
        Placer::new(&cfg, nodes, &r).next(&mut rng).unwrap_err(),
        PlacementError::CapacityUnavailable
    );
}

#[test]
fn a_refusal_moves_on_without_counting_and_failures_give_up_after_three() {
    let cfg = PlacementConfig::default();
    let r = req();
    let nodes: Vec<_> = ["a", "b", "c", "d", "e"].into_iter().map(node).collect();
    let mut rng = StdRng::seed_from_u64(3);
    let mut placer = Placer::new(&cfg, &nodes, &r);
    let mut seen = HashSet::new();
    // Every node refuses: each is tried once, then nothing is left, as a capacity answer.
    for _ in 0..nodes.len() {
        let n = placer.next(&mut rng).unwrap();
        assert!(seen.insert(n.id.clone()), "{} tried twice", n.id);
        placer.refused();
    }
    assert_eq!(
        placer.next(&mut rng).unwrap_err(),
        PlacementError::CapacityUnavailable
    );
    // Failures count: the third ends the walk though nodes are left.
    let mut placer = Placer::new(&cfg, &nodes, &r);
    for _ in 0..3 {
        placer.next(&mut rng).unwrap();
        placer.failed();
    }
    assert_eq!(
        placer.next(&mut rng).unwrap_err(),
        PlacementError::CreateFailed { failures: 3 }
    );
}

/// A node failed and the only other is full: capacity is what stops the create (503, which
/// clients retry), not the failed node's error.
/// Idle nodes score alike: the tie goes to a random one, not always the first listed.
#[test]
fn a_tie_between_idle_nodes_is_broken_at_random() {
    let cfg = PlacementConfig::default();
    let r = req();
    let nodes = [node("a"), node("b")];
    let mut firsts = BTreeMap::new();
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let id = Placer::new(&cfg, &nodes, &r)
            .next(&mut rng)
            .unwrap()
            .id
            .clone();
        *firsts.entry(id).or_insert(0) += 1;
    }
    assert!(
        firsts.get("a").copied().unwrap_or(0) > 60 && firsts.get("b").copied().unwrap_or(0) > 60,
        "{firsts:?}"
    );
}

#[test]
fn a_failure_then_only_full_nodes_is_a_capacity_answer() {
    let cfg = PlacementConfig::default();
    let r = req();
    let mut full = node("full");
    full.cpu_allocated = full.cpus * cfg.cpu_overcommit;
    let nodes = [node("failing"), full];
    let mut rng = StdRng::seed_from_u64(1);
    let mut placer = Placer::new(&cfg, &nodes, &r);
    assert_eq!(placer.next(&mut rng).unwrap().id, "failing");
    placer.failed();
    assert_eq!(
        placer.next(&mut rng).unwrap_err(),
        PlacementError::CapacityUnavailable
    );
    // With no other node at all, the failure is the answer.
    let nodes = [node("failing")];
    let mut placer = Placer::new(&cfg, &nodes, &r);
    placer.next(&mut rng).unwrap();
    placer.failed();
    assert_eq!(
        placer.next(&mut rng).unwrap_err(),
        PlacementError::CreateFailed { failures: 1 }
    );
}

#[test]
fn a_resume_goes_to_its_node_first_and_only_where_the_checkpoint_fits() {
    let cfg = PlacementConfig::default();
    let mut r = req();
    r.checkpoint_key = Some("k1".into());
    r.preferred = Some("origin".into());
    let mut other_kernel = node("other-kernel");
    other_kernel.checkpoint_key = Some("k2".into());
    let mut origin = node("origin");
    origin.cpu_allocated = 40.0; // the busiest, still first: its disk has the state
    let nodes = [node("a"), other_kernel, origin];
    let mut rng = StdRng::seed_from_u64(5);
    let mut placer = Placer::new(&cfg, &nodes, &r);
    assert_eq!(placer.next(&mut rng).unwrap().id, "origin");
    placer.refused();
    assert_eq!(placer.next(&mut rng).unwrap().id, "a");
    placer.refused();
    assert_eq!(
        placer.next(&mut rng).unwrap_err(),
        PlacementError::CapacityUnavailable
    );
    // Nodes are ready but none matches the checkpoint.
    let nodes = [nodes[1].clone()];
    assert_eq!(
        Placer::new(&cfg, &nodes, &r).next(&mut rng).unwrap_err(),
        PlacementError::NoCompatibleNode
    );
}

#[test]
fn measured_use_counts_at_half_weight() {
    let cfg = PlacementConfig::default();
    let r = req();
    let idle = node("idle");
    let mut busy = node("busy");
    busy.cpu_used = 16.0;
    let (i, b) = (idle.score(&r, &cfg).unwrap(), busy.score(&r, &cfg).unwrap());
    let cap = 16.0 * cfg.cpu_overcommit;
    assert!((b - i - 0.5 * 16.0 / cap).abs() < 1e-9, "{i} {b}");
}
