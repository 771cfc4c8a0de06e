//! Which kernel functions the monitor probes, and how their names are found in `/proc/kallsyms`.

use std::collections::BTreeMap;

use rdma_quota::Verb;

/// How a hook is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// kprobe + kretprobe on the same function: the verb is counted at return.
    Pair {
        enter: &'static str,
        exit: &'static str,
    },
    /// A lone kprobe.
    Entry(&'static str),
    /// A tracepoint `category:name`.
    Tracepoint {
        program: &'static str,
        category: &'static str,
        name: &'static str,
    },
}

impl Probe {
    /// The `kind` string of an [`super::AttachReport`].
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Probe::Pair { .. } => "kprobe+kretprobe",
            Probe::Entry(_) => "kprobe",
            Probe::Tracepoint { .. } => "tracepoint",
        }
    }
}

/// One hook point.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hook {
    /// Kernel function (or `category:name` for a tracepoint).
    pub target: &'static str,
    /// Module that defines it (for error messages).
    pub module: &'static str,
    /// Verbs counted there (empty: live-object bookkeeping).
    pub verbs: &'static [Verb],
    pub probe: Probe,
}

const fn pair(enter: &'static str, exit: &'static str) -> Probe {
    Probe::Pair { enter, exit }
}

const QP_CREATE: Probe = pair("mon_qp_create_enter", "mon_qp_create_exit");
const QP_MODIFY: Probe = pair("mon_qp_modify_enter", "mon_qp_modify_exit");
const QP_DESTROY: Probe = pair("mon_qp_destroy_enter", "mon_qp_destroy_exit");
const PD_ALLOC: Probe = pair("mon_pd_alloc_enter", "mon_pd_alloc_exit");
const CTX_OPEN: Probe = pair("mon_ctx_open_enter", "mon_ctx_open_exit");
const PD_DEALLOC: Probe = pair("mon_pd_dealloc_enter", "mon_pd_dealloc_exit");
const CQ_CREATE: Probe = pair("mon_cq_create_enter", "mon_cq_create_exit");
const CQ_DESTROY: Probe = pair("mon_cq_destroy_enter", "mon_cq_destroy_exit");
const MR_REG: Probe = pair("mon_mr_reg_enter", "mon_mr_reg_exit");
const MR_DEREG: Probe = pair("mon_mr_dereg_enter", "mon_mr_dereg_exit");
const IOCTL: Probe = pair("mon_ioctl_enter", "mon_ioctl_exit");

const fn hook(
    target: &'static str,
    module: &'static str,
    verbs: &'static [Verb],
    probe: Probe,
) -> Hook {
    Hook {
        target,
        module,
        verbs,
        probe,
    }
}

/// Every hook, in report order (see `bpf/monitor.bpf.c` for why each). The user paths of one
/// verb are disjoint (no listed function calls another listed function for the same verb), so
/// each user call is counted once.
pub(crate) const HOOKS: &[Hook] = &[
    // ioctl methods: creates are counted at the dispatch, because the uobject of a create is
    // allocated (and charged to the rdma cgroup) before the method's handler runs.
    hook(
        "ib_uverbs_ioctl",
        "ib_uverbs",
        &[Verb::QpCreate, Verb::CqCreate, Verb::MrReg, Verb::GidQuery],
        IOCTL,
    ),
    // write() commands (and ioctl INVOKE_WRITE): their handlers allocate the uobject.
    hook(
        "ib_uverbs_create_qp",
        "ib_uverbs",
        &[Verb::QpCreate],
        QP_CREATE,
    ),
    hook(
        "ib_uverbs_ex_create_qp",
        "ib_uverbs",
        &[Verb::QpCreate],
        QP_CREATE,
    ),
    hook(
        "ib_uverbs_alloc_pd",
        "ib_uverbs",
        &[Verb::PdAlloc],
        PD_ALLOC,
    ),
    hook(
        "ib_uverbs_create_cq",
        "ib_uverbs",
        &[Verb::CqCreate],
        CQ_CREATE,
    ),
    hook(
        "ib_uverbs_ex_create_cq",
        "ib_uverbs",
        &[Verb::CqCreate],
        CQ_CREATE,
    ),
    hook("ib_uverbs_reg_mr", "ib_uverbs", &[Verb::MrReg], MR_REG),
    // Both paths of ibv_open_device (write GET_CONTEXT, ioctl DEVICE/GET_CONTEXT) call it.
    hook("ib_init_ucontext", "ib_uverbs", &[Verb::CtxOpen], CTX_OPEN),
    // ib_core functions reached from every user path (udata != NULL).
    hook(
        "ib_modify_qp_with_udata",
        "ib_core",
        &[Verb::QpModify],
        QP_MODIFY,
    ),
    hook(
        "ib_destroy_qp_user",
        "ib_core",
        &[Verb::QpDestroy],
        QP_DESTROY,
    ),
    hook(
        "ib_dealloc_pd_user",
        "ib_core",
        &[Verb::PdDealloc],
        PD_DEALLOC,
    ),
    hook(
        "ib_destroy_cq_user",
        "ib_core",
        &[Verb::CqDestroy],
        CQ_DESTROY,
    ),
    hook("ib_dereg_mr_user", "ib_core", &[Verb::MrDereg], MR_DEREG),
    hook(
        "rdma_cma:cm_send_req",
        "rdma_cm",
        &[Verb::CmSendReq],
        Probe::Tracepoint {
            program: "mon_cm_send_req",
            category: "rdma_cma",
            name: "cm_send_req",
        },
    ),
    hook(
        "rdma_restrack_add",
        "ib_core",
        &[],
        Probe::Entry("mon_restrack_add"),
    ),
];

/// Maps each wanted function name to the symbol to probe, from `/proc/kallsyms` text.
///
/// An exact text-symbol match wins; otherwise a compiler clone (`name.isra.0`,
/// `name.constprop.0`, ...) is used, because such a clone is the only copy the kernel calls.
/// `name.cold` fragments are never chosen. Names not found are absent from the result.
pub(crate) fn resolve_symbols(kallsyms: &str, wanted: &[&str]) -> BTreeMap<String, String> {
    let mut found: BTreeMap<String, String> = BTreeMap::new();
    for line in kallsyms.lines() {
        let mut cols = line.split_whitespace();
        let (Some(_addr), Some(ty), Some(sym)) = (cols.next(), cols.next(), cols.next()) else {
            continue;
        };
        if !matches!(ty, "t" | "T") {
            continue;
        }
        let (base, suffix) = match sym.split_once('.') {
            Some((b, s)) => (b, Some(s)),
            None => (sym, None),
        };
        if !wanted.contains(&base) {
            continue;
        }
        match suffix {
            None => {
                found.insert(base.to_owned(), sym.to_owned());
            }
            Some(s) if !s.starts_with("cold") && !s.contains(".cold") => {
                found
                    .entry(base.to_owned())
                    .or_insert_with(|| sym.to_owned());
            }
            Some(_) => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_symbols_win_over_clones_and_cold_parts_are_ignored() {
        let text = "\
ffffffffc0a01000 t _ib_modify_qp.cold\t[ib_core]
ffffffffc0a02000 T ib_create_qp_user\t[ib_core]
ffffffffc0a03000 t ib_uverbs_alloc_pd.isra.0\t[ib_uverbs]
ffffffffc0a03100 t ib_uverbs_alloc_pd\t[ib_uverbs]
ffffffffc0a04000 t ib_uverbs_create_cq.constprop.0\t[ib_uverbs]
ffffffffc0a05000 t ib_dereg_mr_user.cold\t[ib_core]
ffffffffc0a06000 r ib_uverbs_method_UVERBS_METHOD_CQ_CREATE\t[ib_uverbs]
ffffffffc0a06000 d ib_destroy_qp_user\t[ib_core]
garbage
";
        let got = resolve_symbols(
            text,
            &[
                "ib_create_qp_user",
                "ib_uverbs_alloc_pd",
                "ib_uverbs_create_cq",
                "ib_dereg_mr_user",
                "ib_destroy_qp_user",
                "_ib_modify_qp",
            ],
        );
        assert_eq!(got["ib_create_qp_user"], "ib_create_qp_user");
        assert_eq!(got["ib_uverbs_alloc_pd"], "ib_uverbs_alloc_pd");
        assert_eq!(
            got["ib_uverbs_create_cq"],
            "ib_uverbs_create_cq.constprop.0"
        );
        assert!(!got.contains_key("ib_dereg_mr_user"));
        assert!(!got.contains_key("ib_destroy_qp_user")); // data symbol
        assert!(!got.contains_key("_ib_modify_qp"));
    }

    #[test]
    fn every_verb_has_a_hook() {
        for verb in Verb::ALL {
            assert!(
                HOOKS.iter().any(|h| h.verbs.contains(&verb)),
                "{verb} has no hook"
            );
        }
        let mut targets: Vec<_> = HOOKS.iter().map(|h| h.target).collect();
        targets.sort_unstable();
        targets.dedup();
        assert_eq!(targets.len(), HOOKS.len(), "duplicate hook target");
    }
}
