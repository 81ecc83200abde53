//! Users and groups of the sandbox, read from its `/etc/passwd` and `/etc/group`.
//!
//! The agent runs after `pivot_root`, so these are the template's files. They are read on each
//! request (they are small, and `RUN useradd` in a template or a command inside the sandbox may
//! change them), never through NSS, so the agent behaves the same as a static binary.

use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;

/// Errors resolving the user a request runs as.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The user does not exist in the sandbox.
    #[error(
        "invalid username: user {0:?} does not exist in this sandbox (check /etc/passwd, or create it with `useradd`)"
    )]
    Unknown(String),
    /// The `Authorization` header is not `Basic base64("<user>:")`.
    #[error("invalid username: the Authorization header must be `Basic base64(\"<user>:\")`")]
    BadHeader,
    /// `/etc/passwd` could not be read.
    #[error("Could not read the user database {path}")]
    Io {
        /// File that failed.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// A user account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: PathBuf,
    /// Login shell.
    pub shell: String,
    /// Primary group followed by supplementary groups.
    pub groups: Vec<u32>,
}

impl User {
    /// The credentials a process or file operation of this user runs with.
    pub fn identity(&self) -> Identity {
        Identity {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Numeric credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// All group ids (primary first).
    pub groups: Vec<u32>,
}

#[derive(Debug, Clone)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    shell: String,
}

#[derive(Debug, Clone)]
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// A parsed snapshot of `/etc/passwd` and `/etc/group`.
#[derive(Debug, Clone, Default)]
pub struct UserDb {
    passwd: Vec<PasswdEntry>,
    groups: Vec<GroupEntry>,
}

impl UserDb {
    /// Reads the system files (a missing `/etc/group` is treated as empty).
    pub fn load() -> Result<Self, UserError> {
        Self::load_from(Path::new("/etc/passwd"), Path::new("/etc/group"))
    }

    /// Reads the given files.
    pub fn load_from(passwd: &Path, group: &Path) -> Result<Self, UserError> {
        let passwd_text = std::fs::read_to_string(passwd).map_err(|source| UserError::Io {
            path: passwd.to_owned(),
            source,
        })?;
        let group_text = match std::fs::read_to_string(group) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(UserError::Io {
                    path: group.to_owned(),
                    source,
                });
            }
        };
        Ok(Self::parse(&passwd_text, &group_text))
    }

    /// Parses file contents; malformed lines are skipped.
    pub fn parse(passwd: &str, group: &str) -> Self {
        let passwd = passwd
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                if f.len() < 7 {
                    return None;
                }
                Some(PasswdEntry {
                    name: f[0].to_owned(),
                    uid: f[2].parse().ok()?,
                    gid: f[3].parse().ok()?,
                    home: f[5].to_owned(),
                    shell: f[6].to_owned(),
                })
            })
            .collect();
        let groups = group
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                if f.len() < 4 {
                    return None;
                }
                Some(GroupEntry {
                    name: f[0].to_owned(),
                    gid: f[2].parse().ok()?,
                    members: f[3]
                        .split(',')
                        .map(str::trim)
                        .filter(|m| !m.is_empty())
                        .map(str::to_owned)
                        .collect(),
                })
            })
            .collect();
        Self { passwd, groups }
    }

    /// Looks a user up by name.
    pub fn user(&self, name: &str) -> Result<User, UserError> {
        let entry = self
            .passwd
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| UserError::Unknown(name.to_owned()))?;
        let mut groups = vec![entry.gid];
        for g in &self.groups {
            if g.members.iter().any(|m| m == name) && !groups.contains(&g.gid) {
                groups.push(g.gid);
            }
        }
        Ok(User {
            name: entry.name.clone(),
            uid: entry.uid,
            gid: entry.gid,
            home: PathBuf::from(if entry.home.is_empty() {
                "/"
            } else {
                &entry.home
            }),
            shell: if entry.shell.is_empty() {
                "/bin/sh".to_owned()
            } else {
                entry.shell.clone()
            },
            groups,
        })
    }

    /// The name of a uid, or the number as text.
    pub fn user_name(&self, uid: u32) -> String {
        self.passwd
            .iter()
            .find(|e| e.uid == uid)
            .map_or_else(|| uid.to_string(), |e| e.name.clone())
    }

    /// The name of a gid, or the number as text.
    pub fn group_name(&self, gid: u32) -> String {
        self.groups
            .iter()
            .find(|g| g.gid == gid)
            .map_or_else(|| gid.to_string(), |g| g.name.clone())
    }
}

/// Extracts the username from `Authorization: Basic base64("<user>:")`.
///
/// Returns `Ok(None)` when the header is absent or empty (use the default user).
pub fn username_from_authorization(value: Option<&str>) -> Result<Option<String>, UserError> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let (scheme, encoded) = value.split_once(' ').ok_or(UserError::BadHeader)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(UserError::BadHeader);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(encoded.trim()))
        .map_err(|_| UserError::BadHeader)?;
    let text = String::from_utf8(decoded).map_err(|_| UserError::BadHeader)?;
    let name = text.split_once(':').map_or(text.as_str(), |(n, _)| n);
    if name.is_empty() {
        return Ok(None);
    }
    Ok(Some(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # comment\n\
        user:x:1000:1000::/home/user:/bin/bash\n\
        broken:line\n\
        nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    const GROUP: &str = "root:x:0:\nuser:x:1000:\nsudo:x:27:user,other\ndocker:x:999:other, user\n";

    #[test]
    fn parses_users_and_supplementary_groups() {
        let db = UserDb::parse(PASSWD, GROUP);
        let user = db.user("user").unwrap();
        assert_eq!(user.uid, 1000);
        assert_eq!(user.home, PathBuf::from("/home/user"));
        assert_eq!(user.groups, [1000, 27, 999]);
        assert_eq!(db.user("root").unwrap().groups, [0]);
        assert!(matches!(db.user("ghost"), Err(UserError::Unknown(_))));
        assert!(db.user("broken").is_err());
        assert_eq!(db.user_name(65534), "nobody");
        assert_eq!(db.user_name(4242), "4242");
        assert_eq!(db.group_name(27), "sudo");
        assert_eq!(db.group_name(5), "5");
    }

    #[test]
    fn basic_auth_username() {
        assert_eq!(username_from_authorization(None).unwrap(), None);
        assert_eq!(
            username_from_authorization(Some("Basic cm9vdDo="))
                .unwrap()
                .as_deref(),
            Some("root")
        );
        assert_eq!(
            username_from_authorization(Some("basic dXNlcjo"))
                .unwrap()
                .as_deref(),
            Some("user")
        );
        assert_eq!(
            username_from_authorization(Some("Basic dXNlcg=="))
                .unwrap()
                .as_deref(),
            Some("user")
        );
        assert_eq!(
            username_from_authorization(Some("Basic Og==")).unwrap(),
            None
        );
        assert!(username_from_authorization(Some("Bearer abc")).is_err());
        assert!(username_from_authorization(Some("Basic !!!")).is_err());
    }
}
