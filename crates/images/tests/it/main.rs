//! Real builds. They need root and a reachable Debian mirror (unless the image is cached), so
//! each is gated with `#[requires(Root, ...)]`: plain `cargo test` reports them as ignored,
//! `--include-ignored` runs them and fails when a need is missing.
//!
//! `BULKHEAD_TEST_IMAGE_CACHE` picks the cache (default /var/cache/bulkhead/images, so a run
//! leaves the cache warm for the other crates' tests). `BULKHEAD_TEST_EXTRA_CA` is the PEM
//! bundle the extra-CA build trusts (e.g. a TLS-inspecting proxy's CA; scripts/test.sh makes a
//! throwaway one when it is unset).

mod oci;
mod pull_guard;
mod registry;
mod setid;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bulkhead_images::{
    BootstrapTool, DEFAULT_CACHE_ROOT, ImageCache, ImageError, LogProgress, TemplateRecipe,
};
use bulkhead_testkit::requires;

fn cache_dir() -> PathBuf {
    std::env::var_os("BULKHEAD_TEST_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE_ROOT))
}

/// Printed straight to the stderr handle so it shows even for passing tests.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// Builds, failing the test (with what to do) when the mirror cannot be reached.
async fn build(cache: &ImageCache, recipe: &TemplateRecipe) -> PathBuf {
    match cache.build(recipe, &LogProgress::quiet()).await {
        Ok(p) => p,
        Err(e @ ImageError::MirrorUnreachable { .. }) => bulkhead_testkit::missing(
            "a reachable Debian mirror",
            &e.to_string(),
            "give the host network access to the mirror",
        ),
        Err(e) => panic!("build failed: {e}"),
    }
}

/// What `base` adds to the Debian layer, as E2B's base has it: Node.js 20 with npm and yarn,
/// pip allowed system-wide, passwordless sudo for `user`.
fn check_e2b_base(rootfs: &Path) {
    let out = in_tree_as_user(rootfs, &["node", "-e", "console.log(process.version)"]);
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(v.starts_with("v20."), "node: {out:?}");
    for (tool, prefix) in [("npm", "10."), ("yarn", "1.")] {
        let out = in_tree_as_user(rootfs, &[tool, "--version"]);
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(v.starts_with(prefix), "{tool}: {out:?}");
    }
    let externally_managed = std::fs::read_dir(rootfs.join("usr/lib"))
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.path().join("EXTERNALLY-MANAGED").exists());
    assert!(!externally_managed, "pip must be allowed to install");
    let rule = std::fs::metadata(rootfs.join("etc/sudoers.d/user")).unwrap();
    assert_eq!((rule.uid(), rule.mode() & 0o7777), (0, 0o440));
}

fn chroot(rootfs: &Path, args: &[&str]) -> std::process::Output {
    Command::new("/usr/sbin/chroot")
        .arg(rootfs)
        .args(args)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .expect("run chroot")
}

/// What every build of the Debian layer (and so of `base` and its children) must contain,
/// whichever tool made it.
fn check_base_tree(rootfs: &Path) {
    for bin in [
        "usr/bin/python3",
        "usr/bin/bash",
        "usr/bin/curl",
        "usr/bin/git",
        "usr/bin/ps",
        "usr/sbin/ip",
        "usr/bin/less",
        "usr/bin/gcc",
        "usr/bin/make",
        "usr/bin/sudo",
        "usr/bin/gh",
        "usr/bin/unzip",
    ] {
        assert!(rootfs.join(bin).exists(), "{bin} missing");
    }
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l == "user:x:1000:1000::/home/user:/bin/bash"),
        "{passwd}"
    );
    assert!(passwd.lines().any(|l| l.starts_with("root:x:0:0:")));
    let home = std::fs::metadata(rootfs.join("home/user")).unwrap();
    assert_eq!((home.uid(), home.gid()), (1000, 1000));
    assert!(rootfs.join("home/user/.bashrc").is_file());
    // sudo is set-uid root (sandboxes run it without no_new_privs).
    let sudo = std::fs::metadata(rootfs.join("usr/bin/sudo")).unwrap();
    assert_eq!((sudo.uid(), sudo.mode() & 0o4000), (0, 0o4000));
    assert!(
        rootfs.join("usr/share/doc/bash/copyright").is_file(),
        "licences kept"
    );
    assert!(
        !rootfs.join("usr/share/man/man1").exists(),
        "man pages removed"
    );
    assert_eq!(
        std::fs::read_dir(rootfs.join("var/lib/apt/lists"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name() != "partial" && e.file_name() != "lock")
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/hostname")).unwrap(),
        "sandbox\n"
    );

    // The tree actually runs: python, and name lookups for the sandbox user.
    let out = chroot(
        rootfs,
        &["python3", "-c", "import ssl, sqlite3, json; print(6*7)"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{out:?}");
    let out = Command::new("/usr/sbin/chroot")
        .args(["--userspec=1000:1000"])
        .arg(rootfs)
        .args(["/usr/bin/id", "-un"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "user",
        "{out:?}"
    );
}

#[requires(Root, "a reachable Debian mirror unless the image is cached")]
#[tokio::test]
async fn builds_the_base_template_and_caches_it() {
    let cache = ImageCache::new(cache_dir());
    let recipe = TemplateRecipe::base();
    let was_cached = cache.is_ready(&recipe);

    // Two builds at once: one bootstraps, the other waits on the lock and reuses the result.
    let started = Instant::now();
    let (rootfs, rootfs2) = tokio::join!(build(&cache, &recipe), build(&cache, &recipe));
    let elapsed = started.elapsed();
    assert_eq!(rootfs, rootfs2);
    assert_eq!(rootfs, cache.rootfs_path(&recipe));
    assert!(cache.is_ready(&recipe));

    check_base_tree(&rootfs);
    check_e2b_base(&rootfs);

    // Cached now: a further build returns at once.
    let t = Instant::now();
    assert_eq!(
        cache.build(&recipe, &LogProgress::quiet()).await.unwrap(),
        rootfs
    );
    let cached = t.elapsed();
    assert!(cached < Duration::from_secs(1), "cache hit took {cached:?}");

    let info = cache.info(&recipe).expect("READY metadata");
    let listed = cache.list().unwrap();
    let entry = listed
        .iter()
        .find(|c| c.hash == recipe.content_hash())
        .expect("listed");
    assert!(entry.ready);
    assert_eq!(entry.size_bytes, info.size_bytes);
    assert!(
        info.size_bytes > 50_000_000,
        "{} bytes is too small for python3+git",
        info.size_bytes
    );
    say(&format!(
        "base template {}: {} ({:.1} MB, {} files), built by {} in {:.1} s{}; this run {:.1} s, cache hit {:?}",
        &info.hash[..12],
        rootfs.display(),
        info.size_bytes as f64 / 1e6,
        info.files,
        info.tool,
        info.build_seconds,
        if was_cached { " (earlier run)" } else { "" },
        elapsed.as_secs_f64(),
        cached
    ));
}

#[requires(
    Root,
    ExtraCaBundle,
    "a reachable Debian mirror unless the image is cached",
    "pypi.org reachable"
)]
#[tokio::test]
async fn extra_ca_bundle_is_trusted_inside_the_template() {
    let bundle = bulkhead_testkit::extra_ca_bundle();
    let cache = ImageCache::new(cache_dir());
    let recipe = TemplateRecipe::base().with_extra_ca_bundle(&bundle);
    assert_ne!(recipe.content_hash(), TemplateRecipe::base().content_hash());
    let rootfs = build(&cache, &recipe).await;
    let installed =
        std::fs::read_to_string(rootfs.join("usr/local/share/ca-certificates/bulkhead-extra.crt"))
            .unwrap();
    let wanted = std::fs::read_to_string(&bundle).unwrap();
    assert_eq!(installed.trim(), wanted.replace("\r\n", "\n").trim());
    let trusted =
        std::fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    let first_line = wanted.lines().nth(1).unwrap();
    assert!(
        trusted.contains(first_line),
        "bundle not merged into the trust store"
    );

    // End to end when the host can reach PyPI: curl inside the template (with the host's DNS
    // bind-mounted in a private mount namespace) must verify the, possibly re-signed, TLS.
    let url = "https://pypi.org/simple/pip/";
    let host_ok = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "--max-time", "20", url])
        .status()
        .is_ok_and(|s| s.success());
    if !host_ok {
        bulkhead_testkit::missing(
            "pypi.org reachable (the TLS part)",
            &format!("`curl {url}` failed on the host"),
            "give the host HTTPS access to pypi.org (through the proxy whose CA this is)",
        );
    }
    let script = format!(
        "mount --bind /etc/resolv.conf {r}/etc/resolv.conf && \
         chroot {r} /usr/bin/curl -sS -o /dev/null -w '%{{http_code}}' --max-time 20 {url}",
        r = rootfs.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl inside the template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    say(&format!(
        "extra CA template {}: curl {url} inside the sandbox tree -> 200",
        rootfs.display()
    ));
}

#[requires(
    Root,
    "debootstrap (a second full base build, ~1 min)",
    "a reachable Debian mirror"
)]
#[tokio::test]
async fn debootstrap_fallback_builds_the_same_template() {
    // A private cache: the hash does not include the tool, so the shared cache would answer.
    let dir = tempfile::Builder::new()
        .prefix("bulkhead-debootstrap-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let cache = ImageCache::new(dir.path()).with_tool(BootstrapTool::Debootstrap);
    let recipe = TemplateRecipe::debian();
    let started = Instant::now();
    let rootfs = build(&cache, &recipe).await;
    check_base_tree(&rootfs);
    let info = cache.info(&recipe).unwrap();
    assert_eq!(info.tool, "debootstrap");
    say(&format!(
        "debootstrap build: {:.1} MB, {} files, {:.1} s",
        info.size_bytes as f64 / 1e6,
        info.files,
        started.elapsed().as_secs_f64()
    ));
    // TempDir's recursive delete would follow a leftover mount into the host: make sure none.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(dir.path().to_str().unwrap()),
        "mounts left under the build"
    );
}

/// Runs `args` in the tree as `user`, with /proc mounted (Deno needs /proc/self/exe) and a
/// tmpfs on /tmp (yarn leaves a compile cache there) in a private mount namespace, so nothing
/// is left mounted in, or written to, the cached tree.
fn in_tree_as_user(rootfs: &Path, args: &[&str]) -> std::process::Output {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-ec"])
        .arg(r#"mount -t proc proc "$0/proc"; mount -t tmpfs tmpfs "$0/tmp"; exec /usr/sbin/chroot --userspec=1000:1000 "$0" /usr/bin/env HOME=/home/user "$@""#)
        .arg(rootfs)
        .args(args)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin")
        .output()
        .expect("run unshare")
}

fn reachable(host: &str) -> bool {
    use std::net::ToSocketAddrs;
    let Ok(mut addrs) = (host, 443).to_socket_addrs() else {
        return false;
    };
    addrs.any(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5)).is_ok())
}

#[requires(
    Root,
    "pypi.org, files.pythonhosted.org, registry.npmjs.org and a Debian mirror reachable unless the image is cached"
)]
#[tokio::test]
async fn builds_the_code_interpreter_template_on_base() {
    let cache = ImageCache::new(cache_dir());
    let recipe = TemplateRecipe::code_interpreter();
    if !cache.is_ready(&recipe) {
        for host in ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"] {
            if !reachable(host) {
                bulkhead_testkit::missing(
                    "the package registries (to build the image)",
                    &format!("{host}:443 is not reachable"),
                    "give the host HTTPS access to it, or build the image once where it is",
                );
            }
        }
    }
    let started = Instant::now();
    let rootfs = build(&cache, &recipe).await;
    let info = cache.info(&recipe).expect("READY written");
    say(&format!(
        "code-interpreter-v1 {}: {:.1} MB, {} files, built in {:.0} s (this run {:.1} s)",
        info.hash,
        info.size_bytes as f64 / 1e6,
        info.files,
        info.build_seconds,
        started.elapsed().as_secs_f64()
    ));
    assert_eq!(info.tool, "layer");
    assert!(cache.is_ready(&TemplateRecipe::base()), "parent built too");
    check_base_tree(&rootfs);
    check_e2b_base(&rootfs);

    // kernels.json is the one the recipe generates, and every kernel program exists.
    let kernels = std::fs::read_to_string(rootfs.join("opt/bulkhead/interpreter/kernels.json"))
        .expect("kernels.json");
    assert_eq!(kernels, bulkhead_images::kernels_json());
    let v: serde_json::Value = serde_json::from_str(&kernels).unwrap();
    for (name, k) in v["languages"].as_object().unwrap() {
        let program = k["argv"][0].as_str().unwrap();
        assert!(
            rootfs.join(program.trim_start_matches('/')).exists(),
            "{name}: {program} missing"
        );
    }
    for rel in bulkhead_images::interpreter_asset_paths() {
        let p = rootfs.join("opt/bulkhead/interpreter").join(rel);
        let m = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o644), "{}", p.display());
    }
    assert!(
        std::fs::read_dir(rootfs.join("usr/lib"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .all(|e| !e.path().join("EXTERNALLY-MANAGED").exists()),
        "EXTERNALLY-MANAGED removed"
    );
    // Build-time leftovers: the CA copy and npm cache lived on a tmpfs, caches were removed.
    assert_eq!(std::fs::read_dir(rootfs.join("tmp")).unwrap().count(), 0);
    for p in ["root/.npm", "root/.cache"] {
        assert!(!rootfs.join(p).exists(), "{p} left in the tree");
    }
    // The host's extra CAs (e.g. a TLS-inspecting proxy's) were used for downloads only.
    let bundle = std::fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    if let Ok(entries) = std::fs::read_dir("/usr/local/share/ca-certificates") {
        for e in entries.flatten() {
            let pem = std::fs::read_to_string(e.path()).unwrap_or_default();
            if let Some(body) = pem.lines().find(|l| l.len() == 64) {
                assert!(
                    !bundle.contains(body),
                    "host CA {} was baked into the template",
                    e.path().display()
                );
            }
        }
    }

    // The kernels' runtimes work as the sandbox user.
    let out = in_tree_as_user(
        &rootfs,
        &[
            "python3",
            "-c",
            "import ipykernel, bash_kernel, numpy, pandas, matplotlib, scipy, seaborn, openpyxl, \
             PIL, requests, orjson, duckdb; print(duckdb.sql('select 6*7').fetchall()[0][0])",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{out:?}");
    let out = in_tree_as_user(
        &rootfs,
        &["deno", "eval", "const n: number = 6 * 7; console.log(n)"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{out:?}");
    let out = in_tree_as_user(&rootfs, &["node", "-e", "console.log(6*7)"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{out:?}");
    assert!(
        rootfs.join("home/user/.cache/matplotlib").is_dir(),
        "font cache warmed for user"
    );
}
