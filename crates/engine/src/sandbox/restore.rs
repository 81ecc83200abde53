//! Starting a new sandbox from a checkpoint (a snapshot, a fork's snapshot): the driver
//! restores it as a new process tree, and its agent is given the new sandbox's identity.

use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::node::driver::{DriverHandle, RestoreOptions};
use crate::sandbox::lifecycle::Operation;
use crate::sandbox::source::CheckpointSource;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Restore `c` as a new sandbox and send its agent `init`. The checkpoint stays in place
    /// (one snapshot serves many sandboxes).
    pub(crate) async fn restore_new(
        &self,
        c: &CheckpointSource,
        init: &InitRequest,
    ) -> Result<(DriverHandle, AgentInfo)> {
        if !self.node.capabilities().checkpoint {
            return Err(EngineError::NotCapable {
                driver: self.node.driver_name(),
                op: Operation::Create,
            });
        }
        let opts = RestoreOptions {
            consume: false,
            filesystem_only: !c.memory,
            access_token: c.access_token.clone(),
        };
        let handle = self
            .node
            .restore(&c.template.spec(), &c.dir, opts)
            .await
            .map_err(EngineError::driver(Operation::Create))?;
        // A memory restore's agent still requires its source's token until it gets its own.
        let auth = if c.memory {
            c.access_token.as_deref()
        } else {
            None
        };
        match crate::sandbox::create::init_agent(self, &handle, init, auth, Operation::Create).await
        {
            Ok(agent) => Ok((handle, agent)),
            Err(e) => {
                let _ = self.node.stop(&handle).await;
                Err(e)
            }
        }
    }
}
