//! Re-adoption: a container of this install left running (or exited) by a restart of its
//! supervisor is supervised again, from its logs, to its end like any run. Nothing here needs
//! the database: the deadline is the container's label (or, for a run that took a warm box,
//! the caller's record), the blocks already stored come from the caller.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::engine::EngineError;
use super::launch::LABEL_DEADLINE;
use super::outcome::Ending;
use super::output::RunOutput;
use super::supervise::Supervisor;
use super::{Adoption, LiveRun, RunControl, RunEnd, RunEvent, Runner};

impl Runner {
    /// Re-adopts a container of this install after a restart: its output is read back from
    /// the start (the replay of the blocks already stored, `prior`, is recognised and not
    /// re-sent), then it is supervised to the end like any run, under the deadline of its
    /// label. A container that already exited is finalized from its logs.
    pub async fn adopt(
        &self,
        a: Adoption,
        events: mpsc::Sender<RunEvent>,
        control: RunControl,
        live: Arc<LiveRun>,
    ) -> RunEnd {
        let mut st = RunOutput::adopted(&self.cfg, &a.run_id, &a.folder, a.prior);
        st.container_id = Some(a.container_id.clone());
        live.set_container(&a.container_id);
        let t = self.cfg.docker_timeout;
        let info = match self.engine.inspect(&a.container_id, t).await {
            Ok(i) => i,
            Err(e) => {
                let terminal = matches!(e, EngineError::NotFound(_));
                let ending = Ending::Failed {
                    error: format!("re-adoption: {e}"),
                    terminal,
                };
                return self.conclude(st, ending, &live).await;
            }
        };
        let running = info.state.running;
        let deadline_ms: Option<i64> = a
            .deadline_ms
            .or_else(|| info.labels.get(LABEL_DEADLINE).and_then(|v| v.parse().ok()));
        let now_ms = hako_shared::time::unix_millis(SystemTime::now());
        let remaining = deadline_ms.map_or(self.cfg.run_timeout, |d| {
            Duration::from_millis((d - now_ms).max(0) as u64)
        });
        let output = self.engine.logs(&a.container_id, running);
        if running {
            *live.gate.write().await = true;
        }
        let deadline = Instant::now() + remaining;
        let supervisor = Supervisor::new(
            self.hands(),
            &mut st,
            &a.container_id,
            output,
            deadline,
            a.close,
            &events,
            &control,
            &live,
        );
        match supervisor.run().await {
            None => RunEnd::Detached,
            Some(ending) => self.conclude(st, ending, &live).await,
        }
    }
}
