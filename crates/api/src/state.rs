//! What every handler shares: the engine. A leaf module, so handlers and the router import it
//! without importing each other.

use std::sync::Arc;

use bulkhead_engine::Engine;

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
}
