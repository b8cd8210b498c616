//! The egress proxy's cost: requests per second and latency through the proxy against a
//! direct connection to the same target, in the same bench run, from real containers.
//!
//! The egress rig (`tests/egress_rig/`) starts authd, runed with the `hako-egress` proxy, and
//! an HTTP target (`web.test`). In each round an `open` run (on the target's network: the
//! direct baseline) and an `allowlist` run (through the proxy) run the test kit's `bench`:
//! sequential requests over one kept-alive connection (latency), then `BENCH_CONCURRENCY`
//! connections (throughput). Through the proxy, twice: absolute `http://` URLs (each request
//! forwarded on a fresh connection to the target, as the proxy does) and plain requests inside
//! one `CONNECT` tunnel per connection (the relay alone, as HTTPS uses it).
//!
//! `cargo bench -p hako-runed --bench egress`; `BENCH_ROUNDS` (3), `BENCH_LATENCY_REQUESTS`
//! (500), `BENCH_REQUESTS` (4000), `BENCH_CONCURRENCY` (16) tune it.

#[path = "../tests/egress_rig/mod.rs"]
mod egress_rig;

use serde_json::{Value, json};

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

#[derive(Default)]
struct Series {
    rps: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn bench() {
    let rounds = env_or("BENCH_ROUNDS", 3);
    let lat_n = env_or("BENCH_LATENCY_REQUESTS", 500);
    let n = env_or("BENCH_REQUESTS", 4000);
    let c = env_or("BENCH_CONCURRENCY", 16);
    let rig = egress_rig::Rig::new().await;
    let url = "http://web.test/bench";
    // (label, group, command)
    let cc = format!("{c} conns");
    let modes: Vec<(String, Value, String)> = vec![
        (
            "direct, 1 conn".to_owned(),
            json!({"network": "open"}),
            format!("bench {url} {lat_n} 1"),
        ),
        (
            "proxy http, 1 conn".to_owned(),
            json!({"network": "allowlist", "egress_allowlist": ["web.test"]}),
            format!("bench {url} {lat_n} 1"),
        ),
        (
            "proxy CONNECT, 1 conn".to_owned(),
            json!({"network": "allowlist", "egress_allowlist": ["web.test"]}),
            format!("bench {url} {lat_n} 1 connect"),
        ),
        (
            format!("direct, {cc}"),
            json!({"network": "open"}),
            format!("bench {url} {n} {c}"),
        ),
        (
            format!("proxy http, {cc}"),
            json!({"network": "allowlist", "egress_allowlist": ["web.test"]}),
            format!("bench {url} {n} {c}"),
        ),
        (
            format!("proxy CONNECT, {cc}"),
            json!({"network": "allowlist", "egress_allowlist": ["web.test"]}),
            format!("bench {url} {n} {c} connect"),
        ),
    ];
    let mut results: Vec<Series> = modes.iter().map(|_| Series::default()).collect();
    for round in 0..rounds {
        // Interleaved: each round measures every mode once, in the same order.
        for (i, (label, group, cmd)) in modes.iter().enumerate() {
            let run = rig
                .run_group(group.clone(), std::slice::from_ref(cmd))
                .await;
            let blocks = rig.blocks(&run, 1).await;
            let v = egress_rig::answer(&blocks, cmd);
            let (Some(rps), Some(p50), Some(p99)) = (
                v["rps"].as_f64(),
                v["p50_ms"].as_f64(),
                v["p99_ms"].as_f64(),
            ) else {
                panic!("{label}: {v}");
            };
            eprintln!("round {round} {label}: {rps:.0} req/s, p50 {p50:.3} ms, p99 {p99:.3} ms");
            results[i].rps.push(rps);
            results[i].p50.push(p50);
            results[i].p99.push(p99);
            rig.wait_end(&run).await;
        }
    }
    println!(
        "\negress proxy vs direct, median of {rounds} rounds (latency: {lat_n} sequential requests on one connection; throughput: {n} requests over {c} connections)\n"
    );
    println!(
        "| mode | req/s | p50 ms | p99 ms | req/s vs direct | added p50 ms |\n|---|---|---|---|---|---|"
    );
    for (i, (label, _, _)) in modes.iter().enumerate() {
        let base = if i < 3 { 0 } else { 3 };
        let (rps, p50, p99) = (
            median(&results[i].rps),
            median(&results[i].p50),
            median(&results[i].p99),
        );
        let (brps, bp50) = (median(&results[base].rps), median(&results[base].p50));
        println!(
            "| {label} | {rps:.0} | {p50:.3} | {p99:.3} | {:.2} | {:+.3} |",
            rps / brps,
            p50 - bp50
        );
    }
}
