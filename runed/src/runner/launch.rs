//! Launching a run: after preparation (`prepare.rs`), its sidecars are started and waited
//! for, then the agent container is created, attached (before start, so no output is
//! missed), started, and given its one input line on stdin, which is then closed.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use bollard::query_parameters::AttachContainerOptionsBuilder;
use futures_util::{StreamExt, TryStreamExt};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use hako_shared::GroupFolder;
use hako_shared::contract::{
    BRAIN_ENV, LLM_API_ENV, MARKER_END_ENV, MARKER_START_ENV, MODEL_ENV, Markers, QUERY_TIMEOUT_ENV,
};
use hako_shared::layout::{self, FolderDir};
use hako_shared::runs::{AgentKind, GroupSpec, Network, SidecarSpec};

use super::docker::{self, ContainerSpec, DockerError, Limits, labels};
use super::prepare::Prepared;
use super::safefs::SafeDir;
use super::supervise::OutputStream;
use super::{LiveRun, RunError, RunSpec, Runner, config, mounts, seed};

/// Label: the run's deadline, in Unix milliseconds (so re-adoption needs no database).
pub(super) const LABEL_DEADLINE: &str = "io.hako.deadline";

/// A started agent container.
pub(super) struct Launched {
    /// Its id.
    pub id: String,
    /// Its output, attached before it started.
    pub output: OutputStream,
    /// The run's ceiling (counted from just before the agent's launch).
    pub deadline: Instant,
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
                Some(e.attach_run(&spec.run_id, spec.folder.as_str()).await?)
            }
            (None, Network::Allowlist) => {
                return Err(RunError::Invalid(
                    "network \"allowlist\" needs the egress proxy (RUNED_EGRESS_IMAGE)".into(),
                ));
            }
            _ => None,
        };
        self.start_sidecars(spec, &prepared).await?;
        let deadline = Instant::now() + ceiling;
        let (id, output) = self
            .launch(spec, &prepared, ceiling, live, egress_net)
            .await?;
        Ok(Launched {
            id,
            output,
            deadline,
        })
    }

    fn base_labels(
        &self,
        run_id: &str,
        folder: &GroupFolder,
        role: &str,
    ) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (labels::INSTALL.to_owned(), self.cfg.install_id.clone()),
            (labels::FOLDER.to_owned(), folder.to_string()),
            (labels::RUN.to_owned(), run_id.to_owned()),
            (labels::ROLE.to_owned(), role.to_owned()),
        ]);
        if let Some(owner) = &self.cfg.owner {
            l.insert(labels::OWNER.to_owned(), owner.clone());
        }
        l
    }

    fn container_name(&self, run_id: &str, suffix: &str) -> String {
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
            let id = docker::create(&self.docker, &spec_c, cfg.docker_timeout).await?;
            docker::bounded(
                "start",
                cfg.docker_timeout,
                &id,
                self.docker.start_container(&id, None),
            )
            .await?;
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
                let running = docker::bounded(
                    "inspect",
                    cfg.docker_timeout,
                    &id,
                    self.docker.inspect_container(&id, None),
                )
                .await?
                .state
                .and_then(|s| s.running)
                .unwrap_or(false);
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
        }
    }

    /// Creates, attaches and starts the agent container and writes its input line.
    async fn launch(
        &self,
        spec: &RunSpec,
        p: &Prepared,
        ceiling: Duration,
        live: &LiveRun,
        egress_net: Option<String>,
    ) -> Result<(String, OutputStream), RunError> {
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
        if g.agent == AgentKind::Claude {
            env.push(format!("{BRAIN_ENV}=claude"));
        }
        if cfg.markers != Markers::default() {
            env.push(format!("{MARKER_START_ENV}={}", cfg.markers.start));
            env.push(format!("{MARKER_END_ENV}={}", cfg.markers.end));
        }
        if egress_net.is_some() {
            // The proxy's address only: the token travels on stdin, and the agent puts it
            // into its tools' proxy variables itself (specs/egress.md).
            env.extend(super::egress::Egress::agent_env());
        }
        let mut labels = self.base_labels(&spec.run_id, &spec.folder, "agent");
        labels.insert(labels::TURN.to_owned(), spec.turn_id.clone());
        let deadline_ms = hako_shared::time::unix_millis(SystemTime::now() + ceiling);
        labels.insert(LABEL_DEADLINE.to_owned(), deadline_ms.to_string());
        let network = self.network_for(g, egress_net);
        let runtime = self.runtime_for(g, &network).await?;
        let cspec = ContainerSpec {
            name: self.container_name(&spec.run_id, ""),
            image: match g.agent {
                AgentKind::Claude => cfg.claude_image.clone(),
                AgentKind::Hako => g.image.clone().unwrap_or_else(|| cfg.default_image.clone()),
            },
            user: format!("{}:{}", cfg.agent_user.uid, cfg.agent_user.gid),
            env,
            cmd: None,
            mounts: p.mounts.clone(),
            network,
            limits: g.limits(&cfg.limits),
            labels,
            stdin: true,
            runtime,
        };
        let t = cfg.docker_timeout;
        let id = docker::create(&self.docker, &cspec, t).await?;
        live.set_container(&id);
        let opts = AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .logs(false)
            .build();
        let attached = docker::bounded(
            "attach",
            t,
            &id,
            self.docker.attach_container(&id, Some(opts)),
        )
        .await?;
        docker::bounded("start", t, &id, self.docker.start_container(&id, None)).await?;
        let mut input = spec.input.clone();
        input.folder = spec.folder.to_string();
        input.turn_id = spec.turn_id.clone();
        input.run_id = spec.run_id.clone();
        let mut line = serde_json::to_vec(&input).map_err(|e| RunError::Invalid(e.to_string()))?;
        line.push(b'\n');
        let mut stdin = attached.input;
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
            Err(_) => return Err(DockerError::Timeout("stdin", t).into()),
        }
        drop(line);
        *live.gate.write().await = true;
        let output = attached
            .output
            .map_err(|e| DockerError::from_bollard(e, "attach"))
            .boxed();
        Ok((id, output))
    }
}
