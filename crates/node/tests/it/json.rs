//! A node answers proto3 JSON to a plain HTTP client, as `curl` would call it:
//!
//! ```text
//! curl -H 'Authorization: Bearer …' -H 'Content-Type: application/json' -d '{}' \
//!     http://node:7070/bulkhead.node.v1.Node/Info
//! ```

use bulkhead_engine::Node;
use bulkhead_node::wire::ErrorBody;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;

use crate::{Harness, TOKEN, post, raw_http};

#[tokio::test]
async fn info_in_json_with_a_plain_http_client() {
    let h = Harness::start().await;
    let request = format!(
        "POST /bulkhead.node.v1.Node/Info HTTP/1.1\r\nHost: node\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let (status, head, body) = raw_http(h.addr, request.as_bytes()).await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json")
    );
    let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["nodeId"], "node-1");
    assert_eq!(info["driverName"], h.local.driver_name());
    assert_eq!(info["protocolVersion"], 1);
    // proto3 JSON writes a uint64 as a string.
    assert_eq!(info["epoch"], "0");
    assert_eq!(info["capabilities"]["checkpoint"], true);
    assert_eq!(info["capabilities"]["network"], "NETWORK_LINK_TUN_IN_NETNS");
    assert_eq!(info["checkpointKey"], "fake-agent-1");
}

#[tokio::test]
async fn a_failed_json_call_answers_a_connect_error_with_its_detail() {
    let h = Harness::start().await;
    // A handle of a sandbox that does not run.
    let body = br#"{"handle": {"format": 1, "driver": "fake", "pid": 4242, "dataJson": "null"}}"#;
    let (status, _, answer) = post(h.addr, "Usage", Some(TOKEN), "application/json", body).await;
    assert_eq!(status, 400);
    let json: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(json["code"], "failed_precondition");
    assert_eq!(json["message"], "Sandbox is not running");
    assert_eq!(json["details"][0]["type"], "bulkhead.node.v1.NodeError");
    let detail = ErrorBody::parse(status, &answer).detail().unwrap();
    assert_eq!(detail.code(), NodeCode::Driver);

    // A body that is not the method's message.
    let (status, _, answer) =
        post(h.addr, "Usage", Some(TOKEN), "application/json", b"[1, 2]").await;
    assert_eq!(status, 400);
    let detail = ErrorBody::parse(status, &answer).detail().unwrap();
    assert_eq!(detail.code(), NodeCode::InvalidArgument);
    // A codec the node does not speak.
    let (status, ..) = post(h.addr, "Info", Some(TOKEN), "text/plain", b"{}").await;
    assert_eq!(status, 415);
}
