//! Pins the exact proto3 JSON of the envd messages, byte for byte.
//!
//! Every case feeds a request or response body, as an SDK or the agent writes it, through the
//! same decoder the agent uses ([`connect::decode_json`]) and re-encodes it with `serde_json`
//! (what the agent's unary and streaming responses do). The expected strings were captured from
//! the hand-written types that the generated code replaced, so they prove the wire did not change:
//! defaults are emitted for plain fields (`"pid":0`, `"isSymlink":false`, `"metadata":{}`), unset
//! `optional` fields and messages are left out, int64 is a string, bytes are standard padded
//! base64, enums are names, timestamps are RFC 3339 in UTC with `Z`, map keys are sorted.

use bulkhead_envd::connect::{self, Code};
use bulkhead_envd::{filesystem as fs, process as pr};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Decodes `input` like the agent does and re-encodes it.
fn rt<T: DeserializeOwned + Serialize>(input: &str) -> String {
    let message: T = connect::decode_json(input.as_bytes())
        .unwrap_or_else(|e| panic!("{input} does not decode: {e}"));
    serde_json::to_string(&message).expect("encodes")
}

/// Asserts that `input` is rejected as `invalid_argument`.
fn rejects<T: DeserializeOwned + Serialize + std::fmt::Debug>(input: &str) {
    match connect::decode_json::<T>(input.as_bytes()) {
        Ok(m) => panic!("{input} decoded to {m:?}"),
        Err(e) => assert_eq!(e.code, Code::InvalidArgument, "{input}: {e}"),
    }
}

#[test]
fn process_start_request() {
    // What the Python and JS SDKs send for `commands.run("echo hi", envs=..., cwd=...)`.
    assert_eq!(
        rt::<pr::StartRequest>(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"B":"2","A":"1"},"cwd":"/tmp"},"stdin":false,"tag":"t","someFutureField":{"x":1}}"#
        ),
        r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1","B":"2"},"cwd":"/tmp"},"tag":"t","stdin":false}"#
    );
    // PTY with sizes as strings (proto3 JSON accepts both), null for defaults.
    assert_eq!(
        rt::<pr::StartRequest>(
            r#"{"process":{"cmd":"bash","args":null,"envs":null},"pty":{"size":{"cols":"80","rows":24}}}"#
        ),
        r#"{"process":{"cmd":"bash","args":[],"envs":{}},"pty":{"size":{"cols":80,"rows":24}}}"#
    );
    assert_eq!(rt::<pr::StartRequest>("{}"), "{}");
    assert_eq!(rt::<pr::StartRequest>(""), "{}");
    assert_eq!(
        rt::<pr::StartRequest>(r#"{"process":{}}"#),
        r#"{"process":{"cmd":"","args":[],"envs":{}}}"#
    );
    rejects::<pr::StartRequest>("[");
    rejects::<pr::StartRequest>(r#"{"process":{"cmd":5}}"#);
}

#[test]
fn process_events() {
    let cases = [
        (
            r#"{"event":{"start":{"pid":42}}}"#,
            r#"{"event":{"start":{"pid":42}}}"#,
        ),
        (
            r#"{"event":{"start":{}}}"#,
            r#"{"event":{"start":{"pid":0}}}"#,
        ),
        (
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#,
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#,
        ),
        // URL-safe and unpadded base64 are accepted; output is standard with padding.
        (
            r#"{"event":{"data":{"stderr":"-_8"}}}"#,
            r#"{"event":{"data":{"stderr":"+/8="}}}"#,
        ),
        (
            r#"{"event":{"data":{"pty":"G1sxbQ=="}}}"#,
            r#"{"event":{"data":{"pty":"G1sxbQ=="}}}"#,
        ),
        (r#"{"event":{"data":{}}}"#, r#"{"event":{"data":{}}}"#),
        (
            r#"{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed","error":"signal: killed"}}}"#,
            r#"{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed","error":"signal: killed"}}}"#,
        ),
        (
            r#"{"event":{"end":{"exit_code":"3","exited":true}}}"#,
            r#"{"event":{"end":{"exitCode":3,"exited":true,"status":""}}}"#,
        ),
        (
            r#"{"event":{"end":{}}}"#,
            r#"{"event":{"end":{"exitCode":0,"exited":false,"status":""}}}"#,
        ),
        (
            r#"{"event":{"keepalive":{}}}"#,
            r#"{"event":{"keepalive":{}}}"#,
        ),
        // Unknown oneof members and fields are ignored; null members count as unset.
        (r#"{"event":{"other":1,"start":null}}"#, r#"{"event":{}}"#),
        (r#"{"event":null}"#, "{}"),
        ("{}", "{}"),
    ];
    for (input, output) in cases {
        assert_eq!(rt::<pr::StartResponse>(input), output, "{input}");
        assert_eq!(rt::<pr::ConnectResponse>(input), output, "{input}");
    }
    rejects::<pr::StartResponse>(r#"{"event":{"start":{"pid":1},"end":{}}}"#);
    rejects::<pr::StartResponse>(r#"{"event":{"data":{"stdout":"!!"}}}"#);
    rejects::<pr::StartResponse>(r#"{"event":{"start":{"pid":-1}}}"#);
}

#[test]
fn process_list_and_selectors() {
    assert_eq!(
        rt::<pr::ListResponse>(
            r#"{"processes":[{"config":{"cmd":"sleep","args":["9"],"envs":{}},"pid":7,"tag":"bg"},{"pid":"8"}]}"#
        ),
        r#"{"processes":[{"config":{"cmd":"sleep","args":["9"],"envs":{}},"pid":7,"tag":"bg"},{"pid":8}]}"#
    );
    assert_eq!(rt::<pr::ListResponse>("{}"), r#"{"processes":[]}"#);
    assert_eq!(rt::<pr::ListRequest>(r#"{"x":1}"#), "{}");
    assert_eq!(
        rt::<pr::ConnectRequest>(r#"{"process":{"pid":"42"}}"#),
        r#"{"process":{"pid":42}}"#
    );
    assert_eq!(
        rt::<pr::ConnectRequest>(r#"{"process":{"tag":"t"}}"#),
        r#"{"process":{"tag":"t"}}"#
    );
    assert_eq!(
        rt::<pr::ConnectRequest>(r#"{"process":{"pid":1,"tag":null}}"#),
        r#"{"process":{"pid":1}}"#
    );
    assert_eq!(
        rt::<pr::ConnectRequest>(r#"{"process":{}}"#),
        r#"{"process":{}}"#
    );
    rejects::<pr::ConnectRequest>(r#"{"process":{"pid":1,"tag":"x"}}"#);
    assert_eq!(
        rt::<pr::CloseStdinRequest>(r#"{"process":{"pid":3}}"#),
        r#"{"process":{"pid":3}}"#
    );
}

#[test]
fn process_input_signal_update() {
    assert_eq!(
        rt::<pr::SendInputRequest>(r#"{"process":{"pid":3},"input":{"stdin":"aGVsbG8="}}"#),
        r#"{"process":{"pid":3},"input":{"stdin":"aGVsbG8="}}"#
    );
    assert_eq!(
        rt::<pr::SendInputRequest>(r#"{"process":{"tag":"t"},"input":{"pty":"BA"}}"#),
        r#"{"process":{"tag":"t"},"input":{"pty":"BA=="}}"#
    );
    assert_eq!(
        rt::<pr::StreamInputRequest>(r#"{"start":{"process":{"pid":5}}}"#),
        r#"{"start":{"process":{"pid":5}}}"#
    );
    assert_eq!(
        rt::<pr::StreamInputRequest>(r#"{"data":{"input":{"stdin":"eA=="}}}"#),
        r#"{"data":{"input":{"stdin":"eA=="}}}"#
    );
    assert_eq!(
        rt::<pr::StreamInputRequest>(r#"{"keepalive":{}}"#),
        r#"{"keepalive":{}}"#
    );
    assert_eq!(
        rt::<pr::StreamInputRequest>(r#"{"data":{}}"#),
        r#"{"data":{}}"#
    );
    for (input, output) in [
        (
            r#"{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}"#,
            r#"{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}"#,
        ),
        (r#"{"signal":15}"#, r#"{"signal":"SIGNAL_SIGTERM"}"#),
        (
            r#"{"signal":"SIGHUP"}"#,
            r#"{"signal":"SIGNAL_UNSPECIFIED"}"#,
        ),
        (r#"{"signal":1}"#, r#"{"signal":"SIGNAL_UNSPECIFIED"}"#),
        ("{}", r#"{"signal":"SIGNAL_UNSPECIFIED"}"#),
    ] {
        assert_eq!(rt::<pr::SendSignalRequest>(input), output, "{input}");
    }
    assert_eq!(
        rt::<pr::UpdateRequest>(r#"{"process":{"pid":2},"pty":{"size":{"cols":100,"rows":30}}}"#),
        r#"{"process":{"pid":2},"pty":{"size":{"cols":100,"rows":30}}}"#
    );
    assert_eq!(rt::<pr::UpdateRequest>(r#"{"pty":{}}"#), r#"{"pty":{}}"#);
    for empty in ["{}", r#"{"unknown":true}"#] {
        assert_eq!(rt::<pr::UpdateResponse>(empty), "{}");
        assert_eq!(rt::<pr::SendInputResponse>(empty), "{}");
        assert_eq!(rt::<pr::StreamInputResponse>(empty), "{}");
        assert_eq!(rt::<pr::SendSignalResponse>(empty), "{}");
        assert_eq!(rt::<pr::CloseStdinResponse>(empty), "{}");
    }
}

#[test]
fn filesystem_entries() {
    let file = r#"{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt","size":"5","mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user","modifiedTime":"2023-11-14T22:13:20Z","metadata":{},"isSymlink":false}"#;
    assert_eq!(rt::<fs::EntryInfo>(file), file);
    assert_eq!(
        rt::<fs::EntryInfo>(
            r#"{"name":"l","type":2,"size":7,"mode":"511","modified_time":"2023-11-14T23:13:20.12+01:00","symlink_target":"/tmp/d","metadata":{"z":"1","a":"2"},"is_symlink":true}"#
        ),
        r#"{"name":"l","type":"FILE_TYPE_DIRECTORY","path":"","size":"7","mode":511,"permissions":"","owner":"","group":"","modifiedTime":"2023-11-14T22:13:20.120Z","symlinkTarget":"/tmp/d","metadata":{"a":"2","z":"1"},"isSymlink":true}"#
    );
    assert_eq!(
        rt::<fs::EntryInfo>(
            r#"{"modifiedTime":"1970-01-01T00:00:00.000001Z","type":"FILE_TYPE_NEW"}"#
        ),
        r#"{"name":"","type":"FILE_TYPE_UNSPECIFIED","path":"","size":"0","mode":0,"permissions":"","owner":"","group":"","modifiedTime":"1970-01-01T00:00:00.000001Z","metadata":{},"isSymlink":false}"#
    );
    assert_eq!(
        rt::<fs::EntryInfo>(
            r#"{"modifiedTime":"2001-02-03T04:05:06.000000007Z","type":"FILE_TYPE_SYMLINK"}"#
        ),
        r#"{"name":"","type":"FILE_TYPE_SYMLINK","path":"","size":"0","mode":0,"permissions":"","owner":"","group":"","modifiedTime":"2001-02-03T04:05:06.000000007Z","metadata":{},"isSymlink":false}"#
    );
    rejects::<fs::EntryInfo>(r#"{"modifiedTime":"yesterday"}"#);
    rejects::<fs::EntryInfo>(r#"{"size":"x"}"#);
    let empty_entry = r#"{"name":"","type":"FILE_TYPE_UNSPECIFIED","path":"","size":"0","mode":0,"permissions":"","owner":"","group":"","metadata":{},"isSymlink":false}"#;
    assert_eq!(rt::<fs::EntryInfo>("{}"), empty_entry);
    assert_eq!(
        rt::<fs::StatResponse>(&format!(r#"{{"entry":{file}}}"#)),
        format!(r#"{{"entry":{file}}}"#)
    );
    assert_eq!(rt::<fs::StatResponse>("{}"), "{}");
    assert_eq!(rt::<fs::MakeDirResponse>("{}"), "{}");
    assert_eq!(
        rt::<fs::MoveResponse>(r#"{"entry":{}}"#),
        format!(r#"{{"entry":{empty_entry}}}"#)
    );
    assert_eq!(
        rt::<fs::ListDirResponse>(&format!(r#"{{"entries":[{file},{file}]}}"#)),
        format!(r#"{{"entries":[{file},{file}]}}"#)
    );
    assert_eq!(rt::<fs::ListDirResponse>("{}"), r#"{"entries":[]}"#);
    assert_eq!(rt::<fs::RemoveResponse>("{}"), "{}");
}

#[test]
fn filesystem_requests() {
    assert_eq!(
        rt::<fs::ListDirRequest>(r#"{"path":"/home/user","depth":2}"#),
        r#"{"path":"/home/user","depth":2}"#
    );
    assert_eq!(
        rt::<fs::ListDirRequest>(r#"{"path":"x"}"#),
        r#"{"path":"x","depth":0}"#
    );
    assert_eq!(rt::<fs::StatRequest>("{}"), r#"{"path":""}"#);
    assert_eq!(
        rt::<fs::MakeDirRequest>(r#"{"path":"d"}"#),
        r#"{"path":"d"}"#
    );
    assert_eq!(
        rt::<fs::RemoveRequest>(r#"{"path":null}"#),
        r#"{"path":""}"#
    );
    assert_eq!(
        rt::<fs::MoveRequest>(r#"{"source":"a","destination":"b"}"#),
        r#"{"source":"a","destination":"b"}"#
    );
    let watch = r#"{"path":"/x","recursive":true,"includeEntry":true,"allowNetworkMounts":false}"#;
    assert_eq!(rt::<fs::WatchDirRequest>(watch), watch);
    assert_eq!(rt::<fs::CreateWatcherRequest>(watch), watch);
    assert_eq!(
        rt::<fs::WatchDirRequest>(
            r#"{"path":"/x","include_entry":true,"allow_network_mounts":true}"#
        ),
        r#"{"path":"/x","recursive":false,"includeEntry":true,"allowNetworkMounts":true}"#
    );
    assert_eq!(
        rt::<fs::CreateWatcherResponse>(r#"{"watcher_id":"w1"}"#),
        r#"{"watcherId":"w1"}"#
    );
    assert_eq!(
        rt::<fs::GetWatcherEventsRequest>(r#"{"watcherId":"w1"}"#),
        r#"{"watcherId":"w1"}"#
    );
    assert_eq!(
        rt::<fs::RemoveWatcherRequest>(r#"{"watcher_id":"w1"}"#),
        r#"{"watcherId":"w1"}"#
    );
    assert_eq!(rt::<fs::RemoveWatcherResponse>("{}"), "{}");
}

#[test]
fn filesystem_watch_events() {
    for (input, output) in [
        (r#"{"start":{}}"#, r#"{"start":{}}"#),
        (r#"{"keepalive":{}}"#, r#"{"keepalive":{}}"#),
        (
            r#"{"filesystem":{"name":"sub/x","type":"EVENT_TYPE_CREATE"}}"#,
            r#"{"filesystem":{"name":"sub/x","type":"EVENT_TYPE_CREATE"}}"#,
        ),
        (
            r#"{"filesystem":{"name":"a","type":5,"entry":{"name":"a","type":"FILE_TYPE_FILE"}}}"#,
            r#"{"filesystem":{"name":"a","type":"EVENT_TYPE_CHMOD","entry":{"name":"a","type":"FILE_TYPE_FILE","path":"","size":"0","mode":0,"permissions":"","owner":"","group":"","metadata":{},"isSymlink":false}}}"#,
        ),
        (
            r#"{"filesystem":{}}"#,
            r#"{"filesystem":{"name":"","type":"EVENT_TYPE_UNSPECIFIED"}}"#,
        ),
        ("{}", "{}"),
    ] {
        assert_eq!(rt::<fs::WatchDirResponse>(input), output, "{input}");
    }
    rejects::<fs::WatchDirResponse>(r#"{"start":{},"keepalive":{}}"#);
    assert_eq!(
        rt::<fs::GetWatcherEventsResponse>(
            r#"{"events":[{"name":"a","type":"EVENT_TYPE_WRITE"},{"name":"b","type":"EVENT_TYPE_REMOVE"}]}"#
        ),
        r#"{"events":[{"name":"a","type":"EVENT_TYPE_WRITE"},{"name":"b","type":"EVENT_TYPE_REMOVE"}]}"#
    );
    assert_eq!(rt::<fs::GetWatcherEventsResponse>("{}"), r#"{"events":[]}"#);
}
