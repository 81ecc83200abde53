//! Access token, signed URLs, `/init`, and routing by port.

use bulkhead_envd::connect::Code;
use bulkhead_envd::protocol::{AGENT_INFO_PATH, AgentInfo};
use bulkhead_envd::rest::{FileOperation, file_signature};
use bytes::Bytes;
use http::{Request, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Agent, full};

/// `POST /init`; a successful answer must carry the agent's protocol version.
async fn init(agent: &Agent, body: Value, token: Option<&str>) -> StatusCode {
    let mut request = Request::post("/init").header("content-type", "application/json");
    if let Some(t) = token {
        request = request.header("x-access-token", t);
    }
    let (status, headers, body) = agent
        .call(
            request
                .body(full(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        )
        .await;
    if status == StatusCode::OK {
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(
            serde_json::from_slice::<AgentInfo>(&body).unwrap(),
            AgentInfo::current()
        );
    }
    status
}

async fn get(agent: &Agent, path: &str, token: Option<&str>) -> (StatusCode, Bytes) {
    let mut request = Request::get(path);
    if let Some(t) = token {
        request = request.header("x-access-token", t);
    }
    let (status, _, body) = agent.call(request.body(full(Bytes::new())).unwrap()).await;
    (status, body)
}

#[tokio::test]
async fn access_token_is_required_once_set() {
    let agent = Agent::start(&[]).await;
    // Before /init, no token is needed.
    let (status, _) = agent
        .unary_raw("/filesystem.Filesystem/Stat", &json!({"path": "/"}), &[])
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        init(
            &agent,
            json!({"accessToken": "s3cret", "defaultUser": "root"}),
            None
        )
        .await,
        StatusCode::OK
    );

    let (status, body) = agent
        .unary_raw("/filesystem.Filesystem/Stat", &json!({"path": "/"}), &[])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], "unauthenticated");
    let (status, _) = agent
        .unary_raw(
            "/filesystem.Filesystem/Stat",
            &json!({"path": "/"}),
            &[("x-access-token", "wrong")],
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = agent
        .unary_raw(
            "/filesystem.Filesystem/Stat",
            &json!({"path": "/"}),
            &[("x-access-token", "s3cret")],
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    assert_eq!(get(&agent, "/health", None).await.0, StatusCode::NO_CONTENT);
    let (status, body) = get(&agent, "/envs", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["code"], 401);
    assert_eq!(get(&agent, "/envs", Some("s3cret")).await.0, StatusCode::OK);
    assert_eq!(
        get(&agent, "/metrics", None).await.0,
        StatusCode::UNAUTHORIZED
    );

    // /init itself needs the current token from now on; with it, the token can be rotated.
    assert_eq!(
        init(&agent, json!({"accessToken": "other"}), None).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        init(&agent, json!({"accessToken": "next"}), Some("s3cret")).await,
        StatusCode::OK
    );
    assert_eq!(
        get(&agent, "/envs", Some("s3cret")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(get(&agent, "/envs", Some("next")).await.0, StatusCode::OK);

    // Streams are refused before they start.
    let (status, body) = agent
        .unary_raw("/process.Process/List", &json!({}), &[])
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
    );
}

#[tokio::test]
async fn files_accept_the_header_or_a_valid_signature() {
    let agent = Agent::start(&[]).await;
    let file = agent.path().join("signed.txt");
    std::fs::write(&file, "signed content").unwrap();
    assert_eq!(
        init(&agent, json!({"accessToken": "tok"}), None).await,
        StatusCode::OK
    );
    let path = file.display().to_string();
    let enc = |s: &str| urlencoding::encode(s).into_owned();

    assert_eq!(
        get(&agent, &format!("/files?path={}", enc(&path)), None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(&agent, &format!("/files?path={}", enc(&path)), Some("tok"))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        get(&agent, &format!("/files?path={}", enc(&path)), Some("bad"))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );

    let read = file_signature(&path, FileOperation::Read, "", "tok", None);
    let (status, body) = get(
        &agent,
        &format!("/files?path={}&signature={}", enc(&path), enc(&read)),
        None,
    )
    .await;
    assert_eq!(
        (status, body.as_ref()),
        (StatusCode::OK, b"signed content".as_ref())
    );

    // With a username the signature covers it.
    let as_root = file_signature(&path, FileOperation::Read, "root", "tok", None);
    let url = format!(
        "/files?path={}&username=root&signature={}",
        enc(&path),
        enc(&as_root)
    );
    assert_eq!(get(&agent, &url, None).await.0, StatusCode::OK);
    let url = format!("/files?path={}&signature={}", enc(&path), enc(&as_root));
    assert_eq!(get(&agent, &url, None).await.0, StatusCode::UNAUTHORIZED);

    // A write signature does not allow reading.
    let write = file_signature(&path, FileOperation::Write, "", "tok", None);
    let url = format!("/files?path={}&signature={}", enc(&path), enc(&write));
    assert_eq!(get(&agent, &url, None).await.0, StatusCode::UNAUTHORIZED);

    // Expiration is part of the signature and is enforced.
    let now = chrono::Utc::now().timestamp();
    let future = file_signature(&path, FileOperation::Read, "", "tok", Some(now + 60));
    let url = format!(
        "/files?path={}&signature={}&signature_expiration={}",
        enc(&path),
        enc(&future),
        now + 60
    );
    assert_eq!(get(&agent, &url, None).await.0, StatusCode::OK);
    let url = format!(
        "/files?path={}&signature={}&signature_expiration={}",
        enc(&path),
        enc(&future),
        now + 61
    );
    assert_eq!(get(&agent, &url, None).await.0, StatusCode::UNAUTHORIZED);
    let past = file_signature(&path, FileOperation::Read, "", "tok", Some(now - 5));
    let url = format!(
        "/files?path={}&signature={}&signature_expiration={}",
        enc(&path),
        enc(&past),
        now - 5
    );
    let (status, body) = get(&agent, &url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&body).contains("expired"));

    // Upload with a write signature.
    let target = agent.path().join("uploaded.txt").display().to_string();
    let sig = file_signature(&target, FileOperation::Write, "", "tok", None);
    let (status, _, _) = agent
        .call(
            Request::post(format!(
                "/files?path={}&signature={}",
                enc(&target),
                enc(&sig)
            ))
            .header("content-type", "application/octet-stream")
            .body(full("via signed url"))
            .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "via signed url");
}

#[tokio::test]
async fn routing_by_port_and_protocol_errors() {
    let agent = Agent::start(&[]).await;
    let (status, _, body) = agent
        .call(
            Request::get("/health")
                .header("e2b-sandbox-id", "sbx123")
                .header("e2b-sandbox-port", "8080")
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"sandboxId": "sbx123", "message": "The sandbox is running but port is not open", "code": 502})
    );
    let (status, _, _) = agent
        .call(
            Request::get("/health")
                .header("e2b-sandbox-port", "49983")
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let (status, body) = agent
        .unary_raw("/process.Process/Nope", &json!({}), &[])
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unimplemented"))
    );
    let (status, body) = agent
        .unary_raw("/filesystem.Filesystem/Nope", &json!({}), &[])
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unimplemented"))
    );

    let (status, _, _) = agent
        .call(
            Request::post("/filesystem.Filesystem/Stat")
                .header("content-type", "application/proto")
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _, body) = agent
        .call(
            Request::post("/filesystem.Filesystem/Stat")
                .header("content-type", "application/json")
                .body(full("{not json"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["code"],
        "invalid_argument"
    );

    // A garbled stream request ends with an error in the end-of-stream message.
    let (status, _, body) = agent
        .call(
            Request::post("/process.Process/Start")
                .header("content-type", "application/connect+json")
                .body(full("xx"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let err = bulkhead_envd::connect::decode_stream_body::<Value>(&body).unwrap_err();
    assert_eq!(err.to_connect_error().code, Code::InvalidArgument);

    let (status, _, body) = agent.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let metrics: bulkhead_envd::rest::Metrics = serde_json::from_slice(&body).unwrap();
    assert!(metrics.cpu_count >= 1 && metrics.mem_total > 0 && metrics.disk_total > 0);
    assert!(metrics.mem_used <= metrics.mem_total && metrics.disk_used <= metrics.disk_total);
    assert!((0.0..=100.0).contains(&metrics.cpu_used_pct));
}

async fn info(agent: &Agent, token: Option<&str>) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut request = Request::get(AGENT_INFO_PATH);
    if let Some(t) = token {
        request = request.header("x-access-token", t);
    }
    agent.call(request.body(full(Bytes::new())).unwrap()).await
}

#[tokio::test]
async fn the_agent_announces_its_protocol_version() {
    let agent = Agent::start(&[]).await;
    let (status, headers, body) = info(&agent, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let announced: AgentInfo = serde_json::from_slice(&body).unwrap();
    assert_eq!(announced, AgentInfo::current());
    assert!(announced.is_supported());
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["protocolVersion"],
        bulkhead_envd::protocol::AGENT_PROTOCOL_VERSION
    );

    // `/init` answers with the same description (checked by `init`), and the info route needs
    // no access token once one is set: it reveals only the version.
    assert_eq!(
        init(&agent, json!({"accessToken": "s3cret"}), None).await,
        StatusCode::OK
    );
    let (status, _, body) = info(&agent, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_slice::<AgentInfo>(&body).unwrap(),
        AgentInfo::current()
    );
    assert_eq!(info(&agent, Some("wrong")).await.0, StatusCode::OK);
    // Only GET is exempt.
    let (status, _, _) = agent
        .call(
            Request::post(AGENT_INFO_PATH)
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // An empty body is still a valid `/init`.
    let (status, _, body) = agent
        .call(
            Request::post("/init")
                .header("x-access-token", "s3cret")
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_slice::<AgentInfo>(&body).unwrap(),
        AgentInfo::current()
    );
}
