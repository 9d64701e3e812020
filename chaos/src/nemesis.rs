//! The faults a campaign injects.

/// A fault schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// SIGSTOP a client past its TTL, then SIGCONT.
    PauseClient,
    /// SIGKILL a client and start a new one.
    KillClient,
    /// Blackhole one client's connections to the servers past its TTL, then heal.
    CutClient,
    /// SIGKILL a server (leader and follower in turn) and restart it half a second later.
    KillServer,
    /// The same, restarting it only after 1.5 TTLs: Redlock's delayed-restart rule.
    KillServerLate,
    /// Delay one client's traffic by half a TTL each way (a round trip takes a whole TTL) for
    /// 1.5 TTLs: every request and answer arrives late, none is lost.
    DelayClient,
    /// Close every connection of one client at once (a TCP reset); it reconnects.
    ResetClient,
    /// Move one server's wall clock forward by 2 TTLs (an NTP step, an operator's `date -s`).
    ClockJump,
    /// SIGKILL the master or primary and promote its replica or standby: the Sentinel does it
    /// for Redis (the old master comes back empty as a replica); for PostgreSQL the run does
    /// what an operator's tool would (promote the synchronous standby, rebuild the old primary
    /// as its standby).
    Failover,
    /// Cut one member (the leader and a follower in turn) from its peers, both ways, for 1.5
    /// TTLs, while every client still reaches it: it answers, but cannot commit.
    PartitionMember,
    /// Blackhole one client's traffic to one server (the leader and a follower in turn) for
    /// 1.5 TTLs; it still reaches the others.
    CutClientMinority,
}

impl Nemesis {
    /// Its label in the history and the report.
    pub fn label(self) -> &'static str {
        match self {
            Nemesis::PauseClient => "pause-client",
            Nemesis::KillClient => "kill-client",
            Nemesis::CutClient => "cut-client",
            Nemesis::KillServer => "kill-server",
            Nemesis::KillServerLate => "kill-server-late",
            Nemesis::DelayClient => "delay-client",
            Nemesis::ResetClient => "reset-client",
            Nemesis::ClockJump => "clock-jump",
            Nemesis::Failover => "failover",
            Nemesis::PartitionMember => "partition-member",
            Nemesis::CutClientMinority => "cut-client-minority",
        }
    }
}
