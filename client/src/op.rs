//! An operation: what one call sends and what its answer is read as.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use reqwest::Method;
use serde::Serialize;

/// The services whose APIs the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Daemon {
    /// The token authority.
    Authd,
    /// The runner daemon.
    Runed,
    /// The routing daemon.
    Routd,
    /// The Telegram adapter (its operator routes).
    Telegram,
}

impl Daemon {
    /// The three daemons, in the order `hako status` lists them.
    pub const ALL: [Daemon; 3] = [Daemon::Authd, Daemon::Runed, Daemon::Routd];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Daemon::Authd => "authd",
            Daemon::Runed => "runed",
            Daemon::Routd => "routd",
            Daemon::Telegram => "the Telegram adapter",
        }
    }
}

impl fmt::Display for Daemon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// What a call sends.
#[derive(Debug, Clone)]
pub enum Body {
    /// Nothing.
    None,
    /// A JSON document, serialized.
    Json(Vec<u8>),
    /// Bytes as they are (a media upload).
    Bytes(bytes::Bytes),
    /// A body that would not serialize: the call fails with this, before anything is sent.
    Invalid(String),
}

/// The answer of an operation that streams server-sent events of `T`.
pub struct Events<T>(PhantomData<fn() -> T>);

/// The answer of an operation that is text, not JSON (a Prometheus exposition).
pub struct Text;

/// One call of a daemon's API whose answer is read as `R` (`()` for none, [`Events`] for a
/// stream). Built by the daemons' modules; [`Op::query`] adds what the call filters by.
#[derive(Debug)]
pub struct Op<R> {
    /// The daemon that serves it.
    pub daemon: Daemon,
    /// Its method.
    pub method: Method,
    /// Its path and query, every part encoded.
    pub path: String,
    /// Its body.
    pub body: Body,
    /// A longer limit than the client's (a long poll): the whole call, answer included.
    pub limit: Option<Duration>,
    answer: PhantomData<fn() -> R>,
}

impl<R> Clone for Op<R> {
    fn clone(&self) -> Self {
        Op {
            daemon: self.daemon,
            method: self.method.clone(),
            path: self.path.clone(),
            body: self.body.clone(),
            limit: self.limit,
            answer: PhantomData,
        }
    }
}

impl<R> Op<R> {
    pub(crate) fn new(daemon: Daemon, method: Method, path: String) -> Self {
        Op {
            daemon,
            method,
            path,
            body: Body::None,
            limit: None,
            answer: PhantomData,
        }
    }

    pub(crate) fn get(daemon: Daemon, path: String) -> Self {
        Self::new(daemon, Method::GET, path)
    }

    /// `body` as JSON.
    pub(crate) fn json(mut self, body: &impl Serialize) -> Self {
        self.body = match serde_json::to_vec(body) {
            Ok(b) => Body::Json(b),
            Err(e) => Body::Invalid(e.to_string()),
        };
        self
    }

    pub(crate) fn bytes(mut self, data: bytes::Bytes) -> Self {
        self.body = Body::Bytes(data);
        self
    }

    /// Adds `key=value` to the query (the value encoded).
    pub fn query(mut self, key: &str, value: impl fmt::Display) -> Self {
        self.path
            .push(if self.path.contains('?') { '&' } else { '?' });
        self.path.push_str(key);
        self.path.push('=');
        self.path.push_str(&seg(&value.to_string()));
        self
    }

    /// Adds `key=value` when there is a value.
    pub fn query_opt(self, key: &str, value: Option<impl fmt::Display>) -> Self {
        match value {
            Some(v) => self.query(key, v),
            None => self,
        }
    }

    /// The same call with `body` in place of its own, its answer read as JSON: tests of
    /// bodies the typed call cannot hold (a verdict that is not a boolean).
    pub fn with_json(mut self, body: &serde_json::Value) -> Op<serde_json::Value> {
        self = self.json(body);
        self.as_value()
    }

    /// The same call, its answer read as the JSON it is (tests, and tools that print it).
    pub fn as_value(self) -> Op<serde_json::Value> {
        Op {
            daemon: self.daemon,
            method: self.method,
            path: self.path,
            body: self.body,
            limit: self.limit,
            answer: PhantomData,
        }
    }

    /// The call may take up to `limit` (a long poll).
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// One path segment or query value, percent-encoded (a chat JID, a folder, an id). A segment
/// of dots alone, which a URL parser would resolve (any encoding of a dot included), goes
/// with its `%` encoded: the call reaches the route it names, with an id no daemon has.
pub(crate) fn seg(s: &str) -> String {
    match s {
        "." | ".." => s.replace('.', "%252E"),
        _ => hako_shared::path_segment(s),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn paths_and_queries_are_encoded() {
        let op = crate::routd::chat_messages("web:acme/support")
            .query("after", 3)
            .query_opt("limit", Some(1))
            .query_opt("folder", None::<&str>);
        assert_eq!(
            op.path,
            "/v1/chats/web:acme%2Fsupport/messages?after=3&limit=1"
        );
        let op = crate::runed::runs().query("folder", "a b&c=d");
        assert_eq!(op.path, "/v1/runs?folder=a%20b%26c%3Dd");
        assert_eq!(crate::runed::run("../x").path, "/v1/runs/..%2Fx");
        // A dot segment is never resolved away to another route.
        assert_eq!(crate::runed::run("..").path, "/v1/runs/%252E%252E");
        let url = reqwest::Url::parse("http://h").unwrap();
        assert_eq!(
            url.join(&crate::routd::group("..").path).unwrap().path(),
            "/v1/groups/%252E%252E"
        );
    }
}
