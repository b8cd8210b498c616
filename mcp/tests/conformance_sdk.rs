//! Conformance: the official MCP Python SDK (`mcp`, pinned in the conformance venv) connects
//! to a turn's socket the way an agent's client does, initializes, lists the tools with their
//! schemas and calls them. Nothing of hako's own client code is involved.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hako_mcp::tools::{Backend, Call, Scope, ToolError};
use hako_mcp::{ServeOptions, serve};
use hako_shared::GroupFolder;
use hako_shared::grants::Grants;
use hako_shared::runs::Trust;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Memory {
    sent: std::sync::Mutex<Vec<String>>,
    _live: AtomicBool,
}

impl Backend for Memory {
    async fn is_live(&self, _scope: &Scope) -> bool {
        true
    }

    async fn call(&self, scope: &Scope, call: Call) -> Result<Value, ToolError> {
        match call {
            Call::SendMessage(m) => {
                self.sent.lock().unwrap().push(m.text);
                Ok(json!({"id": "m-1", "chat_jid": scope.chat_jid}))
            }
            other => Err(ToolError::not_found(format!("{:?}", other.tool()))),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_initializes_lists_and_calls() {
    let python = tokio::task::spawn_blocking(hako_shared::testing::conformance_python)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mcp.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let scope = Arc::new(Scope {
        folder: GroupFolder::new("acme").unwrap(),
        turn_id: hako_shared::ids::TurnId::new("turn-1").unwrap(),
        chat_jid: hako_shared::ChatJid::new("web:acme").unwrap(),
        grants: Grants::parse(&[], Trust::Untrusted).unwrap(),
    });
    let backend = Arc::new(Memory {
        sent: Default::default(),
        _live: AtomicBool::new(true),
    });
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        backend.clone(),
        scope,
        CancellationToken::new(),
        stop.clone(),
        ServeOptions::default(),
    ));
    let input = json!({"socket": path, "text": "hello from the python sdk"});
    let seen = tokio::task::spawn_blocking(move || {
        hako_shared::testing::run_python(&python, include_str!("sdk_client.py"), &input)
    })
    .await
    .unwrap();
    eprintln!("the SDK saw: {seen}");
    assert_eq!(seen["server"], "hako", "{seen}");
    assert!(
        seen["protocol"].as_str().unwrap().starts_with("20"),
        "{seen}"
    );
    let tools = seen["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "send_message",
            "get_history",
            "set_status",
            "schedule_task",
            "list_tasks",
            "cancel_task",
            "reset_session",
            "agent_tool"
        ]
    );
    for t in tools {
        assert_eq!(t["schema"]["type"], "object", "{t}");
        assert!(
            t["description"].as_str().is_some_and(|d| d.len() > 20),
            "{t}"
        );
    }
    assert_eq!(seen["sent"]["is_error"], false, "{seen}");
    assert_eq!(seen["sent"]["structured"]["chat_jid"], "web:acme", "{seen}");
    assert_eq!(seen["refused"]["is_error"], true, "{seen}");
    assert!(
        seen["refused"]["text"][0]
            .as_str()
            .unwrap()
            .starts_with("not_granted: spawn_group is only for the operator's main group"),
        "{seen}"
    );
    assert_eq!(*backend.sent.lock().unwrap(), ["hello from the python sdk"]);
    stop.cancel();
    task.await.unwrap();
}
