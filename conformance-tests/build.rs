//! Builds the clock shim (`shim/clock_shim.c`) into a shared library the harness preloads into a
//! server whose wall clock a test moves. A machine without a C compiler still builds the suite:
//! the harness then reports the shim as missing, naming the compiler's error, when a test asks
//! for it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "shim/clock_shim.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libdistlock_clock_shim.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(src)
        .output();
    let error = match built {
        Ok(o) if o.status.success() => String::new(),
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("{cc}: {e}"),
    };
    println!("cargo:rustc-env=DISTLOCK_CLOCK_SHIM={}", out.display());
    println!("cargo:rustc-env=DISTLOCK_CLOCK_SHIM_ERROR={error}");
}
