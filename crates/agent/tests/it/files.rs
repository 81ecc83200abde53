//! `/files` upload and download against the real agent.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use bulkhead_envd::filesystem::StatResponse;
use bulkhead_envd::rest::UploadedEntry;
use bytes::Bytes;
use http::{Request, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Agent, full};

/// A multipart/form-data body with the given `(field name, filename, content)` parts.
pub fn multipart(parts: &[(&str, &str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "----bulkhead-test-boundary-7d3f";
    let mut body = Vec::new();
    for (name, filename, content) in parts {
        write!(body, "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n")
            .unwrap();
        body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{boundary}--\r\n").unwrap();
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn q(path: &std::path::Path) -> String {
    urlencoding::encode(&path.display().to_string()).into_owned()
}

async fn download(
    agent: &Agent,
    query: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut request = Request::get(format!("/files?{query}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    agent.call(request.body(full(Bytes::new())).unwrap()).await
}

/// POSTs `parts` as a multipart upload to `/files?{query}` (empty query: no `?`).
async fn upload_multipart(
    agent: &Agent,
    query: &str,
    parts: &[(&str, &str, &[u8])],
) -> (StatusCode, http::HeaderMap, Bytes) {
    let (content_type, body) = multipart(parts);
    let uri = if query.is_empty() {
        "/files".to_owned()
    } else {
        format!("/files?{query}")
    };
    agent
        .call(
            Request::post(uri)
                .header("content-type", content_type)
                .body(full(body))
                .unwrap(),
        )
        .await
}

#[tokio::test]
async fn multipart_upload_of_several_files_keeps_directories() {
    let agent = Agent::start(&[]).await;
    let dir = agent.path();
    let a = dir.join("up/a.txt");
    let b = dir.join("up/deep/er/b.bin");
    let binary: Vec<u8> = (0..=255).cycle().take(70_000).collect();
    let (status, _, response) = upload_multipart(
        &agent,
        "",
        &[
            ("file", &a.display().to_string(), b"alpha"),
            ("other", "ignored.txt", b"not a file part"),
            ("file", &b.display().to_string(), &binary),
        ],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&response)
    );
    let entries: Vec<UploadedEntry> = serde_json::from_slice(&response).unwrap();
    assert_eq!(
        entries,
        [
            UploadedEntry {
                path: a.display().to_string(),
                name: "a.txt".into(),
                r#type: "file".into(),
                metadata: None,
            },
            UploadedEntry {
                path: b.display().to_string(),
                name: "b.bin".into(),
                r#type: "file".into(),
                metadata: None,
            },
        ]
    );
    assert_eq!(std::fs::read(&a).unwrap(), b"alpha");
    assert_eq!(std::fs::read(&b).unwrap(), binary);
    assert!(!dir.join("ignored.txt").exists());

    let (status, headers, body) = download(&agent, &format!("path={}", q(&b)), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["content-length"], binary.len().to_string().as_str());
    assert_eq!(body.as_ref(), binary.as_slice());

    // Overwrite truncates; the `path` query overrides the part's filename.
    let (status, _, _) = upload_multipart(
        &agent,
        &format!("path={}", q(&a)),
        &[("file", "whatever-name", b"A")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(std::fs::read(&a).unwrap(), b"A");

    // Two parts to one destination are refused.
    let (status, _, body) = upload_multipart(
        &agent,
        &format!("path={}", q(&dir.join("dup"))),
        &[("file", "x", b"1"), ("file", "x", b"2")],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["code"], 400);
    assert!(error["message"].as_str().unwrap().contains("same path"));
}

#[tokio::test]
async fn octet_stream_upload_with_gzip_and_metadata() {
    let agent = Agent::start(&[]).await;
    let target = agent.path().join("raw/data.txt");
    let content = "line\n".repeat(10_000);
    let (status, _, body) = agent
        .call(
            Request::post(format!("/files?path={}", q(&target)))
                .header("content-type", "application/octet-stream")
                .header("content-encoding", "gzip")
                .header("x-metadata-author", "alice")
                .header("X-Metadata-Purpose", "test run")
                .body(full(gzip(content.as_bytes())))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), content);
    let stat: StatResponse = agent
        .unary(
            "/filesystem.Filesystem/Stat",
            &json!({ "path": target }),
            &[],
        )
        .await
        .unwrap();
    let metadata = stat.entry.unwrap().metadata;
    assert_eq!(metadata.get("author").map(String::as_str), Some("alice"));
    assert_eq!(
        metadata.get("purpose").map(String::as_str),
        Some("test run")
    );

    let (status, headers, body) = download(
        &agent,
        &format!("path={}", q(&target)),
        &[("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-encoding"], "gzip");
    assert!(body.len() < content.len() / 10, "compressed");
    assert_eq!(gunzip(&body), content.as_bytes());

    let (status, _, _) = agent
        .call(
            Request::post("/files")
                .header("content-type", "application/octet-stream")
                .body(full("no path"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = agent
        .call(
            Request::post(format!("/files?path={}", q(&target)))
                .header("content-type", "application/octet-stream")
                .header("content-encoding", "br")
                .body(full("x"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = agent
        .call(
            Request::post(format!("/files?path={}", q(&target)))
                .header("content-type", "text/plain")
                .body(full("x"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn large_files_stream_both_ways() {
    let agent = Agent::start(&[]).await;
    let target = agent.path().join("big.bin");
    let chunk: Vec<u8> = (0..1_048_576_u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let chunks = 24;
    let (tx, body) = Agent::streamed_body();
    let request = Request::post(format!("/files?path={}", q(&target)))
        .header("content-type", "application/octet-stream")
        .body(body)
        .unwrap();
    let sender = {
        let chunk = Bytes::from(chunk.clone());
        tokio::spawn(async move {
            for _ in 0..chunks {
                tx.send(chunk.clone()).await.unwrap();
            }
        })
    };
    let (status, _, body) = agent.call(request).await;
    sender.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        std::fs::metadata(&target).unwrap().len(),
        (chunk.len() * chunks) as u64
    );

    let response = agent
        .send(
            Request::get(format!("/files?path={}", q(&target)))
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0_usize;
    let mut frames = 0;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let data = frame.unwrap().into_data().unwrap();
        for (i, byte) in data.iter().enumerate() {
            assert_eq!(*byte, chunk[(received + i) % chunk.len()]);
        }
        received += data.len();
        frames += 1;
    }
    assert_eq!(received, chunk.len() * chunks);
    assert!(
        frames > 10,
        "the download arrives in pieces, not one buffer"
    );
}

#[tokio::test]
async fn download_errors() {
    let agent = Agent::start(&[]).await;
    let file = agent.path().join("f.txt");
    std::fs::write(&file, "content").unwrap();
    let (status, _, body) = download(
        &agent,
        &format!("path={}", q(&agent.path().join("missing"))),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["code"], 404);
    let (status, _, _) = download(&agent, &format!("path={}", q(agent.path())), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = download(
        &agent,
        &format!("path={}", q(&file)),
        &[("accept-encoding", "br, identity;q=0")],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
    let (status, headers, body) = download(
        &agent,
        &format!("path={}", q(&file)),
        &[("accept-encoding", "br")],
    )
    .await;
    assert_eq!(
        (status, body.as_ref()),
        (StatusCode::OK, b"content".as_ref())
    );
    assert!(!headers.contains_key("content-encoding"));
    let (status, _, _) = download(
        &agent,
        &format!("path={}&username=no-such-user-x", q(&file)),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[bulkhead_testkit::requires(Root)]
#[tokio::test]
async fn transfers_use_the_users_identity() {
    let agent = Agent::start(&[]).await;
    let shared = agent.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let secret = agent.path().join("secret.txt");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let (status, _, body) =
        download(&agent, &format!("path={}&username=nobody", q(&secret)), &[]).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, body) =
        download(&agent, &format!("path={}&username=root", q(&secret)), &[]).await;
    assert_eq!(
        (status, body.as_ref()),
        (StatusCode::OK, b"root only".as_ref())
    );

    let target = shared.join("new/dir/by-nobody.txt");
    let (status, _, response) = upload_multipart(
        &agent,
        "username=nobody",
        &[("file", &target.display().to_string(), b"hi")],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&response)
    );
    for path in [
        target.as_path(),
        target.parent().unwrap(),
        shared.join("new").as_path(),
    ] {
        assert_eq!(
            std::fs::metadata(path).unwrap().uid(),
            65534,
            "{} owned by nobody",
            path.display()
        );
    }
    // nobody cannot overwrite root's file.
    let (status, _, _) = agent
        .call(
            Request::post(format!("/files?username=nobody&path={}", q(&secret)))
                .header("content-type", "application/octet-stream")
                .body(full("pwned"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");
}
