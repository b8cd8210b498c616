//! authd for other crates' tests and benches: one way to start a real authd (in-process, its
//! own `authd.db`) that knows the given identities' service keys, and to get their tokens.
//! A test's helper: what fails panics, naming what.

use std::path::Path;

use hako_client::authd::AuthdClient;
use hako_shared::config::Env;

use crate::{Config, Running, StartError};

/// runed's service key in tests.
pub const RUNED_KEY: &str = "runed-test-key-0123456789";
/// routd's service key in tests.
pub const ROUTD_KEY: &str = "routd-test-key-0123456789";
/// The operator's service key in tests.
pub const OPERATOR_KEY: &str = "operator-test-key-0123456789";
/// A chat adapter's (`channel`) service key in tests.
pub const CHANNEL_KEY: &str = "channel-test-key-0123456789";

/// The identities a test's authd knows, with their keys.
const KEYS: [(&str, &str); 4] = [
    ("runed", RUNED_KEY),
    ("routd", ROUTD_KEY),
    ("operator", OPERATOR_KEY),
    ("channel", CHANNEL_KEY),
];

/// A real authd started for a test; it knows runed, routd, the operator and a channel by the
/// keys above.
#[derive(Debug)]
pub struct TestAuthd {
    running: Running,
    client: AuthdClient,
}

impl TestAuthd {
    /// authd on a fresh loopback port, its data in `data_dir`.
    pub async fn start(data_dir: &Path) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for authd");
        Self::start_on(l, data_dir).await
    }

    /// As [`TestAuthd::start`], on `listener` (an address containers reach, say). Clock
    /// skew is 1 s, so tests of expiry wait seconds, not a minute.
    pub async fn start_on(listener: tokio::net::TcpListener, data_dir: &Path) -> Self {
        let service_keys = KEYS
            .iter()
            .map(|(who, key)| format!("{who}={key}"))
            .collect::<Vec<_>>()
            .join(",");
        let cfg = Config::from_env(&Env::from_pairs([
            ("DATA_DIR", data_dir.display().to_string()),
            ("AUTHD_SERVICE_KEYS", service_keys),
            ("AUTHD_CLOCK_SKEW", "1s".into()),
        ]))
        .expect("authd's test configuration");
        let running = crate::start(cfg, listener).await.expect("authd starts");
        let client = AuthdClient::new(&running.url()).expect("a client of authd");
        Self { running, client }
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        self.running.url()
    }

    /// A fresh service token of `identity` (`runed`, `routd`, `operator` or `channel`).
    pub async fn token(&self, identity: &str) -> String {
        let (_, key) = KEYS
            .iter()
            .find(|(w, _)| *w == identity)
            .unwrap_or_else(|| panic!("authd was started without a key for {identity}"));
        match self.client.service_token(identity, key).await {
            Ok(t) => t.token,
            Err(e) => panic!("{identity}'s service token: {e}"),
        }
    }

    /// Stops it gracefully.
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.running.shutdown().await
    }
}
