//! An election's observer process: records every leader `observe()` reports and what
//! `leader()` answers every 50 ms (when it changed), for the checker's "observers never go back" and "a reported
//! leader is one that was elected".

use std::time::Duration;

use futures_util::StreamExt;

use crate::history::{Event, Recorder};

/// Observes `election` until killed.
pub async fn run(election: &distlock::Election, rec: &Recorder) {
    let mut stream = election.observe();
    let watching = async {
        while let Some(item) = stream.next().await {
            rec.record(match item {
                Ok(l) => Event::Observed {
                    term: l.term.get(),
                    value: l.value,
                    via: "observe".into(),
                },
                Err(e) => Event::ObserveError {
                    error: e.to_string(),
                },
            });
        }
    };
    let polling = async {
        let mut last = None;
        loop {
            match election.leader().await {
                Ok(Some(l)) if last.as_ref() != Some(&l) => {
                    last = Some(l.clone());
                    rec.record(Event::Observed {
                        term: l.term.get(),
                        value: l.value,
                        via: "leader".into(),
                    });
                }
                Ok(_) => {}
                Err(e) => rec.record(Event::ObserveError {
                    error: e.to_string(),
                }),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::join!(watching, polling);
}
