//! Keeps the install's egress proxy alive: every `RUNED_EGRESS_CHECK` the runner's
//! [`Egress`](hako_runner::proxy_container::Egress) checks the proxy container, recreates it if it
//! died (joined again to every live run network), and asks its `/ready`; `/ready` of runed
//! reports the verdict.

use std::sync::Arc;

use crate::state::Shared;
use hako_runner::proxy_container::Checked;

/// Checks the proxy on its interval until shutdown (no proxy configured: returns at once).
pub(crate) async fn supervise(sh: Arc<Shared>) {
    let Some(every) = sh.cfg.runner.egress.as_ref().map(|e| e.check) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = sh.stopping.cancelled() => return,
        }
        let Ok(runner) = sh.runner() else { continue };
        let Some(egress) = runner.egress() else {
            return;
        };
        match egress.check().await {
            Ok(c) => {
                if c == Checked::Recreated {
                    sh.metrics.egress_restarts.inc();
                }
                let up = egress.status().is_ok();
                sh.metrics.egress_up.set(i64::from(up));
                if failing && up {
                    tracing::info!("the egress proxy is ready again");
                }
                failing = !up;
            }
            Err(e) => {
                sh.metrics.egress_up.set(0);
                if !failing {
                    tracing::warn!(error = %e, "the egress proxy cannot be kept running");
                }
                failing = true;
            }
        }
    }
}

/// `/ready`'s word on the proxy: `Ok` when none is configured or it answered ready.
pub(crate) fn ready(sh: &Shared) -> Result<(), String> {
    if sh.cfg.runner.egress.is_none() {
        return Ok(());
    }
    match sh.runner() {
        Ok(r) => r.egress().map_or(Ok(()), |e| e.status()),
        Err(why) => Err(why),
    }
}
