//! `librdma_intercept.so`: RDMA resource quotas for *unmodified* libibverbs
//! programs, through `LD_PRELOAD`.
//!
//! ```text
//! rdma-collector --socket /run/rdma-monitor/collector.sock --limit QP_COUNT=64 &
//! LD_PRELOAD=librdma_intercept.so ibv_rc_pingpong -d rxe-a -g 1
//! ```
//!
//! The object exports `ibv_create_qp`, `ibv_destroy_qp`, `ibv_alloc_pd`,
//! `ibv_dealloc_pd`, `ibv_create_cq`, `ibv_destroy_cq`, `ibv_reg_mr`,
//! `ibv_reg_mr_iova`, `ibv_reg_mr_iova2`, `ibv_reg_dmabuf_mr` and
//! `ibv_dereg_mr`. Before a creation it asks the collector daemon (the
//! `rdma-collector` crate and binary) over a Unix socket; a refused creation
//! returns NULL with `errno = EDQUOT` and prints one line to stderr:
//!
//! ```text
//! rdma-intercept: QP_CREATE refused: QP_COUNT limit 1 reached globally (1 live)
//! ```
//!
//! A refused *rate* (a verb's calls-per-second limit) comes with the time the
//! limit admits again (protocol version 2); until then the interceptor
//! refuses that verb itself, with the same `errno = EDQUOT`, without asking
//! the collector and without printing, so a program retrying in a loop costs
//! the collector a few requests per admitted call instead of one per
//! refusal. With a version 3 collector (the interceptor says `HELLO ...;
//! protocol=3` on each connection) the admission that fills a rate limit
//! already says how long it stays full, so even the first refusal after it
//! is answered here (with one line on stderr saying why): per admitted call
//! the collector serves its `ADMIT` and, in the same write as the next one,
//! its `RELEASE`. With `RDMA_INTERCEPT_ON_LIMIT=wait` the call sleeps until
//! then instead ([`limit`]).
//!
//! Destructions are never refused; they give the resource's ticket back.
//! When the process exits (or crashes), the collector sees its connection
//! close and releases all its tickets.
//!
//! Modules, in reading order:
//! - [`intercept`]: what the hooks decide (admission, the object → ticket
//!   table, fork, connection loss), as plain data tested without RDMA;
//! - [`limit`]: remembered rate refusals and the wait logic, pure and
//!   clock-injected;
//! - [`client`]: the blocking collector connection, on raw `libc` calls;
//! - [`hooks`]: the exported `ibv_*` functions that shadow libibverbs.
//!
//! Its only dependencies are `libc` and `rdma-quota` (for the verbs and the
//! wire protocol): the object is loaded into arbitrary programs, so it
//! brings no runtime and starts no threads.
//!
//! # Environment
//!
//! - `RDMA_COLLECTOR`: the collector's socket (default
//!   [`rdma_quota::wire::DEFAULT_SOCKET`]).
//! - `RDMA_INTERCEPT_FAIL`: `closed` (default) refuses creations when the
//!   collector cannot be asked (`errno = EACCES`, one stderr line per
//!   refusal); `open` lets them through uncounted after a one-time warning.
//! - `RDMA_INTERCEPT_ON_LIMIT`: what a creation refused by a rate limit does.
//!   `fail` (default) returns NULL with `errno = EDQUOT` at once, as before
//!   this setting existed: programs that handle the refusal keep working and
//!   no call blocks that never blocked. `wait` sleeps until the limit admits
//!   again, then asks; a refusal that says no time (a count or byte limit,
//!   which ends with a destruction no clock predicts, or a collector older
//!   than protocol version 2) fails at once as in `fail` mode.
//! - `RDMA_INTERCEPT_MAX_WAIT_MS`: the longest one call waits in `wait` mode,
//!   across repeated refusals (default 2000, at most 60000); a call whose
//!   next token is further away fails with `EDQUOT` at once. Only creating
//!   hooks wait, with the interceptor's lock released and before libibverbs
//!   is entered, so no verbs lock is held while sleeping; destroys never
//!   wait, so a program freeing resources is never held up. A thread that
//!   holds its *own* lock across a creation holds it while waiting, at most
//!   this long.
//!
//! # Protocol
//!
//! See [`rdma_quota::wire`], the one definition both sides use: line-based
//! UTF-8, one request and one reply at a time, lines of at most 512 bytes.
//! The collector identifies the client by `SO_PEERCRED`, never by anything
//! the client says.
//!
//! # What it cannot stop
//!
//! `LD_PRELOAD` only shadows symbols that are bound through the dynamic
//! linker's global scope. A program gets around it by not being dynamically
//! linked that way: a static libibverbs, `dlopen("libibverbs.so.1",
//! RTLD_LOCAL)` + `dlsym(handle, ...)` (as the `sideway` crate does), the
//! inline `ibv_create_qp_ex` / `ibv_create_cq_ex` (which call the provider
//! through function pointers), raw `ioctl`s on `/dev/infiniband/uverbs*`,
//! unsetting `LD_PRELOAD`, or a setuid program (the loader ignores it). It
//! can also lie to the collector, e.g. send `RELEASE` for live resources.
//! This layer gives quotas with clear errors to cooperating programs; the
//! kernel's rdma cgroup controller is the boundary against hostile ones.

pub mod client;
pub mod hooks;
pub mod intercept;
pub mod limit;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
