//! runed's metrics: spawns by outcome, active containers, queue length, the age of the oldest
//! queued run (runs stuck in `queued` mean authd or Docker is unavailable), run durations and
//! Docker API latency.

use std::time::Duration;

use hako_shared::metrics::{Counter, Gauge, Histogram, Metrics};
use hako_shared::runs::Outcome;

use hako_runner::{Start, WarmMiss};

const OUTCOMES: [Outcome; 5] = [
    Outcome::Ok,
    Outcome::Error,
    Outcome::Fatal,
    Outcome::Killed,
    Outcome::TimedOut,
];

/// The daemon's metric handles.
#[derive(Clone)]
pub struct DaemonMetrics {
    /// The registry `/metrics` renders.
    pub registry: Metrics,
    spawns: Vec<(Outcome, Counter)>,
    /// Live containers.
    pub active: Gauge,
    /// Runs waiting.
    pub queued: Gauge,
    /// Seconds the oldest queued run has waited.
    pub oldest_queued: Gauge,
    /// Run durations, seconds.
    pub duration: Histogram,
    /// Docker API round trips, seconds.
    pub docker_latency: Histogram,
    /// Runs re-adopted at start.
    pub adopted: Counter,
    /// Times the egress proxy was found gone and created again.
    pub egress_restarts: Counter,
    /// 1 while the egress proxy answers ready.
    pub egress_up: Gauge,
    /// Runs that took a warm box.
    pub warm_hits: Counter,
    warm_misses: Vec<(WarmMiss, Counter)>,
    /// Warm boxes waiting now.
    pub warm_boxes: Gauge,
    /// What the warm boxes' runs saved: their boxes' create, attach and start, in ms.
    pub warm_saved_ms: Counter,
}

impl DaemonMetrics {
    /// Says which OCI runtime untrusted groups run under (`runed_runtime_info`, 1 for the
    /// runtime each trust level gets; `default` is the Docker daemon's own).
    pub fn runtimes(&self, untrusted: Option<&str>) {
        for (trust, runtime) in [
            ("untrusted", untrusted.unwrap_or("default")),
            ("main", "default"),
        ] {
            self.registry
                .gauge(
                    "runed_runtime_info",
                    "The OCI runtime each trust level's containers run under (1).",
                    &[("trust", trust), ("runtime", runtime)],
                )
                .set(1);
        }
    }

    /// Registers the metrics; the duration buckets reach the run `ceiling`.
    pub fn new(ceiling: Duration) -> Self {
        let registry = Metrics::default();
        let spawns = OUTCOMES
            .iter()
            .map(|o| {
                (
                    *o,
                    registry.counter(
                        "runed_spawns_total",
                        "Finished runs by outcome.",
                        &[("outcome", o.as_str())],
                    ),
                )
            })
            .collect();
        let top = ceiling.as_secs_f64().max(1.0);
        let mut buckets: Vec<f64> = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]
            .into_iter()
            .filter(|b| *b < top)
            .collect();
        buckets.push(top);
        Self {
            active: registry.gauge("runed_active_containers", "Agent containers live now.", &[]),
            queued: registry.gauge("runed_queue_length", "Runs waiting for a slot.", &[]),
            oldest_queued: registry.gauge(
                "runed_oldest_queued_seconds",
                "How long the oldest queued run has waited; growing means authd or Docker is unavailable.",
                &[],
            ),
            duration: registry.histogram(
                "runed_run_duration_seconds",
                "Run duration from start to end.",
                &[],
                &buckets,
            ),
            docker_latency: registry.histogram(
                "runed_docker_api_seconds",
                "Docker API round trip (version probe).",
                &[],
                &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
            ),
            adopted: registry.counter(
                "runed_adopted_total",
                "Runs re-adopted after a restart.",
                &[],
            ),
            egress_restarts: registry.counter(
                "runed_egress_proxy_restarts_total",
                "Times the egress proxy was found gone or stopped and created again.",
                &[],
            ),
            egress_up: registry.gauge(
                "runed_egress_proxy_up",
                "1 while the egress proxy answers ready (0 also when none is configured).",
                &[],
            ),
            warm_hits: registry.counter(
                "runed_warm_hits_total",
                "Runs that took their folder's warm box.",
                &[],
            ),
            warm_misses: WarmMiss::ALL
                .iter()
                .map(|m| {
                    (
                        *m,
                        registry.counter(
                            "runed_warm_misses_total",
                            "Runs that started cold though warm boxes are kept, by reason.",
                            &[("reason", m.as_str())],
                        ),
                    )
                })
                .collect(),
            warm_boxes: registry.gauge(
                "runed_warm_boxes",
                "Warm boxes waiting for their folder's next run.",
                &[],
            ),
            warm_saved_ms: registry.counter(
                "runed_warm_saved_milliseconds_total",
                "Container create, attach and start time that runs in warm boxes did not wait for.",
                &[],
            ),
            spawns,
            registry,
        }
    }

    /// Counts how a run's container came to be.
    pub fn started(&self, start: Start) {
        match start {
            Start::Warm { saved } => {
                self.warm_hits.inc();
                self.warm_saved_ms.add(saved.as_millis() as u64);
            }
            Start::Cold(Some(miss)) => {
                if let Some((_, c)) = self.warm_misses.iter().find(|(m, _)| *m == miss) {
                    c.inc();
                }
            }
            Start::Cold(None) => {}
        }
    }

    /// Counts a run that ended.
    pub fn ended(&self, outcome: Outcome) {
        if let Some((_, c)) = self.spawns.iter().find(|(o, _)| *o == outcome) {
            c.inc();
        }
    }
}
