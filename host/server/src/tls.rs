//! Optional TLS for the API (`--tls-cert`, `--tls-key`), with rustls.
//!
//! - [`TlsConfig::load`] reads a PEM certificate chain and private key, with an error that
//!   names the file and what is wrong with it.
//! - [`TlsListener`] is an `axum::serve` listener: a task accepts TCP connections and runs
//!   each handshake on a task of its own, under a deadline and a cap on handshakes in flight,
//!   so a client that connects and says nothing holds neither the accept loop nor memory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; more connections wait in the kernel's backlog.
const HANDSHAKES_IN_FLIGHT: usize = 256;

/// Why the certificate or key could not be used. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no PEM certificate.
    #[error("{} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The file is not PEM, or holds no private key.
    #[error("{} holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {source}", path.display())]
    BadKey {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate block is not valid PEM.
    #[error("{} is not a valid PEM certificate chain: {source}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refused the pair, for example a key that does not match the certificate.
    #[error("the certificate and key cannot be used together: {0}")]
    Refused(#[source] rustls::Error),
}

/// A checked certificate chain and key, ready to serve with.
#[derive(Clone)]
pub struct TlsConfig(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConfig")
    }
}

impl TlsConfig {
    /// Reads the PEM certificate chain (leaf first) and private key, and checks that they go
    /// together. HTTP/1.1 only, as the API serves it.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let cert_pem = read(cert)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsError::BadCertificate {
                path: cert.to_path_buf(),
                source,
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert.to_path_buf(),
            });
        }
        let key_pem = read(key)?;
        let key_der =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::BadKey {
                path: key.to_path_buf(),
                source,
            })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Refused)?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(TlsError::Refused)?;
        Ok(Self(Arc::new(config)))
    }
}

/// Accepted, handshaken TLS connections, for `axum::serve`.
pub struct TlsListener {
    /// Connections whose handshake finished, from the accept task; it ends when this ends.
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS on `listener`; must be called inside a tokio runtime.
    pub fn new(listener: TcpListener, config: &TlsConfig) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(config.0.clone());
        let (done, handshaken) = mpsc::channel(64);
        tokio::spawn(accept_loop(listener, acceptor, done));
        Ok(Self { handshaken, local })
    }
}

/// Accepts TCP connections until the listener is dropped, and handshakes each on its own task.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let in_flight = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT));
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = done.closed() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (acceptor, done) = (acceptor.clone(), done.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = done.send((stream, peer)).await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept task is gone: nothing will ever arrive.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;
    use tokio_rustls::rustls::pki_types::ServerName;

    use super::*;

    /// A self-signed certificate for 127.0.0.1 and its key, made by the openssl CLI.
    fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=gantry-test", "-addext"])
            .args(["subjectAltName=IP:127.0.0.1", "-addext"])
            .args(["basicConstraints=critical,CA:FALSE", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("this test needs the openssl command (Debian: apt-get install openssl)");
        assert!(made.status.success(), "{made:?}");
        (cert, key)
    }

    #[tokio::test]
    async fn the_api_answers_over_tls_and_not_in_the_clear() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = self_signed(dir.path());
        let config = TlsConfig::load(&cert, &key).expect("load");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .into_make_service();
        let server = tokio::spawn(async move {
            use axum::serve::ListenerExt;
            let listener = TlsListener::new(listener, &config)
                .expect("listener")
                .tap_io(|_| {});
            axum::serve(listener, app).await
        });
        // A client that trusts only this certificate.
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&cert).expect("cert");
        for der in CertificateDer::pem_slice_iter(&pem) {
            roots.add(der.expect("der")).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let name = ServerName::IpAddress(addr.ip().into());
        let mut tls = TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .expect("handshake");
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await.ok();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
        // Plain HTTP to the TLS port gets no HTTP answer.
        let mut plain = TcpStream::connect(addr).await.expect("connect");
        plain
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut bytes = Vec::new();
        plain.read_to_end(&mut bytes).await.ok();
        assert!(!bytes.starts_with(b"HTTP/1.1 200"), "{bytes:?}");
        server.abort();
    }

    #[test]
    fn unusable_files_are_named_with_the_problem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = self_signed(dir.path());
        let missing = dir.path().join("nope.pem");
        let error = TlsConfig::load(&missing, &key).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("cannot read {}: ", missing.display())),
            "{error}"
        );
        // Certificate and key swapped.
        let error = TlsConfig::load(&key, &cert).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "{} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)",
                key.display()
            )
        );
        let error = TlsConfig::load(&cert, &cert).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "{} holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1): ",
                cert.display()
            )),
            "{error}"
        );
        // A key of another certificate.
        let other = tempfile::tempdir().expect("tempdir");
        let (_, other_key) = self_signed(other.path());
        let error = TlsConfig::load(&cert, &other_key).unwrap_err().to_string();
        assert!(
            error.starts_with("the certificate and key cannot be used together: "),
            "{error}"
        );
    }
}
