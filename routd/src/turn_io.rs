//! A turn's sockets served: its tools on `mcp.sock` and its LLM gateway on `api.sock`
//! (`sockets.rs` binds them and keeps them while the turn lives).

use std::sync::Arc;

use hako_mcp::ServeOptions;
use hako_shared::ids::TurnId;
use tokio_util::sync::CancellationToken;

use crate::sockets::{SocketError, listen, remove};
use crate::state::Shared;
use crate::tools::RoutdTools;

/// Binds and serves the turn's sockets (again, if routd restarted); a turn already open
/// is left as it is.
pub(crate) async fn open(sh: &Arc<Shared>, turn_id: &TurnId) -> Result<(), SocketError> {
    if sh.turns.sockets.is_open(turn_id) {
        return Ok(());
    }
    let t = sh
        .store
        .turn(turn_id)
        .await?
        .ok_or_else(|| SocketError::Gone(format!("no turn {turn_id}")))?;
    let scope = crate::tools::scope_of(sh, &t)
        .await?
        .ok_or_else(|| SocketError::Gone(format!("no group {}", t.folder)))?;
    let folder = scope.folder.clone();
    let scope = Arc::new(scope);
    let (mcp, mcp_bound) = listen(sh.cfg.layout.mcp_socket(&folder)).await?;
    let (api, api_bound) = match listen(sh.cfg.layout.api_socket(&folder)).await {
        Ok(l) => l,
        Err(e) => {
            remove(&mcp_bound);
            return Err(e);
        }
    };
    let ended = CancellationToken::new();
    sh.turns.tasks.spawn(hako_mcp::serve(
        mcp,
        Arc::new(RoutdTools { sh: sh.clone() }),
        scope,
        ended.clone(),
        sh.stopping.clone(),
        ServeOptions::default(),
    ));
    let gateway = crate::gateway::router(crate::gateway::turn(sh, &folder, turn_id));
    let (stop_a, stop_b) = (ended.clone(), sh.stopping.clone());
    // A gateway serves one agent: its calls in flight and a few more connections.
    let limits = hako_shared::http::ServeLimits {
        max_connections: sh.cfg.llm.max_calls + crate::gateway::SPARE_CONNECTIONS,
        ..sh.cfg.serve
    };
    sh.turns.tasks.spawn(async move {
        let shutdown = async move {
            tokio::select! {
                () = stop_a.cancelled() => {},
                () = stop_b.cancelled() => {},
            }
        };
        if let Err(e) = hako_shared::http::serve_with(api, gateway, shutdown, limits).await {
            tracing::error!(error = %e, "the turn's gateway stopped");
        }
    });
    let path = mcp_bound.path.clone();
    tracing::info!(turn = %turn_id, socket = %path.display(), "the turn's tools are served");
    sh.turns
        .sockets
        .insert(turn_id, ended, vec![mcp_bound, api_bound]);
    Ok(())
}
