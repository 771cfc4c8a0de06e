//! The start of the host tests of a host *without* RDMA (the quick start's premise; the lab VM
//! has rxe): `secure-rdma-server/tests/no_rdma_device.rs` and
//! `secure-rdma-client/tests/no_rdma_device.rs`.

use std::path::PathBuf;

use secure_rdma::verbs::{Availability, Device};

/// A host without RDMA and a certificate directory for a server on localhost (127.0.0.1) with
/// the client `alice`; the files are removed when `dir` is dropped.
pub struct NoRdma {
    /// Why this host has no RDMA, as the server and client say it.
    pub availability: Availability,
    /// The certificate directory (`ca.pem`, `server.pem`, `alice.pem`, …).
    pub certs: PathBuf,
    /// The temporary directory that holds `certs`: keep it as long as the files are used.
    pub dir: tempfile::TempDir,
}

impl NoRdma {
    /// The setup, or `None` (and a "skipped" line) on a host that has RDMA, where what these
    /// tests check cannot happen.
    pub fn setup() -> Option<NoRdma> {
        let availability = Device::availability();
        if availability.is_available() {
            eprintln!("skipped: this host has RDMA ({availability})");
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        secure_rdma::certs::init(&certs, &["localhost".into(), "127.0.0.1".into()]).expect("certs");
        secure_rdma::certs::issue_client(&certs, "alice").expect("client cert");
        Some(NoRdma {
            availability,
            certs,
            dir,
        })
    }
}
