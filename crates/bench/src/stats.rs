//! What both benchmark modes share: latency samples with percentiles and ratios against a
//! baseline, and one create→first command through the HTTP API.

use std::time::{Duration, Instant};

use anyhow::Context;

use bulkhead_cli::client::{Client, SandboxRef, run_command};

pub(crate) struct Stats {
    pub(crate) name: String,
    pub(crate) samples: Vec<Duration>,
}

impl Stats {
    pub(crate) fn pct(&self, p: f64) -> f64 {
        let mut v: Vec<f64> = self.samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return f64::NAN;
        }
        let idx = ((p / 100.0) * (v.len() as f64 - 1.0)).round() as usize;
        v[idx.min(v.len() - 1)]
    }
    pub(crate) fn row(&self, base: Option<&Stats>) -> String {
        let mut s = format!(
            "{:<44} n={:<4} p50={:>8.2}ms p95={:>8.2}ms p99={:>8.2}ms",
            self.name,
            self.samples.len(),
            self.pct(50.0),
            self.pct(95.0),
            self.pct(99.0)
        );
        if let Some(b) = base {
            s.push_str(&format!(
                "  ×{:.2} p50 vs {}",
                self.pct(50.0) / b.pct(50.0),
                b.name
            ));
        }
        s
    }
}

pub(crate) async fn create_and_run(
    client: &Client,
    template: &str,
    cmd: &[String],
) -> anyhow::Result<(Duration, String)> {
    let (split, id) = create_and_run_split(client, template, cmd).await?;
    Ok((split.total(), id))
}

/// One create→first command, with where the time went.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    pub(crate) create: Duration,
    pub(crate) command: Duration,
}

impl Split {
    pub(crate) fn total(&self) -> Duration {
        self.create + self.command
    }
}

pub(crate) async fn create_and_run_split(
    client: &Client,
    template: &str,
    cmd: &[String],
) -> anyhow::Result<(Split, String)> {
    let t0 = Instant::now();
    let (_, _, b) = client
        .api(
            http::Method::POST,
            "/v2/sandboxes",
            Some(serde_json::json!({ "templateID": template, "timeout": 120 })),
        )
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&b)?;
    let sb = SandboxRef {
        id: v["sandboxID"].as_str().context("no sandboxID")?.to_string(),
        access_token: v["envdAccessToken"].as_str().map(str::to_owned),
    };
    let created = t0.elapsed();
    let code = run_command(client, &sb, &cmd[0], &cmd[1..], Some(30_000), |_, _| {}).await?;
    let elapsed = t0.elapsed();
    anyhow::ensure!(code == 0, "benchmark command exited with {code}");
    Ok((
        Split {
            create: created,
            command: elapsed - created,
        },
        sb.id,
    ))
}
