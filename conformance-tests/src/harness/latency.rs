//! A TCP link with a fixed one-way delay, for measuring on a datacenter-like network: on
//! loopback a round trip is ~50 us, which makes a few microseconds of server work look large.
//!
//! Not [`super::Proxy`]'s `Delay` mode: that sleeps on tokio's timer (millisecond resolution)
//! and holds back everything read after the sleeping chunk, so it also throttles. This is a delay
//! line: every chunk leaves `delay` after it arrived, in order, however many are in flight, timed
//! by OS threads whose sleeps are accurate to tens of microseconds.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A running link. Drop stops it and closes every connection.
#[derive(Debug)]
pub struct LatencyLink {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl LatencyLink {
    /// Listens on a free loopback port and forwards to `upstream`, each way `one_way` late.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stop2, open2) = (stop.clone(), open.clone());
        std::thread::Builder::new()
            .name(format!("distlock-latency-{}", addr.port()))
            .spawn(move || {
                for client in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    // A connection that cannot be set up is dropped: its client sees it closed.
                    let _ = link(client, server, one_way, &open2);
                }
            })?;
        Ok(LatencyLink { addr, stop, open })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for LatencyLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Ok(open) = self.open.lock() {
            for s in open.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Starts both directions of one connection.
fn link(
    client: TcpStream,
    server: TcpStream,
    delay: Duration,
    open: &Mutex<Vec<TcpStream>>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    if let Ok(mut open) = open.lock() {
        open.push(client.try_clone()?);
        open.push(server.try_clone()?);
    }
    direction(client.try_clone()?, server.try_clone()?, delay)?;
    direction(server, client, delay)
}

/// One direction: a reader stamps each chunk with its due time, a writer sends it then. The
/// writer half-closes its side once the reader saw the end, so each side's close travels too.
fn direction(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new()
        .name("distlock-latency-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0
                    || tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                {
                    return;
                }
            }
        })?;
    std::thread::Builder::new()
        .name("distlock-latency-write".into())
        .spawn(move || {
            // The kernel's default timer slack (50 us) would add itself to every delay.
            // SAFETY: PR_SET_TIMERSLACK changes only this thread's timer slack.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
            }
            for (due, bytes) in rx {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&bytes).is_err() {
                    return;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}
