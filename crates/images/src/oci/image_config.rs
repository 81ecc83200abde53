//! The parts of an OCI image config a template builder applies: user, environment, working
//! directory, entrypoint and command (what `docker run` would use).

use std::collections::BTreeMap;

use oci_client::config::ConfigFile;
use serde::{Deserialize, Serialize};

use super::error::OciError;

/// What the image says about running it. Empty fields mean the image does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `USER`: a name or uid, optionally `:group`. `None`: root.
    pub user: Option<String>,
    /// `ENV`, in order, as (name, value).
    pub env: Vec<(String, String)>,
    /// `WORKDIR`. `None`: `/`.
    pub workdir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `EXPOSE`d ports, e.g. `8080/tcp`, sorted.
    pub exposed_ports: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub os: String,
    pub architecture: String,
    /// The uncompressed digests of the layers, in order (the config's `rootfs.diff_ids`).
    pub diff_ids: Vec<String>,
}

impl ImageConfig {
    pub fn parse(json: &str, reference: &str) -> Result<ImageConfig, OciError> {
        let file: ConfigFile = serde_json::from_str(json).map_err(|e| OciError::BadImage {
            reference: reference.to_owned(),
            reason: format!("its config is not an OCI image config: {e}"),
        })?;
        let c = file.config.unwrap_or_default();
        let env = c
            .env
            .unwrap_or_default()
            .into_iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (kv, String::new()),
            })
            .collect();
        let mut exposed_ports: Vec<String> =
            c.exposed_ports.unwrap_or_default().into_iter().collect();
        exposed_ports.sort();
        Ok(ImageConfig {
            user: c.user.filter(|u| !u.is_empty()),
            env,
            workdir: c.working_dir.filter(|w| !w.is_empty()),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            exposed_ports,
            labels: c.labels.unwrap_or_default().into_iter().collect(),
            os: file.os.to_string(),
            architecture: file.architecture.to_string(),
            diff_ids: file.rootfs.diff_ids,
        })
    }

    /// `ENTRYPOINT` followed by `CMD`, as `docker run` starts it; `None` if both are empty.
    pub fn start_command(&self) -> Option<Vec<String>> {
        let argv: Vec<String> = self.entrypoint.iter().chain(&self.cmd).cloned().collect();
        (!argv.is_empty()).then_some(argv)
    }

    /// The value of `name` in [`env`](Self::env) (the last one wins, as in a shell).
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_docker_style_config() {
        let json = r#"{"architecture":"amd64","os":"linux",
          "config":{"User":"app:app","Env":["PATH=/usr/bin:/bin","EMPTY","A=b=c"],
            "WorkingDir":"/srv","Entrypoint":["/bin/sh","-c"],"Cmd":["echo hi"],
            "ExposedPorts":{"8080/tcp":{},"53/udp":{}},"Labels":{"k":"v"}},
          "rootfs":{"type":"layers","diff_ids":["sha256:aa","sha256:bb"]}}"#;
        let c = ImageConfig::parse(json, "x").unwrap();
        assert_eq!(c.user.as_deref(), Some("app:app"));
        assert_eq!(c.env_var("A"), Some("b=c"));
        assert_eq!(c.env_var("EMPTY"), Some(""));
        assert_eq!(c.workdir.as_deref(), Some("/srv"));
        assert_eq!(
            c.start_command().unwrap(),
            ["/bin/sh", "-c", "echo hi"].map(String::from)
        );
        assert_eq!(c.exposed_ports, ["53/udp", "8080/tcp"]);
        assert_eq!(c.diff_ids.len(), 2);
        assert_eq!((c.os.as_str(), c.architecture.as_str()), ("linux", "amd64"));
        let bare =
            r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        let c = ImageConfig::parse(bare, "x").unwrap();
        assert_eq!(c.start_command(), None);
        assert!(ImageConfig::parse("{}", "x").is_err());
    }
}
