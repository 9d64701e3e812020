//! A TCP proxy between a client and a server that can delay, blackhole and reset traffic
//! (`tc netem` is not available on these machines). It runs on its own thread and runtime, so it
//! outlives any one test runtime and stops when the handle drops.

use std::net::SocketAddr;
use std::sync::Arc;
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
            tokio::select! {
                _ = pump(cr, sw, control.clone(), false) => {}
                _ = pump(sr, cw, control.clone(), true) => {}
                _ = reset.wait_for(|c| c.generation != generation) => {}
            }
            // Halves are dropped here; SO_LINGER 0 is not reachable on split halves, so the
            // close is a FIN, which clients see as a reset connection on their next read.
        });
    }
}

/// Copies one direction; `replies` is the server-to-client direction.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    control: watch::Receiver<Control>,
    replies: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mode = control.borrow().mode;
        match mode {
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
