//! The accept loop, in place of `axum::serve`, which sets no header-read deadline and takes
//! every connection offered: each connection holds a permit of [`DoorOptions::max_connections`]
//! until it closes (one more waits in the kernel's backlog), each request's headers must arrive
//! within [`DoorOptions::header_read_timeout`], and a shutdown drains what is open for at most
//! [`DRAIN_TIMEOUT`] (a decision stream never ends by itself).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::DoorOptions;

/// How long open connections may run on once shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `app` on every connection `listener` accepts, within `options`' caps, until
/// `shutdown` resolves; each request carries its peer as axum's `ConnectInfo`.
pub(crate) async fn serve_connections<L>(
    mut listener: L,
    app: Router,
    options: &DoorOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    // A permit per open connection: past the cap, accepting waits for one to close.
    let connections = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = app.clone().map_request(
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            },
        );
        let connection =
            http1.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                // A header-read deadline passed, or the peer went: nothing to answer.
                tracing::debug!(%peer, %error, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("connections still open {DRAIN_TIMEOUT:?} after shutdown were dropped");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// The API on a loopback port the kernel picks, with `options`; shut down when the
    /// returned sender drops.
    async fn listening(
        dir: &std::path::Path,
        options: DoorOptions,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = crate::api::tests::state(dir, options);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(crate::serve(listener, state, None, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// What the server sends on `stream` until it closes it or 10 s pass (`None`).
    async fn read_to_close(stream: &mut TcpStream) -> Option<String> {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer));
        match read.await {
            Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn a_half_sent_request_is_closed_at_the_header_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = DoorOptions {
            header_read_timeout: Duration::from_millis(300),
            ..DoorOptions::default()
        };
        let (addr, _stop) = listening(dir.path(), options).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let started = Instant::now();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: gantry\r\n")
            .await
            .expect("write");
        let answer = read_to_close(&mut stream).await;
        eprintln!("closed after {:?}: {answer:?}", started.elapsed());
        let answer = answer.expect("the half-sent request was still open after 10 s");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
        // A whole request on a new connection is answered.
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: gantry\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let answer = read_to_close(&mut stream).await.expect("answered");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[tokio::test]
    async fn past_the_connection_cap_a_client_waits_until_one_closes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = DoorOptions {
            max_connections: 2,
            ..DoorOptions::default()
        };
        let (addr, _stop) = listening(dir.path(), options).await;
        let idle: Vec<TcpStream> = vec![
            TcpStream::connect(addr).await.expect("connect"),
            TcpStream::connect(addr).await.expect("connect"),
        ];
        // The kernel completes the handshake from its backlog; the server reads nothing.
        let mut third = TcpStream::connect(addr).await.expect("connect");
        third
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: gantry\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut first = [0u8; 1];
        // A read that times out takes nothing from the stream.
        let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut first)).await;
        assert!(early.is_err(), "served past the cap: {early:?}");
        drop(idle);
        let answer = read_to_close(&mut third)
            .await
            .expect("answered once one closed");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
