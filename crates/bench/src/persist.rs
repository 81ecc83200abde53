//! `bulkhead-bench --mode persistence`: pause, resume (request → first command answered),
//! fork and create-from-snapshot through the HTTP API, for a `base` sandbox running a Python
//! process that holds ~50 MB and for a `code-interpreter-v1` sandbox after `import pandas`.
//! The baseline, measured in the same run, is a cold create→first command of the same
//! template. Host memory: MemAvailable (page cache dropped, so run it as root) before the
//! sandbox started, while it runs, and while it is paused (a paused sandbox should hold none).
//! Run the server with `--pool-size 0` so no warm-pool refill moves the memory figures.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;

use bulkhead_cli::client::{Client, SandboxRef, run_command};

use crate::stats::{Stats, create_and_run};

const HOLD_50MB: &str = "import time; x = bytearray(50 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nopen('/tmp/ready', 'w').close(); time.sleep(10**6)";
const INTERPRETER_PORT: u16 = 49999;

fn stats(name: &str) -> Stats {
    Stats {
        name: name.into(),
        samples: Vec::new(),
    }
}

/// (MemAvailable, AnonPages) in KiB with the page cache dropped first (as root) and two
/// seconds to settle, so a checkpoint's files in the cache do not blur what the sandbox itself
/// holds. AnonPages is the steadier figure: memory no cache drop can give back.
fn settled_mem_kib() -> (u64, u64) {
    let _ = std::process::Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    std::thread::sleep(Duration::from_secs(2));
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("MemAvailable:"), field("AnonPages:"))
}

fn sandbox_ref(v: &serde_json::Value) -> anyhow::Result<SandboxRef> {
    Ok(SandboxRef {
        id: v["sandboxID"]
            .as_str()
            .context("no sandboxID in the answer")?
            .to_string(),
        access_token: v["envdAccessToken"].as_str().map(str::to_owned),
    })
}

async fn create(client: &Client, template: &str) -> anyhow::Result<SandboxRef> {
    let (_, _, b) = client
        .api(
            http::Method::POST,
            "/v2/sandboxes",
            Some(serde_json::json!({ "templateID": template, "timeout": 3600 })),
        )
        .await?;
    sandbox_ref(&serde_json::from_slice(&b)?)
}

async fn sh(client: &Client, sb: &SandboxRef, script: &str) -> anyhow::Result<()> {
    let args = ["-c".to_string(), script.to_string()];
    let code = run_command(client, sb, "/bin/sh", &args, Some(60_000), |_, _| {}).await?;
    anyhow::ensure!(code == 0, "`{script}` exited with {code}");
    Ok(())
}

async fn kill(client: &Client, id: &str) -> anyhow::Result<()> {
    client
        .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await
        .map(drop)
}

/// Run code in the interpreter's default Python context and return its answer (NDJSON).
async fn run_code(client: &Client, sb: &SandboxRef, code: &str) -> anyhow::Result<String> {
    let b = client
        .port_post(
            sb,
            INTERPRETER_PORT,
            "/execute",
            &serde_json::json!({ "code": code }),
        )
        .await?;
    let text = String::from_utf8_lossy(&b).into_owned();
    anyhow::ensure!(
        !text.contains("\"type\":\"error\""),
        "run_code failed: {text}"
    );
    Ok(text)
}

/// The first interaction after a resume, by case.
#[derive(Clone, Copy)]
enum Probe {
    Command,
    Code,
}

async fn probe(client: &Client, sb: &SandboxRef, p: Probe) -> anyhow::Result<()> {
    match p {
        Probe::Command => sh(client, sb, "true").await,
        Probe::Code => run_code(client, sb, "int(df.x.sum())").await.map(drop),
    }
}

/// After resume `cycle`: the file written before the pause and the process (its memory, for
/// the interpreter) are still what they were; then the next cycle's values are set. Errors are
/// losses.
async fn verify_cycle(
    client: &Client,
    sb: &SandboxRef,
    p: Probe,
    cycle: usize,
) -> anyhow::Result<()> {
    match p {
        Probe::Command => {
            let script = format!(
                "test \"$(cat /home/user/cycle 2>/dev/null || echo 0)\" = {cycle} \
                 && test -e /tmp/ready && pgrep -f bytearray >/dev/null \
                 && echo {} > /home/user/cycle",
                cycle + 1
            );
            sh(client, sb, &script).await
        }
        Probe::Code => run_code(
            client,
            sb,
            &format!(
                "assert globals().get('cycle', 0) == {cycle} and int(df.x.sum()) == 499500\ncycle = {}",
                cycle + 1
            ),
        )
        .await
        .map(drop),
    }
}

struct Case {
    label: &'static str,
    template: &'static str,
    probe: Probe,
}

pub async fn run(client: &Client, n: usize) -> anyhow::Result<ExitCode> {
    println!("bulkhead bench --mode persistence: {n} pause/resume cycles per case");
    let cases = [
        Case {
            label: "base + python holding 50 MB",
            template: "base",
            probe: Probe::Command,
        },
        Case {
            label: "code-interpreter-v1 after import pandas",
            template: "code-interpreter-v1",
            probe: Probe::Code,
        },
    ];
    for case in cases {
        if let Err(e) = run_case(client, n, &case).await {
            println!("{}: failed: {e:#}", case.label);
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_case(client: &Client, n: usize, case: &Case) -> anyhow::Result<()> {
    println!("\n== {} ==", case.label);
    let mut cold = stats(&format!("cold create→first command ({})", case.template));
    for _ in 0..n.min(20) {
        let cmd = ["true".to_string()];
        let (d, id) = create_and_run(client, case.template, &cmd).await?;
        cold.samples.push(d);
        kill(client, &id).await?;
    }

    let mem_before = settled_mem_kib();
    let sb = create(client, case.template).await?;
    match case.probe {
        Probe::Command => {
            let script = format!(
                "nohup python3 -c \"{}\" >/dev/null 2>&1 & while [ ! -e /tmp/ready ]; do sleep 0.05; done",
                HOLD_50MB.replace('"', "\\\"")
            );
            sh(client, &sb, &script).await?;
        }
        Probe::Code => {
            run_code(
                client,
                &sb,
                "import pandas as pd\ndf = pd.DataFrame({'x': range(1000)})",
            )
            .await?;
        }
    }
    let mem_running = settled_mem_kib();

    let mut pause = stats("pause");
    let mut resume = stats("resume → first answer");
    let mut losses = Vec::new();
    verify_cycle(client, &sb, case.probe, 0).await?;
    for i in 1..=n {
        let t = Instant::now();
        client
            .api(
                http::Method::POST,
                &format!("/sandboxes/{}/pause", sb.id),
                Some(serde_json::json!({})),
            )
            .await?;
        pause.samples.push(t.elapsed());
        let t = Instant::now();
        client
            .api(
                http::Method::POST,
                &format!("/sandboxes/{}/connect", sb.id),
                Some(serde_json::json!({ "timeout": 3600 })),
            )
            .await?;
        probe(client, &sb, case.probe).await?;
        resume.samples.push(t.elapsed());
        if let Err(e) = verify_cycle(client, &sb, case.probe, i).await {
            losses.push(format!("cycle {i}: {e:#}"));
            break;
        }
    }

    let mut fork = stats("fork → first answer");
    for _ in 0..n.min(20) {
        let t = Instant::now();
        let (_, _, b) = client
            .api(
                http::Method::POST,
                &format!("/sandboxes/{}/fork", sb.id),
                Some(serde_json::json!({ "count": 1 })),
            )
            .await?;
        let v: serde_json::Value = serde_json::from_slice(&b)?;
        let child = sandbox_ref(&v[0]["sandbox"]).with_context(|| format!("fork answer {v}"))?;
        probe(client, &child, case.probe).await?;
        fork.samples.push(t.elapsed());
        kill(client, &child.id).await?;
    }

    let (_, _, b) = client
        .api(
            http::Method::POST,
            &format!("/sandboxes/{}/snapshots", sb.id),
            Some(serde_json::json!({})),
        )
        .await?;
    let snap: serde_json::Value = serde_json::from_slice(&b)?;
    let snapshot_id = snap["snapshotID"]
        .as_str()
        .context("no snapshotID in the answer")?
        .to_string();
    let mut from_snapshot = stats("create from snapshot → first answer");
    for _ in 0..n.min(20) {
        let t = Instant::now();
        let c = create(client, &snapshot_id).await?;
        probe(client, &c, case.probe).await?;
        from_snapshot.samples.push(t.elapsed());
        kill(client, &c.id).await?;
    }
    client
        .api(
            http::Method::DELETE,
            &format!("/templates/{snapshot_id}"),
            None,
        )
        .await?;
    // Paused once more: what does the host hold for it now?
    client
        .api(
            http::Method::POST,
            &format!("/sandboxes/{}/pause", sb.id),
            Some(serde_json::json!({})),
        )
        .await?;
    let mem_paused = settled_mem_kib();
    kill(client, &sb.id).await?;

    println!("{}", cold.row(None));
    for s in [&pause, &resume, &fork, &from_snapshot] {
        println!("{}", s.row(Some(&cold)));
    }
    // A loss: a file or the process's memory not what it was before the pause.
    println!(
        "pause/resume cycles checked (file written before the pause, process and its memory after): {}, losses: {}{}",
        resume.samples.len(),
        losses.len(),
        losses
            .first()
            .map(|l| format!(" (first: {l})"))
            .unwrap_or_default()
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let delta = |a: u64, b: u64| (a as f64 - b as f64) / 1024.0;
    println!(
        "host memory (page cache dropped): MemAvailable before {:.1} MiB, running {:+.1}, paused {:+.1}; \
         AnonPages before {:.1} MiB, running {:+.1}, paused {:+.1} (against before)",
        mib(mem_before.0),
        delta(mem_running.0, mem_before.0),
        delta(mem_paused.0, mem_before.0),
        mib(mem_before.1),
        delta(mem_running.1, mem_before.1),
        delta(mem_paused.1, mem_before.1),
    );
    anyhow::ensure!(losses.is_empty(), "a pause/resume cycle lost state");
    Ok(())
}
