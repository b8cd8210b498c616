//! Compact JWS for exactly one algorithm: EdDSA over Ed25519 (RFC 8037).
//!
//! hako needs no algorithm agility, and every JWT bypass in the wild comes from it
//! (`alg: none`, HS256 keyed with the public key, RSA/EC confusion). So the parser accepts
//! `alg: EdDSA` and nothing else, requires a `kid`, refuses `crit`, caps the token's size,
//! and verification has `verify_strict`'s guarantees (no small-order keys or `R`, canonical
//! signatures only) at the price of plain `verify` (see [`Parsed::verify`]).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The only algorithm accepted.
pub const ALG: &str = "EdDSA";
/// Tokens longer than this are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

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
    /// The signature does not verify with the key.
    #[error("token signature does not verify")]
    Signature,
    /// The payload is not the JSON expected.
    #[error("token payload is invalid: {0}")]
    Payload(String),
    /// A JWK that is not an Ed25519 public key.
    #[error("JWK is not usable: {0}")]
    Jwk(String),
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
        let key = VerifyingKey::from_bytes(&bytes)
            .map_err(|_| JwsError::Jwk("x is not a point".into()))?;
        if key.is_weak() {
            return Err(JwsError::Jwk("x is a small-order point".into()));
        }
        Ok(key)
    }
}

fn clip(s: &str) -> String {
    s.chars().take(32).collect()
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
pub struct Signer {
    key: SigningKey,
    /// The same key in aws-lc, which signs 2-2.5x faster than dalek (authd's mint budget is
    /// dominated by the signature). `None` only if aws-lc refused the seed; dalek signs then.
    #[cfg(feature = "aws-lc")]
    fast: Option<aws_lc_rs::signature::Ed25519KeyPair>,
    kid: String,
    /// `base64url(header) + "."`, computed once: the header never changes for a key.
    prefix: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("kid", &self.kid).finish()
    }
}

#[derive(Serialize)]
struct HeaderOut<'a> {
    alg: &'a str,
    typ: &'a str,
    kid: &'a str,
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

    /// The signer for stored secret bytes.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(secret);
        let kid = thumbprint(&key.verifying_key());
        let header = HeaderOut {
            alg: ALG,
            typ: "JWT",
            kid: &kid,
        };
        // Serializing three strings cannot fail.
        let header_json = serde_json::to_vec(&header).unwrap_or_default();
        let mut prefix = B64.encode(header_json);
        prefix.push('.');
        Self {
            #[cfg(feature = "aws-lc")]
            fast: aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(secret).ok(),
            key,
            kid,
            prefix,
        }
    }

    /// The Ed25519 signature of `msg`.
    fn signature(&self, msg: &[u8]) -> [u8; 64] {
        #[cfg(feature = "aws-lc")]
        if let Some(fast) = &self.fast
            && let Ok(sig) = <[u8; 64]>::try_from(fast.sign(msg).as_ref())
        {
            return sig;
        }
        self.key.sign(msg).to_bytes()
    }

    /// The secret bytes, for persisting the key.
    pub fn secret_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Jwk {
        Jwk::from_key(&self.verifying_key())
    }

    /// Signs `claims` into a compact JWS.
    pub fn sign<T: Serialize>(&self, claims: &T) -> Result<String, serde_json::Error> {
        let payload = serde_json::to_vec(claims)?;
        let mut token = String::with_capacity(self.prefix.len() + payload.len() * 4 / 3 + 92);
        token.push_str(&self.prefix);
        B64.encode_string(&payload, &mut token);
        let sig = self.signature(token.as_bytes());
        token.push('.');
        B64.encode_string(sig, &mut token);
        Ok(token)
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
    crit: Option<serde_json::Value>,
}

/// A token whose shape and header were checked, not yet its signature.
#[derive(Debug)]
pub struct Parsed<'a> {
    kid: String,
    signing_input: &'a str,
    payload_b64: &'a str,
    signature: Signature,
}

/// Checks a token's shape and header: size, three segments, base64url, `alg: EdDSA`, a `kid`,
/// an optional `typ: JWT`, no `crit`.
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
    if header.crit.is_some() {
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
    Ok(Parsed {
        kid,
        signing_input: &token[..h.len() + 1 + p.len()],
        payload_b64: p,
        signature: Signature::from_bytes(&sig),
    })
}

impl Parsed<'_> {
    /// The header's key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Verifies the signature with `key`, refusing what `verify_strict` refuses: a
    /// non-canonical `s` or `R`, a small-order `R`, a small-order key.
    ///
    /// `verify_strict` finds a small-order `R` by decompressing it, about a sixth of a
    /// verification. Plain `verify` already demands that `R` be the canonical encoding of the
    /// recomputed point, and the canonical encodings of small-order points are eight fixed
    /// strings, so comparing bytes refuses the same signatures (as libsodium does). Small-order
    /// keys never get this far: [`Jwk::to_key`] and the verifier's key set refuse them.
    ///
    /// With the `aws-lc` feature the equation is checked by aws-lc, about a third faster than
    /// dalek here; both check the same cofactorless equation, demand a canonical `s` and
    /// compare `R` as bytes, so they accept the same signatures (a test holds them to it).
    pub fn verify(&self, key: &VerifyingKey) -> Result<(), JwsError> {
        if key.is_weak() || small_order_encodings().contains(self.signature.r_bytes()) {
            return Err(JwsError::Signature);
        }
        #[cfg(feature = "aws-lc")]
        let ok = equation_aws_lc(key, self.signing_input.as_bytes(), &self.signature);
        #[cfg(not(feature = "aws-lc"))]
        let ok = equation_dalek(key, self.signing_input.as_bytes(), &self.signature);
        if ok { Ok(()) } else { Err(JwsError::Signature) }
    }

    /// Decodes the payload. Call only after [`Parsed::verify`] succeeded.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, JwsError> {
        let bytes = B64
            .decode(self.payload_b64)
            .map_err(|_| JwsError::Base64("payload"))?;
        serde_json::from_slice(&bytes).map_err(|e| JwsError::Payload(e.to_string()))
    }
}

/// Ed25519's verification equation (cofactorless, canonical `s`, `R` compared as bytes).
#[cfg_attr(feature = "aws-lc", allow(dead_code))]
fn equation_dalek(key: &VerifyingKey, msg: &[u8], sig: &Signature) -> bool {
    use ed25519_dalek::Verifier as _;
    key.verify(msg, sig).is_ok()
}

/// The same equation, checked by aws-lc.
#[cfg(feature = "aws-lc")]
fn equation_aws_lc(key: &VerifyingKey, msg: &[u8], sig: &Signature) -> bool {
    use aws_lc_rs::signature::{ED25519, UnparsedPublicKey};
    UnparsedPublicKey::new(&ED25519, key.as_bytes())
        .verify(msg, &sig.to_bytes())
        .is_ok()
}

/// The canonical encodings of the eight points of small order.
fn small_order_encodings() -> &'static [[u8; 32]; 8] {
    static ENCODINGS: std::sync::OnceLock<[[u8; 32]; 8]> = std::sync::OnceLock::new();
    ENCODINGS
        .get_or_init(|| curve25519_dalek::constants::EIGHT_TORSION.map(|p| p.compress().to_bytes()))
}

/// Parses, verifies with `key` and decodes in one step (for callers holding the key).
pub fn verify<T: DeserializeOwned>(token: &str, key: &VerifyingKey) -> Result<T, JwsError> {
    let parsed = parse(token)?;
    parsed.verify(key)?;
    parsed.payload()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(v: &serde_json::Value) -> String {
        B64.encode(serde_json::to_vec(v).unwrap())
    }

    #[test]
    fn round_trip_and_kid() {
        let s = Signer::generate().unwrap();
        let token = s.sign(&json!({"sub": "x"})).unwrap();
        let v: serde_json::Value = verify(&token, &s.verifying_key()).unwrap();
        assert_eq!(v["sub"], "x");
        let p = parse(&token).unwrap();
        assert_eq!(p.kid(), s.kid());
        // The same secret gives the same kid (stable across restarts).
        let again = Signer::from_secret(&s.secret_bytes());
        assert_eq!(again.kid(), s.kid());
        // The JWK round-trips to the same key.
        assert_eq!(s.jwk().to_key().unwrap(), s.verifying_key());
        assert_eq!(s.jwk().kid, s.kid());
        assert!(format!("{s:?}").contains(s.kid()));
    }

    /// Ed25519 is deterministic: the aws-lc signer must produce dalek's exact bytes, or
    /// tokens from authd would not be what every verifier expects.
    #[cfg(feature = "aws-lc")]
    #[test]
    fn fast_signatures_equal_dalek_signatures() {
        for i in 0..64u8 {
            let s = Signer::generate().unwrap();
            assert!(s.fast.is_some());
            let msg = vec![i; usize::from(i) * 13];
            assert_eq!(s.signature(&msg), s.key.sign(&msg).to_bytes());
        }
    }

    /// The byte check refuses exactly what `verify_strict` refuses, on good tokens, tampered
    /// ones and signatures whose `R` is a point of small order.
    #[test]
    fn verify_agrees_with_verify_strict() {
        let s = Signer::generate().unwrap();
        let key = s.verifying_key();
        let strict = |p: &Parsed<'_>| {
            key.verify_strict(p.signing_input.as_bytes(), &p.signature)
                .is_ok()
        };
        for i in 0..32 {
            let token = s.sign(&json!({"i": i})).unwrap();
            let p = parse(&token).unwrap();
            assert!(p.verify(&key).is_ok() && strict(&p));
            let mut sig = p.signature.to_bytes();
            sig[i] ^= 1 << (i % 8);
            let bad = Parsed {
                signature: Signature::from_bytes(&sig),
                ..parse(&token).unwrap()
            };
            assert!(bad.verify(&key).is_err() && !strict(&bad));
        }
        // Every small-order R (the identity among them), with any s, is refused.
        let token = s.sign(&json!({"a": 1})).unwrap();
        let encodings = small_order_encodings();
        assert!(encodings.contains(&{
            let mut id = [0u8; 32];
            id[0] = 1;
            id
        }));
        for r in encodings {
            for s_bytes in [[0u8; 32], [7u8; 32]] {
                let mut sig = [0u8; 64];
                sig[..32].copy_from_slice(r);
                sig[32..].copy_from_slice(&s_bytes);
                let forged = Parsed {
                    signature: Signature::from_bytes(&sig),
                    ..parse(&token).unwrap()
                };
                assert_eq!(forged.verify(&key), Err(JwsError::Signature));
                assert!(!strict(&forged));
            }
        }
    }

    /// aws-lc and dalek must accept exactly the same signatures: every verifier answers the
    /// same whichever backend its daemon was built with.
    #[cfg(feature = "aws-lc")]
    #[test]
    fn aws_lc_and_dalek_accept_the_same_signatures() {
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
        let agree = |key: &VerifyingKey, msg: &[u8], sig: [u8; 64]| {
            let sig = Signature::from_bytes(&sig);
            let (d, a) = (
                equation_dalek(key, msg, &sig),
                equation_aws_lc(key, msg, &sig),
            );
            assert_eq!(d, a, "dalek {d}, aws-lc {a} on {:?}", sig.to_bytes());
            d
        };
        for i in 0..64usize {
            let s = Signer::generate().unwrap();
            let key = s.verifying_key();
            let msg = vec![i as u8; i * 7];
            let good = s.signature(&msg);
            assert!(agree(&key, &msg, good));
            // A flipped bit anywhere in R or s, and a tampered message.
            let mut bad = good;
            bad[i] ^= 1 << (i % 8);
            assert!(!agree(&key, &msg, bad));
            let mut tampered = msg.clone();
            tampered.push(1);
            assert!(!agree(&key, &tampered, good));
            // s + L verifies the same equation, but is not canonical: both refuse it.
            let mut twin = good;
            twin[32..].copy_from_slice(&add_l(&good[32..]));
            assert!(!agree(&key, &msg, twin));
            // Another key.
            assert!(!agree(
                &Signer::generate().unwrap().verifying_key(),
                &msg,
                good
            ));
        }
    }

    #[test]
    fn thumbprint_matches_rfc8037_example() {
        // RFC 8037 appendix A.3: the thumbprint of the example public key.
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let bytes: [u8; 32] = B64.decode(x).unwrap().try_into().unwrap();
        let key = VerifyingKey::from_bytes(&bytes).unwrap();
        assert_eq!(
            thumbprint(&key),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
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
        let h = b64(&json!({"alg": "EdDSA", "kid": "k", "crit": ["exp"]}));
        assert!(matches!(
            parse(&format!("{h}.{p}.{sig}")),
            Err(JwsError::Header(_))
        ));
        let h = b64(&json!({"alg": "EdDSA", "kid": "k", "typ": "at+jwt"}));
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
        j.x = "AAAA".into();
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        // The identity point: small order, must be refused.
        let mut id = [0u8; 32];
        id[0] = 1;
        j.x = B64.encode(id);
        assert!(j.to_key().is_err());
        let mut j = s.jwk();
        j.kid.clear();
        assert!(j.to_key().is_err());
        let j: Jwk = serde_json::from_value(json!({"kty":"oct","k":"c2VjcmV0"})).unwrap();
        assert!(j.to_key().is_err());
    }
}
