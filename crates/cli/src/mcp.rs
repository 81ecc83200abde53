//! `bulkhead mcp --stdio`: MCP over stdin/stdout for local clients, relayed to a running
//! server's `/mcp` (see `bulkhead_mcp::bridge`). stdout carries the protocol, so nothing else
//! may be printed there; errors go to stderr.

use std::process::ExitCode;

use bulkhead_cli::args::ClientArgs;

#[derive(clap::Args)]
pub struct McpArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Speak MCP on stdin/stdout (the only transport of this command; the server itself serves
    /// Streamable HTTP at /mcp).
    #[arg(long)]
    stdio: bool,
}

pub async fn run(args: McpArgs) -> anyhow::Result<ExitCode> {
    if !args.stdio {
        anyhow::bail!(
            "pass --stdio (MCP over stdin/stdout); HTTP clients connect to `bulkhead serve` at <api-url>/mcp directly"
        );
    }
    let key = args.client.api_key.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "no API key: set E2B_API_KEY or pass --api-key (see `bulkhead keys create`)"
        )
    })?;
    bulkhead_mcp::bridge::serve_stdio(&args.client.api_url, key).await?;
    Ok(ExitCode::SUCCESS)
}
