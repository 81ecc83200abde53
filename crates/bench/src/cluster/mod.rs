//! `bulkhead-bench --mode cluster`: how the control plane scales, measured without the two
//! cores of this machine being the limit. Three real nodes on one 2-core machine share its
//! CPU; [fake nodes](fake_node) do not: a start is a 50 ms sleep, and each node takes at most
//! 3 starts at once (E2B's node admission), refusing one more for capacity. The engine runs in
//! this process over a `ClusterNode` of such nodes and a real store (SQLite in a temporary
//! directory, or PostgreSQL with `--database-url`), and every create goes through
//! `Engine::create`: placement, the router, the store, `/init` of the fake agent.
//!
//! One run, in order:
//! 1. **throughput**, for a cluster of 1 node and then of `--nodes` (3): open-loop creates
//!    (Poisson arrivals at `--rate`, above what one node absorbs, for `--seconds`), each
//!    sandbox killed once created (so every node stays at the same load throughout, and the
//!    kill's work is part of the load the API carries). Creates per second achieved and their
//!    ratio; create latency; the time spent inside the node's calls for each create (timed in
//!    the fake node, by request id); and the API's own overhead, latency minus that. A create
//!    refused because every node was starting 3 already is E2B's 503: counted, not an error
//!    of the benchmark.
//! 2. **placement**, on a fresh cluster of `--nodes` equal nodes: `--spread` (300) creates held
//!    (as many at once as all nodes but one can start, so some node's admission always has
//!    room), sandboxes per node; then creates with one node draining (it must get none), and
//!    with one node full, refusing every start (creates land elsewhere, no client sees an
//!    error).

mod fake_node;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bulkhead_engine::cluster::placement::{NodeStatus, PlacementConfig};
use bulkhead_engine::cluster::{ClusterNode, StaticDirectory, StaticMember};
use bulkhead_engine::driver::DriverError;
use bulkhead_engine::testing::base_template;
use bulkhead_engine::{
    AdmissionLimits, Caller, CreateRequest, Engine, EngineConfig, EngineError, PoolConfig,
};
use bulkhead_store::Store;
use futures::StreamExt;
use rand::Rng;

use crate::stats::Stats;
use fake_node::FakeNode;

/// Targets of issue 25 ("Outgrow one machine").
const TARGET_RATIO: f64 = 2.7;
const TARGET_OVERHEAD_P99_MS: f64 = 10.0;
const TARGET_SPREAD: f64 = 1.25;

/// What one run does.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Nodes of the large cluster (the small one has 1).
    pub(crate) nodes: usize,
    /// How long a fake start takes (asleep).
    pub(crate) start: Duration,
    /// Starts a node runs at once; one more is refused.
    pub(crate) max_starting: u32,
    /// Offered creates per second (Poisson arrivals).
    pub(crate) rate: f64,
    /// How long creates arrive, per cluster size.
    pub(crate) duration: Duration,
    /// Creates held on the equal nodes.
    pub(crate) spread: usize,
    /// Creates with one node draining, and again with one node full.
    pub(crate) probes: usize,
    /// PostgreSQL instead of SQLite in a temporary directory.
    pub(crate) database_url: Option<String>,
}

/// Creates through a cluster of `nodes` at an offered rate.
pub(crate) struct Throughput {
    pub(crate) nodes: usize,
    pub(crate) window: Duration,
    pub(crate) offered: usize,
    pub(crate) refused: usize,
    /// Creates that failed otherwise (or whose kill failed), and the first error.
    pub(crate) failed: usize,
    pub(crate) first_error: Option<String>,
    pub(crate) latency: Stats,
    pub(crate) node_time: Stats,
    pub(crate) overhead: Stats,
    pub(crate) refusal_latency: Stats,
}

impl Throughput {
    pub(crate) fn created(&self) -> usize {
        self.latency.samples.len()
    }

    /// Creates per second of arrivals.
    pub(crate) fn rate(&self) -> f64 {
        self.created() as f64 / self.window.as_secs_f64()
    }
}

/// Where a batch of creates landed.
pub(crate) struct Placement {
    pub(crate) what: String,
    pub(crate) per_node: BTreeMap<String, usize>,
    pub(crate) errors: usize,
    pub(crate) first_error: Option<String>,
}

impl Placement {
    fn on(&self, node: &str) -> usize {
        self.per_node.get(node).copied().unwrap_or(0)
    }

    fn describe(&self) -> String {
        let per: Vec<String> = self
            .per_node
            .iter()
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        format!(
            "{}: {}; client errors {}",
            self.what,
            per.join(", "),
            self.errors
        )
    }
}

pub(crate) struct Report {
    pub(crate) one: Throughput,
    pub(crate) many: Throughput,
    pub(crate) spread: Placement,
    pub(crate) draining: Placement,
    pub(crate) full: Placement,
}

/// One target and whether the run met it.
pub(crate) struct Check {
    pub(crate) what: String,
    pub(crate) pass: bool,
}

impl Report {
    pub(crate) fn ratio(&self) -> f64 {
        self.many.rate() / self.one.rate()
    }

    /// max/min sandboxes per node of the held creates (infinite when a node got none).
    pub(crate) fn spread_ratio(&self, nodes: usize) -> f64 {
        let counts: Vec<usize> = (1..=nodes).map(|i| self.spread.on(&node_id(i))).collect();
        let max = counts.iter().copied().max().unwrap_or(0);
        let min = counts.iter().copied().min().unwrap_or(0);
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        }
    }

    pub(crate) fn checks(&self, nodes: usize) -> Vec<Check> {
        let p99 = |t: &Throughput| t.overhead.pct(99.0);
        let overhead = p99(&self.one).max(p99(&self.many));
        let clean = |t: &Throughput| t.failed == 0;
        vec![
            Check {
                what: format!(
                    "create rate, {nodes} nodes ÷ 1 node = ×{:.2} (target ≥ {TARGET_RATIO})",
                    self.ratio()
                ),
                pass: self.ratio() >= TARGET_RATIO,
            },
            Check {
                what: format!(
                    "API overhead p99 = {overhead:.2} ms, the larger of the two clusters' \
                     (target ≤ {TARGET_OVERHEAD_P99_MS} ms)"
                ),
                // NaN (no create) fails.
                pass: overhead <= TARGET_OVERHEAD_P99_MS,
            },
            Check {
                what: format!(
                    "creates failed other than by a 503: {} (target 0)",
                    self.one.failed + self.many.failed
                ),
                pass: clean(&self.one) && clean(&self.many),
            },
            Check {
                what: format!(
                    "spread of {} held creates: max/min = {:.2} (target ≤ {TARGET_SPREAD})",
                    self.spread.per_node.values().sum::<usize>(),
                    self.spread_ratio(nodes)
                ),
                pass: self.spread_ratio(nodes) <= TARGET_SPREAD && self.spread.errors == 0,
            },
            Check {
                what: format!(
                    "draining {} gets {} (target 0), client errors {}",
                    node_id(2),
                    self.draining.on(&node_id(2)),
                    self.draining.errors
                ),
                pass: self.draining.on(&node_id(2)) == 0
                    && self.draining.errors == 0
                    && self.draining.per_node.values().sum::<usize>() > 0,
            },
            Check {
                what: format!(
                    "full {} gets {} (target 0), client errors {} (target 0)",
                    node_id(1),
                    self.full.on(&node_id(1)),
                    self.full.errors
                ),
                pass: self.full.on(&node_id(1)) == 0
                    && self.full.errors == 0
                    && self.full.per_node.values().sum::<usize>() > 0,
            },
        ]
    }
}

/// The id of the `i`th node (from 1).
fn node_id(i: usize) -> String {
    format!("n{i}")
}

/// An engine over a cluster of fake nodes, as `bulkhead api` runs one over its nodes.
struct Cluster {
    engine: Arc<Engine>,
    owner: Caller,
    directory: Arc<StaticDirectory>,
    nodes: Vec<(String, Arc<FakeNode>)>,
}

impl Cluster {
    async fn new(
        store: &Store,
        owner: &Caller,
        cfg: &Config,
        n: usize,
        scratch: &std::path::Path,
    ) -> anyhow::Result<Cluster> {
        let mut nodes = Vec::new();
        let mut members = Vec::new();
        for i in 1..=n {
            let node = FakeNode::new(cfg.start, cfg.max_starting);
            // Room for every sandbox the run holds: the node's admission is the limit, not
            // placement's promised CPU and memory.
            members.push(StaticMember::new(node_id(i), node.clone(), 4096.0, 1 << 30));
            nodes.push((node_id(i), node));
        }
        let directory = Arc::new(StaticDirectory::new(members));
        let router = ClusterNode::new(directory.clone(), PlacementConfig::default()).await;
        let engine_cfg = EngineConfig {
            // Every create is a cold start on a node: no warm pools.
            pools: PoolConfig::fixed(0),
            // Not the bottleneck: every create is let through to placement at once (a queue
            // here would count as the API's overhead).
            admission: AdmissionLimits {
                max_concurrent: 100_000,
                max_queued: 0,
            },
            max_sandboxes: 1_000_000,
            checkpoint_dir: scratch.join(format!("checkpoints-{n}")),
            ..Default::default()
        };
        let engine = Engine::with_node(store.clone(), router.clone(), router, engine_cfg);
        engine
            .register_template(base_template())
            .await
            .context("register the fake template")?;
        Ok(Cluster {
            engine,
            owner: owner.clone(),
            directory,
            nodes,
        })
    }

    /// The time the nodes spent on request `id`.
    fn node_time(&self, id: &str) -> Duration {
        self.nodes.iter().map(|(_, n)| n.take_spent(id)).sum()
    }
}

fn request() -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        timeout: Some(3600),
        ..Default::default()
    }
}

/// E2B's 503: no node had room.
fn is_no_capacity(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::Driver {
            source: DriverError::NoCapacity { .. },
            ..
        }
    )
}

enum Outcome {
    Created { latency: Duration, node: Duration },
    Refused(Duration),
    Failed(String),
}

/// One create (under its own request id, so the nodes' stopwatches know it) and, when it
/// worked, its kill (not timed).
async fn create_and_kill(c: Arc<Cluster>, rid: String) -> Outcome {
    let t0 = Instant::now();
    let r =
        bulkhead_common::request_id::scope(rid.clone(), c.engine.create(&c.owner, request())).await;
    let latency = t0.elapsed();
    let node = c.node_time(&rid);
    match r {
        Ok(info) => match c.engine.kill(&c.owner, &info.id).await {
            Ok(_) => Outcome::Created { latency, node },
            Err(e) => Outcome::Failed(format!("kill: {e}")),
        },
        Err(e) if is_no_capacity(&e) => Outcome::Refused(latency),
        Err(e) => Outcome::Failed(format!("create: {e}")),
    }
}

/// Poisson arrival times (offsets from the start) at `rate` per second within `window`.
fn arrivals(rate: f64, window: Duration) -> Vec<Duration> {
    let mut rng = rand::rng();
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        // Exponential gaps; 1 - u is in (0, 1].
        let u: f64 = rng.random();
        t += -(1.0 - u).ln() / rate;
        if t >= window.as_secs_f64() {
            return out;
        }
        out.push(Duration::from_secs_f64(t));
    }
}

/// Send a create at each time of `schedule` (open loop: whatever the earlier ones are doing)
/// and wait for them all.
async fn drive(
    c: &Arc<Cluster>,
    schedule: Vec<Duration>,
    tag: &str,
) -> anyhow::Result<Vec<Outcome>> {
    let t0 = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(schedule.len());
    for (i, at) in schedule.into_iter().enumerate() {
        tokio::time::sleep_until(t0 + at).await;
        tasks.push(tokio::spawn(create_and_kill(
            c.clone(),
            format!("{tag}-{i}"),
        )));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await.context("a create task panicked")?);
    }
    Ok(outcomes)
}

async fn throughput(
    store: &Store,
    owner: &Caller,
    cfg: &Config,
    n: usize,
    scratch: &std::path::Path,
) -> anyhow::Result<Throughput> {
    let c = Arc::new(Cluster::new(store, owner, cfg, n, scratch).await?);
    // Warm-up at the same rate, not measured: the store's connections opened, the first
    // statements of each kind prepared, the first fake agents served.
    let warm_up = arrivals(cfg.rate, (cfg.duration / 5).min(Duration::from_secs(1)));
    for o in drive(&c, warm_up, &format!("warmup-{n}")).await? {
        if let Outcome::Failed(e) = o {
            anyhow::bail!("a warm-up create on {n} node(s) failed: {e}");
        }
    }
    let schedule = arrivals(cfg.rate, cfg.duration);
    let offered = schedule.len();
    let outcomes = drive(&c, schedule, &format!("bench-{n}")).await?;
    let stats = |what: &str| Stats {
        name: format!("{what} ({n} node{})", if n == 1 { "" } else { "s" }),
        samples: Vec::new(),
    };
    let mut t = Throughput {
        nodes: n,
        window: cfg.duration,
        offered,
        refused: 0,
        failed: 0,
        first_error: None,
        latency: stats("create latency"),
        node_time: stats("  inside the node's calls"),
        overhead: stats("  API overhead (latency − node)"),
        refusal_latency: stats("503 answered in"),
    };
    for o in outcomes {
        match o {
            Outcome::Created { latency, node } => {
                t.latency.samples.push(latency);
                t.node_time.samples.push(node);
                t.overhead.samples.push(latency.saturating_sub(node));
            }
            Outcome::Refused(latency) => {
                t.refused += 1;
                t.refusal_latency.samples.push(latency);
            }
            Outcome::Failed(e) => {
                t.failed += 1;
                t.first_error.get_or_insert(e);
            }
        }
    }
    Ok(t)
}

/// `count` creates, held; where each landed. As many at once as the nodes but one can start
/// (2 per node with the defaults), so that with one node draining or full the others' admission
/// always has room: a client error then is placement's, not a full cluster's 503.
async fn place(c: &Cluster, max_starting: u32, what: String, count: usize) -> Placement {
    let at_once = ((c.nodes.len() - 1) * max_starting as usize).max(1);
    let results: Vec<Result<Option<String>, EngineError>> = futures::stream::iter(0..count)
        .map(|_| async {
            let info = c.engine.create(&c.owner, request()).await?;
            Ok(info.node)
        })
        .buffer_unordered(at_once)
        .collect()
        .await;
    let mut p = Placement {
        what,
        per_node: c.nodes.iter().map(|(id, _)| (id.clone(), 0)).collect(),
        errors: 0,
        first_error: None,
    };
    for r in results {
        match r {
            Ok(node) => {
                *p.per_node
                    .entry(node.unwrap_or_else(|| "(none)".into()))
                    .or_insert(0) += 1;
            }
            Err(e) => {
                p.errors += 1;
                p.first_error.get_or_insert(e.to_string());
            }
        }
    }
    p
}

async fn placement(
    store: &Store,
    owner: &Caller,
    cfg: &Config,
    scratch: &std::path::Path,
) -> anyhow::Result<(Placement, Placement, Placement)> {
    let c = Cluster::new(store, owner, cfg, cfg.nodes, scratch).await?;
    let spread = place(
        &c,
        cfg.max_starting,
        format!("{} creates held on {} equal nodes", cfg.spread, cfg.nodes),
        cfg.spread,
    )
    .await;

    let draining = node_id(2);
    c.directory.set_status(&draining, NodeStatus::Draining);
    let draining = place(
        &c,
        cfg.max_starting,
        format!("{} more with {draining} draining", cfg.probes),
        cfg.probes,
    )
    .await;
    c.directory.set_status(&node_id(2), NodeStatus::Ready);

    let (full_id, full_node) = &c.nodes[0];
    full_node.set_full(true);
    let refused_before = full_node.refused.load(std::sync::atomic::Ordering::Relaxed);
    let mut full = place(
        &c,
        cfg.max_starting,
        format!("{} more with {full_id} full", cfg.probes),
        cfg.probes,
    )
    .await;
    let refusals = full_node.refused.load(std::sync::atomic::Ordering::Relaxed) - refused_before;
    full.what
        .push_str(&format!(" ({refusals} of its refusals moved elsewhere)"));
    full_node.set_full(false);
    Ok((spread, draining, full))
}

/// Everything, in one process.
pub(crate) async fn measure(cfg: &Config) -> anyhow::Result<Report> {
    anyhow::ensure!(cfg.nodes >= 2, "--nodes must be at least 2");
    anyhow::ensure!(cfg.rate > 0.0, "--rate must be positive");
    let scratch = tempfile::tempdir().context("make a temporary directory")?;
    let store = match &cfg.database_url {
        Some(url) => Store::open(url).await?,
        None => Store::open_sqlite_in(scratch.path()).await?,
    };
    let owner = bulkhead_engine::testing::owner(&store).await;
    let one = throughput(&store, &owner, cfg, 1, scratch.path()).await?;
    let many = throughput(&store, &owner, cfg, cfg.nodes, scratch.path()).await?;
    let (spread, draining, full) = placement(&store, &owner, cfg, scratch.path()).await?;
    Ok(Report {
        one,
        many,
        spread,
        draining,
        full,
    })
}

fn throughput_rows(t: &Throughput) -> String {
    let mut rows = vec![format!(
        "{} node{}: offered {} ({:.1}/s), created {} ({:.1}/s), refused with 503 {}, failed {}{}",
        t.nodes,
        if t.nodes == 1 { "" } else { "s" },
        t.offered,
        t.offered as f64 / t.window.as_secs_f64(),
        t.created(),
        t.rate(),
        t.refused,
        t.failed,
        t.first_error
            .as_deref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    )];
    rows.push(t.latency.row(None));
    rows.push(t.node_time.row(None));
    rows.push(t.overhead.row(None));
    if !t.refusal_latency.samples.is_empty() {
        rows.push(t.refusal_latency.row(None));
    }
    rows.join("\n")
}

/// Run it and print the figures and a PASS or FAIL per target; with `check`, a FAIL exits
/// non-zero.
pub(crate) async fn run(cfg: Config, check: bool) -> anyhow::Result<std::process::ExitCode> {
    println!(
        "bulkhead bench cluster: fake nodes ({} ms start, {} concurrent starts per node), \
         open-loop Poisson creates at {}/s for {} s on 1 and on {} nodes, each killed once \
         created; store: {}; {} build",
        cfg.start.as_millis(),
        cfg.max_starting,
        cfg.rate,
        cfg.duration.as_secs_f64(),
        cfg.nodes,
        if cfg.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite (temporary directory)"
        },
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    );
    let report = measure(&cfg).await?;
    println!("{}", throughput_rows(&report.one));
    println!("{}", throughput_rows(&report.many));
    for p in [&report.spread, &report.draining, &report.full] {
        println!("placement: {}", p.describe());
        if let Some(e) = &p.first_error {
            println!("  first error: {e}");
        }
    }
    let checks = report.checks(cfg.nodes);
    for c in &checks {
        println!("{} {}", if c.pass { "PASS" } else { "FAIL" }, c.what);
    }
    let failed = checks.iter().filter(|c| !c.pass).count();
    Ok(if check && failed > 0 {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    })
}
