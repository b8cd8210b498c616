//! Compact JWS for exactly one algorithm: EdDSA over Ed25519 (RFC 8037).
//!
//! Tokens are encoded and decoded by `jsonwebtoken` (crypto by aws-lc-rs, its one backend
//! here), inside hako's envelope, which is checked before the library sees a token and around
//! its answer:
//!
//! - before any decoding, a token longer than [`MAX_TOKEN_LEN`] is refused, then anything
//!   that is not three unpadded base64url segments;
//! - the header must say `alg: EdDSA` (never `none`, `HS256`, `RS256`, …: every JWT bypass in
//!   the wild comes from algorithm agility), carry a `kid`, have no `crit`, and a `typ` of
//!   `JWT` if any;
//! - the signature must be 64 bytes whose `R` is not a point of small order (see
//!   [`small_order`]); keys of small order are refused when a [`VerifyingKey`] is made;
//! - the claims are checked by a [`Validation`] built field by field ([`validation`]), never
//!   the library's defaults (60 s leeway, only `exp` required, `nbf` unchecked).
//!
//! Keys are parsed once: a [`Signer`] keeps its aws-lc key pair and its `EncodingKey`, a
//! [`VerifyingKey`] its `DecodingKey`.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::encoding::AsBigEndian as _;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The only algorithm accepted.
pub const ALG: &str = "EdDSA";
/// Tokens longer than this are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;
/// The largest leeway handed to `jsonwebtoken`, whose time checks compute `now - leeway` in
/// unsigned seconds. Ten years: no configuration means more.
const MAX_LEEWAY_SECS: u64 = 10 * 365 * 86_400;

/// Why a token or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwsError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("token is longer than {MAX_TOKEN_LEN} bytes")]
    TooLong,
    /// Not three `.`-separated segments.
    #[error("token is not a compact JWS (three base64url segments)")]
    Segments,
    /// A segment is not unpadded base64url.
    #[error("token {0} is not valid base64url")]
    Base64(&'static str),
    /// The header is not the JSON object expected.
    #[error("token header is invalid: {0}")]
    Header(String),
    /// An algorithm other than EdDSA.
    #[error("token algorithm {0:?} is not accepted; only EdDSA is")]
    Alg(String),
    /// No `kid` in the header.
    #[error("token header has no kid")]
    MissingKid,
    /// The signature does not verify with the key (or is not 64 bytes, or has a small-order
    /// `R`).
    #[error("token signature does not verify")]
    Signature,
    /// The payload is not the JSON expected.
    #[error("token payload is invalid: {0}")]
    Payload(String),
    /// Past `exp` (plus leeway).
    #[error("token has expired")]
    Expired,
    /// Before `nbf` (minus leeway).
    #[error("token is not valid yet")]
    NotYetValid,
    /// Not issued by the issuer the [`Validation`] names.
    #[error("token issuer is not trusted")]
    Issuer,
    /// A required claim is missing or malformed, or a claim hako never issues is present.
    #[error("token claims are invalid: {0}")]
    Claims(String),
    /// A JWK that is not an Ed25519 public key.
    #[error("JWK is not usable: {0}")]
    Jwk(String),
    /// `jsonwebtoken` refused for a reason of its own (a key or provider failure).
    #[error("token refused: {0}")]
    Library(String),
}

impl From<jsonwebtoken::errors::Error> for JwsError {
    fn from(e: jsonwebtoken::errors::Error) -> Self {
        match e.kind() {
            ErrorKind::InvalidSignature => JwsError::Signature,
            ErrorKind::ExpiredSignature => JwsError::Expired,
            ErrorKind::ImmatureSignature => JwsError::NotYetValid,
            ErrorKind::InvalidIssuer => JwsError::Issuer,
            ErrorKind::InvalidAudience => JwsError::Claims("aud is not accepted".into()),
            ErrorKind::MissingRequiredClaim(c) => {
                JwsError::Claims(format!("{} is required", clip(c)))
            }
            ErrorKind::InvalidClaimFormat(c) => {
                JwsError::Claims(format!("{} is malformed", clip(c)))
            }
            ErrorKind::InvalidToken => JwsError::Segments,
            ErrorKind::InvalidAlgorithm
            | ErrorKind::MissingAlgorithm
            | ErrorKind::InvalidAlgorithmName
            | ErrorKind::UnsupportedAlgorithm => JwsError::Alg("not EdDSA".into()),
            ErrorKind::Base64(_) => JwsError::Base64("payload"),
            ErrorKind::Json(j) => JwsError::Payload(j.to_string()),
            ErrorKind::Utf8(_) => JwsError::Payload("not UTF-8".into()),
            other => JwsError::Library(format!("{other:?}")),
        }
    }
}

fn clip(s: &str) -> String {
    s.chars().take(32).collect()
}

/// The points of small order on Ed25519, as libsodium lists them: the `y` of each, little
/// endian, with the sign bit of `x` (the top bit) cleared. Order 4 (`y = 0`), order 1
/// (`y = 1`), the two `y`s of order 8, order 2 (`y = p - 1`), and the non-canonical
/// encodings `p` (`= 0`) and `p + 1` (`= 1`). With the top bit either way these are the 14
/// strings that decode to a small-order point (a unit test derives them from
/// curve25519-dalek's torsion points).
const SMALL_ORDER_Y: [[u8; 32]; 7] = [
    [0; 32],
    {
        let mut one = [0u8; 32];
        one[0] = 1;
        one
    },
    [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98,
        0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53,
        0xfc, 0x05,
    ],
    [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67,
        0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac,
        0x03, 0x7a,
    ],
    p_plus(-1),
    p_plus(0),
    p_plus(1),
];

/// `p + k` (`p = 2^255 - 19`) little endian, for small `k`.
const fn p_plus(k: i8) -> [u8; 32] {
    let mut b = [0xffu8; 32];
    b[31] = 0x7f;
    b[0] = (0xed_i16 + k as i16) as u8;
    b
}

/// Whether `encoding` decodes to a point of small order (order 1, 2, 4 or 8), canonical or
/// not. Such an `R` or key lets signatures verify for messages nobody signed with the key;
/// `verify_strict` refuses both. Plain verification (aws-lc's) already demands that `R` be the
/// canonical encoding of the recomputed point, so comparing bytes refuses exactly what
/// decompressing `R` would (as libsodium does), at no cost.
pub fn small_order(encoding: &[u8; 32]) -> bool {
    let mut y = *encoding;
    y[31] &= 0x7f;
    SMALL_ORDER_Y.contains(&y)
}

/// An Ed25519 public key (never one of small order), with the `jsonwebtoken` decoding key
/// built once. Cheap to clone; equal when the key bytes are.
#[derive(Clone)]
pub struct VerifyingKey {
    bytes: [u8; 32],
    decoding: Arc<DecodingKey>,
}

impl PartialEq for VerifyingKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for VerifyingKey {}

impl std::fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("VerifyingKey")
            .field(&B64.encode(self.bytes))
            .finish()
    }
}

impl VerifyingKey {
    /// The key for 32 public key bytes; refuses a small-order point. (A string that is not a
    /// point at all is accepted here and verifies nothing: aws-lc refuses it on every check.)
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, JwsError> {
        if small_order(bytes) {
            return Err(JwsError::Jwk("x is a small-order point".into()));
        }
        Ok(Self {
            bytes: *bytes,
            // The raw 32 bytes, as `DecodingKey::from_ed_components` holds them once it has
            // decoded a JWK's `x`.
            decoding: Arc::new(DecodingKey::from_ed_der(bytes)),
        })
    }

    /// The 32 key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The 32 key bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.bytes
    }
}

/// One public key in JWKS form (RFC 8037 `OKP` / `Ed25519`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    /// Key type; must be `OKP`.
    pub kty: String,
    /// Curve; must be `Ed25519`.
    #[serde(default)]
    pub crv: String,
    /// The public key, base64url.
    #[serde(default)]
    pub x: String,
    /// Key id: the RFC 7638 thumbprint.
    #[serde(default)]
    pub kid: String,
    /// Algorithm, `EdDSA` when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    /// Use, `sig` when present.
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub use_: Option<String>,
}

/// A JSON Web Key Set.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    /// The keys.
    pub keys: Vec<Jwk>,
}

impl Jwk {
    /// The JWK of a public key, with its thumbprint as `kid`.
    pub fn from_key(key: &VerifyingKey) -> Self {
        Self {
            kty: "OKP".into(),
            crv: "Ed25519".into(),
            x: B64.encode(key.as_bytes()),
            kid: thumbprint(key),
            alg: Some(ALG.into()),
            use_: Some("sig".into()),
        }
    }

    /// The Ed25519 public key, refusing any other key type, curve, algorithm or use, and
    /// weak (small-order) keys.
    pub fn to_key(&self) -> Result<VerifyingKey, JwsError> {
        if self.kty != "OKP" || self.crv != "Ed25519" {
            return Err(JwsError::Jwk(format!(
                "kty {:?} / crv {:?}; only OKP / Ed25519 is accepted",
                clip(&self.kty),
                clip(&self.crv)
            )));
        }
        if self.alg.as_deref().is_some_and(|a| a != ALG) {
            return Err(JwsError::Jwk("alg is not EdDSA".into()));
        }
        if self.use_.as_deref().is_some_and(|u| u != "sig") {
            return Err(JwsError::Jwk("use is not sig".into()));
        }
        if self.kid.is_empty() {
            return Err(JwsError::Jwk("kid is missing".into()));
        }
        let raw = B64
            .decode(self.x.as_bytes())
            .map_err(|_| JwsError::Jwk("x is not base64url".into()))?;
        let bytes: [u8; 32] = raw
            .try_into()
            .map_err(|_| JwsError::Jwk("x is not 32 bytes".into()))?;
        VerifyingKey::from_bytes(&bytes)
    }
}

/// The RFC 7638 thumbprint of an Ed25519 key: base64url(sha256 of the canonical JWK).
pub fn thumbprint(key: &VerifyingKey) -> String {
    // Members in lexicographic order, no whitespace, as RFC 7638 §3 requires.
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        B64.encode(key.as_bytes())
    );
    B64.encode(Sha256::digest(canonical.as_bytes()))
}

/// A private signing key with its `kid`. `Debug` shows the kid only.
///
/// The key is parsed once: the aws-lc key pair signs, and the `EncodingKey` (PKCS#8 v1, the
/// form `jsonwebtoken` documents) is what `jsonwebtoken::encode` is handed. That function
/// would re-parse the PKCS#8 document, deriving the public key again, on every call (about as
/// dear as the signature itself); hako's [`provider`] hands it the parsed pair instead.
pub struct Signer {
    pair: Arc<Ed25519KeyPair>,
    encoding: EncodingKey,
    header: Header,
    public: VerifyingKey,
    kid: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("kid", &self.kid).finish()
    }
}

impl Signer {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)?;
        let signer = Self::from_secret(&secret);
        secret.fill(0);
        Ok(signer)
    }

    /// The signer for stored secret bytes (the Ed25519 seed).
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        // Every 32 bytes are an Ed25519 seed: aws-lc fails here only if it cannot allocate.
        let pair = Ed25519KeyPair::from_seed_unchecked(secret)
            .expect("aws-lc takes any 32-byte Ed25519 seed");
        let pkcs8 = pair
            .to_pkcs8v1()
            .expect("aws-lc serialises an Ed25519 key pair");
        let public: [u8; 32] = pair
            .public_key()
            .as_ref()
            .try_into()
            .expect("an Ed25519 public key is 32 bytes");
        // The public key of a seed is a multiple of the base point: never of small order.
        let public =
            VerifyingKey::from_bytes(&public).expect("a seed's public key has large order");
        let kid = thumbprint(&public);
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        Self {
            pair: Arc::new(pair),
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            header,
            public,
            kid,
        }
    }

    /// The secret bytes, for persisting the key.
    pub fn secret_bytes(&self) -> [u8; 32] {
        let seed = self
            .pair
            .seed()
            .expect("aws-lc exports the seed it was made from");
        seed.as_be_bytes()
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b.as_ref()).ok())
            .expect("an Ed25519 seed is 32 bytes")
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.public.clone()
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Jwk {
        Jwk::from_key(&self.public)
    }

    /// Signs `claims` into a compact JWS: `{"typ":"JWT","alg":"EdDSA","kid":…}`, encoded and
    /// signed by `jsonwebtoken`.
    pub fn sign<T: Serialize>(&self, claims: &T) -> Result<String, JwsError> {
        provider::ensure();
        provider::with_key_pair(&self.encoding, &self.pair, || {
            jsonwebtoken::encode(&self.header, claims, &self.encoding)
        })
        .map_err(|e| match e.into_kind() {
            ErrorKind::Json(j) => JwsError::Payload(j.to_string()),
            other => JwsError::Library(format!("{other:?}")),
        })
    }
}

/// hako's `jsonwebtoken` crypto provider: aws-lc's, except that signing with a [`Signer`]'s
/// key uses the key pair the signer parsed once.
///
/// `jsonwebtoken` asks its provider for a signer per call, passing only the `EncodingKey`;
/// aws-lc's provider parses the PKCS#8 bytes into a new key pair each time. Around its call to
/// `jsonwebtoken::encode`, [`Signer::sign`] names its `EncodingKey` and key pair in a
/// thread-local; the provider hands out that pair when asked for exactly that `EncodingKey`
/// (the same address) and defers to aws-lc's provider for anything else.
mod provider {
    use std::cell::RefCell;
    use std::sync::{Arc, OnceLock};

    use aws_lc_rs::signature::Ed25519KeyPair;
    use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, KeyUtils, aws_lc};
    use jsonwebtoken::{Algorithm, EncodingKey};

    struct Current {
        /// The address of the `EncodingKey` being signed with.
        key: usize,
        pair: Arc<Ed25519KeyPair>,
    }

    thread_local! {
        static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
    }

    fn addr(key: &EncodingKey) -> usize {
        std::ptr::from_ref(key) as usize
    }

    /// Runs `f` (a call to `jsonwebtoken::encode` with `key`) with `pair` standing for `key`.
    pub(super) fn with_key_pair<R>(
        key: &EncodingKey,
        pair: &Arc<Ed25519KeyPair>,
        f: impl FnOnce() -> R,
    ) -> R {
        struct Restore(Option<Current>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let prev = self.0.take();
                CURRENT.with_borrow_mut(|c| *c = prev);
            }
        }
        let prev = CURRENT.with_borrow_mut(|c| {
            c.replace(Current {
                key: addr(key),
                pair: Arc::clone(pair),
            })
        });
        let _restore = Restore(prev);
        f()
    }

    struct ParsedEd25519(Arc<Ed25519KeyPair>);

    #[cfg(test)]
    thread_local! {
        /// Signatures made with a parsed pair on this thread, for the tests.
        pub(super) static PARSED_SIGNS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    impl jsonwebtoken::signature::Signer<Vec<u8>> for ParsedEd25519 {
        fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, jsonwebtoken::signature::Error> {
            #[cfg(test)]
            PARSED_SIGNS.with(|c| c.set(c.get() + 1));
            Ok(self.0.sign(msg).as_ref().to_vec())
        }
    }

    impl JwtSigner for ParsedEd25519 {
        fn algorithm(&self) -> Algorithm {
            Algorithm::EdDSA
        }
    }

    fn signer_factory(
        alg: &Algorithm,
        key: &EncodingKey,
    ) -> jsonwebtoken::errors::Result<Box<dyn JwtSigner>> {
        if *alg == Algorithm::EdDSA {
            let parsed = CURRENT.with_borrow(|c| {
                c.as_ref()
                    .filter(|c| c.key == addr(key))
                    .map(|c| Arc::clone(&c.pair))
            });
            if let Some(pair) = parsed {
                return Ok(Box::new(ParsedEd25519(pair)));
            }
        }
        (aws_lc::DEFAULT_PROVIDER.signer_factory)(alg, key)
    }

    static PROVIDER: CryptoProvider = CryptoProvider {
        signer_factory,
        verifier_factory: aws_lc::DEFAULT_PROVIDER.verifier_factory,
        key_utils: KeyUtils {
            rsa_pub_components_from_private_key: aws_lc::DEFAULT_PROVIDER
                .key_utils
                .rsa_pub_components_from_private_key,
            rsa_pub_components_from_public_key: aws_lc::DEFAULT_PROVIDER
                .key_utils
                .rsa_pub_components_from_public_key,
            ec_pub_components_from_private_key: aws_lc::DEFAULT_PROVIDER
                .key_utils
                .ec_pub_components_from_private_key,
            ed_pub_components_from_private_key: aws_lc::DEFAULT_PROVIDER
                .key_utils
                .ed_pub_components_from_private_key,
            compute_digest: aws_lc::DEFAULT_PROVIDER.key_utils.compute_digest,
        },
    };

    /// Installs hako's provider as the process's `jsonwebtoken` provider, once, before any
    /// call into the library (each one goes through here). Whether it is the installed one:
    /// if another was installed first, signing still works, re-parsing the key per call.
    pub(super) fn ensure() -> bool {
        static OURS: OnceLock<bool> = OnceLock::new();
        *OURS.get_or_init(|| {
            let ours = match CryptoProvider::install_default(&PROVIDER) {
                Ok(()) => true,
                Err(existing) => std::ptr::eq(existing, &PROVIDER),
            };
            if !ours {
                tracing::warn!(
                    "another jsonwebtoken crypto provider was installed first; every token \
                     signature re-parses its key"
                );
            }
            ours
        })
    }
}

/// The claim checks `jsonwebtoken` applies for a [`Verifier`](super::Verifier), each set on
/// purpose rather than left at the library's defaults:
///
/// - `algorithms = [EdDSA]` (the header was already held to it);
/// - `exp`, `nbf`, `iss` and `sub` required (`iat`, which the library cannot require, is a
///   required field of [`super::Claims`]; hako checks it is not in the future);
/// - `exp` and `nbf` checked with `leeway` (the configured clock skew, not the library's 60 s);
/// - `iss` must be `issuer`;
/// - `aud` checked with no audience configured, so a token carrying any `aud` is refused:
///   authd never sets one, scopes and folders say what a token may do.
pub fn validation(issuer: &str, leeway: Duration) -> Validation {
    let mut v = Validation::new(Algorithm::EdDSA);
    v.algorithms = vec![Algorithm::EdDSA];
    v.set_required_spec_claims(&["exp", "nbf", "iss", "sub"]);
    v.leeway = leeway.as_secs().min(MAX_LEEWAY_SECS);
    v.reject_tokens_expiring_in_less_than = 0;
    v.validate_exp = true;
    v.validate_nbf = true;
    v.validate_aud = true;
    v.aud = None;
    v.set_issuer(&[issuer]);
    v.sub = None;
    v
}

/// Signature only, no claim checks: for [`verify`], whose callers check claims themselves.
fn signature_only() -> &'static Validation {
    static V: std::sync::OnceLock<Validation> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let mut v = Validation::new(Algorithm::EdDSA);
        v.algorithms = vec![Algorithm::EdDSA];
        v.required_spec_claims.clear();
        v.validate_exp = false;
        v.validate_nbf = false;
        v.validate_aud = false;
        v
    })
}

/// `crit`, present with any value (`null` included).
#[derive(Default)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

#[derive(Deserialize)]
struct HeaderIn {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    typ: Option<String>,
    #[serde(default)]
    crit: Present,
}

/// A token whose size, shape, header and signature's `R` were checked, not yet its signature.
#[derive(Debug)]
pub struct Parsed<'a> {
    token: &'a str,
    kid: String,
}

/// Checks the envelope before `jsonwebtoken` sees the token: size, three segments, base64url,
/// `alg: EdDSA`, a `kid`, an optional `typ: JWT`, no `crit`, a 64-byte signature whose `R` is
/// not of small order.
pub fn parse(token: &str) -> Result<Parsed<'_>, JwsError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(JwsError::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwsError::Segments);
    };
    if h.is_empty() || p.is_empty() {
        return Err(JwsError::Segments);
    }
    let header_json = B64.decode(h).map_err(|_| JwsError::Base64("header"))?;
    let header: HeaderIn =
        serde_json::from_slice(&header_json).map_err(|e| JwsError::Header(e.to_string()))?;
    if header.alg != ALG {
        return Err(JwsError::Alg(clip(&header.alg)));
    }
    if header.crit.0 {
        return Err(JwsError::Header("crit is not supported".into()));
    }
    if header.typ.as_deref().is_some_and(|t| t != "JWT") {
        return Err(JwsError::Header("typ is not JWT".into()));
    }
    let kid = header
        .kid
        .filter(|k| !k.is_empty())
        .ok_or(JwsError::MissingKid)?;
    let sig = B64.decode(s).map_err(|_| JwsError::Base64("signature"))?;
    let sig: [u8; 64] = sig.try_into().map_err(|_| JwsError::Signature)?;
    let r: &[u8; 32] = sig[..32].try_into().map_err(|_| JwsError::Signature)?;
    if small_order(r) {
        return Err(JwsError::Signature);
    }
    Ok(Parsed { token, kid })
}

impl Parsed<'_> {
    /// The header's key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Verifies the signature with `key` and decodes the claims, checked by `validation`
    /// (see [`validation`]), all by `jsonwebtoken`.
    pub fn decode<T: DeserializeOwned>(
        &self,
        key: &VerifyingKey,
        validation: &Validation,
    ) -> Result<T, JwsError> {
        provider::ensure();
        Ok(jsonwebtoken::decode::<T>(self.token, &key.decoding, validation)?.claims)
    }
}

/// Checks the envelope, verifies with `key` and decodes, checking the claims with
/// `validation` (for callers holding the key).
pub fn decode<T: DeserializeOwned>(
    token: &str,
    key: &VerifyingKey,
    validation: &Validation,
) -> Result<T, JwsError> {
    parse(token)?.decode(key, validation)
}

/// Checks the envelope, verifies the signature with `key` and decodes the payload, checking
/// no claim: the caller must (the [`Verifier`](super::Verifier) does).
pub fn verify<T: DeserializeOwned>(token: &str, key: &VerifyingKey) -> Result<T, JwsError> {
    decode(token, key, signature_only())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(v: &serde_json::Value) -> String {
        B64.encode(serde_json::to_vec(v).unwrap())
    }

    fn dalek_key(key: &VerifyingKey) -> ed25519_dalek::VerifyingKey {
        ed25519_dalek::VerifyingKey::from_bytes(key.as_bytes()).unwrap()
    }

    /// `(signing input, signature bytes)` of a compact token.
    fn split(token: &str) -> (&str, [u8; 64]) {
        let (input, sig) = token.rsplit_once('.').unwrap();
        (input, B64.decode(sig).unwrap().try_into().unwrap())
    }

    #[test]
    fn round_trip_and_kid() {
        let s = Signer::generate().unwrap();
        let token = s.sign(&json!({"sub": "x"})).unwrap();
        let v: serde_json::Value = verify(&token, &s.verifying_key()).unwrap();
        assert_eq!(v["sub"], "x");
        let p = parse(&token).unwrap();
        assert_eq!(p.kid(), s.kid());
        // The header jsonwebtoken wrote: EdDSA, JWT, the kid, nothing else.
        let header: serde_json::Value =
            serde_json::from_slice(&B64.decode(token.split('.').next().unwrap()).unwrap()).unwrap();
        assert_eq!(
            header,
            json!({"alg": "EdDSA", "typ": "JWT", "kid": s.kid()})
        );
        // The same secret gives the same key and kid (stable across restarts).
        let again = Signer::from_secret(&s.secret_bytes());
        assert_eq!(again.kid(), s.kid());
        assert_eq!(again.verifying_key(), s.verifying_key());
        assert_eq!(again.secret_bytes(), s.secret_bytes());
        // The JWK round-trips to the same key.
        assert_eq!(s.jwk().to_key().unwrap(), s.verifying_key());
        assert_eq!(s.jwk().kid, s.kid());
        assert!(format!("{s:?}").contains(s.kid()));
        assert!(!format!("{s:?}").contains(&B64.encode(s.secret_bytes())));
    }

    /// Ed25519 is deterministic: what jsonwebtoken signs through hako's provider (the key pair
    /// parsed once) must be the bytes an independent implementation (dalek) signs, and the
    /// provider must be the one installed, handing out the parsed pair.
    #[test]
    fn signatures_equal_dalek_signatures_and_use_the_parsed_key() {
        assert!(
            provider::ensure(),
            "hako's jsonwebtoken provider is installed"
        );
        for i in 0..32usize {
            let s = Signer::generate().unwrap();
            let dalek = ed25519_dalek::SigningKey::from_bytes(&s.secret_bytes());
            assert_eq!(
                dalek.verifying_key().to_bytes(),
                s.verifying_key().to_bytes()
            );
            let before = provider::PARSED_SIGNS.with(|c| c.get());
            let token = s.sign(&json!({"i": i, "pad": "x".repeat(i * 7)})).unwrap();
            assert_eq!(provider::PARSED_SIGNS.with(|c| c.get()), before + 1);
            let (input, sig) = split(&token);
            use ed25519_dalek::Signer as _;
            assert_eq!(sig, dalek.sign(input.as_bytes()).to_bytes());
        }
    }

    /// hako's envelope plus jsonwebtoken (aws-lc) refuse exactly what dalek's `verify_strict`
    /// refuses: good tokens, flipped bits, small-order `R`s with any `s`, and `s + L`.
    #[test]
    fn verify_agrees_with_verify_strict() {
        // The group order L, little-endian: s + L is the non-canonical twin of s.
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let add_l = |s: &[u8]| {
            let mut out = [0u8; 32];
            let mut carry = 0u16;
            for i in 0..32 {
                let v = u16::from(s[i]) + u16::from(L[i]) + carry;
                out[i] = v as u8;
                carry = v >> 8;
            }
            out
        };
        let s = Signer::generate().unwrap();
        let key = s.verifying_key();
        let other = Signer::generate().unwrap().verifying_key();
        let with_sig = |input: &str, sig: &[u8; 64]| format!("{input}.{}", B64.encode(sig));
        // Both verdicts on one token, asserted equal; returns whether hako accepts.
        let agree = |token: &str, key: &VerifyingKey| {
            let (input, sig) = split(token);
            let strict = dalek_key(key)
                .verify_strict(
                    input.as_bytes(),
                    &ed25519_dalek::Signature::from_bytes(&sig),
                )
                .is_ok();
            let ours = verify::<serde_json::Value>(token, key);
            assert_eq!(
                ours.is_ok(),
                strict,
                "hako {ours:?}, verify_strict {strict}"
            );
            if let Err(e) = ours {
                assert_eq!(e, JwsError::Signature);
            }
            strict
        };
        for i in 0..64usize {
            let token = s.sign(&json!({"i": i})).unwrap();
            assert!(agree(&token, &key));
            assert!(!agree(&token, &other));
            let (input, good) = split(&token);
            let mut bad = good;
            bad[i] ^= 1 << (i % 8);
            assert!(!agree(&with_sig(input, &bad), &key));
            let mut twin = good;
            twin[32..].copy_from_slice(&add_l(&good[32..]));
            assert!(!agree(&with_sig(input, &twin), &key));
        }
        // Every small-order R (the identity among them), with any s, is refused.
        let token = s.sign(&json!({"a": 1})).unwrap();
        let (input, _) = split(&token);
        for p in curve25519_dalek::constants::EIGHT_TORSION {
            for s_bytes in [[0u8; 32], [7u8; 32]] {
                let mut sig = [0u8; 64];
                sig[..32].copy_from_slice(p.compress().as_bytes());
                sig[32..].copy_from_slice(&s_bytes);
                let forged = with_sig(input, &sig);
                assert_eq!(parse(&forged).unwrap_err(), JwsError::Signature);
                assert!(!agree(&forged, &key));
            }
        }
    }

    /// The table of small-order encodings is exactly libsodium's: it holds every small-order
    /// point's encoding (from curve25519-dalek's torsion points, either sign bit), each entry
    /// decodes (where dalek decodes it at all) to a small-order point, and real keys are not in
    /// it.
    #[test]
    fn small_order_table_matches_the_torsion_points() {
        use curve25519_dalek::edwards::CompressedEdwardsY;
        for p in curve25519_dalek::constants::EIGHT_TORSION {
            let mut enc = p.compress().to_bytes();
            assert!(small_order(&enc), "{enc:?}");
            enc[31] ^= 0x80;
            assert!(small_order(&enc));
        }
        let mut decoded = 0;
        for y in SMALL_ORDER_Y {
            for top in [0u8, 0x80] {
                let mut enc = y;
                enc[31] |= top;
                assert!(small_order(&enc));
                if let Some(p) = CompressedEdwardsY(enc).decompress() {
                    assert!(p.is_small_order(), "{enc:?}");
                    decoded += 1;
                }
                assert!(VerifyingKey::from_bytes(&enc).is_err());
            }
        }
        assert!(decoded >= 8, "the canonical encodings decode");
        for _ in 0..64 {
            let k = Signer::generate().unwrap().verifying_key();
            assert!(!small_order(k.as_bytes()));
            assert!(!dalek_key(&k).is_weak());
        }
    }

    #[test]
    fn thumbprint_matches_rfc8037_example_and_jsonwebtoken() {
        // RFC 8037 appendix A.3: the thumbprint of the example public key.
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let bytes: [u8; 32] = B64.decode(x).unwrap().try_into().unwrap();
        let key = VerifyingKey::from_bytes(&bytes).unwrap();
        assert_eq!(
            thumbprint(&key),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
        // jsonwebtoken computes the same for our JWK, for random keys too.
        for _ in 0..8 {
            let s = Signer::generate().unwrap();
            let theirs: jsonwebtoken::jwk::Jwk =
                serde_json::from_value(serde_json::to_value(s.jwk()).unwrap()).unwrap();
            assert!(provider::ensure());
            assert_eq!(
                theirs
                    .thumbprint(jsonwebtoken::jwk::ThumbprintHash::SHA256)
                    .unwrap(),
                s.kid()
            );
        }
    }

    #[test]
    fn rejects_other_algorithms_and_shapes() {
        let s = Signer::generate().unwrap();
        let good = s.sign(&json!({"a": 1})).unwrap();
        let mut seg = good.split('.');
        let (_, p, sig) = (
            seg.next().unwrap(),
            seg.next().unwrap(),
            seg.next().unwrap(),
        );
        for alg in ["none", "HS256", "RS256", "ES256", "eddsa", ""] {
            let h = b64(&json!({"alg": alg, "typ": "JWT", "kid": s.kid()}));
            let t = format!("{h}.{p}.{sig}");
            assert!(matches!(parse(&t), Err(JwsError::Alg(_))), "{alg}");
        }
        let h = b64(&json!({"alg": "none", "kid": s.kid()}));
        assert!(parse(&format!("{h}.{p}.")).is_err());
        let h = b64(&json!({"alg": "EdDSA"}));
        assert_eq!(
            parse(&format!("{h}.{p}.{sig}")).unwrap_err(),
            JwsError::MissingKid
        );
        let h = b64(&json!({"alg": "EdDSA", "kid": ""}));
        assert_eq!(
            parse(&format!("{h}.{p}.{sig}")).unwrap_err(),
            JwsError::MissingKid
        );
        for crit in [json!(["exp"]), json!([]), json!(null)] {
            let h = b64(&json!({"alg": "EdDSA", "kid": "k", "crit": crit}));
            assert_eq!(
                parse(&format!("{h}.{p}.{sig}")).unwrap_err(),
                JwsError::Header("crit is not supported".into()),
                "{crit}"
            );
        }
        let h = b64(&json!({"alg": "EdDSA", "kid": "k", "typ": "at+jwt"}));
        assert!(matches!(
            parse(&format!("{h}.{p}.{sig}")),
            Err(JwsError::Header(_))
        ));
        // The same algorithm twice: serde refuses the duplicate rather than picking one.
        let h = B64.encode(br#"{"alg":"EdDSA","alg":"none","kid":"k"}"#);
        assert!(matches!(
            parse(&format!("{h}.{p}.{sig}")),
            Err(JwsError::Header(_))
        ));
        assert_eq!(parse("a.b").unwrap_err(), JwsError::Segments);
        assert_eq!(parse("a.b.c.d").unwrap_err(), JwsError::Segments);
        assert_eq!(parse("..").unwrap_err(), JwsError::Segments);
        assert_eq!(
            parse(&"a".repeat(MAX_TOKEN_LEN + 1)).unwrap_err(),
            JwsError::TooLong
        );
        assert!(matches!(
            parse(&format!("{good}=")),
            Err(JwsError::Base64(_))
        ));
        assert!(matches!(parse("!!.a.b"), Err(JwsError::Base64(_))));
        // A truncated signature is not 64 bytes.
        assert!(parse(&good[..good.len() - 4]).is_err());
    }

    #[test]
    fn rejects_wrong_key_and_tampering() {
        let s = Signer::generate().unwrap();
        let other = Signer::generate().unwrap();
        let token = s.sign(&json!({"scope": ["a:b"]})).unwrap();
        assert_eq!(
            verify::<serde_json::Value>(&token, &other.verifying_key()).unwrap_err(),
            JwsError::Signature
        );
        let mut seg = token.split('.');
        let (h, _, sig) = (
            seg.next().unwrap(),
            seg.next().unwrap(),
            seg.next().unwrap(),
        );
        let forged = format!("{h}.{}.{sig}", b64(&json!({"scope": ["a:*"]})));
        assert_eq!(
            verify::<serde_json::Value>(&forged, &s.verifying_key()).unwrap_err(),
            JwsError::Signature
        );
    }

    /// The claim checks are hako's choices, not jsonwebtoken's defaults (60 s leeway, only
    /// `exp` required, `nbf` unchecked, `aud` refused only by accident of configuration).
    #[test]
    fn validation_is_set_deliberately() {
        let v = validation("hako-authd", Duration::from_secs(5));
        assert_eq!(v.algorithms, vec![Algorithm::EdDSA]);
        assert_eq!(v.leeway, 5);
        assert!(v.validate_exp && v.validate_nbf && v.validate_aud);
        assert!(v.aud.is_none());
        let mut req: Vec<&str> = v.required_spec_claims.iter().map(String::as_str).collect();
        req.sort_unstable();
        assert_eq!(req, ["exp", "iss", "nbf", "sub"]);
        assert_eq!(
            validation("x", Duration::from_secs(u64::MAX)).leeway,
            MAX_LEEWAY_SECS
        );

        let s = Signer::generate().unwrap();
        let key = s.verifying_key();
        let now = crate::auth::now_secs();
        let claims = |exp: i64, nbf: i64| json!({"iss": "hako-authd", "sub": "runed", "iat": now, "nbf": nbf, "exp": exp});
        let check = |c: &serde_json::Value| {
            decode::<serde_json::Value>(&s.sign(c).unwrap(), &key, &v).map(|_| ())
        };
        assert_eq!(check(&claims(now + 60, now)), Ok(()));
        // 30 s past exp: inside the library's default 60 s, outside the 5 s configured.
        assert_eq!(check(&claims(now - 30, now - 90)), Err(JwsError::Expired));
        assert_eq!(check(&claims(now - 3, now - 90)), Ok(()));
        // nbf is checked (the library's default does not).
        assert_eq!(
            check(&claims(now + 600, now + 30)),
            Err(JwsError::NotYetValid)
        );
        assert_eq!(check(&claims(now + 600, now + 3)), Ok(()));
        for missing in ["exp", "nbf", "iss", "sub"] {
            let mut c = claims(now + 60, now);
            c.as_object_mut().unwrap().remove(missing);
            assert_eq!(
                check(&c),
                Err(JwsError::Claims(format!("{missing} is required"))),
                "{missing}"
            );
        }
        let mut c = claims(now + 60, now);
        c["iss"] = json!("someone-else");
        assert_eq!(check(&c), Err(JwsError::Issuer));
        for aud in [json!("hako"), json!(["runed"]), json!([])] {
            let mut c = claims(now + 60, now);
            c["aud"] = aud;
            assert_eq!(
                check(&c),
                Err(JwsError::Claims("aud is not accepted".into()))
            );
        }
        let mut c = claims(now + 60, now);
        // A required claim that is not a number counts as missing.
        c["exp"] = json!("tomorrow");
        assert_eq!(check(&c), Err(JwsError::Claims("exp is required".into())));
    }

    #[test]
    fn jwk_of_other_types_is_refused() {
        let s = Signer::generate().unwrap();
        let mut j = s.jwk();
        j.kty = "RSA".into();
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        j.crv = "X25519".into();
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        j.alg = Some("HS256".into());
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        j.use_ = Some("enc".into());
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        j.x = "AAAA".into();
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        // The identity point: small order, must be refused.
        let mut id = [0u8; 32];
        id[0] = 1;
        j.x = B64.encode(id);
        assert_eq!(
            j.to_key().unwrap_err(),
            JwsError::Jwk("x is a small-order point".into())
        );
        let mut j = s.jwk();
        j.kid.clear();
        assert!(j.to_key().is_err());
        let j: Jwk = serde_json::from_value(json!({"kty":"oct","k":"c2VjcmV0"})).unwrap();
        assert!(j.to_key().is_err());
    }
}
