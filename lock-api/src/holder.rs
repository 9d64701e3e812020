//! Who holds an entry: host, process id, command and since when, written by every backend with
//! each lock key, queue entry and shared holder, so that [`crate::LockBackend::inspect`] (and
//! `distlock status`) can say who holds a name, from any process.
//!
//! In entry data it is one segment, `~<since ms>,<pid>,<host>,<command>`, after the owner secret
//! and limit and before an announced value: host and command are percent-encoded so the segment
//! holds no `:`, `#`, `~` or `,` (the separators of the entry grammar) and stays ASCII.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// What a holder's command is cut to in its entry (bytes): entries are read on every inspect and
/// every observer's read of an election.
pub const MAX_COMMAND_BYTES: usize = 256;

/// The longest host name written (POSIX `HOST_NAME_MAX`).
const MAX_HOST_BYTES: usize = 255;

/// Everything the entry grammar uses as a separator, and `%` itself.
const ESCAPED: &AsciiSet = &CONTROLS
    .add(b'%')
    .add(b':')
    .add(b'#')
    .add(b'~')
    .add(b',')
    .add(b' ');

/// The command this process is described as, when set ([`describe_process`]).
static COMMAND: RwLock<Option<Arc<str>>> = RwLock::new(None);

/// Who holds an entry, as its holder wrote it. Host and command are shared strings: this
/// process's are allocated once and shared by every lease it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's host name.
    pub host: Arc<str>,
    /// The holder's process id on that host.
    pub pid: u32,
    /// What the process runs: its executable's name, or what it described itself as
    /// ([`describe_process`]; `distlock run` says the command it runs). At most
    /// [`MAX_COMMAND_BYTES`].
    pub command: Arc<str>,
    /// When the holder asked for the entry, by its own wall clock (millisecond precision).
    pub since: SystemTime,
}

/// Describes this process as running `command` in every entry it writes from now on (by
/// default its executable's name: arguments are left out, as they may carry secrets). Cut to
/// [`MAX_COMMAND_BYTES`].
pub fn describe_process(command: &str) {
    *COMMAND.write().unwrap_or_else(|p| p.into_inner()) =
        Some(cut(command, MAX_COMMAND_BYTES).into());
}

impl HolderInfo {
    /// This process, now.
    pub fn now() -> HolderInfo {
        // Asked of the system once: every acquire writes them.
        static HOST: OnceLock<Arc<str>> = OnceLock::new();
        static EXECUTABLE: OnceLock<Arc<str>> = OnceLock::new();
        let command = COMMAND
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| EXECUTABLE.get_or_init(|| executable().into()).clone());
        HolderInfo {
            host: HOST
                .get_or_init(|| cut(&host_name(), MAX_HOST_BYTES).into())
                .clone(),
            pid: std::process::id(),
            command,
            // Whole milliseconds: what the entry keeps.
            since: UNIX_EPOCH + Duration::from_millis(millis(SystemTime::now())),
        }
    }

    /// The entry segment, `~<since ms>,<pid>,<host>,<command>`: after the owner secret and limit,
    /// before an announced value; host and command percent-encoded, so it holds no `:`, `#`,
    /// `~` or `,` of its own and stays ASCII.
    pub fn segment(&self) -> String {
        format!(
            "~{},{},{},{}",
            millis(self.since),
            self.pid,
            utf8_percent_encode(&self.host, ESCAPED),
            utf8_percent_encode(&self.command, ESCAPED)
        )
    }

    /// The holder recorded in an entry's head (the entry data up to its announced value, if
    /// any): `None` when the head has no segment (an entry written by another language's recipe
    /// or an older version) or it does not parse.
    pub fn in_head(head: &[u8]) -> Option<HolderInfo> {
        let at = head.iter().position(|b| *b == b'~')?;
        let text = std::str::from_utf8(&head[at + 1..]).ok()?;
        let mut parts = text.splitn(4, ',');
        let since = UNIX_EPOCH + Duration::from_millis(parts.next()?.parse().ok()?);
        let pid = parts.next()?.parse().ok()?;
        let host = percent_decode_str(parts.next()?).decode_utf8().ok()?;
        let command = percent_decode_str(parts.next()?).decode_utf8().ok()?;
        Some(HolderInfo {
            host: host.into(),
            pid,
            command: command.into(),
            since,
        })
    }

    /// The holder recorded in entry data `<secret>[#<limit>][~<holder>][:<value>]` (etcd's
    /// attempt keys, ZooKeeper's nodes, the memory store).
    pub fn in_entry(entry: &[u8]) -> Option<HolderInfo> {
        HolderInfo::in_head(head(entry))
    }
}

/// Entry data up to its announced value (the part before the first `:`).
pub(crate) fn head(entry: &[u8]) -> &[u8] {
    entry
        .iter()
        .position(|b| *b == b':')
        .map_or(entry, |at| &entry[..at])
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn host_name() -> String {
    let mut buf = [0u8; MAX_HOST_BYTES + 1];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

fn executable() -> String {
    let name = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| std::env::args().next())
        .unwrap_or_default();
    cut(&name, MAX_COMMAND_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_reads_back_whatever_the_host_and_command_hold() {
        let info = HolderInfo {
            host: "web-1:a#b~c,d é".into(),
            pid: 4242,
            command: "sh -c 'echo 50% : done, ~ok #1'".into(),
            since: UNIX_EPOCH + Duration::from_millis(1_764_000_000_123),
        };
        let seg = info.segment();
        assert!(seg.is_ascii(), "{seg}");
        assert!(!seg[1..].contains([':', '#', '~', ' ']), "{seg}");
        let entry = format!("00ff#3{seg}:announced:value~x");
        assert_eq!(HolderInfo::in_entry(entry.as_bytes()), Some(info.clone()));
        assert_eq!(crate::entry_limit(entry.as_bytes()), 3);
        assert!(crate::entry_written_by(
            format!("00ff{seg}").as_bytes(),
            "00ff"
        ));
    }

    #[test]
    fn an_entry_without_a_segment_has_no_holder() {
        assert_eq!(HolderInfo::in_entry(b"00ff#3"), None);
        // A `~` in an announced value is not a segment.
        assert_eq!(HolderInfo::in_entry(b"00ff:a~1,2,h,c"), None);
        assert_eq!(HolderInfo::in_entry(b"00ff~x,1,h,c"), None);
    }

    #[test]
    fn a_long_command_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_COMMAND_BYTES);
        let c = cut(&long, MAX_COMMAND_BYTES);
        assert!(c.len() <= MAX_COMMAND_BYTES && c.len() >= MAX_COMMAND_BYTES - 1);
        let now = HolderInfo::now();
        assert_eq!(now.pid, std::process::id());
        assert!(!now.host.is_empty() && !now.command.is_empty());
    }
}
