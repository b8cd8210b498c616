//! A small per-daemon metrics registry rendered in the Prometheus text format.
//!
//! Per instance rather than a process-global recorder, so that tests can run several real
//! daemons in one process and read each one's `/metrics` separately.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Label pairs, e.g. `&[("outcome", "ok")]`.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

#[derive(Default)]
struct Family {
    help: &'static str,
    kind: &'static str,
    series: BTreeMap<String, Series>,
}

enum Series {
    Counter(Arc<AtomicU64>),
    Gauge(Arc<AtomicI64>),
    Histogram(Arc<HistogramInner>),
}

/// A registry of counters, gauges and histograms; cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    families: Arc<Mutex<BTreeMap<&'static str, Family>>>,
}

/// A monotonically increasing count.
#[derive(Clone)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Clone)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Adds `d` (may be negative).
    pub fn add(&self, d: i64) {
        self.0.fetch_add(d, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct HistogramInner {
    bounds: Vec<f64>,
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in micro-units so that it fits an atomic integer.
    sum_micros: AtomicU64,
}

/// A distribution with fixed buckets.
#[derive(Clone)]
pub struct Histogram(Arc<HistogramInner>);

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, v: f64) {
        let h = &self.0;
        if let Some(i) = h.bounds.iter().position(|b| v <= *b) {
            h.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        h.count.fetch_add(1, Ordering::Relaxed);
        h.sum_micros
            .fetch_add((v.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }
}

fn key(labels: Labels<'_>) -> String {
    let mut s = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(s, "{k}=\"{v}\"");
    }
    s
}

impl Metrics {
    fn with_family<T>(
        &self,
        name: &'static str,
        help: &'static str,
        kind: &'static str,
        f: impl FnOnce(&mut Family) -> T,
    ) -> T {
        let mut fams = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let fam = fams.entry(name).or_insert_with(|| Family {
            help,
            kind,
            series: BTreeMap::new(),
        });
        f(fam)
    }

    /// The counter `name{labels}`, created at zero on first use.
    pub fn counter(&self, name: &'static str, help: &'static str, labels: Labels<'_>) -> Counter {
        self.with_family(name, help, "counter", |fam| {
            match fam
                .series
                .entry(key(labels))
                .or_insert_with(|| Series::Counter(Arc::default()))
            {
                Series::Counter(c) => Counter(c.clone()),
                _ => Counter(Arc::default()),
            }
        })
    }

    /// The gauge `name{labels}`, created at zero on first use.
    pub fn gauge(&self, name: &'static str, help: &'static str, labels: Labels<'_>) -> Gauge {
        self.with_family(name, help, "gauge", |fam| {
            match fam
                .series
                .entry(key(labels))
                .or_insert_with(|| Series::Gauge(Arc::default()))
            {
                Series::Gauge(g) => Gauge(g.clone()),
                _ => Gauge(Arc::default()),
            }
        })
    }

    /// The histogram `name{labels}` with upper bounds `buckets` (ascending).
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: Labels<'_>,
        buckets: &[f64],
    ) -> Histogram {
        self.with_family(name, help, "histogram", |fam| {
            let make = || {
                Series::Histogram(Arc::new(HistogramInner {
                    bounds: buckets.to_vec(),
                    counts: buckets.iter().map(|_| AtomicU64::new(0)).collect(),
                    count: AtomicU64::new(0),
                    sum_micros: AtomicU64::new(0),
                }))
            };
            match fam.series.entry(key(labels)).or_insert_with(make) {
                Series::Histogram(h) => Histogram(h.clone()),
                _ => Histogram(match make() {
                    Series::Histogram(h) => h,
                    _ => unreachable!("make() builds a histogram"),
                }),
            }
        })
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let fams = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for (name, fam) in fams.iter() {
            let _ = writeln!(out, "# HELP {name} {}", fam.help);
            let _ = writeln!(out, "# TYPE {name} {}", fam.kind);
            for (labels, series) in &fam.series {
                let braced = |extra: &str| -> String {
                    match (labels.is_empty(), extra.is_empty()) {
                        (true, true) => String::new(),
                        (true, false) => format!("{{{extra}}}"),
                        (false, true) => format!("{{{labels}}}"),
                        (false, false) => format!("{{{labels},{extra}}}"),
                    }
                };
                match series {
                    Series::Counter(c) => {
                        let _ = writeln!(out, "{name}{} {}", braced(""), c.load(Ordering::Relaxed));
                    }
                    Series::Gauge(g) => {
                        let _ = writeln!(out, "{name}{} {}", braced(""), g.load(Ordering::Relaxed));
                    }
                    Series::Histogram(h) => {
                        let mut cum = 0u64;
                        for (b, c) in h.bounds.iter().zip(&h.counts) {
                            cum += c.load(Ordering::Relaxed);
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {cum}",
                                braced(&format!("le=\"{b}\""))
                            );
                        }
                        let count = h.count.load(Ordering::Relaxed);
                        let _ = writeln!(out, "{name}_bucket{} {count}", braced("le=\"+Inf\""));
                        let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
                        let _ = writeln!(out, "{name}_sum{} {sum}", braced(""));
                        let _ = writeln!(out, "{name}_count{} {count}", braced(""));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.counter("hako_spawns_total", "Spawns.", &[("outcome", "ok")])
            .add(3);
        m.counter("hako_spawns_total", "Spawns.", &[("outcome", "ok")])
            .inc();
        m.gauge("hako_active", "Active.", &[]).set(2);
        let h = m.histogram("hako_dur_seconds", "Durations.", &[], &[1.0, 10.0]);
        h.observe(0.5);
        h.observe(5.0);
        h.observe(50.0);
        let text = m.render();
        assert!(text.contains("# TYPE hako_spawns_total counter"), "{text}");
        assert!(
            text.contains("hako_spawns_total{outcome=\"ok\"} 4"),
            "{text}"
        );
        assert!(text.contains("hako_active 2"), "{text}");
        assert!(
            text.contains("hako_dur_seconds_bucket{le=\"1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hako_dur_seconds_bucket{le=\"10\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("hako_dur_seconds_bucket{le=\"+Inf\"} 3"),
            "{text}"
        );
        assert!(text.contains("hako_dur_seconds_count 3"), "{text}");
    }
}
