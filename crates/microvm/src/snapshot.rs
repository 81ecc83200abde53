//! Template snapshots: a VM booted once per template and machine shape, stopped once its agent
//! is ready, and saved as three files that every later sandbox of that template is cloned from.
//!
//! - `ram`: the guest's RAM. The template VM runs with its RAM on this file
//!   (`memory-backend-file,share=on`), so the migration (with `x-ignore-shared`) leaves it out
//!   of the state. Clones map it privately (`share=off`: copy-on-write, their writes never reach
//!   the file) through a sealed memfd the server fills once per snapshot: QEMU 7.2 opens the
//!   RAM file read-write even for a private mapping, and a write-sealed memfd is the one file a
//!   clone's QEMU can open that way and still cannot change (`F_SEAL_WRITE` refuses `write(2)`
//!   and shared writable mappings, and allows private ones).
//! - `state`: the device state (`migrate` to an fd, a few hundred KiB).
//! - `disk.img`: the writable disk as it was when the VM stopped (QEMU drains and flushes it on
//!   `stop`, so it matches the RAM: the guest's page cache and ext4 state are in `ram`). Each
//!   clone gets its own sparse copy.
//! - `meta.json`, written last: the key's inputs and the files' sizes. A snapshot without a
//!   valid one is missing.
//!
//! The key covers everything the saved state depends on: the template image (its name carries
//! the tree's fingerprint), the boot disk (the agent's hash), the kernel's hash, QEMU's version
//! and the machine's shape (memory, vCPUs, disk size, acceleration, the agent's log filter).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Bump when the snapshot's layout, the way it is taken or the VM's devices change (2: the NIC,
/// saved with its carrier down).
pub const FORMAT: u32 = 2;

pub const RAM: &str = "ram";
pub const STATE: &str = "state";
pub const DISK: &str = "disk.img";
const META: &str = "meta.json";

/// What a snapshot is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInputs {
    pub format: u32,
    pub root_disk: String,
    pub boot_disk: String,
    pub kernel: String,
    pub qemu: String,
    pub memory_mb: u64,
    pub cpus: u32,
    pub disk_mb: u64,
    pub accel: String,
    pub agent_log: String,
}

impl KeyInputs {
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex(&Sha256::digest(json)[..12])
    }
}

/// `meta.json`: the inputs, the template it was made for (older snapshots of the same template
/// are removed when a new one is saved) and the sizes the files must still have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub inputs: KeyInputs,
    pub template: String,
    pub ram_bytes: u64,
    pub state_bytes: u64,
    pub disk_bytes: u64,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The snapshots under one directory, and the sealed RAM memfds of those loaded (shared by
/// clones of this value).
#[derive(Clone)]
pub struct Snapshots {
    dir: PathBuf,
    ram: Arc<Mutex<HashMap<String, Arc<OwnedFd>>>>,
}

impl Snapshots {
    pub fn new(dir: PathBuf) -> Snapshots {
        Snapshots {
            dir,
            ram: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("snap-{key}"))
    }

    /// The snapshot's meta when all its files are there with the recorded sizes.
    pub fn valid(&self, key: &str) -> Option<Meta> {
        let dir = self.path(key);
        let meta: Meta = serde_json::from_slice(&fs::read(dir.join(META)).ok()?).ok()?;
        let size = |f: &str| fs::metadata(dir.join(f)).ok().map(|m| m.len());
        (meta.inputs.key() == key
            && size(RAM) == Some(meta.ram_bytes)
            && size(STATE) == Some(meta.state_bytes)
            && size(DISK) == Some(meta.disk_bytes)
            && meta.state_bytes > 0)
            .then_some(meta)
    }

    /// Forgets and deletes a snapshot (a restore from it failed). Clones running from its RAM
    /// keep their mappings.
    pub fn invalidate(&self, key: &str) {
        self.ram
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        let _ = fs::remove_dir_all(self.path(key));
    }

    /// A fresh directory to assemble a snapshot in, owned by `uid` (the template VM's QEMU
    /// writes its RAM file there).
    pub fn staging(&self, key: &str, uid: u32) -> io::Result<PathBuf> {
        fs::create_dir_all(&self.dir)?;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self
            .dir
            .join(format!("snap-{key}.{}-{n}.tmp", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir)?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(uid))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        Ok(dir)
    }

    /// Makes the staged files (`ram`, `state`, `disk.img`) the snapshot `key`: root-owned and
    /// private, `meta.json` last, then an atomic rename. Older snapshots of `template` go.
    pub fn commit(&self, staging: &Path, inputs: KeyInputs, template: &str) -> io::Result<Meta> {
        fs::set_permissions(staging, fs::Permissions::from_mode(0o700))?;
        std::os::unix::fs::chown(staging, Some(0), Some(0))?;
        let mut sizes = [0u64; 3];
        for (i, f) in [RAM, STATE, DISK].iter().enumerate() {
            let p = staging.join(f);
            std::os::unix::fs::chown(&p, Some(0), Some(0))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600))?;
            sizes[i] = fs::metadata(&p)?.len();
        }
        let meta = Meta {
            inputs,
            template: template.to_owned(),
            ram_bytes: sizes[0],
            state_bytes: sizes[1],
            disk_bytes: sizes[2],
        };
        fs::write(
            staging.join(META),
            serde_json::to_vec(&meta).map_err(io::Error::other)?,
        )?;
        let key = meta.inputs.key();
        let target = self.path(&key);
        let _ = fs::remove_dir_all(&target);
        fs::rename(staging, &target)?;
        self.prune(template, &key);
        Ok(meta)
    }

    /// Removes the other snapshots made for `template` (an older agent, kernel or tree).
    fn prune(&self, template: &str, keep: &str) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(key) = name.strip_prefix("snap-") else {
                continue;
            };
            if key == keep || key.contains('.') {
                continue;
            }
            let same_template = fs::read(e.path().join(META))
                .ok()
                .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
                .is_some_and(|m| m.template == template);
            if same_template {
                self.invalidate(key);
            }
        }
    }

    /// The snapshot's RAM as a sealed memfd, loaded once per snapshot and process.
    pub fn ram(&self, key: &str) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.ram.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Ok(fd.clone());
        }
        let fd = Arc::new(sealed_copy(&self.path(key).join(RAM))?);
        self.ram
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), fd.clone());
        Ok(fd)
    }

    /// A clone's own copy of the snapshot's writable disk at `dst`.
    pub fn copy_disk(&self, key: &str, dst: &Path) -> io::Result<()> {
        copy_disk(&self.path(key), dst)
    }
}

/// A sparse copy of the writable disk of the snapshot in `snapshot_dir` at `dst` (new file).
pub fn copy_disk(snapshot_dir: &Path, dst: &Path) -> io::Result<()> {
    let src = fs::File::open(snapshot_dir.join(DISK))?;
    let out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)?;
    sparse_copy(&src, &out)
}

/// The data extents of `src` (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes; `out` gets the
/// same length.
fn data_extents(src: &fs::File) -> io::Result<Vec<(u64, u64)>> {
    let len = src.metadata()?.len();
    let fd = src.as_raw_fd();
    let mut extents = Vec::new();
    let mut pos = 0i64;
    while (pos as u64) < len {
        // SAFETY: lseek on an fd we own.
        let start = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if start < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(e);
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        if end < 0 {
            return Err(io::Error::last_os_error());
        }
        extents.push((start as u64, end as u64));
        pos = end;
    }
    Ok(extents)
}

pub fn sparse_copy(src: &fs::File, out: &fs::File) -> io::Result<()> {
    out.set_len(src.metadata()?.len())?;
    let mut buf = vec![0u8; 1 << 20];
    for (start, end) in data_extents(src)? {
        let mut off = start;
        while off < end {
            let n = ((end - off) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], off)?;
            // Zero blocks inside a data extent stay holes too (a RAM file has many).
            if buf[..n].iter().any(|b| *b != 0) {
                out.write_all_at(&buf[..n], off)?;
            }
            off += n as u64;
        }
    }
    Ok(())
}

/// `path`'s content in a new memfd sealed against every change.
fn sealed_copy(path: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let src = fs::File::open(path)?;
    let fd = memfd_create(
        c"bulkhead-snapshot-ram",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io::Error::from)?;
    let mem = fs::File::from(fd);
    sparse_copy(&src, &mem)?;
    fcntl(
        &mem,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_WRITE
                | SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(io::Error::from)?;
    Ok(OwnedFd::from(mem))
}

/// The driver's snapshot bookkeeping.
#[derive(Default)]
pub struct SnapState {
    /// One snapshot taken at a time; a start that finds one being taken waits for it.
    pub building: tokio::sync::Mutex<()>,
    /// Keys whose snapshot could not be taken, and why.
    pub failed: Mutex<HashMap<String, String>>,
    pub kernel: Mutex<Option<(PathBuf, u64, i64, String)>>,
    pub qemu: Mutex<Option<String>>,
}

/// Content hash of the kernel, remembered per (path, size, mtime).
pub fn kernel_hash(
    cache: &Mutex<Option<(PathBuf, u64, i64, String)>>,
    path: &Path,
) -> io::Result<String> {
    let md = fs::metadata(path)?;
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((p, size, mtime, h)) = c.as_ref()
        && p == path
        && *size == md.len()
        && *mtime == md.mtime()
    {
        return Ok(h.clone());
    }
    let h = crate::image::file_hash(path)?;
    *c = Some((path.to_path_buf(), md.len(), md.mtime(), h.clone()));
    Ok(h)
}

/// `qemu --version`'s first line.
pub fn qemu_version(qemu: &Path) -> io::Result<String> {
    let out = std::process::Command::new(qemu).arg("--version").output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").trim().to_owned();
    if !out.status.success() || line.is_empty() {
        return Err(io::Error::other(format!(
            "{} --version failed: install qemu-system-x86",
            qemu.display()
        )));
    }
    Ok(line)
}

/// Raw fd of a sealed RAM memfd, for the clone's `mem-path=/proc/self/fd/N`.
pub fn raw(fd: &OwnedFd) -> i32 {
    fd.as_fd().as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> KeyInputs {
        KeyInputs {
            format: FORMAT,
            root_disk: "root-aa.erofs".into(),
            boot_disk: "boot-bb.ext4".into(),
            kernel: "cc".into(),
            qemu: "QEMU emulator version 7.2.22".into(),
            memory_mb: 256,
            cpus: 1,
            disk_mb: 256,
            accel: "tcg".into(),
            agent_log: "warn".into(),
        }
    }

    #[test]
    fn the_key_follows_every_input() {
        let a = inputs();
        assert_eq!(a.key(), inputs().key());
        let mut b = inputs();
        b.memory_mb = 512;
        assert_ne!(a.key(), b.key());
        let mut c = inputs();
        c.kernel = "dd".into();
        assert_ne!(a.key(), c.key());
    }

    fn staged(s: &Snapshots, inputs: &KeyInputs) -> PathBuf {
        let dir = s.staging(&inputs.key(), 0).unwrap();
        let ram = fs::File::create(dir.join(RAM)).unwrap();
        ram.set_len(8 << 20).unwrap();
        ram.write_all_at(b"guest page", 4 << 20).unwrap();
        fs::write(dir.join(STATE), b"device state").unwrap();
        let disk = fs::File::create(dir.join(DISK)).unwrap();
        disk.set_len(64 << 20).unwrap();
        disk.write_all_at(b"superblock", 1024).unwrap();
        dir
    }

    #[test]
    fn a_committed_snapshot_is_valid_until_a_file_changes() {
        if !nix::unistd::geteuid().is_root() {
            return; // commit chowns to root
        }
        let t = tempfile::tempdir().unwrap();
        let s = Snapshots::new(t.path().to_path_buf());
        let k = inputs();
        assert!(s.valid(&k.key()).is_none(), "missing");
        let meta = s.commit(&staged(&s, &k), k.clone(), "tmpl").unwrap();
        assert_eq!(s.valid(&k.key()), Some(meta));
        // A clone's disk is a sparse copy with the same content.
        let dst = t.path().join("clone.img");
        s.copy_disk(&k.key(), &dst).unwrap();
        let copy = fs::read(&dst).unwrap();
        assert_eq!(copy.len(), 64 << 20);
        assert_eq!(&copy[1024..1034], b"superblock");
        assert!(fs::metadata(&dst).unwrap().blocks() < 1024, "sparse");
        // The RAM memfd: same bytes, and sealed against writes.
        let fd = s.ram(&k.key()).unwrap();
        let mem = fs::File::from(fd.try_clone().unwrap());
        let mut page = [0u8; 10];
        mem.read_exact_at(&mut page, 4 << 20).unwrap();
        assert_eq!(&page, b"guest page");
        assert!(mem.write_all_at(b"x", 0).is_err(), "write-sealed");
        // A truncated file makes it invalid; a newer snapshot of the template prunes the old.
        fs::OpenOptions::new()
            .write(true)
            .open(s.path(&k.key()).join(STATE))
            .unwrap()
            .set_len(3)
            .unwrap();
        assert!(s.valid(&k.key()).is_none(), "truncated state");
        let mut k2 = inputs();
        k2.kernel = "ee".into();
        s.commit(&staged(&s, &k2), k2.clone(), "tmpl").unwrap();
        assert!(!s.path(&k.key()).exists(), "pruned");
        assert!(s.valid(&k2.key()).is_some());
    }
}
