//! The operator's commands against real daemons (authd, runed, routd in-process on loopback
//! ports, real agent containers): each command's `--json` parsed and checked, the human form
//! of some, and what a daemon that is down looks like.

use std::process::Command;
use std::time::Duration;

use hako_authd::testing::{CHANNEL_KEY, OPERATOR_KEY, ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::{Client, Daemon, routd};
use hako_shared::chat::PostMessage;
use hako_shared::config::Env;
use hako_shared::testing::eventually;
use serde_json::{Value, json};

struct Daemons {
    home: tempfile::TempDir,
    authd: Option<TestAuthd>,
    runed: Option<hako_runed::Running>,
    routd: Option<hako_routd::Running>,
    urls: [String; 3],
    install: String,
}

impl Daemons {
    async fn start() -> Daemons {
        let image = hako_deploy::ensure_agent_image().await.expect("image");
        let home = tempfile::tempdir().unwrap();
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).unwrap();
        let install = format!(
            "ops-test-{}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        );
        let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
        let authd = TestAuthd::start(&home.path().join("authd")).await;
        let data = home.path().join("data").display().to_string();
        let runed = hako_runed::start(
            hako_runed::Config::from_env(&Env::from_pairs([
                ("DATA_DIR", data.clone()),
                ("AUTHD_URL", authd.url()),
                ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
                ("CONTAINER_IMAGE", image),
                ("HAKO_INSTALL_ID", install.clone()),
                ("RUNED_STOP_GRACE", "1s".into()),
            ]))
            .unwrap(),
            bind().await,
        )
        .await
        .unwrap();
        let routd = hako_routd::start(
            hako_routd::Config::from_env(&Env::from_pairs([
                ("DATA_DIR", data),
                ("AUTHD_URL", authd.url()),
                ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
                ("RUNED_URL", runed.url()),
                ("ROUTD_LISTEN", "127.0.0.1:0".into()),
            ]))
            .unwrap(),
            bind().await,
        )
        .await
        .unwrap();
        // Where `hako token service channel` finds that identity's key.
        let secrets = home.path().join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::write(secrets.join("channel.key"), CHANNEL_KEY).unwrap();
        let urls = [authd.url(), runed.url(), routd.url()];
        Daemons {
            home,
            authd: Some(authd),
            runed: Some(runed),
            routd: Some(routd),
            urls,
            install,
        }
    }

    /// `hako <args>`: exit code, stdout, stderr.
    fn hako(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(args)
            .env("HAKO_HOME", self.home.path())
            .env("HAKO_AUTHD_URL", &self.urls[0])
            .env("HAKO_RUNED_URL", &self.urls[1])
            .env("HAKO_ROUTD_URL", &self.urls[2])
            .env("HAKO_OPERATOR_KEY", OPERATOR_KEY)
            .env_remove("HAKO_TOKEN")
            .output()
            .expect("hako runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `hako <args>` with `input` on stdin: exit code, stdout, stderr.
    fn hako_with_stdin(&self, args: &[&str], input: &[u8]) -> (i32, String, String) {
        use std::io::Write as _;
        let mut child = Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(args)
            .env("HAKO_HOME", self.home.path())
            .env("HAKO_AUTHD_URL", &self.urls[0])
            .env("HAKO_RUNED_URL", &self.urls[1])
            .env("HAKO_ROUTD_URL", &self.urls[2])
            .env("HAKO_OPERATOR_KEY", OPERATOR_KEY)
            .env_remove("HAKO_TOKEN")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("hako runs");
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `hako <args> --json`, which must succeed; its (last) JSON line.
    /// The id of the run `hako runs list` shows running, once there is one.
    async fn running_run(&self) -> String {
        eventually("a run running", Duration::from_secs(60), || async {
            let v = self.json(&["runs", "list", "--state", "running"]);
            match v["runs"].as_array().and_then(|r| r.first()) {
                Some(r) => Ok(r["run_id"].as_str().unwrap().to_owned()),
                None => Err(v),
            }
        })
        .await
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let (code, out, err) = self.hako(&a);
        assert_eq!(code, 0, "hako {args:?}: {err}");
        let last = out.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| panic!("hako {args:?}: {e}: {out}"))
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        let install = self.install.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _ = rt.block_on(hako_cli::stack::remove_agents(&install));
        })
        .join();
    }
}

fn claims(token: &str) -> Value {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_command_against_real_daemons() {
    let mut d = Daemons::start().await;

    // Groups: set from flags and from a file, refused settings named, list, show.
    let g = d.json(&["groups", "set", "team/dev", "--name", "Dev team"]);
    assert_eq!(
        (&g["folder"], &g["name"]),
        (&json!("team/dev"), &json!("Dev team"))
    );
    let file = d.home.path().join("bad.json");
    std::fs::write(&file, r#"{"name": "x", "group": {"memory": "0"}}"#).unwrap();
    let (code, _, err) = d.hako(&[
        "groups",
        "set",
        "team/dev",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("routd answered 400 invalid_group") && err.contains("memory"),
        "{err}"
    );
    let list = d.json(&["groups", "list"]);
    assert!(
        list["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["folder"] == "team/dev"),
        "{list}"
    );
    let (code, out, _) = d.hako(&["groups", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("team/dev") && l.contains("Dev team")),
        "{out}"
    );
    assert_eq!(d.json(&["groups", "show", "team/dev"])["name"], "Dev team");

    // Routes.
    let r = d.json(&["routes", "add", "tg:*", "team/dev"]);
    let id = r["id"].as_i64().unwrap();
    let routes = d.json(&["routes", "list"]);
    assert!(
        routes["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == id)
    );
    let (code, out, _) = d.hako(&["routes", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l.starts_with(&id.to_string())
            && l.contains("tg:*")
            && l.ends_with("team/dev")),
        "{out}"
    );
    // The answer is the rule removed, read as routd's own type.
    assert_eq!(
        d.json(&["routes", "rm", &id.to_string()])["pattern"],
        "tg:*"
    );
    assert!(
        d.json(&["routes", "list"])["routes"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Tasks: one the agent scheduled, listed, then cancelled.
    let (code, _, err) = d.hako(&[
        "send",
        "web:team/dev",
        r#"/mcp schedule_task {"prompt":"a weekly report","cron":"0 9 * * 1"}"#,
    ]);
    assert_eq!(code, 0, "{err}");
    let tasks = d.json(&["tasks", "list", "--folder", "team/dev"]);
    assert_eq!(tasks["tasks"][0]["prompt"], "a weekly report", "{tasks}");
    let task = tasks["tasks"][0]["id"].as_str().unwrap().to_owned();
    let (code, out, _) = d.hako(&["tasks", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&task) && out.contains("a weekly report"),
        "{out}"
    );
    assert_eq!(d.json(&["tasks", "cancel", &task])["state"], "cancelled");
    assert!(
        d.json(&["tasks", "list"])["tasks"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Send: the reply as it arrives; then the run it took.
    let (code, out, err) = d.hako(&["send", "web:team/dev", "hello from ops"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "agent> hello from ops");

    let runs = d.json(&["runs", "list", "--folder", "team"]);
    let run = runs["runs"][0].clone();
    assert_eq!(
        (&run["folder"], &run["state"]),
        (&json!("team/dev"), &json!("exited")),
        "{runs}"
    );
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let shown = d.json(&["runs", "show", &run_id]);
    assert_eq!(shown["outputs"][0]["result"], "hello from ops", "{shown}");
    let (code, out, _) = d.hako(&["runs", "logs", &run_id]);
    assert_eq!((code, out.trim()), (0, "hello from ops"));
    let (code, out, _) = d.hako(&["runs", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with(&run_id) && l.contains("team/dev") && l.contains("exited")),
        "{out}"
    );
    let (code, out, _) = d.hako(&["runs", "show", &run_id]);
    assert_eq!(code, 0);
    assert!(
        out.contains("exit_code   0") && out.contains("hello from ops"),
        "{out}"
    );

    // Kill a live run.
    let token = d.json(&["token", "service"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let api = Client::new(Daemon::Routd, &d.urls[2], Duration::from_secs(120)).unwrap();
    let m: PostMessage = serde_json::from_value(
        json!({"chat_jid": "web:team/dev", "sender": "t", "content": "/sleep 60"}),
    )
    .unwrap();
    let (posted, _) = api
        .raw(&routd::post_message(&m), Some(&token))
        .await
        .unwrap();
    assert_eq!(posted, 201);
    let live = d.running_run().await;
    let killed = d.json(&["runs", "kill", &live]);
    assert_eq!(
        (&killed["state"], &killed["outcome"]),
        (&json!("killed"), &json!("killed"))
    );
    let (code, out, err) = d.hako(&["runs", "logs", &live, "--follow"]);
    assert_eq!(code, 1, "a killed run's logs end non-zero: {out} {err}");

    // A reply too large for runed's broadcast (it inlines blocks up to 4 KiB) still comes
    // whole when followed live: runed's stream reads it from its store.
    let big = "y".repeat(6000);
    let m: PostMessage = serde_json::from_value(
        json!({"chat_jid": "web:team/dev", "sender": "t", "content": format!("/sleep 2\n{big}")}),
    )
    .unwrap();
    let (posted, _) = api
        .raw(&routd::post_message(&m), Some(&token))
        .await
        .unwrap();
    assert_eq!(posted, 201);
    let big_run = d.running_run().await;
    let (code, out, err) = d.hako(&["runs", "logs", &big_run, "--follow", "--json"]);
    assert_eq!(code, 0, "{err}");
    let events: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let live_block = events
        .iter()
        .find(|e| e["type"] == "output")
        .unwrap_or_else(|| panic!("no output event: {out}"));
    assert!(
        live_block["block"]["result"]
            .as_str()
            .is_some_and(|r| r.contains(&big)),
        "{live_block}"
    );
    assert_eq!(events.last().unwrap()["state"], "exited", "{out}");
    let (code, _, err) = d.hako(&["runs", "show", "run-nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("runed answered 404"), "{err}");

    // Approvals: a held call listed (and in `status`), approved from the CLI; a second
    // verdict is refused, naming the first.
    let file = d.home.path().join("ask.json");
    std::fs::write(
        &file,
        r#"{"name": "ask", "grants": ["*", "?send_message"]}"#,
    )
    .unwrap();
    d.json(&[
        "groups",
        "set",
        "team/ask",
        "--file",
        file.to_str().unwrap(),
    ]);
    let m: PostMessage = serde_json::from_value(json!({"chat_jid": "web:team/ask", "sender": "t",
                      "content": r#"/mcp send_message {"text":"ok by ops"}"#}))
    .unwrap();
    let (posted, _) = api
        .raw(&routd::post_message(&m), Some(&token))
        .await
        .unwrap();
    assert_eq!(posted, 201);
    let held = eventually("an approval request", Duration::from_secs(60), || async {
        let v = d.json(&["approvals", "list"]);
        v["approvals"]
            .as_array()
            .and_then(|a| a.first())
            .cloned()
            .ok_or(v)
    })
    .await;
    let ap = held["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (&held["tool"], &held["state"]),
        (&json!("send_message"), &json!("pending"))
    );
    let (code, out, _) = d.hako(&["approvals", "list"]);
    assert!(
        code == 0 && out.contains(&ap) && out.contains("ok by ops"),
        "{out}"
    );
    let (_, out, _) = d.hako(&["status"]);
    assert!(out.contains("approvals") && out.contains(&ap), "{out}");
    assert_eq!(d.json(&["approvals", "approve", &ap])["state"], "approved");
    let (code, _, err) = d.hako(&["approvals", "deny", &ap]);
    assert_eq!(code, 1);
    assert!(
        err.contains("409 already_decided") && err.contains("approved"),
        "{err}"
    );
    let all = d.json(&["approvals", "list", "--all"]);
    assert_eq!(all["approvals"][0]["decided_by"], "operator", "{all}");

    // Tokens: another identity's, and a downscoped one.
    let ch = d.json(&["token", "service", "channel"]);
    assert_eq!(claims(ch["token"].as_str().unwrap())["sub"], "channel");
    let minted = d.json(&[
        "token",
        "mint",
        "--scope",
        "chats:read",
        "--folder",
        "team",
        "--ttl",
        "5m",
    ]);
    let c = claims(minted["token"].as_str().unwrap());
    assert_eq!(
        (&c["scope"], &c["folder"]),
        (&json!(["chats:read"]), &json!("team")),
        "{c}"
    );
    assert!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap() <= 300);

    // Status, then with routd down: a clear message, a non-zero exit.
    let st = d.json(&["status"]);
    assert!(
        ["authd", "runed", "routd"]
            .iter()
            .all(|n| st["daemons"][n]["ready"] == true),
        "{st}"
    );
    d.routd.take().unwrap().shutdown().await;
    let (code, out, _) = d.hako(&["status"]);
    assert_eq!(code, 1);
    assert!(out.contains("routd  NOT READY: no answer at"), "{out}");
    let (code, _, err) = d.hako(&["groups", "list"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("routd does not answer at {}/v1/groups", d.urls[2])),
        "{err}"
    );
    if let Some(r) = d.runed.take() {
        r.shutdown().await;
    }
    if let Some(a) = d.authd.take() {
        let _ = a.shutdown().await;
    }
}

/// Exchanges a sign-in link's token at routd: (status, the `name=value` of the cookie set, body).
/// `hako secrets`: a value from stdin or a file goes to runed's store and nowhere else (not
/// stdout, stderr, runed.db or routd.db); `list` names the groups that lend each secret and
/// for which hosts; bad names and values are exit 2 and are never sent; `rm` takes it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hako_secrets_keep_the_value_to_the_store() {
    // runed and routd run in this process: everything they log, at every level.
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = log.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || LogSink(sink.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish(),
    )
    .expect("one subscriber per test process");
    let d = Daemons::start().await;
    let value = format!("ghp_{}", {
        let mut b = [0u8; 12];
        getrandom::fill(&mut b).unwrap();
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    });
    let (code, out, err) = d.hako_with_stdin(
        &["secrets", "set", "GH_TOKEN"],
        format!("{value}\n").as_bytes(),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "secret GH_TOKEN set");
    let file = d.home.path().join("npm.txt");
    std::fs::write(&file, format!("npm_{value}")).unwrap();
    let v = d.json(&[
        "secrets",
        "set",
        "NPM_TOKEN",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(v, json!({"name": "NPM_TOKEN", "set": true}));
    // Bad input: exit 2, nothing sent, never echoed.
    for (args, input) in [
        (vec!["secrets", "set", "gh_token"], value.clone()),
        (
            vec!["secrets", "set", "BAD_VALUE"],
            format!("{value}\nX-Evil: 1\n"),
        ),
        (vec!["secrets", "set", "EMPTY"], String::new()),
    ] {
        let (code, out, err) = d.hako_with_stdin(&args, input.as_bytes());
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        assert!(!err.contains(&value) && !out.contains(&value), "{err}");
    }
    let group = d.home.path().join("acme.json");
    std::fs::write(
        &group,
        json!({"group": {"network": "allowlist", "egress_allowlist": ["api.github.com", "github.com"],
                         "secrets": [{"name": "GH_TOKEN", "hosts": ["api.github.com", "github.com"]}],
                         "env_allowlist": ["TZ"]}})
        .to_string(),
    )
    .unwrap();
    let (code, _, err) = d.hako(&["groups", "set", "acme", "--file", group.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let list = d.json(&["secrets", "list"]);
    let rows = list["secrets"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["GH_TOKEN", "NPM_TOKEN"], "{list}");
    assert_eq!(
        rows[0]["used_by"],
        json!([{"folder": "acme", "hosts": ["api.github.com", "github.com"]}])
    );
    assert_eq!(rows[1]["used_by"], json!([]));
    let (code, out, _) = d.hako(&["secrets", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains("acme: api.github.com github.com"), "{out}");
    assert!(!out.contains(&value), "{out}");
    // The group view and `status` name what still goes into the box as it is.
    let g = d.json(&["groups", "show", "acme"]);
    assert_eq!(g["values_in_box"], json!(["TZ"]), "{g}");
    let (_, status, _) = d.hako(&["status"]);
    assert!(
        status.contains("groups handing values to the box"),
        "{status}"
    );
    // The value is in the store only.
    let data = d.home.path().join("data");
    assert_eq!(
        std::fs::read_to_string(data.join("egress/secrets/GH_TOKEN")).unwrap(),
        value
    );
    for db in ["runed.db", "runed.db-wal", "routd.db", "routd.db-wal"] {
        let Ok(bytes) = std::fs::read(data.join(db)) else {
            assert!(db.ends_with("-wal"), "{db} is there");
            continue;
        };
        let hit = bytes.windows(value.len()).any(|w| w == value.as_bytes());
        assert!(!hit, "the value is in {db}");
    }
    let v = d.json(&["secrets", "rm", "GH_TOKEN"]);
    assert_eq!(v, json!({"name": "GH_TOKEN", "removed": true}));
    let (code, _, err) = d.hako(&["secrets", "rm", "GH_TOKEN"]);
    assert_eq!(code, 1);
    assert!(err.contains("404") && err.contains("not_found"), "{err}");
    assert!(!data.join("egress/secrets/GH_TOKEN").exists());
    // Nor in runed's or routd's log (the name is).
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(text.contains("brokered secret set"), "runed logs the name");
    assert!(!text.contains(&value), "a value in a daemon's log");
}

/// A writer into a shared buffer (the daemons' log in the tests above).
struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn exchange(http: &reqwest::Client, routd: &str, token: &str) -> (u16, String, Value) {
    let r = http
        .post(format!("{routd}/web/session"))
        .json(&json!({"token": token}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let cookie = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|c| c.split(';').next())
        .unwrap_or_default()
        .to_owned();
    (status, cookie, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hako_web_prints_a_link_that_signs_in_once_and_revoke_ends_its_session() {
    let d = Daemons::start().await;
    let routd = &d.urls[2];
    let v = d.json(&["web", "--folder", "acme"]);
    let url = v["url"].as_str().unwrap();
    let prefix = format!("{routd}/web/signin#");
    assert!(url.starts_with(&prefix), "{url}");
    let token = &url[prefix.len()..];
    let c = claims(token);
    assert_eq!(c["folder"], "acme");
    assert_eq!(c["typ"], "user");
    assert!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap() <= 600,
        "{c}"
    );
    assert_eq!(v["jti"], c["jti"]);

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let (status, cookie, view) = exchange(&http, routd, token).await;
    assert_eq!(status, 201);
    assert_eq!(view["folder"], "acme");
    assert_eq!(
        exchange(&http, routd, token).await.0,
        409,
        "a link signs in once"
    );

    let listed = d.json(&["web", "--list"]);
    assert_eq!(listed["sessions"][0]["link_jti"], v["jti"], "{listed}");
    assert_eq!(listed["sessions"][0]["folder"], "acme", "{listed}");
    let (code, out, err) = d.hako(&["token", "revoke", v["jti"].as_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("revoked") && out.contains("ended the web session"),
        "{out}"
    );
    assert_eq!(d.json(&["web", "--list"])["sessions"], json!([]));
    eventually(
        "the session ends with its revoked link",
        Duration::from_secs(60),
        || async {
            let r = http
                .get(format!("{routd}/web/session"))
                .header("cookie", &cookie)
                .send()
                .await
                .unwrap();
            if r.status() == 401 {
                Ok(())
            } else {
                Err(r.status())
            }
        },
    )
    .await;

    // A session outlives its link's token: after the token expired, revoking its id still ends
    // the session, at routd (authd may or may not still take the expired token, within its
    // clock skew).
    let short = d.json(&["web", "--ttl", "2s"]);
    let url = short["url"].as_str().unwrap();
    let token = &url[prefix.len()..];
    let (status, cookie, _) = exchange(&http, routd, token).await;
    assert_eq!(status, 201);
    let exp = claims(token)["exp"].as_i64().unwrap();
    while hako_shared::auth::now_secs() <= exp + 1 {
        // The link's token expires (the clock is what is watched).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let session_holds = || async {
        http.get(format!("{routd}/web/session"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .status()
            == 200
    };
    assert!(session_holds().await, "the session outlives its link");
    let (code, out, err) = d.hako(&["token", "revoke", short["jti"].as_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ended the web session"), "{out}");
    assert!(!session_holds().await, "the session holds after its end");
    let (_, out, _) = d.hako(&["token", "revoke", short["jti"].as_str().unwrap()]);
    assert!(!out.contains("ended the web session"), "ended twice: {out}");

    // A link is short-lived; a folder must be one.
    let (code, _, err) = d.hako(&["web", "--ttl", "1h"]);
    assert_ne!(code, 0);
    assert!(err.contains("15m"), "{err}");
    let (code, _, err) = d.hako(&["web", "--folder", "../etc"]);
    assert_ne!(code, 0);
    assert!(err.contains("--folder"), "{err}");
}
