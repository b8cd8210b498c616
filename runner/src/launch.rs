//! Launching a run: after preparation (`prepare.rs`), its sidecars are started and waited
//! for, then the agent container is created, attached (before start, so no output is
//! missed), started, and given its one input line on stdin, which is then closed. A run
//! whose folder has a warm box equal to what it would create takes that box instead
//! (`warm.rs`) and only writes the input line.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use hako_shared::GroupFolder;
use hako_shared::contract::{
    BRAIN_ENV, LLM_API_ENV, MARKER_END_ENV, MARKER_START_ENV, MODEL_ENV, Markers, QUERY_TIMEOUT_ENV,
};
use hako_shared::ids::RunId;
use hako_shared::layout::{self, FolderDir};
use hako_shared::runs::{AgentKind, GroupSpec, Network, SidecarSpec};

use super::engine::{Attached, ContainerSpec, EngineError, FrameStream, Limits, labels};
use super::prepare::Prepared;
use super::safefs::SafeDir;
use super::warm::{Start, WarmBox};
use super::{Bound, LiveRun, RunError, RunSpec, Runner, config, mounts, seed};

/// Label: the run's deadline, in Unix milliseconds (so re-adoption needs no database).
pub(super) const LABEL_DEADLINE: &str = "io.hako.deadline";

/// A started agent container.
pub(super) struct Launched {
    /// Its id.
    pub id: String,
    /// Its output, attached before it started.
    pub output: FrameStream,
    /// The run's ceiling (counted from just before the agent's launch, or the warm box's
    /// take).
    pub deadline: Instant,
    /// Cold or warm.
    pub start: Start,
}

impl Runner {
    /// Prepares the run, starts its sidecars and launches its agent.
    pub(super) async fn start_run(
        &self,
        spec: &RunSpec,
        ceiling: Duration,
        live: &LiveRun,
    ) -> Result<Launched, RunError> {
        let prepared = self.prepare(spec).await?;
        // An allowlist run's network: internal, its only other member the egress proxy.
        let egress_net = match (&self.egress, spec.group.network) {
            (Some(e), Network::Allowlist) => {
                let net = e.attach_run(&spec.run_id, spec.folder.as_str()).await?;
                if !spec.brokered.is_empty() && !e.has_bundle() {
                    // The proxy has not handed out its CA yet: the box could not trust it.
                    let _ = e.detach_run(&spec.run_id).await;
                    return Err(RunError::Docker(EngineError::Api {
                        status: Some(503),
                        message:
                            "the egress proxy's CA bundle is not there yet (is the proxy ready?)"
                                .into(),
                    }));
                }
                Some(net)
            }
            (None, Network::Allowlist) => {
                return Err(RunError::Invalid(
                    "network \"allowlist\" needs the egress proxy (RUNED_EGRESS_IMAGE)".into(),
                ));
            }
            _ => None,
        };
        self.start_sidecars(spec, &prepared).await?;
        // Boxes of runs with sidecars or their own network are made per run, never warm.
        let warmable =
            self.cfg.warm_max > 0 && spec.group.sidecars.is_empty() && egress_net.is_none();
        let cspec = self
            .agent_spec(spec, &prepared, ceiling, egress_net)
            .await?;
        let deadline = Instant::now() + ceiling;
        let taken = if warmable {
            Some(
                self.take_warm(&spec.folder, &cspec, prepared.replaced)
                    .await,
            )
        } else {
            None
        };
        let (id, output, start) = match taken {
            Some(Ok(b)) => {
                let saved = b.saved;
                let (id, output) = self.feed_warm(spec, b, ceiling, deadline, live).await?;
                (id, output, Start::Warm { saved })
            }
            Some(Err(miss)) => {
                let (id, output) = self.launch(spec, &cspec, live).await?;
                (id, output, Start::Cold(Some(miss)))
            }
            None => {
                let (id, output) = self.launch(spec, &cspec, live).await?;
                (id, output, Start::Cold(None))
            }
        };
        Ok(Launched {
            id,
            output,
            deadline,
            start,
        })
    }

    pub(super) fn base_labels(
        &self,
        run_id: &RunId,
        folder: &GroupFolder,
        role: &str,
    ) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (labels::INSTALL.to_owned(), self.cfg.install_id.clone()),
            (labels::FOLDER.to_owned(), folder.to_string()),
            (labels::RUN.to_owned(), run_id.to_string()),
            (labels::ROLE.to_owned(), role.to_owned()),
        ]);
        if let Some(owner) = &self.cfg.owner {
            l.insert(labels::OWNER.to_owned(), owner.clone());
        }
        l
    }

    pub(super) fn container_name(&self, run_id: &RunId, suffix: &str) -> String {
        let clean: String = run_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(64)
            .collect();
        format!("hako-{}-{clean}{suffix}", self.cfg.install_id)
    }

    fn network_for(&self, g: &GroupSpec, egress_net: Option<String>) -> String {
        match (g.network, egress_net) {
            (Network::Allowlist, Some(net)) => net,
            (Network::None | Network::Allowlist, _) => "none".into(),
            (Network::Open, _) => self.cfg.open_network.clone(),
        }
    }

    /// Starts each sidecar and waits (bounded) for its socket.
    async fn start_sidecars(&self, spec: &RunSpec, p: &Prepared) -> Result<(), RunError> {
        let cfg = &self.cfg;
        let mut sc_dir: Option<SafeDir> = None;
        for sc in &spec.group.sidecars {
            let socket = seed::sidecar_socket(&sc.name);
            let mut spec_c = self.sidecar_spec(spec, sc, &socket, p);
            // The group's code either way: the same box as its agent.
            spec_c.runtime = self.runtime_for(&spec.group, &spec_c.network).await?;
            let id = self.create_box(&spec_c).await?;
            self.engine.start(&id, cfg.docker_timeout).await?;
            if sc_dir.is_none() {
                sc_dir = Some(
                    self.storage
                        .root()
                        .subdir(&layout::dir_rel(&spec.folder, FolderDir::Sidecars))?,
                );
            }
            let Some(dir) = sc_dir.as_ref() else { continue };
            let sock_name = format!("{}.sock", sc.name);
            let deadline = Instant::now() + cfg.sidecar_ready;
            loop {
                if dir.kind(&sock_name)? == Some(rustix::fs::FileType::Socket) {
                    break;
                }
                let running = self.engine.state(&id, cfg.docker_timeout).await?.running;
                if !running {
                    return Err(RunError::Invalid(format!(
                        "sidecar {:?} exited before creating its socket",
                        sc.name
                    )));
                }
                if Instant::now() >= deadline {
                    return Err(RunError::Invalid(format!(
                        "sidecar {:?} did not create {socket} within {:?}",
                        sc.name, cfg.sidecar_ready
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    fn sidecar_spec(
        &self,
        spec: &RunSpec,
        sc: &SidecarSpec,
        socket: &str,
        p: &Prepared,
    ) -> ContainerSpec {
        ContainerSpec {
            name: self.container_name(&spec.run_id, &format!("-sc-{}", sc.name)),
            image: sc.image.clone(),
            user: format!("{}:{}", self.cfg.agent_user.uid, self.cfg.agent_user.gid),
            env: vec![format!("HAKO_SIDECAR_SOCKET={socket}")],
            cmd: (!sc.command.is_empty()).then(|| {
                sc.command
                    .iter()
                    .map(|a| a.replace("{socket}", socket))
                    .collect()
            }),
            mounts: p.sidecar_mounts.clone(),
            network: "none".into(),
            limits: Limits {
                memory: sc.memory.map_or(256 << 20, |m| m.0 as i64),
                cpus: sc.cpus.unwrap_or(0.5),
                pids: 128,
            },
            labels: self.base_labels(&spec.run_id, &spec.folder, "sidecar"),
            stdin: false,
            runtime: None,
            kind: crate::engine::BoxKind::Agent,
        }
    }

    /// The agent image of a group's runs.
    pub(super) fn image_for(&self, g: &GroupSpec) -> String {
        match g.agent {
            AgentKind::Claude => self.cfg.claude_image.clone(),
            AgentKind::Codex => self.cfg.codex_image.clone(),
            AgentKind::Hako => g
                .image
                .clone()
                .unwrap_or_else(|| self.cfg.default_image.clone()),
        }
    }

    /// The agent container a run asks for: what a cold start creates, and what a warm box
    /// must equal to serve the run (`warm`).
    pub(super) async fn agent_spec(
        &self,
        spec: &RunSpec,
        p: &Prepared,
        ceiling: Duration,
        egress_net: Option<String>,
    ) -> Result<ContainerSpec, RunError> {
        let cfg = &self.cfg;
        let g = &spec.group;
        let mut env = vec![
            format!("HOME={}", mounts::HOME),
            format!(
                "{QUERY_TIMEOUT_ENV}={}",
                config::query_timeout(ceiling).as_millis()
            ),
            format!("ARIZUKO_FOLDER={}", spec.folder),
        ];
        if let Some(llm) = &g.llm {
            // Names only (checked by GroupSpec::validate); the key stays with routd's gateway.
            env.push(format!("{MODEL_ENV}={}", llm.model));
            env.push(format!("{LLM_API_ENV}={}", llm.api.as_str()));
        }
        if let Some((_, brain, _)) = g.agent.program() {
            env.push(format!("{BRAIN_ENV}={brain}"));
        }
        if cfg.markers != Markers::default() {
            env.push(format!("{MARKER_START_ENV}={}", cfg.markers.start));
            env.push(format!("{MARKER_END_ENV}={}", cfg.markers.end));
        }
        if egress_net.is_some() {
            // The proxy's address only: the token travels on stdin, and the agent puts it
            // into its tools' proxy variables itself (specs/egress.md).
            env.extend(super::proxy_container::Egress::agent_env());
            // Brokered secrets: each placeholder under its secret's name, never a value, and
            // the CA bundle where every common client looks for it.
            env.extend(super::proxy_container::Egress::brokered_env(&spec.brokered));
        }
        let mut labels = self.base_labels(&spec.run_id, &spec.folder, "agent");
        labels.insert(labels::TURN.to_owned(), spec.turn_text());
        let deadline_ms = hako_shared::time::unix_millis(SystemTime::now() + ceiling);
        labels.insert(LABEL_DEADLINE.to_owned(), deadline_ms.to_string());
        let network = self.network_for(g, egress_net);
        let runtime = self.runtime_for(g, &network).await?;
        let image = self.image_for(g);
        let mut mounts = p.mounts.clone();
        let programs = self.program_mounts(&image, &mounts).await;
        mounts.extend(programs);
        Ok(ContainerSpec {
            name: self.container_name(&spec.run_id, ""),
            image,
            user: format!("{}:{}", cfg.agent_user.uid, cfg.agent_user.gid),
            env,
            cmd: None,
            mounts,
            network,
            limits: g.limits(&cfg.limits),
            labels,
            stdin: true,
            runtime,
            kind: crate::engine::BoxKind::Agent,
        })
    }

    /// Attaches to a created agent container (stdin, stdout, stderr), then starts it: attached
    /// first, so that none of its output is missed. A cold run and a warm box both start so.
    pub(super) async fn attach_and_start(&self, id: &str) -> Result<Attached, EngineError> {
        let t = self.cfg.docker_timeout;
        let attached = self.engine.attach(id, t).await?;
        self.engine.start(id, t).await?;
        Ok(attached)
    }

    /// Creates a box (an agent, a sidecar or a warm box).
    pub(super) async fn create_box(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        let id = self.engine.create(spec, self.cfg.docker_timeout).await?;
        hako_shared::failpoint::hit("runed.container.created");
        Ok(id)
    }

    /// Creates, attaches and starts the agent container and writes its input line.
    async fn launch(
        &self,
        spec: &RunSpec,
        cspec: &ContainerSpec,
        live: &LiveRun,
    ) -> Result<(String, FrameStream), RunError> {
        let id = self.create_box(cspec).await?;
        live.set_container(&id);
        let attached = self.attach_and_start(&id).await?;
        // The agent counts the env's deadline from its own start, just after this.
        self.write_input(spec, attached.stdin, None, live).await?;
        Ok((id, attached.output))
    }

    /// Gives a warm box the run: recorded as the run's (the caller's hook) before it gets the
    /// input line, which carries the query deadline left at `deadline`.
    async fn feed_warm(
        &self,
        spec: &RunSpec,
        b: WarmBox,
        ceiling: Duration,
        deadline: Instant,
        live: &LiveRun,
    ) -> Result<(String, FrameStream), RunError> {
        live.set_container(&b.container);
        if let Some(hook) = &spec.bind {
            let left = deadline.saturating_duration_since(Instant::now());
            (hook.0)(Bound {
                container_id: b.container.clone(),
                deadline_ms: hako_shared::time::unix_millis(SystemTime::now() + left),
            })
            .await;
        }
        // The margin a cold agent gets before the ceiling, from what is left of it.
        let spent = ceiling.saturating_sub(deadline.saturating_duration_since(Instant::now()));
        let query = config::query_timeout(ceiling).saturating_sub(spent);
        self.write_input(spec, b.stdin, Some(query.as_millis().max(1) as u64), live)
            .await?;
        Ok((b.container, b.output))
    }

    /// Writes the run's one input line to the agent's stdin and closes it; from then on the
    /// agent can take follow-ups.
    async fn write_input(
        &self,
        spec: &RunSpec,
        mut stdin: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        query_timeout_ms: Option<u64>,
        live: &LiveRun,
    ) -> Result<(), RunError> {
        let t = self.cfg.docker_timeout;
        let mut input = spec.input.clone();
        input.folder = spec.folder.to_string();
        input.turn_id = spec.turn_text();
        input.run_id = spec.run_id.to_string();
        input.query_timeout_ms = query_timeout_ms;
        let mut line = serde_json::to_vec(&input).map_err(|e| RunError::Invalid(e.to_string()))?;
        line.push(b'\n');
        let write = async {
            stdin.write_all(&line).await?;
            stdin.flush().await?;
            stdin.shutdown().await
        };
        match tokio::time::timeout(t, write).await {
            Ok(Ok(())) => {}
            // The agent may exit before reading its input; its output decides the outcome.
            Ok(Err(e)) => {
                tracing::warn!(run = %spec.run_id, error = %e, "writing the input line failed")
            }
            Err(_) => return Err(EngineError::Timeout("stdin", t).into()),
        }
        drop(line);
        *live.gate.write().await = true;
        Ok(())
    }
}
