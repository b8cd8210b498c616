//! authd for other crates' tests and benches: one way to start a real authd (in-process, its
//! own `authd.db`) that knows the given identities' service keys, and to get their tokens.
//! A test's helper: what fails panics, naming what.

use std::path::Path;

use hako_shared::auth::AuthdClient;
use hako_shared::config::Env;

use crate::{Config, Running, StartError};

/// A real authd started for a test, with the service keys it was given.
#[derive(Debug)]
pub struct TestAuthd {
    running: Running,
    client: AuthdClient,
    keys: Vec<(String, String)>,
}

impl TestAuthd {
    /// authd on a fresh loopback port, its data in `data_dir`; `keys` are `(identity, key)`.
    pub async fn start(data_dir: &Path, keys: &[(&str, &str)]) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for authd");
        Self::start_on(l, data_dir, keys).await
    }

    /// As [`TestAuthd::start`], on `listener` (an address containers reach, say). Clock
    /// skew is 1 s, so tests of expiry wait seconds, not a minute.
    pub async fn start_on(
        listener: tokio::net::TcpListener,
        data_dir: &Path,
        keys: &[(&str, &str)],
    ) -> Self {
        let service_keys = keys
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
        Self {
            running,
            client,
            keys: keys
                .iter()
                .map(|(w, k)| ((*w).to_owned(), (*k).to_owned()))
                .collect(),
        }
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        self.running.url()
    }

    /// A fresh service token of `identity` (one of the keys it was started with).
    pub async fn token(&self, identity: &str) -> String {
        let (_, key) = self
            .keys
            .iter()
            .find(|(w, _)| w == identity)
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
