//! Fresh private temporary directories, mkdtemp-style: a random name created exclusively
//! (an existing entry of that name, planted or left over, is never reused) with mode 0700,
//! removed on drop. Removal does not follow symlinks inside (`remove_dir_all` unlinks them).

use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A directory this process created; removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/zcio-TAG-RANDOM` (mode 0700).
    pub fn new(tag: &str) -> io::Result<Self> {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// Creates `DIR/zcio-TAG-RANDOM` (mode 0700).
    pub fn new_in(dir: &Path, tag: &str) -> io::Result<Self> {
        for _ in 0..32 {
            let mut b = [0u8; 8];
            std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
            let name: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let path = dir.join(format!("zcio-{tag}-{name}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no fresh temporary directory name after 32 tries",
        ))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path/name`.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Creates `path` exclusively (`O_CREAT|O_EXCL`: never through a symlink, never an existing
/// file) with `mode`, and writes `data`.
pub fn write_new(path: &Path, data: &[u8], mode: u32) -> io::Result<std::fs::File> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(data)?;
    Ok(f)
}

/// Reads a file without following a symlink at its last component (`O_NOFOLLOW`).
pub fn read_nofollow(path: &Path) -> io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut s = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .read_to_string(&mut s)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn temp_dirs_are_fresh_private_and_never_follow_symlinks() {
        let a = TempDir::new("t").unwrap();
        let b = TempDir::new("t").unwrap();
        assert_ne!(a.path(), b.path());
        let m = std::fs::metadata(a.path()).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        assert_eq!(m.uid(), own_uid());
        // A planted symlink is neither written through nor read through.
        let target = b.join("target");
        write_new(&target, b"secret", 0o600).unwrap();
        let link = a.join("stats");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_new(&link, b"x", 0o600).is_err());
        assert!(read_nofollow(&link).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"secret");
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        assert!(target.exists(), "removal did not follow the symlink");
    }

    fn own_uid() -> u32 {
        std::fs::metadata("/proc/self").unwrap().uid()
    }
}
