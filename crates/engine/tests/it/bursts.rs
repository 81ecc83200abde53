//! Bursts of creates against a test double driver (no root): warm pools that grow with
//! demand, admission limits answering "too many creates", and creates whose caller went away.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bulkhead_engine::testing::{FakeDriver, FakeEngine, fake_engine};
use bulkhead_engine::{
    AdmissionLimits, Caller, CreateRequest, Engine, EngineConfig, EngineError, ListRequest,
    PoolConfig, PoolLimits,
};

struct Setup {
    _dir: tempfile::TempDir,
    driver: Arc<FakeDriver>,
    engine: Arc<Engine>,
    owner: Caller,
}

async fn setup(pools: PoolConfig, admission: AdmissionLimits) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        pools,
        admission,
        reap_interval: Duration::from_millis(20),
        ..Default::default()
    };
    let FakeEngine {
        driver,
        engine,
        owner,
        ..
    } = fake_engine(dir.path(), cfg, bulkhead_engine::testing::base_template()).await;
    Setup {
        _dir: dir,
        driver,
        engine,
        owner,
    }
}

fn base() -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        ..Default::default()
    }
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn running(s: &Setup) -> Vec<String> {
    s.engine
        .list_all(&s.owner, &ListRequest::default())
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect()
}

#[tokio::test]
async fn a_burst_grows_the_warm_pool_toward_its_size_within_the_max() {
    let mut pools = PoolConfig::fixed(0);
    pools
        .per_template
        .insert("base".into(), PoolLimits { min: 2, max: 20 });
    let s = setup(pools, AdmissionLimits::default()).await;
    s.engine.start_background();
    wait_for("the minimum pool", || s.engine.pool_len("base") == 2).await;

    let creates: Vec<_> = (0..12)
        .map(|_| {
            let (e, o) = (s.engine.clone(), s.owner.clone());
            tokio::spawn(async move { e.create(&o, base()).await })
        })
        .collect();
    for c in creates {
        c.await.unwrap().unwrap();
    }
    // 12 creates at once: the pool grows to 12 × 1.25 = 15 for the next burst.
    wait_for("the pool to grow", || s.engine.pool_len("base") == 15).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.engine.pool_len("base"), 15, "grew past its target");

    // A second, larger burst is capped by the max.
    let creates: Vec<_> = (0..40)
        .map(|_| {
            let (e, o) = (s.engine.clone(), s.owner.clone());
            tokio::spawn(async move { e.create(&o, base()).await })
        })
        .collect();
    for c in creates {
        c.await.unwrap().unwrap();
    }
    wait_for("the pool to reach its max", || {
        s.engine.pool_len("base") == 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.engine.pool_len("base"), 20, "grew past its max");

    for id in running(&s).await {
        s.engine.kill(&s.owner, &id).await.unwrap();
    }
    s.engine.shutdown().await;
    assert_eq!(
        s.driver.started.load(Ordering::SeqCst),
        s.driver.stopped.load(Ordering::SeqCst),
        "every sandbox and pool member stopped"
    );
}

#[tokio::test]
async fn creates_beyond_the_admission_limit_are_refused_and_the_rest_wait_their_turn() {
    let s = setup(
        PoolConfig::fixed(0),
        AdmissionLimits {
            max_concurrent: 2,
            max_queued: 3,
        },
    )
    .await;
    *s.driver.start_delay.lock().unwrap() = Duration::from_millis(300);
    let creates: Vec<_> = (0..8)
        .map(|_| {
            let (e, o) = (s.engine.clone(), s.owner.clone());
            tokio::spawn(async move { e.create(&o, base()).await })
        })
        .collect();
    let mut ok = 0;
    let mut refused = 0;
    for c in creates {
        match c.await.unwrap() {
            Ok(_) => ok += 1,
            Err(EngineError::TooManyCreates { limit: 5 }) => refused += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!((ok, refused), (5, 3), "2 running + 3 queued admitted");
    // The refused ones started nothing; the admitted ones are all recorded.
    assert_eq!(s.driver.started.load(Ordering::SeqCst), 5);
    assert_eq!(running(&s).await.len(), 5);
    // Places free up once creates end.
    *s.driver.start_delay.lock().unwrap() = Duration::ZERO;
    s.engine.create(&s.owner, base()).await.unwrap();
    for id in running(&s).await {
        s.engine.kill(&s.owner, &id).await.unwrap();
    }
}

#[tokio::test]
async fn a_create_whose_caller_went_away_is_recorded_not_leaked() {
    let s = setup(PoolConfig::fixed(0), AdmissionLimits::default()).await;
    *s.driver.start_delay.lock().unwrap() = Duration::from_millis(200);
    // The client disconnects mid-start: the server drops the request's future.
    let gone =
        tokio::time::timeout(Duration::from_millis(50), s.engine.create(&s.owner, base())).await;
    assert!(gone.is_err(), "the create finished before the caller left");
    wait_for("the started sandbox", || {
        s.driver.started.load(Ordering::SeqCst) == 1
    })
    .await;
    for _ in 0..100 {
        if !running(&s).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ids = running(&s).await;
    assert_eq!(
        ids.len(),
        1,
        "the sandbox started for the gone caller is recorded"
    );
    s.engine.kill(&s.owner, &ids[0]).await.unwrap();
    assert_eq!(s.driver.stopped.load(Ordering::SeqCst), 1);
}
