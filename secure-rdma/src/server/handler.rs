//! What an application receives: each SEND or WRITE a client makes land,
//! handed to a [`Handler`] given to [`Server::with_handler`](super::Server::with_handler).
//!
//! A server without a handler logs what arrives (`secure-server`). With one,
//! every arrival is authenticated, decrypted and handed over as a
//! [`Delivery`], one at a time per session, in the order the client sent
//! them. The client's acknowledgement waits until the handler returns: an
//! acknowledged message is one the application has, and an application that
//! cannot keep up slows its clients down instead of queueing without bound.
//!
//! Three ways to write one:
//! - a bounded [`tokio::sync::mpsc::Sender<Delivery>`]: receive deliveries
//!   in a loop of your own (`rx.recv().await`); a full channel holds the
//!   sessions back until there is room;
//! - a closure, with [`handler_fn`];
//! - a type of your own implementing [`Handler`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::datapath::{Op, StreamId};
use crate::session::Arrival;

/// The client a delivery came from, authenticated by TLS.
///
/// ```
/// use secure_rdma::server::Peer;
///
/// let peer = Peer { identity: "alice".into(), address: "10.77.0.2:50000".parse().unwrap() };
/// assert_eq!(peer.to_string(), "alice (10.77.0.2:50000)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its identity, the tenant: the common name of its client certificate,
    /// as quotas and logs name it.
    pub identity: String,
    /// The address its TLS connection came from.
    pub address: SocketAddr,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.identity, self.address)
    }
}

/// One SEND or WRITE a client made land, authenticated and decrypted.
///
/// ```
/// use std::sync::Arc;
/// use secure_rdma::datapath::Op;
/// use secure_rdma::server::{Delivery, Peer};
/// use secure_rdma::session::Arrival;
///
/// let peer = Arc::new(Peer { identity: "alice".into(), address: "10.77.0.2:50000".parse().unwrap() });
/// let d = Delivery::new(peer, 1, Arrival::Send(b"hello".to_vec()));
/// assert_eq!((d.identity(), d.op(), d.data()), ("alice", Op::Send, &b"hello"[..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivery {
    /// Who sent it; shared by every delivery of one session.
    pub peer: Arc<Peer>,
    /// The client's operation stream, kept across its reconnects.
    pub stream: StreamId,
    /// Its sequence in that stream, from 1 and across sessions: the `seq` of
    /// the acknowledgement the client gets for it. With [`Delivery::stream`]
    /// and the identity it is the operation's idempotency key.
    pub seq: u64,
    /// The server had lost this stream's state (it restarted, or the resume
    /// window passed) and the client sent this operation again: an earlier
    /// run of the server may have delivered it already. An application that
    /// persists the last `seq` it took per stream skips it if it has it.
    pub possibly_delivered: bool,
    /// The operation and its bytes.
    pub arrival: Arrival,
}

impl Delivery {
    /// The `seq`th arrival of `peer`'s session (the server makes these; an
    /// application makes its own to test its handler).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use secure_rdma::server::{Delivery, Peer};
    /// # use secure_rdma::session::Arrival;
    /// # let peer = Arc::new(Peer { identity: "bob".into(), address: "10.77.0.2:1".parse().unwrap() });
    /// let d = Delivery::new(peer, 7, Arrival::Send(b"hi".to_vec()));
    /// assert_eq!(d.seq, 7);
    /// ```
    pub fn new(peer: Arc<Peer>, seq: u64, arrival: Arrival) -> Delivery {
        Delivery {
            peer,
            stream: StreamId([0; 16]),
            seq,
            possibly_delivered: false,
            arrival,
        }
    }

    /// The same delivery, of `stream`, flagged as `possibly_delivered` or not.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use secure_rdma::server::{Delivery, Peer};
    /// # use secure_rdma::session::Arrival;
    /// use secure_rdma::datapath::StreamId;
    /// # let peer = Arc::new(Peer { identity: "bob".into(), address: "10.77.0.2:1".parse().unwrap() });
    /// let stream = StreamId::random();
    /// let d = Delivery::new(peer, 7, Arrival::Send(b"hi".to_vec())).in_stream(stream, true);
    /// assert_eq!((d.idempotency_key(), d.possibly_delivered), (("bob", stream, 7), true));
    /// ```
    pub fn in_stream(mut self, stream: StreamId, possibly_delivered: bool) -> Delivery {
        self.stream = stream;
        self.possibly_delivered = possibly_delivered;
        self
    }

    /// (identity, stream, sequence): the same for an operation however often
    /// its client had to send it, and different for any other operation.
    pub fn idempotency_key(&self) -> (&str, StreamId, u64) {
        (&self.peer.identity, self.stream, self.seq)
    }

    /// The sender's identity (the tenant).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use secure_rdma::server::{Delivery, Peer};
    /// # use secure_rdma::session::Arrival;
    /// # let peer = Arc::new(Peer { identity: "bob".into(), address: "10.77.0.2:1".parse().unwrap() });
    /// let d = Delivery::new(peer, 1, Arrival::Write(vec![1, 2]));
    /// assert_eq!(d.identity(), "bob");
    /// ```
    pub fn identity(&self) -> &str {
        &self.peer.identity
    }

    /// SEND or WRITE.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use secure_rdma::{datapath::Op, server::{Delivery, Peer}, session::Arrival};
    /// # let peer = Arc::new(Peer { identity: "bob".into(), address: "10.77.0.2:1".parse().unwrap() });
    /// let d = Delivery::new(peer, 1, Arrival::Write(vec![1, 2]));
    /// assert_eq!(d.op(), Op::Write);
    /// ```
    pub fn op(&self) -> Op {
        self.arrival.op()
    }

    /// The bytes the client sent.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use secure_rdma::server::{Delivery, Peer};
    /// # use secure_rdma::session::Arrival;
    /// # let peer = Arc::new(Peer { identity: "bob".into(), address: "10.77.0.2:1".parse().unwrap() });
    /// let d = Delivery::new(peer, 1, Arrival::Send(b"hi".to_vec()));
    /// assert_eq!(d.data(), b"hi");
    /// ```
    pub fn data(&self) -> &[u8] {
        self.arrival.data()
    }
}

/// Why a handler did not take a delivery. A [`HandlerError::Refused`]
/// delivery is answered as refused (the client hears it and never sends it
/// again on its own); after [`HandlerError::Closed`] the session ends
/// without an answer, since nothing can take its deliveries.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// The application stopped receiving: the receiving end of the channel
    /// was dropped.
    ///
    /// ```
    /// use secure_rdma::server::HandlerError;
    /// assert!(HandlerError::Closed.to_string().contains("stopped receiving"));
    /// ```
    #[error(
        "the application stopped receiving deliveries (its receiver was dropped); \
         keep the receiver alive for as long as the server runs"
    )]
    Closed,
    /// The application refused this delivery, for this reason.
    ///
    /// ```
    /// use secure_rdma::server::HandlerError;
    /// let e = HandlerError::Refused("disk full".into());
    /// assert_eq!(e.to_string(), "the application refused the delivery");
    /// ```
    #[error("the application refused the delivery")]
    Refused(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What the server calls with each delivery. Called from the session's own
/// task, one delivery at a time per session; sessions of different clients
/// call it concurrently. The client's acknowledgement waits until the
/// returned future completes; server shutdown cancels a call still waiting.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use secure_rdma::server::{Delivery, Handler, HandlerError};
///
/// /// Counts the bytes every client sent.
/// #[derive(Default)]
/// struct Bytes(AtomicU64);
///
/// impl Handler for Bytes {
///     async fn handle(&self, delivery: Delivery) -> Result<(), HandlerError> {
///         self.0.fetch_add(delivery.data().len() as u64, Ordering::Relaxed);
///         Ok(())
///     }
/// }
/// # let _ = Bytes::default();
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Takes one delivery; `Err` ends the session without acknowledging it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use secure_rdma::server::{Delivery, Handler, Peer};
    /// use secure_rdma::session::Arrival;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    /// let peer = Arc::new(Peer { identity: "alice".into(), address: "10.77.0.2:1".parse().unwrap() });
    /// tx.handle(Delivery::new(peer, 1, Arrival::Send(b"hi".to_vec()))).await.unwrap();
    /// assert_eq!(rx.recv().await.unwrap().data(), b"hi");
    /// # }
    /// ```
    fn handle(&self, delivery: Delivery) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A bounded channel: each delivery is sent into it. While it is full the
/// session waits (its client's acknowledgements wait too, so the client
/// stops at its window); when the receiver is gone, sessions end with
/// [`HandlerError::Closed`].
impl Handler for mpsc::Sender<Delivery> {
    async fn handle(&self, delivery: Delivery) -> Result<(), HandlerError> {
        self.send(delivery).await.map_err(|_| HandlerError::Closed)
    }
}

/// A closure as a [`Handler`]; made by [`handler_fn`].
///
/// ```
/// use secure_rdma::server::{handler_fn, HandlerFn};
/// let h: HandlerFn<_> = handler_fn(|d| async move { println!("{}", d.identity()); Ok(()) });
/// # let _ = h;
/// ```
#[derive(Debug, Clone)]
pub struct HandlerFn<F>(F);

/// Makes a [`Handler`] of a closure that returns a future (like
/// `tower::service_fn`). Shared state goes in an `Arc` the closure clones.
///
/// ```no_run
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use secure_rdma::server::{handler_fn, Server, ServerConfig};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let count = Arc::new(AtomicU64::new(0));
/// let seen = Arc::clone(&count);
/// let server = Server::bind(ServerConfig::new("0.0.0.0:4433".parse()?, "certs".as_ref()))
///     .await?
///     .with_handler(handler_fn(move |d| {
///         let seen = Arc::clone(&seen);
///         async move {
///             seen.fetch_add(1, Ordering::Relaxed);
///             println!("{}: {} bytes", d.identity(), d.data().len());
///             Ok(())
///         }
///     }));
/// server.run(async { let _ = tokio::signal::ctrl_c().await; }).await;
/// println!("{} messages", count.load(Ordering::Relaxed));
/// # Ok(()) }
/// ```
pub fn handler_fn<F, Fut>(f: F) -> HandlerFn<F>
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    HandlerFn(f)
}

impl<F, Fut> Handler for HandlerFn<F>
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    fn handle(&self, delivery: Delivery) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (self.0)(delivery)
    }
}

/// The future a [`DynHandler`] returns.
pub(crate) type Handled<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// [`Handler`] made object-safe, so the server holds any handler without a
/// type parameter on `Server` and every function it calls. The box per
/// delivery is only paid with a handler: the logging default has none.
pub(crate) trait DynHandler: Send + Sync {
    fn handle_boxed(&self, delivery: Delivery) -> Handled<'_>;
}

impl<H: Handler> DynHandler for H {
    fn handle_boxed(&self, delivery: Delivery) -> Handled<'_> {
        Box::pin(self.handle(delivery))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(seq: u64) -> Delivery {
        Delivery::new(
            Arc::new(Peer {
                identity: "alice".into(),
                address: "10.77.0.2:1".parse().expect("address"),
            }),
            seq,
            Arrival::Send(vec![seq as u8]),
        )
    }

    #[tokio::test]
    async fn a_full_channel_holds_the_session_back_and_a_dropped_receiver_ends_it() {
        let (tx, mut rx) = mpsc::channel(1);
        let h: Box<dyn DynHandler> = Box::new(tx);
        h.handle_boxed(delivery(1)).await.expect("room for one");
        // Full: the second delivery waits instead of queueing.
        let mut second = h.handle_boxed(delivery(2));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(rx.recv().await.map(|d| d.seq), Some(1));
        second.await.expect("room again");
        assert_eq!(rx.recv().await.map(|d| d.seq), Some(2));
        drop(rx);
        assert!(matches!(
            h.handle_boxed(delivery(3)).await,
            Err(HandlerError::Closed)
        ));
    }

    #[tokio::test]
    async fn closures_are_handlers() {
        let h = handler_fn(|d: Delivery| async move {
            match d.seq {
                1 => Ok(()),
                _ => Err(HandlerError::Refused("only one".into())),
            }
        });
        assert!(h.handle(delivery(1)).await.is_ok());
        assert!(matches!(
            h.handle(delivery(2)).await,
            Err(HandlerError::Refused(_))
        ));
    }
}
