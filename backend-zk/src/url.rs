//! The scheme this crate serves and its options, read from a [`BackendUrl`]:
//! `zk://[user:password@]h1:p1,h2:p2[/chroot]` (the credentials become a digest identity) with
//! `root`, `session_timeout`, `op_timeout`, `connect_timeout`, `on_disconnect=lose|wait:<d>` and
//! `acl=open|creator`, `layout=curator|kazoo` (whose node names, see [`crate::paths::Layout`]).

use distlock_api::Result;
use distlock_api::url::{BackendUrl, parse_duration};

use crate::config::{NodeAcl, OnDisconnect, ZkOptions};
use crate::paths::Layout;

/// Every option a `zk` URL (or a configuration table) takes; any other is refused.
pub const OPTIONS: &[&str] = &[
    "root",
    "session_timeout",
    "op_timeout",
    "connect_timeout",
    "on_disconnect",
    "acl",
    "layout",
];

/// The connect string (chroot included) and the options, from a `zk://` URL.
///
/// # Errors
/// `InvalidConfig` naming the option or the URL at fault.
pub fn from_url(url: &mut BackendUrl) -> Result<(String, ZkOptions)> {
    let mut o = ZkOptions::default();
    if let Some(v) = url.take("root") {
        o.root = v;
    }
    url.take_duration("session_timeout", &mut o.session_timeout)?;
    url.take_duration("op_timeout", &mut o.op_timeout)?;
    url.take_duration("connect_timeout", &mut o.connect_timeout)?;
    if let Some(v) = url.take("on_disconnect") {
        o.on_disconnect = match v.as_str() {
            "lose" => OnDisconnect::Lose,
            w if w.starts_with("wait:") => {
                OnDisconnect::WaitUpTo(parse_duration("on_disconnect", &w[5..]).map_err(|_| {
                    url.invalid_option("on_disconnect", &v, "use lose or wait:<duration>")
                })?)
            }
            _ => {
                return Err(url.invalid_option("on_disconnect", &v, "use lose or wait:<duration>"));
            }
        };
    }
    if let Some(v) = url.take("acl") {
        o.acl = match v.as_str() {
            "open" => NodeAcl::Open,
            "creator" => NodeAcl::CreatorOnly,
            _ => return Err(url.invalid_option("acl", &v, "use open or creator")),
        };
    }
    if let Some(v) = url.take("layout") {
        o.layout = match v.as_str() {
            "curator" => Layout::Curator,
            "kazoo" => Layout::Kazoo,
            _ => return Err(url.invalid_option("layout", &v, "use curator or kazoo")),
        };
    }
    o.digest = url.user.as_ref().map(|(u, p)| format!("{u}:{p}"));
    let hosts = url.endpoints()?.join(",");
    let chroot = url.path.trim_end_matches('/');
    Ok((format!("{hosts}{chroot}"), o))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use distlock_api::LockError;

    use super::*;

    /// [`OPTIONS`] is exactly what [`from_url`] takes.
    #[test]
    fn the_option_list_is_what_the_reader_takes() {
        for name in OPTIONS.iter().chain(&["colour"]) {
            let mut url = BackendUrl::parse(
                "url",
                &format!("zk://127.0.0.1:1?{name}=x"),
                &BTreeMap::new(),
            )
            .expect("parses");
            let unknown = match from_url(&mut url).map(drop).and_then(|()| url.finish()) {
                Err(LockError::InvalidConfig { reason, .. }) => reason.contains("unknown option"),
                _ => false,
            };
            assert_eq!(unknown, *name == "colour", "{name}");
        }
    }

    #[test]
    fn the_layout_is_curator_or_kazoo_and_nothing_else() {
        let read = |q: &str| {
            let mut url =
                BackendUrl::parse("url", &format!("zk://127.0.0.1:1?{q}"), &BTreeMap::new())
                    .expect("parses");
            from_url(&mut url).map(|(_, o)| o.layout)
        };
        assert_eq!(read("").expect("default"), Layout::Curator);
        assert_eq!(read("layout=kazoo").expect("kazoo"), Layout::Kazoo);
        assert!(matches!(
            read("layout=redis-py"),
            Err(LockError::InvalidConfig { key, value, .. }) if key.contains("layout") && value == "redis-py"
        ));
    }
}
