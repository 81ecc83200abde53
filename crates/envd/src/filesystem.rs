//! Messages of the `filesystem.Filesystem` service, generated at build time from
//! `proto/filesystem/filesystem.proto` (see the crate docs), plus the service's method names and
//! a few constructors. Enum-typed fields (`EntryInfo::r#type`, `FilesystemEvent::r#type`) are
//! `i32` on the struct; read them with the generated getter (`entry.r#type()`).

include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));

/// Fully qualified service name.
pub const SERVICE: &str = "filesystem.Filesystem";

/// Method names of `filesystem.Filesystem`.
pub mod method {
    /// Unary: [`super::StatRequest`] → [`super::StatResponse`].
    pub const STAT: &str = "Stat";
    /// Unary: [`super::MakeDirRequest`] → [`super::MakeDirResponse`].
    pub const MAKE_DIR: &str = "MakeDir";
    /// Unary: [`super::MoveRequest`] → [`super::MoveResponse`].
    pub const MOVE: &str = "Move";
    /// Unary: [`super::ListDirRequest`] → [`super::ListDirResponse`].
    pub const LIST_DIR: &str = "ListDir";
    /// Unary: [`super::RemoveRequest`] → [`super::RemoveResponse`].
    pub const REMOVE: &str = "Remove";
    /// Server stream: [`super::WatchDirRequest`] → [`super::WatchDirResponse`]*.
    pub const WATCH_DIR: &str = "WatchDir";
    /// Unary: [`super::CreateWatcherRequest`] → [`super::CreateWatcherResponse`].
    pub const CREATE_WATCHER: &str = "CreateWatcher";
    /// Unary: [`super::GetWatcherEventsRequest`] → [`super::GetWatcherEventsResponse`].
    pub const GET_WATCHER_EVENTS: &str = "GetWatcherEvents";
    /// Unary: [`super::RemoveWatcherRequest`] → [`super::RemoveWatcherResponse`].
    pub const REMOVE_WATCHER: &str = "RemoveWatcher";
}

/// The HTTP path of a method, e.g. `/filesystem.Filesystem/Stat`.
pub fn path(method: &str) -> String {
    format!("/{SERVICE}/{method}")
}

impl WatchDirResponse {
    /// The `start` message.
    pub fn start() -> Self {
        Self {
            event: Some(watch_dir_response::Event::Start(
                watch_dir_response::StartEvent {},
            )),
        }
    }

    /// A `filesystem` message.
    pub fn filesystem(event: FilesystemEvent) -> Self {
        Self {
            event: Some(watch_dir_response::Event::Filesystem(event)),
        }
    }

    /// A `keepalive` message.
    pub fn keepalive() -> Self {
        Self {
            event: Some(watch_dir_response::Event::Keepalive(
                watch_dir_response::KeepAlive {},
            )),
        }
    }
}

impl From<WatchDirRequest> for CreateWatcherRequest {
    fn from(r: WatchDirRequest) -> Self {
        Self {
            path: r.path,
            recursive: r.recursive,
            include_entry: r.include_entry,
            allow_network_mounts: r.allow_network_mounts,
        }
    }
}

impl From<CreateWatcherRequest> for WatchDirRequest {
    fn from(r: CreateWatcherRequest) -> Self {
        Self {
            path: r.path,
            recursive: r.recursive,
            include_entry: r.include_entry,
            allow_network_mounts: r.allow_network_mounts,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::Timestamp;
    use crate::connect::decode_json;

    #[test]
    fn entry_info_wire_shape() {
        let entry = EntryInfo {
            name: "a.txt".into(),
            r#type: FileType::File.into(),
            path: "/home/user/a.txt".into(),
            size: 5,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            modified_time: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            symlink_target: None,
            metadata: BTreeMap::new(),
            is_symlink: false,
        };
        let value = serde_json::to_value(&entry).unwrap();
        assert_eq!(
            value,
            json!({
                "name": "a.txt", "type": "FILE_TYPE_FILE", "path": "/home/user/a.txt",
                "size": "5", "mode": 420, "permissions": "-rw-r--r--", "owner": "user",
                "group": "user", "modifiedTime": "2023-11-14T22:13:20Z", "metadata": {},
                "isSymlink": false
            })
        );
        let back: EntryInfo = serde_json::from_value(value).unwrap();
        assert_eq!(back, entry);
        let numeric: EntryInfo =
            decode_json(br#"{"type": 2, "size": 7, "is_symlink": true}"#).unwrap();
        assert_eq!(
            (numeric.r#type(), numeric.size, numeric.is_symlink),
            (FileType::Directory, 7, true)
        );
    }

    #[test]
    fn watch_events() {
        let msg = WatchDirResponse::filesystem(FilesystemEvent {
            name: "sub/x".into(),
            r#type: EventType::Create.into(),
            entry: None,
        });
        assert_eq!(
            serde_json::to_value(&msg).unwrap(),
            json!({"filesystem": {"name": "sub/x", "type": "EVENT_TYPE_CREATE"}})
        );
        assert_eq!(
            serde_json::to_value(WatchDirResponse::start()).unwrap(),
            json!({"start": {}})
        );
        let req: WatchDirRequest =
            decode_json(br#"{"path": "/x", "recursive": true, "includeEntry": true}"#).unwrap();
        assert!(req.recursive && req.include_entry && !req.allow_network_mounts);
    }
}
