//! Moving a CRIU image to another uid range. Each jail slot maps the sandbox's ids onto its own
//! host range; a fork (or a resume in another slot) restores into a new range, so the user
//! namespace's maps recorded in `userns-*.img` are rewritten. Everything else CRIU stores is
//! namespace-relative (credentials, tmpfs archives), and the overlay upper dir is shifted
//! separately (`crate::uidshift`).
//!
//! Image file layout: two little-endian u32 magics, then entries, each a u32 length and a
//! protobuf message (`userns_entry { repeated uid_gid_extent uid_map = 1; … gid_map = 2; }`,
//! `uid_gid_extent { uint32 first = 1; uint32 lower_first = 2; uint32 count = 3; }`).

use std::fs;
use std::path::Path;

use super::CriuError;

/// `USERNS_MAGIC` of CRIU's `magic.h`.
const USERNS_MAGIC: u32 = 0x5547_4906;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub first: u32,
    pub lower_first: u32,
    pub count: u32,
}

/// The uid and gid maps of a user namespace entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsernsMaps {
    pub uid: Vec<Extent>,
    pub gid: Vec<Extent>,
}

fn bad(what: &str) -> CriuError {
    CriuError::io(
        "read the checkpoint's user namespace image",
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    )
}

fn read_varint(b: &[u8], at: &mut usize) -> Result<u64, CriuError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at).ok_or_else(|| bad("truncated varint"))?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint too long"))
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn u32_field(v: u64) -> Result<u32, CriuError> {
    u32::try_from(v).map_err(|_| bad("id out of range"))
}

fn decode_extent(b: &[u8]) -> Result<Extent, CriuError> {
    let (mut at, mut e) = (0, [None; 3]);
    while at < b.len() {
        let tag = read_varint(b, &mut at)?;
        let (field, wire) = (tag >> 3, tag & 7);
        if wire != 0 || !(1..=3).contains(&field) {
            return Err(bad("unexpected field in uid_gid_extent"));
        }
        e[field as usize - 1] = Some(u32_field(read_varint(b, &mut at)?)?);
    }
    match e {
        [Some(first), Some(lower_first), Some(count)] => Ok(Extent {
            first,
            lower_first,
            count,
        }),
        _ => Err(bad("uid_gid_extent lacks a required field")),
    }
}

/// Decode one `userns_entry` message.
pub fn decode_userns(b: &[u8]) -> Result<UsernsMaps, CriuError> {
    let (mut at, mut maps) = (0, UsernsMaps::default());
    while at < b.len() {
        let tag = read_varint(b, &mut at)?;
        let (field, wire) = (tag >> 3, tag & 7);
        if wire != 2 {
            return Err(bad("unexpected wire type in userns_entry"));
        }
        let len = read_varint(b, &mut at)? as usize;
        let body = b.get(at..at + len).ok_or_else(|| bad("truncated extent"))?;
        at += len;
        let e = decode_extent(body)?;
        match field {
            1 => maps.uid.push(e),
            2 => maps.gid.push(e),
            _ => return Err(bad("unexpected field in userns_entry")),
        }
    }
    Ok(maps)
}

/// Encode one `userns_entry` message.
pub fn encode_userns(maps: &UsernsMaps) -> Vec<u8> {
    let mut out = Vec::new();
    for (field, list) in [(1u64, &maps.uid), (2, &maps.gid)] {
        for e in list {
            let mut body = Vec::new();
            for (f, v) in [(1u64, e.first), (2, e.lower_first), (3, e.count)] {
                write_varint(&mut body, f << 3);
                write_varint(&mut body, u64::from(v));
            }
            write_varint(&mut out, (field << 3) | 2);
            write_varint(&mut out, body.len() as u64);
            out.extend_from_slice(&body);
        }
    }
    out
}

/// Rewrite every `userns-*.img` in `images` so host ids `[from, from + count)` become
/// `[to, to + count)`. A map pointing anywhere else is refused: the image is not one of ours.
pub fn shift_userns(images: &Path, from: u32, to: u32, count: u32) -> Result<usize, CriuError> {
    let mut rewritten = 0;
    let rd = fs::read_dir(images).map_err(|e| CriuError::io("read the checkpoint images", e))?;
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("userns-") && name.ends_with(".img")) {
            continue;
        }
        let path = entry.path();
        let data = fs::read(&path).map_err(|e| CriuError::io(format!("read {name}"), e))?;
        let out = shift_userns_file(&data, from, to, count)?;
        // A new file, not an in-place write: the images may be hard links shared with the
        // checkpoint that other restores use.
        let tmp = path.with_extension("img.new");
        fs::write(&tmp, out).map_err(|e| CriuError::io(format!("write {name}"), e))?;
        fs::rename(&tmp, &path).map_err(|e| CriuError::io(format!("replace {name}"), e))?;
        rewritten += 1;
    }
    Ok(rewritten)
}

fn shift_userns_file(data: &[u8], from: u32, to: u32, count: u32) -> Result<Vec<u8>, CriuError> {
    let word = |at: usize| -> Result<u32, CriuError> {
        let b = data.get(at..at + 4).ok_or_else(|| bad("truncated image"))?;
        Ok(u32::from_le_bytes(b.try_into().expect("four bytes")))
    };
    if word(4)? != USERNS_MAGIC {
        return Err(bad("not a user namespace image"));
    }
    let mut out = data[..8].to_vec();
    let mut at = 8;
    while at < data.len() {
        let len = word(at)? as usize;
        let body = data
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| bad("truncated entry"))?;
        at += 4 + len;
        let mut maps = decode_userns(body)?;
        for e in maps.uid.iter_mut().chain(maps.gid.iter_mut()) {
            let end = u64::from(e.lower_first) + u64::from(e.count);
            if e.lower_first < from || end > u64::from(from) + u64::from(count) {
                return Err(bad("the image maps ids outside the sandbox's range"));
            }
            e.lower_first = e.lower_first - from + to;
        }
        let enc = encode_userns(&maps);
        out.extend_from_slice(&(enc.len() as u32).to_le_bytes());
        out.extend_from_slice(&enc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `userns-14.img` as CRIU 4.2.1 wrote it for a sandbox of slot 0 (uid base 1000000).
    const IMAGE: &[u8] = &[
        0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55, 0x18, 0x00, 0x00, 0x00, 0x0a, 0x0a, 0x08,
        0x00, 0x10, 0xc0, 0x84, 0x3d, 0x18, 0x80, 0x80, 0x04, 0x12, 0x0a, 0x08, 0x00, 0x10, 0xc0,
        0x84, 0x3d, 0x18, 0x80, 0x80, 0x04,
    ];

    #[test]
    fn decodes_criu_output_and_re_encodes_it_byte_for_byte() {
        let maps = decode_userns(&IMAGE[12..]).unwrap();
        let e = Extent {
            first: 0,
            lower_first: 1_000_000,
            count: 65536,
        };
        assert_eq!(maps.uid, [e]);
        assert_eq!(maps.gid, [e]);
        assert_eq!(encode_userns(&maps), IMAGE[12..]);
    }

    #[test]
    fn shifts_to_another_slot_range() {
        let out = shift_userns_file(IMAGE, 1_000_000, 1_000_000 + 5 * 65536, 65536).unwrap();
        assert_eq!(out[..8], IMAGE[..8]);
        let len = u32::from_le_bytes(out[8..12].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 12);
        let maps = decode_userns(&out[12..]).unwrap();
        assert_eq!(maps.uid[0].lower_first, 1_327_680);
        assert_eq!(maps.gid[0].lower_first, 1_327_680);
        assert_eq!(maps.uid[0].count, 65536);
    }

    #[test]
    fn refuses_foreign_ranges_and_other_images() {
        assert!(shift_userns_file(IMAGE, 2_000_000, 1, 65536).is_err());
        let mut other = IMAGE.to_vec();
        other[4] = 0;
        assert!(shift_userns_file(&other, 1_000_000, 1, 65536).is_err());
        assert!(shift_userns_file(&IMAGE[..20], 1_000_000, 1, 65536).is_err());
    }

    #[test]
    fn rewrites_files_without_touching_their_hard_links() {
        let dir = tempfile::tempdir().unwrap();
        let orig = dir.path().join("orig.img");
        fs::write(&orig, IMAGE).unwrap();
        let images = dir.path().join("images");
        fs::create_dir(&images).unwrap();
        fs::hard_link(&orig, images.join("userns-14.img")).unwrap();
        fs::write(images.join("core-1.img"), b"untouched").unwrap();
        assert_eq!(
            shift_userns(&images, 1_000_000, 1_065_536, 65536).unwrap(),
            1
        );
        assert_eq!(fs::read(&orig).unwrap(), IMAGE);
        let new = fs::read(images.join("userns-14.img")).unwrap();
        assert_eq!(
            decode_userns(&new[12..]).unwrap().uid[0].lower_first,
            1_065_536
        );
        assert_eq!(fs::read(images.join("core-1.img")).unwrap(), b"untouched");
    }
}
