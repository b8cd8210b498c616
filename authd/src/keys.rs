//! The key ring: one active signing key and the retired keys that still verify.

use std::sync::Arc;

use hako_shared::auth::{Jwk, Jwks, Signer};

/// A retired key, published until `drop_at`.
pub struct Retiring {
    /// Its public JWK.
    pub jwk: Jwk,
    /// Unix seconds when it leaves the JWKS.
    pub drop_at: i64,
}

/// The active signer and the retiring public keys.
pub struct KeyRing {
    /// Signs every new token.
    pub active: Arc<Signer>,
    /// Older keys that still verify.
    pub retiring: Vec<Retiring>,
}

impl KeyRing {
    /// The JWKS at `now`: the active key and retiring keys not yet dropped.
    pub fn jwks(&self, now: i64) -> Jwks {
        let mut keys = vec![self.active.jwk()];
        keys.extend(
            self.retiring
                .iter()
                .filter(|r| r.drop_at > now)
                .map(|r| r.jwk.clone()),
        );
        Jwks { keys }
    }
}
