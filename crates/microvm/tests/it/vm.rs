//! The microvm driver with the real agent: commands and files through `Driver::connect`,
//! sandboxes from the `base` template, boot time, and nothing left after a kill.

use std::time::{Duration, Instant};

use crate::common::{Env, call, run};
use bulkhead_driver::Driver;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel, "a Debian mirror or a cached `base`")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_sandbox_runs_commands_and_files_and_leaves_nothing() {
    let env = Env::new();
    let base = crate::common::base_tree().await;
    let d = env.driver();
    eprintln!("acceleration: {:?}", d.accel());
    let started = Instant::now();
    let h = d
        .start(&env.spec_for(&base, 512, 256))
        .await
        .expect("start from base");
    eprintln!(
        "start (boot to agent ready): {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // A command from the template, as the default user, in a VM with its own kernel.
    let (code, out, err) = run(
        &d,
        &h,
        "id -un; uname -r; cat /etc/debian_version; python3 -c 'print(6*7)'",
    )
    .await;
    assert_eq!(code, 0, "stderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "user", "{out}");
    assert_ne!(lines[1], uname_r(), "the guest runs its own kernel: {out}");
    assert!(lines[2].starts_with("12"), "{out}");
    assert_eq!(lines[3], "42", "{out}");

    // Write a file through the files API, read it back through a command and the API.
    let (status, body) = call(
        &d,
        &h,
        Request::post("/files?path=/home/user/hello.txt")
            .header("host", "sandbox")
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from_static(b"hello from the host\n")))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (code, out, _) = run(
        &d,
        &h,
        "cat /home/user/hello.txt; echo made in the guest > /tmp/g.txt",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hello from the host\n"));
    let (status, body) = call(
        &d,
        &h,
        Request::get("/files?path=/tmp/g.txt")
            .header("host", "sandbox")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"made in the guest\n"[..])
    );

    // The template image is shared and read-only: a second sandbox does not see the first's
    // writes.
    let h2 = d
        .start(&env.spec_for(&base, 256, 256))
        .await
        .expect("second sandbox");
    let (code, out, _) = run(&d, &h2, "cat /home/user/hello.txt 2>&1; echo $?").await;
    assert_eq!(code, 0);
    assert!(
        out.trim_end().ends_with('1'),
        "the second sandbox saw the first's file: {out}"
    );

    let u = d.usage(&h).await.expect("usage");
    eprintln!(
        "QEMU RSS with a 512 MiB guest after commands: {:.1} MiB",
        u.mem_used_bytes as f64 / 1048576.0
    );
    assert_eq!(u.mem_limit_bytes, 512 << 20);

    // Kill: the VM is gone and nothing of it is left on the host.
    d.stop(&h).await.expect("stop");
    d.stop(&h2).await.expect("stop");
    tokio::time::timeout(Duration::from_secs(10), d.wait(&h))
        .await
        .expect("dead");
    env.assert_clean();
}

fn uname_r() -> String {
    let out = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Boot time to agent-ready under this host's acceleration, and QEMU's memory per idle VM.
#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_time_and_idle_memory_are_reported() {
    let mut env = Env::new();
    // Boots from scratch (clones are measured by bench/microvm-clone-bench.py).
    env.cfg.snapshots = false;
    let d = env.driver();
    // The first start builds the images; measure the ones after.
    let h = d.start(&env.spec(256, 64)).await.expect("start");
    d.stop(&h).await.unwrap();
    let mut times = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let h = d.start(&env.spec(256, 64)).await.expect("start");
        times.push(t.elapsed());
        tokio::time::sleep(Duration::from_secs(2)).await;
        rss.push(d.usage(&h).await.unwrap().mem_used_bytes);
        d.stop(&h).await.unwrap();
    }
    times.sort();
    eprintln!(
        "boot to agent ready ({:?}): {:?}; idle QEMU RSS (256 MiB guest): {:?} MiB",
        d.accel().accel,
        times,
        rss.iter().map(|r| r / 1048576).collect::<Vec<_>>()
    );
    assert!(rss.iter().all(|&r| r > 0 && r < 256 << 20), "{rss:?}");
    env.assert_clean();
}
