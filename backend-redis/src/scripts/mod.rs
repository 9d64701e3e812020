//! The server-side scripts. Each runs atomically on the server, which is what makes "check the
//! owner, then act" safe: nothing can run between the check and the act.
//!
//! The lock value is `<secret>:<token><holder>`, and `<secret>:<token><holder>:<value>` once an
//! election's leader announced `value` ([`ANNOUNCE`]); the secret is always 32 hex characters, so
//! the owner check compares the first 33 bytes with `<secret>:`. `<holder>` is who holds it
//! (`~<since>,<pid>,<host>,<command>`, [`distlock_api::HolderInfo`]; no `:` in it), empty in a
//! value written by another client.
//!
//! One queue serves every policy ([`distlock_api::Admission`]): a queued member is the secret,
//! followed by `#<limit>` when its limit is not 1, so a waiter reads every limit ahead of it from
//! the queue itself. Each waiter's ask (`asks` hash, member -> `<ttl ms>:<holder>:<channel>`
//! for a lock's, `:<policy><ttl ms><holder>:<channel>` for a policy's, `:<holder>:<channel>` for
//! a Redlock arbiter's waiter, which is only woken) names its client's turn channel, where a
//! message `t:<secret>` says "your turn" and `g<token>:<secret>` "granted" (`HAND_ON`). An
//! exclusive holder (a lock, a writer) is the lock key; shared holders (permits, readers) are the
//! fields of the name's `shared` hash, `<secret>` -> `<expiry ms>:<token>:<limit><holder>` by the
//! server's clock, the hash itself kept alive as long as its longest field ([`ADMIT`]).
//!
//! Waiters queue in arrival order (a sorted set scored by server time) with a liveness set
//! (scored by expiry, refreshed at every re-check): a release grants the live heads that fit,
//! each on its client's channel, and a free lock promised to a live head is refused to everyone
//! else. A waiter that
//! crashed stops refreshing and is dropped within the waiter TTL; one that gives up leaves at
//! once ([`LEAVE`]). Both sets carry that TTL, so a name nobody waits on leaves no key behind.

use std::ops::Deref;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    Arg, Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind,
    ToRedisArgs,
};

mod helpers;
mod holder;
mod lock;
mod shared;

pub use holder::{ANNOUNCE, INSPECT, PEEK};
pub use lock::{ACQUIRE, LEAVE, RELEASE, RENEW};
pub use shared::{ADMIT, RELEASE_SHARED};

/// A script and its source: the source is what a call resends as `EVAL` when a server does not
/// know the script.
pub struct Lua {
    script: Script,
    source: String,
}

impl Lua {
    fn new(source: String) -> Self {
        Lua {
            script: Script::new(&source),
            source,
        }
    }
}

impl Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// One call of a script, written straight into one command (`EVALSHA <sha> <number of keys>`,
/// then the keys, then the arguments, in that order). `Script::key` / `arg` first copy every key
/// and argument into a buffer of its own: ~15 allocations per acquire + release pair, which
/// measured ~10 % of the client's instructions.
pub(crate) struct Call {
    lua: &'static Lua,
    cmd: Cmd,
}

impl Call {
    pub(crate) fn new(lua: &'static Lua, keys: usize) -> Self {
        // Room for our longest single-name call (acquire: 4 keys of a ~100-byte name, 5
        // arguments) at once, rather than growing the buffers six or seven times per call.
        let mut cmd = Cmd::with_capacity(3 + 9, 640);
        cmd.arg("EVALSHA").arg(lua.get_hash()).arg(keys);
        Call { lua, cmd }
    }

    /// Appends a key (while fewer than the declared number were written) or an argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// The same call sent with the script's source (`EVAL`), in one send whatever the server's
    /// script cache holds: for a clean-up whose answer nobody may wait for (its caller gone, or
    /// a server that hangs and answers `NOSCRIPT` only later, when no resend would follow). It
    /// still runs whenever the server gets to it, in order behind the request it cleans up.
    pub(crate) fn with_source(mut self) -> Self {
        self.cmd = self.eval();
        self
    }

    /// Sends the call, each send cut off at `per_send` on its own. A server that does not know
    /// the script yet (restarted, failed over, flushed, a new Cluster node) answers `NOSCRIPT`;
    /// the call is then sent again as `EVAL` with the source, which also caches the script on
    /// that server. `SCRIPT LOAD` is not used: on a Cluster connection it goes to every node and
    /// waits for all, so one hung node would fail calls meant for healthy ones.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        per_send: Duration,
    ) -> RedisResult<T> {
        match timed(per_send, self.cmd.query_async(conn)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                timed(per_send, self.eval().query_async(conn)).await
            }
            answer => answer,
        }
    }

    /// The same call as `EVAL <source> ...` (unchanged if it is one already).
    fn eval(&self) -> Cmd {
        if self
            .cmd
            .args_iter()
            .next()
            .is_some_and(|a| matches!(a, Arg::Simple(b"EVAL")))
        {
            return self.cmd.clone();
        }
        let mut eval = Cmd::with_capacity(3 + 9, 640 + self.lua.source.len());
        eval.arg("EVAL").arg(&self.lua.source);
        for arg in self.cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

/// `send`, or a timeout error (retryable, like a dropped connection) after `limit`.
async fn timed<T>(limit: Duration, send: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    tokio::time::timeout(limit, send).await.unwrap_or_else(|_| {
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {limit:?}"),
        )))
    })
}
