//! Runs the simulator: `cargo run -p stela-repl --example sim -- FIRST_SEED COUNT [two] [bug NAME] [trace]`.
use stela_repl::sim::{run, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let first: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(0);
    let count: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut config = if args.iter().any(|a| a == "two") {
        SimConfig::two_nodes()
    } else {
        SimConfig::three_nodes()
    };
    config.trace = args.iter().any(|a| a == "trace");
    if let Some(i) = args.iter().position(|a| a == "bug") {
        match args.get(i + 1).map(String::as_str) {
            Some("stale") => config.bugs.accept_stale_term = true,
            Some("early") => config.bugs.ack_before_held = true,
            Some("resolve") => config.bugs.fenced_resolve = true,
            Some("fallback") => config.bugs.configured_role_fallback = true,
            other => panic!("unknown bug {other:?}"),
        }
    }
    let started = std::time::Instant::now();
    let mut failed = 0;
    let mut counts = std::collections::BTreeMap::new();
    let mut steps = 0u64;
    for seed in first..first + count {
        let outcome = run(seed, &config);
        steps += outcome.steps;
        for (k, v) in &outcome.counts {
            *counts.entry(*k).or_insert(0u64) += v;
        }
        if outcome.failure.is_some() || config.trace {
            failed += u64::from(outcome.failure.is_some());
            let keep = outcome.trace.len().saturating_sub(80);
            let mut o = outcome;
            o.trace.drain(..keep);
            println!("{}", o.report());
        }
    }
    println!(
        "{count} seeds, {failed} failed, {steps} steps, {:?}; answers {counts:?}",
        started.elapsed()
    );
}
