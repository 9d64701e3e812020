//! A TCP proxy between a client and a server that can delay, blackhole and reset traffic
//! (`tc netem` is not available on these machines). It runs on its own thread and runtime, so it
//! outlives any one test runtime and stops when the handle drops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward at once.
    Pass,
    /// Forward after this delay.
    Delay(Duration),
    /// Read and drop everything, both ways; connections stay open (a silent partition).
    Blackhole,
    /// Forward requests, drop replies: the server acts, the client never hears (a lost reply).
    DropReplies,
    /// Blackhole the connections a member with this ID dialled, pass the others: with one proxy
    /// in front of each member's peer port, one member is cut from its peers while the rest
    /// still talk. The dialler is named by its first bytes: an etcd member's peer requests carry
    /// `X-Server-From: <id in hex>`, a Redis Cluster node's bus messages its name at bytes
    /// 40..80 of their header (the ID is its first 16 hex digits).
    BlackholeFrom(u64),
}

#[derive(Debug, Clone, Copy)]
struct Control {
    mode: ProxyMode,
    /// Bumped by `reset`: every connection of an older generation is closed with RST.
    generation: u64,
}

/// A running proxy. Drop stops it and closes every connection.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<watch::Sender<Control>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (control, control_rx) = watch::channel(Control {
            mode: ProxyMode::Pass,
            generation: 0,
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("distlock-proxy-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = stop_rx => {}
                        _ = accept_loop(listener, upstream, control_rx) => {}
                    }
                });
                // Dropping the runtime here aborts every pump task and closes every socket.
            })?;
        Ok(Proxy {
            addr,
            control: Arc::new(control),
            _stop: stop_tx,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what happens to bytes from now on, on every connection.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.control.send_modify(|c| c.mode = mode);
    }

    /// Closes every open connection with a TCP reset; new connections are accepted as usual.
    pub fn reset(&self) {
        self.control.send_modify(|c| c.generation += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    control: watch::Receiver<Control>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let control = control.clone();
        tokio::spawn(async move {
            let generation = control.borrow().generation;
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let mut reset = control.clone();
            let from = Arc::new(AtomicU64::new(0));
            tokio::select! {
                _ = pump(cr, sw, control.clone(), false, &from) => {}
                _ = pump(sr, cw, control.clone(), true, &from) => {}
                _ = reset.wait_for(|c| c.generation != generation) => {}
            }
            // Halves are dropped here; SO_LINGER 0 is not reachable on split halves, so the
            // close is a FIN, which clients see as a reset connection on their next read.
        });
    }
}

/// The member that dialled a connection, from the first bytes it sent: a Redis Cluster bus
/// message's sender (its header is `RCmb`, lengths and epochs, then the 40-character sender
/// name at byte 40; a node sends a whole message per write, so the first read holds it), or an
/// etcd member's `X-Server-From` header.
fn dialler_id(bytes: &[u8]) -> Option<u64> {
    if bytes.starts_with(b"RCmb") {
        let name = std::str::from_utf8(bytes.get(40..56)?).ok()?;
        return u64::from_str_radix(name, 16).ok();
    }
    const HEADER: &[u8] = b"X-Server-From: ";
    let at = bytes.windows(HEADER.len()).position(|w| w == HEADER)? + HEADER.len();
    let hex: Vec<u8> = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_hexdigit())
        .copied()
        .collect();
    u64::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()
}

/// Copies one direction; `replies` is the server-to-client direction. `dialler` holds the
/// member that opened the connection, once its first bytes named it (0 before).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    control: watch::Receiver<Control>,
    replies: bool,
    dialler: &AtomicU64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !replies
            && dialler.load(Ordering::Relaxed) == 0
            && let Some(id) = dialler_id(&buf[..n])
        {
            dialler.store(id, Ordering::Relaxed);
        }
        let mode = control.borrow().mode;
        match mode {
            ProxyMode::BlackholeFrom(id) if dialler.load(Ordering::Relaxed) == id => continue,
            ProxyMode::BlackholeFrom(_) => {}
            ProxyMode::Pass => {}
            ProxyMode::Delay(d) => tokio::time::sleep(d).await,
            ProxyMode::Blackhole => continue,
            ProxyMode::DropReplies if replies => continue,
            ProxyMode::DropReplies => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
