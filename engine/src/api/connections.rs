//! Bounds on the API's connections, so that connections which never send a request can neither
//! take the file descriptors the engine needs for its own files (redb, object store
//! connections, plugins, the policy watcher) nor stop the API:
//!
//! - `CappedListener` holds one semaphore permit per open connection, released when the
//!   connection is dropped, and stops accepting while all are taken: the kernel's listen
//!   backlog queues the connections beyond the cap until one closes. The cap is
//!   `--max-connections`, by default the open-file limit less `OPEN_FILES_RESERVED`, at most
//!   `CONNECTIONS_DEFAULT_MAX` (`connection_cap`).
//! - `FirstRequestListener` closes a connection that has sent no byte within the first-request
//!   timeout of being handed to the server (after its TLS handshake, when the API serves TLS):
//!   its reads fail with `TimedOut` and hyper drops it. After the first byte this adds no
//!   limit. Each such close is counted in a debug log line (`closed_idle`, the total).
//!
//! `daemon::raise_open_file_limit` raises the soft open-file limit before `api::start` derives
//! the cap from it (`open_file_limits`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Files kept for the engine's own use when the default cap is derived from the open-file
/// limit: the store (redb), object store and webhook connections, plugin files, the policy
/// watcher, logs, the runtime's own descriptors, with room to spare.
pub const OPEN_FILES_RESERVED: u64 = 256;
/// The default cap never exceeds this, whatever the open-file limit (the API serves a few
/// agents and scrapers, not the public).
pub const CONNECTIONS_DEFAULT_MAX: usize = 4_096;
/// `--max-connections` accepts at most this.
pub const CONNECTIONS_MAX: usize = 1_048_576;
/// A new connection has this long to send its first byte, by default.
pub const FIRST_REQUEST_TIMEOUT_SECONDS_DEFAULT: u64 = 10;
/// `--first-request-timeout-seconds` accepts at most this.
pub const FIRST_REQUEST_TIMEOUT_SECONDS_MAX: u64 = 3_600;
/// The soft open-file limit assumed when it cannot be read (the usual default).
pub const OPEN_FILES_ASSUMED: u64 = 1_024;
/// The warning that the cap is reached is repeated at most this often.
const AT_CAP_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The process's soft and hard open-file limits (RLIMIT_NOFILE), or `None` when they cannot be
/// read.
pub fn open_file_limits() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    Some((rlim_u64(limit.rlim_cur), rlim_u64(limit.rlim_max)))
}

/// `rlim_t` is `u64` on the 64-bit targets the engine is built for; a narrower one widens.
#[allow(clippy::useless_conversion)]
fn rlim_u64(value: libc::rlim_t) -> u64 {
    u64::from(value)
}

/// Connections that `open_files` descriptors leave room for: the limit less
/// `OPEN_FILES_RESERVED`, and at least half of it (a small limit is shared evenly).
pub fn connections_allowed(open_files: u64) -> usize {
    let allowed = open_files.saturating_sub(OPEN_FILES_RESERVED).max(open_files / 2).max(1);
    usize::try_from(allowed).unwrap_or(usize::MAX)
}

/// The cap in force: `asked` (`--max-connections`) or `CONNECTIONS_DEFAULT_MAX`, never more
/// than `connections_allowed(open_files)`. The second value is true when `asked` was lowered.
pub fn connection_cap(asked: Option<usize>, open_files: u64) -> (usize, bool) {
    let allowed = connections_allowed(open_files);
    match asked {
        Some(asked) => (asked.min(allowed), asked > allowed),
        None => (CONNECTIONS_DEFAULT_MAX.min(allowed), false),
    }
}

/// A listener that holds at most `cap` connections open at once; see the module.
pub struct CappedListener<L> {
    inner: L,
    permits: Arc<Semaphore>,
    cap: usize,
    warned: Option<Instant>,
}

impl<L> CappedListener<L> {
    pub fn new(inner: L, cap: usize) -> CappedListener<L> {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS);
        CappedListener { inner, permits: Arc::new(Semaphore::new(cap)), cap, warned: None }
    }
}

impl<L: Listener> Listener for CappedListener<L> {
    type Io = Capped<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        if self.permits.available_permits() == 0 && self.warned.is_none_or(|at| at.elapsed() >= AT_CAP_WARNING_INTERVAL)
        {
            self.warned = Some(Instant::now());
            tracing::warn!(
                cap = self.cap,
                "the API holds as many connections as it may (--max-connections, FROSTLINE_MAX_CONNECTIONS); new \
                 ones wait in the kernel's queue until one closes"
            );
        }
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let (io, addr) = self.inner.accept().await;
        (Capped { io, _permit: permit }, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection of a `CappedListener`: its permit is released when it is dropped.
pub struct Capped<Io> {
    io: Io,
    _permit: OwnedSemaphorePermit,
}

impl<Io: AsyncRead + Unpin> AsyncRead for Capped<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

/// The write half of a connection wrapper whose `io` field is the connection: passed through.
macro_rules! forward_async_write {
    ($wrapper:ident) => {
        impl<Io: AsyncWrite + Unpin> AsyncWrite for $wrapper<Io> {
            fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.io).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.io).poll_flush(cx)
            }

            fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.io).poll_shutdown(cx)
            }
        }
    };
}

forward_async_write!(Capped);

/// A listener whose connections are closed when they send no byte within `timeout` of being
/// accepted; see the module.
pub struct FirstRequestListener<L> {
    inner: L,
    timeout: Duration,
    closed_idle: Arc<AtomicU64>,
}

impl<L> FirstRequestListener<L> {
    pub fn new(inner: L, timeout: Duration) -> FirstRequestListener<L> {
        FirstRequestListener { inner, timeout, closed_idle: Arc::new(AtomicU64::new(0)) }
    }
}

impl<L: Listener<Addr = SocketAddr>> Listener for FirstRequestListener<L> {
    type Io = FirstRequest<L::Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, peer) = self.inner.accept().await;
        let waiting = Waiting::Before(Box::pin(tokio::time::sleep(self.timeout)));
        (FirstRequest { io, waiting, peer, timeout: self.timeout, closed_idle: self.closed_idle.clone() }, peer)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

enum Waiting {
    /// No byte read yet; the deadline.
    Before(Pin<Box<tokio::time::Sleep>>),
    /// A byte was read: no limit from here on.
    Started,
    /// The deadline passed first: every read fails.
    Expired,
}

/// A connection of a `FirstRequestListener`.
pub struct FirstRequest<Io> {
    io: Io,
    waiting: Waiting,
    peer: SocketAddr,
    timeout: Duration,
    closed_idle: Arc<AtomicU64>,
}

impl<Io> FirstRequest<Io> {
    fn expired() -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, "no request within the first-request timeout")
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for FirstRequest<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let deadline = match &mut this.waiting {
            Waiting::Started => return Pin::new(&mut this.io).poll_read(cx, buf),
            Waiting::Expired => return Poll::Ready(Err(Self::expired())),
            Waiting::Before(deadline) => deadline,
        };
        let filled = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > filled => {
                this.waiting = Waiting::Started;
                Poll::Ready(Ok(()))
            }
            // The end of the stream or an error: the connection ends anyway.
            Poll::Ready(ended) => Poll::Ready(ended),
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => {
                    this.waiting = Waiting::Expired;
                    let closed_idle = this.closed_idle.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::debug!(
                        peer = %this.peer,
                        timeout_seconds = this.timeout.as_secs_f64(),
                        closed_idle,
                        "closed a connection that sent nothing within the first-request timeout"
                    );
                    Poll::Ready(Err(Self::expired()))
                }
            },
        }
    }
}

forward_async_write!(FirstRequest);

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[test]
    fn the_default_cap_keeps_the_reserve_and_its_bound() {
        assert_eq!(connection_cap(None, 1_024), (768, false));
        assert_eq!(connection_cap(None, 65_536), (CONNECTIONS_DEFAULT_MAX, false));
        assert_eq!(connection_cap(None, 256), (128, false), "a small limit is shared evenly");
        assert_eq!(connection_cap(None, 0), (1, false));
        assert_eq!(connection_cap(None, u64::MAX).0, CONNECTIONS_DEFAULT_MAX);
        assert_eq!(connection_cap(Some(64), 1_024), (64, false));
        assert_eq!(connection_cap(Some(10_000), 65_536), (10_000, false));
        assert_eq!(connection_cap(Some(2_000), 1_024), (768, true), "never more than the limit allows");
    }

    /// A listener of in-memory connections handed to it by the test.
    struct Pipes(tokio::sync::mpsc::Receiver<tokio::io::DuplexStream>);

    impl Listener for Pipes {
        type Io = tokio::io::DuplexStream;
        type Addr = SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            match self.0.recv().await {
                Some(io) => (io, "127.0.0.1:1".parse().unwrap()),
                None => std::future::pending().await,
            }
        }

        fn local_addr(&self) -> io::Result<Self::Addr> {
            Ok("127.0.0.1:0".parse().unwrap())
        }
    }

    fn pipes() -> (tokio::sync::mpsc::Sender<tokio::io::DuplexStream>, Pipes) {
        let (sender, receiver) = tokio::sync::mpsc::channel(16);
        (sender, Pipes(receiver))
    }

    #[tokio::test]
    async fn at_the_cap_nothing_is_accepted_until_a_connection_is_dropped() {
        let (sender, pipes) = pipes();
        let mut listener = CappedListener::new(pipes, 2);
        let mut clients = Vec::new();
        for _ in 0..3 {
            let (client, server) = tokio::io::duplex(64);
            sender.send(server).await.unwrap();
            clients.push(client);
        }
        let (first, _) = listener.accept().await;
        let (_second, _) = listener.accept().await;
        let third = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(third.is_err(), "a third connection is not accepted at a cap of two");
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(30), listener.accept()).await;
        assert!(third.is_ok(), "it is once one of the two is dropped");
    }

    #[tokio::test]
    async fn a_connection_silent_past_the_timeout_fails_and_one_that_spoke_does_not() {
        let (sender, pipes) = pipes();
        let mut listener = FirstRequestListener::new(pipes, Duration::from_millis(200));
        let (_silent_client, server) = tokio::io::duplex(64);
        sender.send(server).await.unwrap();
        let (mut silent, _) = listener.accept().await;
        let error = silent.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(silent.read(&mut [0u8; 8]).await.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(listener.closed_idle.load(Ordering::Relaxed), 1);

        let (mut client, server) = tokio::io::duplex(64);
        sender.send(server).await.unwrap();
        let (mut spoke, _) = listener.accept().await;
        client.write_all(b"G").await.unwrap();
        assert_eq!(spoke.read(&mut [0u8; 8]).await.unwrap(), 1);
        tokio::time::sleep(Duration::from_millis(600)).await;
        client.write_all(b"ET").await.unwrap();
        assert_eq!(spoke.read(&mut [0u8; 8]).await.unwrap(), 2, "no limit after the first byte");
        assert_eq!(listener.closed_idle.load(Ordering::Relaxed), 1);
    }
}
