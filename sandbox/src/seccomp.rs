//! The seccomp filters a sandboxed command runs under: everything is allowed but the system
//! calls that reach past the sandbox (debugging other processes, mounting, loading kernel code,
//! new namespaces, keyrings, raw packets, Unix sockets that could reach the supervisor…), which
//! fail with `EPERM`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// System calls refused whatever their arguments: (name for Docker's profile, number).
pub const DENIED: &[(&str, libc::c_long)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("process_madvise", libc::SYS_process_madvise),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("kcmp", libc::SYS_kcmp),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("syslog", libc::SYS_syslog),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("personality", libc::SYS_personality),
    #[cfg(target_arch = "x86_64")]
    ("kexec_file_load", libc::SYS_kexec_file_load),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
];

/// Namespace flags `clone` may not carry.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).expect("argument index below 6")
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("at least one condition")
}

fn arch() -> Result<seccompiler::TargetArch, String> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|_| format!("seccomp: no filter for the {} architecture", std::env::consts::ARCH))
}

/// The filters, in the order they are installed: the first makes `clone3` look absent
/// (`ENOSYS`, so the C library falls back to `clone`, whose flags the second can inspect —
/// `clone3` passes them in memory, out of a filter's reach); the second refuses the rest.
pub fn filters() -> Result<Vec<BpfProgram>, String> {
    let arch = arch()?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    );

    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&(_, n)| (n, Vec::new())).collect();
    // clone with any namespace flag.
    rules.insert(
        libc::SYS_clone,
        NAMESPACE_FLAGS
            .iter()
            .map(|&f| rule(vec![cond(0, SeccompCmpOp::MaskedEq(f as u64), f as u64)]))
            .collect(),
    );
    // socket: only IPv4/IPv6 streams and datagrams (and only where a network exists at all);
    // no Unix sockets (the supervisor's sockets are files), netlink, packet or raw sockets.
    let not_inet = rule(vec![
        cond(0, SeccompCmpOp::Ne, libc::AF_INET as u64),
        cond(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64),
    ]);
    let raw = rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), libc::SOCK_RAW as u64)]);
    rules.insert(libc::SYS_socket, vec![not_inet, raw]);
    // ioctl(TIOCSTI) pushes input into a terminal; TIOCLINUX too.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI)]),
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX)]),
        ],
    );
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    );
    [clone3, deny]
        .into_iter()
        .map(|f| {
            let f = f.map_err(|e| format!("seccomp: {e}"))?;
            BpfProgram::try_from(f).map_err(|e| format!("seccomp: {e}"))
        })
        .collect()
}

/// The same rules as a Docker seccomp profile (JSON), for the Docker backend: the engine loads
/// it into the container instead of its default profile.
pub fn docker_profile() -> String {
    let errno = |names: Vec<&str>, args: serde_json::Value| serde_json::json!({"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM, "args": args});
    let mut rules = vec![errno(DENIED.iter().map(|(n, _)| *n).collect(), serde_json::json!([]))];
    rules.push(serde_json::json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS}));
    for f in NAMESPACE_FLAGS {
        let arg = serde_json::json!([{"index": 0, "value": *f as u64, "valueTwo": *f as u64, "op": "SCMP_CMP_MASKED_EQ"}]);
        rules.push(errno(vec!["clone"], arg));
    }
    for domain in [libc::AF_UNIX, libc::AF_NETLINK, libc::AF_PACKET] {
        let arg = serde_json::json!([{"index": 0, "value": domain, "op": "SCMP_CMP_EQ"}]);
        rules.push(errno(vec!["socket"], arg));
    }
    let raw = serde_json::json!([{"index": 1, "value": 0xf, "valueTwo": libc::SOCK_RAW, "op": "SCMP_CMP_MASKED_EQ"}]);
    rules.push(errno(vec!["socket"], raw));
    for req in [libc::TIOCSTI, libc::TIOCLINUX] {
        rules.push(errno(
            vec!["ioctl"],
            serde_json::json!([{"index": 1, "value": req, "op": "SCMP_CMP_EQ"}]),
        ));
    }
    serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filters_compile_for_this_machine() {
        let f = super::filters().unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|p| !p.is_empty()));
    }
}
