//! The code-interpreter API on the sandbox's own loopback (`localhost:49999`), which E2B users'
//! code calls from inside the sandbox (`curl localhost:49999/execute`, an SDK in a command).
//!
//! The agent serves it itself: it is the sandbox's pid 1, which no process in the sandbox can
//! kill, so the API cannot be taken down by killing "its process" the way E2B's separate
//! server can. Each listener is supervised: if its accept loop ever fails, it is bound again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::Interpreter;

/// First and longest pause before binding a failed listener again.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Serves the interpreter on each address in the background, for the agent's lifetime.
pub fn serve(interpreter: &Arc<Interpreter>, addrs: &[SocketAddr]) {
    for &addr in addrs {
        let app = super::http::loopback_router(Arc::clone(interpreter));
        tokio::spawn(supervise(addr, app));
    }
}

async fn supervise(addr: SocketAddr, app: axum::Router) {
    let mut pause = RETRY_FIRST;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "code interpreter listening on the sandbox's loopback");
                pause = RETRY_FIRST;
                if let Err(e) = axum::serve(listener, app.clone()).await {
                    tracing::warn!(%addr, error = %e, "the loopback interpreter listener failed; binding it again");
                }
            }
            // No such address here (the sandbox's loopback has no IPv6): nothing to supervise.
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                tracing::info!(%addr, "not serving the code interpreter on {addr}: the sandbox has no such address");
                return;
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, retry_in = ?pause, "could not listen for the code interpreter on the sandbox's loopback");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}
