//! Messages of the `filesystem.Filesystem` service (contract:
//! `proto/filesystem/filesystem.proto`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::json::{self, Timestamp, null_default};

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

crate::proto_enum! {
    /// Kind of a directory entry.
    pub enum FileType {
        /// Unknown (device, socket, FIFO, dangling symlink, ...).
        Unspecified = 0 => "FILE_TYPE_UNSPECIFIED",
        /// Regular file.
        File = 1 => "FILE_TYPE_FILE",
        /// Directory.
        Directory = 2 => "FILE_TYPE_DIRECTORY",
        /// Symbolic link.
        Symlink = 3 => "FILE_TYPE_SYMLINK",
    }
}

crate::proto_enum! {
    /// Kind of a filesystem change.
    pub enum EventType {
        /// Not set.
        Unspecified = 0 => "EVENT_TYPE_UNSPECIFIED",
        /// Created (or moved into the watched tree).
        Create = 1 => "EVENT_TYPE_CREATE",
        /// Contents written.
        Write = 2 => "EVENT_TYPE_WRITE",
        /// Removed.
        Remove = 3 => "EVENT_TYPE_REMOVE",
        /// Renamed away.
        Rename = 4 => "EVENT_TYPE_RENAME",
        /// Metadata (mode, owner, times) changed.
        Chmod = 5 => "EVENT_TYPE_CHMOD",
    }
}

/// Information about a filesystem entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EntryInfo {
    /// Base name.
    #[serde(deserialize_with = "null_default")]
    pub name: String,
    /// Entry type; for a symlink, the type of its target.
    #[serde(rename = "type")]
    pub r#type: FileType,
    /// Absolute path.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
    /// Size in bytes (of the link itself for a symlink).
    #[serde(with = "json::int64")]
    pub size: i64,
    /// Permission bits (`0o777` mask); for a symlink, those of the target.
    #[serde(with = "json::uint32")]
    pub mode: u32,
    /// `ls -l` style permissions, e.g. `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`.
    #[serde(deserialize_with = "null_default")]
    pub permissions: String,
    /// Owner name (or numeric id when unknown).
    #[serde(deserialize_with = "null_default")]
    pub owner: String,
    /// Group name (or numeric id when unknown).
    #[serde(deserialize_with = "null_default")]
    pub group: String,
    /// Last modification time.
    #[serde(skip_serializing_if = "Option::is_none", alias = "modified_time")]
    pub modified_time: Option<Timestamp>,
    /// For a symlink: the fully resolved target path.
    #[serde(skip_serializing_if = "Option::is_none", alias = "symlink_target")]
    pub symlink_target: Option<String>,
    /// User metadata (extended attributes), keys without their namespace prefix.
    #[serde(deserialize_with = "null_default")]
    pub metadata: BTreeMap<String, String>,
    /// Whether the entry itself is a symlink.
    #[serde(deserialize_with = "null_default", alias = "is_symlink")]
    pub is_symlink: bool,
}

/// Request of `Stat`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StatRequest {
    /// Path, absolute or relative to the user's home.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
}

/// Response of `Stat`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StatResponse {
    /// The entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// Request of `MakeDir`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MakeDirRequest {
    /// Directory to create, with any missing parents.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
}

/// Response of `MakeDir`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MakeDirResponse {
    /// The created directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// Request of `Move`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MoveRequest {
    /// Existing path.
    #[serde(deserialize_with = "null_default")]
    pub source: String,
    /// New path.
    #[serde(deserialize_with = "null_default")]
    pub destination: String,
}

/// Response of `Move`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MoveResponse {
    /// The entry at its new path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// Request of `ListDir`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListDirRequest {
    /// Directory to list.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
    /// How many levels to descend; 0 means 1.
    #[serde(with = "json::uint32")]
    pub depth: u32,
}

/// Response of `ListDir`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListDirResponse {
    /// Entries, parents before their children.
    #[serde(deserialize_with = "null_default")]
    pub entries: Vec<EntryInfo>,
}

/// Request of `Remove`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RemoveRequest {
    /// File or directory (removed recursively).
    #[serde(deserialize_with = "null_default")]
    pub path: String,
}

/// Response of `Remove`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RemoveResponse {}

/// Request of `WatchDir`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchDirRequest {
    /// Directory to watch.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
    /// Watch subdirectories too.
    #[serde(deserialize_with = "null_default")]
    pub recursive: bool,
    /// Attach an [`EntryInfo`] to events whose path still exists.
    #[serde(deserialize_with = "null_default", alias = "include_entry")]
    pub include_entry: bool,
    /// Allow watching network or FUSE mounts (no events may arrive from remote changes).
    #[serde(deserialize_with = "null_default", alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

/// A change inside a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FilesystemEvent {
    /// Path relative to the watched directory.
    #[serde(deserialize_with = "null_default")]
    pub name: String,
    /// What happened.
    #[serde(rename = "type")]
    pub r#type: EventType,
    /// The entry after the change, when requested and it still exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// One message of a `WatchDir` stream: `start` first, then `filesystem` events and keepalives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatchDirResponse {
    /// The `event` oneof.
    pub event: Option<watch_dir_response::Event>,
}

/// Nested messages of [`WatchDirResponse`].
pub mod watch_dir_response {
    use serde::{Deserialize, Serialize};

    /// The `event` oneof.
    #[derive(Debug, Clone, PartialEq, Eq)]
    #[expect(
        clippy::large_enum_variant,
        reason = "mirrors the proto oneof; values are short-lived"
    )]
    pub enum Event {
        /// The watch is established.
        Start(StartEvent),
        /// A change.
        Filesystem(super::FilesystemEvent),
        /// Keepalive.
        Keepalive(KeepAlive),
    }

    /// The watch is established.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    pub struct StartEvent {}

    /// Keepalive.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    pub struct KeepAlive {}
}

crate::proto_oneof!(WatchDirResponse.event: watch_dir_response::Event {
    Start(watch_dir_response::StartEvent) = "start" with crate::json::plain,
    Filesystem(FilesystemEvent) = "filesystem" with crate::json::plain,
    Keepalive(watch_dir_response::KeepAlive) = "keepalive" with crate::json::plain,
});

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

/// Request of `CreateWatcher` (same fields as [`WatchDirRequest`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CreateWatcherRequest {
    /// Directory to watch.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
    /// Watch subdirectories too.
    #[serde(deserialize_with = "null_default")]
    pub recursive: bool,
    /// Attach an [`EntryInfo`] to events whose path still exists.
    #[serde(deserialize_with = "null_default", alias = "include_entry")]
    pub include_entry: bool,
    /// Allow watching network or FUSE mounts.
    #[serde(deserialize_with = "null_default", alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

/// Response of `CreateWatcher`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    /// Id to poll with `GetWatcherEvents`.
    #[serde(deserialize_with = "null_default", alias = "watcher_id")]
    pub watcher_id: String,
}

/// Request of `GetWatcherEvents`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetWatcherEventsRequest {
    /// Watcher id.
    #[serde(deserialize_with = "null_default", alias = "watcher_id")]
    pub watcher_id: String,
}

/// Response of `GetWatcherEvents`: the events buffered since the previous call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetWatcherEventsResponse {
    /// Events, oldest first.
    #[serde(deserialize_with = "null_default")]
    pub events: Vec<FilesystemEvent>,
}

/// Request of `RemoveWatcher`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RemoveWatcherRequest {
    /// Watcher id.
    #[serde(deserialize_with = "null_default", alias = "watcher_id")]
    pub watcher_id: String,
}

/// Response of `RemoveWatcher`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RemoveWatcherResponse {}

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
    use serde_json::json;

    use super::*;

    #[test]
    fn entry_info_wire_shape() {
        let entry = EntryInfo {
            name: "a.txt".into(),
            r#type: FileType::File,
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
            serde_json::from_value(json!({"type": 2, "size": 7, "is_symlink": true})).unwrap();
        assert_eq!(
            (numeric.r#type, numeric.size, numeric.is_symlink),
            (FileType::Directory, 7, true)
        );
    }

    #[test]
    fn watch_events() {
        let msg = WatchDirResponse::filesystem(FilesystemEvent {
            name: "sub/x".into(),
            r#type: EventType::Create,
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
            serde_json::from_value(json!({"path": "/x", "recursive": true, "includeEntry": true}))
                .unwrap();
        assert!(req.recursive && req.include_entry && !req.allow_network_mounts);
    }
}
