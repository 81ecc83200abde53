//! How much a directory tree takes: one walk for the meter (checkpoint storage) and the template
//! builder (layer sizes). Leaf module; blocking (call it from `spawn_blocking`).

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What a file counts for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Measure {
    /// Allocated blocks (what the disk holds: checkpoints can be sparse).
    Allocated,
    /// Apparent length (what a copy of the files would be).
    Apparent,
}

/// Sum over every non-directory entry beneath `dir`, not following symlinks; unreadable
/// entries count nothing.
pub(crate) fn tree_bytes(dir: &Path, measure: Measure) -> u64 {
    let size = |m: &Metadata| match measure {
        Measure::Allocated => m.blocks() * 512,
        Measure::Apparent => m.len(),
    };
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += size(&m);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_files_beneath_the_tree_by_length_or_blocks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("a"), vec![1u8; 10]).unwrap();
        std::fs::write(d.path().join("sub/b"), vec![2u8; 5000]).unwrap();
        // A sparse file: long, but no blocks.
        std::fs::File::create(d.path().join("sparse"))
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        assert_eq!(
            tree_bytes(d.path(), Measure::Apparent),
            10 + 5000 + (1 << 20)
        );
        let allocated = tree_bytes(d.path(), Measure::Allocated);
        assert!((5010..(1 << 20)).contains(&allocated), "{allocated}");
        assert_eq!(tree_bytes(&d.path().join("missing"), Measure::Apparent), 0);
    }
}
