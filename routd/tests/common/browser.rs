//! Real headless Chromium, driven through chromedriver's W3C WebDriver protocol (Debian's
//! `chromium` and `chromium-driver`): the page is tested in the browser people use, not in a
//! fake DOM. A small client over the protocol's JSON, so the test keeps its own order (it
//! kills routd between two steps of the browser).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{LIMIT, Rig, eventually};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver with one browser session; both end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The session's end closes Chromium; chromedriver goes with its process.
        // (on a thread of its own: drop may run inside the test's runtime, which must not block)
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let _ = reqwest::Client::new()
                    .delete(url)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
            });
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn find_program(names: &[&str]) -> String {
    for n in names {
        for dir in ["/usr/bin", "/usr/local/bin", "/usr/lib/chromium"] {
            let p = format!("{dir}/{n}");
            if std::path::Path::new(&p).exists() {
                return p;
            }
        }
    }
    panic!(
        "{} not found: install Debian's chromium and chromium-driver (.ci/run does)",
        names.join(" or ")
    );
}

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a headless Chromium.
    pub async fn start() -> Browser {
        let driver_bin = find_program(&["chromedriver"]);
        let chromium = find_program(&["chromium"]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let status = format!("{base}/status");
        eventually("chromedriver ready", Duration::from_secs(30), || async {
            let r = http.get(&status).send().await.map_err(|e| e.to_string())?;
            let v = r.json::<Value>().await.map_err(|e| e.to_string())?;
            if v["value"]["ready"] == true {
                Ok(())
            } else {
                Err(v.to_string())
            }
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--no-default-browser-check", "--window-size=1280,860",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("chromedriver answers")
            .json()
            .await
            .unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {r}"))
            .to_owned();
        Browser {
            driver,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        if v["value"].get("error").is_some() {
            panic!("webdriver {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Reloads the page.
    pub async fn reload(&self) {
        self.cmd(reqwest::Method::POST, "/refresh", Some(json!({})))
            .await;
    }

    /// The address bar.
    pub async fn url(&self) -> String {
        self.cmd(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub async fn js(&self, script: &str, args: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Runs an async `script` whose last argument is the callback its result goes to.
    pub async fn js_async(&self, script: &str, args: Value) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Waits until `script` returns something truthy; answers it.
    pub async fn wait(&self, what: &str, script: &str, limit: Duration) -> Value {
        eventually(what, limit, || async {
            let v = self.js(script, json!([])).await;
            if v.is_null() || v == false || v == "" || v == 0 {
                Err(v)
            } else {
                Ok(v)
            }
        })
        .await
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT].as_str().unwrap().to_owned()
    }

    /// Clicks the first element `css` selects, as a person would.
    pub async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{e}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Types `text` into the first element `css` selects, key by key.
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{e}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// A PNG of the window, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine as _;
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

/// What `hako web` grants a page session.
pub const WEB_SCOPES: &[&str] = &[
    "chats:read",
    "messages:write",
    "groups:read",
    "turns:read",
    "approvals:read",
    "approvals:write",
];

/// A sign-in link's token as `hako web` mints it: (token, jti).
pub async fn link(rig: &Rig, folder: Option<&str>, ttl: u64) -> (String, String) {
    let r = rig.mint_full(WEB_SCOPES, folder, ttl).await;
    (r.token, r.jti)
}

/// Signs the browser in with a fresh link; waits for the chat page.
pub async fn sign_in(rig: &Rig, b: &Browser, folder: Option<&str>) -> String {
    let (token, jti) = link(rig, folder, 600).await;
    b.goto(&format!("{}/web/signin#{token}", rig.base())).await;
    b.wait(
        "the chat page after sign-in",
        "return location.pathname === '/web/' && document.getElementById('who').textContent",
        LIMIT,
    )
    .await;
    let url = b.url().await;
    assert!(
        !url.contains(&token),
        "the token stays in the address bar: {url}"
    );
    jti
}
