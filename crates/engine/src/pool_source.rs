//! Where a new warm-pool member comes from. The filler obtains every member through
//! [`Engine::new_pool_member`], so how a member is made (a cold start today; a restore of a
//! warmed checkpoint for heavy templates) is decided in this one place.

use crate::driver::DriverHandle;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::lifecycle::Operation;
use crate::types::TemplateInfo;

impl Engine {
    /// A started, anonymous sandbox of `t`, ready to be claimed by a create.
    pub(crate) async fn new_pool_member(
        &self,
        t: &TemplateInfo,
    ) -> Result<DriverHandle, EngineError> {
        self.driver
            .start(&t.spec())
            .await
            .map_err(EngineError::driver(Operation::Create))
    }
}
