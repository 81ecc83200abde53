//! Pulls cannot be aimed at this host: a registry on loopback (allowed explicitly, as an
//! operator would) that redirects elsewhere, references naming loopback ports, and what the
//! user is told either way. And a gzip bomb stops at the unpacked-size cap.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bulkhead_images::oci::{OciError, RegistryConfig};
use bulkhead_images::{ImageCache, LogProgress};
use bulkhead_testkit::requires;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::registry::{self, Registry};

/// A listener on loopback answering every request with `response` (with `{port}` replaced by
/// `port_in_response`); counts the connections it got.
async fn fake_server(response: String) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(response.as_bytes()).await;
            });
        }
    });
    (port, hits)
}

fn scratch_cache() -> (tempfile::TempDir, ImageCache) {
    let dir = tempfile::Builder::new()
        .prefix("bulkhead-h2-cache-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let cache = ImageCache::new(dir.path());
    (dir, cache)
}

/// The operator trusts exactly one loopback registry, by port.
fn trusting(port: u16) -> RegistryConfig {
    RegistryConfig {
        allowed: vec![format!("127.0.0.1:{port}")],
        insecure: vec![format!("127.0.0.1:{port}")],
        connect_timeout: Duration::from_secs(3),
        ..Default::default()
    }
}

/// No root needed: every case fails before anything is unpacked.
#[tokio::test(flavor = "multi_thread")]
async fn redirects_to_other_loopback_ports_are_refused_and_errors_do_not_tell_ports_apart() {
    let (_dir, cache) = scratch_cache();
    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".to_owned();
    let (canary, canary_hits) = fake_server(ok).await;

    // An allowed registry answering 307 towards the canary, by every spelling and scheme.
    for location in [
        format!("http://127.0.0.1:{canary}/internal"),
        format!("https://127.0.0.1:{canary}/internal"),
        format!("http://localhost:{canary}/internal"),
        format!("http://2130706433:{canary}/internal"),
        format!("http://[::ffff:127.0.0.1]:{canary}/internal"),
        format!("http://0.0.0.0:{canary}/internal"),
    ] {
        let (reg, reg_hits) = fake_server(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n"
        ))
        .await;
        let e = cache
            .pull_image(
                &format!("127.0.0.1:{reg}/team/app:1"),
                &trusting(reg),
                None,
                &LogProgress::quiet(),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, OciError::Unreachable { .. }), "{location}: {e}");
        assert!(reg_hits.load(Ordering::SeqCst) >= 1, "{location}");
        assert!(!e.to_string().contains(&canary.to_string()), "{e}");
    }
    assert_eq!(
        canary_hits.load(Ordering::SeqCst),
        0,
        "a redirect reached the canary"
    );

    // References naming loopback ports: not allowed by default, whatever listens there.
    let default = RegistryConfig::default();
    for reference in [
        format!("127.0.0.1:{canary}/x/y:1"),
        format!("localhost:{canary}/x/y:1"),
        format!("2130706433:{canary}/x/y:1"),
    ] {
        let e = cache
            .pull_image(&reference, &default, None, &LogProgress::quiet())
            .await
            .unwrap_err();
        assert!(matches!(e, OciError::NotAllowed { .. }), "{reference}: {e}");
    }

    // An operator allowing any registry (`*`) still keeps pulls off non-public addresses,
    // and a refused port, a listening one and one answering 401 or 404 read the same.
    let any = RegistryConfig {
        allowed: vec!["*".into()],
        connect_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let (unauthorized, h401) = fake_server(
        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\n\r\n"
            .to_owned(),
    )
    .await;
    let (missing, h404) =
        fake_server("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned()).await;
    let closed = registry::free_port();
    let mut messages = Vec::new();
    for port in [canary, unauthorized, missing, closed] {
        let e = cache
            .pull_image(
                &format!("127.0.0.1:{port}/x/y:1"),
                &any,
                None,
                &LogProgress::quiet(),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, OciError::Unreachable { .. }), "{port}: {e}");
        messages.push(e.to_string().replace(&port.to_string(), "PORT"));
    }
    assert!(
        messages.windows(2).all(|w| w[0] == w[1]),
        "messages differ: {messages:#?}"
    );
    assert_eq!(
        canary_hits.load(Ordering::SeqCst)
            + h401.load(Ordering::SeqCst)
            + h404.load(Ordering::SeqCst),
        0
    );
    assert!(cache.list().unwrap().iter().all(|c| !c.ready));
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A tar of `files` files of `each` zero bytes.
fn zeros_tar(files: usize, each: usize) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let zeros = vec![0u8; each];
    for i in 0..files {
        let mut h = tar::Header::new_gnu();
        h.set_size(each as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append_data(&mut h, format!("zero-{i}"), &zeros[..])
            .unwrap();
    }
    b.into_inner().unwrap()
}

#[requires(Root, "docker-registry (apt-get install docker-registry)")]
#[tokio::test(flavor = "multi_thread")]
async fn a_gzip_bomb_stops_at_the_unpacked_cap_and_leaves_nothing() {
    let reg = Registry::start(false);
    // 256 MiB of zeros in ~256 KiB of gzip; the operator's cap is 16 MiB.
    let tar = zeros_tar(64, 4 << 20);
    let layer = gzip(&tar);
    assert!(layer.len() < 1 << 20, "{}", layer.len());
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&tar)]}
    });
    reg.push(
        "evil/zeros:1",
        vec![(layer, "application/vnd.oci.image.layer.v1.tar+gzip")],
        serde_json::to_vec(&config).unwrap(),
    )
    .await;
    let (dir, cache) = scratch_cache();
    let mut cfg = RegistryConfig {
        insecure: vec![reg.host()],
        ..Default::default()
    };
    cfg.add_mirror(&format!("docker.io=http://{}", reg.host()))
        .unwrap();
    cfg.limits.max_unpacked_bytes = 16 << 20;
    let e = cache
        .pull_image("evil/zeros:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            OciError::TooLarge {
                what: "unpacked bytes",
                ..
            }
        ),
        "{e}"
    );
    // Nothing usable and no partial tree or blob: at most the entry's lock file.
    for c in cache.list().unwrap() {
        assert!(!c.ready, "{c:?}");
        let entry = c.rootfs.parent().unwrap();
        for leftover in ["rootfs", "rootfs.tmp", "blobs.tmp"] {
            assert!(!entry.join(leftover).exists(), "{leftover} in {c:?}");
        }
    }
    let (bytes, _) = du(dir.path());
    assert!(bytes < 4 << 20, "{bytes} bytes left in the cache");

    // Under the cap, the same image is pulled (the cap is what refused it).
    cfg.limits.max_unpacked_bytes = 512 << 20;
    let img = cache
        .pull_image("evil/zeros:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap();
    assert_eq!(
        std::fs::metadata(img.rootfs.join("zero-63")).unwrap().len(),
        4 << 20
    );
}

/// Allocated bytes and files under `dir`.
fn du(dir: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut files) = (0, 0);
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            bytes += m.blocks() * 512;
            files += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, files)
}
