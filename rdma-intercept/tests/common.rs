//! Finds the artifacts `cargo test` built next to the test binary.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>/deps`, where cargo puts the test binary and, for the
/// tests of a `cdylib` crate, the freshly built shared object.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .expect("test binary has a directory")
        .to_path_buf()
}

/// The `LD_PRELOAD` object.
pub fn cdylib() -> PathBuf {
    let deps = deps_dir();
    let candidates = [
        deps.join("librdma_intercept.so"),
        deps.parent().unwrap_or(&deps).join("librdma_intercept.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("librdma_intercept.so not found at {candidates:?}"))
}

/// An example program of this crate (`cargo test` builds the examples).
pub fn example(name: &str) -> PathBuf {
    let deps = deps_dir();
    let path = deps.parent().unwrap_or(&deps).join("examples").join(name);
    assert!(
        path.exists(),
        "{} not built: run `cargo test -p rdma-intercept` (it builds the examples)",
        path.display()
    );
    path
}
