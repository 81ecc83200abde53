//! Recording a sandbox's usage up to now, before it ends, is paused or resumed (so the
//! meter's interval loop does not count that part at the wrong rate, or not at all).

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::sandbox::lifecycle::SandboxState;
use crate::tenancy::metering;

/// Paused and being resumed: holding a checkpoint, not CPU or memory.
pub(crate) fn holds_checkpoint(state: SandboxState) -> bool {
    matches!(state, SandboxState::Paused | SandboxState::Resuming)
}

/// Records a sandbox's usage up to now (before it ends, is paused or resumed), so the
/// interval loop does not count that part at the wrong rate, or not at all.
pub(crate) async fn meter_one(engine: &Engine, id: &str) {
    let _one = engine.tenants.meter_lock.lock().await;
    let now = now_ms();
    let seg = {
        let live = engine.live.lock();
        live.get(id).and_then(|l| {
            metering::segment(
                id,
                &l.meter,
                holds_checkpoint(l.state),
                l.meter.paused_bytes.unwrap_or(0),
                now,
                &engine.cfg.metering.prices,
            )
        })
    };
    let Some((row, carry)) = seg else { return };
    match engine.store.record_usage(std::slice::from_ref(&row)).await {
        Ok(_) => {
            if let Some(l) = engine.live.lock().get_mut(id) {
                l.meter.since_ms = row.end_ms;
                l.meter.carry = carry;
            }
        }
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "recording the sandbox's last usage failed")
        }
    }
}
