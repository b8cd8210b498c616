//! The Docker side of a run: the security profile every hako container gets (one place),
//! the labels that identify hako's containers, and the small lifecycle operations the runner
//! composes (create, stop → kill → remove and confirm, orphan cleanup).
//!
//! Everything goes through the Engine API (bollard). Every call is bounded by a deadline of
//! our own: bollard's timeout only covers response headers and is whole seconds.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, HostConfigLogConfig, Mount, MountType,
    NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListNetworksOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use super::engine::{
    Attached, BoxControl, BoxKind, ContainerSpec, Engine, EngineError, Frame, FrameStream,
    ImageInfo, Inspected, Listed, ListedNetwork, NetworkSpec, ProcessState,
};

/// Docker as hako's engine: a client of the daemon's Engine API. Everything of a box goes
/// through here; the install's egress proxy and its networks (`proxy_container.rs`) use the
/// same client.
#[derive(Clone)]
pub struct DockerEngine(Docker);

impl DockerEngine {
    /// A client of the daemon at `socket` (`unix:///…` or a path); no I/O until the first call.
    pub fn connect(socket: &str) -> Result<DockerEngine, EngineError> {
        Docker::connect_with_unix(socket, 120, bollard::API_DEFAULT_VERSION)
            .map(DockerEngine)
            .map_err(|e| EngineError::Unavailable {
                socket: socket.to_owned(),
                message: e.to_string(),
            })
    }

    /// A client of the daemon `DOCKER_HOST` names (or the default socket).
    pub fn connect_default() -> Result<DockerEngine, EngineError> {
        Self::connect(&socket_path())
    }

    /// The bollard client, for the proxy's networks (`proxy_container.rs`) and callers that
    /// manage daemons rather than boxes (`hako up`).
    pub fn client(&self) -> &Docker {
        &self.0
    }
}

impl EngineError {
    /// Classifies a bollard error from a call about `what`.
    pub fn from_bollard(e: BollardError, what: &str) -> Self {
        match e {
            BollardError::DockerResponseServerError {
                status_code: 404,
                message,
            } => {
                if message.contains("image") {
                    EngineError::ImageMissing(what.to_owned())
                } else {
                    EngineError::NotFound(what.to_owned())
                }
            }
            BollardError::DockerResponseServerError {
                status_code: 409,
                message,
            } if message.contains("is not running") => EngineError::NotRunning(what.to_owned()),
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => EngineError::Api {
                status: Some(status_code),
                message,
            },
            BollardError::IOError { err } => EngineError::Unavailable {
                socket: socket_path(),
                message: err.to_string(),
            },
            BollardError::HyperResponseError { err } => EngineError::Unavailable {
                socket: socket_path(),
                message: err.to_string(),
            },
            // The connection itself failed (refused, no socket): the daemon is not there.
            BollardError::HyperLegacyError { err } => EngineError::Unavailable {
                socket: socket_path(),
                message: hako_shared::error_chain(&err),
            },
            BollardError::SocketNotFoundError(path) => EngineError::Unavailable {
                socket: path,
                message: "no such socket".into(),
            },
            BollardError::RequestTimeoutError => EngineError::Unavailable {
                socket: socket_path(),
                message: "request timed out".into(),
            },
            other => {
                let text = other.to_string();
                let lower = text.to_ascii_lowercase();
                if lower.contains("connect") || lower.contains("no such file") {
                    EngineError::Unavailable {
                        socket: socket_path(),
                        message: text,
                    }
                } else {
                    EngineError::api(text)
                }
            }
        }
    }
}

/// Docker as the engine of a run's supervision: each call a bounded Engine API call.
impl BoxControl for DockerEngine {
    fn wait(&self, id: &str) -> BoxFuture<'static, Result<i64, EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move {
            let opts = WaitContainerOptionsBuilder::new()
                .condition("not-running")
                .build();
            let mut s = docker.wait_container(&id, Some(opts));
            match s.next().await {
                Some(Ok(r)) => Ok(r.status_code),
                // A non-zero exit comes as this "error".
                Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
                Some(Err(e)) => Err(EngineError::from_bollard(e, &id)),
                None => Err(EngineError::api("wait stream ended without a status")),
            }
        })
    }

    fn stop(
        &self,
        id: &str,
        grace: Duration,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move {
            let secs = grace.as_secs().min(i32::MAX as u64) as i32;
            let opts = StopContainerOptionsBuilder::new().t(secs).build();
            bounded(
                "stop",
                grace + limit,
                &id,
                docker.stop_container(&id, Some(opts)),
            )
            .await
        })
    }

    fn signal(
        &self,
        id: &str,
        sig: &'static str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move { signal(&docker, &id, sig, limit).await })
    }

    fn state(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ProcessState, EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move {
            let info = bounded("inspect", limit, &id, docker.inspect_container(&id, None)).await?;
            let state = info.state.unwrap_or_default();
            Ok(ProcessState {
                running: state.running.unwrap_or(false),
                exit_code: state.exit_code,
            })
        })
    }

    fn list(
        &self,
        label: &'static str,
        value: Option<&str>,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Vec<Listed>, EngineError>> {
        let docker = self.0.clone();
        let value = value.map(str::to_owned);
        Box::pin(async move { list_by(&docker, label, value.as_deref(), limit).await })
    }

    fn remove(
        &self,
        id: &str,
        stop: Option<Duration>,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move {
            match stop {
                Some(grace) => stop_and_remove(&docker, &id, grace, limit).await,
                None => remove(&docker, &id, limit).await,
            }
        })
    }
}

/// A Docker output stream (attach or logs) as the engine's frames; stdin echoes are dropped.
pub fn frames(
    stream: impl futures_util::Stream<Item = Result<LogOutput, BollardError>> + Send + 'static,
    what: &str,
) -> FrameStream {
    let what = what.to_owned();
    stream
        .filter_map(move |item| {
            let out = match item {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    Some(Ok(Frame::Stdout(message)))
                }
                Ok(LogOutput::StdErr { message }) => Some(Ok(Frame::Stderr(message))),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(EngineError::from_bollard(e, &what))),
            };
            std::future::ready(out)
        })
        .boxed()
}

/// The socket hako talks to (from `DOCKER_HOST` or the default).
pub fn socket_path() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| h.starts_with("unix://"))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
}

/// Runs a Docker call with a deadline.
pub async fn bounded<T>(
    what: &'static str,
    limit: Duration,
    subject: &str,
    fut: impl Future<Output = Result<T, BollardError>>,
) -> Result<T, EngineError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(|e| EngineError::from_bollard(e, subject)),
        Err(_) => Err(EngineError::Timeout(what, limit)),
    }
}

/// Every hako container's log: kept on disk for re-adoption, at most 2 × 16 MiB.
pub(crate) fn log_config() -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_owned(), "16m".to_owned()),
            ("max-file".to_owned(), "2".to_owned()),
        ])),
    }
}

/// Size of the writable `/tmp`.
const TMPFS_TMP: &str = "rw,nosuid,nodev,size=256m";

/// The create request: `spec` plus the security defaults every hako container gets.
pub fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let mounts = spec
        .mounts
        .iter()
        .map(|m| Mount {
            target: Some(m.target.clone()),
            source: Some(m.source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(m.readonly),
            ..Default::default()
        })
        .collect();
    let host = HostConfig {
        mounts: Some(mounts),
        // Least privilege: no capabilities, no privilege gain through setuid binaries.
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        privileged: Some(false),
        readonly_rootfs: Some(true),
        tmpfs: (spec.kind == BoxKind::Agent)
            .then(|| HashMap::from([("/tmp".to_owned(), TMPFS_TMP.to_owned())])),
        memory: Some(spec.limits.memory),
        memory_swap: Some(spec.limits.memory),
        nano_cpus: Some((spec.limits.cpus * 1e9) as i64),
        pids_limit: Some(spec.limits.pids),
        network_mode: Some(spec.network.clone()),
        ipc_mode: Some("private".into()),
        runtime: spec.runtime.clone(),
        // An init as PID 1 forwards SIGTERM and SIGUSR1 to the agent and reaps zombies.
        init: Some(true),
        // Output must outlive the daemon (re-adoption reads it back); bounded on disk.
        auto_remove: Some(false),
        log_config: Some(log_config()),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        user: Some(spec.user.clone()),
        env: Some(spec.env.clone()),
        cmd: spec.cmd.clone(),
        labels: Some(spec.labels.clone()),
        working_dir: (spec.kind == BoxKind::Agent).then(|| super::mounts::WORKSPACE.into()),
        open_stdin: Some(spec.stdin),
        stdin_once: Some(spec.stdin),
        attach_stdin: Some(spec.stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        network_disabled: Some(spec.network == "none"),
        host_config: Some(host),
        ..Default::default()
    }
}

/// Creates a container from `spec`; returns its id.
pub async fn create(
    docker: &Docker,
    spec: &ContainerSpec,
    limit: Duration,
) -> Result<String, EngineError> {
    let opts = CreateContainerOptionsBuilder::new()
        .name(&spec.name)
        .build();
    match bounded(
        "create",
        limit,
        &spec.image,
        docker.create_container(Some(opts), create_body(spec)),
    )
    .await
    {
        Ok(r) => Ok(r.id),
        Err(EngineError::NotFound(_)) => Err(EngineError::ImageMissing(spec.image.clone())),
        Err(e) => Err(e),
    }
}

/// Sends `signal` to a container's PID 1 (the init, which forwards it).
pub async fn signal(
    docker: &Docker,
    id: &str,
    signal: &str,
    limit: Duration,
) -> Result<(), EngineError> {
    let opts = KillContainerOptionsBuilder::new().signal(signal).build();
    bounded("kill", limit, id, docker.kill_container(id, Some(opts))).await
}

/// Stop (SIGTERM, then SIGKILL after `grace`), then remove, then confirm the container is
/// gone. Never trusts a client process to do it: everything is by container id.
pub async fn stop_and_remove(
    docker: &Docker,
    id: &str,
    grace: Duration,
    limit: Duration,
) -> Result<(), EngineError> {
    let t = grace.as_secs().min(i32::MAX as u64) as i32;
    let stop = StopContainerOptionsBuilder::new().t(t).build();
    match bounded(
        "stop",
        grace + limit,
        id,
        docker.stop_container(id, Some(stop)),
    )
    .await
    {
        Ok(()) | Err(EngineError::NotFound(_)) => {}
        // 304 (already stopped) and friends: removal with force covers them.
        Err(e) if !e.is_unavailable() => tracing::debug!(container = id, error = %e, "stop"),
        Err(e) => return Err(e),
    }
    remove(docker, id, limit).await
}

/// Force-removes a container and confirms it is gone.
pub async fn remove(docker: &Docker, id: &str, limit: Duration) -> Result<(), EngineError> {
    let opts = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match bounded("remove", limit, id, docker.remove_container(id, Some(opts))).await {
        Ok(()) | Err(EngineError::NotFound(_)) => {}
        // "removal already in progress" resolves by itself; the check below waits for it.
        Err(EngineError::Api { message, .. }) if message.contains("in progress") => {}
        Err(e) => return Err(e),
    }
    // Check that it is gone: a container left behind is how a run burns for nine hours.
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match bounded("inspect", limit, id, docker.inspect_container(id, None)).await {
            Err(EngineError::NotFound(_)) => return Ok(()),
            Err(e) if e.is_unavailable() => return Err(e),
            _ if tokio::time::Instant::now() >= deadline => {
                return Err(EngineError::api(format!(
                    "container {id} still present after removal"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Lists every container (running or not) whose label `label` is `value`.
async fn list_by(
    docker: &Docker,
    label: &str,
    value: Option<&str>,
    limit: Duration,
) -> Result<Vec<Listed>, EngineError> {
    let filter = match value {
        Some(value) => format!("{label}={value}"),
        None => label.to_owned(),
    };
    let filters = HashMap::from([("label".to_owned(), vec![filter])]);
    let opts = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let what = value.unwrap_or(label);
    let list = bounded("list", limit, what, docker.list_containers(Some(opts))).await?;
    Ok(list
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels.unwrap_or_default();
            // Belt and braces: the filter is the daemon's; re-check it here.
            let kept = labels
                .get(label)
                .is_some_and(|v| value.is_none_or(|want| v == want));
            kept.then(|| listed(c.id, c.names, c.state, labels))
        })
        .filter(|c| !c.id.is_empty())
        .collect())
}

fn listed(
    id: Option<String>,
    names: Option<Vec<String>>,
    state: Option<impl ToString>,
    labels: HashMap<String, String>,
) -> Listed {
    let name = names
        .unwrap_or_default()
        .into_iter()
        .next()
        .map(|n| n.trim_start_matches('/').to_owned())
        .unwrap_or_default();
    Listed {
        id: id.unwrap_or_default(),
        name,
        state: state.map(|s| s.to_string()).unwrap_or_default(),
        labels,
    }
}

/// The OCI runtimes the Docker daemon lists.
pub async fn runtimes(docker: &Docker, limit: Duration) -> Result<Vec<String>, EngineError> {
    let info = bounded("info", limit, "daemon", docker.info()).await?;
    let mut names: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    names.sort();
    Ok(names)
}

impl Engine for DockerEngine {
    fn create(
        &self,
        spec: &ContainerSpec,
        limit: Duration,
    ) -> BoxFuture<'static, Result<String, EngineError>> {
        let docker = self.0.clone();
        let spec = spec.clone();
        Box::pin(async move { create(&docker, &spec, limit).await })
    }

    fn attach(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Attached, EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move {
            let opts = AttachContainerOptionsBuilder::new()
                .stdin(true)
                .stdout(true)
                .stderr(true)
                .stream(true)
                .logs(false)
                .build();
            let a = bounded(
                "attach",
                limit,
                &id,
                docker.attach_container(&id, Some(opts)),
            )
            .await?;
            Ok(Attached {
                stdin: a.input,
                output: frames(a.output, "attach"),
            })
        })
    }

    fn start(&self, id: &str, limit: Duration) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(
            async move { bounded("start", limit, &id, docker.start_container(&id, None)).await },
        )
    }

    fn inspect(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Inspected, EngineError>> {
        let docker = self.0.clone();
        let id = id.to_owned();
        Box::pin(async move {
            let info = bounded("inspect", limit, &id, docker.inspect_container(&id, None)).await?;
            let state = info.state.unwrap_or_default();
            let config = info.config.unwrap_or_default();
            let addresses = info
                .network_settings
                .and_then(|n| n.networks)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(net, e)| Some((net, e.ip_address.filter(|ip| !ip.is_empty())?)))
                .collect();
            Ok(Inspected {
                state: ProcessState {
                    running: state.running.unwrap_or(false),
                    exit_code: state.exit_code,
                },
                labels: config.labels.unwrap_or_default(),
                image: config.image.unwrap_or_default(),
                addresses,
            })
        })
    }

    fn logs(&self, id: &str, follow: bool) -> FrameStream {
        let opts = LogsOptionsBuilder::new()
            .follow(follow)
            .stdout(true)
            .stderr(true)
            .build();
        frames(self.0.logs(id, Some(opts)), "logs")
    }

    fn archive(&self, id: &str, path: &str) -> BoxStream<'static, Result<Bytes, EngineError>> {
        let opts = bollard::query_parameters::DownloadFromContainerOptionsBuilder::new()
            .path(path)
            .build();
        let subject = id.to_owned();
        self.0
            .download_from_container(id, Some(opts))
            .map(move |r| r.map_err(|e| EngineError::from_bollard(e, &subject)))
            .boxed()
    }

    fn image(
        &self,
        reference: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ImageInfo, EngineError>> {
        let docker = self.0.clone();
        let reference = reference.to_owned();
        Box::pin(async move {
            let i = match bounded(
                "inspect image",
                limit,
                &reference,
                docker.inspect_image(&reference),
            )
            .await
            {
                Ok(i) => i,
                Err(EngineError::NotFound(_)) => return Err(EngineError::ImageMissing(reference)),
                Err(e) => return Err(e),
            };
            Ok(ImageInfo {
                id: i.id.unwrap_or_default(),
                labels: i.config.and_then(|c| c.labels).unwrap_or_default(),
            })
        })
    }

    fn runtimes(&self, limit: Duration) -> BoxFuture<'static, Result<Vec<String>, EngineError>> {
        let docker = self.0.clone();
        Box::pin(async move { runtimes(&docker, limit).await })
    }

    fn version(&self, limit: Duration) -> BoxFuture<'static, Result<String, EngineError>> {
        let docker = self.0.clone();
        Box::pin(async move {
            let v = bounded("version", limit, "daemon", docker.version()).await?;
            Ok(v.api_version.unwrap_or_default())
        })
    }

    fn create_network(
        &self,
        spec: &NetworkSpec,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let mut options = HashMap::new();
        if spec.host_unreachable {
            // The host gets no address on the bridge: a box cannot reach the host (an internal
            // network still routes to its gateway, which is the host).
            options.insert(
                "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                "true".to_owned(),
            );
            options.insert(
                "com.docker.network.bridge.enable_ip_masquerade".to_owned(),
                "false".to_owned(),
            );
        }
        let req = NetworkCreateRequest {
            name: spec.name.clone(),
            driver: Some("bridge".into()),
            internal: Some(spec.internal),
            attachable: Some(false),
            options: Some(options),
            labels: Some(spec.labels.clone()),
            ..Default::default()
        };
        Box::pin(async move {
            let name = req.name.clone();
            match bounded("network create", limit, &name, docker.create_network(req)).await {
                Ok(_) => Ok(()),
                // A retry after a partial failure: the network is there.
                Err(e @ EngineError::Api { .. })
                    if e.is_status(409) || e.to_string().contains("already exists") =>
                {
                    Ok(())
                }
                Err(e) => Err(e),
            }
        })
    }

    fn connect(
        &self,
        network: &str,
        id: &str,
        alias: Option<&str>,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let network = network.to_owned();
        let req = NetworkConnectRequest {
            container: id.to_owned(),
            endpoint_config: Some(EndpointSettings {
                aliases: alias.map(|a| vec![a.to_owned()]),
                ..Default::default()
            }),
        };
        Box::pin(async move {
            match bounded(
                "network connect",
                limit,
                &network,
                docker.connect_network(&network, req),
            )
            .await
            {
                Ok(()) => Ok(()),
                // Joined already (a retry after a partial failure).
                Err(EngineError::Api { message, .. }) if message.contains("already exists") => {
                    Ok(())
                }
                Err(e) => Err(e),
            }
        })
    }

    fn disconnect(
        &self,
        network: &str,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let network = network.to_owned();
        let req = NetworkDisconnectRequest {
            container: id.to_owned(),
            force: Some(true),
        };
        Box::pin(async move {
            match bounded(
                "network disconnect",
                limit,
                &network,
                docker.disconnect_network(&network, req),
            )
            .await
            {
                Ok(()) | Err(EngineError::NotFound(_)) => Ok(()),
                // Not connected.
                Err(e @ EngineError::Api { .. })
                    if e.is_status(403) || e.to_string().contains("not connected") =>
                {
                    Ok(())
                }
                Err(e) => Err(e),
            }
        })
    }

    fn remove_network(
        &self,
        name: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let docker = self.0.clone();
        let name = name.to_owned();
        Box::pin(async move {
            match bounded("network remove", limit, &name, docker.remove_network(&name)).await {
                Ok(()) | Err(EngineError::NotFound(_)) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn networks(
        &self,
        label: &'static str,
        value: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Vec<ListedNetwork>, EngineError>> {
        let docker = self.0.clone();
        let value = value.to_owned();
        Box::pin(async move {
            let filters = HashMap::from([("label".to_owned(), vec![format!("{label}={value}")])]);
            let opts = ListNetworksOptionsBuilder::new().filters(&filters).build();
            let list = bounded(
                "network list",
                limit,
                &value,
                docker.list_networks(Some(opts)),
            )
            .await?;
            Ok(list
                .into_iter()
                .filter_map(|n| {
                    let labels = n.labels.unwrap_or_default();
                    // The filter is the daemon's; check it again.
                    (labels.get(label) == Some(&value)).then_some(())?;
                    Some(ListedNetwork {
                        name: n.name?,
                        labels,
                    })
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Limits;
    use crate::mounts::MountEntry;

    #[test]
    fn every_container_gets_the_security_profile() {
        let spec = ContainerSpec {
            name: "n".into(),
            image: "img".into(),
            user: "1000:1000".into(),
            env: vec!["HOME=/home/agent".into()],
            cmd: None,
            mounts: vec![MountEntry {
                source: "/data/g".into(),
                target: "/workspace".into(),
                readonly: false,
            }],
            network: "none".into(),
            limits: Limits {
                memory: 1 << 30,
                cpus: 2.0,
                pids: 512,
            },
            labels: HashMap::new(),
            stdin: true,
            runtime: None,
            kind: crate::engine::BoxKind::Agent,
        };
        let body = create_body(&spec);
        let h = body.host_config.unwrap();
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(
            h.security_opt,
            Some(vec!["no-new-privileges:true".to_owned()])
        );
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.init, Some(true));
        assert_eq!(h.memory, Some(1 << 30));
        assert_eq!(h.memory_swap, Some(1 << 30));
        assert_eq!(h.nano_cpus, Some(2_000_000_000));
        assert_eq!(h.pids_limit, Some(512));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert!(h.tmpfs.unwrap().contains_key("/tmp"));
        assert_eq!(h.mounts.unwrap()[0].typ, Some(MountType::BIND));
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(
            (body.open_stdin, body.stdin_once, body.tty),
            (Some(true), Some(true), Some(false))
        );
    }
}
