//! The brokered secrets' target: an HTTPS server (a fresh CA and a certificate for the names
//! given, the CA printed as `CA <base64 DER>`, so that a test can tell the proxy to trust it)
//! that knows only the SHA-256 of the secret it expects, never the secret.
//!
//! Every request is logged on stdout, read from outside by the test (`docker logs`):
//! `REQ <method> <path> host=<host> auth=<ok|other|none> sha256=<of the credential>`, where the
//! credential is the token of `Authorization: Bearer|token <x>`, the password of `Basic`, or
//! `X-Api-Key`'s value. `/git/<repo>/…` is a smart-HTTP git server (`git http-backend` over a
//! bare repository made at start, with one commit holding `hello.txt`) that answers 401 with a
//! Basic challenge unless the credential is the expected one, as a forge does.

use std::convert::Infallible;
use std::process::Stdio;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_rustls::rustls;

use crate::{opt, opts};

/// Where the bare repository lives.
const GIT_ROOT: &str = "/tmp/git";
/// What `hello.txt` of the repository holds.
pub const HELLO: &str = "hello from the hako test forge";

struct Ctx {
    expect: String,
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The credential of a request: a bearer or `token` value, a Basic password, or `X-Api-Key`.
fn credential(req: &Request<hyper::body::Incoming>) -> Option<Vec<u8>> {
    if let Some(v) = req.headers().get("authorization") {
        let v = v.as_bytes();
        let (scheme, rest) = v.split_at(v.iter().position(|b| *b == b' ')?);
        let rest = rest.trim_ascii();
        if scheme.eq_ignore_ascii_case(b"basic") {
            let plain = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()?;
            let colon = plain.iter().position(|b| *b == b':')?;
            return Some(plain[colon + 1..].to_vec());
        }
        return Some(rest.to_vec());
    }
    req.headers()
        .get("x-api-key")
        .map(|v| v.as_bytes().to_vec())
}

async fn answer(
    ctx: Arc<Ctx>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let cred = credential(&req);
    let (auth, sha) = match &cred {
        None => ("none", "-".to_owned()),
        Some(c) => {
            let s = sha256_hex(c);
            (if s == ctx.expect { "ok" } else { "other" }, s)
        }
    };
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    println!(
        "REQ {} {} host={host} auth={auth} sha256={sha}",
        req.method(),
        req.uri()
    );
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/git/") {
        if auth != "ok" {
            let mut r = Response::new(Full::new(Bytes::from_static(b"authentication required\n")));
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r.headers_mut().insert(
                "www-authenticate",
                hyper::header::HeaderValue::from_static("Basic realm=\"hako test forge\""),
            );
            return Ok(r);
        }
        return Ok(git(req, &format!("/{rest}")).await);
    }
    Ok(Response::new(Full::new(Bytes::from(format!(
        "auth={auth}\n"
    )))))
}

/// `git http-backend` as a CGI program for one request.
async fn git(req: Request<hyper::body::Incoming>, path_info: &str) -> Response<Full<Bytes>> {
    let fail = |why: String| {
        let mut r = Response::new(Full::new(Bytes::from(why)));
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        r
    };
    let method = req.method().to_string();
    let query = req.uri().query().unwrap_or("").to_owned();
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (content_type, encoding) = (header("content-type"), header("content-encoding"));
    let body = match http_body_util::Limited::new(req.into_body(), 64 << 20)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return fail(format!("body: {e}")),
    };
    let child = tokio::process::Command::new("/usr/lib/git-core/git-http-backend")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("GIT_PROJECT_ROOT", GIT_ROOT)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path_info)
        .env("QUERY_STRING", &query)
        .env("CONTENT_TYPE", &content_type)
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", &encoding)
        .env("REMOTE_USER", "x-access-token")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail(format!("git http-backend: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&body).await;
    }
    let out = match child.wait_with_output().await {
        Ok(o) => o,
        Err(e) => return fail(format!("git http-backend: {e}")),
    };
    let raw = out.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((at, sep)) = split else {
        return fail(format!(
            "git http-backend gave no headers: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    };
    let mut resp = Response::new(Full::new(Bytes::from(raw[at + sep..].to_vec())));
    for line in String::from_utf8_lossy(&raw[..at]).lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            let code = v.split_whitespace().next().and_then(|c| c.parse().ok());
            if let Some(s) = code.and_then(|c: u16| StatusCode::from_u16(c).ok()) {
                *resp.status_mut() = s;
            }
        } else if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(k.trim().as_bytes()),
            hyper::header::HeaderValue::from_str(v),
        ) {
            resp.headers_mut().append(name, value);
        }
    }
    resp
}

/// Makes the bare repository `GIT_ROOT/repo.git` with one commit holding `hello.txt`.
fn make_repo() -> Result<(), String> {
    let work = "/tmp/git-work";
    let run = |args: &[&str]| -> Result<(), String> {
        let out = std::process::Command::new("/usr/bin/git")
            .args([
                "-c",
                "user.name=hako",
                "-c",
                "user.email=hako@test",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .env("HOME", "/tmp")
            .output()
            .map_err(|e| format!("git {args:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    std::fs::write(format!("{work}/hello.txt"), HELLO).map_err(|e| e.to_string())?;
    let repo = format!("{GIT_ROOT}/repo.git");
    run(&["init", "-q", "--bare", &repo])?;
    let with_tree = ["--git-dir", repo.as_str(), "--work-tree", work];
    run(&[&with_tree[..], &["add", "hello.txt"]].concat())?;
    run(&[&with_tree[..], &["commit", "-q", "-m", "hello"]].concat())?;
    Ok(())
}

/// `secret-server --listen ADDR --san NAME... --expect-sha256 HEX`: see the module's doc.
pub async fn main(args: &[String]) -> Result<(), String> {
    let addr = opt(args, "--listen").unwrap_or("0.0.0.0:443");
    let expect = opt(args, "--expect-sha256")
        .ok_or("--expect-sha256 is required")?
        .to_ascii_lowercase();
    let sans: Vec<String> = opts(args, "--san").into_iter().map(str::to_owned).collect();
    make_repo()?;
    let e = |e: rcgen::Error| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "hako test forge CA");
    let ca = ca_params.self_signed(&ca_key).map_err(e)?;
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = rcgen::CertificateParams::new(sans)
        .map_err(e)?
        .signed_by(&key, &issuer)
        .map_err(e)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("listen {addr}: {e}"))?;
    println!(
        "CA {}",
        base64::engine::general_purpose::STANDARD.encode(ca.der())
    );
    println!("LISTENING {}", l.local_addr().map_err(|e| e.to_string())?);
    let ctx = Arc::new(Ctx { expect });
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(s)).await
            else {
                return;
            };
            let svc = hyper::service::service_fn(move |r| answer(Arc::clone(&ctx), r));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}
