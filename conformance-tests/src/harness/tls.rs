//! TLS material for the servers that serve it (etcd, redis): a throw-away CA and a server
//! certificate for 127.0.0.1, made with `openssl`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{HarnessError, require};

/// PEM files for serving TLS: the CA, and the server certificate and key it signed.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// CA certificate (for clients to trust).
    pub ca: PathBuf,
    /// Server certificate (valid for 127.0.0.1 and localhost).
    pub cert: PathBuf,
    /// Server private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// Makes a CA and a server certificate it signed, in `dir`.
    pub fn generate(dir: &Path) -> Result<Self, HarnessError> {
        require("/usr/bin/openssl", "openssl")?;

        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=distlock-test-ca",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        )?;
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
        )?;
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .map_err(|source| io("openssl", source))?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "san.ext",
                "-out",
                "server.pem",
            ],
        )?;
        Ok(TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        })
    }
}

fn io(server: &str, source: std::io::Error) -> HarnessError {
    HarnessError::Io {
        server: server.into(),
        source,
    }
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), HarnessError> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|source| io("openssl", source))?;
    if out.status.success() {
        return Ok(());
    }
    Err(io(
        "openssl",
        std::io::Error::other(format!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )),
    ))
}
