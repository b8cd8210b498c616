//! Brokered secrets' rig: a test CA, HTTPS targets of our own on loopback that keep what they
//! received, the proxy with a store and a CA in temporary directories, and a box-side client
//! that trusts only the proxy's `/v1/ca-bundle.pem`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hako_egress::config::BrokerConfig;
use hako_shared::secrets::{Placeholder, SecretClaim, SecretName};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, ServerName};

use super::{LIMIT, Rig, admin_get, bearer, connect};

/// A CA of the test's own (what a target's certificate is issued from).
pub struct TestCa {
    pub issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

impl TestCa {
    pub fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "egress test target CA");
        let cert = p.self_signed(&key).unwrap();
        Self {
            pem: hako_egress::tls::pem(cert.der()),
            issuer: rcgen::Issuer::new(p, key),
        }
    }
}

/// What a target received: (method, path, headers).
pub type Seen = Arc<Mutex<Vec<(String, String, hyper::HeaderMap)>>>;

/// An HTTPS target for `localhost` (certificate from `ca`): keeps every request's head and
/// answers `ok <path>` with the `Authorization` it got echoed in `x-echo-authorization` (a
/// careless server the box must not learn a value from).
pub async fn tls_target(ca: &TestCa) -> (SocketAddr, Seen) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca.issuer)
        .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(hako_egress::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let kept = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            let kept = Arc::clone(&kept);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let kept = Arc::clone(&kept);
                    async move {
                        let path = req.uri().to_string();
                        let echo = req.headers().get("authorization").cloned();
                        kept.lock().unwrap().push((
                            req.method().to_string(),
                            path.clone(),
                            req.headers().clone(),
                        ));
                        let mut resp = Response::new(Full::new(Bytes::from(format!("ok {path}"))));
                        if let Some(e) = echo {
                            resp.headers_mut().insert("x-echo-authorization", e);
                        }
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// The proxy with brokered secrets: `values` in its store, its CA in a directory of its own,
/// the system roots and `ca` (the targets') trusted, loopback allowed.
pub async fn broker_proxy(
    rig: &Rig,
    values: &[(&str, &str)],
    ca: Option<&TestCa>,
) -> (hako_egress::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("secrets");
    std::fs::create_dir(&store).unwrap();
    for (k, v) in values {
        std::fs::write(store.join(k), v).unwrap();
    }
    let ca_dir = dir.path().join("ca");
    std::fs::create_dir(&ca_dir).unwrap();
    let broker = BrokerConfig {
        secrets_dir: store,
        ca_dir,
        system_roots: hako_egress::config::SYSTEM_ROOTS.into(),
        extra_roots: ca.map(|c| c.pem.clone()),
    };
    let proxy = rig
        .proxy(move |c| {
            c.broker = Some(broker);
            c.private_targets = vec![hako_egress::Cidr::parse("127.0.0.0/8").unwrap()];
        })
        .await;
    (proxy, dir)
}

pub fn claim(name: &str, hosts: &[String]) -> SecretClaim {
    SecretClaim {
        name: SecretName::parse(name).unwrap(),
        hosts: hosts.to_vec(),
        placeholder: Placeholder::random().unwrap(),
    }
}

/// What a box trusts: the proxy's bundle.
pub async fn box_roots(proxy: &hako_egress::Running) -> rustls::RootCertStore {
    let (st, text) = admin_get(proxy.admin_addr(), "/v1/ca-bundle.pem").await;
    assert_eq!(st, 200, "{text}");
    let pem = text.split_once("\r\n\r\n").unwrap().1;
    let certs = hako_egress::tls::certificates(pem.as_bytes(), "bundle").unwrap();
    assert!(certs.len() > 2, "the system roots and the proxy's CA");
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(certs);
    roots
}

/// A box's HTTPS connection through the proxy: `CONNECT`, then TLS for `sni` with `roots`
/// and `alpn`, then HTTP/1.1.
pub async fn box_tls(
    proxy: SocketAddr,
    token: &str,
    target: &str,
    sni: &str,
    roots: &rustls::RootCertStore,
    alpn: &[&[u8]],
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    let tcp = connect(proxy, target, &bearer(token))
        .await
        .map_err(|(st, text)| format!("CONNECT answered {st}: {text}"))?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(hako_egress::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One request on a box's connection: (status, headers, body).
pub async fn call(
    s: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    headers: &[(&str, String)],
) -> Result<(u16, hyper::HeaderMap, String), String> {
    let mut b = Request::builder().uri(path).header("host", "localhost");
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let req = b.body(Full::new(Bytes::new())).unwrap();
    s.ready().await.map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(LIMIT, s.send_request(req))
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        status,
        headers,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    ))
}
