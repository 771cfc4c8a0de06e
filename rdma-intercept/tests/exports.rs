//! The shared object exports exactly the hooks, unversioned (so they bind for
//! any `@IBVERBS_1.x` import), and does not pull libibverbs in itself.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

const HOOKS: [&str; 11] = [
    "ibv_alloc_pd",
    "ibv_create_cq",
    "ibv_create_qp",
    "ibv_dealloc_pd",
    "ibv_dereg_mr",
    "ibv_destroy_cq",
    "ibv_destroy_qp",
    "ibv_reg_dmabuf_mr",
    "ibv_reg_mr",
    "ibv_reg_mr_iova",
    "ibv_reg_mr_iova2",
];

fn objdump(args: &[&str]) -> String {
    let so = common::cdylib();
    let out = Command::new("objdump")
        .args(args)
        .arg(&so)
        .output()
        .unwrap_or_else(|e| panic!("running objdump (binutils) on {}: {e}", so.display()));
    assert!(
        out.status.success(),
        "objdump {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn exports_exactly_the_hooks() {
    let table = objdump(&["-T"]);
    // Lines look like: "000000000002b5a0 g    DF .text  0000000000000113  Base   ibv_create_cq".
    let defined: Vec<(&str, &str)> = table
        .lines()
        .filter(|l| l.contains(" g ") && l.contains(".text"))
        .filter_map(|l| {
            let mut fields = l.split_whitespace().rev();
            let name = fields.next()?;
            let version = fields.next()?;
            Some((name, version))
        })
        .collect();
    let names: BTreeSet<&str> = defined.iter().map(|(n, _)| *n).collect();
    let expected: BTreeSet<&str> = HOOKS.into_iter().collect();
    assert_eq!(names, expected, "dynamic symbol table:\n{table}");
    for (name, version) in defined {
        assert_eq!(version, "Base", "{name} should be unversioned:\n{table}");
    }
}

#[test]
fn depends_on_libc_only() {
    let headers = objdump(&["-p"]);
    let needed: Vec<&str> = headers
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED"))
        .map(str::trim)
        .collect();
    assert!(needed.contains(&"libc.so.6"), "{needed:?}");
    // Linking libibverbs would load it before the program's own copy and
    // change what RTLD_NEXT finds; libgcc_s is Rust's unwinder.
    for lib in &needed {
        assert!(
            ["libc.so.6", "libgcc_s.so.1"].contains(lib) || lib.starts_with("ld-linux"),
            "unexpected dependency {lib} in {needed:?}"
        );
    }
}
