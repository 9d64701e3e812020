//! Backend URLs: the one grammar with which every backend crate reads its own schemes and
//! options, `scheme://[user[:password]@]host:port[,host:port...][/path][?name=value&...]`.
//!
//! A backend crate declares its schemes and turns a [`BackendUrl`] into its own options; the
//! `distlock` facade picks the crate by scheme. Every error is a
//! [`LockError::InvalidConfig`] that names the key (`<where>.options.<name>` for an option) and
//! the value, with passwords hidden.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{LockError, Result};

/// A parsed backend URL whose options are taken one by one; [`BackendUrl::finish`] refuses the
/// ones nobody took. Its `Debug` shows no password (of the authority or a `password` option).
pub struct BackendUrl {
    /// The scheme (`redis`, `etcd+tls`, ...).
    pub scheme: String,
    /// `user` and `password` of the authority, if given.
    pub user: Option<(String, String)>,
    /// The authority after the user part: `host:port[,host:port...]`, as written.
    pub hosts: String,
    /// The path, with its leading `/` (empty when absent).
    pub path: String,
    /// The URL up to its query string.
    pub base: String,
    options: BTreeMap<String, String>,
    /// Where the URL came from (`url`, `backends.main.url`), for errors.
    key: String,
    options_key: String,
    redacted: String,
}

fn invalid(
    key: impl Into<String>,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> LockError {
    LockError::InvalidConfig {
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// Parses a duration as operators write it (`500ms`, `10s`, `2m`, `1h30m`, `1h 30m`: the
/// `humantime` forms), or a bare number of seconds. Zero and negatives are errors.
///
/// # Errors
/// [`LockError::InvalidConfig`] naming `key` and `value`.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration> {
    match parse_wait(key, value)? {
        d if d.is_zero() => Err(invalid(key, value, "must be above zero")),
        d => Ok(d),
    }
}

/// [`parse_duration`] for a wait, where zero is meaningful (try once, as `flock -w 0`).
///
/// # Errors
/// [`LockError::InvalidConfig`] naming `key` and `value`.
pub fn parse_wait(key: &str, value: &str) -> Result<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| invalid(key, value, "too large"));
    }
    humantime::parse_duration(v).map_err(|e| {
        invalid(
            key,
            value,
            format!("not a duration ({e}); use e.g. 500ms, 10s, 2m, 1h30m"),
        )
    })
}

/// The value of option `name` as an error may show it: a password never.
fn hidden(name: &str, value: String) -> String {
    if name.contains("password") {
        "<redacted>".to_string()
    } else {
        value
    }
}

/// Hides the password of `scheme://user:password@...` and of a `password=` query parameter.
pub fn redact(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let end = out[start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| start + i);
        if let Some(at) = out[start..end].rfind('@').map(|i| start + i)
            && let Some(colon) = out[start..at].find(':').map(|i| start + i)
        {
            out.replace_range(colon + 1..at, "<redacted>");
        }
    }
    // Every `password=`, not only the first (found by the generated-input tests: a repeated
    // option showed its second value).
    let mut from = 0;
    while let Some(p) = out[from..].find("password=").map(|i| from + i) {
        let end = out[p..].find('&').map_or(out.len(), |i| p + i);
        out.replace_range(p + 9..end, "<redacted>");
        from = p + 9 + "<redacted>".len();
    }
    out
}

impl std::fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options: BTreeMap<&String, &str> = self
            .options
            .iter()
            .map(|(k, v)| {
                let v = if k.contains("password") {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k, v)
            })
            .collect();
        f.debug_struct("BackendUrl")
            .field("url", &self.redacted)
            .field("scheme", &self.scheme)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("options", &options)
            .field("key", &self.key)
            .finish()
    }
}

impl BackendUrl {
    /// Parses `url`; `table` options (from a configuration table) override query parameters of
    /// the same name. `key` names where the URL came from.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming `key` when `url` is not `scheme://...`.
    pub fn parse(key: &str, url: &str, table: &BTreeMap<String, String>) -> Result<Self> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid(key, redact(url), "not a URL: expected scheme://..."))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((info, hosts)) => {
                let (u, p) = info.split_once(':').unwrap_or((info, ""));
                (Some((u.to_string(), p.to_string())), hosts)
            }
            None => (None, authority),
        };
        let mut options = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            options.insert(k.to_string(), v.to_string());
        }
        options.extend(table.iter().map(|(k, v)| (k.clone(), v.clone())));
        let options_key = key
            .strip_suffix(".url")
            .map_or_else(|| format!("{key}.options"), |b| format!("{b}.options"));
        Ok(BackendUrl {
            scheme: scheme.to_string(),
            user,
            hosts: hosts.to_string(),
            path: path.to_string(),
            base: url.split_once('?').map_or(url, |(b, _)| b).to_string(),
            options,
            key: key.to_string(),
            options_key,
            redacted: redact(url),
        })
    }

    /// The error for the URL as a whole, naming where it came from (password hidden).
    pub fn invalid(&self, reason: impl Into<String>) -> LockError {
        invalid(&self.key, &self.redacted, reason)
    }

    /// The error for option `name` with `value`.
    pub fn invalid_option(
        &self,
        name: &str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> LockError {
        invalid(
            format!("{}.{name}", self.options_key),
            hidden(name, value.into()),
            reason,
        )
    }

    /// Takes option `name`, if given.
    pub fn take(&mut self, name: &str) -> Option<String> {
        self.options.remove(name)
    }

    /// Sets `field` from the duration option `name`, if given.
    ///
    /// # Errors
    /// A malformed, zero or negative duration.
    pub fn take_duration(&mut self, name: &str, field: &mut Duration) -> Result<()> {
        if let Some(v) = self.options.remove(name) {
            *field = parse_duration(&format!("{}.{name}", self.options_key), &v)?;
        }
        Ok(())
    }

    /// Sets `field` from option `name`, if given, parsed as `T` and accepted by `valid`;
    /// `what` says what is expected.
    ///
    /// # Errors
    /// A value that does not parse or is refused by `valid`.
    pub fn take_parsed<T: FromStr>(
        &mut self,
        name: &str,
        what: &str,
        valid: impl Fn(&T) -> bool,
        field: &mut T,
    ) -> Result<()> {
        if let Some(v) = self.options.remove(name) {
            *field = v
                .parse::<T>()
                .ok()
                .filter(|x| valid(x))
                .ok_or_else(|| self.invalid_option(name, &v, what))?;
        }
        Ok(())
    }

    /// The `host:port` entries of the authority: at least one, each with a host and a port.
    ///
    /// # Errors
    /// An empty list or an entry that is not `host:port`.
    pub fn endpoints(&self) -> Result<Vec<String>> {
        let list: Vec<String> = self
            .hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(String::from)
            .collect();
        if list.is_empty() {
            return Err(self.invalid("empty endpoint list: give at least one host:port"));
        }
        for h in &list {
            let ok = h
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err(self.invalid(format!("endpoint {h:?} is not host:port")));
            }
        }
        Ok(list)
    }

    /// `user:password@` of the authority, or nothing.
    pub fn userinfo(&self) -> String {
        self.user
            .as_ref()
            .map_or(String::new(), |(u, p)| format!("{u}:{p}@"))
    }

    /// The TLS file options `ca`, `cert` and `key` (cert and key go together), read from disk:
    /// `(ca PEM, (cert PEM, key PEM))`.
    ///
    /// # Errors
    /// A file that cannot be read, or `cert` without `key` (or the reverse).
    #[allow(clippy::type_complexity)]
    pub fn take_tls_files(&mut self) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>)> {
        let read = |url: &Self, name: &str, path: &str| {
            std::fs::read(path)
                .map_err(|e| url.invalid_option(name, path, format!("cannot read: {e}")))
        };
        let ca = match self.take("ca") {
            Some(p) => Some(read(self, "ca", &p)?),
            None => None,
        };
        let identity = match (self.take("cert"), self.take("key")) {
            (Some(c), Some(k)) => Some((read(self, "cert", &c)?, read(self, "key", &k)?)),
            (None, None) => None,
            (c, _) => {
                let missing = if c.is_some() { "key" } else { "cert" };
                return Err(self.invalid_option(missing, "", "cert and key go together"));
            }
        };
        Ok((ca, identity))
    }

    /// Ends parsing: an option nobody took is an error, like an unknown key.
    ///
    /// # Errors
    /// The first option left, named.
    pub fn finish(self) -> Result<()> {
        match self.options.into_iter().next() {
            Some((k, v)) => Err(invalid(
                format!("{}.{k}", self.options_key),
                hidden(&k, v),
                "unknown option for this backend",
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("k", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("k", "10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("k", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(
            parse_duration("k", "1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(parse_wait("k", "0").unwrap(), Duration::ZERO);
        for bad in ["0s", "0", "-5s", "abc", "5 parsecs", ""] {
            assert!(parse_duration("k", bad).is_err(), "{bad}");
        }
    }

    /// Shrunk cases the generated-input tests found (`tests/generated.rs`), kept as regressions.
    #[test]
    fn found_by_generated_inputs() {
        // A duration past what `Duration` holds panicked.
        assert!(parse_duration("k", "10000000000000000000000h").is_err());
        // `Debug` of a parsed URL showed the authority's password.
        let u = BackendUrl::parse("url", "://a:aaAAaA0a@", &BTreeMap::new()).unwrap();
        assert!(!format!("{u:?}").contains("aaAAaA0a"));
        // An unknown `password` option's error showed its value.
        let u =
            BackendUrl::parse("url", "memory://?password=Pz7qXk9wVt", &BTreeMap::new()).unwrap();
        assert!(!format!("{:?}", u.finish()).contains("Pz7qXk9wVt"));
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(
            redact("redis://u:hunter2@h:1/0"),
            "redis://u:<redacted>@h:1/0"
        );
        assert_eq!(
            redact("etcd://h:1?user=u&password=hunter2&x=1"),
            "etcd://h:1?user=u&password=<redacted>&x=1"
        );
        assert_eq!(redact("zk://h:1/app"), "zk://h:1/app");
        assert_eq!(
            redact("etcd://h:1?password=a&password=b"),
            "etcd://h:1?password=<redacted>&password=<redacted>"
        );
    }

    #[test]
    fn parts_options_and_leftovers() {
        let table = BTreeMap::from([("b".to_string(), "table".to_string())]);
        let mut u =
            BackendUrl::parse("backends.x.url", "s://u:p@h1:1,h2:2/path?a=1&b=2", &table).unwrap();
        assert_eq!(
            (u.scheme.as_str(), u.hosts.as_str(), u.path.as_str()),
            ("s", "h1:1,h2:2", "/path")
        );
        assert_eq!(u.base, "s://u:p@h1:1,h2:2/path");
        assert_eq!(u.endpoints().unwrap(), ["h1:1", "h2:2"]);
        assert_eq!(u.take("b").as_deref(), Some("table"));
        match u.finish() {
            Err(LockError::InvalidConfig { key, value, .. }) => {
                assert_eq!(
                    (key.as_str(), value.as_str()),
                    ("backends.x.options.a", "1")
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
