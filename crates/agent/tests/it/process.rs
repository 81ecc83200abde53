//! `process.Process` against the real agent.

use std::time::{Duration, Instant};

use bulkhead_envd::connect::{Code, EndStream, StreamFrame, encode_message};
use bulkhead_envd::process::process_event::data_event::Output;
use bulkhead_envd::process::process_event::{EndEvent, Event};
use bulkhead_envd::process::{
    self as p, ListResponse, ProcessConfig, ProcessInput, ProcessSelector, Pty, SendInputRequest,
    SendSignalRequest, Signal, StartRequest, StartResponse, StreamInputRequest, pty,
    stream_input_request,
};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use serde_json::json;

use crate::harness::{Agent, EventStream, basic_auth, eventually};

const START: &str = "/process.Process/Start";
const CONNECT: &str = "/process.Process/Connect";

fn bash(script: &str) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-c".into(), script.into()],
            ..ProcessConfig::default()
        }),
        stdin: Some(false),
        ..StartRequest::default()
    }
}

#[derive(Debug, Default)]
pub struct Collected {
    pub pid: u32,
    pub stdout: String,
    pub stderr: String,
    pub pty: String,
    pub end: Option<EndEvent>,
    pub keepalives: usize,
    pub stream_end: Option<EndStream>,
}

impl Collected {
    fn add(&mut self, message: StartResponse) {
        match message.event.and_then(|e| e.event) {
            Some(Event::Start(s)) => {
                assert_eq!(self.pid, 0, "only one start event");
                self.pid = s.pid;
            }
            Some(Event::Data(d)) => {
                assert!(self.pid != 0, "data after start");
                match d.output {
                    Some(Output::Stdout(b)) => self.stdout.push_str(&String::from_utf8_lossy(&b)),
                    Some(Output::Stderr(b)) => self.stderr.push_str(&String::from_utf8_lossy(&b)),
                    Some(Output::Pty(b)) => self.pty.push_str(&String::from_utf8_lossy(&b)),
                    None => panic!("empty data event"),
                }
            }
            Some(Event::End(end)) => {
                assert!(self.end.is_none(), "exactly one end event");
                self.end = Some(end);
            }
            Some(Event::Keepalive(_)) => self.keepalives += 1,
            None => panic!("event without a member"),
        }
    }
}

pub async fn collect(stream: EventStream<StartResponse>) -> Collected {
    collect_into(stream, Collected::default()).await
}

/// Like [`collect`] for a stream whose start event was already read.
async fn collect_after_start(stream: EventStream<StartResponse>, pid: u32) -> Collected {
    collect_into(
        stream,
        Collected {
            pid,
            ..Collected::default()
        },
    )
    .await
}

async fn collect_into(mut stream: EventStream<StartResponse>, mut c: Collected) -> Collected {
    loop {
        match stream.next().await {
            StreamFrame::Message(m) => c.add(m),
            StreamFrame::End(end) => {
                c.stream_end = Some(end);
                return c;
            }
        }
    }
}

/// Reads messages until `predicate` holds on the collected state.
async fn read_until(
    stream: &mut EventStream<StartResponse>,
    c: &mut Collected,
    predicate: impl Fn(&Collected) -> bool,
) {
    while !predicate(c) {
        c.add(stream.message().await);
    }
}

async fn start_pid(stream: &mut EventStream<StartResponse>) -> u32 {
    let mut c = Collected::default();
    c.add(stream.message().await);
    assert!(c.pid > 0, "first message is the start event");
    c.pid
}

async fn list(agent: &Agent) -> ListResponse {
    agent
        .unary("/process.Process/List", &json!({}), &[])
        .await
        .unwrap()
}

async fn signal(
    agent: &Agent,
    selector: ProcessSelector,
    signal: Signal,
) -> Result<serde_json::Value, (StatusCode, bulkhead_envd::ConnectError)> {
    agent
        .unary(
            "/process.Process/SendSignal",
            &SendSignalRequest {
                process: Some(selector),
                signal: signal.into(),
            },
            &[],
        )
        .await
}

fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // A zombie waiting for its (non-agent) reaper is dead too.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn start_streams_output_then_exactly_one_end() {
    let agent = Agent::start(&[]).await;
    let stream = agent
        .stream(START, &bash("echo out; echo err >&2; exit 3"), &[])
        .await;
    let c = collect(stream).await;
    assert!(c.pid > 0);
    assert_eq!(c.stdout, "out\n");
    assert_eq!(c.stderr, "err\n");
    let end = c.end.expect("end event");
    assert_eq!((end.exit_code, end.exited), (3, true));
    assert_eq!(end.status, "exit status 3");
    assert_eq!(end.error.as_deref(), Some("exit status 3"));
    assert_eq!(c.stream_end.unwrap(), EndStream::default());

    let ok = collect(agent.stream(START, &bash("true"), &[]).await).await;
    let end = ok.end.unwrap();
    assert_eq!(
        (end.exit_code, end.status.as_str(), end.error),
        (0, "exit status 0", None)
    );
}

#[tokio::test]
async fn output_arrives_while_the_process_runs() {
    let agent = Agent::start(&[]).await;
    let mut stream = agent
        .stream(START, &bash("echo first; sleep 5; echo second"), &[])
        .await;
    let mut c = Collected::default();
    let began = Instant::now();
    read_until(&mut stream, &mut c, |c| c.stdout.contains("first")).await;
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "output is not held back until exit"
    );
    signal(&agent, ProcessSelector::pid(c.pid), Signal::Sigkill)
        .await
        .unwrap();
}

#[tokio::test]
async fn signals_end_the_process_group_with_go_status() {
    let agent = Agent::start(&[]).await;
    // The child `sleep` is in the same process group and must die too.
    let mut stream = agent
        .stream(START, &bash("sleep 300 & echo $!; wait"), &[])
        .await;
    let mut c = Collected::default();
    read_until(&mut stream, &mut c, |c| c.stdout.ends_with('\n')).await;
    let child: u32 = c.stdout.trim().parse().unwrap();
    signal(&agent, ProcessSelector::pid(c.pid), Signal::Sigkill)
        .await
        .unwrap();
    while c.end.is_none() {
        c.add(stream.message().await);
    }
    let end = c.end.unwrap();
    assert_eq!(
        (end.exit_code, end.exited, end.status.as_str()),
        (-1, false, "signal: killed")
    );
    eventually("the group member to die", || async {
        process_gone(child).then_some(())
    })
    .await;

    let mut stream = agent.stream(START, &bash("sleep 300"), &[]).await;
    let pid = start_pid(&mut stream).await;
    signal(&agent, ProcessSelector::pid(pid), Signal::Sigterm)
        .await
        .unwrap();
    let c = collect_after_start(stream, pid).await;
    assert_eq!(c.end.unwrap().status, "signal: terminated");

    let (status, err) = signal(&agent, ProcessSelector::pid(999_999), Signal::Sigkill)
        .await
        .unwrap_err();
    assert_eq!((status, err.code), (StatusCode::NOT_FOUND, Code::NotFound));
    let (status, err) = signal(&agent, ProcessSelector::pid(1), Signal::Unspecified)
        .await
        .unwrap_err();
    assert_eq!(
        (status, err.code),
        (StatusCode::BAD_REQUEST, Code::InvalidArgument)
    );
}

#[tokio::test]
async fn stdin_pipe_input_and_close() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("cat; echo done");
    request.stdin = None; // absent: the pipe stays open (backward compatible default)
    let mut stream = agent.stream(START, &request, &[]).await;
    let pid = start_pid(&mut stream).await;
    let send = |data: &'static str| SendInputRequest {
        process: Some(ProcessSelector::pid(pid)),
        input: Some(ProcessInput::stdin(Bytes::from_static(data.as_bytes()))),
    };
    agent
        .unary::<_, serde_json::Value>("/process.Process/SendInput", &send("hello "), &[])
        .await
        .unwrap();
    agent
        .unary::<_, serde_json::Value>("/process.Process/SendInput", &send("world\n"), &[])
        .await
        .unwrap();
    let close = json!({"process": {"pid": pid}});
    agent
        .unary::<_, serde_json::Value>("/process.Process/CloseStdin", &close, &[])
        .await
        .unwrap();
    let c = collect_after_start(stream, pid).await;
    assert_eq!(c.stdout, "hello world\ndone\n");
    assert_eq!(c.end.unwrap().exit_code, 0);

    // stdin: false means /dev/null, so `cat` ends at once and input is refused.
    let mut stream = agent
        .stream(START, &bash("cat; sleep 0.3; echo eof"), &[])
        .await;
    let pid = start_pid(&mut stream).await;
    let send = SendInputRequest {
        process: Some(ProcessSelector::pid(pid)),
        input: Some(ProcessInput::stdin(Bytes::from_static(b"x"))),
    };
    let (status, err) = agent
        .unary::<_, serde_json::Value>("/process.Process/SendInput", &send, &[])
        .await
        .unwrap_err();
    assert_eq!(
        (status, err.code),
        (StatusCode::BAD_REQUEST, Code::FailedPrecondition)
    );
    assert!(err.message.contains("stdin=True"), "{}", err.message);
    assert_eq!(collect_after_start(stream, pid).await.stdout, "eof\n");
}

#[tokio::test]
async fn pty_input_resize_and_term() {
    let agent = Agent::start(&[]).await;
    let request = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec![
                "-c".into(),
                "echo term=$TERM; stty size; read line; echo got:$line; stty size".into(),
            ],
            ..ProcessConfig::default()
        }),
        pty: Some(Pty {
            size: Some(pty::Size {
                cols: 100,
                rows: 30,
            }),
        }),
        ..StartRequest::default()
    };
    let mut stream = agent.stream(START, &request, &[]).await;
    let mut c = Collected::default();
    read_until(&mut stream, &mut c, |c| c.pty.contains("30 100")).await;
    assert!(c.pty.contains("term=xterm-256color"), "{:?}", c.pty);
    assert!(
        c.stdout.is_empty() && c.stderr.is_empty(),
        "PTY output is reported as pty"
    );

    let resize = json!({"process": {"pid": c.pid}, "pty": {"size": {"cols": 120, "rows": 40}}});
    agent
        .unary::<_, serde_json::Value>("/process.Process/Update", &resize, &[])
        .await
        .unwrap();
    let input = SendInputRequest {
        process: Some(ProcessSelector::pid(c.pid)),
        input: Some(ProcessInput::pty(Bytes::from_static(b"typed\n"))),
    };
    agent
        .unary::<_, serde_json::Value>("/process.Process/SendInput", &input, &[])
        .await
        .unwrap();
    while c.end.is_none() {
        c.add(stream.message().await);
    }
    assert!(c.pty.contains("got:typed"), "{:?}", c.pty);
    assert!(c.pty.contains("40 120"), "{:?}", c.pty);
    assert_eq!(c.end.unwrap().exit_code, 0);

    // Stdin-style input and CloseStdin do not apply to a PTY process.
    let mut stream = agent
        .stream(
            START,
            &StartRequest {
                pty: Some(Pty::default()),
                ..bash("sleep 30")
            },
            &[],
        )
        .await;
    let pid = start_pid(&mut stream).await;
    let (_, err) = agent
        .unary::<_, serde_json::Value>(
            "/process.Process/CloseStdin",
            &json!({"process": {"pid": pid}}),
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::FailedPrecondition);
    signal(&agent, ProcessSelector::pid(pid), Signal::Sigkill)
        .await
        .unwrap();
}

#[tokio::test]
async fn connect_by_pid_and_tag_sees_live_output() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("read x; echo got $x");
    request.stdin = Some(true);
    request.tag = Some("my-tag".into());
    let mut first = agent.stream(START, &request, &[]).await;
    let pid = start_pid(&mut first).await;

    let by_tag = agent
        .stream::<_, StartResponse>(CONNECT, &json!({"process": {"tag": "my-tag"}}), &[])
        .await;
    let mut by_pid = agent
        .stream::<_, StartResponse>(CONNECT, &json!({"process": {"pid": pid}}), &[])
        .await;
    assert_eq!(start_pid(&mut by_pid).await, pid);

    let listed = list(&agent).await;
    let info = listed
        .processes
        .iter()
        .find(|i| i.pid == pid)
        .expect("listed");
    assert_eq!(info.tag.as_deref(), Some("my-tag"));
    assert_eq!(info.config.as_ref().unwrap().cmd, "/bin/bash");

    let send = json!({"process": {"tag": "my-tag"}, "input": {"stdin": "aGkK"}});
    agent
        .unary::<_, serde_json::Value>("/process.Process/SendInput", &send, &[])
        .await
        .unwrap();
    let by_tag = collect(by_tag).await;
    assert_eq!(by_tag.pid, pid);
    for c in [
        collect_after_start(first, pid).await,
        by_tag,
        collect_after_start(by_pid, pid).await,
    ] {
        assert_eq!(c.stdout, "got hi\n");
        assert_eq!(c.end.unwrap().exit_code, 0);
    }
}

#[tokio::test]
async fn late_connect_still_gets_start_and_end() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("exit 7");
    request.tag = Some("gone".into());
    let c = collect(agent.stream(START, &request, &[]).await).await;
    for selector in [json!({"pid": c.pid}), json!({"tag": "gone"})] {
        let late = collect(
            agent
                .stream(CONNECT, &json!({ "process": selector }), &[])
                .await,
        )
        .await;
        assert_eq!(late.pid, c.pid);
        let end = late.end.expect("end event for an exited process");
        assert_eq!((end.exit_code, end.status.as_str()), (7, "exit status 7"));
        assert_eq!(late.stream_end.unwrap(), EndStream::default());
    }
    assert!(list(&agent).await.processes.iter().all(|i| i.pid != c.pid));

    let missing = collect(
        agent
            .stream(CONNECT, &json!({"process": {"pid": 999_999}}), &[])
            .await,
    )
    .await;
    assert_eq!(missing.pid, 0);
    assert_eq!(
        missing.stream_end.unwrap().error.unwrap().code,
        Code::NotFound
    );
    let no_selector = collect(agent.stream(CONNECT, &json!({}), &[]).await).await;
    assert_eq!(
        no_selector.stream_end.unwrap().error.unwrap().code,
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn deadline_ends_the_stream_and_kills_the_process() {
    let agent = Agent::start(&[]).await;
    let began = Instant::now();
    let mut stream = agent
        .stream(
            START,
            &bash("sleep 300 & echo $!; wait"),
            &[("connect-timeout-ms", "700")],
        )
        .await;
    let mut c = Collected::default();
    read_until(&mut stream, &mut c, |c| c.stdout.ends_with('\n')).await;
    let child: u32 = c.stdout.trim().parse().unwrap();
    let rest = collect_after_start(stream, c.pid).await;
    assert!(rest.end.is_none(), "the deadline wins over the end event");
    assert_eq!(
        rest.stream_end.unwrap().error.unwrap().code,
        Code::DeadlineExceeded
    );
    assert!(began.elapsed() >= Duration::from_millis(650));
    assert!(began.elapsed() < Duration::from_secs(10));
    eventually("the timed-out process to die", || async {
        process_gone(c.pid).then_some(())
    })
    .await;
    eventually("its child to die", || async {
        process_gone(child).then_some(())
    })
    .await;
    eventually("it to leave the list", || async {
        list(&agent).await.processes.is_empty().then_some(())
    })
    .await;

    // The kill happens even when the client has gone away before the deadline.
    let mut stream = agent
        .stream(START, &bash("sleep 300"), &[("connect-timeout-ms", "500")])
        .await;
    let pid = start_pid(&mut stream).await;
    drop(stream);
    eventually("the abandoned process to be killed", || async {
        process_gone(pid).then_some(())
    })
    .await;
    let late = collect(
        agent
            .stream(CONNECT, &json!({"process": {"pid": pid}}), &[])
            .await,
    )
    .await;
    assert_eq!(late.end.unwrap().status, "signal: killed");
}

#[tokio::test]
async fn disconnecting_keeps_the_process_running() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("sleep 300");
    request.tag = Some("bg".into());
    let mut stream = agent.stream(START, &request, &[]).await;
    let pid = start_pid(&mut stream).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!process_gone(pid));
    assert!(list(&agent).await.processes.iter().any(|i| i.pid == pid));
    let mut again = agent
        .stream::<_, StartResponse>(CONNECT, &json!({"process": {"tag": "bg"}}), &[])
        .await;
    assert_eq!(start_pid(&mut again).await, pid);
    signal(&agent, ProcessSelector::tag("bg"), Signal::Sigkill)
        .await
        .unwrap();
    assert_eq!(
        collect_after_start(again, pid).await.end.unwrap().status,
        "signal: killed"
    );
}

#[tokio::test]
async fn an_abandoned_stream_does_not_stall_a_chatty_process() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("head -c 30000000 /dev/zero | base64; echo finished >&2");
    request.tag = Some("chatty".into());
    let mut stream = agent.stream(START, &request, &[]).await;
    let pid = start_pid(&mut stream).await;
    drop(stream);
    // Far more output than any buffer holds goes to nobody; the process must still finish.
    let late = collect(
        agent
            .stream(CONNECT, &json!({"process": {"tag": "chatty"}}), &[])
            .await,
    )
    .await;
    assert_eq!(late.pid, pid);
    assert_eq!(late.end.unwrap().exit_code, 0);
}

#[tokio::test]
async fn background_cap_answers_resource_exhausted() {
    let agent = Agent::start(&["--max-background-processes", "2"]).await;
    let mut a = agent.stream(START, &bash("sleep 300"), &[]).await;
    let pid_a = start_pid(&mut a).await;
    let mut b = agent.stream(START, &bash("sleep 300"), &[]).await;
    start_pid(&mut b).await;
    let third = collect(agent.stream(START, &bash("true"), &[]).await).await;
    let err = third.stream_end.unwrap().error.expect("refused");
    assert_eq!(err.code, Code::ResourceExhausted);
    assert!(
        err.message.contains("limit: 2") && err.message.contains("kill"),
        "{}",
        err.message
    );

    signal(&agent, ProcessSelector::pid(pid_a), Signal::Sigkill)
        .await
        .unwrap();
    collect_after_start(a, pid_a).await;
    let fourth = collect(agent.stream(START, &bash("echo ok"), &[]).await).await;
    assert_eq!(fourth.stdout, "ok\n");
}

#[tokio::test]
async fn keepalives_are_sent_at_the_requested_interval() {
    let agent = Agent::start(&[]).await;
    let c = collect(
        agent
            .stream(
                START,
                &bash("sleep 2.5"),
                &[("keepalive-ping-interval", "1")],
            )
            .await,
    )
    .await;
    assert!(c.keepalives >= 1, "got {} keepalives", c.keepalives);
    assert_eq!(c.end.unwrap().exit_code, 0);
}

#[tokio::test]
async fn stream_input_feeds_stdin_from_a_client_stream() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("cat");
    request.stdin = Some(true);
    let mut output = agent.stream(START, &request, &[]).await;
    let pid = start_pid(&mut output).await;

    let (tx, body) = Agent::streamed_body();
    let request = Request::builder()
        .method(Method::POST)
        .uri("/process.Process/StreamInput")
        .header("content-type", "application/connect+json")
        .body(body)
        .unwrap();
    let mut c = Collected {
        pid,
        ..Collected::default()
    };
    let driver = async {
        let messages = [
            StreamInputRequest {
                event: Some(stream_input_request::Event::Start(
                    stream_input_request::StartEvent {
                        process: Some(ProcessSelector::pid(pid)),
                    },
                )),
            },
            StreamInputRequest {
                event: Some(stream_input_request::Event::Data(
                    stream_input_request::DataEvent {
                        input: Some(ProcessInput::stdin(Bytes::from_static(b"one\n"))),
                    },
                )),
            },
            StreamInputRequest {
                event: Some(stream_input_request::Event::Keepalive(
                    stream_input_request::KeepAlive {},
                )),
            },
        ];
        for m in &messages {
            tx.send(encode_message(m).unwrap()).await.unwrap();
        }
        // Input is delivered while the request stream is still open.
        read_until(&mut output, &mut c, |c| c.stdout == "one\n").await;
        let more = StreamInputRequest {
            event: Some(stream_input_request::Event::Data(
                stream_input_request::DataEvent {
                    input: Some(ProcessInput::stdin(Bytes::from_static(b"two\n"))),
                },
            )),
        };
        let encoded = encode_message(&more).unwrap();
        // Split an envelope across chunks.
        tx.send(encoded.slice(..3)).await.unwrap();
        tx.send(encoded.slice(3..)).await.unwrap();
        drop(tx);
    };
    let (response, ()) = tokio::join!(agent.send(request), driver);
    assert_eq!(response.status(), StatusCode::OK);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let messages: Vec<p::StreamInputResponse> =
        bulkhead_envd::connect::decode_stream_body(&body).unwrap();
    assert_eq!(messages.len(), 1);

    agent
        .unary::<_, serde_json::Value>(
            "/process.Process/CloseStdin",
            &json!({"process": {"pid": pid}}),
            &[],
        )
        .await
        .unwrap();
    while c.end.is_none() {
        c.add(output.message().await);
    }
    assert_eq!(c.stdout, "one\ntwo\n");
}

#[tokio::test]
async fn environment_cwd_and_global_env() {
    let agent = Agent::start(&[]).await;
    let (status, _, _) = agent
        .call(
            Request::post("/init")
                .body(crate::harness::full(
                    r#"{"envVars":{"GLOBAL":"g","BOTH":"global"}}"#,
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, _, envs) = agent.get("/envs").await;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&envs).unwrap()["GLOBAL"],
        "g"
    );

    let mut request = bash("echo $GLOBAL $BOTH $LOCAL $USER $HOME; pwd");
    let process = request.process.as_mut().unwrap();
    process.envs.insert("LOCAL".into(), "l".into());
    process.envs.insert("BOTH".into(), "request".into());
    process.cwd = Some(agent.path().display().to_string());
    let c = collect(agent.stream(START, &request, &[]).await).await;
    assert_eq!(
        c.stdout,
        format!("g request l root /root\n{}\n", agent.path().display())
    );

    // User processes are preferred by the OOM killer over the agent.
    let c = collect(
        agent
            .stream(START, &bash("cat /proc/self/oom_score_adj"), &[])
            .await,
    )
    .await;
    assert_eq!(c.stdout, "100\n");

    // Relative working directories are relative to the user's home.
    let mut request = bash("pwd");
    request.process.as_mut().unwrap().cwd = Some(".".into());
    assert_eq!(
        collect(agent.stream(START, &request, &[]).await)
            .await
            .stdout,
        "/root\n"
    );

    let mut request = bash("pwd");
    request.process.as_mut().unwrap().cwd = Some("/does/not/exist".into());
    let c = collect(agent.stream(START, &request, &[]).await).await;
    let err = c.stream_end.unwrap().error.unwrap();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("does not exist"));

    let missing = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/no/such/program".into(),
            ..ProcessConfig::default()
        }),
        ..StartRequest::default()
    };
    let c = collect(agent.stream(START, &missing, &[]).await).await;
    assert_eq!(
        c.stream_end.unwrap().error.unwrap().code,
        Code::InvalidArgument
    );
}

#[bulkhead_testkit::requires(Root)]
#[tokio::test]
async fn processes_run_as_the_requested_user() {
    let agent = Agent::start(&[]).await;
    let mut request = bash("id -u; id -g; echo $USER $HOME; touch owned");
    let shared = agent.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    request.process.as_mut().unwrap().cwd = Some(shared.display().to_string());
    let auth = basic_auth("nobody");
    let c = collect(
        agent
            .stream(START, &request, &[("authorization", &auth)])
            .await,
    )
    .await;
    assert_eq!(
        c.stdout, "65534\n65534\nnobody /nonexistent\n",
        "stderr: {}",
        c.stderr
    );
    let meta =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(shared.join("owned")).unwrap());
    assert_eq!(meta, 65534);

    let ghost = basic_auth("no-such-user-here");
    let c = collect(
        agent
            .stream(START, &bash("true"), &[("authorization", &ghost)])
            .await,
    )
    .await;
    let err = c.stream_end.unwrap().error.unwrap();
    assert_eq!(err.code, Code::Unauthenticated);
    assert!(err.message.contains("invalid username"), "{}", err.message);
}
