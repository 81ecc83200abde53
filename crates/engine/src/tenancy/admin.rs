//! The operator's facade: teams, API keys and usage as `bulkhead teams`, `bulkhead keys` and
//! `bulkhead usage` manage them. It works on the store alone (no running engine), so the
//! commands work while a server runs; the server reads a team's row at each create.

use bulkhead_store::{Store, StoreError};

use crate::tenancy::keys::{self, KeyError};
use crate::tenancy::metering::{self, UsageFilter, UsageReport};
use crate::tenancy::teams::{self, QuotaUpdate, Team, TeamError};
use crate::types::ApiKey;

pub struct Admin {
    store: Store,
}

impl Admin {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// A new team named `name`, with a balance (millionths of a credit) or none.
    pub async fn create_team(
        &self,
        name: &str,
        credits_micro: Option<i64>,
    ) -> Result<Team, TeamError> {
        teams::create(&self.store, name, credits_micro).await
    }

    pub async fn teams(&self) -> Result<Vec<Team>, TeamError> {
        teams::list(&self.store).await
    }

    /// The team with this id or name.
    pub async fn team(&self, id_or_name: &str) -> Result<Team, TeamError> {
        teams::get(&self.store, id_or_name).await
    }

    /// Adds credits (negative: takes some); returns the new balance in millionths.
    pub async fn credit(&self, id_or_name: &str, delta_micro: i64) -> Result<i64, TeamError> {
        teams::credit(&self.store, id_or_name, delta_micro).await
    }

    /// Removes the team's balance (metered, never refused for credits).
    pub async fn clear_credits(&self, id_or_name: &str) -> Result<(), TeamError> {
        teams::clear_credits(&self.store, id_or_name).await
    }

    pub async fn set_quotas(&self, id_or_name: &str, u: &QuotaUpdate) -> Result<Team, TeamError> {
        teams::set_quotas(&self.store, id_or_name, u).await
    }

    /// A new key of team `team` (id or name); returns it with its secret, shown only now.
    pub async fn create_key(&self, name: &str, team: &str) -> Result<(ApiKey, String), KeyError> {
        keys::create_in(&self.store, name, team).await
    }

    pub async fn keys(&self) -> Result<Vec<ApiKey>, KeyError> {
        keys::list(&self.store).await
    }

    /// Revokes the key with this id or prefix; false when there is none.
    pub async fn revoke_key(&self, id_or_prefix: &str) -> Result<bool, KeyError> {
        keys::revoke(&self.store, id_or_prefix).await
    }

    /// The usage `filter` selects, summed (any team).
    pub async fn usage(&self, filter: &UsageFilter) -> Result<UsageReport, StoreError> {
        metering::report(&self.store, filter).await
    }
}
