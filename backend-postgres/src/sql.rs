//! The server-side layout in one place: the schema's table and sequence, the functions that
//! keep the queue (one round trip each), the statements the client sends, and the notification
//! channels. `{s}` stands for the schema ([`crate::PostgresOptions::schema`], checked to be a
//! plain identifier before it is put in).
//!
//! One table holds every queue: a row per entry, ordered by `seq` (one global sequence: queue
//! position and fencing token). An entry is admitted by [`distlock_api::admission`]'s rule over
//! the rows of its name; `granted` marks one its client has taken. A waiter's row lives
//! `waiter_ttl` past its last re-check, a holder's its TTL past its last renewal, on the
//! server's clock (`clock_timestamp()`, never the transaction's `now()`). Expired rows are
//! deleted by the next call on their name, `FOR UPDATE SKIP LOCKED`: a row a guarded
//! transaction holds (`FOR KEY SHARE`) stays until that transaction ends, so its holder's
//! writes commit before anyone else is admitted. Rows are never taken over in place: a new
//! holder is always a new row.
//!
//! Calls that change a queue take the name's transaction-scoped advisory lock first
//! (`lock_name`): a sequence value is not a commit order, so without it two entries could commit
//! out of order and a reader could see the head change back. It goes with the commit. Its key
//! is the two-integer form `(CLASS, hashtext(name))`, which never meets an application's
//! one-`bigint` advisory locks in the same database (names whose hashes collide only wait for
//! each other).

/// Bumped with any change below: a client that finds another version installs its own.
pub const VERSION: i64 = 6;

/// The first key of every advisory lock the layout takes (`dlck` in ASCII).
pub const CLASS: i32 = 0x646c_636b;

/// The largest limit, a read-write lock's reader's ([`distlock_api::Admission::Shared`]).
pub const SHARED_LIMIT: i64 = u32::MAX as i64;

/// The schema, its table and its functions, created or replaced in one transaction under a
/// transaction-scoped advisory lock, so clients connecting at once do not race.
pub const MIGRATE: &str = r#"
-- (class, 0): the migration's own key, apart from every name's (class, hash).
SELECT pg_advisory_xact_lock({class}, 0);
CREATE SCHEMA IF NOT EXISTS {s};
CREATE SEQUENCE IF NOT EXISTS {s}.token NO CYCLE;
CREATE TABLE IF NOT EXISTS {s}.entry (
    seq bigint PRIMARY KEY DEFAULT nextval('{s}.token'),
    name text NOT NULL,
    secret text NOT NULL,
    lim bigint NOT NULL,
    client text NOT NULL,
    expires_at timestamptz NOT NULL,
    granted boolean NOT NULL DEFAULT false,
    told boolean NOT NULL DEFAULT false,
    holder text NOT NULL DEFAULT '',
    value text
);
CREATE INDEX IF NOT EXISTS entry_name ON {s}.entry (name, seq);
CREATE INDEX IF NOT EXISTS entry_secret ON {s}.entry (secret);
-- Half of each page left free, so a renewal's new row version fits beside the old one (a HOT
-- update: no index entry written, none to vacuum). Renewing 100 000 leases took 1.2-1.4 s with
-- full pages, every tick; 0.34-0.41 s so. An existing table's pages fill so as they are rewritten.
ALTER TABLE {s}.entry SET (fillfactor = 50);

-- The name's queue lock (see the module docs), and a durable commit whatever the server's
-- default (set here, per transaction: a pooler refuses the startup option), both for the rest
-- of the transaction.
CREATE OR REPLACE FUNCTION {s}.lock_name(p_name text) RETURNS void
LANGUAGE sql AS $f$
    SELECT set_config('synchronous_commit', 'on', true);
    SELECT pg_advisory_xact_lock({class}, hashtext(p_name))
$f$;

-- The entries of a name admitted by the rule: fewer entries ahead than the smallest limit
-- among themselves and those ahead (a prefix of the queue).
CREATE OR REPLACE FUNCTION {s}.admitted(p_name text)
RETURNS TABLE (seq bigint, granted boolean, told boolean, client text)
LANGUAGE sql STABLE AS $f$
    SELECT q.seq, q.granted, q.told, q.client FROM (
        SELECT e.seq, e.granted, e.told, e.client,
               row_number() OVER w - 1 AS ahead, min(e.lim) OVER w AS smallest
        FROM {s}.entry e WHERE e.name = p_name
        WINDOW w AS (ORDER BY e.seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    ) q WHERE q.ahead < q.smallest
$f$;

-- The channel an election's observers listen on (63 bytes at most: the schema is short).
CREATE OR REPLACE FUNCTION {s}.leader_channel(p_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT '{s}_l_' || md5(p_name) $f$;

-- Tells every admitted waiter not told yet (payload: its secret), once. Called after any
-- delete: admission changes only when an entry ahead goes.
CREATE OR REPLACE FUNCTION {s}.tell(p_name text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE r record;
BEGIN
    FOR r IN UPDATE {s}.entry e SET told = true
             WHERE e.seq IN (SELECT a.seq FROM {s}.admitted(p_name) a WHERE NOT a.granted AND NOT a.told)
             RETURNING e.client, e.secret
    LOOP
        PERFORM pg_notify(r.client, r.secret);
    END LOOP;
END $f$;

-- Deletes the name's expired entries that no guarded transaction holds; tells whom that admits,
-- and the observers when a leader's entry went.
CREATE OR REPLACE FUNCTION {s}.reap(p_name text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE n bigint; led boolean;
BEGIN
    WITH d AS (
        DELETE FROM {s}.entry WHERE seq IN (
            SELECT e.seq FROM {s}.entry e
            WHERE e.name = p_name AND e.expires_at <= clock_timestamp()
            FOR UPDATE SKIP LOCKED)
        RETURNING value
    ) SELECT count(*), coalesce(bool_or(value IS NOT NULL), false) INTO n, led FROM d;
    IF led THEN PERFORM pg_notify({s}.leader_channel(p_name), ''); END IF;
    IF n > 0 THEN PERFORM {s}.tell(p_name); END IF;
END $f$;

-- Grants entry p_seq if admitted: {1, seq}. Else a try's entry is deleted: {0, ms}; a waiter's
-- is kept alive: {0, ms, seq}; ms = until the first entry ahead expires.
-- Only a grant waits for the disk. The rest (a waiter's entry, a refused try) commits without:
-- it grants nothing, a grant after it flushes it too, and a waiter's entry lost in a crash is
-- found gone at its next re-check and joins again. Else every enqueue would hold the name's
-- lock through a disk sync, in the way of the hand-over to the head.
CREATE OR REPLACE FUNCTION {s}.settle(p_name text, p_seq bigint, p_ttl_ms bigint,
                                      p_wait boolean, p_waiter_ms bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $f$
DECLARE ms bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.admitted(p_name) a WHERE a.seq = p_seq) THEN
        UPDATE {s}.entry SET granted = true,
               expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
        WHERE seq = p_seq;
        RETURN ARRAY[1, p_seq];
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT greatest(0, ceil(extract(epoch FROM min(expires_at) - clock_timestamp()) * 1000))::bigint
    INTO ms FROM {s}.entry WHERE name = p_name AND seq < p_seq;
    IF NOT p_wait THEN
        DELETE FROM {s}.entry WHERE seq = p_seq;
        RETURN ARRAY[0, coalesce(ms, 0)];
    END IF;
    UPDATE {s}.entry SET expires_at = clock_timestamp() + p_waiter_ms * interval '1 millisecond'
    WHERE seq = p_seq;
    RETURN ARRAY[0, coalesce(ms, 0), p_seq];
END $f$;

-- A new entry at the back of the name's queue, settled at once. A permit meeting another
-- limit ahead is refused before it is written: {-2, theirs}.
-- The calls that read a queue do so without bitmap scans ({nobitmap}): a plain index scan
-- marks the name's deleted entries dead in the index as it passes them, so the next call skips
-- them; a bitmap scan visits them all again until a vacuum (a busy name piled up thousands
-- between autovacuum's visits, each call slower by them: measured 0.9 -> 1.4 ms a pair).
CREATE OR REPLACE FUNCTION {s}.acquire(p_name text, p_secret text, p_lim bigint, p_permit boolean,
                                       p_ttl_ms bigint, p_wait boolean, p_waiter_ms bigint,
                                       p_client text, p_holder text)
RETURNS bigint[] LANGUAGE plpgsql {nobitmap} AS $f$
DECLARE theirs bigint; v_seq bigint;
BEGIN
    PERFORM {s}.lock_name(p_name);
    PERFORM {s}.reap(p_name);
    IF p_permit THEN
        SELECT lim INTO theirs FROM {s}.entry WHERE name = p_name AND lim <> p_lim ORDER BY seq LIMIT 1;
        IF FOUND THEN RETURN ARRAY[-2, theirs]; END IF;
    END IF;
    INSERT INTO {s}.entry (name, secret, lim, client, expires_at, holder)
    VALUES (p_name, p_secret, p_lim, p_client,
            clock_timestamp() + p_waiter_ms * interval '1 millisecond', p_holder)
    RETURNING seq INTO v_seq;
    RETURN {s}.settle(p_name, v_seq, p_ttl_ms, p_wait, p_waiter_ms);
END $f$;

-- A waiter's re-check: as settle, or {-3} when its entry is gone (it stopped re-checking for
-- longer than its liveness).
CREATE OR REPLACE FUNCTION {s}.admit(p_name text, p_secret text, p_ttl_ms bigint, p_waiter_ms bigint)
RETURNS bigint[] LANGUAGE plpgsql {nobitmap} AS $f$
DECLARE v_seq bigint;
BEGIN
    PERFORM {s}.lock_name(p_name);
    PERFORM {s}.reap(p_name);
    SELECT seq INTO v_seq FROM {s}.entry WHERE name = p_name AND secret = p_secret AND NOT granted;
    IF NOT FOUND THEN RETURN ARRAY[-3]; END IF;
    RETURN {s}.settle(p_name, v_seq, p_ttl_ms, true, p_waiter_ms);
END $f$;

-- Ends our entry (a holder's release, a waiter leaving): whether it was a live grant. It is
-- expired first (a non-key update, which a guarded transaction's FOR KEY SHARE lets through),
-- then deleted unless a guarded transaction holds it: that one stays, expired, until the
-- transaction ends and a later call deletes it. Tells whom the delete admits, and the
-- observers when it carried a leader's value.
-- Committed without waiting for the disk: it grants nothing, and what it frees is granted by a
-- later transaction whose durable commit flushes the log up to its own, this one's included (so
-- a grant it let through never outlives it in a crash). Lost in a crash, it leaves the entry as
-- a holder that died would, until its expiry. One disk sync fewer per hand-over.
CREATE OR REPLACE FUNCTION {s}.release(p_name text, p_secret text) RETURNS boolean
LANGUAGE plpgsql {nobitmap} AS $f$
DECLARE v_seq bigint; held boolean; led boolean;
BEGIN
    PERFORM {s}.lock_name(p_name);
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT seq, granted AND expires_at > clock_timestamp(), value IS NOT NULL
    INTO v_seq, held, led
    FROM {s}.entry WHERE name = p_name AND secret = p_secret FOR NO KEY UPDATE;
    IF NOT FOUND THEN RETURN false; END IF;
    UPDATE {s}.entry SET expires_at = least(expires_at, clock_timestamp()) WHERE seq = v_seq;
    DELETE FROM {s}.entry WHERE seq IN (
        SELECT e.seq FROM {s}.entry e WHERE e.seq = v_seq FOR UPDATE SKIP LOCKED);
    IF led THEN PERFORM pg_notify({s}.leader_channel(p_name), ''); END IF;
    PERFORM {s}.tell(p_name);
    RETURN held;
END $f$;

-- Raises SQLSTATE DLK01 unless the lease whose token is p_seq still holds name p_name, and
-- holds its entry (FOR KEY SHARE) until the calling transaction ends: for triggers and other
-- drivers (the same check as the guard statement).
CREATE OR REPLACE FUNCTION {s}.assert_held(p_name text, p_seq bigint) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM 1 FROM {s}.entry
    WHERE seq = p_seq AND name = p_name AND granted AND expires_at > clock_timestamp()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'distlock: lock % is not held by token %', p_name, p_seq
            USING ERRCODE = 'DLK01';
    END IF;
END $f$;

-- A leader's value, written into its own live entry (checked by secret and token).
CREATE OR REPLACE FUNCTION {s}.announce(p_name text, p_secret text, p_seq bigint, p_value text)
RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE {s}.entry SET value = p_value
    WHERE seq = p_seq AND name = p_name AND secret = p_secret AND granted
      AND expires_at > clock_timestamp();
    IF NOT FOUND THEN RETURN false; END IF;
    PERFORM pg_notify({s}.leader_channel(p_name), '');
    RETURN true;
END $f$;

CREATE OR REPLACE FUNCTION {s}.version() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $f$ SELECT {version}::bigint $f$;
"#;

/// The installed layout's version, or an error when there is none yet.
pub const VERSION_QUERY: &str = "SELECT {s}.version()";

/// `(name, secret, limit, permit?, ttl ms, wait?, waiter ttl ms, channel, holder)` -> the
/// outcome array of `acquire`.
pub const ACQUIRE: &str = "SELECT {s}.acquire($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// `(name, secret, ttl ms, waiter ttl ms)` -> the outcome array of `admit`.
pub const ADMIT: &str = "SELECT {s}.admit($1, $2, $3, $4)";

/// `(name, secret)` -> whether it was a live grant.
pub const RELEASE: &str = "SELECT {s}.release($1, $2)";

/// `(name, secret, token, value)` -> whether it was written.
pub const ANNOUNCE: &str = "SELECT {s}.announce($1, $2, $3, $4)";

/// `(token, name, idle limit)` -> one row while the lease holds, whose entry row it then locks
/// `FOR KEY SHARE` until the transaction ends: a takeover's delete waits for that, renewals
/// (non-key updates) do not. Bounds the transaction's idle time (a guarded transaction left
/// open would hold the queue).
pub const GUARD: &str = "SELECT set_config('idle_in_transaction_session_timeout', $3, true) \
     FROM {s}.entry \
     WHERE seq = $1 AND name = $2 AND granted AND expires_at > clock_timestamp() \
     FOR KEY SHARE";

/// `(secrets, ttls ms)` -> one row: the 1-based positions in `secrets` renewed (one array, not
/// a row per lease: a batch of 100 000 leases would otherwise come back as 100 000 rows each
/// allocated on its own, every tick). One statement for a whole batch. Only a live grant is
/// renewed (never an expired or a waiting entry); a non-key column, so a guarded transaction's
/// `FOR KEY SHARE` does not hold it up. Committed durably: a renewal lost in a crash would let
/// the entry expire before its holder's deadline.
pub const RENEW: &str = "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true)), \
     renewed AS (UPDATE {s}.entry e \
     SET expires_at = clock_timestamp() + u.ttl * interval '1 millisecond' \
     FROM durable, unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(secret, ttl, at) \
     WHERE e.secret = u.secret AND e.granted AND e.expires_at > clock_timestamp() \
     RETURNING u.at) \
     SELECT coalesce(array_agg(at), '{}') FROM renewed";

/// Deletes entries of any name that expired over a minute ago (at most 1000 a call): a name
/// nobody calls again would keep them. Without the name's lock: an expired entry binds nobody,
/// and the waiters it admits re-check within a second.
pub const SWEEP: &str = "DELETE FROM {s}.entry WHERE seq IN (SELECT seq FROM {s}.entry \
     WHERE expires_at < clock_timestamp() - interval '1 minute' LIMIT 1000 FOR UPDATE SKIP LOCKED)";

/// `(name)` -> the live entries in queue order: seq, limit, granted, holder, ms left, value.
/// Read-only: expired entries are skipped, not deleted.
pub const ENTRIES: &str = "SELECT seq, lim, granted, holder, \
     ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint, value \
     FROM {s}.entry WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY seq";

/// What decides the grade, read at connect: recovery (a standby), the durability settings, the
/// streaming standbys and whether any is synchronous.
pub const SERVER_FACTS: &str = "SELECT pg_is_in_recovery(), current_setting('fsync'), \
     current_setting('full_page_writes'), (SELECT count(*) FROM pg_stat_replication), \
     current_setting('synchronous_standby_names')";

/// `(name)` -> the channel observers of that election LISTEN on.
pub const LEADER_CHANNEL: &str = "SELECT {s}.leader_channel($1)";

/// A client's wake-up channel: its admitted waiters are told there (payload: the secret).
pub fn client_channel(schema: &str, client: &str) -> String {
    format!("{schema}_c_{client}")
}

/// The layout's SQL for `schema`.
pub fn in_schema(sql: &str, schema: &str) -> String {
    sql.replace("{s}", schema)
        .replace("{version}", &VERSION.to_string())
        .replace("{class}", &CLASS.to_string())
        .replace("{nobitmap}", "SET enable_bitmapscan = off")
}
