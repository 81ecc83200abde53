//! A built template's start command and ready check, run in every new sandbox of it (and once
//! at the end of its build): the command in the background as the template's user, in its
//! workdir, with its env vars, then the check until it exits 0.

use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::node::driver::DriverHandle;
use crate::template::exec::Command;
use crate::template::types::StepError;
use crate::types::TemplateRuntime;

/// Runs the template's start command in the background (as its user, in its workdir, with
/// its env vars) and waits until its ready command exits 0.
pub(crate) async fn start_and_wait_ready(
    engine: &Engine,
    handle: &DriverHandle,
    rt: &TemplateRuntime,
    access_token: Option<&str>,
) -> Result<(), StepError> {
    let limit = engine.cfg.build_limits.ready_timeout;
    if let Some(start) = &rt.start_cmd {
        let script = format!(
            "setsid -f /bin/bash -l -c {} >/dev/null 2>&1 </dev/null",
            crate::template::spec::shell_quote(start)
        );
        let stream = engine.agents.open(handle).await.map_err(StepError::Reach)?;
        let cmd = Command {
            script: &script,
            user: &rt.user,
            cwd: rt.workdir.as_deref(),
            envs: &rt.envs,
            timeout: Duration::from_secs(30),
            access_token,
        };
        let code = crate::template::exec::run(stream, &cmd, &mut |_| {})
            .await
            .map_err(StepError::StartCommand)?;
        if code != 0 {
            return Err(StepError::StartCommandExit(code));
        }
    }
    let Some(ready) = &rt.ready_cmd else {
        return Ok(());
    };
    let deadline = Instant::now() + limit;
    loop {
        let stream = engine.agents.open(handle).await.map_err(StepError::Reach)?;
        let cmd = Command {
            script: ready,
            user: &rt.user,
            cwd: rt.workdir.as_deref(),
            envs: &rt.envs,
            timeout: Duration::from_secs(30),
            access_token,
        };
        let mut out = Vec::new();
        let code = crate::template::exec::run(stream, &cmd, &mut |l| out.push(l)).await;
        if matches!(code, Ok(0)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StepError::NotReady {
                cmd: ready.clone(),
                limit,
                output: if out.is_empty() {
                    String::new()
                } else {
                    format!(": {}", out.join("\n"))
                },
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
