//! Parser throughput on noise-heavy input: `cargo bench -p hako-runed --bench sentinel`.

use std::time::Instant;

use hako_runner::sentinel::{ParseEvent, SentinelParser};
use hako_shared::contract::Markers;

fn main() {
    // 64 MiB of log-like noise with a block every 1 MiB, fed in 32 KiB frames (Docker's size).
    let mut noise = Vec::new();
    let line = b"[agent] 2026-11-23T13:38:00Z INFO thinking about the request, step 42 of many\n";
    while noise.len() < 1 << 20 {
        noise.extend_from_slice(line);
    }
    noise.extend_from_slice(b"---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"partial reply\"}\n---ARIZUKO_OUTPUT_END---\n");
    let mut stream = Vec::new();
    for _ in 0..64 {
        stream.extend_from_slice(&noise);
    }
    let total = stream.len();
    let mut best = f64::MAX;
    for _ in 0..7 {
        let mut p = SentinelParser::new(&Markers::default(), 1 << 20);
        let mut out = Vec::new();
        let t = Instant::now();
        for chunk in stream.chunks(32 * 1024) {
            p.feed(chunk, &mut out);
        }
        let dt = t.elapsed().as_secs_f64();
        let blocks = out
            .iter()
            .filter(|e| matches!(e, ParseEvent::Block(_)))
            .count();
        assert_eq!(blocks, 64);
        best = best.min(dt);
    }
    let gib_s = total as f64 / best / (1u64 << 30) as f64;
    println!(
        "sentinel parser: {:.1} MiB in {:.1} ms -> {gib_s:.2} GiB/s (target >= 1.00 GiB/s)",
        total as f64 / (1 << 20) as f64,
        best * 1e3
    );
}
