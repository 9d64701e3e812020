//! A try creates its node only where the policy admits it: the queue is read first (a `sync`
//! and the listing sent together, one round trip, so no follower's stale view), and a try that
//! is not admitted answers with nothing written. (Created, then deleted, a writer's refused try
//! stood in the queue for a round trip or two and turned other callers' tries away.) A try
//! whose view admits it then queues as an acquire does and is judged on the listing after its
//! create: an entry that came in between can still refuse it.
//!
//! A repeat try, right after this client released the name it held alone, skips the read (the
//! repeat grant, see `RepeatGrant`): another caller came in meanwhile only in a race.

use distlock_api::{Admission, LockError, LockName, Result};
use zookeeper_client::Error as ZkError;

use crate::client::{ZkBackend, is_zk};
use crate::session::Epoch;

impl ZkBackend {
    /// `Busy` (or `LimitMismatch`) unless `admission` admits an entry behind the queue of `dir`
    /// as it stands now.
    pub(crate) async fn admits_now(
        &self,
        epoch: &Epoch,
        dir: &str,
        name: &LockName,
        admission: Admission,
    ) -> Result<()> {
        let (synced, listed) = tokio::join!(
            self.call(epoch.client.sync(dir)),
            self.call(epoch.client.list_children(dir))
        );
        let children = match synced.and(listed) {
            Ok(c) => c,
            // No directory yet: nobody holds or waits.
            Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.layout().refuse_foreign(&children, name)?;
        let limits: Vec<u32> = children
            .iter()
            .map(|c| self.layout().node_limit(c))
            .collect();
        admission.check_ahead(name.as_str(), limits.iter().copied())?;
        if admission.admitted(limits) {
            Ok(())
        } else {
            Err(LockError::Busy {
                name: name.to_string(),
            })
        }
    }
}
