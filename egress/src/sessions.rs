//! The connections each token holds: bounded per token, and cut when the token stops being
//! good (revoked, expired, or the proxy can no longer tell) while they are open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use hako_shared::auth::Claims;
use tokio_util::sync::CancellationToken;

struct Entry {
    claims: Arc<Claims>,
    count: usize,
    cancel: CancellationToken,
    /// Why the token's connections were cut, once they are.
    reason: Arc<OnceLock<&'static str>>,
}

#[derive(Default)]
struct Inner {
    by_jti: Mutex<HashMap<String, Entry>>,
}

/// The registry. Cheap to clone.
#[derive(Clone, Default)]
pub struct Sessions {
    inner: Arc<Inner>,
    max_per_token: usize,
}

/// One connection's place; dropping it gives the place back.
pub struct Slot {
    inner: Arc<Inner>,
    jti: String,
    /// Cancelled when the token's connections are cut.
    pub cancel: CancellationToken,
    reason: Arc<OnceLock<&'static str>>,
}

impl Slot {
    /// Why the connection was cut, if it was.
    pub fn cut_reason(&self) -> Option<&'static str> {
        self.reason.get().copied()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.inner.by_jti.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get_mut(&self.jti) {
            e.count = e.count.saturating_sub(1);
            if e.count == 0 {
                map.remove(&self.jti);
            }
        }
    }
}

impl Sessions {
    /// A registry allowing `max_per_token` connections per token.
    pub fn new(max_per_token: usize) -> Self {
        Self {
            inner: Arc::default(),
            max_per_token,
        }
    }

    /// A place for one more connection of `claims`' token, unless it holds its bound, or its
    /// connections were cut (a token being cut gets no new ones).
    pub fn acquire(&self, claims: &Arc<Claims>) -> Option<Slot> {
        let mut map = self.inner.by_jti.lock().unwrap_or_else(|p| p.into_inner());
        let e = map.entry(claims.jti.clone()).or_insert_with(|| Entry {
            claims: Arc::clone(claims),
            count: 0,
            cancel: CancellationToken::new(),
            reason: Arc::default(),
        });
        if e.count >= self.max_per_token || e.cancel.is_cancelled() {
            if e.count == 0 {
                map.remove(&claims.jti);
            }
            return None;
        }
        e.count += 1;
        Some(Slot {
            inner: Arc::clone(&self.inner),
            jti: claims.jti.clone(),
            cancel: e.cancel.child_token(),
            reason: Arc::clone(&e.reason),
        })
    }

    /// Cuts the connections of every token for which `verdict` gives a reason; returns how
    /// many connections were cut, by reason.
    pub fn sweep(
        &self,
        mut verdict: impl FnMut(&Claims) -> Option<&'static str>,
    ) -> Vec<(&'static str, usize)> {
        let map = self.inner.by_jti.lock().unwrap_or_else(|p| p.into_inner());
        let mut cut: Vec<(&'static str, usize)> = Vec::new();
        for e in map.values() {
            if e.cancel.is_cancelled() {
                continue;
            }
            if let Some(why) = verdict(&e.claims) {
                let _ = e.reason.set(why);
                e.cancel.cancel();
                match cut.iter_mut().find(|(r, _)| *r == why) {
                    Some((_, n)) => *n += e.count,
                    None => cut.push((why, e.count)),
                }
            }
        }
        cut
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        let map = self.inner.by_jti.lock().unwrap_or_else(|p| p.into_inner());
        map.values().map(|e| e.count).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::auth::TokenType;

    fn claims(jti: &str) -> Arc<Claims> {
        Arc::new(Claims {
            iss: "i".into(),
            sub: "s".into(),
            typ: TokenType::Spawn,
            scope: vec![],
            folder: None,
            jti: jti.into(),
            iat: 0,
            nbf: 0,
            exp: 10,
            run_id: Some("r".into()),
            turn_id: Some("t".into()),
            parent_jti: None,
            egress: vec![],
            secrets: vec![],
        })
    }

    #[test]
    fn bounded_per_token_and_cut_together() {
        let s = Sessions::new(2);
        let a = claims("a");
        let a1 = s.acquire(&a).unwrap();
        let a2 = s.acquire(&a).unwrap();
        assert!(s.acquire(&a).is_none(), "bound");
        let b1 = s.acquire(&claims("b")).unwrap();
        drop(a2);
        let a3 = s.acquire(&a).unwrap();
        assert_eq!(s.open(), 3);
        let cut = s.sweep(|c| (c.jti == "a").then_some("revoked"));
        assert_eq!(cut, vec![("revoked", 2)]);
        assert!(a1.cancel.is_cancelled() && a3.cancel.is_cancelled());
        assert_eq!(a1.cut_reason(), Some("revoked"));
        assert!(!b1.cancel.is_cancelled());
        assert!(s.acquire(&a).is_none(), "a cut token gets nothing new");
        drop((a1, a3));
        assert_eq!(s.open(), 1);
        // Once its connections are gone the entry goes too; the verifier refuses it anyway.
        assert!(s.acquire(&a).is_some());
    }
}
