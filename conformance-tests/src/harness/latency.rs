//! A TCP link with a fixed one-way delay, for measuring on a datacenter-like network: on
//! loopback a round trip is ~50 us, which makes a few microseconds of server work look large.
//!
//! Not [`super::Proxy`]'s `Delay` mode: that sleeps on tokio's timer (millisecond resolution)
//! and holds back everything read after the sleeping chunk, so it also throttles. This is a delay
//! line: every chunk leaves `delay` after it arrived, in order, however many are in flight, timed
//! by OS threads whose sleeps are accurate to tens of microseconds.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A running link. Drop stops it and closes every connection.
#[derive(Debug)]
pub struct LatencyLink {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    open: Open,
}

/// The open connections, both sockets each, by number: closed with the link.
type Open = Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>;

impl LatencyLink {
    /// Listens on a free loopback port and forwards to `upstream`, each way `one_way` late.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open: Open = Arc::default();
        let (stop2, open2) = (stop.clone(), open.clone());
        let ids = AtomicU64::new(0);
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
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    let _ = link(id, client, server, one_way, &open2);
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
            for s in open.values().flatten() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Starts both directions of connection `id`; the last direction to end forgets it.
fn link(
    id: u64,
    client: TcpStream,
    server: TcpStream,
    delay: Duration,
    open: &Open,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    if let Ok(mut open) = open.lock() {
        open.insert(id, [client.try_clone()?, server.try_clone()?]);
    }
    let ended = Arc::new(AtomicU64::new(0));
    let done = {
        let open = open.clone();
        move || {
            if ended.fetch_add(1, Ordering::SeqCst) == 1
                && let Ok(mut open) = open.lock()
            {
                open.remove(&id);
            }
        }
    };
    direction(
        client.try_clone()?,
        server.try_clone()?,
        delay,
        done.clone(),
    )?;
    direction(server, client, delay, done)
}

/// One direction: a reader stamps each chunk with its due time, a writer sends it then. The
/// writer half-closes its side once the reader saw the end, so each side's close travels too;
/// then it calls `done`.
fn direction(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    done: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
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
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
            done();
        })?;
    Ok(())
}
