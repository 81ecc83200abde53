//! `bulkhead-agent` binary: see the library docs.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = bulkhead_agent::Args::parse();
    // A microVM's pid 1 first builds the root file system the launcher builds for the jail.
    if args.guest_port.is_some()
        && nix::unistd::getpid().as_raw() == 1
        && let Err(e) = bulkhead_agent::guest::prepare_root()
    {
        eprintln!("bulkhead-agent: {}", bulkhead_agent::error_chain(&e));
        return ExitCode::FAILURE;
    }
    // Before any thread exists: as pid 1, fork the server and stay behind as the reaper.
    bulkhead_agent::init::become_init_if_pid1();

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log_level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: the jail appends stderr to `sock/agent.log`, which people
    // and tests grep (`request_id=…`).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bulkhead-agent: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bulkhead_agent::run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bulkhead-agent: {}", bulkhead_agent::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
