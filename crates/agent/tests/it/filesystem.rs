//! `filesystem.Filesystem` against the real agent.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bulkhead_envd::ConnectError;
use bulkhead_envd::connect::{Code, StreamFrame};
use bulkhead_envd::filesystem::{
    CreateWatcherResponse, EntryInfo, EventType, FileType, FilesystemEvent,
    GetWatcherEventsResponse, ListDirResponse, MakeDirResponse, MoveResponse, StatResponse,
    WatchDirResponse, watch_dir_response,
};
use http::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Agent, EventStream, basic_auth};

async fn rpc<T: serde::de::DeserializeOwned>(
    agent: &Agent,
    method: &str,
    body: Value,
) -> Result<T, (StatusCode, ConnectError)> {
    agent
        .unary(&format!("/filesystem.Filesystem/{method}"), &body, &[])
        .await
}

async fn rpc_as<T: serde::de::DeserializeOwned>(
    agent: &Agent,
    user: &str,
    method: &str,
    body: Value,
) -> Result<T, (StatusCode, ConnectError)> {
    let auth = basic_auth(user);
    agent
        .unary(
            &format!("/filesystem.Filesystem/{method}"),
            &body,
            &[("authorization", &auth)],
        )
        .await
}

async fn stat(agent: &Agent, path: &str) -> Result<EntryInfo, (StatusCode, ConnectError)> {
    rpc::<StatResponse>(agent, "Stat", json!({ "path": path }))
        .await
        .map(|r| r.entry.unwrap())
}

fn code<T: std::fmt::Debug>(result: Result<T, (StatusCode, ConnectError)>) -> (StatusCode, Code) {
    let (status, err) = result.unwrap_err();
    (status, err.code)
}

#[tokio::test]
async fn stat_make_list_move_remove() {
    let agent = Agent::start(&[]).await;
    let root = agent.path().join("work");
    let root_s = root.display().to_string();

    let made: MakeDirResponse = rpc(
        &agent,
        "MakeDir",
        json!({ "path": format!("{root_s}/a/b/c") }),
    )
    .await
    .unwrap();
    let entry = made.entry.unwrap();
    assert_eq!(
        (entry.name.as_str(), entry.r#type()),
        ("c", FileType::Directory)
    );
    assert_eq!(entry.path, format!("{root_s}/a/b/c"));
    assert_eq!(
        code(
            rpc::<MakeDirResponse>(
                &agent,
                "MakeDir",
                json!({ "path": format!("{root_s}/a/b/c") })
            )
            .await
        ),
        (StatusCode::CONFLICT, Code::AlreadyExists)
    );

    std::fs::write(root.join("a/file.txt"), "hello").unwrap();
    std::fs::set_permissions(
        root.join("a/file.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(root.join("a/b/deep.txt"), "x").unwrap();
    assert_eq!(
        code(
            rpc::<MakeDirResponse>(
                &agent,
                "MakeDir",
                json!({ "path": format!("{root_s}/a/file.txt") })
            )
            .await
        ),
        (StatusCode::BAD_REQUEST, Code::InvalidArgument)
    );

    let entry = stat(&agent, &format!("{root_s}/a/file.txt")).await.unwrap();
    assert_eq!(
        (entry.r#type(), entry.size, entry.mode),
        (FileType::File, 5, 0o640)
    );
    assert_eq!(entry.permissions, "-rw-r-----");
    assert_eq!(
        (entry.owner.as_str(), entry.group.as_str()),
        ("root", "root")
    );
    assert!(!entry.is_symlink && entry.symlink_target.is_none());
    assert!(entry.modified_time.is_some());

    let names = |r: ListDirResponse| {
        r.entries
            .into_iter()
            .map(|e| e.path.replace(&root_s, ""))
            .collect::<Vec<_>>()
    };
    let one: ListDirResponse = rpc(&agent, "ListDir", json!({ "path": format!("{root_s}/a") }))
        .await
        .unwrap();
    assert_eq!(names(one), ["/a/b", "/a/file.txt"]);
    let zero: ListDirResponse = rpc(
        &agent,
        "ListDir",
        json!({ "path": format!("{root_s}/a"), "depth": 0 }),
    )
    .await
    .unwrap();
    assert_eq!(names(zero), ["/a/b", "/a/file.txt"]);
    let three: ListDirResponse = rpc(
        &agent,
        "ListDir",
        json!({ "path": format!("{root_s}/a"), "depth": 3 }),
    )
    .await
    .unwrap();
    assert_eq!(
        names(three),
        ["/a/b", "/a/b/c", "/a/b/deep.txt", "/a/file.txt"]
    );
    assert_eq!(
        code(
            rpc::<ListDirResponse>(
                &agent,
                "ListDir",
                json!({ "path": format!("{root_s}/a/file.txt") })
            )
            .await
        ),
        (StatusCode::BAD_REQUEST, Code::InvalidArgument)
    );
    let (_, err) = rpc::<ListDirResponse>(
        &agent,
        "ListDir",
        json!({ "path": format!("{root_s}/a/file.txt") }),
    )
    .await
    .unwrap_err();
    assert!(
        err.message.contains("path is not a directory"),
        "{}",
        err.message
    );
    assert_eq!(
        code(
            rpc::<ListDirResponse>(
                &agent,
                "ListDir",
                json!({ "path": format!("{root_s}/missing") })
            )
            .await
        ),
        (StatusCode::NOT_FOUND, Code::NotFound)
    );

    let moved: MoveResponse = rpc(
        &agent,
        "Move",
        json!({ "source": format!("{root_s}/a/file.txt"), "destination": format!("{root_s}/new/dir/renamed.txt") }),
    )
    .await
    .unwrap();
    assert_eq!(
        moved.entry.unwrap().path,
        format!("{root_s}/new/dir/renamed.txt")
    );
    assert_eq!(
        std::fs::read_to_string(root.join("new/dir/renamed.txt")).unwrap(),
        "hello"
    );
    assert_eq!(
        code(stat(&agent, &format!("{root_s}/a/file.txt")).await),
        (StatusCode::NOT_FOUND, Code::NotFound)
    );
    assert_eq!(
        code(
            rpc::<MoveResponse>(
                &agent,
                "Move",
                json!({ "source": format!("{root_s}/nope"), "destination": format!("{root_s}/x") })
            )
            .await
        ),
        (StatusCode::NOT_FOUND, Code::NotFound)
    );

    rpc::<Value>(&agent, "Remove", json!({ "path": format!("{root_s}/a") }))
        .await
        .unwrap();
    assert!(!root.join("a").exists());
    // Removing what does not exist succeeds, as in envd.
    rpc::<Value>(&agent, "Remove", json!({ "path": format!("{root_s}/a") }))
        .await
        .unwrap();
}

#[tokio::test]
async fn symlinks_and_loops() {
    let agent = Agent::start(&[]).await;
    let dir = agent.path();
    std::fs::write(dir.join("target.txt"), "abc").unwrap();
    std::os::unix::fs::symlink(dir.join("target.txt"), dir.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.join("loop-b"), dir.join("loop-a")).unwrap();
    std::os::unix::fs::symlink(dir.join("loop-a"), dir.join("loop-b")).unwrap();

    let entry = stat(&agent, &dir.join("link").display().to_string())
        .await
        .unwrap();
    assert!(entry.is_symlink);
    assert_eq!(entry.r#type(), FileType::File);
    let canonical = std::fs::canonicalize(dir.join("target.txt")).unwrap();
    assert_eq!(
        entry.symlink_target.as_deref(),
        Some(canonical.to_str().unwrap())
    );

    assert_eq!(
        code(
            rpc::<ListDirResponse>(&agent, "ListDir", json!({ "path": dir.join("loop-a") })).await
        ),
        (StatusCode::BAD_REQUEST, Code::FailedPrecondition)
    );
    let entry = stat(&agent, &dir.join("loop-a").display().to_string())
        .await
        .unwrap();
    assert!(entry.is_symlink);
    assert_eq!(entry.r#type(), FileType::Unspecified);
}

async fn next_fs_event(stream: &mut EventStream<WatchDirResponse>) -> FilesystemEvent {
    loop {
        match stream.message().await.event {
            Some(watch_dir_response::Event::Filesystem(e)) => return e,
            Some(watch_dir_response::Event::Keepalive(_)) => {}
            other => panic!("unexpected watch message {other:?}"),
        }
    }
}

async fn wait_for_event(
    stream: &mut EventStream<WatchDirResponse>,
    name: &str,
    r#type: EventType,
) -> FilesystemEvent {
    loop {
        let event = next_fs_event(stream).await;
        if event.name == name && event.r#type() == r#type {
            return event;
        }
    }
}

#[tokio::test]
async fn watch_dir_reports_recursive_events() {
    let agent = Agent::start(&[]).await;
    let dir = agent.path().join("watched");
    std::fs::create_dir(&dir).unwrap();
    let mut stream: EventStream<WatchDirResponse> = agent
        .stream(
            "/filesystem.Filesystem/WatchDir",
            &json!({ "path": dir, "recursive": true, "includeEntry": true }),
            &[],
        )
        .await;
    assert_eq!(stream.message().await, WatchDirResponse::start());

    std::fs::write(dir.join("a.txt"), "1").unwrap();
    let created = wait_for_event(&mut stream, "a.txt", EventType::Create).await;
    assert_eq!(created.entry.unwrap().name, "a.txt");
    wait_for_event(&mut stream, "a.txt", EventType::Write).await;

    std::fs::create_dir(dir.join("sub")).unwrap();
    let created = wait_for_event(&mut stream, "sub", EventType::Create).await;
    assert_eq!(created.entry.unwrap().r#type(), FileType::Directory);
    // The new directory is watched too.
    std::fs::write(dir.join("sub/b.txt"), "2").unwrap();
    wait_for_event(&mut stream, "sub/b.txt", EventType::Create).await;

    // What a new directory tree already holds when it is noticed is reported too.
    std::fs::create_dir_all(dir.join("new/deeper")).unwrap();
    std::fs::write(dir.join("new/deeper/f.txt"), "3").unwrap();
    wait_for_event(&mut stream, "new/deeper/f.txt", EventType::Create).await;

    std::fs::set_permissions(dir.join("a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    wait_for_event(&mut stream, "a.txt", EventType::Chmod).await;
    std::fs::rename(dir.join("a.txt"), dir.join("c.txt")).unwrap();
    wait_for_event(&mut stream, "a.txt", EventType::Rename).await;
    wait_for_event(&mut stream, "c.txt", EventType::Create).await;
    std::fs::remove_file(dir.join("c.txt")).unwrap();
    let removed = wait_for_event(&mut stream, "c.txt", EventType::Remove).await;
    assert!(removed.entry.is_none());
    drop(stream);

    // Without `recursive`, changes in subdirectories are not reported.
    let mut flat: EventStream<WatchDirResponse> = agent
        .stream(
            "/filesystem.Filesystem/WatchDir",
            &json!({ "path": dir }),
            &[],
        )
        .await;
    assert_eq!(flat.message().await, WatchDirResponse::start());
    std::fs::write(dir.join("sub/ignored.txt"), "x").unwrap();
    std::fs::write(dir.join("top.txt"), "x").unwrap();
    let event = next_fs_event(&mut flat).await;
    assert_eq!(
        (event.name.as_str(), event.r#type()),
        ("top.txt", EventType::Create)
    );
    assert!(event.entry.is_none(), "no entry unless includeEntry");
}

#[tokio::test]
async fn watch_errors_and_keepalive() {
    let agent = Agent::start(&[]).await;
    let missing = agent.path().join("missing");
    let (_, end) = agent
        .stream::<_, WatchDirResponse>(
            "/filesystem.Filesystem/WatchDir",
            &json!({ "path": missing }),
            &[],
        )
        .await
        .finish()
        .await;
    assert_eq!(end.error.unwrap().code, Code::NotFound);
    std::fs::write(agent.path().join("file"), "").unwrap();
    let (_, end) = agent
        .stream::<_, WatchDirResponse>(
            "/filesystem.Filesystem/WatchDir",
            &json!({ "path": agent.path().join("file") }),
            &[],
        )
        .await
        .finish()
        .await;
    assert_eq!(end.error.unwrap().code, Code::InvalidArgument);

    let mut stream: EventStream<WatchDirResponse> = agent
        .stream(
            "/filesystem.Filesystem/WatchDir",
            &json!({ "path": agent.path() }),
            &[
                ("keepalive-ping-interval", "1"),
                ("connect-timeout-ms", "1500"),
            ],
        )
        .await;
    assert_eq!(stream.message().await, WatchDirResponse::start());
    assert_eq!(stream.message().await, WatchDirResponse::keepalive());
    match stream.next().await {
        StreamFrame::End(end) => assert_eq!(end.error.unwrap().code, Code::DeadlineExceeded),
        StreamFrame::Message(m) => panic!("expected the deadline, got {m:?}"),
    }
}

#[tokio::test]
async fn polling_watchers() {
    let agent = Agent::start(&[]).await;
    let dir = agent.path().join("polled");
    std::fs::create_dir(&dir).unwrap();
    let created: CreateWatcherResponse = rpc(
        &agent,
        "CreateWatcher",
        json!({ "path": dir, "recursive": true }),
    )
    .await
    .unwrap();
    let id = created.watcher_id;
    assert!(!id.is_empty());
    std::fs::create_dir(dir.join("d")).unwrap();
    std::fs::write(dir.join("one.txt"), "1").unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + crate::harness::WAIT;
    while !(seen
        .iter()
        .any(|e: &FilesystemEvent| e.name == "one.txt" && e.r#type() == EventType::Create)
        && seen
            .iter()
            .any(|e| e.name == "d" && e.r#type() == EventType::Create))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "polled events never arrived: {seen:?}"
        );
        let got: GetWatcherEventsResponse =
            rpc(&agent, "GetWatcherEvents", json!({ "watcherId": id }))
                .await
                .unwrap();
        seen.extend(got.events);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Events are drained: the next poll is empty until something happens.
    let again: GetWatcherEventsResponse =
        rpc(&agent, "GetWatcherEvents", json!({ "watcherId": id }))
            .await
            .unwrap();
    assert!(again.events.iter().all(|e| e.name != "d"), "{again:?}");

    rpc::<Value>(&agent, "RemoveWatcher", json!({ "watcherId": id }))
        .await
        .unwrap();
    assert_eq!(
        code(
            rpc::<GetWatcherEventsResponse>(&agent, "GetWatcherEvents", json!({ "watcherId": id }))
                .await
        ),
        (StatusCode::NOT_FOUND, Code::NotFound)
    );
    assert_eq!(
        code(
            rpc::<CreateWatcherResponse>(
                &agent,
                "CreateWatcher",
                json!({ "path": dir.join("nope") })
            )
            .await
        ),
        (StatusCode::NOT_FOUND, Code::NotFound)
    );
}

#[bulkhead_testkit::requires(Root)]
#[tokio::test]
async fn operations_use_the_requesting_users_permissions() {
    let agent = Agent::start(&[]).await;
    let shared = agent.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let private = agent.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();

    let made: MakeDirResponse = rpc_as(
        &agent,
        "nobody",
        "MakeDir",
        json!({ "path": shared.join("mine/deeper") }),
    )
    .await
    .unwrap();
    assert_eq!(made.entry.unwrap().owner, "nobody");
    let parent = stat(&agent, &shared.join("mine").display().to_string())
        .await
        .unwrap();
    assert_eq!(
        parent.owner, "nobody",
        "parents are created as the user too"
    );

    assert_eq!(
        code(
            rpc_as::<MakeDirResponse>(
                &agent,
                "nobody",
                "MakeDir",
                json!({ "path": private.join("x") })
            )
            .await
        ),
        (StatusCode::FORBIDDEN, Code::PermissionDenied)
    );
    assert_eq!(
        code(
            rpc_as::<ListDirResponse>(&agent, "nobody", "ListDir", json!({ "path": private }))
                .await
        ),
        (StatusCode::FORBIDDEN, Code::PermissionDenied)
    );
    std::fs::write(private.join("keep"), "").unwrap();
    assert_eq!(
        code(
            rpc_as::<Value>(
                &agent,
                "nobody",
                "Remove",
                json!({ "path": private.join("keep") })
            )
            .await
        ),
        (StatusCode::FORBIDDEN, Code::PermissionDenied)
    );
    assert!(private.join("keep").exists());
    assert_eq!(
        code(rpc_as::<Value>(&agent, "ghost-user-x", "Stat", json!({ "path": "/" })).await),
        (StatusCode::UNAUTHORIZED, Code::Unauthenticated)
    );
    // Watching needs read access as the user.
    let auth = basic_auth("nobody");
    let (_, end) = agent
        .stream::<_, WatchDirResponse>(
            "/filesystem.Filesystem/WatchDir",
            &json!({ "path": private }),
            &[("authorization", &auth)],
        )
        .await
        .finish()
        .await;
    assert_eq!(end.error.unwrap().code, Code::PermissionDenied);
    tokio::time::sleep(Duration::from_millis(1)).await;
}
