//! The QEMU command line of one sandbox VM: the `microvm` machine with direct kernel boot and
//! no firmware, PCI or ACPI; three virtio-blk disks (boot, template, writable), the agent's
//! virtio-serial port on a host Unix socket, virtio-rng, a virtio-net NIC on a host Unix socket
//! (the egress stack's end), QMP; QEMU's own seccomp filter.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Name of the virtio-serial port the agent serves its streams on.
pub const AGENT_PORT: &str = "bulkhead.agent";
/// The NIC's QEMU id (`set_link` and events name it).
pub const NIC: &str = "net0";
/// Host end of the NIC (QEMU listens): `<slot dir>/net.sock`, next to the agent's socket.
pub const NET_SOCKET: &str = "net.sock";
/// Path of the agent's Unix socket inside the guest.
pub const GUEST_AGENT_SOCKET: &str = "/run/bulkhead/agent.sock";

/// Size of TCG's translated-code cache, in MiB.
pub const TCG_TB_MB: u64 = 64;

/// How QEMU executes guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm` (VT-x / AMD-V).
    Kvm,
    /// QEMU's software emulation: works everywhere, slowly. For testing.
    Tcg,
}

/// Everything the command line depends on.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub kernel: PathBuf,
    pub boot_disk: PathBuf,
    pub root_disk: PathBuf,
    pub rw_disk: PathBuf,
    /// Host end of the agent's virtio-serial port (QEMU listens).
    pub agent_socket: PathBuf,
    pub qmp_socket: PathBuf,
    pub console_log: PathBuf,
    pub cpus: u32,
    pub memory_mb: u64,
    pub accel: Accel,
    pub agent_log: String,
    /// The host's wall clock when QEMU starts (the guest has no RTC; see the agent's guest
    /// mode).
    pub clock: std::time::Duration,
    /// Guest RAM on a file instead of anonymous memory (template snapshots and their clones).
    pub memory_file: Option<MemoryFile>,
    /// Wait for the device state over QMP (`-incoming defer`): a clone being restored.
    pub incoming: bool,
    /// The sandbox's process limit inside the guest (0: none); see the agent's `guest_limits`.
    pub pids_max: u64,
}

/// Guest RAM mapped from a file: `shared` (the template VM, whose RAM becomes the snapshot's
/// RAM file) or private copy-on-write (a clone: its writes never reach the file). `path` None:
/// anonymous memory under the same backend id (a clone restored from a checkpoint, whose state
/// carries all its RAM: migration matches RAM blocks by that id).
#[derive(Debug, Clone)]
pub struct MemoryFile {
    pub path: Option<PathBuf>,
    pub shared: bool,
}

fn drive(args: &mut Vec<OsString>, id: &str, file: &Path, readonly: bool) {
    let mut d = OsString::from(format!("id={id},format=raw,if=none,"));
    if readonly {
        d.push("readonly=on,");
    }
    d.push("file=");
    d.push(file);
    args.extend([
        "-drive".into(),
        d,
        "-device".into(),
        format!("virtio-blk-device,drive={id},serial=bulkhead-{id}").into(),
    ]);
}

/// The guest's `eth0`, as the agent reads it: `ADDR/PREFIX,GATEWAY,MTU` (the gateway is also
/// its nameserver). The same fixed addresses as the jail's TUN link: every VM is alone on its
/// link, whose only peer is the egress stack.
fn guest_net() -> String {
    use bulkhead_host::link::{GATEWAY_ADDR, MTU, PREFIX_LEN, SANDBOX_ADDR};
    format!("{SANDBOX_ADDR}/{PREFIX_LEN},{GATEWAY_ADDR},{MTU}")
}

/// The NIC: virtio-net on a `-netdev stream` whose socket QEMU listens on in the slot
/// directory. The driver connects it to the egress stack when the sandbox gets network
/// (`open_network`); until then nothing is connected and QEMU drops the guest's frames.
fn nic(a: &mut Vec<OsString>, s: &VmSpec) {
    let dir = s.agent_socket.parent().unwrap_or(Path::new("."));
    let mut netdev = OsString::from(format!(
        "stream,id={NIC},server=on,addr.type=unix,addr.path="
    ));
    netdev.push(dir.join(NET_SOCKET));
    let mac = bulkhead_host::link::GUEST_MAC
        .map(|b| format!("{b:02x}"))
        .join(":");
    a.extend([
        "-netdev".into(),
        netdev,
        "-device".into(),
        format!("virtio-net-device,netdev={NIC},mac={mac}").into(),
    ]);
}

/// `-object memory-backend-file` as the machine's RAM (QEMU merges the second `-machine`).
fn memory_file(args: &mut Vec<OsString>, file: &MemoryFile, memory_mb: u64) {
    let share = if file.shared { "on" } else { "off" };
    let o = match &file.path {
        Some(path) => {
            let mut o = OsString::from(format!(
                "memory-backend-file,id=mem0,size={memory_mb}M,share={share},mem-path="
            ));
            o.push(path);
            o
        }
        None => format!("memory-backend-ram,id=mem0,size={memory_mb}M,share={share}").into(),
    };
    args.extend([
        "-machine".into(),
        "memory-backend=mem0".into(),
        "-object".into(),
        o,
    ]);
}

/// The arguments after the `qemu-system-x86_64` program name.
pub fn args(s: &VmSpec) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(OsString::from));
    // acpi=off makes QEMU list the virtio-mmio devices on the kernel command line (the kernel
    // has no ACPI); the PIT must stay on under TCG or the TSC calibration hangs.
    push(&[
        "-M",
        "microvm,x-option-roms=off,rtc=off,acpi=off",
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
    ]);
    match s.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host,-arch-capabilities"]),
        // The translated-code cache is capped so that QEMU fits its cgroup's memory limit
        // (`jailer::OVERHEAD_MB`); QEMU's default is up to 1 GiB.
        Accel::Tcg => push(&["-accel", &format!("tcg,tb-size={TCG_TB_MB}"), "-cpu", "max"]),
    }
    let (mem, cpus) = (format!("{}M", s.memory_mb), s.cpus.max(1).to_string());
    push(&["-m", &mem, "-smp", &cpus]);
    // QEMU's own seccomp filter: no exec, no privilege changes, no obsolete syscalls.
    push(&[
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]);
    if let Some(file) = &s.memory_file {
        memory_file(&mut a, file, s.memory_mb);
    }
    if s.incoming {
        a.extend(["-incoming".into(), "defer".into()]);
    }
    let mut serial = OsString::from("file:");
    serial.push(&s.console_log);
    a.extend(["-serial".into(), serial]);
    a.extend(["-kernel".into(), s.kernel.clone().into_os_string()]);
    // The agent's settings go as `NAME=value` parameters, which the kernel hands to init as
    // environment variables: not as arguments after `--`, because QEMU appends its
    // `virtio_mmio.device=` entries to the end of the command line. The agent clears its
    // children's environment, so these do not leak into sandbox processes. panic=-1 plus
    // -no-reboot: when the agent (pid 1) exits, the kernel panics and QEMU exits.
    let cmdline = format!(
        "console=ttyS0 quiet panic=-1 root=/dev/vda ro rootfstype=ext4 init=/agent \
         BULKHEAD_AGENT_LOG={} BULKHEAD_AGENT_LISTEN=unix:{GUEST_AGENT_SOCKET} \
         BULKHEAD_AGENT_GUEST_PORT={AGENT_PORT} BULKHEAD_GUEST_CLOCK={}.{:09} \
         BULKHEAD_GUEST_NET={} BULKHEAD_GUEST_PIDS_MAX={}",
        s.agent_log,
        s.clock.as_secs(),
        s.clock.subsec_nanos(),
        guest_net(),
        s.pids_max
    );
    a.extend(["-append".into(), cmdline.into()]);
    // The boot disk first: the kernel names it /dev/vda (root=). The agent finds the others by
    // their serial.
    drive(&mut a, "boot", &s.boot_disk, true);
    drive(&mut a, "root", &s.root_disk, true);
    drive(&mut a, "rw", &s.rw_disk, false);
    let mut chardev = OsString::from("socket,id=agent,server=on,wait=off,path=");
    chardev.push(&s.agent_socket);
    a.extend([
        "-device".into(),
        "virtio-serial-device".into(),
        "-chardev".into(),
        chardev,
        "-device".into(),
        format!("virtserialport,chardev=agent,name={AGENT_PORT}").into(),
        "-device".into(),
        "virtio-rng-device".into(),
    ]);
    nic(&mut a, s);
    let mut qmp = OsString::from("unix:");
    qmp.push(&s.qmp_socket);
    qmp.push(",server=on,wait=off");
    a.extend(["-qmp".into(), qmp]);
    a
}

/// A VM spec for unit tests (this module's and the jailer's).
#[cfg(test)]
pub(crate) fn sample_spec(accel: Accel) -> VmSpec {
    VmSpec {
        kernel: "/k/bzImage".into(),
        boot_disk: "/c/boot.ext4".into(),
        root_disk: "/c/root.erofs".into(),
        rw_disk: "/s/3/rw.img".into(),
        agent_socket: "/s/3/agent.sock".into(),
        qmp_socket: "/s/3/qmp.sock".into(),
        console_log: "/s/3/console.log".into(),
        cpus: 2,
        memory_mb: 256,
        accel,
        agent_log: "warn".into(),
        clock: std::time::Duration::from_millis(1_700_000_000_250),
        memory_file: None,
        incoming: false,
        pids_max: 128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> VmSpec {
        sample_spec(Accel::Tcg)
    }

    fn joined(s: &VmSpec) -> String {
        args(s)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn limits_disks_and_channels_are_on_the_command_line() {
        let a = joined(&spec());
        assert!(a.contains("-m 256M -smp 2"), "{a}");
        assert!(a.contains("-accel tcg,tb-size=64 -cpu max"), "{a}");
        assert!(a.contains("-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny"));
        let boot = a.find("file=/c/boot.ext4").unwrap();
        assert!(
            boot < a.find("file=/c/root.erofs").unwrap(),
            "boot disk first: {a}"
        );
        assert!(a.contains("readonly=on,file=/c/root.erofs"));
        assert!(!a.contains("readonly=on,file=/s/3/rw.img"));
        assert!(a.contains("serial=bulkhead-rw"));
        assert!(a.contains("socket,id=agent,server=on,wait=off,path=/s/3/agent.sock"));
        assert!(a.contains("virtserialport,chardev=agent,name=bulkhead.agent"));
        assert!(a.contains("BULKHEAD_AGENT_GUEST_PORT=bulkhead.agent"));
        assert!(!a.contains(" -- "), "QEMU appends to the command line: {a}");
        assert!(a.contains("init=/agent"));
        assert!(
            a.contains("-netdev stream,id=net0,server=on,addr.type=unix,addr.path=/s/3/net.sock"),
            "{a}"
        );
        assert!(a.contains("virtio-net-device,netdev=net0,mac=52:54:00:c8:00:02"));
        assert!(
            a.contains("BULKHEAD_GUEST_NET=10.200.0.2/24,10.200.0.1,1500"),
            "{a}"
        );
        assert!(
            a.contains("BULKHEAD_GUEST_CLOCK=1700000000.250000000"),
            "{a}"
        );
        assert!(a.contains("BULKHEAD_GUEST_PIDS_MAX=128"), "{a}");
    }

    #[test]
    fn snapshot_ram_is_a_file_shared_by_the_template_private_to_clones() {
        let mut s = spec();
        assert!(!joined(&s).contains("memory-backend"));
        assert!(!joined(&s).contains("-incoming"));
        s.memory_file = Some(MemoryFile {
            path: Some("/s/3/ram".into()),
            shared: true,
        });
        let a = joined(&s);
        assert!(a.contains("-machine memory-backend=mem0"), "{a}");
        assert!(
            a.contains("memory-backend-file,id=mem0,size=256M,share=on,mem-path=/s/3/ram"),
            "{a}"
        );
        s.memory_file = Some(MemoryFile {
            path: Some("/proc/self/fd/7".into()),
            shared: false,
        });
        s.incoming = true;
        let a = joined(&s);
        assert!(a.contains("share=off,mem-path=/proc/self/fd/7"), "{a}");
        assert!(a.contains("-incoming defer"), "{a}");
        s.memory_file = Some(MemoryFile {
            path: None,
            shared: false,
        });
        let a = joined(&s);
        assert!(
            a.contains("memory-backend-ram,id=mem0,size=256M,share=off"),
            "{a}"
        );
    }

    #[test]
    fn kvm_uses_the_host_cpu() {
        let mut s = spec();
        s.accel = Accel::Kvm;
        // -cpu host alone aborts on PVM hosts (MSR 0x10a); harmless elsewhere.
        assert!(joined(&s).contains("-accel kvm -cpu host,-arch-capabilities"));
    }
}
