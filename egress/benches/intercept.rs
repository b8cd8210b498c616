//! What interception costs: one HTTPS request through the proxy toward a host a run's
//! brokered secret is bound to (the proxy answers the TLS, replaces the placeholder, opens its
//! own TLS to the host) against the same request through a plain tunnel (no secret bound), to
//! the same HTTPS target on loopback, in the same run, interleaved.
//!
//! Two shapes: a new connection per request (`CONNECT`, TLS, one request: what `curl` and
//! `git` do per call) and one more request on a kept-alive connection (what SDKs do). The
//! first intercepted request, which issues the host's certificate, is timed apart; every
//! later one finds it cached. Medians of `BENCH_REQUESTS` (300) per mode; the target is an
//! added median under 5 ms after the first certificate.
//!
//! `cargo bench -p hako-egress --bench intercept`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::Rig;
use common::brokered::*;
use tokio_rustls::rustls;

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let n = env_or("BENCH_REQUESTS", 300);
    let rig = Rig::new().await;
    let ca = TestCa::new();
    let (target, _seen) = tls_target(&ca).await;
    let (proxy, _dirs) = broker_proxy(
        &rig,
        &[("GH_TOKEN", "ghp_bench-value-0123456789")],
        Some(&ca),
    )
    .await;
    let p = proxy.proxy_addr();
    let host = format!("localhost:{}", target.port());
    let gh = claim("GH_TOKEN", std::slice::from_ref(&host));
    let (plain_token, _) = rig
        .spawn_token("bench-tunnel", std::slice::from_ref(&host), 3600)
        .await;
    let (bound_token, _) = rig
        .spawn_token_with(
            "bench-intercept",
            std::slice::from_ref(&host),
            std::slice::from_ref(&gh),
            3600,
        )
        .await;
    // The box of a tunnel trusts the target's CA; the box of an intercepted host trusts the
    // proxy's bundle.
    let mut target_roots = rustls::RootCertStore::empty();
    target_roots.add_parsable_certificates(
        hako_egress::tls::certificates(ca.pem.as_bytes(), "ca").expect("ca"),
    );
    let proxy_roots = box_roots(&proxy).await;
    let auth = |ph: &str| vec![("authorization", format!("Bearer {ph}"))];
    let intercept_auth = auth(gh.placeholder.as_str());
    let tunnel_auth = auth("ghp_bench-value-0123456789");

    let one =
        |token: String, roots: rustls::RootCertStore, headers: Vec<(&'static str, String)>| {
            let host = host.clone();
            async move {
                let t = Instant::now();
                let mut s = box_tls(p, &token, &host, "localhost", &roots, &[b"http/1.1"])
                    .await
                    .expect("connection");
                let (st, ..) = call(&mut s, "/bench", &headers).await.expect("request");
                assert_eq!(st, 200);
                t.elapsed()
            }
        };
    let first = one(
        bound_token.clone(),
        proxy_roots.clone(),
        intercept_auth.clone(),
    )
    .await;
    // Warm both paths (connections, caches) before measuring.
    for _ in 0..20 {
        one(
            plain_token.clone(),
            target_roots.clone(),
            tunnel_auth.clone(),
        )
        .await;
        one(
            bound_token.clone(),
            proxy_roots.clone(),
            intercept_auth.clone(),
        )
        .await;
    }
    let (mut tunnel_new, mut intercept_new) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        tunnel_new.push(ms(one(
            plain_token.clone(),
            target_roots.clone(),
            tunnel_auth.clone(),
        )
        .await));
        intercept_new.push(ms(one(
            bound_token.clone(),
            proxy_roots.clone(),
            intercept_auth.clone(),
        )
        .await));
    }
    let mut kept_tunnel = box_tls(
        p,
        &plain_token,
        &host,
        "localhost",
        &target_roots,
        &[b"http/1.1"],
    )
    .await
    .expect("tunnel");
    let mut kept_intercept = box_tls(
        p,
        &bound_token,
        &host,
        "localhost",
        &proxy_roots,
        &[b"http/1.1"],
    )
    .await
    .expect("intercept");
    let (mut tunnel_kept, mut intercept_kept) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 20 {
        let t = Instant::now();
        call(&mut kept_tunnel, "/bench", &tunnel_auth)
            .await
            .expect("tunnel request");
        let a = ms(t.elapsed());
        let t = Instant::now();
        call(&mut kept_intercept, "/bench", &intercept_auth)
            .await
            .expect("intercepted request");
        let b = ms(t.elapsed());
        if i >= 20 {
            tunnel_kept.push(a);
            intercept_kept.push(b);
        }
    }
    println!("egress interception: one HTTPS request through the proxy, {n} per mode, interleaved");
    println!(
        "first intercepted request (issues the host's certificate): {:.3} ms",
        ms(first)
    );
    println!();
    println!("| mode | p50 ms | p90 ms | p50 vs tunnel | added p50 ms |");
    println!("|---|---|---|---|---|");
    let mut verdicts = Vec::new();
    for (label, tunnel, intercept) in [
        ("new connection", &tunnel_new, &intercept_new),
        ("kept-alive connection", &tunnel_kept, &intercept_kept),
    ] {
        let (t50, i50) = (quantile(tunnel, 0.5), quantile(intercept, 0.5));
        println!(
            "| tunnel, {label} | {t50:.3} | {:.3} | 1.00 | |",
            quantile(tunnel, 0.9)
        );
        println!(
            "| intercepted, {label} | {i50:.3} | {:.3} | {:.2} | {:+.3} |",
            quantile(intercept, 0.9),
            i50 / t50,
            i50 - t50
        );
        verdicts.push((label, i50 - t50));
    }
    println!();
    for (label, added) in verdicts {
        println!(
            "{} added {added:.3} ms at the median ({label}; target < 5 ms)",
            if added < 5.0 { "PASS" } else { "FAIL" }
        );
    }
    proxy.shutdown().await;
}
