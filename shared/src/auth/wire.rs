//! Request and response bodies of authd's routes, shared by the server and the client.

use serde::{Deserialize, Serialize};

use super::claims::TokenType;

/// authd's JWKS, which every verifier reads (`GET`, public).
pub const KEYS_PATH: &str = "/v1/keys";
/// authd's list of revoked tokens not yet expired (`GET`, public).
pub const REVOKED_PATH: &str = "/v1/revoked";

/// `POST /v1/service-token` body; the service key travels as the bearer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceTokenRequest {
    /// The daemon's name, e.g. `runed`.
    pub daemon: String,
}

/// `POST /v1/service-token` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceTokenResponse {
    /// The signed token.
    pub token: String,
    /// Its id.
    pub jti: String,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
    /// The daemon's fixed grants.
    pub scope: Vec<String>,
}

/// `POST /v1/tokens` body: ask for a child of the bearer token.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MintRequest {
    /// The child's scopes; each must be covered by the parent's.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::auth::scope::list_schema))]
    pub scope: Vec<String>,
    /// The child's folder; must equal or sit under the parent's. Defaults to the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Lifetime; defaults to the parent's remaining life capped by the global maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// `user` or `spawn`; defaults to `spawn` when `run_id` is set, else `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<TokenType>,
    /// Spawn tokens: the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Spawn tokens: the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Spawn tokens: hosts the egress proxy may reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
    /// Spawn tokens: brokered secrets (names, hosts within `egress`, the run's placeholders).
    /// Only a service token chooses them; any other parent passes on at most its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::secrets::SecretClaim>,
}

/// `POST /v1/tokens` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MintResponse {
    /// The signed child token.
    pub token: String,
    /// Its id.
    pub jti: String,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
}

/// `DELETE /v1/tokens/{jti}` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeResponse {
    /// The token asked for.
    pub jti: String,
    /// Every jti revoked by this call: the token and its not-yet-expired descendants.
    pub revoked: Vec<String>,
}

/// One entry of the revocation list.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedEntry {
    /// The revoked token's id.
    pub jti: String,
    /// Its expiry (Unix seconds); after it the entry leaves the list.
    pub exp: i64,
}

/// `GET /v1/revoked` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedList {
    /// Revoked tokens that have not expired yet.
    pub revoked: Vec<RevokedEntry>,
}

/// `POST /v1/keys/rotate` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotateResponse {
    /// The new active key.
    pub kid: String,
    /// The key it replaced.
    pub previous_kid: String,
    /// When the previous key leaves the JWKS (Unix seconds).
    pub previous_drops_at: i64,
}

/// One row of authd's audit log. Never holds a token or a secret.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Row id (increasing).
    pub id: i64,
    /// Unix milliseconds.
    pub at: i64,
    /// Who acted: a token's `sub`, a claimed daemon name, or `anonymous`.
    pub actor: String,
    /// The acting token's jti, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_jti: Option<String>,
    /// `mint`, `revoke`, `rotate`, `service_token`, `audit_read`, …
    pub action: String,
    /// `ok`, or the error code of the denial.
    pub outcome: String,
    /// Short facts (scopes, folder, jti, …).
    pub detail: String,
    /// The request it was written for (the `x-request-id` authd answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// `GET /v1/audit` answer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditList {
    /// Rows, newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}
