//! The proxy's metrics: allowed and denied requests (denials by reason), targets that could
//! not be reached, open tunnels and why connections closed, brokered secrets put on the wire
//! and placeholders left (by why). Labels are fixed sets: never a
//! host, folder or token.

use hako_shared::metrics::{Counter, Gauge, Metrics};

use crate::broker::Misuse;
use crate::policy::{Denial, Failure};

/// Handles on the proxy's series. Cheap to clone.
#[derive(Clone)]
pub struct ProxyMetrics {
    /// The registry `/metrics` renders.
    pub registry: Metrics,
    tunnels: Gauge,
}

const ALLOWED: &str = "egress_allowed_total";
const ALLOWED_HELP: &str =
    "Requests let through, by kind (connect: a tunnel; http: a forwarded request).";
const DENIED: &str = "egress_denied_total";
const DENIED_HELP: &str = "Requests refused, by reason.";
const FAILED: &str = "egress_upstream_failures_total";
const FAILED_HELP: &str = "Allowed requests whose target could not be reached, by step.";
const CLOSED: &str = "egress_closed_total";
const CLOSED_HELP: &str = "Connections to targets that ended, by why (done, broken, idle, revoked, expired, verifier_unavailable, tls_handshake, sni_mismatch).";
const REPLACED: &str = "egress_secrets_replaced_total";
const REPLACED_HELP: &str =
    "Requests to a bound host whose headers got a brokered secret's value (one per secret).";
const REFUSED: &str = "egress_placeholders_refused_total";
const REFUSED_HELP: &str = "Placeholders left unreplaced, by why (unbound_host: toward a host the secret is not bound to; other_run: not the run's own; plain_http; in_url).";

/// Keeps the open-tunnel gauge up while it lives.
pub struct TunnelOpen(Gauge);

impl Drop for TunnelOpen {
    fn drop(&mut self) {
        self.0.add(-1);
    }
}

impl ProxyMetrics {
    /// Every series created at zero, so a scrape shows each reason before it happens.
    pub fn new() -> Self {
        let registry = Metrics::default();
        for kind in ["connect", "http", "intercept"] {
            registry.counter(ALLOWED, ALLOWED_HELP, &[("kind", kind)]);
        }
        for d in Denial::ALL {
            registry.counter(DENIED, DENIED_HELP, &[("reason", d.code())]);
        }
        for f in Failure::ALL {
            registry.counter(FAILED, FAILED_HELP, &[("step", f.code())]);
        }
        for m in Misuse::ALL {
            registry.counter(REFUSED, REFUSED_HELP, &[("reason", m.code())]);
        }
        registry.counter(REPLACED, REPLACED_HELP, &[]);
        let tunnels = registry.gauge("egress_open_tunnels", "CONNECT tunnels open now.", &[]);
        Self { registry, tunnels }
    }

    /// Allowed requests of `kind`.
    pub fn allowed(&self, kind: &'static str) -> Counter {
        self.registry
            .counter(ALLOWED, ALLOWED_HELP, &[("kind", kind)])
    }

    /// Denials for `d`.
    pub fn denied(&self, d: Denial) -> Counter {
        self.registry
            .counter(DENIED, DENIED_HELP, &[("reason", d.code())])
    }

    /// Failures at step `f`.
    pub fn failed(&self, f: Failure) -> Counter {
        self.registry
            .counter(FAILED, FAILED_HELP, &[("step", f.code())])
    }

    /// Connections closed for `why` (a fixed word).
    pub fn closed(&self, why: &'static str) -> Counter {
        self.registry
            .counter(CLOSED, CLOSED_HELP, &[("reason", why)])
    }

    /// Values put in place of placeholders.
    pub fn replaced(&self) -> Counter {
        self.registry.counter(REPLACED, REPLACED_HELP, &[])
    }

    /// Placeholders left, for `m`.
    pub fn refused(&self, m: Misuse) -> Counter {
        self.registry
            .counter(REFUSED, REFUSED_HELP, &[("reason", m.code())])
    }

    /// Counts a tunnel open until the guard drops.
    pub fn tunnel_opened(&self) -> TunnelOpen {
        self.tunnels.add(1);
        TunnelOpen(self.tunnels.clone())
    }
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self::new()
    }
}
