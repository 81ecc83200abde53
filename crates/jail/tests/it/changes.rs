//! `Driver::changes` on a real sandbox, as root: files created, modified and deleted inside
//! are listed from the overlay's upper directory, and the jail's own files are not.

use crate::common::{Env, sh};
use bulkhead_driver::{ChangeKind, ChangeSource, Driver};
use bulkhead_testkit::requires;

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_of_a_running_sandbox() {
    let env = Env::new();
    let d = env.driver();
    let h = d.start(&env.spec(256, 128)).await.expect("start");
    let src = ChangeSource::Running(h.clone());
    // A fresh sandbox has changed nothing (resolv.conf and the CA bundle are the jail's).
    assert_eq!(d.changes(&src, None).await.unwrap(), vec![]);

    let (st, out) = sh(
        &d,
        &h,
        "mkdir -p /home/user/proj && echo hi > /home/user/proj/a.txt && echo more >> /etc/passwd \
         && rm /etc/template-marker && echo tmp > /tmp/listed && echo shm > /dev/shm/not-listed",
    )
    .await;
    assert_eq!(st, "exit 0", "{out}");
    let list = d.changes(&src, None).await.unwrap();
    let got: Vec<(String, ChangeKind, String)> = list
        .iter()
        .map(|c| (c.path.clone(), c.kind, c.file_type.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/etc/passwd".into(), ChangeKind::Modified, "file".into()),
            (
                "/etc/template-marker".into(),
                ChangeKind::Deleted,
                "file".into()
            ),
            ("/home/user".into(), ChangeKind::Created, "dir".into()),
            ("/home/user/proj".into(), ChangeKind::Created, "dir".into()),
            (
                "/home/user/proj/a.txt".into(),
                ChangeKind::Created,
                "file".into()
            ),
            // On the disk, as on E2B (/dev/shm is a tmpfs: not a change).
            ("/tmp/listed".into(), ChangeKind::Created, "file".into()),
        ]
    );
    let a = list.iter().find(|c| c.path.ends_with("a.txt")).unwrap();
    assert_eq!(a.size, 3);
    assert!(a.mtime.is_some());
    d.stop(&h).await.unwrap();
    env.assert_clean();
}
