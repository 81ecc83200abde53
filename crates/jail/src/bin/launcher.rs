//! Stand-alone jail launcher: `bulkhead-jail-launcher < request.json`. Equivalent to
//! `bulkhead __jail-launch`; see `bulkhead_jail::launcher` for the contract.

fn main() {
    bulkhead_jail::launcher::main()
}
