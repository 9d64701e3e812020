//! The grade a server earns, from what it says at connect (and again at every reconnect):
//! correctness only when a committed grant survives a crash and a failover.

use tokio_postgres::Client;

use crate::sql;

/// What decides the grade, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerFacts {
    /// A standby (`pg_is_in_recovery()`): refused, it cannot write a grant.
    pub(crate) in_recovery: bool,
    pub(crate) fsync: String,
    pub(crate) full_page_writes: String,
    /// How many standbys stream from it now (`pg_stat_replication`).
    pub(crate) standbys: i64,
    /// `synchronous_standby_names`: empty when no standby is synchronous.
    pub(crate) synchronous_standbys: String,
}

impl ServerFacts {
    /// Reads them ([`sql::SERVER_FACTS`]).
    pub(crate) async fn read(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let row = client.query_typed_one(sql::SERVER_FACTS, &[]).await?;
        Ok(ServerFacts {
            in_recovery: row.try_get(0)?,
            fsync: row.try_get(1)?,
            full_page_writes: row.try_get(2)?,
            standbys: row.try_get(3)?,
            synchronous_standbys: row.try_get(4)?,
        })
    }

    /// Why grants are not durable here (the first check that fails), or `None` for the
    /// correctness grade. Every grant and renewal commits with `synchronous_commit=on` whatever
    /// the server's default; what the client cannot set is checked: writes reach the disk (`fsync`), a torn
    /// page cannot lose a committed row (`full_page_writes`), and a failover cannot land on a
    /// standby that lacks committed grants (no standby streams, or the server waits for a
    /// synchronous one).
    pub(crate) fn downgrade(&self) -> Option<String> {
        if self.fsync != "on" {
            return Some(format!(
                "fsync is {}: a crash can lose committed grants and reissue their tokens",
                self.fsync
            ));
        }
        if self.full_page_writes != "on" {
            return Some(format!(
                "full_page_writes is {}: a crash can tear a page of committed grants",
                self.full_page_writes
            ));
        }
        if self.standbys > 0 && self.synchronous_standbys.trim().is_empty() {
            return Some(format!(
                "{} standby(s) stream asynchronously (synchronous_standby_names is empty): a failover can lose grants and go back in tokens",
                self.standbys
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ServerFacts {
        ServerFacts {
            in_recovery: false,
            fsync: "on".into(),
            full_page_writes: "on".into(),
            standbys: 0,
            synchronous_standbys: String::new(),
        }
    }

    #[test]
    fn a_durable_server_alone_or_with_a_synchronous_standby_keeps_correctness() {
        assert_eq!(facts().downgrade(), None);
        let synced = ServerFacts {
            standbys: 1,
            synchronous_standbys: "FIRST 1 (s1)".into(),
            ..facts()
        };
        assert_eq!(synced.downgrade(), None);
    }

    #[test]
    fn each_failed_check_is_named() {
        let cases = [
            (
                ServerFacts {
                    fsync: "off".into(),
                    ..facts()
                },
                "fsync",
            ),
            (
                ServerFacts {
                    full_page_writes: "off".into(),
                    ..facts()
                },
                "full_page_writes",
            ),
            (
                ServerFacts {
                    standbys: 2,
                    ..facts()
                },
                "asynchronously",
            ),
        ];
        for (f, named) in cases {
            let why = f.downgrade().expect("downgraded");
            assert!(why.contains(named), "{why}");
        }
    }
}
