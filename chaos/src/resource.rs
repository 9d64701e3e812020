//! The protected resources, in a process of their own that the clients reach over TCP:
//!
//! * a **fenced register**: `FENCED <token> <client>` is accepted (`OK`) only if the token is at
//!   least the highest accepted so far, else refused (`STALE`);
//! * an **unfenced lock-set** (Jepsen's `lock-set`): `READ` answers `SET <elements...>`,
//!   `WRITE <elements...>` replaces the set: a holder reads, sleeps, and writes back the set
//!   with one new element, so an element goes missing when two holders overlapped.
//!
//! * a **registry** of permit holders: `ENTER <client> <token>` registers a holder, `LEAVE
//!   <client>` (or its connection closing, a killed client) removes it; each entry is recorded
//!   with how many were registered then;
//! * `PEEK` answers the register's highest token (`TOKEN <n>`, `TOKEN -`), for readers.
//!
//! `END` records the final set. Every accepted fenced write is recorded as the register saw it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::history::{Event, Recorder};

#[derive(Default)]
struct State {
    highest: Option<u64>,
    set: BTreeSet<String>,
    /// Registered permit holders: client -> the connection that registered it.
    inside: BTreeMap<u32, u64>,
    connections: u64,
}

/// Serves on `listener` for ever, recording into `history`.
pub async fn serve(listener: TcpListener, history: Recorder) {
    let state = Arc::new(Mutex::new(State::default()));
    let history = Arc::new(history);
    while let Ok((socket, _)) = listener.accept().await {
        let (state, history) = (state.clone(), history.clone());
        tokio::spawn(async move { connection(socket, &state, &history).await });
    }
}

async fn connection(socket: TcpStream, state: &Mutex<State>, history: &Recorder) {
    let me = {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        st.connections += 1;
        st.connections
    };
    serve_lines(socket, me, state, history).await;
    // A client killed while registered leaves with its connection.
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    st.inside.retain(|_, c| *c != me);
}

async fn serve_lines(socket: TcpStream, me: u64, state: &Mutex<State>, history: &Recorder) {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        let reply = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            match words.next() {
                Some("FENCED") => {
                    let token: Option<u64> = words.next().and_then(|t| t.parse().ok());
                    let client: Option<u32> = words.next().and_then(|c| c.parse().ok());
                    match (token, client) {
                        (Some(token), Some(client)) if st.highest.is_none_or(|h| token >= h) => {
                            st.highest = Some(token);
                            history.record(Event::Accepted { token, client });
                            "OK".to_string()
                        }
                        (Some(_), Some(_)) => "STALE".to_string(),
                        _ => "ERR".to_string(),
                    }
                }
                Some("ENTER") => match words.next().and_then(|c| c.parse().ok()) {
                    Some(client) => {
                        st.inside.insert(client, me);
                        history.record(Event::Entered {
                            client,
                            inside: st.inside.len(),
                        });
                        "OK".to_string()
                    }
                    None => "ERR".to_string(),
                },
                Some("LEAVE") => match words.next().and_then(|c| c.parse::<u32>().ok()) {
                    Some(client) => {
                        st.inside.remove(&client);
                        "OK".to_string()
                    }
                    None => "ERR".to_string(),
                },
                Some("PEEK") => match st.highest {
                    Some(h) => format!("TOKEN {h}"),
                    None => "TOKEN -".to_string(),
                },
                Some("READ") => {
                    let elements: Vec<&str> = st.set.iter().map(String::as_str).collect();
                    format!("SET {}", elements.join(" "))
                }
                Some("WRITE") => {
                    st.set = words.map(str::to_string).collect();
                    "OK".to_string()
                }
                Some("END") => {
                    history.record(Event::FinalSet {
                        elements: st.set.iter().cloned().collect(),
                    });
                    "OK".to_string()
                }
                _ => "ERR".to_string(),
            }
        };
        if write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A client's line-at-a-time connection to the resource process.
pub struct Line {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Line {
    /// Connects to the resource process at `addr`.
    pub async fn connect(addr: &str) -> std::io::Result<Self> {
        let (read, write) = TcpStream::connect(addr).await?.into_split();
        Ok(Line {
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    /// Sends `request`, returns the answer line.
    pub async fn ask(&mut self, request: &str) -> std::io::Result<String> {
        self.write
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        self.lines
            .next_line()
            .await?
            .ok_or_else(|| std::io::Error::other("the resource closed the connection"))
    }
}
