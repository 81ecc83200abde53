//! A real OCI registry for the pull tests: Debian's `docker-registry` (CNCF distribution)
//! on 127.0.0.1, a free port, plain HTTP, storage in a temporary directory; killed on drop.
//! Plus pushing images into it with the same OCI client the puller uses.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
/// `user:bcrypt(password)` for the registry's htpasswd auth (cost 4 keeps requests quick).
const HTPASSWD: &str = "tester:$2b$04$NGUCcI/7rBqGwnXyGTNgyODMc8mWk8IQ0DRMhc/8Evp6YnbrfRpoO\n";
pub const USER: &str = "tester";
pub const PASSWORD: &str = "bulkhead-pw";

pub struct Registry {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Registry {
    /// Starts the registry; with `basic_auth`, every request needs [`USER`]/[`PASSWORD`].
    pub fn start(basic_auth: bool) -> Registry {
        if !std::path::Path::new(REGISTRY_BIN).exists() {
            bulkhead_testkit::missing(
                "docker-registry",
                &format!("{REGISTRY_BIN} is not installed"),
                "apt-get install docker-registry (scripts/test.sh installs it)",
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("bulkhead-registry-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let port = free_port();
        let auth = if basic_auth {
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, HTPASSWD).unwrap();
            format!(
                "auth:\n  htpasswd:\n    realm: bulkhead-test\n    path: {}\n",
                htpasswd.display()
            )
        } else {
            String::new()
        };
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n{auth}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let mut r = Registry {
            port,
            child,
            _dir: dir,
        };
        r.wait_ready();
        r
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log(&self) -> PathBuf {
        self._dir.path().join("registry.log")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "docker-registry exited ({status}): {}",
                    std::fs::read_to_string(self.log()).unwrap_or_default()
                );
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\nHost: x\r\n\r\n");
                let mut buf = [0u8; 12];
                if s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.") {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "docker-registry did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Pushes an image (layers already compressed, with their media types) under `reference`
    /// (`repo:tag`) and returns the manifest URL.
    pub async fn push(
        &self,
        reference: &str,
        layers: Vec<(Vec<u8>, &str)>,
        config_json: Vec<u8>,
    ) -> String {
        // reqwest has no default TLS provider in this build (see the crate's Cargo.toml).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..Default::default()
        });
        let r: Reference = format!("{}/{reference}", self.host()).parse().unwrap();
        let layers: Vec<ImageLayer> = layers
            .into_iter()
            .map(|(data, media_type)| ImageLayer::new(data, media_type.to_owned(), None))
            .collect();
        let config = Config::oci_v1(config_json, None);
        let auth = if self.has_auth() {
            RegistryAuth::Basic(USER.into(), PASSWORD.into())
        } else {
            RegistryAuth::Anonymous
        };
        client
            .push(&r, &layers, config, &auth, None)
            .await
            .expect("push to the test registry")
            .manifest_url
    }

    fn has_auth(&self) -> bool {
        self._dir.path().join("htpasswd").exists()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
