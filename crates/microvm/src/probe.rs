//! What this host can run: hardware KVM, a PVM-only `/dev/kvm` (stock guests do not run on
//! it), or only QEMU's software emulation (TCG).

use std::path::Path;

use crate::qemu::Accel;

/// The acceleration chosen for this host and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelReport {
    pub accel: Accel,
    pub reason: String,
}

/// Picks KVM when `/dev/kvm` opens and the CPU has VT-x/AMD-V, TCG otherwise.
pub fn detect() -> AccelReport {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let kvm_opens = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    decide(
        kvm_opens,
        &cpuinfo,
        Path::new("/sys/module/kvm_pvm").exists(),
    )
}

fn decide(kvm_opens: bool, cpuinfo: &str, pvm: bool) -> AccelReport {
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    let (accel, reason) = match (kvm_opens, hw, pvm) {
        (true, true, _) => (
            Accel::Kvm,
            "hardware KVM (/dev/kvm with VT-x/AMD-V)".to_owned(),
        ),
        (true, false, true) => (
            Accel::Tcg,
            "/dev/kvm is PVM (no VT-x/AMD-V; stock guest kernels do not run on it): using QEMU \
             TCG software emulation, which is for testing only"
                .to_owned(),
        ),
        (true, false, false) => (
            Accel::Tcg,
            "/dev/kvm opens but the CPU reports no VT-x/AMD-V: using QEMU TCG software \
             emulation, which is for testing only"
                .to_owned(),
        ),
        (false, _, _) => (
            Accel::Tcg,
            "no usable /dev/kvm: using QEMU TCG software emulation, which is for testing only"
                .to_owned(),
        ),
    };
    AccelReport { accel, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_only_with_hardware_virtualization() {
        let vmx = "flags\t\t: fpu vme vmx sse\n";
        assert_eq!(decide(true, vmx, false).accel, Accel::Kvm);
        let none = "flags\t\t: fpu vme sse\n";
        let pvm = decide(true, none, true);
        assert_eq!(pvm.accel, Accel::Tcg);
        assert!(pvm.reason.contains("PVM"), "{}", pvm.reason);
        assert_eq!(decide(false, vmx, false).accel, Accel::Tcg);
    }
}
