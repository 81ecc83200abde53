//! Tests of volume file access from the host: traversal, symlinks, sizes, owners.

use super::*;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;

fn root() -> (tempfile::TempDir, VolumeRoot) {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("vol")).unwrap();
    let r = VolumeRoot::open(&t.path().join("vol"), None).unwrap();
    (t, r)
}

#[test]
fn clean_normalises_and_refuses_dotdot() {
    assert_eq!(clean("/a//b/./c/").unwrap().shown(), "/a/b/c");
    assert_eq!(clean("a/b").unwrap().shown(), "/a/b");
    assert!(clean("/").unwrap().is_root());
    assert!(clean("").unwrap().is_root());
    for bad in ["..", "/a/../b", "a/..", "a\0b"] {
        assert!(
            matches!(clean(bad), Err(VolumeFsError::BadPath { .. })),
            "{bad:?}"
        );
    }
    assert!(clean(&"a".repeat(256)).is_err());
    assert!(clean(&"a/".repeat(2100)).is_err());
}

#[test]
fn write_read_list_stat_remove() {
    let (_t, r) = root();
    let p = clean("/dir/sub/f.txt").unwrap();
    // Parent missing without `force`.
    assert!(matches!(
        r.open_write(&p, &Attrs::default(), false),
        Err(VolumeFsError::NotFound(_))
    ));
    let mut f = r.open_write(&p, &Attrs::default(), true).unwrap();
    f.write_all(b"hello").unwrap();
    drop(f);
    let mut s = String::new();
    r.open_read(&p).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello");
    let st = r.stat(&p).unwrap();
    assert_eq!(
        (st.kind, st.size, st.name.as_str(), st.path.as_str()),
        (EntryType::File, 5, "f.txt", "/dir/sub/f.txt")
    );
    assert_eq!(st.mode, 0o644);

    let top = r.list(&clean("/").unwrap(), 1).unwrap();
    assert_eq!(
        top.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        ["/dir"]
    );
    let all = r.list(&clean("/").unwrap(), 3).unwrap();
    assert_eq!(
        all.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        ["/dir", "/dir/sub", "/dir/sub/f.txt"]
    );
    assert!(matches!(
        r.list(&p, 1),
        Err(VolumeFsError::NotADirectory(_))
    ));

    let d = r
        .make_dir(
            &clean("/dir/new").unwrap(),
            &Attrs {
                mode: Some(0o700),
                ..Default::default()
            },
            false,
        )
        .unwrap();
    assert_eq!((d.kind, d.mode), (EntryType::Directory, 0o700));
    assert!(matches!(
        r.make_dir(&clean("/dir/new").unwrap(), &Attrs::default(), false),
        Err(VolumeFsError::Exists(_))
    ));
    assert!(
        r.make_dir(&clean("/dir/new").unwrap(), &Attrs::default(), true)
            .is_ok()
    );
    assert!(matches!(
        r.make_dir(&clean("/x/y").unwrap(), &Attrs::default(), false),
        Err(VolumeFsError::NotFound(_))
    ));

    // Overwriting keeps the mode unless one is given.
    let mode = |m| Attrs {
        mode: Some(m),
        ..Default::default()
    };
    let mut f = r.open_write(&p, &Attrs::default(), false).unwrap();
    f.write_all(b"hi").unwrap();
    drop(f);
    assert_eq!(r.stat(&p).unwrap().mode, 0o644);
    r.set_attrs(&p, &mode(0o640)).unwrap();
    drop(r.open_write(&p, &Attrs::default(), false).unwrap());
    assert_eq!(
        (r.stat(&p).unwrap().mode, r.stat(&p).unwrap().size),
        (0o640, 0)
    );

    let ch = r
        .set_attrs(
            &p,
            &Attrs {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(ch.mode, 0o600);

    r.remove(&clean("/dir").unwrap()).unwrap();
    assert!(matches!(r.stat(&p), Err(VolumeFsError::NotFound(_))));
    assert!(r.remove(&clean("/").unwrap()).is_err());
}

#[test]
fn planted_symlinks_never_lead_out() {
    let t = tempfile::tempdir().unwrap();
    let vol = t.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let secret = t.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    std::fs::create_dir(t.path().join("hostdir")).unwrap();
    // What a sandbox could plant: absolute and relative links out, a magic link, a
    // directory link, and a harmless link inside.
    std::os::unix::fs::symlink(&secret, vol.join("abs")).unwrap();
    std::os::unix::fs::symlink("../secret", vol.join("rel")).unwrap();
    std::os::unix::fs::symlink("/proc/self/root/etc/passwd", vol.join("magic")).unwrap();
    std::os::unix::fs::symlink(t.path().join("hostdir"), vol.join("dirlink")).unwrap();
    std::fs::write(vol.join("inside"), "ok").unwrap();
    std::os::unix::fs::symlink("inside", vol.join("good")).unwrap();
    let r = VolumeRoot::open(&vol, None).unwrap();

    for name in ["/abs", "/rel", "/magic"] {
        let p = clean(name).unwrap();
        assert!(
            matches!(r.open_read(&p), Err(VolumeFsError::Escapes(_))),
            "{name}"
        );
        // Writing refuses the symlink itself; the target is untouched.
        assert!(
            matches!(
                r.open_write(&p, &Attrs::default(), false),
                Err(VolumeFsError::IsASymlink(_))
            ),
            "{name}"
        );
        // Stat shows the link, not its target.
        assert_eq!(r.stat(&p).unwrap().kind, EntryType::Symlink);
    }
    // Through a directory symlink: refused for every operation.
    let through = clean("/dirlink/new").unwrap();
    assert!(matches!(
        r.open_write(&through, &Attrs::default(), false),
        Err(VolumeFsError::Escapes(_))
    ));
    assert!(r.open_write(&through, &Attrs::default(), true).is_err());
    assert!(
        r.make_dir(&clean("/dirlink/d").unwrap(), &Attrs::default(), true)
            .is_err()
    );
    assert!(matches!(
        r.list(&clean("/dirlink").unwrap(), 1),
        Err(VolumeFsError::Escapes(_))
    ));
    assert!(matches!(
        r.stat(&clean("/dirlink/x").unwrap()),
        Err(VolumeFsError::Escapes(_))
    ));
    assert!(
        std::fs::read_dir(t.path().join("hostdir"))
            .unwrap()
            .next()
            .is_none()
    );
    // Chmod of a link changes nothing outside.
    let before = std::fs::metadata(&secret).unwrap().permissions();
    r.set_attrs(
        &clean("/abs").unwrap(),
        &Attrs {
            mode: Some(0o777),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(std::fs::metadata(&secret).unwrap().permissions(), before);
    // Removing links removes the links only; recursive removal does not follow them.
    r.remove(&clean("/abs").unwrap()).unwrap();
    r.remove(&clean("/dirlink").unwrap()).unwrap();
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
    assert!(t.path().join("hostdir").is_dir());
    // A link that stays inside is followed for reading.
    let mut s = String::new();
    r.open_read(&clean("/good").unwrap())
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "ok");
}

#[test]
fn fifos_never_block_and_are_never_written_into() {
    let (t, r) = root();
    let fifo = t.path().join("vol/fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let p = clean("/fifo").unwrap();
    assert!(matches!(
        r.open_read(&p),
        Err(VolumeFsError::BadPath { .. })
    ));
    assert!(matches!(
        r.open_write(&p, &Attrs::default(), false),
        Err(VolumeFsError::BadPath { .. })
    ));
    assert_eq!(r.stat(&p).unwrap().kind, EntryType::Unknown);
}

#[test]
fn bad_attrs_are_refused() {
    let (_t, r) = root();
    let p = clean("/f").unwrap();
    assert!(matches!(
        r.open_write(
            &p,
            &Attrs {
                mode: Some(0o17777),
                ..Default::default()
            },
            false
        ),
        Err(VolumeFsError::BadArgument { .. })
    ));
    assert!(matches!(
        r.open_write(
            &p,
            &Attrs {
                uid: Some(70000),
                ..Default::default()
            },
            false
        ),
        Err(VolumeFsError::BadArgument { .. })
    ));
    assert!(matches!(
        r.list(&clean("/").unwrap(), 0),
        Err(VolumeFsError::BadArgument { .. })
    ));
}

mod props {
    use proptest::prelude::*;

    use super::super::*;

    /// Client paths made of what matters to `clean`: names, `.`, `..`, empty pieces.
    fn messy_path() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just(String::new()),
            "[a-z.~ ]{1,4}",
        ];
        (any::<bool>(), prop::collection::vec(piece, 0..10)).prop_map(|(abs, p)| {
            let s = p.join("/");
            if abs { format!("/{s}") } else { s }
        })
    }

    proptest! {
        #[test]
        fn clean_never_yields_a_way_up(path in messy_path()) {
            match clean(&path) {
                Err(VolumeFsError::BadPath { .. }) => {
                    prop_assert!(path.split('/').any(|c| c == ".."));
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
                Ok(p) => {
                    prop_assert!(!path.split('/').any(|c| c == ".."));
                    prop_assert!(p.shown().starts_with('/'));
                    prop_assert!(!p.shown().contains("//"));
                    prop_assert!(p.rel.components().all(|c| matches!(c, std::path::Component::Normal(_))));
                    prop_assert_eq!(clean(p.shown()).unwrap(), p.clone());
                }
            }
        }

        #[test]
        fn clean_never_panics(path in ".{0,300}") {
            let _ = clean(&path);
        }
    }
}
