//! The agent as the init process of a fresh pid namespace.

use bulkhead_envd::process::{ProcessConfig, StartRequest};

use crate::harness::Agent;
use crate::process::collect;

/// Fails the test when `unshare --pid` cannot run here (it needs root, checked before).
fn require_unshare() {
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc", "true"])
        .output();
    let problem = match out {
        Ok(o) if o.status.success() => return,
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
        Err(e) => e.to_string(),
    };
    bulkhead_testkit::missing(
        "`unshare --pid` (to run the agent as pid 1)",
        &problem,
        "install util-linux and allow PID namespaces",
    );
}

#[bulkhead_testkit::requires(Root, "`unshare --pid`")]
#[tokio::test]
async fn as_pid_1_it_reaps_orphans() {
    require_unshare();
    let agent = Agent::start_with(
        Some(&["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]),
        &[],
    )
    .await;
    // `sh` exits at once, orphaning `sleep`, which is re-parented to pid 1 and must be reaped
    // when it exits rather than linger as a zombie.
    let script = "sh -c 'sleep 0.2 & sleep 0.2 &'; sleep 1.2; ps -eo pid=,stat=,comm=";
    let request = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-c".into(), script.into()],
            ..ProcessConfig::default()
        }),
        stdin: Some(false),
        ..StartRequest::default()
    };
    let c = collect(agent.stream("/process.Process/Start", &request, &[]).await).await;
    assert_eq!(c.end.as_ref().unwrap().exit_code, 0, "stderr: {}", c.stderr);
    let table: Vec<Vec<&str>> = c
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let init = table
        .iter()
        .find(|row| row[0] == "1")
        .expect("pid 1 is listed");
    assert_eq!(init[2], "bulkhead-agent");
    let zombies: Vec<_> = table.iter().filter(|row| row[1].starts_with('Z')).collect();
    assert!(
        zombies.is_empty(),
        "zombies were left: {zombies:?}\n{}",
        c.stdout
    );
    assert!(!table.iter().any(|row| row[2] == "sleep"), "{}", c.stdout);
}
