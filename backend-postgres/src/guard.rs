//! The guarded transaction: data kept in the same database is written only while the lease
//! holds. The guard locks the lease's entry row `FOR KEY SHARE` in the caller's transaction;
//! an entry is only ever ended by a delete, which waits for that lock, so no one else is
//! admitted before the transaction commits or rolls back, even if its holder is paused past
//! its TTL meanwhile. A transaction left idle longer than the lease's TTL is ended by the server
//! (`idle_in_transaction_session_timeout`), so it cannot hold the queue for ever.

use distlock_api::{Lease, LockError, Result};
use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

use crate::config::valid_schema;
use crate::sql;

/// The guard for a driver other than tokio-postgres: run `sql` with `$1` = `token` (bigint),
/// `$2` = `name` (text) and `$3` = `idle_limit` (text) inside the transaction that writes; one
/// row back means the lease holds (write, then commit), none that it does not (write nothing).
/// Or call `<schema>.assert_held(name, token)`, which raises SQLSTATE `DLK01` when it does not
/// (from a trigger, for example).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardStatement {
    /// The statement, in the lease's schema.
    pub sql: String,
    /// The lease's fencing token: its entry.
    pub token: i64,
    /// The lock name.
    pub name: String,
    /// The longest the transaction may stay idle (the lease's TTL, in milliseconds).
    pub idle_limit: String,
}

/// The guard of `lease`, for any driver.
///
/// # Errors
/// `Unsupported` for a lease that did not come from the PostgreSQL backend.
pub fn guard_statement(lease: &Lease) -> Result<GuardStatement> {
    let refused = || LockError::Unsupported {
        backend: "postgres",
        what: format!(
            "a guarded transaction for a lease of the {} backend",
            lease.backend()
        ),
    };
    if lease.backend() != "postgres" {
        return Err(refused());
    }
    // `<schema>.entry/<token>`, as the grant wrote it.
    let (schema, token) = lease
        .backend_key()
        .split_once(".entry/")
        .filter(|(schema, _)| valid_schema(schema))
        .and_then(|(schema, token)| Some((schema, token.parse::<i64>().ok()?)))
        .ok_or_else(refused)?;
    Ok(GuardStatement {
        sql: sql::in_schema(sql::GUARD, schema),
        token,
        name: lease.name().as_str().to_string(),
        idle_limit: lease.ttl().as_millis().max(1).to_string(),
    })
}

/// Checks in `txn` that `lease` still holds, and holds it until `txn` ends: `Ok(true)` means
/// write and commit (no one else can be admitted before the commit), `Ok(false)` that the lease
/// expired or was released (write nothing; roll back). Run it before the writes it guards, in
/// the same transaction (READ COMMITTED, PostgreSQL's default, is enough; under REPEATABLE READ
/// or SERIALIZABLE a changed entry raises a serialization failure: retry the transaction).
/// Commit before releasing the lease.
///
/// # Errors
/// `Unsupported` for a lease of another backend; the server's error otherwise.
pub async fn guard(txn: &Transaction<'_>, lease: &Lease) -> Result<bool> {
    let g = guard_statement(lease)?;
    let rows = txn
        .query_typed(
            &g.sql,
            &[
                (&g.token, Type::INT8),
                (&g.name, Type::TEXT),
                (&g.idle_limit, Type::TEXT),
            ],
        )
        .await
        .map_err(|e| LockError::backend("postgres", e.code().is_none(), e))?;
    Ok(!rows.is_empty())
}
