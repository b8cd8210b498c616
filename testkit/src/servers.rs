//! The targets: an HTTP server and a TLS server (a fresh CA and a certificate for the names
//! given, the CA printed as `CA <base64 DER>` so that a test can hand it to the client).

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::rustls;

use crate::opt;

async fn answer(
    name: Arc<str>,
    scheme: &'static str,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let head = format!(
        "{name} {scheme} {} {} proxy-authorization={}",
        req.method(),
        req.uri(),
        req.headers().contains_key("proxy-authorization")
    );
    // Drain (bounded) what the client sent.
    let _ = http_body_util::Limited::new(req.into_body(), 1 << 20)
        .collect()
        .await;
    Ok(Response::new(Full::new(Bytes::from(head))))
}

async fn listener(args: &[String]) -> Result<(TcpListener, Arc<str>), String> {
    let addr = opt(args, "--listen").unwrap_or("0.0.0.0:80");
    let name: Arc<str> = opt(args, "--name").unwrap_or("target").into();
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("listen {addr}: {e}"))?;
    Ok((l, name))
}

/// `http-server --listen ADDR [--listen ADDR…] --name NAME`: answers every request with one
/// line naming itself, the method, the target and whether a proxy credential reached it.
pub async fn http_main(args: &[String]) -> Result<(), String> {
    let (l, name) = listener(args).await?;
    for extra in crate::opts(args, "--listen").into_iter().skip(1) {
        let more = TcpListener::bind(extra)
            .await
            .map_err(|e| format!("listen {extra}: {e}"))?;
        tokio::spawn(serve_http(more, Arc::clone(&name)));
    }
    println!("LISTENING {}", l.local_addr().map_err(|e| e.to_string())?);
    serve_http(l, name).await;
    Ok(())
}

async fn serve_http(l: TcpListener, name: Arc<str>) {
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        let name = Arc::clone(&name);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |r| answer(Arc::clone(&name), "http", r));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

/// `tls-server --listen ADDR --name NAME --san NAME...`: the same answers over TLS, with a
/// certificate for the `--san` names signed by a CA made at start.
pub async fn tls_main(args: &[String]) -> Result<(), String> {
    let (l, name) = listener(args).await?;
    let sans: Vec<String> = crate::opts(args, "--san")
        .into_iter()
        .map(str::to_owned)
        .collect();
    let e = |e: rcgen::Error| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "hako testkit CA");
    let ca = ca_params.self_signed(&ca_key).map_err(e)?;
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let params = rcgen::CertificateParams::new(sans).map_err(e)?;
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).map_err(e)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|e| e.to_string())?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    println!(
        "CA {}",
        base64::engine::general_purpose::STANDARD.encode(ca.der())
    );
    println!("LISTENING {}", l.local_addr().map_err(|e| e.to_string())?);
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        let name = Arc::clone(&name);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(s)).await
            else {
                return;
            };
            let svc = hyper::service::service_fn(move |r| answer(Arc::clone(&name), "https", r));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}
