//! Why no session was made: a server that closes each new connection before a word is said.
//!
//! ZooKeeper accepts and at once closes a connection past `maxClientCnxns` from one address (60
//! on a stock server), and while it is not serving. Its client only sees the connection lost and
//! tries again until the timeout, so without this a host that runs its 61st client (a cron
//! host's 61st `distlock run`, say) is told "no answer": one probe of each server names it.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::timeout;

/// How long a server that serves keeps a new, silent connection open before it counts as such:
/// a refusing one closes it as it accepts it.
const SILENT: Duration = Duration::from_millis(500);

/// A server of `hosts` (`h1:p1,h2:p2`) that closes a new connection at once, and what that
/// means; `None` when every server reachable keeps it open (or none is reachable). The servers
/// are probed at once, so a failed connect waits [`SILENT`] more at most.
pub(crate) async fn closing_server(hosts: &str) -> Option<String> {
    let hosts: Vec<&str> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    let closing = join_all(hosts.iter().map(|h| closes_at_once(h))).await;
    let host = hosts
        .iter()
        .zip(closing)
        .find_map(|(h, c)| c.then_some(*h))?;
    Some(format!(
        "{host} closes each new connection before a word is said: ZooKeeper does so past \
         `maxClientCnxns` connections from one address (60 on a stock server; each distlock \
         client is one) and while it is not serving"
    ))
}

async fn closes_at_once(host: &str) -> bool {
    let probe = async {
        let mut stream = match TcpStream::connect(host).await {
            Ok(stream) => stream,
            // Closed as it was accepted, before the handshake was seen done here.
            Err(e) => return closed(&e),
        };
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Ok(n) => n == 0,
            Err(e) => closed(&e),
        }
    };
    timeout(SILENT, probe).await.unwrap_or(false)
}

/// The server closed the connection (not: nothing listens, which is refused).
fn closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted)
}
