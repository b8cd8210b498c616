//! TLS for brokered secrets (`specs/egress.md`, Secrets): the install's CA, made once and kept
//! in the proxy's own directory (its key never leaves it), the leaf certificates it issues for
//! the hosts runs' secrets are bound to (issued on first use, then cached), and the roots the
//! proxy verifies targets against when it re-originates TLS.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use tokio_rustls::rustls;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's private key (PKCS#8 DER), 0600, in the proxy's directory.
pub const CA_KEY_FILE: &str = "ca-key.der";
/// The CA's certificate (PEM), what boxes trust.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The one ALPN protocol offered on either side: HTTP/1.1 (a client that insists on h2 fails
/// the handshake; nothing reaches a bound host unread).
pub const ALPN: &[u8] = b"http/1.1";
/// Most leaf configurations kept (full: forgotten at once, O(1) amortised).
const LEAF_CACHE_CAP: usize = 1024;
/// Largest roots file read.
const MAX_ROOTS_FILE: u64 = 8 << 20;

/// What went wrong with the proxy's TLS material. Never holds key bytes.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file of the CA or the roots could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The CA's files do not belong together, or a PEM holds no certificate.
    #[error("{0}")]
    Invalid(String),
    /// rcgen refused.
    #[error("certificate: {0}")]
    Issue(#[from] rcgen::Error),
    /// rustls refused.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The crypto provider of every TLS configuration here: aws-lc, the tree's one backend.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The current calendar year (for validity windows; a year either side is plenty).
fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

fn serial() -> rcgen::SerialNumber {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the system's random source");
    b[0] &= 0x7f; // positive
    rcgen::SerialNumber::from_slice(&b)
}

fn ca_params() -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "hako egress CA");
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "hako");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let y = this_year();
    p.not_before = rcgen::date_time_ymd(y - 1, 1, 1);
    p.not_after = rcgen::date_time_ymd(y + 20, 1, 1);
    p
}

/// PEM text of one certificate.
pub fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = String::with_capacity(b64.len() + 80);
    s.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(line).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

/// Every certificate in a PEM text; an error when there is none.
pub fn certificates(pem_text: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem_text)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::Invalid(format!(
            "{what}: no PEM certificate in it"
        )));
    }
    Ok(certs)
}

/// Reads a file without following a link at its last component, at most `max` bytes.
fn read_nofollow(path: &Path, max: u64) -> Result<Option<Vec<u8>>, TlsError> {
    let fd = match rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_err(path)(e.into())),
    };
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(max)
        .read_to_end(&mut buf)
        .map_err(io_err(path))?;
    Ok(Some(buf))
}

/// Writes `data` to `dir/name` with `mode`: a fresh temporary file (`O_EXCL`, so never
/// through a planted link) renamed into place.
fn write_new(dir: &Path, name: &str, data: &[u8], mode: u32) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(data).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    let target = dir.join(name);
    std::fs::rename(&tmp, &target).map_err(io_err(&target))
}

/// The install's CA and the leaf certificates it issued.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert_pem: String,
    /// One key for every leaf (a leaf's key is worth no more than the CA's, which is here too).
    leaf_key: rcgen::KeyPair,
    provider: Arc<CryptoProvider>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// The CA kept in `dir`: loaded, or made (key 0600, then certificate) on the first start.
    pub fn load_or_create(dir: &Path) -> Result<Self, TlsError> {
        let key_path = dir.join(CA_KEY_FILE);
        let key = match read_nofollow(&key_path, 64 << 10)? {
            Some(der) => rcgen::KeyPair::try_from(der.as_slice()).map_err(|e| {
                TlsError::Invalid(format!("{}: not a usable key: {e}", key_path.display()))
            })?,
            None => {
                let key = rcgen::KeyPair::generate()?;
                write_new(dir, CA_KEY_FILE, &key.serialize_der(), 0o600)?;
                tracing::info!(dir = %dir.display(), "made the install's egress CA");
                key
            }
        };
        let params = ca_params();
        let cert_path = dir.join(CA_CERT_FILE);
        let stored = read_nofollow(&cert_path, 64 << 10)?
            .and_then(|pem_text| certificates(&pem_text, "ca.pem").ok())
            .and_then(|mut certs| certs.drain(..).next())
            // The certificate must hold this key (a key made again after a crash gets a new one).
            .filter(|der| {
                memchr::memmem::find(der.as_ref(), rcgen::PublicKeyData::der_bytes(&key)).is_some()
            });
        let cert_pem = match stored {
            Some(der) => pem(der.as_ref()),
            None => {
                let cert = params.self_signed(&key)?;
                let text = pem(cert.der().as_ref());
                write_new(dir, CA_CERT_FILE, text.as_bytes(), 0o644)?;
                text
            }
        };
        Ok(Self {
            issuer: rcgen::Issuer::new(params, key),
            cert_pem,
            leaf_key: rcgen::KeyPair::generate()?,
            provider: provider(),
            leaves: Mutex::default(),
        })
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The server configuration presenting a certificate for `host` (issued once, cached).
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        if let Some(c) = self
            .leaves
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
        {
            return Ok(Arc::clone(c));
        }
        let config = Arc::new(self.issue(host)?);
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if leaves.len() >= LEAF_CACHE_CAP {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), Arc::clone(&config));
        Ok(config)
    }

    fn issue(&self, host: &str) -> Result<rustls::ServerConfig, TlsError> {
        let mut p = rcgen::CertificateParams::new(vec![host.to_owned()])?;
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, host);
        p.serial_number = Some(serial());
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        let y = this_year();
        p.not_before = rcgen::date_time_ymd(y - 1, 1, 1);
        p.not_after = rcgen::date_time_ymd(y + 2, 1, 1);
        let leaf = p.signed_by(&self.leaf_key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

/// The roots targets are verified against: the system's (the image's CA bundle), and extra
/// ones only when the operator names them (`EGRESS_EXTRA_ROOTS`: a test's CA).
pub struct Roots {
    client: Arc<rustls::ClientConfig>,
    system_pem: String,
}

impl std::fmt::Debug for Roots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Roots").finish_non_exhaustive()
    }
}

impl Roots {
    /// The system roots from `system` (a PEM bundle) and the `extra` PEM certificates.
    pub fn load(system: &Path, extra: Option<&str>) -> Result<Self, TlsError> {
        let text = read_nofollow(system, MAX_ROOTS_FILE)?.ok_or_else(|| {
            TlsError::Invalid(format!(
                "{}: no such file (the system's CA bundle, EGRESS_SYSTEM_ROOTS)",
                system.display()
            ))
        })?;
        let mut store = rustls::RootCertStore::empty();
        let (added, _) =
            store.add_parsable_certificates(certificates(&text, &system.display().to_string())?);
        if added == 0 {
            return Err(TlsError::Invalid(format!(
                "{}: no usable root certificate",
                system.display()
            )));
        }
        if let Some(extra) = extra {
            let certs = certificates(extra.as_bytes(), "EGRESS_EXTRA_ROOTS")?;
            let n = certs.len();
            let (added, _) = store.add_parsable_certificates(certs);
            if added != n {
                return Err(TlsError::Invalid(
                    "EGRESS_EXTRA_ROOTS: a certificate is not usable as a root".into(),
                ));
            }
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(store)
            .with_no_client_auth();
        client.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Self {
            client: Arc::new(client),
            system_pem: String::from_utf8_lossy(&text).into_owned(),
        })
    }

    /// The configuration of connections to targets.
    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.client)
    }

    /// What a box trusts: the system roots and the install's CA.
    pub fn bundle(&self, ca: &Ca) -> String {
        let mut b = String::with_capacity(self.system_pem.len() + ca.cert_pem().len() + 64);
        b.push_str(&self.system_pem);
        if !b.ends_with('\n') {
            b.push('\n');
        }
        b.push_str("# hako egress CA (brokered secrets)\n");
        b.push_str(ca.cert_pem());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = Ca::load_or_create(dir.path()).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(CA_KEY_FILE))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let b = Ca::load_or_create(dir.path()).unwrap();
        assert_eq!(a.cert_pem(), b.cert_pem(), "the same CA after a restart");
        // A leaf issued by the reloaded CA verifies against the stored certificate.
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(certificates(a.cert_pem().as_bytes(), "ca").unwrap());
        let cfg = b.server_config("api.example.test").unwrap();
        assert!(Arc::ptr_eq(
            &cfg,
            &b.server_config("api.example.test").unwrap()
        ));
        assert_eq!(cfg.alpn_protocols, vec![ALPN.to_vec()]);
        // A certificate that does not hold the key is made again.
        std::fs::write(dir.path().join(CA_CERT_FILE), pem(b"not a cert")).unwrap();
        let c = Ca::load_or_create(dir.path()).unwrap();
        assert_ne!(c.cert_pem(), a.cert_pem());
        // A link planted where the key belongs is not followed.
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join(CA_KEY_FILE), other.path().join(CA_KEY_FILE))
            .unwrap();
        assert!(Ca::load_or_create(other.path()).is_err());
    }

    #[test]
    fn roots_need_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(dir.path()).unwrap();
        let sys = dir.path().join("roots.pem");
        std::fs::write(&sys, ca.cert_pem()).unwrap();
        let r = Roots::load(&sys, None).unwrap();
        let bundle = r.bundle(&ca);
        assert_eq!(certificates(bundle.as_bytes(), "b").unwrap().len(), 2);
        assert!(Roots::load(&sys, Some("junk")).is_err());
        assert!(Roots::load(&dir.path().join("absent"), None).is_err());
        std::fs::write(&sys, "nothing").unwrap();
        assert!(Roots::load(&sys, None).is_err());
    }
}
