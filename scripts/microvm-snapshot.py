#!/usr/bin/env python3
# Usage (as root): scripts/microvm-snapshot.py WORKDIR BZIMAGE BOOT_DISK ROOT_DISK [MEM_MB]
# with the disks from <cache>/microvm/ (built by the microvm driver). First measurement of
# QEMU snapshot/restore for issue 10 (TCG here); it is not a benchmark with percentiles yet.
# Measures a QEMU microvm snapshot (migrate to a file) and restore, with the microvm driver's
# guest (bulkhead-agent as pid 1), talking to the agent through the vmchan protocol.
import json, os, socket, struct, subprocess, sys, time
W = sys.argv[1]; KERNEL, BOOT, ROOT = sys.argv[2:5]; MEM = sys.argv[5] if len(sys.argv) > 5 else "256"
RW = f"{W}/rw.img"
subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", RW, "256M"], check=True)
def args(incoming):
    now = time.time()
    a = ["qemu-system-x86_64", "-M", "microvm,x-option-roms=off,rtc=off,acpi=off", "-nodefaults", "-no-user-config",
         "-nographic", "-no-reboot", "-accel", "tcg", "-cpu", "max", "-m", MEM + "M", "-smp", "1",
         "-serial", f"file:{W}/console.log", "-kernel", KERNEL, "-append",
         f"console=ttyS0 quiet panic=-1 root=/dev/vda ro rootfstype=ext4 init=/agent BULKHEAD_AGENT_LOG=warn "
         f"BULKHEAD_AGENT_LISTEN=unix:/run/bulkhead/agent.sock BULKHEAD_AGENT_GUEST_PORT=bulkhead.agent BULKHEAD_GUEST_CLOCK={int(now)}.0"]
    for i, (f, ro) in enumerate([(BOOT, 1), (ROOT, 1), (RW, 0)]):
        n = ["boot", "root", "rw"][i]
        a += ["-drive", f"id={n},format=raw,if=none,{'readonly=on,' if ro else ''}file={f}", "-device", f"virtio-blk-device,drive={n},serial=bulkhead-{n}"]
    a += ["-device", "virtio-serial-device", "-chardev", f"socket,id=agent,server=on,wait=off,path={W}/agent.sock",
          "-device", "virtserialport,chardev=agent,name=bulkhead.agent", "-device", "virtio-rng-device",
          "-qmp", f"unix:{W}/qmp.sock,server=on,wait=off"]
    if incoming: a += ["-incoming", "defer"]
    return a
def wait_sock(p):
    while not os.path.exists(p): time.sleep(0.005)
def qmp():
    wait_sock(f"{W}/qmp.sock"); s = socket.socket(socket.AF_UNIX); s.connect(f"{W}/qmp.sock"); f = s.makefile("rw")
    f.readline()
    def cmd(name, **kw):
        f.write(json.dumps({"execute": name, **({"arguments": kw} if kw else {})}) + "\n"); f.flush()
        while True:
            m = json.loads(f.readline())
            if "return" in m: return m["return"]
            if "error" in m: raise RuntimeError(m)
    cmd("qmp_capabilities"); return cmd
def frame(kind, sid, payload=b""): return struct.pack(">HBII", 0xB17E, kind, sid, len(payload)) + payload
def health(session):
    wait_sock(f"{W}/agent.sock")
    s = socket.socket(socket.AF_UNIX); s.connect(f"{W}/agent.sock")
    s.sendall(frame(1, 0, struct.pack(">Q", session)) + frame(2, session))
    buf = b""; opened = False; body = b""
    while True:
        d = s.recv(65536)
        if not d: raise RuntimeError("channel closed")
        buf += d
        while len(buf) >= 11:
            _, kind, sid, ln = struct.unpack(">HBII", buf[:11])
            if len(buf) < 11 + ln: break
            p = buf[11:11 + ln]; buf = buf[11 + ln:]
            if kind == 3 and not opened:
                opened = True
                s.sendall(frame(5, session, b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n") + frame(7, session))
            elif kind == 4: s.close(); return None
            elif kind == 5: body += p
            elif kind in (7, 8):
                s.close(); return body.split(b"\r\n")[0].decode()
def until_healthy(session):
    while True:
        try:
            r = health(session); session += 1
            if r and r.startswith("HTTP/1.1 2"): return r
        except (ConnectionError, RuntimeError, FileNotFoundError): session += 1
        time.sleep(0.02)
print("start", flush=True)
t0 = time.time(); src = subprocess.Popen(args(False)); r = until_healthy(1000)
boot = time.time() - t0
time.sleep(2)
rss = int([l for l in open(f"/proc/{src.pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
cmd = qmp(); cmd("migrate-set-parameters", **{"max-bandwidth": 107374182400})
t1 = time.time(); cmd("stop"); cmd("migrate", uri=f"exec:cat > {W}/state.bin")
while cmd("query-migrate").get("status") != "completed": time.sleep(0.002)
save = time.time() - t1; size = os.path.getsize(f"{W}/state.bin")
cmd("quit"); src.wait()
for p in ("qmp.sock", "agent.sock"):
    if os.path.exists(f"{W}/{p}"): os.unlink(f"{W}/{p}")
t2 = time.time(); dst = subprocess.Popen(args(True)); cmd = qmp()
cmd("migrate-incoming", uri=f"exec:cat {W}/state.bin")
while cmd("query-status")["status"] == "inmigrate": time.sleep(0.002)
loaded = time.time() - t2; cmd("cont"); r2 = until_healthy(5000); ready = time.time() - t2
print(f"boot to agent ready {boot:.2f} s ({r}); idle RSS {rss} MiB; save {save*1000:.0f} ms, state {size/1048576:.1f} MiB; "
      f"restore: loaded {loaded*1000:.0f} ms, agent answering {ready*1000:.0f} ms ({r2})")
cmd("quit"); dst.wait()
