//! A minimal HTTP/1.1 endpoint for Prometheus: `GET /metrics`, then close.
//!
//! The exposition is OpenMetrics for clients that ask for it (Prometheus
//! does), the text format 0.0.4 for the others (`curl | promtool check
//! metrics`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::timeout;

use super::prometheus::{to_text_format, OPENMETRICS_CONTENT_TYPE};

/// The content type of the text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A scrape request is one line and a few headers; anything longer is not one.
const MAX_REQUEST: usize = 8 * 1024;

/// Clients served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Timeouts {
    /// For the whole request head.
    read: Duration,
    /// For the whole response.
    write: Duration,
}

const TIMEOUTS: Timeouts = Timeouts {
    read: Duration::from_secs(5),
    write: Duration::from_secs(10),
};

/// Where a response's exposition comes from.
#[derive(Clone)]
enum Source {
    /// The latest text an exporter published.
    Latest(watch::Receiver<String>),
    /// Rendered for each request.
    Render(Arc<dyn Fn() -> String + Send + Sync>),
}

impl Source {
    fn current(&self) -> String {
        match self {
            Source::Latest(rx) => rx.borrow().clone(),
            Source::Render(render) => render(),
        }
    }
}

/// Serves the latest Prometheus exposition from `current` on `listener`
/// until the sender of `current` is dropped.
///
/// `GET /metrics` (or `HEAD`) answers 200 with the current text; other paths
/// 404, other methods on `/metrics` 405, malformed requests 400, requests
/// over 8 KiB 431, and clients that do not send a request within 5 s 408.
/// Every connection gets one response and is closed. At most 64 clients are
/// served at once, so slow clients cannot exhaust memory or descriptors.
///
/// A text in the OpenMetrics format (ending with `# EOF`, as
/// [`render_exposition`](super::render_exposition) writes it) goes as is to
/// clients whose `Accept` header names `application/openmetrics-text`, and
/// in the format 0.0.4 ([`to_text_format`]) to the others; any other text is
/// served as 0.0.4.
///
/// # Examples
///
/// ```no_run
/// use rdma_monitor::report::serve_metrics;
///
/// # async fn run() -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:9435").await?;
/// let (publish, current) = tokio::sync::watch::channel(String::new());
/// tokio::spawn(serve_metrics(listener, current));
/// publish.send_replace("rdma_lost_events_total 0\n".to_owned());
/// # Ok(())
/// # }
/// ```
pub async fn serve_metrics(listener: TcpListener, current: watch::Receiver<String>) {
    serve(listener, Source::Latest(current), TIMEOUTS).await;
}

/// Like [`serve_metrics`], but calls `render` for every request, so counts
/// that change between reports are current at each scrape; serves until the
/// task is dropped.
///
/// # Examples
///
/// ```no_run
/// use rdma_monitor::report::{render_exposition, serve_metrics_with, BuildInfo};
///
/// # async fn run() -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:9435").await?;
/// let build = BuildInfo { exporter: "my_exporter", version: "1.0.0" };
/// tokio::spawn(serve_metrics_with(listener, move || render_exposition(None, &build, |_| {})));
/// # Ok(())
/// # }
/// ```
pub async fn serve_metrics_with(
    listener: TcpListener,
    render: impl Fn() -> String + Send + Sync + 'static,
) {
    serve(listener, Source::Render(Arc::new(render)), TIMEOUTS).await;
}

async fn serve(listener: TcpListener, current: Source, timeouts: Timeouts) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut updates = match &current {
        Source::Latest(rx) => Some(rx.clone()),
        Source::Render(_) => None,
    };
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            // The semaphore is never closed.
            return;
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let current = current.clone();
                    tokio::spawn(async move {
                        // A failed connection concerns only its client.
                        let _ = answer(stream, &current, timeouts).await;
                        drop(slot);
                    });
                }
                // Out of descriptors and the like: pause instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            },
            changed = async { updates.as_mut()?.changed().await.ok() }, if updates.is_some() => {
                if changed.is_none() {
                    return;
                }
            }
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    current: &Source,
    timeouts: Timeouts,
) -> std::io::Result<()> {
    let response = match timeout(timeouts.read, read_head(&mut stream)).await {
        Err(_) => Response::error(408, "Request Timeout"),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Head::Closed)) => return Ok(()),
        Ok(Ok(Head::TooLarge)) => Response::error(431, "Request Header Fields Too Large"),
        Ok(Ok(Head::Complete(head))) => route(&head, current),
    };
    timeout(timeouts.write, async {
        stream.write_all(&response.bytes()).await?;
        stream.shutdown().await?;
        // Read what the client still sends (a body we ignored), briefly, so
        // that closing does not reset the connection before it reads the
        // response.
        let mut sink = [0u8; 1024];
        let mut drained = 0;
        while drained < MAX_REQUEST {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok(())
    })
    .await
    .unwrap_or(Ok(()))
}

enum Head {
    Complete(Vec<u8>),
    TooLarge,
    Closed,
}

async fn read_head(stream: &mut TcpStream) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            // A client that closed mid-request cannot read an answer.
            return Ok(Head::Closed);
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(Head::Complete(head));
        }
        if head.len() > MAX_REQUEST {
            return Ok(Head::TooLarge);
        }
    }
}

/// Where the blank line after the headers ends; bare `\n` line ends are
/// tolerated, as RFC 9112 allows.
fn head_end(data: &[u8]) -> Option<usize> {
    let crlf = data
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = data.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the request's `Accept` header names OpenMetrics. Prometheus
/// lists it first, with a higher quality than 0.0.4; no client asks for
/// OpenMetrics while ranking it below 0.0.4, so qualities are not compared.
fn accepts_openmetrics(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n').skip(1).any(|line| {
        let line = String::from_utf8_lossy(line).to_ascii_lowercase();
        line.strip_prefix("accept:")
            .is_some_and(|value| value.contains("application/openmetrics-text"))
    })
}

fn route(head: &[u8], current: &Source) -> Response {
    let Some((method, target)) = request_line(head) else {
        return Response::error(400, "Bad Request");
    };
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    if path != "/metrics" {
        return Response::error(404, "Not Found");
    }
    match method {
        "GET" | "HEAD" => {
            let text = current.current();
            let openmetrics = text.ends_with("# EOF\n");
            let (content_type, body) = if !openmetrics {
                (CONTENT_TYPE, text)
            } else if accepts_openmetrics(head) {
                (OPENMETRICS_CONTENT_TYPE, text)
            } else {
                (CONTENT_TYPE, to_text_format(&text))
            };
            Response {
                status: 200,
                reason: "OK",
                content_type,
                body,
                head_only: method == "HEAD",
                allow: false,
            }
        }
        _ => Response {
            allow: true,
            ..Response::error(405, "Method Not Allowed")
        },
    }
}

/// `METHOD TARGET HTTP/1.x` from the first line, if it is one.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let valid = parts.next().is_none()
        && !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_uppercase())
        && target.starts_with('/')
        && version.starts_with("HTTP/1.");
    valid.then_some((method, target))
}

struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: String,
    head_only: bool,
    allow: bool,
}

impl Response {
    fn error(status: u16, reason: &'static str) -> Response {
        Response {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: format!("{status} {reason}\n"),
            head_only: false,
            allow: false,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        );
        if self.allow {
            out.push_str("Allow: GET, HEAD\r\n");
        }
        out.push_str("\r\n");
        if !self.head_only {
            out.push_str(&self.body);
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    async fn start(timeouts: Timeouts) -> (SocketAddr, watch::Sender<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("bound address");
        let (tx, rx) = watch::channel("rdma_lost_events_total 0\n".to_owned());
        tokio::spawn(serve(listener, Source::Latest(rx), timeouts));
        (addr, tx)
    }

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request).await.expect("send");
        let mut response = Vec::new();
        timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
            .await
            .expect("answered in time")
            .expect("read");
        String::from_utf8(response).expect("UTF-8 response")
    }

    fn split(response: &str) -> (&str, &str) {
        response.split_once("\r\n\r\n").expect("head and body")
    }

    #[tokio::test]
    async fn serves_the_current_body_and_its_updates() {
        let (addr, tx) = start(TIMEOUTS).await;
        let response = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, body) = split(&response);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\nContent-Type: text/plain; version=0.0.4"));
        assert!(head.contains("\r\nContent-Length: 25"));
        assert_eq!(body, "rdma_lost_events_total 0\n");

        tx.send_replace("rdma_lost_events_total 7\n".to_owned());
        let response = exchange(addr, b"GET /metrics?x=1 HTTP/1.0\n\n").await;
        assert_eq!(split(&response).1, "rdma_lost_events_total 7\n");

        let response = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        let (head, body) = split(&response);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        assert_eq!(body, "");
    }

    #[tokio::test]
    async fn other_paths_methods_and_garbage() {
        let (addr, _tx) = start(TIMEOUTS).await;
        let response = exchange(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(
            response.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{response}"
        );
        let response = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        )
        .await;
        assert!(
            response.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{response}"
        );
        assert!(response.contains("\r\nAllow: GET, HEAD\r\n"));
        for garbage in [
            &b"\x00\xff\xfe garbage\r\n\r\n"[..],
            b"GET\r\n\r\n",
            b"GET /metrics HTTP/1.1 extra\r\n\r\n",
            b"get /metrics HTTP/1.1\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
        ] {
            let response = exchange(addr, garbage).await;
            assert!(
                response.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{garbage:?}: {response}"
            );
        }
        let huge = vec![b'A'; MAX_REQUEST * 2];
        let response = exchange(addr, &huge).await;
        assert!(response.starts_with("HTTP/1.1 431 "), "{response}");
        // A client that hangs up at once gets nothing, and harms nothing.
        drop(TcpStream::connect(addr).await.expect("connect"));

        let response = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "still serving");
    }

    #[tokio::test]
    async fn slow_clients_time_out_without_blocking_others() {
        let quick = Timeouts {
            read: Duration::from_millis(200),
            write: Duration::from_millis(200),
        };
        let (addr, _tx) = start(quick).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        silent
            .write_all(b"GET /metr")
            .await
            .expect("partial request");

        let response = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"));

        let mut response = Vec::new();
        timeout(Duration::from_secs(5), silent.read_to_end(&mut response))
            .await
            .expect("closed in time")
            .expect("read");
        assert!(response.starts_with(b"HTTP/1.1 408 Request Timeout\r\n"));
    }

    #[tokio::test]
    async fn openmetrics_to_those_who_ask_and_0_0_4_to_the_others() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("bound address");
        let om = "# HELP x Things.\n# TYPE x counter\nx_total 1\n# EOF\n";
        tokio::spawn(serve_metrics_with(listener, move || om.to_owned()));

        let prometheus = b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n";
        let response = exchange(addr, prometheus).await;
        let (head, body) = split(&response);
        assert!(
            head.contains("\r\nContent-Type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        assert_eq!(body, om);

        let response = exchange(addr, b"GET /metrics HTTP/1.1\r\nAccept: */*\r\n\r\n").await;
        let (head, body) = split(&response);
        assert!(
            head.contains("\r\nContent-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert_eq!(
            body,
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total 1\n"
        );
    }

    #[tokio::test]
    async fn stops_when_the_sender_is_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (tx, rx) = watch::channel(String::new());
        let server = tokio::spawn(serve_metrics(listener, rx));
        drop(tx);
        timeout(Duration::from_secs(5), server)
            .await
            .expect("stopped in time")
            .expect("did not panic");
    }
}
