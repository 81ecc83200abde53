#!/usr/bin/env python3
"""Create = clone bench for the microvm driver (issue 10), all in one run on this machine:

  api       create -> first command through the HTTP API with the official SDK (`Sandbox.create`,
            `commands.run("true")`), each create a clone of the template snapshot (--pool-size 0);
  raw       QEMU's own restore of the same snapshot with the same command line (copied from a
            clone the server started): spawn -> device state loaded over QMP -> `cont` -> the agent
            answering `GET /health` through a new channel session. The disk copy is made before
            the clock starts; the RAM memfd is loaded once, as the server does;
  cold      boot from scratch (same command line, anonymous RAM, fresh disk) to the agent
            answering, for reference;
  memory    per idle clone: QEMU RSS, PSS, and RSS minus the pages it shares from the snapshot.

Usage (as root): BULKHEAD_BIN=target/debug/bulkhead BULKHEAD_GUEST_KERNEL=.../bzImage \
  /var/cache/bulkhead/venv-<hash>/bin/python bench/microvm-clone-bench.py [N]
Needs the `base` template in BULKHEAD_IMAGE_CACHE (default /var/cache/bulkhead/images).
Kills its sandboxes through the API before stopping the server.
"""
import fcntl, glob, json, os, re, secrets, shutil, signal, socket, struct, subprocess, sys, tempfile, time
import urllib.request

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
BIN = os.environ.get("BULKHEAD_BIN", "target/debug/bulkhead")
KERNEL = os.environ["BULKHEAD_GUEST_KERNEL"]
IMAGES = os.environ.get("BULKHEAD_IMAGE_CACHE", "/var/cache/bulkhead/images")
SNAPS = os.path.join(os.path.dirname(IMAGES.rstrip("/")), "microvm")


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(name, xs):
    print(f"{name:58s} n={len(xs):3d}  p50 {pct(xs,50)*1000:7.0f} ms  p95 {pct(xs,95)*1000:7.0f} ms  "
          f"p99 {pct(xs,99)*1000:7.0f} ms", flush=True)


def wait_sock(p, limit=30):
    end = time.time() + limit
    while not os.path.exists(p):
        if time.time() > end:
            raise RuntimeError(f"{p} did not appear")
        time.sleep(0.002)


class Qmp:
    def __init__(self, path):
        wait_sock(path)
        self.s = socket.socket(socket.AF_UNIX)
        for _ in range(500):
            try:
                self.s.connect(path)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                time.sleep(0.002)
        self.f = self.s.makefile("rw")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, name, fd=None, **kw):
        data = (json.dumps({"execute": name, **({"arguments": kw} if kw else {})}) + "\n").encode()
        if fd is not None:
            socket.send_fds(self.s, [data], [fd])
        else:
            self.s.sendall(data)
        while True:
            line = self.f.readline()
            if not line:
                raise RuntimeError(f"QMP closed during {name}")
            m = json.loads(line)
            if "return" in m:
                return m["return"]
            if "error" in m:
                raise RuntimeError(m)


def frame(kind, sid, payload=b""):
    return struct.pack(">HBII", 0xB17E, kind, sid, len(payload)) + payload


def health(sock_path, session):
    """GET /health through a new vmchan session; the status line or None."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.settimeout(1)
    s.sendall(frame(1, 0, struct.pack(">Q", session)) + frame(2, session & 0x7FFFFFFF or 1))
    sid = session & 0x7FFFFFFF or 1
    buf, opened, body = b"", False, b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return None
            buf += d
            while len(buf) >= 11:
                _, kind, fsid, ln = struct.unpack(">HBII", buf[:11])
                if len(buf) < 11 + ln:
                    break
                p, buf = buf[11:11 + ln], buf[11 + ln:]
                if kind == 3 and not opened:
                    opened = True
                    s.sendall(frame(5, sid, b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n") + frame(7, sid))
                elif kind == 4:
                    return None
                elif kind == 5:
                    body += p
                elif kind in (7, 8):
                    return body.split(b"\r\n")[0]
    finally:
        s.close()


def until_healthy(sock_path, limit=120):
    end, session = time.time() + limit, secrets.randbits(48)
    wait_sock(sock_path, limit)
    while time.time() < end:
        try:
            r = health(sock_path, session)
            if r and r.startswith(b"HTTP/1.1 2"):
                return
        except (OSError, RuntimeError):
            pass
        session += 1
        time.sleep(0.005)
    raise RuntimeError("the agent did not answer")


def qemu_pids(marker):
    out = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            c = open(p, "rb").read().split(b"\0")
        except OSError:
            continue
        if c and c[0].endswith(b"qemu-system-x86_64") and any(marker.encode() in a for a in c):
            out.append((int(p.split("/")[2]), [a.decode() for a in c if a]))
    return out


def smaps(pid):
    rss = pss = shared_snap = 0
    in_snap = False
    for line in open(f"/proc/{pid}/smaps"):
        f = line.split()
        if len(f) < 2:
            continue
        if not f[0].endswith(":"):
            in_snap = "bulkhead-snapshot-ram" in line
            continue
        kb = int(f[1]) if f[1].isdigit() else 0
        if f[0] == "Rss:":
            rss += kb
        elif f[0] == "Pss:":
            pss += kb
        elif in_snap and f[0] in ("Shared_Clean:", "Shared_Dirty:"):
            shared_snap += kb
    return rss, pss, shared_snap


def sealed_memfd(path):
    fd = os.memfd_create("bulkhead-snapshot-ram", os.MFD_ALLOW_SEALING)
    size = os.path.getsize(path)
    os.ftruncate(fd, size)
    with open(path, "rb") as f:
        off = 0
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            if chunk.count(0) != len(chunk):
                os.pwrite(fd, chunk, off)
            off += len(chunk)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def main():
    from e2b import Sandbox
    work = tempfile.mkdtemp(prefix="bhvmbench", dir="/var/tmp")
    os.chmod(work, 0o755)
    data = os.path.join(work, "data")
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    port_n = port.getsockname()[1]
    port.close()
    key = "e2b_" + secrets.token_hex(20)
    env = dict(os.environ, BULKHEAD_API_KEY=key, BULKHEAD_IMAGE_CACHE=IMAGES)
    log = open(os.path.join(work, "serve.log"), "w")
    srv = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{port_n}", "--data-dir", data, "--templates", "base",
                            "--pool-size", "0", "--driver", "microvm", "--guest-kernel", KERNEL],
                           env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port_n}"
    os.environ.update(E2B_API_KEY=key, E2B_API_URL=url, E2B_SANDBOX_URL=url)
    for k in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        os.environ.pop(k, None)
    live = []
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        print(f"microvm clone bench (QEMU TCG on this host; figures are TCG figures), N={N}", flush=True)
        # Warm-up: the first create takes the template snapshot.
        t0 = time.time()
        sbx = Sandbox.create("base", timeout=600)
        live.append(sbx)
        sbx.commands.run("true")
        print(f"first create (takes the snapshot, then clones): {time.time()-t0:.2f} s", flush=True)
        pid, cmdline = qemu_pids(data)[0]
        sbx.kill()
        live.remove(sbx)

        api, api_create, api_cmd = [], [], []
        for _ in range(N):
            t0 = time.time()
            s = Sandbox.create("base", timeout=600)
            live.append(s)
            t1 = time.time()
            s.commands.run("true")
            api.append(time.time() - t0)
            api_create.append(t1 - t0)
            api_cmd.append(time.time() - t1)
            s.kill()
            live.remove(s)
        summary("api: create -> first command (SDK, clone)", api)
        summary("api: of which Sandbox.create", api_create)
        summary("api: of which commands.run('true') (bash -l in the guest)", api_cmd)
        log.flush()
        starts = [int(m) / 1000 for m in re.findall(r"ms=(\d+)[^\n]*clone of the template snapshot|clone of the template snapshot[^\n]*ms=(\d+)", open(os.path.join(work, "serve.log")).read()) for m in m if m]
        if starts:
            summary("driver: start by clone, as the server logs it", starts[1:])

        # Memory of idle clones.
        idle = [Sandbox.create("base", timeout=600) for _ in range(3)]
        live.extend(idle)
        for s in idle:
            s.commands.run("true")
        time.sleep(5)
        mem = [smaps(p) for p, _ in qemu_pids(data)]
        for s in idle:
            s.kill()
            live.remove(s)

        # Raw restore of the same snapshot with the same command line.
        metas = []
        for m in glob.glob(os.path.join(SNAPS, "snap-*", "meta.json")):
            meta = json.load(open(m))
            if meta["template"] == "base":
                metas.append((os.path.getmtime(m), os.path.dirname(m), meta))
        snap = max(metas)[1]
        slot = re.search(r"path=(\S*)/agent\.sock", " ".join(cmdline)).group(1)
        raw_dir = os.path.join(work, "raw")
        os.mkdir(raw_dir)
        args = [a.replace(slot, raw_dir) for a in cmdline]
        memfd = sealed_memfd(os.path.join(snap, "ram"))
        # The same command line but for the memfd's number in this process.
        args = [re.sub(r"mem-path=/proc/self/fd/\d+", f"mem-path=/proc/self/fd/{memfd}", a) for a in args]
        qlog = open(os.path.join(work, "raw-qemu.log"), "w")

        def spawn(a, with_memfd):
            return subprocess.Popen(a, pass_fds=[memfd] if with_memfd else [],
                                    stdout=qlog, stderr=qlog, cwd=raw_dir)

        def clean():
            for f in ("agent.sock", "qmp.sock", "rw.img", "console.log"):
                try:
                    os.unlink(os.path.join(raw_dir, f))
                except FileNotFoundError:
                    pass

        raw, raw_loaded = [], []
        for _ in range(N):
            clean()
            subprocess.run(["cp", "--sparse=always", os.path.join(snap, "disk.img"), os.path.join(raw_dir, "rw.img")], check=True)
            t0 = time.time()
            q = spawn(args, True)
            try:
                qmp = Qmp(os.path.join(raw_dir, "qmp.sock"))
                qmp.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
                st = os.open(os.path.join(snap, "state"), os.O_RDONLY)
                qmp.cmd("getfd", fd=st, fdname="s")
                os.close(st)
                qmp.cmd("migrate-incoming", uri="fd:s")
                while qmp.cmd("query-status")["status"] == "inmigrate":
                    time.sleep(0.002)
                qmp.cmd("cont")
                raw_loaded.append(time.time() - t0)
                until_healthy(os.path.join(raw_dir, "agent.sock"))
                raw.append(time.time() - t0)
            finally:
                q.kill()
                q.wait()

        # Boot from scratch, for reference.
        cold_args = []
        skip = 0
        for i, a in enumerate(args):
            if skip:
                skip -= 1
                continue
            if a in ("-incoming",) or (a in ("-machine", "-object") and "mem" in args[i + 1]):
                skip = 1
                continue
            cold_args.append(a)
        cold, cold_rss = [], []
        for _ in range(max(3, N // 4)):
            clean()
            disk_mb = os.path.getsize(os.path.join(snap, "disk.img")) // 1048576
            subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "root_owner=0:0",
                            os.path.join(raw_dir, "rw.img"), f"{disk_mb}M"], check=True)
            t0 = time.time()
            q = spawn(cold_args, False)
            try:
                until_healthy(os.path.join(raw_dir, "agent.sock"))
                cold.append(time.time() - t0)
                time.sleep(3)
                cold_rss.append(smaps(q.pid)[0])
            finally:
                q.kill()
                q.wait()

        print()
        summary("api: create -> first command (SDK, clone)", api)
        if starts:
            summary("driver: start by clone (server log)", starts[1:])
        summary("raw: QEMU restore of the same snapshot -> `cont` done", raw_loaded)
        summary("raw: QEMU restore of the same snapshot -> agent answering", raw)
        summary("cold: boot from scratch -> agent answering (reference)", cold)
        summary("api: of which Sandbox.create", api_create)
        summary("api: of which commands.run('true') (bash -l in the guest)", api_cmd)
        print(f"ratio api/raw: p50 {pct(api,50)/pct(raw,50):.2f}x  p95 {pct(api,95)/pct(raw,95):.2f}x  p99 {pct(api,99)/pct(raw,99):.2f}x")
        print(f"ratio create/raw: p50 {pct(api_create,50)/pct(raw,50):.2f}x  p95 {pct(api_create,95)/pct(raw,95):.2f}x  p99 {pct(api_create,99)/pct(raw,99):.2f}x")
        if starts:
            print(f"ratio driver start/raw: p50 {pct(starts[1:],50)/pct(raw,50):.2f}x  p95 {pct(starts[1:],95)/pct(raw,95):.2f}x")
        for rss, pss, sh in mem:
            print(f"idle clone QEMU: RSS {rss/1024:.1f} MiB, PSS {pss/1024:.1f} MiB, shared snapshot pages {sh/1024:.1f} MiB, "
                  f"RSS minus shared snapshot pages {(rss-sh)/1024:.1f} MiB")
        print(f"idle cold-booted QEMU: RSS {sum(cold_rss)/len(cold_rss)/1024:.1f} MiB (mean of {len(cold_rss)})")
    except Exception:
        for f in ("raw-qemu.log",):
            p = os.path.join(work, f)
            if os.path.exists(p):
                print(f"--- {f}:", open(p).read()[-3000:], file=sys.stderr)
        raise
    finally:
        for s in live:
            try:
                s.kill()
            except Exception:
                pass
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
