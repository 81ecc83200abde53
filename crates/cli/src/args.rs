//! Argument groups shared by several subcommands: where the server keeps its state
//! ([`DataArgs`]) and how a client reaches a running server ([`ClientArgs`]). Part of the
//! `bulkhead_cli` library, so the subcommand modules, `main` and `bulkhead-bench` import it
//! without importing each other.

use std::path::PathBuf;

use crate::client;

/// Where the server keeps its state; shared by `serve`, `keys`, `teams` and `template`.
#[derive(clap::Args, Clone, Debug)]
pub struct DataArgs {
    /// Data directory (database, sandboxes, images).
    #[arg(
        long,
        global = true,
        env = "BULKHEAD_DATA_DIR",
        default_value = "/var/lib/bulkhead"
    )]
    pub data_dir: PathBuf,
    /// Database URL (`sqlite:///path/db` or `postgres://…`); default: SQLite in the data dir.
    #[arg(long, global = true, env = "BULKHEAD_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Template image cache (content-addressed root filesystems); default: <data-dir>/images.
    #[arg(long, global = true, env = "BULKHEAD_IMAGE_CACHE")]
    pub image_cache: Option<PathBuf>,
    /// File with the 256-bit key (64 hex characters, e.g. `openssl rand -hex 32`) that encrypts
    /// secret values in the database; default: <data-dir>/secrets.key, generated on first start.
    #[arg(long, global = true, env = "BULKHEAD_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,
}

impl DataArgs {
    pub fn image_cache(&self) -> PathBuf {
        self.image_cache
            .clone()
            .unwrap_or_else(|| self.data_dir.join("images"))
    }
    pub async fn open_store(&self) -> anyhow::Result<bulkhead_store::Store> {
        std::fs::create_dir_all(&self.data_dir)?;
        Ok(match &self.database_url {
            Some(url) => bulkhead_store::Store::open(url).await?,
            None => bulkhead_store::Store::open_sqlite_in(&self.data_dir).await?,
        })
    }
}

/// How to reach a running server (for `sandbox`, `secrets`, `mcp` and `bulkhead-bench`).
#[derive(clap::Args, Clone, Debug)]
pub struct ClientArgs {
    #[arg(
        long,
        global = true,
        env = "E2B_API_URL",
        default_value = "http://127.0.0.1:3000"
    )]
    pub api_url: String,
    #[arg(long, global = true, env = "E2B_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl ClientArgs {
    pub fn client(&self) -> anyhow::Result<client::Client> {
        let key = self.api_key.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "no API key: set E2B_API_KEY or pass --api-key (see `bulkhead keys create`)"
            )
        })?;
        client::Client::new(&self.api_url, key)
    }
}
