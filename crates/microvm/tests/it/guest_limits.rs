//! The sandbox's process limit inside the guest: every process the agent starts (root's too)
//! is in a cgroup whose `pids.max` is the sandbox's `pids_max`, while the agent stays outside
//! it, so a fork bomb hits the limit and the agent goes on answering. A clone gets its own
//! limit, not the template VM's.

use crate::common::{Env, run};
use bulkhead_driver::{Driver, DriverHandle};

/// A cgroup file read with shell builtins only (no fork: the cgroup may be full).
async fn cgroup_value<D: Driver>(d: &D, h: &DriverHandle, file: &str) -> String {
    let (code, out, err) = run(
        d,
        h,
        &format!("read v < /sys/fs/cgroup/sandbox/{file}; echo $v"),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    out.trim().to_owned()
}

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stops_at_pids_max_and_the_agent_survives_it() {
    let env = Env::new();
    let d = env.driver();
    let h = d.start(&env.spec(256, 64)).await.expect("start");
    assert_eq!(cgroup_value(&d, &h, "pids.max").await, "64");
    let (code, out, _) = run(&d, &h, "cat /proc/self/cgroup").await;
    assert_eq!((code, out.as_str()), (0, "0::/sandbox\n"));

    // Background sleeps until fork fails (dash gives up on the first failed fork); the
    // script's pid is its process group (the agent starts each process in its own session).
    let (_, out, err) = run(
        &d,
        &h,
        "echo $$; i=0; while [ $i -lt 500 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done",
    )
    .await;
    let pgid: u32 = out.trim().parse().unwrap_or_else(|_| panic!("{out} {err}"));
    assert!(err.contains("fork"), "every fork succeeded: {err}");
    let current: u64 = cgroup_value(&d, &h, "pids.current").await.parse().unwrap();
    assert!(
        (60..=66).contains(&current),
        "pids.current {current} with pids.max 64"
    );
    // The agent still starts processes (they join the full cgroup: migration is not limited)
    // and answers.
    let (code, out, _) = run(&d, &h, "echo alive").await;
    assert_eq!((code, out.as_str()), (0, "alive\n"));

    let (code, _, err) = run(&d, &h, &format!("kill -9 -{pgid}")).await;
    assert_eq!(code, 0, "{err}");
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = cgroup_value(&d, &h, "pids.current").await.parse().unwrap();
        if left <= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(left <= 2, "{left} processes left after the kill");
    let (code, out, _) = run(&d, &h, "cat /etc/template-marker | cat").await;
    assert_eq!((code, out.as_str()), (0, "from the template\n"));

    // Another clone of the same snapshot with a different limit gets its own.
    let h2 = d
        .start(&env.spec(256, 48))
        .await
        .expect("start a second clone");
    assert!(h2.data.get("snapshot").and_then(|s| s.as_str()).is_some());
    assert_eq!(cgroup_value(&d, &h2, "pids.max").await, "48");
    for h in [&h, &h2] {
        d.stop(h).await.expect("stop");
    }
    env.assert_clean();
}
