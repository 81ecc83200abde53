//! The launcher zygote and warm-start CPU weights, with real sandboxes as root. Other tests'
//! drivers start zygotes in this process too: this one tags its launcher command line and counts
//! and kills only the zygotes that carry its tag.

use std::fs;
use std::time::{Duration, Instant};

use crate::common::{Env, ask};
use bulkhead_driver::Driver;
use bulkhead_testkit::requires;

/// Children of this process whose command line has `--zygote` and `tag`.
fn zygotes(tag: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| parent_of(*p) == Some(me))
        .filter(|p| {
            fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let mut args = c.split(|b| *b == 0);
                args.clone().any(|a| a == b"--zygote") && args.any(|a| a == tag.as_bytes())
            })
        })
        .collect()
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The CPU weight file of a sandbox's cgroup and its value.
fn cpu_weight(env: &Env, h: &bulkhead_driver::DriverHandle) -> String {
    let name = h.data["cgroup"].as_str().unwrap().to_string();
    for d in env.cgroups().dirs(&name) {
        for f in ["cpu.shares", "cpu.weight"] {
            if let Ok(v) = fs::read_to_string(d.join(f)) {
                return format!("{f}={}", v.trim());
            }
        }
    }
    panic!("no CPU weight for cgroup {name}");
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_go_through_a_zygote_that_is_replaced_when_it_dies() {
    let mut env = Env::new();
    // The launcher ignores arguments it does not know; this one names our zygotes.
    let tag = format!("--test-tag={}", env.path().display());
    env.cfg.launcher.push(tag.clone().into());
    let d = env.driver();
    let spec = env.spec(256, 128);
    // A warm start runs at the smallest CPU weight until it is claimed.
    let a = d.start_warm(&spec).await.expect("warm start");
    assert!(
        ["cpu.shares=2", "cpu.weight=1"].contains(&cpu_weight(&env, &a).as_str()),
        "{}",
        cpu_weight(&env, &a)
    );
    d.claimed(&a).await.expect("claim");
    assert!(
        ["cpu.shares=1024", "cpu.weight=100"].contains(&cpu_weight(&env, &a).as_str()),
        "{}",
        cpu_weight(&env, &a)
    );
    assert_eq!(ask(&d, &a, "ping").await, "pong");
    // The init was re-parented to us (the subreaper), not left with the zygote.
    let me = std::process::id() as i32;
    assert_eq!(parent_of(a.pid), Some(me));
    let first = zygotes(&tag);
    assert_eq!(first.len(), 1, "one zygote serves the driver: {first:?}");

    // SAFETY: killing the zygote this test's driver started.
    unsafe { libc::kill(first[0], libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while zygotes(&tag).contains(&first[0]) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = d.start(&spec).await.expect("start after the zygote died");
    assert_eq!(ask(&d, &b, "ping").await, "pong");
    assert_eq!(parent_of(b.pid), Some(me));
    assert!(
        ["cpu.shares=1024", "cpu.weight=100"].contains(&cpu_weight(&env, &b).as_str()),
        "a plain start has the normal weight: {}",
        cpu_weight(&env, &b)
    );
    let second = zygotes(&tag);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first, "a new zygote");
    d.stop(&a).await.unwrap();
    d.stop(&b).await.unwrap();
}
