//! The README's runnable blocks, for the tests that run them as written: the quick start
//! (`tests/tests/quickstart.rs`) and "Bring your own PKI" (`secure-rdma-server/tests/byo_pki.rs`
//! on the host, `tests/tests/pki_lab.rs` on rxe). A block sits between `<!-- NAME -->` and
//! `<!-- /NAME -->` in `README.md`, inside a code fence.

use std::path::Path;
use std::process::Command;

/// The workspace's README.md.
pub fn readme() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    std::fs::read_to_string(root.join("README.md")).expect("README.md")
}

/// The block `name` of `readme` (between `<!-- name -->` and `<!-- /name -->`), its marker
/// line and code fences removed.
pub fn block_of(readme: &str, name: &str) -> String {
    let (open, close) = (format!("<!-- {name} -->"), format!("<!-- /{name} -->"));
    let start = readme
        .find(&open)
        .unwrap_or_else(|| panic!("README has a {open} block"));
    let end = readme[start..]
        .find(&close)
        .map(|e| start + e)
        .unwrap_or_else(|| panic!("README's {name} block ends with {close}"));
    readme[start..end]
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The README's block `name`.
pub fn block(name: &str) -> String {
    block_of(&readme(), name)
}

/// Runs `script` with `bash -euo pipefail` in `dir`; fails the test with its stderr if it fails.
pub fn sh(dir: &Path, script: &str) {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{script}\nfailed (is openssl installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's "Bring your own PKI" block run in a fresh directory: `ca.pem`/`ca.key`,
/// `server.pem`/`server.key` and the client `alice.pem`/`alice.key`, made by openssl.
pub fn byo_pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    sh(dir.path(), &block("byo-pki"));
    for f in [
        "ca.pem",
        "server.pem",
        "server.key",
        "alice.pem",
        "alice.key",
    ] {
        assert!(dir.path().join(f).exists(), "the README block made no {f}");
    }
    dir
}

/// Another client certificate from the README's CA in `dir`: `file.pem` and `file.key`, with
/// subject CN `cn` and `san` as its subjectAltName (e.g. `URI:spiffe://…`).
pub fn openssl_client(dir: &Path, file: &str, cn: &str, san: &str) {
    sh(
        dir,
        &format!(
            "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
               -keyout {file}.key -out {file}.csr -subj /CN={cn}
             printf '%s\\n' basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature \
               extendedKeyUsage=clientAuth 'subjectAltName={san}' > {file}.ext
             openssl x509 -req -in {file}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
               -extfile {file}.ext -out {file}.pem"
        ),
    );
}
