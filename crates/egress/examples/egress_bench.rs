//! `cargo run --release -p bulkhead-egress --example egress_bench [requests] [connections]`
//! (root): proxy vs direct latency against a local upstream in a test network namespace.

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("counts must be integers"));
    let mut opts = bulkhead_egress::bench::BenchOptions::default();
    if let Some(n) = args.next() {
        opts.requests = n;
    }
    if let Some(n) = args.next() {
        opts.connections = n;
    }
    match bulkhead_egress::bench::run(opts).await {
        Ok(report) => print!("{report}"),
        Err(e) => {
            eprintln!("egress bench: {e}");
            std::process::exit(1);
        }
    }
}
